/* The TCP key-value store (c10d TCPStore's role): a server thread multiplexing
 * every client with poll, and a client whose every request has a deadline.
 *
 * Wire protocol (version 2; integers little endian). The handshake proves the
 * job secret both ways (dt_auth_mac, HMAC-SHA-256) without sending it; before
 * a client's proof the server sends nothing but its nonce (and whether it
 * has a secret), so a stranger learns neither the run id nor anything else:
 *
 *   client -> server  hello:      u32 magic 0x31545344 ("DST1"), u32 version (2), 32 bytes client nonce cn
 *   server -> client  challenge:  u8 0, u8 has_secret, 32 bytes server nonce sn
 *                     or          u8 2, u32 n, n bytes: refused (protocol version); it closes
 *   client -> server  proof:      u32 n (1..127), n bytes run id,
 *                                 32 bytes HMAC(secret, "dtrain store client" | cn | sn | run id)
 *   server -> client  u8 0, 32 bytes HMAC(secret, "dtrain store server" | cn | sn | run id)   accepted
 *                     u8 1                     refused: wrong proof (wrong or no secret); it closes
 *                     u8 3, u32 n, n bytes     refused: the proof holds but the server serves run id
 *                                              <bytes> (n = 0 when it has no secret); it closes
 *   Without a secret the HMAC key is a public constant (the store is open).
 *
 *   requests, client -> server (one at a time: the client waits for the reply):
 *     u8 1 SET     u32 klen, u32 vlen, key, value      -> u8 0
 *     u8 2 GET     u32 klen, key                       -> u8 0, u32 vlen, value   (parked until set)
 *     u8 3 ADD     u32 klen, i64 delta, key            -> u8 0, i64 new value     (value kept as decimal text)
 *     u8 4 CHECK   u32 n, n x (u32 klen, key)          -> u8 0, u8 all present
 *     u8 5 DELETE  u32 klen, key                       -> u8 0, u8 existed
 *     u8 6 WAIT    u32 n, n x (u32 klen, key)          -> u8 0                    (parked until all set)
 *     u8 7 CANCEL  (no body; only while a GET/WAIT is parked, or just answered)
 *                                                      -> u8 2 (after the parked reply if it was already sent)
 *   any request may instead get: u8 1, u32 dt_status, u32 n, n bytes of text.
 *
 * Bounds: 1 <= klen <= DT_STORE_MAX_KEY, vlen <= DT_STORE_MAX_VALUE, 1 <= n <=
 * STORE_MAX_KEYS, one request <= STORE_MAX_REQUEST bytes, all keys and values
 * together <= STORE_MAX_BYTES. A client that breaks a bound, sends an unknown op,
 * a request while one is parked, or no handshake within STORE_HANDSHAKE_S is
 * dropped (and logged, naming its address); the others never notice. Before
 * its proof a client is held to STORE_HS_BYTES of input and at most
 * STORE_MAX_PENDING such clients are kept (the oldest goes first); their
 * refusals are logged once per address (dt_auth_refused). */
#define _GNU_SOURCE /* accept4 / pipe2: close-on-exec set atomically (a launcher forks workers meanwhile) */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "dist/dist-impl.h"

#define STORE_MAGIC 0x31545344u
#define STORE_VERSION 2u
#define STORE_MAX_KEYS 4096
#define STORE_MAX_REQUEST ((size_t)DT_STORE_MAX_VALUE + DT_STORE_MAX_KEY + 64)
#define STORE_MAX_BYTES ((size_t)256 << 20)
#define STORE_MAX_CLIENTS 4096
#define STORE_HANDSHAKE_S 5.0
/* Clients still in their handshake, and the bytes one may send before its proof is checked. */
#define STORE_MAX_PENDING 256
#define STORE_HS_BYTES 256
#define STORE_MAX_RUN_ID 127
/* Per-client buffer kept between requests (bytes); larger ones are released. */
#define STORE_KEEP_BUFFER ((size_t)1 << 20)
/* Server poll tick (ms): how often handshake deadlines are checked. */
#define STORE_TICK_MS 100
/* How long a client waits for the answer to a cancel before giving up on the connection (s). */
#define STORE_CANCEL_S 5.0

enum { OP_SET = 1, OP_GET, OP_ADD, OP_CHECK, OP_DELETE, OP_WAIT, OP_CANCEL };
enum { REP_OK = 0, REP_ERROR = 1, REP_CANCELLED = 2 };
enum { HS_OK = 0, HS_BAD_PROOF = 1, HS_REFUSED = 2, HS_RUN_MISMATCH = 3 };
static const char label_client[] = "dtrain store client", label_server[] = "dtrain store server";

/* ---- little-endian helpers ---------------------------------------------------- */
static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* Grows *buf (capacity *cap, *len bytes used) to hold need bytes. */
static dt_status buf_reserve(uint8_t **buf, size_t *cap, size_t len, size_t need) {
  if (need <= *cap) return DT_OK;
  size_t ncap = *cap ? *cap : 256;
  while (ncap < need) ncap *= 2;
  void *nb;
  DT_CHECK(dt_alloc(ncap, &nb));
  if (len) memcpy(nb, *buf, len);
  dt_free(*buf);
  *buf = nb;
  *cap = ncap;
  return DT_OK;
}

/* ================================ server ======================================= */

typedef struct entry {
  struct entry *next;
  uint64_t hash;
  uint8_t *key, *val;
  size_t klen, vlen;
} entry;

typedef struct conn {
  int fd;
  char peer[64]; /* "ip:port" for logs */
  char ip[48];   /* the address alone: refusals are logged once per address */
  int ready;     /* handshake done */
  int hello_seen; /* its hello arrived and the challenge went out */
  uint8_t cn[DT_AUTH_NONCE], sn[DT_AUTH_NONCE]; /* the handshake's nonces (client's, ours) */
  double accepted_at;
  int dead;      /* drop at the next sweep */
  int eof;       /* peer closed its side */
  char why[128]; /* reason it was dropped, when numbers are worth giving */
  uint8_t *in;
  size_t in_len, in_cap;
  uint8_t *out;
  size_t out_len, out_pos, out_cap;
  /* A parked GET/WAIT: its request bytes (op excluded) and keys pointing into them. */
  int parked_op;
  uint8_t *parked;
  int parked_n;
  const uint8_t **parked_keys;
  size_t *parked_klens;
} conn;

struct dt_store_server {
  int listen_fd, port;
  int wake[2];
  pthread_t thread;
  int thread_started;
  char run_id[128];
  char secret[DT_SECRET_MAX_CHARS + 1]; /* "" = none */
  conn **conns;
  int nconns, cap_conns;
  entry **buckets;
  size_t nbuckets, nentries;
  size_t bytes; /* keys + values held */
  struct pollfd *pfd; /* poll set of the server thread */
  size_t pfd_cap;     /* bytes */
  int background;     /* dt_store_server_set_background: the thread lowers its priority at its next tick */
};

static uint64_t hash_key(const uint8_t *k, size_t n) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (size_t i = 0; i < n; i++) h = (h ^ k[i]) * 1099511628211ull;
  return h;
}

static entry **find_slot(dt_store_server *s, const uint8_t *k, size_t n, uint64_t h) {
  entry **p = &s->buckets[h & (s->nbuckets - 1)];
  while (*p && !((*p)->hash == h && (*p)->klen == n && memcmp((*p)->key, k, n) == 0)) p = &(*p)->next;
  return p;
}

static entry *find(dt_store_server *s, const uint8_t *k, size_t n) {
  return *find_slot(s, k, n, hash_key(k, n));
}

static void entry_free(entry *e) {
  if (!e) return;
  dt_free(e->key);
  dt_free(e->val);
  dt_free(e);
}

static dt_status table_grow(dt_store_server *s) {
  size_t nb = s->nbuckets * 2;
  entry **b;
  DT_CHECK(dt_alloc_array(nb, sizeof *b, "store table", (void **)&b));
  for (size_t i = 0; i < s->nbuckets; i++) {
    entry *e = s->buckets[i];
    while (e) {
      entry *next = e->next;
      e->next = b[e->hash & (nb - 1)];
      b[e->hash & (nb - 1)] = e;
      e = next;
    }
  }
  dt_free(s->buckets);
  s->buckets = b;
  s->nbuckets = nb;
  return DT_OK;
}

