#!/usr/bin/python3
"""bert training and inference speed, side by side in one run: dtrain's bert presets (bench/bert_steps) and the
reference BertForSequenceClassification of tests/parity/bert_reference.py in PyTorch (Hugging Face's computation,
eager mode), same sizes, batch, sequence length, random token batches with lengths uniform in [L/4, L] (padding
masked), dropout 0.1, AdamW, 2 classes, on the same cores (--threads, default 2). Steps alternate sides.

Figures: sequences/s of the median step over --steps steps after one warm-up (train: forward, loss, backward,
AdamW; infer: forward in evaluation mode), and the ratio dtrain / PyTorch.
With --profile, where dtrain's training step goes: seconds per step by layer kind (forward + backward, from the
per-layer trace spans), and the GEMM throughput (Linear and SelfAttention FLOPs, a backward counted as twice the
forward, over those layers' time) as a share of the cores' fp32 peak: cores x clock x 32 (AVX2: two 8-wide FMA
pipes; AVX-512: x2), the clock being /proc/cpuinfo's current MHz, so the share is approximate.

    bench/bert_vs_torch.py [--build build] [--models bert-mini,bert-small] [--batch 32] [--len 128] [--steps 5]
                           [--profile] [--amp bf16]

With --amp bf16 both sides run under autocast: dtrain's --amp bf16 (native bf16 GEMMs where the CPU has
AVX512_BF16), PyTorch's torch.autocast("cpu", dtype=torch.bfloat16) around the forward and the loss.
"""
import argparse, collections, json, os, statistics, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "parity"))
from synthetic_vs_torch import budget_env, cpu_line, loadavg  # noqa: E402

PRESETS = {"bert-tiny": (2, 128, 2), "bert-mini": (4, 256, 4), "bert-small": (4, 512, 8), "bert-medium": (8, 512, 8),
           "bert": (12, 768, 12)}
VOCAB = 30522


def dtrain_rate(a, model, mode):
    amp = ["--amp", a.amp] if a.amp != "off" else []
    out = subprocess.run([os.path.join(a.build, "bench", "bert_steps"), *amp, model, str(a.batch), str(a.len),
                          str(a.steps), mode], check=True, capture_output=True, text=True, env=budget_env(a.threads)).stdout
    steps = [float(l.split()[1]) for l in out.splitlines() if l.startswith("step_s")]
    return a.batch / statistics.median(steps)


def torch_rate(a, model, mode):
    """Run in a child so that its thread pools are held to --threads from the start."""
    code = f"""
import statistics, sys, time, torch
sys.path.insert(0, {os.path.join(HERE, '..', 'tests', 'parity')!r})
import bert_reference
torch.set_num_threads({a.threads})
torch.manual_seed(1)
layers, hidden, heads = {PRESETS[model]!r}
m = bert_reference.init_like_hf(bert_reference.make({VOCAB}, hidden, heads, 4 * hidden, layers, 2, 0.1))
B, L = {a.batch}, {a.len}
x = torch.zeros(B, 3, L, dtype=torch.int32)
g = torch.Generator().manual_seed(2)
for b in range(B):
    n = L // 4 + int(torch.randint(L - L // 4 + 1, (1,), generator=g))
    x[b, 0, :n] = torch.randint(1000, {VOCAB}, (n,), generator=g)
    x[b, 2, :n] = 1
y = torch.randint(2, (B,), generator=g)
opt = torch.optim.AdamW(m.parameters(), lr=2e-5)
train = {mode == 'train'}
m.train(train)
times = []
for s in range({a.steps} + 1):
    t0 = time.perf_counter()
    if train:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled={a.amp == 'bf16'}):
            loss = torch.nn.functional.cross_entropy(m(x).float(), y)
        loss.backward()
        opt.step()
    else:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled={a.amp == 'bf16'}):
            torch.nn.functional.cross_entropy(m(x).float(), y)
    if s:
        times.append(time.perf_counter() - t0)
print(B / statistics.median(times))
"""
    out = subprocess.run(["/usr/bin/python3", "-c", code], check=True, capture_output=True, text=True,
                         env=budget_env(a.threads)).stdout
    return float(out.split()[-1])


def peak_gflops(threads):
    mhz, avx512 = 0.0, False
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("cpu MHz") and not mhz:
                mhz = float(line.split(":")[1])
            if line.startswith("flags"):
                avx512 = " avx512f " in line
    return threads * mhz / 1000 * (64 if avx512 else 32)


def profile(a, model):
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.json")
        out = subprocess.run([os.path.join(a.build, "bench", "bert_steps"), model, str(a.batch), str(a.len),
                              str(a.steps), "train", trace], check=True, capture_output=True, text=True,
                             env=budget_env(a.threads)).stdout
        events = json.load(open(trace))
    vals = dict(l.split()[:2] for l in out.splitlines() if l.split() and l.split()[0] in ("tokens", "gemm_flops"))
    step = statistics.median(float(l.split()[1]) for l in out.splitlines() if l.startswith("step_s"))
    kinds = collections.defaultdict(float)
    for e in events:
        name = e.get("name", "")
        if e.get("ph") == "X" and name.split(" ")[0] in ("forward", "backward") and "kind" in e.get("args", {}):
            kinds[e["args"]["kind"]] += e["dur"] / 1e6 / a.steps
    print(f"\n# {model}: a training step of {a.batch} x {a.len} ({vals['tokens']} tokens): {step:.3f} s")
    print("| layer kind | s per step (fwd + bwd) | share |")
    print("|---|---:|---:|")
    for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"| {k} | {v:.4f} | {100 * v / step:.1f}% |")
    gemm_s = kinds["Linear"] + kinds["SelfAttention"]
    rate = 3 * float(vals["gemm_flops"]) / gemm_s / 1e9
    peak = peak_gflops(a.threads)
    print(f"# GEMM layers (Linear, SelfAttention): {rate:.1f} GFLOP/s, {100 * rate / peak:.0f}% of the fp32 peak "
          f"{peak:.0f} GFLOP/s ({a.threads} cores)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    p.add_argument("--models", default="bert-mini,bert-small")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--len", type=int, default=128)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--amp", choices=["off", "bf16"], default="off")
    a = p.parse_args()
    print(f"# {cpu_line()}; load average before: {loadavg()}")
    print(f"# batch {a.batch}, length {a.len}, {a.threads} threads, median of {a.steps} steps, amp {a.amp}")
    print("| model | mode | dtrain seq/s | PyTorch seq/s | dtrain / PyTorch |")
    print("|---|---|---:|---:|---:|")
    for model in a.models.split(","):
        for mode in ("train", "infer"):
            d, t = dtrain_rate(a, model, mode), torch_rate(a, model, mode)
            print(f"| {model} | {mode} | {d:.1f} | {t:.1f} | {d / t:.2f}x |", flush=True)
    print(f"# load average after: {loadavg()}")
    if a.profile:
        for model in a.models.split(","):
            profile(a, model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
