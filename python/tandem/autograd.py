"""Autograd (SINGA's ``singa.autograd``): operations record a graph as they run, and ``backward``
walks it from a loss, yielding each parameter with its gradient.

SINGA's functions and operator classes are here by SINGA's names, arguments and defaults, built on
tandem's C++ operations (so they run on the CPU and on GPUs alike). ``with precision("bf16"):`` runs
GPU convolutions and products at that precision.
"""
import builtins as _builtins

import numpy as np

from . import _tandem
from .tensor import _promote, _whole_numbers

Tensor = _tandem.Tensor

#: SINGA's training flag: True while training (``Model.train()`` and ``compile(is_train=True)`` set it,
#: ``Model.eval()`` clears it). :func:`dropout` drops only while it is True. Graph recording does not
#: depend on it: operations record whenever gradients are enabled (``no_grad`` turns that off).
training = False

no_grad = _tandem.no_grad
grad_enabled = _tandem.grad_enabled
graph_leaves = _tandem.graph_leaves
precision = _tandem.precision
Precision = _tandem.Precision
current_precision = _tandem.current_precision
default_precision = _tandem.default_precision
set_deterministic_algorithms = _tandem.set_deterministic_algorithms
deterministic_algorithms = _tandem.deterministic_algorithms


# ---- backward
def backward(y, dy=None):
    """Back-propagates from y (usually the loss) and yields ``(parameter, gradient)`` for every tensor
    that stores a gradient (``stores_grad``: the parameters), each once, in the order their gradients
    become final. As SINGA's, this is a generator: nothing runs until it is iterated.

    dy is the gradient of the objective with respect to y: None for 1.0, a number, or a tensor of y's
    shape. Each call gives this pass's gradients (a parameter's earlier gradient is dropped first, not
    added to); the gradient yielded is also the parameter's ``grad``. As in SINGA, the graph stays as long
    as y (or a tensor computed from it) lives, so backward may run over it again: another
    ``autograd.backward(y)``, or an optimizer's step on y.
    """
    if not isinstance(y, Tensor):
        raise TypeError(f"backward: y must be a tandem Tensor, got {type(y).__name__}")
    if dy is not None and not isinstance(dy, Tensor):
        dy = _tandem.full(list(y.shape), float(dy), y.device, y.dtype)
    for p in _tandem.backward_fresh(y, dy, True):
        yield p, p.grad


def gradients(y, dy=None):
    """The gradients of every parameter y depends on, by parameter name (SINGA keys them by ``id``;
    tandem's Python handles of one tensor are not one object, its name is the same)."""
    return {p.name: g for p, g in backward(y, dy)}


# ---- operators
class Operator:
    """SINGA's operator classes: an instance is called on tensors and returns a tuple of outputs
    (``ReLU()(x)[0]``). tandem's own operators run C++ operations, which record their own gradients.

    A subclass may define SINGA's pair instead, in Python: ``forward(*xs)`` gets the input tensors and
    returns a tensor or a tuple of them, computed without recording a graph (``singa_wrap``'s functions,
    tensor methods, NumPy through ``copy_from_numpy``); ``backward(*dys)`` gets the gradient of each
    output and returns the gradient of each input: a tensor, or a tuple with a tensor or None per input,
    of the input's shape (gradients on another device or in another dtype are moved and converted).
    The operator's outputs then carry a graph node that calls ``backward`` when the loss is
    back-propagated; the instance may keep what ``forward`` saw for it (``self.x = x``). With several
    outputs, ``backward`` is called once for each output that receives a gradient, zeros in place of the
    others' (the sum of those calls is the gradient, as backward is linear in the dys)."""

    op_count = 0

    def __init__(self, name=None):
        if name is None:
            name = f"{type(self).__name__}#{Operator.op_count}"
            Operator.op_count += 1
        self.name = name

    def __call__(self, *xs):
        for x in xs:
            if not isinstance(x, Tensor):
                raise TypeError(f"{type(self).__name__}: inputs must be tandem Tensors, got {type(x).__name__}")
        if type(self).forward is not Operator.forward:
            return self._python_forward(xs)
        y = self._apply(*xs)
        return y if isinstance(y, tuple) else (y,)

    def _apply(self, *xs):
        raise NotImplementedError(f"{type(self).__name__} must define forward(*xs) and backward(*dys)")

    def forward(self, *xs):
        """SINGA's forward of a Python operator (see the class): the outputs from the inputs."""
        raise NotImplementedError(f"{type(self).__name__} must define forward(*xs)")

    def backward(self, *dys):
        """SINGA's backward of a Python operator (see the class): the inputs' gradients from the outputs'."""
        raise NotImplementedError(f"{type(self).__name__} must define backward(*dys) to be back-propagated")

    def _python_forward(self, xs):
        name = type(self).__name__
        with _tandem.no_grad():
            ys = self.forward(*xs)
        ys = tuple(ys) if isinstance(ys, (tuple, list)) else (ys,)
        for i, y in enumerate(ys):
            if not isinstance(y, Tensor):
                raise TypeError(f"{name}.forward must return tensors, got {type(y).__name__} as output {i}")
        return tuple(_tandem.record_function(list(ys), list(xs), self.backward, name))


class _Unary(Operator):
    """An operator of one tensor computed by the C++ op ``_fn``."""

    def _apply(self, x):
        return type(self)._fn(x)


class ReLU(_Unary):
    """max(x, 0) elementwise."""

    _fn = _tandem.relu


class Sigmoid(_Unary):
    """1 / (1 + exp(-x)) elementwise."""

    _fn = _tandem.sigmoid


class Tanh(_Unary):
    """tanh(x) elementwise."""

    _fn = _tandem.tanh


class Exp(_Unary):
    """exp(x) elementwise."""

    _fn = _tandem.exp


class Log(_Unary):
    """The natural logarithm elementwise."""

    _fn = _tandem.log


class Identity(Operator):
    """A copy of x."""

    def _apply(self, x):
        return _tandem.scale(x, 1.0)


class Negative(Operator):
    """-x elementwise."""

    def _apply(self, x):
        return _tandem.scale(x, -1.0)


class Matmul(Operator):
    """NumPy's matmul of x and w: matrices [..., M, K] x [..., K, N] with the leading dimensions
    broadcast (batched products); a 1-d operand is a row (left) or a column (right)."""

    def _apply(self, x, w):
        return _tandem.matmul(x, w)


class Add(Operator):
    """a + b elementwise, broadcast as NumPy's; operands of different dtypes are computed in their common
    one (as SINGA's: an integer tensor with a float one gives a float result)."""

    def _apply(self, a, b):
        return _tandem.add(*_promote(a, b))


class Sub(Operator):
    """a - b elementwise, broadcast as NumPy's."""

    def _apply(self, a, b):
        return _tandem.sub(*_promote(a, b))


class Mul(Operator):
    """a * b elementwise, broadcast as NumPy's."""

    def _apply(self, a, b):
        return _tandem.mul(*_promote(a, b))


class Div(Operator):
    """a / b elementwise, broadcast as NumPy's."""

    def _apply(self, a, b):
        return _tandem.div(*_promote(a, b))


class _Comparison(Operator):
    _op = "eq"

    def _apply(self, x, y):
        return _tandem.compare(x, y, self._op)


class Greater(_Comparison):
    """1 where x > y, else 0 (no gradient)."""

    _op = "gt"


class Less(_Comparison):
    """1 where x < y, else 0 (no gradient)."""

    _op = "lt"


class Equal(_Comparison):
    """1 where x == y, else 0 (no gradient)."""

    _op = "eq"


