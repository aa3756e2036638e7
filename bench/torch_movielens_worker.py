#!/usr/bin/python3
"""PyTorch reference for bench/movielens_vs_torch.py: the models dtrain's zoo
calls mf (biased matrix factorisation) and ncf (user and item embeddings side by
side through an MLP) trained on MovieLens ratings with MSE, Adam and an L2 term
on the looked-up embedding rows, in one process or as one rank of
DistributedDataParallel over gloo (when WORLD_SIZE is set, as torchrun sets it).
Prints one JSON line of results (rank 0 only under DDP).

Written the way PyTorch runs this workload fastest: the ratings as three tensors
indexed by a shuffled permutation per batch (a DataLoader over a TensorDataset
costs a Python call per sample), nn.Embedding(sparse=True) with
torch.optim.SparseAdam for the tables and Adam for the rest (--dense: one Adam
over dense embeddings). The held-out 10% is a torch.randperm(seed) split;
dtrain's is its own permutation of the same seed, so the two test sets are
different samples of the same size."""
import argparse, csv, json, os, time

import torch


def load_ratings(path):
    users, items, ratings = [], [], []
    with open(os.path.join(path, "ratings.csv"), newline="") as f:
        rows = csv.reader(f)
        next(rows)
        for r in rows:
            users.append(int(r[0]))
            items.append(int(r[1]))
            ratings.append(float(r[2]))
    u, i = torch.tensor(users), torch.tensor(items)
    # dense indices in ascending id order, as dtrain's MovieLens source
    _, u = torch.unique(u, return_inverse=True)
    _, i = torch.unique(i, return_inverse=True)
    return u, i, torch.tensor(ratings)


class MF(torch.nn.Module):
    def __init__(self, users, items, k, mean, sparse):
        super().__init__()
        E = lambda n, d: torch.nn.Embedding(n, d, sparse=sparse)
        self.user_factors, self.item_factors = E(users, k), E(items, k)
        self.user_bias, self.item_bias = E(users, 1), E(items, 1)
        for e in (self.user_factors, self.item_factors):
            torch.nn.init.normal_(e.weight, std=0.01)
        for e in (self.user_bias, self.item_bias):
            torch.nn.init.zeros_(e.weight)
        self.global_bias = torch.nn.Parameter(torch.tensor([mean]))

    def forward(self, u, i):
        p, q = self.user_factors(u), self.item_factors(i)
        out = self.global_bias + self.user_bias(u).squeeze(1) + self.item_bias(i).squeeze(1) + (p * q).sum(1)
        return out, p, q


class NCF(torch.nn.Module):
    def __init__(self, users, items, k, hidden, sparse):
        super().__init__()
        self.user_embedding = torch.nn.Embedding(users, k, sparse=sparse)
        self.item_embedding = torch.nn.Embedding(items, k, sparse=sparse)
        for e in (self.user_embedding, self.item_embedding):
            torch.nn.init.normal_(e.weight, std=0.01)
        layers, width = [], 2 * k
        for h in hidden:
            layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
            width = h
        self.mlp = torch.nn.Sequential(*layers)
        self.out = torch.nn.Linear(width, 1)

    def forward(self, u, i):
        p, q = self.user_embedding(u), self.item_embedding(i)
        return self.out(self.mlp(torch.cat([p, q], 1))).squeeze(1), p, q


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="a MovieLens directory with ratings.csv")
    ap.add_argument("--model", choices=("mf", "ncf"), default="mf")
    ap.add_argument("--factors", type=int, default=0, help="0: 64 for mf, 32 for ncf (dtrain's defaults)")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=256, help="per process")
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--l2", type=float, default=0.05)
    ap.add_argument("--dense", action="store_true", help="dense embeddings and one Adam")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    world = int(os.environ.get("WORLD_SIZE", "0"))
    ddp = world > 0
    if ddp:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        rank = dist.get_rank()
    else:
        rank, world = 0, 1

    u, i, y = load_ratings(a.data)
    n = len(y)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(a.seed))
    n_val = round(0.1 * n)
    val, train = perm[:n_val], perm[n_val:]
    users, items = int(u.max()) + 1, int(i.max()) + 1
    k = a.factors or (64 if a.model == "mf" else 32)
    sparse = not a.dense
    if a.model == "mf":
        model = MF(users, items, k, float(y[train].mean()), sparse)
    else:
        model = NCF(users, items, k, (64, 32), sparse)
    net = DDP(model) if ddp else model
    tables = [p for name, p in model.named_parameters() if name.endswith("weight") and "mlp" not in name
              and not name.startswith("out")]
    rest = [p for p in model.parameters() if all(p is not t for t in tables)]
    if sparse:
        optims = [torch.optim.SparseAdam(tables, lr=a.lr), torch.optim.Adam(rest, lr=a.lr)]
    else:
        optims = [torch.optim.Adam(model.parameters(), lr=a.lr)]

    train_time, steps, seen_total = 0.0, 0, 0
    for epoch in range(a.epochs):
        g = torch.Generator().manual_seed(a.seed + epoch)
        order = train[torch.randperm(len(train), generator=g)]
        mine = order[rank::world]  # DistributedSampler's interleaving, without its padding
        if ddp:
            dist.barrier()
        loss_sum, seen = 0.0, 0
        t0 = time.perf_counter()
        for s in range(0, len(mine), a.batch_size):
            b = mine[s:s + a.batch_size]
            for o in optims:
                o.zero_grad()
            pred, p, q = net(u[b], i[b])
            mse = torch.nn.functional.mse_loss(pred, y[b])
            loss = mse + a.l2 * ((p * p).sum(1) + (q * q).sum(1)).mean() if a.l2 > 0 else mse
            loss.backward()
            for o in optims:
                o.step()
            loss_sum += mse.item() * len(b)
            seen += len(b)
            steps += 1
        train_time += time.perf_counter() - t0
        seen_total += seen

    model.eval()
    with torch.no_grad():
        pred, _, _ = model(u[val], i[val])
        rmse = float(((pred - y[val]) ** 2).mean().sqrt())
    final = torch.tensor([loss_sum, float(seen), float(seen_total)], dtype=torch.float64)
    if ddp:
        dist.all_reduce(final)
    if rank == 0:
        print(json.dumps({
            "steps": steps, "train_seconds": train_time, "steps_per_s": steps / train_time,
            "samples_per_s": final[2].item() / train_time, "final_train_loss": final[0].item() / final[1].item(),
            "test_rmse": rmse,
        }))
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
