"""Tensors (SINGA's ``singa.tensor``).

``Tensor(shape=(), device=None, dtype=float32, data=None, requires_grad=True, stores_grad=False,
creator=None, name=None)`` takes SINGA's arguments in SINGA's order. The functions and methods below
keep SINGA's names, arguments and defaults; NumPy copies and DLPack views come with them.
"""
import atexit
import builtins
import math

import numpy as np

from . import _tandem
from .device import get_default_device

Tensor = _tandem.Tensor
DType = _tandem.DType

float32 = DType.float32
float64 = DType.float64
float16 = DType.float16
bfloat16 = DType.bfloat16
int32 = DType.int32
int64 = DType.int64
uint8 = DType.uint8

_DLPACK_CUDA = 2
_SIZES = {float32: 4, float64: 8, float16: 2, bfloat16: 2, int32: 4, int64: 8, uint8: 1}


# ---- module functions
def from_numpy(np_array, dev=None, dtype=None):
    """A new tensor with a copy of the array's values, on ``dev`` (None: the CPU). As SINGA's, float64
    arrays become float32 tensors and int64 arrays int32 ones, unless ``dtype`` says otherwise."""
    a = np.asarray(np_array)
    if dtype is None:
        dtype = {np.dtype(np.float64): float32, np.dtype(np.int64): int32}.get(a.dtype)
    return _tandem.from_array(a, dev, dtype)


def to_numpy(t):
    """A NumPy copy of the tensor's values (bfloat16 arrives as float32)."""
    return t.to_numpy()


def to_host(t):
    """A copy of the tensor on the CPU."""
    return t.to(get_default_device())


def from_raw_tensor(t):
    """The tensor itself (SINGA wraps its C++ tensors; tandem's are the same objects)."""
    return t


def from_raw_tensors(tt):
    return list(tt)


def from_dlpack(x):
    """A tensor sharing the memory of a DLPack producer (a NumPy array, a PyTorch tensor, a capsule).

    No copy is made: writes through either side are seen by the other. GPU producers are asked to
    order their pending work before tandem's stream.
    """
    if hasattr(x, "__dlpack_device__") and hasattr(x, "__dlpack__"):
        dev_type, dev_id = x.__dlpack_device__()
        if int(dev_type) == _DLPACK_CUDA:
            stream = _tandem._compute_stream(int(dev_id))
            return _tandem._from_dlpack(x.__dlpack__(stream=stream) if stream else x.__dlpack__())
    return _tandem._from_dlpack(x)


def zeros(shape, device=get_default_device(), dtype=float32):
    return _tandem.full(list(shape), 0.0, device, dtype)


def ones(shape, device=get_default_device(), dtype=float32):
    return _tandem.full(list(shape), 1.0, device, dtype)


def full(shape, value, dev=None, dtype=float32):
    return _tandem.full(list(shape), float(value), dev, dtype)


def random(shape, device=get_default_device()):
    """Uniform values in [0, 1) from the device's generator."""
    return Tensor(shape, device).uniform(0.0, 1.0)


def zeros_like(t):
    return _tandem.full(list(t.shape), 0.0, t.device, t.dtype)


def ones_like(t):
    return _tandem.full(list(t.shape), 1.0, t.device, t.dtype)


def product(shape):
    """The number of elements of a shape."""
    return math.prod(shape)


def sizeof(dtype):
    """Bytes per element of the type."""
    return _SIZES[dtype]


def contiguous(tensor):
    return tensor.contiguous()


def reshape(tensor, shape):
    """A tensor of the same elements in another shape (one extent may be -1)."""
    return tensor.reshape(list(shape))


def transpose(t, axes=None):
    """The dimensions reversed (axes None) or reordered as axes says."""
    return t.transpose(axes)


def copy_data_to_from(dst, src, size, dst_offset=0, src_offset=0):
    """Copies ``size`` elements of src from src_offset on into dst from dst_offset on (flat, any devices)."""
    _flat(dst, dst_offset, size).copy_(src.contiguous().reshape([-1]).detach()[src_offset:src_offset + size])


