#!/usr/bin/env python3
"""bench/images: the peers of towerpack's image pipeline (bench/images/run.sh).
The ImageNet training augmentation on a folder of JPEGs, batch 64, two
worker processes, written the way each library's users write it:

  torchvision  ImageFolder + RandomResizedCrop(224) + RandomHorizontalFlip
               + ColorJitter(0.4, 0.4, 0.4) + ToTensor + Normalize, in a
               DataLoader(batch_size=64, shuffle=True, num_workers=2)
  tensorpack   (tensorpack's source on PYTHONPATH, from $TENSORPACK_SRC):
               the file list, MultiProcessMapDataZMQ(2) running cv2.imread
               and imgaug's GoogleNetRandomCropAndResize(interp=LINEAR),
               Flip(horiz), BrightnessScale((0.6,1.4)), Contrast((0.6,1.4)),
               Saturation(0.4), then mean/std normalisation to float32, and
               BatchData(64), as tensorpack's ImageNet example and its
               "Efficient DataFlow" tutorial do.

Prints one JSON line: images/s over --batches batches after --warmup.
usage: peers.py torchvision|tensorpack DIR [--batches N] [--warmup N] [--workers N]
(--workers 0: torchvision's loading on the calling process, one core)"""
import argparse
import json
import os
import sys
import time

import numpy as np

MEAN = [123.675, 116.28, 103.53]
STD = [58.395, 57.12, 57.375]


def torchvision_loader(d, workers):
    import torch
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms
    torch.set_num_threads(1)
    tf = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ColorJitter(0.4, 0.4, 0.4),
        transforms.ToTensor(),
        transforms.Normalize([m / 255 for m in MEAN], [s / 255 for s in STD]),
    ])
    ds = datasets.ImageFolder(d, transform=tf)
    dl = DataLoader(ds, batch_size=64, shuffle=True, num_workers=workers,
                    persistent_workers=workers > 0, drop_last=True)

    def forever():
        while True:
            for x, y in dl:
                yield x
    return forever()


def tensorpack_loader(d, workers):
    src = os.environ.get("TENSORPACK_SRC")
    if not src:
        print(json.dumps({"skipped": "TENSORPACK_SRC is not set (the folder "
                          "of tensorpack's source, e.g. /work/ref/tensorpack)"}))
        sys.exit(0)
    sys.path.insert(0, src)
    import cv2
    cv2.setNumThreads(1)
    from tensorpack.dataflow import (BatchData, DataFromList,
                                     MultiProcessMapDataZMQ, imgaug)
    files = []
    for k, c in enumerate(sorted(os.listdir(d))):
        for f in sorted(os.listdir(os.path.join(d, c))):
            files.append((os.path.join(d, c, f), k))
    augs = imgaug.AugmentorList([
        imgaug.GoogleNetRandomCropAndResize(interp=cv2.INTER_LINEAR),
        imgaug.Flip(horiz=True),
        imgaug.BrightnessScale((0.6, 1.4)),
        imgaug.Contrast((0.6, 1.4)),
        imgaug.Saturation(0.4),
    ])
    mean = np.array(MEAN, np.float32)
    std = np.array(STD, np.float32)

    def mapf(dp):
        fname, cls = dp
        im = cv2.imread(fname, cv2.IMREAD_COLOR)[:, :, ::-1]  # RGB
        im = augs.augment(im)
        im = (im.astype(np.float32) - mean) / std
        return im, cls

    ds = DataFromList(files, shuffle=True)
    ds = MultiProcessMapDataZMQ(ds, workers, mapf, buffer_size=200, strict=False)
    ds = BatchData(ds, 64)
    ds.reset_state()

    def forever():
        while True:
            for x, y in ds:
                yield x
    return forever()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("peer", choices=["torchvision", "tensorpack"])
    ap.add_argument("dir")
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    it = (torchvision_loader if a.peer == "torchvision" else
          tensorpack_loader)(a.dir, a.workers)
    for _ in range(a.warmup):
        next(it)
    t = time.perf_counter()
    for _ in range(a.batches):
        b = next(it)
    dt = time.perf_counter() - t
    print(json.dumps({"peer": a.peer, "images_per_s": a.batches * 64 / dt,
                      "batch_shape": list(b.shape), "seconds": dt}))
    # tensorpack's workers outlive their parent without python-prctl: end
    # every child before leaving
    try:
        import psutil
        for c in psutil.Process().children(recursive=True):
            c.kill()
    except ImportError:
        pass
    os._exit(0)


if __name__ == "__main__":
    main()