/* Stores a copy of value under key (replacing any old value). */
static dt_status table_set(dt_store_server *s, const uint8_t *k, size_t kn, const uint8_t *v, size_t vn) {
  uint64_t h = hash_key(k, kn);
  entry **slot = find_slot(s, k, kn, h);
  size_t old = *slot ? (*slot)->klen + (*slot)->vlen : 0;
  if (s->bytes - old + kn + vn > STORE_MAX_BYTES)
    return dt_error(DT_OUT_OF_MEMORY, "store full: %zu bytes held, setting %zu more would pass the cap of %zu",
                    s->bytes, kn + vn, STORE_MAX_BYTES);
  void *nv;
  DT_CHECK(dt_alloc(vn, &nv));
  if (vn) memcpy(nv, v, vn);
  if (*slot) {
    dt_free((*slot)->val);
    (*slot)->val = nv;
    (*slot)->vlen = vn;
    s->bytes = s->bytes - old + kn + vn;
    return DT_OK;
  }
  entry *e = NULL;
  void *nk = NULL;
  if (dt_alloc(sizeof *e, (void **)&e) != DT_OK || dt_alloc(kn, &nk) != DT_OK) {
    dt_free(e);
    dt_free(nv);
    return dt_error(DT_OUT_OF_MEMORY, "store: no memory for a key of %zu bytes", kn);
  }
  memcpy(nk, k, kn);
  e->key = nk;
  e->klen = kn;
  e->val = nv;
  e->vlen = vn;
  e->hash = h;
  e->next = NULL;
  *slot = e;
  s->nentries++;
  s->bytes += kn + vn;
  if (s->nentries > 2 * s->nbuckets) (void)table_grow(s); /* a full table only gets slower */
  return DT_OK;
}

static int table_delete(dt_store_server *s, const uint8_t *k, size_t kn) {
  entry **slot = find_slot(s, k, kn, hash_key(k, kn));
  if (!*slot) return 0;
  entry *e = *slot;
  *slot = e->next;
  s->bytes -= e->klen + e->vlen;
  s->nentries--;
  entry_free(e);
  return 1;
}

/* ---- connections ---- */

static void conn_unpark(conn *c) {
  dt_free(c->parked);
  dt_free((void *)c->parked_keys);
  dt_free(c->parked_klens);
  c->parked = NULL;
  c->parked_keys = NULL;
  c->parked_klens = NULL;
  c->parked_n = 0;
  c->parked_op = 0;
}

static void conn_free(conn *c) {
  if (!c) return;
  dt_net_close(&c->fd);
  conn_unpark(c);
  dt_free(c->in);
  dt_free(c->out);
  dt_free(c);
}

/* A client that has not proven the secret is a stranger: its refusals are rate limited. */
static void conn_drop(conn *c, const char *why) {
  if (c->dead) return;
  if (c->ready)
    DT_LOG_WARN("store", "dropped client %s: %s", c->peer, why);
  else
    dt_auth_refused("store", c->ip, why);
  c->dead = 1;
}

/* Sends what the socket takes of the output buffer now. */
static void conn_flush(conn *c) {
  if (c->fd < 0) c->out_pos = c->out_len; /* no socket (the fuzzing driver): replies go nowhere */
  while (!c->dead && c->out_pos < c->out_len) {
    ssize_t k = send(c->fd, c->out + c->out_pos, c->out_len - c->out_pos, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      c->out_pos += (size_t)k;
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    DT_LOG_INFO("store", "client %s went away: %s", c->peer, k < 0 ? strerror(errno) : "closed");
    c->dead = 1;
    return;
  }
  if (c->out_pos == c->out_len) c->out_pos = c->out_len = 0;
}

/* Appends reply bytes; a client whose reply cannot be buffered is dropped. */
static void conn_queue(conn *c, const void *p, size_t n) {
  if (c->dead) return;
  if (buf_reserve(&c->out, &c->out_cap, c->out_len, c->out_len + n) != DT_OK) {
    conn_drop(c, "no memory for its reply");
    return;
  }
  memcpy(c->out + c->out_len, p, n);
  c->out_len += n;
}

static void reply_error(conn *c, dt_status st, const char *text) {
  size_t n = strlen(text);
  uint8_t h[9];
  h[0] = REP_ERROR;
  put_u32(h + 1, (uint32_t)st);
  put_u32(h + 5, (uint32_t)n);
  conn_queue(c, h, 9);
  conn_queue(c, text, n);
}

/* Answers a parked request if all its keys exist now; returns 1 if answered. */
static int try_answer_parked(dt_store_server *s, conn *c) {
  for (int i = 0; i < c->parked_n; i++)
    if (!find(s, c->parked_keys[i], c->parked_klens[i])) return 0;
  if (c->parked_op == OP_GET) {
    entry *e = find(s, c->parked_keys[0], c->parked_klens[0]);
    uint8_t h[5];
    h[0] = REP_OK;
    put_u32(h + 1, (uint32_t)e->vlen);
    conn_queue(c, h, 5);
    conn_queue(c, e->val, e->vlen);
  } else {
    uint8_t ok = REP_OK;
    conn_queue(c, &ok, 1);
  }
  conn_unpark(c);
  conn_flush(c);
  return 1;
}

static void wake_parked(dt_store_server *s) {
  for (int i = 0; i < s->nconns; i++) {
    conn *c = s->conns[i];
    if (!c->dead && c->parked_op) try_answer_parked(s, c);
  }
}

/* Parser over the input buffer: each field is taken if present; lengths are
 * checked as soon as they are read so nothing oversize is ever buffered. */
typedef struct cursor {
  const uint8_t *p;
  size_t len, pos;
} cursor;
enum { P_DONE = 0, P_MORE = 1, P_BAD = 2 };

static int take(cursor *cu, size_t n, const uint8_t **out) {
  if (cu->len - cu->pos < n) return 0;
  *out = cu->p + cu->pos;
  cu->pos += n;
  return 1;
}

static int take_klen(cursor *cu, uint32_t *klen, const char **why) {
  const uint8_t *q;
  if (!take(cu, 4, &q)) return P_MORE;
  *klen = get_u32(q);
  if (*klen < 1 || *klen > DT_STORE_MAX_KEY) {
    *why = "key length outside 1..DT_STORE_MAX_KEY";
    return P_BAD;
  }
  return P_DONE;
}

/* Parses a key list (CHECK/WAIT body) into arrays the caller frees (on P_DONE). */
static int take_keys(cursor *cu, int *n_out, const uint8_t ***keys_out, size_t **lens_out, const char **why) {
  const uint8_t *q;
  if (!take(cu, 4, &q)) return P_MORE;
  uint32_t n = get_u32(q);
  if (n < 1 || n > STORE_MAX_KEYS) {
    *why = "key count outside 1..4096";
    return P_BAD;
  }
  size_t start = cu->pos;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t kl;
    int r = take_klen(cu, &kl, why);
    if (r != P_DONE) return r;
    if (cu->pos - start + kl > STORE_MAX_REQUEST) {
      *why = "request larger than the store's limit";
      return P_BAD;
    }
    if (!take(cu, kl, &q)) return P_MORE;
  }
  const uint8_t **keys = NULL;
  size_t *lens = NULL;
  if (dt_alloc_array(n, sizeof *keys, "store keys", (void **)&keys) != DT_OK ||
      dt_alloc_array(n, sizeof *lens, "store keys", (void **)&lens) != DT_OK) {
    dt_free((void *)keys);
    *why = "no memory for its key list";
    return P_BAD;
  }
  cu->pos = start;
  for (uint32_t i = 0; i < n; i++) {
    take(cu, 4, &q);
    lens[i] = get_u32(q);
    take(cu, lens[i], &keys[i]);
  }
  *n_out = (int)n;
  *keys_out = keys;
  *lens_out = lens;
  return P_DONE;
}

