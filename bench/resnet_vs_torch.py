#!/usr/bin/python3
"""ResNets side by side: dtrain vs PyTorch + torchvision (bench/torch_resnet_worker.py) on the same image folder,
recipe, transforms, data workers and cores, single process and DDP over 2 processes (dtrun vs gloo), data loading
included. Repetitions alternate dtrain and PyTorch; every cell is the median. Prints the CPU (model, SIMD flags,
cores) and the load average before and after, then a table: training samples/s of each, their ratio, top-1.

  bench/resnet_vs_torch.py [--models resnet20,resnet18] [--modes single,ddp] [--reps 3] [--workers 1]
                           [--samples-resnet20 5120] [--samples-resnet18 320] [--data ../shared/data]
  bench/resnet_vs_torch.py --first-epoch [--models resnet20] [--modes single] [--epochs-schedule 20]
                           [--batch-size 128] [--label-smoothing 0]
  bench/resnet_vs_torch.py --first-epoch --models resnet9

resnet9 (at --width 32) runs its own recipe: batch 512, Nesterov, weight decay 5e-4, label smoothing 0.2, the lr
rising linearly from 0 to 0.4 over 4 of 20 epochs and falling to 0 at the 20th (dtrain's --schedule linear
--warmup-epochs 4): its first epoch, here, is the rise from 0 to 0.1 (--schedule linear with the epoch's steps as
warm-up on dtrain's side, LambdaLR on PyTorch's).

Cases: resnet20 on cifar10 (batch 128, --augment cifar; resnet32 and resnet56 alike, --samples-resnet20 images),
resnet18 on imagenette-subset (batch 32, --augment imagenet); SGD lr 0.1 momentum 0.9 weight decay 5e-4. Throughput runs train on N training images drawn at
random (dtrain's --limit-pick auto on a folder; random.sample in PyTorch: top-1 after so few steps says only that
both trained) and score 1,000 random test images. --first-epoch runs the CIFAR-10 recipe's first epoch (all 50,000 images, Nesterov, a 20-epoch schedule
of one warm-up epoch and cosine) once per side and scores the whole test set: the accuracy comparison; --batch-size
(per rank) and --label-smoothing change the recipe on both sides, and --modes ddp runs it on 2 ranks.
Threads: DDP gives each of the 2 ranks half the cores; the DataLoader's workers and dtrain's --data-workers are
the same number."""
import argparse, json, os, shutil, socket, statistics, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = {"resnet9": ("cifar10", "cifar", 512), "resnet20": ("cifar10", "cifar", 128), "resnet32": ("cifar10", "cifar", 128), "resnet56": ("cifar10", "cifar", 128),
         "resnet18": ("imagenette-subset", "imagenet", 32)}


def cpu_line():
    info = {}
    for line in open("/proc/cpuinfo"):
        if ":" in line:
            k, v = (s.strip() for s in line.split(":", 1))
            info.setdefault(k, v)
    flags = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if f in info.get("flags", "").split()]
    return f"CPU: {info.get('model name', '?')}, {os.cpu_count()} cores, {' '.join(flags)}"


def load():
    return open("/proc/loadavg").read().split()[0]


def env_for(threads):
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    return env


