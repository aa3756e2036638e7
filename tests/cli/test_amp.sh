#!/usr/bin/env bash
# Mixed precision through the command line (mlp on synthetic regression data, --threads 1):
#  1. --amp fp16 resumed from a mid-run snapshot = uninterrupted, bit-exact, the loss scaler included (the
#     snapshot holds it, dtrain inspect shows it, TensorBoard has amp/loss_scale and amp/skipped_steps). The scale starts at 2^24 and doubles after 5 finite steps
#     (DT_AMP_INIT_SCALE_LOG2, DT_AMP_GROWTH_INTERVAL), so the scaled gradients overflow fp16 again and again: steps
#     are skipped before and after the snapshot, and its scale and tracker are not the defaults;
#  2. --amp bf16 changes the weights (the rounding is applied) but stays within 2e-2 of f32 after 2 epochs;
#  3. ddp world 2 = world 1 under --amp bf16 (per-rank batch halved), ddp fp16 with skipped steps, and
#     dp --workers 2 = single under fp16; --accumulate 2 = a batch twice as large under fp16 (the same steps
#     skipped) and bf16, single and ddp; --clip-grad-norm under fp16 clips the unscaled gradient; --comm-hook
#     bf16 under bf16; one rank alone overflowing: every rank skips that step;
#  4. a bad --amp value: one usage line, exit 2;
#  5. bert-tiny (attention, LayerNorm, GELU; padded sequences) under --amp bf16: differs from f32, within 1e-3 of it
#     after 2 epochs, and ddp world 2 = world 1 within 1e-5. SGD: a last-bit difference in an f32 sum (ranks add in
#     another order) can move a bf16-rounded operand by a whole bf16 ulp, and AdamW's normalised steps turn that
#     into 1e-2 of weight difference where SGD keeps it near 1e-6;
#  6. native bf16 (AVX512_BF16: our kernel, and oneDNN's) within rounding of the emulation (DT_AMP_KERNELS=emulated).
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
unset OMPI_COMM_WORLD_SIZE SLURM_STEP_NUM_TASKS # they decide whether a train without --strategy runs
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
# --accumulate 2 of 16 = one batch of 32: each micro-step's loss is scaled by scale / 2, so every row of the
# incoming gradient is the same value as in the batch of 32 and rounds alike; skipped steps agree too. Under ddp
# the same holds per rank (2 x 8 against 16 a rank; not against world 1, see above).
export DT_AMP_INIT_SCALE_LOG2=24 DT_AMP_GROWTH_INTERVAL=5
train big16 single --amp fp16 --batch-size 32
train acc16 single --amp fp16 --batch-size 16 --accumulate 2
train bigw2 2 --amp fp16 --batch-size 16
train accw2 2 --amp fp16 --batch-size 8 --accumulate 2
unset DT_AMP_INIT_SCALE_LOG2 DT_AMP_GROWTH_INTERVAL
within "--accumulate 2 = a batch twice as large under fp16" big16 acc16 1e-5
within "ddp world 2: --accumulate 2 = a batch twice as large under fp16" bigw2 accw2 1e-5
a=$(summary_field "$tmp/big16/summary.json" skipped_steps) c=$(summary_field "$tmp/acc16/summary.json" skipped_steps)
d=$(summary_field "$tmp/bigw2/summary.json" skipped_steps) e=$(summary_field "$tmp/accw2/summary.json" skipped_steps)
[ "$a" -gt 0 ] && [ "$a" = "$c" ] && [ "$d" -gt 0 ] && [ "$d" = "$e" ] &&
  ok "the same steps skipped with and without --accumulate ($a single, $d ddp)" ||
  fail "skipped steps: batch 32 $a, --accumulate 2 $c; ddp 16 a rank $d, 2 x 8 $e"
train abf single --amp bf16 --batch-size 32
train abf2 single --amp bf16 --batch-size 16 --accumulate 2
within "--accumulate 2 = a batch twice as large under bf16" abf abf2 1e-5

# Clipping under fp16 sees the unscaled gradient (scaler.unscale_ first): with a max norm of 0.05, which binds
# here (clipped and unclipped f32 end 5e-2 apart), fp16 stays within 1e-3 of f32 clipped alike (measured 1.3e-5);
# clipping the scaled gradient (2^16 times larger) would shrink every step to nothing.
train clip32 single --batch-size 16 --clip-grad-norm 0.05
train clip16 single --batch-size 16 --clip-grad-norm 0.05 --amp fp16
train noclip single --batch-size 16
within "--clip-grad-norm under fp16 within 1e-3 of f32 clipped alike" clip32 clip16 1e-3
d=$(max_diff "$tmp/clip32/model.safetensors" "$tmp/noclip/model.safetensors")
awk -v d="$d" 'BEGIN { exit !(d > 1e-2) }' && ok "the clipping binds (clipped vs not: $d)" || fail "clipping changed the weights by $d only"
# The gradient compression hooks compose with amp: world 2 under bf16 with --comm-hook bf16 stays near world 1.
train hook1 1 --amp bf16 --batch-size 32
train hook2 2 --amp bf16 --batch-size 16 --comm-hook bf16
within "ddp world 2 with --comm-hook bf16 under bf16 within 2e-2 of world 1" hook1 hook2 2e-2
# One rank alone overflows: 64 black 28x28 images and one white one (sample 37), normalised with std 1e-5 so the
# white one is 1e5 > fp16's 65504 and becomes inf in the first layer's operand. Each epoch exactly one rank meets
# it, on one step: both ranks skip that step (2 skipped over 2 epochs, nothing else overflows at the default
# scale) and end where ddp world 1, which skips the same steps, ends.
mkdir -p "$tmp/hot"
/usr/bin/python3 - "$tmp/hot" <<'EOF'
import os, struct, sys
d, n = sys.argv[1], 64
for split, m in (("train", n), ("t10k", 8)):
    img = bytearray(m * 784)
    if split == "train":
        img[37 * 784:38 * 784] = b"\xff" * 784
    open(os.path.join(d, f"{split}-images-idx3-ubyte"), "wb").write(struct.pack(">IIII", 0x803, m, 28, 28) + img)
    open(os.path.join(d, f"{split}-labels-idx1-ubyte"), "wb").write(struct.pack(">II", 0x801, m) + bytes(i % 10 for i in range(m)))
