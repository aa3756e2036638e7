#!/usr/bin/env bash
# Two simulated hosts: network namespaces joined by a veth pair, two ranks on
# each. Auto selection must pick the hierarchical backend (shm inside a
# namespace, tcp across), --backend tcp must work across, and dtrun must run a
# two-node job across them. Skipped (77) where namespaces cannot be made.
set -u
b=${DT_BUILD_DIR:?}
[ "$(id -u)" -eq 0 ] && command -v ip >/dev/null || { echo "skip: needs root and iproute2 for network namespaces"; exit 77; }
tag=$$
A=dtA$tag B=dtB$tag
net=10.$((200 + tag % 50)).$((tag % 250)).
cleanup() {
  for p in $(jobs -p); do kill -9 "$p" 2>/dev/null; done
  ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null
}
trap cleanup EXIT
if ! { ip netns add "$A" && ip netns add "$B" &&
       ip link add "va$tag" type veth peer name "vb$tag" &&
       ip link set "va$tag" netns "$A" && ip link set "vb$tag" netns "$B" &&
       ip -n "$A" addr add "${net}1/24" dev "va$tag" && ip -n "$B" addr add "${net}2/24" dev "vb$tag" &&
       ip -n "$A" link set "va$tag" up && ip -n "$B" link set "vb$tag" up &&
       ip -n "$A" link set lo up && ip -n "$B" link set lo up; } 2>/tmp/netns_err.$tag; then
  echo "skip: cannot create network namespaces here: $(head -1 /tmp/netns_err.$tag)"; rm -f /tmp/netns_err.$tag; exit 77
fi
rm -f /tmp/netns_err.$tag
fail=0
out=$(mktemp -d)

secret=$(/usr/bin/python3 -c 'import secrets; print(secrets.token_hex(32))')
printf '%s\n' "$secret" >"$out/secret"
chmod 600 "$out/secret"

# ranks 0,1 in A and 2,3 in B, torchrun-style variables set by hand; SECRET: DT_JOB_SECRET of every rank.
by_hand() { # name port worker-flags...
  local name=$1 port=$2; shift 2
  for r in 0 1 2 3; do
    ns=$A; [ $r -ge 2 ] && ns=$B
    ip netns exec "$ns" env ${SECRET:+DT_JOB_SECRET=$SECRET} RANK=$r WORLD_SIZE=4 LOCAL_RANK=$((r % 2)) LOCAL_WORLD_SIZE=2 \
      MASTER_ADDR="${net}1" MASTER_PORT=$port DT_TIMEOUT=60 OMP_NUM_THREADS=1 DT_RUN_ID=netns$tag \
      timeout 120 "$b/tests/dist_worker" "$@" >"$out/$name.$r" 2>&1 &
  done
  local rc=0
  for p in $(jobs -p); do wait "$p" || rc=1; done
  if [ $rc -ne 0 ]; then echo "FAIL: $name"; tail -5 "$out/$name".*; fail=1; else echo "ok   $name: $(grep -v ' WARN ' "$out/$name.0" | head -1)"; fi
}
# with a job secret (the leaders' and the mesh's hellos prove it), and without (open, as torchrun's: rank 0 warns)
SECRET=$secret by_hand hierarchical 29611 --expect-backend shm+tcp --large
SECRET=$secret by_hand tcp-across 29612 --backend tcp --expect-backend tcp
SECRET= by_hand tcp-across-no-secret 29614 --backend tcp --expect-backend tcp
grep -q "has no job secret" "$out/tcp-across-no-secret.0" || { echo "FAIL: no warning of the open store"; fail=1; }
grep -q "has no job secret" "$out/hierarchical.0" && { echo "FAIL: warned of an open store with a secret"; fail=1; }

# dtrun: one agent per namespace, node 0 serves the store.
for node in 0 1; do
  ns=$A; [ $node -eq 1 ] && ns=$B
  ip netns exec "$ns" timeout 120 "$b/dtrun" --nnodes 2 --node-rank $node --master-addr "${net}1" --master-port 29613 \
    --nproc-per-node 2 --run-id netns$tag --secret-file "$out/secret" -- "$b/tests/dist_worker" --expect-backend shm+tcp >"$out/dtrun.$node" 2>&1 &
done
rc=0
for p in $(jobs -p); do wait "$p" || rc=1; done
ok=$(cat "$out"/dtrun.* | grep -c "backend shm+tcp: .* 0 failed")
if [ $rc -ne 0 ] || [ "$ok" -ne 4 ]; then echo "FAIL: dtrun across namespaces ($ok of 4 ranks ok)"; tail -5 "$out"/dtrun.*; fail=1
else echo "ok   dtrun --nnodes 2 across namespaces: 4 ranks"; fi
rm -rf "$out"
exit $fail
