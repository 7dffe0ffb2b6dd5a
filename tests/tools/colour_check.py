#!/usr/bin/python3
"""towerpack tests: independent references for the colour image path
(tests/tools/test_proc_colour.c): the class order of an image folder
(torchvision's ImageFolder, or Python's sorted listing of its sub-folders
when torchvision is missing), the decoded and normalised pixels (PIL and
numpy), and an exported ONNX model run by OpenCV's DNN module.

  colour_check.py check                       exit 3 when a module is missing
  colour_check.py classes DIR                 the class names, one a line
  colour_check.py pixels DIR RAW H W MEAN STD compare RAW (float32 [N,3,H,W]
                                              from towerpack) with PIL + numpy
  colour_check.py onnx MODEL DIR JSONL H W    OpenCV's top-1 against
                                              tp-predict's (--output JSONL)
  colour_check.py meta CKPT H W NAMES         the safetensors header read by
                                              hand (the format's spec): the
                                              metadata says 3 channels, size
                                              HxW, the class names NAMES
                                              (comma-separated, label order)
"""
import json
import os
import sys


def need():
    try:
        import numpy  # noqa: F401
        import PIL  # noqa: F401
        import cv2  # noqa: F401
        import onnx  # noqa: F401
    except ImportError as e:
        print("missing %s" % e.name)
        sys.exit(3)


def classes(d):
    try:
        from torchvision.datasets.folder import find_classes
        names, _ = find_classes(d)
        src = "torchvision"
    except ImportError:
        names = sorted(e.name for e in os.scandir(d) if e.is_dir())
        src = "sorted(os.scandir)"
    sys.stderr.write("classes by %s\n" % src)
    return names


def files(d):
    """(path, label) in ImageFolder's order: classes sorted, files sorted."""
    out = []
    for i, c in enumerate(classes(d)):
        for root, dirs, fs in sorted(os.walk(os.path.join(d, c))):
            dirs.sort()
            for f in sorted(fs):
                if f.lower().endswith((".jpg", ".jpeg", ".png")):
                    out.append((os.path.join(root, f), i))
    return out


def pixels(d, raw, h, w, mean, std):
    import numpy as np
    from PIL import Image
    got = np.fromfile(raw, dtype=np.float32)
    fl = files(d)
    got = got.reshape(len(fl), 3, h, w)
    mean = np.array([float(x) for x in mean.split("/")], np.float32)
    std = np.array([float(x) for x in std.split("/")], np.float32)
    worst = {"png": 0.0, "jpg": 0.0}
    for k, (p, _) in enumerate(fl):
        im = np.asarray(Image.open(p).convert("RGB"), dtype=np.float32)
        assert im.shape == (h, w, 3), (p, im.shape)
        want = ((im - mean) / std).transpose(2, 0, 1)
        kind = "png" if p.endswith(".png") else "jpg"
        worst[kind] = max(worst[kind], float(np.abs(want - got[k]).max()))
    print("max |towerpack - PIL/numpy|: png %.3g, jpeg %.3g (one level is %.3g)"
          % (worst["png"], worst["jpg"], 1 / std.min()))
    # PNG is lossless: the same numbers; JPEG: both are libjpeg-turbo, but
    # PIL may use another IDCT or upsampling: one level at most
    return worst["png"] < 1e-5 and worst["jpg"] <= 1.01 / std.min()


def onnx_agree(model, d, jsonl, h, w):
    import cv2
    import numpy as np
    import onnx
    meta = {p.key: p.value for p in onnx.load(model).metadata_props}
    names = meta["classes"].split("\n")[:-1]
    assert names == classes(d), (names, classes(d))
    net = cv2.dnn.readNetFromONNX(model)
    preds = [json.loads(line) for line in open(jsonl)]
    fl = files(d)
    assert len(preds) == len(fl), (len(preds), len(fl))
    same = 0
    for (p, _), pr in zip(fl, preds):
        im = cv2.imread(p, cv2.IMREAD_COLOR)[:, :, ::-1]  # BGR -> RGB
        assert im.shape[:2] == (h, w), (p, im.shape)
        x = (im.astype(np.float32) / 255).transpose(2, 0, 1)[None].copy()
        net.setInput(x, "image")
        out = net.forward("logits")
        same += int(out.argmax()) == pr["classes"][0]
    print("OpenCV DNN top-1 equals tp-predict's on %d of %d images" % (same, len(fl)))
    return same >= 0.99 * len(fl)


def meta(ckpt, h, w, names):
    """The checkpoint's own record of its data, read as any safetensors
    reader would: an 8-byte little-endian length, a JSON header whose
    "__metadata__" maps strings to strings."""
    import struct
    with open(ckpt, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        m = json.loads(f.read(n)).get("__metadata__", {})
    names = names.split(",")
    got = {k: m.get(k) for k in ("channels", "size", "classes", "class_names", "colour")}
    print("metadata: %s" % json.dumps(got))
    ok = (m.get("channels") == "3" and m.get("size") == "%dx%d" % (h, w) and
          m.get("classes") == str(len(names)) and m.get("colour") == "RGB" and
          json.loads(m.get("class_names", "null")) == names and
          len(json.loads(m.get("mean", "[]"))) == 3 and len(json.loads(m.get("std", "[]"))) == 3)
    return ok


def main():
    if sys.argv[1:2] == ["meta"]:  # the standard library only
        ckpt, h, w, names = sys.argv[2:6]
        return 0 if meta(ckpt, int(h), int(w), names) else 1
    need()
    cmd = sys.argv[1]
    if cmd == "check":
        return 0
    if cmd == "classes":
        print("\n".join(classes(sys.argv[2])))
        return 0
    if cmd == "pixels":
        d, raw, h, w, mean, std = sys.argv[2:8]
        return 0 if pixels(d, raw, int(h), int(w), mean, std) else 1
    if cmd == "onnx":
        model, d, jsonl, h, w = sys.argv[2:7]
        return 0 if onnx_agree(model, d, jsonl, int(h), int(w)) else 1
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
