/* dtrain status codes: one X-macro table gives the enum, names and messages. */
#ifndef DTRAIN_STATUS_H
#define DTRAIN_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* X(enum suffix, message). The message says what went wrong in general; the
 * thread-local detail (dt_last_error) says what and where for this failure. */
#define DT_STATUS_MAP(X)                                                     \
  X(OK, "success")                                                           \
  X(INVALID_ARGUMENT, "invalid argument")                                    \
  X(OUT_OF_MEMORY, "out of memory")                                          \
  X(IO, "input/output error")                                                \
  X(NOT_FOUND, "not found")                                                  \
  X(CORRUPT, "corrupt or malformed data")                                    \
  X(SHAPE_MISMATCH, "tensor shape mismatch")                                 \
  X(UNSUPPORTED, "unsupported")                                              \
  X(TIMEOUT, "timed out")                                                    \
  X(PEER_LOST, "peer lost")                                                  \
  X(INTERRUPTED, "interrupted")                                              \
  X(MISMATCH, "ranks disagree (collective, world size or model differs)")    \
  X(INTERNAL, "internal error (a bug in dtrain: please report it)")         \
  X(USAGE, "the configuration does not fit the data or the model")

typedef enum dt_status {
#define DT_STATUS_ENUM_(name, msg) DT_##name,
  DT_STATUS_MAP(DT_STATUS_ENUM_)
#undef DT_STATUS_ENUM_
  DT_STATUS_COUNT
} dt_status;

/* "DT_IO", ... ; "DT_UNKNOWN" for values outside the table. */
const char *dt_status_name(dt_status s);
/* The general message of a status ("input/output error"). */
const char *dt_status_message(dt_status s);
/* Detail of the last failure on this thread ("fashion-mnist/train-images:
 * bad magic 0x00000000, expected 0x00000803"), or "" if none was recorded.
 * Valid until the next failing dtrain call on this thread. */
const char *dt_last_error(void);
/* Forget the detail of the last failure on this thread. */
void dt_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif
