#!/usr/bin/env python3
"""One resnet20 and one resnet18 training step under dtrain's bf16 autocast (dump_resnet OUT --amp bf16) against
test_resnet_torch.py's models (its CIFAR resnet20, torchvision's resnet18) with the autocast contract written out in
f32, on the same weights and batch (2): training logits, loss, every parameter gradient. The contract, as
src/nn/conv2d.c and src/nn/linear.c round:
- every Conv2d and Linear rounds its input, weight, bias and output to bf16 and accumulates in f32;
- backward rounds the incoming gradient and the input gradient, and accumulates the weight gradient in f32 from the
  rounded operands (torch.autocast hands back the bf16 gradient of its bf16 weight copy: rounded);
- BatchNorm, ReLU, the pools, the residual adds and the loss in f32 (torch 1.13's CPU autocast runs BatchNorm,
  ReLU, max pooling and the adds on its bf16 tensors, so rounds their results too).

Teacher forcing. Run free, a resnet step under the contract is chaotic: two correct implementations that sum in
other orders (f32 noise) round the odd value to the other bf16 neighbour; that ulp (0.4%) moves the next layer's
values across other rounding boundaries, and within a few layers many values differ by an ulp. ReLU masks then flip
where a value lies that close to 0, and each flip moves a weight gradient (a sum of some 100 random-sign terms at
batch 2) by ~10% of its largest element. Measured on the conv gradients: the contract with f64 accumulation lands up
to 41% (resnet18: 54%) from the contract, dtrain 45% (89%), torch.autocast 47% (85%); the logits 0.5-1.9%. So
dump_resnet also dumps each Conv2d's and Linear's input, output, incoming gradient and input gradient, and here each
of them, in the torch model, computes its own under the contract and hands on dtrain's (forward: the output;
backward: the input gradient; the weight and bias gradients are its own). The rest of the torch model (BatchNorm,
ReLU, residual adds, pools, loss) then runs on dtrain's values, and agrees with dtrain up to f32 noise, which a
rounding turns into an ulp in the odd element only. Compared, per model:
- f32 glue: each autocast layer's input and incoming gradient as the torch model makes them, against dtrain's
  (1e-4, test_resnet_torch.py's f32 bound);
- bf16, 1e-2 of each tensor's largest magnitude (test_amp_torch.py's bound, 2.5 bf16 ulp: a value within f32 noise of
  a rounding boundary lands an ulp apart): each layer's output and input gradient under the contract; the logits
  (the fc's own output), the loss, every parameter gradient.
Measured, native (bf16 GEMMs after im2col, dtrain's and oneDNN's) and DT_AMP_KERNELS=emulated (f32 GEMMs, direct 3x3 kernels on
rounded values) alike: logits and loss identical; glue within 3e-7; layer outputs and input gradients within 3.3e-3
(an ulp at a large element; 15-60 of ~400k elements differ, on dtrain's own operands); weight gradients within
3e-4, BatchNorm's within 4e-7.
The test can fail: on the first Conv2d or Linear of each kernel and stride (each a path of dtrain's kernels), from
dtrain's operands, f32 and the contract less any one rounding point (input, weight, output, incoming gradient, input
gradient) must each lie more than twice dtrain's error away from the contract, on every such layer. The error there
is the relative RMS (||a - b|| / ||b||): an ulp at one large element (a boundary case of dtrain's) would weigh more
in the max than a missing rounding's half-ulp everywhere. So a dtrain (or a contract here) that forgot one of these
roundings fails. Exit 77 only when torch or torchvision is missing.
"""
import sys

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torchvision
except ImportError as e:  # optional dependency
    print(f"skipped: {e}")
    sys.exit(77)

import parity_dump  # noqa: E402
from test_resnet_torch import CifarResNet  # noqa: E402 (definitions only; its tests run under __main__)

BF16_TOL, F32_TOL = 1e-2, 1e-4
POINTS = ("input", "weight", "output", "grad", "dgrad")  # the contract's rounding points
failures = []


