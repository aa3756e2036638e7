/* TCP backend: a full mesh of sockets between the ranks of a group (works
 * across hosts). Large all-reduces run, in power-of-two worlds, as
 * Rabenseifner's recursive halving + doubling (log2 n pairwise exchanges each
 * way), else as a ring reduce-scatter + all-gather cut into pipelined
 * segments; small ones as recursive doubling; broadcast is
 * a pipelined chain (large) or a binomial tree (small); all-gather and
 * reduce-scatter are rings; barrier is a one-byte recursive doubling.
 *
 * Every collective opens with each rank sending its dt_coll_sig to its ring
 * neighbour on the right and reading its left neighbour's (read whenever the
 * rank waits, whatever else it waits for), so ranks that issued different
 * collectives meet a DT_MISMATCH instead of garbage or a hang. After any
 * failure the backend is broken: it shuts its sockets down so every peer
 * learns at once, and later collectives fail immediately. */
#define _GNU_SOURCE /* POLLRDHUP: a peer's closed connection shows up while we wait for others */
#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "dist/dist-impl.h"

#define TCP_MAGIC 0x50435444u   /* "DTCP" little endian */
#define TCP_VERSION 2u
#define SEG_BYTES ((size_t)256 << 10)   /* pipeline segment: send, receive and reduce overlap */
#define EX_SEG_BYTES ((size_t)1 << 20) /* pairwise exchange (Rabenseifner): received and reduced per
                                        * segment; larger than the ring's (no downstream to feed), still
                                        * within L2, fewer calls and wake-ups (measured: 4 ranks on 2 cores) */
#define TMP_BYTES (SEG_BYTES > EX_SEG_BYTES ? SEG_BYTES : EX_SEG_BYTES)
#define SMALL_BYTES ((size_t)64 << 10)  /* all-reduce / broadcast at or below: latency algorithms */
#define A2A_MAX_BYTES ((size_t)4 << 10) /* all-reduce at or below, worlds of 3..8 not a power of two: all-to-all */
#define A2A_MAX_RANKS 8
#define SOCK_BUF_BYTES (4 << 20)        /* SO_SNDBUF / SO_RCVBUF request */
#define LOWAT_MAX_BYTES EX_SEG_BYTES /* a sleeping receiver wakes once this much (or the rest) is there */
#define POLL_SLICE_MS 100               /* abort flag checked at least this often */
#define SPIN_S 50e-6                    /* polling (with sched_yield) before sleeping in poll */
#define SPIN_MAX_BYTES ((size_t)4 << 20) /* pipelines of messages up to this spin too */
#define HANDSHAKE_S 5.0                 /* an accepted connection must say hello within this */
#define MAX_PENDING 16                  /* accepted connections still in their handshake */

_Static_assert(SMALL_BYTES <= SEG_BYTES, "recursive doubling receives a whole message into the segment buffer");
_Static_assert((A2A_MAX_BYTES + 32) * (A2A_MAX_RANKS + 1) <= TMP_BYTES, "all-to-all's messages fit in tmp");
_Static_assert(sizeof(dt_coll_sig) == 32, "dt_coll_sig travels as 32 bytes");

/* A new connection's handshake (the connector is the lower rank):
 *   connector -> acceptor   hello + 32-byte nonce
 *   acceptor -> connector   hello + 32-byte nonce
 *   connector -> acceptor   HMAC(secret, "dtrain tcp connector" | prefix | both hellos with their nonces)
 *   acceptor -> connector   HMAC(secret, "dtrain tcp acceptor" | the same)
 * so a stranger on a rank's data port (which is only open during setup) can
 * neither pose as a peer nor replay a captured exchange. */
typedef struct tcp_hello {
  uint32_t magic, version;
  int32_t from, to, size;
  uint32_t reserved;
  uint64_t tag; /* FNV-1a of the key prefix (a quick filter; the MACs are what admit) */
} tcp_hello;
_Static_assert(sizeof(tcp_hello) == 32, "hello is 32 bytes");
#define HELLO_BYTES (sizeof(tcp_hello) + DT_AUTH_NONCE) /* hello + nonce */
static const char label_connector[] = "dtrain tcp connector", label_acceptor[] = "dtrain tcp acceptor";

typedef struct tcp_backend {
  dt_backend base;
  int *global;          /* size: group rank of each backend rank */
  int *fd;              /* size: socket to each rank, -1 for self */
  char (*addr)[80];     /* size: "host:port" each rank published, for messages */
  uint64_t *closed_at;  /* size: order in which peers were seen closing (0 = open) */
  int *lowat;           /* size: SO_RCVLOWAT last set on each socket (bytes; 0 = the default) */
  int lowat_cap;        /* a quarter of the receive buffer: always reachable before the sender stalls */
  uint64_t closures;
  struct pollfd *pfd;   /* poll scratch: size + 64 entries */
  int *pfd_op;          /* pfd[i] belongs to op pfd_op[i], or -1-peer for a watch-only peer */
  int npfd_cap;
  void *tmp;            /* TMP_BYTES: one received segment before it is reduced */
  void *scratch;        /* reduce-scatter partials, grown on demand */
  size_t scratch_len;
  struct pstep *steps;  /* 4 * size pipeline steps */
  dt_status broken;     /* first failure; DT_OK while healthy */
  char broken_msg[512];
} tcp_backend;

/* ---- naming and failure ---------------------------------------------------- */

static const char *who(const tcp_backend *b, int j, char *buf, size_t len) {
  snprintf(buf, len, "rank %d (%s)", b->global[j], b->addr[j]);
  return buf;
}

static void note_closed(tcp_backend *b, int j) {
  if (!b->closed_at[j]) b->closed_at[j] = ++b->closures;
}

/* Peer j is gone. If another peer was seen closing earlier, that one is the
 * likely cause (peers shut their sockets down in cascade after a failure). */
