#!/usr/bin/env python3
"""towerpack GPU check: the device time per kernel from Nsight Compute's
CSV (ncu --csv --metrics gpu__time_duration.sum), summed by kernel name:
calls, total and mean time, share of the total, largest first. An
independent reading of where a step's GPU time goes, beside towerpack's
own per-op profile (tp-bench cuda steps --profile).

    kernel_sum.py NCU_CSV [--steps N] [--top K]

--steps N also prints each kernel's time per step (the run's N profiled
steps). Exit 1 when the file has no gpu__time_duration rows."""
import argparse
import csv
import sys
from collections import defaultdict

UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0,
         "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}


def rows(path):
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu's own lines start "==PROF=="
    reader = csv.reader(lines)
    header = next(reader, None)
    if not header:
        return
    col = {name: i for i, name in enumerate(header)}
    for need in ("Kernel Name", "Metric Name", "Metric Unit", "Metric Value"):
        if need not in col:
            sys.exit(f"kernel_sum: {path}: no '{need}' column (ncu --csv --metrics ...)")
    for r in reader:
        if len(r) < len(header) or r[col["Metric Name"]] != "gpu__time_duration.sum":
            continue
        unit = r[col["Metric Unit"]].strip()
        if unit not in UNITS:
            sys.exit(f"kernel_sum: {path}: unknown unit '{unit}'")
        value = float(r[col["Metric Value"]].replace(",", ""))
        yield r[col["Kernel Name"]], value * UNITS[unit]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    calls, total = defaultdict(int), defaultdict(float)
    for name, us in rows(a.csv):
        calls[name] += 1
        total[name] += us
    if not calls:
        print(f"kernel_sum: {a.csv}: no gpu__time_duration.sum rows")
        return 1
    whole = sum(total.values())
    per = f" {'us/step':>9}" if a.steps else ""
    print(f"{sum(calls.values())} kernel runs, {whole:.1f} us in all"
          + (f", {whole / a.steps:.1f} us a step over {a.steps} steps" if a.steps else ""))
    print(f"{'share':>6} {'total us':>10} {'calls':>6} {'mean us':>8}{per}  kernel")
    for name in sorted(total, key=total.get, reverse=True)[:a.top]:
        short = name if len(name) <= 90 else name[:87] + "..."
        step = f" {total[name] / a.steps:9.2f}" if a.steps else ""
        print(f"{100 * total[name] / whole:5.1f}% {total[name]:10.1f} {calls[name]:6d} "
              f"{total[name] / calls[name]:8.2f}{step}  {short}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
