#!/usr/bin/python3
"""PyTorch reference for bench/train_vs_torch.py: FashionCNN (or an MLP) on
Fashion-MNIST with the same recipe as dtrain; prints one JSON line of results."""
import argparse, gzip, json, os, resource, struct, sys, time

import numpy as np
import torch
import torch.nn as nn


def read_idx(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    assert zero == 0 and dtype == 0x08, f"{path}: not a u8 IDX file"
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(root, split):
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(root, f"{prefix}-images-idx3-ubyte.gz")).astype(np.float32) / 255.0
    y = read_idx(os.path.join(root, f"{prefix}-labels-idx1-ubyte.gz")).astype(np.int64)
    return torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y)


class FashionCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2))
        self.layer2 = nn.Sequential(nn.Conv2d(32, 64, 3), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2))
        self.fc1 = nn.Linear(64 * 6 * 6, 600)
        self.drop = nn.Dropout(0.25)
        self.fc2 = nn.Linear(600, 120)
        self.fc3 = nn.Linear(120, 10)

    def forward(self, x):
        x = self.layer2(self.layer1(x))
        return self.fc3(self.fc2(self.drop(self.fc1(x.view(x.size(0), -1)))))


def mlp(hidden):
    layers, width = [nn.Flatten()], 784
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return nn.Sequential(*layers, nn.Linear(width, 10))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--model", default="fashioncnn")
    ap.add_argument("--hidden", default="2048,2048")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--limit-train", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    xtr, ytr = load(a.data, "train")
    xte, yte = load(a.data, "test")
    if a.limit_train:
        xtr, ytr = xtr[:a.limit_train], ytr[:a.limit_train]
    model = FashionCNN() if a.model == "fashioncnn" else mlp([int(h) for h in a.hidden.split(",")])
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    loss_fn = nn.CrossEntropyLoss()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xtr, ytr), batch_size=a.batch_size,
                                         shuffle=True)
    train_time, seen = 0.0, 0
    for _ in range(a.epochs):
        model.train()
        t0 = time.perf_counter()
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            seen += x.size(0)
        train_time += time.perf_counter() - t0
    model.eval()
    top1 = top5 = 0
    t0 = time.perf_counter()
    with torch.no_grad():
        for i in range(0, len(xte), 1000):
            out = model(xte[i:i + 1000])
            t5 = out.topk(5, dim=1).indices
            y = yte[i:i + 1000]
            top1 += (t5[:, 0] == y).sum().item()
            top5 += (t5 == y[:, None]).any(dim=1).sum().item()
    infer_time = time.perf_counter() - t0
    print(json.dumps({
        "train_samples_per_s": seen / train_time,
        "infer_samples_per_s": len(xte) / infer_time,
        "test_acc1": 100.0 * top1 / len(xte),
        "test_acc5": 100.0 * top5 / len(xte),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    }))


if __name__ == "__main__":
    sys.exit(main())
