#!/usr/bin/env bash
# Hugging Face checkpoints and the fine-tuning extras through the command line, over zoo models of every kind:
#  1. mlp, ncf (embeddings), fashioncnn and resnet20 (batch norm): train, export --format hf, the export's
#     tensors byte-identical to the weights, config.json; for the image models eval of the export (given
#     --model and --data: the export keeps the training's metadata in config.json only) equals eval of the weights;
#     --init-from the directory copies every tensor (no missing, nothing unused); for mlp and ncf (no running
#     statistics) one step at lr 1e-30 leaves the weights byte-identical to the export: the copy is exact;
#  2. export refuses a directory holding its outputs (exit 2, files untouched) unless --overwrite;
#  3. usage errors: --init-from with --resume, --no-decay without weight decay, --overwrite without --format hf,
#     --schedule linear with a warm-up as long as the run;
#  4. --no-decay prints the groups (counts of tensors and parameters) and the patterns that match nothing.
set -u
b=${DT_BUILD_DIR:?DT_BUILD_DIR must name the build directory}
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
DTRAIN=$b/dtrain
. "$SRC/tests/cli/common.sh"
[ -x "$DTRAIN" ] || { echo "FAIL: $DTRAIN is not built" >&2; exit 1; }
use_tmp

section "data: IDX 28x28 images, CIFAR-10 binary batches, MovieLens ratings"
/usr/bin/python3 - "$tmp" <<'EOF'
import os, random, struct, sys
root, rng = sys.argv[1], random.Random(5)
idx = os.path.join(root, "idx")
os.makedirs(idx)
for prefix, n in (("train", 64), ("t10k", 32)):
    with open(os.path.join(idx, f"{prefix}-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 28, 28) + bytes(rng.randrange(256) for _ in range(n * 784)))
    with open(os.path.join(idx, f"{prefix}-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(rng.randrange(10) for _ in range(n)))
cifar = os.path.join(root, "cifar")
os.makedirs(cifar)
for name, n in (("data_batch_1.bin", 32), ("test_batch.bin", 16)):
    with open(os.path.join(cifar, name), "wb") as f:
        for _ in range(n):
            f.write(bytes([rng.randrange(10)]) + bytes(rng.randrange(256) for _ in range(3072)))
ml = os.path.join(root, "ml")
os.makedirs(ml)
with open(os.path.join(ml, "ratings.csv"), "w") as f:
    f.write("userId,movieId,rating,timestamp\n")
    for u in range(1, 21):
        for m in range(1, 31):
            if (u * 7 + m * 5) % 3:
                f.write(f"{u},{m},{1 + (u * m) % 9 / 2:.1f},{1000 + u * 100 + m}\n")
EOF
[ -s "$tmp/ml/ratings.csv" ] && ok "data written" || fail "no data"

# model, its data and flags
declare -A data=([mlp]="synthetic:256,in=12,out=4,task=classification --val-fraction 0.25" [ncf]="$tmp/ml"
                 [fashioncnn]="$tmp/idx" [resnet20]="$tmp/cifar")
for m in mlp ncf fashioncnn resnet20; do
  section "$m: train, export --format hf, eval both, --init-from"
  # shellcheck disable=SC2086
  run "train-$m" 300 "$DTRAIN" train --model "$m" --data ${data[$m]} --epochs 1 --batch-size 16 --threads 2 \
    --progress none --out "$tmp/$m"
  [ "$rc" = 0 ] || { show "train-$m"; fail "$m: training failed"; continue; }
  run "export-$m" 60 "$DTRAIN" export "$tmp/$m/model.safetensors" "$tmp/$m-hf" --format hf
  [ "$rc" = 0 ] && grep -q "(model.safetensors, config.json)" "$tmp/export-$m.out" || { show "export-$m"; fail "$m: export"; }
  if same_tensors "$tmp/$m/model.safetensors" "$tmp/$m-hf/model.safetensors"; then ok "$m: exported tensors byte-identical"
  else fail "$m: the export's tensors differ from the weights"; fi
  /usr/bin/python3 - "$tmp/$m-hf" "$m" <<'EOF' && ok "$m: config.json and metadata as transformers writes them" || fail "$m: config.json"
import json, struct, sys
d, model = sys.argv[1], sys.argv[2]
cfg = json.load(open(d + "/config.json"))
assert cfg["torch_dtype"] == "float32" and cfg["dtrain"]["model"] == model and "architectures" not in cfg, cfg
b = open(d + "/model.safetensors", "rb").read()
h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
assert h["__metadata__"]["format"] == "pt" and set(h["__metadata__"]) == {"format", "dtrain.crc32"}, h["__metadata__"]
assert all(v["dtype"] in ("F32", "I64") for k, v in h.items() if k != "__metadata__")
EOF
  if [ "$m" = fashioncnn ] || [ "$m" = resnet20 ]; then # the export loads where the weights do (given the model)
    run "eval-w-$m" 120 "$DTRAIN" eval --weights "$tmp/$m/model.safetensors" --threads 2
    w_line=$(grep -o "loss.*%" "$tmp/eval-w-$m.out")
    run "eval-hf-$m" 120 "$DTRAIN" eval --weights "$tmp/$m-hf/model.safetensors" --model "$m" --data "${data[$m]}" \
      --threads 2
    hf_line=$(grep -o "loss.*%" "$tmp/eval-hf-$m.out")
    if [ -n "$w_line" ] && [ "$w_line" = "$hf_line" ]; then ok "$m: eval of the export = eval of the weights ($w_line)"
    else show "eval-hf-$m"; fail "$m: eval differs: '$w_line' vs '$hf_line'"; fi
  fi
  n_tensors=$(/usr/bin/python3 -c "import json,struct,sys; b=open(sys.argv[1],'rb').read(); \
print(len(json.loads(b[8:8+struct.unpack('<Q',b[:8])[0]]))-1)" "$tmp/$m-hf/model.safetensors")
  # shellcheck disable=SC2086
  run "init-$m" 300 "$DTRAIN" train --model "$m" --data ${data[$m]} --init-from "$tmp/$m-hf" --epochs 1 \
    --limit-train 1 --batch-size 1 --lr 1e-30 --threads 2 --progress none --out "$tmp/$m-init"
  if [ "$rc" = 0 ] && grep -q "init from $tmp/$m-hf/model.safetensors: $n_tensors tensor(s) copied; optimizer state starts fresh" \
      "$tmp/init-$m.out" && ! grep -q "not in the file\|are not used" "$tmp/init-$m.out"; then
    ok "$m: --init-from copied all $n_tensors tensors"
  else show "init-$m"; fail "$m: --init-from"; fi
  if [ "$m" = mlp ] || [ "$m" = ncf ]; then
    if same_tensors "$tmp/$m-hf/model.safetensors" "$tmp/$m-init/model.safetensors"; then
      ok "$m: weights after --init-from and a 1e-30 step are the export's bits"
    else fail "$m: --init-from did not copy the exact bits"; fi
  fi
done

section "export refuses to overwrite its outputs unless --overwrite"
sum_before=$(md5sum "$tmp/mlp-hf"/* | md5sum)
run export-again 60 "$DTRAIN" export "$tmp/ncf/model.safetensors" "$tmp/mlp-hf" --format hf
[ "$rc" = 2 ] && grep -q "already holds model.safetensors and config.json: give --overwrite" "$tmp/export-again.err" &&
  [ "$(md5sum "$tmp/mlp-hf"/* | md5sum)" = "$sum_before" ] && ok "refused (exit 2), files untouched" ||
  { show export-again; fail "export over existing outputs"; }
run export-over 60 "$DTRAIN" export "$tmp/ncf/model.safetensors" "$tmp/mlp-hf" --format hf --overwrite
[ "$rc" = 0 ] && same_tensors "$tmp/ncf/model.safetensors" "$tmp/mlp-hf/model.safetensors" &&
  grep -q '"model": "ncf"' "$tmp/mlp-hf/config.json" && ok "--overwrite replaced both" || { show export-over; fail "--overwrite"; }

section "usage errors"
# usage NAME SUBSTRING ARGS...: exit 2 and one line on stderr holding SUBSTRING
usage() {
  local name=$1 want=$2
  shift 2
  run "$name" 60 "$DTRAIN" "$@"
  if [ "$rc" = 2 ] && [ "$(wc -l <"$tmp/$name.err")" = 1 ] && grep -qF -- "$want" "$tmp/$name.err"; then ok "$name: exit 2"
  else show "$name"; fail "$name: expected exit 2 with '$want'"; fi
}
S=(--data synthetic:64,in=4,out=2,task=classification --progress none)
usage init-resume "--init-from starts a new run" train "${S[@]}" --model mlp --init-from "$tmp/mlp-hf" \
  --resume "$tmp/x.safetensors" --out "$tmp/u1"
usage no-decay-sgd "--no-decay exempts parameters from weight decay, but --optimizer sgd has none" train "${S[@]}" \
  --model mlp --no-decay bias --out "$tmp/u2"
usage overwrite-file "--overwrite applies to --format hf" export "$tmp/mlp/model.safetensors" "$tmp/u.safetensors" --overwrite
usage linear-warmup "warm-up of 2 epochs leaves no room for the linear schedule over 2 epochs" train "${S[@]}" \
  --model mlp --schedule linear --warmup-epochs 2 --epochs 2 --out "$tmp/u3"
usage no-decay-empty "--no-decay" train "${S[@]}" --model mlp --optimizer adamw --no-decay "bias,,x" --out "$tmp/u4"

section "--no-decay groups"
run groups 120 "$DTRAIN" train "${S[@]}" --model mlp --hidden 8 --optimizer adamw --no-decay bias,LayerNorm.weight \
  --schedule linear --warmup-steps 1 --out "$tmp/groups"
# mlp 4 -> 8 -> 2: weights 32 + 16 decay, biases 8 + 2 do not
grep -q "parameter groups: weight decay 0.01 on 2 tensor(s), 48 parameters; none on 2 tensor(s), 10 parameters" \
  "$tmp/groups.out" && grep -q 'pattern "LayerNorm.weight" matches no parameter of mlp' "$tmp/groups.out" &&
  grep -q '"no_decay":"bias,LayerNorm.weight"' "$tmp/groups/config.json" && grep -q '"schedule":"linear"' "$tmp/groups/config.json" &&
  ok "groups printed, recorded in config.json" || { show groups; fail "--no-decay groups"; }

[ "$failures" = 0 ] && echo "all HF checkpoint CLI checks passed" || echo "$failures failure(s)"
exit $((failures > 0))
