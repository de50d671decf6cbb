"""ONNX models on tandem (SINGA's ``singa.sonnx``): ``prepare(model, device)`` gives a representation whose
``run(inputs)`` runs the graph, and ``SONNXModel(model)`` is a ``model.Model`` whose forward runs it with
the model's weights as parameters, to evaluate or to train (fine-tuning, a new head on top).

The graph runs eagerly on tandem's operations, node by node in the file's (topological) order, so it
runs on the CPU and on GPUs and back-propagates like any model. Shapes are taken from the inputs of
each call: the parts of a graph that compute shapes (``Shape``, ``Gather`` of a shape, ``Concat`` of
sizes, ``ConstantOfShape``, ...) are evaluated with NumPy as constants. Floating-point initializers
that feed a node's weight inputs (Conv's weight and bias, Gemm's operands, the normalisations' scale and
bias, PRelu's slope; MatMul's and the arithmetic operators' when they hold more than one number) become
parameters;
BatchNormalization's running mean and variance are buffers (updated in training mode); the other
initializers are constants. The operators supported are listed in ``SUPPORTED``; a graph with another
raises NotImplementedError at ``prepare`` naming it. Reading files needs the ``onnx`` package
(``pip install onnx``). ``to_onnx(inputs, outputs)`` (SINGA's export) writes a model computed by tandem as
ONNX: see ``sonnx_export``.
"""
import math
import re
import warnings

import numpy as np

from . import _tandem, autograd, layer, model
from .tensor import Tensor

_OPSET = 17  # the newest operator-set semantics this backend follows

# ONNX TensorProto data types -> NumPy
_NP = {1: np.float32, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32, 7: np.int64, 9: np.bool_, 10: np.float16,
       11: np.float64, 12: np.uint32, 13: np.uint64}
_DT = {np.dtype(np.float32): _tandem.DType.float32, np.dtype(np.float64): _tandem.DType.float64,
       np.dtype(np.float16): _tandem.DType.float16, np.dtype(np.int32): _tandem.DType.int32,
       np.dtype(np.int64): _tandem.DType.int64, np.dtype(np.uint8): _tandem.DType.uint8}
_CACHED_CONSTANTS = 512
_FLOATS = {_tandem.DType.float32, _tandem.DType.float64, _tandem.DType.float16, _tandem.DType.bfloat16}


def _onnx():
    try:
        import onnx
    except ImportError as e:
        raise ImportError("tandem.sonnx reads ONNX files with the onnx package: pip install onnx") from e
    return onnx


# ---- values: tandem tensors, or NumPy arrays for constants (folded with NumPy)
def _is_t(v):
    return isinstance(v, Tensor)


class _Ctx:
    """One run: the device, the training flag, the graph's floating type and the constants on the device."""

    def __init__(self, device, training, float_type=np.float32, cache=None, initializers=None):
        self.device = device
        self.initializers = initializers or {}  # id of an initializer's array -> its name
        self.training = training
        self.float_type = float_type  # the graph's floating type: float64 constants folded with NumPy become it
        # Constants already on the device, by value: later calls (and a recorded step, which cannot copy
        # from the host) reuse them. Operators never write into their inputs, so sharing them is safe. At
        # most _CACHED_CONSTANTS computed values are kept (values that follow the data would otherwise pile up),
        # none dropped; initializers are kept by name.
        self.cache = cache if cache is not None else {}

    def t(self, v, like=None, keep=True):
        """v as a tensor on the run's device: a floating constant in the type of ``like`` (a tensor it meets)
        or else the graph's floating type."""
        if _is_t(v):
            return v
        init = self.initializers.get(id(v))
        a = np.asarray(v)
        if a.dtype == np.bool_:
            a = a.astype(np.uint8)
        elif a.dtype.kind == "f":
            if like is not None and like.dtype in _FLOATS and like.dtype != _tandem.DType.bfloat16:
                a = a.astype({_tandem.DType.float32: np.float32, _tandem.DType.float64: np.float64,
                              _tandem.DType.float16: np.float16}[like.dtype])
            elif a.dtype == np.float64:
                a = a.astype(self.float_type)
        elif a.dtype not in _DT:
            a = a.astype(np.int64 if np.issubdtype(a.dtype, np.integer) else self.float_type)
        bf16 = like is not None and like.dtype == _tandem.DType.bfloat16 and a.dtype.kind == "f"
        if init is not None:  # an initializer: kept by name, whatever its size
            key = (str(self.device), a.dtype.str, bf16, "initializer", init)
        elif keep and a.nbytes <= (1 << 20):
            key = (str(self.device), a.dtype.str, a.shape, bf16, a.tobytes())
        else:
            key = None
        t = self.cache.get(key) if key is not None else None
        if t is None:
            t = _tandem.from_array(np.ascontiguousarray(a), self.device)
            if bf16:
                t = t.as_type(_tandem.DType.bfloat16)
            if init is not None or (key is not None and len(self.cache) < _CACHED_CONSTANTS):
                self.cache[key] = t
        return t


def _np(v, what):
    """A constant's NumPy value (shapes, axes, indices); a tensor is read back."""
    if v is None:
        return None
    if _is_t(v):
        return v.to_numpy()
    return np.asarray(v)


def _ints(v, what):
    return [int(i) for i in np.asarray(_np(v, what)).reshape(-1)]


def _axis(a, rank):
    return a + rank if a < 0 else a


def _rank(v):
    return v.dim() if _is_t(v) else np.ndim(v)


def _shape(v):
    return tuple(v.shape) if _is_t(v) else np.shape(v)


# ---- the operators. Each takes (ctx, node attributes, inputs) and returns a list of outputs.
_OPS = {}


def _op(*names):
    def register(fn):
        for n in names:
            _OPS[n] = fn
        return fn
    return register


