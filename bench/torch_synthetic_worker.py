#!/usr/bin/python3
"""PyTorch reference for bench/synthetic_vs_torch.py: the DDP tutorial's "fake
data" regression (x = rand(20), y = rand(1), Linear(20, 1), MSE, SGD) with the
tutorial's training loop, in one process or as one rank of DistributedDataParallel
over gloo with a DistributedSampler (when WORLD_SIZE is set, as torchrun sets it).
Prints one JSON line of results (rank 0 only under DDP).

The loop per batch is the tutorial's: zero_grad, forward, F.mse_loss, backward,
optimizer.step; plus loss.item() to report the epoch's mean train loss, as dtrain
reports it. Training time is the sum over epochs of the loop's wall time (rank 0's
under DDP; each epoch starts after a barrier), so steps/s = optimizer steps of one
process / that time."""
import argparse, json, os, resource, sys, time

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=2048, help="dataset size (all ranks together)")
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=32, help="per process")
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)  # the same data and initial weights on every rank
    world = int(os.environ.get("WORLD_SIZE", "0"))
    ddp = world > 0
    if ddp:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        rank = dist.get_rank()
    else:
        rank, world = 0, 1

    dataset = torch.utils.data.TensorDataset(torch.rand(a.samples, 20), torch.rand(a.samples, 1))
    model = torch.nn.Linear(20, 1)
    if ddp:
        sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=True, seed=a.seed)
        loader = torch.utils.data.DataLoader(dataset, batch_size=a.batch_size, shuffle=False, sampler=sampler)
        model = DDP(model)
    else:
        sampler = None
        loader = torch.utils.data.DataLoader(dataset, batch_size=a.batch_size, shuffle=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=a.lr)

    train_time, steps, first_epoch = 0.0, 0, 0.0
    for epoch in range(a.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
            dist.barrier()
        loss_sum, seen = 0.0, 0
        t0 = time.perf_counter()
        for source, targets in loader:
            optimizer.zero_grad()
            output = model(source)
            loss = F.mse_loss(output, targets)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * source.size(0)
            seen += source.size(0)
            steps += 1
        dt = time.perf_counter() - t0
        train_time += dt
        if epoch == 0:
            first_epoch = dt

    final = torch.tensor([loss_sum, float(seen)], dtype=torch.float64)
    if ddp:
        dist.all_reduce(final)  # the last epoch's mean train loss over all ranks, as dtrain reports it
    if rank == 0:
        print(json.dumps({
            "steps": steps,
            "train_seconds": train_time,
            "first_epoch_seconds": first_epoch,
            "steps_per_s": steps / train_time,
            "final_train_loss": final[0].item() / final[1].item(),
            "world_size": world,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        }), flush=True)
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
