#!/usr/bin/python3
"""towerpack tools: examples/autoencoder.c's model in PyTorch, the reference
for its test MSE (docs/performance.md).

Usage: autoencoder_torch.py [--epochs N] [--threads N] [--seed S]
                            [--init torch|he] [--data DIR]

The same model, data and schedule: encoder conv 1->16 (3x3, stride 2, pad 1)
+ relu, conv 16->32 (3x3, s2, p1) + relu; decoder ConvTranspose2d 32->16
(4x4, s2, p1) + relu, ConvTranspose2d 16->1 (4x4, s2, p1) + sigmoid; MSE
against the pixels in [0,1]; Adam 1e-3 (betas 0.9/0.999, eps 1e-8), batch
128, the training split reshuffled every epoch, the last partial batch
dropped (468 steps an epoch, as towerpack's `batch 128`). --init he draws the weights as towerpack does (He normal over the
fan-in, biases zero; a transposed conv's fan-in is W's dim 1 x KH x KW, as
PyTorch counts it); torch (the default) keeps PyTorch's own initialisation.
Prints one JSON line with test_mse over the whole test split (10000 images)
and the seconds per epoch. Reads Fashion-MNIST's IDX files from Debian's
dataset-fashion-mnist (/usr/share/datasets/fashion-mnist, or $TP_FASHION_MNIST_DIR).
"""
import argparse
import gzip
import json
import os
import sys
import time

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover - depends on the machine
    print("python3-torch/python3-numpy missing (%s)" % e)
    sys.exit(3)


def load_images(d, split):
    name = {"train": "train-images-idx3-ubyte.gz", "test": "t10k-images-idx3-ubyte.gz"}[split]
    with gzip.open(os.path.join(d, name), "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[4:8], "big")
    return np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(n, 1, 28, 28)


class AutoEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc0 = nn.Conv2d(1, 16, 3, stride=2, padding=1)
        self.enc1 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.dec0 = nn.ConvTranspose2d(32, 16, 4, stride=2, padding=1)
        self.dec1 = nn.ConvTranspose2d(16, 1, 4, stride=2, padding=1)

    def forward(self, x):
        h = F.relu(self.enc0(x))
        h = F.relu(self.enc1(h))
        h = F.relu(self.dec0(h))
        return torch.sigmoid(self.dec1(h))


def he_init(model):
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
            w = m.weight
            fan_in = w.shape[1] * w.shape[2] * w.shape[3]
            with torch.no_grad():
                w.normal_(0.0, (2.0 / fan_in) ** 0.5)
                m.bias.zero_()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--init", choices=("torch", "he"), default="torch")
    ap.add_argument("--data", default=os.environ.get("TP_FASHION_MNIST_DIR") or
                    "/usr/share/datasets/fashion-mnist")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    train = torch.from_numpy(load_images(a.data, "train").astype(np.float32) / 255.0)
    test = torch.from_numpy(load_images(a.data, "test").astype(np.float32) / 255.0)
    model = AutoEncoder()
    if a.init == "he":
        he_init(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    per_epoch = []
    for _ in range(a.epochs):
        t0 = time.time()
        perm = torch.randperm(train.shape[0])
        for i in range(0, train.shape[0] - 127, 128):
            x = train[perm[i:i + 128]]
            loss = F.mse_loss(model(x), x)
            opt.zero_grad()
            loss.backward()
            opt.step()
        per_epoch.append(time.time() - t0)
    with torch.no_grad():
        sq = 0.0
        for i in range(0, test.shape[0], 500):
            x = test[i:i + 500]
            sq += float(((model(x).double() - x.double()) ** 2).sum())
    print(json.dumps({"model": "autoencoder", "framework": "torch %s" % torch.__version__,
                      "init": a.init, "epochs": a.epochs, "threads": a.threads,
                      "test_mse": round(sq / (test.shape[0] * 784), 6),
                      "epoch_s": [round(s, 2) for s in per_epoch]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
