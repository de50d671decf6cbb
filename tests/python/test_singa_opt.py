"""SINGA's opt API in one process: the signatures and defaults of SGD, Adam, the schedules and every
DistOpt method (a table written from SINGA's python/singa/opt.py), the schedules' values and their
use as learning rates, SINGA's per-parameter apply/update, 16-bit training (dtype=float16) and the
fusion-buffer helpers on one rank. Two-rank behaviour is in distopt_worker.py."""
import inspect

import numpy as np
import pytest

from tandem import _tandem, autograd, layer, model, opt, tensor

POS, KW = "POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY"
EMPTY = inspect.Parameter.empty
SINGA_OPT_SIGNATURES = {
    "SGD.__init__": [("lr", 0.1), ("momentum", 0), ("dampening", 0), ("weight_decay", 0), ("nesterov", False),
                     ("dtype", tensor.float32)],
    "Adam.__init__": [("lr", 0.1), ("beta_1", 0.9), ("beta_2", 0.999), ("epsilon", 1e-8), ("weight_decay", 0)],
    "Optimizer.__init__": [("lr", EMPTY), ("dtype", tensor.float32)],
    "Optimizer.__call__": [("loss", EMPTY)],
    "Optimizer.call": [("loss", EMPTY)],
    "Optimizer.step": [],
    "Optimizer.apply": [("param_name", EMPTY), ("param_value", EMPTY), ("param_grad", EMPTY)],
    "Optimizer.update": [("param", EMPTY), ("grad", EMPTY)],
    "Optimizer.backward_and_update": [("loss", EMPTY)],
    "Optimizer.get_states": [],
    "Optimizer.set_states": [("states", EMPTY)],
    "DecayScheduler.__init__": [("init_value", EMPTY)],
    "DecayScheduler.__call__": [("step", EMPTY)],
    "ExponentialDecay.__init__": [("init_value", EMPTY), ("decay_steps", EMPTY), ("decay_rate", EMPTY),
                                  ("staircase", False)],
    # SINGA's default optimizer is SGD(); tandem's None stands for a new SGD() (checked below).
    "DistOpt.__init__": [("opt", None), ("nccl_id", None), ("local_rank", None), ("world_size", None),
                         ("buffSize", 4194304)],
    "DistOpt.__call__": [("loss", EMPTY)],
    "DistOpt.all_reduce": [("tensor", EMPTY)],
    "DistOpt.fused_all_reduce": [("tensor", EMPTY), ("send", True)],
    "DistOpt.all_reduce_half": [("tensor", EMPTY)],
    "DistOpt.fused_all_reduce_half": [("tensor", EMPTY), ("send", True)],
    "DistOpt.sparsification": [("tensor", EMPTY), ("accumulation", EMPTY), ("spars", EMPTY), ("topK", EMPTY)],
    "DistOpt.fused_sparsification": [("tensor", EMPTY), ("accumulation", EMPTY), ("spars", EMPTY), ("topK", EMPTY)],
    "DistOpt.wait": [],
    "DistOpt.backward_and_update": [("loss", EMPTY), ("threshold", 2097152)],
    "DistOpt.backward_and_update_half": [("loss", EMPTY), ("threshold", 2097152), ("clipping", False),
                                         ("clip_Value", 100)],
    "DistOpt.backward_and_partial_update": [("loss", EMPTY), ("threshold", 2097152)],
    "DistOpt.backward_and_sparse_update": [("loss", EMPTY), ("threshold", 2097152), ("spars", 0.05), ("topK", False),
                                           ("corr", True)],
}
# tandem's own additions come after SINGA's parameters: keyword-only ones, or ones with defaults
# that keep SINGA's calls meaning what they mean there.
EXTRA = {"Adam.__init__": [("decoupled", False), ("dtype", tensor.float32)]}


@pytest.mark.parametrize("qualname", sorted(SINGA_OPT_SIGNATURES))
def test_signatures_and_defaults_are_singas(qualname):
    cls, meth = qualname.split(".")
    params = list(inspect.signature(getattr(getattr(opt, cls), meth)).parameters.values())[1:]
    singa = SINGA_OPT_SIGNATURES[qualname]
    positional = [p for p in params if p.kind.name == POS]
    assert [(p.name, p.default) for p in positional[:len(singa)]] == singa
    extra = positional[len(singa):]
    assert [(p.name, p.default) for p in extra] == EXTRA.get(qualname, [])
    assert all(p.kind.name == KW for p in params if p.kind.name != POS)


