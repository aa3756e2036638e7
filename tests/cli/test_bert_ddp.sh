#!/usr/bin/env bash
# The bert models trained data-parallel on synthetic token sequences (synthetic:N,tokens=V,len=L: lengths vary,
# so every batch packs a different number of tokens), a 2-layer bert (hidden 32, 2 heads), AdamW, 2 epochs:
#  1. without dropout, ddp world 2 (--batch-size 8 per rank) gives world 1's weights (--batch-size 16), and
#     dp --workers 2 gives one process's (single), within 1e-5;
#  2. with dropout (attention probabilities included): a run resumed from a mid-epoch snapshot ends with the
#     uninterrupted run's weights bit for bit (every dropout mask is drawn again from the restored streams),
#     and its weights are not the dropout-free run's;
#  3. dtrain eval of the saved weights (dims from the metadata) reports training's final test loss;
#  4. export --format hf writes BertConfig's fields (sizes from the weights and the preset, num_labels, problem_type),
#     and --init-from that directory starts a run from exactly those weights (lr 1e-30 leaves their bits).
# A few seconds in all (--threads 1).
set -u
b=${DT_BUILD_DIR:?DT_BUILD_DIR must name the build directory}
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
export DT_BUILD_DIR=$b
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export DT_TIMEOUT=60
export DT_NUM_THREADS=1
DTRAIN=$b/dtrain
DTRUN=$b/dtrun
. "$SRC/tests/cli/common.sh" # fail, ok, section, max_diff, same_tensors, use_tmp
for x in "$DTRAIN" "$DTRUN"; do [ -x "$x" ] || { echo "FAIL: $x is not built" >&2; exit 1; }; done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT OMPI_COMM_WORLD_RANK PMI_RANK SLURM_PROCID
unset OMPI_COMM_WORLD_SIZE SLURM_STEP_NUM_TASKS # they decide whether a train without --strategy runs

use_tmp
DATA=synthetic:192,tokens=100,len=16,task=classification,out=3,seed=4
# train NAME WORLD|dp:N|single ARGS...: EPOCHS (default 2) epochs into $tmp/NAME
train() {
  local name=$1 how=$2
  shift 2
  local args=(train --model bert-tiny --layers 2 --hidden-size 32 --heads 2 --intermediate-size 48 --data "$DATA"
    --val-fraction 0.25 --threads 1 --progress none --epochs "${EPOCHS:-2}" --optimizer adamw --lr "${LR:-0.003}"
    --out "$tmp/$name" "$@")
  case $how in
  single) run_ok "$name" 60 "$DTRAIN" "${args[@]}" ;;
  dp:*) run_ok "$name" 60 "$DTRAIN" "${args[@]}" --strategy dp --workers "${how#dp:}" ;;
  *) run_ok "$name" 60 "$DTRUN" --standalone --nproc-per-node "$how" -- "$DTRAIN" "${args[@]}" --strategy ddp ;;
  esac
}
section "1 no dropout: ddp world 2 vs world 1, dp --workers 2 vs single"
train w1 1 --dropout 0 --batch-size 16
train w2 2 --dropout 0 --batch-size 8
same_weights "bert: ddp world 2 = world 1" w1 w2
train single single --dropout 0 --batch-size 16
train dp2 dp:2 --dropout 0 --batch-size 16
same_weights "bert: dp --workers 2 = single" single dp2

section "2 dropout 0.1: resumed mid-epoch = uninterrupted, bit for bit"
train whole single --dropout 0.1 --batch-size 16
# 144 training samples in batches of 16: 9 steps an epoch; a snapshot every 4 steps, the first run stops after 1
EPOCHS=1 train part single --dropout 0.1 --batch-size 16 --save-every-steps 4
train part single --dropout 0.1 --batch-size 16 --save-every-steps 4 \
  --resume "$tmp/part/snapshots/step-000000008.safetensors"
same_tensors "$tmp/whole/model.safetensors" "$tmp/part/model.safetensors" >"$tmp/rs.diff" 2>&1 &&
  ok "resumed at step 8 (mid-epoch 1) = uninterrupted" || fail "resumed run differs: $(head -n 2 "$tmp/rs.diff")"
d=$(max_diff "$tmp/whole/model.safetensors" "$tmp/single/model.safetensors")
awk -v d="$d" 'BEGIN { exit !(d != "" && d > 1e-4) }' && ok "dropout changes the weights (max |diff| $d)" ||
  fail "dropout 0.1 and 0 give the same weights ($d): the check above cannot tell"

section "3 eval of the weights reports training's final test loss"
run_ok eval 60 "$DTRAIN" eval --weights "$tmp/whole/model.safetensors" --split test --threads 1
want=$(/usr/bin/python3 -c 'import json,sys; print("%.4f" % json.load(open(sys.argv[1]))["test_loss"])' "$tmp/whole/summary.json" 2>/dev/null)
got=$(grep -oE "loss [0-9.]+" "$tmp/eval.out" | head -1 | cut -d' ' -f2)
[ -n "$want" ] && [ "$want" = "$got" ] && ok "eval loss $got = training's $want" || { fail "eval loss '$got', training's '$want'"; show eval; }

section "4 export --format hf, then --init-from it"
run_ok export 60 "$DTRAIN" export "$tmp/whole/model.safetensors" "$tmp/hf" --format hf
/usr/bin/python3 - "$tmp/hf/config.json" >"$tmp/cfg.out" 2>&1 <<'PY' && ok "config.json: $(cat "$tmp/cfg.out")" || fail "config.json: $(cat "$tmp/cfg.out")"
import json, sys
c = json.load(open(sys.argv[1]))
want = {"architectures": ["BertForSequenceClassification"], "model_type": "bert", "vocab_size": 100, "hidden_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 48, "num_labels": 3,
        "problem_type": "single_label_classification", "hidden_act": "gelu", "layer_norm_eps": 1e-12,
        "max_position_embeddings": 512, "type_vocab_size": 2, "pad_token_id": 0, "hidden_dropout_prob": 0.1}
bad = {k: (c.get(k), v) for k, v in want.items() if c.get(k) != v}
print("BertConfig fields as trained" if not bad else "differs (got, want): %s" % bad)
sys.exit(1 if bad else 0)
PY
EPOCHS=1 LR=1e-30 train init single --dropout 0 --batch-size 16 --init-from "$tmp/hf"
d=$(max_diff "$tmp/hf/model.safetensors" "$tmp/init/model.safetensors")
awk -v d="$d" 'BEGIN { exit !(d != "" && d + 0 == 0) }' &&
  ok "--init-from the export: the run starts from its weights (max |diff| $d)" ||
  fail "--init-from the export: weights differ by '$d'"

section "done"
[ "$failures" -eq 0 ] || { echo "$failures check(s) failed" >&2; exit 1; }
echo "all checks passed"
