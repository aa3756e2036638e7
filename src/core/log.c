/* Logging to stderr, filtered by DT_DEBUG=error|warn|info|trace (default warn). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <pthread.h>

#include "core/impl.h"

static dt_log_level log_level;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static int log_level_forced;

static void log_init(void) {
  static const char *const names[] = {"error", "warn", "info", "trace"};
  const char *v = NULL;
  log_level = DT_LOG_LEVEL_WARN;
  if (log_level_forced || dt_tunable_str("DT_DEBUG", &v) != DT_OK || !v || !*v) return;
  for (int i = 0; i < 4; i++)
    if (strcasecmp(v, names[i]) == 0) {
      log_level = (dt_log_level)i;
      return;
    }
  fprintf(stderr, "dtrain WARN [log] DT_DEBUG=%s is not one of error|warn|info|trace; using warn\n", v);
}

dt_log_level dt_log_get_level(void) {
  pthread_once(&log_once, log_init);
  return log_level;
}

void dt_log_set_level(dt_log_level level) {
  log_level_forced = 1;
  pthread_once(&log_once, log_init);
  log_level = level;
}

void dt_log_(dt_log_level level, const char *subsys, const char *fmt, ...) {
  static const char *const tags[] = {"ERROR", "WARN", "INFO", "TRACE"};
  if (level > dt_log_get_level()) return;
  char line[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  /* One fprintf per line so lines of different threads do not interleave. */
  fprintf(stderr, "dtrain %s [%s] %s\n", tags[level], subsys, line);
}
