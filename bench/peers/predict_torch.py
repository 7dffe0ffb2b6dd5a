"""towerpack peer benchmark: the zoo's CNN in PyTorch for inference, with
the weights of a towerpack checkpoint (safetensors, read here with the
standard library and numpy), under torch.inference_mode().

  predict_torch.py CHECKPOINT [--threads T] [--latency-iters N] [--batch B]
                   [--rounds R] [--compare PRED.csv]

Prints one JSON object: batch-1 latency (median of N single-image calls, ms)
and batch-B throughput (images/s, fastest round) on Fashion-MNIST test
images; with --compare (tp-predict --logits output for the first rows of
the test split), the largest logit difference and the top-1 agreement, to
show it is the same model with the same weights."""
import argparse
import csv
import gzip
import json
import struct
import time

import numpy as np
import torch
import torch.nn.functional as F

IMAGES = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__" or e["dtype"] != "F32":
            continue
        b, end = e["data_offsets"]
        out[name] = torch.from_numpy(
            np.frombuffer(data[base + b:base + end], np.float32).reshape(e["shape"]).copy())
    return out


class Cnn(torch.nn.Module):
    """towerpack's zoo "cnn": conv32-pool-conv64-pool-fc128-fc10 (models/)."""

    def __init__(self, w):
        super().__init__()
        self.w = w
        self.scale = torch.tensor(1.0 / 255, dtype=torch.float32)
        # the dense weights are [in, out] in towerpack: F.linear wants [out, in]
        self.fc0 = w["fc0/W"].t().contiguous()
        self.lin = w["linear/W"].t().contiguous()

    def forward(self, img):
        w = self.w
        x = (img.float() * self.scale).reshape(-1, 1, 28, 28)
        x = F.max_pool2d(F.relu(F.conv2d(x, w["conv0/W"], w["conv0/b"], padding=1)), 2)
        x = F.max_pool2d(F.relu(F.conv2d(x, w["conv1/W"], w["conv1/b"], padding=1)), 2)
        x = F.relu(F.linear(x.flatten(1), self.fc0, w["fc0/b"]))
        return F.linear(x, self.lin, w["linear/b"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--latency-iters", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--compare")
    ap.add_argument("--bf16", action="store_true",
                    help="under torch.autocast('cpu', torch.bfloat16): the convolutions "
                         "and linear layers on bf16, as tp-predict --bf16")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    net = Cnn(load_safetensors(a.checkpoint)).eval()
    with gzip.open(IMAGES) as f:
        images = torch.from_numpy(np.frombuffer(f.read(), np.uint8, offset=16)
                                  .reshape(-1, 28, 28)[:max(a.batch, 1000)].copy())
    res = {"peer": "pytorch %s" % torch.__version__, "threads": a.threads, "batch": a.batch,
           "bf16": a.bf16}
    # autocast off is a plain fp32 run (enabled=False changes nothing)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
        one = images[:1]
        for _ in range(20):
            net(one)
        lat = []
        for _ in range(a.latency_iters):
            t0 = time.perf_counter()
            net(one)
            lat.append(time.perf_counter() - t0)
        lat.sort()
        res["latency_ms"] = lat[len(lat) // 2] * 1e3
        res["latency_p90_ms"] = lat[len(lat) * 9 // 10] * 1e3
        x = images[:a.batch]
        best = 0.0
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            for _ in range(4):
                net(x)
            best = max(best, a.batch * 4 / (time.perf_counter() - t0))
        res["images_per_s"] = best
        if a.compare:
            with open(a.compare) as f:
                rows = list(csv.DictReader(f))
            ref = np.array([[float(r["logit%d" % j]) for j in range(10)] for r in rows],
                           np.float32)
            got = net(images[:len(rows)]).float().numpy()
            res["compare_rows"] = len(rows)
            res["max_abs_logit_diff"] = float(np.max(np.abs(got - ref)))
            res["top1_agree"] = float(np.mean(got.argmax(1) == ref.argmax(1)))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
