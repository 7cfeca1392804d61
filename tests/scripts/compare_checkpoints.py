#!/usr/bin/env python3
# Compares two tg checkpoints (safetensors): every float32 tensor within a relative tolerance
# (|a - b| / max(1, |b|)), every other tensor byte for byte; prints the largest difference.
# Usage: compare_checkpoints.py A.safetensors B.safetensors TOLERANCE
import json
import struct
import sys


def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    header.pop("__metadata__", None)
    return {k: (v["dtype"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}


a, b, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
if a.keys() != b.keys():
    sys.exit("tensors differ: %s" % sorted(set(a) ^ set(b)))
worst, where = 0.0, ""
for name, (dtype, bytes_a) in sorted(a.items()):
    dtype_b, bytes_b = b[name]
    if dtype != dtype_b or len(bytes_a) != len(bytes_b):
        sys.exit("%s: %s of %d bytes vs %s of %d bytes" % (name, dtype, len(bytes_a), dtype_b, len(bytes_b)))
    if dtype != "F32":
        if bytes_a != bytes_b:
            sys.exit("%s (%s) differs" % (name, dtype))
        continue
    n = len(bytes_a) // 4
    for x, y in zip(struct.unpack("<%df" % n, bytes_a), struct.unpack("<%df" % n, bytes_b)):
        d = abs(x - y) / max(1.0, abs(y))
        if d > worst:
            worst, where = d, name
print("%d tensors; largest relative difference %.3g%s (limit %g)" % (len(a), worst, " in " + where if where else "", tol))
sys.exit(0 if worst <= tol else 1)
