#!/usr/bin/env bash
# dtrain eval on image weights: a tiny image folder (PNG and JPEG written with PIL), resnet20 trained
# with --augment cifar; the weights record augment, image_mean and image_std; eval with no flags but
# --weights reproduces the run's final test loss and top-1 (summary.json); --augment none overrides
# (other inputs, other loss); config.json records "augment", and --resume on another preset is a
# data change (refused without --allow-data-change); --limit-train/--limit-test draw a seeded random subset
# of the class-sorted folder by default, first N on request, and a changed pick is a data change too.
# resnet9 --width 4 --tta flip: config.json and the weights record the width and the flip, and eval with no
# flags rebuilds that width and reproduces the run's test figures (each image scored with its mirror); --tta none
# gives others, --width 8 another model; --width on a model without one, and --tta flip on data that are not images, are usage errors.
set -u
b=${DT_BUILD_DIR:?DT_BUILD_DIR must name the build directory}
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export DT_NUM_THREADS=1
DTRAIN=$b/dtrain
. "$SRC/tests/cli/common.sh" # fail, ok, section, run, show
[ -x "$DTRAIN" ] || { echo "FAIL: $DTRAIN is not built" >&2; exit 1; }
/usr/bin/python3 -c 'import PIL' 2>/dev/null || { echo "skip: python3 PIL is not installed"; exit 77; }

use_tmp
section "a tiny image folder: 3 classes, 32x32, train 8 + test 4 per class"
/usr/bin/python3 - "$tmp/img" <<'EOF' || { echo "FAIL: could not write the images" >&2; exit 1; }
import os, random, sys
from PIL import Image
root, rng = sys.argv[1], random.Random(7)
for split, n in (("train", 8), ("test", 4)):
    for c, name in enumerate(("cat", "dog", "frog")):
        d = os.path.join(root, split, name)
        os.makedirs(d)
        for i in range(n):
            base = [(200, 40, 40), (40, 200, 40), (40, 40, 200)][c]
            px = bytes(max(0, min(255, v + rng.randint(-60, 60))) for _ in range(32 * 32) for v in base)
            img = Image.frombytes("RGB", (32, 32), px)
            if i % 2: img.save(os.path.join(d, f"{i}.png"))
            else: img.save(os.path.join(d, f"{i}.jpg"), quality=90)
EOF
ok "wrote $(find "$tmp/img" -type f | wc -l) images"

section "train resnet20 --augment cifar, then eval from the metadata"
run train 300 "$DTRAIN" train --model resnet20 --data "$tmp/img" --augment cifar --epochs 2 --batch-size 8 \
  --optimizer sgd --lr 0.05 --momentum 0.9 --out "$tmp/run" --progress none --save-every 1
[ "$rc" = 0 ] || { show train; fail "train exit $rc"; exit 1; }
grep -q '"augment":"cifar"' "$tmp/run/config.json" || fail "config.json records no augment: $(cat "$tmp/run/config.json")"
meta=$(/usr/bin/python3 - "$tmp/run/model.safetensors" <<'EOF'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    m = json.loads(f.read(n))["__metadata__"]
print(m.get("augment"), m.get("image_mean"), m.get("image_std"))
EOF
)
[ "$meta" = "cifar 0.4914,0.4822,0.4465 0.247,0.2435,0.2616" ] &&
  ok "metadata: augment image_mean image_std = $meta" || fail "metadata augment/mean/std: '$meta'"

