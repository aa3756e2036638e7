#!/usr/bin/env bash
# Recommendation end to end on a tiny MovieLens directory (8 users, 10 movies, 55 ratings, titles with quotes,
# a comma and a backslash): mf trained on the default random split, then
#  1. eval rebuilds training's held-out part: its RMSE and MAE are summary.json's last test ones, --split
#     train is the rest; ratings with an extra user, or other user ids, are refused naming the weights;
#  2. recommend: K rows, never a movie the user rated, titles and genres from movies.csv, best first with
#     equal scores by lower movieId; --json is one JSON object with the same items and escaped titles;
#  3. errors: an unknown user (exit 1, one line), --top 0 / --top abc / no --user (exit 2), weights of a
#     model without user and item ids (exit 2).
set -u
b=${DT_BUILD_DIR:?DT_BUILD_DIR must name the build directory}
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export DT_NUM_THREADS=1
DTRAIN=$b/dtrain
. "$SRC/tests/cli/common.sh" # fail, ok, section, use_tmp
[ -x "$DTRAIN" ] || { echo "FAIL: $DTRAIN is not built" >&2; exit 1; }
use_tmp

# pycheck MESSAGE PYTHON ARGS...: ok MESSAGE when the Python snippet exits 0, else fail with what it printed.
pycheck() {
  local msg=$1 code=$2 out
  shift 2
  if out=$(/usr/bin/python3 -c "$code" "$@" 2>&1); then ok "$msg${out:+: $out}"; else fail "$msg: $(tail -n 1 <<<"$out")"; fi
}
# expect NAME RC REGEX: the run NAME exited RC and printed one line on stderr matching REGEX.
expect() {
  if [ "$rc" -eq "$2" ] && [ "$(wc -l <"$tmp/$1.err")" -eq 1 ] && grep -qE -- "$3" "$tmp/$1.err"; then
    ok "$1: exit $rc, $(cat "$tmp/$1.err")"
  else
    fail "$1: exit $rc (expected $2 and one line matching '$3')"
    show "$1"
  fi
}

section "data and training"
ml=$tmp/ml
mkdir -p "$ml"
# user 10u rates movie m when (7u + 5m) % 3 != 0, and movie 1 always: user 10 leaves 13, 34, 55 (the backslash),
# user 20 leaves 2 (the quotes), 5, 8, 89
awk 'BEGIN { print "userId,movieId,rating,timestamp"; split("1 2 3 5 8 13 21 34 55 89", M, " ");
  for (u = 1; u <= 8; u++) for (k = 1; k <= 10; k++) { m = M[k]; if ((u * 7 + m * 5) % 3 != 0 || k == 1)
    printf "%d,%d,%.1f,%d\n", u * 10, m, 1 + ((u * 3 + m) % 9) / 2, 1000000 + u * 100 + k } }' >"$ml/ratings.csv"
cat >"$ml/movies.csv" <<'EOF'
movieId,title,genres
1,Toy Story (1995),Adventure|Animation|Children|Comedy|Fantasy
2,"Movie, The (""Quoted"") (1999)",Drama
3,Grumpier Old Men (1995),Comedy|Romance
5,Father of the Bride Part II (1995),Comedy
8,Tom and Huck (1995),Adventure|Children
13,Balto (1995),Adventure|Animation|Children
21,Get Shorty (1995),Comedy|Crime|Thriller
34,Babe (1995),Children|Drama
55,Back\slash (1996),Drama
89,Nick of Time (1995),Action|Thriller
EOF
run train 60 "$DTRAIN" train --model mf --data "$ml" --factors 4 --optimizer adam --lr 0.05 --batch-size 8 --epochs 5 \
  --threads 1 --progress none --out "$tmp/run"
W=$tmp/run/model.safetensors
if [ $rc -ne 0 ] || [ ! -f "$W" ]; then
  fail "train mf: exit $rc"
  show train
  exit 1
