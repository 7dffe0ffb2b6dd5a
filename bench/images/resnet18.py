#!/usr/bin/python3
"""ResNet-18 at 112 x 112 on a folder of JPEGs, decode + augment + train
step, towerpack against PyTorch with torchvision (issue 43).

  nice /usr/bin/python3 bench/images/resnet18.py [--build DIR] [--dir DIR]
        [--batch 16] [--warmup 6] [--steps 10] [--rounds 2] [--checkpoints] [--plots]
        [--tp 2x1,1x1,1x2] [--torch 0x1,0x2,1x1,1x2,2x1,2x2] [--bf16]

The folder: the synthetic colour data set (bench/images/gen_colour.py:
3 classes x 128 JPEGs of 128 x 128), made when missing. Both sides train
torchvision's ResNet-18 layout (7x7 stem, max-pool, 3 classes) by SGD with
momentum 0.9 and weight decay 1e-4 at a total batch of --batch, on the same
ImageNet augmentation: random-resized crop 0.08-1 to 112, flip,
brightness/contrast/saturation jitter 0.4, PCA lighting noise 0.1,
normalisation.

The same clock on both sides: --warmup untimed steps (the first runs build
oneDNN's kernels and fill the input), then --steps timed steps, each from
asking for its batch to the end of its update, data loading included.

  towerpack  tp-train --model resnet18 --image-size 112 --augment imagenet,
             the pipeline in-process, with --steps-per-epoch WARMUP: epoch 1
             is the warm-up, epochs 2.. the timed steps; images/s = the
             timed images / the sum of those epochs' times (stats.json's
             steps_per_s: from the epoch's first step to its last, the
             epoch-end validation not in it). --no-checkpoints: the peer
             saves nothing, and a checkpoint (45 MB of weights and as much
             of momentum) is written by its own thread while the next
             epoch's steps run, about 0.1 CPU s a save, which at these
             2-step epochs took 10-25% of the timed steps' cores (a real
             epoch of this folder is 24 steps). The epochs are WARMUP
             steps long (6 by default; 2 until session 29): each ends in
             validation, whose pass leaves the next epoch's first step
             cold, which 2-step epochs paid every other step (3-4% of the
             loop; 1.52x against 1.72x PyTorch in one sitting) and a real
             epoch amortises; the peer validates nothing. --no-plots
             (since session 34): the peer draws no plot, and tp-train's
             CurvePlotter draws curves.png (~20 ms of a core) on the
             callback actor while the next epoch's first step runs.
             Configurations
             TOWERSxTHREADS: --tp 2x1 is tp-train's default on 2 cores.
  PyTorch    bench/peers/resnet18_torch.py --lighting 0.1: ImageFolder (PIL)
             + DataLoader; configurations WORKERSxTHREADS (DataLoader
             workers x torch threads).

--bf16: both sides in bf16, like for like (issues 43 and 44): towerpack's
runs get tp-train --bf16 (the matrix products and the direct convolutions
on bf16 operands, fp32 sums; docs/compute.md) and PyTorch's step runs its
forward and loss under torch.autocast("cpu", bfloat16) (resnet18_torch.py
--bf16). The precision is checked, not assumed: towerpack's bf16 runs log
at info (the fp32 runs at warn, as always) and must say "bf16: the CPU's
matrix products on bf16 operands" (a CPU without bf16 dot products says
it keeps fp32 instead, and the bench stops), and PyTorch's model output
must be bfloat16. The report then says the precision. Without --bf16 the
bench is fp32, its output as before.

Every round runs each configuration once, the two sides' runs interleaved
(towerpack, PyTorch, towerpack, ...), the order reversed in odd rounds, so a
burst of load falls on both. A round's ratio is its best towerpack run over
its best PyTorch run; the figure is the median of the rounds' ratios. The
load average is printed with each run: on a shared machine read the ratio,
not the images/s. Prints a markdown table and one JSON line."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = "/usr/bin/python3"


def s_pairs(text, what):
    out = []
    for item in text.split(","):
        try:
            a, b = item.lower().split("x")
            out.append((int(a), int(b)))
        except ValueError:
            sys.exit("%s: '%s' is not AxB (e.g. 2x1)" % (what, item))
    return out


def towerpack(a, train, test, towers, threads):
    logdir = tempfile.mkdtemp(prefix="tp-r18-")
    epochs = 1 + -(-a.steps // a.warmup)  # epoch 1 warms up, the rest are timed
    cmd = [os.path.join(a.build, "bin", "tp-train"), "--model", "resnet18",
           "--data", "imagefolder:" + train, "--test-data", "imagefolder:" + test,
           "--image-size", "112", "--augment", "imagenet", "--towers", str(towers),
           "--threads", str(threads), "--batch", str(a.batch // towers),
           "--steps-per-epoch", str(a.warmup), "--epochs", str(epochs),
           "--logdir", logdir, "--logdir-action", "delete", "--no-tensorboard",
           "--stats", "off"] + ([] if a.checkpoints else ["--no-checkpoints"]) \
        + ([] if a.plots else ["--no-plots"]) + (["--bf16"] if a.bf16 else [])
    # bf16 runs log at info: tp-train says there whether the products run in bf16
    r = subprocess.run(cmd, capture_output=True, text=True,
                       env=dict(os.environ, TP_LOG_LEVEL="info" if a.bf16 else "warn"))
    if r.returncode != 0:
        sys.exit("tp-train failed:\n" + r.stdout[-2000:] + r.stderr[-2000:])
    if a.bf16 and "bf16: the CPU's matrix products on bf16 operands" not in r.stderr:
        sys.exit("tp-train --bf16 did not say it runs in bf16:\n" + r.stderr[-2000:])
    stats = json.load(open(os.path.join(logdir, "stats.json")))
    shutil.rmtree(logdir, ignore_errors=True)
    timed = [e for e in stats if e.get("epoch_num", 0) >= 2 and e.get("steps_per_s")]
    if len(timed) != epochs - 1:
        sys.exit("tp-train: stats.json has %d timed epochs, expected %d" % (len(timed),
                                                                          epochs - 1))
    seconds = sum(a.warmup / e["steps_per_s"] for e in timed)
    images = a.warmup * len(timed) * (a.batch // towers) * towers
    return images / seconds, " ".join(cmd[1:]).replace(logdir, "LOGDIR")


def pytorch(a, train, workers, threads):
    steps = -(-a.steps // a.warmup) * a.warmup  # as many as towerpack's
    cmd = [PY, os.path.join(ROOT, "bench", "peers", "resnet18_torch.py"), "--dir", train,
           "--batch", str(a.batch), "--workers", str(workers), "--threads", str(threads),
           "--warmup", str(a.warmup), "--steps", str(steps), "--lighting", "0.1",
           "--weight-decay", "1e-4"] + (["--bf16"] if a.bf16 else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("the PyTorch peer failed:\n" + r.stderr[-2000:])
    j = json.loads(r.stdout.strip().splitlines()[-1])
    if a.bf16 and j.get("logits_dtype") != "bfloat16":
        sys.exit("the PyTorch peer under autocast gave %s logits, not bfloat16"
                 % j.get("logits_dtype"))
    return j


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--dir", default="/tmp/towerpack-bench-colour")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--checkpoints", action="store_true",
                    help="let tp-train save a checkpoint every epoch, as this bench "
                         "did before session 27 (its writer runs in the timed epochs)")
    ap.add_argument("--plots", action="store_true",
                    help="let tp-train draw curves.png every epoch, as this bench did "
                         "before session 34 (the drawing runs in the timed epochs)")
    ap.add_argument("--tp", default="2x1,1x1,1x2", help="towerpack's TOWERSxTHREADS")
    ap.add_argument("--torch", default="0x1,0x2,1x1,1x2,2x1,2x2",
                    help="PyTorch's DataLoader WORKERSxTHREADS")
    ap.add_argument("--bf16", action="store_true",
                    help="both sides in bf16: tp-train --bf16 against PyTorch under "
                         "torch.autocast(bfloat16)")
    a = ap.parse_args()
    if a.warmup < 1 or a.steps < 1 or a.rounds < 1:
        sys.exit("--warmup, --steps and --rounds must be >= 1")
    tp_configs, configs = s_pairs(a.tp, "--tp"), s_pairs(a.torch, "--torch")
    for tw, _ in tp_configs:
        if tw < 1 or a.batch % tw:
            sys.exit("--tp: %d towers do not divide --batch %d" % (tw, a.batch))
    try:
        import torchvision  # noqa: F401
    except ImportError:
        sys.exit("no torchvision: apt-get install python3-torchvision (scripts/install-deps.sh)")
    train, test = os.path.join(a.dir, "train"), os.path.join(a.dir, "test")
    if not os.path.isdir(train):
        subprocess.run([PY, os.path.join(ROOT, "bench", "images", "gen_colour.py"), train,
                        "128", "128"], check=True)
        # validation is not timed: one image a class
        for c in sorted(os.listdir(train)):
            os.makedirs(os.path.join(test, c), exist_ok=True)
            shutil.copy(os.path.join(train, c, "0000.jpg"), os.path.join(test, c))
    runs = []  # interleaved: ("tp", cfg), ("torch", cfg), ...
    for i in range(max(len(tp_configs), len(configs))):
        if i < len(tp_configs):
            runs.append(("tp", tp_configs[i]))
        if i < len(configs):
            runs.append(("torch", configs[i]))
    res = {("tp", c): [] for c in tp_configs}
    res.update({("torch", c): [] for c in configs})
    ratios, loads, cmds, version = [], [], {}, "?"
    for rnd in range(a.rounds):
        best = {"tp": 0.0, "torch": 0.0}
        for side, cfg in (runs if rnd % 2 == 0 else runs[::-1]):
            load0 = os.getloadavg()[0]
            if side == "tp":
                v, cmds[cfg] = towerpack(a, train, test, *cfg)
                what = "towerpack towers %d threads %d" % cfg
            else:
                j = pytorch(a, train, *cfg)
                v, version = j["images_per_s"], j["torch"]
                what = "PyTorch workers %d threads %d" % cfg
            load1 = os.getloadavg()[0]
            loads += [load0, load1]
            res[(side, cfg)].append(v)
            best[side] = max(best[side], v)
            print("round %d: %-32s %7.2f images/s  (load %.1f -> %.1f)"
                  % (rnd + 1, what, v, load0, load1), flush=True)
        ratios.append(best["tp"] / best["torch"])
        print("round %d: ratio towerpack's best / PyTorch's best = %.2f"
              % (rnd + 1, ratios[-1]), flush=True)
    ratio = statistics.median(ratios)

    def cell(side, cfg):
        return ", ".join("%.2f" % v for v in res[(side, cfg)])

    best_torch = max(configs, key=lambda c: statistics.median(res[("torch", c)]))
    best_tp = max(tp_configs, key=lambda c: statistics.median(res[("tp", c)]))
    print()
    print("| side | configuration | images/s, round 1%s |"
          % "".join(", %d" % (r + 1) for r in range(1, a.rounds)))
    print("| --- | --- | --- |")
    for w, t in configs:
        print("| PyTorch %s | DataLoader workers %d, torch threads %d | %s |"
              % (version, w, t, cell("torch", (w, t))))
    for tw, th in tp_configs:
        print("| towerpack | %d tower%s x batch %d, %d thread%s each%s | %s |"
              % (tw, "s" if tw > 1 else "", a.batch // tw, th, "s" if th > 1 else "",
                 " (tp-train's default)" if (tw, th) == (2, 1) else "", cell("tp", (tw, th))))
    print("| **ratio** | each round's best towerpack / best PyTorch: %s; median | **%.2f** |"
          % (", ".join("%.2f" % r for r in ratios), ratio))
    print()
    print("load average during the runs: %.1f-%.1f; %d warm-up + %d timed steps of %d "
          "images a run" % (min(loads), max(loads), a.warmup,
                            -(-a.steps // a.warmup) * a.warmup, a.batch))
    print("towerpack's best (median over rounds): tp-train " + cmds[best_tp])
    if a.bf16:
        print("precision: bf16 on both sides (tp-train --bf16, which said so in its log; "
              "PyTorch under torch.autocast(\"cpu\", bfloat16), its logits bfloat16)")
    print(json.dumps(dict({"ratio": ratio, "round_ratios": ratios,
                      "towerpack": {"%dx%d" % c: res[("tp", c)] for c in tp_configs},
                      "pytorch": {"%dx%d" % c: res[("torch", c)] for c in configs},
                      "towerpack_best_config": "%dx%d" % best_tp,
                      "pytorch_best_config": "%dx%d" % best_torch,
                      "batch": a.batch, "warmup": a.warmup, "steps": a.steps,
                      "rounds": a.rounds, "load": [min(loads), max(loads)],
                      "torch": version}, **({"precision": "bf16"} if a.bf16 else {}))))


if __name__ == "__main__":
    main()
