"""The calls SINGA's char-RNN, transformer and GAN examples make of the API, each against its meaning:
a second backward over a kept graph, optimizer steps on their loss's gradients alone, the truth of
tensors, arithmetic across dtypes, labels of N elements as class indices, recurrent layers broadcasting a
batch of one, tensor attributes as parameters, device_check / dtype_check, and embedding tables drawn
again or frozen."""
import numpy as np
import pytest

from tandem import autograd, layer, model, opt, tensor


def param(values, cpu):
    t = tensor.Tensor(data=np.asarray(values, dtype=np.float32), device=cpu, requires_grad=True, stores_grad=True)
    return t


# ---- backward passes and optimizer steps
def test_backward_runs_again_over_the_graph_of_a_loss(cpu):
    w = param([1.0, -2.0, 0.5], cpu)
    x = tensor.from_numpy(np.array([3.0, 1.0, -1.0], dtype=np.float32), cpu)
    loss = autograd.reduce_sum(autograd.mul(autograd.mul(w, w), x), keepdims=0)  # sum(w^2 x): 2 w x
    first = [g.to_numpy() for _, g in autograd.backward(loss)]
    second = [g.to_numpy() for _, g in autograd.backward(loss)]  # fresh, not added to the first
    np.testing.assert_allclose(first[0], [6.0, -4.0, -1.0])
    np.testing.assert_allclose(second[0], first[0])
    # An optimizer's step after the loop: its own pass over the kept graph, with fresh gradients.
    sgd = opt.SGD(lr=0.1)
    sgd(loss)
    np.testing.assert_allclose(w.to_numpy(), [1.0 - 0.6, -2.0 + 0.4, 0.5 + 0.1], rtol=1e-6)
    with pytest.raises(Exception, match="second time"):  # the optimizer's pass freed it
        list(autograd.backward(loss))


def test_a_discriminator_stepped_twice_on_one_loss_as_singas_vanilla_gan(cpu):
    # SINGA's vanilla GAN applies each discriminator gradient, then calls the optimizer on the same
    # loss: two steps of the loss's gradient (here x, whatever w is).
    w = param([0.5, 0.5], cpu)
    w.name = "dis_net.w"
    x = tensor.from_numpy(np.array([2.0, -1.0], dtype=np.float32), cpu)
    loss = autograd.reduce_sum(autograd.mul(w, x), keepdims=0)
    sgd = opt.SGD(lr=0.25)
    for p, g in autograd.backward(loss):
        if "dis_net" in p.name:
            sgd.apply(p.name, p, g)
    sgd(loss)
    np.testing.assert_allclose(w.to_numpy(), [0.5 - 2 * 0.25 * 2.0, 0.5 + 2 * 0.25 * 1.0], rtol=1e-6)


def test_optimizer_steps_apply_their_own_losses_gradients(cpu):
    w = param([1.0, 1.0], cpu)
    x = tensor.from_numpy(np.array([1.0, 3.0], dtype=np.float32), cpu)
    sgd = opt.SGD(lr=0.5)
    autograd.reduce_sum(autograd.mul(w, x), keepdims=0).backward()  # a gradient left on w
    sgd(autograd.reduce_sum(autograd.mul(w, w), keepdims=0))        # steps on 2 w alone
    np.testing.assert_allclose(w.to_numpy(), [0.0, 0.0], atol=1e-7)
    # Accumulating passes and then step() applies their sum, as before.
    autograd.reduce_sum(w, keepdims=0).backward()
    autograd.reduce_sum(w, keepdims=0).backward()
    sgd.step()
    np.testing.assert_allclose(w.to_numpy(), [-1.0, -1.0], atol=1e-7)


def test_gradients_can_be_dropped_or_set(cpu):
    w = param([1.0, 2.0], cpu)
    autograd.reduce_sum(autograd.mul(w, w), keepdims=0).backward()
    np.testing.assert_allclose(w.grad.to_numpy(), [2.0, 4.0])
    w.grad = None
    assert w.grad is None
    w.grad = tensor.from_numpy(np.array([5.0, 6.0], dtype=np.float32), cpu)
    np.testing.assert_allclose(w.grad.to_numpy(), [5.0, 6.0])
    with pytest.raises(ValueError, match="set_grad"):
        w.grad = tensor.from_numpy(np.zeros(3, dtype=np.float32), cpu)


