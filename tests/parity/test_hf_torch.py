"""Fine-tuning as transformers does it, against PyTorch: the linear schedule with warm-up, AdamW with a
no-decay parameter group, and --init-from reading safetensors checkpoints written here by hand.

1. dtrain's `linear` schedule (dump_optim lr) against torch's LambdaLR with the lambda of
   transformers.get_linear_schedule_with_warmup, written out below.
2. dtrain's optimizers with a no-decay table (dump_optim step nodecay=...) against torch.optim with two
   param groups, weight_decay 0 in the second.
3. End to end: a torch MLP's weights written as safetensors by hand (struct + json: Debian has no
   python3-safetensors), some as fp16; `dtrain train --init-from` on IDX images written here, AdamW,
   --no-decay bias, --schedule linear, full batches; torch runs the same steps; the trained weights agree.
4. --init-from on broken checkpoints: a wrong shape, a missing and an extra tensor, a corrupt header, a
   truncated file, overlapping offsets; every error names the file and the tensor.
Exit 77 only when torch is missing."""
import json
import os
import struct
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
DTRAIN = os.path.join(BUILD, "dtrain")
DUMP_OPTIM = os.path.join(BUILD, "tests", "dump_optim")
torch.set_num_threads(1)
failures = []


def check(name, ok, detail):
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
    if not ok:
        failures.append(name)


def f32(x):
    return float(np.float32(x))


def rel_err(c, t):
    scale = max(float(np.max(np.abs(t))), 1e-30)
    return float(np.max(np.abs(np.asarray(c, np.float64) - np.asarray(t, np.float64)))) / scale


# ---- safetensors by hand -------------------------------------------------------------------
DTYPES = {np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<i8"): "I64"}


def safetensors_bytes(tensors, metadata=None):
    """The file image of {name: numpy array}: 8-byte little-endian header length, JSON header, data."""
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        a = a.astype(a.dtype.newbyteorder("<"))
        raw = a.tobytes()
        header[name] = {"dtype": DTYPES[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def read_safetensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__", {})
    types = {"F32": "<f4", "F16": "<f2", "I64": "<i8"}
    out = {k: np.frombuffer(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]],
                            dtype=types[v["dtype"]]).reshape(v["shape"]) for k, v in h.items()}
    return out, meta


# ---- 1. the linear schedule ------------------------------------------------------------------
def hf_linear_lambda(num_warmup_steps, num_training_steps):
    """transformers.optimization.get_linear_schedule_with_warmup's lr_lambda, verbatim."""
    def lr_lambda(current_step):
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        return max(0.0, float(num_training_steps - current_step) / float(max(1, num_training_steps - num_warmup_steps)))
    return lr_lambda


def schedule_case(base, warmup, total, steps):
    r = subprocess.run([DUMP_OPTIM, "lr", "sched=linear", f"base={base!r}", f"warmup={warmup}", f"total={total}",
                        f"steps={steps}"], capture_output=True, text=True)
    if r.returncode != 0:
        check(f"linear schedule warmup={warmup} total={total}", False, r.stderr.strip())
        return
    c = np.array([float(x) for x in r.stdout.split()])
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=base)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, hf_linear_lambda(warmup, total))
    t = []
    for _ in range(steps):
        t.append(opt.param_groups[0]["lr"])  # the lr the step uses
        opt.step()
        sched.step()
    t = np.array(t)
    err = float(np.max(np.abs(c - t))) / base
    zero_first = warmup == 0 or c[0] == 0.0
    ends_at_zero = steps <= total or c[-1] == 0.0
    check(f"linear schedule warmup={warmup} total={total} ({steps} steps)",
          c.size == steps and err <= 1e-6 and zero_first and ends_at_zero,
          f"max |dt - torch LambdaLR| / lr = {err:.1e}, first lr {c[0]:g}, last {c[-1]:g}")


