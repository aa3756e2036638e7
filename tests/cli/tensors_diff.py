#!/usr/bin/python3
"""Compares the tensors of two safetensors files, metadata aside (the CLI tests' same_tensors and max_diff).
  tensors_diff.py same A B   exit 0 if names, dtypes, shapes and bytes are equal, else say the first difference
  tensors_diff.py max A B    print the largest absolute difference of their f32 tensors (same names and shapes;
                             tensors of other dtypes, such as batch-norm step counts, must be equal)"""
import json
import struct
import sys


def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items()}


def main(mode, path_a, path_b):
    a, b = tensors(path_a), tensors(path_b)
    if a.keys() != b.keys():
        sys.exit("tensor names differ: %s" % sorted(set(a) ^ set(b)))
    if mode == "same":
        for k in a:
            if a[k] != b[k]:
                sys.exit("tensor %s differs" % k)
        return
    for k in a:
        if a[k][:2] != b[k][:2]:
            sys.exit("tensor %s: %s %s vs %s %s" % (k, a[k][0], a[k][1], b[k][0], b[k][1]))
        if a[k][0] != "F32" and a[k][2] != b[k][2]:
            sys.exit("tensor %s (%s) differs" % (k, a[k][0]))
    f32 = [k for k in a if a[k][0] == "F32"]
    values = lambda raw: struct.unpack("<%df" % (len(raw) // 4), raw)
    print("%.3g" % max((abs(x - y) for k in f32 for x, y in zip(values(a[k][2]), values(b[k][2]))), default=0.0))


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("same", "max"):
        sys.exit(__doc__)
    main(*sys.argv[1:])
