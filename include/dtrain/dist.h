/* dtrain distributed runtime: key-value store, rendezvous, process groups and
 * collectives (the equivalent of PyTorch's c10d store + process group).
 *
 *   dt_group *g;
 *   dt_group_init(NULL, &g);                  // from the environment dtrun/torchrun/mpirun/srun set
 *   dt_allreduce(g, buf, buf, n, DT_F32, DT_SUM, NULL);   // NULL work: blocks
 *   dt_work *w; dt_allreduce(g, a, a, n, DT_F32, DT_AVG, &w); ...; dt_work_wait(w, 0); dt_work_free(w);
 *   dt_group_destroy(g);
 *
 * Every rank must issue the same collectives in the same order (with the same
 * count, dtype, op and root). A rank that does not is detected and reported
 * (DT_MISMATCH), a lost peer gives DT_PEER_LOST naming it, a silent one
 * DT_TIMEOUT after the group's deadline. After such an error the group is
 * broken: later collectives fail at once; destroy it (or abort it first). */
#ifndef DTRAIN_DIST_H
#define DTRAIN_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/status.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- job secret ---------------------------------------------------------------
 * The run id names a job; the job secret admits to it. Every store client and
 * every tcp peer proves the secret by HMAC-SHA-256 challenge-response (it
 * never travels). dtrun --standalone makes one and gives it to its workers in
 * DT_JOB_SECRET; other launchers pass DT_JOB_SECRET on (mpirun -x, Slurm's
 * exported environment) or dtrun reads it with --secret-file. Never print it. */
#define DT_SECRET_MIN_CHARS 32      /* 128 bits as hex */
#define DT_SECRET_MAX_CHARS 256
#define DT_SECRET_RANDOM_BYTES 32   /* what dt_job_secret_generate draws: 256 bits */
/* DT_INVALID_ARGUMENT (naming `where`, never the secret) unless secret has
 * DT_SECRET_MIN_CHARS..DT_SECRET_MAX_CHARS printable characters without spaces. */
dt_status dt_job_secret_check(const char *secret, const char *where);
/* A fresh secret from the OS (getrandom) as 64 hex characters; cap >= 65. */
dt_status dt_job_secret_generate(char *out, size_t cap);
/* DT_JOB_SECRET into out ("" when unset); DT_INVALID_ARGUMENT if malformed. */
dt_status dt_job_secret_from_env(char *out, size_t cap);
/* The secret in the file at path (one trailing newline dropped). Refused unless
 * it is a regular file of this user with mode 0600. */
dt_status dt_job_secret_read_file(const char *path, char *out, size_t cap);

/* ---- key-value store --------------------------------------------------------
 * A small TCP key-value store (like c10d's TCPStore): one server, many
 * clients, each request with a deadline. A client proves the job secret
 * before the server tells it anything (and the server proves it back); a
 * client without it, of another job, or one that sends a malformed message,
 * is dropped (logged once per address) without disturbing the others. */
typedef struct dt_store dt_store;
typedef struct dt_store_server dt_store_server;

/* Longest key and value the store accepts. */
#define DT_STORE_MAX_KEY 1024
#define DT_STORE_MAX_VALUE (16u << 20)

/* Serves a store on host:port (host NULL or "" = all interfaces; port 0 = a free
 * port, see dt_store_server_port) in a background thread, admitting clients
 * that prove secret (NULL or "": no secret, anyone who knows the run id gets
 * in). DT_IO naming the address if the port is in use. */
dt_status dt_store_server_start(const char *host, int port, const char *run_id, const char *secret,
                                dt_store_server **out);
/* For a store served beside the training processes (the dtrun agent): its
 * thread runs at a lower CPU priority (nice 10), so a flood of strangers does
 * not take the ranks' cores. Not for a store inside a rank. */
void dt_store_server_set_background(dt_store_server *s);
int dt_store_server_port(const dt_store_server *s);
void dt_store_server_stop(dt_store_server *s);

