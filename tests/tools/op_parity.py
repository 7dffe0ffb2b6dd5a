#!/usr/bin/python3
"""towerpack tests: recompute op rows with PyTorch's autograd and compare.

Usage: op_parity.py DIR
       op_parity.py onnx MODEL.onnx X.f32 D0,D1,... Y.f32

The second form checks an exported model instead: onnx.checker (full
check) accepts it, and evaluating its nodes with numpy on the input X gives
towerpack's output Y within 1e-5 (a small evaluator for the ops the
elementwise, loss and reduce families export; onnx 1.12 has no reference
runtime).

DIR holds manifest.jsonl (one JSON object per row: label, op, alpha, beta,
atol, rtol, the output shape y and the input shapes) and, per row, raw
little-endian float32 files LABEL.x0.f32, LABEL.dx0.f32, ..., LABEL.y.f32,
LABEL.dy.f32, written by tests/gpu/test_proc_op_parity.c from towerpack's
CPU kernels. For each row this script runs the same op in torch (float32)
on the same inputs, back-propagates the same dy, and checks the output and
every input's gradient: |towerpack - torch| <= atol + rtol * |torch|.

A new op family adds one entry to OPS (op name -> torch function of the
inputs and the row). Exit status: 0 all rows close, 1 a mismatch (each one
printed with MISMATCH), 3 torch or numpy missing.
"""
import json
import os
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover - depends on the machine
    print("python3-torch/python3-numpy missing (%s)" % e)
    sys.exit(3)

OPS = {
    "add": lambda x, r: x[0] + x[1],
    "sub": lambda x, r: x[0] - x[1],
    "mul": lambda x, r: x[0] * x[1],
    "div": lambda x, r: x[0] / x[1],
    "maximum": lambda x, r: torch.maximum(x[0], x[1]),
    "minimum": lambda x, r: torch.minimum(x[0], x[1]),
    "relu": lambda x, r: torch.relu(x[0]),
    "leaky_relu": lambda x, r: F.leaky_relu(x[0], r["alpha"]),
    "tanh": lambda x, r: torch.tanh(x[0]),
    "sigmoid": lambda x, r: torch.sigmoid(x[0]),
    "scale": lambda x, r: x[0] * r["alpha"],
    "neg": lambda x, r: -x[0],
    "abs": lambda x, r: torch.abs(x[0]),
    "square": lambda x, r: torch.square(x[0]),
    "sqrt": lambda x, r: torch.sqrt(x[0]),
    "rsqrt": lambda x, r: torch.rsqrt(x[0]),
    "exp": lambda x, r: torch.exp(x[0]),
    "log": lambda x, r: torch.log(x[0]),
    "pow": lambda x, r: torch.pow(x[0], r["alpha"]),
    "clip": lambda x, r: torch.clamp(x[0], r["alpha"], r["beta"]),
    "gelu": lambda x, r: F.gelu(x[0]),
    "gelu_tanh": lambda x, r: F.gelu(x[0], approximate="tanh"),
    "silu": lambda x, r: F.silu(x[0]),
    "softplus": lambda x, r: F.softplus(x[0]),
    # forward x; backward nothing flows: torch's detach, and a zero
    # gradient for the input (towerpack's kernel writes none: the graph
    # never runs it, see the row's note below)
    "stop_gradient": lambda x, r: x[0].detach(),
    # the loss family: reduction='mean', gradients to both inputs
    "mse": lambda x, r: F.mse_loss(x[0], x[1]),
    "l1_loss": lambda x, r: F.l1_loss(x[0], x[1]),
    "huber_loss": lambda x, r: F.huber_loss(x[0], x[1], delta=r["alpha"]),
    "sigmoid_xent": lambda x, r: F.binary_cross_entropy_with_logits(x[0], x[1]),
    # the reduce family: r["axes"] the reduced (or softmax) axes; labels
    # (input 1) arrive as floats of integer value
    "reduce_sum": lambda x, r: torch.sum(x[0], dim=tuple(r["axes"]), keepdim=bool(r["keepdims"])),
    "reduce_mean": lambda x, r: torch.mean(x[0], dim=tuple(r["axes"]), keepdim=bool(r["keepdims"])),
    "reduce_max": lambda x, r: torch.amax(x[0], dim=tuple(r["axes"]), keepdim=bool(r["keepdims"])),
    "argmax": lambda x, r: torch.argmax(x[0], dim=r["axes"][0], keepdim=bool(r["keepdims"])).float(),
    "softmax": lambda x, r: torch.softmax(x[0], dim=r["axes"][0]),
    "log_softmax": lambda x, r: torch.log_softmax(x[0], dim=r["axes"][0]),
    "softmax_xent_seq": lambda x, r: F.cross_entropy(
        x[0].reshape(-1, x[0].shape[-1]), x[1].long().reshape(-1), ignore_index=int(r["alpha"])),
    "softmax_xent": lambda x, r: F.cross_entropy(x[0], x[1].long(), label_smoothing=r["alpha"]),
    "top_k_accuracy": lambda x, r: (x[0].topk(int(r["alpha"]), dim=1).indices
                                    == x[1].long()[:, None]).any(1).float().mean(),
}