static dt_status peer_lost(tcp_backend *b, int j, const char *why) {
  /* Closures that arrived with this one: a dead process closes all its
   * sockets at once, a peer that merely gave up on it closes later. */
  int n = 0;
  for (int i = 0; i < b->base.size && n < b->npfd_cap; i++)
    if (i != j && b->fd[i] >= 0 && !b->closed_at[i]) {
      b->pfd[n] = (struct pollfd){b->fd[i], POLLRDHUP, 0};
      b->pfd_op[n++] = i;
    }
  if (n > 0 && poll(b->pfd, (nfds_t)n, 0) > 0)
    for (int i = 0; i < n; i++)
      if (b->pfd[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) note_closed(b, b->pfd_op[i]);
  note_closed(b, j);
  int first = j;
  for (int i = 0; i < b->base.size; i++)
    if (b->closed_at[i] && b->closed_at[i] < b->closed_at[first]) first = i;
  char w[128], w2[128];
  if (first != j)
    return dt_error(DT_PEER_LOST, "%s: connection closed (then %s: %s)", who(b, first, w, sizeof w),
                    who(b, j, w2, sizeof w2), why);
  return dt_error(DT_PEER_LOST, "%s: %s", who(b, j, w, sizeof w), why);
}

static void shutdown_all(tcp_backend *b) {
  for (int j = 0; j < b->base.size; j++)
    if (b->fd[j] >= 0) shutdown(b->fd[j], SHUT_RDWR);
}

/* Records the first failure and tells every peer by shutting the sockets down. */
static dt_status fail(tcp_backend *b, dt_status st) {
  if (st == DT_OK) return st;
  if (b->broken == DT_OK) {
    b->broken = st;
    snprintf(b->broken_msg, sizeof b->broken_msg, "%s", dt_last_error());
    /* After a lost peer, wait a moment before closing: a dead process's
     * sockets all close at once, so every rank sees the real culprit close
     * before the ranks that merely gave up on it. */
    if (st == DT_PEER_LOST) nanosleep(&(struct timespec){0, 100 * 1000000L}, NULL);
    shutdown_all(b);
  }
  return st;
}

static dt_status check_usable(tcp_backend *b) {
  if (atomic_load(&b->base.aborted)) return fail(b, dt_error(DT_INTERRUPTED, "tcp backend aborted"));
  if (b->broken != DT_OK)
    return dt_error(b->broken, "tcp backend unusable after an earlier failure: %s", b->broken_msg);
  return DT_OK;
}

/* ---- nonblocking transfers ----------------------------------------------- */

typedef struct io_op {
  int peer;
  int sending;
  char *buf;
  size_t len, done;
} io_op;

/* Moves bytes of op until the socket would block. */
static dt_status op_io(tcp_backend *b, io_op *op, int *moved) {
  int fd = b->fd[op->peer];
  while (op->done < op->len) {
    ssize_t k = op->sending ? send(fd, op->buf + op->done, op->len - op->done, MSG_NOSIGNAL | MSG_DONTWAIT)
                            : recv(fd, op->buf + op->done, op->len - op->done, MSG_DONTWAIT);
    if (k > 0) {
      op->done += (size_t)k;
      *moved = 1;
      continue;
    }
    if (k == 0) return peer_lost(b, op->peer, "connection closed");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    char why[96];
    snprintf(why, sizeof why, "connection lost (%s)", strerror(errno));
    return peer_lost(b, op->peer, why);
  }
  return DT_OK;
}

/* Makes poll report peer j readable only once `want` bytes (capped) have
 * arrived, so a receiver sleeping on a large segment wakes once for it rather
 * than for every loopback packet: with ranks outnumbering cores each early
 * wake-up gives away a time slice. Set only when it changes (one call). */
static void set_lowat(tcp_backend *b, int j, size_t want) {
  int v = want > (size_t)b->lowat_cap ? b->lowat_cap : want > 0 ? (int)want : 1;
  if (b->lowat[j] == v) return;
  if (setsockopt(b->fd[j], SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v) == 0) b->lowat[j] = v;
}

/* Sleeps until one of the ops can move, a peer closes, the deadline passes or
 * the backend is aborted (checked every POLL_SLICE_MS). Peers without an op
 * are watched for a closed connection only: a peer that closes while we wait
 * for another is remembered, and named if the wait then fails. */
static dt_status wait_ops(tcp_backend *b, io_op *const *ops, int nops, double deadline, int spin) {
  int n = 0;
  for (int i = 0; i < nops && n < b->npfd_cap; i++) {
    if (!ops[i]->sending) set_lowat(b, ops[i]->peer, ops[i]->len - ops[i]->done);
    b->pfd[n] = (struct pollfd){b->fd[ops[i]->peer], (short)((ops[i]->sending ? POLLOUT : POLLIN) | POLLRDHUP), 0};
    b->pfd_op[n++] = i;
  }
  for (int j = 0; j < b->base.size && n < b->npfd_cap; j++) {
    if (b->fd[j] < 0 || b->closed_at[j]) continue;
    int has_op = 0;
    for (int i = 0; i < nops; i++) has_op |= ops[i]->peer == j;
    if (has_op) continue;
    b->pfd[n] = (struct pollfd){b->fd[j], POLLRDHUP, 0};
    b->pfd_op[n++] = -1 - j;
  }
  /* Small messages answer within microseconds: look again a few times,
   * yielding the core in between, before paying for a sleep and a wake-up. */
  double spin_until = spin ? dt_time_now() + SPIN_S : 0;
  while (spin && poll(b->pfd, (nfds_t)n, 0) == 0) {
    if (dt_time_now() >= spin_until) break;
    sched_yield();
  }
  for (;;) {
    if (atomic_load(&b->base.aborted)) return dt_error(DT_INTERRUPTED, "tcp backend aborted");
    int ms = POLL_SLICE_MS;
    if (deadline > 0) {
      double left = deadline - dt_time_now();
      if (left <= 0) {
        int blame = -1;
        for (int i = 0; i < nops && blame < 0; i++)
          if (!ops[i]->sending) blame = ops[i]->peer;
        if (blame < 0 && nops) blame = ops[0]->peer;
        char w[128];
        if (blame < 0) return dt_error(DT_TIMEOUT, "collective deadline passed");
        return dt_error(DT_TIMEOUT, "waiting for %s to %s", who(b, blame, w, sizeof w),
                        ops[0]->peer == blame && ops[0]->sending ? "take our data" : "send");
      }
      if (left * 1000 < ms) ms = (int)(left * 1000) + 1;
    }
    int r = poll(b->pfd, (nfds_t)n, spin_until > 0 ? 0 : ms);
    spin_until = 0;
    if (r < 0 && errno != EINTR) return dt_error(DT_IO, "tcp: poll: %s", strerror(errno));
    if (r <= 0) continue;
    int ready = 0;
    for (int i = 0; i < n; i++) {
      short ev = b->pfd[i].revents;
      if (!ev) continue;
      if (b->pfd_op[i] < 0) { /* watched peer closed: remember, keep waiting for the others */
        int j = -1 - b->pfd_op[i];
        note_closed(b, j);
        b->pfd[i].fd = -1;
        continue;
      }
      const io_op *op = ops[b->pfd_op[i]];
      /* A peer that closed will never read what we still have to send it. */
      if (op->sending && (ev & (POLLRDHUP | POLLHUP | POLLERR))) return peer_lost(b, op->peer, "connection closed");
      ready = 1; /* readable or closed: the receive tells which */
    }
    if (ready) return DT_OK;
  }
}

/* ---- per-collective state: the signature exchange with the ring neighbours - */

typedef struct cstate {
  const dt_coll *c;
  dt_coll_sig mine, theirs;
  io_op sig_out, sig_in; /* to the right neighbour, from the left one */
  int sig_checked;
} cstate;

static void cstate_init(tcp_backend *b, cstate *cs, const dt_coll *c) {
  int r = b->base.rank, n = b->base.size;
  memset(cs, 0, sizeof *cs);
  cs->c = c;
  dt_coll_sig_make(c, &cs->mine);
  cs->sig_out = (io_op){(r + 1) % n, 1, (char *)&cs->mine, sizeof cs->mine, 0};
  cs->sig_in = (io_op){(r + n - 1) % n, 0, (char *)&cs->theirs, sizeof cs->theirs, 0};
}

/* Moves the signature bytes; checks the left neighbour's once complete. */
static dt_status sig_io(tcp_backend *b, cstate *cs, int *moved) {
  if (cs->sig_out.done < cs->sig_out.len) DT_CHECK(op_io(b, &cs->sig_out, moved));
  if (cs->sig_in.done < cs->sig_in.len) DT_CHECK(op_io(b, &cs->sig_in, moved));
  if (!cs->sig_checked && cs->sig_in.done == cs->sig_in.len) {
    cs->sig_checked = 1;
    DT_CHECK(dt_coll_sig_check(&cs->mine, &cs->theirs, b->global[cs->sig_in.peer]));
  }
  return DT_OK;
}

/* Moves the signature x and the transfer y that follows it on the same link
 * in one system call (small collectives: half the calls and wake-ups). */
static dt_status pair_io(tcp_backend *b, io_op *x, io_op *y, int *moved) {
  int fd = b->fd[x->peer];
  while (x->done < x->len) {
    struct iovec iov[2] = {{x->buf + x->done, x->len - x->done}, {y->buf + y->done, y->len - y->done}};
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = iov;
    m.msg_iovlen = 2;
    ssize_t k = x->sending ? sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT) : recvmsg(fd, &m, MSG_DONTWAIT);
    if (k > 0) {
      size_t first = (size_t)k < x->len - x->done ? (size_t)k : x->len - x->done;
      x->done += first;
      y->done += (size_t)k - first;
      *moved = 1;
      continue;
    }
    if (k == 0) return peer_lost(b, x->peer, "connection closed");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return DT_OK;
    char why[96];
    snprintf(why, sizeof why, "connection lost (%s)", strerror(errno));
    return peer_lost(b, x->peer, why);
  }
  return DT_OK; /* the caller checks a received signature before anything else */
}

