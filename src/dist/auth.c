/* Challenge-response with the job secret (HMAC-SHA-256, OpenSSL's libcrypto)
 * for the store handshake and the tcp mesh hellos, and the rate-limited log
 * of refused connections. The secret never travels: each side proves it by a
 * MAC over both sides' fresh nonces, so a captured exchange cannot be replayed. */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "dist/dist-impl.h"

/* Without a secret the MAC only checks that both sides speak of the same
 * thing (run, group); anyone can compute it. */
static const char open_key[] = "dtrain-no-secret";

/* A MAC that cannot be computed (a message that does not fit, HMAC refused by the crypto library) must fail
 * closed: random bytes, which no peer's proof equals, so the connection is refused, never admitted. */
static void fail_closed(uint8_t out[DT_AUTH_MAC], const char *why) {
  static int said;
  if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
    DT_LOG_WARN("auth", "cannot compute a handshake MAC (%s): every connection will be refused", why);
  if (getrandom(out, DT_AUTH_MAC, 0) != DT_AUTH_MAC)
    for (int i = 0; i < DT_AUTH_MAC; i++) out[i] = (uint8_t)(0xA5 ^ i); /* still no peer's MAC of a nonce */
}

void dt_auth_mac(const char *secret, const char *label, const dt_auth_part *parts, int n, uint8_t out[DT_AUTH_MAC]) {
  uint8_t msg[2048];
  size_t len = strlen(label);
  if (len + 1 > sizeof msg) {
    fail_closed(out, "label too long");
    return;
  }
  memcpy(msg, label, len);
  msg[len++] = 0;
  for (int i = 0; i < n; i++) {
    const size_t pn = parts[i].len;
    if (pn > sizeof msg - len || sizeof msg - len - pn < 4) {
      OPENSSL_cleanse(msg, sizeof msg);
      fail_closed(out, "message too long");
      return;
    }
    for (int b = 0; b < 4; b++) msg[len++] = (uint8_t)(pn >> (8 * b));
    memcpy(msg + len, parts[i].p, pn);
    len += pn;
  }
  const char *key = secret && *secret ? secret : open_key;
  unsigned int outlen = DT_AUTH_MAC;
  if (!HMAC(EVP_sha256(), key, (int)strlen(key), msg, len, out, &outlen) || outlen != DT_AUTH_MAC)
    fail_closed(out, "HMAC-SHA-256 refused by libcrypto");
  OPENSSL_cleanse(msg, sizeof msg);
}

int dt_auth_equal(const uint8_t *a, const uint8_t *b) { return CRYPTO_memcmp(a, b, DT_AUTH_MAC) == 0; }

/* ---- refusals ----------------------------------------------------------------
 * A scanner or a flood of strangers must neither fill the log nor slow the
 * job: each address is logged once (the last AUTH_SEEN addresses remembered),
 * and at most AUTH_BURST lines per AUTH_WINDOW_S seconds in all; the count of
 * refusals left unlogged is given with the next line. */
#define AUTH_SEEN 64
#define AUTH_BURST 5
#define AUTH_WINDOW_S 10.0

static pthread_mutex_t refusal_mu = PTHREAD_MUTEX_INITIALIZER;
static char refusal_seen[AUTH_SEEN][48];
static int refusal_next;
static double window_start;
static int window_lines;
static long unlogged;
static long refusals_total;

void dt_auth_refused(const char *subsys, const char *ip, const char *why) {
  pthread_mutex_lock(&refusal_mu);
  refusals_total++;
  int seen = 0;
  for (int i = 0; i < AUTH_SEEN && !seen; i++) seen = strcmp(refusal_seen[i], ip) == 0;
  double now = dt_time_now();
  if (now - window_start > AUTH_WINDOW_S) {
    window_start = now;
    window_lines = 0;
  }
  if (seen || window_lines >= AUTH_BURST) {
    unlogged++;
    pthread_mutex_unlock(&refusal_mu);
    return;
  }
  snprintf(refusal_seen[refusal_next], sizeof refusal_seen[0], "%s", ip);
  refusal_next = (refusal_next + 1) % AUTH_SEEN;
  window_lines++;
  long before = unlogged;
  unlogged = 0;
  pthread_mutex_unlock(&refusal_mu);
  if (before)
    DT_LOG_WARN(subsys, "refused a connection from %s: %s (and %ld refusals not logged: each address is logged once)",
                ip, why, before);
  else
    DT_LOG_WARN(subsys, "refused a connection from %s: %s (further refusals from it are not logged)", ip, why);
}

long dt_auth_refusals(void) {
  pthread_mutex_lock(&refusal_mu);
  long n = refusals_total;
  pthread_mutex_unlock(&refusal_mu);
  return n;
}
