/* TCP sockets with deadlines: listen, connect with retries, accept, exact
 * send/receive and interleaved send+receive, all bounded by an absolute
 * deadline and an abort flag polled at least every 100 ms. */
#define _GNU_SOURCE /* accept4: close-on-exec set atomically (a launcher forks workers meanwhile) */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "dist/dist-impl.h"

/* Longest single poll: the abort flag is looked at this often (ms). */
#define NET_POLL_SLICE_MS 100

static int aborted(const atomic_int *flag) { return flag && atomic_load(flag); }

/* Milliseconds to wait in one poll: at most a slice, at most until the deadline. */
static int poll_ms(double deadline) {
  if (deadline <= 0) return NET_POLL_SLICE_MS;
  double left = deadline - dt_time_now();
  if (left <= 0) return 0;
  double ms = left * 1000.0 + 1.0;
  return ms < NET_POLL_SLICE_MS ? (int)ms : NET_POLL_SLICE_MS;
}

static int expired(double deadline) { return deadline > 0 && dt_time_now() >= deadline; }

static void set_nonblocking(int fd) {
  int fl = fcntl(fd, F_GETFL, 0);
  if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

void dt_net_set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void dt_net_close(int *fd) {
  if (fd && *fd >= 0) {
    close(*fd);
    *fd = -1;
  }
}

/* Resolves host (IPv4; NULL/"" = any address) into sa. */
static dt_status resolve(const char *host, int port, int passive, struct sockaddr_in *sa) {
  memset(sa, 0, sizeof *sa);
  sa->sin_family = AF_INET;
  sa->sin_port = htons((uint16_t)port);
  if (!host || !*host) {
    sa->sin_addr.s_addr = htonl(passive ? INADDR_ANY : INADDR_LOOPBACK);
    return DT_OK;
  }
  if (inet_pton(AF_INET, host, &sa->sin_addr) == 1) return DT_OK;
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(host, NULL, &hints, &res);
  if (rc != 0 || !res)
    return dt_error(DT_NOT_FOUND, "cannot resolve host '%s': %s: give a name or address every rank resolves "
                    "(MASTER_ADDR or --master; under srun the first node of SLURM_JOB_NODELIST is taken)",
                    host, rc ? gai_strerror(rc) : "no address");
  sa->sin_addr = ((const struct sockaddr_in *)res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return DT_OK;
}

dt_status dt_net_listen(const char *host, int port, int backlog, int *fd_out, int *port_out) {
  const char *shown = (host && *host) ? host : "0.0.0.0";
  if (port < 0 || port > 65535) return dt_error(DT_INVALID_ARGUMENT, "cannot listen on %s:%d: port outside 0..65535", shown, port);
  struct sockaddr_in sa;
  DT_CHECK(resolve(host, port, 1, &sa));
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return dt_error(DT_IO, "cannot listen on %s:%d: socket: %s", shown, port, strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    int e = errno;
    close(fd);
    if (e == EADDRINUSE) return dt_error(DT_IO, "cannot listen on %s:%d: address already in use", shown, port);
    return dt_error(DT_IO, "cannot listen on %s:%d: %s", shown, port, strerror(e));
  }
  if (listen(fd, backlog > 0 ? backlog : 128) != 0) {
    int e = errno;
    close(fd);
    if (e == EADDRINUSE) return dt_error(DT_IO, "cannot listen on %s:%d: address already in use", shown, port);
    return dt_error(DT_IO, "cannot listen on %s:%d: %s", shown, port, strerror(e));
  }
  struct sockaddr_in got;
  socklen_t gl = sizeof got;
  if (getsockname(fd, (struct sockaddr *)&got, &gl) != 0) {
    int e = errno;
    close(fd);
    return dt_error(DT_IO, "cannot listen on %s:%d: getsockname: %s", shown, port, strerror(e));
  }
  set_nonblocking(fd);
  *fd_out = fd;
  if (port_out) *port_out = ntohs(got.sin_port);
  return DT_OK;
}

/* One nonblocking connect attempt, waiting for completion until the deadline.
 * Returns 0 and *fd_out on success, else the errno of the failure. */
static int connect_once(const struct sockaddr_in *sa, double deadline, const atomic_int *abort_flag,
                        int *fd_out) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  set_nonblocking(fd);
  if (connect(fd, (const struct sockaddr *)sa, sizeof *sa) == 0) {
    *fd_out = fd;
    return 0;
  }
  if (errno != EINPROGRESS) {
    int e = errno;
    close(fd);
    return e;
  }
  for (;;) {
    if (aborted(abort_flag)) {
      close(fd);
      return EINTR;
    }
    struct pollfd p = {fd, POLLOUT, 0};
    int n = poll(&p, 1, poll_ms(deadline));
    if (n < 0 && errno != EINTR) {
      int e = errno;
      close(fd);
      return e;
    }
    if (n > 0) break;
    if (expired(deadline)) {
      close(fd);
      return ETIMEDOUT;
    }
  }
  int err = 0;
  socklen_t el = sizeof err;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
  if (err) {
    close(fd);
    return err;
  }
  *fd_out = fd;
  return 0;
}

dt_status dt_net_connect(const char *host, int port, double deadline, const atomic_int *abort_flag,
                         const char *what, int *fd_out) {
  const char *h = (host && *host) ? host : "127.0.0.1";
  if (port <= 0 || port > 65535)
    return dt_error(DT_INVALID_ARGUMENT, "%s: port %d outside 1..65535", what, port);
  double start = dt_time_now();
  int backoff_ms = 10;
  int last_err = 0;
  for (;;) {
    if (aborted(abort_flag)) return dt_error(DT_INTERRUPTED, "%s: connecting to %s:%d aborted", what, h, port);
    struct sockaddr_in sa;
    dt_status st = resolve(h, port, 0, &sa);
    if (st != DT_OK) {
      /* A name that does not resolve yet may be a node still booting: retry
       * until the deadline, then report the resolver's answer. */
      if (expired(deadline)) return dt_error_prefix(st, "%s", what);
    } else {
      int fd = -1;
      int e = connect_once(&sa, deadline, abort_flag, &fd);
      if (e == 0) {
        dt_net_set_nodelay(fd);
        *fd_out = fd;
        return DT_OK;
      }
      last_err = e;
      if (e == EINTR && aborted(abort_flag))
        return dt_error(DT_INTERRUPTED, "%s: connecting to %s:%d aborted", what, h, port);
      if (e != ECONNREFUSED && e != ENETUNREACH && e != EHOSTUNREACH && e != ETIMEDOUT && e != ECONNRESET &&
          e != EAGAIN && e != EINTR && e != ECONNABORTED)
        return dt_error(DT_IO, "%s: cannot connect to %s:%d: %s", what, h, port, strerror(e));
    }
    if (expired(deadline))
      return dt_error(DT_TIMEOUT, "%s: cannot connect to %s:%d within %.1f s (%s)", what, h, port,
                      dt_time_now() - start, last_err ? strerror(last_err) : "host not resolved");
    /* Back off (10 ms doubling to 100 ms) without overshooting the deadline. */
    int ms = poll_ms(deadline);
    sleep_ms(ms < backoff_ms ? ms : backoff_ms);
    if (backoff_ms < NET_POLL_SLICE_MS) backoff_ms *= 2;
  }
}

dt_status dt_net_accept(int listen_fd, double deadline, const atomic_int *abort_flag, int *fd_out) {
  double start = dt_time_now();
  for (;;) {
    if (aborted(abort_flag)) return dt_error(DT_INTERRUPTED, "accept: aborted");
    int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      dt_net_set_nodelay(fd);
      *fd_out = fd;
      return DT_OK;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED && errno != EPROTO)
      return dt_error(DT_IO, "accept: %s", strerror(errno));
    if (expired(deadline))
      return dt_error(DT_TIMEOUT, "accept: no connection for %.1f s", dt_time_now() - start);
    struct pollfd p = {listen_fd, POLLIN, 0};
    if (poll(&p, 1, poll_ms(deadline)) < 0 && errno != EINTR)
      return dt_error(DT_IO, "accept: poll: %s", strerror(errno));
  }
}

