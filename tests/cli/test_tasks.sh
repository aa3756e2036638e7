#!/usr/bin/env bash
# Every task end to end through the command line, on generated data (synthetic:N):
#  1. the PyTorch DDP tutorial (Linear(20, 1) on rand -> rand, 2 ranks, 50 epochs, sgd lr 0.001,
#     a snapshot every 10 epochs): exit 0, loss falling, the five snapshots, tensors "weight" (1, 20)
#     and "bias" (1); without validation data: "no validation data", empty test columns;
#  2. that job with a rank killed (SIGKILL) after the epoch-20 snapshot under --max-restarts 0, then
#     --resume auto: the weights' bytes and metrics.csv (timings aside) equal the uninterrupted run's;
#  3. regression, multilabel and classification with mlp under ddp, world 2 (batch 16 per rank) against
#     world 1 (batch 32): same weights and validation metrics; the world-2 run's validation metrics
#     (301 samples: one rank pads a duplicate) equal a one-process evaluation of its weights exactly;
#  4. outputs per task: summary.json ("task", test_<metric>, eval detail), metrics.csv header, report.html;
#  5. --val-fraction: the split's sizes;
#  6. usage errors of tasks, specs and validation data (exit 2, one line naming both sides), in train
#     and eval;
#  7. --loss l1 reports the mean absolute error as its loss; --pos-weight weighs the loss and eval
#     applies it from the weights' metadata.
set -u
b=${DT_BUILD_DIR:?DT_BUILD_DIR must name the build directory}
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
export DT_BUILD_DIR=$b
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export DT_TIMEOUT=60 # a hung collective fails the test instead of stalling it
export DT_NUM_THREADS=1
DTRAIN=$b/dtrain
DTRUN=$b/dtrun
EVALM=$b/tests/eval_metrics
W=$SRC/tests/cli/ddp_worker.sh
. "$SRC/tests/cli/common.sh" # fail, ok, section, alive, wait_for, same_tensors
for x in "$DTRAIN" "$DTRUN" "$EVALM"; do [ -x "$x" ] || { echo "FAIL: $x is not built" >&2; exit 1; }; done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT OMPI_COMM_WORLD_RANK PMI_RANK SLURM_PROCID
unset OMPI_COMM_WORLD_SIZE SLURM_STEP_NUM_TASKS # they decide whether a train without --strategy runs

use_tmp
# col FILE NAME: the column NAME of a CSV, one value a line.
col() { awk -F, -v c="$2" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == c) k = i; next } k { print $k }' "$1"; }
# untimed FILE: a metrics.csv without its wall-clock columns.
untimed() {
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) skip[i] = ($i == "epoch_seconds" || $i == "train_samples_per_s") }
    { s = ""; for (i = 1; i <= NF; i++) if (!skip[i]) s = s (s == "" ? "" : ",") $i; print s }' "$1"
}
# pycheck MESSAGE PYTHON ARGS...: ok MESSAGE when the Python snippet exits 0, else fail with what it printed.
pycheck() {
  local msg=$1 code=$2 out
  shift 2
  if out=$(/usr/bin/python3 -c "$code" "$@" 2>&1); then ok "$msg${out:+: $out}"; else fail "$msg: $(tail -n 1 <<<"$out")"; fi
}

# ---- 1: the PyTorch DDP tutorial ---------------------------------------------------------------------
# 2048 samples over 2 ranks, batch 32: 32 steps per rank and epoch; a snapshot every 10 epochs = 320 steps.
section "1 the DDP tutorial: linear on synthetic:2048, 2 ranks, 50 epochs"
tut=(train --strategy ddp --model linear --data synthetic:2048 --epochs 50 --batch-size 32 --optimizer sgd --lr 0.001
  --save-every 10 --keep 5 --progress plain)
run tut 120 "$DTRUN" --standalone --nproc-per-node 2 -- "$DTRAIN" "${tut[@]}" --out "$tmp/tut"
if [ $rc -ne 0 ]; then
  fail "tutorial: exit $rc"
  show tut
