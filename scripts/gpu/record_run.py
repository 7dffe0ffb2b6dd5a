#!/usr/bin/env python3
"""towerpack GPU check: one line per time-to-accuracy run, and the summary
of the runs (scripts/gpu-check.sh record).

    record_run.py run SEED RC T0 T1 STATS_JSON   one run's line
    record_run.py summary RECORD_TXT              mean and spread of the
                                                  last block of run lines

A run's training time is the sum over its epochs of steps / steps_per_s
(ThroughputTracker's rate over the epoch's steps, epoch-end work
excluded), so validation and start-up are not counted; its wall time is
the whole command's. The accuracy is the last epoch's
validation_accuracy; flip= (tp-train --tta) its
validation_flip_accuracy, shift= (--tta-shift) its
validation_flip_shift_accuracy."""
import json
import statistics
import sys


def run(seed, rc, t0, t1, path):
    try:
        with open(path) as f:
            epochs = json.load(f)
    except (OSError, ValueError) as e:
        print(f"run seed={seed} rc={rc} FAILED: no stats ({e})")
        return
    trained, prev, acc, flip, shift = 0.0, 0, None, None, None
    for e in epochs:
        step = e.get("global_step", prev)
        rate = e.get("steps_per_s")
        if rate:
            trained += (step - prev) / rate
        prev = step
        acc = e.get("validation_accuracy", acc)
        flip = e.get("validation_flip_accuracy", flip)
        shift = e.get("validation_flip_shift_accuracy", shift)
    if acc is None:
        print(f"run seed={seed} rc={rc} FAILED: no validation_accuracy in {path}")
        return
    flip_kv = f" flip={flip:.4f}" if flip is not None else ""
    flip_kv += f" shift={shift:.4f}" if shift is not None else ""
    print(f"run seed={seed} rc={rc} epochs={len(epochs)} accuracy={acc:.4f}{flip_kv} "
          f"train_s={trained:.2f} wall_s={float(t1) - float(t0):.2f}")


def summary(path):
    block = []
    with open(path) as f:
        for line in f:
            if line.startswith("== record"):
                block = []
            elif line.startswith("run ") and "accuracy=" in line:
                kv = dict(w.split("=", 1) for w in line.split()[1:] if "=" in w)
                block.append(kv)
    if not block:
        print("summary: no successful run")
        return
    acc = [float(r["accuracy"]) for r in block]
    tr = [float(r["train_s"]) for r in block]
    spread = statistics.stdev(acc) if len(acc) > 1 else 0.0
    flip_text = ""
    for key, what in (("flip", "with the mirror images (--tta)"),
                      ("shift", "with the mirrored and shifted images (--tta-shift)")):
        v = [float(r[key]) for r in block if key in r]
        if len(v) == len(acc):
            sd = statistics.stdev(v) if len(v) > 1 else 0.0
            flip_text += (f", {what} mean {statistics.mean(v):.4f} "
                          f"(min {min(v):.4f}, sd {sd:.4f})")
    print(f"summary: {len(acc)} runs, accuracy mean {statistics.mean(acc):.4f} "
          f"(min {min(acc):.4f}, max {max(acc):.4f}, sd {spread:.4f}){flip_text}, "
          f"training time mean {statistics.mean(tr):.2f} s "
          f"(min {min(tr):.2f}, max {max(tr):.2f})")


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "run":
        run(*sys.argv[2:])
    elif len(sys.argv) == 3 and sys.argv[1] == "summary":
        summary(sys.argv[2])
    else:
        sys.exit(__doc__)
