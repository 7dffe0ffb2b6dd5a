#!/usr/bin/env python3
"""The PyTorch peer of `tp-train --model dcgan` on the CPU (issue 44, "Speed";
bench/peers/gan_cpu.sh runs it beside towerpack).

The zoo's DCGAN (models/models.c, s_dcgan) at 28 px grey or a power of two
(32 px colour: fc 256x4x4 -> 128x8x8 -> 64x16x16 -> 3x32x32; the
discriminator mirrored), N(0, 0.02) weights, Adam 2e-4 with beta1 0.5 per
player, uniform noise in [-1, 1], images uint8 in memory scaled to [-1, 1],
batches drawn at random. Two loops:

  usual      PyTorch's DCGAN example: a discriminator step on the real and
             the detached fake images, then the discriminator on the fakes
             again and the generator's step (two discriminator forwards on
             the fakes, its weight gradients made in both backwards).
  gantrainer tensorpack's GANTrainer step, as towerpack's: one forward, the
             generator's gradient of g_loss and the discriminator's of
             d_loss from it (torch.autograd.grad), then both updates.

  dcgan_torch.py --threads T [--data fmnist|cifar:FILE] [--batch 64] [--warmup K] [--chunks E] [--chunk K]
                 [--loop usual|gantrainer] [--bf16]

--bf16: the forwards and the losses under torch.autocast("cpu", bfloat16)
(the products on bf16 operands; fp32 weights, gradients and Adam), the
peer of tp-train --bf16; the backwards and the updates outside it, as
PyTorch's autocast recipe has them. The JSON line's "logits_dtype" (the
discriminator's output in the last step: bfloat16 under autocast) is the
check that the products really ran in bf16.

Start-up is excluded as gan_cpu.sh excludes towerpack's: `warmup` steps
first (tp-train's first epoch), then `chunks` runs of `chunk` steps, each
timed whole (tp-train's later epochs, whose steps_per_s is the epoch's
steps over the time from its first step to the end of its last). Prints
one JSON line: each chunk's seconds per step and their median.

scripts/gpu/pytorch_dcgan.py (the GPU's peer) imports the model, its
initialisation, the optimisers and the usual step from here."""
import argparse
import contextlib
import gzip
import json
import statistics
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

Z = 100
FMNIST = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"


def shape(size):
    """(base, n) as s_dcgan: 28 is 7x7 and two conv-transposes; a power of
    two 16..128 is 4x4 and log2(size / 4)."""
    if size == 28:
        return 7, 2
    for n in range(2, 6):
        if size == 4 << n:
            return 4, n
    raise SystemExit(f"dcgan_torch.py: image size {size}")


def models(channels, size):
    base, n = shape(size)
    width = 64 << (n - 1)
    g = [nn.Linear(Z, width * base * base, bias=False), nn.Unflatten(1, (width, base, base)),
         nn.BatchNorm2d(width, momentum=0.1, eps=1e-5), nn.ReLU()]
    for i in range(1, n + 1):
        out = channels if i == n else width // 2
        g.append(nn.ConvTranspose2d(width, out, 4, 2, 1, bias=i == n))
        if i < n:
            g += [nn.BatchNorm2d(out), nn.ReLU()]
        width = out
    g.append(nn.Tanh())
    d, cin = [nn.Conv2d(channels, 64, 4, 2, 1), nn.LeakyReLU(0.2)], 64
    for i in range(1, n):
        d += [nn.Conv2d(cin, cin * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(cin * 2),
              nn.LeakyReLU(0.2)]
        cin *= 2
    d += [nn.Flatten(), nn.Linear(cin * base * base, 1)]
    return nn.Sequential(*g), nn.Sequential(*d)


def init_weights(*nets):
    """N(0, 0.02) weights, the zoo's (and the DCGAN paper's); biases and
    batch norms as PyTorch makes them. Drawn on the weights' device, so a
    model moved to the GPU first draws from the GPU's generator."""
    for net in nets:
        for m in net.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d, nn.ConvTranspose2d)):
                nn.init.normal_(m.weight, std=0.02)


