#!/usr/bin/python3
"""tp_send.py: feed a towerpack trainer from Python, in towerpack's wire format.

tp-worker's Python twin, for data that Python makes: numpy and pyzmq only
(Debian's python3-numpy and python3-zmq), no tensorpack, no towerpack
library. Each datapoint is one ZeroMQ message: a header frame and one raw
frame per array (docs/wire-format.md), PUSHed to a receiver that binds
(`tp-train --remote @tcp://...`, ZMQInput, the spec source `remote:`).
Like tp-worker it reports its row twice a second, so tp-top and the
trainer's log show it (`tp_send.py 4121@host`), carries the job id of
the job handshake (--job, $TP_JOB), reads what the trainer takes (the
component handshake: a datapoint that does not fit ends it, naming both
sides, before it is sent), and ends when its trainer has been gone for
--exit-with-trainer seconds.

As a program it sends Fashion-MNIST batches as tp-train's zoo models take
them ([uint8 (B,28,28), int32 (B,)]):

    tools/tp-worker/tp_send.py --connect ipc:///tmp/train.sock --batch 64

As a module, your own arrays:

    from tp_send import Sender
    with Sender('tcp://trainer:5550', job='run7') as s:
        for x, y in my_batches():
            s.send([x, y])            # numpy arrays, any of the dtypes below
"""
import argparse
import gzip
import os
import signal
import socket
import struct
import sys
import time

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

# towerpack's tp_dtype_t (include/towerpack/tensor.h)
DTYPES = {np.dtype(np.uint8): 0, np.dtype(np.int32): 1, np.dtype(np.int64): 2,
          np.dtype(np.float16): 3, np.dtype(np.float32): 5, np.dtype(np.float64): 6}
