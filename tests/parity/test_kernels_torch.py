"""Parity of dtrain's CPU kernels with torch.nn.functional: forward and backward of every kernel.

dump_kernels (built next to this test) runs the kernels on seeded random inputs and writes
inputs and results; here torch recomputes them from the same float32 inputs in float64, so
the comparison measures dtrain's float32 error alone. Bound: max |dtrain - torch| <= 1e-5 *
max |torch| per tensor (float32 rounding of sums of a few hundred terms stays well below it).
"""
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # optional dependency genuinely missing
    print("skipped: %s" % e)
    sys.exit(77)

import parity_dump  # noqa: E402 (after the check for the optional dependencies)

TOL = 1e-5
failures = []
checked = 0


def close(name, got, ref, tol=TOL):
    global checked
    checked += 1
    got = got.double()
    ref = ref.detach().double()
    if got.shape != ref.shape:
        failures.append("%s: shape %s vs torch %s" % (name, tuple(got.shape), tuple(ref.shape)))
        return
    scale = max(ref.abs().max().item(), 1e-30)
    err = (got - ref).abs().max().item() / scale
    if not err <= tol:
        failures.append("%s: relative error %.3g > %g" % (name, err, tol))


def equal(name, got, ref):
    global checked
    checked += 1
    if not torch.equal(got.long(), ref.long()):
        failures.append("%s: differs from torch (%d of %d)" % (name, (got.long() != ref.long()).sum().item(), ref.numel()))


def leaf(t):
    return t.double().clone().requires_grad_(True)


def main():
    t = parity_dump.run("dump_kernels")
    if t is None:
        return 1
    t = {k: torch.from_numpy(v) for k, v in t.items()}

    # linear
    x, w, b = leaf(t["linear.x"]), leaf(t["linear.w"]), leaf(t["linear.b"])
    y = F.linear(x, w, b)
    (y * t["linear.dy"].double()).sum().backward()
    close("linear.y", t["linear.y"], y)
    close("linear.dx", t["linear.dx"], x.grad)
    close("linear.dw", t["linear.dw"], w.grad)
    close("linear.db", t["linear.db"], b.grad)

    # conv2d
    for tag in sorted({k.split(".")[0] for k in t if k.startswith("conv_")}):
        s, p, has_b = (int(v) for v in t[tag + ".meta"][:3])
        x, w = leaf(t[tag + ".x"]), leaf(t[tag + ".w"])
        b = leaf(t[tag + ".b"]) if has_b else None
        y = F.conv2d(x, w, b, stride=s, padding=p)
        (y * t[tag + ".dy"].double()).sum().backward()
        close(tag + ".y", t[tag + ".y"], y)
        close(tag + ".dx", t[tag + ".dx"], x.grad)
        close(tag + ".dw", t[tag + ".dw"], w.grad)
        if has_b:
            close(tag + ".db", t[tag + ".db"], b.grad)

    # pooling
    for tag in sorted({k.split(".")[0] for k in t if k.startswith("pool_")}):
        k, s, p = (int(v) for v in t[tag + ".meta"])
        dy = t[tag + ".dy"].double()
        x = leaf(t[tag + ".x"])
        y, idx = F.max_pool2d(x, k, s, p, return_indices=True)
        (y * dy).sum().backward()
        close(tag + ".max_y", t[tag + ".max_y"], y)
        equal(tag + ".max_idx", t[tag + ".max_idx"], idx)
        close(tag + ".max_dx", t[tag + ".max_dx"], x.grad)
        x = leaf(t[tag + ".x"])
        y = F.avg_pool2d(x, k, s, p, count_include_pad=True)
        (y * dy).sum().backward()
        close(tag + ".avg_y", t[tag + ".avg_y"], y)
        close(tag + ".avg_dx", t[tag + ".avg_dx"], x.grad)

    # batchnorm: train (output, grads, running stats), then eval with the updated stats; planes of 25 and of 1075
    for tag in ("bn", "bn_long"):
        x, g, bt = leaf(t[tag + ".x"]), leaf(t[tag + ".gamma"]), leaf(t[tag + ".beta"])
        rm, rv = t[tag + ".rm0"].double().clone(), t[tag + ".rv0"].double().clone()
        y = F.batch_norm(x, rm, rv, g, bt, training=True, momentum=0.1, eps=1e-5)
        (y * t[tag + ".dy"].double()).sum().backward()
        xd = t[tag + ".x"].double()
        mean = xd.mean(dim=(0, 2, 3))
        invstd = 1.0 / torch.sqrt(xd.var(dim=(0, 2, 3), unbiased=False) + 1e-5)
        close(tag + ".y", t[tag + ".y"], y)
        close(tag + ".mean", t[tag + ".mean"], mean)
        close(tag + ".invstd", t[tag + ".invstd"], invstd)
        close(tag + ".running_mean", t[tag + ".rm"], rm)
        close(tag + ".running_var", t[tag + ".rv"], rv)
        close(tag + ".dx", t[tag + ".dx"], x.grad)
        close(tag + ".dgamma", t[tag + ".dgamma"], g.grad)
        close(tag + ".dbeta", t[tag + ".dbeta"], bt.grad)
        ey = F.batch_norm(xd, t[tag + ".rm"].double(), t[tag + ".rv"].double(), t[tag + ".gamma"].double(),
                          t[tag + ".beta"].double(), training=False, eps=1e-5)
        close(tag + ".eval_y", t[tag + ".eval_y"], ey)

    # activations
    acts = {
        "relu": F.relu,
        "gelu": lambda v: F.gelu(v),
        "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"),
        "tanh": torch.tanh,
        "sigmoid": torch.sigmoid,
    }
    for name, fn in acts.items():
        x = leaf(t[name + ".x"])
        y = fn(x)
        (y * t[name + ".dy"].double()).sum().backward()
        close(name + ".y", t[name + ".y"], y)
        close(name + ".dx", t[name + ".dx"], x.grad)

    # softmax / log_softmax
    for name, fn in (("softmax", F.softmax), ("log_softmax", F.log_softmax)):
        x = leaf(t["softmax.x"])
        y = fn(x, dim=1)
        (y * t["softmax.dy"].double()).sum().backward()
        close(name + ".y", t[name + ".y"], y)
        close(name + ".dx", t[name + ".dx"], x.grad)

    # cross entropy, mean reduction, label smoothing 0 and 0.1
    labels = t["ce.labels"].long()
    for tag in ("ce0", "ce1"):
        eps = float(t[tag + ".eps"][0])
        x = leaf(t["ce.x"])
        loss = F.cross_entropy(x, labels, label_smoothing=eps)
        loss.backward()
        close(tag + ".loss", t[tag + ".loss"].reshape(()), loss)
        close(tag + ".dx", t[tag + ".dx"], x.grad)

    for f in failures:
        print("FAIL", f)
    print("%d tensors compared, %d failed" % (checked, len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