/* Connects to the store at host:port, retrying until timeout_s (the server may
 * not be up yet); timeout_s is also the default deadline of later requests.
 * Both sides prove secret (NULL or "": none; a server with a secret refuses
 * such a client, a client with one refuses a server without). DT_TIMEOUT
 * naming the address if nothing answers in time; DT_INVALID_ARGUMENT if the
 * server belongs to another run id or the secrets differ. */
dt_status dt_store_connect(const char *host, int port, const char *run_id, const char *secret, double timeout_s,
                           dt_store **out);
dt_status dt_store_set(dt_store *s, const char *key, const void *value, size_t len);
/* Waits until key exists (up to timeout_s; <= 0: the store's default) and returns
 * a copy of its value in *value (release with dt_free), its length in *len. */
dt_status dt_store_get(dt_store *s, const char *key, void **value, size_t *len, double timeout_s);
/* Adds delta to the integer stored at key (missing = 0) and returns the new value. */
dt_status dt_store_add(dt_store *s, const char *key, int64_t delta, int64_t *out);
/* *present = 1 if every key exists now (no waiting). */
dt_status dt_store_check(dt_store *s, const char *const *keys, int n, int *present);
/* *existed = 1 if key was there (existed may be NULL). */
dt_status dt_store_delete(dt_store *s, const char *key, int *existed);
/* Waits until every key exists. */
dt_status dt_store_wait(dt_store *s, const char *const *keys, int n, double timeout_s);
/* Changes the default deadline of later requests (e.g. short ones on an error path). */
void dt_store_set_timeout(dt_store *s, double timeout_s);
void dt_store_close(dt_store *s);

/* ---- rendezvous: who am I, who is the master -------------------------------- */
typedef struct dt_dist_env {
  int rank, world_size;
  int local_rank, local_world_size;
  int node_rank;            /* GROUP_RANK under dtrun/torchrun; -1 if unknown */
  char master_addr[256];
  int master_port;
  char run_id[128];         /* DT_RUN_ID, TORCHELASTIC_RUN_ID, slurm-<job>.<step> (srun), or "default" */
  int restart_count;        /* DT_RESTART_COUNT / TORCHELASTIC_RESTART_COUNT, else 0 */
  int store_served;         /* 1: the launcher serves the store (DT_STORE_SERVED=1) */
  char job_secret[DT_SECRET_MAX_CHARS + 1]; /* DT_JOB_SECRET, "" if none: never print it */
  const char *source;       /* "torchrun", "openmpi", "slurm", "tcp" */
} dt_dist_env;

/* Fills env from init_method: NULL or "env://" reads the environment (torchrun's
 * RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, else Open MPI's OMPI_COMM_WORLD_*,
 * else Slurm's SLURM_*); "tcp://host:port" uses rank and world_size as given.
 * A missing or malformed variable is DT_INVALID_ARGUMENT naming it. */
dt_status dt_dist_env_detect(const char *init_method, int rank, int world_size, dt_dist_env *env);

/* How many processes a launcher started together with this one, from the variable that says so for every
 * process it starts: WORLD_SIZE (dtrun, torchrun), else OMPI_COMM_WORLD_SIZE (mpirun), else
 * SLURM_STEP_NUM_TASKS (srun; a Slurm batch script, one process, has none of them). The first of them that holds
 * a whole number from 1 to 2^24 counts (one that does not is passed over) and is named in *var; 1 and NULL where
 * none does. For a program that is not meant to run as several copies. */
int dt_dist_launched_world(const char **var);

/* ---- process groups -------------------------------------------------------- */
typedef enum dt_redop { DT_SUM = 0, DT_AVG, DT_MIN, DT_MAX, DT_REDOP_COUNT } dt_redop;
const char *dt_redop_name(dt_redop op);
/* "sum", "avg", "min", "max"; DT_INVALID_ARGUMENT otherwise. */
dt_status dt_redop_parse(const char *s, dt_redop *out);

typedef struct dt_group dt_group;
typedef struct dt_work dt_work;

typedef struct dt_group_options {
  const char *backend;     /* "auto" (default), "shm", "tcp", "mpi" */
  const char *init_method; /* NULL / "env://" or "tcp://host:port" */
  int rank, world_size;    /* with tcp:// (ignored otherwise) */
  double timeout_s;        /* rendezvous and collective deadline; <= 0: DT_TIMEOUT */
} dt_group_options;
void dt_group_options_default(dt_group_options *o);

