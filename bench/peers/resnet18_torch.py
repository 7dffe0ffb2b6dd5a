#!/usr/bin/python3
"""PyTorch peer of the ResNet-18 image benchmark (bench/images/resnet18.sh):
a folder of JPEGs through torchvision's ImageFolder (PIL decode), the
ImageNet training augmentation (RandomResizedCrop to SIZE with scale
0.08-1 and aspect 3/4-4/3, horizontal flip, ColorJitter brightness,
contrast and saturation 0.4, ToTensor, Normalize with ImageNet's mean and
std), a DataLoader with WORKERS worker processes, and torchvision's
resnet18 (the ImageNet layout, as towerpack's resnet18: 7x7 stem, max-pool,
num_classes from the folder) trained by SGD with momentum 0.9, cross-entropy.

Times STEPS steps after WARMUP untimed ones, data loading included (the
loop as a user writes it), and prints one JSON line: images/s."""
import argparse
import json
import time

import torch
import torch.nn as nn
import torchvision
import torchvision.transforms as T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--size", type=int, default=112)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (a GPU)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    tf = T.Compose([T.RandomResizedCrop(a.size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)),
                    T.RandomHorizontalFlip(),
                    T.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4),
                    T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = torchvision.datasets.ImageFolder(a.dir, tf)
    dl = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=True, drop_last=True,
                                     num_workers=a.workers,
                                     persistent_workers=a.workers > 0)
    dev = torch.device(a.device)
    model = torchvision.models.resnet18(num_classes=len(ds.classes)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    lossf = nn.CrossEntropyLoss()
    model.train()
    done, t0 = 0, None
    while done < a.warmup + a.steps:
        for x, y in dl:
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            if done == a.warmup:
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
            opt.zero_grad()
            loss = lossf(model(x), y)
            loss.backward()
            opt.step()
            done += 1
            if done == a.warmup + a.steps:
                break
    if dev.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(json.dumps({"peer": "pytorch", "workers": a.workers, "threads": a.threads,
                      "batch": a.batch, "device": a.device, "size": a.size, "steps": a.steps,
                      "images_per_s": a.steps * a.batch / dt, "loss": loss.item(),
                      "torch": torch.__version__, "torchvision": torchvision.__version__}))


if __name__ == "__main__":
    main()
