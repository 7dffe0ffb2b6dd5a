#!/usr/bin/env python3
"""The Python side of towerpack's tensorpack tests: writes datapoints the way
tensorpack's own code does (tensorpack/utils/serialize.py dumps,
dataflow/remote.py send_dataflow_zmq, dataflow/serialize.py
LMDBSerializer.save, zmq_ops' dump_arrays layout) and reads what towerpack
sends back with Python's own loaders.

  check                                 exit 0 when numpy, msgpack,
                                        msgpack_numpy, zmq and lmdb import
  dump FORMAT DIR                       DIR/msg_K.bin (one message each) and
                                        DIR/truth_K.txt (what it holds)
  send FORMAT ENDPOINT N                PUSH N datapoints (connect), like
                                        send_dataflow_zmq
  lmdb FORMAT PATH N [dir]              LMDBSerializer.save of N datapoints
  pull ENDPOINT N FORMAT OUT            RemoteDataZMQ's loads of N messages
                                        (bind), described into OUT
  hostile DIR                           DIR/K.bin: hostile pickles
  batches FORMAT ENDPOINT N B           PUSH N batches [uint8 (B,28,28),
                                        int64 (B,)] (send_dataflow_zmq of a
                                        BatchData), then linger
  imagelmdb FORMAT PATH N                LMDBSerializer.save of N [uint8 (28,28),
                                        int64 label] datapoints (tp-train's)
  jpeglmdb FORMAT PATH DIR KIND         LMDBSerializer.save of [jpeg, label]
                                        for DIR/K.jpg (label K), the jpeg an
                                        np.uint8 array of the file's bytes
                                        (KIND array, tensorpack's tutorial)
                                        or the bytes (KIND bytes)
  readlmdb PATH OUT                     LMDBSerializer.load(PATH,
                                        shuffle=False) described into OUT,
                                        checking __keys__

FORMAT: pickle, msgpack or zmq_ops; pickle2/pickle4 (older protocols);
pickle-np2/pickle2-np2: the pickles numpy 2.x writes (its module paths,
numpy._core.*), made here with numpy 1.x (np2_dumps). A truth file has one line per component:
"dtype d0,d1,... hexbytes" (numpy's dtype.str, the shape, the raw bytes).
"""
import os
import pickle
import struct
import sys

import numpy as np


def datapoints(fmt, n):
    """n datapoints with every kind of component tensorpack users send."""
    rng = np.random.RandomState(7)
    out = []
    for k in range(n):
        img = rng.randint(0, 256, size=(4, 5, 3)).astype(np.uint8)
        big = rng.randint(0, 256, size=(16, 28, 28)).astype(np.uint8)
        lab = np.array([k, -3, 2 ** 40], dtype=np.int64)
        f32 = rng.randn(3, 3).astype(np.float32)
        if fmt == 'zmq_ops':   # dump_arrays takes arrays (ints -> int32)
            dp = [img, big, lab, f32, rng.randn(2).astype(np.float64),
                  np.array([True, False, True]), np.arange(4, dtype=np.int32),
                  rng.randn(5).astype(np.float16), np.asarray(k).astype('int32')]
        else:
            dp = [img, big, lab, f32, rng.randn(2).astype(np.float64),
                  np.array([True, False, True]), np.arange(4, dtype=np.int32),
                  rng.randn(5).astype(np.float16), np.float32(1.5 + k),
                  np.int64(k), k, 2.5 * k, b'raw\x00bytes', 'str \u00e9',
                  np.zeros((0, 3), np.float32)]
        out.append(dp)
    return out


# zmq_ops' dump_arrays (zmq_ops/zmq_ops.py dump_arrays_py: '=' is native
# order, TensorFlow's DataType numbers)
_TF = {np.dtype(np.float16): 19, np.dtype(np.float32): 1, np.dtype(np.float64): 2,
       np.dtype(np.uint8): 4, np.dtype(np.int64): 9, np.dtype(np.int32): 3,
       np.dtype(np.bool_): 10}