# ---- 2. the no-decay group in the optimizers ------------------------------------------------
def no_decay_case(kind, wd, ranges, seed, tmp, count=3000, steps=12):
    rng = np.random.RandomState(seed)
    p0 = rng.standard_normal(count).astype(np.float32)
    grads = (rng.standard_normal((steps, count)) * 0.1).astype(np.float32)
    lrs = np.array([0.01 * (t + 1) / steps for t in range(steps)], dtype=np.float32)
    mask = np.zeros(count, bool)
    for lo, n in ranges:
        mask[lo:lo + n] = True
    decay_p = torch.nn.Parameter(torch.from_numpy(p0[~mask].copy()))
    none_p = torch.nn.Parameter(torch.from_numpy(p0[mask].copy()))
    groups = [{"params": [decay_p], "weight_decay": f32(wd)}, {"params": [none_p], "weight_decay": 0.0}]
    if kind == "sgd":
        opt = torch.optim.SGD(groups, lr=float(lrs[0]), momentum=f32(0.9))
    else:
        opt = (torch.optim.AdamW if kind == "adamw" else torch.optim.Adam)(groups, lr=float(lrs[0]))
    for t in range(steps):
        for g in opt.param_groups:
            g["lr"] = float(lrs[t])
        decay_p.grad = torch.from_numpy(grads[t][~mask].copy())
        none_p.grad = torch.from_numpy(grads[t][mask].copy())
        opt.step()
    ref = np.empty(count, np.float32)
    ref[~mask] = decay_p.detach().numpy()
    ref[mask] = none_p.detach().numpy()
    ip, op = os.path.join(tmp, "in.f32"), os.path.join(tmp, "out.f32")
    np.concatenate([p0, lrs, grads.ravel()]).astype("<f4").tofile(ip)
    args = [DUMP_OPTIM, "step", f"kind={kind}", f"count={count}", f"steps={steps}", f"wd={f32(wd)!r}",
            "nodecay=" + ",".join(f"{lo}:{n}" for lo, n in ranges)]
    if kind == "sgd":
        args.append(f"momentum={f32(0.9)!r}")
    r = subprocess.run(args + [ip, op], capture_output=True, text=True)
    if r.returncode != 0:
        check(f"{kind} no-decay groups", False, r.stderr.strip())
        return
    out = np.fromfile(op, dtype="<f4")[:count]
    err = rel_err(out, ref)
    same = int(np.sum(out.view(np.uint32) == ref.view(np.uint32)))
    # a wrong table shows at once: decayed elements drift by about lr * wd * |p| a step, far above 1e-6
    check(f"{kind} wd={wd} with a no-decay group of {int(mask.sum())}/{count}", err <= 1e-6,
          f"rel err {err:.1e}, {same}/{count} bit-identical")


# ---- 3. end to end: --init-from, AdamW with --no-decay, --schedule linear --------------------
H, W, N, HIDDEN, CLASSES = 4, 4, 48, 12, 10


def write_idx(d, rng):
    os.makedirs(d, exist_ok=True)
    for prefix, n in (("train", N), ("t10k", 16)):
        x = rng.randint(0, 256, size=(n, H, W)).astype(np.uint8)
        y = rng.randint(0, CLASSES, size=n).astype(np.uint8)
        with open(os.path.join(d, f"{prefix}-images-idx3-ubyte"), "wb") as f:
            f.write(struct.pack(">IIII", 0x803, n, H, W) + x.tobytes())
        with open(os.path.join(d, f"{prefix}-labels-idx1-ubyte"), "wb") as f:
            f.write(struct.pack(">II", 0x801, n) + y.tobytes())
    return x, y


def read_idx_train(d):
    b = open(os.path.join(d, "train-images-idx3-ubyte"), "rb").read()
    x = np.frombuffer(b[16:], np.uint8).reshape(N, H * W).astype(np.float32) / np.float32(255)
    y = np.frombuffer(open(os.path.join(d, "train-labels-idx1-ubyte"), "rb").read()[8:], np.uint8).astype(np.int64)
    return x, y


