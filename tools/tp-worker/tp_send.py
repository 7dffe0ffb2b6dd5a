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
--exit-with-trainer seconds. A handshake that fails is read as tp-worker
reads it (docs/distributed.md, "When a trainer, or its host, goes"): a
trainer that stopped, or whose host answers no connect, is gone and the
next one waited for; one that lets the handshake run out is not answering
(waited for, said once); three closed in a row by a host still there are
a refusal. Nobody at all at a --connect endpoint is said after 10 s, and
waited for, or ends it after --connect-timeout seconds (NoReceiverError
for a module user's connect_timeout); a --bind sender that no receiver has
connected to is said after 10 s too, and waits on. $TP_SEND_HANDSHAKE_S sets libzmq's handshake interval (30 s),
$TP_LOG_LEVEL what the program logs (info).

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
import errno
import gzip
import logging
import os
import select
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
HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL |
                    zmq.EVENT_HANDSHAKE_FAILED_AUTH)
# What a connect of its own says of a receiver's endpoint after a failed
# handshake (df_remote.c's s_peer_t): cannot tell; a receiver listens there;
# nobody listens (refused; ipc: the path gone); tcp: the host answers no
# connect (died, left the network).
PEER_UNKNOWN, PEER_THERE, PEER_NOBODY, PEER_SILENT = range(4)
# How long the tcp check waits for its connects: Linux sends a lost SYN again
# after a second, so one lost packet is still an answer. A live host's
# kernel answers however slow or stopped its receiver is.
PROBE_S, PROBE_ADDRS = 1.5, 8
RESOLVE_RETRY_S = 60.0  # a name that did not resolve is looked up again after this
# A tcp connection with data in flight and no ACK for this long, sent again
# (or two window probes unanswered), has a receiver's host that died.
DEAD_ACK_MS = 20000
# Nobody at a connecting sender's endpoint (no receiver met, no connection
# up) this long since it started: said (a warning, tp-worker's words), then
# every NO_RECEIVER_AGAIN_S. It goes on waiting (a sender may start before
# its trainer) unless it was given a connect_timeout.
NO_RECEIVER_NOTE_S, NO_RECEIVER_AGAIN_S = 10.0, 60.0
log = logging.getLogger("tp_send")


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


def probe(endpoint, timeout=2.0, addrs=None):
    """The properties of the receiver bound at endpoint (tcp://HOST:PORT or
    ipc://PATH) as {lower-case name: value bytes}: a ZMTP 3.0 handshake as a
    PUSH with the NULL mechanism, the receiver's READY read, the connection
    closed (tp_wire_probe_peer in C; a PUSH socket never sees the peer's
    properties). None when it cannot tell (another mechanism, no answer).
    addrs: a tcp endpoint's getaddrinfo result, kept by the caller (a
    Sender looks its receiver up once); None looks the name up here."""
    try:
        if endpoint.startswith("ipc://"):
            path = endpoint[6:]
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            addr = "\0" + path[1:] if path.startswith("@") else path
        elif endpoint.startswith("tcp://"):
            if not addrs:
                host, _, port = endpoint[6:].rpartition(":")
                addrs = socket.getaddrinfo(host.strip("[]"), int(port),
                                           type=socket.SOCK_STREAM)
            fam, kind, proto, _, addr = addrs[0]
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


def handshake_ran_out(value):
    """Whether a handshake that failed without a reason (libzmq's
    EVENT_HANDSHAKE_FAILED_NO_DETAIL, whose value is the errno of that
    moment) ran out, libzmq's handshake interval, rather than being closed:
    a close fails in libzmq's read (EPIPE, its word for a read of nothing,
    or the read's own error); the interval's timer leaves whatever its I/O
    thread last had (EAGAIN, EINPROGRESS), never a read's error."""
    return value not in (errno.EPIPE, errno.ECONNRESET, errno.ECONNABORTED, errno.ETIMEDOUT,
                         errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETDOWN,
                         errno.ENOTCONN)


