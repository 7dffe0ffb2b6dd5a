#!/usr/bin/env python3
"""Write N photo-like JPEGs (about 500x375, quality 90) into DIR/<class>/,
10 classes, for bench/images/run.sh. Photo-like: smooth colour fields at a
few scales, a few hard-edged shapes and sensor-like noise, so the files
are as large as real photos of that size (~60-100 KB) and JPEG has real
work to do.  usage: gen_jpegs.py DIR [N]"""
import os
import sys

import numpy as np
from PIL import Image


def field(r, h, w, cell):
    """a smooth random field: a coarse grid of values, bilinearly enlarged"""
    g = r.uniform(0, 1, (h // cell + 2, w // cell + 2, 3)).astype(np.float32)
    img = Image.fromarray((g * 255).astype(np.uint8)).resize((w, h), Image.BILINEAR)
    return np.asarray(img, dtype=np.float32)


def main():
    out = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    r = np.random.RandomState(0)
    for k in range(10):
        os.makedirs(os.path.join(out, "class%d" % k), exist_ok=True)
    for i in range(n):
        w = int(r.choice([500, 500, 375, 480, 512]))
        h = 375 if w != 375 else 500
        img = 0.5 * field(r, h, w, 97) + 0.3 * field(r, h, w, 23) + 0.2 * field(r, h, w, 5)
        for _ in range(r.randint(2, 6)):  # hard edges
            y, x = r.randint(0, h - 40), r.randint(0, w - 40)
            img[y:y + r.randint(20, 150), x:x + r.randint(20, 150)] = r.uniform(0, 255, 3)
        img += r.normal(0, 6, img.shape)
        img = np.clip(img, 0, 255).astype(np.uint8)
        Image.fromarray(img).save(os.path.join(out, "class%d" % (i % 10), "%05d.jpg" % i),
                                  quality=90)
    print("gen_jpegs: %d JPEGs in %s" % (n, out))


if __name__ == "__main__":
    main()
