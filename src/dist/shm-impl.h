/* Internals of the shared-memory backend shared by shm.c (the segment, syncs and
 * the collectives through its slots) and shm_shared.c (memory the ranks map from
 * each other, and the all-reduce that reads it where it lies). */
#ifndef DT_SHM_IMPL_H
#define DT_SHM_IMPL_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dist/dist-impl.h"

#define SHM_MAGIC 0x68737464u /* "dtsh" little endian */
#define SHM_VERSION 4u
#define SHM_MAX_RANKS 1024
#define SHM_PAGE 4096
/* Two cache lines: adjacent-line prefetchers would otherwise couple neighbours. */
#define SHM_LINE 128
/* Bytes of one half of a rank's slot (and of the result area): the pipeline
 * chunk. Small enough that slots + result of a few ranks stay in L2/L3, large
 * enough that a sync (~1 us) is noise next to copying it. */
#define SHM_HALF (512u << 10)
/* Allreduce up to this many bytes: one sync, every rank reduces all slots. */
#define SHM_SMALL_MAX (32u << 10)
/* Waiting: spin this long (s) where it pays (shm_backend.spin, spin_background),
 * then yield this long,
 * then sleep on the futex in slices of at most SHM_SLICE_S (s). Peers' liveness
 * is checked every SHM_HEALTH_S (s) while waiting. */
#define SHM_SPIN_S 50e-6
#define SHM_YIELD_S 1e-3
#define SHM_YIELD_OVERSUB_S 50e-6
#define SHM_SLICE_S 0.02
#define SHM_HEALTH_S 0.02

typedef struct shm_header {
  uint32_t magic, version;
  uint32_t size, pad;
  uint64_t seg_bytes, half_bytes;
  alignas(SHM_LINE) _Atomic uint32_t mapped; /* ranks that have mapped the segment */
  alignas(SHM_LINE) _Atomic uint32_t epoch;  /* futex word: bumped to wake sleepers */
  alignas(SHM_LINE) _Atomic uint32_t sleepers;
} shm_header;

/* CPUs a rank's affinity is published for (CPU_SETSIZE's 1024). */
#define SHM_CPU_BITS 1024

/* One per rank, written only by that rank. */
typedef struct shm_ctrl {
  alignas(SHM_LINE) _Atomic uint64_t arrive; /* syncs this rank has reached (full syncs and posts) */
  dt_coll_sig sig[2];                        /* collective at full sync c, in sig[c % 2] (a post leaves it) */
  uint64_t place[2];                         /* where its buffer lies in shared memory at full sync c (0: not) */
  int32_t pid;
  _Atomic int32_t gone; /* 1: the rank aborted or destroyed its backend */
  uint64_t pidns;       /* inode of its PID namespace: its pid means something here only if ours matches */
  uint64_t cpus[SHM_CPU_BITS / 64]; /* the CPUs it may run on (its affinity), a bit each */
} shm_ctrl;

/* Memory shared with dt_group_share: every rank's, as this rank maps it. */
#define SHM_MAX_REGIONS 8
typedef struct shm_region {
  char *mine;   /* this rank's (the caller's mapping); NULL: free slot */
  int id;       /* the share that made it (dt_group_share calls are numbered alike on every rank) */
  size_t bytes; /* of each rank's */
  char **peer;  /* (size) every rank's memory as mapped here (read only); peer[rank] = mine */
} shm_region;

