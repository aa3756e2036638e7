/* The one error path of the helper programs (the parity dumps, the bench step timers): TRY(what, expr) returns 1
 * from the calling function after "<TOOL_NAME>: <what>: <STATUS>: <detail>" on stderr. Define TOOL_NAME first. */
#ifndef DT_TESTS_TOOL_TRY_H
#define DT_TESTS_TOOL_TRY_H

#include <stdio.h>

#include "dtrain/status.h"

static inline int tool_fail(const char *what, dt_status s) {
  fprintf(stderr, "%s: %s: %s: %s\n", TOOL_NAME, what, dt_status_name(s), dt_last_error());
  return 1;
}

#define TRY(what, expr)                          \
  do {                                           \
    dt_status s_ = (expr);                       \
    if (s_ != DT_OK) return tool_fail(what, s_); \
  } while (0)

#endif
