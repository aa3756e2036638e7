"""Parity of dtrain's optimizers, LR schedules and gradient clipping with PyTorch (torch.optim 1.13).

Drives tests/parity/dump_optim.c: parameters, a per-step learning rate and a
fixed sequence of random gradients go in a file, the C optimizer runs ~20 steps,
and the final parameters and state buffers come back; torch.optim runs the same
steps from the same inputs. Hyper-parameters are float32 values (dtrain's config
is float), given to torch as the same numbers. Exit 77 only when torch is missing.
"""
import os
import warnings
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as e:  # optional dependency: skip
    print(f"skipped: {e}")
    sys.exit(77)

BUILD = os.environ.get("DT_BUILD_DIR", "build")
TOOL = os.path.join(BUILD, "tests", "dump_optim")
COUNT, STEPS = 1000, 20
# Relative bound for the optimizer comparison: dtrain mirrors torch's kernel
# arithmetic op for op (fmaf where torch's vectorised add/addcmul fuse), so the
# results are usually bit-identical; 1e-6 leaves room for a last-ulp difference
# in torch's scalar tail loops, amplified a little over 20 steps.
TOL = 1e-6

torch.set_num_threads(1)
# SequentialLR steps its second scheduler with an explicit epoch, which warns
warnings.filterwarnings("ignore", message="The epoch parameter")
failures = []


def f32(x):
    return float(np.float32(x))


def check(name, ok, detail):
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
    if not ok:
        failures.append(name)


def rel_err(c, t):
    """max |c - t| relative to the reference's largest magnitude."""
    scale = max(float(np.max(np.abs(t))), 1e-30)
    return float(np.max(np.abs(c.astype(np.float64) - t.astype(np.float64)))) / scale


def run_tool(args, inp=None, out_floats=None, tmp=None):
    paths = []
    if inp is not None:
        ip, op = os.path.join(tmp, "in.f32"), os.path.join(tmp, "out.f32")
        np.ascontiguousarray(inp, dtype="<f4").tofile(ip)
        paths = [ip, op]
    r = subprocess.run([TOOL] + args + paths, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"dump_optim {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    if inp is None:
        return r.stdout
    out = np.fromfile(paths[1], dtype="<f4")
    assert out.size == out_floats, f"dump_optim wrote {out.size} floats, expected {out_floats}"
    return out


# ---- optimizers --------------------------------------------------------------
STATE_NAMES = {"sgd": ["momentum_buffer"], "adam": ["exp_avg", "exp_avg_sq"], "adamw": ["exp_avg", "exp_avg_sq"]}


def torch_optimizer(kind, cfg, p, lr):
    wd = f32(cfg.get("wd", 0.01 if kind == "adamw" else 0.0))
    if kind == "sgd":
        return torch.optim.SGD([p], lr=lr, momentum=f32(cfg.get("momentum", 0)),
                               dampening=f32(cfg.get("dampening", 0)), nesterov=bool(cfg.get("nesterov", 0)),
                               weight_decay=wd)
    betas = (f32(cfg.get("beta1", 0.9)), f32(cfg.get("beta2", 0.999)))
    eps = f32(cfg.get("eps", 1e-8))
    cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
    return cls([p], lr=lr, betas=betas, eps=eps, weight_decay=wd)


def optim_case(kind, cfg, base_lr, seed, tmp):
    rng = np.random.RandomState(seed)
    p0 = rng.standard_normal(COUNT).astype(np.float32)
    grads = (rng.standard_normal((STEPS, COUNT)) * rng.uniform(0.01, 1.0, (STEPS, 1))).astype(np.float32)
    # a varying learning rate (warm-up then decay), as a schedule gives
    lrs = np.array([base_lr * min(1.0, (t + 1) / 4) * 0.9 ** t for t in range(STEPS)], dtype=np.float32)

    p = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    opt = torch_optimizer(kind, cfg, p, float(lrs[0]))
    for t in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = float(lrs[t])
        p.grad = torch.from_numpy(grads[t].copy())
        opt.step()
    states = [opt.state[p][n].numpy() for n in STATE_NAMES[kind] if n in opt.state[p] and opt.state[p][n] is not None]

    args = ["step", f"kind={kind}", f"count={COUNT}", f"steps={STEPS}"]
    args += [f"{k}={float(np.float32(v))!r}" for k, v in cfg.items()]
    out = run_tool(args, np.concatenate([p0, lrs, grads.ravel()]), COUNT * (1 + len(states)), tmp)
    ref = p.detach().numpy()
    err = rel_err(out[:COUNT], ref)
    same = int(np.sum(out[:COUNT].view(np.uint32) == ref.view(np.uint32)))
    label = f"{kind} {cfg or 'defaults'} lr={base_lr}"
    check(label, err <= TOL, f"params rel err {err:.2e}, {same}/{COUNT} bit-identical")
    for i, (n, st) in enumerate(zip(STATE_NAMES[kind], states)):
        e = rel_err(out[COUNT * (i + 1):COUNT * (i + 2)], st)
        check(f"{label} {n}", e <= TOL, f"rel err {e:.2e}")


# ---- schedules ---------------------------------------------------------------
def torch_lrs(base, make, n=50):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=base)
    sched = make(opt)
    out = [opt.param_groups[0]["lr"]]
    for _ in range(n - 1):
        opt.step()  # no grad: a no-op, keeps the scheduler's order check quiet
        sched.step()
        out.append(opt.param_groups[0]["lr"])
    return np.array(out)