else
  first=$(col "$tmp/tut/metrics.csv" train_loss | head -n 1)
  last=$(col "$tmp/tut/metrics.csv" train_loss | tail -n 1)
  rows=$(col "$tmp/tut/metrics.csv" epoch | wc -l)
  steps=$(col "$tmp/tut/metrics.csv" step | tr '\n' ' ')
  if [ "$rows" -eq 50 ] && awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' && [[ "$steps" == "32 64 "*" 1600 " ]]; then
    ok "tutorial: 50 epochs of 32 steps, train loss $first -> $last"
  else
    fail "tutorial: $rows rows, steps '$steps', train loss $first -> $last (expected 50 rows ending at step 1600, falling)"
  fi
  snaps=$(ls "$tmp/tut/snapshots" | tr '\n' ' ')
  want=$(printf 'step-%09d.safetensors ' 320 640 960 1280 1600)
  [ "$snaps" = "$want" ] && ok "tutorial: snapshots after epochs 10, 20, 30, 40, 50 (steps 320 ... 1600)" ||
    fail "tutorial: snapshots '$snaps', expected '$want'"
  # inspect lists "  NAME  DTYPE  (SHAPE)  min ... max ... mean ..." between "tensors (N):" and "total:".
  tensors=$("$DTRAIN" inspect "$tmp/tut/model.safetensors" | sed -n '/^tensors (/,/^total:/p' |
    awk 'NR > 1 && !/^total:/ { $1 = $1; sub(/ min .*/, ""); print }')
  if [ "$tensors" = "$(printf 'weight f32 (1, 20)\nbias f32 (1)')" ]; then
    ok "tutorial: model.safetensors holds exactly weight (1, 20) and bias (1)"
  else
    fail "tutorial: tensors of model.safetensors: $tensors"
  fi
  # No validation data: said once (by rank 0), test columns empty, test figures null, no nan in the per-rank table.
  empty=$(awk -F, 'NR > 1 && $7$8$9 != "" { n++ } END { print n + 0 }' "$tmp/tut/metrics.csv")
  if [ "$(grep -c 'no validation data' "$tmp/tut.out")" -eq 1 ] && [ "$empty" -eq 0 ] &&
    [ "$(head -n 1 "$tmp/tut/metrics.csv" | cut -d, -f7-9)" = "test_loss,test_rmse,test_mae" ] &&
    grep -q '"test_rmse":null' "$tmp/tut/summary.json" && ! grep -qiw 'nan' "$tmp/tut.out"; then
    ok "tutorial: no validation data: said so, test columns empty, summary test_rmse null, no nan printed"
  else
    fail "tutorial: without validation data: $empty row(s) with test figures, summary: $(head -c 400 "$tmp/tut/summary.json")," \
      "output: $(grep -i 'nan\|validation' "$tmp/tut.out" | head -n 3)"
  fi
fi

# ---- 2: kill a rank, resume ------------------------------------------------------------------------------
section "2 the tutorial killed after epoch 20, resumed"
mkdir -p "$tmp/kill"
# Epochs take about 10 ms: the watcher polls every 10 ms and kills rank 1 a few epochs after the snapshot.
DDP_PID_DIR=$tmp/kill "$DTRUN" --standalone --nproc-per-node 2 --max-restarts 0 -- bash "$W" "${tut[@]}" \
  --out "$tmp/kill/o" >"$tmp/kill.out" 2>"$tmp/kill.err" </dev/null &
dpid=$!
bg_pids+=("$dpid")
snap20=$tmp/kill/o/snapshots/step-000000640.safetensors
for ((i = 0; i < 6000; i++)); do [ -e "$snap20" ] || ! alive "$dpid" && break; sleep 0.01; done
victim=$(cat "$tmp/kill/pid.1.0" 2>/dev/null)
if [ ! -e "$snap20" ] || ! alive "$victim"; then
  fail "kill: rank 1 was not running when the epoch-20 snapshot appeared, or it never did" \
    "(snapshots: $(ls "$tmp/kill/o/snapshots" 2>&1 | tr '\n' ' '))"
  kill -9 "$dpid" 2>/dev/null
  wait_for "$dpid" 5
  show kill
