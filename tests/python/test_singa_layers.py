"""SINGA's layer API as its example models use it: Conv2d's forms and groups, SeparableConv2d, Add,
Cat, pooling, register_layers and layers held in closures, and five models in the shapes of SINGA's
examples (CNN, MLP, AlexNet, ResNet, Xception) trained on MNIST-shaped batches."""
import inspect
from collections import OrderedDict

import numpy as np
import pytest

from tandem import _tandem, autograd, layer, model, opt, tensor


def rand(shape, seed=0):
    return np.random.RandomState(seed).standard_normal(shape).astype(np.float32)


def conv_ref(x, w, b, stride, pad, groups=1):
    """Direct NCHW convolution in float64, group by group."""
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    kg = k // groups
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - r) // stride + 1, (wd + 2 * pad - s) // stride + 1
    out = np.zeros((n, k, oh, ow))
    for g in range(groups):
        wg = w[g * kg:(g + 1) * kg].astype(np.float64)
        for i in range(oh):
            for j in range(ow):
                patch = xp[:, g * cg:(g + 1) * cg, i * stride:i * stride + r, j * stride:j * stride + s]
                out[:, g * kg:(g + 1) * kg, i, j] = np.tensordot(patch, wg, axes=([1, 2, 3], [1, 2, 3]))
    return out + (0 if b is None else b[None, :, None, None])


# SINGA's signatures (python/singa/layer.py), parameter by parameter: (name, kind, default).
POS, VAR, KW, VARKW = "POSITIONAL_OR_KEYWORD", "VAR_POSITIONAL", "KEYWORD_ONLY", "VAR_KEYWORD"
EMPTY = inspect.Parameter.empty
SINGA_LAYER_SIGNATURES = {
    "Conv2d": [("nb_kernels", POS, EMPTY), ("kernel_size", POS, EMPTY), ("args", VAR, EMPTY), ("stride", KW, 1),
               ("padding", KW, 0), ("dilation", KW, 1), ("group", KW, 1), ("bias", KW, True),
               ("pad_mode", KW, "NOTSET"), ("activation", KW, "NOTSET"), ("kwargs", VARKW, EMPTY)],
    "SeparableConv2d": [("nb_kernels", POS, EMPTY), ("kernel_size", POS, EMPTY), ("args", VAR, EMPTY),
                        ("stride", KW, 1), ("padding", KW, 0), ("bias", KW, False)],
    "Pooling2d": [("kernel_size", POS, EMPTY), ("stride", POS, None), ("padding", POS, 0), ("is_max", POS, True),
                  ("pad_mode", POS, "NOTSET")],
    "MaxPool2d": [("kernel_size", POS, EMPTY), ("stride", POS, None), ("padding", POS, 0),
                  ("pad_mode", POS, "NOTSET")],
    "AvgPool2d": [("kernel_size", POS, EMPTY), ("stride", POS, None), ("padding", POS, 0),
                  ("pad_mode", POS, "NOTSET")],
    "Dropout": [("ratio", POS, 0.5)],
    "Flatten": [("axis", POS, 1)],
    "Cat": [("axis", POS, 0)],
}


@pytest.mark.parametrize("name", sorted(SINGA_LAYER_SIGNATURES))
def test_layer_signatures_are_singas(name):
    params = list(inspect.signature(getattr(layer, name).__init__).parameters.values())[1:]
    assert [(p.name, p.kind.name, p.default) for p in params] == SINGA_LAYER_SIGNATURES[name]


def test_conv2d_forms(cpu):
    x = rand((2, 3, 9, 9))
    t = tensor.from_numpy(x, cpu)
    new = layer.Conv2d(4, 3)  # SINGA's form: the input channels from the first call
    assert new(t).shape == (2, 4, 7, 7) and new.in_channels == 3 and new.W.shape == (4, 3, 3, 3)
    old = layer.Conv2d(3, 5, 3, 2, 1, bias=False)  # Xception's: in, out, kernel, stride, padding
    y = old(t)
    assert old.stride == (2, 2) and old.padding == (1, 1) and old.b is None
    np.testing.assert_allclose(y.to_numpy(), conv_ref(x, old.W.to_numpy(), None, 2, 1), rtol=1e-4, atol=1e-4)
    layer.Conv2d(4, 3, cudnn_prefer="fastest", workspace_MB_limit=512)(t)  # cuDNN's tuning: accepted
    same = layer.Conv2d(2, 3, stride=2, pad_mode="SAME_UPPER")
    assert same(tensor.from_numpy(rand((1, 3, 9, 9)), cpu)).shape == (1, 2, 5, 5) and same.padding == (1, 1)
    with pytest.raises(TypeError, match="cudnn_prefered"):
        layer.Conv2d(4, 3, cudnn_prefered="fastest")
    with pytest.raises(ValueError, match="dilation"):
        layer.Conv2d(4, 3, dilation=2)
    with pytest.raises(ValueError, match="built for 2 input channels"):
        layer.Conv2d(2, 4, 3)(t)
    with pytest.raises(ValueError, match="padding must be the same on both sides"):
        layer.Conv2d(4, 3, padding=(1, 0, 1, 1))
    with pytest.raises(ValueError, match="split evenly"):
        layer.Conv2d(2, 2, pad_mode="SAME_LOWER")(t)  # 9 -> 9 with a kernel of 2: one padded row


