"""SINGA's elementwise operators and functions on tandem (tandem.autograd): signatures as SINGA declares
them, values against NumPy, gradients against finite differences, SINGA's Max/Min with the incoming
gradient, the Tensor operators with tensors and numbers on either side, and the activation layers."""
import inspect
import math

import numpy as np
import pytest

from tandem import autograd, layer, tensor

REQUIRED = inspect.Parameter.empty

# (name, [(parameter, default or REQUIRED)]) as python/singa/autograd.py declares them.
SINGA_FUNCTIONS = [
    ("abs", [("a", REQUIRED)]), ("exp", [("a", REQUIRED)]), ("leakyrelu", [("x", REQUIRED), ("a", 0.01)]),
    ("sign", [("a", REQUIRED)]), ("pow", [("a", REQUIRED), ("b", REQUIRED)]), ("softsign", [("x", REQUIRED)]),
    ("sqrt", [("x", REQUIRED)]), ("softplus", [("x", REQUIRED)]), ("min", [("*l", REQUIRED)]),
    ("max", [("*l", REQUIRED)]), ("log", [("x", REQUIRED)]),
    ("hardsigmoid", [("x", REQUIRED), ("alpha", 0.2), ("gamma", 0.5)]), ("div", [("a", REQUIRED), ("b", REQUIRED)]),
    ("_and", [("a", REQUIRED), ("b", REQUIRED)]), ("_or", [("a", REQUIRED), ("b", REQUIRED)]),
    ("_not", [("x", REQUIRED)]), ("_xor", [("a", REQUIRED), ("b", REQUIRED)]), ("negative", [("x", REQUIRED)]),
    ("reciprocal", [("x", REQUIRED)]), ("ceil", [("x", REQUIRED)]), ("floor", [("x", REQUIRED)]),
    ("cast", [("x", REQUIRED), ("to", REQUIRED)]), ("round", [("x", REQUIRED)]), ("rounde", [("x", REQUIRED)]),
    ("erf", [("x", REQUIRED)]), ("clip", [("x", REQUIRED), ("min", None), ("max", None)]),
    ("prelu", [("x", REQUIRED), ("slope", REQUIRED)]), ("elu", [("x", REQUIRED), ("alpha", 1)]),
    ("selu", [("x", REQUIRED), ("alpha", 1.67326), ("gamma", 1.0507)]), ("sum", [("*l", REQUIRED)]),
    ("mean", [("*l", REQUIRED)]), ("less", [("x", REQUIRED), ("y", REQUIRED)]),
    ("greater", [("x", REQUIRED), ("y", REQUIRED)]), ("equal", [("x", REQUIRED), ("y", REQUIRED)]),
    ("where", [("x", REQUIRED), ("y", REQUIRED), ("condition", REQUIRED)]),
] + [(n, [("x", REQUIRED)]) for n in ("relu", "tanh", "sigmoid", "cos", "cosh", "acos", "acosh", "sin", "sinh",
                                       "asin", "asinh", "tan", "atan", "atanh")]
SINGA_CLASSES = [
    ("LeakyRelu", [("a", REQUIRED)]), ("Clip", [("min", REQUIRED), ("max", REQUIRED)]), ("Elu", [("alpha", 1.)]),
    ("SeLU", [("alpha", 1.67326), ("gamma", 1.0507)]), ("HardSigmoid", [("alpha", 0.2), ("gamma", 0.5)]),
    ("Cast", [("to", REQUIRED)]), ("Where", [("condition", REQUIRED)]),
] + [(n, []) for n in ("Abs", "Exp", "Sign", "Pow", "SoftSign", "Sqrt", "SoftPlus", "Min", "Max", "Log", "Div",
                       "And", "Or", "Not", "Xor", "Negative", "Reciprocal", "Ceil", "Floor", "Round", "Rounde", "Erf",
                       "PRelu", "Less", "Greater", "Equal", "Sum", "Mean", "ReLU", "Tanh", "Sigmoid", "Cos", "Cosh",
                       "Acos", "Acosh", "Sin", "Sinh", "Asin", "Asinh", "Tan", "Atan", "Atanh", "Add", "Sub", "Mul")]