def test_distopt_update_takes_singas_arguments_or_none():
    params = list(inspect.signature(opt.DistOpt.update).parameters.values())[1:]
    assert [(p.name, p.default) for p in params] == [("param", None), ("grad", None)]
    d = opt.DistOpt()
    assert isinstance(d.opt, opt.SGD) and (d.opt.lr, d.opt.momentum) == (0.1, 0.0)


def test_sgd_checks_as_singa_does():
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum and zero dampening"):
        opt.SGD(momentum=0.9, dampening=0.1, nesterov=True)
    with pytest.raises(ValueError, match="Invalid momentum"):
        opt.SGD(momentum=-1)
    with pytest.raises(ValueError, match="Invalid weight_decay"):
        opt.SGD(weight_decay=-1e-4)
    with pytest.raises(TypeError, match="lr must be a number or a DecayScheduler"):
        opt.SGD(lr="0.1")
    with pytest.raises(ValueError, match="only lr may follow a schedule"):
        opt.SGD(momentum=opt.ExponentialDecay(0.9, 10, 0.5))
    assert opt.SGD(momentum=opt.Constant(0.8)).momentum == 0.8


def test_schedules():
    step = tensor.full((1,), 6.0)
    assert opt.Constant(0.3)(step).to_numpy()[0] == np.float32(0.3)
    decay = opt.ExponentialDecay(0.1, 4, 0.5)
    assert decay(step).shape == (1,)
    assert decay.value_at(6) == pytest.approx(0.1 * 0.5 ** 1.5)
    assert opt.ExponentialDecay(0.1, 4, 0.5, staircase=True).value_at(6) == pytest.approx(0.05)


def _one_weight(cpu, w0):
    w = tensor.from_numpy(w0, cpu)
    w.requires_grad = True
    return w


def _loss(w, x):
    return _tandem.reshape(_tandem.sum(_tandem.mul(w, x)), [1])  # d loss / d w = x


def test_a_decaying_learning_rate(cpu):
    w0, x = np.array([1.0, -2.0], np.float32), tensor.from_numpy(np.array([3.0, 1.0], np.float32), cpu)
    w = _one_weight(cpu, w0)
    sgd = opt.SGD(lr=opt.ExponentialDecay(0.1, 1, 0.5))
    want = w0.astype(np.float64)
    for k in range(3):
        assert sgd.step_counter == k and sgd.lr == pytest.approx(0.1 * 0.5 ** k)
        sgd(_loss(w, x))
        want -= 0.1 * 0.5 ** k * x.to_numpy()
    np.testing.assert_allclose(w.to_numpy(), want, rtol=1e-6)
    assert sgd.get_states() == {"step_counter": 3}
    sgd.set_states({"step_counter": 1})
    assert sgd.lr == pytest.approx(0.05)


def test_distopt_states_are_the_wrapped_optimizers(cpu):
    # SINGA's Optimizer.get_states / set_states: the step counter, which the rate follows. The guide's
    # resume recipe keeps them in a checkpoint's aux states.
    class Net(model.Model):
        def __init__(self):
            super().__init__()
            self.fc = layer.Linear(2)

        def forward(self, x):
            return self.fc(x)

    x = tensor.from_numpy(np.ones((1, 3), np.float32), cpu)
    d = opt.DistOpt(opt.SGD(lr=opt.ExponentialDecay(0.1, 1, 0.5)))
    net = Net()
    net.set_optimizer(d)
    net.compile([x], is_train=True)
    for _ in range(3):
        d(autograd.reduce_sum(net.forward(x), keepdims=0))
    assert d.get_states() == {"step_counter": 3} == d.opt.get_states()
    d.set_states({"step_counter": 1})
    assert d.step_counter == 1 and d.lr == pytest.approx(0.05) and d.lr_value.item() == pytest.approx(0.05)
    d(autograd.reduce_sum(net.forward(x), keepdims=0))
    assert d.get_states() == {"step_counter": 2} and d.lr_value.item() == pytest.approx(0.025)