def _binary(np_fn, t_fn):
    def run(ctx, at, xs):
        a, b = xs
        if not _is_t(a) and not _is_t(b):
            return [np_fn(np.asarray(a), np.asarray(b))]
        a = ctx.t(a, b if _is_t(b) else None)
        b = ctx.t(b, a)
        return [t_fn(a, b)]
    return run


def _div(a, b):
    if np.issubdtype(a.dtype, np.integer) and np.issubdtype(b.dtype, np.integer):
        return np.trunc(a / b).astype(np.result_type(a, b))
    return a / b


_OPS["Add"] = _binary(np.add, lambda a, b: a + b)
_OPS["Sub"] = _binary(np.subtract, lambda a, b: a - b)
_OPS["Mul"] = _binary(np.multiply, lambda a, b: a * b)
_OPS["Div"] = _binary(_div, lambda a, b: a / b)
_OPS["Pow"] = _binary(lambda a, b: np.power(a, b).astype(a.dtype), lambda a, b: _tandem.pow(a, b))
_OPS["Equal"] = _binary(np.equal, _tandem.equal)
_OPS["Less"] = _binary(np.less, _tandem.less)
_OPS["Greater"] = _binary(np.greater, _tandem.greater)
_OPS["LessOrEqual"] = _binary(np.less_equal, _tandem.less_equal)
_OPS["GreaterOrEqual"] = _binary(np.greater_equal, _tandem.greater_equal)


def _as_mask(t):
    """An ONNX bool held as a tensor (uint8 from a Cast or an input, or a comparison's 1/0 in a floating type)
    in a floating type, which tandem's logical operations take."""
    return t if t.dtype in _FLOATS else _tandem.cast(t, _tandem.DType.float32)


_OPS["And"] = _binary(np.logical_and, lambda a, b: _tandem.logical_and(_as_mask(a), _as_mask(b)))
_OPS["Or"] = _binary(np.logical_or, lambda a, b: _tandem.logical_or(_as_mask(a), _as_mask(b)))
_OPS["Xor"] = _binary(np.logical_xor, lambda a, b: _tandem.logical_xor(_as_mask(a), _as_mask(b)))


def _unary(np_fn, t_fn):
    def run(ctx, at, xs):
        x = xs[0]
        return [np_fn(np.asarray(x)) if not _is_t(x) else t_fn(x)]
    return run


def _erf(a):
    return np.vectorize(math.erf)(a).astype(a.dtype)


for _name, _np_fn, _t_fn in (
        ("Relu", lambda a: np.maximum(a, 0), _tandem.relu), ("Sigmoid", lambda a: 1 / (1 + np.exp(-a)), _tandem.sigmoid),
        ("Tanh", np.tanh, _tandem.tanh), ("Exp", np.exp, _tandem.exp), ("Log", np.log, _tandem.log),
        ("Sqrt", np.sqrt, _tandem.sqrt), ("Abs", np.abs, _tandem.abs), ("Neg", np.negative, _tandem.neg),
        ("Reciprocal", np.reciprocal, _tandem.reciprocal), ("Erf", _erf, _tandem.erf),
        ("Floor", np.floor, _tandem.floor), ("Ceil", np.ceil, _tandem.ceil), ("Sign", np.sign, _tandem.sign),
        ("Sin", np.sin, _tandem.sin), ("Cos", np.cos, _tandem.cos), ("Softplus", lambda a: np.log1p(np.exp(a)),
                                                                         _tandem.softplus),
        ("Softsign", lambda a: a / (1 + np.abs(a)), _tandem.softsign),
        ("Not", np.logical_not, lambda t: _tandem.logical_not(_as_mask(t))),
        ("Identity", lambda a: a, lambda t: t)):
    _OPS[_name] = _unary(_np_fn, _t_fn)


@_op("LeakyRelu")
def _leaky(ctx, at, xs):
    return [_tandem.leaky_relu(ctx.t(xs[0]), float(at.get("alpha", 0.01)))]


@_op("Elu")
def _elu(ctx, at, xs):
    return [_tandem.elu(ctx.t(xs[0]), float(at.get("alpha", 1.0)))]


@_op("Selu")
def _selu(ctx, at, xs):
    return [_tandem.selu(ctx.t(xs[0]), float(at.get("alpha", 1.67326319217681884765625)),
                         float(at.get("gamma", 1.05070102214813232421875)))]


@_op("HardSigmoid")
def _hard_sigmoid(ctx, at, xs):
    return [_tandem.hard_sigmoid(ctx.t(xs[0]), float(at.get("alpha", 0.2)), float(at.get("beta", 0.5)))]


@_op("Gelu")
def _gelu(ctx, at, xs):
    return [_tandem.gelu(ctx.t(xs[0]), at.get("approximate", "none") == "tanh")]


@_op("PRelu")
def _prelu(ctx, at, xs):
    x = ctx.t(xs[0])
    slope = ctx.t(xs[1], x)
    if slope.dim() == 1 and x.dim() > 2 and slope.shape[0] == x.shape[1]:  # per channel: [C] -> [C, 1, 1]
        slope = _tandem.reshape(slope, [slope.shape[0]] + [1] * (x.dim() - 2))
    return [_tandem.prelu(x, slope)]


@_op("Clip")
def _clip(ctx, at, xs):
    lo = at.get("min") if len(xs) < 2 or xs[1] is None else float(_np(xs[1], "Clip min"))
    hi = at.get("max") if len(xs) < 3 or xs[2] is None else float(_np(xs[2], "Clip max"))
    x = xs[0]
    if not _is_t(x):
        return [np.clip(x, lo, hi)]
    return [_tandem.clip(x, None if lo is None else float(lo), None if hi is None else float(hi))]


