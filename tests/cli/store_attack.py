#!/usr/bin/env python3
"""A stranger against a dtrain store (protocol 2), written from the protocol's
description in src/dist/store.c, independently of the C client.

  store_attack.py attack HOST PORT RUN_ID SECRET   the attack of issue 17 step by step; exit 0 if every
                                                   step is refused and nothing about the job leaks
  store_attack.py stress HOST PORT N SECONDS       N hostile connections over SECONDS: random bytes,
                                                   half-open handshakes held open, slow senders, wrong
                                                   proofs, connect-and-close; exit 0 if none got in
"""
import hashlib, hmac, os, random, resource, select, socket, struct, sys, time

MAGIC = b"DST1"


def mac(secret, label, *parts):
    msg = label.encode() + b"\0" + b"".join(struct.pack("<I", len(p)) + p for p in parts)
    key = secret.encode() if secret else b"dtrain-no-secret"
    return hmac.new(key, msg, hashlib.sha256).digest()


def connect(host, port):
    s = socket.create_connection((host, port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def recv_all(s, limit=2.0):
    """Everything the server sends until it closes (or limit seconds)."""
    s.settimeout(limit)
    out = b""
    try:
        while True:
            b = s.recv(4096)
            if not b:
                return out, True
            out += b
    except (socket.timeout, ConnectionResetError):
        return out, False


def recv_n(s, n):
    out = b""
    s.settimeout(5)
    while len(out) < n:
        b = s.recv(n - len(out))
        if not b:
            break
        out += b
    return out


def hello(cn):
    return MAGIC + struct.pack("<I", 2) + cn


def proof(secret, cn, sn, run):
    r = run.encode()
    return struct.pack("<I", len(r)) + r + mac(secret, "dtrain store client", cn, sn, r)


def attack(host, port, run_id, secret):
    fails = []
    leaked = lambda data: run_id.encode() in data or secret.encode() in data

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            fails.append(what)

    # 1. the old handshake with a guessed run id: the old server answered with the real one
    s = connect(host, port)
    s.sendall(MAGIC + struct.pack("<II", 1, 7) + b"default")
    data, closed = recv_all(s)
    check(closed and data[:1] == b"\x02" and not leaked(data), "protocol 1 hello: refused by version, run id not told")
    s.close()
    # 2. and 3. a guessed secret, with a guessed and with the right run id
    for run in ("default", run_id):
        s = connect(host, port)
        cn = os.urandom(32)
        s.sendall(hello(cn))
        ch = recv_n(s, 34)
        s.sendall(proof("guessed-" + "0" * 40, cn, ch[2:], run))
        data, closed = recv_all(s)
        check(len(ch) == 34 and ch[0] == 0 and ch[1] == 1 and data == b"\x01" and closed and not leaked(ch + data),
              "wrong secret, run id %s: one refusal byte, closed, nothing about the job" % ("guessed" if run != run_id else "right"))
        # the connection is gone: a SET goes nowhere
        try:
            s.sendall(b"\x01" + struct.pack("<II", 4, 1) + b"evil" + b"x")
            got, _ = recv_all(s, 0.5)
            check(got == b"", "a SET after the refusal is not answered")
        except OSError:
            check(True, "a SET after the refusal is not answered (connection reset)")
        s.close()
    # 4. requests without any proof
    s = connect(host, port)
    cn = os.urandom(32)
    s.sendall(hello(cn))
    ch = recv_n(s, 34)
    s.sendall(b"\x01" + struct.pack("<II", 12, 1) + b"dtrun/r0/failed" + b"x")
    data, closed = recv_all(s)
    check(data in (b"", b"\x01") and closed, "a SET instead of a proof: refused and closed")
    s.close()
    # 5. a captured handshake (here: made with the real secret, as if sniffed) replayed byte for byte
    s = connect(host, port)
    cn = os.urandom(32)
    s.sendall(hello(cn))
    ch = recv_n(s, 34)
    p = proof(secret, cn, ch[2:], run_id)
    s.sendall(p)
    ans = recv_n(s, 33)
    check(ans[:1] == b"\x00" and hmac.compare_digest(ans[1:], mac(secret, "dtrain store server", cn, ch[2:], run_id.encode())),
          "the real secret is accepted and the server proves it back (an independent implementation agrees)")
    s.close()
    s = connect(host, port)
    s.sendall(hello(cn) + p)
    data, closed = recv_all(s)
    check(len(data) == 35 and data[34:] == b"\x01" and closed, "the captured handshake replayed: refused")
    s.close()
    return 1 if fails else 0


def stress(host, port, n, seconds):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, n + 256)), hard))
    rng = random.Random(17)
    kinds = ["random", "half-open", "slow", "wrong-proof", "close"]
    held, slow, admitted, errors = [], [], 0, 0
    counts = dict.fromkeys(kinds, 0)
    start = time.time()
    next_tick = start
    for i in range(n):
        # spread the connections over the period
        while time.time() < start + seconds * i / n:
            if time.time() >= next_tick:
                next_tick += 0.2
                for entry in slow[:]:
                    sock, rest = entry
                    try:
                        if rest:
                            sock.send(rest[:1])
                            entry[1] = rest[1:]
                    except OSError:
                        slow.remove(entry)
                        sock.close()
            time.sleep(0.002)
        kind = kinds[i % len(kinds)]
        counts[kind] += 1
        try:
            s = socket.create_connection((host, port), timeout=5)
        except OSError:
            errors += 1
            continue
        try:
            if kind == "random":
                s.sendall(os.urandom(rng.randint(1, 4096)))
                s.close()
            elif kind == "half-open":
                s.sendall(hello(os.urandom(32)))
                held.append(s)
            elif kind == "slow":
                slow.append([s, hello(os.urandom(32)) + os.urandom(100)])
            elif kind == "wrong-proof":
                cn = os.urandom(32)
                s.sendall(hello(cn))
                ch = recv_n(s, 34)
                s.sendall(proof("guessed-" + "0" * 40, cn, ch[2:], "default"))
                data, _ = recv_all(s, 1.0)
                if data[:1] == b"\x00":
                    admitted += 1
                s.close()
            else:
                s.close()
        except OSError:
            s.close()
    for s in held:
        s.close()
    for sock, _ in slow:
        sock.close()
    took = time.time() - start
    print("stress: %d connections in %.1f s (%s), %d could not connect, %d admitted"
          % (n, took, ", ".join("%s %d" % kv for kv in counts.items()), errors, admitted))
    return 1 if admitted else 0


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "attack":
        sys.exit(attack(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]))
    if len(sys.argv) == 6 and sys.argv[1] == "stress":
        sys.exit(stress(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])))
    print(__doc__, file=sys.stderr)
    sys.exit(2)