else
  kill -9 "$victim"
  wait_for "$dpid" 60
  done_rows=$(($(grep -c '' "$tmp/kill/o/metrics.csv") - 1))
  if [ $rc -eq 1 ] && [ "$done_rows" -ge 20 ] && [ "$done_rows" -lt 50 ] && [ ! -e "$tmp/kill/o/model.safetensors" ] &&
    grep -q "rank 1 .*pid $victim) was killed by signal SIGKILL" "$tmp/kill.err"; then
    ok "kill: rank 1 killed after $done_rows epochs, dtrun exit 1 (no restart), no final weights"
  else
    fail "kill: dtrun exit $rc, $done_rows epochs done, final weights $(ls "$tmp/kill/o/model.safetensors" 2>&1)"
    show kill
  fi
  newest=$(cd "$tmp/kill/o/snapshots" && ls step-*[0-9].safetensors | tail -n 1)
  left=""
  for f in "$tmp"/kill/pid.*; do alive "$(cat "$f")" && left="$left $(cat "$f")"; done
  [ -z "$left" ] || fail "kill: workers still running:$left"
  run resume 120 "$DTRUN" --standalone --nproc-per-node 2 -- "$DTRAIN" "${tut[@]}" --resume auto --out "$tmp/kill/o"
  same=$(same_tensors "$tmp/tut/model.safetensors" "$tmp/kill/o/model.safetensors" 2>&1) && same=equal
  if [ $rc -eq 0 ] && grep -q "resumed from .*/snapshots/$newest: epoch " "$tmp/resume.out" && [ "$same" = equal ]; then
    ok "resume: from $newest, the final weights equal the uninterrupted run's bit for bit"
  else
    fail "resume: exit $rc, weights: $same; expected to resume from $newest:" \
      "$(grep -h 'resumed\|dtrain:' "$tmp/resume.out" "$tmp/resume.err" | head -n 3)"
    show resume
  fi
  if [ -s "$tmp/tut/metrics.csv" ] && cmp -s <(untimed "$tmp/tut/metrics.csv") <(untimed "$tmp/kill/o/metrics.csv"); then
    ok "resume: metrics.csv equals the uninterrupted run's (50 rows; timing columns aside)"
  else
    fail "resume: metrics.csv differs: $(diff <(untimed "$tmp/tut/metrics.csv") <(untimed "$tmp/kill/o/metrics.csv") | head -n 4)"
  fi
fi

