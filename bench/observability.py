"""What snapshots, TensorBoard and the trace cost: fashioncnn training throughput with each of them
against the same run without (one invocation, median of --reps), and the time to write one snapshot
(model + SGD momentum state, fsynced) against torch.save of the same state_dicts plus fsync.
Usage: DT_BUILD_DIR=build /usr/bin/python3 bench/observability.py [--reps 3] [--limit-train 12800]"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

BUILD = os.environ.get("DT_BUILD_DIR", "build")


def train(out, extra, args):
    cmd = [os.path.join(BUILD, "dtrain"), "train", "--model", "fashioncnn", "--epochs", "1", "--limit-train",
           str(args.limit_train), "--limit-test", "1000", "--batch-size", "64", "--momentum", "0.9", "--threads",
           str(args.threads), "--progress", "none", "--out", out] + extra
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)["train_samples_per_s"]


def snapshot_spans(trace):
    with open(trace) as f:
        ev = json.load(f)["traceEvents"]
    return [e["dur"] / 1e6 for e in ev if e.get("name") == "snapshot" and e.get("ph") == "X"]


def torch_save_seconds(reps):
    try:
        import torch
    except ImportError:
        return None
    sys.path.insert(0, os.path.join(os.path.dirname(__file__)))
    from torch_fashioncnn import FashionCNN  # noqa: E402  (the benchmark's PyTorch model)
    m = FashionCNN()
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    m(torch.zeros(2, 1, 28, 28)).sum().backward()
    opt.step()  # creates the momentum buffers
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(reps):
            path = os.path.join(tmp, f"ckpt{i}.pt")
            t0 = time.perf_counter()
            with open(path + ".tmp", "wb") as f:
                torch.save({"model": m.state_dict(), "optimizer": opt.state_dict()}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(path + ".tmp", path)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--limit-train", type=int, default=12800)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    steps = (args.limit_train + 63) // 64
    variants = [
        ("plain", []),
        ("--tensorboard (every 10 steps)", ["--tensorboard", "{d}/tb"]),
        ("--trace", ["--trace", "{d}/trace.json"]),
        (f"--save-every-steps {steps // 4}", ["--save-every-steps", str(steps // 4)]),
        ("all three", ["--tensorboard", "{d}/tb", "--trace", "{d}/trace.json", "--save-every-steps", str(steps // 4)]),
    ]
    print(f"# fashioncnn, 1 epoch of {args.limit_train} samples, batch 64, SGD momentum 0.9, {args.threads} thread(s), "
          f"median of {args.reps}; runs interleaved")
    rates = {name: [] for name, _ in variants}
    spans = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for i, (name, extra) in enumerate(variants):
                d = os.path.join(tmp, f"r{rep}v{i}")
                rates[name].append(train(d, [x.format(d=d) for x in extra], args))
                if name == "all three":
                    spans += snapshot_spans(os.path.join(d, "trace.json"))
    base = statistics.median(rates["plain"])
    print(f"{'variant':34} {'train samp/s':>12} {'vs plain':>9}")
    for name, _ in variants:
        r = statistics.median(rates[name])
        print(f"{name:34} {r:12.0f} {r / base:8.3f}x")
    size = None
    with tempfile.TemporaryDirectory() as tmp:
        train(tmp, ["--save-every", "1"], args)
        snaps = os.listdir(os.path.join(tmp, "snapshots"))
        size = os.path.getsize(os.path.join(tmp, "snapshots", snaps[0]))
    ours = statistics.median(spans) if spans else float("nan")
    ref = torch_save_seconds(max(args.reps, 5))
    print(f"\n# one snapshot of fashioncnn + momentum ({size / 2**20:.1f} MiB), written and fsynced")
    print(f"dtrain snapshot   {ours * 1e3:8.1f} ms (median of {len(spans)}, from the trace)")
    if ref is None:
        print("torch.save        not measured: PyTorch is not installed")
    else:
        print(f"torch.save+fsync  {ref * 1e3:8.1f} ms (median of {max(args.reps, 5)})")
        print(f"ratio             {ref / ours:8.2f}x (torch time / dtrain time)")


if __name__ == "__main__":
    main()