/* Rendezvous (rank 0 serves the store unless a launcher does), checks that
 * every rank agrees on the world size, picks and connects the backend.
 * opts NULL = defaults. */
dt_status dt_group_init(const dt_group_options *opts, dt_group **out);
/* Same from a detected environment (dt_dist_env_detect). */
dt_status dt_group_init_env(const dt_dist_env *env, const dt_group_options *opts, dt_group **out);
int dt_group_rank(const dt_group *g);
int dt_group_size(const dt_group *g);
int dt_group_local_rank(const dt_group *g);
int dt_group_local_size(const dt_group *g);
/* "shm", "tcp", "mpi" or "shm+tcp" (hierarchical). */
const char *dt_group_backend(const dt_group *g);

/* Block partition used by reduce-scatter and all-gather: rank r owns
 * elements [off, off+len) of count, len = count/size (+1 for r < count%size). */
void dt_group_block(const dt_group *g, size_t count, int r, size_t *off, size_t *len);

/* Collectives. Each is queued and run in issue order by the group's
 * communication thread. If w is non-NULL it receives a work handle (wait on it,
 * then dt_work_free); if NULL the call waits itself. Buffers must stay valid
 * and untouched until the work is complete. send == recv is in place. */
dt_status dt_allreduce(dt_group *g, const void *send, void *recv, size_t count, dt_dtype dtype,
                       dt_redop op, dt_work **w);
/* buf of count elements; root's data ends up on every rank. */
dt_status dt_broadcast(dt_group *g, void *buf, size_t count, dt_dtype dtype, int root, dt_work **w);
/* send holds this rank's block of count (dt_group_block); recv all count
 * elements. In place: send == recv + off of this rank's block. */
dt_status dt_allgather(dt_group *g, const void *send, void *recv, size_t count, dt_dtype dtype,
                       dt_work **w);
/* send holds count elements; recv receives this rank's block of the reduction.
 * In place: recv == send + off of this rank's block. */
dt_status dt_reduce_scatter(dt_group *g, const void *send, void *recv, size_t count, dt_dtype dtype,
                            dt_redop op, dt_work **w);
dt_status dt_barrier(dt_group *g, dt_work **w);
/* An all-reduce in place of count f32 in buf after which each rank needs only its own share of the result: for
 * work done once per host, on memory every rank writes (dt_group_share_common), such as an optimizer's update of
 * the parameters (ZeRO's sharded optimizer). The ranks' shares tile [0, count); fn(user, off, n, avg) is called
 * on the thread running the collective for each piece [off, off + n) of this rank's share, in increasing order,
 * avg[0..n) holding its result (the bits dt_allreduce gives; valid during the call only). On the shm backend every
 * rank's calls have returned before any rank's collective completes, so what they wrote is there for all; where
 * buf lies in memory from dt_group_share at the same place on every rank, each rank reduces its share from the
 * others' memory into a small buffer of its own, and nothing is written to buf: afterwards it holds this rank's
 * values, or the result, unspecified which. Elsewhere it is dt_allreduce, then fn over this rank's block
 * (dt_group_block) of buf, unordered with the other ranks' calls (those backends share no memory). */
typedef void (*dt_shard_fn)(void *user, size_t off, size_t n, const float *avg);
dt_status dt_allreduce_shards(dt_group *g, float *buf, size_t count, dt_redop op, dt_shard_fn fn, void *user,
                              dt_work **w);
/* An all-reduce in place of count f32 in buf whose result every rank needs once, piece by piece, and not in buf
 * afterwards: such as each rank's optimizer step of its own parameters. fn(user, off, n, avg) is called on the
 * thread running the collective for pieces [off, off + n) that tile [0, count), each once, in no set order, avg[0..n)
 * holding its result (the bits dt_allreduce gives; valid during the call only). Where buf lies in memory from
 * dt_group_share at the same place on every rank (shm), each rank reduces its share into its own memory and hands
 * the others' shares over where they lie, instead of copying them in. Elsewhere it is dt_allreduce, then fn over
 * the whole of buf. Afterwards buf's contents are unspecified (the result, or this rank's values, piece by piece). */