/* Runs ops (all concurrently; ops on the same peer and direction in list
 * order, after the signature on that link) until they are complete. With
 * finish set, also until the signature exchange is complete. */
static dt_status run_ops(tcp_backend *b, cstate *cs, io_op *ops, int nops, int finish) {
  io_op *active[16];
  for (;;) {
    int moved = 0;
    /* Signatures first, each with the first transfer on its link. */
    io_op *sigs[2] = {&cs->sig_out, &cs->sig_in};
    for (int k = 0; k < 2; k++) {
      io_op *x = sigs[k];
      if (x->done == x->len) continue;
      io_op *y = NULL;
      for (int i = 0; i < nops && !y; i++)
        if (ops[i].peer == x->peer && ops[i].sending == x->sending && ops[i].done < ops[i].len) y = &ops[i];
      DT_CHECK(y ? pair_io(b, x, y, &moved) : op_io(b, x, &moved));
    }
    DT_CHECK(sig_io(b, cs, &moved));
    int na = 0;
    if (cs->sig_out.done < cs->sig_out.len) active[na++] = &cs->sig_out;
    if (cs->sig_in.done < cs->sig_in.len) active[na++] = &cs->sig_in;
    int pending = 0;
    for (int i = 0; i < nops; i++) {
      io_op *op = &ops[i];
      if (op->done == op->len) continue;
      pending = 1;
      int blocked = 0; /* an earlier transfer on the same link and direction comes first */
      for (int k = 0; k < na && !blocked; k++) blocked = active[k]->peer == op->peer && active[k]->sending == op->sending;
      if (blocked) continue;
      DT_CHECK(op_io(b, op, &moved));
      if (op->done < op->len && na < 16) active[na++] = op;
    }
    if (!pending && (!finish || na == 0)) return DT_OK;
    if (atomic_load(&b->base.aborted)) return dt_error(DT_INTERRUPTED, "tcp backend aborted");
    if (!moved) DT_CHECK(wait_ops(b, active, na, cs->c->deadline, 1));
  }
}

/* ---- pipelined ring / chain ------------------------------------------------ */

/* One step of a pipelined stream. Sending: src, bytes. Receiving: dst, bytes,
 * and a: NULL to store what arrives, else dst = op(a, arriving). */
typedef struct pstep {
  const char *src;
  char *dst;
  const char *a;
  size_t bytes;
} pstep;

/* Streams ns send steps to the right neighbour and nr receive steps from the
 * left one, each cut into segments of SEG_BYTES. Send segment k of step t may
 * leave once receive segment k of step t - dep is complete (dep = 1: a ring
 * forwards what it just reduced; dep = 0: a chain forwards what it just got). */
static dt_status pipeline(tcp_backend *b, cstate *cs, const pstep *ss, int ns, const pstep *rs, int nr, int dep) {
  const dt_coll *c = cs->c;
  size_t es = dt_dtype_size(c->dtype), maxb = 0;
  for (int t = 0; t < ns; t++) maxb = ss[t].bytes > maxb ? ss[t].bytes : maxb;
  for (int t = 0; t < nr; t++) maxb = rs[t].bytes > maxb ? rs[t].bytes : maxb;
  long nseg = (long)((maxb + SEG_BYTES - 1) / SEG_BYTES);
  long s_items = ns * nseg, r_items = nr * nseg, lag = dep * nseg;
  /* Mid-sized messages take a few segments per step: waking up costs more
   * than the wait. Large ones keep the cores for the ranks doing the work. */
  int spin = c->count * es <= SPIN_MAX_BYTES;
  io_op so = {cs->sig_out.peer, 1, NULL, 0, 0}, ro = {cs->sig_in.peer, 0, NULL, 0, 0};
  long si = 0, ri = 0;
  int s_set = 0, r_set = 0;
  for (;;) {
    int moved = 0;
    DT_CHECK(sig_io(b, cs, &moved));
    /* Send every ready segment the socket takes. */
    while (cs->sig_out.done == cs->sig_out.len && si < s_items) {
      if (!s_set) {
        if (nr > 0 && si >= lag && ri <= si - lag) break; /* its data has not arrived yet */
        const pstep *st = &ss[si / nseg];
        size_t lo = (size_t)(si % nseg) * SEG_BYTES;
        size_t len = st->bytes > lo ? st->bytes - lo : 0;
        if (len > SEG_BYTES) len = SEG_BYTES;
        if (len == 0) {
          si++;
          continue;
        }
        so.buf = (char *)st->src + lo, so.len = len, so.done = 0, s_set = 1;
      }
      DT_CHECK(op_io(b, &so, &moved));
      if (so.done < so.len) break;
      s_set = 0, si++;
    }
    /* Receive (and reduce) every segment that has arrived. */
    while (cs->sig_in.done == cs->sig_in.len && ri < r_items) {
      const pstep *st = &rs[ri / nseg];
      size_t lo = (size_t)(ri % nseg) * SEG_BYTES;
      if (!r_set) {
        size_t len = st->bytes > lo ? st->bytes - lo : 0;
        if (len > SEG_BYTES) len = SEG_BYTES;
        if (len == 0) {
          ri++;
          continue;
        }
        ro.buf = st->a ? (char *)b->tmp : st->dst + lo, ro.len = len, ro.done = 0, r_set = 1;
      }
      DT_CHECK(op_io(b, &ro, &moved));
      if (ro.done < ro.len) break;
      if (st->a) dt_reduce_pair(st->dst + lo, st->a + lo, b->tmp, ro.len / es, c->dtype, c->op);
      r_set = 0, ri++;
    }
    int sig_done = cs->sig_out.done == cs->sig_out.len && cs->sig_in.done == cs->sig_in.len;
    if (sig_done && si == s_items && ri == r_items) return DT_OK;
    if (atomic_load(&b->base.aborted)) return dt_error(DT_INTERRUPTED, "tcp backend aborted");
    if (moved) continue;
    io_op *active[4];
    int na = 0;
    if (cs->sig_in.done < cs->sig_in.len) active[na++] = &cs->sig_in;
    else if (ri < r_items) active[na++] = &ro; /* the left neighbour, whether or not a segment has begun */
    if (cs->sig_out.done < cs->sig_out.len) active[na++] = &cs->sig_out;
    else if (s_set) active[na++] = &so;
    DT_CHECK(wait_ops(b, active, na, c->deadline, spin));
  }
}

