"""The translations of sonnx_export: each operation the recording notes (by the name it gives it: a function
of ``_tandem``, ``Tensor.<method>``, ``layer.<Layer>``) written as ONNX nodes of opset 17. An exporter takes the
export (names of values, nodes, constants), the operation's result(s) and its arguments as they were called."""
import numpy as np

from . import _tandem

Tensor = _tandem.Tensor
DType = _tandem.DType


class _Unsupported(Exception):
    """An operation, or an operation's form, that has no ONNX export."""


_ELEM = {DType.float32: 1, DType.uint8: 2, DType.int32: 6, DType.int64: 7, DType.float16: 10, DType.float64: 11,
         DType.bfloat16: 16}
_NP_OF = {DType.float32: np.float32, DType.float64: np.float64, DType.float16: np.float16, DType.int32: np.int32,
          DType.int64: np.int64, DType.uint8: np.uint8, DType.bfloat16: np.float32}
_BOOL = 9


# ---- the operations, by the name the recording gives them
_EXPORTERS = {}


def _exports(*names):
    def register(fn):
        for n in names:
            _EXPORTERS[n] = fn
        return fn
    return register


def _unary(onnx_op):
    def run(e, out, x):
        e.bind(out, e.node(onnx_op, [e.name(x)]))
    return run


for _name, _onnx_op in (("relu", "Relu"), ("sigmoid", "Sigmoid"), ("tanh", "Tanh"), ("exp", "Exp"), ("log", "Log"),
                        ("sqrt", "Sqrt"), ("reciprocal", "Reciprocal"), ("abs", "Abs"), ("neg", "Neg"),
                        ("sign", "Sign"), ("erf", "Erf"), ("sin", "Sin"), ("cos", "Cos"), ("ceil", "Ceil"),
                        ("floor", "Floor"), ("softplus", "Softplus"), ("softsign", "Softsign"),
                        ("Tensor.__neg__", "Neg")):
    _EXPORTERS[_name] = _unary(_onnx_op)


def _operand(e, v, like):
    """The ONNX name of a tensor operand, or of a number as a constant in the type of like."""
    return e.name(v) if isinstance(v, Tensor) else e.scalar(float(v), like)


def _binary(onnx_op):
    def run(e, out, a, b):
        x = _operand(e, a, out)
        y = _operand(e, b, out)
        if isinstance(a, Tensor) and a.dtype != out.dtype:
            x = e.cast(x, out.dtype)
        if isinstance(b, Tensor) and b.dtype != out.dtype:
            y = e.cast(y, out.dtype)
        e.bind(out, e.node(onnx_op, [x, y]))
    return run


for _name, _onnx_op in (("add", "Add"), ("sub", "Sub"), ("mul", "Mul"), ("div", "Div"), ("maximum", "Max"),
                        ("minimum", "Min"), ("Tensor.__add__", "Add"), ("Tensor.__radd__", "Add"),
                        ("Tensor.__sub__", "Sub"), ("Tensor.__mul__", "Mul"), ("Tensor.__rmul__", "Mul"),
                        ("Tensor.__matmul__", "MatMul"), ("matmul", "MatMul")):
    _EXPORTERS[_name] = _binary(_onnx_op)


@_exports("Tensor.__truediv__")
def _truediv(e, out, a, b):
    if isinstance(b, Tensor):
        return _binary("Div")(e, out, a, b)
    e.bind(out, e.node("Mul", [e.name(a), e.scalar(1.0 / float(b), out)]))  # as tandem: a * (1 / b)


@_exports("Tensor.__rsub__")
def _rsub(e, out, a, s):
    e.bind(out, e.node("Sub", [e.scalar(float(s), out), e.name(a)]))


@_exports("Tensor.__rtruediv__")
def _rtruediv(e, out, a, s):
    e.bind(out, e.node("Div", [e.scalar(float(s), out), e.name(a)]))


@_exports("scale")
def _scale(e, out, a, s):
    e.bind(out, e.node("Mul", [e.name(a), e.scalar(float(s), out)]))


@_exports("add_scalar")
def _add_scalar(e, out, a, s):
    e.bind(out, e.node("Add", [e.name(a), e.scalar(float(s), out)]))


@_exports("pow")
def _pow(e, out, a, b):
    e.bind(out, e.node("Pow", [_operand(e, a, out), _operand(e, b, out)]))


