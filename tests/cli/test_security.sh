#!/usr/bin/env bash
# The job secret end to end (issue 17):
#  1. dtrun --standalone makes a secret and hands it to the workers in DT_JOB_SECRET only: it is in
#     no /proc/<pid>/cmdline, and no output of the run (logs, metrics, summary, config, snapshots,
#     trace, TensorBoard events, report) holds it;
#  2. the attack step by step against a running 2-rank DDP job (store_attack.py: the old handshake,
#     guessed secrets, requests without a proof, a replayed handshake) fails, the refusals are
#     logged once, and the job ends with the same weights as an undisturbed run;
#  3. a short stress (a few hundred hostile connections: random bytes, half-open handshakes, slow
#     senders, wrong proofs) against a running job: nobody admitted, same weights
#     (the 1,000-connection run with throughput is bench/store_stress.sh);
#  4. --secret-file: refused unless mode 0600 and owned by the user; a malformed DT_JOB_SECRET is
#     refused without echoing it; without a secret, a job on a fixed port starts and warns once.
set -u
b=${DT_BUILD_DIR:?DT_BUILD_DIR must name the build directory}
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export DT_TIMEOUT=60
DTRAIN=$b/dtrain
DTRUN=$b/dtrun
ATTACK=$SRC/tests/cli/store_attack.py
for x in "$DTRAIN" "$DTRUN"; do [ -x "$x" ] || { echo "FAIL: $x is not built" >&2; exit 1; }; done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT OMPI_COMM_WORLD_RANK PMI_RANK SLURM_PROCID
unset OMPI_COMM_WORLD_SIZE SLURM_STEP_NUM_TASKS # they decide whether a train without --strategy runs
unset DT_JOB_SECRET DT_RUN_ID
. "$SRC/tests/cli/common.sh" # fail, ok, section, alive, wait_for, wait_line, same_tensors, use_tmp
use_tmp
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
listening() { /usr/bin/python3 -c "import socket,sys; s=socket.socket(); sys.exit(s.connect_ex(('127.0.0.1',$1)))"; }
# The same small DDP job every time: same seed and world, so the same weights bit for bit.
train=("$DTRAIN" train --strategy ddp --model mlp --data synthetic:60000,in=32,out=4,task=classification,seed=3
       --epochs 3 --batch-size 64 --lr 0.05 --seed 7 --progress none)
# pids of dtrun and of its children
family() { echo "$1"; pgrep -P "$1"; }

# ---- 1. standalone: the secret travels in the environment only ---------------------------------------
section "1/4 dtrun --standalone: the secret is in the workers' environment only"
"$DTRUN" --standalone --nproc-per-node 2 --log-dir "$tmp/logs" -- "${train[@]}" --out "$tmp/alone" \
  --save-every 1 --trace "$tmp/alone/trace.json" --tensorboard "$tmp/alone/tb" >"$tmp/alone.out" 2>"$tmp/alone.err" &
pid=$!
bg_pids+=("$pid")
secret=""
for ((i = 0; i < 100; i++)); do
  [ -n "$secret" ] && break
  for w in $(pgrep -P "$pid"); do
    secret=$(tr '\0' '\n' <"/proc/$w/environ" 2>/dev/null | sed -n 's/^DT_JOB_SECRET=//p')
    [ -n "$secret" ] && break
  done
  [ -z "$secret" ] && sleep 0.05
done
leaks=0
for p in $(family "$pid"); do
  tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qF -- "${secret:-no-secret-seen}" && leaks=$((leaks + 1))
done
wait_for "$pid" 60
if [ "$rc" -ne 0 ]; then
  fail "standalone run: exit $rc: $(tail -n 5 "$tmp/alone.err")"
