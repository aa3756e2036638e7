/* Internals of the distributed runtime shared by store, rendezvous, group and
 * the backends: sockets with deadlines, the collective descriptor, the
 * backend ops table and the reduction kernels. */
#ifndef DT_DIST_IMPL_H
#define DT_DIST_IMPL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/impl.h"
#include "dtrain/dist.h"

/* ---- sockets (net.c) ---------------------------------------------------------
 * All blocking calls take an absolute deadline on the dt_time_now() clock
 * (deadline <= 0: none) and an optional abort flag polled at least every
 * 100 ms, so nothing here can wait forever. `what` names the peer in errors
 * ("rank 3", "store 10.0.0.1:29500"). */

/* Listens on host:port (host NULL/"" = any; port 0 = ephemeral), TCP, nonblocking
 * accept, SO_REUSEADDR. DT_IO "cannot listen on HOST:PORT: address already in use" etc. */
dt_status dt_net_listen(const char *host, int port, int backlog, int *fd_out, int *port_out);
/* Connects with retries until the deadline (connection refused is retried: the
 * peer may not listen yet). TCP_NODELAY set; the returned fd is blocking-mode
 * agnostic (callers use dt_net_send_all/recv_all). */
dt_status dt_net_connect(const char *host, int port, double deadline, const atomic_int *abort_flag,
                         const char *what, int *fd_out);
/* Accepts one connection before the deadline. */
dt_status dt_net_accept(int listen_fd, double deadline, const atomic_int *abort_flag, int *fd_out);
/* Sends / receives exactly n bytes (poll + nonblocking I/O). A closed or reset
 * connection is DT_PEER_LOST naming `what`; the deadline gives DT_TIMEOUT; the
 * abort flag DT_INTERRUPTED. */
dt_status dt_net_send_all(int fd, const void *buf, size_t n, double deadline, const atomic_int *abort_flag,
                          const char *what);
dt_status dt_net_recv_all(int fd, void *buf, size_t n, double deadline, const atomic_int *abort_flag,
                          const char *what);
/* Sends sbuf to sfd while receiving rbuf from rfd, both exactly, interleaved
 * (no deadlock when both sides send large messages at once). sfd == rfd allowed. */
dt_status dt_net_sendrecv(int sfd, const void *sbuf, size_t sn, const char *swhat, int rfd, void *rbuf,
                          size_t rn, const char *rwhat, double deadline, const atomic_int *abort_flag);
/* The address of this host other ranks should use to reach a socket that is
 * connected to `peer_fd` (getsockname of that connection), as text. */
dt_status dt_net_local_addr(int connected_fd, char *buf, size_t len);
void dt_net_set_nodelay(int fd);
void dt_net_close(int *fd);

/* ---- authentication (auth.c, secret.c) ----------------------------------------
 * Both sides send a fresh DT_AUTH_NONCE-byte nonce; each proves the job
 * secret with dt_auth_mac over a label of its role and both nonces (and what
 * the connection is for), so neither a wrong secret nor a replayed exchange
 * passes. secret NULL or "": no secret (anyone can compute the MAC). */
#define DT_AUTH_NONCE 32
#define DT_AUTH_MAC 32
typedef struct dt_auth_part {
  const void *p;
  size_t len;
} dt_auth_part;
/* HMAC-SHA-256 keyed by the secret over label and the length-prefixed parts. */
void dt_auth_mac(const char *secret, const char *label, const dt_auth_part *parts, int n, uint8_t out[DT_AUTH_MAC]);
/* Constant-time comparison of two MACs. */
int dt_auth_equal(const uint8_t *a, const uint8_t *b);
/* n bytes from the OS's random source (getrandom). */
dt_status dt_random_bytes(void *buf, size_t n);
/* Logs a refused connection from ip: once per address, at most a few lines per
 * 10 s in all (thread-safe); never blocks on the peer. */
void dt_auth_refused(const char *subsys, const char *ip, const char *why);
/* Refusals so far in this process (logged or not). */
long dt_auth_refusals(void);

/* The store server's handshake and request parser over bytes, without sockets
 * (the fuzzing target tests/fuzz/fuzz_store.c; layout in store.c). */
void dt_store_server_fuzz(const uint8_t *data, size_t n);