/* ---- helpers ---------------------------------------------------------------- */

static int mod(int a, int n) { return ((a % n) + n) % n; }

/* Ends a collective: the signature exchange must be complete too; any failure
 * breaks the backend. */
static dt_status finish(tcp_backend *b, cstate *cs, dt_status st) {
  if (st == DT_OK) st = run_ops(b, cs, NULL, 0, 1);
  return fail(b, st);
}

/* Recursive doubling over buf (bytes); reduce = 0 only synchronises (barrier).
 * Non-power-of-two sizes fold the first 2*extra ranks in pairs first. Each
 * pair combines as op(lower rank's, higher rank's) so every rank ends up with
 * the same bits. */
static dt_status rd_allreduce(tcp_backend *b, cstate *cs, char *buf, size_t bytes, int reduce) {
  const dt_coll *c = cs->c;
  int r = b->base.rank, n = b->base.size;
  size_t elems = reduce ? bytes / dt_dtype_size(c->dtype) : 0;
  int p = 1;
  while (p * 2 <= n) p *= 2;
  int extra = n - p, nr;
  if (r < 2 * extra) {
    if (r % 2 == 0) { /* hand the data to r+1, get the result back */
      io_op ops[2] = {{r + 1, 1, buf, bytes, 0}, {r + 1, 0, buf, bytes, 0}};
      return run_ops(b, cs, ops, 2, 0);
    }
    io_op in = {r - 1, 0, b->tmp, bytes, 0};
    DT_CHECK(run_ops(b, cs, &in, 1, 0));
    if (reduce) dt_reduce_pair(buf, b->tmp, buf, elems, c->dtype, c->op);
    nr = r / 2;
  } else {
    nr = r - extra;
  }
  for (int mask = 1; mask < p; mask <<= 1) {
    int pn = nr ^ mask, peer = pn < extra ? 2 * pn + 1 : pn + extra;
    io_op ops[2] = {{peer, 1, buf, bytes, 0}, {peer, 0, b->tmp, bytes, 0}};
    DT_CHECK(run_ops(b, cs, ops, 2, 0));
    if (!reduce) continue;
    if (peer < r)
      dt_reduce_pair(buf, b->tmp, buf, elems, c->dtype, c->op);
    else
      dt_reduce_pair(buf, buf, b->tmp, elems, c->dtype, c->op);
  }
  if (r < 2 * extra) {
    io_op out = {r - 1, 1, buf, bytes, 0};
    DT_CHECK(run_ops(b, cs, &out, 1, 0));
  }
  return DT_OK;
}

/* All-to-all for tiny messages in worlds that are not a power of two: every rank sends its input to every other
 * at once and reduces the n inputs in rank order, as shm does (the same bits). One round of hand-offs where
 * recursive doubling needs its fold in and out besides (three sequential hops at n = 3): 8-64 B at 3 ranks on 2
 * cores went from 62-99 to 56-77 us. At 4 ranks (two rounds of one message each) the 3 messages per rank were
 * slower (8-512 B: 83-110 -> 119-158 us), so powers of two keep recursive doubling. Each message carries the sender's
 * signature, checked by every receiver: data from a rank that is not a ring neighbour is never taken unchecked.
 * tmp holds this rank's message, then one slot per rank: [signature | input]. */
static dt_status a2a_allreduce(tcp_backend *b, cstate *cs, size_t bytes) {
  const dt_coll *c = cs->c;
  const int r = b->base.rank, n = b->base.size;
  const size_t msg = sizeof(dt_coll_sig) + bytes;
  io_op ops[2 * (A2A_MAX_RANKS - 1)];
  const void *srcs[A2A_MAX_RANKS];
  memcpy(b->tmp, &cs->mine, sizeof(dt_coll_sig));
  if (bytes) memcpy(b->tmp + sizeof(dt_coll_sig), c->send, bytes);
  int k = 0;
  for (int j = 0; j < n; j++) {
    char *slot = j == r ? b->tmp : b->tmp + (size_t)(j + 1) * msg;
    srcs[j] = slot + sizeof(dt_coll_sig);
    if (j == r) continue;
    ops[k++] = (io_op){j, 1, b->tmp, msg, 0};
    ops[k++] = (io_op){j, 0, slot, msg, 0};
  }
  DT_CHECK(run_ops(b, cs, ops, k, 0));
  for (int j = 0; j < n; j++) {
    dt_coll_sig theirs;
    if (j == r) continue;
    memcpy(&theirs, b->tmp + (size_t)(j + 1) * msg, sizeof theirs);
    DT_CHECK(dt_coll_sig_check(&cs->mine, &theirs, b->global[j]));
  }
  dt_reduce_many(c->recv, srcs, n, c->count, c->dtype, c->op);
  return DT_OK;
}

/* Ring reduce-scatter steps: at step t rank r sends block r-t-1 and receives
 * block r-t-2, which it combines with its own input; after n-1 steps it holds
 * block r reduced. part(k) is where block k's partial result lives. */
static int ring_rs_steps(tcp_backend *b, const dt_coll *c, const char *send, char *own, char *partials, pstep *ss,
                         pstep *rs) {
  int r = b->base.rank, n = b->base.size;
  size_t es = dt_dtype_size(c->dtype);
  for (int t = 0; t < n - 1; t++) {
    int sb = mod(r - t - 1, n), rb = mod(r - t - 2, n);
    size_t off, len;
    dt_block_of(c->count, n, sb, &off, &len);
    ss[t] = (pstep){t == 0 ? send + off * es : partials + off * es, NULL, NULL, len * es};
    dt_block_of(c->count, n, rb, &off, &len);
    rs[t] = (pstep){NULL, rb == r ? own : partials + off * es, send + off * es, len * es};
  }
  return n - 1;
}

/* Sends src (sbytes) to peer while receiving rbytes from it: into dst, or,
 * with a set, segment by segment into tmp and then dst = op(a, arriving)
 * (operands in rank order, lower rank's first). Data on a ring neighbour's
 * link waits for the signature on that link. */
