#!/usr/bin/env python3
"""towerpack tests: the GAN trainers' steps in PyTorch (float64), for
test_proc_gan_torch.c. The tiny GAN of tests/pipeline/gan_testutil.h:
generator gen/ (z -> fc 16 -> tanh -> fc 2), discriminator discrim/
(fc 16 -> tanh -> fc 2) on the real and the fake points; softmax
cross-entropy over the 2 logits stands in for sigmoid cross-entropy (class 1
"real"): d_loss = (CE(D(x), 1) + CE(D(G(z)), 0)) / 2, g_loss = CE(D(G(z)), 1).
Each group has its own Adam (generator lr 0.01, discriminator lr 0.02,
betas (0.5, 0.999), eps 1e-8).

A step, as towerpack's trainers take it (tensorpack's):
  GANTrainer (periods 0 0): both players' gradients at the step's weights
    (the discriminator's on the fakes of the generator before its update),
    then the generator's update, then the discriminator's;
  SeparateGANTrainer (d_period, g_period): at step s a discriminator update
    when s % d_period == 0, then a generator update when s % g_period == 0.
The losses of a step are those at its starting weights.

Reads DIR/recipe.txt ("steps batch zdim d_period g_period"), w0.safetensors
(the initial weights), x.bin float32 [steps, batch, 2], z.bin float32
[steps, batch, zdim], losses.bin float32 [steps, 2] (towerpack's g_loss,
d_loss) and w1.safetensors (towerpack's weights after the last step). Exit 0
and "pytorch agrees" when every loss is within 1e-5 and every weight within
1e-4 (float32 against float64 after a few Adam steps); 1 otherwise, naming
the worst; 77 without torch."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_testutil import F, load, np, torch, verdict  # noqa: E402  (exits 77 without torch)


def main(d):
    steps, batch, zdim, d_period, g_period = (int(v) for v in open(f"{d}/recipe.txt").read().split())
    w0, w1 = load(f"{d}/w0.safetensors"), load(f"{d}/w1.safetensors")
    x = np.fromfile(f"{d}/x.bin", dtype=np.float32).reshape(steps, batch, 2)
    z = np.fromfile(f"{d}/z.bin", dtype=np.float32).reshape(steps, batch, zdim)
    tp_losses = np.fromfile(f"{d}/losses.bin", dtype=np.float32).reshape(steps, 2)
    p = {k: torch.tensor(v.copy(), dtype=torch.float64, requires_grad=True)
         for k, v in w0.items() if not k.startswith("optimizer/")}
    gen = [v for k, v in p.items() if k.startswith("gen/")]
    dis = [v for k, v in p.items() if k.startswith("discrim/")]
    opt_g = torch.optim.Adam(gen, lr=0.01, betas=(0.5, 0.999), eps=1e-8)
    opt_d = torch.optim.Adam(dis, lr=0.02, betas=(0.5, 0.999), eps=1e-8)
    ones = torch.ones(batch, dtype=torch.int64)
    zeros = torch.zeros(batch, dtype=torch.int64)

    def dense(h, scope):
        return h @ p[f"{scope}/W"] + p[f"{scope}/b"]

    def losses(xs, zs):
        fake = dense(torch.tanh(dense(zs, "gen/fc0")), "gen/fc1")
        lr = dense(torch.tanh(dense(xs, "discrim/fc0")), "discrim/fc1")
        lf = dense(torch.tanh(dense(fake, "discrim/fc0")), "discrim/fc1")
        d_loss = 0.5 * F.cross_entropy(lr, ones) + 0.5 * F.cross_entropy(lf, zeros)
        g_loss = F.cross_entropy(lf, ones)
        return g_loss, d_loss

    def update(which, xs, zs):
        opt, params = (opt_g, gen) if which == "g" else (opt_d, dis)
        g_loss, d_loss = losses(xs, zs)
        opt.zero_grad()
        # only this group's gradients: the other group's stay untouched
        grads = torch.autograd.grad(g_loss if which == "g" else d_loss, params)
        for q, gq in zip(params, grads):
            q.grad = gq
        opt.step()
        return float(g_loss), float(d_loss)

    worst, what = 0.0, ""
    for s in range(steps):
        xs = torch.tensor(x[s], dtype=torch.float64)
        zs = torch.tensor(z[s], dtype=torch.float64)
        if d_period == 0:  # one forward pass, both gradients, both applied
            g_loss, d_loss = losses(xs, zs)
            gg = torch.autograd.grad(g_loss, gen, retain_graph=True)
            gd = torch.autograd.grad(d_loss, dis)
            for params, grads, opt in ((gen, gg, opt_g), (dis, gd, opt_d)):
                opt.zero_grad()
                for q, gq in zip(params, grads):
                    q.grad = gq
                opt.step()
            first, order = (float(g_loss), float(d_loss)), []
        else:
            order = (["d"] if s % d_period == 0 else []) + (["g"] if s % g_period == 0 else [])
        for k, which in enumerate(order):
            got = update(which, xs, zs)
            if k == 0:
                first = got
        for i, name in enumerate(("g_loss", "d_loss")):
            diff = abs(first[i] - float(tp_losses[s, i]))
            if diff > worst * 10:  # losses are held to 1e-5, weights to 1e-4
                worst, what = diff / 10, f"step {s} {name}: pytorch {first[i]:.7f}, towerpack {tp_losses[s, i]:.7f}"
    for k, v in p.items():
        diff = float(np.max(np.abs(v.detach().numpy() - w1[k])))
        if diff > worst:
            worst, what = diff, f"{k}: max difference {diff:.3g}"
    print(f"worst: {what} (scaled {worst:.3g})")
    return verdict(worst < 1e-4)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