# ---- 3: each task, world 2 against world 1 -----------------------------------------------------------
section "3 regression, multilabel, classification: ddp world 2 vs world 1, exact distributed evaluation"
tasks="regression:3 multilabel:4 classification:5"
for t in $tasks; do
  task=${t%:*} out=${t#*:}
  spec="in=20,out=$out,task=$task"
  for w in 1 2; do
    run "$task$w" 60 "$DTRUN" --standalone --nproc-per-node $w -- "$DTRAIN" train --strategy ddp --model mlp --hidden 16 \
      --data "synthetic:512,$spec" --val-data "synthetic:301,$spec,seed=9" --epochs 2 --batch-size $((32 / w)) \
      --out "$tmp/$task$w" --progress none
    [ $rc -eq 0 ] || { fail "$task world $w: exit $rc"; show "$task$w"; }
  done
  [ -s "$tmp/${task}2/summary.json" ] && [ -s "$tmp/${task}1/summary.json" ] || continue
  d=$(max_diff "$tmp/${task}1/model.safetensors" "$tmp/${task}2/model.safetensors")
  awk -v d="$d" 'BEGIN { exit !(d != "" && d < 1e-4) }' && ok "$task: world 2 weights = world 1 weights (max |diff| $d)" ||
    fail "$task: world 2 and world 1 weights differ by $d"
  pycheck "$task: world 2 validation metrics = world 1's (1e-4)" '
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
keys = [k for k in a if k.startswith("test_")]
assert len(keys) >= 2 and sorted(keys) == sorted(k for k in b if k.startswith("test_")), keys
bad = [(k, a[k], b[k]) for k in keys if not abs(a[k] - b[k]) <= 1e-4]
assert not bad, bad
print(", ".join("%s %.6f" % (k, b[k]) for k in keys))' "$tmp/${task}1/summary.json" "$tmp/${task}2/summary.json"
  # One process evaluates the 301 samples once each; the world-2 run padded one rank with a duplicate.
  "$EVALM" "$tmp/${task}2/model.safetensors" "synthetic:301,$spec,seed=9" train >"$tmp/$task.evalm" 2>&1 ||
    fail "$task: eval_metrics: $(cat "$tmp/$task.evalm")"
  pycheck "$task: world 2's validation figures = one-process eval of its weights (1e-6, 301 samples)" '
import json, sys
s = json.load(open(sys.argv[1]))
e = dict(l.split() for l in open(sys.argv[2]))
assert e["samples"] == "301", e
got = {"loss": float(e.pop("loss"))}
e.pop("samples")
got.update((k, float(v)) for k, v in e.items())
assert len(got) >= 2, got
bad = [(k, v, s["test_" + k]) for k, v in got.items() if not abs(v - s["test_" + k]) <= 1e-6]
assert not bad, bad
print(" ".join("%s %.6f" % kv for kv in got.items()))' "$tmp/${task}2/summary.json" "$tmp/$task.evalm"
  # dtrain eval itself: the same figures, rounded as it prints them.
  line=$("$DTRAIN" eval --weights "$tmp/${task}2/model.safetensors" --data "synthetic:301,$spec,seed=9" --split train 2>&1)
  m1=$(/usr/bin/python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
if s["task"] == "regression": print("rmse %.4f  mae %.4f" % (s["test_rmse"], s["test_mae"]))
elif s["task"] == "multilabel": print("auc %.4f  acc %.2f%%" % (s["test_auc"], 100 * s["test_acc"]))
else: print("top1 %.2f%%" % (100 * s["test_acc1"]))' "$tmp/${task}2/summary.json")
  if [[ "$line" == *"(301 samples): loss "*"  $m1  "* ]]; then
    ok "$task: dtrain eval prints the run's figures: $m1"
  else
    fail "$task: dtrain eval printed '$line', expected '$m1'"
  fi
done

# ---- 4: outputs per task ---------------------------------------------------------------------------
section "4 summary.json, metrics.csv and report.html per task"
for t in $tasks; do
  task=${t%:*}
  d=$tmp/${task}2
  [ -s "$d/summary.json" ] || continue
  case $task in
  regression) want=train_rmse,train_mae,test_loss,test_rmse,test_mae ;;
  multilabel) want=train_acc,test_loss,test_auc,test_acc ;;
  classification) want=train_acc1,test_loss,test_acc1 ;; # top-5 of 5 classes is always 1: not reported
  esac
  want="epoch,step,lr,train_loss,$want,epoch_seconds,train_samples_per_s"
  [ "$(head -n 1 "$d/metrics.csv")" = "$want" ] && ok "$task: metrics.csv header $want" ||
    fail "$task: metrics.csv header '$(head -n 1 "$d/metrics.csv")', expected '$want'"
done
pycheck "regression: summary.json: task, test_rmse and test_mae, no classification figures" '
import json, sys
s = json.load(open(sys.argv[1]))
assert s["task"] == "regression", s["task"]
assert 0 < s["test_mae"] <= s["test_rmse"] < 1, s
assert not any(k.startswith(("test_acc", "test_auc")) for k in s), s' "$tmp/regression2/summary.json"
pycheck "multilabel: summary.json: task, test_auc (the mean of 4 auc_per_label in [0, 1]) and test_acc" '
import json, sys
s = json.load(open(sys.argv[1]))
assert s["task"] == "multilabel", s["task"]
a = s["eval"]["auc_per_label"]
assert len(a) == 4 and all(0 <= x <= 1 for x in a), a
assert abs(sum(a) / 4 - s["test_auc"]) < 2e-6, (a, s["test_auc"])
assert 0 <= s["test_acc"] <= 1 and "test_rmse" not in s, s' "$tmp/multilabel2/summary.json"
pycheck "classification: summary.json: task, test_acc1, a 5x5 confusion over the 301 samples agreeing with per-class figures" '
import json, sys
s = json.load(open(sys.argv[1]))
assert s["task"] == "classification", s["task"]
e = s["eval"]
c, n, acc = e["confusion"], e["per_class_samples"], e["per_class_acc"]
assert len(c) == 5 and all(len(r) == 5 for r in c), c
assert sum(map(sum, c)) == 301 and sum(n) == 301, (c, n)
assert [sum(r) for r in c] == n, (c, n)
assert all(abs(c[k][k] / n[k] - acc[k]) < 1e-6 for k in range(5)), (c, acc)
assert abs(sum(c[k][k] for k in range(5)) / 301 - s["test_acc1"]) < 1e-6, s["test_acc1"]
assert "test_acc5" not in s and "test_rmse" not in s, s' "$tmp/classification2/summary.json"
check_report() { # TASK WORDS...: report.html names the words; the rest of its words are the other tasks'
  local task=$1 f=$tmp/${1}2/report.html missing=""
  shift
  for w in "$@"; do grep -qF -- ">val $w<" "$f" 2>/dev/null || missing="$missing $w"; done
  [ -z "$missing" ] && ok "$task: report.html names $*" || fail "$task: report.html lacks:$missing"
}
check_report regression RMSE MAE
check_report multilabel ROC-AUC accuracy
check_report classification top-1
if grep -qE 'ROC-AUC|top-1|accuracy' "$tmp/regression2/report.html"; then
  fail "regression: report.html speaks of accuracy:" \
    "$(grep -oE '.{40}(ROC-AUC|top-1|accuracy).{20}' "$tmp/regression2/report.html" | head -n 2)"
else
  ok "regression: report.html has no accuracy, ROC-AUC or top-1"
fi

# ---- 5: --val-fraction ------------------------------------------------------------------------------
section "5 --val-fraction 0.25 of synthetic:400"
vf=(train --model mlp --hidden 16 --data "synthetic:400,task=classification,out=10" --val-fraction 0.25 --epochs 2
  --batch-size 10 --progress none)
run vf 60 "$DTRAIN" "${vf[@]}" --out "$tmp/vf"
if [ $rc -ne 0 ]; then
  fail "--val-fraction: exit $rc"
  show vf
else
  pycheck "--val-fraction 0.25: 100 validation samples, 300 training samples (30 steps of 10 per epoch)" '
import json, sys
s = json.load(open(sys.argv[1]))
n = sum(s["eval"]["per_class_samples"])
assert n == 100, n
assert s["steps"] == 60, s["steps"]
assert "test_acc5" in s, s' "$tmp/vf/summary.json"
  steps=$(col "$tmp/vf/metrics.csv" step | tr '\n' ' ')
  [ "$steps" = "30 60 " ] || fail "--val-fraction: steps '$steps' after epochs 1 and 2, expected '30 60 '"
  grep -q 'no validation data' "$tmp/vf.out" && fail "--val-fraction: says there is no validation data"
fi

# A validation set smaller than the world: rank 1 counts no sample, yet takes part in gathering the rows
# of the multilabel evaluation (it once skipped the all-gather the other rank issued: a mismatch).
tiny=(train --strategy ddp --model linear --data "synthetic:64,in=4,out=2,task=multilabel" --epochs 1 --batch-size 8
  --val-data "synthetic:1,in=4,out=2,task=multilabel,seed=3" --progress none)
