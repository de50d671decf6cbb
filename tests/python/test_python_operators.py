"""SINGA's ways of writing operations and optimizers in Python: Operator subclasses with forward and
backward on raw tensors, the singa_wrap functions they call, and Optimizer subclasses that step each
parameter in apply() (as SINGA's model-selection examples do). Gradients are checked against finite
differences and the optimizer against tandem's own SGD."""
import numpy as np
import pytest

import tandem
from tandem import autograd, layer, model, opt, tensor
from tandem import singa_wrap as singa
from test_singa_api import Tiny

needs_gpu = pytest.mark.skipif(tandem.device.get_num_gpus() == 0, reason="no CUDA GPU")


def param(a, dev=None):
    t = tensor.Tensor(a.shape, dev, tensor.float64 if a.dtype == np.float64 else tensor.float32,
                      requires_grad=True, stores_grad=True)
    t.copy_from_numpy(a)
    return t


class Cube(autograd.Operator):
    """x ** 3 with the derivative written by hand, as SINGA's operators are."""

    def forward(self, x):
        self.x = x
        return singa.PowFloat(x, 3.0)

    def backward(self, dy):
        return singa.__mul__(singa.MultFloat(singa.Square(self.x), 3.0), dy)


class SumError(autograd.Operator):
    """SINGA's model-selection example's loss: the sum of every element, its gradient made with NumPy."""

    def forward(self, x):
        self.shape = x.shape
        return singa.SumAll(x)

    def backward(self, dy=1.0):
        dx = tensor.Tensor(self.shape, tandem.device.get_default_device(), tensor.float32)
        dx.copy_from_numpy(np.ones(self.shape))
        dx *= dy
        return dx


class SplitMul(autograd.Operator):
    """Two outputs (a * b and a + b) and an input that takes no gradient (None)."""

    def forward(self, a, b, mask):
        self.a, self.b = a, b
        return singa.__mul__(a, b), singa.__add__(a, b)

    def backward(self, d_prod, d_sum):
        return singa.__add__(singa.__mul__(d_prod, self.b), d_sum), \
            singa.__add__(singa.__mul__(d_prod, self.a), d_sum), None


def numeric_grad(f, a, eps=1e-6):
    g = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        hi, lo = a.copy(), a.copy()
        hi[i] += eps
        lo[i] -= eps
        g[i] = (f(hi) - f(lo)) / (2 * eps)
    return g