/* Progress of one direction of a transfer. */
typedef struct xfer {
  int fd;
  char *buf;
  size_t n, done;
  int sending;
  const char *what;
} xfer;

/* Moves as many bytes as the socket takes/gives now. DT_OK also when nothing
 * moved (would block). */
static dt_status xfer_step(xfer *x) {
  while (x->done < x->n) {
    ssize_t k;
    if (x->sending)
      k = send(x->fd, x->buf + x->done, x->n - x->done, MSG_NOSIGNAL | MSG_DONTWAIT);
    else
      k = recv(x->fd, x->buf + x->done, x->n - x->done, MSG_DONTWAIT);
    if (k > 0) {
      x->done += (size_t)k;
      continue;
    }
    if (k == 0 && !x->sending) return dt_error(DT_PEER_LOST, "%s: connection closed", x->what);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return DT_OK;
    if (errno == ECONNRESET || errno == EPIPE || errno == ENOTCONN || errno == ETIMEDOUT)
      return dt_error(DT_PEER_LOST, "%s: connection closed (%s)", x->what, strerror(errno));
    return dt_error(DT_IO, "%s: %s: %s", x->what, x->sending ? "send" : "recv", strerror(errno));
  }
  return DT_OK;
}

/* Runs up to two transfers (either may be NULL or already complete) until both
 * are done, one poll loop for both. */
