/* TensorBoard event files: scalars as TFRecord-framed Event protobufs, encoded by hand (no protobuf library). */
#ifndef DT_IO_TENSORBOARD_H
#define DT_IO_TENSORBOARD_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/status.h"

/* Longest tag accepted (bytes): a record then always fits one small buffer. */
#define DT_TB_TAG_MAX 4096

/* One open events file. Owned by the caller: dt_tb_close releases it. */
typedef struct dt_tb_writer dt_tb_writer;

/* Creates DIR (mkdir -p) and DIR/events.out.tfevents.<unix seconds, 10 digits>.<hostname><suffix>
 * (suffix may be NULL or "", e.g. ".rank1" so ranks sharing a directory do not collide), and
 * writes and flushes the first record, an Event with wall_time and file_version "brain.Event:2".
 * The file is created exclusively: an existing file of that name (same second, host and suffix)
 * is DT_IO rather than overwritten. DT_IO naming the path on failure; *out is set only on success. */
dt_status dt_tb_open(const char *dir, const char *suffix, dt_tb_writer **out);

/* Appends Event{wall_time = now (seconds since the epoch), step, summary{value{tag, simple_value}}}.
 * tag: 1..DT_TB_TAG_MAX bytes of UTF-8 (TensorBoard's protos are proto3, whose strings must be
 * UTF-8), else DT_INVALID_ARGUMENT. Buffered: dt_tb_flush makes it visible. DT_IO naming the file
 * when the write fails (disk full). */
dt_status dt_tb_scalar(dt_tb_writer *w, const char *tag, int64_t step, float value);

/* fflush: TensorBoard reads the file while it grows. DT_IO naming the file on failure. */
dt_status dt_tb_flush(dt_tb_writer *w);

/* Flushes and closes; a failure here is logged as a warning (call dt_tb_flush first to see it
 * as a status). NULL is a no-op. */
void dt_tb_close(dt_tb_writer *w);

/* The events file's path; valid until dt_tb_close. */
const char *dt_tb_path(const dt_tb_writer *w);

/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of n bytes: "123456789" -> 0xE3069283. */
uint32_t dt_crc32c(const void *data, size_t n);
/* TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8 (a CRC of data that holds
 * CRCs is then not itself a plain CRC). */
uint32_t dt_crc32c_mask(uint32_t crc);

#endif