run tiny 60 "$DTRUN" --standalone --nproc-per-node 2 -- "$DTRAIN" "${tiny[@]}" --out "$tmp/tiny"
if [ $rc -ne 0 ]; then
  fail "multilabel under ddp with 1 validation sample for 2 ranks: exit $rc"
  show tiny
else
  pycheck "multilabel under ddp with 1 validation sample for 2 ranks: evaluated once, AUC undefined (one class)" '
import json, sys
s = json.load(open(sys.argv[1]))
assert s["test_auc"] is None and s["test_acc"] in (0.0, 0.5, 1.0), s' "$tmp/tiny/summary.json"
fi

# ---- 6: usage errors ----------------------------------------------------------------------------------
section "6 usage errors"
# expect CODE WANT1 WANT2 ARGS...: dtrain exits CODE with one stderr line holding both substrings.
expect() {
  local code=$1 w1=$2 w2=$3
  shift 3
  timeout -k 2 30 "$DTRAIN" "$@" >"$tmp/e.out" 2>"$tmp/e.err" </dev/null
  local got=$?
  if [ $got -eq "$code" ] && [ "$(grep -c '' "$tmp/e.err")" -eq 1 ] && grep -qF -- "$w1" "$tmp/e.err" &&
    grep -qF -- "$w2" "$tmp/e.err"; then
    ok "exit $code: $(cut -c1-150 "$tmp/e.err")"
  else
    fail "dtrain $* -> exit $got (expected $code, one line with '$w1' and '$w2'), stderr: $(cat "$tmp/e.err")"
  fi
}
never=(--out "$tmp/never" --epochs 1 --quiet)
expect 2 "fashioncnn supports classification" "regression task" train --model fashioncnn --data synthetic:64 "${never[@]}"
expect 2 "synthetic:0" "'0' is not a sample count" train --model mlp --data synthetic:0 "${never[@]}"
expect 2 "synthetic:10,foo=1" "'foo' is not a key" train --model mlp --data synthetic:10,foo=1 "${never[@]}"
expect 2 "synthetic:10,in=x" "'x' is not an input width (in)" train --model mlp --data synthetic:10,in=x "${never[@]}"
expect 2 "--pos-weight applies to multilabel" "regression task" train --model mlp --pos-weight 2 --data synthetic:64 "${never[@]}"
expect 2 "--label-smoothing applies to classification" "regression task" train --model mlp --label-smoothing 0.1 \
  --data synthetic:64 "${never[@]}"
expect 2 "--loss l1 applies to regression" "classification task" train --model mlp --loss l1 \
  --data synthetic:64,task=classification,out=3 "${never[@]}"
expect 2 "--val-fraction" "--val-data" train --model mlp --val-fraction 0.2 --val-data synthetic:10 --data synthetic:64 \
  "${never[@]}"
expect 2 "--pos-weight has 2 values" "has 3 labels" train --model mlp --pos-weight 1,2 \
  --data synthetic:64,task=multilabel,out=3 "${never[@]}"
# Validation data must fit the model trained: the same input size and targets.
expect 2 "validation data synthetic:10,in=5 has field \"x\" of shape (5)" "synthetic:64 has (20)" train --model mlp \
  --val-data synthetic:10,in=5 --data synthetic:64 "${never[@]}"
expect 2 "regression task with 1 outputs" "regression task with 3" train --model mlp --val-data synthetic:10,out=1 \
  --data synthetic:64,out=3 "${never[@]}"
expect 2 "multilabel task with 2 outputs" "multilabel task with 3" train --model mlp \
  --val-data synthetic:10,out=2,task=multilabel --data synthetic:64,out=3,task=multilabel "${never[@]}"
