#!/usr/bin/env python3
"""towerpack tests: one training step of the zoo's cnn-bn in PyTorch
(float64), from towerpack's checkpoint before the step (w0.safetensors),
its batch (x.bin uint8 [8,28,28], y.bin int32 [8]) and its dropout layer's
output (dropout.bin, whose zeros are the mask), against towerpack's loss
(cost.bin) and checkpoint after the step (w1.safetensors).

The model and recipe as PyTorch writes them: conv3x3 without bias, batch
norm in training mode (normalised with the batch's biased variance; the
moving averages take the unbiased one with momentum 0.1), relu, max-pool
2, three times; flatten; fc 256, relu, dropout 0.3 (kept units scaled by
1/0.7); fc 10; cross-entropy; L2 weight decay 5e-4 on the conv kernels
and fc weights (the same gradient as SGD's weight_decay there); SGD with
momentum 0.9 and learning rate 0.02. Exit 0 and "pytorch agrees" when
every variable is within 1e-3 of the step's size and the loss within
1e-5; 1 otherwise (naming the worst); 77 without torch."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_testutil import F, load, np, torch  # noqa: E402  (exits 77 without torch)


def main(d):
    w0, w1 = load(f"{d}/w0.safetensors"), load(f"{d}/w1.safetensors")
    x = np.fromfile(f"{d}/x.bin", dtype=np.uint8).reshape(8, 1, 28, 28)
    y = np.fromfile(f"{d}/y.bin", dtype=np.int32).astype(np.int64)
    drop = np.fromfile(f"{d}/dropout.bin", dtype=np.float32).reshape(8, 256)
    cost = float(np.fromfile(f"{d}/cost.bin", dtype=np.float32)[0])
    t = {k: torch.tensor(v.copy(), dtype=torch.float64, requires_grad=not k.endswith("EMA"))
         for k, v in w0.items() if not k.startswith("optimizer/")}
    h = torch.tensor(x, dtype=torch.float64) / 255.0
    batch_stats = {}
    for i in range(3):
        c = f"conv{i}"
        h = F.conv2d(h, t[f"{c}/W"], padding=1)
        mean = h.mean(dim=(0, 2, 3))
        batch_stats[c] = (mean.detach().numpy(),
                          h.var(dim=(0, 2, 3), unbiased=True).detach().numpy())
        h = F.batch_norm(h, None, None, t[f"{c}/bn/gamma"], t[f"{c}/bn/beta"],
                         training=True, eps=1e-5)
        h = F.max_pool2d(F.relu(h), 2)
    h = F.relu(h.flatten(1) @ t["fc0/W"] + t["fc0/b"])  # towerpack's W is [in, out]
    h = h * torch.tensor((drop != 0).astype(np.float64)) / (1.0 - 0.3)
    logits = h @ t["linear/W"] + t["linear/b"]
    xent = F.cross_entropy(logits, torch.tensor(y))
    decayed = ["conv0/W", "conv1/W", "conv2/W", "fc0/W", "linear/W"]
    (xent + 5e-4 / 2 * sum((t[k] ** 2).sum() for k in decayed)).backward()
    rows, worst, worst_name = [], 0.0, ""
    for k, v in t.items():
        if k.endswith("EMA"):
            continue
        want = (v - 0.02 * v.grad).detach().numpy()  # momentum's first step: v = g
        rel = float(np.max(np.abs(w1[k] - want)) / (np.max(np.abs(want - w0[k])) + 1e-30))
        rows.append(f"{k}: {rel:.1e} of the step")
        if rel > worst:
            worst, worst_name = rel, k
    for c, (mean, var) in batch_stats.items():
        for name, batch in (("mean", mean), ("variance", var)):
            k = f"{c}/bn/{name}/EMA"
            want = 0.9 * w0[k] + 0.1 * batch
            rel = float(np.max(np.abs(w1[k] - want)) / (np.max(np.abs(want)) + 1e-30))
            rows.append(f"{k}: {rel:.1e}")
            if rel > worst:
                worst, worst_name = rel, k
    dcost = abs(cost - float(xent))
    print("; ".join(rows))
    if worst > 1e-3 or dcost > 1e-5:
        print(f"pytorch disagrees: {worst_name} off by {worst:.2e} of the step; loss "
              f"towerpack {cost:.7f}, pytorch {float(xent):.7f}")
        return 1
    print(f"pytorch agrees: every variable within {worst:.1e} of the step "
          f"(worst {worst_name}), loss {cost:.6f} vs {float(xent):.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
