#!/usr/bin/python3
"""Step latency, side by side in one run: the PyTorch DDP tutorial's "fake data"
regression (x = rand(20), y = rand(1), Linear(20, 1), MSE, SGD lr 0.001, 2048
samples, batch 32, 50 epochs) trained by dtrain and by PyTorch, in one process
and as DDP with 2 processes of one thread each. A 21-parameter model does next to
no arithmetic, so this measures what a training step costs around it: loader,
autograd or layer calls, optimizer, hooks and, under DDP, the collectives.

Configurations and how each side runs:
  single  dtrain train --model linear --data synthetic:2048 ... (DT_NUM_THREADS=1)
          vs bench/torch_synthetic_worker.py (TensorDataset, DataLoader(shuffle=True),
          zero_grad / forward / F.mse_loss / backward / step; torch.set_num_threads(1))
  ddp     dtrun --standalone --nproc-per-node 2 -- dtrain train --strategy ddp ...
          vs 2 ranks of bench/torch_synthetic_worker.py under DistributedDataParallel
          (gloo, DistributedSampler), each rank 1024 samples, batch 32 per rank

Figures, per run, then the median over --reps runs (repetitions alternate sides):
  steps/s   optimizer steps of one process / its training time (rank 0 under DDP).
            dtrain: training time = the sum of its per-epoch times (summary.json:
            samples of all ranks / train_samples_per_s, which equals its compute +
            data wait + communication seconds); PyTorch: the sum over epochs of the
            loop's wall time. Neither includes start-up, data generation or writing
            outputs.
  us/step   1e6 / steps/s
  wall s    the whole command, from the driver's clock: interpreter and import
            (PyTorch), launcher and rendezvous (dtrun; gloo's init_process_group),
            the data, training, and dtrain's outputs (metrics, report, weights)
  RSS       peak resident memory of the (larger) process, from /usr/bin/time
  loss      the last epoch's mean train loss (over all ranks under DDP); targets are
            uniform noise, so both should end near 0.08-0.1
"""
import argparse, json, os, shutil, socket, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
TIME_FMT = "RSS_KB=%M CPU=%U+%S WALL=%e"
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def cpu_line():
    """'AMD EPYC ..., 2 cores; flags: avx2 ...' from /proc/cpuinfo."""
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                k = k.strip()
                if k == "model name" and model == "unknown CPU":
                    model = v.strip()
                elif k == "flags" and not flags:
                    flags = set(v.split())
    except OSError:
        pass
    have = [f for f in CPU_FLAGS if f in flags]
    amx = any(f.startswith("amx") for f in flags)
    return "%s, %d cores; SIMD flags: %s%s" % (model, os.cpu_count() or 0, " ".join(have) or "none of " + ", ".join(
        CPU_FLAGS[:3]), "" if amx else " (no amx)")


