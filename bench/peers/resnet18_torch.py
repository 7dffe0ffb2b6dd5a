#!/usr/bin/python3
"""PyTorch peer of the ResNet-18 image benchmark (bench/images/resnet18.sh):
a folder of JPEGs through torchvision's ImageFolder (PIL decode), the
ImageNet training augmentation (RandomResizedCrop to SIZE with scale
0.08-1 and aspect 3/4-4/3, horizontal flip, ColorJitter brightness,
contrast and saturation 0.4, ToTensor, Normalize with ImageNet's mean and
std), a DataLoader with WORKERS worker processes, and torchvision's
resnet18 (the ImageNet layout, as towerpack's resnet18: 7x7 stem, max-pool,
num_classes from the folder) trained by SGD with momentum 0.9, cross-entropy;
--weight-decay 1e-4 gives it towerpack's ResNet-18 weight decay (an L2 of
1e-4 in its cost; bench/images/resnet18.py passes it; default 0, as the
GPU comparisons in docs/cuda.md were run). --lighting 0.1 adds AlexNet's PCA lighting noise (after
ToTensor, as fb.resnet.torch and tensorpack): towerpack's `--augment
imagenet` has it, so the benchmark gives both sides the same augmentation.
--bf16: the forward and the loss under torch.autocast("cpu", bfloat16)
(the convolutions and the fc on bf16 operands, fp32 weights, gradients
and optimizer), the peer of tp-train --bf16; the JSON line's
"logits_dtype" is the model output's dtype in the last step (bfloat16
under autocast: the check that the products really ran in bf16).

Times STEPS steps after WARMUP untimed ones, data loading included (the
loop as a user writes it), and prints one JSON line: images/s, each timed
step's seconds, and the main process's CPU seconds over the timed steps
(with workers > 0 their decoding is not in it).

--time-getitem N: no model, no DataLoader: the dataset's __getitem__
(decode and augmentation, as one DataLoader worker runs it) timed over N
images in this process, after WARMUP images, and one JSON line with the
CPU milliseconds an image and the images/s one core gives (the per-core
rate docs/performance.md compares with `tp-bench dataflow`'s)."""
import argparse
import json
import time

import torch
import torch.nn as nn
import torchvision
import torchvision.transforms as T


class Lighting:
    """AlexNet's PCA lighting noise on a [3, H, W] tensor in [0, 1]: each
    channel shifted by eigvec @ (N(0, std) * eigval), ImageNet's eigen
    pairs (towerpack's imgaug lighting, the same numbers on 0..255)."""
    eigval = torch.tensor([0.2175, 0.0188, 0.0045])
    eigvec = torch.tensor([[-0.5675, 0.7192, 0.4009],
                           [-0.5808, -0.0045, -0.8140],
                           [-0.5836, -0.6948, 0.4203]])

    def __init__(self, std):
        self.std = std

    def __call__(self, img):
        alpha = torch.randn(3) * self.std
        return img + (self.eigvec @ (alpha * self.eigval)).view(3, 1, 1)


def s_time_getitem(ds, a):
    """One DataLoader worker's work, per image: ds[i] for shuffled i (what
    a worker calls once per sample; the batch's collate is left out), on
    one thread (a worker runs with torch's threads set to 1)."""
    torch.set_num_threads(1)
    order = torch.randperm(len(ds)).tolist()
    n = a.warmup + a.time_getitem
    for k in range(a.warmup):
        ds[order[k % len(order)]]
    t0, c0 = time.perf_counter(), time.process_time()
    for k in range(a.warmup, n):
        ds[order[k % len(order)]]
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"peer": "pytorch", "mode": "getitem", "size": a.size,
                      "images": a.time_getitem, "lighting": a.lighting,
                      "cpu_ms_per_image": round(1e3 * cpu / a.time_getitem, 3),
                      "images_per_cpu_s": round(a.time_getitem / cpu, 1),
                      "images_per_s": round(a.time_getitem / dt, 1),
                      "torch": torch.__version__, "torchvision": torchvision.__version__}))


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
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--lighting", type=float, default=0.0,
                    help="PCA lighting noise std (0: none; towerpack's imagenet: 0.1)")
    ap.add_argument("--bf16", action="store_true",
                    help="the forward and the loss under torch.autocast(bfloat16)")
    ap.add_argument("--time-getitem", type=int, default=0, metavar="N",
                    help="time N of the dataset's __getitem__ in this process and exit")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    tf = T.Compose([T.RandomResizedCrop(a.size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)),
                    T.RandomHorizontalFlip(),
                    T.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4),
                    T.ToTensor()]
                   + ([Lighting(a.lighting)] if a.lighting > 0 else [])
                   + [T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = torchvision.datasets.ImageFolder(a.dir, tf)
    if a.time_getitem > 0:
        s_time_getitem(ds, a)
        return
    dl = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=True, drop_last=True,
                                     num_workers=a.workers,
                                     persistent_workers=a.workers > 0)
    dev = torch.device(a.device)
    model = torchvision.models.resnet18(num_classes=len(ds.classes)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9,
                          weight_decay=a.weight_decay)
    lossf = nn.CrossEntropyLoss()
    model.train()
    done, ends = 0, []
    # the clock starts when the last warm-up step ends, so that every timed
    # step includes fetching its batch (towerpack's epoch clock likewise
    # starts before the first timed step asks for its batch)
    t0, c0 = time.perf_counter(), time.process_time()
    while done < a.warmup + a.steps:
        for x, y in dl:
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            opt.zero_grad()
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.bf16):
                logits = model(x)
                loss = lossf(logits, y)
            loss.backward()
            opt.step()
            done += 1
            if done == a.warmup:
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0, c0 = time.perf_counter(), time.process_time()
            elif done > a.warmup and dev.type != "cuda":  # (a GPU's would be launches)
                ends.append(time.perf_counter())
            if done == a.warmup + a.steps:
                break
    if dev.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    step_s = [e - b for b, e in zip([t0] + ends[:-1], ends)]
    print(json.dumps({"peer": "pytorch", "workers": a.workers, "threads": a.threads,
                      "batch": a.batch, "device": a.device, "size": a.size, "steps": a.steps,
                      "images_per_s": a.steps * a.batch / dt, "loss": loss.item(),
                      "warmup": a.warmup, "weight_decay": a.weight_decay,
                      "lighting": a.lighting, "bf16": a.bf16,
                      "logits_dtype": str(logits.dtype).replace("torch.", ""),
                      "step_s": [round(v, 4) for v in step_s],
                      "cpu_s": round(cpu, 3),
                      "torch": torch.__version__, "torchvision": torchvision.__version__}))


if __name__ == "__main__":
    main()