static dt_status exchange(tcp_backend *b, cstate *cs, int peer, const char *src, size_t sbytes, char *dst,
                          const char *a, size_t rbytes) {
  const dt_coll *c = cs->c;
  size_t es = dt_dtype_size(c->dtype), rdone = 0;
  int spin = c->count * es <= SPIN_MAX_BYTES, lower = peer < b->base.rank;
  io_op so = {peer, 1, (char *)src, sbytes, 0}, ro = {peer, 0, NULL, 0, 0};
  for (;;) {
    int moved = 0;
    DT_CHECK(sig_io(b, cs, &moved));
    int s_ok = peer != cs->sig_out.peer || cs->sig_out.done == cs->sig_out.len;
    int r_ok = peer != cs->sig_in.peer || cs->sig_in.done == cs->sig_in.len;
    if (s_ok && so.done < so.len) DT_CHECK(op_io(b, &so, &moved));
    while (r_ok && rdone < rbytes) {
      if (!a) { /* straight into place: one call takes whatever has arrived */
        ro.buf = dst, ro.len = rbytes, ro.done = rdone;
        DT_CHECK(op_io(b, &ro, &moved));
        rdone = ro.done;
        break;
      }
      if (ro.len == 0) ro.buf = b->tmp, ro.len = rbytes - rdone < EX_SEG_BYTES ? rbytes - rdone : EX_SEG_BYTES, ro.done = 0;
      DT_CHECK(op_io(b, &ro, &moved));
      if (ro.done < ro.len) break;
      size_t k = ro.len / es;
      if (lower)
        dt_reduce_pair(dst + rdone, b->tmp, a + rdone, k, c->dtype, c->op);
      else
        dt_reduce_pair(dst + rdone, a + rdone, b->tmp, k, c->dtype, c->op);
      rdone += ro.len, ro.len = 0;
    }
    if (so.done == so.len && rdone == rbytes) return DT_OK;
    if (atomic_load(&b->base.aborted)) return dt_error(DT_INTERRUPTED, "tcp backend aborted");
    if (moved) continue;
    io_op *active[4];
    int na = 0;
    if (rdone < rbytes) active[na++] = &ro; /* first: a timeout blames whom we wait for */
    if (cs->sig_in.done < cs->sig_in.len) active[na++] = &cs->sig_in;
    if (cs->sig_out.done < cs->sig_out.len) active[na++] = &cs->sig_out;
    if (so.done < so.len && s_ok) active[na++] = &so;
    DT_CHECK(wait_ops(b, active, na, c->deadline, spin));
  }
}

/* Rabenseifner's all-reduce for a power-of-two world: recursive halving
 * reduce-scatter (round k exchanges half of what remains with rank r ^ 2^k)
 * then recursive doubling all-gather in the reverse order. log2(n) rounds
 * each way instead of the ring's n - 1, the same bytes: far fewer hand-offs
 * when ranks outnumber cores. Each element's result is computed on one rank,
 * so every rank ends with the same bits. */
static dt_status rab_allreduce(tcp_backend *b, cstate *cs) {
  const dt_coll *c = cs->c;
  int r = b->base.rank, n = b->base.size, rounds = 0;
  size_t es = dt_dtype_size(c->dtype), lo[32], cnt[32]; /* range held before each round, elements */
  char *out = c->recv;
  const char *in = c->send;
  size_t l = 0, m = c->count;
  for (int mask = 1; mask < n; mask <<= 1, rounds++) {
    int peer = r ^ mask;
    size_t half = m / 2, keep_lo, keep_n, give_lo, give_n;
    if (r < peer) keep_lo = l, keep_n = half, give_lo = l + half, give_n = m - half;
    else give_lo = l, give_n = half, keep_lo = l + half, keep_n = m - half;
    lo[rounds] = l, cnt[rounds] = m;
    /* Round 0 reads the input; later rounds the partials already in out. */
    const char *src = rounds == 0 ? in : out;
    DT_CHECK(exchange(b, cs, peer, src + give_lo * es, give_n * es, out + keep_lo * es, src + keep_lo * es,
                      keep_n * es));
    l = keep_lo, m = keep_n;
  }
  for (int k = rounds - 1; k >= 0; k--) {
    int peer = r ^ (1 << k);
    /* The partner holds the rest of the range this rank held before round k. */
    size_t plo = l == lo[k] ? lo[k] + m : lo[k], pn = cnt[k] - m;
    DT_CHECK(exchange(b, cs, peer, out + l * es, m * es, out + plo * es, NULL, pn * es));
    l = lo[k], m = cnt[k];
  }
  return DT_OK;
}

/* ---- collectives ----------------------------------------------------------- */

static dt_status tcp_allreduce(dt_backend *base, const dt_coll *c) {
  tcp_backend *b = (tcp_backend *)base;
  DT_CHECK(check_usable(b));
  int r = base->rank, n = base->size;
  size_t es = dt_dtype_size(c->dtype), bytes = c->count * es;
  if (n == 1) {
    if (c->send != c->recv && bytes) memmove(c->recv, c->send, bytes);
    return DT_OK;
  }
  cstate cs;
  cstate_init(b, &cs, c);
  dt_status st;
  if (n >= 3 && n <= A2A_MAX_RANKS && (n & (n - 1)) != 0 && bytes <= A2A_MAX_BYTES) {
    st = a2a_allreduce(b, &cs, bytes);
  } else if (bytes <= SMALL_BYTES) {
    if (c->send != c->recv && bytes) memcpy(c->recv, c->send, bytes);
    st = rd_allreduce(b, &cs, c->recv, bytes, 1);
  } else if ((n & (n - 1)) == 0 && (n >= 4 || bytes > ((size_t)4 << 20))) {
    /* Halving and doubling: log2(n) rounds instead of 2(n-1). With 2 ranks
     * the data flow is the same as the ring's, whose pipeline streams the
     * all-gather behind the reduce-scatter in small segments (faster up to a
     * few MiB); above that the exchange's larger segments (fewer wake-ups) win. */
    st = rab_allreduce(b, &cs);
  } else {
    pstep *ss = b->steps, *rs = b->steps + 2 * n;
    char *out = c->recv;
    size_t off, len;
    dt_block_of(c->count, n, r, &off, &len);
    int k = ring_rs_steps(b, c, c->send, out + off * es, out, ss, rs);
    /* All-gather continues the same stream: step t sends block r-t, receives block r-t-1. */
    for (int t = 0; t < n - 1; t++) {
      dt_block_of(c->count, n, mod(r - t, n), &off, &len);
      ss[k + t] = (pstep){out + off * es, NULL, NULL, len * es};
      dt_block_of(c->count, n, mod(r - t - 1, n), &off, &len);
      rs[k + t] = (pstep){NULL, out + off * es, NULL, len * es};
    }
    st = pipeline(b, &cs, ss, 2 * (n - 1), rs, 2 * (n - 1), 1);
  }
  return finish(b, &cs, st);
}

static dt_status tcp_reduce_scatter(dt_backend *base, const dt_coll *c) {
  tcp_backend *b = (tcp_backend *)base;
  DT_CHECK(check_usable(b));
  int r = base->rank, n = base->size;
  size_t es = dt_dtype_size(c->dtype), off, len;
  dt_block_of(c->count, n, r, &off, &len);
  if (n == 1) {
    if ((const char *)c->send + off * es != (char *)c->recv && len) memmove(c->recv, c->send, len * es);
    return DT_OK;
  }
  /* Partials of the blocks this rank forwards; its own block goes straight to recv. */
  size_t need = c->count * es;
  if (need > b->scratch_len) {
    dt_free(b->scratch);
    b->scratch = NULL, b->scratch_len = 0;
    DT_CHECK(dt_alloc(need, &b->scratch));
    b->scratch_len = need;
  }
  cstate cs;
  cstate_init(b, &cs, c);
  pstep *ss = b->steps, *rs = b->steps + 2 * n;
  int k = ring_rs_steps(b, c, c->send, c->recv, b->scratch, ss, rs);
  return finish(b, &cs, pipeline(b, &cs, ss, k, rs, k, 1));
}