def parameters(fn):
    out = []
    for p in inspect.signature(fn).parameters.values():
        if p.name == "self":
            continue
        out.append(("*" + p.name if p.kind == p.VAR_POSITIONAL else p.name, p.default))
    return out


@pytest.mark.parametrize("name,expected", SINGA_FUNCTIONS + SINGA_CLASSES)
def test_names_and_signatures_are_singas(name, expected):
    fn = getattr(autograd, name, None)
    assert fn is not None, f"autograd.{name} is missing"
    got = parameters(fn.__init__ if inspect.isclass(fn) else fn)
    if inspect.isclass(fn) and not expected:
        got = [(n, d) for n, d in got if n != "name"]  # Operator's optional name
    assert [n for n, _ in got[:len(expected)]] == [n for n, _ in expected], f"{name}: {got}"
    for (n, d), (_, e) in zip(got, expected):
        assert d == e or d is e, f"{name}: default of {n} is {d!r}, SINGA's is {e!r}"
    for n, d in got[len(expected):]:
        assert d is not REQUIRED or n.startswith("*"), f"{name}: extra parameter {n} needs a default"


def t32(a):
    return tensor.from_numpy(np.asarray(a, dtype=np.float32))


def t64(a, grad=False):
    return tensor.Tensor(data=np.asarray(a, dtype=np.float64), dtype=tensor.float64, stores_grad=grad)


RNG = np.random.RandomState(5)
X = RNG.uniform(-1, 1, (2, 3)).astype(np.float32)
POS = RNG.uniform(0.2, 2, (2, 3)).astype(np.float32)
UNIT = RNG.uniform(-0.9, 0.9, (2, 3)).astype(np.float32)
BIG = RNG.uniform(1.2, 3, (2, 3)).astype(np.float32)
ERF = np.vectorize(math.erf)

# (function, input, NumPy's value)
VALUES = [
    (autograd.abs, X, np.abs(X)), (autograd.exp, X, np.exp(X)), (autograd.sign, X, np.sign(X)),
    (autograd.sqrt, POS, np.sqrt(POS)), (autograd.log, POS, np.log(POS)), (autograd.reciprocal, POS, 1 / POS),
    (autograd.negative, X, -X), (autograd.softsign, X, X / (1 + np.abs(X))),
    (autograd.softplus, X, np.log1p(np.exp(X))), (autograd.erf, X, ERF(X)),
    (autograd.sin, X, np.sin(X)), (autograd.cos, X, np.cos(X)), (autograd.tan, X, np.tan(X)),
    (autograd.asin, UNIT, np.arcsin(UNIT)), (autograd.acos, UNIT, np.arccos(UNIT)), (autograd.atan, X, np.arctan(X)),
    (autograd.sinh, X, np.sinh(X)), (autograd.cosh, X, np.cosh(X)), (autograd.asinh, X, np.arcsinh(X)),
    (autograd.acosh, BIG, np.arccosh(BIG)), (autograd.atanh, UNIT, np.arctanh(UNIT)),
    (autograd.ceil, 3 * X, np.ceil(3 * X)), (autograd.floor, 3 * X, np.floor(3 * X)),
    (autograd.relu, X, np.maximum(X, 0)), (autograd.sigmoid, X, 1 / (1 + np.exp(-X))), (autograd.tanh, X, np.tanh(X)),
    (autograd.leakyrelu, X, np.where(X > 0, X, 0.01 * X)),
    (lambda x: autograd.leakyrelu(x, a=0.3), X, np.where(X > 0, X, 0.3 * X)),
    (autograd.elu, X, np.where(X > 0, X, np.expm1(X))),
    (lambda x: autograd.elu(x, alpha=0.5), X, np.where(X > 0, X, 0.5 * np.expm1(X))),
    (autograd.selu, X, 1.0507 * np.where(X > 0, X, 1.67326 * np.expm1(X))),
    (autograd.hardsigmoid, 4 * X, np.clip(0.2 * 4 * X + 0.5, 0, 1)),
    (lambda x: autograd.hardsigmoid(x, 0.5, 0.1), 4 * X, np.clip(0.5 * 4 * X + 0.1, 0, 1)),
    (autograd.clip, X, X), (lambda x: autograd.clip(x, -0.2, 0.3), X, np.clip(X, -0.2, 0.3)),
    (lambda x: autograd.clip(x, min=0), X, np.maximum(X, 0)), (lambda x: autograd.clip(x, max=0.1), X, np.minimum(X, 0.1)),
    (autograd._not, np.round(X), (np.round(X) == 0).astype(np.float32)),
    (autograd.gelu, X, 0.5 * X * (1 + ERF(X / math.sqrt(2)))),
    (lambda x: autograd.gelu(x, "tanh"), X,
     0.5 * X * (1 + np.tanh(math.sqrt(2 / math.pi) * (X + 0.044715 * X ** 3)))),
    (autograd.silu, X, X / (1 + np.exp(-X))),
]


