#!/usr/bin/env bash
# dtrain train --strategy ddp|dp end to end, through the launchers:
#  1. exact distributed evaluation: a ddp run's final test metrics (2 and 3 ranks, an odd
#     test set so one rank has a padding duplicate) equal `dtrain eval` of its weights;
#  2. dp: train with 2 worker threads, `eval --strategy dp --workers 3` equals plain eval;
#  3. rank 0 alone prints progress and the per-rank table (one row per rank) and writes the
#     outputs (metrics.csv one row per epoch, summary.json, config.json with strategy ddp);
#  4. mpirun with 2 and 3 ranks (auto backend -> mpi), and --backend shm under mpirun;
#  5. two simulated hosts (network namespaces + veth, root only): dtrun --nnodes 2 x 2 ranks;
#  6. a rank killed with SIGKILL mid-epoch: dtrun fails fast naming it, survivors report the
#     lost peer (checked without dtrun too), nothing left in /dev/shm, no orphan processes;
#  7. dtrun --max-restarts 1 with a rank that fails in round 0 only: the job finishes;
#  8. usage errors (--sharded-update on with clipping too; no --strategy in one of a launcher's copies), and
#     --comm-hook bf16 reaching the accuracy of the uncompressed run;
#  9. SIGINT to dtrun: every rank stops at the same step, rank 0 writes metrics and weights,
#     exit 130;
# and between 1 and 2: gradients in shared memory, weights in pieces, the sharded and fused updates, how shm
# waits, and a rank stopped half the time (its peer's waits for it not counted as communication).
# Sizes are small (--limit-train/--limit-test): the whole script takes well under a minute.
set -u
b=${DT_BUILD_DIR:?DT_BUILD_DIR must name the build directory}
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
export DT_BUILD_DIR=$b
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export DT_TIMEOUT=60 # a hung collective fails the test instead of stalling it
DTRAIN=$b/dtrain
DTRUN=$b/dtrun
W=$SRC/tests/cli/ddp_worker.sh
for x in "$DTRAIN" "$DTRUN"; do [ -x "$x" ] || { echo "FAIL: $x is not built" >&2; exit 1; }; done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT OMPI_COMM_WORLD_RANK PMI_RANK SLURM_PROCID
unset OMPI_COMM_WORLD_SIZE SLURM_STEP_NUM_TASKS # they decide whether a train without --strategy runs

tmp=$(mktemp -d)
bg_pids=()
netns=()
cleanup() {
  for p in "${bg_pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  # Workers a failed check may have left behind (the wrapper wrote their pids).
  for f in "$tmp"/*/pid.*; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done
  for n in "${netns[@]}"; do ip netns del "$n" 2>/dev/null; done
  [ -n "${KEEP_TMP:-}" ] && echo "kept $tmp" >&2 || rm -rf "$tmp"
}
trap cleanup EXIT
. "$SRC/tests/cli/common.sh" # fail, ok, section, alive, wait_for, wait_line
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
json() { sed -n "s/.*\"$2\":\\([^,}]*\\).*/\\1/p" "$1" | tr -d '"'; } # FILE KEY
csv_last() { # FILE COLUMN-NAME: the value in the last row
  awk -F, -v c="$2" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == c) k = i; next } { v = $k } END { print v }' "$1"
}
near() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t) }'; }
# dtr NAME SECONDS DTRUN-ARGS...: dtrun in the foreground; output in $tmp/NAME.out/.err, exit in $rc.
dtr() {
  local name=$1 secs=$2
  shift 2
  timeout -k 2 "$secs" "$DTRUN" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" </dev/null
  rc=$?
}
show() { echo "--- $1 (rc $rc):"; tail -n 15 "$tmp/$1.out" "$tmp/$1.err" 2>/dev/null | sed 's/^/    /'; }
# eval_matches NAME OUTDIR LIMIT: `dtrain eval` of OUTDIR's weights on the first LIMIT test
# samples reports the loss, top-1 and top-5 of the run's final evaluation (summary.json and
# the last metrics.csv row), to the precision eval prints (4 decimals; 0.01 %).
eval_matches() {
  local name=$1 dir=$2 n=$3 line loss top1 top5 sl s1 s5
  line=$("$DTRAIN" eval --weights "$dir/model.safetensors" --limit "$n" 2>&1)
  loss=$(sed -n 's/.* loss \([0-9.]*\) .*/\1/p' <<<"$line")
  top1=$(sed -n 's/.* top1 \([0-9.]*\)%.*/\1/p' <<<"$line")
  top5=$(sed -n 's/.* top5 \([0-9.]*\)%.*/\1/p' <<<"$line")
  sl=$(json "$dir/summary.json" test_loss)
  s1=$(json "$dir/summary.json" test_acc1)
  s5=$(json "$dir/summary.json" test_acc5)
  if [ -z "$loss" ] || [ -z "$top1" ] || [ -z "$sl" ] || [ -z "$s1" ]; then
    fail "$name: cannot read the metrics (eval: '$line'; summary: $(cat "$dir/summary.json" 2>/dev/null))"
    return
  fi
  [ "$(csv_last "$dir/metrics.csv" test_acc1)" = "$s1" ] && [ "$(csv_last "$dir/metrics.csv" test_loss)" = "$sl" ] ||
    fail "$name: metrics.csv's last row disagrees with summary.json"
  # Correct-sample counts: top-1 to 0.01 % pins the count exactly for n <= 10000.
  local c_eval c_run c5_eval c5_run
  c_eval=$(awk -v p="$top1" -v n="$n" 'BEGIN { printf "%d", p / 100 * n + 0.5 }')
  c_run=$(awk -v p="$s1" -v n="$n" 'BEGIN { printf "%d", p * n + 0.5 }')
  c5_eval=$(awk -v p="$top5" -v n="$n" 'BEGIN { printf "%d", p / 100 * n + 0.5 }')
  c5_run=$(awk -v p="$s5" -v n="$n" 'BEGIN { printf "%d", p * n + 0.5 }')
  if [ "$c_eval" = "$c_run" ] && [ "$c5_eval" = "$c5_run" ] && near "$loss" "$sl" 0.000051; then
    ok "$name: ddp test metrics = eval of its weights (loss $loss, top-1 $c_run/$n, top-5 $c5_run/$n)"
  else
    fail "$name: eval of the weights gives loss $loss top-1 $top1% ($c_eval/$n) top-5 $top5% ($c5_eval/$n); the run reported loss $sl top-1 $s1 ($c_run/$n) top-5 $s5 ($c5_run/$n)"
  fi
}
# table_rows NAME FILE WORLD: the per-rank table is printed once, by rank 0, one row per rank.
table_rows() {
  local name=$1 f=$2 n=$3 hdr rows r
  hdr=$(grep -cE '^(\[rank 0\]: )? rank +wall s +user s +sys s +samples +compute s +data s +comm s +top-1 +top-5$' "$f")
  rows=$(grep -cE '^(\[rank 0\]: )? +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+% +[0-9.]+%$' "$f")
  for ((r = 0; r < n; r++)); do
    grep -qE "^(\[rank 0\]: )? +$r +[0-9.]+ " "$f" || { fail "$name: no table row for rank $r"; return; }
  done
  if [ "$hdr" -eq 1 ] && [ "$rows" -eq "$n" ]; then
    ok "$name: per-rank table printed once with $n rows"
  else
    fail "$name: per-rank table: $hdr header line(s) and $rows row(s), expected 1 and $n: $(grep -A$((n + 1)) ' rank ' "$f")"
  fi
}

