#!/usr/bin/env bash
# Snapshots, resume and run observability through the command line:
#  1. usage errors of the snapshot, resume, TensorBoard and trace flags, and of `dtrain export`;
#  2. elastic restart: dtrun --max-restarts 1 with --save-every 1 --resume auto, a worker
#     killed with SIGKILL in epoch 3 of 4 -> the job is restarted, resumes from the epoch-2
#     snapshot and ends with the very parameters of an uninterrupted run; the trace holds both
#     ranks, TensorBoard and report.html are written;
#  3. SIGINT to dtrun with --save-on-interrupt: both ranks stop at one step, rank 0 writes a
#     snapshot there, no worker or /dev/shm segment is left; resuming ends with the parameters
#     of the uninterrupted run; --tensorboard-all-ranks gives each rank its own events file;
#  4. export and inspect of a snapshot; eval of the exported weights equals eval of the final ones;
#  5. damaged and foreign snapshots given to --resume: one clear line, exit 1.
set -u
b=${DT_BUILD_DIR:?DT_BUILD_DIR must name the build directory}
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
export DT_BUILD_DIR=$b
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export DT_TIMEOUT=60
DTRAIN=$b/dtrain
DTRUN=$b/dtrun
W=$SRC/tests/cli/ddp_worker.sh
. "$SRC/tests/cli/common.sh"
for x in "$DTRAIN" "$DTRUN"; do [ -x "$x" ] || { echo "FAIL: $x is not built" >&2; exit 1; }; done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT OMPI_COMM_WORLD_RANK PMI_RANK SLURM_PROCID
unset OMPI_COMM_WORLD_SIZE SLURM_STEP_NUM_TASKS # they decide whether a train without --strategy runs

use_tmp
show() { for f in "$tmp/$1".out "$tmp/$1".err; do [ -f "$f" ] && { echo "--- $f" >&2; tail -n 15 "$f" >&2; }; done; }

# ---- 1: usage errors -----------------------------------------------------------------------------
section "1 usage errors"
expect() { # CODE EXPECTED-SUBSTRING ARGS...: dtrain exits CODE with one stderr line holding the substring
  local code=$1 want=$2
  shift 2
  "$DTRAIN" "$@" >"$tmp/e.out" 2>"$tmp/e.err" </dev/null
  local got=$?
  if [ $got -eq "$code" ] && [ "$(wc -l <"$tmp/e.err")" -eq 1 ] && grep -qF -- "$want" "$tmp/e.err"; then
    ok "exit $code: $want"
  else
    fail "$* -> exit $got (expected $code), stderr: $(cat "$tmp/e.err")"
  fi
}
usage() { expect 2 "$@"; }
usage "--keep applies only when snapshots are written" train --keep 2 --out "$tmp/never"
usage "--resume auto looks for snapshots in --out DIR" train --resume auto
usage "--log-every applies only with --tensorboard" train --log-every 5 --out "$tmp/never"
usage "--tensorboard-all-ranks needs --tensorboard DIR and --strategy ddp" train --tensorboard "$tmp/tb" --tensorboard-all-ranks
usage "--save-every: '0' is not a positive integer" train --save-every 0
usage "--save-every-steps: 'x' is not a positive integer" train --save-every-steps x
usage "--keep: '-1' is not a positive integer" train --save-every 1 --keep -1
usage "--resume: the value is empty" train --resume ""
usage "missing argument" export only-one.safetensors
usage "--format: 'onnx' is not one of safetensors" export a b --format onnx
usage "the output x is the input" export x x
for f in --save-every --save-every-steps --keep --save-on-interrupt --resume --tensorboard --tensorboard-all-ranks \
  --log-every --trace; do
  "$DTRAIN" train --help | grep -qF -- "$f" || fail "train --help does not document $f"
  grep -qF -- "\`$f" "$SRC/README.md" || fail "README does not document $f"
done
"$DTRAIN" help | grep -qE '^  export ' && ok "help lists export" || fail "help does not list export"

# ---- 2: elastic restart ----------------------------------------------------------------------------
# 3072 samples over 2 ranks, batch 32: 48 steps per epoch, epochs of about a second.
common=(train --strategy ddp --epochs 4 --limit-train 3072 --limit-test 500 --batch-size 32 --optimizer sgd
  --lr 0.05 --momentum 0.9 --save-every 1 --progress plain)
