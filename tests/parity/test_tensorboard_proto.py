"""TensorBoard events files from dtrain, read with the real protobuf library: TFRecord framing and
both masked CRC-32Cs checked by a reader written here, every record parsed as a tensorflow.Event
compiled by protoc from tests/parity/proto, and re-serialized to the same bytes (canonical encoding).
Exit 77 only when protoc or google.protobuf is missing."""
import math
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

PROTOC = shutil.which("protoc")
if PROTOC is None:
    print("protoc not installed (apt-get install protobuf-compiler): skipped")
    sys.exit(77)
try:
    import google.protobuf  # noqa: F401
except ImportError:
    print("google.protobuf not installed (apt-get install python3-protobuf): skipped")
    sys.exit(77)

SOURCE = os.environ.get("DT_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("DT_BUILD_DIR", "build")
DUMP = os.path.join(BUILD, "tests", "dump_tensorboard")
PROTO_DIR = os.path.join(SOURCE, "tests", "parity", "proto")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


# ---- CRC-32C (Castagnoli), table driven, and TFRecord's mask -------------------------------
def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


CRC_TABLE = _crc_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = (crc >> 8) ^ CRC_TABLE[(crc ^ b) & 0xFF]
    return crc ^ 0xFFFFFFFF


def masked_crc(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_records(blob):
    """TFRecord: u64 length, masked CRC of the length bytes, data, masked CRC of the data.
    Raises ValueError on any mismatch or trailing bytes."""
    records, pos = [], 0
    while pos < len(blob):
        if len(blob) - pos < 12:
            raise ValueError(f"truncated record header at {pos}")
        head = blob[pos:pos + 8]
        (n,) = struct.unpack("<Q", head)
        (head_crc,) = struct.unpack("<I", blob[pos + 8:pos + 12])
        if head_crc != masked_crc(head):
            raise ValueError(f"length CRC mismatch at {pos}")
        if len(blob) - pos - 12 < n + 4:
            raise ValueError(f"truncated record at {pos}")
        data = blob[pos + 12:pos + 12 + n]
        (data_crc,) = struct.unpack("<I", blob[pos + 12 + n:pos + 16 + n])
        if data_crc != masked_crc(data):
            raise ValueError(f"data CRC mismatch at {pos}")
        records.append((pos, bytes(data)))
        pos += 16 + n
    return records


def unknown_fields(msg):
    try:
        from google.protobuf import unknown_fields as uf  # protobuf >= 4.22
        return len(uf.UnknownFieldSet(msg))
    except ImportError:
        return len(msg.UnknownFields())


def f32(x):
    """x rounded to float32, as its 4 bytes (compares -0.0 and infinities exactly)."""
    return struct.pack("<f", x)


# The fixed set dump_tensorboard writes without arguments (see dump_tensorboard.c).
FIXED = [("loss/train", i, 2.5 - 0.25 * i) for i in range(5)] + [
    ("acc/top1", 4, 0.1),
    ("\u00fc/accuracy", 5, 1e-45),
    ("neg", -3, -math.inf),
    ("nan", 6, math.nan),
    ("x" * 300, 1 << 40, 3.4028235e38),
    ("m" * 4096, 2**63 - 1, -0.0),
]
GIVEN = [("epoch/lr", "10", "0.001"), ("a b", "-7", "-1.5e-3"), ("big", "123456789012", "1e38")]


def check_file(path, expected, event_pb2, t0, t1, name):
    with open(path, "rb") as f:
        blob = f.read()
    try:
        records = read_records(blob)
    except ValueError as e:
        check(False, f"{name}: framing: {e}")
        return blob
    check(len(records) == 1 + len(expected), f"{name}: {len(records)} records, expected {1 + len(expected)}")
    events = []
    for pos, data in records:
        ev = event_pb2.Event()
        ev.ParseFromString(data)
        events.append(ev)
        # Re-encoding gives the same bytes: field order, varints and proto3 defaults as protobuf's.
        check(ev.SerializeToString() == data, f"{name}: record at {pos} is canonical protobuf")
        check(unknown_fields(ev) == 0 and all(unknown_fields(v) == 0 for v in ev.summary.value),
              f"{name}: record at {pos} has no fields outside event.proto / summary.proto")
    if not events:
        return blob
    first = events[0]
    check(first.WhichOneof("what") == "file_version", f"{name}: first record is the file version")
    check(first.file_version == "brain.Event:2", f"{name}: file_version {first.file_version!r}")
    check(first.step == 0, f"{name}: first record step {first.step}")
    last = 0.0
    for i, ev in enumerate(events):
        check(t0 - 1 <= ev.wall_time <= t1 + 1, f"{name}: record {i} wall_time {ev.wall_time} in [{t0}, {t1}]")
        check(ev.wall_time >= last, f"{name}: record {i} wall_time does not go back")
        last = ev.wall_time
    for i, (tag, step, value) in enumerate(expected):
        if i + 1 >= len(events):
            break
        ev = events[i + 1]
        check(ev.WhichOneof("what") == "summary", f"{name}: record {i + 1} is a summary")
        check(len(ev.summary.value) == 1, f"{name}: record {i + 1} has one value")
        if len(ev.summary.value) != 1:
            continue
        v = ev.summary.value[0]
        check(v.tag == tag, f"{name}: record {i + 1} tag {v.tag[:40]!r} == {tag[:40]!r}")
        check(ev.step == step, f"{name}: record {i + 1} step {ev.step} == {step}")
        check(v.WhichOneof("value") == "simple_value", f"{name}: record {i + 1} holds simple_value")
        if math.isnan(value):
            check(math.isnan(v.simple_value), f"{name}: record {i + 1} value is NaN")
        else:
            check(f32(v.simple_value) == f32(value),
                  f"{name}: record {i + 1} value {v.simple_value!r} == float32({value!r})")
    return blob


def check_corruption_is_caught(blob):
    """The checks mean something only if read_records rejects damage: flip one bit in each part
    of every record, and cut the file short."""
    records = read_records(blob)
    for pos, data in records:
        n = len(data)
        for off, part in [(0, "length"), (8, "length CRC"), (12, "data start"), (12 + n // 2, "data middle"),
                          (11 + n, "data end"), (12 + n, "data CRC"), (15 + n, "data CRC end")]:
            bad = bytearray(blob)
            bad[pos + off] ^= 0x10
            try:
                read_records(bytes(bad))
                check(False, f"flipped bit in the {part} of the record at {pos} went unnoticed")
            except ValueError:
                pass
    for cut in (1, 4, len(records[-1][1]) + 15):
        try:
            read_records(blob[:-cut])
            check(False, f"file cut {cut} bytes short went unnoticed")
        except ValueError:
            pass


def run_dump(args, expect_ok=True):
    t0 = time.time()
    out = subprocess.run([DUMP] + args, capture_output=True, text=True)
    t1 = time.time()
    if expect_ok and out.returncode != 0:
        print(out.stdout, out.stderr)
    return out, t0, t1


def check_training_run(tmp, event_pb2):
    """dtrain train --tensorboard: every expected (tag, step) once, validation scalars equal to metrics.csv."""
    if not os.path.isdir("/usr/share/datasets/fashion-mnist"):
        print("fashion-mnist not installed: the training-run part is skipped")
        return
    out_dir, tb = os.path.join(tmp, "run"), os.path.join(tmp, "run", "tb")
    # 256 samples, batch 32: 8 steps per epoch; train scalars every 4 steps, validation every epoch.
    cmd = [os.path.join(BUILD, "dtrain"), "train", "--model", "mlp", "--epochs", "2", "--limit-train", "256",
           "--limit-test", "100", "--batch-size", "32", "--threads", "1", "--progress", "none", "--out", out_dir,
           "--tensorboard", tb, "--log-every", "4"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    check(run.returncode == 0, f"dtrain train --tensorboard succeeded ({run.stderr.strip()})")
    if run.returncode != 0:
        return
    files = os.listdir(tb)
    check(len(files) == 1 and files[0].startswith("events.out.tfevents."), f"one events file: {files}")
    with open(os.path.join(tb, files[0]), "rb") as f:
        records = read_records(f.read())
    seen = {}
    for _, data in records[1:]:
        ev = event_pb2.Event()
        ev.ParseFromString(data)
        for v in ev.summary.value:
            check((v.tag, ev.step) not in seen, f"{v.tag} at step {ev.step} written once")
            seen[(v.tag, ev.step)] = v.simple_value
    train_tags = ["Loss/train", "acc1/train", "acc5/train", "lr", "throughput/samples_per_s"]
    val_tags = ["Loss/val", "acc1/val", "acc5/val"]
    want = {(t, s) for t in train_tags for s in (4, 8, 12, 16)} | {(t, s) for t in val_tags for s in (8, 16)}
    check(set(seen) == want, f"tags and steps: missing {sorted(want - set(seen))}, extra {sorted(set(seen) - want)}")
    with open(os.path.join(out_dir, "metrics.csv")) as f:
        rows = [line.strip().split(",") for line in f][1:]
    for row in rows:
        step, test_loss, acc1, acc5 = int(row[1]), float(row[5]), float(row[6]), float(row[7])
        for tag, want_v in (("Loss/val", test_loss), ("acc1/val", acc1), ("acc5/val", acc5)):
            got = seen.get((tag, step))
            check(got is not None and abs(got - want_v) < 1e-5, f"{tag} at step {step}: {got} vs metrics.csv {want_v}")
    check(all(0 <= seen[(t, s)] <= 1 for t in ("acc1/train", "acc5/train") for s in (4, 8, 12, 16)), "accuracies in [0, 1]")
    check(all(seen[("acc5/train", s)] >= seen[("acc1/train", s)] for s in (4, 8, 12, 16)), "top-5 >= top-1")
    check(all(abs(seen[("lr", s)] - 0.01) < 1e-9 for s in (4, 8, 12, 16)), "lr is the constant 0.01")
    check(all(seen[("throughput/samples_per_s", s)] > 0 for s in (4, 8, 12, 16)), "throughput > 0")


def main():
    if not os.path.exists(DUMP):
        print(f"{DUMP} missing: build first (make build)")
        return 1
    check(crc32c(b"123456789") == 0xE3069283, "crc32c('123456789')")
    check(crc32c(bytes(32)) == 0x8A9136AA, "crc32c(32 zero bytes)")

    with tempfile.TemporaryDirectory() as tmp:
        gen = os.path.join(tmp, "gen")
        os.mkdir(gen)
        subprocess.run([PROTOC, f"--python_out={gen}", "-I", PROTO_DIR, os.path.join(PROTO_DIR, "event.proto"),
                        os.path.join(PROTO_DIR, "summary.proto")], check=True)
        sys.path.insert(0, gen)
        import event_pb2

        host = re.escape(socket.gethostname())

        # The fixed set into a directory that does not exist yet (created with its parent).
        logdir = os.path.join(tmp, "runs", "fixed")
        out, t0, t1 = run_dump([logdir])
        check(out.returncode == 0, "dump_tensorboard (fixed set) succeeded")
        if out.returncode == 0:
            path = out.stdout.strip()
            check(os.listdir(logdir) == [os.path.basename(path)], "one events file in the directory")
            m = re.fullmatch(r"events\.out\.tfevents\.(\d{10})\." + host, os.path.basename(path))
            check(m is not None, f"file name {os.path.basename(path)!r}")
            if m:
                check(int(t0) - 1 <= int(m.group(1)) <= t1 + 1, "file name holds the creation time")
            blob = check_file(path, FIXED, event_pb2, t0, t1, "fixed")
            check_corruption_is_caught(blob)

        # Scalars from the command line, with a per-rank suffix.
        logdir = os.path.join(tmp, "runs", "given")
        args = [logdir, "--suffix", ".rank1"] + [x for triple in GIVEN for x in triple]
        out, t0, t1 = run_dump(args)
        check(out.returncode == 0, "dump_tensorboard (given scalars) succeeded")
        if out.returncode == 0:
            path = out.stdout.strip()
            check(re.fullmatch(r"events\.out\.tfevents\.\d{10}\." + host + r"\.rank1", os.path.basename(path))
                  is not None, f"file name {os.path.basename(path)!r} ends with the suffix")
            expected = [(t, int(s), float(v)) for t, s, v in GIVEN]
            check_file(path, expected, event_pb2, t0, t1, "given")

        # A directory under a regular file cannot be created: an error naming it, no file.
        plain = os.path.join(tmp, "plain")
        open(plain, "w").close()
        out, _, _ = run_dump([os.path.join(plain, "logs")], expect_ok=False)
        check(out.returncode != 0 and "DT_IO" in out.stderr and plain in out.stderr,
              f"unwritable directory fails with DT_IO naming it ({out.stderr.strip()})")

        check_training_run(tmp, event_pb2)

    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("ok: events files parse as tensorflow.Event with matching CRCs, tags, steps and values")
    return 0


if __name__ == "__main__":
    sys.exit(main())
