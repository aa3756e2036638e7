"""Parity of dtrain's distributed sampler with torch.utils.data.DistributedSampler (PyTorch 1.13).

Drives tests/parity/dump_sampler.c, which writes every rank's dt_dist_sampler
indices for one (n, replicas, seed, epoch, shuffle, drop_last); the same lists
come from DistributedSampler(range(n), replicas, rank, shuffle, seed,
drop_last) after set_epoch(epoch), and must be equal element for element.
Also checks num_real: the first num_real indices of every rank cover each of
the n samples exactly once (without drop_last), and are all of them with it.
Set DT_SAMPLER_BIG=1 to also check n = 214748364 (UINT32_MAX / 20, where later
PyTorch releases change randperm's algorithm; ~1 minute, 2 GB).
Exit 77 only when torch is missing.
"""
import array
import os
import random
import subprocess
import sys
import tempfile
import time

try:
    import torch
    from torch.utils.data.distributed import DistributedSampler
except ImportError as e:  # optional dependency: skip
    print(f"skipped: {e}")
    sys.exit(77)

BUILD = os.environ.get("DT_BUILD_DIR", "build")
TOOL = os.path.join(BUILD, "tests", "dump_sampler")
torch.set_num_threads(1)
failures = []


def check(name, ok, detail=""):
    if not ok:
        print(f"FAIL {name}: {detail}")
        failures.append(name)


def run_c(n, replicas, seed, epoch, shuffle, drop_last, out):
    """Every rank's (num_samples, num_real, indices) from the C sampler."""
    args = [TOOL, str(n), str(replicas), str(seed), str(epoch), str(int(shuffle)), str(int(drop_last)), out]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    a = array.array("q")
    with open(out, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    ranks, pos = [], 0
    for _ in range(replicas):
        m, real = a[pos], a[pos + 1]
        ranks.append((m, real, a[pos + 2:pos + 2 + m].tolist()))
        pos += 2 + m
    assert pos == len(a), f"dump_sampler wrote {len(a)} values, parsed {pos}"
    return ranks


def compare(n, replicas, seed, epoch, shuffle, drop_last, tmp):
    name = f"n={n} replicas={replicas} seed={seed} epoch={epoch} shuffle={int(shuffle)} drop_last={int(drop_last)}"
    got = run_c(n, replicas, seed, epoch, shuffle, drop_last, os.path.join(tmp, "out.bin"))
    covered = []
    for rank in range(replicas):
        s = DistributedSampler(range(n), num_replicas=replicas, rank=rank, shuffle=shuffle, seed=seed,
                               drop_last=drop_last)
        s.set_epoch(epoch)
        want = list(iter(s))
        m, real, idx = got[rank]
        check(name, m == len(s), f"rank {rank}: num_samples {m}, torch {len(s)}")
        if idx != want:
            first = next((i for i, (a, b) in enumerate(zip(idx, want)) if a != b), min(len(idx), len(want)))
            check(name, False, f"rank {rank}: first difference at {first}: "
                                f"{idx[first:first + 5]} vs torch {want[first:first + 5]}")
            return
        check(name, 0 <= real <= m and (real == m or not drop_last), f"rank {rank}: num_real {real} of {m}")
        covered += idx[:real]
    if drop_last:
        check(name, len(covered) == len(set(covered)) == (n // replicas) * replicas,
              f"drop_last: {len(covered)} real samples, {len(set(covered))} distinct")
    else:
        check(name, sorted(covered) == list(range(n)), f"num_real does not count each sample once ({len(covered)})")


def main():
    if not os.path.exists(TOOL):
        print(f"FAIL: {TOOL} not built")
        return 1
    t0 = time.time()
    rng = random.Random(1234)
    small = [0, 1, 7, 10, 10000, 60000]
    reps = [1, 2, 3, 4, 7]
    seeds = [0, 42, 2 ** 40 + 3]
    epochs = [0, 1, 5]
    combos = []
    # sequential order: seed and epoch do not matter; every (n, replicas, drop_last)
    for n in small:
        for r in reps:
            for dl in (False, True):
                combos.append((n, r, rng.choice(seeds), rng.choice(epochs), False, dl))
    # shuffled: every (n, replicas, drop_last) with one sampled (seed, epoch), plus
    # every (seed, epoch) for the tiny and the MNIST-sized lengths
    for n in small:
        for r in reps:
            for dl in (False, True):
                combos.append((n, r, rng.choice(seeds), rng.choice(epochs), True, dl))
    for n in (10, 60000):
        for seed in seeds:
            for epoch in epochs:
                combos.append((n, rng.choice(reps), seed, epoch, True, rng.choice((False, True))))
    # a length beyond a million, both paddings
    combos.append((1234567, 4, 42, 1, True, False))
    combos.append((1234567, 7, 2 ** 40 + 3, 5, True, True))
    if os.environ.get("DT_SAMPLER_BIG") == "1":
        combos.append((214748364, 3, 0, 0, True, False))
    with tempfile.TemporaryDirectory() as tmp:
        for c in combos:
            compare(*c, tmp)
    print(f"{len(combos)} configurations compared in {time.time() - t0:.1f} s")
    if failures:
        print(f"{len(failures)} failed")
        return 1
    print("all equal to torch.utils.data.DistributedSampler")
    return 0


if __name__ == "__main__":
    sys.exit(main())
