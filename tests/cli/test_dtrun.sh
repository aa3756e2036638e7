#!/usr/bin/env bash
# dtrun: workers' environment, output prefixes, --log-dir, exit codes and the failure summary,
# restarts, signal forwarding (no worker left behind), two agents as two nodes (with a
# restart of both), usage errors and a master port in use.
set -u
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
DTRUN="${DT_BUILD_DIR:?DT_BUILD_DIR must name the build directory}/dtrun"
SRC="${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
W="$SRC/tests/cli/dtrun_worker.sh"
[ -x "$DTRUN" ] || { echo "FAIL: $DTRUN is not built" >&2; exit 1; }
tmp=$(mktemp -d)
bg_pids=()
cleanup() {
  for p in "${bg_pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  # Any worker a failed check left behind (they wrote their pids).
  for f in "$tmp"/*/pid.*; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done
  [ -n "${KEEP_TMP:-}" ] && echo "kept $tmp" >&2 || rm -rf "$tmp"
}
trap cleanup EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
# run NAME ARGS...: runs dtrun with a 20 s limit; output in $tmp/NAME.out / .err, exit code in $rc.
run() {
  local name=$1
  shift
  timeout -k 2 20 "$DTRUN" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" </dev/null
  rc=$?
}
expect_rc() { # NAME WANT
  [ "$rc" -eq "$2" ] || fail "$1: exit $rc, expected $2 (stderr: $(head -c 2000 "$tmp/$1.err"))"
}
has() { # NAME FILE TEXT: FILE contains TEXT (fixed string)
  grep -qF -- "$3" "$2" || fail "$1: '$3' missing from $(basename "$2"): $(head -c 2000 "$2")"
}
# alive PID: running (a zombie left to an init that does not reap counts as gone).
alive() { [ -n "$1" ] && [ -r "/proc/$1/stat" ] && ! grep -q ') Z ' "/proc/$1/stat" 2>/dev/null; }
# A port that was free a moment ago (the store of a standalone run picked it).
free_port() { "$DTRUN" --standalone -- sh -c 'echo $MASTER_PORT' | sed 's/^\[rank 0\]: //'; }

# ---- environment: --nproc-per-node 3 ---------------------------------------------------------
cores=$(nproc)
want_threads=$((cores / 3))
[ "$want_threads" -lt 1 ] && want_threads=1
(unset OMP_NUM_THREADS DT_NUM_THREADS; timeout 20 "$DTRUN" --standalone --nproc-per-node 3 -- bash "$W" env \
  >"$tmp/env.out" 2>"$tmp/env.err" </dev/null)
rc=$?
expect_rc env 0
port=$(sed -n 's/^\[rank 0\]: MASTER_PORT=//p' "$tmp/env.out")
runid=$(sed -n 's/^\[rank 0\]: DT_RUN_ID=//p' "$tmp/env.out")
[[ "$port" =~ ^[0-9]+$ ]] && [ "$port" -gt 0 ] || fail "env: MASTER_PORT '$port' is not a port"
[ -n "$runid" ] && [ "$runid" != unset ] || fail "env: no DT_RUN_ID"
for r in 0 1 2; do
  for kv in "RANK=$r" "LOCAL_RANK=$r" "WORLD_SIZE=3" "LOCAL_WORLD_SIZE=3" "GROUP_RANK=0" "ROLE_RANK=$r" \
    "MASTER_ADDR=127.0.0.1" "MASTER_PORT=$port" "DT_RUN_ID=$runid" "TORCHELASTIC_RUN_ID=$runid" \
    "DT_RESTART_COUNT=0" "TORCHELASTIC_RESTART_COUNT=0" "TORCHELASTIC_MAX_RESTARTS=0" "DT_STORE_SERVED=1" \
    "OMP_NUM_THREADS=$want_threads" "DT_NUM_THREADS=$want_threads" "OMP_WAIT_POLICY=passive"; do
    has env "$tmp/env.out" "[rank $r]: $kv"
  done
done
n=$(grep -c '' "$tmp/env.out")
[ "$n" -eq 51 ] || fail "env: $n output lines, expected 3 x 17"
# A user's OMP_NUM_THREADS is kept; --threads-per-proc sets both; --run-id is passed on.
OMP_NUM_THREADS=7 run envomp --nproc-per-node 2 -- bash "$W" env
has envomp "$tmp/envomp.out" "[rank 1]: OMP_NUM_THREADS=7"
run envthr --nproc_per_node 2 --threads-per-proc 5 --run-id myjob -- bash "$W" env
has envthr "$tmp/envthr.out" "[rank 1]: OMP_NUM_THREADS=5"
has envthr "$tmp/envthr.out" "[rank 0]: DT_NUM_THREADS=5"
has envthr "$tmp/envthr.out" "[rank 0]: DT_RUN_ID=myjob"
OMP_NUM_THREADS=7 run envboth --nproc-per-node 1 --threads-per-proc 3 -- bash "$W" env # the flag wins for both
has envboth "$tmp/envboth.out" "[rank 0]: OMP_NUM_THREADS=3"
has envboth "$tmp/envboth.out" "[rank 0]: DT_NUM_THREADS=3"

# --bind-to core: local worker R runs on the usable CPUs R*T .. R*T+T-1 (wrapping round), in the order of dtrun's
# own affinity (a taskset on dtrun narrows them); none leaves them all; T follows the worker's DT_NUM_THREADS.
# auto (the default) binds where two or more workers' threads fill the CPUs, fewer than T left over.
cpus=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
show_cpus='echo "cpus $(sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" /proc/self/status)"'
bind_check() { # NAME OUT TEXT...: rank R printed the R-th expected CPU list (expected lists wrap round)
  python3 - "$@" <<'PY' || fail "$1: expected cpus ${*:3} by rank: $(cat "$2")"
import sys
want = sys.argv[3:]
got = {}
for line in open(sys.argv[2]):
    got[int(line.split("]")[0].split()[1])] = line.split("cpus ")[1].strip()
sys.exit(0 if got and all(got[r] == want[r % len(want)] for r in got) else 1)
PY
}
usable=$(python3 -c 'import os; print(" ".join(map(str, sorted(os.sched_getaffinity(0)))))')
run bind --nproc-per-node 3 --threads-per-proc 1 --bind-to core -- bash -c "$show_cpus"
expect_rc bind 0
bind_check bind "$tmp/bind.out" $usable
run unbound --nproc-per-node 2 --bind-to none -- bash -c "$show_cpus"
has unbound "$tmp/unbound.out" "[rank 1]: cpus $cpus"
run auto1 --nproc-per-node 1 -- bash -c "$show_cpus" # one worker: nothing to keep apart
has auto1 "$tmp/auto1.out" "[rank 0]: cpus $cpus"
n_usable=$(echo $usable | wc -w)
if [ "$n_usable" -ge 2 ]; then
  # a worker per CPU, one thread each: bound (the thread budget dtrun's own: no OMP_NUM_THREADS/DT_NUM_THREADS)
  OMP_NUM_THREADS= DT_NUM_THREADS= run autofill --nproc-per-node "$n_usable" -- bash -c "$show_cpus"
  expect_rc autofill 0
  bind_check autofill "$tmp/autofill.out" $usable
  # more workers than CPUs: unbound
  OMP_NUM_THREADS= DT_NUM_THREADS= run autover --nproc-per-node "$((n_usable + 1))" -- bash -c "$show_cpus"
  has autover "$tmp/autover.out" "[rank $n_usable]: cpus $cpus"
fi
if [ "$n_usable" -ge 3 ]; then # a CPU or more left over for 2 one-thread workers: unbound
  run autospare --nproc-per-node 2 --threads-per-proc 1 -- bash -c "$show_cpus"
  has autospare "$tmp/autospare.out" "[rank 1]: cpus $cpus"
fi
last=${usable##* }
if [ "$last" != "${usable%% *}" ]; then
  # dtrun under taskset -c LAST: every worker on LAST (not CPU 0, 1, ... by local rank)
  timeout -k 2 20 taskset -c "$last" "$DTRUN" --nproc-per-node 2 --bind-to core -- bash -c "$show_cpus" \
    >"$tmp/bindts.out" 2>&1 </dev/null || fail "--bind-to core under taskset: $(cat "$tmp/bindts.out")"
  bind_check bindts "$tmp/bindts.out" "$last"
  # one worker gets every core as its budget, but a DT_NUM_THREADS=1 of the user's runs one thread: one CPU
  DT_NUM_THREADS=1 run bind1 --nproc-per-node 1 --bind-to core -- bash -c "$show_cpus"
  has bind1 "$tmp/bind1.out" "[rank 0]: cpus ${usable%% *}"
fi

# ---- output: prefixes on the right stream, partial last lines, --log-dir -------------------------
run out --nproc-per-node 2 -- bash -c 'echo "out $RANK"; echo "err $RANK" >&2; printf "tail $RANK"'
expect_rc out 0
for r in 0 1; do
  has out "$tmp/out.out" "[rank $r]: out $r"
  has out "$tmp/out.out" "[rank $r]: tail $r"
  has out "$tmp/out.err" "[rank $r]: err $r"
done
grep -q "err" "$tmp/out.out" && fail "out: stderr lines on stdout"
# Many lines from several workers at once: every line whole.
run flood --nproc-per-node 3 -- bash -c 'for ((i = 0; i < 2000; i++)); do echo "r$RANK-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx-$i"; done'
expect_rc flood 0
bad=$(grep -cvE '^\[rank ([0-2])\]: r\1-x{34}-[0-9]+$' "$tmp/flood.out")
[ "$bad" -eq 0 ] || fail "flood: $bad lines interleaved or malformed"
[ "$(grep -c '' "$tmp/flood.out")" -eq 6000 ] || fail "flood: $(grep -c '' "$tmp/flood.out") lines, expected 6000"
run logdir --nproc-per-node 2 --log-dir "$tmp/logs/deep" -- bash -c 'echo "hello $RANK"; echo "oops $RANK" >&2'
expect_rc logdir 0
for r in 0 1; do
  [ "$(cat "$tmp/logs/deep/0/rank$r.out" 2>/dev/null)" = "hello $r" ] || fail "logdir: rank$r.out wrong"
  [ "$(cat "$tmp/logs/deep/0/rank$r.err" 2>/dev/null)" = "oops $r" ] || fail "logdir: rank$r.err wrong"
done
grep -q "hello" "$tmp/logdir.out" "$tmp/logdir.err" && fail "logdir: worker output printed despite --log-dir"
mkdir -p "$tmp/ro" && chmod 500 "$tmp/ro"
if [ ! -w "$tmp/ro" ]; then # (root may write anywhere)
  run logro --log-dir "$tmp/ro/x" -- true
  expect_rc logro 1
  has logro "$tmp/logro.err" "--log-dir"
fi
run lognotdir --log-dir "$W" -- true
expect_rc lognotdir 1
has lognotdir "$tmp/lognotdir.err" "--log-dir"

# ---- failures: exit code, signal, summary --------------------------------------------------------
run code3 --nproc-per-node 3 -- bash "$W" lines 12 3 1
expect_rc code3 1
has code3 "$tmp/code3.err" "dtrun: worker failed: rank 1 (local 1, node 0, pid "
has code3 "$tmp/code3.err" "exited with code 3"
has code3 "$tmp/code3.err" "last 10 lines of rank 1"
has code3 "$tmp/code3.err" "  [rank 1]: rank 1 line 12"
has code3 "$tmp/code3.err" "  [rank 1]: rank 1 says goodbye"
grep -q "  \[rank 1\]: rank 1 line 2$" "$tmp/code3.err" && fail "code3: summary shows more than the last 10 lines"
run kill9 --nproc-per-node 2 -- bash "$W" kill9 0
expect_rc kill9 1
has kill9 "$tmp/kill9.err" "rank 0 (local 0, node 0, pid"
has kill9 "$tmp/kill9.err" "killed by signal SIGKILL"
run noexec --nproc-per-node 2 -- dtrun-no-such-program-xyz --flag
expect_rc noexec 1
has noexec "$tmp/noexec.err" "cannot run 'dtrun-no-such-program-xyz'"

# A worker that has exited keeps its pid (an unreaped zombie) while the round goes on, so the
# group id the final sweep kills (kill -pgid) cannot have gone to an unrelated process meanwhile.
mkdir -p "$tmp/held"
run held --nproc-per-node 2 -- bash -c 'if [ "$RANK" = 0 ]; then echo $$ >"$0/pid0"; exit 0; fi
  for ((i = 0; i < 100; i++)); do [ -s "$0/pid0" ] && break; sleep 0.05; done; sleep 0.5
  p=$(cat "$0/pid0"); st=$(sed "s/.*) //" "/proc/$p/stat" 2>/dev/null | cut -c1); echo "state of rank 0: ${st:-gone}"' "$tmp/held"
expect_rc held 0
has held "$tmp/held.out" "[rank 1]: state of rank 0: Z"
# ...and dtrun reaps them all before it exits, whether the run succeeded or failed: its parent inherits none (here
# a subreaper stands in for a container's init, which may never reap what it inherits). The failing run's workers
# start no process of their own (exec), whose orphans the parent would inherit as it should.
python3 - "$DTRUN" "$W" <<'PY' || fail "reap: dtrun left its workers to its parent"
import ctypes, os, subprocess, sys
if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
    sys.exit("reap: prctl(PR_SET_CHILD_SUBREAPER) failed")
dtrun, worker = sys.argv[1], sys.argv[2]
for want, args in ((0, ["bash", worker, "env"]), (1, ["bash", "-c", '[ "$RANK" = 1 ] && exit 3; exec sleep 10'])):
    try:
        r = subprocess.run([dtrun, "--standalone", "--nproc-per-node", "2", "--"] + args, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=20)
    except subprocess.TimeoutExpired:
        sys.exit(f"reap: dtrun {args} still running after 20 s")
    if r.returncode != want:
        sys.exit(f"reap: dtrun {args} exited {r.returncode}, expected {want}")
    left = []
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        left.append(pid if pid else "a live one")
        if not pid:
            break
    if left:
        sys.exit(f"reap: after dtrun {args} (exit {want}) its parent had to reap: {left}")
PY

# ---- restarts -------------------------------------------------------------------------------------
run restart --nproc-per-node 2 --max-restarts 2 -- bash "$W" fail-until 2 1
expect_rc restart 0
for k in 0 1 2; do has restart "$tmp/restart.out" "[rank 1]: round $k rank 1"; done
has restart "$tmp/restart.err" "restart 2 of 2"
run restartfail --nproc-per-node 2 --max-restarts 1 -- bash "$W" always-fail
expect_rc restartfail 1
has restartfail "$tmp/restartfail.out" "round 1 rank"
grep -q "round 2" "$tmp/restartfail.out" && fail "restartfail: a third round ran"
has restartfail "$tmp/restartfail.err" "restart count 1 (--max-restarts 1)"

# ---- SIGTERM: forwarded, exit 143, nothing left ---------------------------------------------------
mkdir -p "$tmp/term"
"$DTRUN" --nproc-per-node 2 --grace 5 -- bash "$W" wait-term "$tmp/term" >"$tmp/term.out" 2>"$tmp/term.err" </dev/null &
agent=$!
bg_pids+=("$agent")
for ((i = 0; i < 100; i++)); do
  [ -s "$tmp/term/pid.0" ] && [ -s "$tmp/term/pid.1" ] && break
  sleep 0.1
done
kill -TERM "$agent"
for ((i = 0; i < 100; i++)); do kill -0 "$agent" 2>/dev/null || break; sleep 0.1; done
wait "$agent"
rc=$?
[ "$rc" -eq 143 ] || fail "term: exit $rc, expected 143 ($(cat "$tmp/term.err"))"
for r in 0 1; do
  [ -f "$tmp/term/term.$r" ] || fail "term: rank $r did not get SIGTERM"
  p=$(cat "$tmp/term/pid.$r" 2>/dev/null)
  alive "$p" && fail "term: worker $r (pid $p) still running"
done
# Also under SIGINT, with a worker that ignores it: SIGKILL after --grace; exit 130.
mkdir -p "$tmp/int"
"$DTRUN" --nproc-per-node 1 --grace 0.5 -- bash -c 'trap "" INT TERM; echo $$ > '"$tmp/int"'/pid.0; while :; do sleep 0.1; done' \
  >"$tmp/int.out" 2>"$tmp/int.err" </dev/null &
agent=$!
bg_pids+=("$agent")
for ((i = 0; i < 100; i++)); do [ -s "$tmp/int/pid.0" ] && break; sleep 0.1; done
kill -INT "$agent"
wait "$agent"
rc=$?
[ "$rc" -eq 130 ] || fail "int: exit $rc, expected 130 ($(cat "$tmp/int.err"))"
p=$(cat "$tmp/int/pid.0" 2>/dev/null)
alive "$p" && fail "int: worker (pid $p) still running"
has int "$tmp/int.err" "SIGKILL"

# ---- two agents as two nodes ------------------------------------------------------------------------
# node_pair NAME PORT EXTRA_ARGS... -- PROGRAM...: both agents in the background, exit codes in rc0 rc1.
node_pair() {
  local name=$1 port=$2
  shift 2
  timeout -k 2 25 "$DTRUN" --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port "$port" --timeout 15 \
    --run-id "pair-$port" "$@" >"$tmp/$name.1.out" 2>"$tmp/$name.1.err" </dev/null &
  local p1=$!
  timeout -k 2 25 "$DTRUN" --nnodes 2 --node_rank 0 --master_addr 127.0.0.1 --master_port "$port" --timeout 15 \
    --run-id "pair-$port" "$@" >"$tmp/$name.0.out" 2>"$tmp/$name.0.err" </dev/null &
  local p0=$!
  wait "$p0"
  rc0=$?
  wait "$p1"
  rc1=$?
}
port=$(free_port)
node_pair nodes "$port" --nproc-per-node 2 -- bash "$W" env
[ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] || fail "nodes: exits $rc0/$rc1 ($(cat "$tmp/nodes.0.err" "$tmp/nodes.1.err"))"
for r in 0 1 2 3; do
  node=$((r / 2))
  f="$tmp/nodes.$node.out"
  has nodes "$f" "[rank $r]: RANK=$r"
  has nodes "$f" "[rank $r]: LOCAL_RANK=$((r % 2))"
  has nodes "$f" "[rank $r]: WORLD_SIZE=4"
  has nodes "$f" "[rank $r]: GROUP_RANK=$node"
  has nodes "$f" "[rank $r]: MASTER_PORT=$port"
  has nodes "$f" "[rank $r]: DT_RUN_ID=pair-$port"
done
# A failure on node 1 (rank 2, round 0) restarts both nodes.
port=$(free_port)
node_pair noderestart "$port" --nproc-per-node 2 --max-restarts 1 -- bash "$W" fail-until 1 2
[ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] ||
  fail "noderestart: exits $rc0/$rc1 ($(cat "$tmp/noderestart.0.err" "$tmp/noderestart.1.err"))"
has noderestart "$tmp/noderestart.0.out" "[rank 0]: round 1 rank 0"
has noderestart "$tmp/noderestart.1.out" "[rank 2]: round 1 rank 2"
has noderestart "$tmp/noderestart.0.err" "rank 2 (local 0, node 1"
# Without restarts left both agents fail: node 0 stops its (sleeping) worker and names the rank on node 1.
port=$(free_port)
node_pair nodefail "$port" --nproc-per-node 1 -- bash "$W" lines 1 5 1
[ "$rc0" -eq 1 ] && [ "$rc1" -eq 1 ] || fail "nodefail: exits $rc0/$rc1, expected 1/1"
has nodefail "$tmp/nodefail.0.err" "worker failed on another node: rank 1 (local 0, node 1, pid"
has nodefail "$tmp/nodefail.0.err" "exited with code 5"
has nodefail "$tmp/nodefail.1.err" "dtrun: worker failed: rank 1 (local 0, node 1, pid"
has nodefail "$tmp/nodefail.1.err" "  [rank 1]: rank 1 says goodbye"
# Nodes that disagree on --nproc-per-node: both refuse, naming the other node.
port=$(free_port)
timeout 20 "$DTRUN" --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port "$port" --timeout 10 \
  --nproc-per-node 1 -- true >"$tmp/mismatch.1.out" 2>"$tmp/mismatch.1.err" </dev/null &
p1=$!
run mismatch --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port "$port" --timeout 10 --nproc-per-node 2 -- true
wait "$p1"
rc1=$?
expect_rc mismatch 1
[ "$rc1" -eq 1 ] || fail "mismatch: node 1 exit $rc1, expected 1"
has mismatch "$tmp/mismatch.err" "node 1 runs with nnodes=2 nproc=1"

# SIGTERM to node 1's agent: its workers stop, it exits 143, node 0 stops its workers and exits 1.
port=$(free_port)
mkdir -p "$tmp/nterm"
"$DTRUN" --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port "$port" --timeout 15 \
  -- bash "$W" wait-term "$tmp/nterm" >"$tmp/nterm.0.out" 2>"$tmp/nterm.0.err" </dev/null &
a0=$!
"$DTRUN" --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port "$port" --timeout 15 \
  -- bash "$W" wait-term "$tmp/nterm" >"$tmp/nterm.1.out" 2>"$tmp/nterm.1.err" </dev/null &
a1=$!
bg_pids+=("$a0" "$a1")
for ((i = 0; i < 100; i++)); do
  [ -s "$tmp/nterm/pid.0" ] && [ -s "$tmp/nterm/pid.1" ] && break
  sleep 0.1
done
kill -TERM "$a1"
wait "$a1"
rc1=$?
for ((i = 0; i < 100; i++)); do kill -0 "$a0" 2>/dev/null || break; sleep 0.1; done
kill -9 "$a0" 2>/dev/null && fail "nterm: node 0 still running 10 s after node 1 was interrupted"
wait "$a0"
rc0=$?
[ "$rc1" -eq 143 ] && [ "$rc0" -eq 1 ] || fail "nterm: exits $rc0/$rc1, expected 1/143"
has nterm "$tmp/nterm.0.err" "node 1 was interrupted by SIGTERM"
for r in 0 1; do [ -f "$tmp/nterm/term.$r" ] || fail "nterm: rank $r did not get SIGTERM"; done
# An agent killed outright takes its workers with it.
mkdir -p "$tmp/k9"
"$DTRUN" --nproc-per-node 2 -- bash "$W" wait-term "$tmp/k9" >/dev/null 2>&1 </dev/null &
agent=$!
bg_pids+=("$agent")
for ((i = 0; i < 100; i++)); do [ -s "$tmp/k9/pid.0" ] && [ -s "$tmp/k9/pid.1" ] && break; sleep 0.1; done
{ kill -9 "$agent"; wait "$agent"; } 2>/dev/null
sleep 0.3
for r in 0 1; do
  p=$(cat "$tmp/k9/pid.$r" 2>/dev/null)
  alive "$p" && fail "k9: worker $r (pid $p) outlived its killed agent"
done
# A node that never comes: node 0 gives up after --timeout naming it; Ctrl-C while waiting is 130.
port=$(free_port)
run nojoin --nnodes 3 --node-rank 0 --master-addr 127.0.0.1 --master-port "$port" --timeout 0.5 -- true
expect_rc nojoin 1
has nojoin "$tmp/nojoin.err" "missing node 1, 2 of --nnodes 3"
port=$(free_port)
"$DTRUN" --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port "$port" --timeout 15 -- true \
  >"$tmp/joinint.out" 2>"$tmp/joinint.err" </dev/null &
agent=$!
bg_pids+=("$agent")
sleep 0.5
kill -INT "$agent"
wait "$agent"
rc=$?
expect_rc joinint 130

# ---- real process groups under dtrun (the agent serves the store) --------------------------------
AR="$DT_BUILD_DIR/tests/dtrun_allreduce"
run group --nproc-per-node 3 --max-restarts 1 -- "$AR" 1 1
expect_rc group 0
for r in 0 1 2; do
  has group "$tmp/group.out" "[rank $r]: rank $r of 3: sum 6 backend shm restart 0 served 1"
  has group "$tmp/group.out" "[rank $r]: rank $r of 3: sum 6 backend shm restart 1 served 1"
done
port=$(free_port)
DT_HOST_ID=hostA timeout -k 2 25 "$DTRUN" --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port "$port" \
  --timeout 15 --nproc-per-node 2 -- "$AR" >"$tmp/group2.1.out" 2>"$tmp/group2.1.err" </dev/null &
p1=$!
DT_HOST_ID=hostB run group2.0 --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port "$port" \
  --timeout 15 --nproc-per-node 2 -- "$AR"
wait "$p1"
rc1=$?
expect_rc group2.0 0
[ "$rc1" -eq 0 ] || fail "group2: node 1 exit $rc1 ($(cat "$tmp/group2.1.err"))"
for r in 0 1 2 3; do has group2 "$tmp/group2.$((r / 2)).out" "[rank $r]: rank $r of 4: sum 10 backend"; done

# ---- master port in use -----------------------------------------------------------------------------
port=$(free_port)
"$DTRUN" --nnodes 1 --master-port "$port" -- sleep 5 >/dev/null 2>&1 </dev/null &
holder=$!
bg_pids+=("$holder")
sleep 0.5
run portbusy --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port "$port" -- true
expect_rc portbusy 1
has portbusy "$tmp/portbusy.err" "$port"
kill -TERM "$holder" 2>/dev/null
wait "$holder" 2>/dev/null

# ---- usage errors: exit 2 and one line naming the problem ------------------------------------------
usage() { # WANT_TEXT ARGS...
  local want=$1
  shift
  "$DTRUN" "$@" >"$tmp/usage.out" 2>"$tmp/usage.err" </dev/null
  local code=$?
  if [ "$code" -ne 2 ]; then
    fail "dtrun $* -> exit $code, expected 2 ($(cat "$tmp/usage.err"))"
  elif [ "$(grep -c '' "$tmp/usage.err")" -ne 1 ]; then
    fail "dtrun $* -> not one stderr line: $(cat "$tmp/usage.err")"
  elif ! grep -qF -- "$want" "$tmp/usage.err"; then
    fail "dtrun $* -> '$(cat "$tmp/usage.err")' lacks '$want'"
  fi
}
usage "no program to run" --nproc-per-node 2
usage "no program to run" --nproc-per-node 2 --
usage "--nproc-per-node: 'abc' is not a worker count" --nproc-per-node abc -- true
usage "--nproc-per-node: '0' is not a worker count" --nproc-per-node 0 -- true
usage "--nproc-per-node given twice" --nproc-per-node 2 --nproc_per_node 2 -- true
usage "--standalone runs one node" --standalone --nnodes 2 -- true
usage "unknown flag '--frobnicate'" --frobnicate -- true
usage "--max-restarts: '-1'" --max-restarts -1 -- true
usage "--monitor-interval: 'x'" --monitor-interval x -- true
usage "--master-port: '70000' is not a port" --nnodes 2 --node-rank 0 --master-addr h --master-port 70000 -- true
usage "--node-rank 2 is out of range" --nnodes 2 --node-rank 2 --master-addr h --master-port 1234 -- true
usage "--nnodes 2 needs --node-rank" --nnodes 2 --master-addr h --master-port 1234 -- true
usage "--nnodes 2 needs --master-port" --nnodes 2 --node-rank 0 --master-addr h -- true
usage "--timeout needs a value" --timeout
usage "elastic node ranges" --nnodes 1:2 -- true
usage "--bind-to: 'socket' is not one of auto/none/core" --bind-to socket -- true
"$DTRUN" --help >"$tmp/help.out" 2>&1
rc=$?
expect_rc help 0
for f in --standalone --nnodes --node-rank --master-addr --master-port --nproc-per-node --max-restarts \
  --monitor-interval --log-dir --run-id --threads-per-proc --bind-to --timeout --grace; do
  has help "$tmp/help.out" "$f"
done

if [ "$failures" -ne 0 ]; then
  echo "test_dtrun: $failures failure(s)" >&2
  exit 1
fi
echo "test_dtrun: all checks passed"