static dt_status tcp_allgather(dt_backend *base, const dt_coll *c) {
  tcp_backend *b = (tcp_backend *)base;
  DT_CHECK(check_usable(b));
  int r = base->rank, n = base->size;
  size_t es = dt_dtype_size(c->dtype), off, len;
  char *out = c->recv;
  dt_block_of(c->count, n, r, &off, &len);
  if ((const char *)c->send != out + off * es && len) memmove(out + off * es, c->send, len * es);
  if (n == 1) return DT_OK;
  cstate cs;
  cstate_init(b, &cs, c);
  pstep *ss = b->steps, *rs = b->steps + 2 * n;
  for (int t = 0; t < n - 1; t++) {
    dt_block_of(c->count, n, mod(r - t, n), &off, &len);
    ss[t] = (pstep){out + off * es, NULL, NULL, len * es};
    dt_block_of(c->count, n, mod(r - t - 1, n), &off, &len);
    rs[t] = (pstep){NULL, out + off * es, NULL, len * es};
  }
  return finish(b, &cs, pipeline(b, &cs, ss, n - 1, rs, n - 1, 1));
}

static dt_status tcp_broadcast(dt_backend *base, const dt_coll *c) {
  tcp_backend *b = (tcp_backend *)base;
  DT_CHECK(check_usable(b));
  int r = base->rank, n = base->size;
  if (c->root < 0 || c->root >= n)
    return fail(b, dt_error(DT_INVALID_ARGUMENT, "broadcast root %d outside 0..%d", c->root, n - 1));
  if (n == 1) return DT_OK;
  size_t bytes = c->count * dt_dtype_size(c->dtype);
  int rel = mod(r - c->root, n);
  cstate cs;
  cstate_init(b, &cs, c);
  dt_status st = DT_OK;
  if (bytes <= SMALL_BYTES) { /* binomial tree over ranks relative to the root */
    int mask = 1;
    for (; mask < n; mask <<= 1)
      if (rel & mask) {
        io_op in = {mod(rel - mask + c->root, n), 0, c->recv, bytes, 0};
        st = run_ops(b, &cs, &in, 1, 0);
        break;
      }
    io_op out[16];
    int k = 0;
    for (mask >>= 1; mask > 0 && st == DT_OK; mask >>= 1)
      if (rel + mask < n) out[k++] = (io_op){mod(rel + mask + c->root, n), 1, c->recv, bytes, 0};
    if (st == DT_OK) st = run_ops(b, &cs, out, k, 0);
  } else { /* a pipelined chain root -> root+1 -> ... along the ring */
    pstep *ss = b->steps, *rs = b->steps + 2 * n;
    ss[0] = (pstep){c->recv, NULL, NULL, bytes};
    rs[0] = (pstep){NULL, c->recv, NULL, bytes};
    st = pipeline(b, &cs, ss, rel < n - 1, rs, rel > 0, 0);
  }
  return finish(b, &cs, st);
}

static dt_status tcp_barrier(dt_backend *base, const dt_coll *c) {
  tcp_backend *b = (tcp_backend *)base;
  DT_CHECK(check_usable(b));
  if (base->size == 1) return DT_OK;
  cstate cs;
  cstate_init(b, &cs, c);
  char token = 1; /* one byte per exchange: no rank leaves before every rank arrived */
  return finish(b, &cs, rd_allreduce(b, &cs, &token, 1, 0));
}

static void tcp_abort(dt_backend *base) { atomic_store(&base->aborted, 1); }

static void tcp_destroy(dt_backend *base) {
  tcp_backend *b = (tcp_backend *)base;
  if (!b) return;
  if (b->fd)
    for (int j = 0; j < base->size; j++) dt_net_close(&b->fd[j]);
  dt_free(b->global);
  dt_free(b->fd);
  dt_free(b->addr);
  dt_free(b->closed_at);
  dt_free(b->lowat);
  dt_free(b->pfd);
  dt_free(b->pfd_op);
  dt_free(b->tmp);
  dt_free(b->scratch);
  dt_free(b->steps);
  dt_free(b);
}

static const dt_backend_ops tcp_ops = {.name = "tcp", .allreduce = tcp_allreduce, .broadcast = tcp_broadcast,
                                       .allgather = tcp_allgather, .reduce_scatter = tcp_reduce_scatter,
                                       .barrier = tcp_barrier, .abort = tcp_abort, .destroy = tcp_destroy};

/* ---- setup --------------------------------------------------------------------- */

