"""Parity of dtrain's embedding models (mf, ncf: row tables) and their sparse updates with PyTorch.

dump_embed (built next to this test) builds the zoo models mf (7 users, 11 items, 5 factors) and ncf (the
same embeddings, hidden 8,4) with seeded weights and writes them, the output, the MSE loss and every
gradient of a batch of 9 pairs with repeated users and items (embedding L2 off and on), and the parameters
after 5 optimizer steps over batches that leave some rows out of some steps, for dense Adam
(dt_optim_step), row-wise Adam (dt_optim_step_rows: SparseAdam), dense SGD and row-wise SGD.

torch loads the same weights by name into modules made of nn.Embedding (state_dict names as ours) and
recomputes: forward, loss and gradients in float64 (loss = MSE + l2 * batch mean of |p_u|^2 + |q_i|^2,
the term our layers add per lookup): max |dtrain - torch| <= 1e-5 * max |torch| per tensor; then the
steps in float32: torch.optim.Adam on all parameters (dense embeddings) vs dense Adam;
nn.Embedding(sparse=True) with torch.optim.SparseAdam for the tables and torch.optim.Adam for the rest vs
row-wise Adam; torch.optim.SGD on sparse gradients vs both our SGDs: within 1e-6 * max |torch| per tensor.
Rows no batch touches keep their initial bits in every run, and the sparse and dense Adam runs differ
(the batches do skip rows). Exit 77 only when torch is missing.
"""
import sys

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # optional dependency genuinely missing
    print("skipped: %s (apt-get install python3-torch, or make deps)" % e)
    sys.exit(77)

import parity_dump  # noqa: E402 (after the check for the optional dependencies)

USERS, ITEMS, FACTORS, HIDDEN = 7, 11, 5, (8, 4)
ADAM_LR, SGD_LR = 0.01, 0.1
GRAD_TOL = 1e-5
STEP_TOL = 1e-6
torch.set_num_threads(1)
failures = []
checked = 0


class MF(nn.Module):
    """Biased MF: global_bias + user_bias[u] + item_bias[i] + <user_factors[u], item_factors[i]>."""

    def __init__(self, sparse):
        super().__init__()
        self.user_factors = nn.Embedding(USERS, FACTORS, sparse=sparse)
        self.item_factors = nn.Embedding(ITEMS, FACTORS, sparse=sparse)
        self.user_bias = nn.Embedding(USERS, 1, sparse=sparse)
        self.item_bias = nn.Embedding(ITEMS, 1, sparse=sparse)
        self.global_bias = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        u, i = x[:, 0], x[:, 1]
        p, q = self.user_factors(u), self.item_factors(i)
        out = (p * q).sum(1, keepdim=True) + self.user_bias(u) + self.item_bias(i) + self.global_bias
        return out, (p * p).sum(1) + (q * q).sum(1)


class NCF(nn.Module):
    """user and item embeddings side by side -> Linear, ReLU, Linear, ReLU -> out."""

    def __init__(self, sparse):
        super().__init__()
        self.user_embedding = nn.Embedding(USERS, FACTORS, sparse=sparse)
        self.item_embedding = nn.Embedding(ITEMS, FACTORS, sparse=sparse)
        self.mlp = nn.Sequential(nn.Linear(2 * FACTORS, HIDDEN[0]), nn.ReLU(), nn.Linear(HIDDEN[0], HIDDEN[1]),
                                 nn.ReLU())
        self.out = nn.Linear(HIDDEN[1], 1)

    def forward(self, x):
        p, q = self.user_embedding(x[:, 0]), self.item_embedding(x[:, 1])
        return self.out(self.mlp(torch.cat([p, q], 1))), (p * p).sum(1) + (q * q).sum(1)


MODELS = {"mf": MF, "ncf": NCF}