class AddBias(Operator):
    """Adds the bias b to each row (axis 0: b has one value per column) or to each column (axis 1: one
    value per row) of the 2-d x."""

    def __init__(self, axis=0):
        super().__init__()
        self.axis = axis

    def _apply(self, x, b):
        if x.dim() != 2 or b.dim() != 1:
            raise ValueError(f"add_bias: x must be 2-d and b 1-d, got {x.shape} and {b.shape}")
        if self.axis == 0:
            return _tandem.bias_add(x, b)
        if self.axis == 1:
            n, c = x.shape
            return _tandem.reshape(_tandem.bias_add(_tandem.reshape(x, [1, n, c]), b), [n, c])
        raise ValueError(f"add_bias: axis must be 0 or 1, got {self.axis}")


class Reshape(Operator):
    """x in another shape: one extent may be -1 (inferred), an extent 0 keeps x's extent there."""

    def __init__(self, shape):
        super().__init__()
        self.shape = shape

    def _apply(self, x):
        shape = [x.shape[i] if s == 0 and i < x.dim() else int(s) for i, s in enumerate(self.shape)]
        return _tandem.reshape(x, shape)


class Flatten(Operator):
    """x as a 2-d tensor: dimensions before axis make the rows, the rest the columns (axis 0: one row)."""

    def __init__(self, axis=1):
        super().__init__()
        self.axis = axis

    def _apply(self, x):
        axis = self.axis + x.dim() if self.axis < 0 else self.axis
        if not 0 <= axis <= x.dim():
            raise ValueError(f"flatten: axis {self.axis} is outside [-{x.dim()}, {x.dim()}] for shape {x.shape}")
        rows = int(np.prod(x.shape[:axis], dtype=np.int64))
        return _tandem.reshape(x, [rows, int(np.prod(x.shape[axis:], dtype=np.int64))])


class Transpose(Operator):
    """x with its dimensions reordered: dimension i of the result is dimension perm[i] of x."""

    def __init__(self, perm):
        super().__init__()
        self.perm = list(perm)

    def _apply(self, x):
        return _tandem.permute(x, self.perm)


class Squeeze(Operator):
    """x without the dimensions of extent 1 listed in axis (all of them when axis is empty)."""

    def __init__(self, axis=[]):  # noqa: B006 (SINGA's default)
        super().__init__()
        self.axis = [axis] if isinstance(axis, int) else list(axis)

    def _apply(self, x):
        n = x.dim()
        axes = {a % n for a in self.axis} if n else set()
        for a in axes:
            if x.shape[a] != 1:
                raise ValueError(f"squeeze: dimension {a} of {x.shape} has extent {x.shape[a]}, not 1")
        shape = [s for i, s in enumerate(x.shape) if (s != 1 if not self.axis else i not in axes)]
        return _tandem.reshape(x, shape)


class Unsqueeze(Operator):
    """x with dimensions of extent 1 inserted at the positions in axis (positions in the result)."""

    def __init__(self, axis):
        super().__init__()
        self.axis = [axis] if isinstance(axis, int) else list(axis)

    def _apply(self, x):
        n = x.dim() + len(self.axis)
        positions = sorted(a + n if a < 0 else a for a in self.axis)
        shape = list(x.shape)
        for p in positions:
            if not 0 <= p <= len(shape):
                raise ValueError(f"unsqueeze: position {p} is outside a result of {n} dimensions")
            shape.insert(p, 1)
        return _tandem.reshape(x, shape)


class Concat(Operator):
    """The inputs joined along axis (they agree in every other extent)."""

    def __init__(self, axis=0):
        super().__init__()
        self.axis = axis

    def _apply(self, *xs):
        return _tandem.concat(list(xs), self.axis)