fi
ok "train mf on $(($(wc -l <"$ml/ratings.csv") - 1)) ratings"

section "1 eval: training's held-out part"
total=$(($(wc -l <"$ml/ratings.csv") - 1))
held=$(awk -v n="$total" 'BEGIN { printf "%d", 0.1 * n + 0.5 }') # the default --val-fraction 0.1, rounded
run eval 60 "$DTRAIN" eval --weights "$W"
pycheck "eval --split test: the $held held-out ratings, training's last test RMSE and MAE (summary.json)" '
import json, re, sys
out, s = open(sys.argv[1]).read(), json.load(open(sys.argv[2]))
m = re.search(r"test \((\d+) samples\): .* rmse ([0-9.]+)  mae ([0-9.]+) ", out)
assert m, out
assert int(m[1]) == int(sys.argv[3]), (m[1], sys.argv[3])
assert abs(float(m[2]) - s["test_rmse"]) < 1e-4 and abs(float(m[3]) - s["test_mae"]) < 1e-4, (m[0], s["test_rmse"], s["test_mae"])
print("rmse", m[2], "mae", m[3])' "$tmp/eval.out" "$tmp/run/summary.json" "$held"
run eval_train 60 "$DTRAIN" eval --weights "$W" --split train
grep -q "train ($((total - held)) samples): .* rmse " "$tmp/eval_train.out" && ok "eval --split train: the other $((total - held))" ||
  { fail "eval --split train: exit $rc, expected $((total - held)) samples"; show eval_train; }
cp -r "$ml" "$tmp/ml_extra"
echo "90,1,4.0,1000900" >>"$tmp/ml_extra/ratings.csv"
run eval_extra 60 "$DTRAIN" eval --weights "$W" --data "$tmp/ml_extra"
expect eval_extra 2 "^dtrain eval: .* has 9 users; .* was trained on 8: the weights were trained on other ratings"
cp -r "$ml" "$tmp/ml_other"
sed -i 's/^80,/81,/' "$tmp/ml_other/ratings.csv"
run eval_other 60 "$DTRAIN" eval --weights "$W" --data "$tmp/ml_other"
expect eval_other 2 "^dtrain eval: .* user ids differ from those .* was trained on .*: the weights were trained on other ratings"

section "2 recommend"
run rec 60 "$DTRAIN" recommend --weights "$W" --user 20 --top 2
rows=$(awk 'NR > 2' "$tmp/rec.out")
if [ $rc -eq 0 ] && [ "$(wc -l <<<"$rows")" -eq 2 ] && head -n 2 "$tmp/rec.out" | tail -n 1 | grep -q "rank  *movieId  *rating  *title  *genres"; then
  ok "recommend --top 2: a header and 2 rows"
else
  fail "recommend --top 2: exit $rc"
  show rec
fi
run rec10 60 "$DTRAIN" recommend --weights "$W" --user 10
got=$(awk 'NR > 2 { print $2 }' "$tmp/rec10.out" | tr '\n' ' ')
[ $rc -eq 0 ] && [ "$got" != "" ] && ok "recommend user 10: movies $got" || { fail "recommend user 10: exit $rc"; show rec10; }
for m in $got; do
  awk -F, -v m="$m" '$1 == 10 && $2 == m { found = 1 } END { exit !found }' "$ml/ratings.csv" && fail "recommend: user 10 rated movie $m"
done
n_unrated=$((10 - $(awk -F, '$1 == 10' "$ml/ratings.csv" | wc -l)))
[ "$(wc -w <<<"$got")" -eq "$n_unrated" ] && ok "recommend: all $n_unrated unrated movies (fewer than --top 10), none rated" ||
  fail "recommend: $(wc -w <<<"$got") rows, expected the $n_unrated unrated movies"
