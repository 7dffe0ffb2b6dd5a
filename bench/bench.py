"""towerpack peer benchmarks: the driver behind bench/run.sh.

Runs every comparison side by side (towerpack and its peer back to back in
each round, the order alternating between rounds), prints a table of the
median per-round ratios and rewrites the generated part of the "Peer
benchmarks" section of docs/performance.md. Standard library only; the
PyTorch peers are separate processes (bench/peers/*.py)."""
import argparse
import datetime
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PEERS = os.path.join(HERE, "peers")
DOCS = os.path.join(ROOT, "docs", "performance.md")
BEGIN = "<!-- bench/run.sh: generated from here -->"
END = "<!-- bench/run.sh: generated up to here -->"

# Fashion-MNIST's mean and std (of pixels in [0,1]) in uint8 units: the
# towerpack augmentor normalises (x - mean) / std on raw bytes.
MEAN, STD = 0.2860, 0.3530
AUG = "augment crop=28,pad=4,flip,mean=%.3f,std=%.3f" % (MEAN * 255, STD * 255)

MODES = {
    # rounds and sizes of each comparison; quick: about 3-4 minutes on the
    # 2-core development machine even when it is loaded, full: 8-25
    # (PyTorch's CNN epoch dominates)
    "quick": dict(transport_repeat=3, hop_rounds=9, transport_scale=0.2, load_rounds=3,
                  load_batches=150, train_rounds={"mlp": 1, "cnn": 1}, train_steps=50,
                  engine_steps=300, engine_repeat=7, torch_1thread=True, budget_s=210),
    "full": dict(transport_repeat=9, hop_rounds=31, transport_scale=1.0, load_rounds=5,
                 load_batches=400, train_rounds={"mlp": 3, "cnn": 3}, train_steps=0,
                 engine_steps=500, engine_repeat=15, torch_1thread=True, budget_s=1200),
}


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def run_json(cmd, env=None, timeout=1800):
    """Run cmd; the last stdout line that parses as JSON (or the whole
    stdout when it is one JSON document)."""
    e = dict(os.environ)
    e.setdefault("TP_LOG_LEVEL", "warn")
    if env:
        e.update(env)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, env=e, timeout=timeout, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), p.returncode,
                                                   p.stderr.strip()[-2000:]))
    out = p.stdout.strip()
    try:
        return json.loads(out)
    except ValueError:
        pass
    for line in reversed(out.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    raise RuntimeError("%s printed no JSON: %s" % (" ".join(cmd), out[-1000:]))


T_START = time.time()


def over_budget(m):
    """True once the run has used its time budget: further rounds (beyond
    the first of each comparison) and the optional references are skipped,
    so a heavily loaded machine still finishes in bounded time."""
    return time.time() - T_START > m["budget_s"]


def child_cpu():
    """CPU seconds (user + system) of the finished children so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def median(xs):
    return statistics.median(xs) if xs else float("nan")


# ---- the comparisons ---------------------------------------------------------------


def bench_transport(a, m):
    log("transport: 64 B, 64 KiB, 1 MiB over inproc and ipc against raw libzmq")
    r = run_json([a.bench, "transport", "--only", "sizes", "--repeat",
                  str(m["transport_repeat"]), "--scale", str(m["transport_scale"]),
                  "--json"])
    rows = []
    for c in r["sizes"]:
        size = {64: "64 B", 65536: "64 KiB", 1 << 20: "1 MiB"}.get(c["size"], str(c["size"]))
        # the actor issue's ipc goal is this very case; its inproc goal
        # compares against raw libzmq carrying datapoints (next row)
        goal = 0.9 if c["path"] == "ipc" and c["size"] == 1 << 20 else None
        rows.append(dict(group="transport", name="%s datapoint, %s" % (size, c["path"]),
                         tp=c["towerpack_msgs_s"], peer=c["raw_msgs_s"], unit="msg/s",
                         peer_name="raw libzmq", ratio=c["ratio_median"],
                         spread=(c["ratio_min"], c["ratio_max"]), goal=goal,
                         higher_better=True, rounds=m["transport_repeat"]))
    # The actor issue's inproc goal: the two-actor hop of a small datapoint
    # against raw inproc PUSH/PULL passing the same datapoint pointers (made
    # by the sender, freed by the receiver), pinned to one core as in
    # docs/performance.md ("Actors"): the stable way to measure it on 2 cores.
    # Many short rounds in one process, the side going first alternating:
    # this machine's speed flips within a second, so long runs compare
    # moods, not code.
    cmd = [a.bench, "transport", "--only", "inproc", "--repeat", str(m["hop_rounds"]),
           "--inproc-count", "200000", "--json"]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "0"] + cmd
    h = run_json(cmd)["inproc_hop"]
    hops = [h]
    rows.append(dict(group="transport", name="small datapoint hop, 2 actors (pinned)",
                     tp=h["towerpack_msgs_s"], peer=h["raw_msgs_s"], unit="msg/s",
                     peer_name="raw libzmq + datapoints", ratio=h["ratio"],
                     spread=(h["ratio_min"], h["ratio_max"]), goal=0.8, higher_better=True,
                     rounds=h["rounds"]))
    return rows, dict(sizes=r, inproc_hop=hops)


def bench_loading(a, m):
    rows, raw = [], []
    for w in (1, 2):
        spec = "fashion-mnist:train | %s | batch 128 | processes %d" % (AUG, w)
        tps, pts, ratios = [], [], []
        for r in range(m["load_rounds"]):
            if r > 0 and over_budget(m):
                log("data loading: time budget used, %d round(s)" % r)
                break
            log("data loading: %d worker%s, round %d/%d" % (w, "s" if w > 1 else "",
                                                           r + 1, m["load_rounds"]))
            def tp():
                return run_json([a.bench, "dataflow", spec, "--warmup", "20", "--count",
                                 str(m["load_batches"]), "--seed", str(r + 1), "--json"])

            def pt():
                return run_json([a.python, os.path.join(PEERS, "dataloader.py"),
                                 "--workers", str(w), "--batches", str(m["load_batches"]),
                                 "--warmup", "20"])
            if r % 2 == 0:
                x, y = tp(), pt()
            else:
                y, x = pt(), tp()
            tps.append(x["samples_per_s"])
            pts.append(y["samples_per_s"])
            ratios.append(x["samples_per_s"] / y["samples_per_s"])
            raw.append(dict(workers=w, towerpack=x, pytorch=y))
        rows.append(dict(group="loading", name="Fashion-MNIST augment + batch 128, %d worker%s"
                         % (w, "s" if w > 1 else ""), tp=median(tps), peer=median(pts),
                         unit="samples/s", peer_name="PyTorch DataLoader",
                         ratio=median(ratios), spread=(min(ratios), max(ratios)), goal=3.0,
                         higher_better=True, rounds=len(ratios)))
    return rows, raw


def _tp_train(a, model, steps, seed, logdir):
    # SGD with momentum, as the PyTorch peer (tp-train's cnn defaults to Adam)
    cmd = [a.train, "--model", model, "--epochs", "1", "--optimizer", "sgd", "--logdir", logdir,
           "--logdir-action", "delete", "--stats", "off", "--seed", str(seed)]
    if steps:
        cmd += ["--steps-per-epoch", str(steps)]
    e = dict(os.environ, TP_LOG_LEVEL="warn")
    c0 = child_cpu()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=e, cwd=ROOT, timeout=3600)
    cpu = child_cpu() - c0
    if p.returncode != 0:
        raise RuntimeError("tp-train failed: %s" % p.stderr[-2000:])
    head = re.search(r"(\d+) towers? x batch (\d+)", p.stdout)
    with open(os.path.join(logdir, "stats.json")) as f:
        last = json.load(f)[-1]
    steps_done = last["global_step"]
    return dict(model=model, epoch_s=steps_done / last["steps_per_s"], cpu_s=cpu,
                steps=steps_done, test_accuracy=last["validation_accuracy"],
                towers=int(head.group(1)) if head else None,
                batch_per_tower=int(head.group(2)) if head else None)


def _torch_train(a, model, steps, seed, threads):
    cmd = [a.python, os.path.join(PEERS, "train.py"), "--model", model, "--threads",
           str(threads), "--seed", str(seed)]
    if steps:
        cmd += ["--steps", str(steps)]
    c0 = child_cpu()
    r = run_json(cmd, timeout=3600)
    r["cpu_s"] = child_cpu() - c0
    r["epoch_s"] = r["epoch_s"][-1]
    return r


def bench_training(a, m):
    # Issue 49 states the goals against PyTorch "its threads at their best
    # for the machine": each round times PyTorch with every core's thread
    # count and (torch_1thread) with one, and the goal row compares
    # towerpack with the faster of the two in that round. Debian's torch
    # runs its GEMMs on OpenBLAS's pthread pool whatever set_num_threads
    # says, and its OpenMP threads spin at barriers, so on a small or
    # loaded machine one thread is often its best (docs/performance.md).
    rows, raw = [], []
    threads = os.cpu_count() or 1
    tmp = tempfile.mkdtemp(prefix="tp-peer-bench-")
    what = "one epoch" if not m["train_steps"] else "%d steps" % m["train_steps"]
    both = m["torch_1thread"] and threads > 1
    try:
        for model in ("mlp", "cnn"):
            tts, bests, ratios, taccs, paccs, tcpu, pcpu = [], [], [], [], [], [], []
            nts, nratios, nacc, ncpu, best_threads = [], [], [], [], []
            nr = m["train_rounds"][model]
            for r in range(nr):
                if r > 0 and over_budget(m):
                    log("training: time budget used, %d round(s)" % r)
                    break
                log("training: %s, round %d/%d" % (model, r + 1, nr))
                logdir = os.path.join(tmp, "%s-%d" % (model, r))

                def tp():
                    return _tp_train(a, model, m["train_steps"], r + 1, logdir)

                def pts():  # PyTorch at every core's thread count, then 1
                    y = [_torch_train(a, model, m["train_steps"], r + 1, threads)]
                    if both:
                        y.append(_torch_train(a, model, m["train_steps"], r + 1, 1))
                    return y
                if r % 2 == 0:  # the side going first alternates
                    x, ys = tp(), pts()
                else:
                    ys = pts()
                    x = tp()
                y = min(ys, key=lambda v: v["epoch_s"])
                tts.append(x["epoch_s"])
                bests.append(y["epoch_s"])
                best_threads.append(y["threads"])
                ratios.append(x["epoch_s"] / y["epoch_s"])
                taccs.append(x["test_accuracy"])
                paccs.append(y["test_accuracy"])
                tcpu.append(x["cpu_s"])
                pcpu.append(y["cpu_s"])
                nts.append(ys[0]["epoch_s"])
                nratios.append(x["epoch_s"] / ys[0]["epoch_s"])
                nacc.append(ys[0]["test_accuracy"])
                ncpu.append(ys[0]["cpu_s"])
                raw.append(dict(model=model, towerpack=x, pytorch=ys[0],
                                pytorch_1thread=ys[1] if both else None))
            goal = 0.5 if model == "mlp" else 0.35
            peer = ("PyTorch (best of 1 and %d threads: %s)"
                    % (threads, ", ".join(str(t) for t in best_threads))) if both else "PyTorch"
            rows.append(dict(group="training", name="%s, %s, batch 128, against PyTorch at "
                             "its best" % (model.upper(), what), tp=median(tts),
                             peer=median(bests), unit="s", peer_name=peer,
                             ratio=median(ratios), spread=(min(ratios), max(ratios)),
                             goal=goal, higher_better=False, rounds=len(ratios),
                             tp_acc=median(taccs), peer_acc=median(paccs),
                             tp_cpu=median(tcpu), peer_cpu=median(pcpu)))
            if both:
                rows.append(dict(group="training", name="%s, %s: against PyTorch with %d "
                                 "threads" % (model.upper(), what, threads), tp=median(tts),
                                 peer=median(nts), unit="s",
                                 peer_name="PyTorch (%d threads)" % threads,
                                 ratio=median(nratios),
                                 spread=(min(nratios), max(nratios)), goal=None,
                                 higher_better=False, rounds=len(nratios),
                                 tp_acc=median(taccs), peer_acc=median(nacc),
                                 tp_cpu=median(tcpu), peer_cpu=median(ncpu)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows, raw


def bench_engine(a, m):
    log("engine overhead: tp-bench engine")
    r = run_json([a.bench, "engine", "--steps", str(m["engine_steps"]), "--repeat",
                  str(m["engine_repeat"]), "--json"])
    rows = [dict(group="engine", name="engine step rate vs bare loop (tiny MLP)",
                 tp=r["engine_steps_per_s"], peer=r["bare_steps_per_s"], unit="steps/s",
                 peer_name="bare C loop", ratio=r["engine_ratio"], spread=None,
                 goal=0.97, higher_better=True, rounds=r.get("rounds")),
            dict(group="engine", name="real pipeline vs DummyConstantInput",
                 tp=r["pipeline_steps_per_s"], peer=r["dummy_steps_per_s"],
                 unit="steps/s", peer_name="dummy input", ratio=r["input_hiding_ratio"],
                 spread=None, goal=0.98, higher_better=True, rounds=r.get("rounds")),
            dict(group="engine", name="real pipeline vs the engine on in-memory batches "
                 "(what of the pipeline's own work shows)",
                 tp=r["pipeline_steps_per_s"], peer=r["engine_steps_per_s"],
                 unit="steps/s", peer_name="64 batches in memory",
                 ratio=r["pipeline_vs_memory_ratio"], spread=None, goal=None,
                 higher_better=True, rounds=r.get("rounds"))]
    # The same two goals over only the pairs of runs during which the
    # hypervisor took under 2% of this machine's CPU time (tp-bench reads the
    # steal count of /proc/stat around each pair): on a shared virtual machine the
    # prefetch thread and the trainer otherwise share fewer real cores than
    # the guest sees.
    for key, name, tp, peer, peer_name, goal in (
            ("engine", "engine step rate vs bare loop, pairs under 2% steal",
             "engine_steps_per_s", "bare_steps_per_s", "bare C loop", 0.97),
            ("input_hiding", "real pipeline vs DummyConstantInput, pairs under 2% steal",
             "pipeline_steps_per_s", "dummy_steps_per_s", "dummy input", 0.98)):
        n = r.get(key + "_quiet_rounds", 0)
        if n >= 3:
            rows.append(dict(group="engine", name="%s (%d of %d)" % (name, n, r["rounds"]),
                             tp=r[tp], peer=r[peer], unit="steps/s", peer_name=peer_name,
                             ratio=r[key + "_quiet_ratio"], spread=None, goal=goal,
                             higher_better=True, rounds=n))
    return rows, r


# ---- the report ----------------------------------------------------------------------


def steal_ticks():
    """CPU time the hypervisor gave to other guests, in ticks, all CPUs
    together (the steal column of /proc/stat; 0 where there is none)."""
    try:
        with open("/proc/stat") as f:
            v = f.readline().split()
        return int(v[8]) if v[0] == "cpu" and len(v) > 8 else 0
    except (OSError, ValueError, IndexError):
        return 0


def machine():
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        mem = ", %.0f GiB" % (kb / 1048576)
    except (OSError, ValueError, IndexError):
        pass
    osname = platform.platform()
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    osname = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return "%s, %d cores%s, %s" % (cpu, os.cpu_count() or 0, mem, osname)


def fmt_num(x, unit):
    if unit == "s":
        return "%.2f s" % x
    if x >= 1e6:
        return "%.2f M %s" % (x / 1e6, unit)
    if x >= 1e4:
        return "%.0f k %s" % (x / 1e3, unit)
    return "%.0f %s" % (x, unit)


def verdict(row):
    g = row["goal"]
    if g is None:
        return ""
    ok = row["ratio"] >= g if row["higher_better"] else row["ratio"] <= g
    return ("%s %.2f: %s" % (">=" if row["higher_better"] else "<=", g,
                             "met" if ok else "**missed**"))


def table(rows, markdown):
    head = ["comparison", "towerpack", "peer", "ratio (median)", "range", "goal"]
    lines = []
    for r in rows:
        acc = ""
        if "tp_acc" in r:
            acc = " (test acc. %.4f / %.4f" % (r["tp_acc"], r["peer_acc"])
            if "tp_cpu" in r:
                acc += "; CPU s %.0f / %.0f" % (r["tp_cpu"], r["peer_cpu"])
            acc += ")"
        spread = "%.2f-%.2f" % r["spread"] if r.get("spread") else ""
        if spread and r.get("rounds"):
            spread += " (%d)" % r["rounds"]
        lines.append([r["name"] + acc, fmt_num(r["tp"], r["unit"]),
                      "%s: %s" % (r["peer_name"], fmt_num(r["peer"], r["unit"])),
                      "%.3f" % r["ratio"], spread, verdict(r)])
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        for l in lines:
            l[3] = "**%s**" % l[3]
            out.append("| " + " | ".join(l) + " |")
        return "\n".join(out)
    w = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(head)]
    out = ["  ".join(h.ljust(w[i]) for i, h in enumerate(head))]
    out.append("  ".join("-" * x for x in w))
    for l in lines:
        out.append("  ".join(c.ljust(w[i]) for i, c in enumerate(l)))
    return "\n".join(out)


def write_docs(text):
    with open(DOCS) as f:
        doc = f.read()
    block = BEGIN + "\n" + text.rstrip() + "\n" + END
    if BEGIN in doc and END in doc:
        i, j = doc.index(BEGIN), doc.index(END) + len(END)
        doc = doc[:i] + block + doc[j:]
    else:
        doc = doc.rstrip() + "\n\n## Peer benchmarks\n\n" + block + "\n"
    with open(DOCS, "w") as f:
        f.write(doc)


def main():
    ap = argparse.ArgumentParser(description="towerpack against its peers")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument("--only", default="transport,loading,training,engine")
    ap.add_argument("--bin", default="build-release/bin")
    ap.add_argument("--command", default="bash bench/run.sh")
    ap.add_argument("--peer-1thread", action="store_true",
                    help="also time PyTorch with 1 thread (on in the full mode)")
    a = ap.parse_args()
    a.bench = os.path.join(ROOT, a.bin, "tp-bench")
    a.train = os.path.join(ROOT, a.bin, "tp-train")
    a.python = sys.executable
    mode = "quick" if a.quick else "full"
    m = dict(MODES[mode])
    if a.peer_1thread:
        m["torch_1thread"] = True
    only = [x.strip() for x in a.only.split(",") if x.strip()]
    known = {"transport": bench_transport, "loading": bench_loading,
             "training": bench_training, "engine": bench_engine}
    for x in only:
        if x not in known:
            ap.error("--only: '%s' is not one of %s" % (x, ", ".join(known)))
    import torch  # noqa: F401  (fail early when the peer is missing)
    global T_START
    T_START = time.time()
    started = datetime.datetime.now(datetime.timezone.utc)
    load0 = os.getloadavg()
    steal0 = steal_ticks()
    t0 = time.time()
    rows, raw = [], {}
    for name in ("transport", "loading", "training", "engine"):
        if name in only:
            r, x = known[name](a, m)
            rows += r
            raw[name] = x
    elapsed = time.time() - t0
    load1 = os.getloadavg()
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    steal = (steal_ticks() - steal0) / max(1e-9, elapsed * (os.cpu_count() or 1) * hz)
    info = dict(steal=round(steal, 4), date=started.strftime("%Y-%m-%d %H:%M UTC"), machine=machine(),
                command=a.command.strip(), mode=mode, seconds=round(elapsed),
                load=(round(load0[0], 1), round(load1[0], 1)), torch=torch.__version__)
    print()
    print(table(rows, False))
    print("\n%s mode, %.0f s; %s; load average %.1f at the start, %.1f at the end; "
          "the hypervisor took %.1f%% of the CPU time (steal)"
          % (mode, elapsed, info["machine"], load0[0], load1[0], 100 * steal))
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "last.json"), "w") as f:
        json.dump(dict(info=info, rows=rows, raw=raw), f, indent=1)
    if not a.no_docs:
        text = ("Generated by `%s` (%s mode, %.0f s) on %s.\n\n"
                "Machine: %s; load average %.1f when the run started, %.1f when it "
                "ended; the hypervisor took %.1f%% of its CPU time for other guests "
                "(steal, from /proc/stat). PyTorch %s (Debian python3-torch).\n\n"
                "Each ratio is the median of the per-round ratios (towerpack over the "
                "peer for rates, towerpack's time over the peer's for epochs); "
                "the range is the lowest and highest round (and the number of rounds). Test accuracies and "
                "CPU seconds (user + system of the whole process, start-up and "
                "evaluation included): towerpack / PyTorch.\n\n%s\n"
                % (info["command"], mode, elapsed, info["date"], info["machine"],
                   load0[0], load1[0], 100 * steal, info["torch"], table(rows, True)))
        write_docs(text)
        print("docs/performance.md: the Peer benchmarks section is updated")


if __name__ == "__main__":
    main()