def rel_err(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    scale = max(float(np.abs(ref).max()), 1e-30)
    return float(np.abs(got.reshape(ref.shape) - ref).max()) / scale


def close(name, got, ref, tol):
    global checked
    checked += 1
    err = rel_err(got, ref)
    if not err <= tol:
        failures.append("%s: relative error %.3g > %g" % (name, err, tol))
    return err


def tensors(t, prefix):
    return {k[len(prefix):]: v for k, v in t.items() if k.startswith(prefix)}


def module(kind, weights, sparse, dtype):
    m = MODELS[kind](sparse)
    state = {k: torch.from_numpy(v) for k, v in weights.items()}
    if set(state) != set(m.state_dict()):
        failures.append("%s: tensor names %s, torch's %s" % (kind, sorted(state), sorted(m.state_dict())))
        return None
    m.load_state_dict(state)
    return m.to(dtype)


def loss_of(m, x, y, l2):
    out, reg = m(x)
    return out, F.mse_loss(out, y) + l2 * reg.mean()


def grad_case(t, kind, tag):
    """Forward, loss and every gradient of batch 0 in float64."""
    m = module(kind, tensors(t, tag + ".init."), False, torch.float64)
    if m is None:
        return
    x = torch.from_numpy(t["batch0.x"]).long()
    y = torch.from_numpy(t["batch0.y"]).double()
    out, loss = loss_of(m, x, y, float(t[tag + ".l2"][0]))
    loss.backward()
    close(tag + ".out", t[tag + ".out"], out.detach().numpy(), GRAD_TOL)
    # the reported loss is the task's (MSE); the L2 term enters the gradient only
    close(tag + ".loss", t[tag + ".loss"], F.mse_loss(out, y).detach().numpy(), GRAD_TOL)
    worst = 0.0
    for name, p in m.named_parameters():
        worst = max(worst, close("%s.grad.%s" % (tag, name), t["%s.grad.%s" % (tag, name)], p.grad.numpy(), GRAD_TOL))
    print("%s: output, loss and %d gradients, worst relative error %.2g" % (tag, len(list(m.parameters())), worst))


def torch_steps(t, kind, run):
    """The parameters after the steps of `run` in float32 torch."""
    sparse = run != "adam_dense"
    m = module(kind, tensors(t, kind + "_l2.init."), sparse, torch.float32)
    if m is None:
        return None
    tables = [p for n, p in m.named_parameters() if "embedding" in n or "factors" in n or n.endswith("bias.weight")]
    dense = [p for p in m.parameters() if all(p is not q for q in tables)]
    if run == "adam_dense":
        opts = [torch.optim.Adam(m.parameters(), lr=ADAM_LR)]
    elif run == "adam_rows":
        opts = [torch.optim.SparseAdam(tables, lr=ADAM_LR), torch.optim.Adam(dense, lr=ADAM_LR)]
    else:
        opts = [torch.optim.SGD(m.parameters(), lr=SGD_LR)]
    l2 = float(t["l2"][0])
    s = 0
    while "batch%d.x" % s in t:
        for o in opts:
            o.zero_grad(set_to_none=True)
        x = torch.from_numpy(t["batch%d.x" % s]).long()
        _, loss = loss_of(m, x, torch.from_numpy(t["batch%d.y" % s]), l2)
        loss.backward()
        for p in tables:
            if p.grad.is_sparse != sparse:
                failures.append("%s %s: expected %s gradients" % (kind, run, "sparse" if sparse else "dense"))
        for o in opts:
            o.step()
        s += 1
    return {n: p.detach().numpy() for n, p in m.named_parameters()}


def untouched_rows(t, kind):
    """{table name: row indices no batch looks up}."""
    col = {"user": 0, "item": 1}
    xs = np.concatenate([t[k] for k in t if k.startswith("batch") and k.endswith(".x")])
    out = {}
    for name in tensors(t, kind + "_l2.init."):
        if name.endswith("weight") and name.split("_")[0] in col:
            rows = USERS if name.startswith("user") else ITEMS
            out[name] = sorted(set(range(rows)) - set(xs[:, col[name.split("_")[0]]].tolist()))
    return out


def optim_case(t, kind):
    init = tensors(t, kind + "_l2.init.")
    never = untouched_rows(t, kind)
    if not any(never.values()):
        failures.append("%s: every row is touched by some batch; the untouched-row checks check nothing" % kind)
    for run, ref_run in (("adam_dense", "adam_dense"), ("adam_rows", "adam_rows"), ("sgd_dense", "sgd"),
                         ("sgd_rows", "sgd")):
        ref = torch_steps(t, kind, ref_run)
        if ref is None:
            return
        got = tensors(t, "%s.%s." % (kind, run))
        worst = 0.0
        for name, r in ref.items():
            worst = max(worst, close("%s.%s.%s" % (kind, run, name), got[name], r, STEP_TOL))
        for name, rows in never.items():
            for r in rows:
                if not np.array_equal(got[name][r], init[name][r]):
                    failures.append("%s.%s.%s: row %d, never looked up, changed" % (kind, run, name, r))
        print("%s %s vs torch %s: %d tensors, worst relative error %.2g" % (kind, run, ref_run, len(ref), worst))
    dense, rows = tensors(t, kind + ".adam_dense."), tensors(t, kind + ".adam_rows.")
    gap = max(rel_err(rows[n], dense[n]) for n in never)
    if not gap > 1e-3:
        failures.append("%s: SparseAdam and dense Adam agree (%.3g): the batches skip no rows that moved" % (kind, gap))
    sgd_d, sgd_r = tensors(t, kind + ".sgd_dense."), tensors(t, kind + ".sgd_rows.")
    for n in sgd_d:
        if not np.array_equal(sgd_d[n], sgd_r[n]):
            failures.append("%s: row-wise SGD differs from dense SGD in %s (zero gradients must be no-ops)" % (kind, n))


def main():
    t = parity_dump.run("dump_embed")
    if t is None:
        return 1
    for kind in MODELS:
        grad_case(t, kind, kind + "_plain")
        grad_case(t, kind, kind + "_l2")
        optim_case(t, kind)
    for f in failures:
        print("FAIL", f)
    print("%d tensors compared, %d failures" % (checked, len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
