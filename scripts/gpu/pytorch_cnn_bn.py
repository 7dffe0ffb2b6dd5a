#!/usr/bin/env python3
"""towerpack GPU check 6c: the peer. The zoo's cnn-bn model (models/models.c)
and tp-train's recipe for it, written as a PyTorch user would write them,
trained on Fashion-MNIST with a DataLoader (worker processes, pinned
memory) on the same GPU, so that towerpack's CUDA towers can be compared
with it epoch for epoch and in time to accuracy.

Model (the zoo's since 2026-11-22): three blocks of conv3x3 (no bias)-BN-
ReLU-maxpool2 with 32, 64 and 128 filters, fc 1152->256 ReLU, dropout 0.3,
fc 10. Recipe (tp-train's): SGD momentum 0.9, learning rate 0.02 decaying
linearly step by step to a twentieth at the end, L2 weight decay 5e-4 on
the conv kernels and fc weights only (towerpack's 'weight_decay' over */W:
the same gradient as SGD's weight_decay on those tensors), batch 128 with
the remainder dropped; augmentation: zero padding of --pad pixels, a
random 28x28 crop and a horizontal flip with probability 1/2, pixels
scaled to [0, 1]. Batch norm: eps 1e-5, moving averages with momentum 0.1
(towerpack's decay 0.9). Initial weights: towerpack's (--init towerpack,
the default since session 17; the runs before drew PyTorch's defaults,
--init torch).

    python3 pytorch_cnn_bn.py --data DIR [--epochs 3] [--pad 2] [--seed 1]
                              [--workers 8] [--tf32] [--device cuda|cpu]
                              [--init towerpack|torch] [--tta] [--tta-shift]
                              [--label-smoothing S]

Prints per epoch the wall time of the training pass, images/s and test
accuracy, then one summary line: total training seconds (the training
passes only, as towerpack's time to accuracy counts them) and the final
test accuracy. Run by scripts/gpu-check.sh peer (PEER_ARGS)."""
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
    def __init__(self, root, train, augment, pad):
        kind = "train" if train else "t10k"
        self.x = read_idx(os.path.join(root, f"{kind}-images-idx3-ubyte.gz"))
        self.y = read_idx(os.path.join(root, f"{kind}-labels-idx1-ubyte.gz")).astype(np.int64)
        self.augment = augment
        self.pad = pad

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        img = self.x[i]
        if self.augment:
            p = self.pad
            padded = np.zeros((28 + 2 * p, 28 + 2 * p), dtype=np.uint8)
            padded[p:p + 28, p:p + 28] = img
            oy, ox = np.random.randint(0, 2 * p + 1, size=2)
            img = padded[oy:oy + 28, ox:ox + 28]
            if np.random.rand() < 0.5:
                img = img[:, ::-1]
        x = torch.from_numpy(img.astype(np.float32) / 255.0).unsqueeze(0)  # a copy
        return x, int(self.y[i])


class CnnBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList()
        self.bns = nn.ModuleList()
        cin = 1
        for cout in (32, 64, 128):
            self.convs.append(nn.Conv2d(cin, cout, 3, padding=1, bias=False))
            self.bns.append(nn.BatchNorm2d(cout, eps=1e-5, momentum=0.1))
            cin = cout
        self.fc0 = nn.Linear(128 * 3 * 3, 256)
        self.drop = nn.Dropout(0.3)
        self.linear = nn.Linear(256, 10)

    def forward(self, x):
        for conv, bn in zip(self.convs, self.bns):
            x = F.max_pool2d(F.relu(bn(conv(x))), 2)
        x = self.drop(F.relu(self.fc0(x.flatten(1))))
        return self.linear(x)

    def init_as_towerpack(self):
        """towerpack's initial values (gpu/graph/graph.c): conv kernels He
        normal (std sqrt(2 / fan_in)), fc weights Glorot uniform, fc biases
        zero; batch norm's scale 1 and shift 0 as PyTorch's. PyTorch's own
        defaults (--init torch) draw every weight and bias from
        U(+-1 / sqrt(fan_in))."""
        for c in self.convs:
            nn.init.kaiming_normal_(c.weight, mode="fan_in", nonlinearity="relu")
        for f in (self.fc0, self.linear):
            nn.init.xavier_uniform_(f.weight)
            nn.init.zeros_(f.bias)

    def decayed(self):
        """The tensors tp-train's weight decay covers: kernels, fc weights."""
        return [c.weight for c in self.convs] + [self.fc0.weight, self.linear.weight]


