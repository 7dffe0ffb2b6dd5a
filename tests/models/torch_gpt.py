#!/usr/bin/env python3
"""towerpack tests: the zoo's GPT in PyTorch (float64), from towerpack's
initial checkpoint (w0.safetensors, read by hand) and its batch (x.bin,
y.bin: int32 [4,16] tokens and next-byte targets), against towerpack's loss
(cost.bin) and gradients (d<variable>.bin, '/' written '.').

The model as GPT-2 writes it: wte[x] + wpe; per block h<l>: x + proj(causal
multi-head attention(ln1(x))), then x + mlp(ln2(x)) with a tanh GELU of 4x
width; ln_f; logits x wte^T (tied); cross-entropy. towerpack's W are [in,
out] (x @ W + b); qkv's output is q | k | v, each split into heads of
C / H as [B,T,H,D]. Exit 0 and "pytorch agrees" when the loss and every
gradient are within 1e-4 (absolute); 1 otherwise, naming the worst; 77
without torch."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_testutil import F, load, np, torch  # noqa: E402  (exits 77 without torch)

B, T, HEADS = 4, 16, 2
TOL = 1e-4


def main(d):
    w0 = load(f"{d}/w0.safetensors")
    t = {k: torch.tensor(v.copy(), dtype=torch.float64, requires_grad=True)
         for k, v in w0.items() if not k.startswith("optimizer/")}
    x = torch.tensor(np.fromfile(f"{d}/x.bin", dtype=np.int32).reshape(B, T).astype(np.int64))
    y = torch.tensor(np.fromfile(f"{d}/y.bin", dtype=np.int32).reshape(B, T).astype(np.int64))
    cost = float(np.fromfile(f"{d}/cost.bin", dtype=np.float32)[0])
    C = t["wte"].shape[1]
    D = C // HEADS
    layers = sorted({int(k.split("/")[0][1:]) for k in t if k.startswith("h")})

    def ln(h, s):
        return F.layer_norm(h, (C,), t[f"{s}/gamma"], t[f"{s}/beta"], eps=1e-5)

    def lin(h, s):
        return h @ t[f"{s}/W"] + t[f"{s}/b"]

    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    h = t["wte"][x] + t["wpe"]
    for l in layers:
        p = f"h{l}"
        q, k, v = lin(ln(h, f"{p}/ln1"), f"{p}/attn/qkv").split(C, dim=2)
        q, k, v = (z.reshape(B, T, HEADS, D).transpose(1, 2) for z in (q, k, v))
        s = (q @ k.transpose(-1, -2)) / D ** 0.5
        a = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1) @ v
        h = h + lin(a.transpose(1, 2).reshape(B, T, C), f"{p}/attn/proj")
        m = F.gelu(lin(ln(h, f"{p}/ln2"), f"{p}/mlp/fc"), approximate="tanh")
        h = h + lin(m, f"{p}/mlp/proj")
    logits = ln(h, "ln_f") @ t["wte"].T
    loss = F.cross_entropy(logits.reshape(B * T, 256), y.reshape(B * T))
    loss.backward()
    worst, worst_name, rows = abs(cost - float(loss)), "the loss", []
    for k, v in t.items():
        path = f"{d}/d{k.replace('/', '.')}.bin"
        if not os.path.exists(path):
            print(f"pytorch disagrees: towerpack wrote no gradient of {k}")
            return 1
        g = np.fromfile(path, dtype=np.float32).reshape(v.shape)
        err = float(np.max(np.abs(g - v.grad.numpy())))
        rows.append(f"{k} {err:.1e} (max |g| {float(v.grad.abs().max()):.1e})")
        if err > worst:
            worst, worst_name = err, k
    print("; ".join(rows))
    if worst > TOL:
        print(f"pytorch disagrees: {worst_name} off by {worst:.2e} (limit {TOL}); loss "
              f"towerpack {cost:.7f}, pytorch {float(loss):.7f}")
        return 1
    print(f"pytorch agrees: loss {cost:.7f} vs {float(loss):.7f}, every gradient within "
          f"{worst:.1e} (worst {worst_name}; limit {TOL})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
