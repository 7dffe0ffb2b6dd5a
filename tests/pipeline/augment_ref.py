#!/usr/bin/env python3
"""towerpack tests: numpy's reading of a batch made by
tp_backend_augment_batch (tests/pipeline/test_proc_resident.c): pad with
zeros (np.pad), crop (slicing), mirror ([:, ::-1]), normalise in float32.

  augment_ref.py DIR    DIR holds what the test wrote:
    shape.txt   "nsrc h w c n crop_h crop_w pad"
    images.bin  uint8 [nsrc, h, w, c]
    picks.bin   int32 [n, 4]: index, y, x, flip
    norm.bin    float32 [8]: mean[4], inv_std[4]
    out.bin     float32 [n, crop_h, crop_w, c]: towerpack's batch
Exit 0 when numpy's batch is the same to the bit; 1 with the first
difference; 77 when numpy is missing (the test skips).
"""
import os
import sys

try:
    import numpy as np
except ImportError as e:
    print("missing python module: %s (apt-get install python3-numpy)" % e)
    sys.exit(77)


def main(d):
    nsrc, h, w, c, n, ch, cw, pad = map(int, open(os.path.join(d, "shape.txt")).read().split())
    images = np.fromfile(os.path.join(d, "images.bin"), dtype=np.uint8).reshape(nsrc, h, w, c)
    picks = np.fromfile(os.path.join(d, "picks.bin"), dtype=np.int32).reshape(n, 4)
    norm = np.fromfile(os.path.join(d, "norm.bin"), dtype=np.float32)
    mean, inv = norm[:4][:c], norm[4:8][:c]
    got = np.fromfile(os.path.join(d, "out.bin"), dtype=np.float32).reshape(n, ch, cw, c)
    padded = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    for i, (index, y, x, flip) in enumerate(picks):
        crop = padded[index, y:y + ch, x:x + cw, :]
        if flip:
            crop = crop[:, ::-1, :]
        want = (crop.astype(np.float32) - mean) * inv
        if not np.array_equal(want.view(np.uint32), got[i].view(np.uint32)):
            bad = np.argwhere(want != got[i])[0]
            print("image %d (pick %s): at %s numpy %r, towerpack %r"
                  % (i, picks[i].tolist(), bad.tolist(), float(want[tuple(bad)]),
                     float(got[i][tuple(bad)])))
            return 1
    print("numpy agrees on %d images of %dx%dx%d" % (n, ch, cw, c))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