/* The MAC over a handshake: cn | sn | run id, keyed by the secret. */
static void handshake_mac(const char *secret, const char *label, const uint8_t *cn, const uint8_t *sn,
                          const void *run_id, size_t n, uint8_t out[DT_AUTH_MAC]) {
  dt_auth_part parts[3] = {{cn, DT_AUTH_NONCE}, {sn, DT_AUTH_NONCE}, {run_id, n}};
  dt_auth_mac(secret, label, parts, 3, out);
}

/* The client's hello: answered with our nonce (or a refusal naming the version). */
static int handle_hello(dt_store_server *s, conn *c, cursor *cu, const char **why) {
  const uint8_t *q;
  if (!take(cu, 8, &q)) return P_MORE;
  uint32_t magic = get_u32(q), version = get_u32(q + 4);
  if (magic != STORE_MAGIC) {
    *why = "not a dtrain store client (bad magic)";
    return P_BAD;
  }
  if (version != STORE_VERSION) {
    char text[96];
    int tn = snprintf(text, sizeof text, "store protocol %u expected, client speaks %u", STORE_VERSION, version);
    uint8_t h[5] = {HS_REFUSED};
    put_u32(h + 1, (uint32_t)tn);
    conn_queue(c, h, 5);
    conn_queue(c, text, (size_t)tn);
    conn_flush(c);
    *why = "store protocol version differs";
    return P_BAD;
  }
  if (!take(cu, DT_AUTH_NONCE, &q)) return P_MORE;
  memcpy(c->cn, q, DT_AUTH_NONCE);
  if (dt_random_bytes(c->sn, DT_AUTH_NONCE) != DT_OK) {
    *why = "no random bytes for its challenge";
    return P_BAD;
  }
  uint8_t h[2 + DT_AUTH_NONCE] = {HS_OK, s->secret[0] != 0};
  memcpy(h + 2, c->sn, DT_AUTH_NONCE);
  conn_queue(c, h, sizeof h);
  c->hello_seen = 1;
  return P_DONE;
}

/* The client's proof: checked before anything about the job is said. */
static int handle_proof(dt_store_server *s, conn *c, cursor *cu, const char **why) {
  const uint8_t *q, *id, *mac;
  if (!take(cu, 4, &q)) return P_MORE;
  uint32_t n = get_u32(q);
  if (n < 1 || n > STORE_MAX_RUN_ID) {
    *why = "run id length outside 1..127";
    return P_BAD;
  }
  if (!take(cu, n, &id) || !take(cu, DT_AUTH_MAC, &mac)) return P_MORE;
  uint8_t want[DT_AUTH_MAC];
  handshake_mac(s->secret, label_client, c->cn, c->sn, id, n, want);
  if (!dt_auth_equal(want, mac)) {
    uint8_t no = HS_BAD_PROOF;
    conn_queue(c, &no, 1);
    conn_flush(c);
    *why = s->secret[0] ? "failed authentication (wrong job secret, or none)" : "failed authentication";
    return P_BAD;
  }
  size_t mine = strlen(s->run_id);
  if (n != mine || memcmp(id, s->run_id, n) != 0) {
    size_t told = s->secret[0] ? mine : 0; /* only a holder of the secret hears our run id */
    uint8_t h[5] = {HS_RUN_MISMATCH};
    put_u32(h + 1, (uint32_t)told);
    conn_queue(c, h, 5);
    conn_queue(c, s->run_id, told);
    conn_flush(c); /* a few bytes: fit in any socket buffer */
    c->ready = 1;  /* it proved the secret: its refusal is logged as a client's */
    *why = "client of another run id";
    return P_BAD;
  }
  uint8_t h[1 + DT_AUTH_MAC] = {HS_OK};
  handshake_mac(s->secret, label_server, c->cn, c->sn, id, n, h + 1);
  conn_queue(c, h, sizeof h);
  c->ready = 1;
  return P_DONE;
}

static int handle_handshake(dt_store_server *s, conn *c, cursor *cu, const char **why) {
  return c->hello_seen ? handle_proof(s, c, cu, why) : handle_hello(s, c, cu, why);
}

/* Parses and runs one request from the input buffer. */
static int handle_request(dt_store_server *s, conn *c, cursor *cu, const char **why) {
  const uint8_t *q, *key, *val;
  uint32_t klen, vlen;
  int r;
  if (!take(cu, 1, &q)) return P_MORE;
  int op = q[0];
  if (c->parked_op && op != OP_CANCEL) {
    *why = "request while another one waits";
    return P_BAD;
  }
  switch (op) {
    case OP_SET: {
      if ((r = take_klen(cu, &klen, why)) != P_DONE) return r;
      if (!take(cu, 4, &q)) return P_MORE;
      vlen = get_u32(q);
      if (vlen > DT_STORE_MAX_VALUE) {
        snprintf(c->why, sizeof c->why, "value of %u bytes announced, above the limit of %u", vlen,
                 DT_STORE_MAX_VALUE);
        *why = c->why;
        return P_BAD;
      }
      if (!take(cu, klen, &key) || !take(cu, vlen, &val)) return P_MORE;
      if (table_set(s, key, klen, val, vlen) != DT_OK) {
        reply_error(c, DT_OUT_OF_MEMORY, dt_last_error());
        return P_DONE;
      }
      uint8_t ok = REP_OK;
      conn_queue(c, &ok, 1);
      wake_parked(s);
      return P_DONE;
    }
    case OP_GET: {
      if ((r = take_klen(cu, &klen, why)) != P_DONE) return r;
      if (!take(cu, klen, &key)) return P_MORE;
      /* Park a copy of the key; answered now or when it is set. */
      uint8_t *copy = NULL;
      const uint8_t **keys = NULL;
      size_t *lens = NULL;
      if (dt_alloc(klen, (void **)&copy) != DT_OK || dt_alloc(sizeof *keys, (void **)&keys) != DT_OK ||
          dt_alloc(sizeof *lens, (void **)&lens) != DT_OK) {
        dt_free(copy);
        dt_free((void *)keys);
        *why = "no memory for its request";
        return P_BAD;
      }
      memcpy(copy, key, klen);
      keys[0] = copy;
      lens[0] = klen;
      c->parked_op = OP_GET;
      c->parked = copy;
      c->parked_n = 1;
      c->parked_keys = keys;
      c->parked_klens = lens;
      try_answer_parked(s, c);
      return P_DONE;
    }
    case OP_WAIT:
    case OP_CHECK: {
      int n;
      const uint8_t **keys;
      size_t *lens;
      size_t body = cu->pos;
      if ((r = take_keys(cu, &n, &keys, &lens, why)) != P_DONE) return r;
      if (op == OP_CHECK) {
        int all = 1;
        for (int i = 0; i < n && all; i++) all = find(s, keys[i], lens[i]) != NULL;
        dt_free((void *)keys);
        dt_free(lens);
        uint8_t h[2] = {REP_OK, (uint8_t)all};
        conn_queue(c, h, 2);
        return P_DONE;
      }
      /* WAIT: keep the body, rebase the key pointers onto the copy. */
      size_t bn = cu->pos - body;
      uint8_t *copy = NULL;
      if (dt_alloc(bn, (void **)&copy) != DT_OK) {
        dt_free((void *)keys);
        dt_free(lens);
        *why = "no memory for its request";
        return P_BAD;
      }
      memcpy(copy, cu->p + body, bn);
      for (int i = 0; i < n; i++) keys[i] = copy + (keys[i] - (cu->p + body));
      c->parked_op = OP_WAIT;
      c->parked = copy;
      c->parked_n = n;
      c->parked_keys = keys;
      c->parked_klens = lens;
      try_answer_parked(s, c);
      return P_DONE;
    }
    case OP_ADD: {
      if ((r = take_klen(cu, &klen, why)) != P_DONE) return r;
      if (!take(cu, 8, &q)) return P_MORE;
      int64_t delta = (int64_t)get_u64(q);
      if (!take(cu, klen, &key)) return P_MORE;
      int64_t cur = 0;
      entry *e = find(s, key, klen);
      if (e) {
        char txt[32];
        char *end;
        if (e->vlen == 0 || e->vlen >= sizeof txt) goto not_int;
        memcpy(txt, e->val, e->vlen);
        txt[e->vlen] = '\0';
        errno = 0;
        cur = strtoll(txt, &end, 10);
        if (errno || *end) goto not_int;
      }
      if ((delta > 0 && cur > INT64_MAX - delta) || (delta < 0 && cur < INT64_MIN - delta)) {
        reply_error(c, DT_INVALID_ARGUMENT, "add overflows a 64-bit integer");
        return P_DONE;
      }
      cur += delta;
      char txt[32];
      int tn = snprintf(txt, sizeof txt, "%lld", (long long)cur);
      if (table_set(s, key, klen, (const uint8_t *)txt, (size_t)tn) != DT_OK) {
        reply_error(c, DT_OUT_OF_MEMORY, dt_last_error());
        return P_DONE;
      }
      uint8_t h[9];
      h[0] = REP_OK;
      put_u64(h + 1, (uint64_t)cur);
      conn_queue(c, h, 9);
      wake_parked(s);
      return P_DONE;
    not_int:
      reply_error(c, DT_INVALID_ARGUMENT, "add: the key holds a value that is not a decimal integer");
      return P_DONE;
    }
    case OP_DELETE: {
      if ((r = take_klen(cu, &klen, why)) != P_DONE) return r;
      if (!take(cu, klen, &key)) return P_MORE;
      uint8_t h[2] = {REP_OK, (uint8_t)table_delete(s, key, klen)};
      conn_queue(c, h, 2);
      return P_DONE;
    }
    case OP_CANCEL: {
      conn_unpark(c); /* nothing parked: its answer went out before; the ack follows it */
      uint8_t ack = REP_CANCELLED;
      conn_queue(c, &ack, 1);
      return P_DONE;
    }
    default:
      snprintf(c->why, sizeof c->why, "unknown request op %d", op);
      *why = c->why;
      return P_BAD;
  }
}