summary() { /usr/bin/python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print("%.4f %.2f" % (s["test_loss"], 100*s["test_acc1"]))' "$1"; }
want=$(summary "$tmp/run/summary.json")
run eval 120 "$DTRAIN" eval --weights "$tmp/run/model.safetensors"
[ "$rc" = 0 ] || { show eval; fail "eval exit $rc"; }
got=$(sed -nE 's/.*loss ([0-9.]+)  top1 ([0-9.]+)%.*/\1 \2/p' "$tmp/eval.out")
[ -n "$want" ] && [ "$got" = "$want" ] && ok "eval = the run's final test loss and top-1 ($got)" ||
  fail "eval loss/top1 '$got' != summary.json '$want': $(cat "$tmp/eval.out")"
grep -q "(12 samples)" "$tmp/eval.out" || fail "eval should see the 12 test images: $(cat "$tmp/eval.out")"

run eval_none 120 "$DTRAIN" eval --weights "$tmp/run/model.safetensors" --augment none
none=$(sed -nE 's/.*loss ([0-9.]+)  top1 ([0-9.]+)%.*/\1 \2/p' "$tmp/eval_none.out")
[ "$rc" = 0 ] && [ -n "$none" ] && [ "$none" != "$got" ] && ok "--augment none overrides the metadata ($none)" ||
  fail "eval --augment none: rc $rc, '$none' should differ from '$got'"
run eval_bad 30 "$DTRAIN" eval --weights "$tmp/run/model.safetensors" --augment flip
[ "$rc" = 2 ] && grep -q "not one of none/cifar/imagenet" "$tmp/eval_bad.err" && ok "--augment flip: usage error" ||
  { show eval_bad; fail "eval --augment flip: exit $rc"; }

section "resnet9 --width 4 --tta flip: recorded, and eval builds that width"
run r9 120 "$DTRAIN" train --model resnet9 --width 4 --data "$tmp/img" --augment cifar --epochs 1 --batch-size 8 \
  --optimizer sgd --lr 0.05 --momentum 0.9 --nesterov --tta flip --out "$tmp/r9" --progress none
[ "$rc" = 0 ] || { show r9; fail "train resnet9 exit $rc"; }
grep -q '"width":4' "$tmp/r9/config.json" && grep -q '"tta":"flip"' "$tmp/r9/config.json" &&
  ok "config.json records the width and the test-time flip" ||
  fail "config.json records no width or tta: $(cat "$tmp/r9/config.json")"
run r9_eval 60 "$DTRAIN" eval --weights "$tmp/r9/model.safetensors"
r9_got=$(sed -nE 's/.*loss ([0-9.]+)  top1 ([0-9.]+)%.*/\1 \2/p' "$tmp/r9_eval.out")
[ "$rc" = 0 ] && [ -n "$r9_got" ] && [ "$r9_got" = "$(summary "$tmp/r9/summary.json")" ] &&
  grep -q "each with its mirror" "$tmp/r9_eval.out" &&
  ok "eval takes width 4 and the flip from the metadata: the run's figures ($r9_got)" ||
  { show r9_eval; fail "eval of resnet9 --width 4 --tta flip: rc $rc, '$r9_got'"; }
run r9_plain 60 "$DTRAIN" eval --weights "$tmp/r9/model.safetensors" --tta none
r9_plain=$(sed -nE 's/.*loss ([0-9.]+)  top1 ([0-9.]+)%.*/\1 \2/p' "$tmp/r9_plain.out")
[ "$rc" = 0 ] && [ -n "$r9_plain" ] && [ "$r9_plain" != "$r9_got" ] && ! grep -q "mirror" "$tmp/r9_plain.out" &&
  ok "eval --tta none scores otherwise ($r9_plain)" ||
  { show r9_plain; fail "eval --tta none: rc $rc, '$r9_plain' should differ from '$r9_got'"; }
run r9_width 60 "$DTRAIN" eval --weights "$tmp/r9/model.safetensors" --width 8
[ "$rc" = 1 ] && grep -q "shape" "$tmp/r9_width.err" && ok "eval --width 8 overrides the metadata (shapes differ: exit 1)" ||
  { show r9_width; fail "eval --width 8 on width-4 weights: exit $rc"; }
# Under DDP each rank flips its share of the test images and the exact reduction adds them up: the same figures
# as one process scoring the saved weights.
timeout -k 2 120 "$b/dtrun" --standalone --nproc-per-node 2 -- "$DTRAIN" train --strategy ddp --model resnet9 \
  --width 4 --data "$tmp/img" --augment cifar --epochs 1 --batch-size 4 --tta flip --out "$tmp/r9ddp" \
  --progress none >"$tmp/r9ddp.out" 2>"$tmp/r9ddp.err" </dev/null
rc=$?
run r9ddp_eval 60 "$DTRAIN" eval --weights "$tmp/r9ddp/model.safetensors"
r9ddp=$(sed -nE 's/.*loss ([0-9.]+)  top1 ([0-9.]+)%.*/\1 \2/p' "$tmp/r9ddp_eval.out")
[ -n "$r9ddp" ] && [ "$r9ddp" = "$(summary "$tmp/r9ddp/summary.json")" ] && grep -q "each with its mirror" "$tmp/r9ddp_eval.out" &&
  ok "ddp x2 --tta flip: the run's figures are one process's ($r9ddp)" ||
  { show r9ddp; show r9ddp_eval; fail "ddp --tta flip: train rc $rc, eval '$r9ddp' vs $(summary "$tmp/r9ddp/summary.json" 2>&1)"; }
run tta_bad 30 "$DTRAIN" train --model mlp --data synthetic:64 --tta flip --out "$tmp/tta_bad"
[ "$rc" = 2 ] && grep -q "mirrors images (C, H, W)" "$tmp/tta_bad.err" && ok "--tta flip on vectors: usage error" ||
  { show tta_bad; fail "--tta flip on vectors: exit $rc"; }
run r9_bad 30 "$DTRAIN" train --model resnet18 --width 4 --data "$tmp/img" --out "$tmp/r18"
[ "$rc" = 2 ] && grep -q -- "--width applies only to" "$tmp/r9_bad.err" && ok "--width with resnet18: usage error" ||
  { show r9_bad; fail "--width with resnet18: exit $rc"; }

section "resume on another preset is a data change"
run resume 120 "$DTRAIN" train --model resnet20 --data "$tmp/img" --augment none --epochs 3 --batch-size 8 \
  --optimizer sgd --lr 0.05 --momentum 0.9 --out "$tmp/run" --progress none --resume auto
[ "$rc" = 2 ] && grep -q "augment" "$tmp/resume.err" && ok "--resume with --augment none refused (exit 2)" ||
  { show resume; fail "resume on another augment preset: exit $rc"; }

section "--limit-train / --limit-test on a folder sorted by class: a random N by default (--limit-pick auto)"
lp() { # NAME PICK [FLAGS...]: 1 epoch of resnet20 on 6 training and 4 test images of the folder
  local name=$1 pick=$2
  shift 2
  run_ok "$name" 120 "$DTRAIN" train --model resnet20 --data "$tmp/img" --epochs 1 --batch-size 6 --optimizer sgd \
    --lr 0.05 --limit-train 6 --limit-test 4 ${pick:+--limit-pick "$pick"} --out "$tmp/$name" --progress none "$@"
}
lp pick_auto "" --save-every 1
lp pick_random random
lp pick_first first
grep -q "^--limit-train 6: a random 6 of 24 samples (--limit-pick auto, seed 0)" "$tmp/pick_auto.out" &&
  grep -q "^--limit-test 4: a random 4 of 12 samples" "$tmp/pick_auto.out" && ok "auto picks at random on a folder" ||
  fail "auto on a folder should say it picks at random: $(cat "$tmp/pick_auto.out")"
grep -q "a random" "$tmp/pick_first.out" && fail "--limit-pick first should take the first N: $(cat "$tmp/pick_first.out")"
same_weights "auto = random on a folder (one seeded draw)" pick_auto pick_random
d=$(max_diff "$tmp/pick_first/model.safetensors" "$tmp/pick_random/model.safetensors")
awk -v d="$d" 'BEGIN { exit !(d > 1e-3) }' && ok "first and random train on other images (max |diff| $d)" ||
  fail "first and random gave the same weights (max |diff| $d)"
grep -q '"limit_pick":"first"' "$tmp/pick_first/config.json" || fail "config.json records no limit_pick"
run pick_resume 120 "$DTRAIN" train --model resnet20 --data "$tmp/img" --epochs 2 --batch-size 6 --optimizer sgd \
  --lr 0.05 --limit-train 6 --limit-test 4 --limit-pick first --out "$tmp/pick_auto" --progress none --resume auto
[ "$rc" = 2 ] && grep -q "limit_pick" "$tmp/pick_resume.err" && ok "--resume with another --limit-pick refused (exit 2)" ||
  { show pick_resume; fail "resume with another limit pick: exit $rc"; }

[ "$failures" = 0 ] || { echo "$failures failure(s)" >&2; exit 1; }
echo "all image eval checks passed"
