#!/usr/bin/env python3
"""towerpack GPU check: the step files of scripts/gpu/steps/ checked without
a GPU (tests/tools/gpu_check_scripts.sh runs it), so that the next GPU
session's few minutes are not spent on a typo.

    check_steps.py ROOT FILE...     exit 0 and one line per file when
                                    sound, else one line per fault

Per line "SECONDS COMMAND" (scripts/gpu-check.sh steps): SECONDS a whole
number; the command parses (bash -n); each .gpu/bin/PROG or $BIN/PROG is
a program `gpu-check.sh prepare` carries; each scripts/...py, bench/...py
or .sh path it names exists in ROOT; every --flag given to tp-train (a
tp_train line, `gpu-check.sh train`), to a tp-bench subcommand (cuda, ops,
...: the strcmp tests of the file that defines tp_bench_<subcommand>; an
ops_table line, lib.sh's, is tp-bench ops), to
example-autoencoder or to a Python peer is one that program defines (its
long options, strcmp tests or argparse arguments in ROOT's sources); the
gpu-check.sh environment knobs it sets are ones the script reads. Per
file: its seconds at most 600 (the device tool's limit a call) and a
comment "# expected: N s" (what the steps should take, from the last GPU
session's timings); the files' expected seconds, with 90 s to start the
machine for each call, at most 660 (11 of the session's 15 minutes: a
quarter left to rerun a call after a fix)."""
import os
import re
import shlex
import subprocess
import sys

CALL_LIMIT = 600
START = 90
SESSION_PLAN = 660


def read(root, path):
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
        return f.read()


def program_flags(root):
    """The flags each program accepts, from its sources."""
    flags = {}
    main = read(root, "tools/tp-train/main.c")
    flags["tp-train"] = set(re.findall(r'\{"([a-z0-9-]+)",\s*(?:no|required|optional)_argument',
                                       main))
    flags["tp-bench"] = bench_flags(root)
    ae = read(root, "examples/autoencoder.c")
    flags["example-autoencoder"] = {f[2:] for f in re.findall(r'"(--[a-z0-9-]+)"', ae)}
    return flags


def bench_flags(root):
    """tp-bench's flags by subcommand: {subcommand: flags}, each from the
    file of tools/tp-bench/ that defines tp_bench_<subcommand>."""
    d = os.path.join(root, "tools/tp-bench")
    out = {}
    for name in sorted(os.listdir(d)):
        if not (name.startswith("bench_") and name.endswith(".c")):
            continue
        src = read(root, os.path.join("tools/tp-bench", name))
        fl = {f[2:] for f in re.findall(r'strcmp\(argv\[i\], "(--[a-z0-9-]+)"\)', src)}
        for sub in re.findall(r"^int tp_bench_([a-z0-9_]+)\(int argc", src, re.M):
            out[sub] = fl
    return out


def argparse_flags(root, script):
    src = read(root, script)
    return {f[2:] for f in re.findall(r'add_argument\(\s*"(--[a-z0-9-]+)"', src)}


def carried_programs(root):
    src = read(root, "scripts/gpu-check.sh")
    m = re.search(r'cp "\$build"/bin/\{([^}]*)\} \.gpu/bin/', src)
    return set(m.group(1).split(",")) if m else set()


def words_after(tokens, i):
    """The tokens of one simple command starting at tokens[i]."""
    out = []
    for t in tokens[i:]:
        if t in (";", "&&", "||", "|", "do", "done", "then", "fi", "else"):
            break
        out.append(t)
    return out


def check_flags(what, allowed, words, faults, where):
    for w in words:
        if w.startswith("--"):
            name = w[2:].split("=", 1)[0]
            if name and name not in allowed:
                faults.append(f"{where}: {what} has no flag --{name}")


def tokens_of(cmd):
    lex = shlex.shlex(cmd, posix=True, punctuation_chars=";&|")
    lex.whitespace_split = True
    try:
        return list(lex)
    except ValueError as e:
        return None