# ---- 1 + 3: two ranks (progress, table, outputs) and exact evaluation -------------------------
section "1/3 ddp on 2 ranks"
base_args=(--strategy ddp --epochs 2 --limit-train 3000 --limit-test 1001 --lr 0.05)
DT_DEBUG=ddp dtr ddp2 60 --standalone --nproc-per-node 2 -- "$DTRAIN" train "${base_args[@]}" --out "$tmp/ddp2" \
  --progress plain
# the measured bucket layout: chosen once by rank 0 after the first steps, the same on both ranks (DT_DEBUG=ddp)
l0=$(grep -oE '^\[rank 0\]: dtrain INFO \[ddp\] rank 0: measured layout: .* MiB' "$tmp/ddp2.err" | sed 's/.*layout: //')
l1=$(grep -oE '^\[rank 1\]: dtrain INFO \[ddp\] rank 1: measured layout: .* MiB' "$tmp/ddp2.err" | sed 's/.*layout: //')
if [ -n "$l0" ] && [ "$l0" = "$l1" ] && [ "$(grep -c 'measured layout: ' "$tmp/ddp2.err")" -eq 2 ]; then
  ok "ddp 2 ranks: one measured bucket layout, the same on both ranks ($l0)"
else
  fail "ddp 2 ranks: measured layouts '$l0' and '$l1'; $(grep -c 'measured layout: ' "$tmp/ddp2.err") layout lines"
fi
# DT_COMM_CPU overrides what the ranks' CPU masks say: 1 plans the layout from the measured steps, 0 keeps one bucket
# after backward; anything else is refused before training
rc_main=$rc
for cc in 1 0 yes; do
  DT_COMM_CPU=$cc DT_DEBUG=ddp dtr "cc$cc" 60 --standalone --nproc-per-node 2 -- "$DTRAIN" train --strategy ddp \
    --epochs 1 --limit-train 640 --limit-test 64 --out "$tmp/cc$cc" --progress none
  eval "rc_cc$cc=\$rc"
done
n_plan=$(grep -c 'measured layout: [0-9]* buckets of .* (all-reduce' "$tmp/cc1.err")
n_one=$(grep -c 'measured layout: 1 bucket(s) of .* after backward (communication threads share' "$tmp/cc0.err")
n_bad=$(grep -c 'DT_COMM_CPU=yes: auto, 0 or 1' "$tmp/ccyes.err")
if [ "$rc_cc1" -eq 0 ] && [ "$rc_cc0" -eq 0 ] && [ "$rc_ccyes" -ne 0 ] && [ "$n_plan" -eq 2 ] && [ "$n_one" -eq 2 ] &&
  [ "$n_bad" -ge 1 ]; then
  ok "DT_COMM_CPU: 1 plans the layout on both ranks, 0 gives one bucket on both, 'yes' refused (exit $rc_ccyes)"
else
  fail "DT_COMM_CPU: exits $rc_cc1 / $rc_cc0 / $rc_ccyes, planned-layout lines $n_plan, one-bucket lines $n_one," \
    "refusals $n_bad"
  rc=$rc_cc1 show cc1
  rc=$rc_cc0 show cc0
  rc=$rc_ccyes show ccyes
fi
rc=$rc_main
if [ "$rc" -ne 0 ]; then
  fail "ddp 2 ranks: exit $rc"
  show ddp2
else
  eval_matches "ddp 2 ranks, 1001 test samples" "$tmp/ddp2" 1001
  table_rows "ddp 2 ranks" "$tmp/ddp2.out" 2
  # Progress lines ("epoch E/N  step S/T ...") and epoch lines come from rank 0 only.
  p0=$(grep -cE '^\[rank 0\]: epoch [0-9]+/2  step ' "$tmp/ddp2.out")
  e0=$(grep -cE '^\[rank 0\]: epoch [0-9]+/2  train loss ' "$tmp/ddp2.out")
  others=$(grep -c '^\[rank [1-9]' "$tmp/ddp2.out")
  if [ "$p0" -ge 1 ] && [ "$e0" -eq 2 ] && [ "$others" -eq 0 ]; then
    ok "ddp 2 ranks: only rank 0 prints ($p0 progress lines, 2 epoch lines)"
  else
    fail "ddp 2 ranks: rank 0 printed $p0 progress and $e0 epoch lines, other ranks $others lines on stdout"
  fi
  nt=$(grep -c 'summary (fashioncnn' "$tmp/ddp2.out")
  [ "$nt" -eq 1 ] || fail "ddp 2 ranks: the summary was printed $nt times"
  rows=$(($(grep -c '' "$tmp/ddp2/metrics.csv") - 1))
  jrows=$(grep -c '' "$tmp/ddp2/metrics.jsonl")
  ws=$(json "$tmp/ddp2/summary.json" world_size)
  if [ "$rows" -eq 2 ] && [ "$jrows" -eq 2 ] && [ "$ws" = 2 ] && [ "$(json "$tmp/ddp2/summary.json" epochs_done)" = 2 ] &&
    grep -q '"strategy":"ddp"' "$tmp/ddp2/config.json" && [ -s "$tmp/ddp2/model.safetensors" ]; then
    ok "ddp 2 ranks: outputs (metrics.csv 2 rows, summary.json world_size 2, config.json strategy ddp, weights)"
  else
    fail "ddp 2 ranks: outputs: metrics.csv $rows rows, metrics.jsonl $jrows, world_size '$ws', config: $(head -c 300 "$tmp/ddp2/config.json")"
  fi