def handshake_why(event, value):
    """What a failed handshake means, for the message that ends the sender
    (tp_send.py has no CURVE keys)."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return "the receiver refused this sender's key"
    if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        return ("the receiver uses CURVE: it requires CURVE keys, which tp_send.py does not "
                "have (tp-worker --curve DIR has them)")
    if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and handshake_ran_out(value):
        return ("it did not answer the handshake in libzmq's handshake interval (a peer "
                "stopped or overloaded, or not a towerpack one)")
    return ("the receiver closed the connection in the handshake: it requires CURVE keys "
            "(tp_send.py has none: tp-worker --curve DIR), or it is not a towerpack receiver")


def _tcp_answer(err):
    """One address's answer to a connect, from its errno (0: accepted)."""
    if err == 0:
        return PEER_THERE
    if err in (errno.ECONNREFUSED, errno.EADDRNOTAVAIL, errno.ENETUNREACH):
        return PEER_NOBODY
    if err in (errno.EHOSTUNREACH, errno.ETIMEDOUT):  # no ARP answer; no SYN-ACK
        return PEER_SILENT
    return PEER_UNKNOWN


def peer_state(endpoint, addrs=None, timeout=PROBE_S):
    """What listens at a receiver's endpoint now, one of PEER_*: on ipc a
    connect of its own (refused or the path gone: nobody; a full backlog is
    someone); on tcp connects to every address of `addrs` (getaddrinfo's
    tuples) at once, `timeout` seconds in all: a receiver there when one is
    accepted, else cannot tell when one failed otherwise, else silent when
    one got no answer, else nobody (every address refused)."""
    if endpoint.startswith("ipc://"):
        path = endpoint[6:]
        if not path:
            return PEER_UNKNOWN
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.setblocking(False)
            err = s.connect_ex("\0" + path[1:] if path.startswith("@") else path)
        if err in (0, errno.EAGAIN):
            return PEER_THERE
        return PEER_NOBODY if err in (errno.ECONNREFUSED, errno.ENOENT) else PEER_UNKNOWN
    if not addrs:
        return PEER_UNKNOWN
    answers, pending = set(), {}
    try:
        for n, (fam, kind, proto, _, addr) in enumerate(addrs):
            if n == PROBE_ADDRS:  # more addresses than it waits on
                answers.add(PEER_UNKNOWN)
                break
            s = socket.socket(fam, kind, proto)
            s.setblocking(False)
            err = s.connect_ex(addr)
            if err == errno.EINPROGRESS:
                pending[s.fileno()] = s
                continue
            s.close()
            answers.add(_tcp_answer(err))
            if PEER_THERE in answers:
                return PEER_THERE
        poller = select.poll()
        for fd in pending:
            poller.register(fd, select.POLLOUT)
        deadline = time.monotonic() + timeout
        while pending and PEER_THERE not in answers:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for fd, _ in poller.poll(left * 1000):
                s = pending.pop(fd)
                poller.unregister(fd)
                answers.add(_tcp_answer(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)))
                s.close()
        if pending:  # no answer in time
            answers.add(PEER_SILENT)
    except OSError:
        return PEER_UNKNOWN
    finally:
        for s in pending.values():
            s.close()
    for p in (PEER_THERE, PEER_UNKNOWN, PEER_SILENT):
        if p in answers:
            return p
    return PEER_NOBODY if answers else PEER_UNKNOWN


def handshake_ivl():
    """libzmq's handshake interval in ms for $TP_SEND_HANDSHAKE_S (seconds),
    None when unset; ValueError naming it when it is not 0.001 to 3600."""
    env = os.environ.get("TP_SEND_HANDSHAKE_S")
    if env is None:
        return None
    try:
        v = float(env)
    except ValueError:
        v = None
    if v is None or not 0.001 <= v <= 3600:
        raise ValueError("tp_send: TP_SEND_HANDSHAKE_S='%s' is not a number of seconds from "
                         "0.001 to 3600" % env)
    return int(v * 1000 + 0.5)


