#!/usr/bin/env python3
"""towerpack tests: a few training steps of a small MLP in PyTorch (float64)
with torch.optim's optimizer and gradient processing, against towerpack's
(tests/models/test_proc_torch_step.c, torch_step/optim_*).

For every case named in cases.txt (one a line: NAME OPTIMIZER LR WD CLIP
EMA STEPS TOWERS MULTS ACCUMULATE, MULTS "-" or PATTERN=MULT,... in order): NAME_w0.safetensors (the weights before), NAME_x.bin (float32
[STEPS, TOWERS*B, 12]) and NAME_y.bin (int32 [STEPS, TOWERS*B]), the batches
(each step's rows are all towers' batches, one after another: the towers'
mean gradient is the gradient of the mean over all rows), and
NAME_w1.safetensors, towerpack's weights after the STEPS steps. The model:
fc0 12->16 (towerpack's W is [in, out]), relu, fc1 16->10, mean
cross-entropy. Each step: backward, torch.nn.utils.clip_grad_norm_(CLIP)
when CLIP > 0, then torch.optim.AdamW(LR, betas (0.9, 0.999), eps 1e-8,
weight_decay WD) or Adam, or torch.optim.SGD(LR, momentum 0.9, weight_decay
WD: on the matrices only for "sgd", on every weight for "sgd-all"); with EMA > 0 the weights' average after the
step, ema = EMA x ema + (1 - EMA) x w from the initial weights (timm's
ModelEmaV2), against towerpack's optimizer/<var>/ema. Learning-rate
multipliers are parameter groups (each variable in the group of the first
pattern it matches, fnmatch, at LR x MULT); a multiplier 0 freezes
(requires_grad False, in no group). ACCUMULATE K > 1: each step's loss
divided by K goes backward into the accumulated .grad, and every K-th step
clips, steps the optimizer and the average, and zeroes the gradients.
Exit 0 and "pytorch agrees" when every weight is
within 2e-6 + 1e-4 x its total travel of PyTorch's; 1 otherwise (naming the
worst); 77 without torch. A case with a clip must clip at least one step."""
import fnmatch
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_testutil import F, load, np, torch, verdict  # noqa: E402  (exits 77 without torch)

NAMES = ["fc0/W", "fc0/b", "fc1/W", "fc1/b"]


def run_case(d, name, opt, lr, wd, clip, ema_decay, steps, towers, mults, accumulate):
    w0, w1 = load(f"{d}/{name}_w0.safetensors"), load(f"{d}/{name}_w1.safetensors")
    x = np.fromfile(f"{d}/{name}_x.bin", dtype=np.float32).reshape(steps, -1, 12)
    y = np.fromfile(f"{d}/{name}_y.bin", dtype=np.int32).reshape(steps, -1).astype(np.int64)
    rules = [(r.split("=")[0], float(r.split("=")[1])) for r in mults.split(",")
             if mults != "-"]
    mult = [next((m for pat, m in rules if fnmatch.fnmatchcase(k, pat)), 1.0) for k in NAMES]
    p = [torch.tensor(w0[k].astype(np.float64), requires_grad=m > 0) for k, m in zip(NAMES, mult)]
    groups = [{"params": [t], "lr": lr * m} for t, m in zip(p, mult) if m > 0]
    if opt.startswith("sgd"):
        # coupled L2 on the matrices ("sgd", tp-train's) or on all ("sgd-all")
        for g, k in zip(groups, [k for k, m in zip(NAMES, mult) if m > 0]):
            g["weight_decay"] = 0.0 if opt == "sgd" and k.endswith("/b") else wd
        o = torch.optim.SGD(groups, lr=lr, momentum=0.9)
    elif opt == "adamw":
        o = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)
    else:
        o = torch.optim.Adam(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8)
    clipped = 0
    ema = [t.detach().clone() for t in p]
    for s in range(steps):
        h = F.relu(torch.tensor(x[s], dtype=torch.float64) @ p[0] + p[1])
        (F.cross_entropy(h @ p[2] + p[3], torch.tensor(y[s])) / accumulate).backward()
        if (s + 1) % accumulate:
            continue  # accumulating
        if clip > 0:
            norm = float(torch.nn.utils.clip_grad_norm_([t for t in p if t.requires_grad],
                                                         clip))
            clipped += norm > clip
        o.step()
        o.zero_grad()
        with torch.no_grad():
            for e, t in zip(ema, p):
                e.mul_(ema_decay).add_(t, alpha=1 - ema_decay)
    worst, worst_name, rows = 0.0, "", []
    pairs = list(zip(NAMES, [t.detach() for t in p]))
    if ema_decay > 0:
        pairs += [(f"optimizer/{k}/ema", e) for k, e, m in zip(NAMES, ema, mult) if m > 0]
        for k in [k for k, m in zip(NAMES, mult) if m > 0]:  # it starts at the weights
            if not np.array_equal(w0[f"optimizer/{k}/ema"], w0[k]):
                print(f"{name}: optimizer/{k}/ema does not start at {k}")
                return False
    for k, t in pairs:
        want = t.numpy()
        travel = float(np.max(np.abs(want - w0[k.removeprefix("optimizer/").removesuffix("/ema")])))
        if travel == 0 and not np.array_equal(w1[k], w0[k]):
            print(f"{name} {k}: frozen, but towerpack moved it")
            return False
        err = float(np.max(np.abs(w1[k] - want)))
        rel = err / (2e-6 + 1e-4 * travel)
        rows.append(f"{name} {k}: |d| {err:.2e}, travel {travel:.2e}")
        if rel > worst:
            worst, worst_name = rel, f"{name} {k}"
    ok = worst <= 1.0
    # every weight's line when the case fails; one line when it agrees (the
    # C side reads 4 KiB of this output, which ends with the verdict)
    print("\n".join(rows) if not ok else f"{name}: within {worst:.2f} x the tolerance")
    if clip > 0 and clipped == 0:
        print(f"{name}: the clip {clip} never clipped: the case tests nothing")
        ok = False
    elif clip > 0:
        print(f"{name}: {clipped} of {steps // accumulate} updates clipped")
    if not ok:
        print(f"worst: {worst_name} ({worst:.2f} x the tolerance)")
    return ok


def main(d):
    ok = True
    for line in open(f"{d}/cases.txt"):
        f = line.split()
        if f:
            ok &= run_case(d, f[0], f[1], float(f[2]), float(f[3]), float(f[4]),
                           float(f[5]), int(f[6]), int(f[7]), f[8], int(f[9]))
    return verdict(ok)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
