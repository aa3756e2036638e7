#!/usr/bin/python3
"""The toxicity lab's recipe, side by side: bert-mini trained from scratch by dtrain and by the reference
BertForSequenceClassification of tests/parity/bert_reference.py in PyTorch, on the same split, the same token ids
(dtrain tokenize: the same WordPiece), the same recipe: AdamW (weight decay 0.01, none on biases and LayerNorm
weights), linear schedule with 10% warm-up, gradient clipping at 1.0, dropout 0.1, batch 32, --epochs, seed 1,
--threads threads each. PyTorch pads every sequence to --max-len as the lab does (padding="max_length"); dtrain
packs the tokens (no computation on padding).

Data (../shared/data/toxicity):
  davidson  davidson-hate-speech.csv, text `tweet`, classes `class` (0 hate, 1 offensive, 2 neither), a 90/10
            split by seed 1 written to two CSV files: accuracy on the 10%
  jigsaw    jigsaw-toxic-sample.csv (3,000) for training, jigsaw-toxic-sample2.csv (2,000) for validation,
            text `comment_text`, binary label `toxic`: ROC-AUC and accuracy at 0.5
Figures: validation accuracy (and ROC-AUC), training samples/s over the training loop, wall time of each run.

    bench/bert_train_vs_torch.py [--build build] [--task davidson|jigsaw] [--epochs 2] [--max-len 128]
                                 [--limit N (training rows)] [--lr 1e-4] [--threads 2]
"""
import argparse, csv, json, os, random, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "parity"))
from synthetic_vs_torch import budget_env, cpu_line, loadavg  # noqa: E402

DATA = os.path.join(HERE, "..", "..", "shared", "data")
VOCAB = os.path.join(DATA, "bert", "bert-base-uncased-vocab.txt")


def read_rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        r = csv.DictReader(f)
        return r.fieldnames, list(r)