def copy_from_numpy(data, np_array):
    """Copies the array's values into the tensor ``data`` (same element count)."""
    return data.copy_from_numpy(np_array)


def concatenate(tensors, axis):
    return _tandem.concat(list(tensors), int(axis))


def softmax(t, out=None):
    """Softmax of each row of a 1-d or 2-d tensor (SINGA's: over the dimensions from 1 on, flattened)."""
    from . import autograd

    y = autograd.softmax(t, 1 if t.dim() > 1 else 0)
    return _into(out, y)


def sum(t, axis=None, out=None):
    """Sum of all elements (a 0-d tensor when axis is None), or over the axis (an int or a tuple of ints)."""
    if axis is None:
        return _into(out, _tandem.sum(t))
    axes = [axis] if isinstance(axis, int) else list(axis)
    return _into(out, _tandem.sum_dims(t, axes, False))


def average(t, axis=None):
    """Mean of all elements as a float (axis None), or along the axis."""
    if axis is None:
        return _tandem.sum(t).item() / t.size()
    return _tandem.sum_dims(t, [axis], False) * (1.0 / t.shape[axis])


def exp(t):
    return _tandem.exp(t)


def log(t):
    return _tandem.log(t)


def sigmoid(t):
    return _tandem.sigmoid(t)


def tanh(t):
    return _tandem.tanh(t)


def relu(t):
    return _tandem.relu(t)


def square(t):
    return _tandem.mul(t, t)


def pow(t, x, out=None):
    """t ** x elementwise (x a number or a tensor, broadcast)."""
    return _into(out, _tandem.pow(t, x if isinstance(x, Tensor) else float(x)))


def lt(t, x):
    return t < x


def le(t, x):
    return t <= x


def gt(t, x):
    return t > x


def ge(t, x):
    return t >= x


def eq(t, x):
    """1 where t equals x (a tensor or a number), 0 elsewhere."""
    return _compare(t, x, "eq")


def add(lhs, rhs, ret=None):
    return _into(ret, lhs + rhs)


def sub(lhs, rhs, ret=None):
    return _into(ret, lhs - rhs)


def eltwise_mult(lhs, rhs, ret=None):
    return _into(ret, lhs * rhs)


def div(lhs, rhs, ret=None):
    return _into(ret, lhs / rhs)


def mult(A, B, C=None, alpha=1.0, beta=0.0):
    """alpha * A B + beta * C for 2-d A and B (B may be 1-d); into C when given."""
    vector = B.dim() == 1
    y = _tandem.matmul(A, B.reshape([B.shape[0], 1]) if vector else B)
    if vector:
        y = y.reshape([A.shape[0]])
    if alpha != 1.0:
        y = y * float(alpha)
    if C is None:
        return y
    if beta != 0.0:
        y = y + C * float(beta)
    C.copy_(y)
    return C


def axpy(alpha, x, y):
    """y += alpha * x, in place; returns y."""
    y += x * float(alpha)
    return y


def bernoulli(p, t):
    return t.bernoulli(p)


def gaussian(mean, std, t):
    return t.gaussian(mean, std)


def uniform(low, high, t):
    return t.uniform(low, high)


# ---- helpers
def _scalar(value, like):
    return _tandem.full([], value, like.device, like.dtype)


def _compare(t, x, op):
    return _tandem.compare(t, x if isinstance(x, Tensor) else _scalar(float(x), t), op)


def _into(out, y):
    if out is None:
        return y
    out.copy_(y)
    return out


def _flat(t, offset, size):
    if offset < 0 or size < 0 or offset + size > t.size():
        raise ValueError(f"elements [{offset}, {offset + size}) are outside the tensor of {t.size()} elements "
                         "(element count and offset do not fit)")
    if not t.is_contiguous():
        raise ValueError("copying into part of a tensor needs a contiguous tensor")
    return t.view([-1]).narrow(0, offset, size)