/* Runs every complete request buffered for c. Returns 1 if anything ran. */
static int conn_process(dt_store_server *s, conn *c) {
  int progress = 0;
  size_t consumed = 0;
  /* Pipelining is not part of the protocol: one reply goes out before the next
   * request is read (which also bounds the output buffer). */
  while (!c->dead && c->out_len == 0 && consumed < c->in_len) {
    cursor cu = {c->in + consumed, c->in_len - consumed, 0};
    const char *why = "malformed request";
    int r = c->ready ? handle_request(s, c, &cu, &why) : handle_handshake(s, c, &cu, &why);
    if (r == P_BAD) {
      conn_drop(c, why);
      break;
    }
    if (r == P_MORE) {
      if (!c->ready && c->in_len - consumed >= STORE_HS_BYTES)
        conn_drop(c, "sent more than a handshake before proving the secret");
      else if (c->in_len - consumed >= STORE_MAX_REQUEST)
        conn_drop(c, "request larger than the store's limit");
      break;
    }
    consumed += cu.pos;
    progress = 1;
    conn_flush(c);
  }
  if (consumed) {
    memmove(c->in, c->in + consumed, c->in_len - consumed);
    c->in_len -= consumed;
  }
  /* Idle clients do not keep the buffers of a past large value (up to 16 MiB each). */
  if (c->in_len == 0 && c->in_cap > STORE_KEEP_BUFFER) {
    dt_free(c->in);
    c->in = NULL;
    c->in_cap = 0;
  }
  if (c->out_len == 0 && c->out_cap > STORE_KEEP_BUFFER) {
    dt_free(c->out);
    c->out = NULL;
    c->out_cap = 0;
  }
  return progress;
}

/* Input a client may have buffered: a handshake's worth until it proved the secret. */
static size_t conn_in_limit(const conn *c) { return c->ready ? STORE_MAX_REQUEST : STORE_HS_BYTES; }

/* Makes room for more input (up to the client's limit); 0 when there is none. */
static int conn_in_room(conn *c) {
  size_t limit = conn_in_limit(c);
  if (c->in_len >= limit) return 0;
  if (c->in_len < c->in_cap) return 1;
  size_t want = c->in_cap ? c->in_cap * 2 : (c->ready ? 4096 : STORE_HS_BYTES);
  if (want > limit) want = limit;
  if (buf_reserve(&c->in, &c->in_cap, c->in_len, want) != DT_OK) {
    conn_drop(c, "no memory for its request");
    return 0;
  }
  return 1;
}

/* Reads what the socket has, up to the client's limit. */
static void conn_read(conn *c) {
  for (;;) {
    if (!conn_in_room(c)) return;
    size_t room = c->in_cap - c->in_len, left = conn_in_limit(c) - c->in_len;
    ssize_t k = recv(c->fd, c->in + c->in_len, room < left ? room : left, MSG_DONTWAIT);
    if (k > 0) {
      c->in_len += (size_t)k;
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    c->eof = 1; /* closed or reset: run what it sent, then forget it */
    return;
  }
}

/* A flood of connections that never finish their handshake must not crowd
 * out the job's clients: past STORE_MAX_PENDING, the oldest is dropped. */
static void drop_oldest_pending(dt_store_server *s) {
  int pending = 0, oldest = -1;
  for (int i = 0; i < s->nconns; i++)
    if (!s->conns[i]->ready && !s->conns[i]->dead) {
      pending++;
      if (oldest < 0) oldest = i; /* conns are kept in order of arrival */
    }
  if (pending >= STORE_MAX_PENDING) conn_drop(s->conns[oldest], "too many clients in their handshake");
}

static void accept_all(dt_store_server *s) {
  for (;;) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = accept4(s->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) DT_LOG_WARN("store", "accept: %s", strerror(errno));
      return;
    }
    dt_net_set_nodelay(fd);
    char peer[64] = "?", ip[INET6_ADDRSTRLEN] = "?";
    if (ss.ss_family == AF_INET) {
      const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
      inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
      snprintf(peer, sizeof peer, "%s:%d", ip, ntohs(a->sin_port));
    }
    if (s->nconns >= STORE_MAX_CLIENTS) {
      dt_auth_refused("store", ip, "too many clients connected");
      close(fd);
      continue;
    }
    drop_oldest_pending(s);
    conn *c = NULL;
    if (s->nconns == s->cap_conns) {
      size_t cap = s->cap_conns ? (size_t)s->cap_conns * 2 : 64;
      uint8_t *nb = (uint8_t *)s->conns;
      size_t ocap = (size_t)s->cap_conns * sizeof *s->conns;
      if (buf_reserve(&nb, &ocap, ocap, cap * sizeof *s->conns) != DT_OK) {
        DT_LOG_WARN("store", "refused client %s: out of memory", peer);
        close(fd);
        continue;
      }
      s->conns = (conn **)nb;
      s->cap_conns = (int)cap;
    }
    if (dt_alloc(sizeof *c, (void **)&c) != DT_OK) {
      DT_LOG_WARN("store", "refused client %s: out of memory", peer);
      close(fd);
      continue;
    }
    c->fd = fd;
    snprintf(c->peer, sizeof c->peer, "%s", peer);
    snprintf(c->ip, sizeof c->ip, "%s", ip);
    c->accepted_at = dt_time_now();
    s->conns[s->nconns++] = c;
    DT_LOG_TRACE("store", "client %s connected", peer);
  }
}

/* A store served beside the training processes (the dtrun agent) answers a job's few requests per round, not
 * per step; a flood of strangers must not take the ranks' cores, so its thread then runs at a lower priority
 * (best effort: a failure changes nothing). A store inside a rank keeps the rank's priority. */
#define STORE_NICE 10

void dt_store_server_set_background(dt_store_server *s) {
  if (s) __atomic_store_n(&s->background, 1, __ATOMIC_RELAXED);
}