def run(cmd, env, what):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=7200)
    if p.returncode != 0:
        sys.exit(f"resnet_vs_torch: {what} failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return p.stdout


def recipe(a, model, first_epoch):
    folder, preset, batch = CASES[model]
    r = {"data": os.path.join(a.data, folder), "preset": preset, "batch": a.batch_size or batch, "limit_train": 0,
         "limit_test": 1000}
    if first_epoch:
        r["limit_test"] = 0
    else:
        r["limit_train"] = a.samples_resnet18 if model == "resnet18" else a.samples_resnet20
    return r


RESNET9_WIDTH, RESNET9_SMOOTHING = 32, 0.2


def first_epoch_steps(a, r, ranks):
    """Optimizer steps of one epoch over the whole training folder at batch r["batch"] a rank."""
    train, exts = os.path.join(r["data"], "train"), (".jpg", ".jpeg", ".png")  # what the folder holds, as both read it
    n = sum(1 for c in os.listdir(train) for f in os.listdir(os.path.join(train, c)) if f.lower().endswith(exts))
    per_rank = -(-n // ranks)
    return -(-per_rank // r["batch"])


def dtrain_first_epoch(a, model, r, ranks):
    """The recipe's first epoch as dtrain flags (see the module's doc)."""
    if model == "resnet9":
        return ["--nesterov", "--cache-images", "--schedule", "linear", "--warmup-steps",
                str(first_epoch_steps(a, r, ranks)), "--label-smoothing", str(RESNET9_SMOOTHING)]
    # the 20-epoch recipe's first epoch is its warm-up: LinearLR from lr/3, the same steps' lr
    return ["--nesterov", "--schedule", "constant", "--warmup-epochs", "1", "--cache-images",
            "--label-smoothing", str(a.label_smoothing)]


def torch_first_epoch(a, model):
    if model == "resnet9":
        return ["--nesterov", "--schedule", "rise", "--label-smoothing", str(RESNET9_SMOOTHING)]
    return ["--nesterov", "--schedule", "cosine", "--schedule-epochs", str(a.epochs_schedule), "--warmup-epochs",
            "1", "--label-smoothing", str(a.label_smoothing)]


def dtrain_once(a, model, mode, first_epoch):
    r = recipe(a, model, first_epoch)
    ranks = 2 if mode == "ddp" else 1
    out = tempfile.mkdtemp(prefix="resnet-bench-")
    cmd = [os.path.join(a.build, "dtrain"), "train", "--model", model, "--data", r["data"], "--augment", r["preset"],
           "--epochs", "1", "--batch-size", str(r["batch"]), "--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9",
           "--weight-decay", "5e-4", "--threads", str(max(1, a.threads // ranks)), "--data-workers", str(a.workers),
           "--seed", "0", "--progress", "none", "--out", out]
    if r["limit_train"]:
        cmd += ["--limit-train", str(r["limit_train"])]
    if r["limit_test"]:
        cmd += ["--limit-test", str(r["limit_test"])]
    if model == "resnet9":
        cmd += ["--width", str(RESNET9_WIDTH)]
    if first_epoch:
        cmd += dtrain_first_epoch(a, model, r, ranks)
    if mode == "ddp":
        cmd = [os.path.join(a.build, "dtrun"), "--standalone", "--nproc-per-node", "2", "--"] + cmd + ["--strategy", "ddp"]
    try:
        run(cmd, env_for(max(1, a.threads // ranks)), f"dtrain {model} {mode}")
        s = json.load(open(os.path.join(out, "summary.json")))
        return {"sps": s["train_samples_per_s"], "top1": 100.0 * s["test_acc1"], "wait": s.get("data_wait_seconds", 0.0)}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def torch_once(a, model, mode, first_epoch):
    r = recipe(a, model, first_epoch)
    ranks = 2 if mode == "ddp" else 1
    cmd = ["/usr/bin/python3", os.path.join(HERE, "torch_resnet_worker.py"), "--data", r["data"], "--model", model,
           "--augment", r["preset"], "--threads", str(max(1, a.threads // ranks)), "--workers", str(a.workers),
           "--batch-size", str(r["batch"]), "--limit-train", str(r["limit_train"]), "--limit-test", str(r["limit_test"])]
    if model == "resnet9":
        cmd += ["--width", str(RESNET9_WIDTH)]
    if first_epoch:
        cmd += torch_first_epoch(a, model)
    if ranks == 1:
        out = run(cmd, env_for(a.threads), f"PyTorch {model}")
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
        procs = []
        for rank in range(ranks):
            env = env_for(max(1, a.threads // ranks))
            env.update(RANK=str(rank), WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
        outs = [p.communicate(timeout=7200) for p in procs]
        for p, (o, e) in zip(procs, outs):
            if p.returncode != 0:
                sys.exit(f"resnet_vs_torch: PyTorch DDP {model} failed ({p.returncode})\n{e[-3000:]}")
        out = outs[0][0]
    j = json.loads(out.strip().splitlines()[-1])
    return {"sps": j["train_samples_per_s"], "top1": j["test_acc1"], "wait": float("nan")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("DT_BUILD_DIR", "build"))
    ap.add_argument("--data", default=os.path.join(HERE, "..", "..", "shared", "data"))
    ap.add_argument("--models", default=None, help="default: resnet20,resnet18; with --first-epoch resnet20")
    ap.add_argument("--modes", default=None, help="default: single,ddp; with --first-epoch single")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--workers", type=int, default=1, help="data workers on both sides")
    ap.add_argument("--samples-resnet20", type=int, default=5120)
    ap.add_argument("--samples-resnet18", type=int, default=320)
    ap.add_argument("--first-epoch", action="store_true", help="the CIFAR-10 recipe's first epoch, once per side")
    ap.add_argument("--epochs-schedule", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=0,
                    help="per rank (default: 128 on CIFAR, 512 for resnet9, 32 on Imagenette)")
    ap.add_argument("--label-smoothing", type=float, default=0.0,
                    help="--first-epoch: the recipe's label smoothing (resnet9's recipe has its own, 0.2)")
    a = ap.parse_args()
    a.models = a.models or ("resnet20" if a.first_epoch else "resnet20,resnet18")
    a.modes = a.modes or ("single" if a.first_epoch else "single,ddp")
    for m in a.models.split(","):
        if m not in CASES:
            sys.exit(f"resnet_vs_torch: unknown model {m}: choose among {', '.join(CASES)}")
    print(cpu_line())
    print(f"load average before: {load()}; {a.threads} threads, {a.workers} data worker(s)")
    if a.first_epoch and any(CASES[m][0] != "cifar10" for m in a.models.split(",")):
        sys.exit("resnet_vs_torch: --first-epoch runs the CIFAR-10 recipe: give --models among the CIFAR ResNets")
    cases = [(m, mode) for m in a.models.split(",") for mode in a.modes.split(",")]
    reps = 1 if a.first_epoch else a.reps
    print("\n| model | mode | dtrain samples/s | PyTorch samples/s | ratio | top-1 dtrain | top-1 PyTorch | dtrain data wait s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for model, mode in cases:
        d, t = [], []
        for _ in range(reps):  # alternated
            d.append(dtrain_once(a, model, mode, a.first_epoch))
            t.append(torch_once(a, model, mode, a.first_epoch))
        med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
        ds, ts = med(d, "sps"), med(t, "sps")
        print(f"| {model} | {mode} | {ds:.1f} | {ts:.1f} | **{ds / ts:.2f}x** | {med(d, 'top1'):.2f} | "
              f"{med(t, 'top1'):.2f} | {med(d, 'wait'):.2f} |", flush=True)
    print(f"\nload average after: {load()}")


if __name__ == "__main__":
    main()
