#!/usr/bin/env python3
"""towerpack tests: checkpoints read by tools nobody here wrote.
For every *.safetensors file in the directory given: the XXH3-64 of each
tensor's bytes by Python's xxhash module (Debian's python3-xxhash) must be
the sum towerpack wrote in the metadata key "xxh3_64" (one per tensor, in
the order the tensors lie in the data section: by data_offsets), and a numpy reader of the
format written from its specification must read every tensor (and, where
Hugging Face's safetensors package is installed, so must it, with the same
values). Exit 0 and "xxhash agrees on N tensors"; 1 otherwise; 77 without
xxhash or numpy."""
import glob
import json
import os
import struct
import sys

try:
    import numpy as np
    import xxhash
except ImportError as e:
    print("skipped: %s (apt-get install python3-xxhash python3-numpy)" % e)
    sys.exit(77)

DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64,
          "U8": np.uint8, "F16": np.float16}


def read(path):
    """Header, metadata and tensors (name -> array) of a safetensors file."""
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    meta = head.pop("__metadata__", {})
    data = b[8 + n:]
    arrays = {}
    for k, v in head.items():
        s, e = v["data_offsets"]
        arrays[k] = np.frombuffer(data[s:e], dtype=DTYPES[v["dtype"]]).reshape(v["shape"])
    return head, meta, data, arrays


def main(d):
    files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
    if not files:
        print("no checkpoint in %s" % d)
        return 1
    try:
        from safetensors.numpy import load_file
    except ImportError:
        load_file = None
    total = 0
    for path in files:
        head, meta, data, arrays = read(path)
        order = sorted(head, key=lambda k: tuple(head[k]["data_offsets"]))
        ours = [xxhash.xxh3_64_hexdigest(data[head[k]["data_offsets"][0]:head[k]["data_offsets"][1]])
                for k in order]
        theirs = meta.get("xxh3_64", "").split(",")
        if ours != theirs:
            bad = [k for k, a, b in zip(order, ours, theirs) if a != b]
            print("%s: xxhash disagrees on %s (%d sums recorded for %d tensors)"
                  % (path, bad[:3], len(theirs), len(order)))
            return 1
        if load_file is not None:
            ref = load_file(path)
            for k, a in arrays.items():
                if not np.array_equal(ref[k], a):
                    print("%s: safetensors reads %s differently" % (path, k))
                    return 1
        total += len(order)
    print("numpy%s reads %d files; xxhash agrees on %d tensors"
          % ("" if load_file is None else " and safetensors", len(files), total))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
