/* Internal helpers shared by all of libdtrain: error recording, checks, logging. */
#ifndef DT_CORE_IMPL_H
#define DT_CORE_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "dtrain/core.h"
#include "dtrain/status.h"

#if defined(__GNUC__)
#define DT_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define DT_PRINTF(f, a)
#endif

/* Records the detail string of a failure on this thread and returns s, so a
 * failing path reads `return dt_error(DT_IO, "%s: %s", path, strerror(errno));`.
 * The detail names what and where; the status says what kind. */
dt_status dt_error(dt_status s, const char *fmt, ...) DT_PRINTF(2, 3);
/* Prefixes the current detail with context ("loading model.safetensors: ..."). */
dt_status dt_error_prefix(dt_status s, const char *fmt, ...) DT_PRINTF(2, 3);

/* Propagates a non-OK status to the caller (NCCLCHECK style), leaving a
 * breadcrumb at trace level. */
#define DT_CHECK(expr)                                                          \
  do {                                                                          \
    dt_status dt_check_s_ = (expr);                                             \
    if (dt_check_s_ != DT_OK) {                                                 \
      dt_log_(DT_LOG_LEVEL_TRACE, "check", "%s:%d: %s -> %s", __FILE__, __LINE__, #expr, \
              dt_status_name(dt_check_s_));                                     \
      return dt_check_s_;                                                       \
    }                                                                           \
  } while (0)

/* Same, but jumps to a cleanup label with the status in variable st. */
#define DT_CHECK_GOTO(expr, st, label) \
  do {                                 \
    (st) = (expr);                     \
    if ((st) != DT_OK) goto label;     \
  } while (0)

/* ---- logging: DT_DEBUG=error|warn|info|trace, or subsystems shown in full ("ddp,store"); subsystem names the
 * area ---- */
void dt_log_(dt_log_level level, const char *subsys, const char *fmt, ...) DT_PRINTF(3, 4);
/* 1 when a message of this level and subsystem is shown. */
int dt_log_on(dt_log_level level, const char *subsys);
#define DT_LOG_ERROR(sub, ...) dt_log_(DT_LOG_LEVEL_ERROR, sub, __VA_ARGS__)
#define DT_LOG_WARN(sub, ...) dt_log_(DT_LOG_LEVEL_WARN, sub, __VA_ARGS__)
#define DT_LOG_INFO(sub, ...)                                                     \
  do {                                                                            \
    if (dt_log_on(DT_LOG_LEVEL_INFO, sub)) dt_log_(DT_LOG_LEVEL_INFO, sub, __VA_ARGS__); \
  } while (0)
#define DT_LOG_TRACE(sub, ...)                                                    \
  do {                                                                            \
    if (dt_log_on(DT_LOG_LEVEL_TRACE, sub)) dt_log_(DT_LOG_LEVEL_TRACE, sub, __VA_ARGS__); \
  } while (0)

/* ---- checked allocation ---------------------------------------------------- */
/* n * size bytes, 64-byte aligned, zeroed; DT_OUT_OF_MEMORY (with the size and
 * what for) on overflow or failure. */
dt_status dt_alloc_array(size_t n, size_t size, const char *what, void **out);
/* The same, not zeroed: for a buffer written before it is read. A large block comes fresh from the kernel (mapped,
 * or the heap grown) unless freed memory is reused, and its pages never written then take no memory (a model
 * context's activations, workspaces and backward buffers). Freed with dt_free. */
dt_status dt_alloc_array_unset(size_t n, size_t size, const char *what, void **out);
/* For tests: what every later dt_alloc_array_unset block holds when handed out. 0 (the default): whatever it held;
 * 1: NaN and 3.4e38 in turn, a float at a time, so a read before the first write shows in the results; 2: zeros, a
 * clean baseline to hold those results against (freed blocks come back: "whatever it held" may be a poison). */
void dt_alloc_poison_unset(int mode);
/* dt_alloc_array for a data set held in memory and read at random, a sample here and there: from 4 MiB, 2 MiB-aligned
 * and asked of the kernel as transparent huge pages (MADV_HUGEPAGE; "madvise" is the default THP mode) before its
 * pages are first written, so a sample's read finds its page in the TLB. Measured on 2 Zen 5 vCPUs: fetching
 * Fashion-MNIST batches at random took 330 us a batch of 64 at first, falling to 20 over 50,000 samples as every
 * 4 KiB page was first read; with huge pages 18-30 us from the start. Not for GEMM operands: with physical pages
 * contiguous, power-of-two strides meet in the same cache sets (the 2048-wide mlp ran 3-6% slower). */