fi

section "1 ddp on 3 ranks"
dtr ddp3 60 --standalone --nproc-per-node 3 -- "$DTRAIN" train --strategy ddp --epochs 1 --limit-train 1500 \
  --limit-test 1001 --out "$tmp/ddp3" --progress none
if [ "$rc" -ne 0 ]; then
  fail "ddp 3 ranks: exit $rc"
  show ddp3
else
  eval_matches "ddp 3 ranks, 1001 test samples" "$tmp/ddp3" 1001
  table_rows "ddp 3 ranks" "$tmp/ddp3.out" 3
fi

section "ddp: gradients in memory the ranks share give the slot path's bits, and so does the fused update"
# 3 ranks (rank 2 reduces its share aside), a fixed layout: shared gradients (the default) stepped after the
# all-reduces (DT_FUSED_UPDATE=0), --shared-grads off, and the default, the fused update; with --clip-grad-norm,
# which reads the averaged gradients, the update stays after them
for sg in on off fused clip; do
  case $sg in
  on) flags=(--shared-grads on) fused=0 ;;
  off) flags=(--shared-grads off) fused=1 ;;
  fused) flags=() fused=1 ;;
  clip) flags=(--clip-grad-norm 100) fused=1 ;;
  esac
  DT_FUSED_UPDATE=$fused dtr "sg$sg" 60 --standalone --nproc-per-node 3 -- "$DTRAIN" train --strategy ddp --epochs 1 \
    --limit-train 960 --limit-test 100 --bucket-cap-mb 1 --out "$tmp/sg$sg" --progress none --sharded-update off \
    "${flags[@]}"
  [ "$rc" -eq 0 ] || { fail "ddp 3 ranks ($sg): exit $rc"; show "sg$sg"; }
done
s_on=$(json "$tmp/sgon/summary.json" shared_grads)
s_off=$(json "$tmp/sgoff/summary.json" shared_grads)
n_on=$(json "$tmp/sgon/summary.json" shared_allreduces)
n_off=$(json "$tmp/sgoff/summary.json" shared_allreduces)
f_on=$(json "$tmp/sgon/summary.json" fused_update)
f_fused=$(json "$tmp/sgfused/summary.json" fused_update)
f_clip=$(json "$tmp/sgclip/summary.json" fused_update)
f_off=$(json "$tmp/sgoff/summary.json" fused_update)
if [ "$s_on" = true ] && [ "$s_off" = false ] && [ "${n_on:-0}" -gt 0 ] && [ "$n_off" = 0 ] &&
  [ "$f_on" = false ] && [ "$f_fused" = true ] && [ "$f_clip" = false ] && [ "$f_off" = false ] &&
  grep -q "3 ranks over shm with shared gradients, all-reduce" "$tmp/sgon.out" &&
  grep -q "3 ranks over shm with shared gradients and a fused update, all-reduce" "$tmp/sgfused.out" &&
  grep -q "3 ranks over shm, all-reduce" "$tmp/sgoff.out" &&
  cmp -s "$tmp/sgon/model.safetensors" "$tmp/sgoff/model.safetensors" &&
  cmp -s "$tmp/sgfused/model.safetensors" "$tmp/sgoff/model.safetensors"; then
  ok "ddp 3 ranks: $n_on all-reduces read shared gradients in place (off: none), the same weights bit for bit, fused too (not with clipping)"
else
  fail "ddp 3 ranks: shared_grads '$s_on' / '$s_off', in place '$n_on' / '$n_off', fused (plain, default, clip, off) '$f_on' '$f_fused' '$f_clip' '$f_off'; weights $(cmp "$tmp/sgon/model.safetensors" "$tmp/sgoff/model.safetensors" 2>&1), fused $(cmp "$tmp/sgfused/model.safetensors" "$tmp/sgoff/model.safetensors" 2>&1)"
fi

section "ddp: the sharded and fused updates give the plain bits, and the sharded one's snapshot resumes"
# Each rank steps its share of parameters and momentum common to the host: the weights of every rank stepping the
# whole model, bit for bit (a warmed-up cosine schedule, weight decay but not on biases); the epoch-1 snapshot
# (state gathered from the common memory) resumed to the same end. auto: the 3-rank fashioncnn run above (5.6 MiB of
# parameters) ran with it, this 256-wide mlp (1.6 MiB with momentum) runs without, a 2048-wide one (30 MiB) with;
# the 256-wide one with batches of 512 (2.6 MiB of activations) with, a Linear (61 KiB, 0.2 MiB of activations)
# without.
common=(train --strategy ddp --epochs 2 --limit-train 1280 --limit-test 100 --momentum 0.9 --model mlp --hidden 256
  --schedule cosine --warmup-steps 3 --weight-decay 0.01 --no-decay bias --progress none)
for su in on off auto; do
  dtr "su$su" 60 --standalone --nproc-per-node 2 -- "$DTRAIN" "${common[@]}" --out "$tmp/su$su" --sharded-update $su \
    --save-every 1
  [ "$rc" -eq 0 ] || { fail "ddp --sharded-update $su: exit $rc"; show "su$su"; }
done
dtr sures 60 --standalone --nproc-per-node 2 -- "$DTRAIN" "${common[@]}" --out "$tmp/sures" --sharded-update on \
  --resume "$(ls "$tmp"/suon/snapshots/*.safetensors | head -n 1)"
[ "$rc" -eq 0 ] || { fail "ddp --sharded-update on, resumed: exit $rc"; show sures; }
su_on=$(json "$tmp/suon/summary.json" sharded_update)
su_off=$(json "$tmp/suoff/summary.json" sharded_update)
su_auto=$(json "$tmp/ddp3/summary.json" sharded_update)
su_small=$(json "$tmp/suauto/summary.json" sharded_update)
dtr subig 60 --standalone --nproc-per-node 2 -- "$DTRAIN" train --strategy ddp --model mlp --hidden 2048,1024 \
  --momentum 0.9 --limit-train 256 --limit-test 64 --out "$tmp/subig" --progress none
su_big=$(json "$tmp/subig/summary.json" sharded_update)
# off: every rank steps the whole model, inside the all-reduces (the fused update) unless DT_FUSED_UPDATE=0
DT_FUSED_UPDATE=0 dtr suplain 60 --standalone --nproc-per-node 2 -- "$DTRAIN" "${common[@]}" --out "$tmp/suplain" \
  --sharded-update off
