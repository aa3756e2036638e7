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
same_tensors() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, struct, sys
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
if a.keys() != b.keys():
    sys.exit("tensor names differ: %s" % sorted(set(a) ^ set(b)))
for k in a:
    if a[k] != b[k]:
        sys.exit("tensor %s differs" % k)
PY
}