# ---- SINGA's Tensor methods, in Python (see _install below)
class _Count(int):
    """An int that may also be called: ``t.ndim`` (NumPy's attribute) and ``t.ndim()`` (SINGA's method)."""

    def __call__(self):
        return int(self)


_c = {name: getattr(Tensor, name) for name in ("copy_from_numpy", "set_value", "gaussian", "uniform", "transpose")}


def _ndim(self):
    return _Count(self.dim())


def _is_dummy(self):
    """True for a tensor nobody named (SINGA's names such tensors Dummy#N)."""
    return self.name.startswith("Dummy#")


def _is_empty(self):
    return self.dim() == 0


def _is_transpose(self):
    """True when the elements are not stored in row-major order."""
    return not self.is_contiguous()


def _memsize(self):
    return self.nbytes


def _to_host(self):
    """Moves this handle's data to the CPU."""
    self.to_device(get_default_device())


def _l1(self):
    """SINGA's L1 value: the mean absolute value of the elements."""
    a = _tandem.add(_tandem.relu(self), _tandem.relu(self * -1.0))
    return _tandem.sum(a).item() / self.size()


def _l2(self):
    """SINGA's L2 value: the Euclidean norm of the elements divided by their number."""
    return math.sqrt(_tandem.sum(_tandem.mul(self, self)).item()) / self.size()


def _set_value(self, x, inplace=True):
    """Sets every element to x (inplace False: a new tensor of that value)."""
    if not inplace:
        return _tandem.full(list(self.shape), float(x), self.device, self.dtype)
    return _c["set_value"](self, float(x))


def _copy_from_numpy(self, np_array, offset=0):
    """Copies the array's values into this tensor, converting their type; from element ``offset`` on
    when given (the array then fills part of the tensor)."""
    a = np.asarray(np_array)
    if offset == 0:
        return _c["copy_from_numpy"](self, a)
    _c["copy_from_numpy"](_flat(self, offset, a.size), a.reshape(-1))
    return self


def _copy_from(self, t, offset=0):
    """Copies a tensor's or an array's values into this tensor (from element offset on)."""
    if isinstance(t, Tensor):
        if offset == 0:
            return self.copy_data(t)
        _flat(self, offset, t.size()).copy_(t.contiguous().reshape([-1]).detach())
        return self
    if isinstance(t, np.ndarray):
        return _copy_from_numpy(self, t, offset)
    raise ValueError("copy_from: t should be a Tensor or a NumPy array")


def _copy(self):
    """A new handle sharing this tensor's memory."""
    return Tensor(data=self, requires_grad=False)


def _deepcopy(self):
    return self.clone()


def _random(self, inplace, fill):
    t = self if inplace else Tensor(self.shape, self.device, self.dtype)
    fill(t)
    return t


def _gaussian(self, mean, std, inplace=True):
    """N(mean, std^2) values from the device's generator, into this tensor (inplace False: a new one)."""
    return _random(self, inplace, lambda t: _c["gaussian"](t, float(mean), float(std)))


def _uniform(self, low, high, inplace=True):
    """U[low, high) values from the device's generator, into this tensor (inplace False: a new one)."""
    return _random(self, inplace, lambda t: _c["uniform"](t, float(low), float(high)))


def _bernoulli(self, p, inplace=True):
    """1 with probability p, else 0, per element (inplace False: a new tensor)."""
    def fill(t):
        u = Tensor(t.shape, t.device, float32 if t.dtype not in (float32, float64) else t.dtype)
        _c["uniform"](u, 0.0, 1.0)
        t.copy_(_compare(u, float(p), "lt"))

    return _random(self, inplace, fill)


def _lt(self, rhs):
    return _as_mask(_compare(self, rhs, "lt"))


def _le(self, rhs):
    return _as_mask(_compare(self, rhs, "le"))


def _gt(self, rhs):
    return _as_mask(_compare(self, rhs, "gt"))


def _ge(self, rhs):
    return _as_mask(_compare(self, rhs, "ge"))