def dump_arrays(arrs):
    s = struct.pack('=i', len(arrs))
    for arr in arrs:
        assert arr.flags['C_CONTIGUOUS']
        s += struct.pack('=i', _TF[arr.dtype])
        s += struct.pack('=i', len(arr.shape))
        for d in arr.shape:
            s += struct.pack('=i', d)
        content = arr.tobytes()
        s += struct.pack('=q', len(content))
        s += content
    return s


def np2_dumps(obj, protocol):
    """pickle.dumps as under numpy 2.x, whose ndarray reduces to the same
    functions under the module paths numpy._core.multiarray / numeric.
    numpy 1.x (Debian bookworm's) names them numpy.core.*: stand-ins with
    numpy 2's names, registered as modules, take their place in the
    reduction, so the bytes name what numpy 2 names."""
    import io
    import types
    stand_ins = {}
    for sub in ('multiarray', 'numeric'):
        name = 'numpy._core.' + sub
        mod = sys.modules.get(name) or types.ModuleType(name)
        sys.modules[name] = mod
        stand_ins[sub] = mod

    def stand_in(fn):
        sub = fn.__module__.rsplit('.', 1)[-1] if fn.__module__ else 'multiarray'
        mod = stand_ins['numeric' if sub == 'numeric' else 'multiarray']
        if not hasattr(mod, fn.__name__):
            def f(*a, _fn=fn):
                return _fn(*a)
            f.__module__, f.__name__, f.__qualname__ = mod.__name__, fn.__name__, fn.__name__
            setattr(mod, fn.__name__, f)
        return getattr(mod, fn.__name__)

    class P(pickle.Pickler):
        def reducer_override(self, o):
            if type(o) is not np.ndarray:
                return NotImplemented
            r = o.__reduce_ex__(protocol)
            return (stand_in(r[0]),) + tuple(r[1:])

    b = io.BytesIO()
    P(b, protocol=protocol).dump(obj)
    return b.getvalue()


def dumps_fn(fmt):
    if fmt.endswith('-np2'):   # numpy 2.x's module paths
        proto = -1 if fmt == 'pickle-np2' else int(fmt[6:-4])
        return lambda obj: np2_dumps(obj, pickle.HIGHEST_PROTOCOL if proto < 0 else proto)
    if fmt == 'pickle':   # PickleSerializer.dumps
        return lambda obj: pickle.dumps(obj, protocol=-1)
    if fmt.startswith('pickle'):   # an older protocol: pickle2, pickle4
        proto = int(fmt[6:])
        return lambda obj: pickle.dumps(obj, protocol=proto)
    if fmt == 'msgpack':  # MsgpackSerializer.dumps after msgpack_numpy.patch()
        import msgpack
        import msgpack_numpy
        msgpack_numpy.patch()
        return lambda obj: msgpack.dumps(obj, use_bin_type=True)
    if fmt == 'zmq_ops':
        return dump_arrays
    raise SystemExit('unknown format ' + fmt)


def truth(dp):
    lines = []
    for c in dp:
        if isinstance(c, bool):
            a = np.asarray(c, np.uint8)
        elif isinstance(c, int):
            a = np.asarray(c, np.int64)
        elif isinstance(c, float):
            a = np.asarray(c, np.float64)
        elif isinstance(c, bytes):
            a = np.frombuffer(c, np.uint8)
        elif isinstance(c, str):
            a = np.frombuffer(c.encode('utf-8'), np.uint8)
        else:
            a = np.asarray(c)
        if a.dtype == np.bool_:
            a = a.astype(np.uint8)
        lines.append('%s %s %s' % (a.dtype.str, ','.join(str(d) for d in a.shape),
                                   a.tobytes().hex() or '-'))
    return '\n'.join(lines) + '\n'


