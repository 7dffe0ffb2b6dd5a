#!/usr/bin/env python3
"""The PyTorch peer of `tp-train --model dcgan` on a GPU (issue 44): the
zoo's DCGAN for 28x28 grey images (models/models.c: generator fc to
128x7x7, batch norm, ReLU, two 4x4 stride-2 transposed convolutions, tanh;
discriminator two 4x4 stride-2 convolutions with leaky ReLU 0.2 and batch
norm, fc to one logit), N(0, 0.02) weights, Adam 2e-4 with beta1 0.5, the
usual loop: a discriminator step on real and detached fake images, then a
generator step. Fashion-MNIST from DIR (train-images-idx3-ubyte.gz), held
on the GPU (the most favourable input for the peer).

  pytorch_dcgan.py DIR [--batch 64] [--steps 300] [--warmup 20]

Prints one JSON line: steps/s and images/s (batch x steps / s)."""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

Z = 100


def gen():
    return nn.Sequential(nn.Linear(Z, 128 * 7 * 7, bias=False), nn.Unflatten(1, (128, 7, 7)),
                         nn.BatchNorm2d(128), nn.ReLU(),
                         nn.ConvTranspose2d(128, 64, 4, 2, 1, bias=False), nn.BatchNorm2d(64),
                         nn.ReLU(), nn.ConvTranspose2d(64, 1, 4, 2, 1), nn.Tanh())


def disc():
    return nn.Sequential(nn.Conv2d(1, 64, 4, 2, 1), nn.LeakyReLU(0.2),
                         nn.Conv2d(64, 128, 4, 2, 1, bias=False), nn.BatchNorm2d(128),
                         nn.LeakyReLU(0.2), nn.Flatten(), nn.Linear(128 * 7 * 7, 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(1)
    dev = torch.device("cuda")
    raw = gzip.open(os.path.join(a.dir, "train-images-idx3-ubyte.gz")).read()[16:]
    images = torch.tensor(np.frombuffer(raw, np.uint8).reshape(-1, 1, 28, 28), device=dev)
    g, d = gen().to(dev), disc().to(dev)
    for m in list(g.modules()) + list(d.modules()):
        if isinstance(m, (nn.Linear, nn.Conv2d, nn.ConvTranspose2d)):
            nn.init.normal_(m.weight, std=0.02)
    og = torch.optim.Adam(g.parameters(), lr=2e-4, betas=(0.5, 0.999))
    od = torch.optim.Adam(d.parameters(), lr=2e-4, betas=(0.5, 0.999))
    bce = F.binary_cross_entropy_with_logits
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        idx = torch.randint(0, images.shape[0], (a.batch,), device=dev)
        real = images[idx].float() * (2 / 255) - 1
        fake = g(torch.rand(a.batch, Z, device=dev) * 2 - 1)
        lr, lf = d(real), d(fake.detach())
        d_loss = 0.5 * (bce(lr, torch.ones_like(lr)) + bce(lf, torch.zeros_like(lf)))
        od.zero_grad(set_to_none=True)
        d_loss.backward()
        od.step()
        lf = d(fake)
        g_loss = bce(lf, torch.ones_like(lf))
        og.zero_grad(set_to_none=True)
        g_loss.backward()
        og.step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(json.dumps({"peer": "pytorch", "model": "dcgan", "batch": a.batch, "steps": a.steps,
                      "steps_per_s": round(a.steps / dt, 1),
                      "images_per_s": round(a.steps * a.batch / dt),
                      "d_loss": round(d_loss.item(), 4), "g_loss": round(g_loss.item(), 4),
                      "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    main()