def budget_env(threads):
    """Holds every pool of a process to `threads` threads (PyTorch's OpenBLAS ignores torch.set_num_threads)."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "DT_NUM_THREADS"):
        env[var] = str(threads)
    return env


def read_time(path):
    """(peak RSS MiB, CPU s) from one /usr/bin/time -o file."""
    with open(path) as f:
        fields = dict(x.split("=") for x in f.read().strip().splitlines()[-1].split())
    return int(fields["RSS_KB"]) / 1024.0, sum(float(x) for x in fields["CPU"].split("+"))


def fail(what, cmd, rc, err):
    sys.exit(f"synthetic_vs_torch: {what} failed: {' '.join(cmd)} exited with status {rc}\n{err[-3000:]}")


def dtrain_cmd(a, ddp, out_dir, seed):
    cmd = [a.dtrain, "train"] + (["--strategy", "ddp"] if ddp else []) + [
        "--model", "linear", "--data", f"synthetic:{a.samples}", "--epochs", str(a.epochs), "--batch-size",
        str(a.batch_size), "--optimizer", "sgd", "--lr", str(a.lr), "--seed", str(seed), "--progress", "none",
        "--out", out_dir]
    return cmd + a.dtrain_args


def dtrain_once(a, ddp, tmp, seed):
    out_dir, tprefix = os.path.join(tmp, "out"), os.path.join(tmp, "time")
    nproc = a.nproc if ddp else 1
    if ddp:
        # Each worker under /usr/bin/time, writing time.<RANK> (dtrun sets RANK).
        wrap = ["/bin/sh", "-c", f'exec /usr/bin/time -f "{TIME_FMT}" -o "$0.$RANK" "$@"', tprefix]
        cmd = [a.dtrun, "--standalone", "--nproc-per-node", str(a.nproc), "--threads-per-proc", "1", "--"] + wrap
    else:
        cmd = ["/usr/bin/time", "-f", TIME_FMT, "-o", f"{tprefix}.0"]
    cmd += dtrain_cmd(a, ddp, out_dir, seed)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=budget_env(1), timeout=1800)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        fail("dtrain " + ("DDP" if ddp else "single"), cmd, p.returncode, p.stderr + p.stdout)
    s = json.load(open(os.path.join(out_dir, "summary.json")))
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        last = json.loads(f.read().strip().splitlines()[-1])
    world = s.get("world_size", 1) or 1
    train_s = s["steps"] * a.batch_size * world / s["train_samples_per_s"]  # every batch is full here
    times = [read_time(f"{tprefix}.{r}") for r in range(nproc)]
    return {
        "steps": s["steps"], "train_s": train_s, "steps_per_s": s["steps"] / train_s, "wall_s": wall,
        "rss_mb": max(t[0] for t in times), "cpu_s": sum(t[1] for t in times), "loss": last["train_loss"],
        "rss_train_mb": s["peak_rss_bytes"] / 2**20, "data_s": s["data_wait_seconds"], "comm_s": s["comm_seconds"], "compute_s": s["compute_seconds"],
    }


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_once(a, ddp, tmp, seed):
    tprefix = os.path.join(tmp, "time")
    nproc = a.nproc if ddp else 1
    port = str(free_port())
    procs = []
    t0 = time.perf_counter()
    for r in range(nproc):
        env = budget_env(1)
        env.pop("WORLD_SIZE", None)
        if ddp:
            env.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        cmd = ["/usr/bin/time", "-f", TIME_FMT, "-o", f"{tprefix}.{r}", "/usr/bin/python3",
               os.path.join(HERE, "torch_synthetic_worker.py"), "--samples", str(a.samples), "--epochs", str(a.epochs),
               "--batch-size", str(a.batch_size), "--lr", str(a.lr), "--threads", "1", "--seed", str(seed)]
        procs.append((cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)))
    outs = []
    try:
        for cmd, p in procs:
            out, err = p.communicate(timeout=1800)
            if p.returncode != 0:
                fail("PyTorch " + ("DDP" if ddp else "single"), cmd, p.returncode, err)
            outs.append(out)
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    wall = time.perf_counter() - t0
    r = json.loads(outs[0].strip().splitlines()[-1])
    times = [read_time(f"{tprefix}.{k}") for k in range(nproc)]
    return {
        "steps": r["steps"], "train_s": r["train_seconds"], "steps_per_s": r["steps_per_s"], "wall_s": wall,
        "rss_mb": max(t[0] for t in times), "cpu_s": sum(t[1] for t in times), "loss": r["final_train_loss"],
    }


def med(runs, key):
    return statistics.median(r[key] for r in runs)


def loadavg():
    try:
        return "%.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        return "?"


def main():
    build = os.environ.get("DT_BUILD_DIR", "build")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtrain", default=os.path.join(build, "dtrain"))
    ap.add_argument("--dtrun", default=None, help="default: dtrun next to --dtrain")
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=32, help="per process")
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--nproc", type=int, default=2, help="DDP processes on each side")
    ap.add_argument("--configs", default="single,ddp", help="comma list of single, ddp")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0, help="repetition i uses seed + i on both sides")
    ap.add_argument("--dtrain-arg", dest="dtrain_args", action="append", default=[],
                    help="an extra argument for dtrain train (repeat the flag for several)")
    a = ap.parse_args()
    a.dtrain = os.path.abspath(a.dtrain)
    a.dtrun = os.path.abspath(a.dtrun or os.path.join(os.path.dirname(a.dtrain), "dtrun"))
    configs = [c for c in a.configs.split(",") if c]
    for c in configs:
        if c not in ("single", "ddp"):
            sys.exit(f"synthetic_vs_torch: unknown configuration {c!r} (single, ddp)")
    for path in (a.dtrain,) + ((a.dtrun,) if "ddp" in configs else ()):
        if not os.access(path, os.X_OK):
            sys.exit(f"synthetic_vs_torch: {path} is missing: build dtrain (and dtrun) first, or set DT_BUILD_DIR")
    try:
        import torch.distributed as dist
        have_torch, have_gloo = True, dist.is_available() and dist.is_gloo_available()
    except ImportError:
        have_torch = have_gloo = False

    per_rank = a.samples // a.nproc
    print(f"# {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; {cpu_line()}")
    print(f"# load average at start: {loadavg()}"
          + (f"; OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']}" if os.environ.get("OPENBLAS_CORETYPE") else ""))
    if not have_torch:
        print("# PyTorch (python3-torch) is not installed: printing dtrain's figures alone")
    elif not have_gloo and "ddp" in configs:
        print("# PyTorch has no gloo backend: printing dtrain's DDP figures alone")
    print(f"# the DDP tutorial's fake-data regression: x = rand(20), y = rand(1), Linear(20, 1), MSE, SGD lr {a.lr}, "
          f"{a.samples} samples, {a.epochs} epochs, batch {a.batch_size} per process; one thread per process on both sides")
    print(f"# single: {-(-a.samples // a.batch_size)} steps/epoch; ddp: {a.nproc} processes, {per_rank} samples and "
          f"{-(-per_rank // a.batch_size)} steps/epoch per rank (dtrun + shm all-reduce vs DDP over gloo, "
          f"DistributedSampler)")
    print(f"# median of {a.reps} (alternating; seeds {a.seed}..{a.seed + a.reps - 1}); steps/s = optimizer steps of one "
          "process / training time (dtrain: sum of epoch times from summary.json; PyTorch: sum of epoch-loop times); "
          "wall = the whole command; RSS = the larger process's peak")
    if a.dtrain_args:
        print(f"# extra dtrain arguments: {' '.join(a.dtrain_args)}")
    results = {c: ([], []) for c in configs}
    for rep in range(a.reps):
        for c in configs:
            ddp = c == "ddp"
            sides = [(results[c][0], dtrain_once)]
            if have_torch and (have_gloo or not ddp):
                sides.append((results[c][1], torch_once))
            for runs, fn in sides:
                tmp = tempfile.mkdtemp(prefix="dtrain-synth-bench-")
                try:
                    runs.append(fn(a, ddp, tmp, a.seed + rep))
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
    print()
    print("| config | impl | steps/s | us/step | train s | wall s | peak RSS MiB | CPU s | final train loss |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    ratios = {}
    for c in configs:
        ours, theirs = results[c]
        label = "single" if c == "single" else f"ddp x{a.nproc}"
        rows = [("dtrain", ours)] + ([("PyTorch", theirs)] if theirs else [])
        for name, runs in rows:
            print("| %s | %s | %.0f | %.1f | %.3f | %.2f | %.1f | %.2f | %.4f |" % (
                label, name, med(runs, "steps_per_s"), 1e6 / med(runs, "steps_per_s"), med(runs, "train_s"),
                med(runs, "wall_s"), med(runs, "rss_mb"), med(runs, "cpu_s"), med(runs, "loss")))
        if theirs:
            r = med(ours, "steps_per_s") / med(theirs, "steps_per_s")
            ratios[c] = r
            print("| %s | **dtrain/PyTorch** | **%.2fx** | %.3fx | %.3fx | %.3fx | %.3fx | %.3fx | %+.4f |" % (
                label, r, (1 / med(ours, "steps_per_s")) / (1 / med(theirs, "steps_per_s")),
                med(ours, "train_s") / med(theirs, "train_s"), med(ours, "wall_s") / med(theirs, "wall_s"),
                med(ours, "rss_mb") / med(theirs, "rss_mb"), med(ours, "cpu_s") / med(theirs, "cpu_s"),
                med(ours, "loss") - med(theirs, "loss")))
    print()
    for c in configs:
        ours, theirs = results[c]
        print(f"# {c} per rep steps/s (dtrain | PyTorch): " + ", ".join(
            "%.0f | %s" % (o["steps_per_s"], "%.0f" % t["steps_per_s"] if t else "-")
            for o, t in zip(ours, theirs + [None] * (len(ours) - len(theirs)))))
        n = med(ours, "steps")
        print(f"# {c} dtrain per step (rank 0, median): compute %.1f us, waiting for data %.1f us, communication "
              "not hidden %.1f us" % (1e6 * med(ours, "compute_s") / n, 1e6 * med(ours, "data_s") / n,
                                      1e6 * med(ours, "comm_s") / n))
    for c in configs:
        print(f"# {c} dtrain peak RSS when training ended (summary.json, rank 0): %.1f MiB; the process's peak above "
              "is reached afterwards, while writing the outputs" % med(results[c][0], "rss_train_mb"))
    for c, r in ratios.items():
        print(f"# target {c}: dtrain >= 10x PyTorch steps/s: {'met' if r >= 10 else 'missed'} ({r:.2f}x)")
    print(f"# load average at end: {loadavg()}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