def _variadic(np_fn, t_fn):
    def run(ctx, at, xs):
        out = xs[0]
        for x in xs[1:]:
            out = _binary(np_fn, t_fn)(ctx, at, [out, x])[0]
        return [out]
    return run


_OPS["Sum"] = _variadic(np.add, lambda a, b: a + b)
_OPS["Max"] = _variadic(np.maximum, _tandem.maximum)
_OPS["Min"] = _variadic(np.minimum, _tandem.minimum)


@_op("Mean")
def _mean(ctx, at, xs):
    total = _OPS["Sum"](ctx, at, xs)[0]
    return [total / len(xs) if not _is_t(total) else total * (1.0 / len(xs))]


@_op("Where")
def _where(ctx, at, xs):
    c, a, b = xs
    if not any(_is_t(v) for v in xs):
        return [np.where(np.asarray(c).astype(bool), a, b)]
    a = ctx.t(a, b if _is_t(b) else None)
    b = ctx.t(b, a)
    return [_tandem.where(ctx.t(np.asarray(_np(c, "Where")).astype(np.float32), a) if not _is_t(c) else c, a, b)]


# ---- shapes
@_op("Shape")
def _shape_op(ctx, at, xs):
    s = np.array(_shape(xs[0]), dtype=np.int64)
    start, end = at.get("start", 0), at.get("end", None)
    return [s[start:end]]


@_op("Size")
def _size(ctx, at, xs):
    return [np.array(int(np.prod(_shape(xs[0]))), dtype=np.int64)]


@_op("Constant")
def _constant(ctx, at, xs):
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in at:
            v = at[key]
            if key.startswith("value_float"):
                return [np.array(v, dtype=np.float32)]
            if key.startswith("value_int"):
                return [np.array(v, dtype=np.int64)]
            return [v]
    raise NotImplementedError("Constant: only value, value_float(s) and value_int(s) are supported")


@_op("ConstantOfShape")
def _constant_of_shape(ctx, at, xs):
    value = at.get("value", np.zeros(1, np.float32))
    return [np.full(_ints(xs[0], "ConstantOfShape"), np.asarray(value).reshape(-1)[0], dtype=np.asarray(value).dtype)]


@_op("Range")
def _range(ctx, at, xs):
    start, limit, delta = (np.asarray(_np(v, "Range")).reshape(()) for v in xs)
    return [np.arange(start, limit, delta, dtype=np.result_type(start, limit, delta))]


@_op("Cast")
def _cast(ctx, at, xs):
    to = _NP[int(at["to"])]
    x = xs[0]
    if not _is_t(x):
        return [np.asarray(x).astype(to)]
    if to is np.bool_:  # true where nonzero (a conversion to uint8 would truncate 0.25 to 0), held as uint8
        return [_tandem.cast(_tandem.not_equal(_as_mask(x), 0.0), _tandem.DType.uint8)]
    target = _DT.get(np.dtype(to))
    if target is None:
        raise NotImplementedError(f"Cast to {np.dtype(to)} of a tensor")
    return [x if x.dtype == target else _tandem.cast(x, target)]


@_op("Reshape")
def _reshape(ctx, at, xs):
    x = xs[0]
    shape = _ints(xs[1], "Reshape shape")
    if not at.get("allowzero", 0):
        shape = [_shape(x)[i] if s == 0 else s for i, s in enumerate(shape)]
    return [np.reshape(x, shape) if not _is_t(x) else _tandem.reshape(x, shape)]


@_op("Flatten")
def _flatten(ctx, at, xs):
    x = xs[0]
    s = _shape(x)
    axis = _axis(int(at.get("axis", 1)), len(s))
    shape = [int(np.prod(s[:axis])), int(np.prod(s[axis:]))]
    return [np.reshape(x, shape) if not _is_t(x) else _tandem.reshape(x, shape)]


@_op("Transpose")
def _transpose(ctx, at, xs):
    x = xs[0]
    perm = at.get("perm", list(range(_rank(x)))[::-1])
    return [np.transpose(x, perm) if not _is_t(x) else _tandem.permute(x, [int(p) for p in perm]).contiguous()]


def _axes_of(at, xs, i, what):
    if len(xs) > i and xs[i] is not None:
        return _ints(xs[i], what)
    return [int(a) for a in at["axes"]] if "axes" in at else None


@_op("Squeeze")
def _squeeze(ctx, at, xs):
    x = xs[0]
    axes = _axes_of(at, xs, 1, "Squeeze axes")
    if axes is None:
        axes = [i for i, d in enumerate(_shape(x)) if d == 1]
    axes = [_axis(a, _rank(x)) for a in axes]
    return [np.squeeze(x, tuple(axes)) if not _is_t(x) else _tandem.squeeze(x, axes)]


@_op("Unsqueeze")
def _unsqueeze(ctx, at, xs):
    x = xs[0]
    axes = sorted(_axis(a, _rank(x) + len(_axes_of(at, xs, 1, "Unsqueeze axes")))
                  for a in _axes_of(at, xs, 1, "Unsqueeze axes"))
    if not _is_t(x):
        out = np.asarray(x)
        for a in axes:
            out = np.expand_dims(out, a)
        return [out]
    return [_tandem.unsqueeze(x, axes)]


@_op("Concat")
def _concat(ctx, at, xs):
    xs = [x for x in xs if x is not None and (int(np.prod(_shape(x))) > 0 or _rank(x) > 1)]  # no empty 1-d parts
    axis = _axis(int(at["axis"]), _rank(xs[0]))
    if not any(_is_t(x) for x in xs):
        return [np.concatenate([np.asarray(x) for x in xs], axis)]
    like = next(x for x in xs if _is_t(x))
    return [_tandem.concat([ctx.t(x, like) for x in xs], axis)]


