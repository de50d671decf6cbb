"""Export to ONNX (sonnx.to_onnx): models trained in tandem (the guide's CNN, an MLP, a small residual network
with batch normalisation, and a model that makes the export write every operator it writes) become ONNX models
that onnx.checker accepts, that onnx's reference evaluator computes as tandem does, and that sonnx.prepare reads
back with the same outputs; operations with no ONNX form are refused by name."""
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx.reference import ReferenceEvaluator  # noqa: E402

from conftest import EXAMPLES  # noqa: E402
from tandem import _tandem, autograd, layer, model, opt, sonnx, tensor  # noqa: E402
from tandem import sonnx_export  # noqa: E402

sys.path.insert(0, str(EXAMPLES))
from doc_dist_train import CNN  # noqa: E402  (the guide's model)


def rand(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def check(m, inputs, want, rtol=1e-5, atol=1e-5):
    """m is a valid model, and the reference evaluator and sonnx.prepare both compute want from inputs."""
    onnx.checker.check_model(m, full_check=True)
    arrays = [i.to_numpy() if isinstance(i, tensor.Tensor) else i for i in inputs]
    want = [w.to_numpy() if isinstance(w, tensor.Tensor) else w for w in want]
    ref = ReferenceEvaluator(m).run(None, {i.name: a for i, a in zip(m.graph.input, arrays)})
    back = sonnx.prepare(m).run(arrays)
    assert len(ref) == len(back) == len(want)
    for k, (r, b, w) in enumerate(zip(ref, back, want)):
        np.testing.assert_allclose(r, w, rtol=rtol, atol=atol, err_msg=f"reference evaluator, output {k}")
        np.testing.assert_allclose(b, w, rtol=rtol, atol=atol, err_msg=f"sonnx.prepare, output {k}")


def ops_of(m):
    return {n.op_type for n in m.graph.node}


def train(net, x, y, steps=3, lr=0.05):
    net.set_optimizer(opt.SGD(lr=lr, momentum=0.9))
    net.compile([x], is_train=True)
    for _ in range(steps):
        net(x, y)
    net.eval()


def test_the_guides_cnn_trained_exports_as_singa_calls_it():
    """SINGA's call, to_onnx([x], [y]) on outputs computed while recording, and the model form."""
    net = CNN()
    x = tensor.from_numpy(rand((4, 1, 28, 28), 1))
    train(net, x, tensor.from_numpy(np.array([1, 3, 5, 7], np.int32)))
    with sonnx.record():
        y = net(x)
    m = sonnx.to_onnx([x], [y])
    assert {"Conv", "Relu", "MaxPool", "Flatten", "Gemm"} <= ops_of(m)
    names = {i.name for i in m.graph.initializer}
    assert len(names) == 8  # two weights and biases of each of the four layers, under their names
    check(m, [x], [y])
    m2 = sonnx.to_onnx([x], net)
    check(m2, [x], [y])
    assert [n.op_type for n in m2.graph.node] == [n.op_type for n in m.graph.node]


class MLP(model.Model):
    def __init__(self):
        super().__init__()
        self.hidden = layer.Linear(16)
        self.relu = layer.ReLU()
        self.scores = layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return autograd.softmax(self.scores(self.relu(self.hidden(x))))

    def train_one_batch(self, x, y):
        out = self.scores(self.relu(self.hidden(x)))
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def test_an_mlp_exports_and_reads_back():
    net = MLP()
    x = tensor.from_numpy(rand((8, 5), 2))
    train(net, x, tensor.from_numpy(np.arange(8, dtype=np.int32) % 3))
    m = sonnx.to_onnx([x], net)
    assert ops_of(m) >= {"Gemm", "Relu", "Softmax"}
    check(m, [x], [net(x)])
    # The graph's input shape is the recorded one.
    assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim] == [8, 5]