section "2 elastic restart after a SIGKILL in epoch 3"
"$DTRUN" --standalone --nproc-per-node 2 -- "$DTRAIN" "${common[@]}" --out "$tmp/ref" >"$tmp/ref.out" 2>"$tmp/ref.err" </dev/null
[ $? -eq 0 ] || { fail "reference run failed"; show ref; }
mkdir -p "$tmp/el"
DDP_PID_DIR=$tmp/el "$DTRUN" --standalone --nproc-per-node 2 --max-restarts 1 -- bash "$W" "${common[@]}" \
  --resume auto --out "$tmp/el/o" --tensorboard "$tmp/el/tb" --trace "$tmp/el/trace.json" \
  >"$tmp/el.out" 2>"$tmp/el.err" </dev/null &
dpid=$!
bg_pids+=($dpid)
if ! wait_line "$tmp/el.out" '^\[rank 0\]: epoch 3/4  step ' 60; then
  fail "elastic: epoch 3 did not start within 60 s"
  show el
else
  rows=$(($(wc -l <"$tmp/el/o/metrics.csv") - 1))
  kill -9 "$(cat "$tmp/el/pid.1.0")"
  wait_for "$dpid" 120
  if [ "$rows" -eq 2 ] && [ $rc -eq 0 ] && grep -q 'resumed from .*/snapshots/step-000000096.safetensors: epoch 3, step 96' "$tmp/el.out" &&
    [ -f "$tmp/el/pid.0.1" ] && same_tensors "$tmp/ref/model.safetensors" "$tmp/el/o/model.safetensors"; then
    ok "elastic: killed in epoch 3 (2 epochs done), restarted, resumed at step 96, final parameters equal the uninterrupted run's"
  else
    fail "elastic: exit $rc, metrics rows at the kill $rows"
    show el
  fi
  if [ "$(($(wc -l <"$tmp/el/o/metrics.csv") - 1))" -eq 4 ] && cmp -s <(cut -d, -f1-8 "$tmp/ref/metrics.csv") <(cut -d, -f1-8 "$tmp/el/o/metrics.csv"); then
    ok "elastic: metrics.csv has the 4 rows of the uninterrupted run"
  else
    fail "elastic: metrics.csv differs: $(cat "$tmp/el/o/metrics.csv")"
  fi
  /usr/bin/python3 - "$tmp/el/trace.json" <<'PY' && ok "elastic: trace.json is valid JSON with both ranks, all-reduces and snapshots" || fail "elastic: trace.json"
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"]
pids = {e["pid"] for e in ev if e.get("ph") == "X"}
names = {e["name"] for e in ev}
assert pids == {0, 1}, pids
for want in ("forward", "optimizer", "snapshot", "evaluate"):
    assert any(want in n for n in names), (want, sorted(names))
assert any(e.get("ph") == "X" and "allreduce" in e["name"] and "bytes" in e.get("args", {}) for e in ev), "no all-reduce with bytes"
PY
  tbf=$(ls "$tmp"/el/tb/events.out.tfevents.* 2>/dev/null | head -n 1)
  if [ -n "$tbf" ] && grep -qa 'Loss/train' "$tbf" && grep -qa 'acc5/val' "$tbf" && grep -qa 'throughput/samples_per_s' "$tbf"; then
    ok "elastic: TensorBoard events written ($(ls "$tmp"/el/tb | wc -l) file(s), one per round)"
  else
    fail "elastic: no TensorBoard events with the expected tags in $tmp/el/tb"
  fi
  grep -q '<svg' "$tmp/el/o/report.html" 2>/dev/null && ok "elastic: report.html written" || fail "elastic: no report.html"
fi

# ---- 3: SIGINT with --save-on-interrupt --------------------------------------------------------------
section "3 SIGINT to dtrun with --save-on-interrupt"
run_id=snapint$$
mkdir -p "$tmp/int"
DDP_PID_DIR=$tmp/int "$DTRUN" --standalone --nproc-per-node 2 --run-id "$run_id" -- bash "$W" "${common[@]}" \
  --save-on-interrupt --out "$tmp/int/o" --tensorboard "$tmp/int/tb" --tensorboard-all-ranks \
  >"$tmp/int.out" 2>"$tmp/int.err" </dev/null &
dpid=$!
bg_pids+=($dpid)
if ! wait_line "$tmp/int.out" '^\[rank 0\]: epoch 2/4  step ' 60; then
  fail "SIGINT: epoch 2 did not start within 60 s"
  show int