def load(d, label, what, shape):
    a = np.fromfile(os.path.join(d, "%s.%s.f32" % (label, what)), dtype="<f4")
    return a.reshape(shape)


def compare(label, what, got, want, atol, rtol):
    got = np.asarray(got, dtype=np.float32)
    want = np.asarray(want, dtype=np.float32)
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    bound = atol + rtol * np.abs(want.astype(np.float64))
    bad = ~(err <= bound)
    if bad.any():
        i = int(np.flatnonzero(bad.reshape(-1))[0])
        print("MISMATCH %s %s: %d of %d elements, first [%d]: towerpack %.9g, "
              "torch %.9g (atol %g, rtol %g)" % (label, what, int(bad.sum()), bad.size,
                                                 i, got.reshape(-1)[i], want.reshape(-1)[i],
                                                 atol, rtol))
        return False
    return True


def onnx_eval(model_path, x_path, dims, y_path):
    import math
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError as e:
        print("python3-onnx missing (%s)" % e)
        return 3
    model = onnx.load(model_path)
    onnx.checker.check_model(model, full_check=True)
    g = model.graph
    shape = [int(d) for d in dims.split(",")]
    env = {g.input[0].name: np.fromfile(x_path, dtype="<f4").reshape(shape)}
    for t in g.initializer:
        env[t.name] = numpy_helper.to_array(t)
    erf = np.vectorize(math.erf, otypes=[np.float32])
    fns = {
        "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide,
        "Max": np.maximum, "Min": np.minimum, "Neg": np.negative, "Abs": np.abs,
        "Sqrt": np.sqrt, "Reciprocal": np.reciprocal, "Exp": np.exp, "Log": np.log,
        "Pow": np.power, "Erf": erf, "Tanh": np.tanh, "Identity": lambda v: v,
        "Sigmoid": lambda v: 1 / (1 + np.exp(-v)),
        "Softplus": lambda v: np.log1p(np.exp(v)),
        "Clip": lambda v, lo, hi: np.clip(v, lo, hi),
    }
    # ops that read their attributes (a: name -> value): the reduce family's,
    # and the losses' ReduceMean (every axis, keepdims 0)
    def axes_of(a, axes=None):
        axes = a.get("axes") if axes is None else axes
        return None if axes is None or len(axes) == 0 else tuple(int(v) for v in axes)

    def softmax(v, axis):
        e = np.exp(v - np.max(v, axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)

    def log_softmax(v, axis):
        m = v - np.max(v, axis=axis, keepdims=True)
        return m - np.log(np.sum(np.exp(m), axis=axis, keepdims=True))

    def xent(a, scores, labels):
        lp = log_softmax(scores.astype(np.float64), 1)
        keep = labels != a.get("ignore_index", -100)
        safe = np.where(keep, labels, 0).astype(np.int64)
        picked = np.take_along_axis(lp, np.expand_dims(safe, 1), axis=1).squeeze(1)
        return -np.sum(picked[keep]) / np.sum(keep)

    def topk(a, v, k):
        axis = a.get("axis", -1)
        idx = np.take(np.argsort(-v, axis=axis, kind="stable"), np.arange(int(k[0])), axis=axis)
        return np.take_along_axis(v, idx, axis=axis), idx

    casts = {1: np.float32, 6: np.int32, 7: np.int64}
    afns = {
        "ReduceMean": lambda a, v: np.mean(v.astype(np.float64), axis=axes_of(a),
                                           keepdims=bool(a.get("keepdims", 1))),
        "ReduceSum": lambda a, v, axes=None: np.sum(v.astype(np.float64), axis=axes_of(a, axes),
                                                    keepdims=bool(a.get("keepdims", 1))),
        "ReduceMax": lambda a, v: np.max(v, axis=axes_of(a), keepdims=bool(a.get("keepdims", 1))),
        "ArgMax": lambda a, v: (np.expand_dims(np.argmax(v, axis=a.get("axis", 0)), a.get("axis", 0))
                                if a.get("keepdims", 1) else np.argmax(v, axis=a.get("axis", 0))),
        "Cast": lambda a, v: v.astype(casts[a["to"]]),
        "Softmax": lambda a, v: softmax(v.astype(np.float64), a.get("axis", -1)),
        "LogSoftmax": lambda a, v: log_softmax(v.astype(np.float64), a.get("axis", -1)),
        "Transpose": lambda a, v: np.transpose(v, a["perm"]),
        "SoftmaxCrossEntropyLoss": xent,
        "TopK": topk,
        "Unsqueeze": lambda a, v, axes: np.expand_dims(v, tuple(int(x) for x in axes)),
        "Equal": lambda a, x, y: np.equal(x, y),
        "Flatten": lambda a, v: v.reshape(int(np.prod(v.shape[:a.get("axis", 1)])), -1),
        "Reshape": lambda a, v, shape: v.reshape([int(d) for d in shape]),
    }
    for n in g.node:
        ins = [env[i] for i in n.input]
        if n.op_type in afns:
            r = afns[n.op_type]({t.name: onnx.helper.get_attribute_value(t)
                                 for t in n.attribute}, *ins)
        elif n.op_type in fns:
            r = fns[n.op_type](*ins)
        else:
            print("MISMATCH: the evaluator has no %s" % n.op_type)
            return 1
        for name, v in zip(n.output, r if isinstance(r, tuple) else (r,)):
            v = np.asarray(v)
            env[name] = v.astype(np.float32) if v.dtype.kind == "f" else v
    got = env[g.output[0].name]
    want = np.fromfile(y_path, dtype="<f4").reshape(got.shape)
    ok = compare("onnx", g.output[0].name, got, want, 1e-5, 1e-5)
    print("%s: onnx.checker ok, %d nodes (%s), numpy evaluation %s" % (
        model_path, len(g.node), ",".join(sorted({n.op_type for n in g.node})),
        "matches" if ok else "differs"))
    return 0 if ok else 1


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "onnx":
        return onnx_eval(*sys.argv[2:])
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    d = sys.argv[1]
    torch.manual_seed(0)
    ok = True
    rows = 0
    worst = {}
    with open(os.path.join(d, "manifest.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            label, op = r["label"], r["op"]
            if op not in OPS:
                print("MISMATCH %s: no torch form for op %s in op_parity.py" % (label, op))
                ok = False
                continue
            xs = [torch.tensor(load(d, label, "x%d" % i, s), requires_grad=True)
                  for i, s in enumerate(r["inputs"])]
            y = OPS[op](xs, r)
            dy = torch.tensor(load(d, label, "dy", r["y"]))
            atol, rtol = r["atol"], r["rtol"]
            ok &= compare(label, "forward", load(d, label, "y", r["y"]),
                          y.detach().numpy(), atol, rtol)
            if y.requires_grad:
                y.backward(dy)
            for i, s in enumerate(r["inputs"]):
                want = xs[i].grad
                if op == "stop_gradient":
                    continue  # no gradient to compare: the graph never asks
                if want is None:
                    want = torch.zeros(s)
                got = load(d, label, "dx%d" % i, s)
                ok &= compare(label, "grad[%d]" % i, got, want.numpy(), atol, rtol)
                e = float(np.max(np.abs(got - want.numpy()))) if got.size else 0.0
                worst[op] = max(worst.get(op, 0.0), e)
            rows += 1
    print("%d rows checked against torch %s; largest gradient error per op: %s" % (
        rows, torch.__version__,
        ", ".join("%s %.2g" % (k, v) for k, v in sorted(worst.items()))))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