def adam(net):
    """The zoo's optimiser, one per player: Adam 2e-4, beta1 0.5."""
    return torch.optim.Adam(net.parameters(), lr=2e-4, betas=(0.5, 0.999))


def usual_step(g, d, og, od, real, z, amp=contextlib.nullcontext):
    """PyTorch's DCGAN example's step on `real` images and noise z: the
    discriminator's update on the real and the detached fake images, then
    the discriminator on the fakes again for the generator's update.
    amp() is the context of the forwards and losses (an autocast for
    bf16). Returns the losses (g_loss, d_loss) and the discriminator's
    logits on the real images as tensors."""
    bce = F.binary_cross_entropy_with_logits
    with amp():
        fake = g(z)
        lr, lf = d(real), d(fake.detach())
        d_loss = 0.5 * (bce(lr, torch.ones_like(lr)) + bce(lf, torch.zeros_like(lf)))
    od.zero_grad(set_to_none=True)
    d_loss.backward()
    od.step()
    with amp():
        lf = d(fake)
        g_loss = bce(lf, torch.ones_like(lf))
    og.zero_grad(set_to_none=True)
    g_loss.backward()
    og.step()
    return g_loss, d_loss, lr


def images(data):
    if data == "fmnist":
        raw = gzip.open(FMNIST).read()[16:]
        return torch.tensor(np.frombuffer(raw, np.uint8).reshape(-1, 1, 28, 28).copy())
    if data.startswith("cifar:"):  # CIFAR-10 records: a label byte, R, G, B planes
        rec = np.fromfile(data[6:], np.uint8).reshape(-1, 1 + 3 * 32 * 32)
        return torch.tensor(rec[:, 1:].reshape(-1, 3, 32, 32).copy())
    raise SystemExit(f"dcgan_torch.py: --data {data} (fmnist or cifar:FILE)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data", default="fmnist")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--chunks", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=10)
    ap.add_argument("--loop", default="usual", choices=("usual", "gantrainer"))
    ap.add_argument("--bf16", action="store_true",
                    help="the forwards and losses under torch.autocast(bfloat16)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    x = images(a.data)
    channels, size = x.shape[1], x.shape[2]
    g, d = models(channels, size)
    init_weights(g, d)
    og, od = adam(g), adam(d)
    gp, dp = list(g.parameters()), list(d.parameters())
    bce = F.binary_cross_entropy_with_logits
    dtype = ["float32"]  # the discriminator's logits in the last step

    def amp():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16)

    def step():
        idx = torch.randint(0, x.shape[0], (a.batch,))
        real = x[idx].float() * (2 / 255) - 1
        z = torch.rand(a.batch, Z) * 2 - 1
        if a.loop == "usual":
            g_loss, d_loss, lr = usual_step(g, d, og, od, real, z, amp)
        else:
            with amp():
                fake = g(z)
                lr, lf = d(real), d(fake)
                d_loss = 0.5 * (bce(lr, torch.ones_like(lr)) + bce(lf, torch.zeros_like(lf)))
                g_loss = bce(lf, torch.ones_like(lf))
            gg = torch.autograd.grad(g_loss, gp, retain_graph=True)
            gd = torch.autograd.grad(d_loss, dp)
            for ps, gs, opt in ((gp, gg, og), (dp, gd, od)):
                for p, q in zip(ps, gs):
                    p.grad = q
                opt.step()
        dtype[0] = str(lr.dtype).replace("torch.", "")
        return float(g_loss), float(d_loss)

    for _ in range(a.warmup):
        step()
    per = []
    for _ in range(a.chunks):
        t0 = time.perf_counter()
        for _ in range(a.chunk):
            losses = step()
        per.append((time.perf_counter() - t0) / a.chunk)
    print(json.dumps({"peer": "pytorch", "loop": a.loop, "threads": a.threads,
                      "image": f"{channels}x{size}x{size}", "batch": a.batch,
                      "chunk_s_per_step": [round(v, 4) for v in per],
                      "median_s_per_step": round(statistics.median(per), 4),
                      "g_loss": round(losses[0], 3), "d_loss": round(losses[1], 3),
                      "bf16": a.bf16, "logits_dtype": dtype[0],
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
