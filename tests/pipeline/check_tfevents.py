#!/usr/bin/env python3
"""towerpack tests: read a run's TensorBoard event file as TensorBoard would.

  check_tfevents.py LOGDIR [--stats] [--hparams] [--partial-tail-ok] [--print=TAG]
                    [--images=TAG:N:PREFIX]

Compiles the schema (pipeline/callbacks/proto/*.proto) with protoc into a
temporary folder, reads every TFRecord of LOGDIR/events.out.tfevents.*,
checks both masked CRC32Cs of each record (crcmod's crc-32c, not towerpack's
code), parses each Event with Python's protobuf, and checks that the first
is file_version "brain.Event:2". With --stats, every scalar of every
stats.json record equals the last event of that tag at or before the
record's global_step (1e-6 relative: events hold float32), and the event
file has no tag stats.json lacks. With --hparams, a text summary "hparams"
is present. --partial-tail-ok: a file may end in one incomplete record (a
killed writer); a complete record with a bad CRC is an error all the same.
Every image summary must decode (PIL, not towerpack's codec) to its
stated height, width and colour space. With --images=TAG:N:PREFIX, tag TAG
has exactly N images, at increasing steps, and the k-th (from 1) has the
pixels of LOGDIR/PREFIX-k.png.

Exit status: 0 good, 1 bad (one line per problem), 77 cannot check here
(python3-protobuf, python3-crcmod or protoc missing).
"""
import glob
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

SKIP = 77


def skip(why):
    print("check_tfevents: SKIP: " + why)
    sys.exit(SKIP)


try:
    import crcmod.predefined
except ImportError:
    skip("python3-crcmod is not installed (apt-get install python3-crcmod)")
try:
    import google.protobuf  # noqa: F401
except ImportError:
    skip("python3-protobuf is not installed (apt-get install python3-protobuf)")
if not shutil.which("protoc"):
    skip("protoc is not installed (apt-get install protobuf-compiler)")

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "pipeline",
                                          "callbacks", "proto"))
crc32c = crcmod.predefined.mkCrcFun("crc-32c")


def masked(data):
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xffffffff) + 0xa282ead8) & 0xffffffff


def load_schema(tmp):
    subprocess.run(["protoc", "--proto_path=" + PROTO_DIR, "--python_out=" + tmp,
                    os.path.join(PROTO_DIR, "summary.proto"),
                    os.path.join(PROTO_DIR, "event.proto")], check=True)
    sys.path.insert(0, tmp)
    import event_pb2
    return event_pb2


def read_records(path, partial_ok, problems):
    """Every complete record's payload; a problem for each bad one."""
    data = open(path, "rb").read()
    out, off = [], 0
    while off < len(data):
        if len(data) - off < 12:
            tail = "%d trailing bytes (less than a header)" % (len(data) - off)
            if not partial_ok:
                problems.append("%s: %s" % (path, tail))
            break
        hdr = data[off:off + 8]
        (n,) = struct.unpack("<Q", hdr)
        (hcrc,) = struct.unpack("<I", data[off + 8:off + 12])
        if masked(hdr) != hcrc:
            problems.append("%s: record %d at byte %d: length CRC %08x, expected %08x"
                            % (path, len(out), off, hcrc, masked(hdr)))
            break
        if len(data) - off < 12 + n + 4:
            if not partial_ok:
                problems.append("%s: record %d at byte %d: %d bytes of %d"
                                % (path, len(out), off, len(data) - off, 16 + n))
            break
        payload = data[off + 12:off + 12 + n]
        (dcrc,) = struct.unpack("<I", data[off + 12 + n:off + 16 + n])
        if masked(payload) != dcrc:
            problems.append("%s: record %d at byte %d: data CRC %08x, expected %08x"
                            % (path, len(out), off, dcrc, masked(payload)))
            break
        out.append(payload)
        off += 16 + n
    return out


