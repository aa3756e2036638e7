#!/usr/bin/env bash
# dtrain CLI: usage errors (exit 2, one line), runtime errors (exit 1), help, a tiny real run, eval, inspect,
# determinism and Ctrl-C or SIGTERM (exit 130/143 with metrics, weights and a snapshot written).
set -u
# Passive OpenMP waiting: spinning workers crawl on a loaded shared machine.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
DTRAIN="${DT_BUILD_DIR:?DT_BUILD_DIR must name the build directory}/dtrain"
[ -x "$DTRAIN" ] || { echo "FAIL: $DTRAIN is not built" >&2; exit 1; }
tmp=$(mktemp -d)
bg_pid=
cleanup() {
  [ -n "$bg_pid" ] && kill -9 "$bg_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# expect_exit CODE WANT_STDERR_TEXT ARGS...: exit code, exactly one stderr line, containing the text.
expect_exit() {
  local want_rc=$1 want=$2
  shift 2
  "$DTRAIN" "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
  local rc=$?
  local n
  n=$(wc -l <"$tmp/err")
  if [ "$rc" -ne "$want_rc" ]; then
    fail "dtrain $* -> exit $rc, expected $want_rc (stderr: $(cat "$tmp/err"))"
  elif [ "$n" -ne 1 ]; then
    fail "dtrain $* -> $n stderr lines, expected 1: $(cat "$tmp/err")"
  elif ! grep -qF -- "$want" "$tmp/err"; then
    fail "dtrain $* -> stderr '$(cat "$tmp/err")' lacks '$want'"
  fi
}
usage() { expect_exit 2 "$@"; }

# ---- usage errors: exit 2, one line "dtrain <cmd>: <what> (<fix>)" ---------------------
usage "dtrain train: --batch-size: 'abc' is not a positive integer (e.g. --batch-size 64)" train --batch-size abc
usage "dtrain train: --epochs: '0' is not a positive integer (e.g. --epochs 3)" train --epochs 0
usage "dtrain train: --lr: '-1' is not a positive number (e.g. --lr 0.01)" train --lr -1
usage "--lr: '1e999' is not a positive number" train --lr 1e999
usage "dtrain train: --optimizer: 'foo' is not one of sgd/adam/adamw (e.g. --optimizer adam)" train --optimizer foo
usage "--betas: '0.9' is not two numbers B1,B2 (e.g. --betas 0.9,0.999)" train --optimizer adam --betas 0.9
usage "dtrain bench scaling: unexpected argument 'stray' (put flags for dtrain train after --)" bench scaling stray
usage "dtrain tokenize: --vocab FILE is required" tokenize
usage "--betas: '0.9,1.5': both betas must be in [0, 1)" train --optimizer adam --betas 0.9,1.5
usage "--betas does not apply to --optimizer sgd" train --betas 0.9,0.999
usage "--momentum does not apply to --optimizer adam" train --optimizer adam --momentum 0.9
usage "--nesterov needs --momentum > 0 and zero --dampening" train --nesterov
usage "--nesterov needs --momentum > 0 and zero --dampening" train --momentum 0.9 --dampening 0.1 --nesterov
usage "dtrain train: unknown flag '--frobnicate' (see 'dtrain train --help')" train --frobnicate 3
usage "--epochs needs a value (e.g. --epochs 3)" train --epochs
usage "--lr given twice (give each flag once)" train --lr 0.1 --lr 0.2
usage "--model: unknown model 'nope' (known: " train --model nope
usage "--hidden: '32,,16' is not a list of positive widths" train --model mlp --hidden 32,,16
usage "--hidden: '32,-4' is not a list of positive widths" train --model mlp --hidden 32,-4
usage "--hidden applies only to --model mlp" train --hidden 32
usage "dtrain bench scaling: --hidden applies only to --model mlp or ncf" bench scaling --model fashioncnn --hidden 8
usage "--min-lr applies only to --schedule cosine" train --schedule step --min-lr 0.001
usage "--step-size and --gamma apply only to --schedule step" train --gamma 0.5
usage "--warmup-epochs and --warmup-steps conflict" train --warmup-epochs 1 --warmup-steps 5
usage "--label-smoothing: '1' is not a number in [0, 1)" train --label-smoothing 1
usage "--dropout: 'x' is not a number in [0, 1)" train --dropout x
usage "--progress: 'loud' is not one of auto/bar/plain/none" train --progress loud
usage "--threads: '-1' is not a non-negative integer" train --threads -1
usage "--seed: '-5' is not a non-negative integer" train --seed -5
usage "--limit-train: '0' is not a positive integer" train --limit-train 0
usage "--limit-pick chooses which samples --limit-train or --limit-test keep: give one of them" train --limit-pick random
usage "--limit-pick: 'some' is not one of auto/first/random" train --limit-train 10 --limit-pick some
usage "thread count 9999 is too large" train --threads 9999
DT_NUM_THREADS=abc "$DTRAIN" train --quiet 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "DT_NUM_THREADS" "$tmp/err" || fail "malformed DT_NUM_THREADS: $(cat "$tmp/err")"
usage "--normalize: '0.5,0': STD must be positive" train --normalize 0.5,0
usage "--quiet takes no value" train --quiet=yes
usage "--quiet and --progress conflict" train --quiet --progress plain
usage "warm-up of 3 epochs leaves no room for the cosine schedule" train --schedule cosine --epochs 3 --warmup-epochs 3
usage "min lr = 0.5 must not exceed the learning rate 0.01" train --schedule cosine --min-lr 0.5
usage "dtrain train: unexpected argument 'extra'" train extra
usage "dtrain: unknown command 'frobnicate' (run 'dtrain help' for the list of commands)" frobnicate
usage "dtrain eval: --weights FILE is required" eval
usage "dtrain eval: --split: 'dev' is not one of test/train" eval --weights x --split dev
usage "dtrain inspect: missing argument: FILE" inspect
usage "dtrain inspect: unexpected argument 'b'" inspect a b
usage "dtrain train: --workers applies only to --strategy dp" train --workers 2
usage "dtrain train: --bucket-cap-mb applies only to --strategy ddp" train --strategy dp --bucket-cap-mb 4
usage "dtrain train: --comm-hook: 'int8' is not one of none/bf16/fp16" train --strategy ddp --comm-hook int8
usage "dtrain eval: --workers applies only to --strategy dp" eval --weights x --workers 2
usage "dtrain recommend: --weights FILE is required" recommend --user 1
usage "dtrain recommend: --user ID is required" recommend --weights x
usage "dtrain recommend: --top: '0' is not a positive integer" recommend --weights x --user 1 --top 0
usage "dtrain help: unknown command 'nope'" help nope
"$DTRAIN" >/dev/null 2>&1
[ $? -eq 2 ] || fail "dtrain without a command should exit 2"

# ---- help: every flag of the parser, with defaults, and the DT_* tunables ------------
train_flags="--model --hidden --dropout --factors --embedding-l2 --sparse-embeddings --zero-init-residual --width --layers --hidden-size --heads --intermediate-size --init-from --data --split --normalize --augment --tta --data-workers --cache-images --skip-bad-images --vocab --text-column --text-pair-column --label-columns --label-column --max-len --no-lower-case --skip-bad-rows --limit-train --limit-test --limit-pick --epochs --batch-size
--optimizer --lr --momentum --dampening --nesterov --weight-decay --no-decay --betas --eps --schedule --step-size --gamma
--min-lr --warmup-epochs --warmup-steps --clip-grad-norm --amp --label-smoothing --loss --pos-weight --val-fraction --val-data
--threads --seed --out --progress --quiet
--strategy --workers --accumulate --backend --master --bucket-cap-mb --first-bucket-mb --grad-piece-mb --broadcast-buffers --shared-grads
--sharded-update
--find-unused-parameters --comm-hook --embedding-exchange --timeout --save-every --save-every-steps --keep --save-on-interrupt --resume
--allow-data-change --overwrite --tensorboard --tensorboard-all-ranks --log-every --trace"
eval_flags="--weights --model --hidden --width --data --split --normalize --augment --tta --vocab --text-column --text-pair-column --label-columns --label-column --max-len --no-lower-case --skip-bad-rows --batch-size --threads --limit --strategy --workers"
recommend_flags="--weights --user --top --data --json --threads"
check_help() { # command, expected flags
  local cmd=$1 want=$2
  "$DTRAIN" "$cmd" --help >"$tmp/help" 2>&1 || fail "dtrain $cmd --help exited non-zero"
  local listed
  listed=$(grep -oE '^  --[a-z0-9-]+' "$tmp/help" | sed 's/^  //' | grep -v '^--help$' | sort | tr '\n' ' ')
  local expected
  expected=$(echo $want | tr ' ' '\n' | sort | tr '\n' ' ')
  [ "$listed" = "$expected" ] || fail "dtrain $cmd --help lists [$listed], expected [$expected]"
  for t in DT_NUM_THREADS DT_DATA_DIR DT_DEBUG; do
    grep -q "$t" "$tmp/help" || fail "dtrain $cmd --help does not mention $t"
  done
  # every flag line but the booleans shows a default
  local nodef
  nodef=$(grep -E '^  --[a-z0-9-]+ [A-Z]' "$tmp/help" | grep -v '(default: ' || true)
  [ -z "$nodef" ] || fail "dtrain $cmd --help: flags without a default: $nodef"
}
check_help train "$train_flags"
check_help eval "$eval_flags"
check_help recommend "$recommend_flags"
"$DTRAIN" help train | cmp -s - <("$DTRAIN" train --help) || fail "'dtrain help train' differs from 'dtrain train --help'"
for c in train eval recommend export models inspect version help; do
  "$DTRAIN" help | grep -q "^  $c " || fail "'dtrain help' does not list $c"
done
"$DTRAIN" version | grep -qE '^dtrain [0-9]+\.[0-9]+\.[0-9]+$' || fail "dtrain version"
"$DTRAIN" models >"$tmp/models" || fail "dtrain models exited non-zero"
grep -qE '^  mlp +235146 ' "$tmp/models" || fail "dtrain models: mlp (784-256-128-10) should have 235146 parameters: $(cat "$tmp/models")"
grep -q '^  fashioncnn ' "$tmp/models" || fail "dtrain models lacks fashioncnn"
grep -qE '^  resnet18 +11689512\+ ' "$tmp/models" || fail "dtrain models: resnet18 at 3x224x224, 1000 classes, should have 11689512+ parameters: $(cat "$tmp/models")"
grep -qE '^  resnet20 +[0-9]+ ' "$tmp/models" || fail "dtrain models: resnet20 should fit 1x28x28 inputs: $(cat "$tmp/models")"
grep -qE '^  bert-mini +11171074# ' "$tmp/models" || fail "dtrain models: bert-mini at bert-base-uncased's vocabulary should have 11171074# parameters: $(cat "$tmp/models")"
usage "--zero-init-residual applies only to the resnets, not mlp" train --model mlp --zero-init-residual
usage "--heads applies only to the bert models, not mlp" train --model mlp --heads 4

# ---- runtime errors: exit 1, one line "dtrain: <detail> (<hint>)" ----------------------
expect_exit 1 "$tmp/no-such-data" train --model mlp --data "$tmp/no-such-data" --out "$tmp/o1" --quiet
# A small valid IDX set, then a truncated image file.
mkdir -p "$tmp/idx"
python3 - "$tmp/idx" <<'EOF'
import struct, sys, os
d = sys.argv[1]
for split, n in (("train", 20), ("t10k", 10)):
    with open(os.path.join(d, f"{split}-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 28, 28) + bytes((i * 7) % 256 for i in range(n * 784)))
    with open(os.path.join(d, f"{split}-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(i % 10 for i in range(n)))
EOF
"$DTRAIN" train --model mlp --hidden 8 --data "$tmp/idx" --batch-size 5 --out "$tmp/idx-run" --progress bar \
  >"$tmp/bar.out" 2>"$tmp/err" || fail "training on a valid synthetic IDX set failed: $(cat "$tmp/err")"
grep -q $'\repoch 1/1 \[#' "$tmp/bar.out" || fail "--progress bar: no updating bar line: $(od -c "$tmp/bar.out" | head)"
grep -q $'\r\033\[Kepoch 1/1  train loss' "$tmp/bar.out" || fail "--progress bar: the epoch line does not replace the bar"
# eval takes model, widths and dataset from the file's metadata
"$DTRAIN" eval --weights "$tmp/idx-run/model.safetensors" >"$tmp/eval0.out" 2>&1 || fail "eval from metadata: $(cat "$tmp/eval0.out")"
grep -q "^eval mlp on $tmp/idx test (10 samples): " "$tmp/eval0.out" || fail "eval from metadata: $(cat "$tmp/eval0.out")"
: >"$tmp/plainfile"
expect_exit 1 "$tmp/plainfile" train --model mlp --hidden 8 --data "$tmp/idx" --out "$tmp/plainfile/sub" --quiet
[ ! -e "$tmp/plainfile/sub" ] || fail "unwritable --out: something was created"
head -c 5000 "$tmp/idx/train-images-idx3-ubyte" >"$tmp/idx/cut" && mv "$tmp/idx/cut" "$tmp/idx/train-images-idx3-ubyte"
expect_exit 1 "train-images-idx3-ubyte" train --model mlp --data "$tmp/idx" --out "$tmp/o2" --quiet
grep -q '^dtrain: ' "$tmp/err" || fail "runtime error line should start with 'dtrain: ': $(cat "$tmp/err")"
expect_exit 1 "$tmp/no.safetensors" eval --weights "$tmp/no.safetensors"
printf 'not a safetensors file' >"$tmp/junk.safetensors"
expect_exit 1 "junk.safetensors" inspect "$tmp/junk.safetensors"

# ---- a tiny real run on Fashion-MNIST -----------------------------------------------------
FMNIST=/usr/share/datasets/fashion-mnist
if [ ! -f "$FMNIST/train-images-idx3-ubyte.gz" ] && [ ! -f "$FMNIST/train-images-idx3-ubyte" ]; then
  echo "fashion-mnist not found under $FMNIST: real-run checks skipped"
  [ "$failures" -eq 0 ] && exit 77
  exit 1
fi
run_args=(train --model mlp --hidden 32 --epochs 2 --limit-train 2000 --limit-test 500 --batch-size 50 --threads 2
  --seed 1 --lr 0.05 --momentum 0.9)
"$DTRAIN" "${run_args[@]}" --progress plain --out "$tmp/run" >"$tmp/run.out" 2>"$tmp/run.err" || fail "tiny run failed: $(cat "$tmp/run.err")"
csv="$tmp/run/metrics.csv"
[ "$(head -1 "$csv")" = "epoch,step,lr,train_loss,train_acc1,test_loss,test_acc1,test_acc5,epoch_seconds,train_samples_per_s" ] \
  || fail "metrics.csv header: $(head -1 "$csv")"
[ "$(wc -l <"$csv")" -eq 3 ] || fail "metrics.csv should have a header and 2 rows: $(cat "$csv")"
awk -F, 'NR > 1 && NF != 10 { bad = 1 } END { exit bad }' "$csv" || fail "metrics.csv rows need 10 columns"
[ "$(cut -d, -f1,2 "$csv" | tail -2 | tr '\n' ' ')" = "1,40 2,80 " ] || fail "metrics.csv epoch/step columns: $(cat "$csv")"
python3 - "$tmp/run/metrics.jsonl" "$tmp/run/config.json" "$tmp/run/summary.json" <<'EOF' || fail "metrics.jsonl / config.json / summary.json are not valid"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 2, rows
for r in rows:
    for k in ("epoch", "step", "lr", "train_loss", "train_acc1", "test_loss", "test_acc1", "test_acc5",
              "epoch_seconds", "train_samples_per_s"):
        assert k in r, (k, r)
    assert 0 <= r["test_acc1"] <= r["test_acc5"] <= 1
assert rows[1]["test_acc1"] > 0.55, rows  # 2 epochs on 2000 samples: far above chance (0.1)
assert rows[1]["train_loss"] < rows[0]["train_loss"], rows
cfg = json.load(open(sys.argv[2]))
assert cfg["model"] == "mlp" and cfg["hidden"] == [32] and cfg["epochs"] == 2 and cfg["batch_size"] == 50, cfg
summary = json.load(open(sys.argv[3]))
assert summary["model"] == "mlp" and summary["epochs_done"] == 2 and summary["steps"] == 80, summary
assert summary["test_acc1"] == rows[1]["test_acc1"] and summary["train_samples_per_s"] > 0, summary
EOF
[ -s "$tmp/run/model.safetensors" ] || fail "model.safetensors missing"
grep -q "^epoch 2/2  train loss .* top5 .*samples/s$" "$tmp/run.out" || fail "no epoch line: $(cat "$tmp/run.out")"
for k in "wall time" "CPU time" "train throughput" "inference throughput" "test top-1" "test top-5" "peak RSS"; do
  grep -q "  $k " "$tmp/run.out" || fail "summary lacks '$k'"
done
steps=$(grep -c "step [0-9]*/40" "$tmp/run.out")
[ "$steps" -ge 1 ] && [ "$steps" -le 18 ] || fail "plain progress: $steps step lines for 2 epochs (want 1..18)"

# eval reports the test top-1 of the last metrics row
"$DTRAIN" eval --weights "$tmp/run/model.safetensors" --limit 500 >"$tmp/eval.out" 2>&1 || fail "eval failed: $(cat "$tmp/eval.out")"
want=$(tail -1 "$csv" | awk -F, '{ printf "%.2f%%", 100 * $7 }')
got=$(grep -oE 'top1 [0-9.]+%' "$tmp/eval.out" | cut -d' ' -f2)
[ "$got" = "$want" ] || fail "eval top1 $got != last metrics row $want ($(cat "$tmp/eval.out"))"
grep -q "(500 samples)" "$tmp/eval.out" || fail "eval should use 500 samples: $(cat "$tmp/eval.out")"
expect_exit 1 "fc1.weight" eval --weights "$tmp/run/model.safetensors" \
  --hidden 16 --limit 10
grep -q "give the --model and --hidden used in training" "$tmp/err" || fail "shape mismatch hint: $(cat "$tmp/err")"

"$DTRAIN" inspect "$tmp/run/model.safetensors" >"$tmp/inspect.out" || fail "inspect failed"
grep -qE '^  fc1\.weight +f32 +\(32, 784\) +min ' "$tmp/inspect.out" || fail "inspect: no fc1.weight line: $(cat "$tmp/inspect.out")"
grep -q '^  model = mlp$' "$tmp/inspect.out" || fail "inspect: no model metadata"

# same seed twice: identical metrics except the time columns
"$DTRAIN" "${run_args[@]}" --out "$tmp/run2" --quiet >"$tmp/run2.out" 2>&1 || fail "second run failed"
[ ! -s "$tmp/run2.out" ] || fail "--quiet printed: $(cat "$tmp/run2.out")"
cmp -s <(cut -d, -f1-8 "$csv") <(cut -d, -f1-8 "$tmp/run2/metrics.csv") \
  || fail "same seed, different metrics: $(cat "$csv" "$tmp/run2/metrics.csv")"

# bench scaling: single, ddp and dp rows for 1 and 2 workers, and "indep" (two single runs at once, never
# communicating): the same seeded job as the single run, so the same top-1 (speeds are not asserted).
# On two CPUs (the first two this test may use, where it has more) dtrun binds the two ranks, and indep's runs too.
two=$(/usr/bin/python3 -c 'import os; c = sorted(os.sched_getaffinity(0)); print(*c[:2]) if len(c) > 1 else None')
on_two=()
[ -n "$two" ] && on_two=(taskset -c "${two/ /,}")
"${on_two[@]}" "$DTRAIN" bench scaling --model mlp --hidden 16 --max-workers 2 --limit-train 640 --batch-size 32 -- \
  --limit-test 200 >"$tmp/scaling.out" 2>"$tmp/scaling.err" || fail "bench scaling failed: $(tail -3 "$tmp/scaling.err")"
top1() { awk -v s="$1" -v w="$2" '$1 == s && $2 == w { print $(NF - 1) }' "$tmp/scaling.out"; }
sps() { awk -v s="$1" -v w="$2" '$1 == s && $2 == w { print $4 }' "$tmp/scaling.out"; }
[ -n "$(top1 indep 2)" ] && [ "$(top1 indep 2)" = "$(top1 single 1)" ] ||
  fail "bench scaling: indep x2 top-1 '$(top1 indep 2)' vs single '$(top1 single 1)': $(cat "$tmp/scaling.out")"
for row in "ddp 1" "dp 1" "ddp 2" "dp 2"; do
  [ -n "$(sps $row)" ] || fail "bench scaling: no '$row' row: $(cat "$tmp/scaling.out")"
done
[ -n "$(sps indep 2)" ] || fail "bench scaling: no 'indep 2' row: $(cat "$tmp/scaling.out")"
# one round: ddp's and dp's samples/s over indep's, as the rows give them (rounded to whole samples/s, so within
# 0.01), the round's ratio and the median alike
vs=$(grep "^# against indep x2 in the same round:" "$tmp/scaling.out")
for s in ddp dp; do
  want=$(awk -v a="$(sps $s 2)" -v b="$(sps indep 2)" 'BEGIN { printf "%.2f", a / b }')
  got=$(echo "${vs#*:}" | tr ';' '\n' | awk -v s=$s '$1 == s && $2 == "x2" { sub(",", "", $3); print $3, $5 }')
  echo "$got" | awk -v w="$want" '{ exit !(NF == 2 && $1 - w <= 0.0101 && w - $1 <= 0.0101 && $1 == $2) }' ||
    fail "bench scaling: $s x2 against indep x2 reads '$got', the rows give $want: $vs"
done
# indep's two runs, each figure on the progress line (bound as dtrun binds two workers: on 2 CPUs, one each), and
# the line against twice the slower one's samples/s
runs=$(sed -n 's/^bench scaling: indep x2 \.\.\. (\(.*\)) = \([0-9]*\) samples\/s$/\1 = \2/p' "$tmp/scaling.err")
if [ -n "$two" ]; then
  set -- $two
  [[ "$runs" =~ ^[0-9]+\ on\ cpu\ $1\ \+\ [0-9]+\ on\ cpu\ $2\ = ]] ||
    fail "bench scaling on CPUs $1 and $2: indep's runs not one on each: '$runs' ($(grep 'indep x2' "$tmp/scaling.err"))"
else
  [[ "$runs" =~ ^[0-9]+\ \+\ [0-9]+\ = ]] || fail "bench scaling on one CPU: indep's runs bound: '$runs'"
fi
lock=$(grep "^# against 2 x the slowest of indep x2's runs in the same round" "$tmp/scaling.out")
for s in ddp dp; do
  got=$(echo "${lock#*pace):}" | tr ';' '\n' | awk -v s=$s '$1 == s && $2 == "x2" { sub(",", "", $3); print $3 }')
  echo "$runs" | awk -v got="$got" -v r="$(sps $s 2)" -v sum="$(sps indep 2)" '{
    a = $1; b = ($2 == "on") ? $6 : $3; t = $NF; lo = a < b ? a : b; want = r / (2 * lo)
    exit !(got != "" && got - want <= 0.0101 && want - got <= 0.0101 && a + b - t <= 1 && t - a - b <= 1 &&
           t - sum <= 1 && sum - t <= 1) }' ||
    fail "bench scaling: $s x2 against twice indep's slower run reads '$got'; runs '$runs', $s x2 $(sps $s 2): $lock"
done
# the round closes with a second single run; every other row over the mean of single's two (rows rounded to whole
# samples/s, so within 0.01)
[ "$(grep -c '^bench scaling: single x1 \.\.\. [0-9]* samples/s$' "$tmp/scaling.err")" = 2 ] ||
  fail "bench scaling: single did not run twice: $(cat "$tmp/scaling.err")"
end=$(sed -n 's/^# single at the end of each round: \([0-9]*\)$/\1/p' "$tmp/scaling.out")
[ -n "$end" ] || fail "bench scaling: no line of single at the round's end: $(cat "$tmp/scaling.out")"
vs1=$(grep "^# against single in the same round (the mean of its runs at the round's start and end):" "$tmp/scaling.out")
for row in "ddp 1" "dp 1" "ddp 2" "dp 2" "indep 2"; do
  set -- $row
  got=$(echo "${vs1#*end):}" | tr ';' '\n' | awk -v s=$1 -v w=x$2 '$1 == s && $2 == w { sub(",", "", $3); print $3, $5 }')
  echo "$got" | awk -v r="$(sps $1 $2)" -v a="$(sps single 1)" -v b="$end" '{ want = r / ((a + b) / 2)
    exit !(NF == 2 && $1 - want <= 0.0101 && want - $1 <= 0.0101 && $1 == $2) }' ||
    fail "bench scaling: $row against single reads '$got'; single $(sps single 1) and $end, $row $(sps $1 $2): $vs1"
done
grep -qE "^# CPU: .*; avx2[+-] .*; [0-9]+ online CPUs" "$tmp/scaling.out" ||
  fail "bench scaling: no '# CPU:' line: $(head -3 "$tmp/scaling.out")"
for when in start end; do
  grep -qE "^# CPU speed at the $when \(f32 GEMM 256x256x256 by .*, GFLOP/s\): (cpu[0-9]+|[0-9]+ CPUs: slowest cpu[0-9]+) [0-9]+" \
    "$tmp/scaling.out" ||
    fail "bench scaling: no '# CPU speed at the $when' line: $(cat "$tmp/scaling.out")"
done

# --reps: four rounds; each row is the round with its median samples/s (of the even count the lower middle one,
# single's the upper one), every round listed at the end; the speedup is over single's; nothing is left in TMPDIR
mkdir "$tmp/reps.tmp"
TMPDIR="$tmp/reps.tmp" "$DTRAIN" bench scaling --model mlp --hidden 16 --max-workers 2 --limit-train 320 --batch-size 32 \
  --reps 4 -- --limit-test 100 >"$tmp/reps.out" 2>"$tmp/reps.err" ||
  fail "bench scaling --reps 4 failed: $(tail -3 "$tmp/reps.err")"
[ "$(grep -c "^bench scaling: round [1234] of 4" "$tmp/reps.err")" = 4 ] || fail "bench scaling --reps 4: $(cat "$tmp/reps.err")"
[ -z "$(ls -A "$tmp/reps.tmp")" ] || fail "bench scaling --reps 4 left $(ls -A "$tmp/reps.tmp") in TMPDIR"
rounds=$(grep "^# train samples/s round by round:" "$tmp/reps.out") || fail "bench scaling --reps: no rounds line: $(cat "$tmp/reps.out")"
# median_of STRATEGY WORKERS NTH: the NTH smallest of the row's four rounds
median_of() {
  echo "${rounds#*:}" | tr ';' '\n' | awk -v s="$1" -v w="x$2" '$1 == s && $2 == w { print $3; print $4; print $5; print $6 }' |
    sort -n | sed -n "$3p"
}
for row in "single 1 3" "ddp 1 2" "dp 1 2"; do
  set -- $row
  shown=$(awk -v s="$1" -v w="$2" '$1 == s && $2 == w { print $4 }' "$tmp/reps.out")
  [ -n "$shown" ] && [ "$shown" = "$(median_of "$1" "$2" "$3")" ] || fail "bench scaling --reps 4: row '$row' shows '$shown', rounds: $rounds"
done
# the row's speedup is over single's row: the same ratio as the printed rows', which are rounded to whole
# samples/s, so the two may differ in the last of the speedup's two decimals
speedup=$(awk '$1 == "dp" && $2 == 1 { print $6 }' "$tmp/reps.out")
want=$(awk -v a="$(median_of dp 1 2)" -v b="$(median_of single 1 3)" 'BEGIN { printf "%.2fx", a / b }')
awk -v s="${speedup%x}" -v w="${want%x}" 'BEGIN { d = s - w; exit !(s != "" && d <= 0.0101 && d >= -0.0101) }' ||
  fail "bench scaling --reps 4: dp x1 speedup '$speedup', the rows give '$want'"
# against indep in the same round: each round's ratio from the rounds line, and their median, the lower middle
# one (within 0.01: the rounds line gives whole samples/s)
vs=$(grep "^# against indep x2 in the same round:" "$tmp/reps.out")
for s in ddp dp; do
  got=$(echo "${vs#*:}" | tr ';' '\n' | awk -v s=$s '$1 == s && $2 == "x2" { sub(",", "", $6); print $3, $4, $5, $6, $8 }')
  echo "${rounds#*:}" | tr ';' '\n' | awk -v s=$s -v got="$got" '$1 == s && $2 == "x2" { a = $3 " " $4 " " $5 " " $6 }
    $1 == "indep" && $2 == "x2" { b = $3 " " $4 " " $5 " " $6 }
    function near(x, y) { return x - y <= 0.0101 && y - x <= 0.0101 }
    END { split(a, x); split(b, y); n = split(got, g); ok = n == 5
      for (i = 1; i <= 4; i++) { r[i] = x[i] / y[i]; ok = ok && near(g[i], r[i]) }
      for (i = 1; i <= 4; i++) for (j = 1; j < 4; j++) if (r[j] > r[j + 1]) { t = r[j]; r[j] = r[j + 1]; r[j + 1] = t }
      exit !(ok && near(g[5], r[2])) }' ||
    fail "bench scaling --reps 4: $s x2 against indep x2 reads '$got', the rounds: $rounds"
done
# against single in the same round: each round's ratio over the mean of single's runs at its start (the rounds
# line) and end (its own line), and their median, the lower middle one
[ "$(grep -c '^bench scaling: single x1 \.\.\. [0-9]* samples/s$' "$tmp/reps.err")" = 8 ] ||
  fail "bench scaling --reps 4: single did not run twice a round: $(cat "$tmp/reps.err")"
ends=$(sed -n 's/^# single at the end of each round: //p' "$tmp/reps.out")
vs1=$(grep "^# against single in the same round (the mean of its runs at the round's start and end):" "$tmp/reps.out")
got=$(echo "${vs1#*end):}" | tr ';' '\n' | awk '$1 == "dp" && $2 == "x2" { sub(",", "", $6); print $3, $4, $5, $6, $8 }')
echo "${rounds#*:}" | tr ';' '\n' | awk -v got="$got" -v ends="$ends" '$1 == "dp" && $2 == "x2" { a = $3 " " $4 " " $5 " " $6 }
  $1 == "single" && $2 == "x1" { b = $3 " " $4 " " $5 " " $6 }
  function near(x, y) { return x - y <= 0.0101 && y - x <= 0.0101 }
  END { split(a, x); split(b, y); n = split(got, g); ok = n == 5 && split(ends, e) == 4
    for (i = 1; i <= 4; i++) { r[i] = x[i] / ((y[i] + e[i]) / 2); ok = ok && near(g[i], r[i]) }
    for (i = 1; i <= 4; i++) for (j = 1; j < 4; j++) if (r[j] > r[j + 1]) { t = r[j]; r[j] = r[j + 1]; r[j + 1] = t }
    exit !(ok && near(g[5], r[2])) }' ||
  fail "bench scaling --reps 4: dp x2 against single reads '$got', single at the ends '$ends', the rounds: $rounds"
usage "dtrain bench scaling: --reps 65: at most 64 rounds (e.g. --reps 5)" bench scaling --reps 65

# --skip-epochs: train samples/s over the later epochs (each run's metrics.jsonl), said in a header line; it must
# leave an epoch
"$DTRAIN" bench scaling --model mlp --hidden 16 --max-workers 1 --limit-train 320 --batch-size 32 --epochs 2 \
  --skip-epochs 1 -- --limit-test 100 >"$tmp/skip.out" 2>"$tmp/skip.err" ||
  fail "bench scaling --skip-epochs 1 failed: $(tail -3 "$tmp/skip.err")"
grep -q "^# train samples/s over the epochs after the first 1 of 2 (--skip-epochs" "$tmp/skip.out" ||
  fail "bench scaling --skip-epochs: no header line: $(head -3 "$tmp/skip.out")"
for row in "single 1" "ddp 1" "dp 1"; do
  set -- $row
  awk -v s="$1" -v w="$2" '$1 == s && $2 == w && $4 > 0 { found = 1 } END { exit !found }' "$tmp/skip.out" ||
    fail "bench scaling --skip-epochs: no '$row' row: $(cat "$tmp/skip.out")"
done
usage "dtrain bench scaling: --skip-epochs 1 leaves no epoch of 1 (e.g. --epochs 2 --skip-epochs 1)" bench scaling \
  --skip-epochs 1
usage "dtrain bench scaling: --skip-epochs 3 leaves no epoch of 2 (e.g. --epochs 2 --skip-epochs 1)" bench scaling \
  --epochs 2 --skip-epochs 3

# Ctrl-C: stops at a step boundary, writes metrics and weights, exits 130
"$DTRAIN" train --model mlp --hidden 32 --epochs 1000 --batch-size 50 --limit-train 2000 --limit-test 200 \
  --threads 2 --out "$tmp/int" --progress none >"$tmp/int.out" 2>"$tmp/int.err" &
bg_pid=$!
for _ in $(seq 200); do # until the first epoch row is there (at most 20 s)
  [ -f "$tmp/int/metrics.csv" ] && [ "$(wc -l <"$tmp/int/metrics.csv")" -ge 2 ] && break
  sleep 0.1
done
# No thread of the run may take the signal with a handler: the kernel would write the signal frame below a
# compute thread's stack pointer, which oneDNN's sgemm points into the heap. Every thread blocks SIGINT and
# SIGTERM (bits 1 and 14 of SigBlk) but "dt-signals", which takes them with sigwait (the kernel unblocks the
# signals it waits for while it waits).
# OpenBLAS's pthread build would start its workers when it loads, before any mask is set (make deps installs the
# OpenMP build, which starts none): with it the masks are not checked.
if ldd "$DTRAIN" 2>/dev/null | grep -q openblas-pthread; then
  echo "note: dtrain loads OpenBLAS's pthread build: thread signal masks not checked"
else
  n_threads=0 n_taker=0
  for t in /proc/"$bg_pid"/task/*; do
    blk=$(sed -n 's/^SigBlk:[[:space:]]*//p' "$t/status" 2>/dev/null) || continue
    [ -n "$blk" ] || continue
    n_threads=$((n_threads + 1))
    if [ "$(cat "$t/comm" 2>/dev/null)" = dt-signals ]; then
      n_taker=$((n_taker + 1))
    elif [ $((0x$blk & 0x4002)) -ne $((0x4002)) ]; then
      fail "SIGINT/SIGTERM not blocked in thread $t ($(cat "$t/comm" 2>/dev/null), SigBlk $blk)"
    fi
  done
  [ "$n_taker" -eq 1 ] || fail "expected one dt-signals thread, saw $n_taker"
  [ "$n_threads" -ge 3 ] || fail "expected the main, signal and compute threads, saw $n_threads"
fi
kill -INT "$bg_pid"
for _ in $(seq 200); do kill -0 "$bg_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$bg_pid" 2>/dev/null; then
  fail "dtrain did not stop within 20 s of SIGINT"
  kill -9 "$bg_pid"
fi
wait "$bg_pid"
rc=$?
bg_pid=
[ "$rc" -eq 130 ] || fail "SIGINT: exit $rc, expected 130 ($(cat "$tmp/int.err"))"
[ "$(wc -l <"$tmp/int/metrics.csv")" -ge 2 ] || fail "SIGINT: metrics.csv has no rows"
[ -s "$tmp/int/model.safetensors" ] || fail "SIGINT: no weights written"
grep -q "interrupted" "$tmp/int.err" || fail "SIGINT: no note on stderr: $(cat "$tmp/int.err")"

# A second Ctrl-C ends the run at once: no weights, no note. It is sent once the first has been taken (two
# signals pending at once merge into one); the first comes once epoch 2's training has made progress (a progress
# line; stopped before an epoch's first step, a run has nothing to evaluate and ends at once, which lost this
# test the race under load), and the stop's evaluation of 10,000 samples by a convolutional model outlasts the
# moments between the two signals by far.
"$DTRAIN" train --model fashioncnn --epochs 1000 --batch-size 50 --limit-train 10000 --limit-test 10000 \
  --threads 2 --out "$tmp/int2" --progress plain >"$tmp/int2.out" 2>"$tmp/int2.err" &
bg_pid=$!
for _ in $(seq 300); do
  grep -q "^epoch 2/1000  step" "$tmp/int2.out" && break
  sleep 0.1
done
kill -INT "$bg_pid"
for _ in $(seq 50); do # until the signal thread has taken it (no SIGINT pending for the process: ShdPnd bit 1)
  pnd=$(sed -n 's/^ShdPnd:[[:space:]]*//p' /proc/"$bg_pid"/status 2>/dev/null)
  [ -n "$pnd" ] && [ $((0x$pnd & 2)) -eq 0 ] && break
  sleep 0.1
done
kill -INT "$bg_pid"
for _ in $(seq 200); do kill -0 "$bg_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$bg_pid" 2>/dev/null && { fail "dtrain did not end within 20 s of a second SIGINT"; kill -9 "$bg_pid"; }
wait "$bg_pid"
rc=$?
bg_pid=
[ "$rc" -eq 130 ] || fail "second SIGINT: exit $rc, expected 130 (killed by SIGINT)"
if grep -q "interrupted after" "$tmp/int2.err" || [ -e "$tmp/int2/model.safetensors" ]; then
  fail "second SIGINT: the run stopped gracefully instead of ending at once: $(cat "$tmp/int2.err")"
fi

# The banner names who multiplies f32 matrices: DT_SGEMM=openblas gives OpenBLAS and the kernels
# OPENBLAS_CORETYPE forces; onednn (in a build with oneDNN) oneDNN's sgemm; a bad value is refused.
sgemm_name() { # prints the "(X)" after "thread(s)" in the banner of a tiny run
  env "$@" "$DTRAIN" train --model mlp --hidden 8 --limit-train 64 --limit-test 64 --out "$tmp/blas" --overwrite \
    --progress none 2>/dev/null | sed -n 's/.*thread(s) (\([^)]*\)).*/\1/p'
}
[ "$(sgemm_name DT_SGEMM=openblas OPENBLAS_CORETYPE=Haswell)" = "OpenBLAS Haswell" ] ||
  fail "banner does not show DT_SGEMM=openblas OPENBLAS_CORETYPE=Haswell"
[ -n "$(sgemm_name -u DT_SGEMM)" ] || fail "banner does not name the sgemm in use"
case "$(sgemm_name DT_SGEMM=onednn)" in
"oneDNN sgemm") ;;
"") DT_SGEMM=onednn "$DTRAIN" train --model mlp --limit-train 64 --out "$tmp/blas1" 2>&1 |
  grep -q "this build has no oneDNN" || fail "DT_SGEMM=onednn: neither oneDNN's banner nor a clear refusal" ;;
*) fail "banner under DT_SGEMM=onednn: $(sgemm_name DT_SGEMM=onednn)" ;;
esac
if DT_SGEMM=mkl "$DTRAIN" train --model mlp --limit-train 64 --out "$tmp/blas2" >"$tmp/sg.out" 2>"$tmp/sg.err"; then
  fail "DT_SGEMM=mkl accepted"
fi
grep -q "DT_SGEMM=mkl: expected auto, openblas or onednn" "$tmp/sg.err" || fail "DT_SGEMM=mkl: $(cat "$tmp/sg.err")"
DT_SGEMM=mkl "$DTRAIN" eval --model mlp --weights "$tmp/blas/model.safetensors" >/dev/null 2>"$tmp/sg2.err" &&
  fail "DT_SGEMM=mkl accepted by eval"
grep -q "DT_SGEMM=mkl: expected" "$tmp/sg2.err" || fail "eval under DT_SGEMM=mkl: $(cat "$tmp/sg2.err")"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all CLI checks passed"