typedef struct shm_backend {
  dt_backend base;
  char name[96];
  void *seg;
  size_t seg_bytes, half;
  shm_header *hdr;
  shm_ctrl *ctrl;
  char *slots;  /* size ranks x 2 halves */
  char *result; /* 2 halves */
  int *global;
  int *pidfd; /* -1: no pidfd (kernel without pidfd_open): kill(pid, 0) instead */
  char *nowatch; /* 1: the rank's process cannot be watched (other PID namespace) */
  const void **srcs;
  uint64_t syncs; /* syncs this rank has arrived at, full syncs and posts */
  int spin;            /* every rank sharing this one's CPUs has one: a waiting caller (its compute idle) spins
                          briefly (choose_spin) */
  int spin_background; /* every such rank's compute threads and communication thread have a CPU each: the
                          communication thread, waiting beside compute, spins too (or DT_COMM_CPU says so) */
  int comm_cpu;        /* the context's (DT_COMM_CPU_AUTO, _SHARED or _OWN) */
  double t0;      /* start of the running collective (for the timeout message) */
  dt_status broken;
  char broken_msg[256];
  /* dt_group_share: what a share needs after setup, and the shared regions */
  dt_store *store;        /* the group's (not owned) */
  char *prefix;           /* store keys of this backend */
  char stem[96];          /* "/dt-<tag>-<hash>": segment names start so */
  double timeout_s;       /* of a share's store exchange */
  int shares;             /* dt_group_share calls so far, identical on every rank */
  uint64_t shared_allreduces; /* all-reduces run in place on shared memory (dt_backend_shm_shared_allreduces) */
  shm_region region[SHM_MAX_REGIONS];
} shm_backend;

/* ---- shm.c ---- */
/* Arrives at the next sync with this collective's signature and the place of
 * its buffer (dt_shm_place; 0 for none), waits for every rank and checks that
 * all run the same collective. */
dt_status dt_shm_sync(shm_backend *b, const dt_coll *c, const dt_coll_sig *sig, uint64_t place);
/* The two halves of a sync without its signature: dt_shm_post arrives at the next sync (its number returned; what
 * this rank wrote before is then visible to whoever waits for it) and goes on; dt_shm_wait waits until every rank
 * has arrived at sync v, checking abort, liveness and the deadline. Every rank posts as many as the others. A full
 * sync (dt_shm_sync) after posts must come after a wait for every rank's last post: a peer still reading sig[w % 2]
 * and place[w % 2] of an earlier full sync w would otherwise find them overwritten. */
uint64_t dt_shm_post(shm_backend *b);
dt_status dt_shm_wait(shm_backend *b, const dt_coll *c, uint64_t v);
/* Whether every rank has arrived at sync v, without waiting. */
int dt_shm_arrived(const shm_backend *b, uint64_t v);
/* Rank r's share of m elements of es bytes among n ranks, in whole 64-byte units. */
void dt_shm_share_of(size_t m, size_t es, int n, int r, size_t *off, size_t *len);
/* Creates a segment named name (a stem; a pid and nonce are appended, name has cap bytes) of bytes, its pages
 * reserved, and maps it read-write into *map. The name stays linked: the caller unlinks it. */
dt_status dt_shm_create_mapped(char *name, size_t cap, size_t bytes, void **map);

/* A DT_AVG all-reduce's n elements at p divided as the group would (if it lets the backend): in cache, where
 * they were just reduced. */
static inline void dt_shm_divide(const dt_coll *c, void *p, size_t n) {
  if (c->divided && c->divisor > 1) dt_reduce_scale(p, n, c->dtype, c->divisor);
}

/* ---- shm_shared.c ---- */
dt_status dt_shm_share(dt_backend *b, size_t bytes, void **mem);
void dt_shm_unshare(dt_backend *b, void *mem);
/* dt_group_share_common: one segment, created by rank 0, every rank's mapping writable. */
dt_status dt_shm_share_common(dt_backend *b, size_t bytes, void **mem);
/* Unmaps every region's peer mappings (the backend's destruction; this rank's memory stays the caller's). */
void dt_shm_regions_free(shm_backend *b);
/* Where c's buffer lies in shared memory, packed as (share number + 1) << 48 | byte offset; 0 unless the
 * all-reduce is in place inside one region. */
uint64_t dt_shm_place(const shm_backend *b, const dt_coll *c, size_t bytes);
/* After the sync at which every rank published place (the same on all): the all-reduce read from every rank's
 * shared memory, one sync per chunk (shm_shared.c). */
dt_status dt_shm_allreduce_shared(shm_backend *b, const dt_coll *c, const dt_coll_sig *sig, uint64_t place);


#endif
