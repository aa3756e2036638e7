"""PyTorch's side of dtrain's ReLU masks (tests/parity/relu_masks.h): a model's nn.ReLU modules replaced by ones that
rectify with dtrain's masks during one training forward, so that the gradients are compared under the same
rectification, and a check that PyTorch's own sign differs from dtrain's only at inputs within rounding of zero.

A ReLU input this close to zero can change sign under either side's f32 rounding (about 1e-6 of the activations'
scale after a few layers): every gradient upstream of it would then differ by percents, with the logits still in
agreement."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MaskedReLU(nn.Module):
    """A ReLU that, while `masks` is set, multiplies its input by the next of dtrain's masks (relu/NNN, in the order
    dtrain ran its ReLUs) instead of by its own. It records each call's (inputs whose own sign differs from dtrain's
    mask, the largest |input| among them, the largest |input|): such an input must lie within rounding of zero."""

    def __init__(self, state):
        super().__init__()
        self.state = state

    def forward(self, x):
        masks, calls = self.state["masks"], self.state["calls"]
        if masks is None:
            return F.relu(x)
        k = len(calls)
        mask = torch.from_numpy(masks[k]) if k < len(masks) else None
        if mask is None or mask.numel() != x.numel():  # check_flips reports the pairing
            calls.append(None)
            return F.relu(x)
        mask = mask.reshape(x.shape)
        differ = (x > 0) != (mask > 0)
        size = x.detach().abs()
        calls.append((int(differ.sum()), float(size[differ].max()) if differ.any() else 0.0, float(size.max())))
        return x * mask


def mask_relus(m, masks):
    """Replaces every nn.ReLU of m by a MaskedReLU over `masks` (dtrain's, in call order); returns their shared
    state: state["calls"] fills with one entry per call, and state["masks"] = None turns the masks off."""
    state = {"masks": masks, "calls": []}
    for parent in list(m.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.ReLU):
                setattr(parent, name, MaskedReLU(state))
    return state


def relu_masks(t, p=""):
    """dtrain's ReLU masks under key prefix p, in the order its training forward ran them (relu/NNN)."""
    return [t[k] for k in sorted((k for k in t if k.startswith(p + "relu/")), key=lambda k: int(k.rsplit("/", 1)[1]))]


def check_flips(p, masks, calls, failures):
    """Each of dtrain's ReLU masks was used by one call, and where PyTorch's own sign differs the input is within
    1e-4 of the largest |input| of that ReLU (the forward's tolerance): a rounding flip, not a wrong kernel (a
    wrong mask would differ at inputs far from zero). Prints one line; appends to failures where it fails."""
    if not masks or len(calls) != len(masks) or None in calls:
        unpaired = calls.index(None) if None in calls else min(len(calls), len(masks))
        failures.append(f"{p}relu masks: {len(masks)} from dtrain, {len(calls)} ReLU calls")
        print(f"FAIL {p}relu masks: {len(masks)} from dtrain, {len(calls)} ReLU calls; call {unpaired} has no mask of "
              "its size")
        return
    count = sum(c[0] for c in calls)
    worst = max((c[1] / c[2] if c[2] > 0 else math.inf for c in calls if c[0]), default=0.0)
    ok = worst <= 1e-4
    if not ok:
        failures.append(f"{p}relu masks")
    print(f"{'ok  ' if ok else 'FAIL'} {p}relu masks: {len(masks)} ReLUs, {count} inputs of the other sign in "
          f"PyTorch, the largest {worst:.3g} of its ReLU's largest |input|")
