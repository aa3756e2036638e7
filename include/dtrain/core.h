/* dtrain core: threads budget, logging level, tunables, aligned memory, RNG, timers. */
#ifndef DTRAIN_CORE_H
#define DTRAIN_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- threads ---------------------------------------------------------- */
/* Sets the compute thread budget of this process: our OpenMP loops and
 * OpenBLAS together never use more than n threads. n <= 0 means DT_NUM_THREADS
 * if set, else OMP_NUM_THREADS if set, else all cores. Call before training;
 * not thread-safe. */
dt_status dt_set_threads(int n);
/* The current budget (>= 1). */
int dt_get_threads(void);
/* Online cores of this machine. */
int dt_num_cores(void);
/* The logical CPUs this process may run on (its affinity: a launcher's binding, a taskset, a cpuset), else
 * dt_num_cores(). */
int dt_usable_cores(void);

/* ---- BLAS ----------------------------------------------------------- */
/* The OpenBLAS kernel family in use ("Haswell", "SkylakeX", "Cooperlake", ...): chosen
 * by OpenBLAS for the CPU when it loads, or forced by OPENBLAS_CORETYPE. */
const char *dt_blas_corename(void);
/* Who multiplies f32 matrices: "oneDNN sgemm" (a build with oneDNN on an AVX-512 CPU where OpenBLAS runs AVX2
 * kernels), else "OpenBLAS <corename>"; DT_SGEMM=auto|openblas|onednn chooses. dt_sgemm_check
 * validates DT_SGEMM. */
const char *dt_sgemm_name(void);
dt_status dt_sgemm_check(void);
/* oneDNN's sgemm builds its kernels at its first products (40-60 ms once a process on a Zen 5 EPYC, a
 * training run's first forward): dt_sgemm_warm_begin has them built on a thread of their own beside what
 * the caller does next (reading data, joining a group), dt_sgemm_warm_end waits for that thread. Both return
 * at once where OpenBLAS multiplies, once the kernels are built, or if the thread cannot start. */
void dt_sgemm_warm_begin(void);
void dt_sgemm_warm_end(void);

/* ---- logging ---------------------------------------------------------- */
typedef enum dt_log_level { DT_LOG_LEVEL_ERROR = 0, DT_LOG_LEVEL_WARN, DT_LOG_LEVEL_INFO, DT_LOG_LEVEL_TRACE } dt_log_level;
/* Current level: from DT_DEBUG=error|warn|info|trace (default warn), or as set. */
dt_log_level dt_log_get_level(void);
void dt_log_set_level(dt_log_level level);

/* ---- tunables ---------------------------------------------------------- */
/* Tunables are rows of one table (name, default, doc), read from DT_* env
 * variables. Lookup by name; DT_NOT_FOUND for an unknown name, DT_INVALID_ARGUMENT
 * (naming the variable) when the environment holds a malformed value. */
dt_status dt_tunable_int(const char *name, long *out);
dt_status dt_tunable_str(const char *name, const char **out);
/* Calls fn for every row (for --help and docs). */
void dt_tunables_each(void (*fn)(const char *name, const char *def, const char *doc, void *user), void *user);

/* ---- memory ------------------------------------------------------------ */
/* 64-byte aligned, zeroed allocation; *out set only on success. dt_free(NULL) is a no-op. */
dt_status dt_alloc(size_t bytes, void **out);
void dt_free(void *p);
/* Has glibc's malloc keep what a training step frees for the next step, for the whole process: blocks up to
 * 256 MiB (32 MiB where an older glibc refuses more; in threads' own pools up to their 64 MiB heaps) come from the
 * heap rather than fresh mappings, and the heap's top is not handed back to the kernel after every large free.
 * oneDNN's sgemm allocates its packing buffer on every call (up to 2 MiB each, some 3,000 calls a BERT-mini step);
 * without this each such block was mapped again and every page paid its first touch (about 5 us a page on the
 * 2-vCPU machines measured; BERT-mini's DDP x2 113-173 samples/s against 167-201). dt_train_run calls it; a program
 * that steps models itself may call it once at its start. A no-op where the C library is not glibc. */
void dt_keep_freed_memory(void);

/* ---- RNG: Philox4x32-10, counter based -------------------------------- */
/* A stream is (key, counter): the same key and counter give the same numbers
 * on any thread, rank or machine. */
typedef struct dt_rng {
  uint64_t key;     /* seed mixed with a stream id (see dt_rng_init) */
  uint64_t counter; /* index of the next 4x32-bit block */
  uint32_t buf[4];
  int used; /* words of buf already handed out (4 = empty) */
} dt_rng;
/* key = mix(seed, stream); counter starts at 0. */
void dt_rng_init(dt_rng *r, uint64_t seed, uint64_t stream);
/* One Philox4x32-10 block for (key, counter). */
void dt_philox4x32(uint64_t key, uint64_t counter, uint32_t out[4]);
uint32_t dt_rng_u32(dt_rng *r);
/* Uniform in [0, 1) with 24 random bits. */
float dt_rng_uniform(dt_rng *r);
/* Uniform in [lo, hi). */
float dt_rng_uniform_range(dt_rng *r, float lo, float hi);
/* Standard normal (Box-Muller). */
float dt_rng_normal(dt_rng *r);
/* Unbiased integer in [0, n), n >= 1. */
uint32_t dt_rng_below(dt_rng *r, uint32_t n);

/* ---- timers ------------------------------------------------------------ */
/* Monotonic seconds since an arbitrary origin. */
double dt_time_now(void);
/* CPU time of this process so far, in seconds. */
void dt_cpu_time(double *user_s, double *sys_s);
/* Peak resident set size of this process, bytes (0 if unknown). */
size_t dt_peak_rss(void);

#ifdef __cplusplus
}
#endif
#endif
