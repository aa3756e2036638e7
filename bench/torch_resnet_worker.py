#!/usr/bin/python3
"""PyTorch + torchvision reference for bench/resnet_vs_torch.py: one process (or one DDP rank over gloo, when
WORLD_SIZE > 1 is set as torchrun sets it) training resnet20/32/56 (He et al. 2016's CIFAR ResNets), resnet9
(Page's DAWNBench ResNet-9 at --width), as dtrain's zoo builds them, or torchvision's resnet18 on an image folder, with the transforms of dtrain's --augment presets, a
DataLoader with --workers processes, SGD with momentum and weight decay. Rank 0 prints one JSON line.

Figures are computed as dtrain computes them: train samples/s = samples of all ranks / rank 0's wall time of
the epoch (data loading included, the DataLoader's start too); top-1 over --limit-test test images drawn at
random, each rank scoring a contiguous share."""
import argparse, json, math, os, random, resource, sys, time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torchvision
import torchvision.transforms as T
from torch.utils.data import DataLoader, Subset

PRESETS = {  # dtrain's --augment presets (src/data/transform.c)
    "cifar": (T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
                         T.Normalize((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))]),
              T.Compose([T.ToTensor(), T.Normalize((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))])),
    "imagenet": (T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                            T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]),
                 T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(),
                            T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])),
}


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (self.downsample(x) if self.downsample is not None else x))


class CifarResNet(nn.Module):
    """resnet20/32/56: 3x3 stem of 16 channels, 3 stages of n blocks (16, 32, 64), projection shortcuts."""

    def __init__(self, n, classes):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        blocks, cin = [], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            for k in range(n):
                blocks.append(Block(cin, cout, stride if k == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class ConvBN(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())


class Stage(nn.Module):
    """resnet9's stage: conv-BN-ReLU, 2x2 max pool, then x + res(x) (two conv-BN-ReLU) where it has one."""

    def __init__(self, cin, cout, res):
        super().__init__()
        self.head = nn.Sequential(ConvBN(cin, cout), nn.MaxPool2d(2))
        self.res = nn.Sequential(ConvBN(cout, cout), ConvBN(cout, cout)) if res else None

    def forward(self, x):
        x = self.head(x)
        return x + self.res(x) if self.res is not None else x


class ResNet9(nn.Module):
    """The DAWNBench ResNet-9 at width w (stages w, 2w, 4w, 8w), global max pool, bias-free fc, logits x 0.125;
    PyTorch's default initialisation, as dtrain's."""

    def __init__(self, w, classes):
        super().__init__()
        self.body = nn.Sequential(ConvBN(3, w), Stage(w, 2 * w, True), Stage(2 * w, 4 * w, False),
                                  Stage(4 * w, 8 * w, True), nn.AdaptiveMaxPool2d(1), nn.Flatten())
        self.fc = nn.Linear(8 * w, classes, bias=False)

    def forward(self, x):
        return self.fc(self.body(x)) * 0.125


def build(name, classes, width):
    depth = {"resnet20": 3, "resnet32": 5, "resnet56": 9}
    if name == "resnet9":
        return ResNet9(width or 64, classes)
    if name in depth:
        return CifarResNet(depth[name], classes)
    return getattr(torchvision.models, name)(num_classes=classes)


def evaluate(model, test_set, rank, world, batch):
    n = len(test_set)
    part = Subset(test_set, range(rank * n // world, (rank + 1) * n // world))
    hits = torch.zeros(2, dtype=torch.float64)
    model.eval()
    with torch.no_grad():
        for x, y in DataLoader(part, batch_size=batch):
            hits += torch.tensor([len(y), (model(x).argmax(1) == y).sum().item()], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(hits)
    return 100.0 * hits[1].item() / max(hits[0].item(), 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="folder with train/ and test/ (or val/)")
    ap.add_argument("--model", default="resnet20")
    ap.add_argument("--augment", default="cifar", choices=sorted(PRESETS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=128, help="per rank")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--width", type=int, default=0, help="resnet9: the first stage's channels (default 64)")
    ap.add_argument("--nesterov", action="store_true")
    ap.add_argument("--schedule", default="constant", choices=("constant", "cosine", "rise"),
                    help="per step: cosine (after --warmup-epochs of LinearLR from lr/3, as dtrain's), or rise: "
                    "from 0 to lr over the run (the first epoch of dtrain's --schedule linear warm-up)")
    ap.add_argument("--schedule-epochs", type=int, default=0, help="cosine: epochs the schedule spans (default --epochs)")
    ap.add_argument("--warmup-epochs", type=int, default=0, help="cosine: LinearLR from lr/3 first, as dtrain's")
    ap.add_argument("--limit-train", type=int, default=0)
    ap.add_argument("--limit-test", type=int, default=0)
    ap.add_argument("--label-smoothing", type=float, default=0.0, help="cross-entropy's label_smoothing")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.width and a.model != "resnet9":
        sys.exit("torch_resnet_worker: --width applies to resnet9 only")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0

    train_tf, test_tf = PRESETS[a.augment]
    train_set = torchvision.datasets.ImageFolder(os.path.join(a.data, "train"), train_tf)
    test_dir = os.path.join(a.data, "test") if os.path.isdir(os.path.join(a.data, "test")) else os.path.join(a.data, "val")
    test_set = torchvision.datasets.ImageFolder(test_dir, test_tf)
    # A random subset, as dtrain's --limit-pick auto takes on image folders (sorted by class): the same size and
    # kind of draw, another generator.
    pick = lambda ds, n: Subset(ds, sorted(random.Random(a.seed).sample(range(len(ds)), n))) if 0 < n < len(ds) else ds  # noqa: E731
    train_set, test_set = pick(train_set, a.limit_train), pick(test_set, a.limit_test)
    model = build(a.model, 10, a.width)
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=0.9, weight_decay=5e-4, nesterov=a.nesterov)
    sampler = torch.utils.data.distributed.DistributedSampler(train_set, seed=a.seed) if world > 1 else None
    loader = DataLoader(train_set, batch_size=a.batch_size, shuffle=sampler is None, sampler=sampler,
                        num_workers=a.workers, persistent_workers=a.workers > 0, drop_last=False)
    warm, steps = a.warmup_epochs * len(loader), (a.schedule_epochs or a.epochs) * len(loader)

    def factor(s):  # dtrain's --warmup-epochs then --schedule cosine (SequentialLR of LinearLR and cosine)
        if a.schedule == "rise":  # transformers' linear warm-up, as dtrain's --schedule linear --warmup-steps
            return s / (a.epochs * len(loader))
        if s < warm:
            return 1 / 3 + (2 / 3) * s / warm
        t = min(s - warm, steps - warm)
        return 0.5 * (1 + math.cos(math.pi * t / max(steps - warm, 1)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor) if a.schedule != "constant" else None
    seen, train_time = 0, 0.0
    for epoch in range(a.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        net.train()
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(net(x), y, label_smoothing=a.label_smoothing).backward()
            opt.step()
            if sched is not None:
                sched.step()
            seen += len(y)
        train_time += time.perf_counter() - t0
    top1 = evaluate(model, test_set, rank, world, a.batch_size)
    if rank == 0:
        print(json.dumps({"train_samples_per_s": seen * world / train_time, "test_acc1": top1,
                          "train_seconds": train_time,
                          "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}), flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
