#!/usr/bin/env bash
# The embedding models (mf, ncf) trained data-parallel on a tiny MovieLens directory (40 users, 60 movies,
# 400 ratings; 360 train after the 10% random split), 2 epochs, Adam with --embedding-l2:
#  1. ddp world 2 (--batch-size 16 per rank) gives world 1's weights (--batch-size 32; both ddp, so both draw the
#     DistributedSampler's order) for --embedding-exchange sparse, dense and auto, with dense updates and with
#     --sparse-embeddings (SparseAdam); auto also at 32 per rank against 64, where it picks the touched rows for
#     the factor tables and the dense all-reduce for the bias tables (fewer bytes: 1 + 32 * 2 words > 40 rows);
#  2. dp --workers 2 and 3 give the weights of one process (strategy single, same loader order);
#  3. ncf (hidden 8,4) once each: ddp world 2 vs world 1 and dp vs single, --sparse-embeddings.
# Weights within 1e-5 (max |diff|). A few seconds in all (--threads 1).
set -u
b=${DT_BUILD_DIR:?DT_BUILD_DIR must name the build directory}
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
export DT_BUILD_DIR=$b
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export DT_TIMEOUT=60 # a hung collective fails the test instead of stalling it
export DT_NUM_THREADS=1
DTRAIN=$b/dtrain
DTRUN=$b/dtrun
. "$SRC/tests/cli/common.sh" # fail, ok, section, max_diff, use_tmp
for x in "$DTRAIN" "$DTRUN"; do [ -x "$x" ] || { echo "FAIL: $x is not built" >&2; exit 1; }; done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT OMPI_COMM_WORLD_RANK PMI_RANK SLURM_PROCID
unset OMPI_COMM_WORLD_SIZE SLURM_STEP_NUM_TASKS # they decide whether a train without --strategy runs

use_tmp
# train NAME WORLD|dp:N|single ARGS...: dtrain train into $tmp/NAME (world W: dtrun with W ranks, strategy ddp).
train() {
  local name=$1 how=$2
  shift 2
  local args=(train --data "$tmp/ml" --threads 1 --progress none --epochs 2 --optimizer adam --lr 0.01
    --embedding-l2 0.05 --out "$tmp/$name" "$@")
  case $how in
  single) run_ok "$name" 60 "$DTRAIN" "${args[@]}" ;;
  dp:*) run_ok "$name" 60 "$DTRAIN" "${args[@]}" --strategy dp --workers "${how#dp:}" ;;
  *) run_ok "$name" 60 "$DTRUN" --standalone --nproc-per-node "$how" -- "$DTRAIN" "${args[@]}" --strategy ddp ;;
  esac
}
# A tiny ratings.csv: sparse original ids (users 1..40, movies 1, 11, ..., 591), ratings 0.5..5.
mkdir -p "$tmp/ml"
/usr/bin/python3 - "$tmp/ml/ratings.csv" <<'EOF'
import random, sys
r = random.Random(5)
pairs = set()
while len(pairs) < 400:
    pairs.add((r.randint(1, 40), r.choice(range(1, 600, 10))))
with open(sys.argv[1], "w") as f:
    f.write("userId,movieId,rating,timestamp\n")
    for i, (u, m) in enumerate(sorted(pairs)):
        f.write("%d,%d,%.1f,%d\n" % (u, m, r.randint(1, 10) / 2, 964982703 + i * 37 % 1000))
EOF

# ---- 1: mf, ddp world 2 vs world 1 ------------------------------------------------------------------------
section "1 mf: ddp world 2 (batch 16) vs world 1 (batch 32), every exchange, dense and sparse updates"
mf=(--model mf --factors 8)
for sp in dense sparse; do
  flag=()
  [ $sp = sparse ] && flag=(--sparse-embeddings)
  train "mf_w1_$sp" 1 "${mf[@]}" "${flag[@]}" --batch-size 32
  for ex in sparse dense auto; do
    train "mf_w2_${sp}_$ex" 2 "${mf[@]}" "${flag[@]}" --batch-size 16 --embedding-exchange $ex
    same_weights "mf, $sp updates, --embedding-exchange $ex: world 2 = world 1" "mf_w1_$sp" "mf_w2_${sp}_$ex"
  done
