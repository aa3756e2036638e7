/* The one table of DT_* environment tunables: name, default, documentation. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/impl.h"

typedef struct tunable {
  const char *name;
  const char *def;
  int is_int;
  const char *doc;
} tunable;

static const tunable tunables[] = {
    {"DT_DEBUG", "warn", 0, "log level: error, warn, info or trace; or subsystems logged in full, e.g. ddp or ddp,store"},
    {"DT_NUM_THREADS", "0", 1, "compute threads per process when --threads is not given (0: OMP_NUM_THREADS if set, else all cores)"},
    {"DT_DATA_DIR", "/usr/share/datasets", 0, "where named datasets (fashion-mnist, mnist) are looked up"},
    {"DT_PREFETCH", "0", 1, "batches the data loader prepares ahead of training (0: as many as fit in 1 MiB, 2 to 64)"},
    {"DT_IMAGE_CACHE_MB", "0", 1, "the most memory --cache-images may use for decoded images, per process (0: half the machine's memory)"},
    {"DT_TIMEOUT", "300", 1, "seconds a rendezvous or collective may wait for the other ranks before it fails"},
    {"DT_RUN_ID", "default", 0, "job identity: store clients with another run id are refused (under srun: slurm-<job>.<step>)"},
    {"DT_JOB_SECRET", "", 0, "the job secret every store client and tcp peer proves (dtrun sets it; never printed)"},
    {"DT_HOST_ID", "", 0, "overrides this host's identity (ranks with the same id share memory; default: hostname + network namespace)"},
    {"DT_TRACE_MAX_EVENTS", "2000000", 1, "events a trace keeps per process (about 150 bytes each); later ones are counted as dropped"},
    {"DT_AMP_INIT_SCALE_LOG2", "16", 1, "--amp fp16: log2 of the loss scaler's initial scale (0 to 127; GradScaler's 65536)"},
    {"DT_AMP_GROWTH_INTERVAL", "2000", 1, "--amp fp16: consecutive finite steps before the loss scale doubles (>= 1)"},
    {"DT_AMP_KERNELS", "auto", 0, "--amp bf16: auto = native bf16 GEMMs where the CPU has AVX512_BF16 (dtrain's own), own = the same (refused on a CPU without AVX512_BF16), onednn = oneDNN's bf16 matmul (refused without AVX512_BF16 or a build with oneDNN; auto takes it on CPUs with AMX), emulated = the f32 emulation everywhere"},
    {"DT_SGEMM", "auto", 0, "f32 GEMMs: auto = oneDNN's sgemm where the build has oneDNN, the CPU AVX-512 and OpenBLAS runs AVX2 kernels, else OpenBLAS; openblas; onednn"},
    {"DT_FUSED_UPDATE", "1", 1, "ddp on one host: 1 = where the sharded update is off and nothing reads the averaged gradients, the optimizer steps each piece of them inside the all-reduces (the same bits); 0 = after them"},
    {"DT_COMM_CPU", "auto", 0, "whether each rank's communication thread has a CPU of its own: 1 = it has (the shm backend's communication thread spins briefly while it waits; ddp's measured layout is planned from the measured steps, large weights in pieces), 0 = it shares the compute threads' CPUs (it sleeps at once; one bucket after backward, whole weights); auto = from the ranks' CPU affinity"},
    {"DT_STORE_SERVED", "0", 1, "1 when a launcher (dtrun) serves the store; rank 0 then connects instead of serving"},
};

static const tunable *find(const char *name) {
  for (size_t i = 0; i < sizeof tunables / sizeof tunables[0]; i++)
    if (strcmp(tunables[i].name, name) == 0) return &tunables[i];
  return NULL;
}

dt_status dt_tunable_str(const char *name, const char **out) {
  const tunable *t = find(name);
  if (!t) return dt_error(DT_NOT_FOUND, "unknown tunable %s", name);
  const char *v = getenv(name);
  *out = (v && *v) ? v : t->def;
  return DT_OK;
}

dt_status dt_tunable_int(const char *name, long *out) {
  const tunable *t = find(name);
  if (!t) return dt_error(DT_NOT_FOUND, "unknown tunable %s", name);
  if (!t->is_int) return dt_error(DT_INVALID_ARGUMENT, "tunable %s is not an integer", name);
  const char *v = getenv(name);
  const char *s = (v && *v) ? v : t->def;
  char *end;
  errno = 0;
  long x = strtol(s, &end, 10);
  if (errno || end == s || *end != '\0')
    return dt_error(DT_INVALID_ARGUMENT, "%s=%s is not an integer (%s)", name, s, t->doc);
  *out = x;
  return DT_OK;
}

void dt_tunables_each(void (*fn)(const char *, const char *, const char *, void *), void *user) {
  for (size_t i = 0; i < sizeof tunables / sizeof tunables[0]; i++)
    fn(tunables[i].name, tunables[i].def, tunables[i].doc, user);
}