/* ---- collective descriptors ----------------------------------------------- */
typedef enum dt_coll_kind {
  DT_COLL_ALLREDUCE = 0,
  DT_COLL_BROADCAST,
  DT_COLL_ALLGATHER,
  DT_COLL_REDUCE_SCATTER,
  DT_COLL_BARRIER,
  DT_COLL_ALLREDUCE_SHARDS, /* an all-reduce whose result each rank needs only its share of (dt_allreduce_shards) */
  DT_COLL_ALLREDUCE_EACH,   /* an all-reduce whose result each rank needs once, piece by piece (dt_allreduce_each) */
  DT_COLL_KIND_COUNT
} dt_coll_kind;
const char *dt_coll_name(dt_coll_kind k);

/* One collective as the backend sees it. Buffers follow dist.h. */
typedef struct dt_coll {
  dt_coll_kind kind;
  uint64_t seq;     /* 1, 2, ... per group, identical on every rank */
  const void *send; /* NULL for broadcast/barrier */
  void *recv;       /* broadcast: the buffer */
  size_t count;     /* elements (the whole tensor; see dt_block_of) */
  dt_dtype dtype;
  dt_redop op;
  int root;         /* broadcast: root rank within the backend's ranks */
  double deadline;  /* absolute, dt_time_now() clock */
  /* DT_AVG all-reduce: the group divides the result by divisor (the group's size) after the backend returns,
   * unless the backend did so itself (with dt_reduce_scale, in cache as it reduces) and set *divided = 1.
   * divided NULL: the backend must not divide. */
  int divisor;
  int *divided;
  int background; /* run by the group's communication thread, beside the caller's compute (else by the caller) */
  /* DT_COLL_ALLREDUCE_EACH: a backend that hands every piece of the result to shard itself sets *shard_done = 1;
   * else the group calls it on the whole result afterwards.
   * DT_COLL_ALLREDUCE_SHARDS: a backend that hands this rank's share to shard itself, piece by piece once each
   * holds the result (divided), sets *shard_done = 1; else the group calls it on the rank's block afterwards. */
  dt_shard_fn shard;
  void *shard_user;
  int *shard_done;
} dt_coll;
/* A sharded all-reduce whose whole result is in c->recv: this rank's block (dt_block_of) handed to c->shard, and
 * *c->shard_done set (coll.c). */
void dt_coll_shard_block(const dt_coll *c, int size, int rank);
/* 1 for the kinds that all-reduce (a sharded all-reduce is one to the backends that do not take it apart). */
static inline int dt_coll_is_allreduce(dt_coll_kind k) {
  return k == DT_COLL_ALLREDUCE || k == DT_COLL_ALLREDUCE_SHARDS || k == DT_COLL_ALLREDUCE_EACH;
}

/* What ranks compare to detect a mismatch: fixed 32 bytes, little endian. */
typedef struct dt_coll_sig {
  uint64_t seq;
  uint64_t count;
  uint32_t kind, dtype, op;
  int32_t root;
} dt_coll_sig;
void dt_coll_sig_make(const dt_coll *c, dt_coll_sig *s);
/* DT_MISMATCH naming both sides if theirs differs from mine ("allreduce #17:
 * this rank has count 1000 f32 sum, rank 2 has broadcast count 10 root 0"). */
dt_status dt_coll_sig_check(const dt_coll_sig *mine, const dt_coll_sig *theirs, int their_rank);

/* ---- the block partition ------------------------------------------------------
 * The one rule that splits count elements of an all-gather / reduce-scatter
 * among world ranks: rank r owns [off, off + n), n = count/world, plus one for
 * r < count % world, blocks in rank order (dt_group_block in dist.h). */
static inline void dt_block_of(size_t count, int world, int rank, size_t *off, size_t *n) {
  size_t q = count / (size_t)world, rem = count % (size_t)world, r = (size_t)rank;
  *off = q * r + (r < rem ? r : rem);
  *n = q + (r < rem);
}

/* ---- reductions (reduce.c) -------------------------------------------------- *
 * bf16/f16 are reduced in f32 and rounded once per call. AVG is SUM here; it is
 * divided with dt_reduce_scale (integers: truncating) by the group at the end,
 * or by a backend as it reduces (dt_coll.divided). */
/* dst[i] = op(dst[i], src[i]) */
void dt_reduce_into(void *dst, const void *src, size_t n, dt_dtype t, dt_redop op);
/* dst[i] = op(a[i], b[i]) (dst may alias a or b) */
void dt_reduce_pair(void *dst, const void *a, const void *b, size_t n, dt_dtype t, dt_redop op);
/* dst[i] = op over k sources srcs[j][i] (dst may alias srcs[0]); one rounding for bf16/f16. */
void dt_reduce_many(void *dst, const void *const *srcs, int k, size_t n, dt_dtype t, dt_redop op);
/* dst[i] /= divisor (for DT_AVG). */
void dt_reduce_scale(void *dst, size_t n, dt_dtype t, int divisor);

