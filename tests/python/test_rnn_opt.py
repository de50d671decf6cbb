"""Embedding and the recurrent layers (SINGA's Embedding, RNN, LSTM, CudnnRNN and autograd's embedding and
_RNN, tandem's GRU), RMSProp and AdaGrad with SINGA's signatures and rules, parameter groups, the
warm-up cosine schedule, and a resumed run with all of them. PyTorch (the system's) checks the recurrent
layers' values where it is importable."""
import inspect
import math

import numpy as np
import pytest

from conftest import TORCH_SKIP, torch_for_numpy
from tandem import _tandem, autograd, layer, model, opt, tensor

EMPTY = inspect.Parameter.empty
SINGA_SIGNATURES = {
    (opt, "RMSProp.__init__"): [("lr", 0.1), ("rho", 0.9), ("epsilon", 1e-8), ("weight_decay", 0)],
    (opt, "AdaGrad.__init__"): [("lr", 0.1), ("epsilon", 1e-8), ("weight_decay", 0)],
    (layer, "Embedding.__init__"): [("input_dim", EMPTY), ("output_dim", EMPTY), ("initializer", "gaussian")],
    (layer, "RNN.__init__"): [("input_size", EMPTY), ("hidden_size", EMPTY), ("num_layers", 1), ("nonlinearity", "tanh"),
                              ("bias", True), ("batch_first", False), ("dropout", 0), ("bidirectional", False)],
    (layer, "LSTM.__init__"): [("input_size", EMPTY), ("hidden_size", EMPTY), ("nonlinearity", "tanh"),
                               ("num_layers", 1), ("bias", True), ("batch_first", False), ("dropout", 0),
                               ("bidirectional", False)],
    (layer, "CudnnRNN.__init__"): [("hidden_size", EMPTY), ("activation", "tanh"), ("num_layers", 1), ("bias", True),
                                   ("batch_first", True), ("dropout", 0), ("bidirectional", False),
                                   ("rnn_mode", "lstm"), ("use_mask", False), ("return_sequences", True)],
    (autograd, "_RNN.__init__"): [("handle", EMPTY), ("return_sequences", False), ("use_mask", False),
                                  ("seq_lengths", None)],
}


@pytest.mark.parametrize("where,qualname", sorted(SINGA_SIGNATURES, key=lambda k: k[1]),
                         ids=lambda v: v if isinstance(v, str) else v.__name__)
def test_signatures_are_singas(where, qualname):
    cls, meth = qualname.split(".")
    params = list(inspect.signature(getattr(getattr(where, cls), meth)).parameters.values())[1:]
    want = SINGA_SIGNATURES[(where, qualname)]
    assert [(p.name, p.default) for p in params[:len(want)]] == want


# ---- embedding

def test_embedding_values_gradients_and_index_types(cpu):
    rng = np.random.RandomState(0)
    w_np = rng.standard_normal((6, 3)).astype(np.float32)
    idx_np = np.array([[0, 2, 2], [5, 0, 2]])
    for idx in (tensor.from_numpy(idx_np.astype(np.int32), cpu), tensor.from_numpy(idx_np.astype(np.int64), cpu,
                                                                                   tensor.int64),
                tensor.from_numpy(idx_np.astype(np.float32), cpu)):  # SINGA's floating indices
        w = tensor.from_numpy(w_np, cpu)
        w.requires_grad = True
        w.stores_grad = True
        y = autograd.embedding(idx, w)
        np.testing.assert_array_equal(y.to_numpy(), w_np[idx_np])
        grads = dict((p.name, g) for p, g in autograd.backward(autograd.reduce_sum(y, keepdims=0)))
        g = w.grad.to_numpy()
        np.testing.assert_array_equal(g[:, 0], [2, 0, 3, 0, 0, 1])  # rows picked twice add twice
        assert grads or g is not None


def test_embedding_index_out_of_range(cpu):
    w = tensor.from_numpy(np.zeros((4, 2), dtype=np.float32), cpu)
    with pytest.raises(Exception, match="embedding: index 4 at position 1"):
        autograd.embedding(tensor.from_numpy(np.array([1, 4], dtype=np.int32), cpu), w)


