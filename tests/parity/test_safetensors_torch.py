"""safetensors parity with PyTorch: Python (json + struct + torch.frombuffer) reads a file
dtrain wrote and checks its dtrain.crc32 with zlib, and dtrain reads back files Python wrote
by hand (other key order, metadata last, pretty-printed header, raw UTF-8 names, with and
without a checksum). Exit 77 only when torch is missing."""
import json
import os
import struct
import subprocess
import sys
import tempfile
import zlib

try:
    import torch
except ImportError:
    print("torch not installed: skipped")
    sys.exit(77)

BUILD = os.environ.get("DT_BUILD_DIR", "build")
DUMP = os.path.join(BUILD, "tests", "dump_safetensors")
DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
          "I32": torch.int32, "I64": torch.int64, "F64": torch.float64}
DT_NAMES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16",
            torch.int32: "i32", torch.int64: "i64", torch.float64: "f64"}
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def expected_tensors():
    """What dump_safetensors write stores, recomputed with torch (all values exact in their dtype)."""
    i = torch.arange
    return [
        ("conv.weight", ((i(18, dtype=torch.float32) - 9) * 0.125).reshape(2, 1, 3, 3)),
        ("conv.bias", torch.tensor([0.5, -1.5], dtype=torch.float32)),
        ("bn.num_batches_tracked", torch.tensor(123456789012, dtype=torch.int64)),
        ("emb.bf16", (i(6, dtype=torch.float32) * 0.75 - 2).to(torch.bfloat16).reshape(3, 2)),
        ("emb.f16", (i(5, dtype=torch.float32) * 0.5 - 1).to(torch.float16)),
        ("idx", (i(6, dtype=torch.int32) * 7 - 20).reshape(2, 3)),
        ("d", torch.tensor([k / 3.0 for k in range(4)], dtype=torch.float64).reshape(2, 2)),
        ("empty", torch.zeros(0, 4, dtype=torch.float32)),
    ]