@_op("Split")
def _split(ctx, at, xs):
    x = xs[0]
    axis = _axis(int(at.get("axis", 0)), _rank(x))
    sizes = _axes_of({"axes": at["split"]} if "split" in at else {}, xs, 1, "Split sizes")
    n = _shape(x)[axis]
    if sizes is None:
        parts = int(at.get("num_outputs", 0)) or ctx.outputs
        each = -(-n // parts)
        sizes = [min(each, n - i * each) for i in range(parts)]
    if not _is_t(x):
        return list(np.split(x, np.cumsum(sizes)[:-1], axis))
    return list(_tandem.split(x, sizes, axis))


@_op("Slice")
def _slice(ctx, at, xs):
    x = xs[0]
    if len(xs) > 1:
        starts, ends = _ints(xs[1], "Slice starts"), _ints(xs[2], "Slice ends")
        axes = _ints(xs[3], "Slice axes") if len(xs) > 3 and xs[3] is not None else list(range(len(starts)))
        steps = _ints(xs[4], "Slice steps") if len(xs) > 4 and xs[4] is not None else [1] * len(starts)
    else:
        starts, ends = list(at["starts"]), list(at["ends"])
        axes = list(at.get("axes", range(len(starts))))
        steps = [1] * len(starts)
    shape = _shape(x)
    index = [slice(None)] * len(shape)
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = _axis(a, len(shape))
        index[a] = slice(*slice(s, e, st).indices(shape[a]))
    if not _is_t(x):
        return [np.asarray(x)[tuple(index)]]
    out = x
    for a, sl in enumerate(index):
        if sl != slice(None):
            start, stop, step = sl.start, sl.stop, sl.step
            out = _tandem.strided_slice(out, a, start, stop if stop >= 0 else None, step)
    return [out]


@_op("Gather")
def _gather(ctx, at, xs):
    data, idx = xs
    axis = _axis(int(at.get("axis", 0)), _rank(data))
    if not _is_t(data) and not _is_t(idx):
        return [np.take(np.asarray(data), np.asarray(idx), axis=axis)]
    data = ctx.t(data)
    scalar = _rank(idx) == 0
    if not _is_t(idx):
        idx = np.asarray(idx).astype(np.int64)
        idx = np.where(idx < 0, idx + data.shape[axis], idx)
        idx = ctx.t(idx.reshape(1) if scalar else idx)
    out = _tandem.index_select(data, axis, idx)
    return [_tandem.squeeze(out, [axis]) if scalar else out]


@_op("Trilu")
def _trilu(ctx, at, xs):
    x = xs[0]
    k = int(_np(xs[1], "Trilu k").reshape(-1)[0]) if len(xs) > 1 and xs[1] is not None else 0
    upper = bool(at.get("upper", 1))
    if not _is_t(x):
        return [np.triu(x, k) if upper else np.tril(x, k)]
    rows, cols = x.shape[-2], x.shape[-1]
    keep = np.triu(np.ones((rows, cols)), k) if upper else np.tril(np.ones((rows, cols)), k)
    return [x * ctx.t(keep, x) if x.dtype in _FLOATS else _tandem.cast(_tandem.cast(x, _tandem.DType.float32) *
                                                                      ctx.t(keep.astype(np.float32)), x.dtype)]


@_op("Expand")
def _expand(ctx, at, xs):
    x = xs[0]
    shape = _ints(xs[1], "Expand shape")
    full = list(np.broadcast_shapes(tuple(_shape(x)), tuple(shape)))
    if not _is_t(x):
        return [np.broadcast_to(x, full).copy()]
    if x.dim() < len(full):
        x = _tandem.reshape(x, [1] * (len(full) - x.dim()) + list(x.shape))
    return [_tandem.expand(x, full)]


@_op("Tile")
def _tile(ctx, at, xs):
    reps = _ints(xs[1], "Tile repeats")
    return [np.tile(xs[0], reps) if not _is_t(xs[0]) else _tandem.tile(xs[0], reps)]


@_op("Pad")
def _pad(ctx, at, xs):
    x = ctx.t(xs[0])
    pads = _ints(xs[1], "Pad pads") if len(xs) > 1 and xs[1] is not None else list(at["pads"])
    value = float(_np(xs[2], "Pad value").reshape(-1)[0]) if len(xs) > 2 and xs[2] is not None \
        else float(at.get("value", 0.0))
    if len(xs) > 3 and xs[3] is not None:  # axes: pads given for those only
        axes = [_axis(a, x.dim()) for a in _ints(xs[3], "Pad axes")]
        full = [0] * (2 * x.dim())
        for i, a in enumerate(axes):
            full[a], full[a + x.dim()] = pads[i], pads[i + len(axes)]
        pads = full
    mode = at.get("mode", "constant")
    if isinstance(mode, bytes):
        mode = mode.decode()
    return [_tandem.pad(x, pads, mode, value)]


@_op("DepthToSpace")
def _depth_to_space(ctx, at, xs):
    mode = at.get("mode", "DCR")
    return [_tandem.depth_to_space(ctx.t(xs[0]), int(at["blocksize"]), mode.decode() if isinstance(mode, bytes)
                                   else mode)]


@_op("Upsample", "Resize")
def _resize(ctx, at, xs):
    x = ctx.t(xs[0])
    mode = at.get("mode", "nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    scales = None
    for i in ((1,) if ctx.op == "Upsample" else (2, 3)):
        if len(xs) > i and xs[i] is not None and np.size(_np(xs[i], "scales")) > 0:
            v = np.asarray(_np(xs[i], "scales")).reshape(-1)
            scales = v if i != 3 else v / np.array(x.shape)
    if scales is None and "scales" in at:
        scales = np.asarray(at["scales"])
    if mode != "nearest" or scales is None or np.any(scales != np.round(scales)) or np.any(scales[:2] != 1):
        raise NotImplementedError(f"{ctx.op}: only nearest-neighbour resizing by whole factors of H and W is "
                                  f"supported (mode {mode!r}, scales {None if scales is None else list(scales)})")
    return [_tandem.upsample_nearest(x, [int(s) for s in scales])]


# ---- matrices, convolutions, pooling, normalisation
@_op("MatMul")
def _matmul(ctx, at, xs):
    a, b = xs
    if not _is_t(a) and not _is_t(b):
        return [np.matmul(a, b)]
    a = ctx.t(a, b if _is_t(b) else None)
    b = ctx.t(b, a)
    if b.dim() == 1:
        return [_tandem.squeeze(_tandem.matmul(a, _tandem.unsqueeze(b, [1])), [a.dim() - 1])]
    if a.dim() == 1:
        return [_tandem.squeeze(_tandem.matmul(_tandem.unsqueeze(a, [0]), b), [b.dim() - 2])]
    return [_tandem.matmul(a, b)]


@_op("Gemm")
def _gemm(ctx, at, xs):
    a = ctx.t(xs[0])
    b = ctx.t(xs[1], a)
    y = _tandem.gemm(a, b, None, float(at.get("alpha", 1.0)), 0.0, bool(at.get("transA", 0)),
                     bool(at.get("transB", 0)))
    if len(xs) > 2 and xs[2] is not None:
        c = ctx.t(xs[2], y)
        beta = float(at.get("beta", 1.0))
        y = y + (c if beta == 1.0 else c * beta)
    return [y]


def _same_pads(size, k, s, mode):
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    return (total // 2, total - total // 2) if mode == "SAME_UPPER" else (total - total // 2, total // 2)


def _window(ctx, at, x, kernel):
    """(pads [top, left, bottom, right], strides) of a 2-d window op."""
    if x.dim() != 4:
        raise NotImplementedError(f"{ctx.op}: only 2-d windows (NCHW inputs) are supported, got {list(x.shape)}")
    strides = [int(s) for s in at.get("strides", [1, 1])]
    if any(int(d) != 1 for d in at.get("dilations", [1, 1])):
        raise NotImplementedError(f"{ctx.op}: dilations other than 1 are not supported")
    auto = at.get("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        (t, b), (l, r) = (_same_pads(x.shape[2 + i], kernel[i], strides[i], auto) for i in range(2))
        pads = [t, l, b, r]
    elif auto == "VALID":
        pads = [0, 0, 0, 0]
    else:
        pads = [int(p) for p in at.get("pads", [0, 0, 0, 0])]
    return pads, strides


def _pad_asymmetric(ctx, x, pads, value):
    """x padded by the part of the pads that differs at the two ends; the symmetric part returned."""
    sym = [min(pads[0], pads[2]), min(pads[1], pads[3])]
    extra = [pads[0] - sym[0], pads[1] - sym[1], pads[2] - sym[0], pads[3] - sym[1]]
    if any(extra):
        x = _tandem.pad(x, [0, 0, extra[0], extra[1], 0, 0, extra[2], extra[3]], "constant", value)
    return x, sym


@_op("Conv")
def _conv(ctx, at, xs):
    x = ctx.t(xs[0])
    w = ctx.t(xs[1], x)
    b = ctx.t(xs[2], x) if len(xs) > 2 and xs[2] is not None else None
    one_d = x.dim() == 3
    if one_d:  # [N, C, L] as [N, C, 1, L]
        x, w = _tandem.unsqueeze(x, [2]), _tandem.unsqueeze(w, [2])
        at = dict(at)
        for key in ("kernel_shape", "strides", "dilations"):
            if key in at:
                at[key] = [1] + list(at[key])
        if "pads" in at:
            at["pads"] = [0, at["pads"][0], 0, at["pads"][1]]
    kernel = list(w.shape[2:])
    pads, strides = _window(ctx, at, x, kernel)
    x, sym = _pad_asymmetric(ctx, x, pads, 0.0)
    y = _tandem.conv2d(x, w, b, strides, sym, False, int(at.get("group", 1)))
    return [_tandem.squeeze(y, [2]) if one_d else y]


@_op("MaxPool", "AveragePool")
def _pool(ctx, at, xs):
    # The pooling ops take ONNX's geometry whole: pads before and after, ceil_mode (whose last window starts
    # inside the input or its leading padding) and count_include_pad (the divisor counts the padded input's
    # positions, never a ceil-mode window's overhang past it).
    x = ctx.t(xs[0])
    kernel = [int(k) for k in at["kernel_shape"]]
    pads, strides = _window(ctx, at, x, kernel)
    ceil = bool(at.get("ceil_mode", 0))
    if ctx.op == "MaxPool":
        return [_tandem.max_pool2d(x, kernel, strides, pads[:2], pads[2:], ceil)]
    return [_tandem.avg_pool2d(x, kernel, strides, pads[:2], pads[2:], ceil, bool(at.get("count_include_pad", 0)))]


@_op("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(ctx, at, xs):
    x = ctx.t(xs[0])
    dims = list(range(2, x.dim()))
    if ctx.op == "GlobalAveragePool":
        return [_tandem.mean_dims(x, dims, True)]
    return [_tandem.amax(x, dims, True)]


@_op("BatchNormalization")
def _batch_norm(ctx, at, xs):
    x = ctx.t(xs[0])
    scale, bias, mean, var = (ctx.t(v, x) for v in xs[1:5])
    shape = list(x.shape)
    if x.dim() != 4:  # [N, C] or [N, C, L]: as [N, C, L, 1]
        x = _tandem.reshape(x, shape[:2] + [int(np.prod(shape[2:])) if len(shape) > 2 else 1, 1])
    y = _tandem.batch_norm2d(x, scale, bias, mean, var, ctx.training, 1.0 - float(at.get("momentum", 0.9)),
                             float(at.get("epsilon", 1e-5)))
    return [_tandem.reshape(y, shape) if len(shape) != 4 else y]


@_op("InstanceNormalization")
def _instance_norm(ctx, at, xs):
    x = ctx.t(xs[0])
    dims = list(range(2, x.dim()))
    mean = _tandem.mean_dims(x, dims, True)
    centred = x - mean
    var = _tandem.mean_dims(centred * centred, dims, True)
    per_channel = [1, x.shape[1]] + [1] * len(dims)
    scale = _tandem.reshape(ctx.t(xs[1], x), per_channel)
    bias = _tandem.reshape(ctx.t(xs[2], x), per_channel)
    return [centred / _tandem.sqrt(var + float(at.get("epsilon", 1e-5))) * scale + bias]


@_op("LayerNormalization")
def _layer_norm(ctx, at, xs):
    x = ctx.t(xs[0])
    axis = _axis(int(at.get("axis", -1)), x.dim())
    shape = list(x.shape[axis:])
    w = ctx.t(xs[1], x) if len(xs) > 1 and xs[1] is not None else None
    b = ctx.t(xs[2], x) if len(xs) > 2 and xs[2] is not None else None
    return [_tandem.layer_norm(x, shape, w, b, float(at.get("epsilon", 1e-5)))]


@_op("LRN")
def _lrn(ctx, at, xs):
    x = ctx.t(xs[0])
    size = int(at["size"])
    alpha, beta, bias = float(at.get("alpha", 1e-4)), float(at.get("beta", 0.75)), float(at.get("bias", 1.0))
    n, c, h, w = x.shape
    sq = _tandem.reshape(x * x, [n, 1, c, h * w])
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = _tandem.pad(sq, [0, 0, lo, 0, 0, 0, hi, 0], "constant", 0.0)
    window = _tandem.avg_pool2d(sq, [size, 1], [1, 1], [0, 0])  # the mean over the window: sum / size
    denom = _tandem.reshape(window, [n, c, h, w]) * alpha + bias
    return [x / _tandem.pow(denom, ctx.t(np.array([beta], np.float32), x))]


@_op("Dropout")
def _dropout(ctx, at, xs):
    x = ctx.t(xs[0])
    ratio = float(_np(xs[1], "Dropout ratio").reshape(-1)[0]) if len(xs) > 1 and xs[1] is not None \
        else float(at.get("ratio", 0.5))
    if not ctx.training or ratio == 0.0:
        return [x]
    return [autograd.dropout(x, ratio)]


def _reduce_axes(at, xs, x):
    axes = _axes_of(at, xs, 1, "axes")
    if not axes:
        if at.get("noop_with_empty_axes", 0):
            return None
        axes = list(range(_rank(x)))
    return sorted(_axis(a, _rank(x)) for a in axes)


def _reduce(np_fn, t_fn):
    def run(ctx, at, xs):
        x = xs[0]
        axes = _reduce_axes(at, xs, x)
        keep = bool(at.get("keepdims", 1))
        if axes is None:
            return [x]
        if not _is_t(x):
            return [np_fn(np.asarray(x), axis=tuple(axes), keepdims=keep)]
        return [t_fn(x, axes, keep)]
    return run


_OPS["ReduceMean"] = _reduce(np.mean, _tandem.mean_dims)
_OPS["ReduceSum"] = _reduce(np.sum, _tandem.sum_dims)
_OPS["ReduceMax"] = _reduce(np.max, _tandem.amax)
_OPS["ReduceMin"] = _reduce(np.min, _tandem.amin)


@_op("Softmax", "LogSoftmax")
def _softmax(ctx, at, xs):
    x = ctx.t(xs[0])
    fn = _tandem.softmax if ctx.op == "Softmax" else _tandem.log_softmax
    if ctx.opset >= 13:
        return [fn(x, _axis(int(at.get("axis", -1)), x.dim()))]
    axis = _axis(int(at.get("axis", 1)), x.dim())  # before opset 13: over the dimensions from axis on, flattened
    shape = list(x.shape)
    flat = _tandem.reshape(x, [int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))])
    return [_tandem.reshape(fn(flat, 1), shape)]


@_op("ArgMax")
def _argmax(ctx, at, xs):
    x = _np(xs[0], "ArgMax")
    axis = int(at.get("axis", 0))
    return [np.expand_dims(np.argmax(x, axis), axis) if at.get("keepdims", 1) else np.argmax(x, axis)]


SUPPORTED = tuple(sorted(_OPS))

# Weight positions: the inputs of these operators that an initializer may be a parameter at.
_WEIGHT_INPUTS = {"Conv": (1, 2), "Gemm": (0, 1, 2), "BatchNormalization": (1, 2), "InstanceNormalization": (1, 2),
                  "LayerNormalization": (1, 2), "PRelu": (1,)}
# ... and of these, when the initializer has more than one element (a single number there is a constant:
# a scale, an epsilon, the 2 of a square).
_ARRAY_INPUTS = {"MatMul": (0, 1), "Add": (0, 1), "Sub": (0, 1), "Mul": (0, 1), "Div": (0, 1)}
_BUFFER_INPUTS = {"BatchNormalization": (3, 4)}


def _attributes(node):
    onnx = _onnx()
    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        if a.type == onnx.AttributeProto.TENSOR:
            v = onnx.numpy_helper.to_array(v)
        elif isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [s.decode() for s in v]
        out[a.name] = v
    return out


class _Node:
    def __init__(self, node, index):
        self.name = node.name or f"{node.op_type}_{index}"
        self.op_type = node.op_type
        self.inputs = list(node.input)
        self.outputs = list(node.output)
        self.attrs = _attributes(node)


class SingaRep:
    """A prepared ONNX graph (SINGA's SingaRep): ``run(inputs)`` runs it. ``inputs`` is a list of NumPy
    arrays or tensors, in the order of the graph's inputs; the result is the list of the graph's outputs,
    as NumPy arrays (as SINGA's, outside a SONNXModel) or tensors. ``last_layers=k`` stops after the k-th
    node (0-based; negative k: SINGA's count, node (k + 1) mod the node count) and returns its outputs;
    ``aux_output`` names more values to return. ``states`` holds the initializers by name (NumPy)."""

    def __init__(self, graph, device, opset, params=None):
        onnx = _onnx()
        self.opset = opset
        self.states = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
        self.inputs = [i for i in graph.input if i.name not in self.states]
        doubles = any(i.type.tensor_type.elem_type == 11 for i in self.inputs) or any(
            v.dtype == np.float64 for v in self.states.values())
        self.float_type = np.float64 if doubles else np.float32
        self.outputs = list(graph.output)
        self.layers = [_Node(n, i) for i, n in enumerate(graph.node)]
        self.dev = _device(device)
        self.is_graph = False
        self._constants = {}  # see _Ctx.cache
        self._initializer_ids = {id(v): k for k, v in self.states.items()}
        self._params = params or {}  # initializer name -> tensor (SONNXModel's parameters and buffers)
        unknown = sorted({n.op_type for n in self.layers} - set(_OPS))
        if unknown:
            raise NotImplementedError(f"sonnx: the graph has operators tandem does not run: {', '.join(unknown)} "
                                      f"(supported: {', '.join(SUPPORTED)})")

    def run(self, x, aux_output=(), training=False, **kwargs):
        if not isinstance(x, (list, tuple)):
            x = [x]
        if len(x) != len(self.inputs):
            raise ValueError(f"sonnx: the graph takes {len(self.inputs)} input(s) "
                             f"({', '.join(i.name for i in self.inputs)}), got {len(x)}")
        dev = next((v.device for v in x if _is_t(v)), self.dev)
        ctx = _Ctx(dev, training, self.float_type, self._constants, self._initializer_ids)
        ctx.opset = self.opset
        n = len(self.layers)
        last = kwargs.get("last_layers", n - 1)
        last = last if last >= 0 else (last + 1) % n
        if not 0 <= last < n:
            raise ValueError(f"sonnx: last_layers {kwargs.get('last_layers')} is outside the graph's {n} nodes")
        wanted = self.layers[last].outputs if last != n - 1 else [o.name for o in self.outputs]
        wanted = list(wanted) + [a for a in aux_output if a not in wanted]
        values = {}
        for info, v in zip(self.inputs, x):
            if not _is_t(v):  # as SINGA's: an array is converted to the input's declared type
                want = _NP.get(info.type.tensor_type.elem_type)
                v = ctx.t(np.asarray(v, dtype=want) if want is not None else np.asarray(v), keep=False)
            values[info.name] = v
        left = {}
        for node in self.layers[:last + 1]:
            for name in node.inputs:
                left[name] = left.get(name, 0) + 1
        for node in self.layers[:last + 1]:
            xs = []
            for name in node.inputs:
                if name == "":
                    xs.append(None)
                elif name in values:
                    xs.append(values[name])
                elif name in self._params:
                    xs.append(self._params[name])
                elif name in self.states:
                    xs.append(self.states[name])
                else:
                    raise KeyError(f"sonnx: node {node.name} ({node.op_type}) reads '{name}', which no input, "
                                   "initializer or earlier node gives")
            ctx.op, ctx.outputs = node.op_type, len(node.outputs)
            try:
                outs = _OPS[node.op_type](ctx, node.attrs, xs)
            except Exception as e:
                e.add_note(f"in node {node.name} ({node.op_type}) of the ONNX graph")
                raise
            for name, v in zip(node.outputs, outs):
                if name:
                    values[name] = v
            for name in node.inputs:  # drop what no later node reads
                left[name] = left.get(name, 1) - 1
                if left[name] == 0 and name not in wanted:
                    values.pop(name, None)
        missing = [w for w in wanted if w not in values]
        if missing:
            raise KeyError(f"sonnx: no value named {', '.join(missing)} in the graph")
        out = [values[w] for w in wanted]
        if self.is_graph:
            return [ctx.t(v) for v in out]
        return [v.to_numpy() if _is_t(v) else np.asarray(v) for v in out]


def _device(device):
    from . import device as devices

    if device is None or (isinstance(device, str) and device.upper() == "CPU"):
        return devices.get_default_device()
    if isinstance(device, str) and device.upper() in ("CUDA", "GPU"):
        return devices.create_cuda_gpu()
    return device


def _opset_of(model):
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            if imp.version > _OPSET:
                warnings.warn(f"sonnx: the model's operator set {imp.version} is newer than {_OPSET}, the newest "
                              "whose semantics tandem follows")
            return int(imp.version)
    return _OPSET


def _load(model):
    onnx = _onnx()
    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        path = model
        try:
            model = onnx.load(path)
        except OSError:
            raise
        except Exception as e:  # protobuf's DecodeError and the like: not an ONNX file
            raise ValueError(f"sonnx: {path!s} is not a readable ONNX model ({type(e).__name__}: {e})") from e
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"sonnx: expected an onnx.ModelProto or a file name, got {type(model).__name__}")
    return model


def prepare(model, device="CPU", **kwargs):
    """SINGA's prepare: the ONNX model (a ModelProto or a file name) ready to run on ``device`` ("CPU",
    "CUDA" or a tandem Device); returns a SingaRep. Inputs given to ``run`` as tensors run on their device."""
    model = _load(model)
    return SingaRep(model.graph, device, _opset_of(model))


def run_node(node, inputs, device="CPU", opset_version=_OPSET):
    """SINGA's run_node (the ONNX backend API): one NodeProto run on ``inputs`` (NumPy arrays, one for each of
    the node's non-empty inputs); returns an OrderedDict of the node's outputs by name, as tensors."""
    from collections import OrderedDict

    if node.op_type not in _OPS:
        raise NotImplementedError(f"sonnx.run_node: tandem does not run {node.op_type} "
                                  f"(supported: {', '.join(SUPPORTED)})")
    named = [name for name in node.input if name != ""]
    if len(named) != len(inputs):
        raise ValueError(f"sonnx.run_node: {node.op_type} takes {len(named)} input(s), got {len(inputs)}")
    given = iter(inputs)
    ctx = _Ctx(_device(device), False)
    ctx.opset, ctx.op, ctx.outputs = int(opset_version), node.op_type, len(node.output)
    xs = [None if name == "" else ctx.t(np.asarray(next(given)), keep=False) for name in node.input]
    outs = _OPS[node.op_type](ctx, _attributes(node), xs)
    return OrderedDict((name, ctx.t(v, keep=False)) for name, v in zip(node.output, outs) if name)


def _role(graph):
    """Initializer name -> "param" or "buffer", by the inputs that read it."""
    sizes = {t.name: int(np.prod(t.dims)) for t in graph.initializer
             if np.dtype(_NP.get(t.data_type, np.int64)).kind == "f"}
    roles = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name not in sizes:
                continue
            if i in _BUFFER_INPUTS.get(node.op_type, ()):
                roles.setdefault(name, "buffer")
            elif i in _WEIGHT_INPUTS.get(node.op_type, ()) or (
                    i in _ARRAY_INPUTS.get(node.op_type, ()) and sizes[name] > 1):
                roles[name] = "param"
    return roles


def _identifier(name, taken):
    base = re.sub(r"\W", "_", name) or "w"
    if base[0].isdigit():
        base = "w_" + base
    out, i = base, 1
    while out in taken:
        out, i = f"{base}_{i}", i + 1
    taken.add(out)
    return out


class _Weights(layer.Layer):
    """The parameters and buffers an ONNX graph's initializers became, by (sanitised) initializer name."""

    def __init__(self, params, buffers):
        super().__init__()
        self.__dict__["_onnx_params"] = params
        self.__dict__["_onnx_buffers"] = buffers

    def _module(self):
        m = _tandem.ParamModule()
        for name, t in self._onnx_params.items():
            m.add_parameter(name, t)
        for name, t in self._onnx_buffers.items():
            m.add_buffer(name, t)
        return m

    def forward(self, *args):
        raise RuntimeError("the weights of an ONNX graph are read by SONNXModel's forward")


class SONNXModel(model.Model):
    """SINGA's SONNXModel: a Model whose ``forward(*inputs, aux_output=(), last_layers=...)`` runs the ONNX
    graph (see SingaRep.run; the result is a list of tensors). The initializers at weight inputs become the
    model's parameters (named ``weights.<initializer>``), BatchNormalization's statistics its buffers;
    they are created on the device of the tensors given to ``compile``. In training mode (``model.train()``)
    batch normalisation uses the batch's statistics and dropout drops. Subclass it to add layers and
    ``train_one_batch``, as SINGA's examples do."""

    def __init__(self, onnx_model):
        super().__init__()
        m = _load(onnx_model)
        self.__dict__["_onnx_graph"] = m.graph
        self.__dict__["_onnx_opset"] = _opset_of(m)
        self.sg_ir = SingaRep(m.graph, None, self._onnx_opset)
        self.sg_ir.is_graph = True
        self.__dict__["_onnx_ready"] = False

    def _make_weights(self, device):
        roles = _role(self._onnx_graph)
        taken, params, buffers, by_name = set(), {}, {}, {}
        for name, value in self.sg_ir.states.items():
            role = roles.get(name)
            if role is None:
                continue
            t = _tandem.from_array(np.ascontiguousarray(value), device)
            key = _identifier(name, taken)
            if role == "param":
                t.requires_grad = True
                params[key] = t
            else:
                buffers[key] = t
            t.name = f"weights.{key}"
            by_name[name] = t
        self.weights = _Weights(params, buffers)
        self.sg_ir._params = by_name
        self.__dict__["_onnx_ready"] = True

    def initialize(self, *inputs, **kwargs):
        if not self._onnx_ready:
            dev = next((v.device for v in inputs if _is_t(v)), None)
            self._make_weights(dev if dev is not None else _device("CPU"))

    def forward(self, *inputs, aux_output=(), **kwargs):
        if not self._onnx_ready:
            self.initialize(*inputs)
        return self.sg_ir.run(list(inputs), aux_output=aux_output, training=self.training, **kwargs)

    def train_one_batch(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define train_one_batch() to be trained")


def to_onnx(inputs, outputs, model_name="sonnx"):
    """SINGA's export: the ONNX ModelProto (opset 17) that computes ``outputs`` from ``inputs`` (lists of
    tensors). The outputs are tensors computed inside ``with sonnx.record():`` on this thread, or a model (a
    ``Model``, a ``Layer`` or a callable of the inputs), which is then run on the inputs while recording, in
    evaluation mode. Operations with no ONNX form raise NotImplementedError naming them (see sonnx_export)."""
    from . import sonnx_export

    return sonnx_export.to_onnx(inputs, outputs, model_name)


def record():
    """``with sonnx.record(): y = net(x)`` records the forward for ``to_onnx([x], [y])`` (see sonnx_export)."""
    from . import sonnx_export

    return sonnx_export.record()


singa_to_onnx_model = to_onnx  # SINGA's SingaFrontend.singa_to_onnx_model, the function behind to_onnx


def save(model, path):
    """SINGA's save: writes an ONNX ModelProto to ``path`` (onnx.save)."""
    _onnx().save(model, path)
