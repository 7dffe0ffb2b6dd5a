#!/usr/bin/env python3
"""PyTorch eager's CPU training of towerpack's GPT, from towerpack's own
initial weights (issue 45, "Speed on the CPU"; bench/peers/gpt_cpu.sh).

  /usr/bin/python3 bench/peers/gpt_torch_cpu.py --init CKPT --data FILE
      --heads H --context T --batch B [--steps 6 --warmup 1 --threads N
      --lr 1e-3 --lr-warmup 0 --clip-norm 1 --plain --bf16]

The model is tests/models/torch_gpt.py's gpt_loss (the one the 20-step
parity test holds towerpack to), float32, its parameters read from CKPT (a
safetensors checkpoint of tp-train --model gpt: the layers, width and heads
come with it, --heads excepted); the recipe is tp-train's for the GPT:
AdamW betas 0.9/0.95, eps 1e-8, weight decay 0.1 on the matrices and
embeddings only, the global-norm clip; with --lr-warmup N the rate climbs
linearly from a tenth of --lr to it over the first N steps, then stays
(tp-train's --warmup-epochs with --lr-end 1, its linear schedule). Batches of
--batch random windows of --data (torch's generator, seed 1). By default
the model runs as PyTorch does at its fastest here (gpt_loss fast=True:
addmm linears, and the fused attention where torch has it); --plain runs
gpt_loss as the parity test does. Prints one JSON line: tokens/s over
--steps timed steps after --warmup, and the first steps' losses (from the
checkpoint's weights, the first is ln 256 ~ 5.55 on any text: a check that
both sides train the same model from the same start), the last, and the
highest after the first (above the first: the run diverged), and "cores":
the process's CPU time over the wall time of the timed steps. Debian's
torch does its GEMMs in OpenBLAS's pthread build, whose own pool (the
host's core count unless OPENBLAS_NUM_THREADS says otherwise) is apart
from torch.set_num_threads: at --threads 1 the products still run on every
core (cores ~1.8 on 2), and at --threads 2 each of torch's 2 OpenMP
threads drives OpenBLAS's 2 (4 busy threads on 2 cores: slower than 1).
--bf16: the forward and backward under torch.autocast("cpu", bfloat16),
PyTorch's mixed precision on the CPU (its linears and matmuls on oneDNN's
bf16 products, fp32 weights and optimizer), the peer of tp-train --bf16."""
import argparse
import json
import os
import sys
import time

repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(repo, "tests", "models"))
sys.path.insert(0, os.path.join(repo, "tests"))
from torch_gpt import gpt_loss, params  # noqa: E402
from torch_testutil import load, np, torch  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--init", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--context", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--lr-warmup", type=int, default=0,
                    help="steps of the rate's climb from lr/10 (0: constant)")
    ap.add_argument("--clip-norm", type=float, default=1.0)
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--bf16", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    t = params(load(a.init), torch.float32)
    decay = [v for v in t.values() if v.dim() >= 2]
    no_decay = [v for v in t.values() if v.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    text = torch.from_numpy(np.frombuffer(open(a.data, "rb").read(), np.uint8).astype(np.int64))
    T = a.context
    offs = torch.arange(T)
    g = torch.Generator().manual_seed(1)
    losses = []
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            t0, c0 = time.perf_counter(), time.process_time()
        if a.lr_warmup > 0:  # tp_lr_schedule_at's LinearLR from 0.1
            f = 0.1 + 0.9 * i / a.lr_warmup if i < a.lr_warmup else 1.0
            for grp in opt.param_groups:
                grp["lr"] = a.lr * f
        start = torch.randint(0, text.numel() - T - 1, (a.batch, 1), generator=g)
        x, y = text[start + offs], text[start + offs + 1]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            loss = gpt_loss(t, x, y, a.heads, fast=not a.plain)
        loss.backward()
        if a.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(list(t.values()), a.clip_norm)
        opt.step()
        losses.append(float(loss))
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    print(json.dumps({"peer": "pytorch", "threads": torch.get_num_threads(),
                      "fast": not a.plain, "bf16": a.bf16, "context": T, "batch": a.batch,
                      "layers": sum(1 for k in t if k.endswith("ln1/gamma")),
                      "embed": int(t["wte"].shape[1]), "steps": a.steps,
                      "tokens_per_s": round(a.steps * a.batch * T / dt),
                      "cores": round(cpu / dt, 2),
                      "first_losses": [round(v, 4) for v in losses[:3]],
                      "loss": round(losses[-1], 4), "max_loss": round(max(losses[1:]), 4),
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
