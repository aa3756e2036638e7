#!/usr/bin/env bash
# Shared helpers of the CLI tests (sourced): pass/fail counting, waiting for processes and lines, comparing weights.
failures=0
t_start=$(date +%s.%N)
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
ok() { echo "ok   $*"; }
section() { echo "== $* ($(awk -v s="$t_start" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f s", n - s }'))"; }
# alive PID: running (a zombie not yet reaped counts as gone).
alive() { [ -n "$1" ] && [ -r "/proc/$1/stat" ] && ! grep -q ') Z ' "/proc/$1/stat" 2>/dev/null; }
# wait_for PID SECONDS: waits until PID is gone (SIGKILL after SECONDS); its exit code in $rc.
wait_for() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do alive "$1" || break; sleep 0.1; done
  alive "$1" && { kill -9 "$1" 2>/dev/null; echo "(killed pid $1 after $2 s)" >&2; }
  wait "$1" 2>/dev/null
  rc=$?
}
# wait_line FILE REGEX SECONDS: waits until FILE has a line matching REGEX.
wait_line() {
  local i
  for ((i = 0; i < $3 * 20; i++)); do grep -qE -- "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  return 1
}
# same_tensors A B: the tensors of two safetensors files have the same names, dtypes, shapes and bytes
# (metadata may differ); prints the first difference.
same_tensors() { /usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/tensors_diff.py" same "$1" "$2"; }
# max_diff A B: the largest absolute difference of the f32 tensors of two safetensors files (same names).
max_diff() { /usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/tensors_diff.py" max "$1" "$2"; }
# run NAME SECONDS CMD...: in the foreground, bounded; output in $tmp/NAME.out/.err, exit in $rc.
run() {
  local name=$1 secs=$2
  shift 2
  timeout -k 2 "$secs" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" </dev/null
  rc=$?
}
# show NAME: the last lines of run NAME's output and errors, on stderr.
show() { echo "--- $1 (rc $rc):" >&2; tail -n 15 "$tmp/$1.out" "$tmp/$1.err" 2>/dev/null | sed 's/^/    /' >&2; }
# use_tmp: a temporary directory in $tmp, removed at exit (KEEP_TMP=1 keeps it) after killing the pids in
# bg_pids and any worker a failed check left behind (the workers write $tmp/*/pid.*).
use_tmp() {
  tmp=$(mktemp -d)
  bg_pids=()
  trap cleanup_tmp EXIT
}
cleanup_tmp() {
  for p in "${bg_pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  for f in "$tmp"/*/pid.*; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done
  [ -n "${KEEP_TMP:-}" ] && echo "kept $tmp" >&2 || rm -rf "$tmp"
}
# same_weights WHAT A B: the weights of runs $tmp/A and $tmp/B agree within 1e-5 (max |diff|): ok or fail.
same_weights() {
  [ -s "$tmp/$2/model.safetensors" ] && [ -s "$tmp/$3/model.safetensors" ] || { fail "$1: weights missing"; return; }
  local d
  d=$(max_diff "$tmp/$2/model.safetensors" "$tmp/$3/model.safetensors")
  awk -v d="$d" 'BEGIN { exit !(d != "" && d <= 1e-5) }' && ok "$1 (max |diff| $d)" || fail "$1: weights differ by $d"
}
# run_ok NAME SECONDS CMD...: run that must succeed (fail and show its output otherwise).
run_ok() {
  run "$@"
  [ $rc -eq 0 ] || { fail "$1: exit $rc"; show "$1"; }
}
