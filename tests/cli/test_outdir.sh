#!/usr/bin/env bash
# The output directory's guard and failed writes through the command line:
#  1. a second run into the same --out without --resume exits 2 naming what is there and leaves every file of
#     the first byte-identical; under ddp every rank refuses; --overwrite leaves only the new run's files;
#  2. --resume auto continues the first run and prints what the new flags change (lr); a changed --limit-train
#     is refused (exit 2) unless --allow-data-change; --resume auto with no snapshot refuses another run's outputs;
#  3. a file-size limit (ulimit -f) during the weights, a snapshot, the report, TensorBoard and the trace:
#     exit 1, one line, no temporary file, the previous files intact;
#  4. a full disk (a small tmpfs; skipped where none can be mounted): the metrics, the weights with and without
#     a snapshot to fall back on.
set -u
b=${DT_BUILD_DIR:?DT_BUILD_DIR must name the build directory}
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export DT_TIMEOUT=60
DTRAIN=$b/dtrain
DTRUN=$b/dtrun
. "$SRC/tests/cli/common.sh"
for x in "$DTRAIN" "$DTRUN"; do [ -x "$x" ] || { echo "FAIL: $x is not built" >&2; exit 1; }; done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT OMPI_COMM_WORLD_RANK PMI_RANK SLURM_PROCID
unset OMPI_COMM_WORLD_SIZE SLURM_STEP_NUM_TASKS # they decide whether a train without --strategy runs

tmp=$(mktemp -d)
mnt=
cleanup() {
  [ -n "$mnt" ] && umount "$mnt" 2>/dev/null
  [ -n "${KEEP_TMP:-}" ] && echo "kept $tmp" >&2 || rm -rf "$tmp"
}
trap cleanup EXIT

# Small and quick: a 100 KiB model (report ~22 KiB, snapshot ~101 KiB), 32 steps an epoch.
c0=(train --model mlp --hidden 32 --limit-test 500 --progress plain)
c=("${c0[@]}" --limit-train 2000)
# sums DIR: a checksum line per file under DIR (sorted), to compare a directory before and after.
sums() { (cd "$1" && find . -type f | sort | xargs md5sum); }
# one_line NAME SUBSTRING...: stderr of NAME is exactly one line holding every substring.
one_line() {
  local name=$1 s
  shift
  [ "$(wc -l <"$tmp/$name.err")" -eq 1 ] || { fail "$name: stderr is not one line: $(cat "$tmp/$name.err")"; return; }
  for s in "$@"; do grep -qF -- "$s" "$tmp/$name.err" || fail "$name: stderr lacks '$s': $(cat "$tmp/$name.err")"; done
}
# no_temporaries DIR: no *.tmp.<pid> file left anywhere under DIR.
no_temporaries() {
  local left
  left=$(find "$1" -name '*.tmp.*' 2>/dev/null)
  [ -z "$left" ] || fail "temporary files left: $left"
}
# run NAME CODE ARGS...: dtrain ARGS exits CODE (stdout and stderr into $tmp/NAME.out, .err).
run() {
  local name=$1 code=$2
  shift 2
  "$DTRAIN" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" </dev/null
  local got=$?
  [ $got -eq "$code" ] && ok "$name: exit $code" || fail "$name: exit $got (expected $code): $(tail -n 3 "$tmp/$name.err")"
}

# ---- 1: a second run into the same --out ---------------------------------------------------------
section "1 a second run into the same --out"
A=$tmp/same
run first 0 "${c[@]}" --out "$A" --save-every 1
sums "$A" >"$tmp/first.sums"
cp -a "$A" "$tmp/copy"
run second 2 "${c[@]}" --lr 0.05 --out "$A"
one_line second "holds the outputs of an earlier run" "model.safetensors" "snapshots/ (1 file)" "--resume auto" \
  "--overwrite"
sums "$A" | cmp -s - "$tmp/first.sums" && ok "every file of the first run is byte-identical" ||
  fail "the refused run changed $A"
"$DTRUN" --standalone --nproc-per-node 2 -- "$DTRAIN" "${c[@]}" --strategy ddp --out "$A" \
  >"$tmp/ddp.out" 2>"$tmp/ddp.err" </dev/null
