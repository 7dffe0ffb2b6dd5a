"""towerpack tests: a colour DCGAN's sample grids and tp-generate's samples,
read by PIL and NumPy (test_proc_dcgan_colour).

usage: gan_colour_check.py DIR -- DIR/expect.txt says "SIZE EPOCHS COUNT";
DIR/run/samples-EPOCHS.png is tp-train's last grid of 64 samples of
SIZE x SIZE, DIR/g.npy tp-generate's COUNT samples (the run's seed: the
first 64 are the grid's tiles). Exits 77 when numpy or PIL is missing."""
import sys

try:
    import numpy as np
    from PIL import Image
except ImportError as e:
    print("gan_colour_check: %s" % e)
    sys.exit(77)

d = sys.argv[1]
size, epochs, count = (int(v) for v in open(d + "/expect.txt").read().split())
for e in range(1, epochs + 1):
    im = Image.open("%s/run/samples-%d.png" % (d, e))
    side = 8 * size + 9 * 2  # 8 x 8 tiles, 2 px between and around
    assert im.mode == "RGB", "samples-%d.png is %s, not RGB" % (e, im.mode)
    assert im.size == (side, side), (im.size, side)
grid = np.array(im).astype(int)
# the tiles' channels differ (a colour generator, not grey thrice)
inner = grid[2:2 + size, 2:2 + size]
assert (inner[..., 0] != inner[..., 1]).any() or (inner[..., 1] != inner[..., 2]).any(), \
    "the grid's channels are equal: grey written as RGB"
g = np.load(d + "/g.npy")
assert g.dtype == np.uint8 and g.shape == (count, size, size, 3), (g.dtype, g.shape)
# a few steps from N(0, 0.02) weights leave the tanh near 0 (pixels near
# 127): not constant is what they show
assert len(np.unique(g)) > 3, "samples constant: %s" % np.unique(g)
assert (g[..., 0] != g[..., 2]).any(), "the samples' R and B are equal"
if count >= 64:
    for i in range(64):
        r, c = divmod(i, 8)
        y, x = 2 + (size + 2) * r, 2 + (size + 2) * c
        tile = grid[y:y + size, x:x + size]
        assert (tile == g[i]).all(), "sample %d differs from the grid's tile" % i
print("numpy agrees: RGB grids of %d px tiles, %d samples uint8 [%d, %d, %d, 3]"
      % (size, count, count, size, size))