static void *server_main(void *arg) {
  dt_store_server *s = arg;
  int lowered = 0;
  struct pollfd *pfd = s->pfd;
  size_t pfd_cap = s->pfd_cap;
  for (;;) {
    if (!lowered && __atomic_load_n(&s->background, __ATOMIC_RELAXED))
      lowered = 1, (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), STORE_NICE);
    size_t need = (size_t)s->nconns + 2;
    if (need * sizeof *pfd > pfd_cap) {
      uint8_t *nb = (uint8_t *)pfd;
      /* On failure fewer clients are watched this round (they wait, nobody is lost). */
      if (buf_reserve(&nb, &pfd_cap, 0, need * 2 * sizeof *pfd) == DT_OK) pfd = (struct pollfd *)nb;
    }
    int np = 0;
    pfd[np++] = (struct pollfd){s->wake[0], POLLIN, 0};
    pfd[np++] = (struct pollfd){s->listen_fd, POLLIN, 0};
    int nwatch = s->nconns;
    if ((size_t)nwatch + 2 > pfd_cap / sizeof *pfd) nwatch = (int)(pfd_cap / sizeof *pfd) - 2;
    for (int i = 0; i < nwatch; i++) {
      conn *c = s->conns[i];
      short ev = 0;
      if (c->in_len < conn_in_limit(c)) ev |= POLLIN;
      if (c->out_len > c->out_pos) ev |= POLLOUT;
      pfd[np++] = (struct pollfd){c->fd, ev, 0};
    }
    int n = poll(pfd, (nfds_t)np, STORE_TICK_MS);
    if (n < 0 && errno != EINTR) {
      DT_LOG_WARN("store", "poll: %s", strerror(errno));
      struct timespec ts = {0, 10 * 1000000L};
      nanosleep(&ts, NULL);
      continue;
    }
    if (n > 0 && (pfd[0].revents & POLLIN)) break;
    for (int i = 0; n > 0 && i < nwatch; i++) {
      conn *c = s->conns[i];
      short re = pfd[2 + i].revents;
      if (re & (POLLIN | POLLHUP | POLLERR)) conn_read(c);
      if (re & POLLOUT) conn_flush(c);
      /* A hang-up we cannot read past (full buffer) must not make poll spin. */
      if ((re & POLLERR) || ((re & POLLHUP) && c->in_len == c->in_cap)) c->eof = 1;
    }
    if (n > 0 && (pfd[1].revents & POLLIN)) accept_all(s);
    /* Requests may wake parked clients, whose buffered input may then run. */
    for (int progress = 1; progress;) {
      progress = 0;
      for (int i = 0; i < s->nconns; i++) progress |= conn_process(s, s->conns[i]);
    }
    double now = dt_time_now();
    for (int i = 0; i < s->nconns; i++) {
      conn *c = s->conns[i];
      if (!c->ready && !c->dead && now - c->accepted_at > STORE_HANDSHAKE_S) {
        char why[64];
        snprintf(why, sizeof why, "no handshake within %.0f s", STORE_HANDSHAKE_S);
        conn_drop(c, why);
      }
      if (c->eof && !c->dead) {
        if (c->in_len && c->ready)
          conn_drop(c, "closed in the middle of a request");
        else if (!c->ready)
          conn_drop(c, "closed before its handshake");
        else
          DT_LOG_TRACE("store", "client %s disconnected", c->peer);
        c->dead = 1;
      }
    }
    int w = 0;
    for (int i = 0; i < s->nconns; i++) {
      if (s->conns[i]->dead)
        conn_free(s->conns[i]); /* frees any parked request with it */
      else
        s->conns[w++] = s->conns[i];
    }
    s->nconns = w;
  }
  s->pfd = pfd;
  s->pfd_cap = pfd_cap;
  return NULL;
}

static void server_free(dt_store_server *s) {
  if (!s) return;
  for (int i = 0; i < s->nconns; i++) conn_free(s->conns[i]);
  dt_free(s->conns);
  if (s->buckets)
    for (size_t i = 0; i < s->nbuckets; i++) {
      entry *e = s->buckets[i];
      while (e) {
        entry *next = e->next;
        entry_free(e);
        e = next;
      }
    }
  dt_free(s->buckets);
  dt_free(s->pfd);
  if (s->wake[0] >= 0) close(s->wake[0]);
  if (s->wake[1] >= 0) close(s->wake[1]);
  dt_net_close(&s->listen_fd);
  memset(s->secret, 0, sizeof s->secret);
  dt_free(s);
}

static dt_status check_run_id(const char *run_id) {
  size_t n = run_id ? strlen(run_id) : 0;
  if (n < 1 || n > 127) return dt_error(DT_INVALID_ARGUMENT, "store run id must have 1..127 characters (got %zu)", n);
  return DT_OK;
}

/* NULL or "" is no secret; anything else must be a well-formed one. */
static dt_status check_secret(const char *secret) {
  if (!secret || !*secret) return DT_OK;
  return dt_job_secret_check(secret, "store");
}

dt_status dt_store_server_start(const char *host, int port, const char *run_id, const char *secret,
                                dt_store_server **out) {
  dt_status st = DT_OK;
  DT_CHECK(check_run_id(run_id));
  DT_CHECK(check_secret(secret));
  dt_store_server *s;
  DT_CHECK(dt_alloc(sizeof *s, (void **)&s));
  s->listen_fd = s->wake[0] = s->wake[1] = -1;
  snprintf(s->run_id, sizeof s->run_id, "%s", run_id);
  snprintf(s->secret, sizeof s->secret, "%s", secret ? secret : "");
  s->nbuckets = 64;
  DT_CHECK_GOTO(dt_alloc_array(s->nbuckets, sizeof *s->buckets, "store table", (void **)&s->buckets), st, fail);
  s->pfd_cap = 130 * sizeof *s->pfd;
  DT_CHECK_GOTO(dt_alloc(s->pfd_cap, (void **)&s->pfd), st, fail);
  DT_CHECK_GOTO(dt_net_listen(host, port, 512, &s->listen_fd, &s->port), st, fail);
  if (pipe2(s->wake, O_CLOEXEC) != 0) {
    st = dt_error(DT_IO, "store: pipe: %s", strerror(errno));
    goto fail;
  }
  int rc = pthread_create(&s->thread, NULL, server_main, s);
  if (rc != 0) {
    st = dt_error(DT_IO, "store: cannot start its thread: %s", strerror(rc));
    goto fail;
  }
  s->thread_started = 1;
  DT_LOG_INFO("store", "serving run '%s' on %s:%d (%s)", run_id, host && *host ? host : "0.0.0.0", s->port,
              s->secret[0] ? "clients prove the job secret" : "no job secret: open to anyone who can reach it");
  *out = s;
  return DT_OK;
fail:
  server_free(s);
  return st;
}

int dt_store_server_port(const dt_store_server *s) { return s ? s->port : -1; }

void dt_store_server_stop(dt_store_server *s) {
  if (!s) return;
  if (s->thread_started) {
    char b = 1;
    while (write(s->wake[1], &b, 1) < 0 && errno == EINTR) {
    }
    pthread_join(s->thread, NULL);
  }
  server_free(s);
}

/* ---- fuzzing ----------------------------------------------------------------
 * The server's handshake and request parser without sockets or thread, for
 * tests/fuzz/fuzz_store.c. data[0] bit i: client i (of 2) starts as if it had
 * proven the secret; then chunks of (u8 h: client h >> 7, length h & 127;
 * bytes) are what the clients send, each processed as the server thread would. */
static void fuzz_feed(conn *c, const uint8_t *p, size_t n) {
  while (n > 0 && !c->dead && conn_in_room(c)) {
    size_t room = c->in_cap - c->in_len, left = conn_in_limit(c) - c->in_len;
    size_t k = room < left ? room : left;
    if (k > n) k = n;
    memcpy(c->in + c->in_len, p, k);
    c->in_len += k;
    p += k;
    n -= k;
  }
}

