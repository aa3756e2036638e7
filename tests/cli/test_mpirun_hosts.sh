#!/usr/bin/env bash
# mpirun across two simulated hosts: network namespaces A and B joined by a veth pair, each with its own hostname,
# Open MPI reaching B through an rsh agent that runs the daemon inside B's namespace (root only):
#  1. dtrain train --strategy ddp with --backend mpi, auto and tcp on -H A:1,B:1: 2 hosts seen, the final
#     weights of a one-host dtrun run, bit for bit;
#  2. rank 1 (on B) killed with SIGKILL: mpirun ends the job within seconds naming rank 1 and B; nothing is left
#     in either namespace;
#  3. B's link taken down mid-training: mpirun notices the lost daemon (TCP keepalive) and ends within seconds;
#     rank 0, where its DT_TIMEOUT comes first, fails naming rank 1 and its address; nothing is left; relaunched
#     with --resume auto the job continues from the last snapshot to the uninterrupted weights.
# Skipped (77) without root, iproute2, mpirun or an MPI build.
set -u
b=${DT_BUILD_DIR:?DT_BUILD_DIR must name the build directory}
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
DTRAIN=$b/dtrain
DTRUN=$b/dtrun
for x in "$DTRAIN" "$DTRUN"; do [ -x "$x" ] || { echo "FAIL: $x is not built" >&2; exit 1; }; done
[ "$(id -u)" -eq 0 ] && command -v ip >/dev/null && command -v unshare >/dev/null ||
  { echo "skip: needs root, iproute2 and unshare for network namespaces"; exit 77; }
command -v mpirun >/dev/null || { echo "skip: mpirun not installed (apt-get install openmpi-bin libopenmpi-dev)"; exit 77; }
nm -D "$b/libdtrain.so" | grep -q " U MPI_Init" || { echo "skip: libdtrain was built without MPI"; exit 77; }
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT DT_RUN_ID SLURM_PROCID OMPI_COMM_WORLD_RANK
unset OMPI_COMM_WORLD_SIZE SLURM_STEP_NUM_TASKS # they decide whether a train without --strategy runs
. "$SRC/tests/cli/common.sh" # fail, ok, section, alive, wait_for, wait_line, same_tensors, run, show

tag=$$
A=dtmA$tag B=dtmB$tag
net=10.$((200 + tag % 50)).$((tag % 250)).
tmp=$(mktemp -d)
leftovers() { ip netns pids "$A" 2>/dev/null; ip netns pids "$B" 2>/dev/null; }
cleanup() {
  for p in $(leftovers); do kill -9 "$p" 2>/dev/null; done
  ip netns del "$A" 2>/dev/null
  ip netns del "$B" 2>/dev/null
  rm -f /dev/shm/dt-mpih$tag-* 2>/dev/null
  [ -n "${KEEP_TMP:-}" ] && echo "kept $tmp" >&2 || rm -rf "$tmp"
}
trap cleanup EXIT
if ! { ip netns add "$A" && ip netns add "$B" &&
  ip link add "ma$tag" type veth peer name "mb$tag" &&
  ip link set "ma$tag" netns "$A" && ip link set "mb$tag" netns "$B" &&
  ip -n "$A" addr add "${net}1/24" dev "ma$tag" && ip -n "$B" addr add "${net}2/24" dev "mb$tag" &&
  ip -n "$A" link set "ma$tag" up && ip -n "$B" link set "mb$tag" up &&
  ip -n "$A" link set lo up && ip -n "$B" link set lo up; } 2>"$tmp/netns.err"; then
  echo "skip: cannot create network namespaces here: $(head -n 1 "$tmp/netns.err")"
  exit 77
