#!/usr/bin/env bash
# make demo-cifar: resnet20 on a class-balanced slice of CIFAR-10 (image folders), DDP on 2 local workers.
# usage: scripts/demo_cifar.sh BUILD_DIR CIFAR_DIR [TRAIN_PER_CLASS] [TEST_PER_CLASS]
# The slice is links to the first images of every class (BUILD_DIR/demo-cifar-data): --limit-train alone
# would take the first images of the sorted folder, all of class 0 (airplane).
set -euo pipefail
build=${1:?usage: demo_cifar.sh BUILD_DIR CIFAR_DIR [TRAIN_PER_CLASS] [TEST_PER_CLASS]}
cifar=${2:?usage: demo_cifar.sh BUILD_DIR CIFAR_DIR [TRAIN_PER_CLASS] [TEST_PER_CLASS]}
train_n=${3:-800}
test_n=${4:-100}
if [ ! -d "$cifar/train" ] || [ ! -d "$cifar/test" ]; then
  echo "make demo-cifar: no CIFAR-10 image folder at '$cifar' (it needs train/<class>/*.jpg and test/<class>/*.jpg);" \
    "give its path: make demo-cifar CIFAR=/path/to/cifar10" >&2
  exit 1
fi
cifar=$(cd "$cifar" && pwd)
slice=$build/demo-cifar-data
rm -rf "$slice"
for split in train test; do
  n=$([ $split = train ] && echo "$train_n" || echo "$test_n")
  for class_dir in "$cifar/$split"/*/; do
    class=$(basename "$class_dir")
    mkdir -p "$slice/$split/$class"
    files=("$class_dir"*)
    ln -s "${files[@]:0:$n}" "$slice/$split/$class/"
  done
done
[ -n "$(find "$slice/train" -type l -print -quit)" ] || { echo "make demo-cifar: no images under $cifar/train/<class>/" >&2; exit 1; }
echo "demo-cifar: $(find "$slice/train" -type l | wc -l) training and $(find "$slice/test" -type l | wc -l) test images" \
  "of $cifar (the first $train_n and $test_n of each class)"
exec "$build/dtrun" --standalone --nproc-per-node 2 -- "$build/dtrain" train --strategy ddp \
  --model resnet20 --data "$slice" --augment cifar --epochs 1 --batch-size 64 \
  --optimizer sgd --lr 0.05 --momentum 0.9 --weight-decay 5e-4 --out runs/demo-cifar --overwrite
