#!/usr/bin/python3
"""towerpack tests: the learning-rate schedules (tp_lr_schedule_t,
pipeline/callbacks/cb_hyperparam.c) against PyTorch's schedulers, stepped
once per step as a per-step schedule is (or once per epoch: the same thing
with one step an epoch):

  warm-up       LinearLR(start_factor=F, total_iters=W)
  linear        SequentialLR([warm-up, LinearLR(1, END, T - W)], [W])
  cosine        SequentialLR([warm-up, CosineAnnealingLR(T - W, BASE x END)], [W])
  step          ChainedScheduler([warm-up, MultiStepLR(MILESTONES, GAMMA)])

  lr_schedule_torch.py KIND BASE F END GAMMA W T MILESTONES OURS

MILESTONES: comma-separated steps ("-" for none); OURS: a file of the rates
towerpack gives at steps 0..T, one a line. Exit 0 when every step agrees
within 1e-6 (printing the largest difference), 1 when one does not, 3
without torch (Debian's python3-torch)."""
import sys

try:
    import torch
except ImportError:
    print("missing torch (apt-get install python3-torch)")
    sys.exit(3)


def torch_rates(kind, base, f, end, gamma, w, t, milestones):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=base)
    S = torch.optim.lr_scheduler
    scheds = []
    if w > 0:
        scheds.append(S.LinearLR(opt, start_factor=f, end_factor=1.0, total_iters=w))
    if kind == "step":
        scheds.append(S.MultiStepLR(opt, milestones=milestones, gamma=gamma))
        sched = S.ChainedScheduler(scheds) if len(scheds) > 1 else scheds[0]
    else:
        main = (S.CosineAnnealingLR(opt, T_max=t - w, eta_min=base * end) if kind == "cosine"
                else S.LinearLR(opt, start_factor=1.0, end_factor=end, total_iters=t - w))
        scheds.append(main)
        sched = S.SequentialLR(opt, scheds, milestones=[w]) if w > 0 else main
    out = []
    for _ in range(t + 1):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def main():
    kind = sys.argv[1]
    base, f, end, gamma = (float(x) for x in sys.argv[2:6])
    w, t = int(sys.argv[6]), int(sys.argv[7])
    milestones = [] if sys.argv[8] == "-" else [int(x) for x in sys.argv[8].split(",")]
    ours = [float(x) for x in open(sys.argv[9]).read().split()]
    import warnings
    warnings.simplefilter("ignore")  # the schedulers' advice on call order
    theirs = torch_rates(kind, base, f, end, gamma, w, t, milestones)
    if len(ours) != len(theirs):
        print("%d rates from towerpack, %d from torch" % (len(ours), len(theirs)))
        return 1
    worst = max(range(len(ours)), key=lambda i: abs(ours[i] - theirs[i]))
    d = abs(ours[worst] - theirs[worst])
    print("%s: largest difference %.3g at step %d (towerpack %.9g, torch %.9g), torch %s"
          % (kind, d, worst, ours[worst], theirs[worst], torch.__version__))
    return 0 if d <= 1e-6 else 1


if __name__ == "__main__":
    sys.exit(main())