def test_embedding_layer_is_lazy_and_loads_pretrained_tables(cpu):
    emb = layer.Embedding(10, 4)
    assert emb.W is None
    x = tensor.from_numpy(np.array([[1, 2], [3, 9]], dtype=np.int32), cpu)
    y = emb(x)
    assert y.shape == (2, 2, 4) and emb.W.shape == (10, 4)
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    emb.from_pretrained(tensor.from_numpy(table, cpu), freeze=True)
    np.testing.assert_array_equal(emb(x).to_numpy(), table[[[1, 2], [3, 9]]])
    assert not emb.W.requires_grad
    with pytest.raises(ValueError, match="initializer"):
        layer.Embedding(3, 2, initializer="zeros")
    uniform = layer.Embedding(50, 8, initializer="uniform")
    uniform(x)
    assert np.abs(uniform.W.to_numpy()).max() <= 1.0


# ---- recurrent layers

torch = torch_for_numpy()  # the system's PyTorch, when this interpreter can use it


def torch_module(kind, lay, batch_first=False):
    cls = {"rnn": torch.nn.RNN, "lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[kind]
    m = cls(lay.input_size, lay.hidden_size, num_layers=lay.num_layers, bias=lay.bias, batch_first=batch_first,
            bidirectional=lay.bidirectional).double()
    params = {k: torch.tensor(v.to_numpy(), dtype=torch.float64) for k, v in lay.get_params().items()}
    m.load_state_dict(params)  # tandem's parameters carry PyTorch's names
    return m


@pytest.mark.skipif(torch is None, reason=TORCH_SKIP)
@pytest.mark.parametrize("kind", ["rnn", "lstm", "gru"])
def test_recurrent_layers_follow_singas_calls_and_pytorchs_values(cpu, kind):
    rng = np.random.RandomState(1)
    T, N, I, H = 5, 3, 4, 6
    xs_np = rng.standard_normal((T, N, I)).astype(np.float32)
    h0_np = rng.standard_normal((N, H)).astype(np.float32)
    c0_np = rng.standard_normal((N, H)).astype(np.float32)
    xs = [tensor.from_numpy(xs_np[t], cpu) for t in range(T)]
    h0, c0 = tensor.from_numpy(h0_np, cpu), tensor.from_numpy(c0_np, cpu)
    lay = {"rnn": lambda: layer.RNN(I, H), "lstm": lambda: layer.LSTM(I, H), "gru": lambda: layer.GRU(I, H)}[kind]()
    if kind == "lstm":
        outs, h, c = lay(xs, (h0, c0))
    else:
        outs, h = lay(xs, h0)
    assert isinstance(outs, list) and len(outs) == T and outs[0].shape == (N, H) and h.shape == (N, H)
    ref = torch_module(kind, lay)
    tx, th = torch.tensor(xs_np, dtype=torch.float64), torch.tensor(h0_np[None], dtype=torch.float64)
    ty, tstate = ref(tx, (th, torch.tensor(c0_np[None], dtype=torch.float64)) if kind == "lstm" else th)
    np.testing.assert_allclose(np.stack([o.to_numpy() for o in outs]), ty.detach().numpy(), rtol=2e-5, atol=2e-6)
    th_out = tstate[0] if kind == "lstm" else tstate
    np.testing.assert_allclose(h.to_numpy(), th_out[0].detach().numpy(), rtol=2e-5, atol=2e-6)
    if kind == "lstm":
        np.testing.assert_allclose(c.to_numpy(), tstate[1][0].detach().numpy(), rtol=2e-5, atol=2e-6)
    # Every parameter gets a gradient, as PyTorch's.
    loss = autograd.reduce_sum(autograd.cat([autograd.reshape(o, [1, N, H]) for o in outs], 0), keepdims=0)
    grads = {p.name: g.to_numpy() for p, g in autograd.backward(loss)}
    ty.sum().backward()
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(lay.get_params()[name].grad.to_numpy(), p.grad.numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=name)
    assert grads


@pytest.mark.skipif(torch is None, reason=TORCH_SKIP)
def test_deep_bidirectional_batch_first_lstm_on_a_tensor(cpu):
    rng = np.random.RandomState(2)
    N, T, I, H = 2, 4, 3, 5
    x_np = rng.standard_normal((N, T, I)).astype(np.float32)
    lay = layer.LSTM(None, H, num_layers=2, batch_first=True, bidirectional=True)  # input size from the call
    y, h, c = lay(tensor.from_numpy(x_np, cpu))
    assert lay.input_size == I and y.shape == (N, T, 2 * H) and h.shape == (4, N, H)
    assert sorted(lay.get_params())[:2] == ["bias_hh_l0", "bias_hh_l0_reverse"]
    ref = torch_module("lstm", lay, batch_first=True)
    ty, (th, tc) = ref(torch.tensor(x_np, dtype=torch.float64))
    np.testing.assert_allclose(y.to_numpy(), ty.detach().numpy(), rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(c.to_numpy(), tc.detach().numpy(), rtol=2e-5, atol=2e-6)


def test_cudnn_rnn_modes_shapes_and_last_step(cpu):
    rng = np.random.RandomState(3)
    x = tensor.from_numpy(rng.standard_normal((2, 5, 3)).astype(np.float32), cpu)  # [N, T, I]
    for mode, bidirectional in (("lstm", True), ("gru", False), ("vanilla", False), ("relu", True)):
        seq = layer.CudnnRNN(4, rnn_mode=mode, bidirectional=bidirectional, num_layers=2)
        y = seq(x)
        d = 2 if bidirectional else 1
        assert y.shape == (2, 5, 4 * d)
        assert seq.W.shape == (_tandem.rnn_weight_size({"vanilla": "tanh"}.get(mode, mode), 3, 4, 2, bidirectional),)
        last = layer.CudnnRNN(4, rnn_mode=mode, bidirectional=bidirectional, num_layers=2, return_sequences=False)
        last(x)
        last.W.copy_(seq.W)
        np.testing.assert_allclose(last(x).to_numpy(), y.to_numpy()[:, -1, :], rtol=1e-6, atol=1e-7)
    with pytest.raises(NotImplementedError, match="use_mask"):
        layer.CudnnRNN(4, use_mask=True)
    with pytest.raises(ValueError, match="rnn_mode"):
        layer.CudnnRNN(4, rnn_mode="conv")


def test_autograd_rnn_operator_with_a_handle(cpu):
    rng = np.random.RandomState(4)
    T, N, I, H = 4, 2, 3, 5
    x = tensor.from_numpy(rng.standard_normal((T, N, I)).astype(np.float32), cpu)
    handle = autograd.CudnnRNNHandle(x, H, mode=2, num_layers=1, bidirectional=0)
    w = tensor.Tensor((handle.weights_size,), cpu)
    w.uniform(-0.3, 0.3)
    w.requires_grad = True
    w.stores_grad = True
    hx = tensor.zeros((1, N, H), cpu)
    cx = tensor.zeros((1, N, H), cpu)
    y_all = autograd._RNN(handle, return_sequences=True)(x, hx, cx, w)[0]
    y_last = autograd._RNN(handle)(x, hx, cx, w)[0]
    assert y_all.shape == (T, N, H) and y_last.shape == (N, H)
    np.testing.assert_allclose(y_last.to_numpy(), y_all.to_numpy()[-1], rtol=1e-6)
    grads = dict(autograd.backward(autograd.reduce_sum(y_last, keepdims=0)))
    assert w.grad is not None and np.abs(w.grad.to_numpy()).sum() > 0 and grads
    y2, hy, cy = autograd.rnn(x, w, hx, cx, mode="lstm", hidden_size=H)
    np.testing.assert_allclose(y2.to_numpy(), y_all.to_numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="recurrent mode"):
        autograd.CudnnRNNHandle(x, H, mode=7)


class CharModel(model.Model):
    """An embedding, an LSTM and a linear head over token sequences [N, T], in SINGA's style."""

    def __init__(self):
        super().__init__()
        self.emb = layer.Embedding(7, 4)
        self.lstm = layer.CudnnRNN(5, batch_first=True)
        self.fc = layer.Linear(7)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        y = self.lstm(self.emb(x))
        return self.fc(autograd.reshape(y, [-1, 5]))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def char_batch(cpu, step):
    rng = np.random.RandomState(100 + step)
    tokens = rng.randint(0, 7, (3, 4))
    x = tensor.from_numpy(tokens.astype(np.int32), cpu)
    y = tensor.from_numpy(np.roll(tokens, -1, axis=1).reshape(-1).astype(np.int32), cpu)
    return x, y


def test_char_model_learns(cpu):
    net = CharModel()
    net.set_optimizer(opt.RMSProp(lr=0.02))
    x, y = char_batch(cpu, 0)
    net.compile([x], is_train=True)
    losses = [net(x, y)[1].item() for _ in range(40)]
    assert losses[-1] < 0.5 * losses[0]


# ---- optimizers

def one_param_step(optimizer, w0, grads):
    w = tensor.from_numpy(w0.copy())
    w.requires_grad = True
    w.stores_grad = True
    for g in grads:
        optimizer.apply("w", w, tensor.from_numpy(g.copy()))
    return w.to_numpy()


def test_rmsprop_and_adagrad_follow_singas_rules():
    w0 = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    grads = [np.array([0.3, -0.1, 2.0], dtype=np.float32), np.array([-0.4, 0.2, 0.1], dtype=np.float32)]
    got = one_param_step(opt.RMSProp(lr=0.1, rho=0.8, epsilon=1e-4, weight_decay=0.01), w0, grads)
    w, v = w0.astype(np.float64), np.zeros(3)
    for g in grads:
        g = g + 0.01 * w
        v = 0.8 * v + 0.2 * g * g
        w = w - 0.1 * g / np.sqrt(v + 1e-4)
    np.testing.assert_allclose(got, w, rtol=1e-5)
    got = one_param_step(opt.AdaGrad(lr=0.1, epsilon=1e-4, weight_decay=0.01), w0, grads)
    w, h = w0.astype(np.float64), np.zeros(3)
    for g in grads:
        g = g + 0.01 * w
        h = h + g * g
        w = w - 0.1 * g / np.sqrt(h + 1e-4)
    np.testing.assert_allclose(got, w, rtol=1e-5)
    with pytest.raises(ValueError, match="weight_decay"):
        opt.RMSProp(weight_decay=-1)
    with pytest.raises(ValueError, match="rho"):
        opt.RMSProp(rho=1.5)


def test_warmup_cosine_matches_cs_schedule():
    py = opt.WarmupCosineDecay(0.3, 3, 11, 0.03)
    cpp = _tandem.WarmupCosineLr(0.3, 3, 11, 0.03)
    for k in range(15):
        assert py.value_at(k) == pytest.approx(cpp.lr(k), rel=1e-12, abs=1e-15)
    assert py.value_at(0) == pytest.approx(0.1) and py.value_at(2) == pytest.approx(0.3)
    assert py.value_at(11) == pytest.approx(0.03)
    assert math.isclose(py(5).item(), cpp.lr(5), rel_tol=1e-6)
    with pytest.raises(ValueError, match="warmup_steps < total_steps"):
        opt.WarmupCosineDecay(0.1, 5, 5)
    # As a learning rate: each step takes the schedule's value at the steps taken before it.
    sgd = opt.SGD(lr=opt.WarmupCosineDecay(0.3, 3, 11))
    w = tensor.from_numpy(np.zeros(1, dtype=np.float32))
    w.requires_grad = True
    w.stores_grad = True
    x = tensor.from_numpy(np.ones(1, dtype=np.float32))
    rates = []
    for _ in range(4):
        rates.append(sgd.lr)
        sgd(_tandem.reshape(_tandem.sum(_tandem.mul(w, x)), [1]))
    assert rates == pytest.approx([0.1, 0.2, 0.3, 0.3])
    assert w.to_numpy()[0] == pytest.approx(-0.9)


def test_param_groups_and_the_decay_split(cpu):
    net = CharModel()
    sgd = opt.SGD(lr=0.1, weight_decay=0.5)
    net.set_optimizer(sgd)
    x, y = char_batch(cpu, 0)
    net.compile([x], is_train=True)
    groups = opt.decay_groups(net, 0.5)
    assert groups[0]["weight_decay"] == 0.5 and groups[1]["weight_decay"] == 0.0
    assert set(groups[0]["params"]) == {"lstm.W", "fc.weight"}  # the flat recurrent weight decays
    assert set(groups[1]["params"]) == {"emb.weight", "fc.bias"}
    sgd.set_param_groups(groups + [{"params": [], "lr": 0.05}])
    got = sgd.param_groups
    assert [g["weight_decay"] for g in got[:2]] == [0.5, 0.0]
    assert set(got[1]["params"]) == {"emb.weight", "fc.bias"}
    # Without a gradient, a step only decays: the no-decay group stays as it was.
    before = {k: v.to_numpy().copy() for k, v in net.get_params().items()}
    zero = None
    for p in net.get_params().values():  # a loss whose gradients are all zeros
        term = _tandem.scale(_tandem.sum(p), 0.0)
        zero = term if zero is None else _tandem.add(zero, term)
    _tandem.backward(zero)
    sgd._impl.step()
    after = {k: v.to_numpy() for k, v in net.get_params().items()}
    np.testing.assert_array_equal(after["fc.bias"], before["fc.bias"])
    np.testing.assert_array_equal(after["emb.weight"], before["emb.weight"])
    np.testing.assert_allclose(after["fc.weight"], before["fc.weight"] * (1 - 0.1 * 0.5), rtol=1e-6)
    with pytest.raises(KeyError, match="fc.nothing"):
        sgd.set_param_groups([{"params": ["fc.nothing"]}])
    with pytest.raises(ValueError, match="unknown keys"):
        sgd.set_param_groups([{"params": [], "momentum": 0.9}])


def make_run(cpu):
    net = CharModel()
    rms = opt.RMSProp(lr=opt.WarmupCosineDecay(0.02, 2, 6), weight_decay=0.01)
    net.set_optimizer(rms)
    net.compile([char_batch(cpu, 0)[0]], is_train=True)
    rms.set_param_groups(opt.decay_groups(net, 0.01))
    return net, rms


def test_resume_equals_uninterrupted(cpu, tmp_path):
    cpu.SetRandSeed(5)
    whole, _ = make_run(cpu)
    for s in range(6):
        whole(*char_batch(cpu, s))
    cpu.SetRandSeed(5)
    first, rms = make_run(cpu)
    for s in range(3):
        first(*char_batch(cpu, s))
    path = tmp_path / "char.ckpt"
    first.save_states(path, {"opt": rms.get_states()})
    cpu.SetRandSeed(9)  # other initial values
    second = CharModel()
    rms2 = opt.RMSProp(lr=opt.WarmupCosineDecay(0.02, 2, 6), weight_decay=0.01)  # no groups: the file has them
    second.set_optimizer(rms2)
    second.compile([char_batch(cpu, 0)[0]], is_train=True)
    aux = second.load_states(path)
    rms2.set_states(aux["opt"])
    assert rms2.step_counter == 3 and rms2.lr == pytest.approx(rms.lr)
    assert [g["weight_decay"] for g in rms2.param_groups] == [0.01, 0.0]
    for s in range(3, 6):
        second(*char_batch(cpu, s))
    for k, v in whole.get_params().items():
        np.testing.assert_array_equal(second.get_params()[k].to_numpy(), v.to_numpy(), err_msg=k)


def test_distopt_wraps_grouped_optimizers(cpu):
    net = CharModel()
    inner = opt.AdaGrad(lr=0.05)
    dist = opt.DistOpt(inner)
    net.set_optimizer(dist)
    x, y = char_batch(cpu, 0)
    net.compile([x], is_train=True)
    dist.set_param_groups(opt.decay_groups(net, 0.02))
    assert [g["weight_decay"] for g in dist.param_groups] == [0.02, 0.0]
    out = net.forward(x)
    loss = autograd.softmax_cross_entropy(out, y)
    before = net.get_params()["fc.weight"].to_numpy().copy()
    dist.backward_and_update(loss)
    assert not np.array_equal(net.get_params()["fc.weight"].to_numpy(), before)