rc=$?
[ $rc -ne 0 ] && grep -qF "holds the outputs of an earlier run" "$tmp/ddp.err" && ok "ddp: rank 0 refuses (exit $rc)" ||
  fail "ddp into a used --out: exit $rc, $(tail -n 5 "$tmp/ddp.err")"
sums "$A" | cmp -s - "$tmp/first.sums" && ok "ddp: the first run's files are byte-identical" || fail "ddp changed $A"
run overwrite 0 "${c[@]}" --lr 0.05 --out "$tmp/copy" --overwrite
grep -qF "overwrite: deleted the earlier run's outputs" "$tmp/overwrite.out" || fail "--overwrite did not say what it deleted"
[ ! -e "$tmp/copy/snapshots" ] && grep -qF '"lr":0.05' "$tmp/copy/config.json" &&
  [ "$(ls "$tmp/copy" | tr '\n' ' ')" = "config.json metrics.csv metrics.jsonl model.safetensors report.html summary.json " ] &&
  [ "$(wc -l <"$tmp/copy/metrics.csv")" -eq 2 ] && ok "--overwrite leaves only the new run's files" ||
  fail "--overwrite left: $(ls -R "$tmp/copy")"

# ---- 2: resume checks the stored configuration ---------------------------------------------------
section "2 --resume against the snapshot's configuration"
run data_change 2 "${c0[@]}" --limit-train 1000 --epochs 2 --out "$A" --resume auto
one_line data_change "was trained on other data" "limit_train 2000 -> 1000" "--allow-data-change"
sums "$A" | cmp -s - "$tmp/first.sums" && ok "a refused resume changes nothing" || fail "the refused resume changed $A"
cp -a "$A" "$tmp/data"
run data_allowed 0 "${c0[@]}" --limit-train 1000 --epochs 2 --out "$tmp/data" --resume auto --allow-data-change
grep -qF "resume: limit_train 2000 -> 1000 (--allow-data-change)" "$tmp/data_allowed.out" &&
  ok "--allow-data-change continues and says so" || fail "no data change line: $(cat "$tmp/data_allowed.out")"
run resume_lr 0 "${c[@]}" --lr 0.05 --epochs 2 --out "$A" --resume auto
grep -qxF "resume: lr 0.01 -> 0.05" "$tmp/resume_lr.out" && grep -qxF "resume: epochs 1 -> 2" "$tmp/resume_lr.out" &&
  ok "--resume prints the changed lr and epochs" || fail "no difference lines: $(head -n 5 "$tmp/resume_lr.out")"
grep -qF "resumed from $A/snapshots/step-000000032.safetensors" "$tmp/resume_lr.out" &&
  [ "$(wc -l <"$A/metrics.csv")" -eq 3 ] && ok "--resume auto continues the first run (epoch 2 after its epoch 1)" ||
  fail "the resumed run did not continue: $(cat "$A/metrics.csv")"
run no_snapshot 0 "${c[@]}" --out "$tmp/plain"
run auto_other 2 "${c[@]}" --lr 0.05 --out "$tmp/plain" --resume auto
one_line auto_other "no snapshot to continue from" "--overwrite"
run auto_same_a 0 "${c[@]}" --out "$tmp/restart" --resume auto
run auto_same_b 0 "${c[@]}" --out "$tmp/restart" --resume auto
run conflict 2 "${c[@]}" --out "$A" --resume auto --overwrite
one_line conflict "--overwrite starts afresh, --resume continues"
run allow_alone 2 "${c[@]}" --out "$tmp/x" --allow-data-change
one_line allow_alone "--allow-data-change applies only with --resume"

