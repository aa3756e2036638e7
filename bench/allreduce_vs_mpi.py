#!/usr/bin/env python3
"""All-reduce of floats (sum): dtrain's shm and tcp backends against Open MPI's
MPI_Allreduce on shared memory (btl vader) and TCP loopback (btl tcp), same
sizes, same iteration rule, same ranks, in one run. Prints one table per rank
count with time and bus bandwidth of each, and the ratios dtrain/MPI
(busbw: > 1 is dtrain faster; time: < 1 is dtrain faster), then each side's
CPU seconds per GB all-reduced (out of place, mean over ranks).

  bench/allreduce_vs_mpi.py [--build build] [--ranks 2,4] [-b 8] [-e 64M] [-f 4] [--reps 3] [--backends shm,tcp]
                            [--bind-to none|core]

--bind-to core binds both sides the same way (rank R to core R modulo the
cores: dtrun --bind-to core, mpirun --map-by core --bind-to
core:overload-allowed; alike where each core has one logical CPU, as on the
machines measured); the default none leaves placement to the kernel on both.

Each configuration runs --reps times, interleaved (dtrain shm, MPI shm,
dtrain tcp, MPI tcp, then again), and every cell is the median.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synthetic_vs_torch import cpu_line  # noqa: E402


def run(cmd, env=None):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, timeout=900)
    if p.returncode != 0:
        sys.stderr.write("failed: %s\n%s%s" % (" ".join(cmd), p.stdout[-2000:], p.stderr[-2000:]))
        return None
    return p.stdout


def parse(table):
    """size -> (out-of-place time us, out-of-place busbw, in-place time, in-place busbw, CPU s per GB or nan)"""
    rows = {}
    for line in (table or "").splitlines():
        f = line.split()
        if not f or line.startswith("#") or f[0].startswith("["):
            # dtrun prefixes worker lines with "[rank 0]: "
            if f and f[0] == "[rank" and len(f) > 2:
                f = f[2:]
            else:
                continue
        if len(f) < 13 or not f[0].isdigit():
            continue
        rows[int(f[0])] = (float(f[5]), float(f[7]), float(f[9]), float(f[11]),
                           float(f[13]) if len(f) > 13 else float("nan"))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.environ.get("DT_BUILD_DIR", "build"))
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("-b", default="8")
    ap.add_argument("-e", default="64M")
    ap.add_argument("-f", default="4")
    ap.add_argument("-n", default="100")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--backends", default="shm,tcp", help="comma list of shm, tcp (one alone halves the run)")
    ap.add_argument("--bind-to", default="none", choices=("none", "core"),
                    help="none: the kernel places ranks; core: rank R on core R mod cores, on both sides")
    args = ap.parse_args()
    backends = args.backends.split(",")
    if not backends or any(x not in ("shm", "tcp") for x in backends):
        ap.error("--backends: '%s' is not a comma list of shm, tcp" % args.backends)
    b = args.build
    sizes = ["-b", args.b, "-e", args.e, "-f", args.f, "-n", args.n]
    mpirun = shutil.which("mpirun")
    ref = os.path.join(b, "bench", "mpi_allreduce")
    have_mpi = mpirun and os.path.exists(ref)
    if not have_mpi:
        print("# Open MPI (mpirun, build/bench/mpi_allreduce) not found: printing dtrain's figures alone")
    print("# CPU: " + cpu_line())
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for n in [int(x) for x in args.ranks.split(",")]:
        runs = {}
        for _ in range(args.reps):
            for backend in backends:
                out = run([os.path.join(b, "dtrun"), "--standalone", "--nproc-per-node", str(n),
                           "--bind-to", args.bind_to, "--",
                           os.path.join(b, "dtrain"), "bench", "allreduce", "--backend", backend] + sizes, env)
                runs.setdefault("dtrain " + backend, []).append(parse(out))
                if have_mpi:
                    bind = ["--bind-to", "none"] if args.bind_to == "none" else \
                        ["--map-by", "core", "--bind-to", "core:overload-allowed"]
                    base = [mpirun, "--allow-run-as-root", "--oversubscribe", "-n", str(n)] + bind
                    btl = ["--mca", "btl", "vader,self"] if backend == "shm" else \
                        ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo", "--mca", "pml", "ob1"]
                    runs.setdefault("MPI " + backend, []).append(parse(run(base + btl + [ref] + sizes, env)))
        cols = {}
        for k, tables in runs.items():
            cols[k] = {}
            for size in set().union(*[set(t) for t in tables]):
                vals = [t[size] for t in tables if size in t]
                cols[k][size] = tuple(statistics.median(v[i] for v in vals) for i in range(5))
        print("\n## %d ranks, float sum, out of place: time (us) and bus bandwidth (GB/s), median of %d, bound to %s\n"
              % (n, args.reps, args.bind_to))
        names = [k for k in ("dtrain shm", "MPI shm", "dtrain tcp", "MPI tcp") if k in cols]
        head = "| size (B) | " + " | ".join("%s us | %s GB/s" % (k, k) for k in names)
        pairs = [x for x in backends if have_mpi]
        for x in pairs:
            head += " | %s busbw ratio | %s time ratio" % (x, x)
        head += "".join(" | %s cpu s/GB" % k for k in names)
        print(head + " |")
        print("|" + "---|" * (1 + 3 * len(names) + 2 * len(pairs)))
        for size in sorted(set().union(*[set(v) for v in cols.values()])):
            cells = []
            for k in names:
                r = cols[k].get(size)
                cells += ["%.2f" % r[0], "%.2f" % r[1]] if r else ["-", "-"]
            def ratio(a, c, i):
                ra, rc = cols[a].get(size), cols[c].get(size)
                return "%.2f" % (ra[i] / rc[i]) if ra and rc and rc[i] > 0 else "-"
            for x in pairs:
                cells += [ratio("dtrain " + x, "MPI " + x, 1), ratio("dtrain " + x, "MPI " + x, 0)]
            for k in names:
                r = cols[k].get(size)
                cells.append("%.3f" % r[4] if r and r[4] == r[4] else "-")
            print("| %d | %s |" % (size, " | ".join(cells)))


if __name__ == "__main__":
    main()