# ---- tensors
def test_tensors_are_true_and_comparison_masks_keep_numpys_rule(cpu):
    labels = None
    assert not labels
    labels = tensor.from_numpy(np.zeros((4, 1), dtype=np.int32), cpu)
    assert labels and bool(tensor.from_numpy(np.zeros(1, dtype=np.float32), cpu))  # SINGA's: a tensor is true
    t = tensor.from_numpy(np.arange(3, dtype=np.float32), cpu)
    with pytest.raises(ValueError, match="ambiguous"):
        bool(t == t)
    with pytest.raises(ValueError, match="ambiguous"):
        tensor.from_numpy(np.arange(3, dtype=np.float32), cpu) in [t]  # noqa: B015
    assert t in [t]  # by identity
    assert bool(tensor.from_numpy(np.array([2.0], dtype=np.float32), cpu) > 1)
    assert not (tensor.from_numpy(np.array([0.0], dtype=np.float32), cpu) > 1)


def test_binary_operations_take_operands_of_two_dtypes(cpu):
    ints = tensor.from_numpy(np.array([[1, 0], [0, 1]], dtype=np.int32), cpu)
    floats = tensor.from_numpy(np.array([[0.5, 0.25], [0.0, 2.0]], dtype=np.float32), cpu)
    for y, want in ((ints + floats, [[1.5, 0.25], [0.0, 3.0]]), (floats - ints, [[-0.5, 0.25], [0.0, 1.0]]),
                    (ints * floats, [[0.5, 0.0], [0.0, 2.0]]), (autograd.add(ints, floats), [[1.5, 0.25], [0.0, 3.0]])):
        assert y.dtype == tensor.float32
        np.testing.assert_allclose(y.to_numpy(), want)
    assert tensor.gt(ints + floats, 0.3).to_numpy().tolist() == [[1, 0], [0, 1]]
    wide = tensor.from_numpy(np.array([[2, 2], [2, 2]], dtype=np.int64), cpu, dtype=tensor.int64)
    assert (ints * wide).dtype == tensor.int64 and (ints * wide).to_numpy().tolist() == [[2, 0], [0, 2]]
    # The float operand's gradient goes through, the integer one takes none.
    w = param([[1.0, 1.0], [1.0, 1.0]], cpu)
    loss = autograd.reduce_sum(autograd.mul(autograd.add(w, ints), autograd.add(w, ints)), keepdims=0)
    (p, g), = list(autograd.backward(loss))
    np.testing.assert_allclose(g.to_numpy(), 2 * (1.0 + np.eye(2)))


def test_softmax_cross_entropy_reads_labels_of_n_elements_as_classes(cpu):
    rng = np.random.RandomState(0)
    logits = tensor.from_numpy(rng.standard_normal((6, 4)).astype(np.float32), cpu)
    idx = np.array([0, 3, 1, 1, 2, 0], dtype=np.int32)
    want = autograd.softmax_cross_entropy(logits, tensor.from_numpy(idx, cpu)).item()
    for labels in (idx.reshape(6, 1), idx.astype(np.float32), idx.astype(np.float32).reshape(6, 1)):
        t = tensor.from_numpy(labels, cpu)
        assert autograd.softmax_cross_entropy(logits, t).item() == pytest.approx(want, rel=1e-6)
        assert layer.SoftMaxCrossEntropy()(logits, t).item() == pytest.approx(want, rel=1e-6)
    one_class = tensor.from_numpy(rng.standard_normal((3, 1)).astype(np.float32), cpu)
    target = tensor.from_numpy(np.ones((3, 1), dtype=np.float32), cpu)  # [N, 1] of one class: targets
    assert autograd.softmax_cross_entropy(one_class, target).item() == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="do not fit logits"):
        autograd.softmax_cross_entropy(logits, tensor.from_numpy(idx[:5].reshape(5, 1), cpu))