void dt_store_server_fuzz(const uint8_t *data, size_t n) {
  dt_store_server *s = NULL;
  if (n < 1 || dt_alloc(sizeof *s, (void **)&s) != DT_OK) return;
  s->listen_fd = s->wake[0] = s->wake[1] = -1;
  snprintf(s->run_id, sizeof s->run_id, "fuzz");
  snprintf(s->secret, sizeof s->secret, "fuzz-secret-0123456789abcdef0123456789");
  s->nbuckets = 64;
  if (dt_alloc_array(s->nbuckets, sizeof *s->buckets, "store table", (void **)&s->buckets) != DT_OK ||
      dt_alloc_array(2, sizeof *s->conns, "store clients", (void **)&s->conns) != DT_OK) {
    server_free(s);
    return;
  }
  s->cap_conns = 2;
  for (int i = 0; i < 2; i++) {
    conn *c;
    if (dt_alloc(sizeof *c, (void **)&c) != DT_OK) break;
    c->fd = -1;
    c->ready = (data[0] >> i) & 1;
    snprintf(c->peer, sizeof c->peer, "fuzz%d", i);
    snprintf(c->ip, sizeof c->ip, "fuzz%d", i);
    s->conns[s->nconns++] = c;
  }
  for (size_t pos = 1; pos < n && s->nconns == 2;) {
    conn *c = s->conns[data[pos] >> 7];
    size_t len = data[pos++] & 127;
    if (len > n - pos) len = n - pos;
    fuzz_feed(c, data + pos, len);
    pos += len;
    for (int progress = 1; progress;) {
      progress = 0;
      for (int i = 0; i < s->nconns; i++)
        if (!s->conns[i]->dead) progress |= conn_process(s, s->conns[i]);
    }
  }
  server_free(s);
}

/* ================================ client ======================================= */

struct dt_store {
  int fd;
  int broken; /* the connection was lost or desynchronised: every request fails */
  char host[256];
  int port;
  char what[300]; /* "store host:port" */
  double timeout_s;
  pthread_mutex_t mu;
  char broken_why[256];
};

static double default_timeout(void) {
  long t = 300;
  if (dt_tunable_int("DT_TIMEOUT", &t) != DT_OK || t <= 0) t = 300;
  return (double)t;
}

/* Reads the server's refusal text (u32 n, n bytes) into text. */
static dt_status recv_text(dt_store *s, int fd, double deadline, char *text, size_t cap) {
  uint8_t lb[4];
  DT_CHECK(dt_net_recv_all(fd, lb, 4, deadline, NULL, s->what));
  uint32_t tn = get_u32(lb);
  if (tn >= cap) return dt_error(DT_CORRUPT, "store at %s:%d: handshake answer of %u bytes", s->host, s->port, tn);
  DT_CHECK(dt_net_recv_all(fd, text, tn, deadline, NULL, s->what));
  text[tn] = '\0';
  return DT_OK;
}

/* Hello and challenge: the server's nonce, after checking it is the kind of server we expect. */
static dt_status client_hello(dt_store *s, int fd, const char *secret, const uint8_t *cn, uint8_t *sn,
                              double deadline) {
  uint8_t h[8 + DT_AUTH_NONCE], code, has_secret;
  char text[256];
  put_u32(h, STORE_MAGIC);
  put_u32(h + 4, STORE_VERSION);
  memcpy(h + 8, cn, DT_AUTH_NONCE);
  DT_CHECK(dt_net_send_all(fd, h, sizeof h, deadline, NULL, s->what));
  DT_CHECK(dt_net_recv_all(fd, &code, 1, deadline, NULL, s->what));
  if (code == HS_REFUSED) {
    DT_CHECK(recv_text(s, fd, deadline, text, sizeof text));
    return dt_error(DT_INVALID_ARGUMENT, "store at %s:%d refused this client: %s", s->host, s->port, text);
  }
  if (code != HS_OK) return dt_error(DT_CORRUPT, "store at %s:%d: unexpected handshake answer %u", s->host, s->port, code);
  DT_CHECK(dt_net_recv_all(fd, &has_secret, 1, deadline, NULL, s->what));
  DT_CHECK(dt_net_recv_all(fd, sn, DT_AUTH_NONCE, deadline, NULL, s->what));
  int mine = secret && *secret;
  if (has_secret && !mine)
    return dt_error(DT_INVALID_ARGUMENT,
                    "store at %s:%d requires the job secret and this process has none (set DT_JOB_SECRET, or "
                    "dtrun --secret-file on every node)", s->host, s->port);
  if (!has_secret && mine)
    return dt_error(DT_INVALID_ARGUMENT,
                    "store at %s:%d has no job secret but this process has one: not this job's store, or its "
                    "node was started without the secret", s->host, s->port);
  return DT_OK;
}

/* Connects and shakes hands once: both sides prove the secret. */
static dt_status client_open(dt_store *s, const char *run_id, const char *secret, double deadline, int *fd_out) {
  int fd = -1;
  dt_status st;
  uint8_t cn[DT_AUTH_NONCE], sn[DT_AUTH_NONCE], code;
  DT_CHECK(dt_random_bytes(cn, sizeof cn));
  DT_CHECK(dt_net_connect(s->host, s->port, deadline, NULL, s->what, &fd));
  DT_CHECK_GOTO(client_hello(s, fd, secret, cn, sn, deadline), st, fail);
  size_t n = strlen(run_id);
  uint8_t proof[4 + STORE_MAX_RUN_ID + DT_AUTH_MAC], theirs[DT_AUTH_MAC], want[DT_AUTH_MAC];
  put_u32(proof, (uint32_t)n);
  memcpy(proof + 4, run_id, n);
  handshake_mac(secret, label_client, cn, sn, run_id, n, proof + 4 + n);
  DT_CHECK_GOTO(dt_net_send_all(fd, proof, 4 + n + DT_AUTH_MAC, deadline, NULL, s->what), st, fail);
  DT_CHECK_GOTO(dt_net_recv_all(fd, &code, 1, deadline, NULL, s->what), st, fail);
  if (code == HS_OK) {
    DT_CHECK_GOTO(dt_net_recv_all(fd, theirs, DT_AUTH_MAC, deadline, NULL, s->what), st, fail);
    handshake_mac(secret, label_server, cn, sn, run_id, n, want);
    if (!dt_auth_equal(want, theirs)) {
      st = dt_error(DT_INVALID_ARGUMENT, "store at %s:%d did not prove the job secret: not this job's store",
                    s->host, s->port);
      goto fail;
    }
    *fd_out = fd;
    return DT_OK;
  }
  if (code == HS_BAD_PROOF) {
    st = dt_error(DT_INVALID_ARGUMENT, "store at %s:%d refused this client's job secret (do all processes have the "
                  "same DT_JOB_SECRET / --secret-file?)", s->host, s->port);
  } else if (code == HS_RUN_MISMATCH) {
    char text[256];
    DT_CHECK_GOTO(recv_text(s, fd, deadline, text, sizeof text), st, fail);
    if (text[0])
      st = dt_error(DT_INVALID_ARGUMENT, "store at %s:%d belongs to run '%s', not '%s'", s->host, s->port, text,
                    run_id);
    else
      st = dt_error(DT_INVALID_ARGUMENT, "store at %s:%d belongs to another run than '%s'", s->host, s->port, run_id);
  } else {
    st = dt_error(DT_CORRUPT, "store at %s:%d: unexpected handshake answer %u", s->host, s->port, code);
  }
fail:
  dt_net_close(&fd);
  return st;
}

dt_status dt_store_connect(const char *host, int port, const char *run_id, const char *secret, double timeout_s,
                           dt_store **out) {
  DT_CHECK(check_run_id(run_id));
  DT_CHECK(check_secret(secret));
  if (port <= 0 || port > 65535) return dt_error(DT_INVALID_ARGUMENT, "store port %d outside 1..65535", port);
  const char *h = host && *host ? host : "127.0.0.1";
  if (strlen(h) >= 256) return dt_error(DT_INVALID_ARGUMENT, "store host name longer than 255 characters");
  dt_store *s;
  DT_CHECK(dt_alloc(sizeof *s, (void **)&s));
  s->fd = -1;
  snprintf(s->host, sizeof s->host, "%s", h);
  s->port = port;
  snprintf(s->what, sizeof s->what, "store %s:%d", h, port);
  s->timeout_s = timeout_s > 0 ? timeout_s : default_timeout();
  double deadline = dt_time_now() + s->timeout_s;
  dt_status st;
  for (;;) {
    st = client_open(s, run_id, secret, deadline, &s->fd);
    /* A server that closed on us may be restarting: retry until the deadline. */
    if (st != DT_PEER_LOST || dt_time_now() >= deadline) break;
    struct timespec ts = {0, 50 * 1000000L};
    nanosleep(&ts, NULL);
  }
  if (st != DT_OK) {
    dt_free(s);
    return st;
  }
  pthread_mutex_init(&s->mu, NULL);
  *out = s;
  return DT_OK;
}