@_exports("silu")
def _silu(e, out, x):
    n = e.name(x)
    e.bind(out, e.node("Mul", [n, e.node("Sigmoid", [n])]))


@_exports("leaky_relu")
def _leaky(e, out, x, alpha=0.01):
    e.bind(out, e.node("LeakyRelu", [e.name(x)], alpha=float(alpha)))


@_exports("elu")
def _elu(e, out, x, alpha=1.0):
    e.bind(out, e.node("Elu", [e.name(x)], alpha=float(alpha)))


@_exports("selu")
def _selu(e, out, x, alpha=1.6732632423543772, scale=1.0507009873554805):
    e.bind(out, e.node("Selu", [e.name(x)], alpha=float(alpha), gamma=float(scale)))


@_exports("hard_sigmoid")
def _hard_sigmoid(e, out, x, alpha=0.2, beta=0.5):
    e.bind(out, e.node("HardSigmoid", [e.name(x)], alpha=float(alpha), beta=float(beta)))


@_exports("gelu")
def _gelu(e, out, x, tanh_approximation=False):
    # Opset 17 has no Gelu: x Phi(x) written with the operators it has.
    n = e.name(x)
    if tanh_approximation:
        cube = e.node("Mul", [e.node("Mul", [n, n]), n])
        inner = e.node("Mul", [e.node("Add", [n, e.node("Mul", [cube, e.scalar(0.044715, x)])]),
                               e.scalar(float(np.sqrt(2.0 / np.pi)), x)])
        phi = e.node("Add", [e.node("Tanh", [inner]), e.scalar(1.0, x)])
    else:
        phi = e.node("Add", [e.node("Erf", [e.node("Div", [n, e.scalar(float(np.sqrt(2.0)), x)])]), e.scalar(1.0, x)])
    e.bind(out, e.node("Mul", [e.node("Mul", [n, phi]), e.scalar(0.5, x)]))


@_exports("prelu")
def _prelu(e, out, x, slope):
    e.bind(out, e.node("PRelu", [e.name(x), e.name(slope)]))


@_exports("clip")
def _clip(e, out, x, min=None, max=None):  # noqa: A002 (the binding's names)
    lo = "" if min is None else e.scalar(float(min), x)
    hi = "" if max is None else e.scalar(float(max), x)
    e.bind(out, e.node("Clip", [e.name(x), lo, hi]))


_COMPARE = {"gt": "Greater", "ge": "GreaterOrEqual", "lt": "Less", "le": "LessOrEqual", "eq": "Equal"}


def _mask(e, out, onnx_op, a, b, negate=False):
    """A comparison as ONNX gives it (bool), then in tandem's type of the result (1 and 0)."""
    like = a if isinstance(a, Tensor) else b
    x, y = _operand(e, a, like), _operand(e, b, like)
    if isinstance(a, Tensor) and isinstance(b, Tensor) and a.dtype != b.dtype:
        y = e.cast(y, a.dtype)
    r = e.node(onnx_op, [x, y])
    if negate:
        r = e.node("Not", [r])
    e.bind(out, e.cast(r, out.dtype))


@_exports("compare")
def _compare(e, out, a, b, op):
    _mask(e, out, _COMPARE[op], a, b)


for _name, _onnx_op in (("less", "Less"), ("less_equal", "LessOrEqual"), ("greater", "Greater"),
                        ("greater_equal", "GreaterOrEqual"), ("equal", "Equal")):
    _EXPORTERS[_name] = (lambda o: lambda e, out, a, b: _mask(e, out, o, a, b))(_onnx_op)
_EXPORTERS["not_equal"] = lambda e, out, a, b: _mask(e, out, "Equal", a, b, negate=True)


def _as_bool(e, t):
    return e.cast(e.name(t), _BOOL)


@_exports("logical_not")
def _not(e, out, x):
    e.bind(out, e.cast(e.node("Not", [_as_bool(e, x)]), out.dtype))


for _name, _onnx_op in (("logical_and", "And"), ("logical_or", "Or"), ("logical_xor", "Xor")):
    _EXPORTERS[_name] = (lambda o: lambda e, out, a, b: e.bind(
        out, e.cast(e.node(o, [_as_bool(e, a), _as_bool(e, b)]), out.dtype)))(_onnx_op)


