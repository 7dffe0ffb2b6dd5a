#!/usr/bin/python3
"""towerpack peer benchmark: each op's forward+backward in PyTorch, for
`tp-bench ops` (tools/tp-bench/bench_ops.c), which runs it once for the
whole table and puts its times beside towerpack's.

Usage: torch_ops.py --serve [--device N] [--tf32]

It prints {"torch": VERSION} first (with --device also "device", the
GPU's name), then reads one request per line on
stdin: {"seconds": S, "min_iters": N, "threads": T, "name", "op",
"attr": [6 numbers], "inputs": [{"kind", "shape"}]}, and answers each with
one line {"name", "threads", "median_us", "iters"} (median_us -1 and an
"error" for an op not in OPS). It ends at the end of its input. tp-bench
alternates its side and this one round by round, so both see the same load.

Input kinds as bench_ops.c draws them: 'x' uniform in [-1,1] with
requires_grad, 'p' in [0.5,1.5] with requires_grad, 't' in [0,1] without
(a loss's target), 'l' int64 labels below attr[5] if set, else the last dim of input 0, 'w' a
parameter (uniform in [-0.1,0.1], requires_grad).

A request sets torch.set_num_threads(T) and times, after two warm-up steps,
`y = OPS[op](inputs, attr); y.backward(g)` (g fixed, rand of y's shape; a
scalar y takes none), the gradients set to None between steps as
optimizer.zero_grad() does, for about S seconds and at least N steps.
Exit status 3 when torch is missing.

--device N (tp-bench ops --device N) runs every row on cuda:N: the inputs
made as on the CPU (the same generator) and moved there once, the threads
left alone (the request's are ignored), TF32 off unless --tf32 (both
torch.backends.cuda.matmul and cudnn, as towerpack's TP_CUDA_TF32 says).
An op row is timed on the device: torch.cuda.synchronize(), a CUDA event,
the forward and backward, a second event, torch.cuda.synchronize(), and
the time between the events (the GPU's, which waits on the host's
launches and autograd between the kernels as towerpack's per-call events
wait on its launches); a step row in wall time between two
torch.cuda.synchronize() calls, as tp-bench times its step. Exit status 4
when torch sees no CUDA device.

A request with "step": 1 is a whole model's training step: after the
backward pass, an SGD update (no momentum) of every tensor that asked for a
gradient is inside the timed step too, as in tp-bench's model. With "cpu":
1 too (tp-bench ops --cpu-time) such a step is timed in CPU time, not
wall time: the calling thread's (time.thread_time_ns) at 1 thread, the
process's (time.process_time_ns) at more.

A new op is one entry in OPS (the key bench_ops.c's row names in `op`).
"""
import json
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover - depends on the machine
    print("python3-torch missing (%s)" % e, file=sys.stderr)
    sys.exit(3)


# where the rows run: "cpu", or "cuda:N" with --device N
DEVICE = "cpu"


def _batch_norm(x, a, st):
    # training mode, PyTorch's momentum 0.1 (towerpack's 0.9 the other way
    # round), eps 1e-5; gamma and beta trainable, as the layer's
    c = x[0].shape[1]
    if "bn" not in st:
        d = x[0].device
        st["bn"] = (torch.zeros(c, device=d), torch.ones(c, device=d),
                    torch.ones(c, device=d, requires_grad=True),
                    torch.zeros(c, device=d, requires_grad=True))
    rm, rv, g, b = st["bn"]
    return F.batch_norm(x[0], rm, rv, g, b, training=True, momentum=0.1, eps=1e-5)


def _attention(q, k, v, st):
    """Causal attention as PyTorch runs it: F.scaled_dot_product_attention
    (its fused kernels) where torch has it (2.0+), else eager's matmul,
    mask, softmax, matmul, the mask made once."""
    f = getattr(F, "scaled_dot_product_attention", None)
    if f is not None:
        return f(q, k, v, is_causal=True)
    t = q.shape[-2]
    if st.get("mask_t") != t:
        st["mask_t"] = t
        st["mask"] = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    return torch.softmax(s.masked_fill(st["mask"], float("-inf")), dim=-1) @ v


def _params(st):
    """The tensors a row's op owns (batch norm's gamma and beta)."""
    return [t for t in st.get("bn", ())[2:]]


