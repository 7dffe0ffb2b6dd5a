#!/usr/bin/env python3
"""towerpack tests: the reference for the text source
(tests/dataflow/test_proc_text.c): numpy slices the file's bytes at the
offsets the C side drew and compares them with the windows it wrote.

  text_ref.py FILE T SPLIT VAL OFFSETS WINDOWS

FILE: the text file. T: the context. SPLIT: train, val or all. VAL: the
held-out fraction. OFFSETS: int64 offsets within the split, native endian.
WINDOWS: int32 [N, 2, T] (the input, then the targets, of each window).
Exit status 0: every window matches; 1: a mismatch (printed); 77: numpy is
missing (the test skips).
"""
import math
import sys

try:
    import numpy as np
except ImportError as e:
    print("missing python module: %s (apt-get install python3-numpy)" % e)
    sys.exit(77)


def main():
    path, T, split, val, offs, wins = sys.argv[1:7]
    T, val = int(T), float(val)
    data = np.fromfile(path, dtype=np.uint8)
    n = data.size
    cut = n - int(math.floor(n * val))
    lo, hi = {"train": (0, cut), "val": (cut, n), "all": (0, n)}[split]
    part = data[lo:hi]
    off = np.fromfile(offs, dtype=np.int64)
    got = np.fromfile(wins, dtype=np.int32).reshape(-1, 2, T)
    if got.shape[0] != off.size:
        print("%d windows for %d offsets" % (got.shape[0], off.size))
        return 1
    if off.size and (off.min() < 0 or off.max() + T + 1 > part.size):
        print("an offset outside the split: [%d, %d] for %d bytes"
              % (off.min(), off.max(), part.size))
        return 1
    idx = off[:, None] + np.arange(T)[None, :]
    want = np.stack([part[idx], part[idx + 1]], axis=1).astype(np.int32)
    bad = np.argwhere(np.any(want != got, axis=(1, 2)))
    if bad.size:
        i = int(bad[0, 0])
        print("window %d (offset %d) differs: got %s, want %s"
              % (i, off[i], got[i, 0, :8], want[i, 0, :8]))
        return 1
    print("%d windows of %s (%d of %d bytes) match" % (off.size, split,
                                                       part.size, n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