def main():
    cmd = sys.argv[1]
    if cmd == 'check':
        import msgpack, msgpack_numpy, zmq, lmdb  # noqa: F401
        return 0
    if cmd == 'dump':
        fmt, d = sys.argv[2], sys.argv[3]
        dumps = dumps_fn(fmt)
        for k, dp in enumerate(datapoints(fmt if fmt == 'zmq_ops' else 'x', 3)):
            with open(os.path.join(d, 'msg_%d.bin' % k), 'wb') as f:
                f.write(dumps(dp))
            with open(os.path.join(d, 'truth_%d.txt' % k), 'w') as f:
                f.write(truth(dp))
        return 0
    if cmd == 'send':   # send_dataflow_zmq(df, addr, format=...)
        import zmq
        fmt, addr, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
        dumps = dumps_fn(fmt)
        ctx = zmq.Context()
        socket = ctx.socket(zmq.PUSH)
        socket.set_hwm(50)
        socket.connect(addr)
        for dp in datapoints(fmt, n):
            socket.send(dumps(dp), copy=False)
        socket.setsockopt(zmq.LINGER, 10000)
        socket.close()
        ctx.term()
        return 0
    if cmd == 'lmdb':   # LMDBSerializer.save(df, path)
        import lmdb
        fmt, path, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
        if len(sys.argv) > 5 and sys.argv[5] == 'dir':
            os.makedirs(path, exist_ok=True)
        dumps = dumps_fn(fmt)
        isdir = os.path.isdir(path)
        db = lmdb.open(path, subdir=isdir, map_size=1 << 30, readonly=False,
                       meminit=False, map_async=True)
        txn = db.begin(write=True)
        idx = -1
        with open(path.rstrip('/') + '.truth', 'w') as tf:
            for idx, dp in enumerate(datapoints('x', n)):
                txn.put(u'{:08}'.format(idx).encode('ascii'), dumps(dp))
                tf.write(truth(dp) + '=\n')
                if (idx + 1) % 5000 == 0:
                    txn.commit()
                    txn = db.begin(write=True)
        txn.commit()
        keys = [u'{:08}'.format(k).encode('ascii') for k in range(idx + 1)]
        with db.begin(write=True) as txn:
            txn.put(b'__keys__', dumps(keys))
        db.sync()
        db.close()
        return 0
    if cmd == 'pull':   # RemoteDataZMQ: loads(socket.recv(copy=False))
        import zmq
        addr, n, fmt, out = sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
        if fmt == 'msgpack':
            import msgpack
            import msgpack_numpy
            msgpack_numpy.patch()
            loads = lambda b: msgpack.loads(b, raw=False)  # noqa: E731
        else:
            loads = pickle.loads
        ctx = zmq.Context()
        socket = ctx.socket(zmq.PULL)
        socket.set_hwm(50)
        socket.setsockopt(zmq.RCVTIMEO, 20000)
        socket.bind(addr)
        with open(out + '.tmp', 'w') as f:
            for _ in range(n):
                dp = loads(socket.recv(copy=False))
                assert isinstance(dp, list), type(dp)
                for c in dp:
                    assert isinstance(c, np.ndarray), type(c)
                f.write(truth(dp) + '=\n')
        os.rename(out + '.tmp', out)
        ctx.destroy(0)
        return 0
    if cmd == 'hostile':
        d = sys.argv[2]

        class Sys:
            def __reduce__(self):
                return (os.system, ('echo towerpack-was-owned',))

        class Ev:
            def __reduce__(self):
                import builtins
                return (builtins.eval, ('1+1',))
        msgs = {
            # what pickle itself writes for objects that call os.system / eval
            'os_system_py': pickle.dumps([np.zeros(2), Sys()], protocol=-1),
            'eval_py': pickle.dumps([Ev()], protocol=-1),
            'eval_p2': pickle.dumps([Ev()], protocol=2),
            # os.system named as such (pickle writes posix.system on Linux)
            'os_system': b'\x80\x02]q\x00(cos\nsystem\nq\x01X\x04\x00\x00\x00trueq\x02'
                         b'\x85q\x03Rq\x04e.',
            'unknown_opcode': b'\x80\x04]\xff.',
            'truncated': pickle.dumps([np.arange(100, dtype=np.float32)], protocol=-1)[:-40],
            'huge_length': b'\x80\x05\x96' + struct.pack('<Q', 1 << 62) + b'abc.',
            'deep_lists': b'\x80\x04' + b']' * 10000 + b'a' * 9999 + b'.',
            'fortran': pickle.dumps([np.asfortranarray(np.ones((3, 4), np.float32))],
                                    protocol=-1),
            'object_array': pickle.dumps([np.array([1, 'a'], dtype=object)], protocol=-1),
        }
        for k, v in msgs.items():
            with open(os.path.join(d, k + '.bin'), 'wb') as f:
                f.write(v)
        return 0
    if cmd == 'batches':
        import zmq
        fmt, addr, n, b = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        dumps = dumps_fn(fmt)
        rng = np.random.RandomState(3)
        ctx = zmq.Context()
        socket = ctx.socket(zmq.PUSH)
        socket.set_hwm(50)
        socket.connect(addr)
        for _ in range(n):
            dp = [rng.randint(0, 256, size=(b, 28, 28)).astype(np.uint8),
                  rng.randint(0, 10, size=(b,)).astype(np.int64)]
            socket.send(dumps(dp), copy=False)
        socket.setsockopt(zmq.LINGER, 30000)
        socket.close()
        ctx.term()
        return 0
    if cmd == 'imagelmdb':
        import lmdb
        fmt, path, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
        dumps = dumps_fn(fmt)
        rng = np.random.RandomState(11)
        db = lmdb.open(path, subdir=False, map_size=1 << 30, readonly=False,
                       meminit=False, map_async=True)
        with db.begin(write=True) as txn:
            for idx in range(n):
                label = idx % 10
                img = (rng.randint(0, 40, size=(28, 28)) + 20 * label).astype(np.uint8)
                txn.put(u'{:08}'.format(idx).encode('ascii'), dumps([img, label]))
            keys = [u'{:08}'.format(k).encode('ascii') for k in range(n)]
            txn.put(b'__keys__', dumps(keys))
        db.sync()
        db.close()
        return 0
    if cmd == 'jpeglmdb':   # the Efficient DataFlow tutorial's ILSVRC12 LMDB
        import lmdb
        fmt, path, d, kind = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
        dumps = dumps_fn(fmt)
        names = sorted(f for f in os.listdir(d) if f.endswith('.jpg'))
        db = lmdb.open(path, subdir=False, map_size=1 << 30, readonly=False,
                       meminit=False, map_async=True)
        with db.begin(write=True) as txn:
            for idx, name in enumerate(names):
                with open(os.path.join(d, name), 'rb') as f:
                    jpeg = f.read()
                if kind == 'array':   # BinaryILSVRC12: uint8 array of the bytes
                    jpeg = np.asarray(bytearray(jpeg), dtype='uint8')
                label = int(name.split('.')[0])   # the file's number
                txn.put(u'{:08}'.format(idx).encode('ascii'), dumps([jpeg, label]))
            keys = [u'{:08}'.format(k).encode('ascii') for k in range(len(names))]
            txn.put(b'__keys__', dumps(keys))
        db.sync()
        db.close()
        return 0
    if cmd == 'readlmdb':   # LMDBData(path, shuffle=False) + loads
        import lmdb
        path, out = sys.argv[2], sys.argv[3]
        db = lmdb.open(path, subdir=os.path.isdir(path), readonly=True, lock=False,
                       readahead=True, map_size=1 << 30, max_readers=100)
        with db.begin() as txn, open(out + '.tmp', 'w') as f:
            raw = txn.get(b'__keys__')
            if raw[:1] == b'\x80':
                keys = pickle.loads(raw)
            else:
                import msgpack
                keys = msgpack.loads(raw, raw=False)
            n = txn.stat()['entries'] - 1
            assert keys == [u'{:08}'.format(k).encode('ascii') for k in range(n)], keys[:3]
            for k, v in txn.cursor():
                if k == b'__keys__':
                    continue
                if v[:1] == b'\x80':
                    dp = pickle.loads(v)
                else:
                    import msgpack
                    import msgpack_numpy
                    msgpack_numpy.patch()
                    dp = msgpack.loads(v, raw=False)
                f.write(truth(dp) + '=\n')
        os.rename(out + '.tmp', out)
        return 0
    raise SystemExit('unknown command ' + cmd)


if __name__ == '__main__':
    sys.exit(main())
