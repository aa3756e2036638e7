#!/usr/bin/python3
"""PyTorch DDP reference for bench/ddp_vs_torch.py: one rank of FashionCNN (or an
MLP) on Fashion-MNIST with DistributedDataParallel over gloo and a
DistributedSampler, the recipe of dtrain's --strategy ddp. Started once per rank
with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (as torchrun would);
rank 0 prints one JSON line of results.

Figures are computed as dtrain computes them: train samples/s = samples of all
ranks / rank 0's training time; inference samples/s = test samples / rank 0's
evaluation time, each rank evaluating its own contiguous share of the test set
(so top-1 is exact over the whole test set, every sample counted once)."""
import argparse, json, os, resource, sys, time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_fashioncnn import FashionCNN, load, mlp  # noqa: E402  the model definitions of the single-process bench


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--model", default="fashioncnn")
    ap.add_argument("--hidden", default="2048,2048")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=64, help="per rank")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--limit-train", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)  # the same initial weights everywhere; DDP broadcasts rank 0's anyway
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    xtr, ytr = load(a.data, "train")
    xte, yte = load(a.data, "test")
    if a.limit_train:
        xtr, ytr = xtr[:a.limit_train], ytr[:a.limit_train]
    model = FashionCNN() if a.model == "fashioncnn" else mlp([int(h) for h in a.hidden.split(",")])
    ddp = DDP(model)  # bucket_cap_mb 25, broadcast_buffers on: dtrain's defaults
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=a.momentum)
    loss_fn = nn.CrossEntropyLoss()
    train_set = torch.utils.data.TensorDataset(xtr, ytr)
    sampler = torch.utils.data.distributed.DistributedSampler(train_set, shuffle=True, seed=a.seed)
    loader = torch.utils.data.DataLoader(train_set, batch_size=a.batch_size, sampler=sampler)

    train_time, seen = 0.0, 0
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        ddp.train()
        dist.barrier()
        t0 = time.perf_counter()
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(ddp(x), y)
            loss.backward()
            opt.step()
            seen += x.size(0)
        train_time += time.perf_counter() - t0

    # Exact evaluation: rank r scores test samples [r*n/world, (r+1)*n/world).
    ddp.eval()
    n = len(xte)
    lo, hi = rank * n // world, (rank + 1) * n // world
    counts = torch.zeros(3, dtype=torch.float64)  # samples, top-1, top-5
    dist.barrier()
    t0 = time.perf_counter()
    with torch.no_grad():
        for i in range(lo, hi, 1000):
            j = min(i + 1000, hi)
            t5 = model(xte[i:j]).topk(5, dim=1).indices
            y = yte[i:j]
            counts += torch.tensor([j - i, (t5[:, 0] == y).sum().item(), (t5 == y[:, None]).any(dim=1).sum().item()],
                                   dtype=torch.float64)
    infer_time = time.perf_counter() - t0
    dist.all_reduce(counts)
    seen_all = torch.tensor([float(seen)], dtype=torch.float64)
    dist.all_reduce(seen_all)
    if rank == 0:
        print(json.dumps({
            "train_samples_per_s": seen_all.item() / train_time,
            "infer_samples_per_s": counts[0].item() / infer_time,
            "test_acc1": 100.0 * counts[1].item() / counts[0].item(),
            "test_acc5": 100.0 * counts[2].item() / counts[0].item(),
            "test_samples": int(counts[0].item()),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        }), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
