#!/usr/bin/env bash
# dtrain under a real Slurm cluster of one host (munged, slurmctld and slurmd started here, root only):
#  1. srun -n 2 dtrain train --strategy ddp gives the final weights of dtrun --nproc-per-node 2, bit for bit;
#  2. sbatch --wait examples/slurm/train.sbatch gives them too;
#  3. scancel --signal=TERM (what --signal=TERM@60 sends before the time limit): every rank stops at one step,
#     rank 0 writes a snapshot, srun exits 143, the script requeues the job and the requeued run resumes to the
#     weights of the uninterrupted run;
#  4. a task killed with SIGKILL: the survivor fails within seconds naming rank 1, and with --kill-on-bad-exit
#     srun ends the step naming task 1; nothing is left behind (processes, /dev/shm);
#  5. two nodes in two network namespaces (a second cluster, one slurmd per namespace): srun -N 2 gives the
#     one-host weights; B's link taken down mid-training: rank 0 names rank 1 within DT_TIMEOUT, Slurm
#     reports the node failure, srun ends, no rank is left, and a relaunch resumes from the last snapshot.
# Skipped (77) where the Slurm packages are missing or the daemons do not come up.
set -u
b=${DT_BUILD_DIR:?DT_BUILD_DIR must name the build directory}
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
DTRAIN=$b/dtrain
DTRUN=$b/dtrun
for x in "$DTRAIN" "$DTRUN"; do [ -x "$x" ] || { echo "FAIL: $x is not built" >&2; exit 1; }; done
[ "$(id -u)" -eq 0 ] || { echo "skip: needs root to run slurmctld and slurmd"; exit 77; }
for c in munged munge slurmctld slurmd srun sbatch scancel scontrol sinfo squeue; do
  command -v $c >/dev/null || { echo "skip: $c not installed (apt-get install slurmctld slurmd slurm-client munge)"; exit 77; }