EOF
saved=("${COMMON[@]}")
COMMON=(train --model mlp --hidden 16 --data "$tmp/hot" --normalize 0,1e-5 --threads 1 --progress none --epochs 2
  --lr 0.05 --amp fp16)
train hot1 1 --batch-size 16
train hot2 2 --batch-size 8
a=$(summary_field "$tmp/hot1/summary.json" skipped_steps) c=$(summary_field "$tmp/hot2/summary.json" skipped_steps)
[ "$a" = 2 ] && [ "$c" = 2 ] && ok "one rank's overflow skips the step on every rank (2 of 2 epochs)" ||
  fail "one rank overflowing: world 1 skipped $a, world 2 skipped $c (expected 2 and 2)"
within "ddp world 2 = world 1 with one rank overflowing" hot1 hot2 1e-5
COMMON=("${saved[@]}")

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

section "6 native bf16 = the emulation, up to the order of sums"
# Where the CPU has AVX512_BF16 --amp bf16 multiplies natively (dtrain's own kernel; DT_AMP_KERNELS=onednn takes
# oneDNN's where the build has it); DT_AMP_KERNELS=emulated runs the f32 emulation on the same grid. fashioncnn on
# 2 threads multiplies from both at once (its convolution GEMMs): 16 SGD steps apart the two stay within 3e-2
# (measured 3e-3; with oneDNN's shared scratchpad between threads, 0.23). Where the CPU has no native bf16 both
# runs are the emulation and must be bit-identical.
CNN=(train --model fashioncnn --data fashion-mnist --limit-train 1024 --limit-test 64 --epochs 1 --batch-size 64
  --lr 0.01 --threads 2 --progress none --amp bf16)
run_ok cnn_auto 120 "$DTRAIN" "${CNN[@]}" --out "$tmp/cnn_auto"
DT_AMP_KERNELS=emulated run_ok cnn_emul 120 "$DTRAIN" "${CNN[@]}" --out "$tmp/cnn_emul"
if grep -q "amp bf16 native" "$tmp/cnn_auto.out"; then
  within "fashioncnn native bf16 within 3e-2 of the emulation" cnn_emul cnn_auto 3e-2
  grep -q "amp bf16 emulated" "$tmp/cnn_emul.out" && ok "DT_AMP_KERNELS=emulated names the emulation" ||
    fail "DT_AMP_KERNELS=emulated: banner $(grep -o 'amp bf16[^,]*' "$tmp/cnn_emul.out")"
  # auto: dtrain's kernel, but oneDNN's on a CPU with AMX where the build has oneDNN (its tiles are only there)
  want="dtrain's vdpbf16ps GEMM"
  grep -qw amx_bf16 /proc/cpuinfo && ldd "$DTRAIN" | grep -q libdnnl && want="oneDNN bf16 matmul"
  grep -q "amp bf16 native ($want" "$tmp/cnn_auto.out" && ok "auto takes $want" ||
    fail "auto: banner $(grep -o 'amp bf16[^,]*' "$tmp/cnn_auto.out"), expected $want"
  DT_AMP_KERNELS=emulated train berte single "${BERT[@]}" --batch-size 16 --amp bf16
  within "bert native bf16 within 1e-3 of the emulation" berte bert16 1e-3
  run cnn_dnnl 120 env DT_AMP_KERNELS=onednn "$DTRAIN" "${CNN[@]}" --out "$tmp/cnn_dnnl"
  if [ $rc -eq 0 ]; then
    grep -q "amp bf16 native (oneDNN" "$tmp/cnn_dnnl.out" && ok "DT_AMP_KERNELS=onednn names oneDNN" ||
      fail "DT_AMP_KERNELS=onednn: banner $(grep -o 'amp bf16[^,]*' "$tmp/cnn_dnnl.out")"
    within "fashioncnn oneDNN bf16 within 3e-2 of the emulation" cnn_emul cnn_dnnl 3e-2
  elif grep -q "DT_AMP_KERNELS=onednn: needs AVX512_BF16 and a build with oneDNN" "$tmp/cnn_dnnl.err"; then
    ok "DT_AMP_KERNELS=onednn refused in a build without oneDNN"
  else fail "DT_AMP_KERNELS=onednn: exit $rc"; show cnn_dnnl; fi
else
  same_tensors "$tmp/cnn_auto/model.safetensors" "$tmp/cnn_emul/model.safetensors" &&
    ok "no native bf16 here (skipped the comparison): both runs emulate, bit-identical" || fail "two emulations differ"
fi
run bad_kernels 10 env DT_AMP_KERNELS=fast "$DTRAIN" "${CNN[@]}" --out "$tmp/bad_kernels"
[ $rc -ne 0 ] && grep -q "DT_AMP_KERNELS=fast: expected auto, own, onednn or emulated" "$tmp/bad_kernels.err" &&
  ok "a bad DT_AMP_KERNELS: $(tail -1 "$tmp/bad_kernels.err")" || { fail "DT_AMP_KERNELS=fast: exit $rc"; show bad_kernels; }

cleanup_tmp
[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all ok"