static dt_status xfer_run(xfer *a, xfer *b, double deadline, const atomic_int *abort_flag) {
  double start = dt_time_now();
  for (;;) {
    if (a) DT_CHECK(xfer_step(a));
    if (b) DT_CHECK(xfer_step(b));
    int a_open = a && a->done < a->n, b_open = b && b->done < b->n;
    if (!a_open && !b_open) return DT_OK;
    if (aborted(abort_flag)) {
      const xfer *x = a_open ? a : b;
      return dt_error(DT_INTERRUPTED, "%s: aborted", x->what);
    }
    if (expired(deadline)) {
      const xfer *x = b_open && !b->sending ? b : a_open && !a->sending ? a : a_open ? a : b;
      if (x->sending)
        return dt_error(DT_TIMEOUT, "%s: could not send for %.1f s (%zu of %zu bytes sent)", x->what,
                        dt_time_now() - start, x->done, x->n);
      return dt_error(DT_TIMEOUT, "%s: no data for %.1f s (%zu of %zu bytes received)", x->what,
                      dt_time_now() - start, x->done, x->n);
    }
    struct pollfd p[2];
    int np = 0;
    if (a_open) p[np++] = (struct pollfd){a->fd, (short)(a->sending ? POLLOUT : POLLIN), 0};
    if (b_open) {
      short ev = (short)(b->sending ? POLLOUT : POLLIN);
      if (np == 1 && p[0].fd == b->fd)
        p[0].events |= ev;
      else
        p[np++] = (struct pollfd){b->fd, ev, 0};
    }
    if (poll(p, (nfds_t)np, poll_ms(deadline)) < 0 && errno != EINTR) {
      const xfer *x = a_open ? a : b;
      return dt_error(DT_IO, "%s: poll: %s", x->what, strerror(errno));
    }
  }
}

dt_status dt_net_send_all(int fd, const void *buf, size_t n, double deadline, const atomic_int *abort_flag,
                          const char *what) {
  xfer x = {fd, (char *)buf, n, 0, 1, what};
  return xfer_run(&x, NULL, deadline, abort_flag);
}

dt_status dt_net_recv_all(int fd, void *buf, size_t n, double deadline, const atomic_int *abort_flag,
                          const char *what) {
  xfer x = {fd, (char *)buf, n, 0, 0, what};
  return xfer_run(&x, NULL, deadline, abort_flag);
}

dt_status dt_net_sendrecv(int sfd, const void *sbuf, size_t sn, const char *swhat, int rfd, void *rbuf,
                          size_t rn, const char *rwhat, double deadline, const atomic_int *abort_flag) {
  xfer s = {sfd, (char *)sbuf, sn, 0, 1, swhat};
  xfer r = {rfd, (char *)rbuf, rn, 0, 0, rwhat};
  return xfer_run(&s, &r, deadline, abort_flag);
}

dt_status dt_net_local_addr(int connected_fd, char *buf, size_t len) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (getsockname(connected_fd, (struct sockaddr *)&ss, &sl) != 0)
    return dt_error(DT_IO, "getsockname: %s", strerror(errno));
  char tmp[INET6_ADDRSTRLEN];
  const char *r = NULL;
  if (ss.ss_family == AF_INET)
    r = inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, tmp, sizeof tmp);
  else if (ss.ss_family == AF_INET6)
    r = inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, tmp, sizeof tmp);
  if (!r) return dt_error(DT_IO, "local address: unsupported address family %d", (int)ss.ss_family);
  if (strlen(tmp) + 1 > len) return dt_error(DT_INVALID_ARGUMENT, "local address %s: buffer of %zu bytes too small", tmp, len);
  memcpy(buf, tmp, strlen(tmp) + 1);
  return DT_OK;
}