void dt_store_close(dt_store *s) {
  if (!s) return;
  dt_net_close(&s->fd);
  pthread_mutex_destroy(&s->mu);
  dt_free(s);
}

/* Takes the client's mutex before the deadline (another thread may be waiting on a key). */
static dt_status client_lock(dt_store *s, double deadline, const char *op) {
  struct timespec now_rt;
  clock_gettime(CLOCK_REALTIME, &now_rt);
  double left = deadline - dt_time_now();
  if (left < 0) left = 0;
  double t = (double)now_rt.tv_sec + now_rt.tv_nsec * 1e-9 + left;
  struct timespec abs = {(time_t)t, (long)((t - (double)(time_t)t) * 1e9)};
  int rc = pthread_mutex_timedlock(&s->mu, &abs);
  if (rc == ETIMEDOUT)
    return dt_error(DT_TIMEOUT, "%s: %s: another thread of this process held the store for %.1f s", s->what, op,
                    left);
  if (rc != 0) return dt_error(DT_INTERNAL, "%s: lock: %s", s->what, strerror(rc));
  if (s->broken) {
    pthread_mutex_unlock(&s->mu);
    return dt_error(DT_PEER_LOST, "%s: %s: connection lost earlier (%s)", s->what, op, s->broken_why);
  }
  return DT_OK;
}

/* After a failure mid-request the byte stream cannot be trusted: close it. */
static dt_status client_break(dt_store *s, dt_status st) {
  snprintf(s->broken_why, sizeof s->broken_why, "%s", dt_last_error());
  s->broken = 1;
  dt_net_close(&s->fd);
  return st;
}

void dt_store_set_timeout(dt_store *s, double timeout_s) {
  if (timeout_s > 0) s->timeout_s = timeout_s;
}

static double request_deadline(const dt_store *s, double timeout_s) {
  return dt_time_now() + (timeout_s > 0 ? timeout_s : s->timeout_s);
}

/* Reads a reply's status byte; REP_ERROR replies become the server's status and text. */
static dt_status recv_status(dt_store *s, double deadline, uint8_t *code) {
  DT_CHECK(dt_net_recv_all(s->fd, code, 1, deadline, NULL, s->what));
  if (*code != REP_ERROR) return DT_OK;
  uint8_t h[8];
  char text[512];
  DT_CHECK(dt_net_recv_all(s->fd, h, 8, deadline, NULL, s->what));
  uint32_t st = get_u32(h), n = get_u32(h + 4);
  if (n >= sizeof text || st == DT_OK || st >= DT_STATUS_COUNT)
    return dt_error(DT_CORRUPT, "%s: malformed error reply", s->what);
  DT_CHECK(dt_net_recv_all(s->fd, text, n, deadline, NULL, s->what));
  text[n] = '\0';
  return dt_error((dt_status)st, "%s: %s", s->what, text);
}

/* Sends a header and an optional payload. */
static dt_status send_req(dt_store *s, const void *h, size_t hn, const void *p, size_t pn, double deadline) {
  DT_CHECK(dt_net_send_all(s->fd, h, hn, deadline, NULL, s->what));
  if (pn) DT_CHECK(dt_net_send_all(s->fd, p, pn, deadline, NULL, s->what));
  return DT_OK;
}

static dt_status check_key(const dt_store *s, const char *key, size_t *n) {
  size_t kn = key ? strlen(key) : 0;
  if (kn < 1 || kn > DT_STORE_MAX_KEY)
    return dt_error(DT_INVALID_ARGUMENT, "%s: key length %zu outside 1..%d", s->what, kn, DT_STORE_MAX_KEY);
  *n = kn;
  return DT_OK;
}

/* Ends the status of a simple (never parked) request: an error reply leaves the
 * connection in sync; a lost or silent server breaks it. */
static dt_status simple_fail(dt_store *s, dt_status st, uint8_t code_seen, const char *op, const char *key) {
  if (code_seen == REP_ERROR && st != DT_CORRUPT && st != DT_PEER_LOST && st != DT_TIMEOUT) return st;
  if (st == DT_TIMEOUT) dt_error(DT_TIMEOUT, "%s: %s '%s': no reply in time (%s)", s->what, op, key, "server busy or hung");
  return client_break(s, st);
}

dt_status dt_store_set(dt_store *s, const char *key, const void *value, size_t len) {
  size_t kn = 0;
  DT_CHECK(check_key(s, key, &kn));
  if (len > DT_STORE_MAX_VALUE)
    return dt_error(DT_INVALID_ARGUMENT, "%s: value of %zu bytes for '%s' above the limit of %u", s->what, len, key,
                    DT_STORE_MAX_VALUE);
  double deadline = request_deadline(s, 0);
  DT_CHECK(client_lock(s, deadline, "set"));
  uint8_t h[9 + DT_STORE_MAX_KEY];
  h[0] = OP_SET;
  put_u32(h + 1, (uint32_t)kn);
  put_u32(h + 5, (uint32_t)len);
  memcpy(h + 9, key, kn);
  uint8_t code = 0xff;
  dt_status st = send_req(s, h, 9 + kn, value, len, deadline);
  if (st == DT_OK) st = recv_status(s, deadline, &code);
  if (st == DT_OK && code != REP_OK) st = dt_error(DT_CORRUPT, "%s: set: unexpected reply %u", s->what, code);
  if (st != DT_OK) st = simple_fail(s, st, code, "set", key);
  pthread_mutex_unlock(&s->mu);
  return st;
}

/* A GET/WAIT outlived its deadline: withdraw it. The answer may have crossed the
 * cancel; then *answered is set and the caller reads the reply (GET: after its
 * status byte) through read_reply. */
typedef dt_status (*reply_reader)(dt_store *s, double deadline, void *ctx);
static dt_status cancel_parked(dt_store *s, reply_reader read_reply, void *ctx, int *answered) {
  double deadline = dt_time_now() + STORE_CANCEL_S;
  uint8_t op = OP_CANCEL, code;
  *answered = 0;
  DT_CHECK(dt_net_send_all(s->fd, &op, 1, deadline, NULL, s->what));
  DT_CHECK(recv_status(s, deadline, &code));
  if (code == REP_OK) {
    DT_CHECK(read_reply(s, deadline, ctx));
    *answered = 1;
    DT_CHECK(recv_status(s, deadline, &code));
  }
  if (code != REP_CANCELLED) return dt_error(DT_CORRUPT, "%s: unexpected reply %u to a cancel", s->what, code);
  return DT_OK;
}

/* Runs a parked request (GET or WAIT) already sent: waits for its status byte
 * until the deadline, cancels on timeout, reads the rest with read_reply. */
static dt_status await_parked(dt_store *s, double deadline, double timeout_s, const char *desc, reply_reader read_reply,
                              void *ctx) {
  uint8_t code;
  dt_status st = recv_status(s, deadline, &code);
  if (st == DT_OK) {
    if (code != REP_OK) return client_break(s, dt_error(DT_CORRUPT, "%s: unexpected reply %u", s->what, code));
    st = read_reply(s, deadline + STORE_CANCEL_S, ctx); /* the reply is on its way: let it land */
    return st == DT_OK ? DT_OK : client_break(s, st);
  }
  if (st != DT_TIMEOUT) return client_break(s, st);
  int answered;
  st = cancel_parked(s, read_reply, ctx, &answered);
  if (st != DT_OK) return client_break(s, st);
  if (answered) return DT_OK;
  return dt_error(DT_TIMEOUT, "%s: %s not set within %.1f s", s->what, desc, timeout_s);
}