WIRE_MAGIC, WIRE_VERSION = 0x31575054, 1     # "TPW1"
CTL_MAGIC, CTL_ERROR, CTL_PAD, CTL_REPORT = 0x314C4354, 2, 4, 6   # "TCL1", control frames
RUNNING, DONE = 1, 3                         # tp_actor_state_t
JOB_PROPERTY = b"X-Tp-Job"
COMPS_PROPERTY = b"X-Tp-Comps"
SENDER_PROPERTY = b"X-Tp-Sender"  # who it is: its first report's text
DTYPE_NAMES = ["uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


def parse_comps(text):
    """The receiver's components ("image:uint8[64,28,28];label:int32[*]{0..9}",
    docs/wire-format.md) as [(name, dtype name, shape with None for '*',
    (lo, hi) or None)]; None when malformed."""
    out = []
    try:
        for part in text.split(";") if text else []:
            name, _, rest = part.partition(":")
            dt, _, dims = rest.partition("[")
            dims, close, values = dims.partition("]")
            if dt not in DTYPE_NAMES or not close:
                return None
            rng = None
            if values:  # the values an integer component takes, "{LO..HI}"
                if not (values.startswith("{") and values.endswith("}")) or \
                        dt not in ("uint8", "int32", "int64"):
                    return None
                lo, sep, hi = values[1:-1].partition("..")
                rng = (int(lo), int(hi))
                if not sep or rng[1] < rng[0]:
                    return None
            shape = [None if d == "*" else int(d) for d in dims.split(",")] if dims else []
            out.append((name, dt, shape, rng))
    except ValueError:
        return None
    return out


def _describe(dt, shape, rng=None):
    return "%s[%s]%s" % (dt, ",".join("*" if d is None else str(d) for d in shape),
                         "{%d..%d}" % rng if rng else "")


def check_comps(want, arrays):
    """None when the arrays fit the receiver's components `want`; else the
    mismatch in the words tp_wire_comps_check uses."""
    have = [(np.dtype(a.dtype.str.replace(">", "<")), tuple(a.shape)) for a in arrays]
    names = [DTYPE_NAMES[DTYPES[d]] if d in DTYPES else str(d) for d, _ in have]
    if len(have) != len(want):
        return "%d component%s (%s), expected %d: %s" % (
            len(have), "" if len(have) == 1 else "s",
            ", ".join(_describe(n, s) for n, (_, s) in zip(names, have)), len(want),
            ", ".join("%s %s" % (w[0] or "?", _describe(w[1], w[2], w[3])) for w in want))
    for i, ((name, dt, shape, rng), n, (_, s)) in enumerate(zip(want, names, have)):
        if n != dt or len(s) != len(shape) or any(
                d is not None and d != x for d, x in zip(shape, s)):
            return "component %d '%s' is %s, expected %s" % (
                i, name or "?", _describe(n, s), _describe(dt, shape, rng))
    # then the values, once every shape fits (a label out of the classes)
    for i, ((name, dt, shape, rng), a) in enumerate(zip(want, arrays)):
        if rng is None or a.size == 0:
            continue
        bad = np.flatnonzero((a < rng[0]) | (a > rng[1]))
        if bad.size:
            at = np.unravel_index(bad[0], a.shape)
            return "component %d '%s' has value %d%s, expected %d..%d" % (
                i, name or "?", a.flat[bad[0]],
                " at [%s]" % ",".join(map(str, at)) if a.ndim else "", rng[0], rng[1])
    return None


def encode(arrays):
    """The frames of one datapoint: header, then each array's bytes (C order,
    little-endian). Raises ValueError for a dtype the wire has no code for."""
    hdr = [struct.pack("<IBBH", WIRE_MAGIC, WIRE_VERSION, 0, len(arrays))]
    frames = []
    for a in arrays:
        a = np.ascontiguousarray(a)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        code = DTYPES.get(np.dtype(a.dtype.str.replace(">", "<")))
        if code is None or a.ndim > 8:
            raise ValueError("tp_send: %s[%s] cannot travel (dtypes: uint8, int32, int64, "
                             "float16, float32, float64; at most 8 dims)"
                             % (a.dtype, ",".join(map(str, a.shape))))
        # u8 dtype, u8 ndim, u8 codec (none), u8 0, u32 crc (none), u64 raw, u64 wire
        hdr.append(struct.pack("<BBBBIQQ", code, a.ndim, 0, 0, 0, a.nbytes, a.nbytes))
        hdr.append(struct.pack("<%dq" % a.ndim, *a.shape))
        frames.append(memoryview(a).cast("B") if a.nbytes else b"")
    return [b"".join(hdr)] + frames


def probe_job(endpoint, timeout=2.0):
    """The job id of the receiver bound at endpoint, "" when it has none,
    None when it cannot tell (probe below)."""
    props = probe(endpoint, timeout)
    return None if props is None else props.get(JOB_PROPERTY.lower(), b"").decode(
        "ascii", "replace")


def probe(endpoint, timeout=2.0):
    """The properties of the receiver bound at endpoint (tcp://HOST:PORT or
    ipc://PATH) as {lower-case name: value bytes}: a ZMTP 3.0 handshake as a
    PUSH with the NULL mechanism, the receiver's READY read, the connection
    closed (tp_wire_probe_peer in C; a PUSH socket never sees the peer's
    properties). None when it cannot tell (another mechanism, no answer)."""
    try:
        if endpoint.startswith("ipc://"):
            path = endpoint[6:]
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            addr = "\0" + path[1:] if path.startswith("@") else path
        elif endpoint.startswith("tcp://"):
            host, _, port = endpoint[6:].rpartition(":")
            host = host.strip("[]")
            fam, kind, proto, _, addr = socket.getaddrinfo(host, int(port),
                                                           type=socket.SOCK_STREAM)[0]
            s = socket.socket(fam, kind, proto)
        else:
            return None
        s.settimeout(timeout)
        with s:
            s.connect(addr)
            s.sendall(b"\xff" + bytes(7) + b"\x01\x7f\x03\x00" + b"NULL".ljust(20, b"\0") +
                      bytes(32))
            greeting = _recv_all(s, 64)
            if greeting[0] != 0xFF or greeting[9] != 0x7F or greeting[12:17] != b"NULL\0":
                return None
            ready = b"\x05READY\x0bSocket-Type" + struct.pack(">I", 4) + b"PUSH"
            s.sendall(bytes([0x04, len(ready)]) + ready)
            for _ in range(4):
                flags, size = _recv_all(s, 2)
                if flags & 0x02:
                    size = struct.unpack(">Q", bytes([size]) + _recv_all(s, 7))[0]
                body = _recv_all(s, size) if size <= 8192 else None
                if body is None:
                    return None
                if flags & 0x04 and body[:6] == b"\x05READY":
                    p, props = 6, {}
                    while p < len(body):
                        nl = body[p]
                        name = body[p + 1:p + 1 + nl]
                        vl = struct.unpack(">I", body[p + 1 + nl:p + 5 + nl])[0]
                        props[name.lower()] = body[p + 5 + nl:p + 5 + nl + vl]
                        p += 5 + nl + vl
                    return props
    except (OSError, ValueError, IndexError, struct.error):
        return None
    return None


def _recv_all(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise OSError("closed in the handshake")
        buf += chunk
    return buf


def _host():
    h = "".join(c for c in socket.gethostname() if 0x21 <= ord(c) <= 0x7e) or "localhost"
    return h[:31]


class RefusedError(RuntimeError):
    """The receiver belongs to another job (the job handshake), or does not
    take these datapoints (the component handshake)."""


class Sender:
    """A PUSH socket to `endpoint` that sends datapoints in the wire format.
    send() waits while the receiver is full; it raises TimeoutError once no
    receiver has been connected for `exit_with_trainer` seconds (after one
    was; 0: never), RefusedError when a connecting sender with a job finds
    a receiver of another job, or a datapoint that its receiver does not
    take (nothing of it sent), and KeyboardInterrupt on SIGINT as usual. A
    connecting sender's first datapoint waits for the first handshake."""

    def __init__(self, endpoint, bind=False, hwm=50, job=None, name="tp_send.py",
                 exit_with_trainer=10.0):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.SNDHWM, hwm)
        self.sock.setsockopt(zmq.LINGER, 2000)
        if job:  # the job handshake: the trainer refuses another job's sender
            self.sock.setsockopt(zmq.METADATA, JOB_PROPERTY + b":" + job.encode())
        self.pid, self.host = os.getpid(), _host()
        self.name = ("%.24s %d@%s" % (name, self.pid, self.host))[:47]
        self.start = time.monotonic_ns()
        self.blocked_ns, self.msgs, self.bytes, self.reported = 0, 0, 0, 0
        # who it is, in the handshake of every connection: the receiver names
        # it from its first message on (a refused one too), before its report
        self.where = self._where(endpoint, bind)
        self.sock.setsockopt(zmq.METADATA, SENDER_PROPERTY + b":" +
                             self._report_text(RUNNING, self.start).encode())
        self.mon = self.sock.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        (self.sock.bind if bind else self.sock.connect)(endpoint)
        self.endpoint = endpoint
        self.job, self.bind = job, bind
        # where it is, for the receiver's log and tp-top: '>' the endpoint it
        # connected to, '@' the one it bound (a wildcard's port resolved)
        if bind:
            self.where = self._where(self.sock.getsockopt(zmq.LAST_ENDPOINT).decode(), bind)
        self.gone_s = exit_with_trainer
        self.connected, self.ever, self.none_since = 0, False, time.monotonic()
        self.want, self.want_text = None, ""  # the receiver's components
        self._report(RUNNING)

    @staticmethod
    def _where(addr, bind):
        return ("@" if bind else ">") + "".join(
            c if " " <= c <= "~" else "?" for c in addr)[:126]

    def _report_text(self, state, now):
        alive = now - self.start
        return "%d\t%s\t%s\t%d\t%d\t%d\t%d\t0\t%d\t%d\t%s" % (
            self.pid, self.host, self.name, state, alive, max(0, alive - self.blocked_ns),
            self.blocked_ns, self.msgs, self.bytes, self.where)

    def _events(self):
        while self.mon.poll(0):
            ev = recv_monitor_message(self.mon)["event"]
            if ev == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.connected += 1
                self.ever = True
                self.reported = 0  # a new receiver hears who this is soon
                props = probe(self.endpoint) if not self.bind else None
                theirs = props.get(JOB_PROPERTY.lower(), b"").decode("ascii", "replace") \
                    if props is not None else None
                text = props.get(COMPS_PROPERTY.lower(), b"").decode("ascii", "replace") \
                    if props is not None else ""
                self.want = parse_comps(text) or None
                self.want_text = text if self.want else ""
                if self.job and theirs and theirs != self.job:
                    raise RefusedError(
                        "tp_send: refused by the receiver at %s: it is job '%s', this "
                        "sender was started for job '%s' (a sender of another job, or one "
                        "left from an earlier run)" % (self.endpoint, theirs, self.job))
            elif ev == zmq.EVENT_DISCONNECTED:
                self.connected = max(0, self.connected - 1)
                if self.connected == 0:
                    self.none_since = time.monotonic()

    def _report(self, state, force=True):
        """This sender's row (control frame 6), never waited for."""
        now = time.monotonic_ns()
        if not force and now - self.reported < 500_000_000:
            return
        text = self._report_text(state, now)
        try:
            self.sock.send(struct.pack("<IB3xI", CTL_MAGIC, CTL_REPORT, 0) + text.encode(),
                           zmq.NOBLOCK)
            self.reported = now
        except zmq.Again:
            pass

    def send(self, arrays):
        frames = encode(arrays)
        size = sum(len(f) for f in frames)
        while not self.bind and not self.ever:  # what the receiver takes, first
            self._events()
            if not self.ever:
                t0 = time.monotonic_ns()
                self.mon.poll(100)
                self.blocked_ns += time.monotonic_ns() - t0
        why = check_comps(self.want, [np.asarray(a) for a in arrays]) if self.want else None
        if why:
            try:  # the receiver's log names this sender and why it ends
                self.sock.send(struct.pack("<IB3xI", CTL_MAGIC, CTL_ERROR, 0) + why.encode(),
                               zmq.NOBLOCK)
            except zmq.Again:
                pass
            raise RefusedError(
                "tp_send: the receiver at %s does not take this sender's datapoints: %s "
                "(it takes %s: its model's inputs)" % (self.endpoint, why, self.want_text))
        while True:
            self._events()
            if (self.gone_s > 0 and self.ever and self.connected == 0 and
                    time.monotonic() - self.none_since >= self.gone_s):
                raise TimeoutError("tp_send: the receiver at %s has been gone for %g s"
                                   % (self.endpoint, self.gone_s))
            if self.sock.poll(0, zmq.POLLOUT):
                self._report(RUNNING, force=False)
                self.sock.send_multipart(frames, copy=False)
                break
            t0 = time.monotonic_ns()
            self.sock.poll(100, zmq.POLLOUT)
            self.blocked_ns += time.monotonic_ns() - t0
        self.msgs += 1
        self.bytes += size

    def close(self):
        """Say it is done and flush (the padding frame is what libzmq may
        cut from a closing connection, not the last datapoints)."""
        self._report(DONE)
        try:
            self.sock.send(struct.pack("<IB3xI", CTL_MAGIC, CTL_PAD, 0) + bytes(256 * 1024),
                           zmq.NOBLOCK)
        except zmq.Again:
            pass
        self.sock.disable_monitor()
        self.mon.close()
        self.sock.close()
        self.ctx.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def fashion_mnist(split, root="/usr/share/datasets/fashion-mnist"):
    """Images uint8 (N,28,28) and labels int32 (N,) of Debian's
    dataset-fashion-mnist."""
    prefix = "train" if split == "train" else "t10k"
    with gzip.open(os.path.join(root, "%s-images-idx3-ubyte.gz" % prefix)) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)
    with gzip.open(os.path.join(root, "%s-labels-idx1-ubyte.gz" % prefix)) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int32)
    return x, y


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--connect", metavar="ENDPOINT", help="a receiver that binds")
    g.add_argument("--bind", metavar="ENDPOINT", help="bind; receivers connect")
    p.add_argument("--batch", type=int, default=64, help="datapoints a batch (64)")
    p.add_argument("--split", default="train", choices=["train", "test"])
    p.add_argument("--count", type=int, default=0, help="batches to send (0: endless)")
    p.add_argument("--seed", type=int, default=0, help="shuffle seed (each pass)")
    p.add_argument("--hwm", type=int, default=50)
    p.add_argument("--job", default=os.environ.get("TP_JOB") or None,
                   help="the job id (default $TP_JOB)")
    p.add_argument("--exit-with-trainer", type=float, default=10.0, metavar="S",
                   help="end once the trainer has been gone S seconds (0: never)")
    a = p.parse_args(argv)
    if a.batch <= 0:
        p.error("--batch must be positive")
    x, y = fashion_mnist(a.split)
    rng = np.random.default_rng(a.seed)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    s = Sender(a.connect or a.bind, bind=bool(a.bind), hwm=a.hwm, job=a.job,
               exit_with_trainer=a.exit_with_trainer)
    code = 0
    try:
        while not a.count or s.msgs < a.count:
            order = rng.permutation(len(x))
            for k in range(0, len(order) - a.batch + 1, a.batch):
                idx = order[k:k + a.batch]
                s.send([x[idx], y[idx]])
                if a.count and s.msgs >= a.count:
                    break
    except TimeoutError as e:
        print("%s (--exit-with-trainer): ending after %d batches" % (e, s.msgs),
              file=sys.stderr)
    except RefusedError as e:
        print(e, file=sys.stderr)
        s.sock.setsockopt(zmq.LINGER, 500)  # its report still tells the receiver
        code = 1
    except KeyboardInterrupt:
        code = 0
    finally:
        s.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