class RefusedError(RuntimeError):
    """The receiver belongs to another job (the job handshake), does not
    take these datapoints (the component handshake), or refused the
    connection's handshake (three closed in a row by a host still there:
    it wants CURVE keys, or it is no towerpack receiver)."""


class NoReceiverError(TimeoutError):
    """A connecting sender given a connect_timeout found no receiver at
    its endpoint in that time (nothing there took the connection: a trainer
    not started, or a wrong address)."""


class Sender:
    """A PUSH socket to `endpoint` that sends datapoints in the wire format.
    send() waits while the receiver is full; it raises TimeoutError once no
    receiver has been connected for `exit_with_trainer` seconds (after one
    was, or was met in a handshake that failed; 0: never), RefusedError
    when a connecting sender with a job finds a receiver of another job, a
    receiver refuses its handshake, or a datapoint that its receiver does
    not take (nothing of it sent), and KeyboardInterrupt on SIGINT as
    usual. A connecting sender's first datapoint waits for the first
    handshake: with nobody at the endpoint it says so after
    NO_RECEIVER_NOTE_S seconds (a warning) and waits on, or raises
    NoReceiverError (a TimeoutError) once `connect_timeout` seconds have
    passed since it started (None: it waits for ever). What it learns of
    its receivers goes to the "tp_send" logger (nobody there, a receiver
    gone, or not answering). ValueError for a bad $TP_SEND_HANDSHAKE_S or
    connect_timeout, or an endpoint it cannot bind or connect (naming
    it)."""

    def __init__(self, endpoint, bind=False, hwm=50, job=None, name="tp_send.py",
                 exit_with_trainer=10.0, connect_timeout=None):
        if connect_timeout is not None and not connect_timeout > 0:
            raise ValueError("tp_send: connect_timeout %r is not a number of seconds > 0 "
                             "(None waits for ever)" % (connect_timeout,))
        ivl = handshake_ivl()  # before anything that would need closing
        if not endpoint.startswith(("tcp://", "ipc://")):
            raise ValueError("tp_send: endpoint '%s' is not tcp://HOST:PORT or ipc://PATH"
                             % endpoint)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.SNDHWM, hwm)
        self.sock.setsockopt(zmq.LINGER, 2000)
        if ivl is not None:
            self.sock.setsockopt(zmq.HANDSHAKE_IVL, ivl)
        self.handshake_s = self.sock.getsockopt(zmq.HANDSHAKE_IVL) / 1000
        if endpoint.startswith("tcp://"):
            # ZMTP heartbeats: a receiver whose host died (no close ever
            # comes) is a closed connection after 10 s
            self.sock.setsockopt(zmq.HEARTBEAT_IVL, 2000)
            self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 10000)
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
            zmq.EVENT_CONNECTED | zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED |
            zmq.EVENT_HANDSHAKE_SUCCEEDED | HANDSHAKE_FAILED)
        try:
            (self.sock.bind if bind else self.sock.connect)(endpoint)
        except zmq.ZMQError as e:  # libzmq's words, with what it was doing
            self.sock.disable_monitor()
            self.mon.close()
            self.sock.close(linger=0)
            self.ctx.term()
            raise ValueError("tp_send: %s %s: %s" % ("bind" if bind else "connect",
                                                     endpoint, e)) from None
        self.endpoint = endpoint
        self.job, self.bind = job, bind
        # where it is, for the receiver's log and tp-top: '>' the endpoint it
        # connected to, '@' the one it bound (a wildcard's port resolved)
        if bind:
            self.where = self._where(self.sock.getsockopt(zmq.LAST_ENDPOINT).decode(), bind)
        self.gone_s = exit_with_trainer
        # connections open (by descriptor, from their connect or accept to
        # their close, handshake or not), whether a handshake ever succeeded,
        # since when none is open
        self.conns, self.ever, self.none_since = set(), False, time.monotonic()
        # a receiver met in a handshake that failed (a trainer that stopped):
        # --exit-with-trainer counts its absence as after one connected
        self.met = False
        # handshakes in a row (a success resets) closed, of those closed by a
        # receiver still there, and run out on a receiver still there
        self.closed_in_row = self.refused_in_row = self.ran_out_in_row = 0
        self.addrs, self.resolved = None, None  # a tcp receiver's, looked up once
        self.checked = 0.0  # the last look for dead hosts
        self.want, self.want_text = None, ""  # the receiver's components
        # nobody at the endpoint: when it is said next, when it ends
        self.note_s, self.connect_timeout = NO_RECEIVER_NOTE_S, connect_timeout
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

    @property
    def connected(self):
        """Connections open now (in their handshake or past it)."""
        return len(self.conns)

    def _addrs(self):
        """A tcp receiver's addresses, looked up the first time they are
        needed and kept (a lookup blocks for as long as the resolver takes);
        a name that did not resolve is tried again at most once a minute."""
        if self.addrs is not None or not self.endpoint.startswith("tcp://"):
            return self.addrs
        now = time.monotonic()
        if self.resolved is not None and now - self.resolved < RESOLVE_RETRY_S:
            return None
        self.resolved = now
        host, _, port = self.endpoint[6:].rpartition(":")
        try:
            self.addrs = socket.getaddrinfo(host.strip("[]"), int(port),
                                            type=socket.SOCK_STREAM)
        except (OSError, ValueError) as e:
            log.debug("tp_send: cannot look up %s (%s): a failed handshake's cause is not "
                      "checked for a minute", self.endpoint, e)
        return self.addrs

    def _closed_is_refusal(self, ran_out):
        """A connecting sender's handshake that failed, no reason given: the
        receiver closed it, or the handshake interval ran out (df_remote.c's
        s_sender_closed_is_refusal). A receiver was there: from now its
        absence counts for --exit-with-trainer. Nobody listening any more,
        or a host that answers no connect, is a receiver gone: waited for.
        A live host that lets it run out is a receiver not answering (a
        trainer stopped or overloaded): said once, waited for however long.
        Three closed in a row by a receiver still there, or five however
        explained, are a refusal: True."""
        self.met = True
        if not ran_out:
            self.closed_in_row += 1
        p = peer_state(self.endpoint, self._addrs()) \
            if ran_out or self.closed_in_row < 5 else PEER_UNKNOWN
        self.none_since = time.monotonic()  # from the verdict
        if p in (PEER_NOBODY, PEER_SILENT):
            self.refused_in_row = self.ran_out_in_row = 0
            if p == PEER_NOBODY:
                log.info("tp_send: the receiver at %s %s in the handshake and is gone (a "
                         "trainer that stopped): waiting for the next", self.endpoint,
                         "did not answer" if ran_out else "closed the connection")
            else:
                log.info("tp_send: the handshake with the receiver at %s failed and its host "
                         "does not answer a connect (%.1f s): the receiver is gone (a host "
                         "that died or left the network): waiting for the next",
                         self.endpoint, PROBE_S)
            return False
        if ran_out:
            self.ran_out_in_row += 1
            if self.ran_out_in_row == 1:
                log.warning("tp_send: the receiver at %s is not answering the handshake "
                            "(%.1f s: a trainer stopped or overloaded, or not a towerpack "
                            "receiver): waiting for it", self.endpoint, self.handshake_s)
            elif self.ran_out_in_row % 10 == 0:
                log.info("tp_send: the receiver at %s is still not answering the handshake "
                         "(%d in a row): waiting for it", self.endpoint, self.ran_out_in_row)
            return False
        self.refused_in_row += 1
        if self.closed_in_row < 5 and self.refused_in_row < 3:
            log.debug("tp_send: the receiver at %s closed the connection in the handshake "
                      "(%d in a row): trying again", self.endpoint, self.refused_in_row)
            return False
        return True

    def _no_receiver(self):
        """A sender with no receiver since it started (a connecting one:
        none met, no connection up; a bound one: none has connected and
        shaken hands): said once NO_RECEIVER_NOTE_S have passed, then
        every NO_RECEIVER_AGAIN_S (df_remote.c's s_sender_await_receiver
        and s_send_blocking); a connecting one raises NoReceiverError past
        connect_timeout. ZeroMQ's connect is asynchronous and a bound
        socket with no peer just blocks: this is how nobody is told."""
        if self.met or self.conns or (self.bind and self.ever):
            return
        waited = (time.monotonic_ns() - self.start) * 1e-9
        if self.bind:
            what = ("is the trainer started, connecting to it with --remote %s, and is the "
                    "address right?" % self.endpoint)
            first = "tp_send: no receiver has connected to %s after %.0f s (%s): waiting for one"
            again = "tp_send: still no receiver connected to %s after %.0f s: waiting for one"
        else:
            what = ("nothing there takes the connection: is the trainer started, binding it "
                    "with --remote @%s, and is the address right?" % self.endpoint)
            first = "tp_send: no receiver at %s after %.0f s (%s): waiting for one"
            again = "tp_send: still no receiver at %s after %.0f s: waiting for one"
            if self.connect_timeout is not None and waited >= self.connect_timeout:
                raise NoReceiverError("tp_send: no receiver at %s after %g s (%s)"
                                      % (self.endpoint, self.connect_timeout, what))
        if waited < self.note_s:
            return
        if self.note_s == NO_RECEIVER_NOTE_S:
            log.warning(first, self.endpoint, waited, what)
        else:
            log.info(again, self.endpoint, waited)
        self.note_s = waited + NO_RECEIVER_AGAIN_S

    def _events(self):
        while self.mon.poll(0):
            msg = recv_monitor_message(self.mon)
            ev, value = msg["event"], msg["value"]
            if ev in (zmq.EVENT_CONNECTED, zmq.EVENT_ACCEPTED):
                self.conns.add(value)
            elif ev == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                if not self.ever:
                    log.info("tp_send: connected to a receiver at %s", self.endpoint)
                elif self.ran_out_in_row:
                    log.info("tp_send: the receiver at %s answered the handshake again (after "
                             "%d that ran out)", self.endpoint, self.ran_out_in_row)
                self.ever = True
                self.closed_in_row = self.refused_in_row = self.ran_out_in_row = 0
                self.reported = 0  # a new receiver hears who this is soon
                props = probe(self.endpoint, addrs=self._addrs()) if not self.bind else None
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
                self.conns.discard(value)
                if not self.conns:
                    self.none_since = time.monotonic()
            elif ev & HANDSHAKE_FAILED:
                log.debug("tp_send: a handshake at %s failed (event %d, value %d)",
                          self.endpoint, ev, value)
                if self.bind:  # anyone may knock on a bound socket
                    log.warning("tp_send: a receiver's handshake at %s failed: %s",
                                self.endpoint, handshake_why(ev, value))
                elif ev != zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL or \
                        self._closed_is_refusal(handshake_ran_out(value)):
                    raise RefusedError("tp_send: the handshake with the receiver at %s "
                                       "failed: %s" % (self.endpoint, handshake_why(ev, value)))

    def _dead_hosts(self):
        """A tcp connection whose receiver's host died, or left the network,
        with data on its way: nothing closes it, and the heartbeat cannot
        tell when full socket buffers hold its PING back; the kernel would
        take some 15 minutes (df_remote.c's s_sender_dead_hosts). What the
        kernel knows decides: data in flight sent again, or two window
        probes in a row unanswered, and no ACK for DEAD_ACK_MS; a live
        host ACKs whatever arrives however slow its trainer is. The
        connection (its descriptor from the monitor's events) is shut down
        under libzmq, which sees it closed and connects again."""
        for fd in list(self.conns):
            try:
                s = socket.socket(fileno=os.dup(fd))
            except OSError:
                continue  # gone meanwhile, or not a socket
            with s:
                try:
                    ti = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
                except OSError:
                    continue  # not tcp (ipc)
                if len(ti) < 60:
                    continue
                # struct tcp_info: u8 state, ca_state, retransmits, probes;
                # u32 unacked at 24, last_ack_recv (ms) at 56
                state, retransmits, probes = ti[0], ti[2], ti[3]
                unacked, = struct.unpack_from("<I", ti, 24)
                last_ack, = struct.unpack_from("<I", ti, 56)
                if state != 1 or not ((unacked and retransmits) or probes >= 2) or \
                        last_ack < DEAD_ACK_MS:  # 1: TCP_ESTABLISHED
                    continue
                log.info("tp_send: the receiver at %s has acknowledged nothing for %.1f s (%d "
                         "segments sent again, %d in flight, %d window probes unanswered): its "
                         "host died or left the network: closing the connection",
                         self.endpoint, last_ack * 1e-3, retransmits, unacked, probes)
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _check(self):
        """The connection events (and dead hosts, at most every 100 ms);
        TimeoutError once its receivers have been gone for
        exit_with_trainer seconds (after one was, or was met)."""
        self._events()
        now = time.monotonic()
        if now - self.checked >= 0.1:
            self.checked = now
            self._dead_hosts()
        if (self.gone_s > 0 and (self.ever or self.met) and not self.conns and
                time.monotonic() - self.none_since >= self.gone_s):
            raise TimeoutError("tp_send: the receiver at %s has been gone for %g s"
                               % (self.endpoint, self.gone_s))

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
            self._check()
            if not self.ever:
                self._no_receiver()
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
            self._check()
            if self.sock.poll(0, zmq.POLLOUT):
                self._report(RUNNING, force=False)
                self.sock.send_multipart(frames, copy=False)
                break
            if self.bind:  # nobody connected yet: said, not waited on in silence
                self._no_receiver()
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
    p.add_argument("--connect-timeout", type=float, default=0.0, metavar="S",
                   help="with --connect: end (exit 1) when no receiver is at the "
                   "endpoint after S seconds (0: wait for ever; it says so after 10 s)")
    a = p.parse_args(argv)
    if a.batch <= 0:
        p.error("--batch must be positive")
    if not a.connect_timeout >= 0:
        p.error("--connect-timeout must be 0 (wait for ever) or more seconds")
    # what it learns of its receivers, at tp-worker's level ($TP_LOG_LEVEL)
    level = os.environ.get("TP_LOG_LEVEL", "info").lower()
    logging.basicConfig(format="%(message)s", stream=sys.stderr, level={
        "debug": logging.DEBUG, "warn": logging.WARNING, "error": logging.ERROR,
        "off": logging.CRITICAL + 1}.get(level, logging.INFO))
    x, y = fashion_mnist(a.split)
    rng = np.random.default_rng(a.seed)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        s = Sender(a.connect or a.bind, bind=bool(a.bind), hwm=a.hwm, job=a.job,
                   exit_with_trainer=a.exit_with_trainer,
                   connect_timeout=a.connect_timeout or None)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 1
    code = 0
    try:
        while not a.count or s.msgs < a.count:
            order = rng.permutation(len(x))
            for k in range(0, len(order) - a.batch + 1, a.batch):
                idx = order[k:k + a.batch]
                s.send([x[idx], y[idx]])
                if a.count and s.msgs >= a.count:
                    break
    except NoReceiverError as e:
        print("%s (--connect-timeout)" % e, file=sys.stderr)
        code = 1
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