def test_apply_and_update_step_one_parameter(cpu):
    """SINGA's per-parameter steps: the others' gradients stay as they were, and momentum is shared
    with whole steps of the same optimizer."""
    a0, b0 = np.array([1.0, 2.0], np.float32), np.array([[0.5, -1.0]], np.float32)
    a, b = _one_weight(cpu, a0), _one_weight(cpu, b0)
    x = tensor.from_numpy(np.array([3.0, -1.0], np.float32), cpu)
    sgd = opt.SGD(lr=0.1, momentum=0.9)
    sgd(_tandem.add(_loss(a, x), _tandem.reshape(_tandem.sum(b), [1])))  # a whole step: g_a = x, g_b = 1
    a1, b1 = a0 - 0.1 * x.to_numpy(), b0 - 0.1
    g = tensor.from_numpy(np.array([1.0, 1.0], np.float32), cpu)
    autograd_b = tensor.from_numpy(np.full((1, 2), 7.0, np.float32), cpu)
    sgd.update(a, g)  # momentum continues: buf = 0.9 * x + g
    np.testing.assert_allclose(a.to_numpy(), a1 - 0.1 * (0.9 * x.to_numpy() + 1.0), rtol=1e-6)
    np.testing.assert_allclose(b.to_numpy(), b1, rtol=1e-6)  # untouched
    sgd.apply("b", b, autograd_b)
    np.testing.assert_allclose(b.to_numpy(), b1 - 0.1 * (0.9 * 1.0 + 7.0), rtol=1e-6)
    # A parameter the optimizer has not seen gets state of its own, kept by name.
    c = _one_weight(cpu, np.zeros(2, np.float32))
    sgd.apply("c", c, tensor.from_numpy(np.ones(2, np.float32), cpu))
    sgd.apply("c", c, tensor.from_numpy(np.ones(2, np.float32), cpu))
    np.testing.assert_allclose(c.to_numpy(), -0.1 * (1.0 + 1.9) * np.ones(2), rtol=1e-6)
    with pytest.raises(ValueError, match="does not match its parameter"):
        sgd.apply("c", c, tensor.from_numpy(np.ones(3, np.float32), cpu))


def test_apply_steps_a_tensor_that_stores_no_gradient(cpu):
    """SINGA's RBM example steps tensors made by Tensor(shape) and from_numpy (no stores_grad) with
    apply: they are updated in place, with momentum kept by name, and stay as they were made."""
    w = tensor.from_numpy(np.array([1.0, -2.0, 0.5], np.float32), cpu)
    v = tensor.Tensor((2, 2), cpu)
    assert not w.requires_grad and not w.stores_grad
    sgd = opt.SGD(lr=0.1, momentum=0.9, weight_decay=0.01)
    g = np.array([0.5, 1.0, -1.0], np.float32)
    want, buf = w.to_numpy().copy(), np.zeros(3, np.float32)
    for step in range(3):
        sgd.apply("w", w, tensor.from_numpy(g * (step + 1), cpu))
        d = g * (step + 1) + 0.01 * want
        buf = d if step == 0 else 0.9 * buf + d
        want = want - 0.1 * buf
        np.testing.assert_allclose(w.to_numpy(), want, rtol=1e-6)
    sgd.apply("v", v, tensor.from_numpy(np.ones((2, 2), np.float32), cpu))
    np.testing.assert_allclose(v.to_numpy(), -0.1 * np.ones((2, 2)), rtol=1e-6)
    assert not w.requires_grad and not v.requires_grad


class _Stray(model.Model):
    """A model whose forward multiplies by a tensor that requires a gradient but is no parameter (held in
    a list: a tensor attribute that stores a gradient would be one)."""

    def __init__(self, cpu):
        super().__init__()
        self.fc = layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()
        extra = tensor.from_numpy(np.ones((4, 3), np.float32), cpu)
        extra.requires_grad = True
        self.extras = [extra]

    def forward(self, x):
        return _tandem.mul(self.fc(x), self.extras[0])

    def train_one_batch(self, x, y):
        loss = self.loss(self.forward(x), y)
        self.optimizer(loss)
        return loss


def test_a_loss_reaching_tensors_outside_the_model_is_refused(cpu):
    net = _Stray(cpu)
    x = tensor.from_numpy(np.ones((4, 5), np.float32), cpu)
    net.set_optimizer(opt.SGD(lr=0.1))
    net.compile([x], is_train=True)
    with pytest.raises(ValueError, match=r"1 tensor\(s\) that require a gradient but are not parameters"):
        net(x, tensor.from_numpy(np.array([0, 1, 2, 1], np.int32), cpu))


