#!/usr/bin/python3
"""MovieLens rating prediction, side by side in one run: dtrain's mf and ncf
against the same models in PyTorch (bench/torch_movielens_worker.py), single
process and DDP with 2 processes of one thread each, and dtrain's DDP with the
embedding gradients exchanged as touched rows (all-gather) and as dense tables
(all-reduce).

Recipe on both sides: ml-latest-small, 10% held out at random (seed 0; each
side its own permutation), Adam lr 0.001, batch 256 per process, MSE plus
0.05 x the batch mean of |user row|^2 + |item row|^2, embeddings N(0, 0.01),
mf 64 factors with the global bias at the training mean, ncf 32 factors and
hidden 64,32. Sparse updates on both sides (nn.Embedding(sparse=True) with
SparseAdam, Adam for the rest; dtrain --sparse-embeddings), PyTorch's fastest.

Figures, median over --reps runs (sides alternate):
  samples/s   training samples of all processes / training time (dtrain:
              summary.json train_samples_per_s; PyTorch: the epoch loops' time)
  test RMSE   on the held-out 10% after the last epoch
  bytes/step  dtrain DDP: this rank's gradient payload per step (summary.json)
"""
import argparse, json, os, shutil, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synthetic_vs_torch import budget_env, cpu_line, free_port, loadavg, med  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DATA = os.path.join(HERE, "..", "..", "shared", "data", "movielens", "ml-latest-small")


def fail(what, cmd, rc, err):
    sys.exit(f"movielens_vs_torch: {what} failed: {' '.join(cmd)} exited with status {rc}\n{err[-3000:]}")


def dtrain_once(a, model, ddp, exchange, tmp, seed):
    out = os.path.join(tmp, "out")
    cmd = [a.dtrain, "train", "--model", model, "--data", a.data, "--epochs", str(a.epochs), "--batch-size",
           str(a.batch_size), "--optimizer", "adam", "--lr", str(a.lr), "--embedding-l2", str(a.l2),
           "--sparse-embeddings", "--seed", str(seed), "--progress", "none", "--out", out]
    if ddp:
        cmd = [a.dtrun, "--standalone", "--nproc-per-node", "2", "--threads-per-proc", "1", "--"] + cmd + [
            "--strategy", "ddp", "--embedding-exchange", exchange]
    p = subprocess.run(cmd, capture_output=True, text=True, env=budget_env(1), timeout=1800)
    if p.returncode != 0:
        fail("dtrain", cmd, p.returncode, p.stderr + p.stdout)
    s = json.load(open(os.path.join(out, "summary.json")))
    return {"samples_per_s": s["train_samples_per_s"], "rmse": s["test_rmse"],
            "bytes": s.get("comm_bytes_per_step", 0.0)}


def torch_once(a, model, ddp, tmp, seed):
    nproc = 2 if ddp else 1
    port, procs = str(free_port()), []
    for r in range(nproc):
        env = budget_env(1)
        env.pop("WORLD_SIZE", None)
        if ddp:
            env.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        cmd = ["/usr/bin/python3", os.path.join(HERE, "torch_movielens_worker.py"), "--data", a.data, "--model", model,
               "--epochs", str(a.epochs), "--batch-size", str(a.batch_size), "--lr", str(a.lr), "--l2", str(a.l2),
               "--seed", str(seed)]
        procs.append((cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)))
    outs = []
    for cmd, p in procs:
        o, err = p.communicate(timeout=1800)
        if p.returncode != 0:
            fail("PyTorch", cmd, p.returncode, err)
        outs.append(o)
    r = json.loads(outs[0].strip().splitlines()[-1])
    return {"samples_per_s": r["samples_per_s"], "rmse": r["test_rmse"], "bytes": 0.0}


def main():
    build = os.environ.get("DT_BUILD_DIR", "build")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtrain", default=os.path.join(build, "dtrain"))
    ap.add_argument("--data", default=os.path.normpath(DEFAULT_DATA))
    ap.add_argument("--models", default="mf,ncf")
    ap.add_argument("--configs", default="single,ddp")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--l2", type=float, default=0.05)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    a.dtrain = os.path.abspath(a.dtrain)
    a.dtrun = os.path.join(os.path.dirname(a.dtrain), "dtrun")
    if not os.path.exists(os.path.join(a.data, "ratings.csv")):
        sys.exit(f"movielens_vs_torch: {a.data}/ratings.csv is missing (--data DIR)")
    models, configs = a.models.split(","), a.configs.split(",")
    print(f"# {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; {cpu_line()}")
    print(f"# load average at start: {loadavg()}")
    print(f"# {a.data}: Adam lr {a.lr}, batch {a.batch_size} per process, L2 {a.l2} on looked-up rows, "
          f"{a.epochs} epochs, sparse embedding updates both sides, one thread per process; median of {a.reps}")
    rows = []
    for model in models:
        for config in configs:
            ddp = config == "ddp"
            sides = [("dtrain", lambda t, s: dtrain_once(a, model, ddp, "auto", t, s))]
            if ddp:
                sides.append(("dtrain dense exchange", lambda t, s: dtrain_once(a, model, ddp, "dense", t, s)))
            sides.append(("PyTorch", lambda t, s: torch_once(a, model, ddp, t, s)))
            runs = {name: [] for name, _ in sides}
            for rep in range(a.reps):
                for name, fn in sides:
                    tmp = tempfile.mkdtemp(prefix="dtrain-ml-bench-")
                    try:
                        runs[name].append(fn(tmp, a.seed + rep))
                    finally:
                        shutil.rmtree(tmp, ignore_errors=True)
            rows.append((model, "single" if not ddp else "ddp x2", runs))
    print()
    print("| model | config | impl | samples/s | test RMSE | bytes/step (rank 0) |")
    print("|---|---|---|---:|---:|---:|")
    for model, config, runs in rows:
        for name, r in runs.items():
            print("| %s | %s | %s | %.0f | %.4f | %s |" % (model, config, name, med(r, "samples_per_s"), med(r, "rmse"),
                                                         "%.0f" % med(r, "bytes") if "dtrain" in name and config != "single" else "-"))
        ratio = med(runs["dtrain"], "samples_per_s") / med(runs["PyTorch"], "samples_per_s")
        print("| %s | %s | **dtrain/PyTorch** | **%.2fx** | %+.4f | |" % (
            model, config, ratio, med(runs["dtrain"], "rmse") - med(runs["PyTorch"], "rmse")))
        print(f"# target {model} {config}: dtrain >= 5x PyTorch samples/s: {'met' if ratio >= 5 else 'missed'}")
    print(f"# load average at end: {loadavg()}")


if __name__ == "__main__":
    main()