def rate_factor(step, total, warm, lr_end):
    """tp-train's schedule, the rate at `step` of `total` as a fraction of
    --lr: from a tenth up to 1 over the first `warm` steps, then linear down
    to lr_end at the end (a twentieth by default)."""
    step = min(step, total)
    if step < warm:
        return 0.1 + 0.9 * step / warm
    return 1.0 - (1.0 - lr_end) * (step - warm) / (total - warm)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--pad", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--lr-end", type=float, default=0.05,
                    help="the rate at the end, a fraction of --lr (tp-train's)")
    ap.add_argument("--warmup", type=float, default=0.0,
                    help="epochs of the rate's climb from lr / 10 (tp-train's)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--label-smoothing", type=float, default=0.0,
                    help="the targets smoothed (tp-train --label-smoothing)")
    ap.add_argument("--tta", action="store_true",
                    help="also score the logits of each test image and its "
                         "mirror image summed (tp-train --tta)")
    ap.add_argument("--tta-shift", action="store_true",
                    help="--tta, and also the logits of the image and its mirror "
                         "(twice) and both shifted a pixel up-left and down-right "
                         "with zeros shifted in, summed (tp-train --tta-shift)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--init", choices=("towerpack", "torch"), default="towerpack",
                    help="initial weights: towerpack's (the same recipe) or PyTorch's defaults")
    a = ap.parse_args()
    if not 0 <= a.warmup < a.epochs:
        ap.error(f"--warmup {a.warmup}: the warm-up must end before the last of the {a.epochs} epochs")
    if not 0 <= a.lr_end <= 1:
        ap.error(f"--lr-end {a.lr_end}: a fraction of --lr in [0, 1]")
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    torch.backends.cudnn.benchmark = True
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    print(f"device: {name}, torch {torch.__version__}, "
          f"cuDNN {torch.backends.cudnn.version()}, TF32 {a.tf32}, "
          f"epochs {a.epochs}, pad {a.pad}, seed {a.seed}, init {a.init}")
    torch.manual_seed(a.seed)
    np.random.seed(a.seed)
    train = DataLoader(FashionMNIST(a.data, True, True, a.pad), batch_size=a.batch,
                       shuffle=True, num_workers=a.workers, pin_memory=cuda,
                       drop_last=True, persistent_workers=a.workers > 0)
    test = DataLoader(FashionMNIST(a.data, False, False, 0), batch_size=500,
                      num_workers=min(a.workers, 2), pin_memory=cuda)
    model = CnnBn()
    if a.init == "towerpack":
        model.init_as_towerpack()
    model = model.to(dev)
    decayed = {id(p) for p in model.decayed()}
    groups = [{"params": [p for p in model.parameters() if id(p) in decayed],
               "weight_decay": 5e-4},
              {"params": [p for p in model.parameters() if id(p) not in decayed],
               "weight_decay": 0.0}]
    opt = torch.optim.SGD(groups, lr=a.lr, momentum=0.9)
    total = a.epochs * len(train)
    warm = a.warmup * len(train)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: rate_factor(step, total, warm, a.lr_end))
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    trained = 0.0
    acc = 0.0
    for epoch in range(a.epochs):
        model.train()
        sync()
        t0 = time.perf_counter()
        n = 0
        for x, y in train:
            x = x.to(dev, non_blocking=True)
            y = y.to(dev, non_blocking=True)
            loss = F.cross_entropy(model(x), y, label_smoothing=a.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            n += x.shape[0]
        sync()
        dt = time.perf_counter() - t0
        trained += dt
        model.eval()
        a.tta = a.tta or a.tta_shift
        correct = flip_correct = shift_correct = count = 0
        with torch.no_grad():
            for x, y in test:
                x = x.to(dev, non_blocking=True)
                logits = model(x)
                correct += int((logits.argmax(1).cpu() == y).sum())
                if a.tta:  # the width is the last axis of [B, 1, H, W]
                    both = logits + model(torch.flip(x, dims=[3]))
                    flip_correct += int((both.argmax(1).cpu() == y).sum())
                if a.tta_shift:
                    padded = F.pad(x, (1, 1, 1, 1))
                    views = 2 * both
                    for t in (padded[:, :, 0:-2, 0:-2], padded[:, :, 2:, 2:]):
                        views = views + model(t) + model(torch.flip(t, dims=[3]))
                    shift_correct += int((views.argmax(1).cpu() == y).sum())
                count += len(y)
        acc = correct / count
        flip = f", with the mirror images {flip_correct / count:.4f}" if a.tta else ""
        if a.tta_shift:
            flip += f", with the mirrored and shifted images {shift_correct / count:.4f}"
        print(f"epoch {epoch + 1}: train {dt:.2f} s ({n / dt:.0f} images/s), "
              f"test accuracy {acc:.4f}{flip}", flush=True)
    print(f"pytorch cnn-bn: {a.epochs} epochs, pad {a.pad}, seed {a.seed}: "
          f"training {trained:.2f} s, test accuracy {acc:.4f}{flip}")


if __name__ == "__main__":
    main()
