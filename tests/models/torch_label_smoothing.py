#!/usr/bin/env python3
"""towerpack tests: a cross-entropy with smoothed labels against PyTorch's.
From towerpack's batch (x.bin float32 [16,12], y.bin int32 [16]), fc layer
(W.bin [12,10], b.bin [10]), loss (cost.bin) and gradients (dW.bin, db.bin)
with label smoothing 0.2: torch.nn.functional.cross_entropy(x @ W + b, y,
label_smoothing=0.2) in float64 and its gradients must agree within 1e-5
(loss) and 1e-5 of the largest gradient. Exit 0 and "pytorch agrees"; 1
otherwise; 77 without torch."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_testutil import F, np, torch, verdict  # noqa: E402  (exits 77 without torch)


def main(d):
    f32 = lambda name, shape: np.fromfile(f"{d}/{name}", dtype=np.float32).reshape(shape)
    x = torch.tensor(f32("x.bin", (16, 12)), dtype=torch.float64)
    y = torch.tensor(np.fromfile(f"{d}/y.bin", dtype=np.int32).astype(np.int64))
    w = torch.tensor(f32("W.bin", (12, 10)), dtype=torch.float64, requires_grad=True)
    b = torch.tensor(f32("b.bin", (10,)), dtype=torch.float64, requires_grad=True)
    loss = F.cross_entropy(x @ w + b, y, label_smoothing=0.2)
    loss.backward()
    ours = float(f32("cost.bin", (1,))[0])
    worst = 0.0
    for name, ref, shape in (("dW.bin", w.grad, (12, 10)), ("db.bin", b.grad, (10,))):
        got = f32(name, shape)
        want = ref.numpy()
        worst = max(worst, float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-30)))
    print(f"loss towerpack {ours:.7f}, pytorch {float(loss):.7f}; gradients within "
          f"{worst:.1e} of the largest")
    return verdict(abs(ours - float(loss)) <= 1e-5 and worst <= 1e-5)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
