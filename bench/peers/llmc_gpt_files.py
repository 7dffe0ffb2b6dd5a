#!/usr/bin/env python3
"""Input files for llm.c's CPU trainer (train_gpt2.c) at towerpack's GPT
shape (issue 45, "Speed on the CPU"; run by bench/peers/llmc_gpt.sh).

  llmc_gpt_files.py --out DIR --text FILE [--layers 4 --heads 4 --embed 256
                    --context 256] [--from CKPT.safetensors] [--seed 1]

Writes DIR/model.bin, llm.c's checkpoint (a header of 256 int32: magic
20240326, version 3, maxT, V, L, NH, C, padded V; then the float32
parameters in llm.c's order: wte [Vp,C], wpe [maxT,C], ln1w/ln1b [L,C],
qkvw [L,3C,C], qkvb [L,3C], attprojw [L,C,C], attprojb, ln2w, ln2b,
fcw [L,4C,C], fcb [L,4C], fcprojw [L,C,4C], fcprojb [L,C], lnfw, lnfb [C]),
and DIR/train.bin, DIR/val.bin, llm.c's token files (a header of 256 int32:
magic 20240520, version 1, token count; then uint16 tokens), here the
bytes of FILE as tokens (vocabulary 256, as `tp-train --model gpt`).

The weights are towerpack's GPT's: from a towerpack checkpoint (--from, a
model-N.safetensors of `tp-train --model gpt` of the same shape; its
matrices are [in, out], llm.c's [out, in], so they are transposed) or
drawn as zoo_gpt.c draws them (N(0, 0.02), residual projections
N(0, 0.02/sqrt(2L)), wpe N(0, 0.01), biases 0, layer norms 1 and 0).
The speed does not depend on them; the losses of the first steps show
that both programs train the same model. V = 256 is already a multiple of
128, so llm.c's padded vocabulary is 256 too. Needs only numpy."""
import argparse
import json
import os
import struct

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        blob = f.read()
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        if v["dtype"] != "F32":
            continue
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(blob[a:b], np.float32).reshape(v["shape"])
    return out


def towerpack_weights(args):
    """{name: array} in towerpack's names and layouts."""
    if args.from_ckpt:
        w = read_safetensors(args.from_ckpt)
        return {k: v for k, v in w.items() if not k.startswith("optimizer/")}
    rng = np.random.default_rng(args.seed)
    C, L, T = args.embed, args.layers, args.context

    def n(shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    w = {"wte": n((256, C), 0.02), "wpe": n((T, C), 0.01),
         "ln_f/gamma": np.ones(C, np.float32), "ln_f/beta": np.zeros(C, np.float32)}
    res = 0.02 / np.sqrt(2 * L)
    for l in range(L):
        p = f"h{l}"
        for ln in ("ln1", "ln2"):
            w[f"{p}/{ln}/gamma"] = np.ones(C, np.float32)
            w[f"{p}/{ln}/beta"] = np.zeros(C, np.float32)
        for s, i, o, std in (("attn/qkv", C, 3 * C, 0.02), ("attn/proj", C, C, res),
                             ("mlp/fc", C, 4 * C, 0.02), ("mlp/proj", 4 * C, C, res)):
            w[f"{p}/{s}/W"] = n((i, o), std)
            w[f"{p}/{s}/b"] = np.zeros(o, np.float32)
    return w


def write_model(path, w, args):
    C, L, T = args.embed, args.layers, args.context
    if w["wte"].shape != (256, C) or w["wpe"].shape != (T, C):
        raise SystemExit(f"llmc_gpt_files: checkpoint shape wte {w['wte'].shape}, "
                         f"wpe {w['wpe'].shape}: want (256,{C}) and ({T},{C})")
    Vp = (256 + 127) // 128 * 128
    wte = np.zeros((Vp, C), np.float32)
    wte[:256] = w["wte"]

    def per_layer(s, transpose=False):
        return np.stack([w[f"h{l}/{s}"].T if transpose else w[f"h{l}/{s}"] for l in range(L)])

    tensors = [wte, w["wpe"], per_layer("ln1/gamma"), per_layer("ln1/beta"),
               per_layer("attn/qkv/W", True), per_layer("attn/qkv/b"),
               per_layer("attn/proj/W", True), per_layer("attn/proj/b"),
               per_layer("ln2/gamma"), per_layer("ln2/beta"),
               per_layer("mlp/fc/W", True), per_layer("mlp/fc/b"),
               per_layer("mlp/proj/W", True), per_layer("mlp/proj/b"),
               w["ln_f/gamma"], w["ln_f/beta"]]
    header = np.zeros(256, np.int32)
    header[:8] = [20240326, 3, T, 256, L, args.heads, C, Vp]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for t in tensors:
            f.write(np.ascontiguousarray(t, np.float32).tobytes())
    return sum(t.size for t in tensors)


def write_tokens(path, data):
    header = np.zeros(256, np.int32)
    header[:3] = [20240520, 1, len(data)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(data.astype(np.uint16).tobytes())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--embed", type=int, default=256)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--from", dest="from_ckpt")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    n = write_model(os.path.join(args.out, "model.bin"), towerpack_weights(args), args)
    data = np.frombuffer(open(args.text, "rb").read(), np.uint8)
    cut = len(data) * 9 // 10  # the last tenth held out, as the text: source does
    write_tokens(os.path.join(args.out, "train.bin"), data[:cut])
    write_tokens(os.path.join(args.out, "val.bin"), data[cut:])
    print(f"llmc_gpt_files: {args.out}/model.bin ({n} parameters), "
          f"train.bin {cut} tokens, val.bin {len(data) - cut} tokens")


if __name__ == "__main__":
    main()
