#!/usr/bin/env bash
# dtrain train on text data (.csv/.tsv): wrong use of the text flags is one usage line (exit 2) naming what to
# give (a missing column lists the header's columns); a malformed row stops the run naming file:line unless
# --skip-bad-rows leaves it out; every text flag is in --help of train and eval and in README.md.
set -u
b=${DT_BUILD_DIR:?DT_BUILD_DIR must name the build directory}
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export DT_NUM_THREADS=1
DTRAIN=$b/dtrain
. "$SRC/tests/cli/common.sh" # fail, ok, section, run, show
[ -x "$DTRAIN" ] || { echo "FAIL: $DTRAIN is not built" >&2; exit 1; }

use_tmp
printf '[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\ngood\nbad\n' >"$tmp/vocab.txt"
printf 'comment,toxic,insult,class\n"hello\nworld",0.9,0,pos\ngood,0.1,1,neg\nbad,x,1,neg\n' >"$tmp/c.csv"
V=$tmp/vocab.txt

expect() { # CODE EXPECTED-SUBSTRING ARGS...: dtrain exits CODE with one stderr line holding the substring
  local code=$1 want=$2
  shift 2
  "$DTRAIN" "$@" >"$tmp/e.out" 2>"$tmp/e.err" </dev/null
  local got=$?
  if [ $got -eq "$code" ] && [ "$(wc -l <"$tmp/e.err")" -eq 1 ] && grep -qF -- "$want" "$tmp/e.err"; then
    ok "exit $code: $want"
  else
    fail "$* -> exit $got (expected $code), stderr: $(cat "$tmp/e.err")"
  fi
}
usage() { expect 2 "$@"; }

section "usage errors"
T=(--out "$tmp/never" --progress none --val-fraction 0.5)
usage 'no column "coment"; its header has: comment, toxic, insult, class' \
  train --data "$tmp/c.csv" --vocab "$V" --text-column coment --label-columns toxic "${T[@]}"
usage 'no column "insolt"; its header has: comment, toxic, insult, class' \
  train --data "$tmp/c.csv" --vocab "$V" --text-column comment --label-columns toxic,insolt "${T[@]}"
usage "--label-column (one column of classes) and --label-columns (0/1 labels): give one" \
  train --data "$tmp/c.csv" --vocab "$V" --text-column comment --label-columns toxic --label-column class "${T[@]}"
usage "text data needs a WordPiece vocabulary: --vocab FILE" \
  train --data "$tmp/c.csv" --text-column comment --label-column class "${T[@]}"
usage "name the column holding the text with --text-column NAME" \
  train --data "$tmp/c.csv" --vocab "$V" --label-column class "${T[@]}"
usage "name the targets: --label-column NAME" train --data "$tmp/c.csv" --vocab "$V" --text-column comment "${T[@]}"
usage "--vocab applies to text data (a .csv or .tsv file, or text:PATH), not synthetic:64" \
  train --data synthetic:64 --vocab "$V" "${T[@]}"
usage "--max-len: '2' is not an integer in [3, 8192]" train --data "$tmp/c.csv" --max-len 2 "${T[@]}"
usage "--skip-bad-rows applies to text data" eval --weights "$tmp/w.safetensors" --data synthetic:8 --skip-bad-rows

section "a malformed row: an error naming file:line, or left out with --skip-bad-rows"
expect 1 "c.csv:5: label toxic is 'x', not a number" \
  train --data "$tmp/c.csv" --vocab "$V" --text-column comment --label-columns toxic,insult --model mlp "${T[@]}"
# With the row left out the data opens; mlp then refuses token ids (a model for text is the bert model's work).
"$DTRAIN" train --data "$tmp/c.csv" --vocab "$V" --text-column comment --label-columns toxic,insult --model mlp \
  --skip-bad-rows "${T[@]}" >"$tmp/s.out" 2>"$tmp/s.err" </dev/null
grep -qF "left out 1 malformed rows of 3; the first:" "$tmp/s.err" && grep -qF "c.csv:5:" "$tmp/s.err" &&
  grep -qF "model mlp reads f32 inputs" "$tmp/s.err" && ok "--skip-bad-rows: 1 row left out, named" ||
  fail "--skip-bad-rows: $(cat "$tmp/s.err")"
# named classes need no --label-columns rows to be numbers
"$DTRAIN" train --data "text:$tmp/c.csv" --vocab "$V" --text-column comment --label-column class --model mlp \
  "${T[@]}" >"$tmp/n.out" 2>"$tmp/n.err" </dev/null
grep -qF "model mlp reads f32 inputs" "$tmp/n.err" && ok "text:PATH with named classes opens" ||
  fail "text:PATH --label-column class: $(cat "$tmp/n.err")"

section "--val-data: classes numbered as the training file numbers them"
printf 'comment,class\ngood,pos\n' >"$tmp/v_ok.csv"     # only "pos": index 1 of training's neg,pos
printf 'comment,class\ngood,pos\nbad,meh\n' >"$tmp/v_bad.csv"
V2=(--data "$tmp/c.csv" --vocab "$V" --text-column comment --label-column class --model mlp --out "$tmp/never"
  --progress none)
"$DTRAIN" train "${V2[@]}" --val-data "$tmp/v_ok.csv" >"$tmp/v1.out" 2>"$tmp/v1.err" </dev/null
grep -qF "model mlp reads f32 inputs" "$tmp/v1.err" && ok "--val-data with a subset of the classes opens" ||
  fail "--val-data v_ok.csv: $(cat "$tmp/v1.err")"
"$DTRAIN" train "${V2[@]}" --val-data "$tmp/v_bad.csv" >"$tmp/v2.out" 2>"$tmp/v2.err" </dev/null
grep -qF "v_bad.csv:3: class 'meh' (column class) is not one of training's 2 classes (neg,pos)" "$tmp/v2.err" &&
  ok "--val-data with a class training lacks: named" || fail "--val-data v_bad.csv: $(cat "$tmp/v2.err")"

section "documentation"
before=$failures
for f in --vocab --text-column --text-pair-column --label-columns --label-column --max-len --no-lower-case \
  --skip-bad-rows; do
  for cmd in train eval; do
    "$DTRAIN" "$cmd" --help | grep -qF -- "$f " || fail "$cmd --help does not document $f"
  done
  grep -qF -- "\`$f" "$SRC/README.md" || fail "README does not document $f"
done
[ "$failures" = "$before" ] && ok "help and README document the text flags"

[ "$failures" = 0 ] || { echo "$failures failure(s)" >&2; exit 1; }
echo "all text data checks passed"
