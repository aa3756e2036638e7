#!/usr/bin/env bash
# Mixed precision through the command line (mlp on synthetic regression data, --threads 1):
#  1. --amp fp16 resumed from a mid-run snapshot = uninterrupted, bit-exact, the loss scaler included (the
#     snapshot holds it, dtrain inspect shows it, TensorBoard has amp/loss_scale and amp/skipped_steps). The scale starts at 2^24 and doubles after 5 finite steps
#     (DT_AMP_INIT_SCALE_LOG2, DT_AMP_GROWTH_INTERVAL), so the scaled gradients overflow fp16 again and again: steps
#     are skipped before and after the snapshot, and its scale and tracker are not the defaults;
#  2. --amp bf16 changes the weights (the rounding is applied) but stays within 2e-2 of f32 after 2 epochs;
#  3. ddp world 2 = world 1 under --amp bf16 (per-rank batch halved), ddp fp16 with skipped steps, and
#     dp --workers 2 = single under fp16;
#  4. a bad --amp value: one usage line, exit 2;
#  5. bert-tiny (attention, LayerNorm, GELU; padded sequences) under --amp bf16: differs from f32, within 1e-3 of it
#     after 2 epochs, and ddp world 2 = world 1 within 1e-5. SGD: a last-bit difference in an f32 sum (ranks add in
#     another order) can move a bf16-rounded operand by a whole bf16 ulp, and AdamW's normalised steps turn that
#     into 1e-2 of weight difference where SGD keeps it near 1e-6.
set -u
b=${DT_BUILD_DIR:?DT_BUILD_DIR must name the build directory}
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
export DT_BUILD_DIR=$b
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export DT_TIMEOUT=60
export DT_NUM_THREADS=1
DTRAIN=$b/dtrain
DTRUN=$b/dtrun
. "$SRC/tests/cli/common.sh"
for x in "$DTRAIN" "$DTRUN"; do [ -x "$x" ] || { echo "FAIL: $x is not built" >&2; exit 1; }; done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT OMPI_COMM_WORLD_RANK PMI_RANK SLURM_PROCID
use_tmp
run_ok() {
  run "$@"
  [ $rc -eq 0 ] || { fail "$1: exit $rc"; show "$1"; }
}
COMMON=(train --model mlp --data synthetic:512,in=20,out=1 --threads 1 --progress none --epochs 2 --lr 0.05)
# train NAME single|dp:N|WORLD ARGS...
train() {
  local name=$1 how=$2
  shift 2
  local args=("${COMMON[@]}" --out "$tmp/$name" "$@")
  case $how in
  single) run_ok "$name" 60 "$DTRAIN" "${args[@]}" ;;
  dp:*) run_ok "$name" 60 "$DTRAIN" "${args[@]}" --strategy dp --workers "${how#dp:}" ;;
  *) run_ok "$name" 60 "$DTRUN" --standalone --nproc-per-node "$how" -- "$DTRAIN" "${args[@]}" --strategy ddp ;;
  esac
}
summary_field() { /usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$@"; }
within() { # WHAT A B TOL
  local d
  d=$(max_diff "$tmp/$2/model.safetensors" "$tmp/$3/model.safetensors")
  awk -v d="$d" -v t="$4" 'BEGIN { exit !(d != "" && d <= t) }' && ok "$1 (max |diff| $d)" || fail "$1: max |diff| $d > $4"
}

section "1 fp16 resume is bit-exact with the scaler"
export DT_AMP_INIT_SCALE_LOG2=24 DT_AMP_GROWTH_INTERVAL=5
train full single --amp fp16 --batch-size 16 --save-every-steps 24 --tensorboard "$tmp/tb" --log-every 4
snap=$(ls "$tmp/full/snapshots/"step-000000048.safetensors 2>/dev/null)
[ -n "$snap" ] || fail "no snapshot at step 48 in $tmp/full/snapshots"
mkdir -p "$tmp/resumed"
train resumed single --amp fp16 --batch-size 16 --resume "$snap"
if same_tensors "$tmp/full/model.safetensors" "$tmp/resumed/model.safetensors"; then ok "resumed = uninterrupted"
else fail "fp16 resumed weights differ"; fi
skipped=$(summary_field "$tmp/full/summary.json" skipped_steps)
[ "$skipped" -gt 2 ] && ok "$skipped steps skipped for an overflow" || fail "only $skipped steps skipped"
for k in loss_scale skipped_steps; do
  a=$(summary_field "$tmp/full/summary.json" $k) c=$(summary_field "$tmp/resumed/summary.json" $k)
  [ "$a" = "$c" ] && ok "$k $a on both" || fail "$k: uninterrupted $a, resumed $c"
done
run_ok inspect 30 "$DTRAIN" inspect "$snap"
grep -q "loss scaler (--amp fp16): scale [0-9]*, growth tracker [0-4], skipped steps [1-9]" "$tmp/inspect.out" && ok "inspect shows the scaler" ||
  { fail "inspect: no loss scaler line"; grep -i scaler "$tmp/inspect.out" >&2; }
grep -rqa "amp/loss_scale" "$tmp/tb" && grep -rqa "amp/skipped_steps" "$tmp/tb" && ok "tensorboard has the scale" ||
  fail "no amp/loss_scale scalar in $tmp/tb"
grep -q "amp fp16 emulated" "$tmp/full.out" && ok "the banner names the path" || fail "banner: no amp path"
grep -q "is emulated on this CPU: expect it to be slower than f32" "$tmp/full.err" && ok "emulation said" ||
  fail "no emulation warning"

unset DT_AMP_INIT_SCALE_LOG2 DT_AMP_GROWTH_INTERVAL

section "2 bf16 rounds, close to f32"
train f32 single --batch-size 16
train bf16 single --batch-size 16 --amp bf16
if same_tensors "$tmp/f32/model.safetensors" "$tmp/bf16/model.safetensors" 2>/dev/null; then
  fail "bf16 gave f32's weights bit for bit: nothing was rounded"
else ok "bf16 weights differ from f32"; fi
within "bf16 within 2e-2 of f32" f32 bf16 2e-2

section "3 strategies under amp"
train w1 1 --amp bf16 --batch-size 32
train w2 2 --amp bf16 --batch-size 16
within "ddp world 2 = world 1 under bf16" w1 w2 1e-5
# fp16 under ddp with steps skipped (the scale starts too high): the run finishes with skips agreed. Not compared
# with world 1: each rank scales the gradient of its own 16-sample mean, twice world 1's per-sample share, so a
# near-overflow scale overflows on other steps (as in PyTorch's DDP).
export DT_AMP_INIT_SCALE_LOG2=24 DT_AMP_GROWTH_INTERVAL=5
train f2 2 --amp fp16 --batch-size 16
unset DT_AMP_INIT_SCALE_LOG2 DT_AMP_GROWTH_INTERVAL
a=$(summary_field "$tmp/f2/summary.json" skipped_steps)
[ "$a" -gt 2 ] && ok "ddp world 2 under fp16: $a steps skipped" || fail "ddp fp16: $a steps skipped"
train s16 single --amp fp16 --batch-size 32
train dp2 dp:2 --amp fp16 --batch-size 32
within "dp 2 workers = single under fp16" s16 dp2 1e-5

section "4 a bad --amp value"
run bad 10 "$DTRAIN" "${COMMON[@]}" --amp f16
[ $rc -eq 2 ] && grep -q "amp" "$tmp/bad.err" && ok "usage error: $(head -1 "$tmp/bad.err")" || { fail "--amp f16: exit $rc"; show bad; }

section "5 bert under bf16"
BERT=(--model bert-tiny --layers 2 --hidden-size 32 --heads 2 --intermediate-size 48 --dropout 0
  --data "synthetic:192,tokens=100,len=16,task=classification,out=3,seed=4" --optimizer sgd --lr 0.05)
COMMON=(train --threads 1 --progress none --epochs 2)
train bert32 single "${BERT[@]}" --batch-size 16
train bert16 single "${BERT[@]}" --batch-size 16 --amp bf16
if same_tensors "$tmp/bert32/model.safetensors" "$tmp/bert16/model.safetensors" 2>/dev/null; then
  fail "bert: bf16 gave f32's weights bit for bit"
else ok "bert bf16 weights differ from f32"; fi
within "bert bf16 within 1e-3 of f32" bert32 bert16 1e-3
train bertw1 1 "${BERT[@]}" --batch-size 16 --amp bf16
train bertw2 2 "${BERT[@]}" --batch-size 8 --amp bf16
within "bert ddp world 2 = world 1 under bf16" bertw1 bertw2 1e-5

cleanup_tmp
[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all ok"
