#!/usr/bin/env python3
"""towerpack tests: how good a trained DCGAN's samples are, judged by a
Fashion-MNIST classifier towerpack had no part in (test_proc_dcgan_quality.c).

The judge: a small PyTorch CNN (conv 32 3x3, max pool, conv 64 3x3, max
pool, fc 128, fc 10; Adam 1e-3, batch 128) trained here for one epoch on
Fashion-MNIST's 60,000 training images (Debian's dataset-fashion-mnist),
seeded; its accuracy on the 10,000 test images is checked first (it must be
a real classifier: >= MIN_ACC).

Each sample set (uint8 [N, 28, 28] .npy files from tp-generate) is scored
as the issue asks: the mean top-1 probability (how confidently the judge
names a class: high for garments, low for noise) and the entropy of the
histogram of predicted classes in nats (ln 10 = 2.30 when every class is as
frequent; near 0 when the generator collapsed onto one class). The real test
images are scored the same way as the yardstick.

Reads DIR/trained.npy (a trained generator's samples) and DIR/untrained.npy
(the same generator after one step). Must hold:
  trained:   mean top-1 >= MIN_CONF and histogram entropy >= MIN_ENTROPY
             (not collapsed: most classes appear);
  untrained: not both (its blobs are one class to the judge).
Measured on the shared 2-core host (issue 44; judge accuracy 0.867, real
test images: mean top-1 0.869, entropy 2.29): after 100 steps of batch 64
0.75 / 0.11 (one class), 200 steps 0.58 / 1.76, 300 steps 0.62 / 1.92;
after one step 0.91 / 0.00 (every sample "bag"). Mean top-1 alone does not
tell blobs from garments (the judge is sure of its one class); with the
entropy it does. Prints the scores; "pytorch agrees" (exit 0) or "pytorch
disagrees" (1); 77 without torch or without the data set.

By hand, `dcgan_quality.py DIR --peer STEPS` also trains PyTorch's own
DCGAN (the same model, initialisation, Adam and uniform noise, GANTrainer's
step, batch 64 of shuffled training images) for STEPS steps and scores 500
of its samples beside towerpack's: the issue's yardstick."""
import gzip
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_testutil import F, np, torch, verdict  # noqa: E402  (exits 77 without torch)

FMNIST = "/usr/share/datasets/fashion-mnist"
MIN_ACC = 0.85
MIN_CONF = 0.5
MIN_ENTROPY = 1.5


def idx(name, offset):
    with gzip.open(os.path.join(FMNIST, name)) as f:
        return np.frombuffer(f.read()[offset:], dtype=np.uint8)


