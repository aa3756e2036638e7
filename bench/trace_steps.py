#!/usr/bin/python3
"""Where a training step's time goes, from a dtrain Chrome trace (dtrain train
--trace FILE): for every rank, the main thread's spans of each optimizer step cut
into consecutive segments, as mean / median / p90 in microseconds.

  stop all-reduce      ddp: the per-step agreement on a stop request (3 int32, max: the
                       flag, and the last step's wait and all-reduce time, negated)
  wait for data        dt_loader_next: handing over the next batch
  buffers broadcast    ddp: rank 0's buffers (BatchNorm's running statistics) sent before forward
  forward, backward    the model's spans
  loss + metrics       between forward and backward (loss, its gradient, counters)
  after backward       between backward and the step's end phase: the gradient
                       bucket's launch (ddp), the loss check, batch hooks, dp's
                       sum of the gradients where its step is not fused
  grad all-reduce      ddp: the bucket all-reduce run inside the step's end phase (with the
                       sharded update, the update of this rank's share included)
                       (run by the main thread when the queue was idle)
  optimizer + rest     the rest of "finish step + optimizer" (waiting for the
                       communication thread when it ran the bucket, the update;
                       dp: the workers' fused shares of the gradients' sum and
                       the update; each worker's listed as "dp share", by kind)
  step hooks           from the end phase to the next step's first span
  step total           from one step's first span to the next's
The first step of every epoch (whose stop all-reduce also waits for the other
ranks' end of epoch: rank 0 writes metrics and the report) and the last (followed
by the epoch's end) are left out; the first epoch is left out as warm-up.

Usage: bench/trace_steps.py TRACE.json [--skip-epochs N]"""
import argparse, json, sys

SEGMENTS = ("stop all-reduce", "wait for data", "buffers broadcast", "forward", "loss + metrics", "backward",
            "after backward", "grad all-reduce", "optimizer + rest", "step hooks", "step total")


