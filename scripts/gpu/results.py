#!/usr/bin/env python3
"""towerpack GPU check: one Markdown table row a measurement, appended to
$OUT/results.md (the step files in scripts/gpu/steps/ call it after each
run), so that a GPU session brings back one file whose rows paste into
docs/cuda.md's "Current results on a GPU" beside their commands.

    results.py stats LABEL STATS_JSON KEY[,KEY...]   tp-train's stats.json:
        each KEY's value in the last epoch; for a rate (a key ending in
        _per_s) also the best epoch after the first (the first holds the
        start-up: cuDNN's search, the graphs' recording)
    results.py json LABEL KEY[,KEY...] [FILE]       the last line of FILE
        (default stdin) that parses as a JSON object (a peer's summary:
        scripts/gpu/pytorch_*.py, bench/peers/*.py, example-autoencoder
        --json): each KEY's value
    results.py compare LABEL STATS_A STATS_B KEY[,KEY...]   two runs'
        stats.json: each KEY's last-epoch values, "equal" when they are
        the same number, else their relative difference
    results.py line LABEL TEXT...                    a row of free text
    results.py ops LABEL [FILE]                     `tp-bench ops --json`'s
        line in FILE (default stdin): one row an op ("LABEL: NAME",
        towerpack's and torch's microseconds and their ratio, or "not on
        CUDA" / "failed"), then a row of the whole (the device, TF32, how
        many rows compared, slower than PyTorch, not on CUDA, failed)

A missing file or key gives a row that says so (a step's failure must
show in the table, not vanish from it); the exit status is then 1."""
import json
import os
import sys


def emit(label, cells, ok):
    row = f"| {label} | {cells} |"
    print(row)
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "results.md"), "a") as f:
            f.write(row + "\n")
    return 0 if ok else 1


def fmt(v):
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.4g}"
    return str(v)


def stats(label, path, keys):
    try:
        with open(path) as f:
            epochs = json.load(f)
    except (OSError, ValueError) as e:
        return emit(label, f"FAILED: no stats.json ({e})", False)
    if not isinstance(epochs, list) or not epochs:
        return emit(label, f"FAILED: {path} holds no epochs", False)
    cells, ok = [], True
    for k in keys:
        last = epochs[-1].get(k)
        if last is None:
            cells.append(f"{k}: missing")
            ok = False
            continue
        cell = f"{k} {fmt(last)}"
        if k.endswith("_per_s") and len(epochs) > 1:
            best = max(e.get(k, 0) for e in epochs[1:])
            cell += f" (best epoch after the first {fmt(best)})"
        cells.append(cell)
    cells.append(f"{len(epochs)} epochs")
    return emit(label, "; ".join(cells), ok)


def compare(label, path_a, path_b, keys):
    last = []
    for path in (path_a, path_b):
        try:
            with open(path) as f:
                last.append(json.load(f)[-1])
        except (OSError, ValueError, IndexError, KeyError, TypeError) as e:
            return emit(label, f"FAILED: no stats ({path}: {e})", False)
    cells, ok = [], True
    for k in keys:
        a, b = last[0].get(k), last[1].get(k)
        if a is None or b is None:
            cells.append(f"{k}: missing")
            ok = False
        elif a == b:
            cells.append(f"{k} equal ({a!r})")
        else:
            rel = abs(a - b) / max(abs(a), abs(b), 1e-30)
            cells.append(f"{k} {a!r} against {b!r} (relative difference {rel:.2e})")
    return emit(label, "; ".join(cells), ok)


def js(label, keys, src):
    obj = None
    for line in src:
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                pass
    if not isinstance(obj, dict):
        return emit(label, "FAILED: no JSON summary line", False)
    cells, ok = [], True
    for k in keys:
        if k in obj:
            cells.append(f"{k} {fmt(obj[k])}")
        else:
            cells.append(f"{k}: missing")
            ok = False
    return emit(label, "; ".join(cells), ok)


def ops(label, src):
    obj = None
    for line in src:
        line = line.strip()
        if line.startswith('{"bench":"ops"'):
            try:
                obj = json.loads(line)
            except ValueError:
                pass
    if not isinstance(obj, dict) or not isinstance(obj.get("rows"), list):
        return emit(label, "FAILED: no tp-bench ops --json line", False)
    failed = 0
    for r in obj["rows"]:
        status = r.get("status", "ok" if r.get("towerpack_us", -1) >= 0 else "failed")
        torch = (f"torch {r['torch_us']:.1f} us" if r.get("torch_us", 0) > 0
                 else "torch not run")
        if status == "ok":
            ratio = f", ratio {r['ratio']:.2f}" if r.get("ratio", 0) > 0 else ""
            cell = f"towerpack {r['towerpack_us']:.1f} us, {torch}{ratio}"
        else:
            failed += status == "failed"
            cell = f"{status.upper() if status == 'failed' else status}; {torch}"
        emit(f"{label}: {r.get('name')}", f"{cell} ({r.get('inputs', '')})", status != "failed")
    return emit(label, f"{obj.get('device', '?')}, TF32 {'on' if obj.get('tf32') else 'off'}, "
                f"torch {obj.get('torch') or 'not run'}: {len(obj['rows'])} rows, "
                f"{obj.get('compared', 0)} compared, {obj.get('slower', 0)} slower than "
                f"PyTorch, {obj.get('not_on_device', 0)} not on the device, {failed} failed",
                failed == 0)


def main(argv):
    if len(argv) >= 4 and argv[1] == "stats":
        if len(argv) != 5:
            sys.exit(__doc__)
        return stats(argv[2], argv[3], argv[4].split(","))
    if len(argv) >= 4 and argv[1] == "json":
        keys = argv[3].split(",")
        if len(argv) > 4:
            try:
                with open(argv[4]) as f:
                    return js(argv[2], keys, f.readlines())
            except OSError as e:
                return emit(argv[2], f"FAILED: {e}", False)
        return js(argv[2], keys, sys.stdin)
    if len(argv) == 6 and argv[1] == "compare":
        return compare(argv[2], argv[3], argv[4], argv[5].split(","))
    if len(argv) in (3, 4) and argv[1] == "ops":
        if len(argv) == 4:
            try:
                with open(argv[3]) as f:
                    return ops(argv[2], f.readlines())
            except OSError as e:
                return emit(argv[2], f"FAILED: {e}", False)
        return ops(argv[2], sys.stdin)
    if len(argv) >= 4 and argv[1] == "line":
        return emit(argv[2], " ".join(argv[3:]), True)
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
