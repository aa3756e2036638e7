#!/usr/bin/env python3
"""Parity of dtrain's resnet18, resnet20 and resnet9 (at --width 16) with torchvision and PyTorch: state_dict keys
and shapes, training-mode logits, cross-entropy loss, every parameter gradient, the BN running statistics after the
step, and evaluation-mode logits and loss, on dtrain's initial weights and batch (dump_resnet). The training step
rectifies with dtrain's ReLU masks, where PyTorch's own may differ only at inputs within rounding of zero
(check_flips). resnet18 is torchvision's own (torchvision.models.resnet18, loaded with strict=True); resnet20 is not
in torchvision and is written here from He et al. 2016 with torchvision's BasicBlock and 1x1-conv + BN projection
shortcuts (option B); resnet9 is the DAWNBench ResNet-9, written here from Page's description with dtrain's names.
Also checks that dtrain's initialisation has torchvision's distribution (kaiming_normal_ fan_out for convs, BN 1/0,
Linear's default; resnet9: PyTorch's defaults). Exit 77 only when torch or torchvision is missing (make deps installs
both).
"""
import math
import sys

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torchvision
    from torchvision.models.resnet import BasicBlock, conv1x1
except ImportError as e:  # optional dependency
    print(f"skipped: {e}")
    sys.exit(77)

import parity_dump  # noqa: E402 (after the check for the optional dependencies)
from relu_masks import check_flips, mask_relus, relu_masks  # noqa: E402


class CifarResNet(nn.Module):
    """ResNet-6n+2 for CIFAR (He et al. 2016, 4.2): 3x3 stem of 16, stages of n BasicBlocks at 16/32/64 channels,
    projection shortcuts where the shape changes, global average pool, fc. torchvision's names."""

    def __init__(self, n, num_classes=10):
        super().__init__()
        self.inplanes = 16
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._make_layer(16, n, 1)
        self.layer2 = self._make_layer(32, n, 2)
        self.layer3 = self._make_layer(64, n, 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)

    def _make_layer(self, planes, blocks, stride):
        down = None
        if stride != 1 or self.inplanes != planes:
            down = nn.Sequential(conv1x1(self.inplanes, planes, stride), nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, down)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class Residual(nn.Module):
    """resnet9's residual branch: two (3x3 conv, BN, ReLU), added to the input by the stage."""

    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.relu1, self.relu2 = nn.ReLU(), nn.ReLU()

    def forward(self, x):
        return self.relu2(self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x))))))


class Stage(nn.Module):
    """resnet9's stage: 3x3 conv, BN, ReLU, 2x2 max pool, then x + res(x) where it has one."""

    def __init__(self, cin, cout, res):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.res = Residual(cout) if res else None

    def forward(self, x):
        x = F.max_pool2d(self.relu(self.bn(self.conv(x))), 2)
        return x + self.res(x) if self.res is not None else x


class ResNet9(nn.Module):
    """The DAWNBench ResNet-9 (Page 2018) at width w: stages w, 2w, 4w, 8w, global max pool, fc without bias,
    x 0.125."""

    def __init__(self, w, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, w, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.relu = nn.ReLU()
        self.layer1 = Stage(w, 2 * w, True)
        self.layer2 = Stage(2 * w, 4 * w, False)
        self.layer3 = Stage(4 * w, 8 * w, True)
        self.fc = nn.Linear(8 * w, num_classes, bias=False)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(F.adaptive_max_pool2d(x, 1), 1)) * 0.125


failures = []


def check(name, got, ref, tol, floor=0.0, quiet=False):
    """max |got - ref| / max |ref| <= tol; a reference below `floor` is compared absolutely."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        failures.append(f"{name}: shape {got.shape} vs {ref.shape}")
        print(f"FAIL {name}: shape {got.shape} vs {ref.shape}")
        return 0.0
    err = float(np.max(np.abs(got - ref))) if got.size else 0.0
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    rel = err / scale if scale > floor else err
    bound = tol if scale > floor else floor
    if rel > bound:
        failures.append(name)
    if rel > bound or not quiet:
        print(f"{'ok  ' if rel <= bound else 'FAIL'} {name:44s} rel err {rel:.3g} (scale {scale:.3g})")
    return rel


def load(m, t, prefix):
    """dtrain's state (every tensor, num_batches_tracked included) into m with strict=True."""
    want = {k[len(prefix):]: torch.from_numpy(v) for k, v in t.items() if k.startswith(prefix)}
    keys = list(m.state_dict())
    if list(want) != keys:
        missing, extra = sorted(set(keys) - set(want)), sorted(set(want) - set(keys))
        failures.append(f"{prefix} state_dict keys: missing {missing[:5]}, extra {extra[:5]}, or order")
        print(f"FAIL {prefix} keys: missing {missing[:5]}, extra {extra[:5]}")
    for k, v in m.state_dict().items():
        if k in want and tuple(want[k].shape) != tuple(v.shape):
            failures.append(f"{k}: shape {tuple(want[k].shape)} vs {tuple(v.shape)}")
    m.load_state_dict(want, strict=True)


