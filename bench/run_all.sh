#!/usr/bin/env bash
# make bench: every benchmark, side by side with its reference, on this machine.
# Long (about 20-30 minutes on 2 cores); results go to stdout: copy them into docs/benchmarks.md.
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
echo "# $(date -u +%Y-%m-%d) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo
echo "## GEMM-bound MLP vs OpenBLAS sgemm"
"$build/bench/mlp_vs_sgemm"
echo
echo "## dtrain's f32 GEMM (DT_SGEMM's choice) vs OpenBLAS on dtrain's shapes, OpenBLAS as the environment sets it"
echo "## and on the kernels it picks for this CPU itself"
"$build/bench/sgemm_shapes"
env -u OPENBLAS_CORETYPE "$build/bench/sgemm_shapes"
echo
echo "## bf16 GEMMs (dtrain's own, oneDNN's) vs the f32 GEMM on dtrain's shapes (CPUs with AVX512_BF16 only)"
"$build/bench/gemm_bf16_shapes" || echo "(skipped: no AVX512_BF16 on this CPU)"
echo
echo "## mixed precision: f32 vs --amp bf16 (dtrain's kernel, oneDNN's, the emulation) vs PyTorch's CPU autocast"
DT_BUILD_DIR=$build /usr/bin/python3 "$here/amp_vs_f32.py" --reps "${REPS:-3}"
echo
echo "## fashioncnn, Fashion-MNIST, batch 64, SGD momentum 0.9, one epoch: dtrain vs PyTorch"
DT_BUILD_DIR=$build /usr/bin/python3 "$here/train_vs_torch.py" --reps "${REPS:-3}"
echo
echo "## mlp 784-2048-2048-10, batch 256, one epoch: dtrain vs PyTorch"
DT_BUILD_DIR=$build /usr/bin/python3 "$here/train_vs_torch.py" --model mlp --hidden 2048,2048 --batch-size 256 --reps "${REPS:-3}"
echo
echo "## all-reduce of floats: dtrain shm/tcp vs Open MPI (vader/tcp), 2 and 4 ranks"
/usr/bin/python3 "$here/allreduce_vs_mpi.py" --build "$build" --ranks 2,4 -b 8 -e 64M -f 8 --reps "${REPS:-3}"
echo
echo "## the in-place all-reduce of a DDP gradient on shared memory, 2 ranks pinned: dtrain vs a plain hand-written exchange"
"$build/dtrun" --standalone --nproc-per-node 2 --threads-per-proc 1 -- "$build/bench/allreduce_vs_plain"
echo
echo "## the default mlp's step, 2 ranks pinned, in a mock: data-parallel against its first layer split between the ranks"
"$build/bench/split_first_layer"
echo
echo "## fashioncnn DDP, 2 processes x 1 thread, batch 64 per process, one epoch: dtrain vs PyTorch DDP (gloo)"
DT_BUILD_DIR=$build /usr/bin/python3 "$here/ddp_vs_torch.py" --reps "${REPS:-3}"
echo
echo "## step latency: the DDP tutorial's fake-data regression (Linear(20, 1), batch 32, 50 epochs), single and DDP x2: dtrain vs PyTorch"
DT_BUILD_DIR=$build /usr/bin/python3 "$here/synthetic_vs_torch.py" --reps "${REPS:-3}"
echo
echo "## scaling: single vs ddp/dp with 1..2 workers of 1 thread and indep (the machine's ceiling), each row the median of ${REPS:-3} alternated rounds"
for model in "--model fashioncnn" "--model mlp --hidden 2048,2048" "--model mlp"; do
  # shellcheck disable=SC2086 # the model flags split into words on purpose
  "$build/dtrain" bench scaling $model --max-workers 2 --limit-train 19200 --reps "${REPS:-3}"
done
echo
echo "## the store under 1,000 hostile connections: a 2-rank DDP job's throughput and weights, the store's CPU"
DT_BUILD_DIR=$build /usr/bin/python3 "$here/store_stress.py" --reps "${REPS:-3}"
echo
echo "## what snapshots, TensorBoard and the trace cost (fashioncnn), and one snapshot vs torch.save"
DT_BUILD_DIR=$build /usr/bin/python3 "$here/observability.py" --reps "${REPS:-3}"
echo
echo "## MovieLens ml-latest-small, mf and ncf (Adam, batch 256, sparse embeddings), single and DDP x2: dtrain vs PyTorch"
DT_BUILD_DIR=$build /usr/bin/python3 "$here/movielens_vs_torch.py" --reps "${REPS:-3}"
echo
echo "## image input pipeline alone (decode + augment, images/s per core): dtrain vs torchvision's PIL pipeline"
DT_BUILD_DIR=$build /usr/bin/python3 "$here/images_vs_torchvision.py" --reps "${REPS:-3}"
echo
echo "## resnet20 (CIFAR-10) and resnet18 (Imagenette) training, single and DDP x2, data loading included: dtrain vs PyTorch + torchvision"
/usr/bin/python3 "$here/resnet_vs_torch.py" --build "$build" --reps "${REPS:-3}"
