"""PyTorch peer of the training comparison (bench/run.sh, part c).

The model zoo's mlp and cnn (models/models.c) rebuilt in PyTorch with the
same architecture, initialisation (Glorot-uniform fully connected weights,
He-normal convolution weights, zero biases), batch 128, SGD with momentum
0.9, the learning rate decaying linearly per step from lr to lr/20 over the
run, mean softmax cross-entropy, and inputs scaled to [0,1] as tp-train
does (uint8 / 255, no augmentation). Data sits in memory as tensors and is
shuffled each epoch: the fastest way to feed PyTorch, so the time is the
model's.

Prints one JSON line: the training time of each epoch (the loop only, no
evaluation) and the test accuracy after the last one."""
import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import fmnist


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(),
                         nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))


def cnn():
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def init(m):
    if isinstance(m, nn.Linear):
        nn.init.xavier_uniform_(m.weight)
        nn.init.zeros_(m.bias)
    elif isinstance(m, nn.Conv2d):
        nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
        nn.init.zeros_(m.bias)


MODELS = {"mlp": (mlp, 0.05), "cnn": (cnn, 0.1)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(MODELS), default="mlp")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0, help="steps per epoch (0: a full pass)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    build, lr = MODELS[a.model]
    lr = a.lr or lr
    model = build()
    model.apply(init)
    xs, ys = fmnist.load("train")
    xt, yt = fmnist.load("test")
    xs, ys = torch.from_numpy(xs.copy()), torch.from_numpy(ys)
    xt, yt = torch.from_numpy(xt.copy()), torch.from_numpy(yt)
    if a.model == "cnn":
        xs, xt = xs.unsqueeze(1), xt.unsqueeze(1)
    steps = len(ys) // a.batch
    if a.steps:
        steps = min(steps, a.steps)
    total = steps * a.epochs
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 1.0 - (1.0 - 1.0 / 20) * min(s, total) / total)
    epoch_s = []
    for _ in range(a.epochs):
        model.train()
        perm = torch.randperm(len(ys))
        t0 = time.perf_counter()
        for s in range(steps):
            idx = perm[s * a.batch:(s + 1) * a.batch]
            x = xs[idx].float().div_(255)
            loss = F.cross_entropy(model(x), ys[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        epoch_s.append(time.perf_counter() - t0)
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(yt), 500):
            x = xt[i:i + 500].float().div_(255)
            correct += (model(x).argmax(1) == yt[i:i + 500]).sum().item()
    print(json.dumps({"peer": "pytorch", "model": a.model, "threads": a.threads,
                      "batch": a.batch, "steps_per_epoch": steps, "epoch_s": epoch_s,
                      "samples_per_s": steps * a.batch / epoch_s[-1],
                      "test_accuracy": correct / len(yt),
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
