#!/usr/bin/env python3
"""The PyTorch peer of `tp-train --model dcgan` on a GPU (issue 44): the
zoo's DCGAN for 28x28 grey images (models/models.c: generator fc to
128x7x7, batch norm, ReLU, two 4x4 stride-2 transposed convolutions, tanh;
discriminator two 4x4 stride-2 convolutions with leaky ReLU 0.2 and batch
norm, fc to one logit), N(0, 0.02) weights, Adam 2e-4 with beta1 0.5, the
usual loop: a discriminator step on real and detached fake images, then a
generator step. The model, its weights, the optimisers and the step are
the CPU peer's (bench/peers/dcgan_torch.py: models(1, 28), init_weights,
adam, usual_step), imported from the tree. Fashion-MNIST from DIR
(train-images-idx3-ubyte.gz), held on the GPU (the most favourable input
for the peer).

  pytorch_dcgan.py DIR [--batch 64] [--steps 300] [--warmup 20]

Prints one JSON line: steps/s and images/s (batch x steps / s)."""
import argparse
import gzip
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "bench", "peers"))
from dcgan_torch import Z, adam, init_weights, models, usual_step  # noqa: E402


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
    g, d = (m.to(dev) for m in models(1, 28))
    init_weights(g, d)  # on the device: its generator's draws, as before
    og, od = adam(g), adam(d)
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        idx = torch.randint(0, images.shape[0], (a.batch,), device=dev)
        real = images[idx].float() * (2 / 255) - 1
        z = torch.rand(a.batch, Z, device=dev) * 2 - 1
        g_loss, d_loss, _ = usual_step(g, d, og, od, real, z)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(json.dumps({"peer": "pytorch", "model": "dcgan", "batch": a.batch, "steps": a.steps,
                      "steps_per_s": round(a.steps / dt, 1),
                      "images_per_s": round(a.steps * a.batch / dt),
                      "d_loss": round(d_loss.item(), 4), "g_loss": round(g_loss.item(), 4),
                      "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    main()
