#!/usr/bin/python3
"""towerpack tests: check exported ONNX models with tools nobody here wrote.

  onnx_check.py check MODEL.onnx...
      onnx.checker.check_model (full check: types and shapes inferred) on
      each; prints one line per model, exits 1 on the first rejection.
  onnx_check.py shape MODEL.onnx...
      the same check, then one line per model with the graph's inputs and
      outputs and their dims: "PATH: image=batch,32,32 logits=batch,10".
  onnx_check.py opencv MODEL.onnx PREDICTIONS.csv IMAGES.gz
      runs the model with OpenCV's DNN module on the IDX images (as many as
      the CSV has rows, which tp-predict wrote with --logits) and prints one
      JSON object: n, the share of images whose top-1 class agrees, and the
      largest absolute difference of a logit.

Exit 3 when a needed Python package is missing (the C test then skips).
"""
import csv
import gzip
import json
import sys

try:
    import numpy as np
    import onnx
    import cv2
except ImportError as e:  # the caller skips with this message
    print("missing Python package: %s" % e.name)
    sys.exit(3)


def check(paths):
    for p in paths:
        model = onnx.load(p)
        onnx.checker.check_model(model, full_check=True)
        ops = sorted({n.op_type for n in model.graph.node})
        print("%s: ok (opset %d, ops %s)" % (p, model.opset_import[0].version, ",".join(ops)))


def dims(value):
    return ",".join(d.dim_param or str(d.dim_value) for d in value.type.tensor_type.shape.dim)


def shape(paths):
    for p in paths:
        model = onnx.load(p)
        onnx.checker.check_model(model, full_check=True)
        io = list(model.graph.input) + list(model.graph.output)
        print("%s: %s" % (p, " ".join("%s=%s" % (v.name, dims(v)) for v in io)))


def opencv(model_path, csv_path, images_path):
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    n = len(rows)
    k = sum(1 for c in rows[0] if c.startswith("logit"))
    ref = np.array([[float(r["logit%d" % j]) for j in range(k)] for r in rows], np.float32)
    with gzip.open(images_path) as f:
        data = f.read()
    count, h, w = (int.from_bytes(data[i:i + 4], "big") for i in (4, 8, 12))
    images = np.frombuffer(data, np.uint8, offset=16).reshape(count, h, w)[:n]
    net = cv2.dnn.readNetFromONNX(model_path)
    got = []
    for b in range(0, n, 500):
        x = images[b:b + 500]
        # cv2 reads a 3-D array as one image with channels: give the batch
        # as N x 1 x H x W (the model reshapes its input to that anyway)
        net.setInput(np.ascontiguousarray(x.reshape(len(x), 1, h, w)))
        got.append(net.forward("logits").reshape(len(x), k))
    got = np.concatenate(got)
    agree = float(np.mean(got.argmax(1) == ref.argmax(1)))
    print(json.dumps({"n": n, "agree": agree,
                      "max_abs": float(np.max(np.abs(got - ref)))}))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "check":
        check(sys.argv[2:])
    elif len(sys.argv) >= 3 and sys.argv[1] == "shape":
        shape(sys.argv[2:])
    elif len(sys.argv) == 5 and sys.argv[1] == "opencv":
        opencv(*sys.argv[2:])
    else:
        print(__doc__)
        sys.exit(2)