@_exports("where")
def _where(e, out, condition, a, b):
    e.bind(out, e.node("Where", [_as_bool(e, condition), _operand(e, a, out), _operand(e, b, out)]))


@_exports("cast")
def _cast_op(e, out, x, dtype):
    e.bind(out, e.cast(e.name(x), out.dtype))


@_exports("Tensor.as_type", "Tensor.to")
def _convert(e, out, x, *args, **kwargs):
    name = e.name(x)
    e.bind(out, name if out.dtype == x.dtype else e.cast(name, out.dtype))


@_exports("Tensor.detach", "Tensor.clone", "Tensor.contiguous", "Tensor.__init__")
def _same(e, out, x=None, *args, **kwargs):
    # Tensor(data=t) views t (in the shape given, where one is); Tensor(shape) without data is a constant.
    src = x if isinstance(x, Tensor) else kwargs.get("data")
    if not isinstance(src, Tensor):
        src = next((a for a in args if isinstance(a, Tensor)), None)
    if src is None:
        raise _Unsupported("a tensor made from the values of others")
    name = e.name(src)
    if tuple(out.shape) != tuple(src.shape):
        name = e.node("Reshape", [name, e.const(list(out.shape))])
    e.bind(out, name if out.dtype == src.dtype else e.cast(name, out.dtype))


@_exports("record_function")
def _record_function(e, out, outputs, inputs, backward, name):
    # An Operator with a Python forward: its outputs are the tensors its forward computed (recorded).
    for o, y in zip(out, outputs):
        e.bind(o, e.name(y))


@_exports("reshape", "Tensor.reshape", "Tensor.view")
def _reshape(e, out, x, shape):
    e.bind(out, e.node("Reshape", [e.name(x), e.const(list(out.shape))]))


@_exports("flatten")
def _flatten(e, out, x, start_dim=1):
    n = e.name(x)
    if out.dim() == 2 and 0 <= start_dim < max(x.dim(), 1) and list(out.shape)[0] == int(np.prod(x.shape[:start_dim])):
        e.bind(out, e.node("Flatten", [n], axis=int(start_dim)))
    else:
        e.bind(out, e.node("Reshape", [n, e.const(list(out.shape))]))


@_exports("expand")
def _expand(e, out, x, shape):
    e.bind(out, e.node("Expand", [e.name(x), e.const(list(out.shape))]))


@_exports("permute")
def _permute(e, out, x, perm):
    e.bind(out, e.node("Transpose", [e.name(x)], perm=[int(p) % max(x.dim(), 1) for p in perm]))


@_exports("transpose", "Tensor.transpose")
def _transpose(e, out, x, dim0, dim1):
    perm = list(range(x.dim()))
    a, b = int(dim0) % x.dim(), int(dim1) % x.dim()
    perm[a], perm[b] = perm[b], perm[a]
    e.bind(out, e.node("Transpose", [e.name(x)], perm=perm))


@_exports("concat", "cat")
def _concat(e, out, tensors, dim=0):
    names = []
    for t in tensors:
        n = e.name(t)
        names.append(n if t.dtype == out.dtype else e.cast(n, out.dtype))
    e.bind(out, e.node("Concat", names, axis=int(dim) % out.dim()))


def _slice(e, out, x, starts, ends, axes, steps=None):
    inputs = [e.name(x), e.const(starts), e.const(ends), e.const(axes)]
    if steps is not None:
        inputs.append(e.const(steps))
    e.bind(out, e.node("Slice", inputs))


@_exports("slice", "Tensor.narrow")
def _slice_length(e, out, x, dim, start, length):
    dim = int(dim) % x.dim()
    _slice(e, out, x, [int(start)], [int(start) + int(length)], [dim])


@_exports("strided_slice")
def _strided(e, out, x, dim, start, end, step=1):
    dim = int(dim) % x.dim()
    s, t, st = slice(start, end, step).indices(x.shape[dim])
    if st < 0 and t < 0:
        t = -(2 ** 63)  # past the beginning, ONNX's way
    _slice(e, out, x, [s], [t], [dim], [st])


@_exports("slice_ranges")
def _slice_ranges(e, out, x, starts, ends, axes=(), steps=()):
    axes = list(axes) if len(axes) else list(range(len(starts)))
    _slice(e, out, x, list(starts), list(ends), axes, list(steps) if len(steps) else None)


