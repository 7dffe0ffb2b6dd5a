"""Fashion-MNIST from the Debian package's IDX files, as numpy arrays.

Shared by the PyTorch peers of bench/run.sh. Reads the gzipped IDX files
the way a PyTorch user without torchvision would (gzip + numpy)."""
import gzip
import os

import numpy as np

ROOT = os.environ.get("TP_FMNIST_DIR", "/usr/share/datasets/fashion-mnist")


def _idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    ndim = magic & 0xFF
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(split):
    """(images uint8 [N,28,28], labels int64 [N]) of 'train' or 'test'."""
    prefix = "train" if split == "train" else "t10k"
    images = _idx(os.path.join(ROOT, prefix + "-images-idx3-ubyte.gz"))
    labels = _idx(os.path.join(ROOT, prefix + "-labels-idx1-ubyte.gz"))
    return images, labels.astype(np.int64)
