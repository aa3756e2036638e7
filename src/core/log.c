/* Logging to stderr, filtered by DT_DEBUG: a level (error|warn|info|trace, default warn), or subsystems
 * ("ddp", "ddp,store") whose every message is shown while the others stay at warn. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <pthread.h>

#include "core/impl.h"

#define MAX_SUBSYS 8

static dt_log_level log_level;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static int log_level_forced;
static char subsys_on[MAX_SUBSYS][16]; /* DT_DEBUG's subsystems: everything they log is shown */
static int n_subsys;

/* "ddp,store": subsystem names of lower-case letters, 1..15 each; 0 when v is not such a list. */
static int read_subsystems(const char *v) {
  int n = 0;
  for (const char *s = v; *s;) {
    size_t len = strspn(s, "abcdefghijklmnopqrstuvwxyz");
    if (len == 0 || len >= sizeof subsys_on[0] || n == MAX_SUBSYS || (s[len] && s[len] != ',')) return 0;
    memcpy(subsys_on[n], s, len);
    subsys_on[n++][len] = '\0';
    s += len + (s[len] == ',');
  }
  n_subsys = n;
  return n > 0;
}

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
  if (read_subsystems(v)) return;
  fprintf(stderr, "dtrain WARN [log] DT_DEBUG=%s is not a level (error|warn|info|trace) nor subsystems (e.g. ddp or "
          "ddp,store); using warn\n", v);
}

int dt_log_on(dt_log_level level, const char *subsys) {
  if (level <= dt_log_get_level()) return 1;
  for (int i = 0; i < n_subsys; i++)
    if (strcmp(subsys_on[i], subsys) == 0) return 1;
  return 0;
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
  if (!dt_log_on(level, subsys)) return;
  char line[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  /* One fprintf per line so lines of different threads do not interleave. */
  fprintf(stderr, "dtrain %s [%s] %s\n", tags[level], subsys, line);
}