def close(a, b):
    if math.isnan(a) and math.isnan(b):
        return True
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b)) + 1e-30


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    logdir = argv[1]
    opts = set(argv[2:])
    files = sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*")))
    if not files:
        print("check_tfevents: no events.out.tfevents.* in %s" % logdir)
        return 1
    tmp = tempfile.mkdtemp(prefix="tp-tfevents-")
    try:
        event_pb2 = load_schema(tmp)
        problems = []
        scalars = {}  # tag -> [(step, value)] in file order
        hparams = None
        images = {}  # tag -> [(step, PIL image)]
        nrec = 0
        for path in files:
            recs = read_records(path, "--partial-tail-ok" in opts, problems)
            nrec += len(recs)
            for i, r in enumerate(recs):
                ev = event_pb2.Event()
                try:
                    ev.ParseFromString(r)
                except Exception as e:  # a DecodeError: say which record
                    problems.append("%s: record %d does not parse: %s" % (path, i, e))
                    continue
                if i == 0:
                    if ev.WhichOneof("what") != "file_version" or \
                            ev.file_version != "brain.Event:2":
                        problems.append("%s: first record is not file_version "
                                        "brain.Event:2: %s" % (path, ev))
                    continue
                if ev.WhichOneof("what") != "summary":
                    problems.append("%s: record %d is not a summary" % (path, i))
                    continue
                if not ev.wall_time > 1e9:
                    problems.append("%s: record %d: wall_time %r" % (path, i, ev.wall_time))
                for v in ev.summary.value:
                    kind = v.WhichOneof("value")
                    if kind == "simple_value":
                        scalars.setdefault(v.tag, []).append((ev.step, v.simple_value))
                    elif kind == "image":
                        im = v.image
                        try:
                            from PIL import Image
                            import io
                            pic = Image.open(io.BytesIO(im.encoded_image_string))
                            pic.load()
                        except Exception as e:
                            problems.append("%s: image %s does not decode: %s"
                                            % (path, v.tag, e))
                            continue
                        mode = {1: "L", 3: "RGB"}.get(im.colorspace)
                        if pic.size != (im.width, im.height) or pic.mode != mode:
                            problems.append("%s: image %s: %s %s, the summary says %dx%d "
                                            "colorspace %d" % (path, v.tag, pic.size, pic.mode,
                                                               im.width, im.height,
                                                               im.colorspace))
                        images.setdefault(v.tag, []).append((ev.step, pic))
                    elif kind == "tensor" and v.metadata.plugin_data.plugin_name == "text":
                        if v.tensor.dtype != 7 or len(v.tensor.string_val) != 1:
                            problems.append("%s: text summary %s is not one string"
                                            % (path, v.tag))
                        elif v.tag == "hparams":
                            hparams = v.tensor.string_val[0].decode()
                    else:
                        problems.append("%s: record %d: value %s of kind %s"
                                        % (path, i, v.tag, kind))
        for tag, pts in scalars.items():
            steps = [s for s, _ in pts]
            if steps != sorted(steps):
                problems.append("tag %s: steps go backwards: %s" % (tag, steps[:20]))
        if "--hparams" in opts and not hparams:
            problems.append("no text summary 'hparams'")
        if "--stats" in opts:
            stats = json.load(open(os.path.join(logdir, "stats.json")))
            keys = set()
            for rec in stats:
                gs = rec["global_step"]
                for k, want in rec.items():
                    if k in ("epoch_num", "global_step"):
                        continue
                    keys.add(k)
                    got = [v for s, v in scalars.get(k, []) if s <= gs]
                    if not got:
                        problems.append("epoch %s: %s=%r is not in the event file "
                                        "(at or before step %d)"
                                        % (rec["epoch_num"], k, want, gs))
                        continue
                    if want is None:  # NaN or Inf in JSON
                        if math.isfinite(got[-1]):
                            problems.append("epoch %s: %s: stats null, event %r"
                                            % (rec["epoch_num"], k, got[-1]))
                    elif not close(float(want), got[-1]):
                        problems.append("epoch %s: %s: stats %r, event %r (step <= %d)"
                                        % (rec["epoch_num"], k, want, got[-1], gs))
            extra = sorted(set(scalars) - keys)
            if extra:
                problems.append("tags in the event file but not in stats.json: %s"
                                % ", ".join(extra))
        for o in sorted(opts):
            if o.startswith("--images="):
                tag, n, prefix = o[len("--images="):].split(":")
                got = images.get(tag, [])
                if len(got) != int(n):
                    problems.append("tag %s: %d images, expected %s" % (tag, len(got), n))
                if [s for s, _ in got] != sorted(s for s, _ in got):
                    problems.append("tag %s: image steps go backwards" % tag)
                from PIL import Image
                for k, (step, pic) in enumerate(got, 1):
                    f = os.path.join(logdir, "%s-%d.png" % (prefix, k))
                    if not os.path.exists(f):
                        problems.append("tag %s: image %d: no %s" % (tag, k, f))
                    elif Image.open(f).tobytes() != pic.tobytes():
                        problems.append("tag %s: image %d (step %d) differs from %s"
                                        % (tag, k, step, f))
            if o.startswith("--print="):  # a tag's points, for a test to read
                tag = o[len("--print="):]
                print("check_tfevents: %s %s" % (tag, " ".join(
                    "%d=%.6g" % (s, v) for s, v in scalars.get(tag, []))))
        for p in problems:
            print("check_tfevents: " + p)
        if problems:
            return 1
        print("check_tfevents: OK: %d file(s), %d records, %d scalar events of %d tags%s"
              % (len(files), nrec, sum(len(v) for v in scalars.values()),
                 len(scalars), ", hparams" if hparams else ""))
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
