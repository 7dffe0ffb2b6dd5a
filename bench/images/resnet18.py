#!/usr/bin/python3
"""ResNet-18 at 112 x 112 on a folder of JPEGs, decode + augment + train
step, towerpack against PyTorch with torchvision (issue 43).

  /usr/bin/python3 bench/images/resnet18.py [--build DIR] [--dir DIR]
        [--batch 16] [--steps 4] [--rounds 1]

The folder: the synthetic colour data set (bench/images/gen_colour.py:
3 classes x 128 JPEGs of 128 x 128), made when missing. Both sides train
torchvision's ResNet-18 layout (7x7 stem, max-pool, 3 classes) by SGD with
momentum 0.9 at a total batch of --batch, on the ImageNet augmentation
(random-resized crop 0.08-1 to 112, flip, brightness/contrast/saturation
jitter 0.4, normalisation; towerpack's `--augment imagenet` adds its
lighting noise):

  towerpack  tp-train --model resnet18 --image-size 112 --augment imagenet,
             the pipeline in-process, at its default for 2 cores (2 towers,
             1 BLAS thread each) and at 1 tower x 1 and 2 threads; the best
             of the three is towerpack's; images/s: stats.json's throughput
             of epoch 2 (--steps steps an epoch; epoch 1 warms up)
  PyTorch    bench/peers/resnet18_torch.py: ImageFolder (PIL), DataLoader
             with 0, 1 and 2 workers x torch threads 1 and 2, --steps steps
             timed after one untimed; the best of the six is PyTorch's

Rounds alternate the two sides. Prints a markdown table (every PyTorch
configuration, the best, towerpack, the ratio towerpack / best) and one
JSON line."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = "/usr/bin/python3"


def towerpack(build, data, test, batch, steps, towers, threads):
    logdir = tempfile.mkdtemp(prefix="tp-r18-")
    cmd = [os.path.join(build, "bin", "tp-train"), "--model", "resnet18",
           "--data", "imagefolder:" + data, "--test-data", "imagefolder:" + test,
           "--image-size", "112", "--augment", "imagenet", "--towers", str(towers),
           "--threads", str(threads),
           "--batch", str(batch // towers), "--steps-per-epoch", str(steps), "--epochs", "2",
           "--logdir", logdir, "--logdir-action", "delete", "--no-tensorboard",
           "--stats", "off"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ,
                       TP_LOG_LEVEL="warn"))
    if r.returncode != 0:
        sys.exit("tp-train failed:\n" + r.stdout[-2000:] + r.stderr[-2000:])
    stats = json.load(open(os.path.join(logdir, "stats.json")))
    shutil.rmtree(logdir, ignore_errors=True)
    return stats[-1]["throughput"], " ".join(cmd[1:]).replace(logdir, "LOGDIR")


def pytorch(data, batch, steps, workers, threads):
    cmd = [PY, os.path.join(ROOT, "bench", "peers", "resnet18_torch.py"), "--dir", data,
           "--batch", str(batch), "--workers", str(workers), "--threads", str(threads),
           "--warmup", "1", "--steps", str(steps)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("the PyTorch peer failed:\n" + r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--dir", default="/tmp/towerpack-bench-colour")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
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
    configs = [(w, t) for w in (0, 1, 2) for t in (1, 2)]
    tp_configs = [(2, 1), (1, 1), (1, 2)]  # (towers, threads): the default first
    tp_runs, torch_runs, cmds = {c: [] for c in tp_configs}, {c: [] for c in configs}, {}
    for rnd in range(a.rounds):
        order = ["tp", "torch"] if rnd % 2 == 0 else ["torch", "tp"]
        for side in order:
            if side == "tp":
                for tw, th in tp_configs:
                    v, cmds[(tw, th)] = towerpack(a.build, train, test, a.batch, a.steps,
                                                  tw, th)
                    tp_runs[(tw, th)].append(v)
                    print("round %d: towerpack towers %d threads %d: %.2f images/s"
                          % (rnd + 1, tw, th, v), flush=True)
            else:
                for w, t in configs:
                    j = pytorch(train, a.batch, a.steps, w, t)
                    torch_runs[(w, t)].append(j["images_per_s"])
                    print("round %d: PyTorch workers %d threads %d: %.2f images/s"
                          % (rnd + 1, w, t, j["images_per_s"]), flush=True)
    best_cfg = max(configs, key=lambda c: max(torch_runs[c]))
    best = max(torch_runs[best_cfg])
    tp_best = max(tp_configs, key=lambda c: max(tp_runs[c]))
    mine = max(tp_runs[tp_best])
    print()
    print("| side | configuration | images/s |")
    print("| --- | --- | --- |")
    for w, t in configs:
        print("| PyTorch %s | DataLoader workers %d, torch threads %d | %.2f |"
              % (j["torch"], w, t, max(torch_runs[(w, t)])))
    for tw, th in tp_configs:
        print("| towerpack | %d tower%s x batch %d, %d BLAS thread%s each%s | %.2f |"
              % (tw, "s" if tw > 1 else "", a.batch // tw, th, "s" if th > 1 else "",
                 " (tp-train's default)" if (tw, th) == tp_configs[0] else "",
                 max(tp_runs[(tw, th)])))
    print("| **ratio** | towerpack's best (%d tower%s, %d thread%s) / PyTorch's best "
          "(workers %d, threads %d) | **%.2f** |"
          % (tp_best[0], "s" if tp_best[0] > 1 else "", tp_best[1],
             "s" if tp_best[1] > 1 else "", best_cfg[0], best_cfg[1], mine / best))
    print()
    print("towerpack's best: tp-train " + cmds[tp_best])
    print(json.dumps({"towerpack": mine, "towerpack_config": {"towers": tp_best[0],
                      "threads": tp_best[1]}, "pytorch_best": best, "pytorch_best_config":
                      {"workers": best_cfg[0], "threads": best_cfg[1]},
                      "ratio": mine / best, "batch": a.batch, "steps": a.steps,
                      "rounds": a.rounds}))


if __name__ == "__main__":
    main()