@_exports("split", "chunk")
def _split(e, out, x, lengths, dim=0):
    dim = int(dim) % x.dim()
    sizes = [int(o.shape[dim]) for o in out]
    names = e.node("Split", [e.name(x), e.const(sizes)], outputs=len(out), axis=dim)
    for o, n in zip(out, names if len(out) > 1 else [names]):
        e.bind(o, n)


@_exports("squeeze")
def _squeeze(e, out, x, dims=()):
    dims = [int(d) % x.dim() for d in dims] if len(dims) else [i for i, d in enumerate(x.shape) if d == 1]
    e.bind(out, e.node("Squeeze", [e.name(x), e.const(sorted(dims))]))


@_exports("unsqueeze")
def _unsqueeze(e, out, x, dims):
    e.bind(out, e.node("Unsqueeze", [e.name(x), e.const(sorted(int(d) % out.dim() for d in dims))]))


@_exports("tile")
def _tile(e, out, x, repeats):
    reps = [int(r) for r in repeats]
    n = e.name(x)
    if len(reps) > x.dim():
        n = e.node("Reshape", [n, e.const([1] * (len(reps) - x.dim()) + list(x.shape))])
    reps = [1] * (out.dim() - len(reps)) + reps
    e.bind(out, e.node("Tile", [n, e.const(reps)]))


@_exports("upsample_nearest")
def _upsample(e, out, x, scales):
    scales = [float(s) for s in scales]
    e.bind(out, e.node("Resize", [e.name(x), "", e.const(scales, np.float32)], mode="nearest",
                       coordinate_transformation_mode="asymmetric", nearest_mode="floor"))


@_exports("pad")
def _pad(e, out, x, pads, mode="constant", value=0.0):
    e.bind(out, e.node("Pad", [e.name(x), e.const([int(p) for p in pads]), e.scalar(float(value), x)], mode=mode))


@_exports("depth_to_space")
def _depth_to_space(e, out, x, blocksize, mode="DCR"):
    e.bind(out, e.node("DepthToSpace", [e.name(x)], blocksize=int(blocksize), mode=mode.upper()))


@_exports("index_select")
def _index_select(e, out, x, dim, index):
    e.bind(out, e.node("Gather", [e.name(x), e.name(index)], axis=int(dim) % x.dim()))


@_exports("embedding")
def _embedding(e, out, weight, indices):
    e.bind(out, e.node("Gather", [e.name(weight), e.name(indices)], axis=0))


def _reduce(onnx_op, axes_input):
    def run(e, out, x, dims=None, keepdim=False):
        n = e.name(x)
        if dims is None:
            e.bind(out, e.node(onnx_op, [n], keepdims=0))
            return
        axes = sorted(int(d) % x.dim() for d in dims)
        if axes_input:
            e.bind(out, e.node(onnx_op, [n, e.const(axes)], keepdims=int(bool(keepdim))))
        else:
            e.bind(out, e.node(onnx_op, [n], axes=axes, keepdims=int(bool(keepdim))))
    return run


_EXPORTERS["sum"] = _reduce("ReduceSum", True)
_EXPORTERS["sum_dims"] = _reduce("ReduceSum", True)
_EXPORTERS["mean"] = _reduce("ReduceMean", False)
_EXPORTERS["mean_dims"] = _reduce("ReduceMean", False)
_EXPORTERS["amax"] = _reduce("ReduceMax", False)
_EXPORTERS["amin"] = _reduce("ReduceMin", False)


@_exports("argmax_dim")
def _argmax_dim(e, out, x, dim, keepdim=False):
    e.bind(out, e.node("ArgMax", [e.name(x)], axis=int(dim) % x.dim(), keepdims=int(bool(keepdim))))


@_exports("argmax")
def _argmax(e, out, x):
    e.bind(out, e.node("ArgMax", [e.name(x)], axis=x.dim() - 1, keepdims=0))


@_exports("softmax")
def _softmax(e, out, x, dim=-1):
    e.bind(out, e.node("Softmax", [e.name(x)], axis=int(dim) % x.dim()))


@_exports("log_softmax")
def _log_softmax(e, out, x, dim=-1):
    e.bind(out, e.node("LogSoftmax", [e.name(x)], axis=int(dim) % x.dim()))


@_exports("dropout")
def _dropout(e, out, x, p, training, generator=None):
    if training and p > 0:
        raise _Unsupported("dropout in training mode (call model.eval() before recording)")
    e.bind(out, e.name(x))