OPS = {
    "add": lambda x, a, st: x[0] + x[1],
    "sub": lambda x, a, st: x[0] - x[1],
    "mul": lambda x, a, st: x[0] * x[1],
    "div": lambda x, a, st: x[0] / x[1],
    "maximum": lambda x, a, st: torch.maximum(x[0], x[1]),
    "minimum": lambda x, a, st: torch.minimum(x[0], x[1]),
    "bias_add": lambda x, a, st: x[0] + x[1].view(1, -1, *([1] * (x[0].dim() - 2))),
    "neg": lambda x, a, st: -x[0],
    "abs": lambda x, a, st: torch.abs(x[0]),
    "square": lambda x, a, st: torch.square(x[0]),
    "sqrt": lambda x, a, st: torch.sqrt(x[0]),
    "rsqrt": lambda x, a, st: torch.rsqrt(x[0]),
    "exp": lambda x, a, st: torch.exp(x[0]),
    "log": lambda x, a, st: torch.log(x[0]),
    "pow": lambda x, a, st: torch.pow(x[0], a[0]),
    "clip": lambda x, a, st: torch.clamp(x[0], a[0], a[1]),
    "scale": lambda x, a, st: x[0] * a[0],
    "relu": lambda x, a, st: torch.relu(x[0]),
    "leaky_relu": lambda x, a, st: F.leaky_relu(x[0], a[0]),
    "sigmoid": lambda x, a, st: torch.sigmoid(x[0]),
    "tanh": lambda x, a, st: torch.tanh(x[0]),
    "gelu": lambda x, a, st: F.gelu(x[0], approximate="tanh" if a[0] else "none"),
    "silu": lambda x, a, st: F.silu(x[0]),
    "softplus": lambda x, a, st: F.softplus(x[0]),
    "concat": lambda x, a, st: torch.cat(x, dim=1),
    "mse": lambda x, a, st: F.mse_loss(x[0], x[1]),
    "l1_loss": lambda x, a, st: F.l1_loss(x[0], x[1]),
    "huber_loss": lambda x, a, st: F.huber_loss(x[0], x[1], delta=a[0]),
    "sigmoid_xent": lambda x, a, st: F.binary_cross_entropy_with_logits(x[0], x[1]),
    "softmax_xent": lambda x, a, st: F.cross_entropy(x[0], x[1]),
    "matmul": lambda x, a, st: x[0] @ x[1],
    "conv2d": lambda x, a, st: F.conv2d(x[0], x[1], None, int(a[0]), int(a[1])),
    "batch_norm": _batch_norm,
    "max_pool": lambda x, a, st: F.max_pool2d(x[0], int(a[0]), int(a[1]), int(a[2])),
    "avg_pool": lambda x, a, st: F.avg_pool2d(x[0], int(a[0]), int(a[1]), int(a[2]),
                                              count_include_pad=False),
    "global_avg_pool": lambda x, a, st: x[0].mean(dim=(2, 3)),
    # the families after the first table
    "conv2d_transpose": lambda x, a, st: F.conv_transpose2d(x[0], x[1], None, int(a[0]),
                                                            int(a[1])),
    "upsample_nearest": lambda x, a, st: F.interpolate(x[0], scale_factor=int(a[0]),
                                                       mode="nearest"),
    "upsample_bilinear": lambda x, a, st: F.interpolate(x[0], scale_factor=int(a[0]),
                                                        mode="bilinear", align_corners=False),
    "transpose_nhwc": lambda x, a, st: x[0].permute(0, 2, 3, 1).contiguous(),
    "transpose_nchw": lambda x, a, st: x[0].permute(0, 3, 1, 2).contiguous(),
    # an NHWC input: torch reads the permuted view as channels_last
    "conv2d_nhwc": lambda x, a, st: F.conv2d(x[0].permute(0, 3, 1, 2), x[1], None,
                                             int(a[0]), int(a[1])),
    "gather": lambda x, a, st: F.embedding(x[0], x[1]),
    "reduce_sum_hw": lambda x, a, st: x[0].sum(dim=(2, 3)),
    "reduce_mean_hw": lambda x, a, st: x[0].mean(dim=(2, 3)),
    "softmax": lambda x, a, st: torch.softmax(x[0], dim=-1),
    "log_softmax": lambda x, a, st: torch.log_softmax(x[0], dim=-1),
    "softmax_xent_seq": lambda x, a, st: F.cross_entropy(x[0].reshape(-1, x[0].shape[-1]),
                                                         x[1].reshape(-1)),
    "batch_matmul_qk": lambda x, a, st: x[0] @ x[1].transpose(-1, -2),
    "layer_norm": lambda x, a, st: F.layer_norm(x[0], x[1].shape, x[1], x[2], 1e-5),
    "attention_causal": lambda x, a, st: _attention(x[0], x[1], x[2], st),
    # a whole step around it: the mean square of the output
    "attention_sq_step": lambda x, a, st: _attention(x[0], x[1], x[2], st).square().mean(),
    "group_norm": lambda x, a, st: F.group_norm(x[0], int(a[0]), x[1], x[2], 1e-5),
    # whole models (step rows): x, labels, then weights and biases
    "mlp_step": lambda x, a, st: F.cross_entropy(
        torch.relu(torch.relu(x[0] @ x[2] + x[3]) @ x[4] + x[5]) @ x[6] + x[7], x[1]),
    # examples/autoencoder.c: image, then enc0, enc1, dec0, dec1 weights and biases
    "autoencoder_step": lambda x, a, st: F.mse_loss(torch.sigmoid(F.conv_transpose2d(
        torch.relu(F.conv_transpose2d(
            torch.relu(F.conv2d(torch.relu(F.conv2d(x[0], x[1], x[2], 2, 1)),
                                x[3], x[4], 2, 1)),
            x[5], x[6], 2, 1)), x[7], x[8], 2, 1)), x[0]),
}

