/* Status names and messages from the X-macro table, and the per-thread detail string. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/impl.h"

static const char *const status_names[] = {
#define DT_NAME_(name, msg) "DT_" #name,
    DT_STATUS_MAP(DT_NAME_)
#undef DT_NAME_
};
static const char *const status_messages[] = {
#define DT_MSG_(name, msg) msg,
    DT_STATUS_MAP(DT_MSG_)
#undef DT_MSG_
};

static _Thread_local char last_error[1024];

const char *dt_status_name(dt_status s) {
  return (unsigned)s < DT_STATUS_COUNT ? status_names[s] : "DT_UNKNOWN";
}

const char *dt_status_message(dt_status s) {
  return (unsigned)s < DT_STATUS_COUNT ? status_messages[s] : "unknown status";
}

const char *dt_last_error(void) { return last_error; }

void dt_clear_error(void) { last_error[0] = '\0'; }

dt_status dt_error(dt_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  DT_LOG_TRACE("error", "%s: %s", dt_status_name(s), last_error);
  return s;
}

dt_status dt_error_prefix(dt_status s, const char *fmt, ...) {
  char prefix[512], old[sizeof last_error];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, last_error, sizeof old);
  if (old[0])
    snprintf(last_error, sizeof last_error, "%.500s: %.500s", prefix, old);
  else
    snprintf(last_error, sizeof last_error, "%s", prefix);
  return s;
}