typedef struct get_ctx {
  void *value;
  size_t len;
} get_ctx;

static dt_status read_get_reply(dt_store *s, double deadline, void *vctx) {
  get_ctx *g = vctx;
  uint8_t lb[4];
  DT_CHECK(dt_net_recv_all(s->fd, lb, 4, deadline, NULL, s->what));
  uint32_t n = get_u32(lb);
  if (n > DT_STORE_MAX_VALUE) return dt_error(DT_CORRUPT, "%s: value of %u bytes above the limit", s->what, n);
  void *v;
  DT_CHECK(dt_alloc(n, &v));
  dt_status st = dt_net_recv_all(s->fd, v, n, deadline, NULL, s->what);
  if (st != DT_OK) {
    dt_free(v);
    return st;
  }
  g->value = v;
  g->len = n;
  return DT_OK;
}

static dt_status read_nothing(dt_store *s, double deadline, void *ctx) { return DT_OK; }

dt_status dt_store_get(dt_store *s, const char *key, void **value, size_t *len, double timeout_s) {
  size_t kn = 0;
  DT_CHECK(check_key(s, key, &kn));
  double t = timeout_s > 0 ? timeout_s : s->timeout_s;
  double deadline = dt_time_now() + t;
  DT_CHECK(client_lock(s, deadline, "get"));
  uint8_t h[5 + DT_STORE_MAX_KEY];
  h[0] = OP_GET;
  put_u32(h + 1, (uint32_t)kn);
  memcpy(h + 5, key, kn);
  get_ctx g = {NULL, 0};
  char desc[DT_STORE_MAX_KEY + 16];
  snprintf(desc, sizeof desc, "key '%s'", key);
  dt_status st = send_req(s, h, 5 + kn, NULL, 0, deadline);
  if (st != DT_OK)
    st = client_break(s, st);
  else
    st = await_parked(s, deadline, t, desc, read_get_reply, &g);
  pthread_mutex_unlock(&s->mu);
  if (st != DT_OK) return st;
  *value = g.value;
  *len = g.len;
  return DT_OK;
}

dt_status dt_store_add(dt_store *s, const char *key, int64_t delta, int64_t *out) {
  size_t kn = 0;
  DT_CHECK(check_key(s, key, &kn));
  double deadline = request_deadline(s, 0);
  DT_CHECK(client_lock(s, deadline, "add"));
  uint8_t h[13 + DT_STORE_MAX_KEY], r[8];
  h[0] = OP_ADD;
  put_u32(h + 1, (uint32_t)kn);
  put_u64(h + 5, (uint64_t)delta);
  memcpy(h + 13, key, kn);
  uint8_t code = 0xff;
  dt_status st = send_req(s, h, 13 + kn, NULL, 0, deadline);
  if (st == DT_OK) st = recv_status(s, deadline, &code);
  if (st == DT_OK && code != REP_OK) st = dt_error(DT_CORRUPT, "%s: add: unexpected reply %u", s->what, code);
  if (st == DT_OK) st = dt_net_recv_all(s->fd, r, 8, deadline, NULL, s->what);
  if (st != DT_OK) {
    if (code == REP_ERROR && st == DT_INVALID_ARGUMENT) {
      char msg[600];
      snprintf(msg, sizeof msg, "%s", dt_last_error());
      st = dt_error(st, "%s (key '%s')", msg, key);
    } else {
      st = simple_fail(s, st, code, "add", key);
    }
  }
  pthread_mutex_unlock(&s->mu);
  if (st == DT_OK && out) *out = (int64_t)get_u64(r);
  return st;
}

/* Encodes a key list (CHECK/WAIT) into a fresh buffer. */
static dt_status encode_keys(dt_store *s, int op, const char *const *keys, int n, uint8_t **buf, size_t *len) {
  if (n < 1 || n > STORE_MAX_KEYS || !keys)
    return dt_error(DT_INVALID_ARGUMENT, "%s: %d keys, expected 1..%d", s->what, n, STORE_MAX_KEYS);
  size_t total = 5;
  for (int i = 0; i < n; i++) {
    size_t kn = 0;
    DT_CHECK(check_key(s, keys[i], &kn));
    total += 4 + kn;
  }
  if (total > STORE_MAX_REQUEST) return dt_error(DT_INVALID_ARGUMENT, "%s: key list of %zu bytes too long", s->what, total);
  uint8_t *b;
  DT_CHECK(dt_alloc(total, (void **)&b));
  b[0] = (uint8_t)op;
  put_u32(b + 1, (uint32_t)n);
  size_t pos = 5;
  for (int i = 0; i < n; i++) {
    size_t kn = strlen(keys[i]);
    put_u32(b + pos, (uint32_t)kn);
    memcpy(b + pos + 4, keys[i], kn);
    pos += 4 + kn;
  }
  *buf = b;
  *len = total;
  return DT_OK;
}

dt_status dt_store_check(dt_store *s, const char *const *keys, int n, int *present) {
  uint8_t *b;
  size_t bn;
  DT_CHECK(encode_keys(s, OP_CHECK, keys, n, &b, &bn));
  double deadline = request_deadline(s, 0);
  dt_status st = client_lock(s, deadline, "check");
  if (st != DT_OK) {
    dt_free(b);
    return st;
  }
  uint8_t code = 0xff, all = 0;
  st = send_req(s, b, bn, NULL, 0, deadline);
  if (st == DT_OK) st = recv_status(s, deadline, &code);
  if (st == DT_OK && code != REP_OK) st = dt_error(DT_CORRUPT, "%s: check: unexpected reply %u", s->what, code);
  if (st == DT_OK) st = dt_net_recv_all(s->fd, &all, 1, deadline, NULL, s->what);
  if (st != DT_OK) st = simple_fail(s, st, code, "check", keys[0]);
  pthread_mutex_unlock(&s->mu);
  dt_free(b);
  if (st == DT_OK) *present = all ? 1 : 0;
  return st;
}

dt_status dt_store_delete(dt_store *s, const char *key, int *existed) {
  size_t kn = 0;
  DT_CHECK(check_key(s, key, &kn));
  double deadline = request_deadline(s, 0);
  DT_CHECK(client_lock(s, deadline, "delete"));
  uint8_t h[5 + DT_STORE_MAX_KEY];
  h[0] = OP_DELETE;
  put_u32(h + 1, (uint32_t)kn);
  memcpy(h + 5, key, kn);
  uint8_t code = 0xff, was = 0;
  dt_status st = send_req(s, h, 5 + kn, NULL, 0, deadline);
  if (st == DT_OK) st = recv_status(s, deadline, &code);
  if (st == DT_OK && code != REP_OK) st = dt_error(DT_CORRUPT, "%s: delete: unexpected reply %u", s->what, code);
  if (st == DT_OK) st = dt_net_recv_all(s->fd, &was, 1, deadline, NULL, s->what);
  if (st != DT_OK) st = simple_fail(s, st, code, "delete", key);
  pthread_mutex_unlock(&s->mu);
  if (st == DT_OK && existed) *existed = was ? 1 : 0;
  return st;
}

dt_status dt_store_wait(dt_store *s, const char *const *keys, int n, double timeout_s) {
  uint8_t *b;
  size_t bn;
  DT_CHECK(encode_keys(s, OP_WAIT, keys, n, &b, &bn));
  double t = timeout_s > 0 ? timeout_s : s->timeout_s;
  double deadline = dt_time_now() + t;
  dt_status st = client_lock(s, deadline, "wait");
  if (st != DT_OK) {
    dt_free(b);
    return st;
  }
  char desc[200];
  if (n == 1)
    snprintf(desc, sizeof desc, "key '%.150s'", keys[0]);
  else
    snprintf(desc, sizeof desc, "keys '%.120s' ... (%d keys) not all", keys[0], n);
  st = send_req(s, b, bn, NULL, 0, deadline);
  if (st != DT_OK)
    st = client_break(s, st);
  else
    st = await_parked(s, deadline, t, desc, read_nothing, NULL);
  pthread_mutex_unlock(&s->mu);
  dt_free(b);
  return st;
}
