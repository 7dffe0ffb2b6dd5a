#!/usr/bin/env python3
"""Python's own decoders on the messages tp-bench tensorpack wrote to DIR:
pickle.loads of DIR/pickle.bin, msgpack.unpackb (msgpack_numpy's decoder,
raw=False, as tensorpack's MsgpackSerializer.loads) of DIR/msgpack.bin.
Prints "format nanoseconds-per-decode" lines: this process's CPU time (not
wall time: the machine may be shared), the best of 5 runs of 0.2 s each.

  /usr/bin/python3 bench/peers/tensorpack_decode.py DIR
"""
import os
import pickle
import sys
import time

import msgpack
import msgpack_numpy

msgpack_numpy.patch()


def per_call(fn, buf):
    best = None
    for _ in range(5):
        n, t0 = 0, time.process_time()
        while True:
            for _ in range(16):
                fn(buf)
            n += 16
            t = time.process_time() - t0
            if t >= 0.2:
                break
        v = t / n * 1e9
        best = v if best is None else min(best, v)
    return best


def main():
    d = sys.argv[1]
    with open(os.path.join(d, 'pickle.bin'), 'rb') as f:
        p = f.read()
    with open(os.path.join(d, 'msgpack.bin'), 'rb') as f:
        m = f.read()
    print('pickle %.1f' % per_call(pickle.loads, p))
    print('msgpack %.1f' % per_call(lambda b: msgpack.unpackb(b, raw=False), m))
    return 0


if __name__ == '__main__':
    sys.exit(main())