[ -e "$tmp/never/model.safetensors" ] && fail "a usage error trained a model"
# eval: the data must pose the task the weights were trained on.
if [ -s "$tmp/multilabel2/model.safetensors" ]; then
  expect 2 "was trained on a multilabel task" "synthetic:301,out=4 is a regression task" eval \
    --weights "$tmp/multilabel2/model.safetensors" --data synthetic:301,out=4 --split train
  expect 2 "has 3 outputs" "synthetic:301,out=1's target has 1" eval --weights "$tmp/regression2/model.safetensors" \
    --data synthetic:301,out=1 --split train
fi

# ---- 7: --loss l1, --pos-weight --------------------------------------------------------------------------
section "7 --loss l1 and --pos-weight"
run l1 60 "$DTRAIN" train --model mlp --hidden 16 --loss l1 --data synthetic:512,out=3 \
  --val-data synthetic:301,out=3,seed=9 --epochs 3 --batch-size 32 --out "$tmp/l1" --progress none
if [ $rc -ne 0 ]; then
  fail "--loss l1: exit $rc"
  show l1
else
  pycheck "--loss l1: train_loss = train_mae and test_loss = test_mae in every row, falling" '
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 3, rows
for r in rows:
    assert abs(float(r["train_loss"]) - float(r["train_mae"])) <= 1e-6, r
    assert abs(float(r["test_loss"]) - float(r["test_mae"])) <= 1e-6, r
    assert float(r["train_rmse"]) > float(r["train_mae"]), r
assert float(rows[-1]["train_loss"]) < float(rows[0]["train_loss"]), rows
print("train loss %s -> %s" % (rows[0]["train_loss"], rows[-1]["train_loss"]))' "$tmp/l1/metrics.csv"
  e=$("$EVALM" "$tmp/l1/model.safetensors" synthetic:301,out=3,seed=9 train 2>&1)
  el=$(sed -n 's/^loss //p' <<<"$e")
  sl=$(/usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["test_loss"])' "$tmp/l1/summary.json")
  awk -v a="$el" -v b="$sl" 'BEGIN { d = a - b; exit !(a != "" && d <= 1e-6 && d >= -1e-6) }' &&
    ok "--loss l1: eval takes the L1 loss from the weights' metadata (loss $el)" ||
    fail "--loss l1: eval loss '$el', the run's test loss $sl"
fi
ml=(train --model mlp --hidden 16 --data "synthetic:512,out=4,task=multilabel"
  --val-data "synthetic:301,out=4,task=multilabel,seed=9"
  --epochs 1 --batch-size 32 --progress none)
run pw0 60 "$DTRAIN" "${ml[@]}" --out "$tmp/pw0"
run pw 60 "$DTRAIN" "${ml[@]}" --pos-weight 1,2,3,4 --out "$tmp/pw"
if [ $rc -ne 0 ] || [ ! -s "$tmp/pw0/summary.json" ]; then
  fail "--pos-weight: exit $rc"
  show pw
else
  "$EVALM" "$tmp/pw/model.safetensors" synthetic:301,out=4,task=multilabel,seed=9 train >"$tmp/pw.evalm" 2>&1
  # Weights 1..4 on the positive terms: about (1 + 2.5) / 2 times the unweighted BCE near the start.
  pycheck "--pos-weight 1,2,3,4: the loss is weighted, and eval weighs it as the run did" '
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
e = dict(l.split() for l in open(sys.argv[3]))
assert b["test_loss"] > 1.4 * a["test_loss"], (a["test_loss"], b["test_loss"])
assert abs(float(e["loss"]) - b["test_loss"]) <= 1e-6, (e, b["test_loss"])
print("test loss %.4f (unweighted %.4f)" % (b["test_loss"], a["test_loss"]))' \
    "$tmp/pw0/summary.json" "$tmp/pw/summary.json" "$tmp/pw.evalm"
fi

section "done"
[ "$failures" -eq 0 ] || { echo "$failures check(s) failed" >&2; exit 1; }
echo "all checks passed"
