#!/usr/bin/env python3
"""Learning curves of towerpack's GPT and PyTorch's same model, side by side
(issue 45, "Learning"; docs/training.md, "Learning against PyTorch").

  /usr/bin/python3 bench/peers/gpt_curve.py --out DIR [--steps 600]
      [--eval-every 100] [--layers 4 --embed 256 --heads 4 --context 128
      --batch 8 --lr 1e-3 --warmup 60] [--text FILE] [--tp-train PATH]
      [--nice 10]

The text (default: docs/*.md concatenated, ~0.84 MB) is cut in two files:
the first 90% is the training text, the last 10% (or its first
--val-bytes, to keep evaluations cheap; trimmed to whole batches of
windows) the validation text. Both sides then train the byte
GPT of models/zoo_gpt.c from the SAME initial weights (towerpack's, read
from a checkpoint of a run whose one step changes nothing: a rate of 1e-30)
with the same recipe: AdamW betas 0.9/0.95, eps 1e-8, weight decay 0.1 on
the matrices and embeddings only, global-norm clip 1.0, the rate climbing
linearly from lr/10 to lr over --warmup steps then a half cosine down to 0
at --steps (tp_lr_schedule_at's formula), batches of --batch random
windows of the training text, one thread each, run concurrently under
nice. The batches are NOT the same: towerpack draws its windows with its
own generator (seed 1) and PyTorch with torch's (seed 1), from the same
training text (same distribution, different draws).

Every --eval-every steps both measure the validation cross-entropy over
all consecutive windows of the validation text, in bits per byte:
towerpack's validation_bpb in LOGDIR/stats.json, PyTorch's the mean
per-token cross-entropy / ln 2. Writes DIR/curve.csv (step, towerpack_bpb,
pytorch_bpb, difference, training losses, elapsed seconds) and
DIR/curve.json, and prints the table as markdown.

The PyTorch model is tests/models/torch_gpt.py's gpt_loss (the model the
20-step parity test checks against towerpack), float32."""
import argparse
import glob
import json
import math
import os
import subprocess
import sys
import threading
import time

repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(repo, "tests", "models"))
sys.path.insert(0, os.path.join(repo, "tests"))
from torch_gpt import gpt_loss, params  # noqa: E402
from torch_testutil import load, np, torch  # noqa: E402


def schedule(a, step):
    """tp_lr_schedule_at (pipeline/callbacks/cb_hyperparam.c): LinearLR
    from 0.1 over the warm-up, then cosine to 0 at --steps."""
    if step < a.warmup:
        return a.lr * (0.1 + 0.9 * step / a.warmup)
    x = min(1.0, (step - a.warmup) / (a.steps - a.warmup))
    return a.lr * (1 + math.cos(math.pi * x)) / 2


def tp_args(a, logdir, train, val):
    return ["nice", "-n", str(a.nice), a.tp_train, "--model", "gpt",
            "--data", f"text:{train},val=0", "--test-data", f"text:{val},random=0",
            "--layers", str(a.layers), "--embed", str(a.embed), "--heads", str(a.heads),
            "--context", str(a.context), "--batch", str(a.batch), "--towers", "1",
            "--threads", "1", "--optimizer", "adamw", "--lr", str(a.lr),
            "--beta1", "0.9", "--beta2", "0.95", "--weight-decay", "0.1",
            "--clip-norm", "1", "--lr-schedule", "cosine",
            "--seed", "1", "--no-tensorboard", "--stats", "off",
            "--logdir", logdir, "--logdir-action", "delete"]


def initial_weights(a, train, val):
    """towerpack's initial weights: one step at a rate of 1e-30 (the zero
    biases become +-1e-30, no other weight changes in float32; --freeze
    '*' would say it plainly, but tp-train refuses a step with no gradient
    at all)."""
    d = os.path.join(a.out, "tp-init")
    cmd = tp_args(a, d, train, val) + ["--epochs", "1", "--steps-per-epoch", "1"]
    cmd[cmd.index("--lr") + 1] = "1e-30"
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL,
                   stderr=open(os.path.join(a.out, "tp-init.log"), "w"))
    ck = sorted(glob.glob(os.path.join(d, "*.safetensors")))
    if not ck:
        sys.exit(f"gpt_curve: no checkpoint in {d} (see {a.out}/tp-init.log)")
    st = [r for r in json.load(open(os.path.join(d, "stats.json"))) if "validation_bpb" in r]
    return ck[-1], st[-1]["validation_bpb"]