fi
# The rsh agent: Open MPI runs "agent HOST orted ARGS..." as it would run ssh; the command runs in HOST's namespace
# under HOST's own hostname (a UTS namespace), so each "host" looks like a machine of its own.
printf '%s1 %s\n%s2 %s\n' "$net" "$A" "$net" "$B" >"$tmp/hosts"
cat >"$tmp/agent.sh" <<EOF
#!/bin/sh
host=\$1
shift
ns=\$(awk -v h="\$host" '\$1 == h { print \$2 }' "$tmp/hosts")
[ -n "\$ns" ] || { echo "agent.sh: no namespace for host '\$host'" >&2; exit 1; }
exec ip netns exec "\$ns" unshare -u sh -c "hostname \$ns; \$*"
EOF
chmod +x "$tmp/agent.sh"

DT_JOB_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
export DT_JOB_SECRET DT_TIMEOUT=20 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive DT_RUN_ID=mpih$tag DT_DEBUG=info
# mpirun from host A onto A and B. Keepalive on the daemons' connections: a lost host is noticed in ~4 s, not 8 min.
mpirun_hosts() { # NAME SECONDS ARGS...: in the foreground; output in $tmp/NAME.out, exit in $rc
  local name=$1 secs=$2
  shift 2
  timeout -k 2 "$secs" ip netns exec "$A" unshare -u sh -c 'hostname "$0"; exec "$@"' "$A" \
    mpirun --allow-run-as-root --bind-to none --mca plm_rsh_agent "$tmp/agent.sh" \
    --mca oob_tcp_keepalive_time 2 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 2 \
    -H "${net}1:1,${net}2:1" -n 2 -x DT_JOB_SECRET -x DT_TIMEOUT -x OMP_NUM_THREADS -x OMP_WAIT_POLICY -x DT_RUN_ID \
    -x DT_DEBUG "$@" </dev/null >"$tmp/$name.out" 2>&1
  rc=$?
  return $rc # the exit status of a run in the background
}
common=(--model mlp --hidden 512,512 --data synthetic:1024,in=256,out=4,task=classification,seed=3 --seed 1
  --batch-size 32 --threads 1 --progress none)
master=(--master "${net}1:29700")

# ---- 1: training across the two hosts ------------------------------------------------------------
section "1 mpirun -H A:1,B:1 dtrain train --strategy ddp"
run ref 120 env -u DT_RUN_ID "$DTRUN" --standalone --nproc-per-node 2 -- "$DTRAIN" train --strategy ddp "${common[@]}" \
  --epochs 30 --out "$tmp/ref"
[ $rc -eq 0 ] || { fail "the one-host dtrun reference"; show ref; }
for be in mpi:mpi auto:mpi tcp:tcp; do
  mpirun_hosts "$be" 120 "$DTRAIN" train --strategy ddp "${common[@]}" --epochs 30 --backend "${be%%:*}" "${master[@]}" \
    --out "$tmp/${be%%:*}"
  n=$(grep -cE "rank [01] of 2 \(local 0 of 1, 2 host\(s\)\), backend ${be#*:}," "$tmp/$be.out")
  if [ $rc -eq 0 ] && [ "$n" -eq 2 ] &&
    same_tensors "$tmp/ref/model.safetensors" "$tmp/${be%%:*}/model.safetensors"; then
    ok "--backend ${be%%:*}: 2 ranks on 2 hosts over ${be#*:}, the one-host weights bit for bit"
  else
    fail "--backend ${be%%:*}: exit $rc, $n of 2 ranks report 2 hosts and backend ${be#*:}"
    tail -n 15 "$tmp/$be.out" >&2
  fi
done

# ---- 2: a rank killed ----------------------------------------------------------------------------------
section "2 rank 1 on host B killed"
rank_in() { for p in $(ip netns pids "$1"); do [ "$(cat "/proc/$p/comm" 2>/dev/null)" = dtrain ] && echo "$p"; done; }
mpirun_hosts killed 60 "$DTRAIN" train --strategy ddp "${common[@]}" --epochs 1000 --backend tcp \
  "${master[@]}" --out "$tmp/killed" &