_METHODS = {
    "ndim": property(_ndim, doc="The number of dimensions: t.ndim, or SINGA's t.ndim()."),
    "is_dummy": _is_dummy,
    "is_empty": _is_empty,
    "is_transpose": _is_transpose,
    "memsize": _memsize,
    "to_host": _to_host,
    "l1": _l1,
    "l2": _l2,
    "set_value": _set_value,
    "copy_from_numpy": _copy_from_numpy,
    "copy_from": _copy_from,
    "copy": _copy,
    "deepcopy": _deepcopy,
    "gaussian": _gaussian,
    "uniform": _uniform,
    "bernoulli": _bernoulli,
    "__lt__": _lt,
    "__le__": _le,
    "__gt__": _gt,
    "__ge__": _ge,
}


def _install():
    for name, f in _METHODS.items():
        setattr(Tensor, name, f)


def _uninstall():
    # Before the interpreter shuts down: these Python functions refer to this module, which refers to
    # the Tensor type; removing them lets the type go with the extension module.
    for name in _METHODS:
        try:
            delattr(Tensor, name)
        except AttributeError:
            pass


_install()
atexit.register(_uninstall)


# ---- elementwise ops
def abs(t):  # noqa: A001 (SINGA's name)
    """|t| elementwise."""
    return _tandem.abs(t)


def ceil(t):
    """The smallest integer >= t, elementwise."""
    return _tandem.ceil(t)


def sign(t):
    """1, 0 or -1 by the sign of each element."""
    return _tandem.sign(t)


def sqrt(t):
    """t^0.5 elementwise."""
    return _tandem.sqrt(t)


def ne(t, x):
    """1 where t differs from x (a tensor or a number), 0 elsewhere."""
    return t != x


# NumPy-style operators beyond those of the C++ class (+ - * / with tensors and numbers on either side,
# unary -, in place += -= *= /=): ** with a tensor or a number on either side, abs(), == and != giving
# masks. Differentiable ones record their gradients.
def _is_number(v):
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def _tensor_pow(self, rhs):
    if isinstance(rhs, Tensor):
        return _tandem.pow(self, rhs)
    if _is_number(rhs):
        return _tandem.pow(self, float(rhs))
    return NotImplemented


def _tensor_rpow(self, lhs):
    return _tandem.pow(float(lhs), self) if _is_number(lhs) else NotImplemented


def _tensor_abs(self):
    return _tandem.abs(self)


def _tensor_eq(self, rhs):
    if isinstance(rhs, Tensor) or _is_number(rhs):
        return _as_mask(_compare(self, rhs, "eq"))
    return NotImplemented


def _tensor_ne(self, rhs):
    if isinstance(rhs, Tensor):
        return _as_mask(_tandem.not_equal(self, rhs))
    if _is_number(rhs):
        return _as_mask(_tandem.not_equal(self, float(rhs)))
    return NotImplemented


def _tensor_bool(self):
    """A tensor is true, as SINGA's are: its truth tells it from None (``if labels:``). Read values with
    ``item()`` or reduce them first; the masks of comparison operators are the exception (see _Mask)."""
    return True


class _Mask(Tensor):
    """The 1/0 tensor a comparison operator gives (``== != < <= > >=``). A mask of several elements has no
    truth value (as NumPy's), so that ``t == u`` inside ``if`` or ``in`` cannot pass unnoticed; a mask of
    one element is true when nonzero."""

    def __bool__(self):
        if self.size() != 1:
            raise ValueError(f"the truth value of a mask of {self.size()} elements is ambiguous: reduce it first "
                             "(tensor.sum, .item()) or compare tensors by identity (is)")
        return self.item() != 0


def _as_mask(t):
    return _Mask(data=t, requires_grad=False)


_FLOAT_RANKS = {bfloat16: 1, float16: 1, float32: 2, float64: 3}
_INT_RANKS = {uint8: 0, int32: 1, int64: 2}