def stats(xs):
    xs = sorted(xs)
    n = len(xs)
    return "%8.1f %8.1f %8.1f" % (sum(xs) / n, xs[n // 2], xs[min(n - 1, int(n * 0.9))])


def is_stop(e):
    return e["name"] == "allreduce" and e.get("args", {}).get("dtype") == "i32"


def is_grad(e):
    """A bucket's all-reduce: plain, sharded or fused (the sharded and fused updates': the optimizer's step
    included)."""
    return (e["name"] in ("allreduce", "allreduce_shards", "allreduce_each")
            and e.get("args", {}).get("dtype") in ("f32", "bf16", "f16"))


def end(e):
    return e["ts"] + e["dur"]


def steps_of(main):
    """[(segments dict, first span ts, index after the step, end of the end phase)] for every forward that starts
    a step. Backward is one span ("backward") or one per layer ("backward fc1"), taken together; the gradient
    all-reduces the main thread ran inside the end phase are summed."""
    out = []
    for i, f in enumerate(main):
        if f["name"] != "forward":
            continue
        j = i + 1
        while j < len(main) and main[j]["name"].startswith("backward"):
            j += 1
        if j == i + 1 or j >= len(main) or not main[j]["name"].startswith("finish"):
            continue
        b0, b1, fin = main[i + 1], main[j - 1], main[j]
        k = i - 1
        bc = []
        while k >= 0 and main[k]["name"] == "broadcast":
            bc.append(main[k])
            k -= 1
        w = main[k] if k >= 0 and main[k]["name"] == "wait for data" else None
        s = main[k - 1] if w is not None and k >= 1 and is_stop(main[k - 1]) else None
        j += 1
        ga = []
        while j < len(main) and is_grad(main[j]) and main[j]["ts"] >= fin["ts"] and end(main[j]) <= end(fin) + 1e-3:
            ga.append(main[j]["dur"])
            j += 1
        seg = {
            "stop all-reduce": s["dur"] if s else None,
            "wait for data": w["dur"] if w else None,
            "buffers broadcast": (end(bc[0]) - bc[-1]["ts"]) if bc else None,
            "forward": f["dur"],
            "loss + metrics": b0["ts"] - end(f),
            "backward": end(b1) - b0["ts"],
            "after backward": fin["ts"] - end(b1),
            "grad all-reduce": sum(ga) if ga else None,
            "optimizer + rest": fin["dur"] - sum(ga),
        }
        start = s["ts"] if s else (w["ts"] if w else (bc[-1]["ts"] if bc else f["ts"]))
        out.append((seg, start, j, end(fin)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--skip-epochs", type=int, default=1, help="leave out the first N epochs (warm-up)")
    a = ap.parse_args()
    with open(a.trace) as f:
        t = json.load(f)
    events = t["traceEvents"] if isinstance(t, dict) else t
    spans = [e for e in events if e.get("ph") == "X"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    for pid in sorted({e["pid"] for e in spans}):
        main_tid = next((tid for (p, tid), n in names.items() if p == pid and n == "main"), 1)
        # the per-layer forward spans ("forward conv1") nest inside the model's forward, and a batch the training
        # threads fetch themselves (no loader thread) is loaded inside the step, a bucket's all-reduce from launch
        # to completion ("bucket 3") spans backward, and a DP worker's shares ("dp reduce", ...) lie inside the
        # step's segments: not steps' segments
        main = sorted((e for e in spans if e["pid"] == pid and e["tid"] == main_tid
                       and not e["name"].startswith(("forward ", "bucket ", "dp ")) and e["name"] != "load batch"),
                      key=lambda e: e["ts"])
        steps = steps_of(main)
        if not steps:
            continue
        per_epoch = None
        # epoch boundaries: a "wait for data" that is not followed by a forward (the loader's end of epoch), buffer
        # broadcasts between them aside
        def next_after_broadcasts(k):
            while k < len(main) and main[k]["name"] == "broadcast":
                k += 1
            return main[k]["name"] if k < len(main) else None

        boundaries = [k for k, e in enumerate(main) if e["name"] == "wait for data"
                      and next_after_broadcasts(k + 1) != "forward"]
        if boundaries:
            first_epoch_end = main[boundaries[0]]["ts"]
            per_epoch = sum(1 for _, st, _, _ in steps if st < first_epoch_end)
        skip = (per_epoch or 0) * a.skip_epochs
        starts = [st for _, st, _, _ in steps]
        bts = [main[b]["ts"] for b in boundaries]

        def crossing(lo, hi):
            return any(lo < t < hi for t in bts)

        cols = {k: [] for k in SEGMENTS}
        first_stop = []  # the first step of each epoch: its stop all-reduce waits out the epoch's end on other ranks
        for n, (seg, start, j, fin_end) in enumerate(steps):
            if n < skip:
                continue
            if n > 0 and crossing(starts[n - 1], start):
                if seg["stop all-reduce"] is not None:
                    first_stop.append(seg["stop all-reduce"])
                continue
            for k, v in seg.items():
                if v is not None:
                    cols[k].append(v)
            if n + 1 < len(steps) and not crossing(start, starts[n + 1]):
                cols["step hooks"].append(starts[n + 1] - fin_end)
                cols["step total"].append(starts[n + 1] - start)
        threads = sorted({names.get((pid, e["tid"]), str(e["tid"])) for e in spans if e["pid"] == pid})
        grads_elsewhere = sum(1 for e in spans if e["pid"] == pid and e["tid"] != main_tid and is_grad(e))
        print(f"rank {pid}: {len(steps) - skip} steps after {a.skip_epochs} warm-up epoch(s); threads {', '.join(threads)}; "
              f"gradient all-reduces run by the communication thread: {grads_elsewhere}")
        print("  %-18s %8s %8s %8s   (us)" % ("segment", "mean", "median", "p90"))
        for k in SEGMENTS:
            if cols[k]:
                print("  %-18s %s" % (k, stats(cols[k])))
        if first_stop:
            print("  %-18s %s   (first step of an epoch, left out above)" % ("stop, epoch start", stats(first_stop)))
        loads = [e for e in spans if e["pid"] == pid and e["name"] == "load batch"]
        by_loader = [e["dur"] for e in loads if names.get((pid, e["tid"]), "").startswith("loader")]
        in_step = [e["dur"] for e in loads if not names.get((pid, e["tid"]), "").startswith("loader")]
        if by_loader:
            print("  %-18s %s   (loader thread, per batch)" % ("load batch", stats(by_loader)))
        if in_step:
            print("  %-18s %s   (training threads, per batch or slice, inside the step)"
                  % ("load batch", stats(in_step)))
        # dp: each worker's shares, by kind: of the fused sum and update, inside "optimizer + rest"; unfused, of the
        # sum ("dp reduce", inside "after backward") and of the update ("dp optimizer share", in "optimizer + rest")
        shares = {}
        for e in spans:
            if e["pid"] == pid and e["name"].startswith("dp "):
                shares.setdefault((e["name"], e["tid"]), []).append(e["dur"])
        for (name, tid), durs in sorted(shares.items()):
            print("  %-18s %s   (%s, %s)" % ("dp share", stats(durs), name, names.get((pid, tid), str(tid))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