def write_rows(path, fields, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def prepare(a, tmp):
    """(train.csv, val.csv, text column, label column, task) in tmp."""
    tox = os.path.join(DATA, "toxicity")
    if a.task == "davidson":
        fields, rows = read_rows(os.path.join(tox, "davidson-hate-speech.csv"))
        random.Random(1).shuffle(rows)
        n_val = len(rows) // 10
        val, train = rows[:n_val], rows[n_val:]
        text, label, task = "tweet", "class", "classification"
    else:
        fields, train = read_rows(os.path.join(tox, "jigsaw-toxic-sample.csv"))
        fields2, val = read_rows(os.path.join(tox, "jigsaw-toxic-sample2.csv"))
        val = [{k: r[k] for k in fields} for r in val]
        text, label, task = "comment_text", "toxic", "binary"
    if a.limit:
        train = train[:a.limit]
    paths = os.path.join(tmp, "train.csv"), os.path.join(tmp, "val.csv")
    write_rows(paths[0], fields, train)
    write_rows(paths[1], fields, val)
    return paths, text, label, task, train, val


def run_dtrain(a, tmp, paths, text, label, task, n_train):
    steps = (n_train + 31) // 32 * a.epochs
    lab = ["--label-column", label] if task == "classification" else ["--label-columns", label]
    cmd = [os.path.join(a.build, "dtrain"), "train", "--model", "bert-mini", "--data", paths[0], "--val-data", paths[1],
           "--vocab", VOCAB, "--text-column", text, *lab, "--max-len", str(a.max_len), "--epochs", str(a.epochs),
           "--batch-size", "32", "--optimizer", "adamw", "--lr", str(a.lr), "--weight-decay", "0.01",
           "--no-decay", "bias,LayerNorm.weight", "--schedule", "linear", "--warmup-steps", str(steps // 10),
           "--clip-grad-norm", "1.0", "--seed", "1", "--threads", str(a.threads), "--progress", "none",
           "--out", os.path.join(tmp, "dtrain")]
    t0 = time.time()
    subprocess.run(cmd, check=True, env=budget_env(a.threads), stdout=subprocess.DEVNULL)
    wall = time.time() - t0
    s = json.load(open(os.path.join(tmp, "dtrain", "summary.json")))
    return s, wall


TORCH = r'''
import json, math, sys, time, torch
import numpy as np
sys.path.insert(0, sys.argv[1])
import bert_reference
from sklearn.metrics import roc_auc_score
cfg = json.load(open(sys.argv[2]))
torch.set_num_threads(cfg["threads"])
torch.manual_seed(1)
def load(path):
    ids = [[int(t) for t in line.split()] for line in open(path)]
    x = torch.zeros(len(ids), 3, cfg["max_len"], dtype=torch.int32)
    for i, s in enumerate(ids):
        x[i, 0, :len(s)] = torch.tensor(s)
        x[i, 2, :len(s)] = 1
    return x
xt, xv = load(cfg["train_ids"]), load(cfg["val_ids"])
yt, yv = torch.tensor(cfg["train_y"]), torch.tensor(cfg["val_y"])
classes = cfg["outputs"]
m = bert_reference.init_like_hf(bert_reference.make(30522, 256, 4, 1024, 4, classes, 0.1))
decay = [p for n, p in m.named_parameters() if not ("bias" in n or "LayerNorm.weight" in n)]
no_decay = [p for n, p in m.named_parameters() if "bias" in n or "LayerNorm.weight" in n]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}], lr=cfg["lr"])
steps = math.ceil(len(xt) / 32) * cfg["epochs"]
warm = steps // 10
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: s / max(1, warm) if s < warm else max(0.0, (steps - s) / max(1, steps - warm)))
def loss_of(logits, y):
    if cfg["task"] == "classification":
        return torch.nn.functional.cross_entropy(logits, y.long())
    return torch.nn.functional.binary_cross_entropy_with_logits(logits[:, 0], y.float())
train_s = 0.0
g = torch.Generator().manual_seed(1)
for epoch in range(cfg["epochs"]):
    m.train()
    perm = torch.randperm(len(xt), generator=g)
    t0 = time.perf_counter()
    for i in range(0, len(xt), 32):
        idx = perm[i:i + 32]
        opt.zero_grad()
        loss_of(m(xt[idx]), yt[idx]).backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        sched.step()
    train_s += time.perf_counter() - t0
m.eval()
with torch.no_grad():
    out = torch.cat([m(xv[i:i + 64]) for i in range(0, len(xv), 64)])
res = {"train_samples_per_s": len(xt) * cfg["epochs"] / train_s}
if cfg["task"] == "classification":
    res["acc"] = float((out.argmax(1) == yv).float().mean())
else:
    p = out[:, 0].numpy()
    res["acc"] = float(((p > 0) == (yv.numpy() > 0.5)).mean())
    res["auc"] = float(roc_auc_score(yv.numpy(), p))
print(json.dumps(res))
'''


def tokenize(a, rows, text, path):
    data = b"".join(r[text].encode("utf-8") + b"\0" for r in rows)
    out = subprocess.run([os.path.join(a.build, "dtrain"), "tokenize", "--vocab", VOCAB, "--null", "--special",
                          "--max-len", str(a.max_len)], input=data, check=True, capture_output=True).stdout
    open(path, "wb").write(out)


def run_torch(a, tmp, text, label, task, train, val):
    cfg = {"threads": a.threads, "max_len": a.max_len, "lr": a.lr, "epochs": a.epochs, "task": task,
           "train_ids": os.path.join(tmp, "train.ids"), "val_ids": os.path.join(tmp, "val.ids")}
    tokenize(a, train, text, cfg["train_ids"])
    tokenize(a, val, text, cfg["val_ids"])
    conv = (lambda v: int(v)) if task == "classification" else (lambda v: 1.0 if float(v) >= 0.5 else 0.0)
    cfg["train_y"] = [conv(r[label]) for r in train]
    cfg["val_y"] = [conv(r[label]) for r in val]
    cfg["outputs"] = max(cfg["train_y"]) + 1 if task == "classification" else 1
    json.dump(cfg, open(os.path.join(tmp, "cfg.json"), "w"))
    t0 = time.time()
    out = subprocess.run(["/usr/bin/python3", "-c", TORCH, os.path.join(HERE, "..", "tests", "parity"),
                          os.path.join(tmp, "cfg.json")], check=True, capture_output=True, text=True,
                         env=budget_env(a.threads)).stdout
    return json.loads(out.strip().splitlines()[-1]), time.time() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    p.add_argument("--task", choices=["davidson", "jigsaw"], default="davidson")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    print(f"# {cpu_line()}; load average before: {loadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        paths, text, label, task, train, val = prepare(a, tmp)
        print(f"# {a.task}: {len(train)} training rows, {len(val)} validation rows, max length {a.max_len}, "
              f"{a.epochs} epochs, lr {a.lr}, {a.threads} threads")
        s, dwall = run_dtrain(a, tmp, paths, text, label, task, len(train))
        t, twall = run_torch(a, tmp, text, label, task, train, val)
    metric = "test_acc1" if task == "classification" else "test_acc"
    d_acc = s.get(metric, s.get("test_acc1"))
    print("| | dtrain | PyTorch reference | dtrain / PyTorch |")
    print("|---|---:|---:|---:|")
    print(f"| validation accuracy | {100 * d_acc:.2f}% | {100 * t['acc']:.2f}% | |")
    if task != "classification":
        print(f"| validation ROC-AUC | {s.get('test_auc', float('nan')):.4f} | {t['auc']:.4f} | |")
    d_rate = s["train_samples_per_s"]
    print(f"| training samples/s | {d_rate:.1f} | {t['train_samples_per_s']:.1f} | "
          f"{d_rate / t['train_samples_per_s']:.2f}x |")
    print(f"| wall time of the run | {dwall:.0f} s | {twall:.0f} s | {twall / dwall:.2f}x faster |")
    print(f"# load average after: {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
