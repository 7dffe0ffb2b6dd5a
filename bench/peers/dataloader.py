"""PyTorch peer of the data-loading comparison (bench/run.sh, part b).

Written the way a PyTorch user writes it: a map-style Dataset whose
__getitem__ augments one sample with torch ops (random crop of 28 after
zero padding of 4, horizontal flip with probability 0.5, normalise with
Fashion-MNIST's mean and std: what torchvision's RandomCrop(28, padding=4),
RandomHorizontalFlip(), ToTensor(), Normalize() do), and a DataLoader with
batch 128, shuffling, num_workers and persistent workers.

Prints one JSON line: samples/s over --batches batches after --warmup."""
import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import fmnist

MEAN, STD = 0.2860, 0.3530


class AugmentedFashionMNIST(Dataset):
    def __init__(self, split="train"):
        images, labels = fmnist.load(split)
        self.images = torch.from_numpy(images.copy())
        self.labels = torch.from_numpy(labels)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        img = self.images[i].float().div_(255).unsqueeze(0)      # [1,28,28]
        img = F.pad(img, (4, 4, 4, 4))                           # [1,36,36]
        y, x = torch.randint(0, 9, (2,)).tolist()
        img = img[:, y:y + 28, x:x + 28]
        if torch.rand(1).item() < 0.5:
            img = img.flip(-1)
        img = (img - MEAN) / STD
        return img, self.labels[i]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--batches", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--batch", type=int, default=128)
    a = ap.parse_args()
    torch.set_num_threads(1)  # each worker runs per-sample ops: no intra-op threads
    loader = DataLoader(AugmentedFashionMNIST(), batch_size=a.batch, shuffle=True,
                        num_workers=a.workers, persistent_workers=a.workers > 0,
                        drop_last=True)
    it = iter(loader)

    def take():
        nonlocal it
        try:
            return next(it)
        except StopIteration:
            it = iter(loader)
            return next(it)

    for _ in range(a.warmup):
        take()
    t0 = time.perf_counter()
    samples = 0
    for _ in range(a.batches):
        x, y = take()
        samples += x.shape[0]
    dt = time.perf_counter() - t0
    print(json.dumps({"peer": "pytorch-dataloader", "workers": a.workers,
                      "batches": a.batches, "samples": samples, "seconds": dt,
                      "samples_per_s": samples / dt,
                      "shape": list(x.shape), "dtype": str(x.dtype)}))


if __name__ == "__main__":
    main()