@pytest.mark.parametrize("i", range(len(VALUES)))
def test_values_match_numpy(i):
    fn, x, want = VALUES[i]
    np.testing.assert_allclose(fn(t32(x)).to_numpy(), want, rtol=2e-5, atol=2e-6)


def test_rounding_at_halves():
    h = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 0.4], dtype=np.float32)
    np.testing.assert_array_equal(autograd.round(t32(h)).to_numpy(), [1, 2, 3, -1, -2, 0])  # SINGA's Round
    np.testing.assert_array_equal(autograd.rounde(t32(h)).to_numpy(), np.round(h))  # to even, as NumPy
    assert autograd.round(2.5) == round(2.5) and autograd.abs(-3) == 3 and autograd.pow(2, 3) == 8
    assert autograd.max(3, 7) == 7 and autograd.min([4, 2]) == 2  # numbers: Python's


def test_binary_ops_broadcast_as_numpy():
    a, b = X, RNG.uniform(-1, 1, (3,)).astype(np.float32)
    ta, tb = t32(a), t32(b)
    close = np.testing.assert_allclose
    close(autograd.pow(t32(POS), tb).to_numpy(), POS ** b, rtol=1e-5)
    close(autograd.pow(t32(POS), 2.5).to_numpy(), POS ** 2.5, rtol=1e-5)
    close(autograd.pow(2.0, ta).to_numpy(), 2.0 ** a, rtol=1e-5)
    close(autograd.max(ta, tb).to_numpy(), np.maximum(a, b))
    close(autograd.max(ta, tb, t32(np.zeros((2, 1)))).to_numpy(), np.maximum(np.maximum(a, b), 0))
    close(autograd.min(ta, tb).to_numpy(), np.minimum(a, b))
    close(autograd.Max()(ta)[0].to_numpy(), a)
    close(autograd.prelu(ta, t32([0.1, 0.2, 0.3])).to_numpy(), np.where(a > 0, a, a * [0.1, 0.2, 0.3]), rtol=1e-6)
    close(autograd.less(ta, tb).to_numpy(), (a < b).astype(np.float32))
    close(autograd.greater(ta, tb).to_numpy(), (a > b).astype(np.float32))
    close(autograd.equal(ta, ta).to_numpy(), np.ones_like(a))
    close(autograd.less_equal(ta, tb).to_numpy(), (a <= b).astype(np.float32))
    close(autograd.greater_equal(ta, tb).to_numpy(), (a >= b).astype(np.float32))
    close(autograd.not_equal(ta, tb).to_numpy(), (a != b).astype(np.float32))
    p, q = np.array([[0.0, 1.0, 2.0]], dtype=np.float32), np.array([[0.0], [3.0]], dtype=np.float32)
    close(autograd._and(t32(p), t32(q)).to_numpy(), np.logical_and(p, q).astype(np.float32))
    close(autograd._or(t32(p), t32(q)).to_numpy(), np.logical_or(p, q).astype(np.float32))
    close(autograd._xor(t32(p), t32(q)).to_numpy(), np.logical_xor(p, q).astype(np.float32))
    close(autograd.where(ta, tb, [[True], [False]]).to_numpy(), np.where([[True], [False]], a, b))
    close(autograd.where(ta, tb, t32(a > 0)).to_numpy(), np.where(a > 0, a, b))
    close(autograd.sum(ta, tb, t32([[1.0], [2.0]])).to_numpy(), a + b + [[1.0], [2.0]], rtol=1e-6)
    close(autograd.mean(ta, tb).to_numpy(), (a + b) / 2, rtol=1e-6)