class _Net(model.Model):
    def __init__(self):
        super().__init__()
        self.conv = layer.Conv2d(1, 4, 3, padding=1)
        self.flatten, self.fc = layer.Flatten(), layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc(self.flatten(self.conv(x)))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def _train(cpu, dtype, x, y, steps=3):
    cpu.SetRandSeed(5)
    net = _Net()
    tx = tensor.Tensor(x.shape, cpu, dtype)
    tx.copy_from_numpy(x.astype(np.float16 if dtype == tensor.float16 else np.float32))
    ty = tensor.from_numpy(y, cpu)
    sgd = opt.SGD(lr=0.1, momentum=0.9, dtype=dtype)
    net.set_optimizer(sgd)
    net.compile([tx], is_train=True)
    for _ in range(steps):
        net(tx, ty)
    return net, sgd


def test_float16_keeps_float32_parameters_and_computes_in_f16_precision(cpu):
    """SINGA's dtype=float16: here float32 master parameters and optimizer state, with the model run
    in tandem's f16 precision; on the CPU that computes float32, so the run equals a float32 run on the
    same (16-bit-rounded) inputs, bit for bit."""
    rng = np.random.RandomState(0)
    x = rng.standard_normal((4, 1, 5, 5)).astype(np.float32)
    y = np.array([0, 2, 1, 2], np.int32)
    half, sgd = _train(cpu, tensor.float16, x, y)
    assert sgd.precision == "f16" and opt.SGD(dtype=tensor.bfloat16).precision == "bf16"
    full, _ = _train(cpu, tensor.float32, x.astype(np.float16).astype(np.float32), y)
    for name, p in half.get_params().items():
        assert p.dtype == tensor.float32, name
        np.testing.assert_array_equal(p.to_numpy(), full.get_params()[name].to_numpy(), err_msg=name)
    seen = []

    class Probe(_Net):
        def forward(self, x):
            seen.append((x.dtype, _tandem.current_precision()))
            return super().forward(x)

    probe = Probe()
    probe.set_optimizer(opt.SGD(dtype=tensor.float16))
    probe.compile([tensor.Tensor((2, 1, 5, 5), cpu, tensor.float16)])
    assert seen == [(tensor.float32, _tandem.Precision.f16)]  # CPU inputs as float32, in f16 precision


def test_fusion_buffer_on_one_rank(cpu):
    d = opt.DistOpt(opt.SGD())
    a, b = tensor.full((2, 2), 1.5, cpu), tensor.full((3,), -2.0, cpu)
    d.fused_all_reduce([a], send=False)  # copied now: later changes to a are not sent
    d.fused_all_reduce([b], send=False)
    a.fill_(9.0)
    d.fused_all_reduce([a, b])
    d.wait()
    np.testing.assert_array_equal(a.to_numpy(), np.full((2, 2), 1.5))
    np.testing.assert_array_equal(b.to_numpy(), np.full(3, -2.0))
    d.fused_all_reduce_half([a, b])  # nothing staged: the tensors themselves
    d.all_reduce_half(a)
    d.wait()
    np.testing.assert_array_equal(a.to_numpy(), np.full((2, 2), 1.5))
    d.fused_all_reduce([a], send=False)
    with pytest.raises(ValueError, match="holds 4 values .* but the tensors given hold 7"):
        d.fused_all_reduce([a, b])
    with pytest.raises(ValueError, match="float32"):
        d.all_reduce_half(tensor.full((2,), 1.0, cpu, tensor.float64))
    with pytest.raises(TypeError, match="list of tensors"):
        d.fused_all_reduce([])
    g = tensor.from_numpy(np.array([0.5, -3.0, 2.0, -0.25], np.float32), cpu)
    acc = tensor.zeros((4,), cpu)
    d.sparsification(g, acc, 0.5, True)
    np.testing.assert_array_equal(g.to_numpy(), [0.0, -3.0, 2.0, 0.0])
    np.testing.assert_array_equal(acc.to_numpy(), [0.5, 0.0, 0.0, -0.25])
    p, q = tensor.from_numpy(np.array([0.5, -3.0], np.float32), cpu), tensor.from_numpy(np.array([[2.0]], np.float32),
                                                                                      cpu)
    d.fused_sparsification([p, q], None, 1.0, False)
    np.testing.assert_array_equal(p.to_numpy(), [0.0, -3.0])
    np.testing.assert_array_equal(q.to_numpy(), [[2.0]])
