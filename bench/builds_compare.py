#!/usr/bin/python3
"""Two dtrain builds on the same training job, side by side in one run: samples/s,
test top-1 and peak RSS of each, alternating, medians over repetitions, and the
ratio B/A. For checking that a change of structure costs no speed, e.g.

  git worktree add ../base <commit> && make -C ../base build
  /usr/bin/python3 bench/builds_compare.py --a ../base/build --b build

Configurations: single (one process, --threads all cores) and ddp (dtrun, 2
processes of one thread each). Prints the CPU model and SIMD flags first."""
import argparse, json, os, re, statistics, subprocess, sys, tempfile


def cpu_line():
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "unknown CPU":
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    simd = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return f"# {model}, {os.cpu_count()} cores; SIMD flags: {' '.join(simd) or 'none of avx2/avx512'}"


def run(build, config, job, out):
    dtrain = os.path.join(build, "dtrain")
    env = dict(os.environ)
    if config == "single":
        cmd = [dtrain, "train", *job, "--out", out]
    else:
        env["DT_NUM_THREADS"] = "1"
        cmd = [os.path.join(build, "dtrun"), "--standalone", "--nproc-per-node", "2", "--",
               dtrain, "train", "--strategy", "ddp", *job, "--out", out]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    return s["train_samples_per_s"], s["test_acc1"], s["peak_rss_bytes"] / 2**20


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="build directory A (the reference)")
    ap.add_argument("--b", required=True, help="build directory B")
    ap.add_argument("--configs", default="single,ddp")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--model", default="fashioncnn")
    ap.add_argument("--data", default="fashion-mnist")
    args = ap.parse_args()
    job = ["--model", args.model, "--data", args.data, "--epochs", str(args.epochs), "--batch-size", "64",
           "--optimizer", "sgd", "--lr", "0.01", "--momentum", "0.9", "--progress", "none", "--seed", "0"]
    print(cpu_line())
    print(f"# load average at start: {' '.join(open('/proc/loadavg').read().split()[:3])}")
    print(f"# {args.model} on {args.data}, {args.epochs} epoch(s), batch 64 per process, SGD momentum 0.9, seed 0; "
          f"median of {args.reps}, A and B alternating")
    print("# samples/s, test top-1 and peak RSS (of rank 0 at the end of training) from summary.json")
    print("| config | build | samples/s | test top-1 | peak RSS MiB |\n|---|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for config in args.configs.split(","):
            res = {"A": [], "B": []}
            for rep in range(args.reps):
                for side, build in (("A", args.a), ("B", args.b)):
                    res[side].append(run(build, config, job, os.path.join(tmp, f"{config}-{side}-{rep}")))
            med = {k: [statistics.median(r[i] for r in v) for i in range(3)] for k, v in res.items()}
            for side in ("A", "B"):
                sps, acc, rss = med[side]
                print(f"| {config} | {side} | {sps:.0f} | {100 * acc:.2f}% | {rss:.1f} |")
            print(f"| {config} | **B/A** | **{med['B'][0] / med['A'][0]:.3f}x** | "
                  f"{100 * (med['B'][1] - med['A'][1]):+.2f} pt | {med['B'][2] / med['A'][2]:.3f}x |")
            print(f"# {config} per rep samples/s A | B: " +
                  ", ".join(f"{a[0]:.0f} | {b[0]:.0f}" for a, b in zip(res["A"], res["B"])))
    print(f"# load average at end: {' '.join(open('/proc/loadavg').read().split()[:3])}")


if __name__ == "__main__":
    sys.exit(main())