class Block(layer.Layer):
    def __init__(self, channels, stride):
        super().__init__()
        self.conv1 = layer.Conv2d(channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = layer.BatchNorm2d()
        self.relu1 = layer.ReLU()
        self.conv2 = layer.Conv2d(channels, 3, padding=1, bias=False)
        self.bn2 = layer.BatchNorm2d()
        self.down = layer.Conv2d(channels, 1, stride=stride, bias=False) if stride != 1 else None
        self.add = layer.Add()
        self.relu2 = layer.ReLU()

    def forward(self, x):
        y = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        return self.relu2(self.add(y, self.down(x) if self.down is not None else x))


class ResNetish(model.Model):
    def __init__(self):
        super().__init__()
        self.stem = layer.Conv2d(8, 3, padding=1)
        self.bn = layer.BatchNorm2d()
        self.relu = layer.ReLU()
        self.pool = layer.MaxPool2d(3, 2, padding=1)
        self.block1 = Block(8, 1)
        self.block2 = Block(16, 2)
        self.avg = layer.AvgPool2d(3, 1, padding=1)
        self.flatten = layer.Flatten()
        self.fc = layer.Linear(5)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        y = self.pool(self.relu(self.bn(self.stem(x))))
        y = self.block2(self.block1(y))
        return self.fc(self.flatten(self.avg(y)))

    def train_one_batch(self, x, t):
        out = self.forward(x)
        loss = self.loss(out, t)
        self.optimizer(loss)
        return out, loss


def test_a_small_residual_network_with_batch_norm_exports_its_running_statistics():
    net = ResNetish()
    x = tensor.from_numpy(rand((4, 3, 11, 9), 3))
    train(net, x, tensor.from_numpy(np.array([0, 1, 2, 4], np.int32)))
    mean = net.bn.running_mean.to_numpy()
    assert np.abs(mean).max() > 0  # the statistics moved in training: the export must carry them
    m = sonnx.to_onnx([x], net)
    assert ops_of(m) >= {"Conv", "BatchNormalization", "Relu", "MaxPool", "Add", "AveragePool", "Flatten", "Gemm"}
    check(m, [x], [net(x)], rtol=1e-4)
    assert net.training is False  # the mode it was in
    # In training mode, batch normalisation uses the batch's statistics: no ONNX graph computes that.
    net.train()
    with pytest.raises(NotImplementedError, match="BatchNorm2d in training mode.*model.eval"):
        with sonnx.record():
            y = net.forward(x)
        sonnx.to_onnx([x], [y])


class EveryOp(layer.Layer):
    """Layers and operations that make the export write each operator of sonnx_export.WRITTEN."""

    def __init__(self):
        super().__init__()
        self.conv = layer.Conv2d(4, 3, padding=1)
        self.bn = layer.BatchNorm2d()
        self.maxpool = layer.MaxPool2d(2, 2)
        self.ln = layer.LayerNorm(6)
        self.prelu = layer.PRelu()
        self.emb = layer.Embedding(7, 6)
        self.fc = layer.Linear(5)
        self.flatten = layer.Flatten()

    def forward(self, x, ids):
        a = self.bn(self.conv(x))                                          # [2, 4, 6, 6]
        b = self.ln(autograd.relu(a) - autograd.sigmoid(a) * autograd.tanh(a))
        c = autograd.cat([b, self.prelu(a)], 1)                            # [2, 8, 6, 6]
        p = _tandem.avg_pool2d(c, [3, 3], [2, 2], [1, 1], [0, 0], True, False)   # ceil mode, pads not counted
        q = self.maxpool(c)                                                # [2, 8, 3, 3]
        r = autograd.add(p, q) / 2.0
        s = autograd.depth_to_space(autograd.pad(r, "constant", [0, 0, 0, 1, 0, 0, 1, 0]), 2)  # [2, 2, 8, 8]
        t = autograd.upsample(autograd.globalaveragepool(s), "nearest", [1, 1, 2, 3])           # [2, 2, 2, 3]
        u = autograd.transpose(autograd.tile(t, [1, 2, 1, 1]), (0, 2, 3, 1))   # [2, 2, 3, 4]
        v = autograd.reshape(u, [2, 24]) ** 2.0
        e = autograd.reduce_sum(self.emb(ids), [1], 0)                     # [2, 6]
        g = autograd.gather(e, 1, [0, 2, 5])                               # [2, 3]
        gmax = _tandem.squeeze(autograd.reduce_max(g, [1], 1), [1])[:, None]   # Squeeze, then Unsqueeze
        head = self.fc(self.flatten(autograd.cat([v, gmax, autograd.reduce_min(g, [1], 1)], 1)))  # [2, 5]
        w = autograd.matmul(head, autograd.transpose(head, (1, 0)))       # [2, 2]
        # elementwise, comparisons and masks
        h = autograd.elu(head, 0.7) + autograd.selu(head) - autograd.leakyrelu(head, 0.1)
        h = h + autograd.hardsigmoid(head, 0.3, 0.4) + autograd.softplus(head) + autograd.softsign(head)
        h = h + autograd.gelu(head) + autograd.sin(head) * autograd.cos(head) + autograd.erf(head)
        h = h + autograd.sqrt(autograd.abs(head)) + autograd.reciprocal(autograd.abs(head) + 1.0)
        h = h + autograd.log(autograd.exp(head) + 1.0) + autograd.sign(head) + autograd.ceil(head)
        h = h - autograd.floor(head) + autograd.clip(head, -0.2, 0.3) + autograd.max(head, h) - autograd.min(head, h)
        m1 = autograd.greater(head, h)
        m2 = head <= 0.3
        m3 = autograd.Or()(autograd.And()(m1, m2)[0], autograd.equal(head, h))[0]
        m4 = autograd.Xor()(head >= -0.1, autograd.less_equal(head, autograd.less(head, h)))[0]
        m5 = autograd.not_equal(m3, m4)
        k = autograd.where(h, -h, m5)
        k = autograd.div(k, autograd.abs(k) + 1.0) + autograd.cast(autograd.cast(k * 4.0, tensor.int32), tensor.float32)
        parts = autograd.split(k, 1, [2, 3])
        sl = autograd.slice(parts[1], [0, 1], [2, 3], [0, 1])              # [2, 2]
        f = autograd.expand(autograd.reshape(autograd.reduce_mean(sl, [1], 1), [2, 1]), [2, 2])
        z = autograd.flatten(autograd.log_softmax(f + w, 1)) - autograd.softmax(-parts[0] * 1.5, 1)
        am = autograd.cast(_tandem.argmax_dim(z, 1, True), tensor.float32)
        return z, am, autograd.negative(q)


def test_a_model_that_writes_every_operator_exports_and_reads_back():
    net = EveryOp()
    x = tensor.from_numpy(rand((2, 3, 6, 6), 4))
    ids = tensor.from_numpy(np.array([[1, 4, 6], [0, 2, 2]], np.int64))
    net(x, ids)  # the parameters; then a batch-norm step moves its statistics
    net.train()
    net.bn(net.conv(x))
    net.eval()
    want = net(x, ids)
    m = sonnx.to_onnx([x, ids], net)
    missing = set(sonnx_export.WRITTEN) - ops_of(m)
    assert not missing, f"operators the model did not make the export write: {sorted(missing)}"
    assert set(sonnx_export.WRITTEN) <= set(sonnx.SUPPORTED)  # each is read back
    check(m, [x, ids], list(want), rtol=1e-4)


def test_python_operators_and_tensor_methods_export():
    """SINGA's Operator with a Python forward (singa_wrap's functions inside), tensor methods and operators."""
    from tandem import singa_wrap

    class Scale2(autograd.Operator):
        def forward(self, x):
            return singa_wrap.MultFloat(singa_wrap.Tanh(x), 2.0)

        def backward(self, dy):
            return dy

    x = tensor.from_numpy(rand((3, 4), 5))

    def fn(x):
        y = Scale2()(x)[0]
        y = (y.reshape(4, 3).T() @ x.T()) + 1.5
        return (3.0 - y[1:, ::2]) / 4.0, tensor.sum(abs(y)) * (y > 0.5)

    want = fn(x)
    m = sonnx.to_onnx([x], fn)
    check(m, [x], list(want))


def test_what_has_no_onnx_form_is_refused_by_name():
    x4 = tensor.from_numpy(rand((1, 2, 3, 4), 6))
    with pytest.raises(NotImplementedError, match="scaled_dot_product_attention"):
        sonnx.to_onnx([x4], lambda x: autograd.scaled_dot_product_attention(x, x, x) + 1.0)
    x = tensor.from_numpy(rand((2, 3, 4), 6))
    lstm = layer.LSTM(4, 5)
    with pytest.raises(NotImplementedError, match="RecurrentNet"):
        sonnx.to_onnx([x], lambda x: lstm(x)[0])
    # A value read back to the host and used after: the graph could not compute that.
    with pytest.raises(NotImplementedError, match="back to the host"):
        sonnx.to_onnx([x], lambda x: x * float(autograd.reduce_sum(x, None, 0).item()))
    # What is read after the outputs are computed does not matter.
    def read_after(x):
        y = autograd.relu(x)
        y.to_numpy()
        return y
    check(sonnx.to_onnx([x], read_after), [x], [read_after(x)])
    # A function held from before the recording started (as a library might keep one) is not seen: the
    # tensor it makes is new, so it is refused rather than taken for a constant.
    unseen_relu = _tandem.relu
    with pytest.raises(NotImplementedError, match="did not see"):
        sonnx.to_onnx([x], lambda x: unseen_relu(x * 2.0) + 1.0)
    # An output that the recording did not make.
    y = autograd.relu(x)
    with sonnx.record():
        autograd.relu(x)
    with pytest.raises(ValueError, match="not computed while recording"):
        sonnx.to_onnx([x], [y])
    with pytest.raises(TypeError, match="must be a tandem Tensor"):
        sonnx.to_onnx([x.to_numpy()], [y])


def test_recording_leaves_other_threads_and_the_api_as_they_were():
    import threading

    before = (_tandem.relu, tensor.Tensor.__add__, autograd.ReLU._fn)
    seen = []

    def other():
        seen.append(float(autograd.relu(tensor.from_numpy(np.ones((2,), np.float32))).to_numpy()[0]))

    x = tensor.from_numpy(rand((2, 2), 7))
    with sonnx.record() as r:
        t = threading.Thread(target=other)
        t.start()
        t.join()
        y = autograd.relu(x)
    assert seen == [1.0]
    assert all(c.op != "relu" or c.out.shape == (2, 2) for c in r.recording.calls)
    assert (_tandem.relu, tensor.Tensor.__add__, autograd.ReLU._fn) == before
    check(r.to_onnx([x], [y]), [x], [y])


@pytest.mark.parametrize("make", ["cnn", "attention", "older_opsets"])
def test_graphs_read_by_prepare_export_again(make):
    """An ONNX graph run by a SONNXModel records like any model: shapes it computes are folded, its weights
    become initializers again, and the reference evaluator gives the first graph's outputs."""
    import test_sonnx

    m, feeds = getattr(test_sonnx, make)()
    net = sonnx.SONNXModel(m)
    xs = [tensor.from_numpy(v) for v in feeds.values()]
    net.eval()
    out = sonnx.to_onnx(xs, lambda *x: net.forward(*x))
    assert "Shape" not in ops_of(out)
    check(out, xs, test_sonnx.reference(m, feeds))