[ "$rc" -eq 0 ] || { fail "ddp --sharded-update off, DT_FUSED_UPDATE=0: exit $rc"; show suplain; }
fu_off=$(json "$tmp/suoff/summary.json" fused_update)
fu_plain=$(json "$tmp/suplain/summary.json" fused_update)
fu_on=$(json "$tmp/suon/summary.json" fused_update)
dtr suacts 60 --standalone --nproc-per-node 2 -- "$DTRAIN" train --strategy ddp --model mlp --hidden 256 \
  --momentum 0.9 --batch-size 512 --limit-train 1024 --limit-test 64 --out "$tmp/suacts" --progress none
[ "$rc" -eq 0 ] || { fail "ddp, a 1.6 MiB mlp with batches of 512: exit $rc"; show suacts; }
su_acts=$(json "$tmp/suacts/summary.json" sharded_update)
dtr sutiny 60 --standalone --nproc-per-node 2 -- "$DTRAIN" train --strategy ddp --model linear --momentum 0.9 \
  --limit-train 256 --limit-test 64 --out "$tmp/sutiny" --progress none
[ "$rc" -eq 0 ] || { fail "ddp, a Linear: exit $rc"; show sutiny; }
su_tiny=$(json "$tmp/sutiny/summary.json" sharded_update)
if [ "$su_on" = true ] && [ "$su_off" = false ] && [ "$su_auto" = true ] && [ "$su_small" = false ] &&
  [ "$su_big" = true ] && [ "$su_acts" = true ] && [ "$su_tiny" = false ] &&
  cmp -s "$tmp/suauto/model.safetensors" "$tmp/suoff/model.safetensors" &&
  grep -q "2 ranks over shm with shared gradients and a sharded update" "$tmp/suon.out" &&
  cmp -s "$tmp/suon/model.safetensors" "$tmp/suoff/model.safetensors" &&
  cmp -s "$tmp/suon/model.safetensors" "$tmp/sures/model.safetensors" &&
  [ "$fu_off" = true ] && [ "$fu_plain" = false ] && [ "$fu_on" = false ] &&
  grep -q "2 ranks over shm with shared gradients and a fused update" "$tmp/suoff.out" &&
  cmp -s "$tmp/suoff/model.safetensors" "$tmp/suplain/model.safetensors"; then
  ok "ddp --sharded-update on: the unsharded weights bit for bit, and resumed from its epoch-1 snapshot too; off: the fused update's weights those of the step after the all-reduces"
else
  fail "ddp sharded update: on '$su_on', off '$su_off', auto on fashioncnn '$su_auto', on a 1.6 MiB mlp '$su_small', on a 30 MiB mlp '$su_big', on the 1.6 MiB mlp with 2.6 MiB of activations '$su_acts', on a Linear '$su_tiny'; fused when off '$fu_off', with DT_FUSED_UPDATE=0 '$fu_plain', when on '$fu_on'; fused against plain $(cmp "$tmp/suoff/model.safetensors" "$tmp/suplain/model.safetensors" 2>&1); weights $(cmp "$tmp/suon/model.safetensors" "$tmp/suoff/model.safetensors" 2>&1); resumed $(cmp "$tmp/suon/model.safetensors" "$tmp/sures/model.safetensors" 2>&1)"
fi

section "ddp: how shm waits, by the ranks' CPUs"
# Bound to a CPU each, a rank shares it with no other: its blocking waits spin. Two ranks on one CPU (a taskset on
# dtrun, no binding): they sleep. The communication thread, beside its rank's compute on that CPU, sleeps in both.
usable=$(/usr/bin/python3 -c 'import os; print(" ".join(map(str, sorted(os.sched_getaffinity(0)))))')
if [ "$(wc -w <<<"$usable")" -ge 2 ]; then
  dtr spinb 60 --standalone --nproc-per-node 2 --threads-per-proc 1 --bind-to core -- env DT_DEBUG=shm "$DTRAIN" \
    train --strategy ddp --limit-train 256 --limit-test 64 --out "$tmp/spinb" --progress none
  want="1 rank(s) on its 1 CPU(s): a waiting caller spins, the communication thread sleeps"
  if [ "$rc" -eq 0 ] && [ "$(grep -c "$want" "$tmp/spinb.err")" -eq 2 ]; then
    ok "ddp bound to a CPU each: the callers' waits spin, the communication threads' sleep"
  else
    fail "ddp bound: rc $rc, $(grep "CPU(s)" "$tmp/spinb.err")"
  fi
fi
timeout -k 2 60 taskset -c "${usable%% *}" "$DTRUN" --standalone --nproc-per-node 2 --threads-per-proc 1 -- \
  env DT_DEBUG=shm "$DTRAIN" train --strategy ddp --limit-train 256 --limit-test 64 --out "$tmp/spin1" \
  --progress none >"$tmp/spin1.out" 2>"$tmp/spin1.err" </dev/null
rc=$?
want="2 rank(s) on its 1 CPU(s): a waiting caller sleeps, the communication thread sleeps"
if [ "$rc" -eq 0 ] && [ "$(grep -c "$want" "$tmp/spin1.err")" -eq 2 ]; then
  ok "ddp, 2 ranks on one CPU: every wait sleeps"
else
  fail "ddp on one CPU: rc $rc, $(grep "CPU(s)" "$tmp/spin1.err")"
fi