def test_cast_takes_singas_codes_and_dtypes():
    x = t32([1.7, -2.2])
    assert autograd.cast(x, 2).dtype == tensor.int32
    np.testing.assert_array_equal(autograd.cast(x, 2).to_numpy(), [1, -2])
    assert autograd.cast(x, 4).dtype == tensor.float64
    assert autograd.cast(x, tensor.float16).dtype == tensor.float16
    assert autograd.Cast("float64")(x)[0].dtype == tensor.float64
    with pytest.raises(ValueError, match="cast"):
        autograd.cast(x, 99)
    w = t64([3.0, 5.0], grad=True)
    autograd.cast(autograd.cast(w, 0), tensor.float64).backward(t64([1.0, 2.0]))
    assert w.grad.dtype == tensor.float64
    np.testing.assert_array_equal(w.grad.to_numpy(), [1.0, 2.0])


def numeric_grad(fn, xs, i, dy, eps=1e-6):
    """d sum(fn(xs) * dy) / d xs[i] by central differences (f64)."""
    base = [x.copy() for x in xs]
    g = np.zeros_like(base[i])
    for j in np.ndindex(*base[i].shape):
        vals = []
        for s in (1, -1):
            pert = [x.copy() for x in base]
            pert[i][j] += s * eps
            with autograd.no_grad():
                vals.append(float(np.sum(fn(*[t64(p) for p in pert]).to_numpy() * dy)))
        g[j] = (vals[0] - vals[1]) / (2 * eps)
    return g


def check_grads(fn, *arrays):
    xs = [np.asarray(a, dtype=np.float64) for a in arrays]
    leaves = [t64(x, grad=True) for x in xs]
    y = fn(*leaves)
    dy = np.random.RandomState(1).uniform(-1, 1, y.shape)
    y.backward(t64(dy))
    for i, leaf in enumerate(leaves):
        np.testing.assert_allclose(leaf.grad.to_numpy(), numeric_grad(fn, xs, i, dy), rtol=1e-6, atol=1e-8,
                                   err_msg=f"gradient of input {i}")


GRADS = [
    (autograd.abs, [X]), (autograd.exp, [X]), (autograd.sqrt, [POS]), (autograd.log, [POS]),
    (autograd.reciprocal, [POS]), (autograd.negative, [X]), (autograd.softsign, [X]), (autograd.softplus, [X]),
    (autograd.erf, [X]), (autograd.sin, [X]), (autograd.cos, [X]), (autograd.tan, [X]), (autograd.asin, [UNIT]),
    (autograd.acos, [UNIT]), (autograd.atan, [X]), (autograd.sinh, [X]), (autograd.cosh, [X]),
    (autograd.asinh, [X]), (autograd.acosh, [BIG]), (autograd.atanh, [UNIT]), (autograd.leakyrelu, [X]),
    (autograd.elu, [X]), (autograd.selu, [X]), (autograd.hardsigmoid, [4 * X]), (autograd.gelu, [X]),
    (autograd.silu, [X]), (lambda x: autograd.clip(x, -0.5, 0.4), [X]), (autograd.sign, [X]),
    (autograd.ceil, [3 * X]), (autograd.floor, [3 * X]), (autograd.round, [3 * X]), (autograd.rounde, [3 * X]),
    (autograd.pow, [POS, X[0]]), (lambda a: autograd.pow(a, 3.0), [X]), (lambda a: autograd.pow(1.5, a), [X]),
    (autograd.max, [X, X[0] * 0.5, X[:, :1] + 0.1]), (autograd.min, [X, X[0] * 0.5]), (autograd.prelu, [X, POS[0]]),
    (lambda a, b: autograd.where(a, b, [[True, False, True]]), [X, X[1]]), (autograd.sum, [X, X[0]]),
    (autograd.mean, [X, X[:, :1]]), (autograd.div, [X, POS]), (autograd.sub, [X, X[0]]),
]


