#!/usr/bin/env bash
# A launcher worker for test_train_ddp.sh: writes its pid to $DDP_PID_DIR/pid.$RANK.$DT_RESTART_COUNT
# (when DDP_PID_DIR is set), then becomes `dtrain ARGS...` (same pid).
#   DDP_CRASH_RANK=R  rank R exits 1 after DDP_CRASH_DELAY seconds (default 0.5) instead of
#                     training, while DT_RESTART_COUNT is 0 (a failure of the first round only)
set -u
if [ -n "${DDP_PID_DIR:-}" ]; then echo $$ >"$DDP_PID_DIR/pid.${RANK:-x}.${DT_RESTART_COUNT:-0}"; fi
if [ -n "${DDP_CRASH_RANK:-}" ] && [ "${RANK:-}" = "$DDP_CRASH_RANK" ] && [ "${DT_RESTART_COUNT:-0}" = 0 ]; then
  sleep "${DDP_CRASH_DELAY:-0.5}"
  echo "ddp_worker.sh: rank $RANK crashing on round 0 on purpose" >&2
  exit 1
fi
exec "${DT_BUILD_DIR:?}/dtrain" "$@"