else
  kill -INT "$dpid"
  wait_for "$dpid" 30
  s0=$(sed -n 's/^\[rank 0\]: dtrain: interrupted after \([0-9]*\) step(s).*/\1/p' "$tmp/int.err")
  s1=$(sed -n 's/^\[rank 1\]: dtrain: interrupted after \([0-9]*\) step(s).*/\1/p' "$tmp/int.err")
  snap=$(printf '%s/int/o/snapshots/step-%09d.safetensors' "$tmp" "${s0:-0}")
  left=""
  for f in "$tmp"/int/pid.*; do alive "$(cat "$f")" && left="$left $(cat "$f")"; done
  shm=$(ls /dev/shm 2>/dev/null | grep -E "^dt-$run_id-" || true)
  if [ $rc -eq 130 ] && [ -n "$s0" ] && [ "$s0" = "$s1" ] && [ -s "$snap" ] && [ -z "$left" ] && [ -z "$shm" ] &&
    grep -q 'continue with --resume auto' "$tmp/int.err"; then
    ok "SIGINT: exit 130, both ranks stopped after step $s0, snapshot $(basename "$snap"), no worker or /dev/shm segment left"
  else
    fail "SIGINT: exit $rc, steps '$s0'/'$s1', snapshot $snap $(ls "$tmp/int/o/snapshots" 2>&1), left '$left', shm '$shm'"
    show int
  fi
  if ls "$tmp"/int/tb/events.out.tfevents.* >/dev/null 2>&1 && ls "$tmp"/int/tb/rank1/events.out.tfevents.* >/dev/null 2>&1 &&
    [ ! -e "$tmp/int/tb/rank0" ]; then
    ok "SIGINT: --tensorboard-all-ranks: rank 0 in tb/, rank 1 in tb/rank1/"
  else
    fail "SIGINT: TensorBoard files per rank: $(find "$tmp/int/tb" 2>&1 | tr '\n' ' ')"
  fi
  "$DTRUN" --standalone --nproc-per-node 2 -- "$DTRAIN" "${common[@]}" --resume auto --out "$tmp/int/o" \
    >"$tmp/int2.out" 2>"$tmp/int2.err" </dev/null
  if [ $? -eq 0 ] && grep -q "resumed from .*step-0*$s0.safetensors" "$tmp/int2.out" &&
    same_tensors "$tmp/ref/model.safetensors" "$tmp/int/o/model.safetensors"; then
    ok "SIGINT: resumed at step $s0, final parameters equal the uninterrupted run's"
  else
    fail "SIGINT: the resumed run differs or failed"
    show int2
  fi
fi

# ---- 4: export and inspect ---------------------------------------------------------------------------
section "4 export and inspect"
last=$(ls "$tmp"/ref/snapshots/step-*.safetensors | tail -n 1)
"$DTRAIN" inspect "$last" >"$tmp/insp.out" 2>&1
if grep -q 'dtrain.snapshot = 1' "$tmp/insp.out" && grep -q 'optimizer.state.fc1.weight.momentum_buffer' "$tmp/insp.out" &&
  grep -q 'trainer.position' "$tmp/insp.out" && grep -q 'dtrain.crc32 = ' "$tmp/insp.out"; then
  ok "inspect: a snapshot shows its metadata, optimizer and trainer state"
else
  fail "inspect: $(head -c 600 "$tmp/insp.out")"
fi
if "$DTRAIN" export "$last" "$tmp/exported.safetensors" >/dev/null &&
  ! "$DTRAIN" inspect "$tmp/exported.safetensors" | grep -qE 'optimizer\.|trainer\.|dtrain.snapshot' &&
  same_tensors "$tmp/exported.safetensors" "$tmp/ref/model.safetensors"; then
  ok "export: weights only, equal to the run's final model.safetensors"
else
  fail "export of $last"
fi
e1=$("$DTRAIN" eval --weights "$tmp/exported.safetensors" --limit 500 | sed 's/  [0-9.]* s .*//')
e2=$("$DTRAIN" eval --weights "$tmp/ref/model.safetensors" --limit 500 | sed 's/  [0-9.]* s .*//')
[ -n "$e1" ] && [ "$e1" = "$e2" ] && ok "eval: exported weights give the same figures ($e1)" || fail "eval: '$e1' vs '$e2'"

# ---- 5: bad snapshots --------------------------------------------------------------------------------
section "5 damaged and foreign snapshots"
runtime() { expect 1 "$@"; }
head -c 3000 "$last" >"$tmp/cut.safetensors"
runtime "cut.safetensors" train --limit-train 320 --out "$tmp/bad" --resume "$tmp/cut.safetensors" --quiet
runtime "is a snapshot of model fashioncnn, this run trains mlp" train --model mlp --limit-train 320 --out "$tmp/bad" \
  --resume "$last" --quiet
runtime "is not a dtrain snapshot" train --limit-train 320 --out "$tmp/bad" --resume "$tmp/ref/model.safetensors" --quiet
runtime "no-such" export "$tmp/no-such.safetensors" "$tmp/x.safetensors"

section "done"
[ "$failures" -eq 0 ] || { echo "$failures check(s) failed" >&2; exit 1; }
echo "all checks passed"
