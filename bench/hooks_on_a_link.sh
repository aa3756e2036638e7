#!/usr/bin/env bash
# DDP between two hosts joined by a link of a given rate, with and without a gradient compression hook: two
# network namespaces and a veth pair stand for two machines (needs root and iproute2's tc), a token bucket on
# each end caps the link, one rank of one thread on each (`dtrun --nnodes 2`, tcp between them). Each repetition
# runs --comm-hook none, bf16 and fp16 in turn (the order rotating), and the table gives each one's median train
# samples/s (the second epoch's: the first is warm-up) and its ratio to none.
#
#   bench/hooks_on_a_link.sh [BUILD_DIR] [RATE] [REPS] [-- TRAIN FLAGS]
#   e.g. bench/hooks_on_a_link.sh build 1gbit 3 -- --model mlp --limit-train 12800
set -euo pipefail
case "${1:-}" in -*) echo "usage: bench/hooks_on_a_link.sh [BUILD_DIR] [RATE] [REPS] [-- TRAIN FLAGS]" >&2; exit 2 ;; esac
build=${1:-build}
rate=${2:-1gbit}
reps=${3:-3}
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || { echo "hooks_on_a_link.sh: REPS '$reps' is not a positive whole number" >&2; exit 2; }
shift $(($# < 3 ? $# : 3))
[ "${1:-}" = "--" ] && shift
flags=("$@")
[ ${#flags[@]} -gt 0 ] || flags=(--model fashioncnn --limit-train 6400)
[ "$(id -u)" = 0 ] || { echo "hooks_on_a_link.sh: needs root (network namespaces)" >&2; exit 2; }
command -v tc >/dev/null || { echo "hooks_on_a_link.sh: needs tc (apt-get install iproute2)" >&2; exit 2; }
for x in "$build/dtrun" "$build/dtrain"; do [ -x "$x" ] || { echo "hooks_on_a_link.sh: $x is not built" >&2; exit 2; }; done

A=dthA$$ B=dthB$$ net=10.$((160 + $$ % 40)).$(($$ % 250))
tmp=$(mktemp -d)
cleanup() { ip netns del "$A" 2>/dev/null || true; ip netns del "$B" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
ip netns add "$A"
ip netns add "$B"
ip link add "vha$$" type veth peer name "vhb$$"
ip link set "vha$$" netns "$A"
ip link set "vhb$$" netns "$B"
for side in "$A vha$$ $net.1" "$B vhb$$ $net.2"; do
  read -r ns dev ip <<<"$side"
  ip -n "$ns" addr add "$ip/24" dev "$dev"
  ip -n "$ns" link set "$dev" up
  ip -n "$ns" link set lo up
  tc -n "$ns" qdisc add dev "$dev" root tbf rate "$rate" burst 256kb latency 50ms
done

# one run: the second epoch's samples/s on rank 0
run() {
  local hook=$1 port=$((20000 + RANDOM % 20000)) out=$tmp/$1.$RANDOM
  for node in 0 1; do
    ip netns exec "$([ $node = 0 ] && echo "$A" || echo "$B")" timeout -k 5 900 \
      "$build/dtrun" --nnodes 2 --node-rank $node --nproc-per-node 1 --threads-per-proc 1 --master-addr "$net.1" \
      --master-port $port --run-id "hooks$port" -- \
      "$build/dtrain" train --strategy ddp --epochs 2 --limit-test 500 --progress none --comm-hook "$hook" \
      --out "$out$node" "${flags[@]}" >"$out$node.log" 2>&1 &
  done
  wait
  if [ ! -s "${out}0/metrics.jsonl" ]; then
    echo "hooks_on_a_link.sh: the run with --comm-hook $hook failed:" >&2
    tail -n 3 "${out}0.log" "${out}1.log" >&2
    exit 1
  fi
  tail -1 "${out}0/metrics.jsonl" | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["train_samples_per_s"])'
}

hooks=(none bf16 fp16)
declare -A got
for ((r = 0; r < reps; r++)); do
  for ((k = 0; k < 3; k++)); do
    h=${hooks[$(((k + r) % 3))]}
    got[$h]="${got[$h]:-} $(run "$h")"
  done
done
echo "# DDP x2 between two network namespaces over a $rate veth (tbf), tcp; train flags: ${flags[*]}; $reps reps"
flags_of_cpu=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE 'avx2|fma|f16c|avx512f|avx512_bf16|amx_bf16' | tr '\n' ' ')
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'); ${flags_of_cpu}; $(nproc) CPUs"
med() { printf '%s\n' $1 | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
base=$(med "${got[none]}")
for h in "${hooks[@]}"; do
  m=$(med "${got[$h]}")
  printf '%-5s median %10.1f samples/s  (%s)  %.2fx none\n' "$h" "$m" "${got[$h]# }" "$(awk -v a="$m" -v b="$base" 'BEGIN { print a / b }')"
done