# the step rows' update: SGD without momentum, as tp-bench's models
STEP_LR = 1e-6


# compact JSON: tp-bench reads "key":value without spaces
SEP = (",", ":")


def make_inputs(row, gen):
    xs = []
    for i in row["inputs"]:
        k, shape = i["kind"], i["shape"]
        if k == "l":
            classes = int(row["attr"][5]) or row["inputs"][0]["shape"][-1]
            xs.append(torch.randint(0, classes, shape, generator=gen).to(DEVICE))
            continue
        if k == "x":
            t = torch.rand(shape, generator=gen) * 2 - 1
        elif k == "p":
            t = torch.rand(shape, generator=gen) + 0.5
        elif k == "t":
            t = torch.rand(shape, generator=gen)
        elif k == "w":
            t = (torch.rand(shape, generator=gen) * 2 - 1) * 0.1
        else:
            raise ValueError("input kind %r" % k)
        # moved before requires_grad, so that it stays a leaf on a GPU
        t = t.to(DEVICE)
        if k != "t":
            t.requires_grad_(True)
        xs.append(t)
    return xs


_cache = {}


def time_row(row, seconds, min_iters):
    fn = OPS[row["op"]]
    # the inputs (and an op's own tensors) once per row, kept while the
    # requests are about it (tp-bench asks for a row's rounds in a row)
    if _cache.get("name") != row["name"]:
        _cache.clear()
        gen = torch.Generator().manual_seed(7)
        _cache.update(name=row["name"], gen=gen, xs=make_inputs(row, gen), st={}, g=None)
    xs, st, attr = _cache["xs"], _cache["st"], row["attr"]
    leaves = None
    clock = time.perf_counter_ns
    cuda = DEVICE != "cpu"
    events = cuda and not row.get("step")
    if events:
        ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if row.get("step") and row.get("cpu") and not cuda:
        # at 1 thread the calling thread's own time: the process's would
        # count the OpenMP workers a 2-thread round left spinning
        clock = time.thread_time_ns if row["threads"] == 1 else time.process_time_ns
    times = []
    start = None
    it = 0
    while True:
        if leaves is not None:
            for t in leaves:
                t.grad = None
        if cuda:
            torch.cuda.synchronize()  # nothing before the region in it
        if events:
            ev0.record()
        t0 = clock()
        y = fn(xs, attr, st)
        if y.dim() == 0:
            y.backward()
        else:
            if _cache["g"] is None:
                _cache["g"] = torch.rand(y.shape, generator=_cache["gen"]).to(DEVICE)
            y.backward(_cache["g"])
        if leaves is None:
            leaves = [t for t in xs if t.requires_grad] + _params(st)
        if row.get("step"):
            with torch.no_grad():
                for t in leaves:
                    t.add_(t.grad, alpha=-STEP_LR)
        if events:
            ev1.record()
        if cuda:
            torch.cuda.synchronize()  # all of the region's work in it
        t1 = clock()
        if events:
            t1 = t0 + ev0.elapsed_time(ev1) * 1e6  # ms to ns
        if it == 1:
            start = time.perf_counter()
        if it >= 2:
            times.append((t1 - t0) / 1e3)
        it += 1
        if len(times) >= min_iters and time.perf_counter() - start >= seconds:
            break
    times.sort()
    n = len(times)
    med = times[n // 2] if n % 2 else (times[n // 2 - 1] + times[n // 2]) / 2
    return med, n


def main():
    global DEVICE
    args = sys.argv[1:]
    tf32 = "--tf32" in args
    if tf32:
        args.remove("--tf32")
    device = None
    if len(args) == 3 and args[1] == "--device" and args[2].isdigit():
        device = int(args[2])
        args = args[:1]
    if args != ["--serve"]:
        print(__doc__, file=sys.stderr)
        return 2
    hello = {"torch": torch.__version__}
    if device is not None:
        if not torch.cuda.is_available() or device >= torch.cuda.device_count():
            print("torch_ops.py: no CUDA device %d for torch (%d device(s))"
                  % (device, torch.cuda.device_count() if torch.cuda.is_available() else 0),
                  file=sys.stderr)
            return 4
        DEVICE = "cuda:%d" % device
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        hello["device"] = torch.cuda.get_device_name(device)
    print(json.dumps(hello, separators=SEP), flush=True)
    torch.manual_seed(0)
    for line in sys.stdin:
        if not line.strip():
            continue
        row = json.loads(line)
        out = {"name": row["name"], "threads": row["threads"]}
        if row["op"] not in OPS:
            out.update(median_us=-1, iters=0, error="no op %r in OPS" % row["op"])
            print("torch_ops.py: no op %r in OPS (row %s)" % (row["op"], row["name"]),
                  file=sys.stderr)
        else:
            if DEVICE == "cpu":
                torch.set_num_threads(row["threads"])
            med, iters = time_row(row, row["seconds"], row["min_iters"])
            out.update(median_us=round(med, 2), iters=iters)
        print(json.dumps(out, separators=SEP), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