section "ddp: a wait for a slower rank is not counted as communication"
# Rank 1 is stopped (SIGSTOP) 5 ms of every 10, its compute and communication alike, so rank 0 waits for it at
# the end of most steps. The share hidden behind backward is taken step by step on the rank that arrived last
# (the least wait over the ranks): rank 0's own wait, mostly for rank 1, must not lower it. Rank 1 stopped inside
# its own all-reduces makes the least wait long too: under the CI's load rank 0 waited 0.318 s against 0.145 s.
# PyTorch's fixed layout (two buckets, the first during backward): on CPUs the communication threads share, the
# measured layout is one bucket after backward, which hides nothing for this check to tell apart.
mkdir -p "$tmp/slowpids"
(
  for _ in $(seq 400); do [ -s "$tmp/slowpids/pid.1.0" ] && break; sleep 0.05; done
  p=$(cat "$tmp/slowpids/pid.1.0" 2>/dev/null) || { echo "rank 1 wrote no pid: not stopped" >&2; exit 0; }
  trap 'kill -CONT "$p" 2>/dev/null; exit 0' TERM # stopped with TERM: rank 1 never stays stopped
  while kill -STOP "$p" 2>/dev/null; do sleep 0.005; kill -CONT "$p" 2>/dev/null; sleep 0.005; done
) &
pulser=$!
bg_pids+=("$pulser")
DDP_PID_DIR=$tmp/slowpids dtr slow1 90 --standalone --nproc-per-node 2 -- "$W" train --strategy ddp \
  --model fashioncnn --limit-train 3840 --limit-test 64 --out "$tmp/slow1" --progress none --bucket-cap-mb 25
{ kill -TERM "$pulser"; wait "$pulser"; } 2>/dev/null
s1=$tmp/slow1/summary.json
c0=$(json "$s1" comm_seconds) tot=$(json "$s1" comm_total_seconds) h=$(json "$s1" comm_hidden)
crit=$(json "$s1" comm_critical_seconds) ct=$(json "$s1" comm_critical_total_seconds)
# crit and ct are written to 1 ms: their ratio is known to 0.001 / ct, and comm_hidden to 0.0001
if [ "$rc" -eq 0 ] && [ -n "$crit" ] && [ -n "$ct" ] &&
  awk -v c0="$c0" -v tot="$tot" -v h="$h" -v crit="$crit" -v ct="$ct" 'BEGIN {
    if (!(ct > 0 && tot > 0)) exit 1
    d = h - (1 - crit / ct); if (d < 0) d = -d
    exit !(c0 >= 1.5 * crit + 0.05 && d <= 0.001 / ct + 0.0002 && h > 1 - c0 / tot + 0.15) }'; then
  ok "ddp, rank 1 stopped half the time: rank 0 waited $c0 s, the slowest rank's waits $crit s of $ct s ($h hidden)"
else
  fail "ddp, rank 1 stopped half the time: rc $rc, rank 0 waited '$c0' s of '$tot' s, the slowest rank's waits '$crit' s of '$ct' s, hidden '$h'"
  show slow1
fi

# ---- 2: dp ----------------------------------------------------------------------------------
section "2 dp"
timeout -k 2 60 "$DTRAIN" train --strategy dp --workers 2 --epochs 1 --limit-train 1500 --limit-test 1001 \
  --out "$tmp/dp" --progress none >"$tmp/dp.out" 2>&1
rc=$?
if [ "$rc" -ne 0 ]; then
  fail "dp train --workers 2: exit $rc"
  show dp
else
  e1=$("$DTRAIN" eval --weights "$tmp/dp/model.safetensors" --limit 1001 2>&1)
  e3=$("$DTRAIN" eval --strategy dp --workers 3 --weights "$tmp/dp/model.safetensors" --limit 1001 2>&1)
  t1=$(sed -n 's/.* \(top1 [0-9.]*%\).*/\1/p' <<<"$e1")
  t3=$(sed -n 's/.* \(top1 [0-9.]*%\).*/\1/p' <<<"$e3")
  l1=$(sed -n 's/.* loss \([0-9.]*\) .*/\1/p' <<<"$e1")
  l3=$(sed -n 's/.* loss \([0-9.]*\) .*/\1/p' <<<"$e3")
  if [ -n "$t1" ] && [ "$t1" = "$t3" ] && near "$l1" "$l3" 0.00011; then
    ok "dp: eval --strategy dp --workers 3 = plain eval ($t1, loss $l1 / $l3)"
  else
    fail "dp: plain eval '$e1' vs dp eval '$e3'"
  fi
  eval_matches "dp train --workers 2, final test metrics" "$tmp/dp" 1001
fi
# Workers that fetch their own slices (--data-workers 0: no loader thread) train on what a loader thread makes.
for dw in 0 1; do
  timeout -k 2 60 "$DTRAIN" train --strategy dp --workers 2 --threads 2 --data-workers "$dw" --epochs 1 \
    --limit-train 700 --limit-test 64 --batch-size 50 --out "$tmp/dpdw$dw" --progress none >"$tmp/dpdw$dw.out" 2>&1
done
if cmp -s "$tmp/dpdw0/model.safetensors" "$tmp/dpdw1/model.safetensors" && grep -q '"data_workers":0' \
  "$tmp/dpdw0/config.json"; then
  ok "dp: workers fetching their own slices (--data-workers 0) give a loader thread's weights"
else
  fail "dp --data-workers 0 against 1: $(cmp "$tmp/dpdw0/model.safetensors" "$tmp/dpdw1/model.safetensors" 2>&1)"
  show dpdw0
fi
# --clip-grad-norm is the workers' (dt_dp_clip_grad_norm, no OpenMP region of the main thread's beside them): a
# share of the norm and, where it clips, of the scaling a worker and step in the trace (14 steps), and it binds
timeout -k 2 60 "$DTRAIN" train --strategy dp --workers 2 --threads 2 --epochs 1 --limit-train 700 --limit-test 64 \
  --batch-size 50 --clip-grad-norm 0.05 --trace "$tmp/dpclip.json" --out "$tmp/dpclip" --progress none \
  >"$tmp/dpclip.out" 2>&1
n_norm=$(grep -o '"name":"dp clip norm share"' "$tmp/dpclip.json" 2>/dev/null | wc -l)
n_scale=$(grep -o '"name":"dp clip share"' "$tmp/dpclip.json" 2>/dev/null | wc -l)
if [ "$n_norm" = 28 ] && [ "$n_scale" = 28 ] && [ -s "$tmp/dpclip/model.safetensors" ] &&
  ! cmp -s "$tmp/dpclip/model.safetensors" "$tmp/dpdw1/model.safetensors"; then
  ok "dp: --clip-grad-norm by the workers (28 norm and 28 scaling shares in 14 steps), and it binds"
else
  fail "dp --clip-grad-norm: $n_norm norm and $n_scale scaling shares in the trace (28 each expected), weights" \
    "$(cmp "$tmp/dpclip/model.safetensors" "$tmp/dpdw1/model.safetensors" 2>&1 || true)"
  show dpclip
fi

# ---- 4: mpirun --------------------------------------------------------------------------------
section "4 mpirun"
if ! command -v mpirun >/dev/null; then
  echo "skip (part 4): mpirun not installed"
elif ! nm -D "$b/libdtrain.so" 2>/dev/null | grep -q " U MPI_Init"; then
  echo "skip (part 4): libdtrain was built without MPI"
