"""SINGA's ``singa_wrap`` (its compiled module), for scripts that import it: ``NcclIdHolder``, the
multiprocessing ticket, and the tensor functions SINGA's Python operators and optimizers call on raw
tensors (``singa.Axpy(alpha.data, x.data, y.data)``, ``singa.SumAll(x)``, ...). In tandem ``t.data`` is
the tensor itself, so these take and return tandem tensors. As SINGA's, they record no graph: they are
for the insides of an ``autograd.Operator``'s forward and backward and of an optimizer's ``apply``.

Axpy(alpha, x, y)          y += alpha * x in place (alpha a number or a one-element tensor)
SumAll(x)                  the sum of every element, a tensor of shape (1,)
Sum(x, axis)               the sum over one axis (that axis removed)
Mult(a, b)                 the matrix product
__add__ __sub__ __mul__ __div__ (a, b)     elementwise, broadcast as NumPy's
AddFloat SubFloat MultFloat DivFloat PowFloat (x, v)   x + v, x - v, x * v, x / v, x ** v
LTFloat LEFloat GTFloat GEFloat (x, v)     1 where x < v (<=, >, >=), else 0, in x's dtype
Pow(a, b), Abs Ceil Cos Cosh Erf Exp Floor Log ReLU Round RoundE Sigmoid Sign Sin Sinh Sqrt Square Tan Tanh (x)
Transpose(x, axes), DefaultTranspose(x) (the dimensions reversed), Reshape(x, shape)
"""
from . import _tandem
from .distributed import NcclIdHolder

__all__ = ["NcclIdHolder", "Axpy", "SumAll", "Sum", "Mult", "Pow", "Transpose", "DefaultTranspose", "Reshape",
           "__add__", "__sub__", "__mul__", "__div__"]


def _raw(fn):
    """fn with graph recording off (SINGA's CTensor functions have no autograd)."""

    def run(*args):
        with _tandem.no_grad():
            return fn(*args)

    run.__name__ = fn.__name__
    return run


def _scalar(alpha):
    return float(alpha.item()) if isinstance(alpha, _tandem.Tensor) else float(alpha)


@_raw
def Axpy(alpha, x, y):  # noqa: N802 - SINGA's names
    y += x * _scalar(alpha)


@_raw
def SumAll(x):  # noqa: N802
    return _tandem.reshape(_tandem.sum(x), [1])


@_raw
def Sum(x, axis):  # noqa: N802
    return _tandem.sum_dims(x, [int(axis)], False)


@_raw
def Mult(a, b):  # noqa: N802
    return _tandem.matmul(a, b)


@_raw
def Pow(a, b):  # noqa: N802
    return _tandem.pow(a, b)


@_raw
def Transpose(x, axes):  # noqa: N802
    return _tandem.permute(x, [int(a) for a in axes]).contiguous()


@_raw
def DefaultTranspose(x):  # noqa: N802
    return _tandem.permute(x, list(range(x.dim()))[::-1]).contiguous()


@_raw
def Reshape(x, shape):  # noqa: N802
    return _tandem.reshape(x, [int(s) for s in shape])


def _binary(fn, name):
    f = _raw(fn)
    f.__name__ = name
    return f


__add__ = _binary(lambda a, b: a + b, "__add__")
__sub__ = _binary(lambda a, b: a - b, "__sub__")
__mul__ = _binary(lambda a, b: a * b, "__mul__")
__div__ = _binary(lambda a, b: a / b, "__div__")

_WITH_FLOAT = {
    "AddFloat": lambda x, v: x + float(v),
    "SubFloat": lambda x, v: x - float(v),
    "MultFloat": lambda x, v: x * float(v),
    "DivFloat": lambda x, v: x / float(v),
    "PowFloat": lambda x, v: _tandem.pow(x, _tandem.full([1], float(v), x.device, x.dtype)),
    "LTFloat": lambda x, v: _tandem.cast(_tandem.less(x, _tandem.full([1], float(v), x.device, x.dtype)), x.dtype),
    "LEFloat": lambda x, v: _tandem.cast(_tandem.less_equal(x, _tandem.full([1], float(v), x.device, x.dtype)),
                                         x.dtype),
    "GTFloat": lambda x, v: _tandem.cast(_tandem.greater(x, _tandem.full([1], float(v), x.device, x.dtype)),
                                         x.dtype),
    "GEFloat": lambda x, v: _tandem.cast(_tandem.greater_equal(x, _tandem.full([1], float(v), x.device, x.dtype)),
                                         x.dtype),
}
_UNARY = {"Abs": _tandem.abs, "Ceil": _tandem.ceil, "Cos": _tandem.cos, "Cosh": _tandem.cosh, "Erf": _tandem.erf,
          "Exp": _tandem.exp, "Floor": _tandem.floor, "Log": _tandem.log, "ReLU": _tandem.relu,
          "Round": _tandem.round, "RoundE": _tandem.rounde, "Sigmoid": _tandem.sigmoid, "Sign": _tandem.sign, "Sin": _tandem.sin,
          "Sinh": _tandem.sinh, "Sqrt": _tandem.sqrt, "Square": lambda x: x * x, "Tan": _tandem.tan,
          "Tanh": _tandem.tanh}
for _name, _fn in list(_WITH_FLOAT.items()) + list(_UNARY.items()):
    globals()[_name] = _binary(_fn, _name)
    __all__.append(_name)
del _name, _fn
