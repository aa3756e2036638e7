#!/usr/bin/env bash
# make demo-cifar: resnet20 on a random 8,000 of CIFAR-10's training images (image folders), DDP on 2 local
# workers, scored on a random 1,000 test images.
# usage: scripts/demo_cifar.sh BUILD_DIR CIFAR_DIR [TRAIN_IMAGES] [TEST_IMAGES]
# --limit-train/--limit-test draw a seeded random subset of a folder (--limit-pick auto): the folder is sorted by
# class, so its first images would all be airplanes.
set -euo pipefail
build=${1:?usage: demo_cifar.sh BUILD_DIR CIFAR_DIR [TRAIN_IMAGES] [TEST_IMAGES]}
cifar=${2:?usage: demo_cifar.sh BUILD_DIR CIFAR_DIR [TRAIN_IMAGES] [TEST_IMAGES]}
train_n=${3:-8000}
test_n=${4:-1000}
if [ ! -d "$cifar/train" ] || [ ! -d "$cifar/test" ]; then
  echo "make demo-cifar: no CIFAR-10 image folder at '$cifar' (it needs train/<class>/*.jpg and test/<class>/*.jpg);" \
    "give its path: make demo-cifar CIFAR=/path/to/cifar10" >&2
  exit 1
fi
exec "$build/dtrun" --standalone --nproc-per-node 2 -- "$build/dtrain" train --strategy ddp \
  --model resnet20 --data "$cifar" --augment cifar --epochs 1 --batch-size 64 --limit-train "$train_n" \
  --limit-test "$test_n" --optimizer sgd --lr 0.05 --momentum 0.9 --weight-decay 5e-4 --out runs/demo-cifar --overwrite