@pytest.mark.parametrize("i", range(len(GRADS)))
def test_gradients_match_finite_differences(i):
    fn, arrays = GRADS[i]
    check_grads(fn, *arrays)


def test_max_and_min_pass_the_incoming_gradient_and_split_ties():
    a, b = t64([1.0, 2.0, 3.0], grad=True), t64([1.0, 1.0, 4.0], grad=True)
    autograd.max(a, b).backward(t64([2.0, 3.0, 5.0]))  # SINGA's would hand back its masks, ignoring dy
    np.testing.assert_array_equal(a.grad.to_numpy(), [1.0, 3.0, 0.0])
    np.testing.assert_array_equal(b.grad.to_numpy(), [1.0, 0.0, 5.0])
    c, d = t64([1.0, 2.0], grad=True), t64([1.0, 0.0], grad=True)
    autograd.Min()(c, d)[0].backward(t64([4.0, 4.0]))
    np.testing.assert_array_equal(c.grad.to_numpy(), [2.0, 0.0])
    np.testing.assert_array_equal(d.grad.to_numpy(), [2.0, 4.0])


def test_tensor_operators_take_numbers_on_either_side():
    a = RNG.uniform(0.5, 2, (2, 3)).astype(np.float32)
    b = RNG.uniform(0.5, 2, (3,)).astype(np.float32)
    ta, tb = t32(a), t32(b)
    close = lambda t, want: np.testing.assert_allclose(t.to_numpy(), want, rtol=1e-5)  # noqa: E731
    close(ta + tb, a + b), close(ta + 2, a + 2), close(2 + ta, 2 + a)
    close(ta - tb, a - b), close(ta - 2, a - 2), close(2 - ta, 2 - a)
    close(ta * tb, a * b), close(ta * 2, a * 2), close(2 * ta, 2 * a)
    close(ta / tb, a / b), close(ta / 2, a / 2), close(2 / ta, 2 / a)
    close(ta ** tb, a ** b), close(ta ** 2, a ** 2), close(2 ** ta, 2 ** a), close(ta ** 0.5, a ** 0.5)
    close(-ta, -a), close(abs(t32(-a)), a)
    close(ta < tb, a < b), close(ta <= 1, a <= 1), close(ta > tb, a > b), close(ta >= 1, a >= 1)
    close(1 < ta, 1 < a), close(1 >= ta, 1 >= a)
    close(ta == ta, np.ones_like(a)), close(ta == 1, a == 1), close(ta != tb, a != b), close(ta != 1, a != 1)
    close(tensor.pow(ta, 2), a ** 2), close(tensor.abs(t32(-a)), a), close(tensor.sqrt(ta), np.sqrt(a))
    close(tensor.sign(t32(a - 1)), np.sign(a - 1)), close(tensor.ceil(ta), np.ceil(a)), close(tensor.ne(ta, 1), a != 1)
    # Not tensors nor numbers: Python's own comparison (identity); tensors keep hashing by identity.
    assert (ta == None) is False and (ta != "x") is True  # noqa: E711
    assert ta in [ta] and {ta: 1, tb: 2}[tb] == 2
    # A mask of several elements has no truth value (as NumPy's); one element has. Other tensors are
    # true, as SINGA's (`if labels:` tells a tensor from None).
    assert ta and t32([0.0])
    with pytest.raises(ValueError, match="ambiguous"):
        bool(ta == ta)
    with pytest.raises(ValueError, match="ambiguous"):
        tb in [ta]  # noqa: B015
    assert bool(t32([2.0]) == 2) and not (t32([1.0]) > 2)


