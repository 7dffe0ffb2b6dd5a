#!/usr/bin/env python3
"""towerpack GPU check 6d's peer: the GEMM step of `tp-bench cuda gemm`
written as a PyTorch user would, timed against the same eight matrix
products alone on the same GPU, so that towerpack's ratio (its step over
its cuBLAS products) has PyTorch's beside it.

The step (tools/tp-bench/bench_cuda.c, s_mlp and s_sgd): a uint8 batch of
B x 784 already on the GPU, scaled by 1/255, fc 784->W, ReLU, fc W->W,
ReLU, fc W->10, mean cross-entropy; SGD with momentum 0.9 (no Nesterov)
at learning rate 0.01, gradients set to None between steps (PyTorch's
default). The products alone: the three forward products, the three
weight gradients and the two input gradients (the input needs none), as
torch.mm on preallocated float32 tensors of the same shapes.

    python3 pytorch_gemm_step.py [--batch 1024] [--width 2048] [--iters 200]
                                 [--rounds 5] [--tf32] [--graph]

--graph captures the step as a CUDA graph (torch.cuda.graphs, the way a
PyTorch user removes launch overhead; towerpack's TP_CUDA_GRAPHS). Prints a
line per round and a summary: the median step and products times in ms and
their ratio. Times are CUDA events around whole loops of `iters` steps."""
import argparse
import statistics

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--graph", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("pytorch_gemm_step: no CUDA device")
        return 77
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    dev = torch.device("cuda")
    B, W = a.batch, a.width
    model = nn.Sequential(nn.Linear(784, W), nn.ReLU(), nn.Linear(W, W), nn.ReLU(),
                          nn.Linear(W, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    # bench_cuda.c's constant batch: pixel i is (i * 131 + 7) mod 256, label i mod 10
    x8 = ((torch.arange(B * 784, device=dev) * 131 + 7) % 256).to(torch.uint8).view(B, 784)
    y = (torch.arange(B, device=dev) % 10).long()

    def step(zero=True):
        if zero:
            opt.zero_grad(set_to_none=True)
        out = model(x8.float() / 255.0)
        loss = F.cross_entropy(out, y)
        loss.backward()
        opt.step()

    run = step
    if a.graph:
        # PyTorch's documented whole-network capture: warm-up on a side
        # stream, gradients set to None once, then the step without
        # zero_grad captured (its backward writes the graph's own buffers)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            step(zero=False)
        run = g.replay
    for _ in range(5):
        run()

    # the products alone: (m, n, k, transpose a, transpose b), row-major as
    # in bench_cuda.c
    shapes = [(B, W, 784, 0, 0), (B, W, W, 0, 0), (B, 10, W, 0, 0), (W, 10, B, 1, 0),
              (B, W, 10, 0, 1), (W, W, B, 1, 0), (B, W, W, 0, 1), (784, W, B, 1, 0)]
    mats = []
    for m, n, k, ta, tb in shapes:
        A = torch.full((k, m) if ta else (m, k), 0.01, device=dev)
        Bm = torch.full((n, k) if tb else (k, n), 0.02, device=dev)
        C = torch.empty((m, n), device=dev)
        mats.append((A.t() if ta else A, Bm.t() if tb else Bm, C))

    def products():
        for A, Bm, C in mats:
            torch.mm(A, Bm, out=C)

    for _ in range(5):
        products()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    steps_ms, prods_ms, ratios = [], [], []
    for r in range(a.rounds):
        ev[0].record()
        for _ in range(a.iters):
            run()
        ev[1].record()
        for _ in range(a.iters):
            products()
        ev[2].record()
        torch.cuda.synchronize()
        st = ev[0].elapsed_time(ev[1]) / a.iters
        pr = ev[1].elapsed_time(ev[2]) / a.iters
        steps_ms.append(st)
        prods_ms.append(pr)
        ratios.append(st / pr)
        print(f"round {r}: step {st:.4f} ms, products {pr:.4f} ms, ratio {st / pr:.3f}")
    print(f"pytorch gemm step: MLP 784-{W}-{W}-10, batch {B}, TF32 {'on' if a.tf32 else 'off'}, "
          f"{'graph' if a.graph else 'eager'}: step {statistics.median(steps_ms):.4f} ms, "
          f"products {statistics.median(prods_ms):.4f} ms, ratio {statistics.median(ratios):.3f} "
          f"(median of {a.rounds})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