def rel_err(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    return float(np.max(np.abs(got - ref))) / scale if scale > 0 else float(np.max(np.abs(got - ref)))


def rms_err(got, ref):
    """||got - ref|| / ||ref|| of two tensors."""
    return float((got - ref).norm() / ref.norm().clamp(min=1e-30))


def check(name, got, ref, tol, quiet=False):
    e = rel_err(got, ref)
    if e > tol:
        failures.append(name)
    if e > tol or not quiet:
        print(f"{'ok  ' if e <= tol else 'FAIL'} {name:46s} rel err {e:.3g} (bound {tol:g})")
    return e


def rb(x):
    return x.bfloat16().float()


def rounding(skip=()):
    return {k: (lambda v: v) if k in skip else rb for k in POINTS}


def lowp_forward(mod, x, r):
    """mod (Conv2d or Linear) on x under the contract; r: rounding(skip)."""
    b = None if mod.bias is None else r["weight"](mod.bias.detach())
    w = r["weight"](mod.weight.detach())
    if isinstance(mod, nn.Conv2d):
        return r["output"](F.conv2d(r["input"](x), w, b, mod.stride, mod.padding))
    return r["output"](F.linear(r["input"](x), w, b))


def lowp_backward(mod, x, g, r):
    """Input, weight and bias gradients of mod at input x, incoming gradient g, under the contract."""
    g, x, w = r["grad"](g), r["input"](x), r["weight"](mod.weight.detach())
    if isinstance(mod, nn.Conv2d):
        dx, dw, _ = torch.ops.aten.convolution_backward(g, x, w, None, list(mod.stride), list(mod.padding), [1, 1],
                                                        False, [0, 0], 1, [True, True, False])
        return r["dgrad"](dx), dw, g.sum((0, 2, 3))
    return r["dgrad"](g @ w), g.t() @ x, g.sum(0)


class Forced(torch.autograd.Function):
    """mod under the contract, handing on dtrain's output and input gradient (mod.rec) after noting (mod.seen) its
    input, incoming gradient, and its own output and input gradient; the weight and bias gradients are its own."""

    @staticmethod
    def forward(ctx, x, w, b, mod):
        ctx.save_for_backward(x)
        ctx.mod = mod
        mod.seen = {"in": x.detach().clone(), "out": lowp_forward(mod, x, rounding())}
        return mod.rec["out"].clone()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        mod = ctx.mod
        mod.seen["dout"] = g.clone()
        mod.seen["dinp"], dw, db = lowp_backward(mod, x, g, rounding())
        dx = mod.rec["dinp"].clone() if "dinp" in mod.rec else None
        return dx, dw, db if mod.bias is not None else None, None


def forced_step(name, t):
    """The torch model of name on dtrain's weights, its autocast layers teacher-forced with dtrain's records, after
    one training step: (model, its Conv2d and Linear layers by name)."""
    p = name + "/"
    m = torchvision.models.resnet18(num_classes=10) if name == "resnet18" else CifarResNet(3)
    m.load_state_dict({k[len(p) + 5:]: torch.from_numpy(v) for k, v in t.items() if k.startswith(p + "init/")},
                      strict=True)
    layers = {k: mod for k, mod in m.named_modules() if isinstance(mod, (nn.Conv2d, nn.Linear))}
    for k, mod in layers.items():
        mod.rec = {w: torch.from_numpy(t[f"{p}amp/{k}/{w}"]) for w in ("in", "out", "dout", "dinp")
                   if f"{p}amp/{k}/{w}" in t}
        mod.forward = lambda x, mod=mod: Forced.apply(x, mod.weight, mod.bias, mod)
    m.train()
    x, y = torch.from_numpy(t[p + "input"]), torch.from_numpy(t[p + "labels"]).long()
    F.cross_entropy(m(x), y).backward()  # on dtrain's logits, which fc hands on
    return m, layers


def check_step(p, t, m, layers):
    """Logits, loss, each layer's records and every parameter gradient against the contract."""
    y = torch.from_numpy(t[p + "labels"]).long()
    logits = layers["fc"].seen["out"]
    check(f"bf16 {p}train/logits", t[p + "train/logits"], logits.numpy(), BF16_TOL)
    check(f"bf16 {p}train/loss", t[p + "train/loss"][0], F.cross_entropy(logits, y).item(), BF16_TOL)
    worst = {}
    for k, mod in layers.items():
        rec, seen = mod.rec, mod.seen
        for what, tol in (("in", F32_TOL), ("dout", F32_TOL), ("out", BF16_TOL), ("dinp", BF16_TOL)):
            if what in rec:
                e = check(f"{p}{k} {what}", rec[what], seen[what], tol, quiet=True)
                worst[what] = max(worst.get(what, 0.0), e)
    for k, v in m.named_parameters():
        group = "grad " + ("conv, fc" if v.ndim > 1 or k.startswith("fc") else "BatchNorm")
        worst[group] = max(worst.get(group, 0.0), check(f"bf16 {p}grad/{k}", t[p + "grad/" + k], v.grad.numpy(),
                                                          BF16_TOL, quiet=True))
    for group, e in worst.items():
        tol = F32_TOL if group in ("in", "dout") else BF16_TOL
        what = {"in": "f32 glue: layer inputs", "dout": "f32 glue: incoming grads", "out": "bf16 layer outputs",
                "dinp": "bf16 layer input grads"}.get(group, "bf16 " + group)
        if e <= tol:
            print(f"ok   {p}{what:41s} worst rel err {e:.3g} (bound {tol:g})")


def check_roundings_show(p, t, layers):
    """Every rounding point shows (see the docstring), on the first Conv2d and Linear of each kernel and stride."""
    picked = {}
    for k, mod in layers.items():
        picked.setdefault((type(mod), getattr(mod, "kernel_size", 0), getattr(mod, "stride", 0)), k)

    def local(skip, parts=("output", "input grad", "weight grad")):
        out = {}
        for k in picked.values():
            mod, r = layers[k], rounding(skip)
            if "output" in parts:
                out[k + " output"] = lowp_forward(mod, mod.rec["in"], r)
            if "input grad" in parts:
                dx, dw, _ = lowp_backward(mod, mod.rec["in"], mod.rec["dout"], r)
                if "dinp" in mod.rec:
                    out[k + " input grad"] = dx
                if "weight grad" in parts:
                    out[k + " weight grad"] = dw
        return out

    ref = local(())
    dtrain = {}
    for k in picked.values():
        rec = layers[k].rec
        dtrain.update({k + " output": rec["out"], k + " weight grad": torch.from_numpy(t[f"{p}grad/{k}.weight"])})
        if "dinp" in rec:
            dtrain[k + " input grad"] = rec["dinp"]
    for what, skip in (("f32", POINTS),) + tuple((f"unrounded {s}", (s,)) for s in POINTS):
        # what the rounding point moves (a forward one moves the gradients too, and shows in the outputs)
        alt = local(skip, {"grad": ("input grad", "weight grad"), "dgrad": ("input grad",)}.get(skip[0], ("output",)))
        nearest, mine_worst, n, bad = float("inf"), 0.0, 0, len(failures)
        for layer in picked.values():
            errs = [(rms_err(alt[k], ref[k]), k) for k in alt if k.startswith(layer + " ")]
            if not errs:  # dgrad of the first conv: no input gradient
                continue
            far, k = max(errs)
            mine = rms_err(dtrain[k], ref[k])
            nearest, mine_worst, n = min(nearest, far), max(mine_worst, mine), n + 1
            if far <= 2 * max(mine, 1e-6):
                print(f"FAIL bf16 {p}{k}: dtrain {mine:.3g} vs {what} {far:.3g} from the contract (rms)")
                failures.append(f"{p}{k}: {what} is as close to the bf16 contract as dtrain's bf16")
        ok = n and bad == len(failures)
        print(f"{'ok  ' if ok else 'FAIL'} bf16 {p}{what + ':':17s} at least {nearest:.3g} from the contract on each "
              f"of {n} layers, dtrain at most {mine_worst:.3g} (rms)")
        if not n:
            failures.append(f"{p}{what}: no layer to compare")


def main():
    torch.set_num_threads(2)
    t = parity_dump.run("dump_resnet", "--amp", "bf16")
    if t is None:
        return 1
    for name in ("resnet20", "resnet18"):
        m, layers = forced_step(name, t)
        check_step(name + "/", t, m, layers)
        check_roundings_show(name + "/", t, layers)
    if failures:
        print("FAILED:", ", ".join(failures[:20]))
        return 1
    print("resnet bf16 parity: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
