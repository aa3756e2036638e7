#!/usr/bin/python3
"""DDP across two hosts, side by side in one run: two network namespaces joined by a veth pair stand for two
machines (needs root), one process of one thread on each; dtrain (`dtrun --nnodes 2`, tcp between the hosts)
against PyTorch DDP over gloo (bench/torch_ddp_worker.py with RANK/WORLD_SIZE/MASTER_ADDR set, as torchrun would)
on the same namespaces: fashioncnn on Fashion-MNIST, batch 64 per process, SGD momentum 0.9, --epochs, a
DistributedSampler on both sides. Repetitions alternate sides; figures are medians.

Figures: training samples/s (samples of both ranks / rank 0's training time), inference samples/s, test top-1
(exact over the whole test set on both sides), and the ratio dtrain / PyTorch.

    bench/ddp_hosts_vs_torch.py [--build build] [--limit-train 12800] [--epochs 1] [--reps 3]
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from synthetic_vs_torch import budget_env, cpu_line, loadavg  # noqa: E402

A, B, NET = "dtbA%d" % os.getpid(), "dtbB%d" % os.getpid(), "10.%d.%d." % (150 + os.getpid() % 50, os.getpid() % 250)


def sh(*cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def make_hosts():
    va, vb = "vba%d" % os.getpid(), "vbb%d" % os.getpid()
    sh("ip", "netns", "add", A)
    sh("ip", "netns", "add", B)
    sh("ip", "link", "add", va, "type", "veth", "peer", "name", vb)
    sh("ip", "link", "set", va, "netns", A)
    sh("ip", "link", "set", vb, "netns", B)
    for ns, dev, ip in ((A, va, NET + "1/24"), (B, vb, NET + "2/24")):
        sh("ip", "-n", ns, "addr", "add", ip, "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")


def drop_hosts():
    for ns in (A, B):
        subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)


def both(cmds, envs):
    """Runs the two ranks' commands in their namespaces; their stdout."""
    procs = [subprocess.Popen(["ip", "netns", "exec", ns, *c], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=e) for ns, c, e in zip((A, B), cmds, envs)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=3600)
        if p.returncode != 0:
            for q in procs:
                q.kill()
            raise SystemExit(f"a rank failed (exit {p.returncode}): {err[-800:]}")
        outs.append(out)
    return outs


def dtrain_once(a, tmp, port):
    out = os.path.join(tmp, "dt%d-" % port)  # a fresh output directory every repetition
    cmds = []
    for node in (0, 1):
        cmds.append([os.path.join(a.build, "dtrun"), "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
                     "--master-addr", NET + "1", "--master-port", str(port), "--run-id", "bench%d" % port, "--",
                     os.path.join(a.build, "dtrain"), "train", "--strategy", "ddp", "--threads", "1", "--model",
                     "fashioncnn", "--epochs", str(a.epochs), "--batch-size", "64", "--optimizer", "sgd", "--lr", "0.01",
                     "--momentum", "0.9", "--limit-train", str(a.limit_train), "--progress", "none",
                     "--out", out + str(node)])
    both(cmds, [budget_env(1), budget_env(1)])
    s = json.load(open(os.path.join(out + "0", "summary.json")))
    return {"train": s["train_samples_per_s"], "infer": s["infer_samples_per_s"], "top1": 100 * s["test_acc1"]}


def torch_once(a, port):
    cmds, envs = [], []
    for r in (0, 1):
        e = budget_env(1)
        e.update(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR=NET + "1",
                 MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="vba%d" % os.getpid() if r == 0 else "vbb%d" % os.getpid())
        envs.append(e)
        cmds.append(["/usr/bin/python3", os.path.join(HERE, "torch_ddp_worker.py"), "--threads", "1", "--epochs",
                     str(a.epochs), "--batch-size", "64", "--lr", "0.01", "--momentum", "0.9", "--limit-train",
                     str(a.limit_train)])
    r = json.loads(both(cmds, envs)[0].strip().splitlines()[-1])
    return {"train": r["train_samples_per_s"], "infer": r["infer_samples_per_s"], "top1": r["test_acc1"]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    p.add_argument("--limit-train", type=int, default=12800)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces): nothing measured")
        return 0
    print(f"# {cpu_line()}; load average before: {loadavg()}")
    print(f"# 2 hosts (network namespaces, veth), 1 process x 1 thread each; fashioncnn, {a.limit_train} samples, "
          f"{a.epochs} epoch(s), batch 64 per process; median of {a.reps}")
    make_hosts()
    try:
        d, t = [], []
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(a.reps):
                d.append(dtrain_once(a, tmp, 29700 + 2 * i))
                t.append(torch_once(a, 29701 + 2 * i))
    finally:
        drop_hosts()
    med = lambda runs, k: statistics.median(r[k] for r in runs)  # noqa: E731
    print("| | dtrain (tcp) | PyTorch DDP (gloo) | dtrain / PyTorch |")
    print("|---|---:|---:|---:|")
    for k, name in (("train", "training samples/s"), ("infer", "inference samples/s")):
        print(f"| {name} | {med(d, k):.0f} | {med(t, k):.0f} | {med(d, k) / med(t, k):.2f}x |")
    print(f"| test top-1 | {med(d, 'top1'):.2f}% | {med(t, 'top1'):.2f}% | |")
    print(f"# load average after: {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
