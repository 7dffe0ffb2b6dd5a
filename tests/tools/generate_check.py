"""towerpack tests: tp-generate's .npy files, read by NumPy (test_proc_dcgan).

usage: generate_check.py DIR -- DIR holds g.npy (300 samples), g64.npy (64,
the same seed) and run/samples-2.png (tp-train's last sample grid). Exits 77
when numpy or PIL is missing."""
import sys

try:
    import numpy as np
    from PIL import Image
except ImportError as e:
    print("generate_check: %s" % e)
    sys.exit(77)

d = sys.argv[1]
g = np.load(d + "/g.npy")
g64 = np.load(d + "/g64.npy")
assert g.shape == (300, 28, 28) and g.dtype == np.uint8, (g.shape, g.dtype)
assert g64.shape == (64, 28, 28) and g64.dtype == np.uint8, (g64.shape, g64.dtype)
# a sample is a function of its noise row: the first 64 of 300 are the 64
assert (g[:64] == g64).all(), "the first 64 of 300 samples differ from --count 64"
assert len(np.unique(g)) > 10, "samples nearly constant: %s" % np.unique(g)
assert np.abs(g[0].astype(int) - g[1].astype(int)).sum() > 0, "two samples are equal"
# the grid of tp-train's last epoch: 8 x 8 tiles of 28 with 2 px around each
grid = np.array(Image.open(d + "/run/samples-2.png"))
assert grid.shape == (242, 242), grid.shape
for i in range(64):
    r, c = divmod(i, 8)
    tile = grid[2 + 30 * r:30 + 30 * r, 2 + 30 * c:30 + 30 * c]
    assert (tile == g64[i]).all(), "sample %d differs from the grid's tile" % i
print("numpy agrees: 300 samples uint8 [300, 28, 28], the first 64 the grid's tiles")
