#!/usr/bin/python3
"""Where a resnet training step's time goes, per layer kind, from bench/resnet_steps' per-layer trace spans:
forward and backward of Conv2d, BatchNorm2d, ReLU, pools, the residual adds, Linear, and what is outside the
layers (loss, zero_grad, optimizer); the convolutions' GFLOP/s and their fraction of the CPU's fp32 peak.

Peak = cores x clock x 32 fp32 FLOP/cycle (two 256-bit FMA pipes: AVX2 + FMA, as Zen 2/3; 16 with AVX alone,
64 with AVX-512); the clock is /proc/cpuinfo's "cpu MHz" (a VM reports its nominal clock), or --ghz.

Usage: bench/resnet_profile.py [--build build] [--steps N] [--threads T] [--ghz G] [--width W] MODEL BATCH SIDE
e.g.   bench/resnet_profile.py resnet20 128 32;  bench/resnet_profile.py resnet18 32 224"""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile


def cpu():
    info = {}
    for line in open("/proc/cpuinfo"):
        if ":" in line:
            k, v = (s.strip() for s in line.split(":", 1))
            info.setdefault(k, v)
    flags = set(info.get("flags", "").split())
    simd = [f for f in ("sse4_2", "avx", "avx2", "fma", "avx512f") if f in flags]
    per_cycle = 64 if "avx512f" in flags else 32 if {"avx2", "fma"} <= flags else 16 if "avx" in flags else 8
    return info.get("model name", "?"), float(info.get("cpu MHz", "0")) / 1000, simd, per_cycle


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("batch", type=int)
    ap.add_argument("side", type=int)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--ghz", type=float, default=0)
    ap.add_argument("--width", type=int, default=0, help="resnet9, CIFAR resnets: as dtrain train --width")
    ap.add_argument("--build", default=os.environ.get("DT_BUILD_DIR", "build"))
    a = ap.parse_args()
    name, ghz, simd, per_cycle = cpu()
    ghz = a.ghz or ghz
    peak = a.threads * ghz * per_cycle
    print(f"CPU: {name}, {os.cpu_count()} cores ({a.threads} threads used), {ghz:.2f} GHz, {' '.join(simd)}: "
          f"fp32 peak {peak:.0f} GFLOP/s ({per_cycle} FLOP/cycle/core)")
    env = dict(os.environ, DT_NUM_THREADS=str(a.threads), OMP_WAIT_POLICY="passive")
    with tempfile.TemporaryDirectory() as tmp:
        tr = os.path.join(tmp, "trace.json")
        width = ["--width", str(a.width)] if a.width else []
        out = subprocess.run([os.path.join(a.build, "bench", "resnet_steps")] + width + [a.model, str(a.batch), str(a.side),
                              str(a.steps), tr], env=env, check=True, capture_output=True, text=True).stdout
        events = json.load(open(tr))
    flops = {}
    steps = []
    for line in out.splitlines():
        f = line.split()
        if f[0] == "flops":
            flops[f[1]] = (float(f[3]), float(f[4]))
        elif f[0] == "step_s":
            steps.append(float(f[1]))
        elif f[0] == "images_per_s":
            print(line)
    step = sum(steps) / len(steps)
    per = collections.defaultdict(float)  # (kind, pass) -> seconds per step
    conv_flop = [0.0, 0.0]
    layer_time = collections.defaultdict(float)
    for e in events:
        if e.get("ph") != "X" or e.get("cat") != "nn" or " " not in e["name"]:
            continue
        pas, layer = e["name"].split(" ", 1)
        kind = e.get("args", {}).get("kind", "?")
        per[(kind, pas)] += e["dur"] / 1e6 / len(steps)
        layer_time[(layer, pas)] += e["dur"] / 1e6 / len(steps)
    for layer, (f, b) in flops.items():
        if layer_time.get((layer, "forward")) is not None and "conv" in layer or "downsample.0" in layer:
            conv_flop[0] += f
            conv_flop[1] += b
    layers = sum(per.values())
    print(f"step {step * 1e3:.1f} ms (mean of {len(steps)}), {a.batch / step:.1f} images/s; in layers "
          f"{layers * 1e3:.1f} ms, outside (loss, zero_grad, SGD, trace) {(step - layers) * 1e3:.1f} ms")
    print(f"{'kind':22s} {'forward ms':>11s} {'backward ms':>12s} {'share':>7s}")
    kinds = sorted({k for k, _ in per}, key=lambda k: -(per[(k, 'forward')] + per[(k, 'backward')]))
    for k in kinds:
        fw, bw = per[(k, "forward")], per[(k, "backward")]
        print(f"{k:22s} {fw * 1e3:11.1f} {bw * 1e3:12.1f} {100 * (fw + bw) / step:6.1f}%")
    cf, cb = per[("Conv2d", "forward")], per[("Conv2d", "backward")]
    if cf > 0:
        print(f"Conv2d: forward {conv_flop[0] / 1e9:.2f} GFLOP in {cf * 1e3:.1f} ms = {conv_flop[0] / cf / 1e9:.1f} "
              f"GFLOP/s ({100 * conv_flop[0] / cf / 1e9 / peak:.0f}% of peak); backward {conv_flop[1] / 1e9:.2f} GFLOP "
              f"in {cb * 1e3:.1f} ms = {conv_flop[1] / cb / 1e9:.1f} GFLOP/s ({100 * conv_flop[1] / cb / 1e9 / peak:.0f}% "
              f"of peak); conv share of the step {100 * (cf + cb) / step:.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