# ---- 3: a file-size limit during each kind of output ---------------------------------------------
section "3 ulimit -f during each kind of output"
# limited NAME KIB SUBSTRING ARGS...: dtrain under a file-size limit of KIB KiB exits 1 (not killed by SIGXFSZ)
# with one line naming the file and EFBIG, and leaves no temporary file in its --out.
limited() {
  local name=$1 kib=$2 want=$3
  shift 3
  (ulimit -f "$kib" && exec "$DTRAIN" "$@") >"$tmp/$name.out" 2>"$tmp/$name.err" </dev/null
  local got=$?
  [ $got -eq 1 ] && ok "$name: exit 1 under ulimit -f $kib" || fail "$name: exit $got under ulimit -f $kib"
  one_line "$name" "$want" "File too large"
  no_temporaries "$tmp/$name"
}
run base 0 "${c[@]}" --out "$tmp/base" --save-every 1
# what must survive a failed write of the resumed run: weights, summary, snapshot (and the report unless rewritten)
keep_sums() { (cd "$1" && md5sum model.safetensors summary.json snapshots/step-000000032.safetensors ${2:-}); }
for k in weights snapshot report; do cp -a "$tmp/base" "$tmp/$k"; done
keep_sums "$tmp/base" report.html >"$tmp/base.sums"
limited weights 64 "model.safetensors" "${c[@]}" --epochs 2 --resume auto --out "$tmp/weights"
grep -qF "wrote no snapshot: its trained weights are lost" "$tmp/weights.err" || fail "weights: no word of the lost weights"
keep_sums "$tmp/weights" | cmp -s - <(keep_sums "$tmp/base") && ok "weights: the previous weights are intact" ||
  fail "weights: previous files changed"
limited snapshot 64 "snapshots/step-000000064.safetensors" "${c[@]}" --epochs 2 --resume auto --save-every 1 \
  --out "$tmp/snapshot"
keep_sums "$tmp/snapshot" report.html | cmp -s - "$tmp/base.sums" && ok "snapshot: the previous files are intact" ||
  fail "snapshot: previous files changed"
limited report 16 "report.html" "${c[@]}" --epochs 2 --resume auto --out "$tmp/report"
keep_sums "$tmp/report" report.html | cmp -s - "$tmp/base.sums" && ok "report: the previous files are intact" ||
  fail "report: previous files changed"
limited tensorboard 4 "events.out.tfevents" "${c[@]}" --out "$tmp/tensorboard" --tensorboard "$tmp/tensorboard/tb" \
  --log-every 1
limited trace 40 "trace.json" train --model mlp --hidden 4 --limit-train 4000 --limit-test 500 --progress plain \
  --out "$tmp/trace" --trace "$tmp/trace/trace.json"
[ -s "$tmp/trace/model.safetensors" ] && ok "trace: the outputs before it are written" || fail "trace: no weights"

# ---- 4: a full disk -----------------------------------------------------------------------------------
section "4 a full disk (tmpfs)"
mkdir -p "$tmp/mnt"
if [ "$(id -u)" -ne 0 ] || ! mount -t tmpfs -o size=1m tmpfs "$tmp/mnt" 2>/dev/null; then
  echo "skipped: cannot mount a tmpfs here (needs root and permission to mount)"
  [ $failures -eq 0 ] && echo "test_outdir: all passed" && exit 0
  echo "test_outdir: $failures failure(s)" >&2
  exit 1
fi
mnt=$tmp/mnt
# full NAME FREE_KIB SUBSTRING ARGS...: with FREE_KIB left on the tmpfs, dtrain exits 1 with one line naming the
# file and ENOSPC, and leaves no temporary file.
full() {
  local name=$1 free=$2 want=$3
  shift 3
  rm -rf "${mnt:?}"/*
  dd if=/dev/zero of="$mnt/filler" bs=4k count=$((256 - free / 4)) 2>/dev/null
  "$DTRAIN" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" </dev/null
  local got=$?
  [ $got -eq 1 ] && ok "$name: exit 1 with $free KiB free" || fail "$name: exit $got with $free KiB free"
  one_line "$name" "$want" "No space left on device"
  no_temporaries "$mnt"
}
full disk_metrics 0 "metrics.csv" "${c[@]}" --out "$mnt/o"
full disk_weights 64 "model.safetensors" "${c[@]}" --out "$mnt/o"
grep -qF "its trained weights are lost" "$tmp/disk_weights.err" || fail "disk_weights: no word of the lost weights"
full disk_kept 184 "model.safetensors" "${c[@]}" --out "$mnt/o" --save-every 1
grep -qF "newest snapshot $mnt/o/snapshots/step-000000032.safetensors is intact" "$tmp/disk_kept.err" &&
  [ -s "$mnt/o/snapshots/step-000000032.safetensors" ] && ok "disk_kept: says where the last snapshot is" ||
  fail "disk_kept: $(cat "$tmp/disk_kept.err")"

[ $failures -eq 0 ] && echo "test_outdir: all passed" && exit 0
echo "test_outdir: $failures failure(s)" >&2
exit 1
