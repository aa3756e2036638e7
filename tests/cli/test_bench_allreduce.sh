#!/usr/bin/env bash
# `dtrain bench allreduce`: the nccl-tests table under dtrun (shm and tcp, with
# --check), every dtype/op checked, usage errors, and a clear error without a launcher.
set -u
b=${DT_BUILD_DIR:?}
fail=0
check() { # description, condition...
  local what=$1; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fail=1; fi
}
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT

for backend in shm tcp; do
  timeout 120 "$b/dtrun" --standalone --nproc-per-node 3 -- "$b/dtrain" bench allreduce --backend $backend \
    -b 8 -e 1M -f 16 -n 5 -w 1 --check >"$t/out" 2>"$t/err"
  rc=$?
  check "$backend: exit 0" test $rc -eq 0
  check "$backend: header names the columns" grep -q "size .*count .*type .*redop .*root .*time .*algbw .*busbw .*#wrong .*cpu" "$t/out"
  # the cpu column: CPU seconds per GB, positive on every row
  check "$backend: a positive cpu s/GB on every row" awk '/^\[rank 0\]: +[0-9]+ +[0-9]+ +float/ { n++; if (!($NF > 0)) bad++ }
    END { exit !(n == 5 && !bad) }' "$t/out"
  rows=$(grep -cE '^\[rank 0\]: +[0-9]+ +[0-9]+ +float +sum +-1 ' "$t/out")
  check "$backend: one row per size (8 B .. 512 KiB by 16: 5 rows, got $rows)" test "$rows" -eq 5
  check "$backend: no wrong values" grep -q "Out of bounds values : 0 OK" "$t/out"
  check "$backend: closing average" grep -q "# Avg bus bandwidth" "$t/out"
  check "$backend: only rank 0 prints the table" bash -c "! grep -q '^\[rank [12]\]: .*Avg bus' '$t/out'"
  check "$backend: the banner names the backend" grep -q "backend $backend" "$t/out"
  check "$backend: the table names the CPU" grep -qE "^\[rank 0\]: # CPU: .*; avx2[+-] .*; [0-9]+ online CPUs" "$t/out"
done

# --shared: the in-place half on memory the ranks share, read where it lies (3 ranks: rank 2 reduces aside)
timeout 120 "$b/dtrun" --standalone --nproc-per-node 3 -- "$b/dtrain" bench allreduce --backend shm --shared \
  -b 8 -e 8M -f 32 -n 5 -w 1 --check >"$t/out" 2>"$t/err"
rc=$?
check "--shared: exit 0, every value right" bash -c "[ $rc -eq 0 ] && grep -q 'Out of bounds values : 0 OK' '$t/out'"
check "--shared: the banner says so" grep -q "in place on shared memory" "$t/out"
check "--shared: all-reduces ran in place on shared memory" grep -qE "# In place on shared memory: [1-9][0-9]* all-reduces" "$t/out"
check "--shared: a positive cpu-in s/GB on every row" awk '/^\[rank 0\]: +[0-9]+ +[0-9]+ +float/ { n++; if (!($NF > 0)) bad++ }
  END { exit !(n == 5 && !bad) }' "$t/out"
timeout 60 "$b/dtrun" --standalone --nproc-per-node 2 -- "$b/dtrain" bench allreduce --backend tcp --shared \
  -b 8 -e 8 >"$t/out" 2>"$t/err"
rc=$?
check "--shared on tcp: exit 1 naming the backend" bash -c "[ $rc -ne 0 ] && grep -q 'tcp backend shares no memory' '$t/err'"

for d in f64 bf16 f16 i32 i64; do
  for o in sum avg min max; do
    timeout 60 "$b/dtrun" --standalone --nproc-per-node 2 -- "$b/dtrain" bench allreduce -b 6 -e 4K -f 8 -n 2 -w 0 \
      -d $d -o $o --check >"$t/out" 2>&1 || { echo "FAIL -d $d -o $o"; tail -3 "$t/out"; fail=1; }
  done
done
echo "ok   every dtype x op verified"

usage() { # expected-substring args...
  local want=$1; shift
  "$b/dtrain" bench "$@" >"$t/out" 2>"$t/err"
  local rc=$?
  check "usage: dtrain bench $* -> exit 2 naming '$want'" bash -c "[ $rc -eq 2 ] && grep -q -- '$want' '$t/err'"
}
usage "unknown benchmark" broadcast
usage "larger than -e" allreduce -b 1M -e 8
usage "not a size" allreduce -e 12X
usage "-f must be greater than 1" allreduce -f 1
usage "not one of" allreduce -d f8
usage "given twice" allreduce -b 8 -b 16

env -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT -u OMPI_COMM_WORLD_RANK -u SLURM_PROCID \
  "$b/dtrain" bench allreduce >"$t/out" 2>"$t/err"
rc=$?
check "no launcher: exit 1 with one line naming the variables" \
  bash -c "[ $rc -eq 1 ] && grep -q 'RANK' '$t/err' && [ \$(wc -l <'$t/err') -eq 1 ]"
exit $fail