static uint64_t fnv1a(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static void tune_socket(int fd) {
  int sz = SOCK_BUF_BYTES;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
  dt_net_set_nodelay(fd);
}

static double remaining(double deadline) {
  double left = deadline - dt_time_now();
  return left > 0.001 ? left : 0.001;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Splits "host:port" (the last colon separates). */
static dt_status parse_addr(const char *s, char *host, size_t hlen, int *port) {
  const char *colon = strrchr(s, ':');
  char *end = NULL;
  long p = colon ? strtol(colon + 1, &end, 10) : -1;
  if (!colon || colon == s || (size_t)(colon - s) >= hlen || !end || *end || p <= 0 || p > 65535)
    return dt_error(DT_CORRUPT, "malformed peer address '%s' (expected host:port)", s);
  memcpy(host, s, (size_t)(colon - s));
  host[colon - s] = 0;
  *port = (int)p;
  return DT_OK;
}

static int hello_ok(const tcp_hello *h, uint64_t tag, int from, int to, int size) {
  return h->magic == TCP_MAGIC && h->version == TCP_VERSION && h->tag == tag && h->from == from && h->to == to &&
         h->size == size;
}

/* The MAC of one side over the handshake: both hellos with their nonces, bound to the group's prefix. */
static void mesh_mac(const dt_backend_ctx *ctx, const char *label, const uint8_t *conn_first, const uint8_t *acc_first,
                     uint8_t out[DT_AUTH_MAC]) {
  dt_auth_part parts[3] = {{ctx->prefix, strlen(ctx->prefix)}, {conn_first, HELLO_BYTES}, {acc_first, HELLO_BYTES}};
  dt_auth_mac(ctx->secret, label, parts, 3, out);
}

/* Our hello and a fresh nonce, as they go on the wire. */
static dt_status hello_make(int from, int to, int size, uint64_t tag, uint8_t out[HELLO_BYTES]) {
  tcp_hello h = {TCP_MAGIC, TCP_VERSION, from, to, size, 0, tag};
  memcpy(out, &h, sizeof h);
  return dt_random_bytes(out + sizeof h, DT_AUTH_NONCE);
}

/* The connector's side of the handshake on fd; 1 if rank j answered as itself and proved the secret. */
static int shake_as_connector(tcp_backend *b, const dt_backend_ctx *ctx, int fd, int j, uint64_t tag, double deadline,
                              const char *w, dt_status *st) {
  int r = b->base.rank, n = b->base.size;
  uint8_t mine[HELLO_BYTES], theirs[HELLO_BYTES], mac[DT_AUTH_MAC], want[DT_AUTH_MAC];
  tcp_hello h;
  if ((*st = hello_make(r, j, n, tag, mine)) != DT_OK) return 0;
  *st = dt_net_send_all(fd, mine, sizeof mine, deadline, NULL, w);
  if (*st == DT_OK) *st = dt_net_recv_all(fd, theirs, sizeof theirs, deadline, NULL, w);
  if (*st != DT_OK) return 0;
  memcpy(&h, theirs, sizeof h);
  if (!hello_ok(&h, tag, j, r, n)) return 0;
  mesh_mac(ctx, label_connector, mine, theirs, mac);
  *st = dt_net_send_all(fd, mac, sizeof mac, deadline, NULL, w);
  if (*st == DT_OK) *st = dt_net_recv_all(fd, mac, sizeof mac, deadline, NULL, w);
  if (*st != DT_OK) return 0;
  mesh_mac(ctx, label_acceptor, mine, theirs, want);
  return dt_auth_equal(mac, want);
}

/* Connects to higher rank j and shakes hands; a wrong answer (another
 * process on that port, or one without the job secret) is logged and retried
 * until the deadline. */
static dt_status connect_peer(tcp_backend *b, const dt_backend_ctx *ctx, int j, uint64_t tag, double deadline) {
  char host[80], w[128];
  int port = 0;
  DT_CHECK(parse_addr(b->addr[j], host, sizeof host, &port));
  who(b, j, w, sizeof w);
  for (;;) {
    int fd = -1;
    DT_CHECK(dt_net_connect(host, port, deadline, NULL, w, &fd));
    tune_socket(fd);
    dt_status st = DT_OK;
    if (shake_as_connector(b, ctx, fd, j, tag, deadline, w, &st)) {
      b->fd[j] = fd;
      return DT_OK;
    }
    dt_net_close(&fd);
    if (st == DT_TIMEOUT || dt_time_now() >= deadline)
      return dt_error(DT_TIMEOUT, "tcp setup: no handshake from %s before the deadline", w);
    DT_LOG_WARN("tcp", "setup: %s answered with %s; retrying", w,
                st == DT_OK ? "a wrong handshake (another job or process on that port, or no job secret?)"
                            : dt_last_error());
    sleep_ms(100);
  }
}

/* An accepted connection in its handshake: stage 0 reads the connector's
 * hello + nonce (then our reply goes out), stage 1 its MAC. */
typedef struct pending_conn {
  int fd;
  int stage;
  size_t got;
  double since;
  char ip[48];
  uint8_t first[HELLO_BYTES]; /* the connector's hello + nonce */
  uint8_t reply[HELLO_BYTES]; /* ours */
  uint8_t mac[DT_AUTH_MAC];
} pending_conn;

/* A stranger (or a peer that broke its handshake): logged once per address. */
static void drop_pending(pending_conn *p, int *np, int i, const char *why) {
  dt_auth_refused("tcp", p[i].ip, why);
  dt_net_close(&p[i].fd);
  p[i] = p[--*np];
}

/* Reads what has arrived of the current handshake message; 1 when it is complete. */
static int pending_read(pending_conn *p, int *closed) {
  uint8_t *buf = p->stage == 0 ? p->first : p->mac;
  size_t need = p->stage == 0 ? sizeof p->first : sizeof p->mac;
  ssize_t k = recv(p->fd, buf + p->got, need - p->got, MSG_DONTWAIT);
  if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) *closed = 1;
  if (k > 0) p->got += (size_t)k;
  return p->got == need;
}

/* Stage 0 done: checks the hello and sends ours. NULL, or why the connection is refused. */
static const char *pending_hello(tcp_backend *b, pending_conn *p, uint64_t tag, double deadline, char *why,
                                 size_t len) {
  int r = b->base.rank, n = b->base.size;
  tcp_hello h;
  memcpy(&h, p->first, sizeof h);
  if (!(h.from >= 0 && h.from < r && hello_ok(&h, tag, h.from, r, n))) {
    snprintf(why, len, "wrong handshake (magic 0x%08x, from %d to %d, world %d)", h.magic, h.from, h.to, h.size);
    return why;
  }
  if (hello_make(r, h.from, n, tag, p->reply) != DT_OK ||
      dt_net_send_all(p->fd, p->reply, sizeof p->reply, deadline, NULL, "a connecting rank") != DT_OK)
    return "could not answer its hello";
  p->stage = 1;
  p->got = 0;
  return NULL;
}

/* Stage 1 done: checks the connector's MAC, proves ours, and takes the socket as rank `from`'s. */
static const char *pending_proof(tcp_backend *b, const dt_backend_ctx *ctx, pending_conn *p, double deadline) {
  tcp_hello h;
  memcpy(&h, p->first, sizeof h);
  uint8_t want[DT_AUTH_MAC];
  mesh_mac(ctx, label_connector, p->first, p->reply, want);
  if (!dt_auth_equal(want, p->mac)) return "failed authentication (wrong job secret, or none)";
  if (b->fd[h.from] >= 0) return "a second connection claiming the same rank";
  mesh_mac(ctx, label_acceptor, p->first, p->reply, want);
  char w[128];
  if (dt_net_send_all(p->fd, want, sizeof want, deadline, NULL, who(b, h.from, w, sizeof w)) != DT_OK)
    return "could not send it our proof";
  tune_socket(p->fd);
  b->fd[h.from] = p->fd;
  return NULL;
}

/* Moves pending connection i on; 1 if it became a peer's socket (and left the list). */
static int pending_step(tcp_backend *b, const dt_backend_ctx *ctx, pending_conn *pend, int *np, int i, int readable,
                        uint64_t tag, double deadline) {
  pending_conn *p = &pend[i];
  int closed = 0, complete = readable && pending_read(p, &closed);
  char why[160];
  const char *bad = NULL;
  if (complete && p->stage == 0) {
    bad = pending_hello(b, p, tag, deadline, why, sizeof why);
  } else if (complete) {
    bad = pending_proof(b, ctx, p, deadline);
    if (!bad) {
      pend[i] = pend[--*np];
      return 1;
    }
  } else if (closed) {
    bad = "closed before completing its handshake";
  } else if (dt_time_now() - p->since > HANDSHAKE_S) {
    bad = "no handshake within 5 s";
  }
  if (bad) drop_pending(pend, np, i, bad);
  return 0;
}

/* The address of an accepted connection, for the refusal log. */
static void peer_ip(const struct sockaddr_storage *ss, char *buf, size_t len) {
  snprintf(buf, len, "?");
  if (ss->ss_family == AF_INET) inet_ntop(AF_INET, &((const struct sockaddr_in *)ss)->sin_addr, buf, (socklen_t)len);
  else if (ss->ss_family == AF_INET6)
    inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)ss)->sin6_addr, buf, (socklen_t)len);
}

/* Accepts the lower ranks. Handshakes proceed side by side, so a stranger
 * that connects and stalls or sends garbage delays no one; it is dropped. */