def torch_run(a, w0, train, val, log):
    torch.set_num_threads(1)
    torch.manual_seed(1)
    t = params(w0, torch.float32)
    decay = [v for k, v in t.items() if v.dim() >= 2]
    no_decay = [v for k, v in t.items() if v.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    tr = torch.from_numpy(np.frombuffer(open(train, "rb").read(), np.uint8).astype(np.int64))
    vb = torch.from_numpy(np.frombuffer(open(val, "rb").read(), np.uint8).astype(np.int64))
    T = a.context
    nv = (vb.numel() - 1) // T
    vx = vb[:nv * T].view(nv, T)
    vy = vb[1:nv * T + 1].view(nv, T)
    offs = torch.arange(T)
    g = torch.Generator().manual_seed(1)
    out, losses, t0 = {}, [], time.perf_counter()

    def evaluate():
        with torch.no_grad():
            tot = 0.0
            for i in range(0, nv, a.batch):
                tot += float(gpt_loss(t, vx[i:i + a.batch], vy[i:i + a.batch], a.heads)) * \
                    vx[i:i + a.batch].shape[0]
        return tot / nv / math.log(2)

    out[0] = {"bpb": evaluate(), "loss": None, "elapsed_s": 0.0}
    print(json.dumps({"peer": "pytorch", "step": 0, **out[0]}), file=log, flush=True)
    for s in range(a.steps):
        for grp in opt.param_groups:
            grp["lr"] = schedule(a, s)
        start = torch.randint(0, tr.numel() - T - 1, (a.batch, 1), generator=g)
        x, y = tr[start + offs], tr[start + offs + 1]
        opt.zero_grad(set_to_none=True)
        loss = gpt_loss(t, x, y, a.heads)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(t.values()), 1.0)
        opt.step()
        losses.append(float(loss))
        if (s + 1) % a.eval_every == 0:
            bpb = evaluate()
            out[s + 1] = {"bpb": bpb, "loss": float(np.mean(losses[-a.eval_every:])),
                          "elapsed_s": time.perf_counter() - t0}
            print(json.dumps({"peer": "pytorch", "step": s + 1, **out[s + 1]}), file=log,
                  flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--text")
    ap.add_argument("--tp-train", default=os.path.join(repo, "build", "bin", "tp-train"))
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--embed", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--nice", type=int, default=10)
    ap.add_argument("--val-bytes", type=int, default=0,
                    help="validate on the held-out tenth's first N bytes only (0: all)")
    a = ap.parse_args()
    if a.steps % a.eval_every:
        sys.exit("gpt_curve: --steps must be a multiple of --eval-every")
    os.makedirs(a.out, exist_ok=True)
    if a.text:
        text = open(a.text, "rb").read()
    else:
        text = b"".join(open(f, "rb").read() for f in sorted(glob.glob(f"{repo}/docs/*.md")))
    cut = len(text) - len(text) // 10
    T, B = a.context, a.batch
    held = len(text) - cut if a.val_bytes <= 0 else min(a.val_bytes, len(text) - cut)
    nval = ((held - 1) // (T * B)) * T * B + 1  # whole batches of windows
    train, val = os.path.join(a.out, "train.txt"), os.path.join(a.out, "val.txt")
    open(train, "wb").write(text[:cut])
    open(val, "wb").write(text[cut:cut + nval])
    ck, tp_bpb0 = initial_weights(a, train, val)
    w0 = load(ck)
    epochs = a.steps // a.eval_every
    logdir = os.path.join(a.out, "tp")
    cmd = tp_args(a, logdir, train, val) + [
        "--epochs", str(epochs), "--steps-per-epoch", str(a.eval_every),
        "--warmup-epochs", repr(a.warmup / a.eval_every)]
    with open(os.path.join(a.out, "command.txt"), "w") as f:
        f.write(" ".join(cmd) + "\n")
    tp_t0 = time.time()
    tp = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                          stderr=open(os.path.join(a.out, "tp.log"), "w"))
    tp_end = []  # when tp-train ends (it may end before or after PyTorch)
    waiter = threading.Thread(target=lambda: (tp.wait(), tp_end.append(time.time())))
    waiter.start()
    os.nice(a.nice)
    with open(os.path.join(a.out, "pytorch.jsonl"), "w") as log:
        pt = torch_run(a, w0, train, val, log)
    waiter.join()
    if tp.returncode != 0:
        sys.exit(f"gpt_curve: tp-train failed (see {a.out}/tp.log)")
    tp_wall = tp_end[0] - tp_t0
    stats = [r for r in json.load(open(os.path.join(logdir, "stats.json")))
             if "validation_bpb" in r]
    rows = [{"step": 0, "towerpack_bpb": tp_bpb0, "pytorch_bpb": pt[0]["bpb"],
             "difference": tp_bpb0 - pt[0]["bpb"], "towerpack_train_nats": None,
             "pytorch_train_nats": None, "pytorch_elapsed_s": 0.0}]
    for r in stats:
        s = int(r.get("global_step", r.get("epoch_num", 0) * a.eval_every))
        p = pt.get(s)
        if p is None:
            continue
        rows.append({"step": s, "towerpack_bpb": r["validation_bpb"], "pytorch_bpb": p["bpb"],
                     "difference": r["validation_bpb"] - p["bpb"],
                     "towerpack_train_nats": r.get("cost"), "pytorch_train_nats": p["loss"],
                     "pytorch_elapsed_s": p["elapsed_s"]})
    meta = {"text_bytes": len(text), "train_bytes": cut, "val_bytes": nval,
            "layers": a.layers, "embed": a.embed, "heads": a.heads, "context": T,
            "batch": B, "lr": a.lr, "warmup": a.warmup, "steps": a.steps,
            "towerpack_wall_s": round(tp_wall, 1),
            "pytorch_wall_s": round(pt[max(pt)]["elapsed_s"], 1), "torch": torch.__version__,
            "tp_command": " ".join(cmd)}
    json.dump({"meta": meta, "rows": rows}, open(os.path.join(a.out, "curve.json"), "w"),
              indent=1)
    with open(os.path.join(a.out, "curve.csv"), "w") as f:
        f.write(",".join(rows[0].keys()) + "\n" if rows else "")
        for r in rows:
            f.write(",".join(str(v) for v in r.values()) + "\n")
    print("| step | towerpack bpb | PyTorch bpb | difference | train nats tp / torch |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        tn = r["towerpack_train_nats"]
        print(f"| {r['step']} | {r['towerpack_bpb']:.4f} | {r['pytorch_bpb']:.4f} | "
              f"{r['difference']:+.4f} | {tn if tn is None else round(tn, 3)} / "
              f"{r['pytorch_train_nats'] if r['pytorch_train_nats'] is None else round(r['pytorch_train_nats'], 3)} |")
    print(f"gpt_curve: {json.dumps(meta)}")


if __name__ == "__main__":
    main()