elif [ ${#secret} -ne 64 ]; then
  fail "standalone run: the workers got no 64-character DT_JOB_SECRET ('${#secret}' characters)"
else
  ok "standalone run: the workers got a fresh 256-bit DT_JOB_SECRET"
  [ "$leaks" -eq 0 ] && ok "the secret is in no /proc/<pid>/cmdline of dtrun or its workers" ||
    fail "the secret is in $leaks command line(s)"
  n_files=$(find "$tmp/alone" "$tmp/logs" "$tmp/alone.out" "$tmp/alone.err" -type f | wc -l)
  found=$(grep -rlaF -- "$secret" "$tmp/alone" "$tmp/logs" "$tmp/alone.out" "$tmp/alone.err")
  [ -f "$tmp/alone/trace.json" ] && [ -f "$tmp/alone/report.html" ] && ls "$tmp/alone/snapshots/"* >/dev/null 2>&1 ||
    fail "standalone run: trace, report or snapshots missing: $(ls "$tmp/alone")"
  [ -z "$found" ] && ok "the secret is in none of the run's $n_files output files (logs, summary, snapshots, trace, events, report)" ||
    fail "the secret is in $found"
fi

# ---- 2. the attack against a running job ----------------------------------------------------------------
section "2/4 the attack step by step against a running 2-rank DDP job"
export DT_JOB_SECRET=$(/usr/bin/python3 -c 'import secrets; print(secrets.token_hex(32))')
run_id=secure-run-17
p1=$(free_port)
timeout -k 2 60 "$DTRUN" --nnodes 1 --master-port "$p1" --nproc-per-node 2 --run-id "$run_id" -- "${train[@]}" \
  --out "$tmp/calm" >"$tmp/calm.out" 2>"$tmp/calm.err"
[ $? -eq 0 ] || fail "undisturbed run failed: $(tail -n 5 "$tmp/calm.err")"
p2=$(free_port)
"$DTRUN" --nnodes 1 --master-port "$p2" --nproc-per-node 2 --run-id "$run_id" -- "${train[@]}" \
  --out "$tmp/attacked" >"$tmp/attacked.out" 2>"$tmp/attacked.err" &
pid=$!
bg_pids+=("$pid")
for ((i = 0; i < 100; i++)); do listening "$p2" && break; sleep 0.05; done
/usr/bin/python3 "$ATTACK" attack 127.0.0.1 "$p2" "$run_id" "$DT_JOB_SECRET" >"$tmp/attack.log" 2>&1
arc=$?
alive "$pid" && during=1 || during=0
wait_for "$pid" 60
sed 's/^/    /' "$tmp/attack.log"
[ "$arc" -eq 0 ] && [ "$during" -eq 1 ] && ok "every step of the attack failed while the job ran" ||
  fail "attack: exit $arc, job still running at its end: $during"
[ "$rc" -eq 0 ] || fail "attacked run: exit $rc: $(tail -n 5 "$tmp/attacked.err")"
if same_tensors "$tmp/calm/model.safetensors" "$tmp/attacked/model.safetensors"; then
  ok "the attacked job's weights equal the undisturbed job's"
else
  fail "the attacked job's weights differ from the undisturbed job's"
fi
nlog=$(grep -c 'refused a connection from 127.0.0.1' "$tmp/attacked.err")
[ "$nlog" -eq 1 ] && ok "the refusals are logged once for the address" ||
  fail "$nlog log lines for the refused address: $(grep refused "$tmp/attacked.err" | head -3)"
grep -rqaF -- "$DT_JOB_SECRET" "$tmp"/calm* "$tmp"/attacked* && fail "the secret is in an output of the runs" ||
  ok "the secret is in no output of the two runs"

# ---- 3. a short stress ------------------------------------------------------------------------------------
section "3/4 300 hostile connections against a running job"
p3=$(free_port)
"$DTRUN" --nnodes 1 --master-port "$p3" --nproc-per-node 2 --run-id "$run_id" -- "${train[@]}" \
  --out "$tmp/stressed" >"$tmp/stressed.out" 2>"$tmp/stressed.err" &
pid=$!
bg_pids+=("$pid")
for ((i = 0; i < 100; i++)); do listening "$p3" && break; sleep 0.02; done
/usr/bin/python3 "$ATTACK" stress 127.0.0.1 "$p3" 300 2 >"$tmp/stress.log" 2>&1
src=$?
wait_for "$pid" 60
sed 's/^/    /' "$tmp/stress.log"
[ "$src" -eq 0 ] && [ "$rc" -eq 0 ] && ok "nobody admitted, the job finished" ||
  fail "stress: exit $src, job exit $rc: $(tail -n 3 "$tmp/stressed.err")"
same_tensors "$tmp/calm/model.safetensors" "$tmp/stressed/model.safetensors" &&
  ok "the stressed job's weights equal the undisturbed job's" || fail "the stressed job's weights differ"
nlog=$(grep -c 'refused a connection' "$tmp/stressed.err")
[ "$nlog" -le 5 ] && ok "300 refusals, $nlog log line(s)" || fail "300 refusals gave $nlog log lines"

# ---- 4. where the secret comes from ------------------------------------------------------------------------
section "4/4 --secret-file, DT_JOB_SECRET, and no secret at all"
/usr/bin/python3 -c 'import secrets; print(secrets.token_hex(32))' >"$tmp/secret"
chmod 644 "$tmp/secret"
"$DTRUN" --nnodes 1 --master-port "$(free_port)" --secret-file "$tmp/secret" -- true >"$tmp/f.out" 2>"$tmp/f.err"
rc=$?
[ "$rc" -eq 2 ] && grep -q "mode 0644; it must be 0600" "$tmp/f.err" && ok "a secret file of mode 0644 is refused (exit 2)" ||
  fail "mode 0644: exit $rc: $(cat "$tmp/f.err")"
chmod 600 "$tmp/secret"
if [ "$(id -u)" -eq 0 ] && id nobody >/dev/null 2>&1; then
  chown nobody "$tmp/secret"
  "$DTRUN" --nnodes 1 --master-port "$(free_port)" --secret-file "$tmp/secret" -- true >"$tmp/f.out" 2>"$tmp/f.err"
  rc=$?
  [ "$rc" -eq 2 ] && grep -q "not to this user" "$tmp/f.err" && ok "a secret file of another user is refused (exit 2)" ||
    fail "another user's file: exit $rc: $(cat "$tmp/f.err")"
  chown 0 "$tmp/secret"
fi
unset DT_JOB_SECRET
p4=$(free_port)
timeout -k 2 30 "$DTRUN" --nnodes 1 --master-port "$p4" --nproc-per-node 2 --secret-file "$tmp/secret" -- \
  "$DTRAIN" bench allreduce -b 8 -e 1K -n 2 -w 1 --check >"$tmp/f.out" 2>"$tmp/f.err"
rc=$?
[ "$rc" -eq 0 ] && ! grep -q "no job secret" "$tmp/f.err" && ok "a 0600 secret file of the user admits the workers" ||
  fail "secret file 0600: exit $rc: $(tail -n 3 "$tmp/f.err")"
DT_JOB_SECRET=short-$RANDOM "$DTRUN" --nnodes 1 --master-port "$(free_port)" -- true >"$tmp/f.out" 2>"$tmp/f.err"
rc=$?
[ "$rc" -eq 2 ] && grep -q "DT_JOB_SECRET: a job secret has 32..256 characters" "$tmp/f.err" && ! grep -q "short-" "$tmp/f.err" &&
  ok "a malformed DT_JOB_SECRET is refused without being echoed (exit 2)" || fail "short secret: exit $rc: $(cat "$tmp/f.err")"
timeout -k 2 30 "$DTRUN" --nnodes 1 --master-port "$(free_port)" --nproc-per-node 2 -- \
  "$DTRAIN" bench allreduce -b 8 -e 1K -n 2 -w 1 --check >"$tmp/f.out" 2>"$tmp/f.err"
rc=$?
nw=$(grep -c "no job secret" "$tmp/f.err")
[ "$rc" -eq 0 ] && [ "$nw" -eq 1 ] && grep -q -- "--secret-file" "$tmp/f.err" &&
  ok "without a secret the job starts and dtrun warns once, naming --secret-file" ||
  fail "no secret: exit $rc, $nw warning(s): $(cat "$tmp/f.err")"
"$DTRUN" --help | grep -q -- "--secret-file PATH" && ok "dtrun --help documents --secret-file" || fail "--secret-file not in --help"

[ "$failures" -eq 0 ] || { echo "$failures check(s) failed" >&2; exit 1; }
echo "all security checks passed"