def _common_dtype(a, b):
    """The dtype two operands of different dtypes compute in (NumPy's rule among tandem's dtypes): an
    integer with a floating type gives the floating type, otherwise the wider of the two (float16 with
    bfloat16: float32)."""
    fa, fb = a in _FLOAT_RANKS, b in _FLOAT_RANKS
    if fa and fb:
        if {a, b} == {float16, bfloat16}:
            return float32
        return a if _FLOAT_RANKS[a] >= _FLOAT_RANKS[b] else b
    if fa or fb:
        return a if fa else b
    return a if _INT_RANKS[a] >= _INT_RANKS[b] else b


def _promote(a, b):
    """a and b in their common dtype (SINGA's binary ops take operands of different dtypes: an integer
    mask added to a float one, say); the conversion is recorded by autograd."""
    if a.dtype == b.dtype:
        return a, b
    dt = _common_dtype(a.dtype, b.dtype)
    return (a if a.dtype == dt else _tandem.cast(a, dt)), (b if b.dtype == dt else _tandem.cast(b, dt))


# While a model records its training step (compile(use_graph=True) on a GPU), nothing may wait for the device.
_recording_step = [False]


def _whole_numbers(t, what, kind="labels"):
    """Class labels or indices as an integer tensor: an int32 / int64 tensor as it is, a floating one (SINGA's
    scripts pass labels so) as int32 when every value is a whole number. A fraction (1.7) would be cut to
    another class without a word: it is a ValueError naming the element. The values are read on the host,
    except while a step is recorded (its eager steps before were checked)."""
    if t.dtype in (int32, int64):
        return t
    if t.dtype in _FLOAT_RANKS and not _recording_step[0]:
        a = t.to_numpy().ravel()
        bad = ~np.isfinite(a) | (np.floor(a) != a)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{what}: {kind} must be whole numbers, but element {i} of the "
                             f"{str(t.dtype).split('.')[-1]} {kind} {list(t.shape)} is {float(a[i]):.7g}; give an "
                             "int32 / int64 tensor, or whole numbers")
    return t.as_type(int32)


def _promoting(name):
    cpp = getattr(Tensor, name)

    def op(self, rhs):
        if isinstance(rhs, Tensor) and rhs.dtype != self.dtype:
            self, rhs = _promote(self, rhs)
        return cpp(self, rhs)

    op.__name__ = name
    op.__doc__ = cpp.__doc__
    return op


_BINARY_CPP = {name: getattr(Tensor, name) for name in ("__add__", "__sub__", "__mul__", "__truediv__")}

_ELEMENTWISE_METHODS = {
    "__bool__": _tensor_bool,
    "__pow__": _tensor_pow,
    "__rpow__": _tensor_rpow,
    "__abs__": _tensor_abs,
    "__eq__": _tensor_eq,
    "__ne__": _tensor_ne,
}
for _name, _f in _ELEMENTWISE_METHODS.items():
    setattr(Tensor, _name, _f)
    _METHODS[_name] = _f  # removed again at exit, with the others


for _name in _BINARY_CPP:
    setattr(Tensor, _name, _promoting(_name))


def _uninstall_binary():
    # At exit the C++ operators go back in place of the Python ones, which refer to this module.
    for name, f in _BINARY_CPP.items():
        setattr(Tensor, name, f)


atexit.register(_uninstall_binary)

# ---- reductions, shape and indexing ops, products
def _index_values(key, device):
    """An index key that selects by position (a tensor, a list, an array) as an i32 / i64 tensor."""
    if isinstance(key, Tensor):
        if key.dtype not in (int32, int64):
            raise ValueError(f"a tensor used as an index must hold int32 or int64 values, got {key.dtype}")
        return key.to(device)
    a = np.asarray(key)
    if a.dtype == np.bool_:
        raise ValueError("boolean masks are not supported as indices; use tandem.autograd.nonzero for positions")
    if a.dtype.kind not in "iu":
        raise ValueError(f"indices must be integers, got an array of {a.dtype}")
    return _tandem.from_array(np.ascontiguousarray(a.astype(np.int64)), device, int64)