@_exports("bias_add")
def _bias_add(e, out, x, b):
    shaped = e.node("Reshape", [e.name(b), e.const([b.shape[0]] + [1] * (x.dim() - 2))])
    e.bind(out, e.node("Add", [e.name(x), shaped]))


def _linear(e, out, x, w, b, relu, trusted=False):
    xn, wn = e.name(x), e.name(w, trusted)
    bn = e.name(b, trusted) if b is not None else None
    if x.dim() == 2:
        y = e.node("Gemm", [xn, wn] + ([bn] if bn else []), transB=1)
    else:
        y = e.node("MatMul", [xn, e.node("Transpose", [wn], perm=[1, 0])])
        if bn:
            y = e.node("Add", [y, bn])
    e.bind(out, e.node("Relu", [y]) if relu else y)


@_exports("linear")
def _linear_op(e, out, x, weight, bias=None, relu=False):
    _linear(e, out, x, weight, bias, relu)


@_exports("gemm")
def _gemm(e, out, a, b, c=None, alpha=1.0, beta=1.0, trans_a=False, trans_b=False):
    inputs = [e.name(a), e.name(b)] + ([e.name(c)] if c is not None else [])
    e.bind(out, e.node("Gemm", inputs, alpha=float(alpha), beta=float(beta), transA=int(bool(trans_a)),
                       transB=int(bool(trans_b))))


def _conv(e, out, x, w, b, stride, padding, relu, groups, trusted=False):
    inputs = [e.name(x), e.name(w, trusted)] + ([e.name(b, trusted)] if b is not None else [])
    kernel = [int(k) for k in w.shape[2:]]
    pads = [int(p) for p in padding]
    y = e.node("Conv", inputs, kernel_shape=kernel, strides=[int(s) for s in stride], pads=pads + pads,
               group=int(groups))
    e.bind(out, e.node("Relu", [y]) if relu else y)


@_exports("conv2d")
def _conv_op(e, out, x, weight, bias=None, stride=(1, 1), padding=(0, 0), relu=False, groups=1):
    _conv(e, out, x, weight, bias, stride, padding, relu, groups)


def _pool_attrs(kernel, stride, padding, padding_end, ceil_mode):
    pads = [int(p) for p in padding]
    end = pads if padding_end is None else [int(q) if int(q) >= 0 else p for q, p in zip(padding_end, pads)]
    return dict(kernel_shape=[int(k) for k in kernel], strides=[int(s) for s in stride], pads=pads + end,
                ceil_mode=int(bool(ceil_mode)))


@_exports("max_pool2d")
def _max_pool(e, out, x, kernel, stride, padding=(0, 0), padding_end=None, ceil_mode=False):
    e.bind(out, e.node("MaxPool", [e.name(x)], **_pool_attrs(kernel, stride, padding, padding_end, ceil_mode)))


@_exports("avg_pool2d")
def _avg_pool(e, out, x, kernel, stride, padding=(0, 0), padding_end=None, ceil_mode=False, count_include_pad=True):
    e.bind(out, e.node("AveragePool", [e.name(x)], count_include_pad=int(bool(count_include_pad)),
                       **_pool_attrs(kernel, stride, padding, padding_end, ceil_mode)))


def _batch_norm(e, out, x, gamma, beta, mean, var, eps, keep, training, trusted=False, what="batch_norm2d"):
    if training:
        raise _Unsupported(f"{what} in training mode (call model.eval() before recording)")
    inputs = [e.name(x)] + [e.name(t, trusted) for t in (gamma, beta, mean, var)]
    e.bind(out, e.node("BatchNormalization", inputs, epsilon=float(eps), momentum=float(keep)))


@_exports("batch_norm2d")
def _batch_norm_op(e, out, x, gamma, beta, running_mean, running_var, training, momentum=0.1, eps=1e-5):
    _batch_norm(e, out, x, gamma, beta, running_mean, running_var, eps, 1.0 - momentum, training)


def _layer_norm(e, out, x, shape, weight, bias, eps, trusted=False):
    axis = x.dim() - len(shape)
    w = e.name(weight, trusted) if weight is not None else e.const(np.ones(list(shape)), _NP_OF[x.dtype])
    inputs = [e.name(x), w] + ([e.name(bias, trusted)] if bias is not None else [])
    e.bind(out, e.node("LayerNormalization", inputs, axis=axis, epsilon=float(eps)))


