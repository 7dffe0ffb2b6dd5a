#!/usr/bin/env python3
"""towerpack tests: tp-train --tta's validation numbers against PyTorch.
From a tp-train log directory of the zoo's mlp (its newest checkpoint and
stats.json), the Fashion-MNIST test set (TP_FASHION_MNIST_DIR, else
/usr/share/datasets/fashion-mnist) runs through the same network in
PyTorch (float64): the test accuracy, the accuracy of the logits of each
image and its mirror image (left to right) summed, and, where tp-train ran
--tta-shift, of those twice plus both shifted a pixel up-left and
down-right with zero padding (torch.nn.functional.pad, then the two
corner crops), each mirrored too. Each must be within 3 images of 10000 of
what tp-train put in stats.json (validation_accuracy,
validation_flip_accuracy, validation_flip_shift_accuracy): float32 against
float64 may move an argmax that sits on a tie. Exit 0 and "pytorch agrees"; 1
otherwise; 77 without torch or the data."""
import glob
import gzip
import json
import os
import re
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_testutil import F, load, np, torch, verdict  # noqa: E402  (exits 77 without torch)


def idx(path):
    with gzip.open(path, "rb") as f:
        b = f.read()
    ndim = b[3]
    dims = struct.unpack(">" + "I" * ndim, b[4:4 + 4 * ndim])
    return np.frombuffer(b[4 + 4 * ndim:], dtype=np.uint8).reshape(dims)


def main(logdir):
    data = os.environ.get("TP_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")
    try:
        x = idx(f"{data}/t10k-images-idx3-ubyte.gz")
        y = idx(f"{data}/t10k-labels-idx1-ubyte.gz").astype(np.int64)
    except OSError as e:
        print(f"no Fashion-MNIST test set ({e})")
        return 77
    ckpts = glob.glob(f"{logdir}/model-*.safetensors")
    newest = max(ckpts, key=lambda p: int(re.search(r"model-(\d+)", p).group(1)))
    w = {k: torch.tensor(v.copy(), dtype=torch.float64) for k, v in load(newest).items()}
    stats = json.load(open(f"{logdir}/stats.json"))[-1]

    def logits(img):  # the zoo's mlp: 784-512-256-10, relu; W is [in, out]
        h = torch.tensor(img.reshape(len(img), -1), dtype=torch.float64) / 255.0
        h = F.relu(h @ w["fc0/W"] + w["fc0/b"])
        h = F.relu(h @ w["fc1/W"] + w["fc1/b"])
        return h @ w["linear/W"] + w["linear/b"]

    plain = logits(x)
    mirror = logits(x[:, :, ::-1].copy())
    both = plain + mirror
    label = torch.tensor(y)
    acc = float((plain.argmax(1) == label).double().mean())
    flip = float((both.argmax(1) == label).double().mean())
    ours, ours_flip = stats["validation_accuracy"], stats["validation_flip_accuracy"]
    print(f"{os.path.basename(newest)}: accuracy towerpack {ours:.4f}, pytorch {acc:.4f}; "
          f"with the mirror images towerpack {ours_flip:.4f}, pytorch {flip:.4f}")
    ok = abs(ours - acc) <= 3e-4 and abs(ours_flip - flip) <= 3e-4
    if "validation_flip_shift_accuracy" in stats:
        padded = F.pad(torch.tensor(x, dtype=torch.float64), (1, 1, 1, 1))
        views = 2 * both
        for t in (padded[:, 0:28, 0:28], padded[:, 2:30, 2:30]):
            views = views + logits(t.numpy()) + logits(t.flip(-1).numpy())
        shift = float((views.argmax(1) == label).double().mean())
        ours_shift = stats["validation_flip_shift_accuracy"]
        print(f"with the mirror images and the shifted ones towerpack {ours_shift:.4f}, "
              f"pytorch {shift:.4f}")
        ok = ok and abs(ours_shift - shift) <= 3e-4
    return verdict(ok)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
