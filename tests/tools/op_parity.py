#!/usr/bin/python3
"""towerpack tests: recompute op rows with PyTorch's autograd and compare.

Usage: op_parity.py DIR
       op_parity.py onnx MODEL.onnx X.f32 D0,D1,... Y.f32
       op_parity.py opencv MODEL.onnx X.f32 D0,D1,... Y.f32 [MODEL X DIMS Y]...

The second form checks an exported model instead: onnx.checker (full
check) accepts it, and evaluating its nodes with numpy on the input X gives
towerpack's output Y within 1e-5 (a small evaluator for the ops the
elementwise, loss, linalg and reduce families export; onnx 1.12 has no reference
runtime).

The third form has OpenCV's DNN module (Debian's python3-opencv,
cv2.dnn.readNetFromONNX) import and run each model on its X and prints
one line per model: "agrees" (max |diff| within 1e-5 + 1e-5 |y|),
"differs" or "cannot read" with OpenCV's first error line, so that a
test can say which exports OpenCV supports (one process for all: cv2's
import costs seconds). Exit 0 when every model agrees, else 1.

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
    # the shape family: attributes a (perm, start, pads before), b (step,
    # pads after), axis; integer inputs arrive as int64 tensors
    "transpose": lambda x, r: x[0].permute(*r["a"][:x[0].dim()]),
    "slice": lambda x, r: shape_slice(x[0], r),
    "concat": lambda x, r: torch.cat([x[0], x[1]], dim=r["axis"]),
    "pad": lambda x, r: F.pad(x[0], [p for i in reversed(range(x[0].dim()))
                                     for p in (r["a"][i], r["b"][i])], value=r["alpha"]),
    "broadcast_to": lambda x, r: torch.broadcast_to(x[0], r["y"]),
    # F.embedding for a [V, D] table; a table of more dims by indexing
    "gather": lambda x, r: (F.embedding(x[1], x[0]) if x[0].dim() == 2
                            else x[0][x[1]]),
    "one_hot": lambda x, r: F.one_hot(x[0], r["y"][-1]).float(),
    # the convolution family: NCHW, W as torch lays it out (conv [O,C/g,..],
    # transpose [C,O/g,..]); upsampling by the row's integer factor
    # pooling: alpha the window; padding never counted in an average
    "max_pool": lambda x, r: F.max_pool2d(x[0], int(r["alpha"]), stride=r["stride"],
                                          padding=r["pad"]),
    "avg_pool": lambda x, r: F.avg_pool2d(x[0], int(r["alpha"]), stride=r["stride"],
                                          padding=r["pad"], count_include_pad=False),
    "conv2d": lambda x, r: F.conv2d(x[0], x[1], stride=r["stride"], padding=r["pad"],
                                    dilation=r["dilation"], groups=r["groups"]),
    "conv2d_transpose": lambda x, r: F.conv_transpose2d(
        x[0], x[1], stride=r["stride"], padding=r["pad"], output_padding=r["out_pad"],
        groups=r["groups"], dilation=r["dilation"]),
    "upsample_nearest": lambda x, r: F.interpolate(x[0], scale_factor=r["stride"],
                                                   mode="nearest"),
    "upsample_bilinear": lambda x, r: F.interpolate(x[0], scale_factor=r["stride"],
                                                    mode="bilinear",
                                                    align_corners=bool(r["align"])),
    # the linalg family: alpha/beta are batch_matmul's transposes, the
    # norms' eps and layer norm's axes / group norm's groups
    "batch_matmul": lambda x, r: torch.matmul(
        x[0].transpose(-1, -2) if r["alpha"] else x[0],
        x[1].transpose(-1, -2) if r["beta"] else x[1]),
    # (norm_params: the weight and bias the row has, None for those left out)
    "layer_norm": lambda x, r: F.layer_norm(x[0], tuple(x[0].shape[-int(r["beta"]):]),
                                            *norm_params(x, r), eps=r["alpha"]),
    "group_norm": lambda x, r: F.group_norm(x[0], int(r["beta"]),
                                            *norm_params(x, r, x[0].shape[1]),
                                            eps=r["alpha"]),
    "instance_norm": lambda x, r: F.instance_norm(x[0], *((None, None) + norm_params(x, r)),
                                                  eps=r["alpha"]),
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
    # fused attention: alpha the scale, beta causal; heads: the packed form
    "attention": lambda x, r: (attention_qkv(x[0], r["heads"], bool(r["beta"]), r["alpha"])
                               if r.get("heads") else
                               sdpa(x[0], x[1], x[2], bool(r["beta"]), r["alpha"])),
    "top_k_accuracy": lambda x, r: (x[0].topk(int(r["alpha"]), dim=1).indices
                                    == x[1].long()[:, None]).any(1).float().mean(),
}


def sdpa(q, k, v, causal, scale):
    """F.scaled_dot_product_attention (is_causal, scale) where torch has it
    (2.1+), else its definition: softmax(scale q k^T, -inf above the
    diagonal when causal) v."""
    f = getattr(F, "scaled_dot_product_attention", None)
    if f is not None:
        try:
            return f(q, k, v, is_causal=causal, scale=scale)
        except TypeError:  # torch 2.0: no scale argument
            pass
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:
        tq, tk = s.shape[-2], s.shape[-1]
        s = s.masked_fill(torch.ones(tq, tk, dtype=torch.bool).triu(1), float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v)


def attention_qkv(x, heads, causal, scale):
    """tp_attention_qkv: x [...,T,3C] (q, k, v side by side in each row,
    each `heads` heads of D) cut into heads [...,H,T,D], attended, and the
    heads merged back to [...,T,C], as a Transformer written in torch
    does it."""
    *lead, t, c3 = x.shape
    c = c3 // 3
    h = x.reshape(*lead, t, 3 * heads, c // heads).transpose(-2, -3)
    q, k, v = h.split(heads, dim=-3)
    return sdpa(q, k, v, causal, scale).transpose(-2, -3).reshape(*lead, t, c)


def norm_params(x, r, ones_with_bias=0):
    """(weight, bias) of a norm row: inputs 1 and 2, or None for the one
    towerpack's row leaves out ("absent": bit 0 gamma, bit 1 beta).
    ones_with_bias C: a weight of C ones (no gradient) in place of None
    when there is a bias: torch 1.13's group_norm backward fails with a
    bias and no weight ("tensor does not have a device")."""
    ab = r.get("absent", 0)
    rest = list(x[1:])
    w = None if ab & 1 else rest.pop(0)
    b = None if ab & 2 else rest.pop(0)
    if w is None and b is not None and ones_with_bias:
        w = torch.ones(ones_with_bias)
    return (w, b)


def shape_slice(x, r):
    """x[start::step] per axis for count = the output's dim: index_select
    with the element indices, so negative steps need no flip."""
    for i in range(x.dim()):
        idx = r["a"][i] + r["b"][i] * torch.arange(r["y"][i])
        x = x.index_select(i, idx)
    return x


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


# ---- the convolution family's ONNX nodes: Conv and ConvTranspose as the
# ONNX operators define them (evaluated by torch in float64 from the node's
# own attributes), Resize from the ONNX formulas in numpy
def _attrs(node):
    from onnx import helper
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _conv_node(node, x, w, b=None, transpose=False):
    a = _attrs(node)
    p = list(a.get("pads", [0, 0, 0, 0]))
    assert p[0] == p[2] and p[1] == p[3], "asymmetric pads"
    kw = dict(stride=tuple(a.get("strides", [1, 1])), padding=(p[0], p[1]),
              dilation=tuple(a.get("dilations", [1, 1])), groups=int(a.get("group", 1)))
    t = lambda v: None if v is None else torch.tensor(v, dtype=torch.float64)
    if transpose:
        y = F.conv_transpose2d(t(x), t(w), t(b), output_padding=tuple(
            a.get("output_padding", [0, 0])), **kw)
    else:
        y = F.conv2d(t(x), t(w), t(b), **kw)
    return y.numpy()


def _resize_axis(n_in, n_out, scale, ctm, mode):
    """Source indices and weights along one axis (ONNX Resize, opset 13)."""
    o = np.arange(n_out, dtype=np.float64)
    if ctm == "asymmetric":
        src = o / scale
    elif ctm == "align_corners":
        src = o * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros_like(o)
    elif ctm == "pytorch_half_pixel":
        src = (o + 0.5) / scale - 0.5 if n_out > 1 else np.zeros_like(o)
    else:
        src = (o + 0.5) / scale - 0.5
    if mode == "nearest":  # nearest_mode floor
        i0 = np.clip(np.floor(src), 0, n_in - 1).astype(int)
        return i0, i0, np.ones_like(src), np.zeros_like(src)
    src = np.clip(src, 0, n_in - 1)
    i0 = np.floor(src).astype(int)
    i1 = np.minimum(i0 + 1, n_in - 1)
    l1 = src - i0
    return i0, i1, 1 - l1, l1


def _resize_node(node, x, roi, scales):
    a = _attrs(node)
    mode = a.get("mode", b"nearest").decode()
    ctm = a.get("coordinate_transformation_mode", b"half_pixel").decode()
    assert list(scales[:2]) == [1, 1]
    x = x.astype(np.float64)
    hs = _resize_axis(x.shape[2], int(x.shape[2] * scales[2]), float(scales[2]), ctm, mode)
    ws = _resize_axis(x.shape[3], int(x.shape[3] * scales[3]), float(scales[3]), ctm, mode)
    rows = (x[:, :, hs[0], :] * hs[2][:, None] + x[:, :, hs[1], :] * hs[3][:, None])
    return rows[:, :, :, ws[0]] * ws[2] + rows[:, :, :, ws[1]] * ws[3]


CONV_NODE_FNS = {
    "Conv": _conv_node,
    "ConvTranspose": lambda n, x, w, b=None: _conv_node(n, x, w, b, transpose=True),
    "Resize": _resize_node,
    "Relu": lambda n, x: np.maximum(x, 0),
}


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
    if g.input[0].type.tensor_type.elem_type == onnx.TensorProto.INT32:
        env[g.input[0].name] = env[g.input[0].name].astype(np.int32)  # ids as floats
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
        "MatMul": np.matmul,
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
    rfns = {  # looked up after afns (the node-style table below)
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

    # ops whose attributes matter (the node comes first)
    def attr(n, name, default=None):
        for a in n.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default

    def instance_norm(n, v, scale, bias):
        ax = tuple(range(2, v.ndim))
        v64 = v.astype(np.float64)
        mu = v64.mean(axis=ax, keepdims=True)
        var = ((v64 - mu) ** 2).mean(axis=ax, keepdims=True)
        cs = (1, -1) + (1,) * (v.ndim - 2)
        return (v64 - mu) / np.sqrt(var + attr(n, "epsilon")) * scale.reshape(cs) + \
            bias.reshape(cs)

    def reduce_mean(n, v):
        # the losses' mean (no axes: every axis, keepdims 0) and the norms'
        # (axes, keepdims 1)
        axes = attr(n, "axes")
        return np.mean(v.astype(np.float64), axis=tuple(axes) if axes else None,
                       keepdims=bool(attr(n, "keepdims", 1)))

    afns = {
        # the linalg family
        "ReduceMean": reduce_mean,
        "Transpose": lambda n, v: np.transpose(v, attr(n, "perm")),
        "Reshape": lambda n, v, s: v.reshape([v.shape[i] if int(d) == 0 else int(d)
                                              for i, d in enumerate(s.tolist())]),
        "InstanceNormalization": instance_norm,
        # a shape travels as floats here, Reshape reads it back as ints
        "Shape": lambda n, v: np.array(v.shape, dtype=np.float32),
    }
    # the shape family: ops whose attributes matter (the node comes first)

    def np_slice(n, v, starts, ends, axes, steps):
        idx = [slice(None)] * v.ndim
        for s0, e0, a0, st in zip(starts, ends, axes, steps):
            # ONNX's clamping (numpy's slice does the same for these)
            stop = int(e0)
            if e0 < -v.shape[a0]:  # before element 0
                stop = None if st < 0 else 0
            idx[int(a0)] = slice(int(s0), stop, int(st))
        return v[tuple(idx)]

    def np_pad(n, v, pads, value):
        r = v.ndim
        return np.pad(v, [(int(pads[i]), int(pads[r + i])) for i in range(r)],
                      constant_values=value)

    def np_one_hot(n, idx, depth, values):
        d = int(np.asarray(depth).reshape(-1)[0])
        out = np.full(idx.shape + (d,), values[0], dtype=np.float32)
        np.put_along_axis(out, idx[..., None].astype(np.int64), values[1], axis=-1)
        return out

    afns.update({
        "Slice": np_slice,
        "Concat": lambda n, *vs: np.concatenate(vs, axis=attr(n, "axis")),
        "Pad": np_pad,
        "Expand": lambda n, v, shp: v * np.ones(tuple(int(d) for d in shp), dtype=v.dtype),
        "Gather": lambda n, v, i: np.take(v, i, axis=attr(n, "axis", 0)),
        "OneHot": np_one_hot,
    })
    for n in g.node:
        ins = [env[i] if i else None for i in n.input]
        if n.op_type in afns:
            r = afns[n.op_type](n, *ins)
        elif n.op_type in rfns:  # the reduce family reads an attribute dict
            r = rfns[n.op_type]({t.name: onnx.helper.get_attribute_value(t)
                                 for t in n.attribute}, *ins)
        elif n.op_type in CONV_NODE_FNS:  # the convolution family reads attributes
            r = CONV_NODE_FNS[n.op_type](n, *ins)
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


def opencv_eval(model_path, x_path, dims, y_path):
    """OpenCV's DNN importer and forward pass on X against towerpack's Y."""
    try:
        import cv2
        import onnx
    except ImportError as e:
        print("python3-opencv or python3-onnx missing (%s)" % e)
        return 3
    model = onnx.load(model_path)
    ops = ",".join(sorted({n.op_type for n in model.graph.node}))
    shape = [int(d) for d in dims.split(",")]
    x = np.fromfile(x_path, dtype="<f4").reshape(shape)
    if model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.INT32:
        x = x.astype(np.int32)
    want = np.fromfile(y_path, dtype="<f4")
    try:
        net = cv2.dnn.readNetFromONNX(model_path)
        # a 4-d array goes in as a blob (cv2 reads a 3-d one as an image
        # with channels, so the callers' inputs are 2-d or 4-d)
        net.setInput(np.ascontiguousarray(x))
        got = np.asarray(net.forward(), dtype=np.float64).reshape(-1)
    except cv2.error as e:
        msg = [l for l in str(e).splitlines() if "error:" in l]
        print("%s (%s): OpenCV %s cannot read it: %s" % (
            os.path.basename(model_path), ops, cv2.__version__,
            (msg[0] if msg else str(e)).strip()[:300]))
        return 4
    if got.size != want.size:
        print("%s (%s): OpenCV %s differs: %d outputs, towerpack %d" % (
            os.path.basename(model_path), ops, cv2.__version__, got.size, want.size))
        return 1
    err = np.abs(got - want)
    ok = bool(np.all(err <= 1e-5 + 1e-5 * np.abs(want)))
    print("%s (%s): OpenCV %s %s: max |diff| %.3g over %d values" % (
        os.path.basename(model_path), ops, cv2.__version__,
        "agrees" if ok else "differs", float(err.max()) if err.size else 0.0, got.size))
    return 0 if ok else 1


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "onnx":
        return onnx_eval(*sys.argv[2:])
    if len(sys.argv) >= 6 and (len(sys.argv) - 2) % 4 == 0 and sys.argv[1] == "opencv":
        rcs = [opencv_eval(*sys.argv[i:i + 4]) for i in range(2, len(sys.argv), 4)]
        return 3 if 3 in rcs else (0 if not any(rcs) else 1)
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
            ints = r.get("ints", 0)
            xs = [torch.tensor(load(d, label, "x%d" % i, s)).long() if (ints >> i) & 1
                  else torch.tensor(load(d, label, "x%d" % i, s), requires_grad=True)
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
                if op == "stop_gradient" or op == "one_hot" or (ints >> i) & 1:
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