mp=$!
if ! wait_line "$tmp/killed/metrics.csv" '^2,' 30; then
  fail "killed: epoch 2 not reached"
  tail -n 15 "$tmp/killed.out" >&2
else
  victim=$(rank_in "$B")
  kill -9 $victim
  t0=$(date +%s.%N)
  wait_for "$mp" 30
  secs=$(awk -v s="$t0" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }')
  sleep 0.5
  left=$(leftovers | tr '\n' ' ')
  if [ $rc -ne 0 ] && awk -v s="$secs" 'BEGIN { exit !(s < 10) }' && [ -z "$left" ] &&
    grep -q "process rank 1 with PID $victim on node ${net}2 exited on signal 9" "$tmp/killed.out"; then
    ok "killed: mpirun exited $rc after $secs s naming rank 1 on ${net}2; nothing left on A or B"
  else
    fail "killed: exit $rc after $secs s, left '$left'"
    tail -n 15 "$tmp/killed.out" >&2
  fi
fi

# ---- 3: a link down --------------------------------------------------------------------------------------
section "3 host B's link down mid-training, then a relaunch"
export DT_TIMEOUT=5
mpirun_hosts down 60 "$DTRAIN" train --strategy ddp "${common[@]}" --epochs 30 --backend tcp "${master[@]}" \
  --save-every 1 --out "$tmp/down" &
mp=$!
if ! wait_line "$tmp/down/metrics.csv" '^3,' 30; then
  fail "link down: epoch 3 not reached"
  tail -n 15 "$tmp/down.out" >&2
else
  ip -n "$B" link set "mb$tag" down
  t0=$(date +%s.%N)
  wait_for "$mp" 40
  secs=$(awk -v s="$t0" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }')
  for i in $(seq 50); do [ -z "$(leftovers)" ] && break; sleep 0.1; done
  left=$(leftovers | tr '\n' ' ')
  # Two timers race here: rank 0's DT_TIMEOUT (5 s) and mpirun's keepalive on its daemon's link (~4-5 s; a
  # later one would not do: once mpirun has sent the dead daemon a kill order, keepalive no longer applies and it
  # hangs). Rank 0's failure, when it came first, names rank 1 and its address.
  named=$(grep -c "allreduce #[0-9]* (.*) on rank 0: " "$tmp/down.out")
  if [ $rc -ne 0 ] && awk -v s="$secs" 'BEGIN { exit !(s < 15) }' && [ -z "$left" ] &&
    { [ "$named" -eq 0 ] || grep -q "on rank 0: waiting for rank 1 (${net}2:[0-9]*)" "$tmp/down.out"; } &&
    grep -q "lost communication with a remote daemon" "$tmp/down.out"; then
    ok "link down: $([ "$named" -eq 0 ] && echo "mpirun's keepalive first" || echo "rank 0 named rank 1 (${net}2)"), mpirun ended after $secs s; nothing left on A or B"
  else
    fail "link down: exit $rc after $secs s, left '$left'"
    grep -v '^epoch' "$tmp/down.out" | tail -n 15 >&2
  fi
  ip -n "$B" link set "mb$tag" up
  last=$(ls "$tmp/down/snapshots" 2>/dev/null | tail -n 1)
  mpirun_hosts resumed 120 "$DTRAIN" train --strategy ddp "${common[@]}" --epochs 30 --backend tcp "${master[@]}" \
    --save-every 1 --resume auto --out "$tmp/down"
  if [ $rc -eq 0 ] && [ -n "$last" ] && grep -q "resumed from .*$last" "$tmp/resumed.out" &&
    same_tensors "$tmp/ref/model.safetensors" "$tmp/down/model.safetensors"; then
    ok "relaunch: resumed from $last, the uninterrupted weights bit for bit"
  else
    fail "relaunch: exit $rc, last snapshot '$last'"
    grep -v '^epoch' "$tmp/resumed.out" | tail -n 15 >&2
  fi
fi

section "done"
exit $((failures > 0))