def read_with_python(path):
    """A reader from the spec only: u64 header length, JSON, little-endian row-major data."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    check(n % 8 == 0, f"header length {n} is a multiple of 8")
    raw = blob[8:8 + n]
    check(raw.rstrip(b" ") == raw.rstrip(), "header padding is spaces")
    header = json.loads(raw.decode("utf-8"))
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    if "dtrain.crc32" in meta:
        crc = meta.pop("dtrain.crc32")
        check(crc == "%08x" % zlib.crc32(data), f"dtrain.crc32 {crc} is zlib.crc32 of the data section")
    tensors = {}
    spans = []
    for name, info in header.items():
        dtype = DTYPES[info["dtype"]]
        shape = info["shape"]
        b, e = info["data_offsets"]
        spans.append((b, e))
        numel = 1
        for s in shape:
            numel *= s
        check(e - b == numel * torch.tensor([], dtype=dtype).element_size(), f"{name}: size matches shape")
        if numel == 0:
            t = torch.empty(shape, dtype=dtype)
        else:
            t = torch.frombuffer(bytearray(data[b:e]), dtype=dtype).reshape(shape)
        tensors[name] = t
    spans.sort()
    pos = 0
    for b, e in spans:
        check(b == pos, f"data buffer fully indexed at {pos}")
        pos = e
    check(pos == len(data), "no bytes after the last tensor")
    return list(header.keys()), tensors, meta


def dtrain_read(path):
    out = subprocess.run([DUMP, "read", path], capture_output=True, text=True)
    return out.returncode, out.stdout


def test_python_reads_dtrain_file(tmp):
    path = os.path.join(tmp, "from_dtrain.safetensors")
    subprocess.run([DUMP, "write", path], check=True)
    with open(path, "rb") as f:
        check(b'"dtrain.crc32":"' in f.read(4096), "dtrain wrote a checksum")
    names, tensors, meta = read_with_python(path)
    want = expected_tensors()
    check(names == [n for n, _ in want], f"tensor order {names}")
    for name, ref in want:
        got = tensors[name]
        check(got.dtype == ref.dtype, f"{name}: dtype {got.dtype} vs {ref.dtype}")
        check(tuple(got.shape) == tuple(ref.shape), f"{name}: shape {tuple(got.shape)} vs {tuple(ref.shape)}")
        check(torch.equal(got, ref), f"{name}: values differ:\n{got}\n{ref}")
    check(meta == {"format": "pt", "epoch": "3", "note": "\u00fcn\u00efcode \"q\" \\ \n"}, f"metadata {meta}")
    try:  # the Hugging Face reader too, where installed
        from safetensors.torch import load_file
        hf = load_file(path)
        for name, ref in want:
            check(torch.equal(hf[name], ref), f"{name}: safetensors.torch differs")
    except ImportError:
        pass


def write_by_hand(path, tensors, meta, key_order, indent=None, ensure_ascii=True, crc=None):
    """Data laid out in list order; header keys in key_order; metadata last. crc: None (no
    checksum), "right" (zlib.crc32 of the data) or a literal dtrain.crc32 value."""
    header, chunks, off = {}, [], 0
    for name, t in tensors:
        b = t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"shape": list(t.shape), "dtype": [k for k, v in DTYPES.items() if v == t.dtype][0],
                        "data_offsets": [off, off + len(b)]}
        chunks.append(b)
        off += len(b)
    ordered = {k: header[k] for k in key_order}
    if crc is not None:
        meta = dict(meta or {})
        meta["dtrain.crc32"] = "%08x" % zlib.crc32(b"".join(chunks)) if crc == "right" else crc
    if meta is not None:
        ordered["__metadata__"] = meta
    text = json.dumps(ordered, indent=indent, ensure_ascii=ensure_ascii).encode("utf-8")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))
    return {name: (b, header[name]) for (name, _), b in zip(tensors, chunks)}


def parse_dump(stdout):
    metas, tensors = {}, []
    for line in stdout.splitlines():
        parts = line.split(" ")
        if parts[0] == "meta":
            metas[bytes.fromhex(parts[1]).decode()] = bytes.fromhex(parts[2]).decode() if parts[2] != "-" else ""
        elif parts[0] == "tensor":
            ndim = int(parts[3])
            shape = [int(x) for x in parts[4:4 + ndim]]
            data = b"" if parts[4 + ndim] == "-" else bytes.fromhex(parts[4 + ndim])
            tensors.append((bytes.fromhex(parts[1]).decode(), parts[2], shape, data))
    return metas, tensors


def test_dtrain_reads_python_file(tmp):
    g = torch.Generator().manual_seed(0)
    tensors = [
        ("fc1.weight", torch.randn(4, 3, generator=g)),
        ("fc1.bias", torch.randn(4, generator=g).to(torch.float16)),  # 8 bytes: keeps later data aligned
        ("h", torch.randn(3, generator=g).to(torch.float16)),         # 6 bytes: misaligns what follows
        ("w.bf16", torch.randn(2, 2, generator=g).to(torch.bfloat16)),
        ("count", torch.tensor(-42, dtype=torch.int64)),
        ("lab\u00e9ls", torch.tensor([[1, -2, 3]], dtype=torch.int32)),
        ("dbl", torch.randn(2, 1, 2, generator=g, dtype=torch.float64)),
        ("nothing", torch.zeros(3, 0)),
    ]
    order = ["dbl", "count", "lab\u00e9ls", "nothing", "fc1.bias", "h", "w.bf16", "fc1.weight"]
    meta = {"format": "pt", "caf\u00e9": "\u20ac \"x\"\t"}
    for variant, kw in [("ascii", dict(indent=None, ensure_ascii=True)), ("pretty_utf8", dict(indent=2, ensure_ascii=False))]:
        path = os.path.join(tmp, f"from_python_{variant}.safetensors")
        written = write_by_hand(path, tensors, meta, order, **kw)
        rc, out = dtrain_read(path)
        check(rc == 0, f"{variant}: dtrain read failed: {out}")
        metas, got = parse_dump(out)
        check(metas == meta, f"{variant}: metadata {metas}")
        check([n for n, *_ in got] == order, f"{variant}: order {[n for n, *_ in got]}")
        ref = dict(tensors)
        for name, dt, shape, data in got:
            t = ref[name]
            check(dt == DT_NAMES[t.dtype], f"{variant}: {name} dtype {dt}")
            check(shape == list(t.shape), f"{variant}: {name} shape {shape}")
            check(data == written[name][0], f"{variant}: {name} bytes differ")


def test_dtrain_rejects_python_corruptions(tmp):
    good = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    cases = {
        "overlap": (dict(good, b={"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}), 8),
        "hole": ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, 8),
        "size": ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, 8),
        "dtype": ({"a": {"dtype": "F31", "shape": [2], "data_offsets": [0, 8]}}, 8),
    }
    for what, (header, n_data) in cases.items():
        path = os.path.join(tmp, f"bad_{what}.safetensors")
        text = json.dumps(header).encode()
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + bytes(n_data))
        rc, out = dtrain_read(path)
        check(rc == 2 and out.startswith("error DT_CORRUPT") and path in out, f"{what}: {rc} {out!r}")
    path = os.path.join(tmp, "bad_duplicate.safetensors")
    text = b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + bytes(8))
    rc, out = dtrain_read(path)
    check(rc == 2 and "duplicate key" in out, f"duplicate: {out!r}")


def test_checksum_from_python(tmp):
    """A checksum Python computed with zlib is accepted; a wrong or malformed one is DT_CORRUPT."""
    tensors = [("x", torch.arange(6, dtype=torch.float32).reshape(2, 3)), ("n", torch.tensor(5, dtype=torch.int64))]
    data = b"".join(t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() for _, t in tensors)
    for crc, want in [("right", "ok"), ("00000000", "the file is damaged"), ("12345", "not 8 hex digits"),
                      ("xyzxyzxy", "not 8 hex digits")]:
        path = os.path.join(tmp, f"crc_{crc}.safetensors")
        write_by_hand(path, tensors, {"format": "pt"}, ["n", "x"], crc=crc)
        rc, out = dtrain_read(path)
        if want == "ok":
            check(rc == 0, f"crc {crc}: dtrain read failed: {out}")
            metas, _ = parse_dump(out)
            check(metas.get("dtrain.crc32") == "%08x" % zlib.crc32(data), f"crc {crc}: metadata {metas}")
        else:
            check(rc == 2 and out.startswith("error DT_CORRUPT") and want in out and path in out,
                  f"crc {crc}: {rc} {out!r}")
    # A dtrain file with one data byte changed, as a disk or a copy might do it.
    path = os.path.join(tmp, "flipped.safetensors")
    subprocess.run([DUMP, "write", path], check=True)
    with open(path, "r+b") as f:
        f.seek(-9, os.SEEK_END)
        byte = f.read(1)
        f.seek(-9, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x01]))
    rc, out = dtrain_read(path)
    check(rc == 2 and "the file is damaged" in out and "expected" in out and "found" in out, f"flipped: {out!r}")


def main():
    if not os.path.exists(DUMP):
        print(f"missing {DUMP}: build the project first")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        test_python_reads_dtrain_file(tmp)
        test_dtrain_reads_python_file(tmp)
        test_dtrain_rejects_python_corruptions(tmp)
        test_checksum_from_python(tmp)
    print("safetensors parity:", "FAILED" if failures else "ok", f"({len(failures)} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