dt_status dt_allreduce_each(dt_group *g, float *buf, size_t count, dt_redop op, dt_shard_fn fn, void *user,
                            dt_work **w);

/* Memory the ranks on one host share. A collective (every rank calls it with
 * the same bytes, no collective of the group in flight): every rank gets bytes
 * of zeroed, page-aligned memory of its own in *mem that the other ranks map
 * too (read only). An all-reduce in place (send == recv) at the same offset of
 * such memory on every rank then reads the peers' data where it lies: each
 * rank sums its share of the elements from every rank's memory and copies the
 * other shares from their owners, instead of copying everything in and out
 * through the backend's own buffers (each all-reduce above 32 KiB decides
 * afresh, from where every rank's buffer lies). DT_UNSUPPORTED for a one-rank
 * group, a backend other than shm (tcp, mpi, ranks on several hosts), or
 * memory that could not be shared (/dev/shm full; then on every rank alike,
 * naming the rank and the cause): use memory of your own then. *mem is the caller's: release
 * it with dt_shared_free, after dt_group_unshare or the group's destruction. */
dt_status dt_group_share(dt_group *g, size_t bytes, void **mem);
/* The group stops reading mem (local; no collective of the group may be
 * queued or running): it unmaps the peers' memory; mem stays mapped and the
 * caller's. A later all-reduce on mem goes through the backend's buffers. */
void dt_group_unshare(dt_group *g, void *mem);
/* Memory every rank on the host maps writable, the same bytes for all (a collective, as dt_group_share):
 * bytes of zeroed, page-aligned memory in *mem. What one rank writes the others read, with no ordering beyond
 * what the group's collectives give (a barrier, or the end of a dt_allreduce_shards). DT_UNSUPPORTED where
 * dt_group_share is. *mem is the caller's: release it with dt_shared_free. */
dt_status dt_group_share_common(dt_group *g, size_t bytes, void **mem);
/* All-reduces this rank has run in place on shared memory so far. */
uint64_t dt_group_shared_allreduces(const dt_group *g);
/* 1 where this rank's communication thread has a CPU of its own: the host's ranks sharing its CPUs times their
 * compute threads plus one fit in them (shm: from every rank's CPU set; else this host's ranks and this process's
 * CPUs), so collectives queued during compute run beside it, not in its time slices; DT_COMM_CPU=0 or 1 as the
 * group was made says so instead (a CPU quota the masks do not show). Local: ranks may differ. */
int dt_group_comm_has_cpu(const dt_group *g);
/* Unmaps memory from dt_group_share (bytes as asked). */
void dt_shared_free(void *mem, size_t bytes);

/* Waits for the work to finish, up to timeout_s (<= 0: until it finishes, which
 * is bounded: every collective fails once it has run for the group's deadline,
 * so a wait behind k queued works lasts at most about k deadlines); returns
 * its status (DT_TIMEOUT if this wait expired with the work still running). */
dt_status dt_work_wait(dt_work *w, double timeout_s);
/* 1 if the work has finished (successfully or not), 0 if not yet. */
int dt_work_test(dt_work *w);
/* Sequence number of the collective in its group (1, 2, ...). */
uint64_t dt_work_seq(const dt_work *w);
/* Seconds the backend spent running the work, once finished (-1 before): the
 * communication time itself, without the time it waited in the queue. */
double dt_work_elapsed(dt_work *w);
/* Releases the handle; a work still running finishes on its own. Handles may
 * be freed before or after dt_group_destroy (which fails unfinished ones). */
void dt_work_free(dt_work *w);

/* Fails every queued and running collective with DT_INTERRUPTED and breaks
 * the group; safe from any thread. */
void dt_group_abort(dt_group *g);
/* Aborts if work is pending, stops the communication thread, disconnects. */
void dt_group_destroy(dt_group *g);

#ifdef __cplusplus
}
#endif
#endif
