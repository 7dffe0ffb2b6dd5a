#!/usr/bin/python3
"""bench/images/resnet18_step_torch.py: PyTorch's twin of resnet18_step.c,
one training step of torchvision's resnet18 on random images (no input
pipeline), its CPU and wall milliseconds.

  /usr/bin/python3 bench/images/resnet18_step_torch.py [--size 112]
        [--batch 16] [--classes 3] [--warmup 2] [--steps 6] [--threads 1]

SGD with momentum 0.9 and weight decay 1e-4 (towerpack's ResNet-18 has an
L2 of 1e-4 in its cost), cross-entropy; one JSON line as resnet18_step's."""
import argparse
import json
import time

import torch
import torchvision


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=112)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--classes", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model = torchvision.models.resnet18(num_classes=a.classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    lossf = torch.nn.CrossEntropyLoss()
    x = torch.rand(a.batch, 3, a.size, a.size)
    y = torch.arange(a.batch) % a.classes
    model.train()

    def step():
        opt.zero_grad()
        lossf(model(x), y).backward()
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
    print(json.dumps({"side": "pytorch", "torch": torch.__version__, "threads": a.threads,
                      "size": a.size, "batch": a.batch, "steps": a.steps,
                      "cpu_ms_min": round(cpu[0], 1), "cpu_ms_median": round(cpu[a.steps // 2], 1),
                      "wall_ms_min": round(wall[0], 1),
                      "wall_ms_median": round(wall[a.steps // 2], 1)}))


if __name__ == "__main__":
    main()