def end_to_end(tmp):
    rng = np.random.RandomState(7)
    data = os.path.join(tmp, "idx")
    write_idx(data, rng)
    torch.manual_seed(3)
    fc1, fc2 = torch.nn.Linear(H * W, HIDDEN), torch.nn.Linear(HIDDEN, CLASSES)
    # fp16 in the checkpoint for fc1.weight (as transformers may save): both sides start from its rounded values
    with torch.no_grad():
        fc1.weight.copy_(fc1.weight.half().float())
    ckpt = os.path.join(tmp, "pretrained")
    os.makedirs(ckpt)
    init = {"fc1.weight": fc1.weight.detach().numpy().astype(np.float16),
            "fc1.bias": fc1.bias.detach().numpy().copy(),  # copies: torch trains these tensors in place below
            "fc2.weight": fc2.weight.detach().numpy().copy(), "fc2.bias": fc2.bias.detach().numpy().copy()}
    open(os.path.join(ckpt, "model.safetensors"), "wb").write(safetensors_bytes(init, {"format": "pt"}))
    json.dump({"model_type": "toy-mlp", "architectures": ["ToyMLP"]}, open(os.path.join(ckpt, "config.json"), "w"))

    epochs, lr, wd, warmup = 4, f32(0.01), f32(0.1), 1
    out = os.path.join(tmp, "run")
    r = subprocess.run([DTRAIN, "train", "--model", "mlp", "--hidden", str(HIDDEN), "--data", data,
                        "--init-from", ckpt, "--optimizer", "adamw", "--lr", repr(lr), "--weight-decay", repr(wd),
                        "--no-decay", "bias", "--schedule", "linear", "--warmup-steps", str(warmup),
                        "--epochs", str(epochs), "--batch-size", str(N), "--threads", "1", "--progress", "none",
                        "--out", out], capture_output=True, text=True)
    if r.returncode != 0:
        check("dtrain train --init-from", False, r.stderr.strip() + r.stdout[-500:])
        return
    said = r.stdout
    check("--init-from reports the copy and the fp16 conversion",
          "4 tensor(s) copied (1 converted from 16-bit floats)" in said and "model_type toy-mlp" in said, said[:300])
    check("--no-decay prints the groups",
          "weight decay 0.1 on 2 tensor(s), 312 parameters; none on 2 tensor(s), 22 parameters" in said,
          [l for l in said.splitlines() if "parameter groups" in l])

    x, y = read_idx_train(data)
    model = torch.nn.Sequential(fc1, torch.nn.ReLU(), fc2)
    groups = [{"params": [fc1.weight, fc2.weight], "weight_decay": wd},
              {"params": [fc1.bias, fc2.bias], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, hf_linear_lambda(warmup, epochs))
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(epochs):  # one full batch an epoch: the sampler's order does not change the mean loss
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xt), yt).backward()
        opt.step()
        sched.step()
    got, meta = read_safetensors(os.path.join(out, "model.safetensors"))
    ref = {"fc1.weight": fc1.weight, "fc1.bias": fc1.bias, "fc2.weight": fc2.weight, "fc2.bias": fc2.bias}
    errs = {k: rel_err(got[k], v.detach().numpy()) for k, v in ref.items()}
    moved = rel_err(got["fc2.bias"], init["fc2.bias"])
    check("init-from + AdamW(no-decay bias) + linear schedule, 4 steps, vs torch",
          max(errs.values()) <= 2e-5 and moved > 1e-4,
          ", ".join(f"{k} {e:.1e}" for k, e in errs.items()) + f"; moved {moved:.1e} from the start")

    # export --format hf and back: identical bits, transformers' metadata
    hf = os.path.join(tmp, "hf")
    r = subprocess.run([DTRAIN, "export", os.path.join(out, "model.safetensors"), hf, "--format", "hf"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        check("export --format hf", False, r.stderr.strip())
        return
    exp, emeta = read_safetensors(os.path.join(hf, "model.safetensors"))
    cfg = json.load(open(os.path.join(hf, "config.json")))
    check("export --format hf: same tensors, {\"format\": \"pt\"}, config.json",
          exp.keys() == got.keys() and all(exp[k].tobytes() == got[k].tobytes() for k in got)
          and emeta.get("format") == "pt" and cfg["dtrain"]["model"] == "mlp" and cfg["torch_dtype"] == "float32"
          and "architectures" not in cfg, f"metadata {emeta}, config keys {sorted(cfg)}")
    # torch reads the export: load_state_dict with strict names
    sd = {k: torch.from_numpy(v.copy()) for k, v in exp.items()}
    m2 = torch.nn.Sequential()
    m2.add_module("fc1", torch.nn.Linear(H * W, HIDDEN))
    m2.add_module("fc2", torch.nn.Linear(HIDDEN, CLASSES))
    m2.load_state_dict(sd, strict=True)
    check("torch load_state_dict(strict=True) of the export", True, f"{len(sd)} tensors")


# ---- 4. broken checkpoints ------------------------------------------------------------------
def init_from(tmp, path, hidden=HIDDEN):
    data = os.path.join(tmp, "idx")
    return subprocess.run([DTRAIN, "train", "--model", "mlp", "--hidden", str(hidden), "--data", data, "--init-from",
                           path, "--epochs", "1", "--threads", "1", "--progress", "none", "--overwrite", "--out",
                           os.path.join(tmp, "bad-run")], capture_output=True, text=True)


def broken(tmp):
    rng = np.random.RandomState(1)
    good = {"fc1.weight": rng.standard_normal((HIDDEN, H * W)).astype(np.float32),
            "fc1.bias": rng.standard_normal(HIDDEN).astype(np.float32),
            "fc2.weight": rng.standard_normal((CLASSES, HIDDEN)).astype(np.float16),
            "fc2.bias": rng.standard_normal(CLASSES).astype(np.float32)}

    def case(label, image, rc, *needles):
        path = os.path.join(tmp, label.replace(" ", "_") + ".safetensors")
        open(path, "wb").write(image)
        r = init_from(tmp, path)
        text = r.stdout + r.stderr
        ok = r.returncode == rc and all(n.replace("PATH", path) in text for n in needles)
        lines = [l for l in text.splitlines() if "dtrain" in l or "init from" in l or "tensor(s)" in l]
        check(f"--init-from {label}", ok, f"exit {r.returncode}: {' | '.join(lines)[:400]}")
        return r

    # a missing tensor keeps its initialisation, an extra one is not used: both listed, the run goes on
    part = dict(good)
    del part["fc2.bias"]
    part["classifier.weight"] = np.zeros((2, 3), np.float32)
    case("missing and extra tensors", safetensors_bytes(part), 0, "3 tensor(s) copied (1 converted",
         "1 tensor(s) of mlp not in the file keep their initialisation (newly initialized; train them): fc2.bias",
         "1 tensor(s) of the file not in mlp are not used: classifier.weight")
    wrong = dict(good)
    wrong["fc1.weight"] = np.zeros((HIDDEN + 1, H * W), np.float32)
    case("wrong shape", safetensors_bytes(wrong), 1, "PATH: tensor fc1.weight: shape (13, 16) in the file, (12, 16) in "
         "the model")
    img = safetensors_bytes(good)
    case("truncated file", img[:-10], 1, "PATH: tensor", "outside the", "truncated file?")
    n = struct.unpack("<Q", img[:8])[0]
    case("corrupt header", img[:8] + b"{\"fc1.weight\": [" + img[8 + 16:], 1, "PATH: header")
    case("header length beyond the file", struct.pack("<Q", len(img)) + img[8:], 1, "PATH: header length")
    hdr = json.loads(img[8:8 + n])
    hdr["fc1.bias"]["data_offsets"] = [hdr["fc1.weight"]["data_offsets"][0], hdr["fc1.weight"]["data_offsets"][0] +
                                       4 * HIDDEN]
    text = json.dumps(hdr).encode()
    text += b" " * (-(8 + len(text)) % 8)
    case("overlapping offsets", struct.pack("<Q", len(text)) + text + img[8 + n:], 1, "PATH: tensors", "overlap")
    hdr = json.loads(img[8:8 + n])
    hdr["fc1.bias"]["shape"] = [HIDDEN + 1]
    text = json.dumps(hdr).encode()
    text += b" " * (-(8 + len(text)) % 8)
    case("shape not matching its bytes", struct.pack("<Q", len(text)) + text + img[8 + n:], 1,
         "PATH: tensor \"fc1.bias\": data_offsets", "shape and dtype need")
    case("another model's weights", safetensors_bytes({"weight": np.zeros((3, 3), np.float32)}), 1,
         "PATH: none of the model's 4 tensors is in the file", "weight")
    r = init_from(tmp, os.path.join(tmp, "no-such-dir"))
    check("--init-from a path that does not exist", r.returncode == 1 and "no-such-dir" in r.stderr, r.stderr.strip())


def main():
    for tool in (DTRAIN, DUMP_OPTIM):
        if not os.access(tool, os.X_OK):
            print(f"missing {tool}: build the tree first (DT_BUILD_DIR={BUILD})")
            return 1
    with tempfile.TemporaryDirectory() as tmp:
        base = f32(5e-5)
        for warmup, total, steps in ((0, 10, 12), (3, 10, 12), (10, 100, 120), (1, 1, 3), (7, 7, 9), (100, 1000, 300)):
            schedule_case(base, warmup, total, steps)
        ranges = [(0, 100), (1000, 1), (2500, 500)]
        no_decay_case("adamw", 0.1, ranges, 1, tmp)
        no_decay_case("adam", 0.01, ranges, 2, tmp)
        no_decay_case("sgd", 0.05, ranges, 3, tmp)
        end_to_end(tmp)
        broken(tmp)
    if failures:
        print(f"{len(failures)} failure(s): {failures}")
        return 1
    print("all fine-tuning parity checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