def test_labels_and_indices_with_fractions_are_refused(cpu):
    # Read as class numbers, 1.7 would become class 1 without a word.
    rng = np.random.RandomState(1)
    logits = tensor.from_numpy(rng.standard_normal((6, 4)).astype(np.float32), cpu)
    frac = np.array([0, 3, 1.7, 1, 2, 0], dtype=np.float32)
    for labels in (frac, frac.reshape(6, 1)):
        t = tensor.from_numpy(labels, cpu)
        with pytest.raises(ValueError, match=r"softmax_cross_entropy: labels must be whole numbers.*element 2 .* 1\.7"):
            autograd.softmax_cross_entropy(logits, t)
        with pytest.raises(ValueError, match="labels must be whole numbers"):
            layer.SoftMaxCrossEntropy()(logits, t)
    with pytest.raises(ValueError, match="cross_entropy: labels must be whole numbers"):
        autograd.cross_entropy(autograd.softmax(logits), tensor.from_numpy(frac, cpu))
    with pytest.raises(ValueError, match="element 0 .* nan"):
        autograd.softmax_cross_entropy(logits, tensor.from_numpy(np.full(6, np.nan, np.float32), cpu))
    # Whole numbers in a floating tensor are classes, as SINGA's scripts pass them.
    idx = np.array([0, 3, 1, 1, 2, 0])
    probs = autograd.softmax(logits)
    want = autograd.cross_entropy(probs, tensor.from_numpy(idx.astype(np.int32), cpu)).item()
    assert autograd.cross_entropy(probs, tensor.from_numpy(idx.astype(np.float32), cpu)).item() == pytest.approx(want)
    emb = layer.Embedding(5, 3)
    with pytest.raises(ValueError, match=r"Embedding: indices must be whole numbers.*element 1 .* 2\.5"):
        emb(tensor.from_numpy(np.array([[0.0, 2.5]], dtype=np.float32), cpu))
    with pytest.raises(ValueError, match="embedding: indices must be whole numbers"):
        autograd.embedding(tensor.from_numpy(np.array([0.5], dtype=np.float32), cpu), emb.W)
    whole = emb(tensor.from_numpy(np.array([[0.0, 2.0]], dtype=np.float32), cpu)).to_numpy()
    np.testing.assert_array_equal(whole[0], emb.W.to_numpy()[[0, 2]])


# ---- layers
@pytest.mark.parametrize("kind", ["lstm", "rnn"])
def test_recurrent_layers_broadcast_a_batch_of_one_against_their_states(cpu, kind):
    rng = np.random.RandomState(2)
    T, N, I, H = 3, 4, 5, 6
    lay = layer.LSTM(I, H) if kind == "lstm" else layer.RNN(I, H)
    x1 = rng.standard_normal((T, 1, I)).astype(np.float32)
    h0 = rng.standard_normal((N, H)).astype(np.float32)
    c0 = rng.standard_normal((N, H)).astype(np.float32)
    states = lambda: ((tensor.from_numpy(h0, cpu), tensor.from_numpy(c0, cpu)) if kind == "lstm"  # noqa: E731
                      else tensor.from_numpy(h0, cpu))
    one = lay([tensor.from_numpy(x1[t], cpu) for t in range(T)], states())
    wide = lay([tensor.from_numpy(np.repeat(x1[t], N, 0), cpu) for t in range(T)], states())
    assert [y.shape for y in one[0]] == [(N, H)] * T
    for a, b in zip(one[0] + list(one[1:]), wide[0] + list(wide[1:])):
        np.testing.assert_allclose(a.to_numpy(), b.to_numpy(), rtol=1e-6)
    # States of batch 1 against inputs of batch N.
    xn = rng.standard_normal((T, N, I)).astype(np.float32)
    s1 = ((tensor.from_numpy(h0[:1], cpu), tensor.from_numpy(c0[:1], cpu)) if kind == "lstm"
          else tensor.from_numpy(h0[:1], cpu))
    sn = ((tensor.from_numpy(np.repeat(h0[:1], N, 0), cpu), tensor.from_numpy(np.repeat(c0[:1], N, 0), cpu))
          if kind == "lstm" else tensor.from_numpy(np.repeat(h0[:1], N, 0), cpu))
    a = lay([tensor.from_numpy(xn[t], cpu) for t in range(T)], s1)
    b = lay([tensor.from_numpy(xn[t], cpu) for t in range(T)], sn)
    np.testing.assert_allclose(a[0][-1].to_numpy(), b[0][-1].to_numpy(), rtol=1e-6)
    with pytest.raises(ValueError):  # batches of 2 and 4 do not broadcast
        lay([tensor.from_numpy(xn[t, :2], cpu) for t in range(T)], states())