class SoftMax(Operator):
    """Softmax over the dimensions from axis on, taken together (SINGA's and ONNX's first definition;
    for a 2-d x and axis 1: each row)."""

    def __init__(self, axis=1):
        super().__init__()
        self.axis = axis

    def _apply(self, x):
        n = x.dim()
        axis = self.axis + n if self.axis < 0 else self.axis
        if not 0 <= axis < max(n, 1):
            raise ValueError(f"softmax: axis {self.axis} is out of range for shape {x.shape}")
        if axis == n - 1:
            return _tandem.softmax(x, -1)
        rows = int(np.prod(x.shape[:axis], dtype=np.int64))
        flat = _tandem.reshape(x, [rows, x.size() // rows if rows else 0])
        return _tandem.reshape(_tandem.softmax(flat, -1), list(x.shape))


class Sum(Operator):
    """The elementwise sum of the inputs."""

    def _apply(self, *xs):
        if not xs:
            raise ValueError("sum: no tensors to add")
        y = xs[0]
        for x in xs[1:]:
            y = _tandem.add(y, x)
        return _tandem.scale(y, 1.0) if len(xs) == 1 else y


class Mean(Operator):
    """The elementwise mean of the inputs."""

    def _apply(self, *xs):
        return _tandem.scale(Sum()._apply(*xs), 1.0 / len(xs))


class SoftMaxCrossEntropy(Operator):
    """The mean over the batch of -log softmax(x)[t]: t holds class indices [N] (int) or targets [N, C]
    (one-hot rows or a distribution per row). The losses here are tensors of shape (1,), as SINGA's."""

    def __init__(self, t):
        super().__init__()
        self.t = t

    def _apply(self, x):
        if x.dim() != 2 or self.t.dim() > 2:
            raise ValueError(
                f"softmax_cross_entropy: x must be 2-d and t at most 2-d, got {x.shape} and {self.t.shape}")
        return _tandem.reshape(_tandem.softmax_cross_entropy(x, _class_labels(x, self.t)), [1])


def _class_labels(x, t):
    """SINGA's reading of the labels of softmax cross-entropy over x [N, C]: labels of N elements ([N], or
    [N, 1] when C > 1) are class indices, in an integer tensor or as whole numbers in a floating one (a
    fraction is a ValueError); other labels are targets [N, C]."""
    if x.dim() != 2 or t.dim() not in (1, 2) or t.shape[0] != x.shape[0]:
        return t
    if t.dim() == 2 and not (t.shape[1] == 1 and x.shape[1] != 1):
        return t
    if t.dim() == 2:
        t = _tandem.reshape(t.detach(), [t.shape[0]])
    return _whole_numbers(t, "softmax_cross_entropy")


class CrossEntropy(Operator):
    """-sum(t * log(x)) / N for probabilities x [N, C]: t holds targets [N, C] or class indices [N]."""

    def __init__(self, t):
        super().__init__()
        self.t = t

    def _apply(self, x):
        if x.dim() != 2 or self.t.dim() > 2:
            raise ValueError(f"cross_entropy: x must be 2-d and t at most 2-d, got {x.shape} and {self.t.shape}")
        t = _targets(self.t, x)
        return _tandem.reshape(_tandem.scale(_tandem.sum(_tandem.mul(t, _tandem.log(x))), -1.0 / x.shape[0]), [1])


class MeanSquareError(Operator):
    """The mean over every element of (x - t)^2."""

    def __init__(self, t):
        super().__init__()
        self.t = t

    def _apply(self, x):
        if tuple(x.shape) != tuple(self.t.shape):
            raise ValueError(f"mse_loss: input and target shapes differ: {x.shape} and {self.t.shape}")
        t = self.t if self.t.dtype == x.dtype else self.t.as_type(x.dtype)
        return _tandem.reshape(_tandem.mse_loss(x, t.detach(), "mean"), [1])


_dropout_generators = {}


class Dropout(Operator):
    """While ``autograd.training`` is True, zeroes each element with probability ratio and scales the
    rest by 1 / (1 - ratio); x itself otherwise. Masks come from a random stream per seed, which goes
    on from call to call (the same seed gives the same sequence of masks)."""

    def __init__(self, seed=0, ratio=0.5):
        super().__init__()
        self.seed = int(seed)
        self.ratio = ratio

    def _apply(self, x):
        gen = _dropout_generators.get(self.seed)
        if gen is None:
            gen = _dropout_generators[self.seed] = _tandem.Generator(self.seed)
        return _tandem.dropout(x, float(self.ratio), bool(training), gen)


class Where(Operator):
    """x where the condition is true (nonzero), y elsewhere; the condition is a tensor, an array or a
    list, broadcast with x and y."""

    def __init__(self, condition):
        super().__init__()
        self.condition = condition

    def _apply(self, x, y):
        return _tandem.where(_mask(self.condition, x), x, y)


class BinaryCrossEntropy(Operator):
    """-(sum(t log(x + 1e-4)) + sum((1 - t) log(1.0001 - x))) / N for probabilities x [N, ...] and
    targets t of x's shape (SINGA's, with its guard against log 0)."""

    def __init__(self, t):
        super().__init__()
        self.t = t

    def _apply(self, x):
        t = self.t.detach() if self.t.dtype == x.dtype else self.t.as_type(x.dtype).detach()
        if tuple(t.shape) != tuple(x.shape):
            raise ValueError(f"binary_cross_entropy: input and target shapes differ: {x.shape} and {self.t.shape}")
        pos = _tandem.mul(t, _tandem.log(_tandem.add_scalar(x, 1e-4)))
        neg = _tandem.mul(_tandem.add_scalar(_tandem.scale(t, -1.0), 1.0),
                          _tandem.log(_tandem.add_scalar(_tandem.scale(x, -1.0), 1.0001)))
        total = _tandem.add(_tandem.sum(pos), _tandem.sum(neg))
        return _tandem.reshape(_tandem.scale(total, -1.0 / x.shape[0]), [1])


class _Reduce(Operator):
    def __init__(self, axes=None, keepdims=1):
        super().__init__()
        self.axes = axes
        self.keepdims = keepdims

    def _dims(self, x):
        return list(range(x.dim())) if self.axes is None else [a + x.dim() if a < 0 else a for a in self.axes]


class ReduceSum(_Reduce):
    """The sum over the axes (None: all); keepdims 1 keeps them as extents of 1."""

    def _apply(self, x):
        return _tandem.sum_dims(x, self._dims(x), bool(self.keepdims))


class ReduceMean(_Reduce):
    """The mean over the axes (None: all); keepdims 1 keeps them as extents of 1."""

    def _apply(self, x):
        dims = self._dims(x)
        count = int(np.prod([x.shape[d] for d in dims], dtype=np.int64))
        return _tandem.scale(_tandem.sum_dims(x, dims, bool(self.keepdims)), 1.0 / max(count, 1))


class Expand(Operator):
    """x broadcast to shape (NumPy's rules; the result has the larger of each extent)."""

    def __init__(self, shape):
        super().__init__()
        self.shape = list(shape)

    def _apply(self, x):
        n = max(len(self.shape), x.dim())
        mine = [1] * (n - len(self.shape)) + self.shape
        theirs = [1] * (n - x.dim()) + list(x.shape)
        return _tandem.expand(x, [max(a, b) for a, b in zip(mine, theirs)])


class Slice(Operator):
    """Elements starts[i] to ends[i] (exclusive, clipped to the extent; negative: from the end) along
    axes[i] (default: the first len(starts) dimensions), every steps[i]-th (default 1; negative:
    backwards). A view of x for positive steps."""

    def __init__(self, starts, ends, axes=None, steps=None):
        super().__init__()
        self.starts, self.ends, self.axes, self.steps = starts, ends, axes, steps

    def _apply(self, x):
        starts = [int(v) for v in self.starts]
        axes = list(range(len(starts))) if self.axes is None else [int(a) for a in self.axes]
        steps = [1] * len(starts) if self.steps is None else [int(v) for v in self.steps]
        return _tandem.slice_ranges(x, starts, [int(v) for v in self.ends], axes, steps)


def _targets(t, x):
    """t as targets of x's shape and dtype: class indices [N] become one-hot rows."""
    t = t.detach()
    if t.dim() == 1:
        classes = _tandem.from_array(np.arange(x.shape[1], dtype=np.float32).reshape(1, -1), x.device, x.dtype)
        t = _whole_numbers(t, "cross_entropy")
        return _tandem.compare(_tandem.reshape(t.as_type(x.dtype), [t.shape[0], 1]), classes, "eq")
    return t if t.dtype == x.dtype else t.as_type(x.dtype)


# ---- functions (SINGA's)
def relu(x):
    """max(x, 0) elementwise."""
    return _tandem.relu(x)


def sigmoid(x):
    """1 / (1 + exp(-x)) elementwise."""
    return _tandem.sigmoid(x)


def tanh(x):
    """tanh(x) elementwise."""
    return _tandem.tanh(x)


def exp(a):
    """exp(a) elementwise."""
    return _tandem.exp(a)


def log(x):
    """The natural logarithm elementwise."""
    return _tandem.log(x)


def identity(x):
    return Identity()(x)[0]


def negative(x):
    return Negative()(x)[0]


def matmul(x, w):
    """NumPy's matmul of x and w (batched over broadcast leading dimensions)."""
    return _tandem.matmul(x, w)


def add_bias(x, b, axis=0):
    """b added to each row (axis 0) or each column (axis 1) of the 2-d x."""
    return AddBias(axis)(x, b)[0]


def add(a, b):
    return _tandem.add(*_promote(a, b))


def sub(a, b):
    return _tandem.sub(*_promote(a, b))


def mul(x, y):
    return _tandem.mul(*_promote(x, y))


def div(a, b):
    return _tandem.div(*_promote(a, b))


def greater(x, y):
    return Greater()(x, y)[0]


def less(x, y):
    return Less()(x, y)[0]


def equal(x, y):
    return Equal()(x, y)[0]


def reshape(x, shape):
    """x in another shape (-1: inferred; 0: x's extent kept)."""
    return Reshape(shape)(x)[0]


def flatten(x, axis=1):
    """x as a 2-d tensor: [product of the extents before axis, product of the rest]."""
    return Flatten(axis)(x)[0]


def transpose(x, shape):
    """x with its dimensions reordered by the permutation ``shape``."""
    return Transpose(shape)(x)[0]


def squeeze(x, axis=[]):  # noqa: B006 (SINGA's default)
    """x without the extent-1 dimensions listed in axis (all of them by default)."""
    return Squeeze(axis)(x)[0]


def unsqueeze(x, axis=-1):
    """x with extent-1 dimensions inserted at the positions in axis (an int or a list)."""
    return Unsqueeze(axis)(x)[0]


def cat(xs, axis=0):
    """The tensors of the list xs joined along axis."""
    return Concat(axis)(*xs)[0]


def softmax(x, axis=1):
    """Softmax over the dimensions from axis on (each row of a 2-d x)."""
    return SoftMax(axis)(x)[0]


def sum(*l):
    """The elementwise sum of the tensors."""
    return Sum()(*l)[0]


def add_all(*xs):
    """The sum of the tensors, added one after another (broadcast as ``add``). SINGA's asks for more
    than two and returns nothing (it forgets the sum it computed); this one returns it, for one tensor
    or more."""
    if not xs:
        raise ValueError("add_all: give at least one tensor")
    y = xs[0]
    for x in xs[1:]:
        y = add(y, x)
    return y


def mean(*l):
    """The elementwise mean of the tensors."""
    return Mean()(*l)[0]


def softmax_cross_entropy(x, t, ignore_index=None, reduction=None):
    """SINGA's: the mean over the batch of -log softmax(x)[t] for 2-d x, t class indices [N] or targets
    [N, C], as a tensor of shape (1,). For logits [..., C] with class indices [...] (a language model's
    [B, T, V] and [B, T]), or with ``ignore_index`` or ``reduction`` given: the loss over the last axis,
    positions whose target is ignore_index (default -100) left out, reduced by "mean" (over the others,
    the default), "sum" or "none" (one loss per position); a scalar for mean and sum."""
    if ignore_index is None and reduction is None and x.dim() <= 2:
        return SoftMaxCrossEntropy(t)(x)[0]
    return _tandem.cross_entropy_loss(x, t, reduction or "mean", -100 if ignore_index is None else int(ignore_index))


def cross_entropy(x, t):
    """-sum(t log x) / N for probabilities x [N, C]; t: targets [N, C] or class indices [N]."""
    return CrossEntropy(t)(x)[0]


def mse_loss(x, t):
    """The mean of (x - t)^2 over every element."""
    return MeanSquareError(t)(x)[0]


def dropout(x, seed=0, ratio=0.5):
    """Zeroes elements with probability ratio while ``training`` (the rest scaled by 1 / (1 - ratio))."""
    return Dropout(seed, ratio)(x)[0]


def binary_cross_entropy(x, t):
    """-(sum(t log x) + sum((1 - t) log(1 - x))) / N for probabilities x (guarded against log 0)."""
    return BinaryCrossEntropy(t)(x)[0]


def reduce_sum(x, axes=None, keepdims=1):
    """The sum over the axes (None: all), kept as extents of 1 with keepdims 1."""
    return ReduceSum(axes, keepdims)(x)[0]


def reduce_mean(x, axes=None, keepdims=1):
    """The mean over the axes (None: all), kept as extents of 1 with keepdims 1."""
    return ReduceMean(axes, keepdims)(x)[0]


def expand(x, shape):
    """x broadcast to shape."""
    return Expand(shape)(x)[0]


def slice(x, starts, ends, axes=None, steps=None):
    """Elements [starts[i], ends[i]) of axes[i], every steps[i]-th."""
    return Slice(starts, ends, axes, steps)(x)[0]


def where(x, y, condition):
    """x where condition is nonzero, y elsewhere."""
    return Where(condition)(x, y)[0]


# ---- elementwise ops
# SINGA's elementwise operators and functions by SINGA's names and arguments, on tandem's C++ ops (CPU
# and GPU alike; operands broadcast as NumPy's, any strides). Where SINGA's backward is wrong, tandem's
# is the true gradient (docs/ops.md lists the differences): Max and Min pass the incoming gradient (ties
# split it as PyTorch does), Erf differentiates erf at x (not at dy).

def _operand(v, like):
    """A number as a 0-d tensor of like's dtype and device (a tensor itself)."""
    return v if isinstance(v, Tensor) else _tandem.full([], float(v), like.device, like.dtype)


def _mask(c, like):
    """A condition (a tensor, an array or a list) as a detached tensor of like's dtype and device."""
    if not isinstance(c, Tensor):
        c = _tandem.from_array(np.asarray(c, dtype=np.float32), like.device, like.dtype)
    return c.detach()


class Abs(_Unary):
    """|x| elementwise (gradient sign(x))."""

    _fn = _tandem.abs


class Sqrt(_Unary):
    """x^0.5 elementwise."""

    _fn = _tandem.sqrt


class Sign(_Unary):
    """1 where x > 0, -1 where x < 0, 0 where x is 0 (zero gradient)."""

    _fn = _tandem.sign


class Reciprocal(_Unary):
    """1 / x elementwise."""

    _fn = _tandem.reciprocal


class Erf(_Unary):
    """The error function elementwise."""

    _fn = _tandem.erf


class Cos(_Unary):
    """cos(x) elementwise."""

    _fn = _tandem.cos


class Cosh(_Unary):
    """cosh(x) elementwise."""

    _fn = _tandem.cosh


class Acos(_Unary):
    """arccos(x) elementwise."""

    _fn = _tandem.acos


class Acosh(_Unary):
    """arcosh(x) elementwise."""

    _fn = _tandem.acosh


class Sin(_Unary):
    """sin(x) elementwise."""

    _fn = _tandem.sin


class Sinh(_Unary):
    """sinh(x) elementwise."""

    _fn = _tandem.sinh


class Asin(_Unary):
    """arcsin(x) elementwise."""

    _fn = _tandem.asin


class Asinh(_Unary):
    """arsinh(x) elementwise."""

    _fn = _tandem.asinh


class Tan(_Unary):
    """tan(x) elementwise."""

    _fn = _tandem.tan


class Atan(_Unary):
    """arctan(x) elementwise."""

    _fn = _tandem.atan


class Atanh(_Unary):
    """artanh(x) elementwise."""

    _fn = _tandem.atanh


class SoftPlus(_Unary):
    """log(exp(x) + 1) elementwise (computed without overflow)."""

    _fn = _tandem.softplus


class SoftSign(_Unary):
    """x / (1 + |x|) elementwise."""

    _fn = _tandem.softsign


class Ceil(_Unary):
    """The smallest integer >= x, elementwise (zero gradient)."""

    _fn = _tandem.ceil


class Floor(_Unary):
    """The largest integer <= x, elementwise (zero gradient)."""

    _fn = _tandem.floor


class Round(_Unary):
    """x rounded to the nearest integer, halves away from zero (zero gradient)."""

    _fn = _tandem.round


class Rounde(_Unary):
    """x rounded to the nearest integer, halves to the even one (zero gradient)."""

    _fn = _tandem.rounde


class Silu(_Unary):
    """x * sigmoid(x) elementwise (not in SINGA)."""

    _fn = _tandem.silu


class Not(_Unary):
    """1 where x is 0, else 0 (a mask: no gradient)."""

    _fn = _tandem.logical_not


class LeakyRelu(Operator):
    """x for x > 0 and a * x below, elementwise."""

    def __init__(self, a):
        super().__init__()
        self.a = a

    def _apply(self, x):
        return _tandem.leaky_relu(x, float(self.a))


class Elu(Operator):
    """x for x > 0 and alpha * (exp(x) - 1) below, elementwise."""

    def __init__(self, alpha=1.):
        super().__init__()
        self.alpha = alpha

    def _apply(self, x):
        return _tandem.elu(x, float(self.alpha))


class SeLU(Operator):
    """gamma * x for x > 0 and gamma * alpha * (exp(x) - 1) below, elementwise."""

    def __init__(self, alpha=1.67326, gamma=1.0507):
        super().__init__()
        self.alpha = alpha
        self.gamma = gamma

    def _apply(self, x):
        return _tandem.selu(x, float(self.alpha), float(self.gamma))


class HardSigmoid(Operator):
    """max(0, min(1, alpha * x + gamma)) elementwise."""

    def __init__(self, alpha=0.2, gamma=0.5):
        super().__init__()
        self.alpha = alpha
        self.gamma = gamma

    def _apply(self, x):
        return _tandem.hard_sigmoid(x, float(self.alpha), float(self.gamma))


class Gelu(Operator):
    """x * Phi(x), Phi the standard normal CDF; approximate="tanh" takes its tanh approximation (as
    PyTorch's GELU; not in SINGA)."""

    def __init__(self, approximate="none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def _apply(self, x):
        return _tandem.gelu(x, self.approximate == "tanh")


class Clip(Operator):
    """x limited to [min, max] elementwise (None: no bound); the gradient passes where min <= x <= max."""

    def __init__(self, min, max):  # noqa: A002 (SINGA's names)
        super().__init__()
        self.min = min
        self.max = max

    def _apply(self, x):
        return _tandem.clip(x, None if self.min is None else float(self.min),
                            None if self.max is None else float(self.max))


class Pow(Operator):
    """a ** b elementwise, broadcast (either may be a number)."""

    def _apply(self, a, b):
        return _tandem.pow(a, b)

    def __call__(self, a, b):
        if not isinstance(a, Tensor) and not isinstance(b, Tensor):
            raise TypeError("pow: at least one operand must be a tandem Tensor")
        return (self._apply(a, b),)


class PRelu(Operator):
    """x for x > 0 and slope * x below, elementwise; slope broadcasts with x."""

    def _apply(self, x, slope):
        return _tandem.prelu(x, slope)


class _Fold(Operator):
    """The elementwise fold of ``_fn`` over the inputs (broadcast)."""

    def _apply(self, *xs):
        if not xs:
            raise ValueError(f"{type(self).__name__.lower()}: no tensors given")
        if len(xs) == 1:
            return xs[0]
        y = type(self)._fn(xs[0], xs[1])
        for x in xs[2:]:
            y = type(self)._fn(y, x)
        return y


class Max(_Fold):
    """The elementwise maximum of the inputs (broadcast). Its gradient goes to the largest input (a tie
    splits it in halves, pairwise from the left), times the incoming gradient."""

    _fn = _tandem.maximum


class Min(_Fold):
    """The elementwise minimum of the inputs (broadcast); gradients as Max's, to the smallest."""

    _fn = _tandem.minimum


class _Logical(Operator):
    _fn = None

    def _apply(self, a, b):
        return type(self)._fn(a, b)


class And(_Logical):
    """1 where both a and b are nonzero, else 0 (a mask: no gradient)."""

    _fn = _tandem.logical_and


class Or(_Logical):
    """1 where a or b is nonzero, else 0 (a mask: no gradient)."""

    _fn = _tandem.logical_or


class Xor(_Logical):
    """1 where exactly one of a and b is nonzero, else 0 (a mask: no gradient)."""

    _fn = _tandem.logical_xor


class LessEqual(_Comparison):
    """1 where x <= y, else 0 (no gradient; not in SINGA)."""

    _op = "le"


class GreaterEqual(_Comparison):
    """1 where x >= y, else 0 (no gradient; not in SINGA)."""

    _op = "ge"


class NotEqual(Operator):
    """1 where x != y, else 0 (no gradient; not in SINGA)."""

    def _apply(self, x, y):
        return _tandem.not_equal(x, y)


#: SINGA's data type codes for Cast's ``to`` (kFloat32, kFloat16, kInt, kDouble).
_CAST_CODES = {0: "float32", 1: "float16", 2: "int32", 4: "float64"}


def _dtype_of(to):
    if isinstance(to, _tandem.DType):
        return to
    if isinstance(to, str):
        return _tandem.parse_dtype(to)
    if isinstance(to, (int, np.integer)) and int(to) in _CAST_CODES:
        return getattr(_tandem.DType, _CAST_CODES[int(to)])
    raise ValueError(f"cast: unknown data type {to!r} (a tandem DType, a name such as 'float32', or SINGA's "
                     "code: 0 float32, 1 float16, 2 int32, 4 float64)")


class Cast(Operator):
    """x converted to the data type ``to`` (a tandem DType, a name, or SINGA's code: 0 float32,
    1 float16, 2 int32, 4 float64). Between floating types the gradient is converted back; SINGA's
    Cast has none."""

    def __init__(self, to):
        super().__init__()
        self.to = to

    def _apply(self, x):
        return _tandem.cast(x, _dtype_of(self.to))


def abs(a):  # noqa: A001 (SINGA's name)
    """|a| elementwise (numbers: Python's abs)."""
    return Abs()(a)[0] if isinstance(a, Tensor) else _builtins.abs(a)


def sqrt(x):
    return Sqrt()(x)[0]


def sign(a):
    return Sign()(a)[0]


def reciprocal(x):
    return Reciprocal()(x)[0]


def erf(x):
    return Erf()(x)[0]


def cos(x):
    return Cos()(x)[0]


def cosh(x):
    return Cosh()(x)[0]


def acos(x):
    return Acos()(x)[0]


def acosh(x):
    return Acosh()(x)[0]


def sin(x):
    return Sin()(x)[0]


def sinh(x):
    return Sinh()(x)[0]


def asin(x):
    return Asin()(x)[0]


def asinh(x):
    return Asinh()(x)[0]


def tan(x):
    return Tan()(x)[0]


def atan(x):
    return Atan()(x)[0]


def atanh(x):
    return Atanh()(x)[0]


def softplus(x):
    return SoftPlus()(x)[0]


def softsign(x):
    return SoftSign()(x)[0]


def ceil(x):
    return Ceil()(x)[0]


def floor(x):
    return Floor()(x)[0]


def round(x):  # noqa: A001 (SINGA's name)
    """x rounded elementwise, halves away from zero (numbers: Python's round)."""
    return Round()(x)[0] if isinstance(x, Tensor) else _builtins.round(x)


def rounde(x):
    """x rounded elementwise, halves to the even integer."""
    return Rounde()(x)[0]


def silu(x):
    return Silu()(x)[0]


def gelu(x, approximate="none"):
    return Gelu(approximate)(x)[0]


def leakyrelu(x, a=0.01):
    return LeakyRelu(a)(x)[0]


def elu(x, alpha=1):
    return Elu(alpha)(x)[0]


def selu(x, alpha=1.67326, gamma=1.0507):
    return SeLU(alpha, gamma)(x)[0]


def hardsigmoid(x, alpha=0.2, gamma=0.5):
    return HardSigmoid(alpha, gamma)(x)[0]


def clip(x, min=None, max=None):  # noqa: A002 (SINGA's names)
    return Clip(min, max)(x)[0]


def pow(a, b):  # noqa: A001 (SINGA's name)
    """a ** b elementwise, broadcast; a or b may be a number (two numbers: Python's pow)."""
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        return _builtins.pow(a, b)
    return Pow()(a, b)[0]


def prelu(x, slope):
    return PRelu()(x, slope)[0]


def max(*l):  # noqa: A001 (SINGA's name)
    """The elementwise maximum of the tensors (anything else: Python's max)."""
    if not l or not _builtins.all(isinstance(x, Tensor) for x in l):
        return _builtins.max(*l)
    return Max()(*l)[0]


def min(*l):  # noqa: A001 (SINGA's name)
    """The elementwise minimum of the tensors (anything else: Python's min)."""
    if not l or not _builtins.all(isinstance(x, Tensor) for x in l):
        return _builtins.min(*l)
    return Min()(*l)[0]


def _and(a, b):
    return And()(a, b)[0]


def _or(a, b):
    return Or()(a, b)[0]


def _xor(a, b):
    return Xor()(a, b)[0]


def _not(x):
    return Not()(x)[0]


def less_equal(x, y):
    return LessEqual()(x, y)[0]


def greater_equal(x, y):
    return GreaterEqual()(x, y)[0]


def not_equal(x, y):
    return NotEqual()(x, y)[0]


def cast(x, to):
    return Cast(to)(x)[0]


# ---- reductions, shape and indexing ops, products
def _axes(x, axes):
    """The axes as a list of non-negative ints (None: every dimension)."""
    if axes is None:
        return list(range(x.dim()))
    axes = [axes] if isinstance(axes, (int, np.integer)) else list(axes)
    return [int(a) + x.dim() if int(a) < 0 else int(a) for a in axes]


def _index_tensor(indices, device):
    """Indices (a tensor, an array, a list or an int) as an i32 or i64 tensor on the device."""
    if isinstance(indices, Tensor):
        if indices.dtype in (_tandem.DType.int32, _tandem.DType.int64):
            return indices.to(device)
        return indices.as_type(_tandem.DType.int64).to(device)
    a = np.asarray(indices)
    if a.dtype.kind not in "iu":
        if a.size and not np.all(np.equal(np.mod(a, 1), 0)):
            raise ValueError(f"indices must be integers, got {a.dtype} values")
        a = a.astype(np.int64)
    return _tandem.from_array(np.ascontiguousarray(a.astype(np.int64)), device, _tandem.DType.int64)


def _values_tensor(v, like):
    """A tensor, an array or a list as a tensor of like's dtype on like's device."""
    if isinstance(v, Tensor):
        return v if v.dtype == like.dtype else v.as_type(like.dtype)
    return _tandem.from_array(np.ascontiguousarray(np.asarray(v, dtype=np.float64)), like.device, like.dtype)


class ReduceMax(_Reduce):
    """The largest element over the axes (None: all); keepdims 1 keeps them as extents of 1. Elements
    tied for the largest share its gradient evenly."""

    def _apply(self, x):
        return _tandem.amax(x, self._dims(x), bool(self.keepdims))


class ReduceMin(_Reduce):
    """The smallest element over the axes (None: all), gradient as ReduceMax's."""

    def _apply(self, x):
        return _tandem.amin(x, self._dims(x), bool(self.keepdims))


class GlobalAveragePool(Operator):
    """The mean over the spatial dimensions, kept as extents of 1: [N, C, H, W] -> [N, C, 1, 1]
    (``data_format='channels_last'``: [N, H, W, C] -> [N, 1, 1, C])."""

    def __init__(self, data_format="channels_first"):
        super().__init__()
        if data_format not in ("channels_first", "channels_last"):
            raise ValueError(f"globalaveragepool: data_format must be 'channels_first' or 'channels_last', "
                             f"got {data_format!r}")
        self.data_format = data_format

    def _apply(self, x):
        n = x.dim()
        axes = list(range(2, n)) if self.data_format == "channels_first" else list(range(1, n - 1))
        return _tandem.mean_dims(x, axes, True)


class Shape(Operator):
    """The shape of x as a 1-d int32 tensor on x's device (no gradient)."""

    def _apply(self, x):
        return _tandem.from_array(np.array(list(x.shape), dtype=np.int32), x.device, _tandem.DType.int32)


class ConstantOfShape(Operator):
    """A float32 tensor filled with value, of the shape held by the 1-d tensor x (its values are read
    back to the host: the host waits for x's device)."""

    def __init__(self, value=0.0):
        super().__init__()
        self.value = float(value)

    def _apply(self, x):
        shape = [int(v) for v in np.asarray(x.to_numpy()).reshape(-1)]
        if any(v < 0 for v in shape):
            raise ValueError(f"constant_of_shape: negative extent in the shape {shape}")
        return _tandem.full(shape, self.value, x.device, _tandem.DType.float32)


class Split(Operator):
    """x cut along axis into pieces of the lengths in parts, or (parts None) into num_output pieces of
    ceil(extent / num_output) elements, the last shorter when the extent does not divide."""

    def __init__(self, axis, parts, num_output=None):
        super().__init__()
        if parts is None and num_output is None:
            raise ValueError("split: give parts (the lengths) or num_output (the number of pieces)")
        self.axis, self.parts, self.num_output = axis, parts, num_output

    def _apply(self, x):
        if self.parts is not None:
            return tuple(_tandem.split(x, [int(p) for p in self.parts], int(self.axis)))
        return tuple(_tandem.chunk(x, int(self.num_output), int(self.axis)))


class Gather(Operator):
    """The slices of x at the indices along axis (ONNX's Gather): the result has shape
    x.shape[:axis] + indices.shape + x.shape[axis + 1:]. Negative indices count from the end. The
    gradient sums the slices of repeated indices (SINGA's keeps only one of them)."""

    def __init__(self, axis, indices):
        super().__init__()
        self.axis, self.indices = axis, indices

    def _apply(self, x):
        return _tandem.index_select(x, int(self.axis), _index_tensor(self.indices, x.device))


class ScatterElements(Operator):
    """ONNX's ScatterElements: x with updates written at indices along axis (indices and updates of one
    shape, of x's rank; a position given twice takes the later value). x's gradient is zero where it was
    overwritten; updates given as a tensor that requires a gradient receive the gradient at their
    positions."""

    def __init__(self, indices, updates, axis=0):
        super().__init__()
        self.indices, self.updates, self.axis = indices, updates, axis

    def _apply(self, x):
        idx = _index_tensor(self.indices, x.device)
        upd = _values_tensor(self.updates, x)
        return _tandem.scatter_elements(x, idx, upd, int(self.axis))


class Tile(Operator):
    """NumPy's tile: x repeated repeats[d] times along each dimension."""

    def __init__(self, repeats):
        super().__init__()
        self.repeats = [repeats] if isinstance(repeats, (int, np.integer)) else list(repeats)

    def _apply(self, x):
        return _tandem.tile(x, [int(r) for r in self.repeats])


class NonZero(Operator):
    """The positions of x's nonzero elements as an int32 tensor [x.ndim, count] (the count decides the
    shape: the host waits for the device). No gradient."""

    def _apply(self, x):
        return _tandem.nonzero(x).as_type(_tandem.DType.int32)


class OneHot(Operator):
    """One-hot rows of indices (values in [-depth, depth); negative ones count from the end, others
    outside give a row of off values): a dimension of extent depth inserted at axis, values =
    [off_value, on_value]. Float32, no gradient."""

    def __init__(self, axis, depth, values):
        super().__init__()
        self.axis, self.depth, self.values = axis, depth, values

    def _apply(self, indices):
        off, on = (float(v) for v in np.asarray(self.values.to_numpy() if isinstance(self.values, Tensor)
                                                else self.values).reshape(-1)[:2])
        idx = _index_tensor(indices, indices.device)
        return _tandem.one_hot(idx, int(self.depth), int(self.axis), off, on, _tandem.DType.float32)


class CosSim(Operator):
    """The cosine similarity of each row of the 2-d a and b (one value per row), as PyTorch's (each norm
    clamped below by 1e-8, so a zero row gives 0, not NaN)."""

    def _apply(self, a, b):
        return _tandem.cosine_similarity(a, b, 1, 1e-8)


class Pad(Operator):
    """ONNX's Pad: pads lists the elements added at the beginning of each axis, then at the end of
    each; mode "constant" (the value constant), "reflect" (mirrored, the edge not repeated, as NumPy's)
    or "edge" (the edge repeated). SINGA's reflect repeats the first (last) pads elements in their order
    instead; tandem's is NumPy's and ONNX's, and its gradients sum every copy back."""

    def __init__(self, mode, pads, constant=0.0):
        super().__init__()
        if mode not in ("constant", "reflect", "edge"):
            raise ValueError(f"pad: mode must be 'constant', 'reflect' or 'edge', got {mode!r}")
        self.mode, self.pads, self.constant = mode, [int(p) for p in pads], float(constant)

    def _apply(self, x):
        half = len(self.pads) // 2
        if len(self.pads) % 2 or half > x.dim():
            raise ValueError(f"pad: {len(self.pads)} pads for a tensor of shape {x.shape}")
        # Axes past the ones listed are not padded.
        pads = self.pads[:half] + [0] * (x.dim() - half) + self.pads[half:] + [0] * (x.dim() - half)
        return _tandem.pad(x, pads, self.mode, self.constant)


class UpSample(Operator):
    """Nearest-neighbour upsampling: each element repeated scales[d] times along dimension d (integer
    scales of at least 1, one per dimension)."""

    def __init__(self, mode, scales):
        super().__init__()
        if mode.lower() != "nearest":
            raise ValueError(f"upsample: only mode 'nearest' is supported, got {mode!r}")
        self.mode = "nearest"
        self.scales = list(np.asarray(scales).reshape(-1))

    def _apply(self, x):
        scales = []
        for s in self.scales:
            if float(s) != int(s):
                raise ValueError(f"upsample: scales must be whole numbers, got {s}")
            scales.append(int(s))
        return _tandem.upsample_nearest(x, scales)


class DepthToSpace(Operator):
    """[N, C, H, W] -> [N, C / b^2, H b, W b]: blocks of channels moved into b x b patches, in
    depth-column-row order (mode "DCR") or column-row-depth ("CRD")."""

    def __init__(self, blocksize, mode="DCR"):
        super().__init__()
        self.blocksize, self.mode = int(blocksize), mode.upper()

    def _apply(self, x):
        return _tandem.depth_to_space(x, self.blocksize, self.mode)


class SpaceToDepth(Operator):
    """[N, C, H, W] -> [N, C b^2, H / b, W / b], DepthToSpace's inverse."""

    def __init__(self, blocksize, mode="DCR"):
        super().__init__()
        self.blocksize, self.mode = int(blocksize), mode.upper()

    def _apply(self, x):
        return _tandem.space_to_depth(x, self.blocksize, self.mode)


class Gemm(Operator):
    """alpha * A' B' + beta * C, A' = A^T when transA, B' = B^T when transB, for 2-d A and B; C (optional)
    broadcasts to the product's shape."""

    def __init__(self, alpha=1.0, beta=1.0, transA=0, transB=0):
        super().__init__()
        self.alpha, self.beta, self.transA, self.transB = float(alpha), float(beta), transA, transB

    def _apply(self, A, B, C=None):
        return _tandem.gemm(A, B, C, self.alpha, self.beta, bool(self.transA), bool(self.transB))


class RankingLoss(Operator):
    """sum(max(0, M - pos + neg)) / pos.shape[0]: scores pos should beat neg by the margin M."""

    def __init__(self, M=0.2):
        super().__init__()
        self.M = float(M)

    def _apply(self, pos, neg):
        return _tandem.ranking_loss(pos, neg, self.M)


def reduce_max(x, axes=None, keepdims=1):
    """The largest element over the axes (None: all), kept as extents of 1 with keepdims 1."""
    return ReduceMax(axes, keepdims)(x)[0]


def reduce_min(x, axes=None, keepdims=1):
    """The smallest element over the axes (None: all), kept as extents of 1 with keepdims 1."""
    return ReduceMin(axes, keepdims)(x)[0]


def globalaveragepool(x, data_format="channels_first"):
    """The mean over the spatial dimensions, kept as extents of 1."""
    return GlobalAveragePool(data_format)(x)[0]


def shape(x):
    """x's shape as a 1-d int32 tensor."""
    return Shape()(x)[0]


def constant_of_shape(x, value=0):
    """A float32 tensor of value in the shape held by the 1-d tensor x."""
    return ConstantOfShape(value)(x)[0]


def split(x, axis, parts, num_output=None):
    """x cut along axis into pieces of the lengths parts (or num_output even pieces): a tuple."""
    return Split(axis, parts, num_output)(x)


def gather(x, axis, indices):
    """The slices of x at the indices (ints, nested lists, an array or a tensor) along axis."""
    return Gather(axis, indices)(x)[0]


def scatter_elements(x, indices, updates, axis=0):
    """x with updates written at indices along axis."""
    return ScatterElements(indices, updates, axis)(x)[0]


def tile(x, repeats):
    """x repeated repeats[d] times along each dimension (NumPy's tile)."""
    return Tile(repeats)(x)[0]


def nonzero(x):
    """The positions of x's nonzero elements, int32 [x.ndim, count]."""
    return NonZero()(x)[0]


def onehot(axis, indices, depth, values):
    """One-hot rows of indices along a new axis of extent depth; values = [off_value, on_value]."""
    return OneHot(axis, depth, values)(indices)[0]


def cossim(a, b):
    """The cosine similarity of each row of the 2-d a and b."""
    if tuple(a.shape) != tuple(b.shape) or a.dim() != 2:
        raise ValueError(f"cossim: a and b must be 2-d of one shape, got {a.shape} and {b.shape}")
    return CosSim()(a, b)[0]


def pad(x, mode, pads, constant=0.0):
    """x padded by pads (the beginnings of each axis, then the ends) in mode constant, reflect or edge."""
    return Pad(mode, pads, constant)(x)[0]


def upsample(x, mode, scales):
    """Nearest-neighbour upsampling by the integer scales, one per dimension."""
    return UpSample(mode, scales)(x)[0]


def depth_to_space(x, blocksize, mode="DCR"):
    """[N, C, H, W] -> [N, C / b^2, H b, W b] (mode DCR or CRD)."""
    return DepthToSpace(blocksize, mode)(x)[0]


def space_to_depth(x, blocksize, mode="DCR"):
    """[N, C, H, W] -> [N, C b^2, H / b, W / b] (mode DCR or CRD)."""
    return SpaceToDepth(blocksize, mode)(x)[0]


def gemm(A, B, C=None, alpha=1.0, beta=1.0, transA=0, transB=0):
    """alpha * A' B' + beta * C (A', B' transposed when transA, transB); C optional."""
    if C is not None:
        return Gemm(alpha, beta, transA, transB)(A, B, C)[0]
    return Gemm(alpha, beta, transA, transB)(A, B)[0]


def ranking_loss(pos, neg, M=0.2):
    """sum(max(0, M - pos + neg)) / pos.shape[0]."""
    if tuple(pos.shape) != tuple(neg.shape):
        raise ValueError(f"ranking_loss: pos and neg shapes differ: {pos.shape} and {neg.shape}")
    return RankingLoss(M)(pos, neg)[0]


# ---- softmax, normalisation, losses, attention
class LogSoftmax(Operator):
    """log(softmax(x)) over the dimensions from axis on, taken together, as SoftMax normalises them (for a
    2-d x and axis 1: each row); computed stably in one kernel."""

    def __init__(self, axis=1):
        super().__init__()
        self.axis = axis

    def _apply(self, x):
        n = x.dim()
        axis = self.axis + n if self.axis < 0 else self.axis
        if not 0 <= axis < max(n, 1):
            raise ValueError(f"log_softmax: axis {self.axis} is out of range for shape {x.shape}")
        if axis == n - 1:
            return _tandem.log_softmax(x, -1)
        rows = int(np.prod(x.shape[:axis], dtype=np.int64))
        flat = _tandem.reshape(x, [rows, x.size() // rows if rows else 0])
        return _tandem.reshape(_tandem.log_softmax(flat, -1), list(x.shape))


def log_softmax(x, axis=1):
    """log(softmax(x)) over the dimensions from axis on (each row of a 2-d x)."""
    return LogSoftmax(axis)(x)[0]


def nll_loss(x, t, ignore_index=-100, reduction="mean"):
    """The negative log-likelihood -x[t] over the last axis of log-probabilities x [..., C] (log_softmax's
    output) against class indices t [...]; positions whose target is ignore_index are left out; reduction
    "mean" (over the others), "sum" or "none"."""
    return _tandem.nll_loss(x, t, reduction, int(ignore_index))


def binary_cross_entropy_with_logits(x, t, reduction="mean"):
    """Binary cross-entropy of sigmoid(x) against targets t of x's shape, computed stably from the logits:
    max(x, 0) - x t + log(1 + exp(-|x|)); reduction "mean", "sum" or "none"."""
    t = t if t.dtype == x.dtype else t.as_type(x.dtype)
    return _tandem.binary_cross_entropy_with_logits(x, t.detach(), reduction)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Layer normalisation over the trailing dimensions normalized_shape (an int or a list):
    (x - mean) / sqrt(var + eps) * weight + bias, weight and bias optional."""
    shape = [int(normalized_shape)] if isinstance(normalized_shape, int) else [int(s) for s in normalized_shape]
    return _tandem.layer_norm(x, shape, weight, bias, float(eps))


def rms_norm(x, normalized_shape, weight=None, eps=1e-6):
    """Root-mean-square normalisation over the trailing dimensions normalized_shape: x / sqrt(mean(x^2) +
    eps) * weight, weight optional."""
    shape = [int(normalized_shape)] if isinstance(normalized_shape, int) else [int(s) for s in normalized_shape]
    return _tandem.rms_norm(x, shape, weight, float(eps))


_attention_generator = None


def scaled_dot_product_attention(q, k, v, causal=False, dropout_p=0.0, scale=None, generator=None):
    """softmax(scale q k^T) v for q [B, H, Tq, d], k [B, H, Tk, d], v [B, H, Tk, dv] (scale None: 1/sqrt(d));
    causal masks key j out of query i's row where j > i. dropout_p drops probabilities (from ``generator``,
    or one module-wide generator of seed 0). 16-bit tensors on a GPU go through cuDNN's fused flash
    attention; others compute the same by matrix products."""
    global _attention_generator
    if dropout_p and generator is None:
        if _attention_generator is None:
            _attention_generator = _tandem.Generator(0)
        generator = _attention_generator
    return _tandem.scaled_dot_product_attention(q, k, v, bool(causal), float(dropout_p), scale,
                                                generator if dropout_p else None)


# ---- embedding, recurrent networks
def _indices(x):
    """Indices as int32 / int64 (SINGA passes them as floating tensors holding whole numbers)."""
    return _whole_numbers(x, "embedding", "indices")


class Embedding(Operator):
    """SINGA's embedding: ``Embedding()(x, w)`` gives the rows of w [V, D] that the indices x name,
    [..., D]; x holds int32 / int64 values, or whole numbers in a floating tensor (SINGA's; a fraction
    is a ValueError). Rows picked more than once add their gradients. An index outside [0, V) raises (on
    a GPU at the next wait for the device)."""

    def _apply(self, x, w):
        return _tandem.embedding(w, _indices(x))


def embedding(x, w):
    """The rows of w [V, D] that the indices x name: [..., D] (see :class:`Embedding`)."""
    return Embedding()(x, w)[0]


_RNN_MODES = {0: "relu", 1: "tanh", 2: "lstm", 3: "gru", "vanilla": "tanh", "tanh": "tanh", "relu": "relu",
              "lstm": "lstm", "gru": "gru"}


def _rnn_mode(mode):
    if mode not in _RNN_MODES:
        raise ValueError(f"unknown recurrent mode {mode!r}: 0 / 'relu', 1 / 'tanh' ('vanilla'), 2 / 'lstm' or 3 / 'gru'")
    return _RNN_MODES[mode]


class CudnnRNNHandle:
    """SINGA's description of a recurrent network for :class:`_RNN`: ``CudnnRNNHandle(x, hidden_size,
    mode=0, num_layers=1, dropout=0, bidirectional=0)`` with x time-major [T, N, I] (its I is the input
    size) and SINGA's mode numbers (0 RNN relu, 1 RNN tanh, 2 LSTM, 3 GRU; names work too).
    ``weights_size`` is the length of the flat weight (PyTorch's parameters in their order: per layer and
    direction weight_ih, weight_hh, bias_ih, bias_hh). It runs on the CPU and on GPUs (cuDNN there)."""

    def __init__(self, x, hidden_size, mode=0, num_layers=1, dropout=0.0, bidirectional=0, bias=True):
        self.mode = _rnn_mode(mode)
        self.input_size = int(x.shape[-1])
        self.hidden_size = int(hidden_size)
        self.num_layers = int(num_layers)
        self.dropout = float(dropout)
        self.bidirectional = bool(bidirectional)
        self.bias = bool(bias)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"CudnnRNNHandle: dropout must be in [0, 1), got {dropout}")
        self.weights_size = _tandem.rnn_weight_size(self.mode, self.input_size, self.hidden_size, self.num_layers,
                                                    self.bidirectional, self.bias)
        self.generator = _tandem.Generator(x.device.generator.next_below(2**62))  # dropout masks


class _RNN(Operator):
    """SINGA's recurrent operator: ``_RNN(handle, return_sequences=False)(x, hx, cx, w)`` over the
    time-major x [T, N, I] with initial states hx, cx [L D, N, H] (cx is read for LSTMs only) and the
    flat weight w; returns (y,) with y [T, N, D H] (return_sequences) or its last step [N, D H]. While
    ``autograd.training`` is True, the outputs of all layers but the last go through dropout.
    Sequences of different lengths (``use_mask``) are not supported: pad them to one length."""

    def __init__(self, handle, return_sequences=False, use_mask=False, seq_lengths=None):
        super().__init__()
        if use_mask:
            raise NotImplementedError("_RNN: sequences of different lengths (use_mask=True) are not supported; "
                                      "pad the batch to one length")
        self.handle = handle
        self.return_sequences = bool(return_sequences)

    def _apply(self, x, hx, cx, w):
        h = self.handle
        y, _, _ = _tandem.rnn(x, w, hx, cx if h.mode == "lstm" else None, h.mode, h.hidden_size, h.num_layers,
                              h.bidirectional, False, h.bias, h.dropout, bool(training), h.generator)
        if self.return_sequences:
            return y
        steps = y.shape[0]
        return _tandem.reshape(_tandem.slice(y, 0, steps - 1, 1), [y.shape[1], y.shape[2]])


def rnn(x, w, hx=None, cx=None, mode="lstm", hidden_size=None, num_layers=1, bidirectional=False, batch_first=False,
        bias=True, dropout=0.0, generator=None):
    """A multi-layer recurrent network as one operation (tandem's; SINGA has only :class:`_RNN`): x [T, N, I]
    ([N, T, I] with batch_first), the flat weight w, initial states hx, cx [L D, N, H] (None: zeros);
    returns (y, hy, cy), cy None unless mode is "lstm". Dropout between layers while ``training``."""
    if hidden_size is None:
        raise TypeError("rnn: hidden_size is required")
    gen = generator if generator is not None else _tandem.Generator(0)
    return _tandem.rnn(x, w, hx, cx, _rnn_mode(mode), int(hidden_size), int(num_layers), bool(bidirectional),
                       bool(batch_first), bool(bias), float(dropout), bool(training), gen)


# SINGA 3.0 kept its layers in autograd, and the distributed-training guide writes its CNN with
# autograd.Conv2d, autograd.Linear and autograd.MaxPool2d: they are tandem.layer's classes.
from .layer import (AvgPool1d, AvgPool2d, BatchNorm2d, Conv2d, Layer, Linear, MaxPool1d, MaxPool2d,  # noqa: E402
                    Pooling2d, SeparableConv2d)