/* ---- backends ---------------------------------------------------------------- */
typedef struct dt_backend dt_backend;

/* One entry per collective; each runs it to completion (or error) before the
 * deadline in c, on the group's communication thread (or a waiting caller),
 * never two at once. Errors: DT_PEER_LOST / DT_TIMEOUT / DT_MISMATCH /
 * DT_INTERRUPTED with a detail naming the rank; the group adds the collective
 * and its sequence number. abort() may be called from any thread at any time:
 * a running collective must then return DT_INTERRUPTED promptly. */
typedef struct dt_backend_ops {
  const char *name;
  dt_status (*allreduce)(dt_backend *b, const dt_coll *c);
  dt_status (*broadcast)(dt_backend *b, const dt_coll *c);
  dt_status (*allgather)(dt_backend *b, const dt_coll *c);
  dt_status (*reduce_scatter)(dt_backend *b, const dt_coll *c);
  dt_status (*barrier)(dt_backend *b, const dt_coll *c);
  void (*abort)(dt_backend *b);
  void (*destroy)(dt_backend *b);
  /* Optional (NULL: dt_group_share is DT_UNSUPPORTED): memory the ranks map from each other. Called on the
   * caller's thread with no collective queued or running; share is a collective, unshare is local. */
  dt_status (*share)(dt_backend *b, size_t bytes, void **mem);
  void (*unshare)(dt_backend *b, void *mem);
  /* Optional (NULL: dt_group_share_common is DT_UNSUPPORTED): one memory every rank maps writable. */
  dt_status (*share_common)(dt_backend *b, size_t bytes, void **mem);
} dt_backend_ops;

/* Every backend struct starts with this. */
struct dt_backend {
  const dt_backend_ops *ops;
  int rank, size;    /* within this backend */
  const int *global; /* global[i] = group rank of backend rank i (for messages) */
  atomic_int aborted;
};

/* What a backend is built from. The store is shared (not owned); keys live
 * under prefix, unique per group, backend instance and restart. */
typedef struct dt_backend_ctx {
  dt_store *store;
  const char *prefix;   /* "dt/<run>/<restart>/g<id>/<backend>" */
  const char *job_tag;  /* short text safe for file names: run id hash + restart (shm names) */
  int rank, size;       /* within this backend */
  const int *global;    /* size entries, copied by the backend */
  double timeout_s;     /* setup deadline */
  const char *host_addr; /* address peers use to reach this process (tcp) */
  const char *secret;    /* the job secret proven in every tcp hello; NULL or "": none */
  int comm_cpu;          /* DT_COMM_CPU: DT_COMM_CPU_AUTO (0, shm: from the ranks' CPU sets), _SHARED or _OWN */
} dt_backend_ctx;

/* dt_backend_ctx.comm_cpu: whether each communication thread has a CPU of its own, as DT_COMM_CPU says. */
enum { DT_COMM_CPU_AUTO = 0, DT_COMM_CPU_SHARED, DT_COMM_CPU_OWN };

dt_status dt_backend_shm_new(const dt_backend_ctx *ctx, dt_backend **out);
dt_status dt_backend_tcp_new(const dt_backend_ctx *ctx, dt_backend **out);
/* Ranks on several hosts: shm inside each host, tcp between one leader per
 * host (and among all ranks for all-gather / reduce-scatter). host_of[r] is
 * the host of rank r, hosts numbered in order of their lowest rank. */
dt_status dt_backend_hier_new(const dt_backend_ctx *ctx, const int *host_of, dt_backend **out);
/* DT_UNSUPPORTED when libdtrain was built without MPI or not launched by mpirun. */
dt_status dt_backend_mpi_new(const dt_backend_ctx *ctx, dt_backend **out);
/* 1 if this process was started by mpirun/mpiexec (Open MPI's variables are set). */
int dt_mpi_launched(void);

/* How many all-reduces the shm backend b ran in place on shared memory (0 for
 * another backend or NULL): dt_group_shared_allreduces. */
uint64_t dt_backend_shm_shared_allreduces(const dt_backend *b);
/* 1 where the shm backend b found that the communication thread has a CPU of its own beside the compute threads
 * of the ranks sharing this rank's CPUs, 0 where not; -1 for another backend (dt_group_comm_has_cpu). */
int dt_backend_shm_comm_cpu(const dt_backend *b);

/* Runs c on b through the ops table (switch on kind); used by the group and
 * by backends composed of others (hierarchical). */
dt_status dt_backend_run(dt_backend *b, const dt_coll *c);

#endif