def test_tensor_operators_record_gradients():
    a = np.array([0.5, 1.5, 2.0])
    x = t64(a, grad=True)
    y = (2 - x) ** 2 / x + 3 ** x - abs(-x) * 0.5
    y.backward(t64(np.ones(3)))
    want = (-2 * (2 - a) * a - (2 - a) ** 2) / a ** 2 + np.log(3) * 3 ** a - 0.5
    np.testing.assert_allclose(x.grad.to_numpy(), want, rtol=1e-10)


def test_errors_name_the_op_and_shapes():
    with pytest.raises(ValueError, match=r"maximum.*\[2, 3\].*\[4\].*axis 1"):
        autograd.max(t32(X), t32(np.zeros(4)))
    with pytest.raises(ValueError, match="pow: operands must be floating"):
        autograd.pow(tensor.from_numpy(np.ones(3, dtype=np.int32)), tensor.from_numpy(np.ones(3, dtype=np.int32)))
    with pytest.raises(ValueError, match="gelu: approximate"):
        autograd.gelu(t32(X), "fast")


def test_activation_layers():
    x = t32(X)
    close = np.testing.assert_allclose
    close(layer.Tanh()(x).to_numpy(), np.tanh(X), rtol=1e-6)
    close(layer.LeakyRelu(0.2)(x).to_numpy(), np.where(X > 0, X, 0.2 * X), rtol=1e-6)
    close(layer.Elu()(x).to_numpy(), np.where(X > 0, X, np.expm1(X)), rtol=1e-6)
    close(layer.SeLU()(x).to_numpy(), 1.0507 * np.where(X > 0, X, 1.67326 * np.expm1(X)), rtol=1e-6)
    close(layer.SoftPlus()(x).to_numpy(), np.log1p(np.exp(X)), rtol=1e-6)
    close(layer.SoftSign()(x).to_numpy(), X / (1 + np.abs(X)), rtol=1e-6)
    close(layer.HardSigmoid()(x).to_numpy(), np.clip(0.2 * X + 0.5, 0, 1), rtol=1e-6)
    close(layer.Gelu()(x).to_numpy(), 0.5 * X * (1 + ERF(X / math.sqrt(2))), rtol=1e-5)
    close(layer.Silu()(x).to_numpy(), X / (1 + np.exp(-X)), rtol=1e-6)
    close(layer.ReLU()(x).to_numpy(), np.maximum(X, 0))
    close(layer.Sigmoid()(x).to_numpy(), 1 / (1 + np.exp(-X)), rtol=1e-6)


def test_prelu_layer_trains_one_slope_per_channel():
    x4 = RNG.uniform(-1, 1, (2, 3, 2, 2)).astype(np.float32)
    p = layer.PRelu(3, init=0.1)
    y = p(t32(x4))
    np.testing.assert_allclose(y.to_numpy(), np.where(x4 > 0, x4, 0.1 * x4), rtol=1e-6)
    params = p.get_params()
    assert list(params) == ["slope"] and params["slope"].shape == (3,)
    y.backward(t32(np.ones(x4.shape)))
    want = np.where(x4 > 0, 0, x4).sum(axis=(0, 2, 3))
    np.testing.assert_allclose(params["slope"].grad.to_numpy(), want, rtol=1e-5)
    with pytest.raises(ValueError, match="PRelu"):
        layer.PRelu(4)(t32(x4))
