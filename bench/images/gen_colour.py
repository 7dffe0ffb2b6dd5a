#!/usr/bin/python3
"""The synthetic colour data set of tests/tools/test_proc_colour.c, as JPEG
files for the benchmarks: DIR/<class>/<n>.jpg, three classes (red, Green,
blue) of squares and discs on a grey ground that differ only in hue at
equal luminance (110, BT.601), N images of SIDE x SIDE per class, a fixed
generator (the same files every time).

  gen_colour.py DIR [N] [SIDE]        (default 128 per class, 128 px)"""
import os
import sys

import numpy as np
from PIL import Image

NAMES = ["red", "Green", "blue"]
RGB = [(190, 76, 76), (65, 141, 65), (93, 93, 238)]


def main():
    out = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 128
    side = int(sys.argv[3]) if len(sys.argv) > 3 else 128
    r = np.random.RandomState(1)
    yy, xx = np.mgrid[0:side, 0:side]
    for c, name in enumerate(NAMES):
        os.makedirs(os.path.join(out, name), exist_ok=True)
        for i in range(n):
            img = np.full((side, side, 3), 110, np.uint8)
            s = side * 5 // 16 + r.randint(side * 5 // 16)
            x0, y0 = r.randint(side - s), r.randint(side - s)
            mask = (xx >= x0) & (xx < x0 + s) & (yy >= y0) & (yy < y0 + s)
            if i % 2:  # a disc inside the square
                dx, dy = xx - x0 - s / 2 + 0.5, yy - y0 - s / 2 + 0.5
                mask &= dx * dx + dy * dy <= s * s / 4
            img[mask] = RGB[c]
            Image.fromarray(img).save(os.path.join(out, name, "%04d.jpg" % i), quality=90)
    print("%s: %d JPEGs of %dx%d in %d classes" % (out, n * len(NAMES), side, side, len(NAMES)))


if __name__ == "__main__":
    main()
