#!/usr/bin/env bash
# A worker for the dtrun tests: `dtrun_worker.sh MODE [ARGS]`, behaviour by mode.
#   env                     print the launcher's variables, one NAME=value per line
#   lines N CODE RANK       print N lines; RANK exits with CODE, the others sleep until stopped
#   kill9 RANK              RANK kills itself with SIGKILL, the others sleep until stopped
#   fail-until N RANK       RANK fails while DT_RESTART_COUNT < N; everyone prints its round
#   always-fail             print the round, exit 1
#   wait-term DIR           write DIR/pid.RANK; on SIGTERM write DIR/term.RANK and exit 0
set -u
mode=$1
shift
case "$mode" in
env)
  for v in RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK ROLE_RANK MASTER_ADDR MASTER_PORT \
    DT_RUN_ID TORCHELASTIC_RUN_ID DT_RESTART_COUNT TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS \
    DT_STORE_SERVED OMP_NUM_THREADS DT_NUM_THREADS OMP_WAIT_POLICY; do
    echo "$v=${!v-unset}"
  done
  ;;
lines)
  for ((i = 1; i <= $1; i++)); do echo "rank $RANK line $i"; done
  echo "rank $RANK says goodbye" >&2
  [ "$RANK" = "$3" ] && exit "$2"
  sleep 30
  ;;
kill9)
  echo "rank $RANK before the kill"
  [ "$RANK" = "$1" ] && kill -9 $$
  sleep 30
  ;;
fail-until)
  echo "round $DT_RESTART_COUNT rank $RANK"
  if [ "$RANK" = "$2" ] && [ "$DT_RESTART_COUNT" -lt "$1" ]; then exit 1; fi
  ;;
always-fail)
  echo "round $DT_RESTART_COUNT rank $RANK"
  exit 1
  ;;
wait-term)
  trap 'echo term > "$1/term.$RANK"; exit 0' TERM
  echo $$ > "$1/pid.$RANK"
  for ((i = 0; i < 300; i++)); do sleep 0.1; done
  ;;
*)
  echo "dtrun_worker.sh: unknown mode $mode" >&2
  exit 99
  ;;
esac