done
# A test run inside a Slurm job must not hand that job's variables to ours.
for v in $(env | sed -n 's/^\(SLURM_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT DT_RUN_ID OMPI_COMM_WORLD_RANK
unset OMPI_COMM_WORLD_SIZE SLURM_STEP_NUM_TASKS # they decide whether a train without --strategy runs
export OMP_WAIT_POLICY=passive DT_TIMEOUT=30

. "$SRC/tests/cli/common.sh" # fail, ok, section, alive, wait_for, wait_line, same_tensors, run, show
tmp=$(mktemp -d)
chmod 755 "$tmp" # munged wants to see its socket's directories searchable by all
daemons=()
bg_pids=()
A="" B="" in_a="" # part 5's namespaces, and the prefix that runs a command in A
cleanup() {
  local c pre
  for c in c1 c2; do
    pre=""
    [ $c = c2 ] && pre=$in_a
    [ -f "$tmp/$c/slurm.conf" ] && export SLURM_CONF=$tmp/$c/slurm.conf &&
      $pre scancel --full --signal=KILL --quiet $($pre squeue -h -o %i 2>/dev/null) 2>/dev/null
  done
  for p in "${bg_pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  for ((i = ${#daemons[@]} - 1; i >= 0; i--)); do kill "${daemons[i]}" 2>/dev/null && wait "${daemons[i]}" 2>/dev/null; done
  rm -f /dev/shm/dt-slurm-* 2>/dev/null # only our jobs' names: run ids slurm-<job>.<step>
  [ -n "$A" ] && ip netns del "$A" 2>/dev/null
  [ -n "$B" ] && ip netns del "$B" 2>/dev/null
  [ -n "${KEEP_TMP:-}" ] && echo "kept $tmp" >&2 || rm -rf "$tmp"
}
trap cleanup EXIT
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("",0)); print(s.getsockname()[1])'; }
skip() { echo "skip: $1"; tail -n 5 "$tmp"/log/* "$tmp"/c1/log/* 2>/dev/null | sed 's/^/    /'; exit 77; }

# ---- the cluster ---------------------------------------------------------------------------------
section "a one-host Slurm cluster"
host=$(hostname)
mkdir -p "$tmp/munge" "$tmp/log"
chmod 711 "$tmp/munge"
head -c 1024 /dev/urandom >"$tmp/munge/key" && chmod 400 "$tmp/munge/key"
munged -F --force --socket="$tmp/munge/sock" --key-file="$tmp/munge/key" --log-file="$tmp/log/munged.log" \
  --pid-file="$tmp/munge/pid" --seed-file="$tmp/munge/seed" >"$tmp/log/munged.out" 2>&1 &
daemons+=($!)
for i in $(seq 50); do [ -S "$tmp/munge/sock" ] && break; sleep 0.1; done
munge -S "$tmp/munge/sock" -n </dev/null | unmunge -S "$tmp/munge/sock" >/dev/null 2>&1 || skip "munged did not start"
# slurm_conf DIR CTLD-HOST NODE-LINE...: a cluster's slurm.conf in DIR, its state, spool and logs under DIR.
slurm_conf() {
  local dir=$1 ctld=$2
  shift 2
  mkdir -p "$dir/state" "$dir/spool" "$dir/log"
  cat <<EOF
ClusterName=dt$(basename "$dir")
SlurmctldHost=$ctld
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
CredType=cred/munge
# a requeued job waits cred_expire + 1 s before it may start again (default 120)
AuthInfo=socket=$tmp/munge/sock,cred_expire=5
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.%n.log
PlugStackConfig=/dev/null
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
# the main scheduling loop every second (default 60): a requeued job starts once eligible
SchedulerParameters=sched_interval=1
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdParameters=config_overrides
# a node that stops answering is down (its jobs failed) after 6 s, not 300
SlurmdTimeout=6
MessageTimeout=5
KillWait=5
InactiveLimit=0
EOF
  printf '%s\n' "$@"
  echo "PartitionName=dt Nodes=ALL Default=YES MaxTime=10 State=UP OverSubscribe=YES"
}
# nodes_idle N SECONDS: waits until N nodes are idle.
nodes_idle() {
  local i
  for ((i = 0; i < $2 * 5; i++)); do [ "$($in_a sinfo -h -N -o %t 2>/dev/null | grep -cx idle)" -ge "$1" ] && return 0; sleep 0.2; done
  return 1
}
export SLURM_CONF=$tmp/c1/slurm.conf
mkdir -p "$tmp/c1/spool/$host"
slurm_conf "$tmp/c1" "$host" "NodeName=$host CPUs=2 RealMemory=1000 State=UNKNOWN" >"$SLURM_CONF"
slurmctld -D -i -f "$SLURM_CONF" >"$tmp/log/slurmctld.out" 2>&1 &
daemons+=($!)
slurmd -D -f "$SLURM_CONF" >"$tmp/log/slurmd.out" 2>&1 &
daemons+=($!)
nodes_idle 1 20 || skip "slurmctld and slurmd did not bring node $host up within 20 s"
ok "munged, slurmctld and slurmd up, node $host idle"

DATA=synthetic:2048,in=256,out=4,task=classification,seed=3
common=(--model mlp --hidden 512,512 --data "$DATA" --seed 1 --batch-size 32 --threads 1 --progress none)

# ---- 1: srun = dtrun ------------------------------------------------------------------------------
section "1 srun -n 2 and dtrun --nproc-per-node 2"
run dtrun 120 "$DTRUN" --standalone --nproc-per-node 2 -- "$DTRAIN" train --strategy ddp "${common[@]}" --epochs 16 \
  --out "$tmp/dtrun"
[ $rc -eq 0 ] || { fail "dtrun reference run"; show dtrun; }
run srun 120 srun -n 2 "$DTRAIN" train --strategy ddp "${common[@]}" --epochs 16 --out "$tmp/srun"
if [ $rc -eq 0 ] && grep -q "2 ranks over shm" "$tmp/srun.out" &&
  same_tensors "$tmp/dtrun/model.safetensors" "$tmp/srun/model.safetensors"; then
  ok "srun -n 2: 2 ranks over shm, the final weights of dtrun's run bit for bit"
else
  fail "srun -n 2 (exit $rc)"
  show srun
fi

# ---- 2: sbatch with the example script ---------------------------------------------------------------
section "2 sbatch --wait examples/slurm/train.sbatch"
SB=$SRC/examples/slurm/train.sbatch
export DTRAIN
run sbatch 120 env OUT="$tmp/sbatch" sbatch --wait -n 2 -o "$tmp/sbatch.log" "$SB" "${common[@]}" --epochs 16
if [ $rc -eq 0 ] && same_tensors "$tmp/dtrun/model.safetensors" "$tmp/sbatch/model.safetensors"; then
  ok "sbatch --wait: the final weights of dtrun's run bit for bit"
else
  fail "sbatch (exit $rc)"
  show sbatch
  tail -n 15 "$tmp/sbatch.log" >&2
fi

# ---- 3: SIGTERM, snapshot, requeue, resume -----------------------------------------------------------------
section "3 scancel --signal=TERM: snapshot, requeue, resume"
env OUT="$tmp/term" sbatch --parsable -n 2 -o "$tmp/term.log" "$SB" "${common[@]}" --epochs 16 >"$tmp/term.id" 2>&1
job=$(cat "$tmp/term.id")
if ! wait_line "$tmp/term/metrics.csv" '^2,' 60; then
  fail "SIGTERM: job '$job' did not finish epoch 2 within 60 s"
  tail -n 15 "$tmp/term.log" >&2
else
  scancel --signal=TERM "$job"
  t0=$(date +%s)
  for i in $(seq 600); do [ "$(squeue -h -j "$job" -o %T 2>/dev/null)" = "" ] && break; sleep 0.1; done
  st=$(scontrol show job "$job" 2>/dev/null | sed -n 's/.*JobState=\([A-Z]*\).*Reason.*/\1/p')
  restarts=$(scontrol show job "$job" 2>/dev/null | sed -n 's/.*Restarts=\([0-9]*\).*/\1/p')
  s0=$(sed -n 's/^dtrain: interrupted after \([0-9]*\) step(s) by SIGTERM.*/\1/p' "$tmp/term.log" | head -n 1)
  nint=$(grep -c "interrupted after $s0 step(s) by SIGTERM" "$tmp/term.log")
  snap=$(printf '%s/term/snapshots/step-%09d.safetensors' "$tmp" "${s0:-0}")
  if [ -n "$s0" ] && [ "$nint" -eq 2 ] && grep -q "stopped by SIGTERM; requeueing" "$tmp/term.log" && [ -s "$snap" ]; then
    ok "SIGTERM: both ranks stopped after step $s0, exit 143, snapshot $(basename "$snap"), job requeued"
  else
    fail "SIGTERM: steps '$s0' ($nint ranks), snapshot $(ls "$tmp/term/snapshots" 2>&1)"
    tail -n 20 "$tmp/term.log" >&2
  fi
  if [ "$st" = COMPLETED ] && [ "${restarts:-0}" -ge 1 ] && grep -q "resumed from .*step-0*$s0.safetensors" "$tmp/term.log" &&
    same_tensors "$tmp/dtrun/model.safetensors" "$tmp/term/model.safetensors"; then
    ok "SIGTERM: the requeued job (restart $restarts) resumed at step $s0 and ended with the uninterrupted weights ($(($(date +%s) - t0)) s)"
  else
    fail "SIGTERM: the requeued job: state '$st', restarts '$restarts'"
    tail -n 20 "$tmp/term.log" >&2
  fi
fi

# ---- 4: a killed task ---------------------------------------------------------------------------------------
section "4 a task killed with SIGKILL"
# kill_rank1 LOG: waits for epoch 2 in LOG's run, then kills the task with SLURM_PROCID=1; its pid in $victim.
rank_pid() { # the pid of the dtrain task with SLURM_PROCID=$1 whose SLURM_JOB_ID is $2
  local p
  for p in $(pgrep -x dtrain); do
    tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qx "SLURM_JOB_ID=$2" &&
      tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qx "SLURM_PROCID=$1" && { echo "$p"; return; }
  done
}
killed_run() { # NAME SRUN-FLAGS...: srun -n 2 in the background, rank 1 killed at epoch 2; exit in $rc, seconds in $secs
  local name=$1 job victim i
  shift
  srun -n 2 -v "$@" "$DTRAIN" train --strategy ddp "${common[@]}" --epochs 160 --out "$tmp/$name" \
    >"$tmp/$name.out" 2>"$tmp/$name.err" </dev/null &
  local spid=$!
  bg_pids+=($spid)
  rc=999
  wait_line "$tmp/$name/metrics.csv" '^2,' 60 || { fail "$name: epoch 2 not reached"; show "$name"; return; }
  job=$(sed -n 's/.*jobid \([0-9]*\).*/\1/p' "$tmp/$name.err" | head -n 1)
  victim=$(rank_pid 1 "$job")
  [ -n "$victim" ] || { fail "$name: no task with SLURM_PROCID=1 in job '$job'"; return; }
  kill -9 "$victim"
  local t0=$(date +%s.%N)
  wait_for "$spid" 30
  secs=$(awk -v s="$t0" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }')
  for i in $(seq 50); do [ -z "$(squeue -h -j "$job" 2>/dev/null)" ] && break; sleep 0.1; done
  left=$(for p in $(pgrep -x dtrain); do tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qx "SLURM_JOB_ID=$job" && echo "$p"; done)
  shm=$(ls /dev/shm | grep "^dt-slurm-$job\." || true)
}
killed_run killed
if [ "$rc" -ne 0 ] && [ "$rc" -ne 999 ] && awk -v s="$secs" 'BEGIN { exit !(s < 10) }' &&
  grep -qE "rank 1 .*(lost|exited|closed)|lost .*rank 1" "$tmp/killed.out" "$tmp/killed.err" && [ -z "$left" ] && [ -z "$shm" ]; then
  ok "rank 1 killed: srun exited $rc after $secs s, the survivor names rank 1, nothing left behind"
else
  fail "rank 1 killed: exit $rc after ${secs:-?} s, left '$left', shm '$shm'"
  show killed
fi
killed_run kobe --kill-on-bad-exit=1
if [ "$rc" -ne 0 ] && [ "$rc" -ne 999 ] && awk -v s="$secs" 'BEGIN { exit !(s < 10) }' &&
  grep -qE "task 1: Killed" "$tmp/kobe.err" && [ -z "$left" ] && [ -z "$shm" ]; then
  ok "--kill-on-bad-exit: srun exited $rc after $secs s naming task 1, nothing left behind"
else
  fail "--kill-on-bad-exit: exit $rc after ${secs:-?} s, left '$left', shm '$shm'"
  show kobe
fi

# ---- 5: two nodes in two network namespaces ---------------------------------------------------------------
section "5 two Slurm nodes in two network namespaces"
# One slurmd per namespace (slurmd -N NAME: Debian's build runs several on one host), slurmctld and the clients
# in A. nsenter, not ip netns exec: the latter remounts /sys, and slurmd wants /sys/fs/cgroup.
tag=$$
net=10.$((200 + tag % 50)).$((tag % 250)).
if ! command -v nsenter >/dev/null || ! command -v ip >/dev/null || ! {
  A=dtsA$tag && ip netns add "$A" && B=dtsB$tag && ip netns add "$B" &&
    ip link add "sa$tag" type veth peer name "sb$tag" &&
    ip link set "sa$tag" netns "$A" && ip link set "sb$tag" netns "$B" &&
    ip -n "$A" addr add "${net}1/24" dev "sa$tag" && ip -n "$B" addr add "${net}2/24" dev "sb$tag" &&
    ip -n "$A" link set "sa$tag" up && ip -n "$B" link set "sb$tag" up &&
    ip -n "$A" link set lo up && ip -n "$B" link set lo up; } 2>"$tmp/netns.err"; then
  echo "skip (part 5): cannot create network namespaces: $(head -n 1 "$tmp/netns.err")"
else
  in_a="nsenter --net=/run/netns/$A"
  export SLURM_CONF=$tmp/c2/slurm.conf
  mkdir -p "$tmp/c2/spool/n1" "$tmp/c2/spool/n2"
  slurm_conf "$tmp/c2" "$host(${net}1)" \
    "NodeName=n1 NodeAddr=${net}1 NodeHostname=$host CPUs=1 RealMemory=500 State=UNKNOWN" \
    "NodeName=n2 NodeAddr=${net}2 NodeHostname=$host CPUs=1 RealMemory=500 State=UNKNOWN" >"$SLURM_CONF"
  $in_a slurmctld -D -i >"$tmp/c2/log/slurmctld.out" 2>&1 &
  daemons+=($!)
  $in_a slurmd -D -N n1 >"$tmp/c2/log/n1.out" 2>&1 &
  daemons+=($!)
  nsenter --net="/run/netns/$B" slurmd -D -N n2 >"$tmp/c2/log/n2.out" 2>&1 &
  daemons+=($!)
  if ! nodes_idle 2 20; then
    fail "two nodes: n1 and n2 not idle within 20 s"
    tail -n 5 "$tmp"/c2/log/* >&2
  else
    # The node names (n1, n2) resolve nowhere: MASTER_ADDR names rank 0's address (on a real cluster the first
    # node's name does).
    export MASTER_ADDR=${net}1 DT_DEBUG=info
    run two 120 $in_a srun -N 2 -n 2 "$DTRAIN" train --strategy ddp "${common[@]}" --epochs 16 --out "$tmp/two"
    n=$(grep -c "rank [01] of 2 (local 0 of 1, 2 host(s)), backend tcp, run slurm-" "$tmp/two.err")
    if [ $rc -eq 0 ] && [ "$n" -eq 2 ] && same_tensors "$tmp/dtrun/model.safetensors" "$tmp/two/model.safetensors"; then
      ok "srun -N 2 -n 2: one rank per namespace, 2 hosts over tcp, the one-host weights bit for bit"
    else
      fail "srun -N 2 -n 2: exit $rc, $n of 2 ranks on 2 hosts over tcp"
      show two
    fi
    # B's link down mid-training: rank 0 names rank 1 within DT_TIMEOUT, Slurm declares n2 failed within
    # SlurmdTimeout, srun ends; nothing is left; a relaunch resumes.
    DT_TIMEOUT=5 $in_a srun --kill-on-bad-exit=1 -N 2 -n 2 "$DTRAIN" train --strategy ddp "${common[@]}" --epochs 16 \
      --save-every 1 --out "$tmp/down" >"$tmp/down.out" 2>"$tmp/down.err" </dev/null &
    spid=$!
    bg_pids+=($spid)
    if ! wait_line "$tmp/down/metrics.csv" '^3,' 60; then
      fail "link down: epoch 3 not reached"
      show down
    else
      ip -n "$B" link set "sb$tag" down
      t0=$(date +%s.%N)
      wait_for "$spid" 40
      secs=$(awk -v s="$t0" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }')
      ours() { for p in $(pgrep -x dtrain); do tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qx "SLURM_CONF=$SLURM_CONF" && echo "$p"; done; }
      for i in $(seq 100); do [ -z "$(ours)" ] && break; sleep 0.1; done
      left=$(ours | tr '\n' ' ')
      if [ $rc -ne 0 ] && awk -v s="$secs" 'BEGIN { exit !(s < 20) }' && [ -z "$left" ] &&
        grep -q "on rank 0: waiting for rank 1 (${net}2:[0-9]*)" "$tmp/down.err" && grep -q "Node failure on n2" "$tmp/down.err"; then
        ok "link down: rank 0 named rank 1 (${net}2), srun reported the node failure of n2 and ended after $secs s; no rank left"
      else
        fail "link down: exit $rc after $secs s, left '$left'"
        show down
      fi
      ip -n "$B" link set "sb$tag" up
      last=$(ls "$tmp/down/snapshots" 2>/dev/null | tail -n 1)
      nodes_idle 2 30 || fail "link up: n2 did not return within 30 s"
      run resumed 120 $in_a srun -N 2 -n 2 "$DTRAIN" train --strategy ddp "${common[@]}" --epochs 16 --save-every 1 \
        --resume auto --out "$tmp/down"
      if [ $rc -eq 0 ] && [ -n "$last" ] && grep -q "resumed from .*$last" "$tmp/resumed.out" &&
        same_tensors "$tmp/dtrun/model.safetensors" "$tmp/down/model.safetensors"; then
        ok "relaunch: resumed from $last on both nodes, the uninterrupted weights bit for bit"
      else
        fail "relaunch: exit $rc, last snapshot '$last'"
        show resumed
      fi
    fi
  fi
fi

section "done"
exit $((failures > 0))
