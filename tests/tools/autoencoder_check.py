#!/usr/bin/python3
"""towerpack tests: examples/autoencoder.c's ONNX export, checked by tools
nobody here wrote.

Usage: autoencoder_check.py MODEL.onnx RECON.f32 [IMAGES.gz]

onnx.checker (full check) accepts MODEL.onnx; OpenCV's DNN module runs it
on the first 16 Fashion-MNIST test images (uint8 [16,1,28,28]: the model
casts and scales them itself) and its reconstructions agree with
towerpack's (RECON.f32, raw float32 [16,1,28,28], written by
`example-autoencoder --recon`) within 1e-4. OpenCV 4.6 imports every op
the model uses (Cast, Mul, Reshape, Conv, Relu, ConvTranspose, Sigmoid).
Exit 0 agree, 1 differ, 3 a package missing (the test skips).
"""
import gzip
import sys

try:
    import numpy as np
    import onnx
    import cv2
except ImportError as e:  # the ctest skips on 3
    print("missing Python package: %s" % e.name)
    sys.exit(3)


def main():
    if len(sys.argv) not in (3, 4):
        print(__doc__)
        return 2
    model, recon = sys.argv[1], sys.argv[2]
    images = sys.argv[3] if len(sys.argv) == 4 else \
        "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
    m = onnx.load(model)
    onnx.checker.check_model(m, full_check=True)
    with gzip.open(images) as f:
        data = f.read()
    x = np.frombuffer(data, np.uint8, offset=16).reshape(-1, 1, 28, 28)[:16]
    net = cv2.dnn.readNetFromONNX(model)
    net.setInput(np.ascontiguousarray(x))
    got = net.forward().reshape(16, 1, 28, 28)
    want = np.fromfile(recon, dtype="<f4").reshape(16, 1, 28, 28)
    err = float(np.max(np.abs(got.astype(np.float64) - want)))
    ops = ",".join(sorted({n.op_type for n in m.graph.node}))
    print("%s: onnx.checker ok (%s); OpenCV %s vs towerpack on 16 test images: "
          "max |diff| %.3g (limit 1e-4)" % (model, ops, cv2.__version__, err))
    return 0 if err <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
