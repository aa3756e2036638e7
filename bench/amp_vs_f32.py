#!/usr/bin/env python3
"""Mixed precision cost: dtrain f32 vs --amp bf16, and PyTorch CPU f32 vs torch.autocast bf16, side by side.

  bench/amp_vs_f32.py [--build build] [--threads 2] [--reps 2] [--accuracy-epochs 3]

Models: fashioncnn on Fashion-MNIST (batch 64, 4096 samples) and two GEMM-bound mlps (784-1024-1024-10, batch 128,
and 784-2048-2048-10, batch 256; 16384 samples), one epoch each, SGD lr 0.01. Every cell is the best of --reps
runs (samples/s of the training epoch; peak RSS of the process), every variant once per round, rounds in turn.
dtrain's bf16 runs three ways: as it runs on this CPU (native where it has AVX512_BF16: dtrain's own kernel), with
DT_AMP_KERNELS=onednn (oneDNN's bf16 matmul, '-' where the build or CPU has none) and with DT_AMP_KERNELS=emulated.
Then test top-1 of f32 and bf16 after --accuracy-epochs on all 60,000 samples (0: skipped). Prints the CPU model
and its relevant flags first.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

TORCH_WORKER = r'''
import resource, sys, time, gzip, numpy as np, torch, torch.nn as nn
model, amp, n, batch, threads = sys.argv[1], sys.argv[2] == "bf16", int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
width = int(sys.argv[6])
torch.set_num_threads(threads)
torch.manual_seed(0)
d = "/usr/share/datasets/fashion-mnist/"
x = np.frombuffer(gzip.open(d + "train-images-idx3-ubyte.gz").read(), np.uint8, offset=16)[:n * 784]
y = np.frombuffer(gzip.open(d + "train-labels-idx1-ubyte.gz").read(), np.uint8, offset=8)[:n]
x = torch.from_numpy((x.astype(np.float32) / 255).reshape(n, 1, 28, 28))
y = torch.from_numpy(y.astype(np.int64))
if model == "fashioncnn":
    m = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(32, 64, 3), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                      nn.Linear(2304, 600), nn.Dropout(0.25), nn.Linear(600, 120), nn.Linear(120, 10))
else:
    m = nn.Sequential(nn.Flatten(), nn.Linear(784, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                      nn.Linear(width, 10))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
t0 = time.perf_counter()
for i in range(0, n, batch):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        loss = nn.functional.cross_entropy(m(x[i:i + batch]).float(), y[i:i + batch])
    opt.zero_grad()
    loss.backward()
    opt.step()
dt = time.perf_counter() - t0
print(n / dt, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
'''

MODELS = {"fashioncnn": (["--model", "fashioncnn"], 4096, 64),
          "mlp 1024x2": (["--model", "mlp", "--hidden", "1024,1024"], 16384, 128),
          "mlp 2048x2": (["--model", "mlp", "--hidden", "2048,2048"], 16384, 256)}


def cpu_line():
    model, flags = "?", set()
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name") and model == "?":
            model = line.split(":", 1)[1].strip()
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
    want = ["avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16"]
    return model, " ".join(f + ("+" if f in flags else "-") for f in want)


def dtrain_run(build, args, n, batch, amp, threads, tmp, kernels="auto", epochs=1):
    out = os.path.join(tmp, "run")
    cmd = [os.path.join(build, "dtrain"), "train", *args, "--data", "fashion-mnist", "--epochs", str(epochs),
           "--batch-size", str(batch), "--lr", "0.01", "--threads", str(threads), "--progress", "none", "--amp", amp,
           "--out", out, "--overwrite"]
    if n:
        cmd += ["--limit-train", str(n), "--limit-test", "1"]
    subprocess.run(cmd, check=True, capture_output=True, env=dict(os.environ, DT_AMP_KERNELS=kernels))
    s = json.load(open(os.path.join(out, "summary.json")))
    return s["train_samples_per_s"], s["peak_rss_bytes"], 100.0 * s["test_acc1"]


def torch_run(model, n, batch, amp, threads):
    width = model.split()[1].split("x")[0] if model.startswith("mlp") else "0"
    r = subprocess.run([sys.executable, "-c", TORCH_WORKER, "fashioncnn" if model == "fashioncnn" else "mlp", amp,
                        str(n), str(batch), str(threads), width], check=True, capture_output=True, text=True)
    sps, rss = r.stdout.split()
    return float(sps), int(rss)


def best_alternating(runs, reps, optional=("dnnl",)):
    """Every variant once per round, rounds repeated (a machine's speed drifts over minutes: alternating keeps the
    ratios fair); per variant the best samples/s and the lowest peak RSS, or None where an optional variant cannot
    run (oneDNN's kernel in a build without oneDNN); any other failure ends the benchmark."""
    got = {k: [] for k in runs}
    for _ in range(reps):
        for k, f in runs.items():
            try:
                got[k].append(f())
            except subprocess.CalledProcessError:
                if k not in optional:
                    raise
    return {k: (max(r[0] for r in v), min(r[1] for r in v)) if v else None for k, v in got.items()}


def path_line(build):
    r = subprocess.run([os.path.join(build, "dtrain"), "train", "--model", "mlp", "--data", "fashion-mnist",
                        "--limit-train", "64", "--limit-test", "1", "--epochs", "1", "--amp", "bf16", "--progress",
                        "none", "--out", tempfile.mkdtemp(prefix="amp-path-"), "--overwrite"],
                       capture_output=True, text=True)
    for line in r.stdout.splitlines():
        if "amp bf16" in line:
            return line[line.index("amp bf16"):].split(", out ")[0]
    return "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.environ.get("DT_BUILD_DIR", "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--accuracy-epochs", type=int, default=3)
    a = ap.parse_args()
    model, flags = cpu_line()
    print(f"CPU: {model}; {flags}; {a.threads} threads")
    print(f"dtrain: {path_line(a.build)}")
    print(f"{'model':12s} {'dtrain f32':>11s} {'dt bf16':>8s} {'(oneDNN)':>8s} {'(emul.)':>8s} {'bf16/f32':>8s} "
          f"{'torch f32':>10s} {'torch bf16':>11s} {'bf16/f32':>8s} {'dt/torch bf16':>13s}  "
          f"peak RSS MiB (dt f32, dt bf16, torch f32, torch bf16)")
    mib = lambda b: b / 2**20
    with tempfile.TemporaryDirectory() as tmp:
        for name, (args, n, batch) in MODELS.items():
            runs = {"d32": lambda: dtrain_run(a.build, args, n, batch, "off", a.threads, tmp),
                    "d16": lambda: dtrain_run(a.build, args, n, batch, "bf16", a.threads, tmp),
                    "dnnl": lambda: dtrain_run(a.build, args, n, batch, "bf16", a.threads, tmp, "onednn"),
                    "emu": lambda: dtrain_run(a.build, args, n, batch, "bf16", a.threads, tmp, "emulated"),
                    "t32": lambda: torch_run(name, n, batch, "off", a.threads),
                    "t16": lambda: torch_run(name, n, batch, "bf16", a.threads)}
            r = best_alternating(runs, a.reps)
            dnnl = f"{r['dnnl'][0]:8.0f}" if r["dnnl"] else f"{'-':>8s}"
            print(f"{name:12s} {r['d32'][0]:11.0f} {r['d16'][0]:8.0f} {dnnl} {r['emu'][0]:8.0f} "
                  f"{r['d16'][0] / r['d32'][0]:8.2f} {r['t32'][0]:10.0f} {r['t16'][0]:11.0f} "
                  f"{r['t16'][0] / r['t32'][0]:8.2f} {r['d16'][0] / r['t16'][0]:13.2f}  {mib(r['d32'][1]):.0f}, "
                  f"{mib(r['d16'][1]):.0f}, {mib(r['t32'][1]):.0f}, {mib(r['t16'][1]):.0f}")
        if a.accuracy_epochs > 0:
            print(f"# test top-1 % after {a.accuracy_epochs} epoch(s) on all 60,000 samples (seed 0)")
            for name, (args, _, batch) in MODELS.items():
                f32 = dtrain_run(a.build, args, 0, batch, "off", a.threads, tmp, epochs=a.accuracy_epochs)
                b16 = dtrain_run(a.build, args, 0, batch, "bf16", a.threads, tmp, epochs=a.accuracy_epochs)
                print(f"{name:12s} f32 {f32[2]:.2f}  bf16 {b16[2]:.2f}  ({b16[2] - f32[2]:+.2f} points)")


main()
