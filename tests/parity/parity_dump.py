"""Runs a dump_* tool of the parity tests and reads what it wrote (the format of dump_io.h):
PREFIX.bin holds raw little-endian tensors, PREFIX.idx one line per tensor,
"name f32|i32|f64|i64 offset_bytes ndim d0 d1 ...". Imported by the test_*_torch.py scripts."""
import os
import subprocess
import tempfile

import numpy as np

TYPES = {"f32": np.float32, "i32": np.int32, "f64": np.float64, "i64": np.int64}


def load(prefix):
    """{name: numpy array} of a dump at prefix."""
    raw = open(prefix + ".bin", "rb").read()
    out = {}
    for line in open(prefix + ".idx"):
        f = line.split()
        name, typ, off, ndim = f[0], f[1], int(f[2]), int(f[3])
        dims = [int(d) for d in f[4:4 + ndim]]
        n = int(np.prod(dims))
        arr = np.frombuffer(raw, dtype=np.dtype(TYPES[typ]).newbyteorder("<"), count=n, offset=off).reshape(dims)
        out[name] = arr.copy()
    return out


def run(tool, *args):
    """Runs $DT_BUILD_DIR/tests/<tool> [args] and returns its dump; None (after saying why) outside ctest."""
    build = os.environ.get("DT_BUILD_DIR")
    if not build:
        print("DT_BUILD_DIR is not set (run through ctest)")
        return None
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "dump")
        subprocess.run([os.path.join(build, "tests", tool), prefix, *args], check=True)
        return load(prefix)
