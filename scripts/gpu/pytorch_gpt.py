#!/usr/bin/env python3
"""The PyTorch peer of `tp-train --model gpt` on a GPU (issue 45): the same
byte-level GPT-2 layout as models/zoo_gpt.c (token + position embeddings,
pre-norm blocks of causal multi-head attention and a tanh-GELU MLP of 4x
width, a final layer norm, the output tied to the token embedding), random
windows of a text file, AdamW (weight decay on every variable, as tp-train
does today), float32 with TF32 off unless --tf32; --bf16 autocasts the
forward to bfloat16 (the weights and the update stay float32).

  pytorch_gpt.py --data FILE [--context 256 --layers 6 --heads 6 --embed 384
                 --batch 32 --steps 100 --warmup 10] [--attention math|sdpa]
                 [--compile] [--tf32] [--bf16] [--device cuda|cpu] [--threads N]

--attention math writes attention as towerpack's graph does (scores, a
causal mask added, softmax, x v); sdpa is PyTorch's fused
scaled_dot_product_attention (flash attention where it applies). Prints one
JSON line with tokens/s over --steps timed steps (after --warmup).
--device cpu runs the same on the CPU (PyTorch eager's CPU training, the
peer of docs/performance.md's "GPT on the CPU against llm.c and PyTorch",
bench/peers/gpt_cpu.sh) with --threads N intra-op threads (0: PyTorch's
default)."""
import argparse
import json
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, heads, attention):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.out = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.heads, self.attention = heads, attention

    def forward(self, x, mask):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.attention == "sdpa":
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-1, -2)) * (1.0 / (c // self.heads) ** 0.5) + mask
            a = torch.softmax(s, dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, context, layers, heads, c, attention):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(256, c), nn.Parameter(torch.zeros(context, c))
        nn.init.normal_(self.wpe, std=0.01)
        self.blocks = nn.ModuleList(Block(c, heads, attention) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)
        mask = torch.full((context, context), -1e9).triu(1)
        self.register_buffer("mask", mask)

    def forward(self, x, y):
        h = self.wte(x) + self.wpe
        for b in self.blocks:
            h = b(h, self.mask)
        logits = self.ln_f(h) @ self.wte.weight.T
        return F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--embed", type=int, default=384)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--attention", choices=["math", "sdpa"], default="math")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--tf32", action="store_true")
    # autocast to bfloat16 (the products and attention in bf16, the
    # weights and the optimizer in fp32): PyTorch's counterpart of
    # tp-train --bf16's bf16 tensor-core products
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    torch.manual_seed(1)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    cuda = a.device == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()
    text = torch.tensor(np.frombuffer(open(a.data, "rb").read(), np.uint8).astype(np.int64),
                        device=dev)
    model = GPT(a.context, a.layers, a.heads, a.embed, a.attention).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.1)
    step = torch.compile(model) if a.compile else model
    offs = torch.arange(a.context, device=dev)
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            sync()
            t0 = time.perf_counter()
        start = torch.randint(0, text.numel() - a.context - 1, (a.batch, 1), device=dev)
        x, y = text[start + offs], text[start + offs + 1]
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.bf16):
            loss = step(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    sync()
    dt = time.perf_counter() - t0
    print(json.dumps({"peer": "pytorch", "attention": a.attention, "compile": a.compile,
                      "tf32": a.tf32, "bf16": a.bf16, "context": a.context, "layers": a.layers,
                      "embed": a.embed, "batch": a.batch, "steps": a.steps,
                      "tokens_per_s": round(a.steps * a.batch * a.context / dt),
                      "loss": round(loss.item(), 4), "torch": torch.__version__,
                      "device": torch.cuda.get_device_name() if cuda else "cpu",
                      "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