@_exports("layer_norm")
def _layer_norm_op(e, out, x, normalized_shape, weight=None, bias=None, eps=1e-5):
    _layer_norm(e, out, x, list(normalized_shape), weight, bias, eps)


def _rms_norm(e, out, x, shape, weight, eps, trusted=False):
    # x / sqrt(mean(x^2) + eps) * weight, with the operators of opset 17.
    n = e.name(x)
    axes = list(range(x.dim() - len(shape), x.dim()))
    ms = e.node("ReduceMean", [e.node("Mul", [n, n])], axes=axes, keepdims=1)
    y = e.node("Div", [n, e.node("Sqrt", [e.node("Add", [ms, e.scalar(float(eps), x)])])])
    if weight is not None:
        y = e.node("Mul", [y, e.name(weight, trusted)])
    e.bind(out, y)


@_exports("rms_norm")
def _rms_norm_op(e, out, x, normalized_shape, weight=None, eps=1e-6):
    _rms_norm(e, out, x, list(normalized_shape), weight, eps)


# The built-in layers whose forward runs a C++ module. A layer's own parameters and buffers are trusted
# inputs: they may have been made while recording (a layer's first call creates them).
def _layer_input(call):
    return call.args[0] if call.args else call.kwargs.get("x")


@_exports("layer.Conv2d")
def _conv_layer(e, out, *args, **kwargs):
    lay, _ = e.call.obj
    m = lay._cpp
    _conv(e, out, _layer_input(e.call), m.weight, m.bias, lay.stride, lay.padding, lay.activation == "RELU",
          lay.group, trusted=True)


@_exports("layer.Linear")
def _linear_layer(e, out, *args, **kwargs):
    lay, _ = e.call.obj
    m = lay._cpp
    _linear(e, out, _layer_input(e.call), m.weight, m.bias, lay.activation == "RELU", trusted=True)


@_exports("layer.BatchNorm2d")
def _batch_norm_layer(e, out, *args, **kwargs):
    lay, training = e.call.obj
    m = lay._cpp
    _batch_norm(e, out, _layer_input(e.call), m.gamma, m.beta, m.running_mean, m.running_var, lay.eps, lay.momentum,
                training, trusted=True, what="BatchNorm2d")


@_exports("layer.Dropout")
def _dropout_layer(e, out, *args, **kwargs):
    lay, training = e.call.obj
    if training and lay.ratio > 0:
        raise _Unsupported("Dropout in training mode (call model.eval() before recording)")
    e.bind(out, e.name(_layer_input(e.call)))


@_exports("layer.LayerNorm")
def _layer_norm_layer(e, out, *args, **kwargs):
    lay, _ = e.call.obj
    m = lay._cpp
    _layer_norm(e, out, _layer_input(e.call), list(m.normalized_shape), m.weight, m.bias, m.eps, trusted=True)


@_exports("layer.RMSNorm")
def _rms_norm_layer(e, out, *args, **kwargs):
    lay, _ = e.call.obj
    m = lay._cpp
    _rms_norm(e, out, _layer_input(e.call), list(m.normalized_shape), m.weight, m.eps, trusted=True)


#: The ONNX operators an export writes (every one of them is read back by sonnx.prepare).
WRITTEN = ("Abs", "Add", "And", "ArgMax", "AveragePool", "BatchNormalization", "Cast", "Ceil", "Clip", "Concat",
           "Conv", "Cos", "DepthToSpace", "Div", "Elu", "Equal", "Erf", "Exp", "Expand", "Flatten", "Floor",
           "Gather", "Gemm", "Greater", "GreaterOrEqual", "HardSigmoid", "Identity", "LayerNormalization",
           "LeakyRelu", "Less", "LessOrEqual", "Log", "LogSoftmax", "MatMul", "Max", "MaxPool", "Min", "Mul", "Neg",
           "Not", "Or", "PRelu", "Pad", "Pow", "Reciprocal", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceSum",
           "Relu", "Reshape", "Resize", "Selu", "Sigmoid", "Sign", "Sin", "Slice", "Softmax", "Softplus", "Softsign",
           "Split", "Sqrt", "Squeeze", "Sub", "Tanh", "Tile", "Transpose", "Unsqueeze", "Where", "Xor")