grep -qE '^ +1 +[0-9]+ +[0-9.]+  [A-Z].*\([0-9]{4}\) +[A-Z][a-z]+' "$tmp/rec10.out" && ok "recommend: titles and genres" ||
  { fail "recommend: no title and genres on the first row"; show rec10; }
run json 60 "$DTRAIN" recommend --weights "$W" --user 10 --json
pycheck "recommend --json: one object, the table's items best first, equal scores by lower movieId" '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["user"] == 10, d["user"]
ids = [e["movie_id"] for e in d["items"]]
assert ids == [int(m) for m in sys.argv[2].split()], (ids, sys.argv[2])
keys = [(-e["score"], e["movie_id"]) for e in d["items"]]
assert keys == sorted(keys), keys
assert all(e["title"] and e["genres"] for e in d["items"]), d["items"]
print(", ".join(e["title"] for e in d["items"]))' "$tmp/json.out" "$got"
run json20 60 "$DTRAIN" recommend --weights "$W" --user 20 --json
pycheck "recommend --json: quotes, a comma and a backslash in titles" '
import json, sys
titles = [e["title"] for f in sys.argv[1:] for e in json.load(open(f))["items"]]
assert "Back\\slash (1996)" in titles and "Movie, The (\"Quoted\") (1999)" in titles, titles' "$tmp/json.out" "$tmp/json20.out"

section "3 errors"
run unknown 60 "$DTRAIN" recommend --weights "$W" --user 11
expect unknown 1 "^dtrain: user 11 is not among the 8 users .* was trained on"
run top0 60 "$DTRAIN" recommend --weights "$W" --user 10 --top 0
expect top0 2 "^dtrain recommend: --top: '0' is not a positive integer"
run topabc 60 "$DTRAIN" recommend --weights "$W" --user 10 --top abc
expect topabc 2 "^dtrain recommend: --top: 'abc' is not a positive integer"
run nouser 60 "$DTRAIN" recommend --weights "$W"
expect nouser 2 "^dtrain recommend: --user ID is required"
run linear 60 "$DTRAIN" train --model linear --data synthetic:64 --epochs 1 --threads 1 --progress none --out "$tmp/linear"
run notrec 60 "$DTRAIN" recommend --weights "$tmp/linear/model.safetensors" --user 10
expect notrec 2 "holds model linear without user and item ids: recommend needs mf or ncf"

section "cold start and foreign validation ids"
# 20 users, each rating the 12 of 120 movies with (movie + user) % 10 == 0, users 1-10 the highest last and
# users 11-20 the lowest last, so every held-out movie is rated in training by the other user of its set;
# user 1's latest rating is the only one of movie 999: leave-last-out's test split has one unseen item.
mkdir -p "$tmp/cold"
awk 'BEGIN { print "userId,movieId,rating,timestamp";
  for (u = 1; u <= 20; u++) for (m = 1; m <= 120; m++) if ((m + u) % 10 == 0)
    printf "%d,%d,%.1f,%d\n", u, m, 1 + (u + m) % 5, u <= 10 ? m : 1000 - m;
  print "1,999,4.0,5000" }' >"$tmp/cold/ratings.csv"
run cold 60 "$DTRAIN" train --model mf --data "$tmp/cold" --split leave-last-out --epochs 1 --threads 1 --progress none \
  --out "$tmp/cold_run"
if [ $rc -eq 0 ] && grep -q "^cold start: 0 users and 1 items of the validation data have no training sample" "$tmp/cold.out"; then
  ok "cold start: the one unseen movie of the test split is said"
else
  fail "cold start: exit $rc, no 'cold start: 0 users and 1 items' line"
  show cold
fi
run foreign 60 "$DTRAIN" train --model mf --data "$ml" --val-data "$tmp/cold" --epochs 1 --threads 1 --out "$tmp/foreign"
expect foreign 2 "validation data .* numbers its user_ids differently from the training data"

section "done"
[ $failures -eq 0 ] || { echo "$failures failure(s)" >&2; exit 1; }