def judge():
    """The classifier, trained one epoch; and its test accuracy."""
    torch.manual_seed(0)
    x = torch.tensor(idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28))
    y = torch.tensor(idx("train-labels-idx1-ubyte.gz", 8).astype(np.int64))
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(64 * 7 * 7, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    order = torch.randperm(len(x))
    for i in range(0, len(x), 128):
        b = order[i:i + 128]
        loss = F.cross_entropy(net(x[b].float() / 255), y[b])
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    tx = idx("t10k-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)
    ty = idx("t10k-labels-idx1-ubyte.gz", 8)
    p = probs(net, tx)
    return net, float(np.mean(p.argmax(1) == ty)), tx


def probs(net, images):
    """Softmax [N, 10] of uint8 images [N, 28, 28]."""
    with torch.no_grad():
        t = torch.tensor(np.ascontiguousarray(images)).reshape(-1, 1, 28, 28).float() / 255
        return torch.cat([F.softmax(net(t[i:i + 1000]), 1) for i in range(0, len(t), 1000)]).numpy()


def score(net, images):
    p = probs(net, images)
    hist = np.bincount(p.argmax(1), minlength=10) / len(p)
    nz = hist[hist > 0]
    return float(p.max(1).mean()), float(-(nz * np.log(nz)).sum()), hist


def peer(steps, batch=64, count=500):
    """PyTorch's DCGAN after `steps` GANTrainer steps: uint8 [count, 28, 28]."""
    nn = torch.nn
    torch.manual_seed(1)
    g = nn.Sequential(nn.Linear(100, 128 * 7 * 7, bias=False), nn.Unflatten(1, (128, 7, 7)),
                      nn.BatchNorm2d(128), nn.ReLU(), nn.ConvTranspose2d(128, 64, 4, 2, 1, bias=False),
                      nn.BatchNorm2d(64), nn.ReLU(), nn.ConvTranspose2d(64, 1, 4, 2, 1), nn.Tanh())
    d = nn.Sequential(nn.Conv2d(1, 64, 4, 2, 1), nn.LeakyReLU(0.2),
                      nn.Conv2d(64, 128, 4, 2, 1, bias=False), nn.BatchNorm2d(128),
                      nn.LeakyReLU(0.2), nn.Flatten(), nn.Linear(128 * 7 * 7, 1))
    for m in list(g.modules()) + list(d.modules()):
        if isinstance(m, (nn.Linear, nn.Conv2d, nn.ConvTranspose2d)):
            nn.init.normal_(m.weight, std=0.02)
    og = torch.optim.Adam(g.parameters(), lr=2e-4, betas=(0.5, 0.999))
    od = torch.optim.Adam(d.parameters(), lr=2e-4, betas=(0.5, 0.999))
    x = torch.tensor(idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28))
    order = torch.randperm(len(x))
    bce = F.binary_cross_entropy_with_logits
    for s in range(steps):
        real = x[order[s * batch % len(x):][:batch]].float() * (2 / 255) - 1
        fake = g(torch.rand(batch, 100) * 2 - 1)
        lr_, lf = d(real), d(fake)
        d_loss = 0.5 * (bce(lr_, torch.ones_like(lr_)) + bce(lf, torch.zeros_like(lf)))
        g_loss = bce(lf, torch.ones_like(lf))
        gg = torch.autograd.grad(g_loss, list(g.parameters()), retain_graph=True)
        gd = torch.autograd.grad(d_loss, list(d.parameters()))
        for net, grads, opt in ((g, gg, og), (d, gd, od)):
            for q, gq in zip(net.parameters(), grads):
                q.grad = gq
            opt.step()
    g.eval()  # the moving averages, as tp-generate runs the generator
    with torch.no_grad():
        out = g(torch.rand(count, 100) * 2 - 1)
    return ((out.reshape(-1, 28, 28).numpy() + 1) * 127.5).round().clip(0, 255).astype(np.uint8)


def main(d, peer_steps=0):
    if not os.path.exists(os.path.join(FMNIST, "train-images-idx3-ubyte.gz")):
        print("Fashion-MNIST is not installed (dataset-fashion-mnist)")
        return 77
    torch.set_num_threads(2)
    net, acc, tx = judge()
    print(f"judge: a PyTorch CNN, one epoch: test accuracy {acc:.4f} (bound {MIN_ACC})")
    ok = acc >= MIN_ACC
    got = {}
    for name, images in (("real test images", tx[:1000]),
                         ("trained", np.load(os.path.join(d, "trained.npy"))),
                         ("untrained", np.load(os.path.join(d, "untrained.npy")))) + (
                             ((f"PyTorch's DCGAN, {peer_steps} steps", peer(peer_steps)),)
                             if peer_steps else ()):
        conf, ent, hist = score(net, images)
        got[name] = conf, ent
        print(f"{name} ({len(images)}): mean top-1 {conf:.3f}, class histogram entropy "
              f"{ent:.3f} nats, histogram {' '.join(f'{h:.2f}' for h in hist)}")
    def passes(name):
        return got[name][0] >= MIN_CONF and got[name][1] >= MIN_ENTROPY

    ok &= passes("trained") and not passes("untrained")
    print(f"bounds: trained mean top-1 >= {MIN_CONF} and entropy >= {MIN_ENTROPY}; untrained "
          f"not both")
    return verdict(ok)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[3]) if sys.argv[2:3] == ["--peer"] else 0))
