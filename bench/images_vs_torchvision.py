"""The image input pipeline alone: read + decode + augment + ToTensor/Normalize, images/s per core, dtrain vs
torchvision's PIL pipeline (ImageFolder + the same transforms, DataLoader(num_workers=0), 1 torch thread).

dtrain: bench/images_pipeline (the loader with 1 worker thread, OMP_NUM_THREADS=1); per core = images / CPU
seconds of the whole process. torchvision: the same images in the same order, per core = images / process CPU
seconds. Each side runs --reps times after one warm-up pass (files in the page cache); the best run counts.

  python3 bench/images_vs_torchvision.py [--data ../shared/data] [--reps 3]
"""
import argparse
import os
import subprocess
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data"))
ap.add_argument("--build", default=os.environ.get("DT_BUILD_DIR", "build"))
ap.add_argument("--reps", type=int, default=3)
args = ap.parse_args()

import torch
import torchvision
import torchvision.transforms as T
from torch.utils.data import DataLoader, Subset

torch.set_num_threads(1)
CIFAR = T.Normalize((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
IMAGENET = T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
CASES = [  # name, folder, split, preset, torchvision transform, images, batch
    ("cifar10 train, --augment cifar", "cifar10", "train", "cifar",
     T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), CIFAR]), 10000, 128),
    ("cifar10 test, --augment cifar", "cifar10", "test", "cifar", T.Compose([T.ToTensor(), CIFAR]), 10000, 128),
    ("imagenette-subset train, --augment imagenet", "imagenette-subset", "train", "imagenet",
     T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), IMAGENET]), 1000, 32),
    ("imagenette-subset val, --augment imagenet", "imagenette-subset", "val", "imagenet",
     T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), IMAGENET]), 500, 32),
]


def dtrain(root, preset, split, n, batch):
    tool = os.path.join(args.build, "bench", "images_pipeline")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([tool, root, preset, "train" if split == "train" else "test", "1", str(batch), str(n)],
                       capture_output=True, text=True, env=env, check=True)
    f = r.stdout.split()
    v = dict(zip(f[0::2], f[1::2]))
    return float(v["images_per_s"]), float(v["images_per_cpu_s"])


def torchvision_run(folder, tf, n, batch):
    ds = Subset(torchvision.datasets.ImageFolder(folder, transform=tf), range(n))
    dl = DataLoader(ds, batch_size=batch, shuffle=False, num_workers=0)
    t0, c0 = time.perf_counter(), time.process_time()
    seen = 0
    for x, y in dl:
        seen += x.shape[0]
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return seen / wall, seen / cpu


cpu = open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].split(":", 1)[1].strip()
flags = [f for f in open("/proc/cpuinfo").read().split("flags")[1].split("\n")[0].split() if f in ("avx2", "avx512f", "fma", "sse4_2")]
print(f"CPU: {cpu} ({os.cpu_count()} cores; {' '.join(flags)}); torch {torch.__version__}, torchvision "
      f"{torchvision.__version__}; one core each side")
print(f"| {'data, transform':45} | dtrain img/s per core | torchvision img/s per core | ratio |")
print(f"|{'-' * 47}|---:|---:|---:|")
for name, sub, split, preset, tf, n, batch in CASES:
    root = os.path.join(args.data, sub)
    if not os.path.isdir(root):
        print(f"| {name:45} | (missing {root}) | | |")
        continue
    folder = os.path.join(root, split)
    n = min(n, len(torchvision.datasets.ImageFolder(folder)))
    dtrain(root, preset, split, n, batch)  # warm-up: the files into the page cache
    ours = max(dtrain(root, preset, split, n, batch)[1] for _ in range(args.reps))
    torchvision_run(folder, tf, min(n, 500), batch)
    theirs = max(torchvision_run(folder, tf, n, batch)[1] for _ in range(args.reps))
    print(f"| {name:45} | {ours:.0f} | {theirs:.0f} | {ours / theirs:.1f}x |")
    sys.stdout.flush()