else
  # Under a sanitizer build, Open MPI's own allocations (never freed by MPI_Finalize) would
  # fail every rank at exit: suppress leaks in the MPI stack and its plugins only (plugins
  # kept loaded so their frames have names; full unwinding since they lack frame pointers).
  printf 'leak:%s\n' libmpi.so libopen-pal.so libopen-rte.so mca_ libhwloc.so libpmix.so libevent libopenblas \
    libgomp >"$tmp/mpi.supp"
  mpi() { # NAME RANKS BACKEND EXPECTED-BACKEND
    local try
    for try in 1 2; do # a free port can be taken by a parallel test before rank 0 binds it: once more then
      mpi_once "$@"
      [ $rc -ne 0 ] && grep -q "address already in use" "$tmp/$1.out" || break
      rm -rf "$tmp/$1"
    done
    mpi_check "$@"
  }
  mpi_once() {
    timeout -k 2 60 mpirun --allow-run-as-root --oversubscribe --bind-to none -n "$2" -x DT_NUM_THREADS=1 \
      -x OMP_NUM_THREADS=1 -x DT_TIMEOUT -x OMP_WAIT_POLICY -x DT_DEBUG=info \
      -x OMPI_MCA_mca_base_component_disable_dlclose=1 -x LSAN_OPTIONS="suppressions=$tmp/mpi.supp:print_suppressions=0" \
      -x ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0" \
      "$DTRAIN" train --strategy ddp --backend "$3" --master "127.0.0.1:$(free_port)" --epochs 1 --limit-train 1200 \
      --limit-test 1001 --out "$tmp/$1" --progress none </dev/null >"$tmp/$1.out" 2>&1
    rc=$?
  }
  mpi_check() {
    local nb
    nb=$(grep -cE "rank [0-9]+ of $2 .*, backend $4, " "$tmp/$1.out")
    if [ "$rc" -eq 0 ] && [ "$nb" -eq "$2" ] && [ "$(json "$tmp/$1/summary.json" world_size)" = "$2" ]; then
      ok "mpirun -n $2 --backend $3: trained on $2 ranks with backend $4"
    else
      fail "mpirun -n $2 --backend $3: exit $rc, $nb of $2 ranks report backend $4"
      grep -E 'backend|dtrain:|error' "$tmp/$1.out" | tail -n 10 | sed 's/^/    /'
      return 1
    fi
  }
  mpi mpi2 2 auto mpi && table_rows "mpirun -n 2" "$tmp/mpi2.out" 2
  mpi mpi3 3 auto mpi && eval_matches "mpirun -n 3, 1001 test samples" "$tmp/mpi3" 1001
  mpi mpishm 2 shm shm
fi

# ---- 5: two simulated hosts -----------------------------------------------------------------
section "5 two hosts (network namespaces)"
tag=$$
A=dtdA$tag B=dtdB$tag
net=10.$((200 + tag % 50)).$(((tag / 50) % 250)).
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
  echo "skip (part 5): needs root and iproute2 for network namespaces"
elif ! { ip netns add "$A" && netns+=("$A") && ip netns add "$B" && netns+=("$B") &&
  ip link add "vda$tag" type veth peer name "vdb$tag" &&
  ip link set "vda$tag" netns "$A" && ip link set "vdb$tag" netns "$B" &&
  ip -n "$A" addr add "${net}1/24" dev "vda$tag" && ip -n "$B" addr add "${net}2/24" dev "vdb$tag" &&
  ip -n "$A" link set "vda$tag" up && ip -n "$B" link set "vdb$tag" up &&
  ip -n "$A" link set lo up && ip -n "$B" link set lo up; } 2>"$tmp/netns.err"; then
  echo "skip (part 5): cannot create network namespaces here: $(head -n 1 "$tmp/netns.err")"
else
  # 6400 samples / 4 ranks / batch 16 = 100 steps per rank, 400 in all.
  pids=()
  for node in 0 1; do
    ns=$A
    [ $node -eq 1 ] && ns=$B
    ip netns exec "$ns" timeout -k 2 60 "$DTRUN" --nnodes 2 --node-rank $node --master-addr "${net}1" \
      --master-port 29617 --nproc-per-node 2 --run-id ddpns$tag -- "$DTRAIN" train --strategy ddp --epochs 1 \
      --limit-train 6400 --batch-size 16 --limit-test 1000 --out "$tmp/ns$node" --progress none \
      >"$tmp/ns$node.out" 2>"$tmp/ns$node.err" </dev/null &
    pids+=($!)
    bg_pids+=($!)
  done
  nrc=0
  for p in "${pids[@]}"; do wait "$p" || nrc=1; done
  acc=$(json "$tmp/ns0/summary.json" test_acc1 2>/dev/null)
  steps=$(json "$tmp/ns0/summary.json" steps 2>/dev/null)
  if [ "$nrc" -ne 0 ] || [ -z "$acc" ]; then
    fail "two hosts: dtrun exit codes not 0 or no summary"
    rc=$nrc; show ns0; show ns1
  else
    table_rows "two hosts, 2 x 2 ranks" "$tmp/ns0.out" 4
    if [ "$steps" = 100 ] && awk -v a="$acc" 'BEGIN { exit !(a > 0.5) }'; then
      ok "two hosts: 100 steps per rank, test top-1 $acc"
    else
      fail "two hosts: $steps steps (expected 100), test top-1 $acc (expected > 0.5)"
    fi
    [ ! -e "$tmp/ns1" ] || fail "two hosts: node 1 (no rank 0 there) wrote outputs"
  fi
fi

# ---- 6: a rank killed mid-epoch ---------------------------------------------------------------
section "6 a rank killed (SIGKILL)"
run_id=ddpkill$$
mkdir -p "$tmp/kill"
DDP_PID_DIR=$tmp/kill "$DTRUN" --standalone --nproc-per-node 3 --run-id "$run_id" -- bash "$W" train --strategy ddp \
  --epochs 1 --limit-train 9600 --limit-test 100 --out "$tmp/kill/o" --progress plain \
  >"$tmp/kill.out" 2>"$tmp/kill.err" </dev/null &
dpid=$!
bg_pids+=($dpid)
if ! wait_line "$tmp/kill.out" '^\[rank 0\]: epoch 1/1  step ' 30; then
  fail "kill: training did not start within 30 s"
  kill -9 "$dpid" 2>/dev/null
