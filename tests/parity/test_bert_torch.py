#!/usr/bin/env python3
"""Parity of dtrain's bert with the reference BertForSequenceClassification of bert_reference.py (PyTorch, as
Hugging Face's modeling_bert.py computes it, with its module names, so dtrain's weights load with strict=True). On dtrain's initial weights and padded batch
(dump_bert): training logits and cross-entropy loss, every parameter gradient (f32, rel <= 1e-4 of each tensor's largest
magnitude), evaluation logits; the initialisation's distribution (N(0, 0.02) weights and embeddings, zero
biases, LayerNorm 1/0, a zero padding row); and the other way: a checkpoint the reference writes in Hugging Face's
layout (model.safetensors with its names, config.json) loads into dtrain (dt_model_init_from, as --init-from) and
gives the reference's logits. Exit 77 only when torch is missing (make deps installs it).
"""
import math
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # optional dependency
    print(f"skipped: {e}")
    sys.exit(77)

import bert_reference  # noqa: E402
import parity_dump  # noqa: E402

failures = []


def check(name, got, ref, tol, quiet=False, floor=1e-9):
    """max |got - ref| <= tol * max |ref|; a tensor whose reference is below floor everywhere (the key bias's
    gradient, zero in exact arithmetic: softmax ignores a shift of every score of a row) is compared absolutely."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        failures.append(f"{name}: shape {got.shape} vs {ref.shape}")
        print(f"FAIL {name}: shape {got.shape} vs {ref.shape}")
        return 0.0
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    err = float(np.max(np.abs(got - ref))) if got.size else 0.0
    rel = err / scale if scale > floor else err
    tol = tol if scale > floor else floor
    if rel > tol:
        failures.append(name)
    if rel > tol or not quiet:
        print(f"{'ok  ' if rel <= tol else 'FAIL'} {name:56s} rel err {rel:.3g} (scale {scale:.3g})")
    return rel


def init_distribution(t):
    for k, v in t.items():
        if not k.startswith("init/"):
            continue
        name = k[5:]
        if "LayerNorm.weight" in name:
            ok = np.all(v == 1)
        elif name.endswith(".bias"):
            ok = np.all(v == 0)
        else:
            w = v[1:] if "word_embeddings" in name else v
            ok = abs(float(w.std()) / 0.02 - 1) < 6 / math.sqrt(w.size) + 0.02 and abs(float(w.mean())) < 6 * 0.02 / math.sqrt(w.size)
            if "word_embeddings" in name:
                ok = ok and np.all(v[0] == 0)
        if not ok:
            failures.append(f"init {name}")
            print(f"FAIL init {name}")
    print("ok   init: N(0, 0.02) weights and embeddings, padding row 0, biases 0, LayerNorm 1/0" if not failures else "")


def hf_checkpoint_loads(x):
    """A reference model with other weights, saved as transformers would, read by dtrain: the same logits."""
    import json
    import os
    import tempfile
    from test_hf_torch import safetensors_bytes
    torch.manual_seed(5)
    ref = bert_reference.init_like_hf(bert_reference.make(60, 32, 4, 48, 2, 3, dropout=0.0)).eval()
    with tempfile.TemporaryDirectory() as tmp:
        tensors = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
        with open(os.path.join(tmp, "model.safetensors"), "wb") as f:
            f.write(safetensors_bytes(tensors, {"format": "pt"}))
        json.dump({"model_type": "bert", "architectures": ["BertForSequenceClassification"]},
                  open(os.path.join(tmp, "config.json"), "w"))
        d = parity_dump.run("dump_bert", tmp)
    with torch.no_grad():
        check("hf checkpoint -> dtrain: eval logits", d["hf/logits"], ref(torch.from_numpy(d["input"])).numpy(), 1e-4)


def main():
    torch.set_num_threads(2)
    t = parity_dump.run("dump_bert")
    if t is None:
        return 1
    init_distribution(t)
    m = bert_reference.make(60, 32, 4, 48, 2, 3, dropout=0.0)
    want = {k[5:]: torch.from_numpy(v) for k, v in t.items() if k.startswith("init/")}
    if list(want) != list(m.state_dict()):
        failures.append("state_dict keys or order")
        print("FAIL keys:", sorted(set(m.state_dict()) ^ set(want))[:6])
    m.load_state_dict(want, strict=True)
    x = torch.from_numpy(t["input"])
    y = torch.from_numpy(t["labels"]).long()
    logits = m(x)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    # f32 on both sides with other summation orders (OpenBLAS vs torch's GEMMs, per-head GEMMs, LayerNorm in
    # double here): ~1e-6 per op, through 2 layers and LayerNorm's 1/std, well inside 1e-4 of each tensor's scale.
    check("train/logits", t["train/logits"], logits.detach().numpy(), 1e-4)
    check("train/loss", t["train/loss"][0], loss.item(), 1e-5)
    worst, n = 0.0, 0
    for k, v in m.named_parameters():
        worst = max(worst, check("grad/" + k, t["grad/" + k], v.grad.numpy(), 1e-4, quiet=True))
        n += 1
    print(f"ok   grad: {n} parameter gradients, worst rel err {worst:.3g}")
    if np.any(t["grad/bert.embeddings.word_embeddings.weight"][0] != 0):
        failures.append("the padding row got a gradient")
    with torch.no_grad():
        check("eval/logits", t["eval/logits"], m(x).numpy(), 1e-4)
    hf_checkpoint_loads(x)
    if failures:
        print("FAILED:", ", ".join(failures[:20]))
        return 1
    print("bert parity: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
