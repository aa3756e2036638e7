"""Parity of dtrain's task losses and ROC-AUC with PyTorch and scikit-learn.

dump_task (built next to this test) runs dt_task_loss and dt_roc_auc on seeded random inputs and
writes inputs and results. torch recomputes BCEWithLogitsLoss (with and without pos_weight, shape
(B, K)), MSELoss, L1Loss and CrossEntropyLoss(label_smoothing) and their gradients by autograd in
float64 from the same float32 inputs: max |dtrain - torch| <= 1e-5 * max |torch| per tensor.
sklearn.metrics.roc_auc_score recomputes every ROC-AUC (scores on a 0.1 grid, so many ties) and
the macro mean over labels of a multilabel evaluation pass: equal within 1e-12.
Exit 77 only when torch or sklearn is missing (make deps installs both).
"""
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from sklearn.metrics import roc_auc_score
except ImportError as e:  # optional dependency genuinely missing
    print("skipped: %s (apt-get install python3-torch python3-sklearn, or make deps)" % e)
    sys.exit(77)

import parity_dump  # noqa: E402 (after the check for the optional dependencies)

TOL = 1e-5
AUC_TOL = 1e-12
failures = []
checked = 0


def close(name, got, ref, tol=TOL):
    global checked
    checked += 1
    got = torch.as_tensor(got).double().reshape(ref.shape)
    ref = ref.detach().double()
    scale = max(ref.abs().max().item(), 1e-30)
    err = (got - ref).abs().max().item() / scale
    if not err <= tol:
        failures.append("%s: relative error %.3g > %g" % (name, err, tol))


def exact(name, got, ref, who="sklearn", tol=AUC_TOL):
    global checked
    checked += 1
    if not abs(float(got) - float(ref)) <= tol:
        failures.append("%s: %.17g vs %s %.17g" % (name, float(got), who, float(ref)))


def leaf(a):
    return torch.from_numpy(a).double().clone().requires_grad_(True)


def check_loss(tag, t, loss_fn, x_name):
    x = leaf(t[x_name])
    loss = loss_fn(x)
    loss.backward()
    close(tag + ".loss", t[tag + ".loss"], loss)
    close(tag + ".dout", t[tag + ".dout"], x.grad)


def main():
    t = parity_dump.run("dump_task")
    if t is None:
        return 1

    # BCEWithLogitsLoss, mean over (B, K); pos_weight broadcasts over the label (last) dimension
    y = torch.from_numpy(t["bce.y"]).double()
    pw = torch.from_numpy(t["bce.pos_weight"]).double()
    check_loss("bce", t, lambda x: F.binary_cross_entropy_with_logits(x, y), "bce.x")
    check_loss("bce_pw", t, lambda x: F.binary_cross_entropy_with_logits(x, y, pos_weight=pw), "bce.x")

    # MSELoss and L1Loss, mean over every element (one exact tie: both give the subgradient 0)
    y = torch.from_numpy(t["reg.y"]).double()
    check_loss("mse", t, lambda x: F.mse_loss(x, y), "reg.x")
    check_loss("l1", t, lambda x: F.l1_loss(x, y), "reg.x")

    # CrossEntropyLoss: label smoothing 0.1 in training, none in evaluation
    labels = torch.from_numpy(t["ce.y"]).long()
    check_loss("ce_train", t, lambda x: F.cross_entropy(x, labels, label_smoothing=0.1), "ce.x")
    check_loss("ce_eval", t, lambda x: F.cross_entropy(x, labels), "ce.x")

    # ROC-AUC with ties against sklearn
    sizes = sorted(int(k[3:-4]) for k in t if k.startswith("auc") and k.endswith(".auc"))
    if len(sizes) < 5:
        failures.append("expected at least 5 ROC-AUC cases, found %d" % len(sizes))
    for n in sizes:
        s, yy = t["auc%d.s" % n].astype(np.float64), t["auc%d.y" % n]
        ties = n - len(np.unique(s))
        if n > 20 and ties < n // 2:
            failures.append("auc%d: only %d tied scores" % (n, ties))
        ref = roc_auc_score(yy, s)
        exact("auc%d" % n, t["auc%d.auc" % n][0], ref)
        if "auc%d.strided" % n in t:
            exact("auc%d.strided" % n, t["auc%d.strided" % n][0], ref)

    # a multilabel evaluation pass: mean AUC over labels (sklearn's macro average) and accuracy at logit 0
    x, yy = t["mlacc.x"], t["mlacc.y"]
    auc, acc = t["mlacc.values"]
    exact("mlacc.auc", auc, roc_auc_score(yy, x.astype(np.float64), average="macro"))
    exact("mlacc.acc", acc, float(np.mean((x > 0) == (yy > 0.5))), who="numpy")

    for f in failures:
        print("FAIL", f)
    print("%d values compared, %d failed" % (checked, len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
