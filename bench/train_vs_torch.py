#!/usr/bin/python3
"""Side-by-side training benchmark: dtrain vs PyTorch on the same model, data,
recipe and thread budget, in one run. Prints samples/s, accuracy, peak RSS and
the ratio dtrain/PyTorch; the median of --reps runs of each."""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def dtrain_once(dtrain, a, threads, extra):
    out_dir = tempfile.mkdtemp(prefix="dtrain-bench-")
    try:
        cmd = [dtrain, "train", "--model", a.model, "--data", a.data, "--epochs", str(a.epochs),
               "--batch-size", str(a.batch_size), "--optimizer", "sgd", "--lr", str(a.lr),
               "--momentum", "0.9", "--threads", str(threads), "--seed", "0", "--progress", "none",
               "--out", out_dir] + extra
        if a.model == "mlp":
            cmd += ["--hidden", a.hidden]
        if a.limit_train:
            cmd += ["--limit-train", str(a.limit_train)]
        _, rss, cores = timed(cmd, budget_env(threads))
        summary = json.load(open(os.path.join(out_dir, "summary.json")))
        return {
            "train_samples_per_s": summary["train_samples_per_s"],
            "infer_samples_per_s": summary["infer_samples_per_s"],
            "test_acc1": 100.0 * summary["test_acc1"],
            "test_acc5": 100.0 * summary["test_acc5"],
            "peak_rss_mb": rss,
            "cpu_per_wall": cores,
        }
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def budget_env(threads):
    """The environment that holds a process to `threads` threads in every pool:
    PyTorch's BLAS is Debian's generic libblas (OpenBLAS, pthread build), which
    torch.set_num_threads does not reach and which otherwise uses every core."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    return env


def timed(cmd, env):
    """Runs cmd under /usr/bin/time; returns (stdout, peak RSS MiB, CPU seconds / wall seconds)."""
    p = subprocess.run(["/usr/bin/time", "-f", "RSS_KB=%M CPU=%U+%S WALL=%e"] + cmd, capture_output=True,
                       text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"train_vs_torch: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    fields = dict(f.split("=") for f in p.stderr.strip().splitlines()[-1].split())
    cpu = sum(float(x) for x in fields["CPU"].split("+"))
    return p.stdout, int(fields["RSS_KB"]) / 1024.0, cpu / max(float(fields["WALL"]), 1e-9)


def torch_once(a, threads):
    cmd = ["/usr/bin/python3", os.path.join(HERE, "torch_fashioncnn.py"), "--model", a.model,
           "--hidden", a.hidden, "--data", a.data, "--threads", str(threads), "--epochs", str(a.epochs),
           "--batch-size", str(a.batch_size), "--lr", str(a.lr), "--momentum", "0.9"]
    if a.limit_train:
        cmd += ["--limit-train", str(a.limit_train)]
    out, rss, cores = timed(cmd, budget_env(threads))
    r = json.loads(out.strip().splitlines()[-1])
    r["peak_rss_mb"], r["cpu_per_wall"] = rss, cores
    return r


def median_of(runs, key):
    return statistics.median(r[key] for r in runs)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dtrain", default=os.path.join(os.environ.get("DT_BUILD_DIR", "build"), "dtrain"))
    ap.add_argument("--model", default="fashioncnn")
    ap.add_argument("--hidden", default="2048,2048")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--limit-train", type=int, default=0)
    ap.add_argument("--threads", default="1,all", help="comma list; 'all' = every core")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
        print("# PyTorch (python3-torch) is not installed: printing dtrain's figures alone")
    ncores = os.cpu_count()
    print(f"# model {a.model}{' ' + a.hidden if a.model == 'mlp' else ''}, batch {a.batch_size}, SGD lr {a.lr} "
          f"momentum 0.9, {a.epochs} epoch(s), {a.limit_train or 60000} train samples, median of {a.reps}")
    print("# OpenBLAS kernels (dtrain's GEMMs, PyTorch's Linear layers): "
          + (f"OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']}" if os.environ.get("OPENBLAS_CORETYPE")
             else "chosen by OpenBLAS for this CPU") + "; PyTorch's convolutions use oneDNN")
    print("# both sides held to the same thread budget (OMP/OpenBLAS/MKL_NUM_THREADS, torch.set_num_threads, "
          "dtrain --threads); CPU/wall = cores the whole process kept busy")
    cols = ("threads", "impl", "train samp/s", "infer samp/s", "top-1 %", "top-5 %", "peak RSS MiB", "CPU/wall")
    print("%-8s %-8s %13s %13s %8s %8s %13s %9s" % cols)
    for t in a.threads.split(","):
        threads = ncores if t == "all" else int(t)
        ours = [dtrain_once(a.dtrain, a, threads, []) for _ in range(a.reps)]
        rows = [("dtrain", ours)]
        if have_torch:
            rows.append(("pytorch", [torch_once(a, threads) for _ in range(a.reps)]))
        for name, runs in rows:
            print("%-8d %-8s %13.0f %13.0f %8.2f %8.2f %13.1f %9.2f" % (
                threads, name, median_of(runs, "train_samples_per_s"), median_of(runs, "infer_samples_per_s"),
                median_of(runs, "test_acc1"), median_of(runs, "test_acc5"), median_of(runs, "peak_rss_mb"),
                median_of(runs, "cpu_per_wall")))
        if have_torch:
            theirs = rows[1][1]
            print("%-8d %-8s %13.2fx %12.2fx %+8.2f %8s %12.2fx" % (
                threads, "ratio", median_of(ours, "train_samples_per_s") / median_of(theirs, "train_samples_per_s"),
                median_of(ours, "infer_samples_per_s") / median_of(theirs, "infer_samples_per_s"),
                median_of(ours, "test_acc1") - median_of(theirs, "test_acc1"), "",
                median_of(ours, "peak_rss_mb") / median_of(theirs, "peak_rss_mb")))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