def parity(name, m, t):
    p = name + "/"
    load(m, t, p + "init/")
    x = torch.from_numpy(t[p + "input"])
    y = torch.from_numpy(t[p + "labels"]).long()
    m.train()
    # A ReLU input this close to zero can change sign under either side's f32 rounding (about 1e-6 of the
    # activations' scale after a few layers): every gradient upstream of it would then differ by percents, with
    # the logits still in agreement. So the training step rectifies with dtrain's masks, and the places where
    # PyTorch's own sign differs are checked to be such inputs.
    masks = relu_masks(t, p)
    state = mask_relus(m, masks)
    logits = m(x)
    state["masks"] = None
    check_flips(p, masks, state["calls"], failures)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    # f32 on both sides, summed in other orders (im2col + OpenBLAS vs. torch's conv): ~1e-6 relative per
    # layer, amplified through BN's 1/std; 1e-4 of each tensor's largest magnitude keeps a margin.
    check(p + "train/logits", t[p + "train/logits"], logits.detach().numpy(), 1e-4)
    check(p + "train/loss", t[p + "train/loss"][0], loss.item(), 1e-5)
    worst, n = 0.0, 0
    for k, v in m.named_parameters():
        worst = max(worst, check(p + "grad/" + k, t[p + "grad/" + k], v.grad.numpy(), 1e-4, quiet=True))
        n += 1
    print(f"ok   {p}grad: {n} parameter gradients, worst rel err {worst:.3g}")
    for k, v in m.named_buffers():
        check(p + "after/" + k, t[p + "after/" + k], v.numpy(), 1e-5, quiet=True)
    m.eval()
    with torch.no_grad():
        ev = m(x)
    check(p + "eval/logits", t[p + "eval/logits"], ev.numpy(), 1e-4)
    check(p + "eval/loss", t[p + "eval/loss"][0], F.cross_entropy(ev, y).item(), 1e-5)


def default_init(t):
    """resnet9 keeps PyTorch's default initialisation: every conv and fc weight U(+-1/sqrt(fan_in)), filled."""
    p, before = "resnet9/init/", len(failures)
    for k, v in t.items():
        if k.startswith(p) and v.ndim in (2, 4):
            bound = 1 / math.sqrt(v[0].size)
            if np.max(np.abs(v)) > bound or np.max(np.abs(v)) < 0.9 * bound:
                failures.append(f"{k}: outside U(+-{bound:.4g}) or far from filling it")
    print("ok   resnet9 init: conv and fc U(+-1/sqrt(fan_in))" if len(failures) == before else "FAIL resnet9 init")


def weights_load_and_predict(t):
    """dtrain's resnet18 weights load into a fresh torchvision resnet18 (strict) and give dtrain's eval logits."""
    m = torchvision.models.resnet18(num_classes=10)
    load(m, t, "resnet18/init/")
    # The training step moved dtrain's running statistics: evaluate with those.
    sd = m.state_dict()
    for k in sd:
        if ("running_" in k or "num_batches" in k) and "resnet18/after/" + k in t:
            sd[k] = torch.from_numpy(t["resnet18/after/" + k])
    m.load_state_dict(sd, strict=True)
    m.eval()
    with torch.no_grad():
        ev = m(torch.from_numpy(t["resnet18/input"]))
    check("resnet18 strict load: eval/logits", t["resnet18/eval/logits"], ev.numpy(), 1e-4)


def init_distribution(t):
    """Conv weights ~ N(0, 2/fan_out), BN weight 1 and bias 0, fc U(+-1/sqrt(fan_in)), as torchvision's."""
    for model in ("resnet18", "resnet20"):
        p = model + "/init/"
        for k, v in t.items():
            if not k.startswith(p):
                continue
            name = k[len(p):]
            if v.ndim == 4:  # conv weight
                fan_out = v.shape[0] * v.shape[2] * v.shape[3]
                std = math.sqrt(2.0 / fan_out)
                got = float(v.std())
                if (abs(got / std - 1) > 0.5 / math.sqrt(v.size) * 6 + 0.02
                        or abs(float(v.mean())) > 6 * std / math.sqrt(v.size)):
                    failures.append(f"{k}: std {got:.4g}, want {std:.4g}")
            elif name.endswith("running_var") or (name.endswith(".weight") and v.ndim == 1):
                if not np.all(v == 1):
                    failures.append(f"{k}: not all ones")
            elif name.endswith(".bias") and name != "fc.bias" or name.endswith("running_mean"):
                if not np.all(v == 0):
                    failures.append(f"{k}: not all zeros")
            elif name.startswith("fc."):
                bound = 1 / math.sqrt(t[p + "fc.weight"].shape[1])
                if np.max(np.abs(v)) > bound or np.max(np.abs(v)) < 0.5 * bound:
                    failures.append(f"{k}: outside U(+-{bound:.4g}) or far from filling it")
    print("ok   init: conv N(0, 2/fan_out), BN 1/0, fc U(+-1/sqrt(fan_in))" if not failures else "FAIL init")


def main():
    torch.set_num_threads(2)
    torch.manual_seed(0)
    t = parity_dump.run("dump_resnet")
    if t is None:
        return 1
    init_distribution(t)
    parity("resnet18", torchvision.models.resnet18(num_classes=10), t)
    parity("resnet20", CifarResNet(3), t)
    default_init(t)
    parity("resnet9", ResNet9(16), t)
    weights_load_and_predict(t)
    if failures:
        print("FAILED:", ", ".join(failures[:20]))
        return 1
    print("resnet parity: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
