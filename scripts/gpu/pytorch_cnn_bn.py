#!/usr/bin/env python3
"""towerpack GPU check 6c: the peer. The zoo's cnn-bn model (models/models.c)
written as a PyTorch user would write it, trained on Fashion-MNIST with a
DataLoader (worker processes, pinned memory) on the same GPU, so that an
epoch of towerpack's CUDA towers can be compared with it.

Model: conv3x3(1->32, no bias)-BN-ReLU-maxpool2, conv3x3(32->64)-BN-ReLU-
maxpool2, fc 3136->128 ReLU, dropout 0.3, fc 10; SGD lr 0.02, momentum 0.9;
batch 128; augmentation: random crop 28 from a 2-pixel zero padding and a
horizontal flip (towerpack's augmented zoo models crop and flip too).

    python3 pytorch_cnn_bn.py --data DIR [--epochs 3] [--workers 8] [--tf32]

Prints per epoch: wall time of the training pass, images/s, test accuracy.
Written without a GPU to run it on; run by scripts/gpu-check.sh peer."""
import argparse
import gzip
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


class FashionMNIST(Dataset):
    def __init__(self, root, train, augment):
        kind = "train" if train else "t10k"
        self.x = read_idx(os.path.join(root, f"{kind}-images-idx3-ubyte.gz"))
        self.y = read_idx(os.path.join(root, f"{kind}-labels-idx1-ubyte.gz")).astype(np.int64)
        self.augment = augment

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        img = self.x[i]
        if self.augment:
            padded = np.zeros((32, 32), dtype=np.uint8)
            padded[2:30, 2:30] = img
            oy, ox = np.random.randint(0, 5, size=2)
            img = padded[oy:oy + 28, ox:ox + 28]
            if np.random.rand() < 0.5:
                img = img[:, ::-1]
        x = torch.from_numpy(np.ascontiguousarray(img)).float().div_(255.0).unsqueeze(0)
        return x, int(self.y[i])


class CnnBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv0 = nn.Conv2d(1, 32, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(32, eps=1e-5, momentum=0.1)
        self.conv1 = nn.Conv2d(32, 64, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64, eps=1e-5, momentum=0.1)
        self.fc0 = nn.Linear(64 * 7 * 7, 128)
        self.drop = nn.Dropout(0.3)
        self.linear = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn0(self.conv0(x))), 2)
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = self.drop(F.relu(self.fc0(x.flatten(1))))
        return self.linear(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--tf32", action="store_true")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"cuDNN {torch.backends.cudnn.version()}, TF32 {a.tf32}")
    train = DataLoader(FashionMNIST(a.data, True, True), batch_size=a.batch, shuffle=True,
                       num_workers=a.workers, pin_memory=True, drop_last=True,
                       persistent_workers=True)
    test = DataLoader(FashionMNIST(a.data, False, False), batch_size=500,
                      num_workers=2, pin_memory=True)
    torch.manual_seed(42)
    model = CnnBn().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    for epoch in range(a.epochs):
        model.train()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        n = 0
        for x, y in train:
            x = x.to(dev, non_blocking=True)
            y = y.to(dev, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            n += x.shape[0]
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for x, y in test:
                pred = model(x.to(dev, non_blocking=True)).argmax(1).cpu()
                correct += int((pred == y).sum())
                total += len(y)
        print(f"epoch {epoch + 1}: train {dt:.2f} s ({n / dt:.0f} images/s), "
              f"test accuracy {correct / total:.4f}")


if __name__ == "__main__":
    main()