done
# the checks can tell: SparseAdam's weights are not dense Adam's (the batches skip rows)
d=$(max_diff "$tmp/mf_w1_dense/model.safetensors" "$tmp/mf_w1_sparse/model.safetensors")
awk -v d="$d" 'BEGIN { exit !(d != "" && d > 1e-3) }' && ok "mf: sparse and dense updates differ (max |diff| $d)" ||
  fail "mf: sparse and dense updates agree ($d): the comparisons above cannot tell them apart"
# auto with both choices in one step: 32 lookups per rank make the bias tables' rows (1 + 32 * 2 words)
# dearer than their dense all-reduce (40 and 60 words), the factor tables' rows (1 + 32 * 9) cheaper
train mf_w1_64 1 "${mf[@]}" --sparse-embeddings --batch-size 64
train mf_w2_64 2 "${mf[@]}" --sparse-embeddings --batch-size 32 --embedding-exchange auto
same_weights "mf, sparse updates, auto exchange choosing rows and dense by table: world 2 = world 1" mf_w1_64 mf_w2_64

# ---- 2: mf, dp vs single -------------------------------------------------------------------------------------
section "2 mf: dp --workers 2 and 3 vs one process"
for sp in dense sparse; do
  flag=()
  [ $sp = sparse ] && flag=(--sparse-embeddings)
  train "mf_single_$sp" single "${mf[@]}" "${flag[@]}" --batch-size 32
  for w in 2 3; do
    train "mf_dp${w}_$sp" "dp:$w" "${mf[@]}" "${flag[@]}" --batch-size 32
    same_weights "mf, $sp updates: dp --workers $w = single" "mf_single_$sp" "mf_dp${w}_$sp"
  done
done

# ---- 3: ncf ----------------------------------------------------------------------------------------------------
section "3 ncf (hidden 8,4), sparse updates: ddp world 2 vs 1, dp vs single"
ncf=(--model ncf --factors 6 --hidden 8,4 --sparse-embeddings)
train ncf_w1 1 "${ncf[@]}" --batch-size 32
train ncf_w2 2 "${ncf[@]}" --batch-size 16
same_weights "ncf: world 2 = world 1" ncf_w1 ncf_w2
train ncf_single single "${ncf[@]}" --batch-size 32
train ncf_dp2 dp:2 "${ncf[@]}" --batch-size 32
same_weights "ncf: dp --workers 2 = single" ncf_single ncf_dp2

# ---- 4: resume ---------------------------------------------------------------------------------------------------
section "4 mf, sparse updates: a run resumed mid-epoch ends with the uninterrupted run's weights, bit for bit"
rs=(--model mf --factors 6 --sparse-embeddings --batch-size 32)
train rs_whole single "${rs[@]}"
# 360 training ratings in batches of 32: 12 steps an epoch; a snapshot every 5 steps, the run stopped after 1 epoch
rs_run() { # NAME EPOCHS ARGS...
  local name=$1 epochs=$2
  shift 2
  run_ok "$name" 60 "$DTRAIN" train --data "$tmp/ml" --threads 1 --progress none --epochs "$epochs" --optimizer adam \
    --lr 0.01 --embedding-l2 0.05 "${rs[@]}" --save-every-steps 5 --out "$tmp/rs_part" "$@"
}
rs_run rs_part 1
rs_run rs_resume 2 --resume "$tmp/rs_part/snapshots/step-000000010.safetensors"
same_tensors "$tmp/rs_whole/model.safetensors" "$tmp/rs_part/model.safetensors" >"$tmp/rs.diff" 2>&1 &&
  ok "resumed at step 10 (mid-epoch 1) = uninterrupted" || { fail "resumed run differs: $(head -n 2 "$tmp/rs.diff")"; }

section "done"
[ "$failures" -eq 0 ] || { echo "$failures check(s) failed" >&2; exit 1; }
echo "all checks passed"