else
  victim=$(cat "$tmp/kill/pid.1.0")
  kill -9 "$victim"
  t0=$(date +%s.%N)
  wait_for "$dpid" 20
  dt=$(awk -v s="$t0" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }')
  if [ "$rc" -eq 1 ] && awk -v d="$dt" 'BEGIN { exit !(d < 10) }' &&
    grep -qE "^dtrun: worker failed: rank 1 \(local 1, node 0, pid $victim\) was killed by signal SIGKILL" "$tmp/kill.err"; then
    ok "kill: dtrun exits 1 ${dt} s after the kill, naming rank 1 and SIGKILL"
  else
    fail "kill: dtrun exit $rc after $dt s; stderr: $(head -c 1500 "$tmp/kill.err")"
  fi
  # Survivors stopped by dtrun may not get to say anything; what they say must name rank 1.
  peer=$(grep -E '^\[rank [02]\]: dtrain: ' "$tmp/kill.err" "$tmp/kill.out" | grep -vE 'interrupted|terminated' || true)
  if [ -n "$peer" ] && ! grep -qE 'rank 1\b' <<<"$peer"; then
    fail "kill: a surviving rank's error does not name rank 1: $peer"
  elif [ -n "$peer" ]; then
    ok "kill: survivors report the lost peer: $(head -n 1 <<<"$peer")"
  fi
  left=""
  for f in "$tmp"/kill/pid.*; do alive "$(cat "$f")" && left="$left $(cat "$f")"; done
  [ -z "$left" ] || fail "kill: workers still running after dtrun exited:$left"
  stray=$(pgrep -f -- "--out $tmp/kill/o" || true)
  [ -z "$stray" ] || { fail "kill: processes of the job still running: $(ps -o pid=,args= -p $stray)"; left="$stray"; }
  shm=$(ls /dev/shm 2>/dev/null | grep -E "^dt-$run_id-" || true)
  [ -z "$shm" ] || fail "kill: left in /dev/shm: $shm"
  [ -z "$left" ] && [ -z "$shm" ] && ok "kill: no worker left running, nothing of run $run_id in /dev/shm"
fi
# The same without a launcher to stop the survivors: they must fail with the lost peer named.
port=$(free_port)
run_id=ddphand$$
mkdir -p "$tmp/hand"
hand() { # RANK: one rank of a 3-rank job with torchrun's variables set by hand
  RANK=$1 WORLD_SIZE=3 LOCAL_RANK=$1 LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DT_NUM_THREADS=1 \
    DT_RUN_ID=$run_id DDP_PID_DIR=$tmp/hand bash "$W" train --strategy ddp --epochs 1 --limit-train 9600 \
    --limit-test 100 --out "$tmp/hand/o" --progress plain >"$tmp/hand.$1" 2>&1 </dev/null
}
hand 0 &
p0=$!
# The victim runs under a subshell that swallows the shell's "Killed" notice.
(hand 1 & wait) 2>/dev/null &
bg_pids+=($p0 $!)
hand 2 &
p2=$!
bg_pids+=($p2)
if ! wait_line "$tmp/hand.0" '^epoch 1/1  step ' 30 || [ ! -s "$tmp/hand/pid.1.0" ]; then
  fail "kill by hand: training did not start within 30 s"
else
  victim=$(cat "$tmp/hand/pid.1.0")
  kill -9 "$victim"
  t0=$(date +%s.%N)
  for r in 0 2; do
    if [ $r -eq 0 ]; then wait_for "$p0" 20; else wait_for "$p2" 20; fi
    dt=$(awk -v s="$t0" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }')
    msg=$(grep -E '^dtrain: ' "$tmp/hand.$r" | head -n 1)
    if [ "$rc" -eq 1 ] && awk -v d="$dt" 'BEGIN { exit !(d < 10) }' &&
      grep -qE "rank 1 \(pid $victim\) exited|rank 1\b.*(lost|closed|exited)" <<<"$msg"; then
      ok "kill by hand: rank $r exits 1 after $dt s: $msg"
    else
      fail "kill by hand: rank $r exit $rc after $dt s, message '$msg': $(tail -n 3 "$tmp/hand.$r")"
    fi
  done
  shm=$(ls /dev/shm 2>/dev/null | grep -E "^dt-$run_id-" || true)
  [ -z "$shm" ] || fail "kill by hand: left in /dev/shm: $shm"
fi
for f in "$tmp"/hand/pid.*; do
  p=$(cat "$f")
  alive "$p" && { fail "kill by hand: pid $p still running"; kill -9 "$p"; }
done
wait 2>/dev/null

# ---- 7: a restart -----------------------------------------------------------------------------
section "7 --max-restarts 1"
mkdir -p "$tmp/restart"
DDP_PID_DIR=$tmp/restart DDP_CRASH_RANK=1 DDP_CRASH_DELAY=0.5 dtr restart 60 --standalone --nproc-per-node 2 \
  --max-restarts 1 -- bash "$W" train --strategy ddp --epochs 1 --limit-train 1000 --limit-test 200 \
  --out "$tmp/restart/o" --progress none
if [ "$rc" -eq 0 ] && grep -q 'rank 1 crashing on round 0' "$tmp/restart.err" &&
  grep -q 'restarting the workers (restart 1 of 1)' "$tmp/restart.err" && [ -f "$tmp/restart/pid.0.1" ] &&
  [ -f "$tmp/restart/pid.1.1" ] && [ -s "$tmp/restart/o/model.safetensors" ]; then
  ok "restart: rank 1 failed in round 0, the job restarted once (restart 1 of 1) and finished"
else
  fail "restart: exit $rc"
  show restart
fi

# ---- 8: usage errors, bf16 hook ----------------------------------------------------------------
section "8 usage errors, --comm-hook bf16"
"$DTRAIN" train --strategy ddp --limit-train 100 --out "$tmp/u1" >"$tmp/u1.out" 2>"$tmp/u1.err" </dev/null
rc=$?
if [ "$rc" -eq 1 ] && [ "$(grep -c '' "$tmp/u1.err")" -eq 1 ] && grep -q 'RANK' "$tmp/u1.err" &&
  grep -q 'WORLD_SIZE' "$tmp/u1.err" && [ ! -e "$tmp/u1/model.safetensors" ]; then
  ok "ddp without a launcher: exit 1, one line: $(cat "$tmp/u1.err")"
else
  fail "ddp without a launcher: exit $rc, stderr: $(cat "$tmp/u1.err")"
fi
"$DTRAIN" train --workers 2 --limit-train 100 --out "$tmp/u2" >"$tmp/u2.out" 2>"$tmp/u2.err" </dev/null
rc=$?
[ "$rc" -eq 2 ] && grep -q -- '--workers' "$tmp/u2.err" && ok "--workers without dp: exit 2" ||
  fail "--workers without dp: exit $rc, stderr: $(cat "$tmp/u2.err")"