def _getitem(self, keys):
    """NumPy's basic and integer indexing, recorded by autograd: a slice with any step (a view for a
    positive step, a copy for a negative one), ``...``, ``None`` (a new axis of extent 1), and a tensor,
    list or array of positions (the slices at those positions along that dimension; one such key at most).
    An int keeps its dimension, of extent 1, as SINGA's indexing does (``t[1]`` is ``t[1:2]``)."""
    if not isinstance(keys, tuple):
        keys = (keys,)
    if builtins.sum(k is Ellipsis for k in keys) > 1:  # the module's own sum is SINGA's
        raise ValueError("an index can have only one ellipsis ('...')")
    consumed = builtins.sum(1 for k in keys if k is not None and k is not Ellipsis)
    if consumed > self.dim():
        raise ValueError(f"{consumed} indices for a tensor of {self.dim()} dimensions (shape {self.shape})")
    expanded = []
    for k in keys:
        if k is Ellipsis:
            expanded.extend([slice(None)] * (self.dim() - consumed))
        else:
            expanded.append(k)
    out, axis, fancy = self, 0, 0
    for key in expanded:
        if key is None:
            out = _tandem.unsqueeze(out, [axis])
            axis += 1
            continue
        n = out.shape[axis]
        if isinstance(key, (bool, np.bool_)):
            raise ValueError("a bool is not an index")
        if isinstance(key, (int, np.integer)):
            k = int(key) + n if key < 0 else int(key)
            if not 0 <= k < n:
                raise ValueError(f"index {key} is outside dimension {axis} of extent {n} (shape {self.shape})")
            out = _tandem.slice(out, axis, k, 1)
        elif isinstance(key, slice):
            if key.step == 0:
                raise ValueError(f"slice step cannot be zero (dimension {axis})")
            if key != slice(None):
                start = None if key.start is None else int(key.start)
                stop = None if key.stop is None else int(key.stop)
                out = _tandem.strided_slice(out, axis, start, stop, 1 if key.step is None else int(key.step))
        elif isinstance(key, (Tensor, list, np.ndarray)):
            fancy += 1
            if fancy > 1:
                raise ValueError("at most one tensor, list or array of positions per index")
            idx = _index_values(key, out.device)
            out = _tandem.index_select(out, axis, idx)
            axis += idx.dim() - 1
        else:
            raise ValueError(f"a tensor is indexed by ints, slices, '...', None and integer tensors, lists or "
                             f"arrays, not {type(key).__name__}")
        axis += 1
    return out


def _reshape(self, shape, *more):
    """The same elements in another shape, ``t.reshape((2, -1))`` (SINGA's form) or ``t.reshape(2, -1)``
    (NumPy's): a view where the strides allow. Recorded by autograd."""
    if more:
        shape = (shape,) + more
    elif not isinstance(shape, (tuple, list)):
        shape = (shape,)
    return _tandem.reshape(self, [int(s) for s in shape])


def _transpose(self, axes=None, dim1=None):
    """The dimensions reversed (axes None) or ordered as axes; ``t.transpose(0, 1)`` swaps two
    dimensions. A view, recorded by autograd."""
    if dim1 is not None:
        return _tandem.transpose(self, int(axes), int(dim1))
    if axes is None:
        perm = list(range(self.dim()))[::-1]
    else:
        perm = list(axes)
        if len(perm) != self.dim():
            raise ValueError(f"transpose: {len(perm)} axes for a tensor of {self.dim()} dimensions")
    return _tandem.permute(self, perm)


def _T(self):
    """``t.T()``, SINGA's method: the dimensions reversed (a 2-d tensor's transpose), as a view that shares
    the tensor's memory."""
    return _transpose(self)


_METHODS.update({
    "__getitem__": _getitem,
    "reshape": _reshape,
    "transpose": _transpose,
    "T": _T,
})
_install()

# ---- softmax, normalisation, losses, attention

# ---- embedding, recurrent networks

#: SINGA's name for a tensor given to ``compile`` as a model's input (an alias of Tensor there too).
PlaceHolder = Tensor
