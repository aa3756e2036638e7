#!/usr/bin/env python3
"""A 2-rank DDP job under 1,000 hostile connections to its store vs the same job undisturbed.

Alternates undisturbed and stressed runs of the same job (fashioncnn, Fashion-MNIST, DDP x 2
through dtrun with a job secret on a fixed port); the stress is tests/cli/store_attack.py
stress (random bytes, half-open handshakes held open, slow senders, wrong proofs,
connect-and-close) spread over the training. Prints train samples/s of each run, the median
ratio stressed/undisturbed, and whether every stressed run ended with the weights of the
undisturbed one. The attacker stands for other machines: on this one it runs at nice 19 by
default (--attacker-nice 0 lets its own CPU compete with the job's ranks); what is measured is
what the job's host pays, the store's work included (the store's thread runs at nice 10).

  DT_BUILD_DIR=build python3 bench/store_stress.py [--reps 3] [--conns 1000] [--limit-train 20000]
"""
import argparse, filecmp, json, os, resource, secrets, socket, statistics, subprocess, sys, tempfile, time

here = os.path.dirname(os.path.abspath(__file__))
attack = os.path.join(here, "..", "tests", "cli", "store_attack.py")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def listening(port):
    s = socket.socket()
    try:
        return s.connect_ex(("127.0.0.1", port)) == 0
    finally:
        s.close()


def run(build, out, args, conns, seconds):
    port = free_port()
    cmd = [f"{build}/dtrun", "--nnodes", "1", "--master-port", str(port), "--nproc-per-node", "2",
           "--run-id", "bench-stress", "--", f"{build}/dtrain", "train", "--strategy", "ddp", "--model", "fashioncnn",
           "--data", "fashion-mnist", "--limit-train", str(args.limit_train), "--limit-test", "1000", "--epochs", "1",
           "--batch-size", "64", "--optimizer", "sgd", "--lr", "0.01", "--momentum", "0.9", "--seed", "5",
           "--progress", "none", "--out", out, "--overwrite"]
    job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stress = None
    if conns:
        while not listening(port):
            time.sleep(0.01)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        stress = subprocess.run(["nice", "-n", str(args.attacker_nice), sys.executable, attack, "stress", "127.0.0.1",
                                 str(port), str(conns), str(seconds)], capture_output=True, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        stress.cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    err = job.communicate()[1]
    if job.returncode != 0:
        sys.exit(f"job failed ({job.returncode}): {err[-2000:]}")
    if stress and stress.returncode != 0:
        sys.exit(f"stress admitted a stranger: {stress.stdout}")
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    refusals = sum("refused a connection" in line for line in err.splitlines())
    line = f"{stress.stdout.strip()}; the attacker used {stress.cpu:.1f} CPU s" if stress else ""
    return s["train_samples_per_s"], s["wall_seconds"], line, refusals


def agent_cpu(build, conns, seconds):
    """CPU seconds of the dtrun agent (whose thread serves the store) over a job of one sleeping worker,
    read while the job still runs: idle, or while conns hostile connections arrive over `seconds`."""
    port = free_port()
    job = subprocess.Popen([f"{build}/dtrun", "--nnodes", "1", "--master-port", str(port), "--", "sleep",
                            str(seconds + 3)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not listening(port):
        time.sleep(0.01)
    if conns:
        subprocess.run([sys.executable, attack, "stress", "127.0.0.1", str(port), str(conns), str(seconds)],
                       capture_output=True, text=True)
    else:
        time.sleep(seconds)
    with open(f"/proc/{job.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    job.wait()
    return cpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--conns", type=int, default=1000)
    ap.add_argument("--limit-train", type=int, default=20000)
    ap.add_argument("--attacker-nice", type=int, default=19, help="the attacker's nice value (0: it competes)")
    ap.add_argument("--seconds", type=float, default=0,
                    help="spread the connections over this (default: 60%% of the undisturbed run before)")
    args = ap.parse_args()
    build = os.environ.get("DT_BUILD_DIR", "build")
    os.environ["DT_JOB_SECRET"] = secrets.token_hex(32)
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    tmp = tempfile.mkdtemp()
    calm, stressed, same = [], [], True
    for r in range(args.reps):
        tp, wall, _, _ = run(build, f"{tmp}/calm{r}", args, 0, 0)
        calm.append(tp)
        seconds = args.seconds or max(1.0, 0.6 * wall)
        tp2, wall2, line, refusals = run(build, f"{tmp}/stress{r}", args, args.conns, seconds)
        stressed.append(tp2)
        same &= filecmp.cmp(f"{tmp}/calm{r}/model.safetensors", f"{tmp}/stress{r}/model.safetensors", shallow=False)
        print(f"rep {r + 1}: undisturbed {tp:8.0f} samples/s ({wall:.1f} s); stressed {tp2:8.0f} samples/s "
              f"({wall2:.1f} s), {refusals} refusal log line(s); {line}")
    idle = agent_cpu(build, 0, 10)
    busy = agent_cpu(build, args.conns, 10)
    print(f"the store's host (dtrun agent) over 10 s: {idle:.2f} CPU s idle, {busy:.2f} CPU s under {args.conns} "
          f"hostile connections")
    ratio = statistics.median(stressed) / statistics.median(calm)
    print(f"median train samples/s: undisturbed {statistics.median(calm):.0f}, under {args.conns} hostile connections "
          f"{statistics.median(stressed):.0f}: ratio {ratio:.3f}; weights identical in every pair: {same}")
    subprocess.run(["rm", "-rf", tmp])
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