@pytest.mark.parametrize("groups,k", [(3, 6), (3, 3), (1, 4)])
def test_grouped_conv2d_against_numpy(cpu, groups, k):
    x = rand((2, 6, 7, 6), seed=groups)
    conv = layer.Conv2d(k, 3, stride=1, padding=1, group=groups, activation="RELU")
    y = conv(tensor.from_numpy(x, cpu))
    w, b = conv.W.to_numpy(), conv.b.to_numpy()
    assert w.shape == (k, 6 // groups, 3, 3)
    np.testing.assert_allclose(y.to_numpy(), np.maximum(conv_ref(x, w, b, 1, 1, groups), 0), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="group"):
        layer.Conv2d(4, 3, group=3)  # 4 filters in 3 groups


def test_separable_conv2d_against_numpy(cpu):
    x = rand((2, 4, 8, 8))
    sep = layer.SeparableConv2d(4, 6, 3, 1, 1)  # Xception's form: in, out, kernel, stride, padding
    y = sep(tensor.from_numpy(x, cpu))
    params = sep.get_params()
    assert list(params) == ["depthwise_conv.weight", "point_conv.weight"]  # bias=False, SINGA's default
    dw, pw = params["depthwise_conv.weight"].to_numpy(), params["point_conv.weight"].to_numpy()
    assert dw.shape == (4, 1, 3, 3) and pw.shape == (6, 4, 1, 1)
    want = conv_ref(conv_ref(x, dw, None, 1, 1, groups=4).astype(np.float32), pw, None, 1, 0)
    np.testing.assert_allclose(y.to_numpy(), want, rtol=1e-4, atol=1e-4)
    # Gradients reach both halves.
    list(autograd.backward(_flat_sum(y)))  # SINGA's backward is a generator: iterated, it runs
    assert np.abs(params["depthwise_conv.weight"].grad.to_numpy()).sum() > 0
    with pytest.raises(ValueError, match="built for 3 input channels"):
        layer.SeparableConv2d(3, 6, 3)(tensor.from_numpy(x, cpu))


def _flat_sum(t):
    return _tandem.reshape(_tandem.sum(t), [1])


def test_add_cat_reshape_and_pooling(cpu):
    a, b = rand((2, 3, 4, 4)), rand((2, 3, 4, 4), seed=1)
    ta, tb = tensor.from_numpy(a, cpu), tensor.from_numpy(b, cpu)
    np.testing.assert_allclose(layer.Add()(ta, tb).to_numpy(), a + b, rtol=1e-6)
    c = rand((2, 5, 4, 4), seed=2)
    np.testing.assert_array_equal(layer.Cat(1)([ta, tensor.from_numpy(c, cpu)]).to_numpy(),
                                  np.concatenate([a, c], axis=1))
    np.testing.assert_array_equal(layer.Cat()([ta, tb]).to_numpy(), np.concatenate([a, b]))
    np.testing.assert_array_equal(layer.Reshape()(ta, (2, -1)).to_numpy(), a.reshape(2, -1))
    # The gradient of a joined tensor reaches each part.
    wa = tensor.from_numpy(a, cpu)
    wa.requires_grad = True
    list(autograd.backward(_flat_sum(layer.Cat(1)([wa, wa]))))
    np.testing.assert_array_equal(wa.grad.to_numpy(), np.full(a.shape, 2.0))
    with pytest.raises(ValueError, match="outside dimension 0"):
        layer.Cat(0)([ta, tensor.from_numpy(c, cpu)])
    # Pooling as Xception's and ResNet's (padding 1 around a 3x3 window; a 7x7 average).
    x = rand((1, 2, 9, 9))
    got = layer.MaxPool2d(3, 2, 1)(tensor.from_numpy(x, cpu)).to_numpy()
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    want = np.array([[[[xp[0, ch, 2 * i:2 * i + 3, 2 * j:2 * j + 3].max() for j in range(5)] for i in range(5)]
                      for ch in range(2)]])
    np.testing.assert_array_equal(got, want)
    avg = layer.Pooling2d(7, stride=1, is_max=False)(tensor.from_numpy(rand((1, 2, 7, 7)), cpu))
    np.testing.assert_allclose(avg.to_numpy().reshape(2), rand((1, 2, 7, 7)).mean(axis=(2, 3)).reshape(2),
                               rtol=1e-5)
    assert layer.MaxPool2d(3, 1, pad_mode="SAME_UPPER")(tensor.from_numpy(x, cpu)).shape == (1, 2, 9, 9)
    assert layer.AvgPool1d(2)(tensor.from_numpy(rand((1, 2, 1, 8)), cpu)).shape == (1, 2, 1, 4)


class _Stage(layer.Layer):
    """Layers in a list and a downsampling pair held only in a closure, as SINGA's ResNet keeps them."""

    def __init__(self):
        super().__init__()
        conv, bn = layer.Conv2d(2, 4, 1, bias=False), layer.BatchNorm2d(4)

        def downsample(x):
            return bn(conv(x))

        self.downsample = downsample
        self.blocks = [layer.Conv2d(2, 4, 3, padding=1), layer.ReLU()]
        self.register_layers(*self.blocks)
        self.add = layer.Add()

    def forward(self, x):
        y = x
        for b in self.blocks:
            y = b(y)
        return self.add(y, self.downsample(x))


def test_register_layers_and_layers_in_closures(cpu):
    stage = _Stage()
    stage(tensor.from_numpy(rand((2, 2, 5, 5)), cpu))
    assert list(stage.get_params()) == ["Conv2d_0.weight", "Conv2d_0.bias", "Conv2d_1.weight", "BatchNorm2d_0.gamma",
                                        "BatchNorm2d_0.beta"]
    assert list(stage.get_states())[-2:] == ["BatchNorm2d_0.running_mean", "BatchNorm2d_0.running_var"]
    assert stage.Conv2d_0 is stage.blocks[0] and stage.ReLU_1 is stage.blocks[1]  # SINGA's attribute access
    named = layer.Layer()
    named.register_layers(OrderedDict([("first", layer.ReLU()), ("second", layer.Linear(2))]))
    assert list(named._layers) == ["first", "second"]
    with pytest.raises(ValueError, match="already names another sublayer"):
        named.register_layers(OrderedDict([("first", layer.ReLU())]))
    with pytest.raises(TypeError, match="takes layers"):
        named.register_layers(lambda x: x)


class _ClosureNet(model.Model):
    def __init__(self):
        super().__init__()
        self.stage = _Stage()
        self.flatten = layer.Flatten()
        self.fc = layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc(self.flatten(self.stage(x)))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss

    def set_optimizer(self, optimizer):  # as SINGA's example models do: compile hands it the parameters
        self.optimizer = optimizer


def test_layers_in_closures_are_trained(cpu):
    net = _ClosureNet()
    x = tensor.from_numpy(rand((4, 2, 5, 5)), cpu)
    y = tensor.from_numpy(np.array([0, 1, 2, 1], np.int32), cpu)
    net.set_optimizer(opt.SGD(lr=0.1))
    net.compile([x], is_train=True)
    before = {k: v.to_numpy() for k, v in net.get_params().items()}
    net(x, y)
    for name in ("stage.Conv2d_1.weight", "stage.BatchNorm2d_0.gamma"):  # the closure's layers
        assert not np.array_equal(net.get_params()[name].to_numpy(), before[name]), name


# ---- five models in the shapes of SINGA's examples (smaller), each with SINGA's train_one_batch

def _step(m, x, y, dist_option, spars):
    out = m.forward(x)
    loss = m.softmax_cross_entropy(out, y)
    if dist_option == "plain":
        m.optimizer(loss)
    elif dist_option == "half":
        m.optimizer.backward_and_update_half(loss)
    elif dist_option == "partialUpdate":
        m.optimizer.backward_and_partial_update(loss)
    elif dist_option == "sparseTopK":
        m.optimizer.backward_and_sparse_update(loss, topK=True, spars=spars)
    elif dist_option == "sparseThreshold":
        m.optimizer.backward_and_sparse_update(loss, topK=False, spars=spars)
    return out, loss


class _Singa(model.Model):
    train_one_batch = _step

    def set_optimizer(self, optimizer):
        self.optimizer = optimizer


class Cnn(_Singa):
    def __init__(self, num_classes=10, num_channels=1):
        super().__init__()
        self.conv1 = layer.Conv2d(num_channels, 8, 5, padding=0, activation="RELU")
        self.conv2 = layer.Conv2d(8, 8, 5, padding=0, activation="RELU")
        self.pooling1, self.pooling2 = layer.MaxPool2d(2, 2, padding=0), layer.MaxPool2d(2, 2, padding=0)
        self.flatten, self.relu = layer.Flatten(), layer.ReLU()
        self.linear1, self.linear2 = layer.Linear(32), layer.Linear(num_classes)
        self.softmax_cross_entropy = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        y = self.pooling2(self.conv2(self.pooling1(self.conv1(x))))
        return self.linear2(self.relu(self.linear1(self.flatten(y))))


class Mlp(_Singa):
    def __init__(self, num_classes=10):
        super().__init__()
        self.relu, self.flatten = layer.ReLU(), layer.Flatten()
        self.linear1, self.linear2 = layer.Linear(32), layer.Linear(num_classes)
        self.softmax_cross_entropy = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.linear2(self.relu(self.linear1(self.flatten(x))))


class AlexNetLike(_Singa):
    def __init__(self, num_classes=10, num_channels=1):
        super().__init__()
        self.conv1 = layer.Conv2d(num_channels, 8, 5, stride=2, padding=2)
        self.conv2 = layer.Conv2d(8, 16, 3, padding=1)
        self.relu1, self.relu2, self.relu3 = layer.ReLU(), layer.ReLU(), layer.ReLU()
        self.pooling1 = layer.MaxPool2d(2, 2, padding=0)
        self.avg_pooling1 = layer.AvgPool2d(3, 2, padding=0)
        self.flatten = layer.Flatten()
        self.dropout1 = layer.Dropout()
        self.linear1, self.linear2 = layer.Linear(32), layer.Linear(num_classes)
        self.softmax_cross_entropy = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        y = self.pooling1(self.relu1(self.conv1(x)))
        y = self.avg_pooling1(self.relu2(self.conv2(y)))
        return self.linear2(self.relu3(self.linear1(self.dropout1(self.flatten(y)))))


class Bottleneck(layer.Layer):
    expansion = 2

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1, self.bn1, self.relu1 = layer.Conv2d(inplanes, planes, 1, bias=False), layer.BatchNorm2d(planes), \
            layer.ReLU()
        self.conv2 = layer.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2, self.relu2 = layer.BatchNorm2d(planes), layer.ReLU()
        self.conv3 = layer.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = layer.BatchNorm2d(planes * self.expansion)
        self.add, self.relu3 = layer.Add(), layer.ReLU()
        self.downsample = downsample

    def forward(self, x):
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.relu2(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        residual = self.downsample(x) if self.downsample is not None else x
        return self.relu3(self.add(out, residual))


class ResNetLike(_Singa):
    def __init__(self, num_classes=10, num_channels=1):
        self.inplanes = 8  # before Layer.__init__, as SINGA's ResNet sets it
        super().__init__()
        self.conv1 = layer.Conv2d(num_channels, 8, 7, stride=2, padding=3, bias=False)
        self.bn1, self.relu = layer.BatchNorm2d(8), layer.ReLU()
        self.maxpool = layer.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1, layers1 = self._make_layer(4, 2)
        self.layer2, layers2 = self._make_layer(8, 2, stride=2)
        self.avgpool = layer.AvgPool2d(4, stride=1)
        self.flatten, self.fc = layer.Flatten(), layer.Linear(num_classes)
        self.softmax_cross_entropy = layer.SoftMaxCrossEntropy()
        self.register_layers(*layers1, *layers2)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            conv = layer.Conv2d(self.inplanes, planes * Bottleneck.expansion, 1, stride=stride, bias=False)
            bn = layer.BatchNorm2d(planes * Bottleneck.expansion)

            def downsample(x):
                return bn(conv(x))

        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * Bottleneck.expansion
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]

        def forward(x):
            for lay in layers:
                x = lay(x)
            return x

        return forward, layers

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        return self.fc(self.flatten(self.avgpool(x)))


class XBlock(layer.Layer):
    def __init__(self, in_filters, out_filters, reps, strides=1, padding=0, start_with_relu=True):
        super().__init__()
        if out_filters != in_filters or strides != 1:
            self.skip = layer.Conv2d(in_filters, out_filters, 1, stride=strides, padding=padding, bias=False)
            self.skipbn = layer.BatchNorm2d(out_filters)
        else:
            self.skip = None
        self.layers = []
        filters = in_filters
        for _ in range(reps):
            self.layers += [layer.ReLU(), layer.SeparableConv2d(filters, out_filters, 3, stride=1, padding=1,
                                                                 bias=False), layer.BatchNorm2d(out_filters)]
            filters = out_filters
        if not start_with_relu:
            self.layers = self.layers[1:]
        if strides != 1:
            self.layers.append(layer.MaxPool2d(3, strides, padding + 1))
        self.register_layers(*self.layers)
        self.add = layer.Add()

    def forward(self, x):
        y = x
        for lay in self.layers:
            y = lay(y)
        skip = self.skipbn(self.skip(x)) if self.skip is not None else x
        return self.add(y, skip)


class XceptionLike(_Singa):
    def __init__(self, num_classes=10, num_channels=1):
        super().__init__()
        self.conv1 = layer.Conv2d(num_channels, 8, 3, 2, 0, bias=False)
        self.bn1, self.relu1 = layer.BatchNorm2d(8), layer.ReLU()
        self.block1 = XBlock(8, 16, 2, 2, padding=0, start_with_relu=False)
        self.block2 = XBlock(16, 16, 2, 1)
        self.conv3 = layer.SeparableConv2d(16, 24, 3, 1, 1)
        self.bn3, self.relu3 = layer.BatchNorm2d(24), layer.ReLU()
        self.globalpooling = layer.MaxPool2d(7, 1)
        self.flatten, self.fc = layer.Flatten(), layer.Linear(num_classes)
        self.softmax_cross_entropy = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.block2(self.block1(x))
        x = self.relu3(self.bn3(self.conv3(x)))
        return self.fc(self.flatten(self.globalpooling(x)))


MODELS = {"cnn": Cnn, "mlp": Mlp, "alexnet": AlexNetLike, "resnet": ResNetLike, "xceptionnet": XceptionLike}


def mnist_batches(cpu, n=16, batches=2):
    """MNIST-shaped batches [N, 1, 28, 28], labels int32 [N], separable enough to learn in a few steps."""
    rng = np.random.RandomState(3)
    protos = rng.standard_normal((10, 1, 28, 28)).astype(np.float32)
    out = []
    for _ in range(batches):
        y = rng.randint(0, 10, n).astype(np.int32)
        x = protos[y] + 0.3 * rng.standard_normal((n, 1, 28, 28)).astype(np.float32)
        out.append((x, y))
    return out


@pytest.mark.parametrize("name", sorted(MODELS))
def test_singa_shaped_models_train_on_mnist_batches(cpu, name):
    net = MODELS[name]()
    data = mnist_batches(cpu)
    tx, ty = tensor.Tensor((16, 1, 28, 28), cpu, tensor.float32), tensor.Tensor((16,), cpu, tensor.int32)
    net.set_optimizer(opt.SGD(lr=0.05, momentum=0.9, weight_decay=1e-5))
    net.compile([tx], is_train=True, use_graph=False, sequential=False)
    names = list(net.get_params())
    assert net.optimizer._impl is not None and len(net.optimizer._impl.params()) == len(names)
    losses = []
    for epoch in range(6):
        for x, y in data:
            tx.copy_from_numpy(x)
            ty.copy_from_numpy(y)
            out, loss = net(tx, ty, "plain", None)
            losses.append(tensor.to_numpy(loss)[0])
    assert out.shape == (16, 10)
    assert np.mean(losses[-2:]) < np.mean(losses[:2]), losses
    net.eval()
    assert net(tx).shape == (16, 10)


@pytest.mark.parametrize("dist_option", ["plain", "half", "partialUpdate", "sparseTopK", "sparseThreshold"])
def test_train_one_batch_under_every_dist_option(cpu, dist_option):
    net = ResNetLike()
    (x, y), = mnist_batches(cpu, batches=1)
    tx, ty = tensor.from_numpy(x, cpu), tensor.from_numpy(y, cpu)
    net.set_optimizer(opt.DistOpt(opt.SGD(lr=0.05, momentum=0.9)))  # one rank: no launcher
    net.compile([tx], is_train=True)
    before = {k: v.to_numpy() for k, v in net.get_params().items()}
    net(tx, ty, dist_option, 0.05)
    changed = [k for k, v in net.get_params().items() if not np.array_equal(v.to_numpy(), before[k])]
    assert "Bottleneck_2.Conv2d_0.weight" in changed  # the closure's downsampling convolution trains too
    assert len(changed) > len(before) // 2


def test_a_first_call_refused_by_initialize_can_be_retried(cpu):
    conv = layer.Conv2d(4, 3)
    with pytest.raises(ValueError, match="NCHW"):
        conv(tensor.from_numpy(rand((3, 5, 5)), cpu))
    assert conv(tensor.from_numpy(rand((1, 3, 5, 5)), cpu)).shape == (1, 4, 3, 3)