class Scaled(layer.Layer):
    """A layer written as SINGA's custom layers are: its parameter a tensor attribute made in initialize."""

    def initialize(self, x):
        self.W = tensor.Tensor(shape=(x.shape[1], 3), device=x.device, requires_grad=True, stores_grad=True)
        self.W.gaussian(0.0, 0.1)
        self.fixed = tensor.Tensor(shape=(3,), device=x.device, requires_grad=False)  # not a parameter
        self.fixed.set_value(1.0)

    def forward(self, x):
        self.device_check(x, self.W, self.fixed)
        return autograd.mul(autograd.matmul(x, self.W), self.fixed)


class TwoLayers(model.Model):
    def __init__(self):
        super().__init__()
        self.blocks = [Scaled()]  # held in a list only, as SINGA's transformer holds its layers
        self.fc = layer.Linear(2)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc(self.blocks[0](x))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def test_tensor_attributes_that_store_gradients_are_parameters(cpu):
    x = tensor.from_numpy(np.random.RandomState(3).standard_normal((5, 4)).astype(np.float32), cpu)
    y = tensor.from_numpy(np.array([0, 1, 1, 0, 1], dtype=np.int32).reshape(5, 1), cpu)
    net = TwoLayers()
    net.set_optimizer(opt.SGD(lr=0.1))
    net.compile([x], is_train=True)
    names = sorted(net.get_params())
    assert names == ["Scaled_0.W", "fc.bias", "fc.weight"], names
    assert "Scaled_0.fixed" not in net.get_states()
    before = net.get_params()["Scaled_0.W"].to_numpy()
    losses = [tensor.to_numpy(net(x, y)[1])[0] for _ in range(20)]
    assert not np.allclose(net.get_params()["Scaled_0.W"].to_numpy(), before)  # trained
    assert losses[-1] < losses[0]
    saved = {k: v.to_numpy() for k, v in net.get_states().items()}
    net(x, y)
    net.set_states(saved)
    np.testing.assert_array_equal(net.get_params()["Scaled_0.W"].to_numpy(), saved["Scaled_0.W"])


def test_dtype_check_converts_to_the_first_tensors_dtype(cpu):
    lay = Scaled()
    a = tensor.from_numpy(np.zeros((2, 2), dtype=np.float32), cpu)
    b = tensor.from_numpy(np.ones((2, 2)), cpu, dtype=tensor.float64)
    c = tensor.from_numpy(np.ones((2,), dtype=np.int32), cpu)
    lay.dtype_check(a, b, c)
    assert b.dtype == tensor.float32 and c.dtype == tensor.float32
    lay.device_check(a, b)  # one device: nothing moves
    assert b.device == a.device


def test_embedding_initialized_again_draws_into_the_same_table(cpu):
    emb = layer.Embedding(6, 3)
    x = tensor.from_numpy(np.array([[0, 5]], dtype=np.int32), cpu)
    emb.initialize(x)
    w = emb.W
    first, ptr = w.to_numpy().copy(), w.data_ptr
    emb.from_pretrained(tensor.from_numpy(np.ones((6, 3), dtype=np.float32), cpu), freeze=True)
    assert not emb.W.requires_grad
    emb.initialize(x)  # SINGA's scripts call it before every from_pretrained
    assert emb.W.data_ptr == ptr and emb.W.requires_grad
    assert not np.allclose(emb.W.to_numpy(), first) and not np.allclose(emb.W.to_numpy(), 1.0)