def test_python_operator_gradients_match_finite_differences():
    rng = np.random.default_rng(0)
    a0 = rng.standard_normal((3, 4))
    w0 = rng.standard_normal((4, 2))

    def loss_of(a, w):  # tandem ops before and after the Python operator
        y = Cube()(autograd.matmul(a, w))[0]
        return autograd.reduce_mean(autograd.tanh(y), [0, 1], keepdims=0)

    a, w = param(a0), param(w0)
    loss = loss_of(a, w)
    grads = {id(p): g.to_numpy() for p, g in autograd.backward(loss)}
    assert len(grads) == 2
    np_loss = lambda a_, w_: np.tanh((a_ @ w_) ** 3).mean()  # noqa: E731
    np.testing.assert_allclose(a.grad.to_numpy(), numeric_grad(lambda x: np_loss(x, w0), a0), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(w.grad.to_numpy(), numeric_grad(lambda x: np_loss(a0, x), w0), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(loss.to_numpy(), np_loss(a0, w0), rtol=1e-12)


def test_two_outputs_and_an_input_without_gradient():
    rng = np.random.default_rng(1)
    a0, b0 = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    a, b = param(a0), param(b0)
    mask = tensor.from_numpy(np.ones((2, 3)), dtype=tensor.float64)
    prod, total = SplitMul()(a, b, mask)
    # Both outputs reach the loss: d/da = 2 * b * (a * b) + 3, d/db = 2 * a * (a * b) + 3.
    loss = autograd.reduce_sum(prod * prod + total * 3.0, [0, 1], keepdims=0)
    list(autograd.backward(loss))
    np.testing.assert_allclose(a.grad.to_numpy(), 2 * b0 * a0 * b0 + 3, rtol=1e-12)
    np.testing.assert_allclose(b.grad.to_numpy(), 2 * a0 * a0 * b0 + 3, rtol=1e-12)
    # Only one output used: the other's gradient is zeros.
    a2, b2 = param(a0), param(b0)
    _, total2 = SplitMul()(a2, b2, mask)
    list(autograd.backward(autograd.reduce_sum(total2, [0, 1], keepdims=0)))
    np.testing.assert_allclose(a2.grad.to_numpy(), np.ones((2, 3)))


def test_sum_error_trains_a_model_as_singas_example():
    """SumError's gradient (made on the CPU in float32) reaches the linear layer's parameters."""
    dev = tandem.device.get_default_device()

    class Net(model.Model):
        def __init__(self):
            super().__init__()
            self.fc = layer.Linear(3)

        def forward(self, x):
            return self.fc(x)

        def train_one_batch(self, x, y):
            loss = SumError()(self.forward(x))[0]
            self.optimizer(loss)
            return loss

    x = tensor.from_numpy(np.arange(8, dtype=np.float32).reshape(4, 2), dev)
    net = Net()
    net.set_optimizer(opt.SGD(lr=0.01))
    net.compile([x], is_train=True)
    w0 = net.fc.W.to_numpy().copy()
    b0 = net.fc.b.to_numpy().copy()
    loss = net(x, None)
    assert loss.shape == (1,)
    # d(sum of the outputs)/dW = the column sums of x, for every output (tandem's weight is [out, in]);
    # /db = the batch size.
    assert w0.shape == (3, 2)
    np.testing.assert_allclose(net.fc.W.to_numpy(), w0 - 0.01 * x.to_numpy().sum(0)[None, :], rtol=1e-6)
    np.testing.assert_allclose(net.fc.b.to_numpy(), b0 - 0.01 * 4, rtol=1e-6)


def test_operator_mistakes_are_reported():
    a = param(np.ones((2, 2)))

    class WrongCount(autograd.Operator):
        def forward(self, x):
            return singa.MultFloat(x, 2.0)

        def backward(self, dy):
            return dy, dy

    class WrongShape(autograd.Operator):
        def forward(self, x):
            return singa.SumAll(x)

        def backward(self, dy):
            return dy

    class Raises(autograd.Operator):
        def forward(self, x):
            return singa.MultFloat(x, 2.0)

        def backward(self, dy):
            raise KeyError("from the operator's backward")

    class NotATensor(autograd.Operator):
        def forward(self, x):
            return 3.0

    class NoBackward(autograd.Operator):
        def forward(self, x):
            return singa.MultFloat(x, 2.0)

    for op, err, match in ((WrongCount, ValueError, "gave 2 gradient"), (WrongShape, ValueError, r"has shape \[1\]"),
                           (Raises, KeyError, "from the operator's backward"),
                           (NoBackward, NotImplementedError, "must define backward")):
        y = op()(a)[0]
        with pytest.raises(err, match=match):
            list(autograd.backward(autograd.reduce_sum(y, [0, 1], keepdims=0) if y.size() > 1 else y))
    with pytest.raises(TypeError, match="must return tensors"):
        NotATensor()(a)
    with pytest.raises(NotImplementedError, match="must define forward"):
        autograd.Operator()(a)


def test_gradient_dtype_is_converted_and_no_graph_without_grad():
    class Doubler(autograd.Operator):
        def forward(self, x):
            return singa.MultFloat(x, 2.0)

        def backward(self, dy):
            return tensor.from_numpy(np.full(dy.shape, 2.0), dtype=tensor.float64)  # float64 for a float32 input

    a = param(np.ones((2, 2), np.float32))
    y = Doubler()(a)[0]
    assert y.requires_grad
    list(autograd.backward(autograd.reduce_sum(y, [0, 1], keepdims=0)))
    assert a.grad.dtype == tensor.float32
    np.testing.assert_array_equal(a.grad.to_numpy(), np.full((2, 2), 2.0))
    with autograd.no_grad():
        assert not Doubler()(a)[0].requires_grad
    plain = tensor.from_numpy(np.ones(3, np.float32))
    assert not Doubler()(plain)[0].requires_grad  # no input needs a gradient


def test_singa_wrap_functions_against_numpy():
    rng = np.random.default_rng(2)
    x0, y0 = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    x, y = param(x0), tensor.from_numpy(y0)
    close = lambda t, want: np.testing.assert_allclose(t.to_numpy(), want, rtol=1e-6, atol=1e-6)  # noqa: E731
    s = singa.SumAll(x)
    assert s.shape == (1,) and not s.requires_grad  # raw functions record no graph
    close(s, [x0.sum()])
    close(singa.Sum(x, 1), x0.sum(1))
    close(singa.Mult(x, singa.DefaultTranspose(y)), x0 @ y0.T)
    close(singa.Transpose(x, (1, 0)), x0.T)
    close(singa.Reshape(x, (4, 3)), x0.reshape(4, 3))
    close(singa.__sub__(x, y), x0 - y0)
    close(singa.__div__(x, y), x0 / y0)
    close(singa.AddFloat(x, 1.5), x0 + 1.5)
    close(singa.SubFloat(x, 1.5), x0 - 1.5)
    close(singa.DivFloat(x, 2.0), x0 / 2)
    close(singa.PowFloat(singa.Abs(x), 0.5), np.abs(x0) ** 0.5)
    close(singa.Pow(singa.Abs(x), singa.Abs(y)), np.abs(x0) ** np.abs(y0))
    close(singa.GTFloat(x, 0.1), (x0 > 0.1).astype(np.float32))
    close(singa.GEFloat(x, 0.1), (x0 >= 0.1).astype(np.float32))
    close(singa.LTFloat(x, 0.1), (x0 < 0.1).astype(np.float32))
    close(singa.LEFloat(x, 0.1), (x0 <= 0.1).astype(np.float32))
    for name, fn in (("Exp", np.exp), ("Square", np.square), ("ReLU", lambda v: np.maximum(v, 0)),
                     ("Sign", np.sign), ("Tanh", np.tanh), ("Sigmoid", lambda v: 1 / (1 + np.exp(-v))),
                     ("Sin", np.sin), ("Cos", np.cos), ("Floor", np.floor), ("Ceil", np.ceil)):
        close(getattr(singa, name)(x), fn(x0))
    close(singa.Sqrt(singa.Abs(x)), np.sqrt(np.abs(x0)))
    close(singa.Log(singa.Abs(x)), np.log(np.abs(x0)))
    out = tensor.from_numpy(y0.copy())
    singa.Axpy(0.5, x, out)
    close(out, y0 + 0.5 * x0)
    singa.Axpy(tensor.from_numpy(np.array([-2.0], np.float32)), x, out)  # SINGA's one-element-tensor alpha
    close(out, y0 + 0.5 * x0 - 2 * x0)


class PySGD(opt.Optimizer):
    """SGD with momentum written as SINGA writes its optimizers (per-parameter apply, Axpy on .data)."""

    def __init__(self, lr=0.1, momentum=0.0, weight_decay=0.0):
        super().__init__(lr)
        self.momentum = opt.Constant(momentum)
        self.mom_value = self.momentum(self.step_counter).as_type(self.dtype)
        self.decay = weight_decay
        self.moments = {}
        self.names = []

    def apply(self, param_name, param_value, param_grad):
        self.device_check(param_value, self.step_counter, self.lr_value, self.mom_value)
        self.names.append(param_name)
        if self.decay:
            singa.Axpy(self.decay, param_value.data, param_grad.data)
        if param_name not in self.moments:
            self.moments[param_name] = tensor.zeros_like(param_value)
        buf = self.moments[param_name]
        buf *= self.mom_value
        singa.Axpy(1.0, param_grad.data, buf.data)
        minus_lr = 0.0 - self.lr_value
        singa.Axpy(minus_lr.data, buf.data, param_value.data)


def _train(optimizer, steps=4, use_graph=False):
    dev = tandem.device.get_default_device()
    dev.SetRandSeed(7)
    rng = np.random.default_rng(3)
    x = tensor.from_numpy(rng.standard_normal((6, 4)).astype(np.float32), dev)
    y = tensor.from_numpy(rng.integers(0, 3, 6).astype(np.int32), dev)
    m = Tiny()  # Linear, ReLU, Linear, softmax cross-entropy
    m.set_optimizer(optimizer)
    m.compile([x], is_train=True, use_graph=use_graph)
    losses = [float(m(x, y)[1].to_numpy()[0]) for _ in range(steps)]
    return m, losses


def test_python_optimizer_steps_as_tandems_sgd():
    schedule = opt.ExponentialDecay(0.2, 2, 0.5)
    ours, ours_losses = _train(opt.SGD(lr=schedule, momentum=0.9, weight_decay=0.01))
    py = PySGD(lr=opt.ExponentialDecay(0.2, 2, 0.5), momentum=0.9, weight_decay=0.01)
    theirs, their_losses = _train(py)
    np.testing.assert_allclose(their_losses, ours_losses, rtol=1e-5)
    for (name, a), (_, b) in zip(sorted(ours.get_params().items()), sorted(theirs.get_params().items())):
        np.testing.assert_allclose(b.to_numpy(), a.to_numpy(), rtol=1e-5, atol=1e-7, err_msg=name)
    assert py.step_counter == 4
    np.testing.assert_allclose(py.lr_value.to_numpy(), [0.2 * 0.5 ** 2], rtol=1e-6)  # the next step's rate
    assert sorted(set(py.names)) == sorted(theirs.get_params())  # apply is given the parameters' names
    assert len(py.names) == 4 * 4


def test_python_optimizer_limits_are_stated():
    py = PySGD(lr=0.1)
    with pytest.raises(ValueError, match="steps in Python"):
        py.set_param_groups([{"params": [], "weight_decay": 0.0}])
    with pytest.raises(TypeError, match="steps in Python"):
        opt.DistOpt(py)
    m, losses = _train(PySGD(lr=0.1), steps=2, use_graph=True)  # a recorded step falls back to eager calls
    assert np.all(np.isfinite(losses)) and m.replays == 0


class SumOnHost(autograd.Operator):
    """The sum of every element, its gradient made with NumPy on the CPU whatever the input's device."""

    def forward(self, x):
        self.shape = x.shape
        return singa.SumAll(x)

    def backward(self, dy):
        return tensor.from_numpy(np.full(self.shape, tensor.to_numpy(dy)[0], np.float32))


def test_a_gradient_made_on_the_host_reaches_the_input():
    a0 = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = param(a0)
    list(autograd.backward(SumOnHost()(Cube()(a)[0])[0] * 2.0))
    np.testing.assert_allclose(a.grad.to_numpy(), 2 * 3 * a0 ** 2, rtol=1e-6)


@needs_gpu
def test_python_operator_on_a_gpu_matches_the_cpu():
    dev = tandem.device.create_cuda_gpu_on(0)
    rng = np.random.default_rng(4)
    a0 = rng.standard_normal((3, 5)).astype(np.float32)
    got = {}
    for where in (None, dev):
        a = param(a0, where)
        loss = SumOnHost()(Cube()(a)[0])[0]  # its gradient is made on the CPU and moved to the input's device
        list(autograd.backward(loss))
        got[where is None] = (loss.to_numpy(), a.grad.to_numpy())
    np.testing.assert_allclose(got[False][0], got[True][0], rtol=1e-5)
    np.testing.assert_allclose(got[False][1], 3 * a0 ** 2, rtol=1e-5)
