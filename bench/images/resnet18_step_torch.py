#!/usr/bin/python3
"""bench/images/resnet18_step_torch.py: PyTorch's twin of resnet18_step.c,
one training step of torchvision's resnet18 on random images (no input
pipeline), its CPU and wall milliseconds.

  /usr/bin/python3 bench/images/resnet18_step_torch.py [--model resnet18]
        [--size 112] [--batch 16] [--classes 3] [--channels 3] [--warmup 2]
        [--steps 6] [--threads 1] [--bf16]

SGD with momentum 0.9 and the model's weight decay (towerpack's ResNet-18
has an L2 of 1e-4 in its cost, its CIFAR-style `resnet` 5e-4),
cross-entropy; one JSON line as resnet18_step's. --model resnet is the
zoo's CIFAR-style ResNet (models/models.c: a 3x3 stem of 32, basic blocks
32, 32, 64, 64, 128, 128, the first of a width with stride 2 and a 1x1
projection, global average pool, fc). --bf16: the forward and the loss
under torch.autocast("cpu", bfloat16) (its convolutions and products on
bf16 operands, fp32 weights and optimizer), the peer of resnet18_step
--bf16."""
import argparse
import json
import time

import torch
import torch.nn as nn
import torchvision


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, 0, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
        return torch.relu(y + (self.short(x) if self.short is not None else x))


def cifar_resnet(channels, classes):
    """The zoo's `resnet` (models/models.c, s_resnet)."""
    layers = [nn.Conv2d(channels, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU()]
    cin = 32
    for cout, stride in ((32, 1), (32, 1), (64, 2), (64, 1), (128, 2), (128, 1)):
        layers.append(Block(cin, cout, stride))
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, classes)]
    return nn.Sequential(*layers)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18", choices=["resnet18", "resnet"])
    ap.add_argument("--size", type=int, default=112)
    ap.add_argument("--channels", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--classes", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--bf16", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    if a.model == "resnet18":
        model, wd = torchvision.models.resnet18(num_classes=a.classes), 1e-4
    else:
        model, wd = cifar_resnet(a.channels, a.classes), 5e-4
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=wd)
    lossf = torch.nn.CrossEntropyLoss()
    x = torch.rand(a.batch, a.channels, a.size, a.size)
    y = torch.arange(a.batch) % a.classes
    model.train()

    def step():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            loss = lossf(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    cpu, wall = [], []
    for _ in range(a.steps):
        c0, t0 = time.process_time(), time.perf_counter()
        step()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    cpu.sort()
    wall.sort()
    print(json.dumps({"side": "pytorch", "model": a.model, "torch": torch.__version__,
                      "threads": a.threads, "bf16": a.bf16,
                      "size": a.size, "batch": a.batch, "steps": a.steps,
                      "cpu_ms_min": round(cpu[0], 1), "cpu_ms_median": round(cpu[a.steps // 2], 1),
                      "wall_ms_min": round(wall[0], 1),
                      "wall_ms_median": round(wall[a.steps // 2], 1)}))


if __name__ == "__main__":
    main()