def sched_case(label, args, base, make):
    c = np.array([float(x) for x in run_tool(["lr", f"base={base!r}", "steps=50"] + args).split()])
    t = torch_lrs(base, make)
    # C returns float (rounded from a double closed form); torch keeps a double
    # stepped recursively: agree to float precision, relative to base_lr.
    err = float(np.max(np.abs(c - t))) / base
    check(f"schedule {label}", c.size == 50 and err <= 1e-6, f"max |dt - torch| / base_lr = {err:.2e}")


def schedules():
    S = torch.optim.lr_scheduler
    base, third = f32(0.1), f32(1.0 / 3.0)
    sched_case("StepLR(7, 0.5)", ["sched=step", "step_size=7", "gamma=0.5"], base,
               lambda o: S.StepLR(o, step_size=7, gamma=0.5))
    gamma = f32(0.9)
    sched_case("StepLR(1, 0.9)", ["sched=step", "step_size=1", f"gamma={gamma!r}"], base,
               lambda o: S.StepLR(o, step_size=1, gamma=gamma))
    eta = f32(1e-3)
    sched_case("CosineAnnealingLR(49, 1e-3)", ["sched=cosine", "total=49", f"min={eta!r}"], base,
               lambda o: S.CosineAnnealingLR(o, T_max=49, eta_min=eta))
    sched_case("LinearLR(1/3, 5) + CosineAnnealingLR(45)",
               ["sched=cosine", "warmup=5", f"warmup_start={third!r}", "total=45"], base,
               lambda o: S.SequentialLR(o, [S.LinearLR(o, start_factor=third, total_iters=5),
                                            S.CosineAnnealingLR(o, T_max=45)], milestones=[5]))
    sched_case("LinearLR(0.25, 8) + StepLR(10, 0.5)",
               ["sched=step", "warmup=8", "warmup_start=0.25", "step_size=10", "gamma=0.5"], base,
               lambda o: S.SequentialLR(o, [S.LinearLR(o, start_factor=0.25, total_iters=8),
                                            S.StepLR(o, step_size=10, gamma=0.5)], milestones=[8]))
    sched_case("LinearLR(1/3, 10) alone (warm-up + constant)",
               ["sched=constant", "warmup=10", f"warmup_start={third!r}"], base,
               lambda o: S.LinearLR(o, start_factor=third, total_iters=10))


# ---- clipping ----------------------------------------------------------------
def clip_case(label, g, max_norm, tmp):
    max_norm = f32(max_norm)
    out = run_tool(["clip", f"max_norm={max_norm!r}", f"count={g.size}"], g, 1 + g.size, tmp)
    t = torch.from_numpy(g.copy())
    p = torch.nn.Parameter(torch.zeros_like(t))
    p.grad = t
    norm = float(torch.nn.utils.clip_grad_norm_([p], max_norm))
    cn = float(out[0])
    if not np.isfinite(norm):
        # dtrain reports a non-finite norm and leaves the gradients alone; torch
        # multiplies them all by NaN. Same norm, documented difference.
        ok = (np.isnan(cn) and np.isnan(norm)) or cn == norm
        check(f"clip {label}", ok and np.array_equal(out[1:], g, equal_nan=True),
              f"norm dt {cn} torch {norm}; gradients left unscaled")
        return
    # torch sums squares in float, dtrain in double: the norms agree to float precision
    en = abs(cn - norm) / norm
    eg = rel_err(out[1:], p.grad.numpy())
    scaled = norm > max_norm
    untouched = scaled or np.array_equal(out[1:], g)
    check(f"clip {label}", en <= 1e-6 and eg <= 2e-6 and untouched,
          f"norm {cn:.7g} (torch {norm:.7g}, rel {en:.1e}), grads rel err {eg:.1e}, "
          f"{'scaled' if scaled else 'untouched'}")


def main():
    if not os.access(TOOL, os.X_OK):
        print(f"missing {TOOL}: build the tree first (DT_BUILD_DIR={BUILD})")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        sgd_cases = [{}, {"momentum": 0.9}, {"momentum": 0.9, "dampening": 0.3}, {"momentum": 0.9, "nesterov": 1},
                     {"wd": 1e-2}, {"momentum": 0.9, "nesterov": 1, "wd": 5e-3},
                     {"momentum": 0.5, "dampening": 0.5, "wd": 1e-3}]
        for i, cfg in enumerate(sgd_cases):
            optim_case("sgd", cfg, 0.05, 100 + i, tmp)
        for i, cfg in enumerate([{}, {"wd": 0.01}, {"beta1": 0.8, "beta2": 0.99, "eps": 1e-6}]):
            optim_case("adam", cfg, 1e-3 if i != 1 else 0.01, 200 + i, tmp)
        for i, cfg in enumerate([{}, {"wd": 0.1}, {"wd": 0.05, "beta1": 0.85, "eps": 1e-7}]):
            optim_case("adamw", cfg, 1e-3 if i != 1 else 0.01, 300 + i, tmp)
        schedules()
        rng = np.random.RandomState(7)
        g = rng.standard_normal(1000).astype(np.float32)
        clip_case("1000 elems, max_norm 1 (scaled)", g, 1.0, tmp)
        clip_case("1000 elems, max_norm 100 (untouched)", g, 100.0, tmp)
        big = (rng.standard_normal(100003) * 0.01).astype(np.float32)
        clip_case("100003 elems, several chunks", big, 0.5, tmp)
        bad = g.copy()
        bad[17] = np.nan
        clip_case("a NaN gradient", bad, 1.0, tmp)
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