dt_status dt_alloc_array_huge(size_t n, size_t size, const char *what, void **out);
/* Reads a byte of every 4 KiB page of [p, p + bytes): memory another process wrote, mapped here but not yet read,
 * costs a fault a page at its first read (about 5 us a page on the 2-vCPU machines); a run pays that at its
 * start instead of in its first step. */
void dt_touch_pages(const void *p, size_t bytes);
/* dst[0..n) = src[0..n) with streaming stores where the CPU has them (src/core/stream.c), fenced: for memory another
 * core reads next, whose copies of the lines the stores invalidate without first taking them. */
void dt_stream_store(float *dst, const float *src, size_t n);
/* This thread's scratch of at least n bytes, 64-byte aligned, for a kernel's work within one call (the bf16 GEMMs'
 * packed operands): kept and reused, grown as needed (what it held is then lost), freed when the thread exits;
 * NULL without memory. */
void *dt_thread_scratch(size_t n);
/* How many blocks dt_alloc and the functions above have handed out in this process (huge ones and thread scratch
 * included; not what other code takes from malloc): the tests check that a training step, once warm, takes none. */
uint64_t dt_alloc_count(void);
/* dt_keep_freed_memory, returning the mmap threshold glibc accepted (256 or 32 MiB), 0 where none was. */
int dt_keep_freed_memory_threshold(void);
/* Room for `need` elements of `size` bytes in *arr (doubling *cap from `first`,
 * keeping the first `used`); *arr and *cap change only on success. */
dt_status dt_grow_array(void **arr, int64_t *cap, int64_t used, int64_t need, int64_t first, size_t size,
                        const char *what);
/* a * b with overflow detection; 0 on success. */
/* A spin-wait's pause: the CPU's hint that this loop waits on memory another core writes. */
static inline void dt_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static inline int dt_mul_overflow(size_t a, size_t b, size_t *out) {
  return __builtin_mul_overflow(a, b, out);
}

/* ---- files ------------------------------------------------------------------- */
/* Opens path for reading if it is a regular file; *len is its size. DT_NOT_FOUND
 * or DT_IO naming the path otherwise. The caller fcloses *out. */
dt_status dt_file_open_regular(const char *path, FILE **out, size_t *len);
/* Reads exactly n bytes: DT_IO on a read error, DT_CORRUPT if the file ended early. */
dt_status dt_file_read_exact(FILE *f, const char *path, void *buf, size_t n);
/* Writes text to path atomically (dt_atomic_*): on failure DT_IO naming the path, the previous file intact. */
dt_status dt_file_write_text(const char *path, const char *text);
/* mkdir -p: creates path and its missing parents (mode & umask); an existing
 * directory is fine. DT_INVALID_ARGUMENT for an empty name or one of 4096
 * bytes or more; DT_IO naming the directory that could not be created, or the
 * path when it exists and is not a directory. */
dt_status dt_mkdir_p(const char *path, mode_t mode);
/* 1 if path is a directory (a regular file), following links; 0 otherwise, also when it cannot be stat'ed. */
int dt_is_dir(const char *path);
int dt_is_file(const char *path);

/* A file that appears whole or not at all. Writes go to `path.tmp.<pid>` next
 * to path (same file system, so the rename is atomic); commit flushes, fsyncs,
 * closes, renames it over path and fsyncs the directory. Abort, or any failure
 * before the rename, removes the temporary and leaves a previous file at path
 * untouched. Errors are DT_IO naming path and the temporary. */
typedef struct dt_atomic_file {
  FILE *f;      /* open from dt_atomic_open until commit or abort */
  dt_status st; /* the first write failure; later writes are skipped */
  int renamed;  /* the new file is at path: a failed commit failed only to sync the directory */
  char path[4096], tmp[4128];
} dt_atomic_file;
dt_status dt_atomic_open(dt_atomic_file *a, const char *path);
/* After a failure, a no-op that returns it (commit reports it too). */
dt_status dt_atomic_write(dt_atomic_file *a, const void *buf, size_t n);
/* Closes a, whatever it returns. */
dt_status dt_atomic_commit(dt_atomic_file *a);
/* Safe after commit or a failed open (a no-op then). */
void dt_atomic_abort(dt_atomic_file *a);

#define DT_ALIGN 64
#define DT_ALIGN_UP(n) (((n) + (DT_ALIGN - 1)) & ~(size_t)(DT_ALIGN - 1))

#endif
