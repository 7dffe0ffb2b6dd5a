#!/usr/bin/python3
"""towerpack tests: a reference for dataflow/tokenizer.c, written from GPT-2's
published encoder (bytes_to_unicode, the pattern, bpe()) and tiktoken's
byte-pair merge, with Python's `regex` module for \\p{L}, \\p{N} and \\s.
Nothing is downloaded: `gen` learns a small vocabulary from a corpus.

  bpe_ref.py gen CORPUS DIR NMERGES     DIR/encoder.json, DIR/vocab.bpe and
                                        DIR/r.tiktoken (the same tokens)
  bpe_ref.py pretok TEXT OUT            pre-token lengths in bytes, int64
  bpe_ref.py encode DIR TEXT OUT        GPT-2's encode, int32 ids
  bpe_ref.py encode-tiktoken DIR TEXT OUT   tiktoken's merge on r.tiktoken
  bpe_ref.py randtext SEED N OUT        N random characters from all of
                                        Unicode, weighted to the classes
"""
import base64
import json
import random
import struct
import sys
from collections import Counter

import regex

PAT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


BE = bytes_to_unicode()
BD = {v: k for k, v in BE.items()}


def read_text(path):
    # the C side reads bytes; the test texts are valid UTF-8
    return open(path, "rb").read().decode("utf-8")


def gen(corpus, outdir, nmerges):
    words = Counter()
    for tok in PAT.findall(read_text(corpus)):
        words[tuple(BE[b] for b in tok.encode("utf-8"))] += 1
    merges = []
    for _ in range(nmerges):
        pairs = Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        nw = Counter()
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            nw[tuple(out)] += c
        words = nw
    # GPT-2's order: the 256 bytes in bytes_to_unicode's order, then merges
    encoder = {}
    for b, ch in BE.items():
        encoder[ch] = len(encoder)
    for a, b in merges:
        if a + b not in encoder:
            encoder[a + b] = len(encoder)
    encoder["<|endoftext|>"] = len(encoder)
    json.dump(encoder, open(outdir + "/encoder.json", "w", encoding="utf-8"),
              ensure_ascii=False)
    with open(outdir + "/vocab.bpe", "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write("%s %s\n" % (a, b))
    with open(outdir + "/r.tiktoken", "w") as f:
        for tok, i in encoder.items():
            if tok == "<|endoftext|>":
                continue  # tiktoken keeps specials out of the file
            raw = bytes(BD[c] for c in tok)
            f.write("%s %d\n" % (base64.b64encode(raw).decode(), i))


def load_gpt2(d):
    encoder = json.load(open(d + "/encoder.json", encoding="utf-8"))
    lines = open(d + "/vocab.bpe", encoding="utf-8").read().split("\n")[1:]
    ranks = {tuple(l.split()): i for i, l in enumerate(lines) if l}
    return encoder, ranks


def bpe(token, ranks):
    """GPT-2's encoder.py bpe(): the lowest-ranked pair, every occurrence."""
    word = tuple(token)
    while len(word) > 1:
        pairs = set(zip(word, word[1:]))
        bigram = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if bigram not in ranks:
            break
        first, second = bigram
        new, i = [], 0
        while i < len(word):
            try:
                j = word.index(first, i)
            except ValueError:
                new.extend(word[i:])
                break
            new.extend(word[i:j])
            i = j
            if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                new.append(first + second)
                i += 2
            else:
                new.append(word[i])
                i += 1
        word = tuple(new)
    return word


def encode(d, text):
    encoder, ranks = load_gpt2(d)
    ids = []
    for tok in PAT.findall(text):
        mapped = "".join(BE[b] for b in tok.encode("utf-8"))
        ids.extend(encoder[t] for t in bpe(mapped, ranks))
    return ids


def encode_tiktoken(d, text):
    ranks = {}
    for line in open(d + "/r.tiktoken"):
        if line.strip():
            t, r = line.split()
            ranks[base64.b64decode(t)] = int(r)
    ids = []
    for tok in PAT.findall(text):
        parts = [bytes([b]) for b in tok.encode("utf-8")]
        while len(parts) > 1:  # tiktoken's _byte_pair_merge: leftmost lowest
            best, at = None, -1
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        ids.extend(ranks[p] for p in parts)
    return ids


def randtext(seed, n):
    rng = random.Random(seed)
    pools = [" ", "  ", "\n", "\t", "\u00a0", "\u2003", "\u3000", "'s", "'ll", "'", "a",
             "Z", "é", "ß", "日本", "١٢", "²", "Ⅻ", "e\u0301", "!?", "—", "😀", "7", "0.5"]
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.5:
            out.append(rng.choice(pools))
        else:
            while True:
                c = rng.randrange(0x110000 if r < 0.6 else 0x3000)
                if not 0xD800 <= c <= 0xDFFF:
                    break
            out.append(chr(c))
    return "".join(out)


def main():
    cmd = sys.argv[1]
    if cmd == "gen":
        gen(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif cmd == "pretok":
        lens = [len(t.encode("utf-8")) for t in PAT.findall(read_text(sys.argv[2]))]
        open(sys.argv[3], "wb").write(struct.pack("<%dq" % len(lens), *lens))
    elif cmd in ("encode", "encode-tiktoken"):
        f = encode if cmd == "encode" else encode_tiktoken
        ids = f(sys.argv[2], read_text(sys.argv[3]))
        open(sys.argv[4], "wb").write(struct.pack("<%di" % len(ids), *ids))
    elif cmd == "randtext":
        open(sys.argv[4], "wb").write(
            randtext(int(sys.argv[2]), int(sys.argv[3])).encode("utf-8", "surrogatepass"))
    else:
        sys.exit("unknown command " + cmd)


if __name__ == "__main__":
    main()