def check_line(root, where, cmd, flags, carried, faults):
    r = subprocess.run(["bash", "-n", "-c", cmd], capture_output=True, text=True)
    if r.returncode:
        faults.append(f"{where}: bash -n: {r.stderr.strip()}")
        return
    toks = tokens_of(cmd)
    if toks is None:
        faults.append(f"{where}: cannot split the command")
        return
    for i, t in enumerate(toks):
        m = re.match(r"^(?:\.gpu/bin|\$BIN)/([A-Za-z0-9_-]+)$", t)
        if m:
            prog = m.group(1)
            if prog not in carried:
                faults.append(f"{where}: {t}: prepare does not carry {prog}")
            elif prog == "tp-bench":
                words = words_after(toks, i + 1)
                sub = words[0] if words else ""
                if sub not in flags[prog]:
                    faults.append(f"{where}: tp-bench has no subcommand '{sub}'")
                else:
                    check_flags(f"tp-bench {sub}", flags[prog][sub], words[1:], faults, where)
            elif prog in flags:
                check_flags(prog, flags[prog], words_after(toks, i + 1), faults, where)
        for p in re.findall(r"((?:scripts|bench)/[A-Za-z0-9_./-]+\.(?:py|sh))", t):
            if not os.path.isfile(os.path.join(root, p)):
                faults.append(f"{where}: no file {p}")
            elif p.endswith(".py") and i > 0 and toks[i - 1] in ("$PY", "python3"):
                check_flags(p, argparse_flags(root, p), words_after(toks, i + 1), faults,
                            where)
        if t == "ops_table":
            # ops_table LABEL FLAGS... (lib.sh): tp-bench ops's flags
            check_flags("tp-bench ops", flags["tp-bench"].get("ops", set()),
                        words_after(toks, i + 2), faults, where)
        if t == "tp_train":
            # tp_train LABEL KEYS FLAGS...
            check_flags("tp-train", flags["tp-train"], words_after(toks, i + 3), faults, where)
        if t == "scripts/gpu-check.sh" and i + 1 < len(toks) and toks[i + 1] == "train":
            check_flags("tp-train", flags["tp-train"], words_after(toks, i + 2), faults, where)
    # the knobs set for gpu-check.sh must be ones it reads
    gc = read(root, "scripts/gpu-check.sh")
    for knob in re.findall(r"\b([A-Z][A-Z0-9_]*)=", cmd):
        if knob in ("OUT", "PY", "BIN") or knob.startswith("TP_"):
            continue
        if not re.search(r"\$\{?" + knob + r"\b", gc):
            faults.append(f"{where}: gpu-check.sh reads no {knob}")


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    root, files = argv[1], argv[2:]
    flags = program_flags(root)
    carried = carried_programs(root)
    if not carried:
        sys.exit("check_steps: cannot find prepare's list of programs in gpu-check.sh")
    faults, total = [], 0
    for path in files:
        secs_file, n, expected = 0, 0, None
        with open(path, encoding="utf-8") as f:
            for no, line in enumerate(f, 1):
                line = line.rstrip("\n")
                m = re.match(r"^#\s*expected:\s*(\d+)\s*s\b", line)
                if m:
                    expected = int(m.group(1))
                if not line.strip() or line.startswith("#"):
                    continue
                where = f"{os.path.basename(path)}:{no}"
                secs, _, cmd = line.partition(" ")
                if not secs.isdigit() or not cmd.strip():
                    faults.append(f"{where}: not 'SECONDS COMMAND': {line[:60]}")
                    continue
                n += 1
                secs_file += int(secs)
                check_line(root, where, cmd, flags, carried, faults)
        if secs_file > CALL_LIMIT:
            faults.append(f"{os.path.basename(path)}: {secs_file} s, over a call's {CALL_LIMIT} s")
        if expected is None:
            faults.append(f"{os.path.basename(path)}: no '# expected: N s' line")
            expected = secs_file
        total += expected + START
        print(f"check_steps: {os.path.basename(path)}: {n} steps, {secs_file} s at most, "
              f"{expected} s expected")
    print(f"check_steps: {total} s of device time expected with the machines' starts")
    if total > SESSION_PLAN:
        faults.append(f"the files together: {total} s expected with the starts, over "
                      f"the {SESSION_PLAN} s planned of the session's 900")
    for f in faults:
        print(f"check_steps: FAULT: {f}")
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