static dt_status accept_peers(tcp_backend *b, const dt_backend_ctx *ctx, int lfd, uint64_t tag, double deadline) {
  int r = b->base.rank, missing = r;
  pending_conn pend[MAX_PENDING];
  int np = 0;
  struct pollfd pfd[MAX_PENDING + 1];
  dt_status st = DT_OK;
  while (missing > 0) {
    pfd[0] = (struct pollfd){lfd, POLLIN, 0};
    for (int i = 0; i < np; i++) pfd[i + 1] = (struct pollfd){pend[i].fd, POLLIN, 0};
    double now = dt_time_now();
    if (now >= deadline) {
      int first = 0;
      while (first < r && b->fd[first] >= 0) first++;
      char w[128];
      st = dt_error(DT_TIMEOUT, "tcp setup: %d lower rank(s) did not connect in time, first %s", missing,
                    who(b, first, w, sizeof w));
      break;
    }
    int ms = (int)((deadline - now) * 1000) + 1;
    if (ms > POLL_SLICE_MS) ms = POLL_SLICE_MS;
    int pr = poll(pfd, (nfds_t)np + 1, ms);
    if (pr < 0 && errno != EINTR) {
      st = dt_error(DT_IO, "tcp setup: poll: %s", strerror(errno));
      break;
    }
    /* Walk backwards: drops and completions move the last entry into slot i. */
    for (int i = np - 1; i >= 0; i--)
      missing -= pending_step(b, ctx, pend, &np, i, pr > 0 && pfd[i + 1].revents, tag, deadline);
    if (pr > 0 && (pfd[0].revents & POLLIN)) {
      for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept(lfd, (struct sockaddr *)&ss, &sl);
        if (fd < 0) break;
        fcntl(fd, F_SETFD, FD_CLOEXEC);
        if (np == MAX_PENDING) drop_pending(pend, &np, 0, "too many connections in handshake");
        pend[np] = (pending_conn){.fd = fd, .since = dt_time_now()};
        peer_ip(&ss, pend[np].ip, sizeof pend[np].ip);
        np++;
      }
    }
  }
  for (int i = 0; i < np; i++) dt_net_close(&pend[i].fd);
  return st;
}

dt_status dt_backend_tcp_new(const dt_backend_ctx *ctx, dt_backend **out) {
  int n = ctx->size, r = ctx->rank;
  if (n < 1 || r < 0 || r >= n || !ctx->global || (n > 1 && (!ctx->store || !ctx->prefix || !ctx->host_addr)))
    return dt_error(DT_INVALID_ARGUMENT, "tcp backend: bad context (rank %d of %d, store %s, prefix %s, host %s)", r,
                    n, ctx->store ? "set" : "missing", ctx->prefix ? ctx->prefix : "missing",
                    ctx->host_addr ? ctx->host_addr : "missing");
  tcp_backend *b = NULL;
  dt_status st = dt_alloc(sizeof *b, (void **)&b);
  if (st != DT_OK) return st;
  b->base.ops = &tcp_ops;
  b->base.rank = r;
  b->base.size = n;
  atomic_init(&b->base.aborted, 0);
  int lfd = -1;
  b->npfd_cap = n + 64;
  DT_CHECK_GOTO(dt_alloc_array((size_t)n, sizeof *b->global, "tcp ranks", (void **)&b->global), st, fail_setup);
  DT_CHECK_GOTO(dt_alloc_array((size_t)n, sizeof *b->fd, "tcp sockets", (void **)&b->fd), st, fail_setup);
  for (int j = 0; j < n; j++) b->fd[j] = -1;
  DT_CHECK_GOTO(dt_alloc_array((size_t)n, sizeof *b->addr, "tcp addresses", (void **)&b->addr), st, fail_setup);
  DT_CHECK_GOTO(dt_alloc_array((size_t)n, sizeof *b->closed_at, "tcp peers", (void **)&b->closed_at), st, fail_setup);
  DT_CHECK_GOTO(dt_alloc_array((size_t)n, sizeof *b->lowat, "tcp peers", (void **)&b->lowat), st, fail_setup);
  DT_CHECK_GOTO(dt_alloc_array((size_t)b->npfd_cap, sizeof *b->pfd, "tcp poll set", (void **)&b->pfd), st, fail_setup);
  DT_CHECK_GOTO(dt_alloc_array((size_t)b->npfd_cap, sizeof *b->pfd_op, "tcp poll set", (void **)&b->pfd_op), st,
                fail_setup);
  DT_CHECK_GOTO(dt_alloc_array((size_t)n * 4, sizeof *b->steps, "tcp steps", (void **)&b->steps), st, fail_setup);
  DT_CHECK_GOTO(dt_alloc(TMP_BYTES, &b->tmp), st, fail_setup);
  memcpy(b->global, ctx->global, (size_t)n * sizeof *b->global);
  b->base.global = b->global;
  for (int j = 0; j < n; j++) snprintf(b->addr[j], sizeof b->addr[j], "?");
  if (n > 1) {
    double deadline = dt_time_now() + (ctx->timeout_s > 0 ? ctx->timeout_s : 300);
    uint64_t tag = fnv1a(ctx->prefix);
    int port = 0;
    DT_CHECK_GOTO(dt_net_listen(NULL, 0, 128, &lfd, &port), st, fail_setup);
    tune_socket(lfd); /* accepted sockets inherit the buffer sizes */
    snprintf(b->addr[r], sizeof b->addr[r], "%s:%d", ctx->host_addr, port);
    char key[DT_STORE_MAX_KEY];
    snprintf(key, sizeof key, "%s/addr/%d", ctx->prefix, r);
    DT_CHECK_GOTO(dt_store_set(ctx->store, key, b->addr[r], strlen(b->addr[r])), st, fail_setup);
    for (int j = 0; j < n; j++) {
      if (j == r) continue;
      void *v = NULL;
      size_t len = 0;
      snprintf(key, sizeof key, "%s/addr/%d", ctx->prefix, j);
      st = dt_store_get(ctx->store, key, &v, &len, remaining(deadline));
      if (st != DT_OK) {
        dt_error_prefix(st, "tcp setup: address of rank %d", ctx->global[j]);
        goto fail_setup;
      }
      if (len == 0 || len >= sizeof b->addr[j]) {
        dt_free(v);
        st = dt_error(DT_CORRUPT, "tcp setup: address of rank %d is %zu bytes", ctx->global[j], len);
        goto fail_setup;
      }
      memcpy(b->addr[j], v, len);
      b->addr[j][len] = 0;
      dt_free(v);
    }
    /* Higher ranks first: the top rank only accepts, so every chain of
     * connects ends at someone who accepts (no cycle). */
    for (int j = r + 1; j < n; j++) DT_CHECK_GOTO(connect_peer(b, ctx, j, tag, deadline), st, fail_setup);
    DT_CHECK_GOTO(accept_peers(b, ctx, lfd, tag, deadline), st, fail_setup);
    dt_net_close(&lfd);
    DT_LOG_INFO("tcp", "rank %d: connected to %d peers", ctx->global[r], n - 1);
    int rcvbuf = 0;
    socklen_t sl = sizeof rcvbuf;
    if (getsockopt(b->fd[r == 0 ? 1 : 0], SOL_SOCKET, SO_RCVBUF, &rcvbuf, &sl) != 0) rcvbuf = 0;
    b->lowat_cap = rcvbuf / 4 < (int)LOWAT_MAX_BYTES ? rcvbuf / 4 : (int)LOWAT_MAX_BYTES;
    if (b->lowat_cap < 1) b->lowat_cap = 1;
  }
  *out = &b->base;
  return DT_OK;
fail_setup:
  dt_net_close(&lfd);
  tcp_destroy(&b->base);
  return st;
}