# A launcher's copies of a run with no --strategy would each train alone into the same outputs: every copy refuses;
# an explicit --strategy runs them on purpose.
dtr u4 60 --standalone --nproc-per-node 2 -- "$DTRAIN" train --limit-train 100 --out "$tmp/u4"
[ "$rc" -ne 0 ] && grep -q 'one of 2 a launcher started (WORLD_SIZE=2) and no --strategy was given' "$tmp/u4.err" &&
  grep -q -- 'add --strategy ddp' "$tmp/u4.err" && [ ! -e "$tmp/u4" ] &&
  ok "no --strategy under dtrun x2: refused, nothing written" || { fail "no --strategy under dtrun x2"; show u4; }
for v in OMPI_COMM_WORLD_SIZE SLURM_STEP_NUM_TASKS; do
  env "$v=3" "$DTRAIN" train --limit-train 100 --out "$tmp/u5" >"$tmp/u5.out" 2>"$tmp/u5.err" </dev/null
  rc=$?
  [ "$rc" -eq 2 ] && [ "$(grep -c '' "$tmp/u5.err")" -eq 1 ] &&
    grep -q "one of 3 a launcher started ($v=3) and no --strategy" "$tmp/u5.err" && [ ! -e "$tmp/u5" ] &&
    ok "no --strategy as one of 3 ($v): exit 2, one line" || fail "$v=3: exit $rc, $(cat "$tmp/u5.err")"
done
for e in WORLD_SIZE=1 "WORLD_SIZE=2 --strategy single"; do
  set -- $e
  env "$1" "$DTRAIN" train "${@:2}" --limit-train 64 --limit-test 64 --out "$tmp/u6" >"$tmp/u6.out" 2>&1 </dev/null
  rc=$?
  [ "$rc" -eq 0 ] && [ -e "$tmp/u6/model.safetensors" ] && ok "$e: trains" ||
    { fail "$e: exit $rc"; tail -3 "$tmp/u6.out"; }
  rm -rf "$tmp/u6"
done
dtr u3 60 --standalone --nproc-per-node 1 -- "$DTRAIN" train --strategy ddp --sharded-update on --clip-grad-norm 1 \
  --limit-train 100 --out "$tmp/u3"
[ "$rc" -ne 0 ] && grep -q -- '--sharded-update on: --clip-grad-norm reads the averaged gradients' "$tmp/u3.err" &&
  [ ! -e "$tmp/u3/model.safetensors" ] && ok "--sharded-update on with --clip-grad-norm: refused, one line" ||
  fail "--sharded-update on with --clip-grad-norm: exit $rc, stderr: $(tail -n 2 "$tmp/u3.err")"
dtr bf16 60 --standalone --nproc-per-node 2 -- "$DTRAIN" train "${base_args[@]}" --comm-hook bf16 --out "$tmp/bf16" \
  --progress none
if [ "$rc" -ne 0 ]; then
  fail "--comm-hook bf16: exit $rc"
  show bf16
elif [ -f "$tmp/ddp2/summary.json" ]; then
  a0=$(json "$tmp/ddp2/summary.json" test_acc1)
  a1=$(json "$tmp/bf16/summary.json" test_acc1)
  grep -q '"comm_hook":"bf16"' "$tmp/bf16/config.json" || fail "--comm-hook bf16: config.json does not record it"
  # Same seed and data: only the compressed all-reduce can move the loss.
  l0=$(json "$tmp/ddp2/summary.json" test_loss)
  l1=$(json "$tmp/bf16/summary.json" test_loss)
  [ "$l0" != "$l1" ] || fail "--comm-hook bf16: test loss $l1 identical to the run without the hook (was it applied?)"
  if near "$a0" "$a1" 0.03 && awk -v a="$a1" 'BEGIN { exit !(a > 0.5) }'; then
    ok "--comm-hook bf16: test top-1 $a1 (without: $a0)"
  else
    fail "--comm-hook bf16: test top-1 $a1, without the hook $a0 (expected within 3 points, > 0.5)"
  fi
fi

# ---- 9: SIGINT --------------------------------------------------------------------------------
section "9 SIGINT"
"$DTRUN" --standalone --nproc-per-node 2 -- "$DTRAIN" train --strategy ddp --epochs 2 --limit-train 9600 \
  --limit-test 300 --out "$tmp/int" --progress plain >"$tmp/int.out" 2>"$tmp/int.err" </dev/null &
dpid=$!
bg_pids+=($dpid)
if ! wait_line "$tmp/int.out" '^\[rank 0\]: epoch 1/2  step ' 30; then
  fail "SIGINT: training did not start within 30 s"
  kill -9 "$dpid"
else
  kill -INT "$dpid"
  wait_for "$dpid" 20
  s0=$(sed -n 's/^\[rank 0\]: dtrain: interrupted after \([0-9]*\) step(s).*/\1/p' "$tmp/int.err")
  s1=$(sed -n 's/^\[rank 1\]: dtrain: interrupted after \([0-9]*\) step(s).*/\1/p' "$tmp/int.err")
  csvstep=$(csv_last "$tmp/int/metrics.csv" step 2>/dev/null)
  sm0=$(grep -E '^\[rank 0\]: +0 +[0-9.]+ ' "$tmp/int.out" | awk '{ print $7 }')
  sm1=$(grep -E '^\[rank 0\]: +1 +[0-9.]+ ' "$tmp/int.out" | awk '{ print $7 }')
  if [ "$rc" -eq 130 ] && [ -n "$s0" ] && [ "$s0" = "$s1" ] && [ "$csvstep" = "$s0" ] && [ -n "$sm0" ] &&
    [ "$sm0" = "$sm1" ] && [ "$(json "$tmp/int/summary.json" interrupted)" = true ] &&
    [ "$(json "$tmp/int/summary.json" steps)" = "$s0" ] && [ -s "$tmp/int/model.safetensors" ]; then
    ok "SIGINT: exit 130, both ranks stopped after step $s0 ($sm0 samples each), metrics and weights written"
  else
    fail "SIGINT: exit $rc, steps rank 0 '$s0' rank 1 '$s1', metrics.csv step '$csvstep', table samples '$sm0'/'$sm1', summary: $(cat "$tmp/int/summary.json" 2>/dev/null)"
    show int
  fi
fi

section "done"
[ "$failures" -eq 0 ] || { echo "$failures check(s) failed" >&2; exit 1; }
echo "all checks passed"