class FrozenTable(model.Model):
    def __init__(self):
        super().__init__()
        self.table = layer.Embedding(5, 3)
        self.fc = layer.Linear(2)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc(autograd.reshape(self.table(x), [-1, 3]))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def test_a_frozen_table_is_left_out_of_the_optimizer(cpu):
    x = tensor.from_numpy(np.array([[0, 1], [2, 4]], dtype=np.int32), cpu)
    y = tensor.from_numpy(np.array([0, 1, 1, 0], dtype=np.int32), cpu)
    net = FrozenTable()
    net.compile([x], is_train=True)
    table = np.arange(15, dtype=np.float32).reshape(5, 3) / 15
    net.table.from_pretrained(tensor.from_numpy(table, cpu), freeze=True)
    net.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    fc_before = net.fc.W.to_numpy().copy()
    for _ in range(3):
        net(x, y)
    np.testing.assert_array_equal(net.table.W.to_numpy(), table)
    assert not np.allclose(net.fc.W.to_numpy(), fc_before)


class Gain(layer.Layer):
    """A layer that makes its own parameters: a gain registered in __init__, a shift as a tensor attribute
    made in initialize (SINGA's way)."""

    def __init__(self):
        super().__init__()
        self.g = self.register_param("g", tensor.from_numpy(np.array([1.5, -0.5, 2.0], dtype=np.float32)))

    def initialize(self, x):
        self.b = tensor.Tensor(shape=(3,), device=x.device, requires_grad=True, stores_grad=True)
        self.b.set_value(0.25)

    def forward(self, x):
        return autograd.add(autograd.mul(x, self.g), self.b)


class GainNet(model.Model):
    def __init__(self):
        super().__init__()
        self.gain = Gain()
        self.fc = layer.Linear(2)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc(self.gain(x))

    def train_one_batch(self, x, y):
        loss = self.loss(self.forward(x), y)
        self.optimizer(loss)
        return loss


OPTIMIZERS = {"SGD": lambda: opt.SGD(lr=0.1, momentum=0.9, weight_decay=0.1), "Adam": lambda: opt.Adam(lr=0.1),
              "DistOpt": lambda: opt.DistOpt(opt.Adam(lr=0.1, weight_decay=0.1))}


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_frozen_parameters_stay_frozen(cpu, kind):
    x = tensor.from_numpy(np.random.RandomState(2).standard_normal((5, 3)).astype(np.float32), cpu)
    y = tensor.from_numpy(np.array([0, 1, 1, 0, 1], dtype=np.int32), cpu)
    net = GainNet()
    net.gain.g.requires_grad = False  # registered, frozen before compile
    net.compile([x], is_train=True)
    net.gain.b.requires_grad = False  # a tensor attribute, frozen once it is a parameter
    sgd = OPTIMIZERS[kind]()
    net.set_optimizer(sgd)
    sgd.set_param_groups(opt.decay_groups(net, 0.01))  # the frozen ones, named there, have no settings to take
    assert sorted(n for g in sgd.param_groups for n in g["params"]) == ["fc.bias", "fc.weight"]
    params = net.get_params()
    assert sorted(params) == ["fc.bias", "fc.weight", "gain.b", "gain.g"], sorted(params)  # still parameters
    assert not params["gain.g"].requires_grad and not params["gain.b"].requires_grad
    before = {k: v.to_numpy().copy() for k, v in params.items()}
    for _ in range(3):
        net(x, y)
        net.get_params()  # listing the parameters again does not unfreeze them
    after = {k: v.to_numpy() for k, v in net.get_params().items()}
    np.testing.assert_array_equal(after["gain.g"], before["gain.g"])
    np.testing.assert_array_equal(after["gain.b"], before["gain.b"])
    assert not np.allclose(after["fc.weight"], before["fc.weight"])
    # Frozen after the optimizer took the parameters: a plain optimizer steps only parameters with a
    # gradient; DistOpt's buckets would still step it (momentum, decay), so it refuses.
    net.fc.W.requires_grad = False
    net.get_params()
    w = net.fc.W.to_numpy().copy()
    if kind == "DistOpt":
        with pytest.raises(ValueError, match="fc.weight was frozen .* after DistOpt took"):
            net(x, y)
    else:
        net(x, y)
        np.testing.assert_array_equal(net.fc.W.to_numpy(), w)
