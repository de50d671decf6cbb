"""Layers: each against a NumPy computation, and the guide's CNN written from layers against the
C++ model of `tandem train --model cnn` (same parameters, outputs and gradients)."""
import sys

import numpy as np
import pytest

from conftest import EXAMPLES
from tandem import _tandem, autograd, layer, tensor

sys.path.insert(0, str(EXAMPLES))
from doc_dist_train import CNN  # noqa: E402  (the guide's model, as the example defines it)


def rand(shape, seed=0):
    return np.random.RandomState(seed).standard_normal(shape).astype(np.float32)


def conv_ref(x, w, b, stride, pad):
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - r) // stride + 1, (wd + 2 * pad - s) // stride + 1
    out = np.zeros((n, k, oh, ow), dtype=np.float64)
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * stride:i * stride + r, j * stride:j * stride + s]
            out[:, :, i, j] = np.tensordot(patch, w, axes=([1, 2, 3], [1, 2, 3]))
    return out + b[None, :, None, None]


def pool_ref(x, k, stride, op):
    n, c, h, w = x.shape
    oh, ow = (h - k) // stride + 1, (w - k) // stride + 1
    out = np.zeros((n, c, oh, ow), dtype=np.float64)
    for i in range(oh):
        for j in range(ow):
            out[:, :, i, j] = op(x[:, :, i * stride:i * stride + k, j * stride:j * stride + k], axis=(2, 3))
    return out


def test_conv2d_against_numpy(cpu):
    x = rand((2, 3, 7, 6))
    conv = layer.Conv2d(3, 4, 3, stride=2, padding=1, activation="RELU")
    y = conv(tensor.from_numpy(x, cpu)).to_numpy()
    w, b = conv.W.to_numpy(), conv.b.to_numpy()
    assert w.shape == (4, 3, 3, 3) and b.shape == (4,)
    np.testing.assert_allclose(y, np.maximum(conv_ref(x, w, b, 2, 1), 0), rtol=1e-5, atol=1e-5)
    lazy = layer.Conv2d(4, 3)  # SINGA's form: input channels from the first call
    assert lazy(tensor.from_numpy(x, cpu)).shape == (2, 4, 5, 4) and lazy.in_channels == 3
    with pytest.raises(ValueError, match="built for 3 input channels"):
        layer.Conv2d(3, 4, 3)(tensor.from_numpy(rand((1, 2, 5, 5)), cpu))


def test_linear_against_numpy(cpu):
    x = rand((5, 7))
    lin = layer.Linear(3)  # input size from the first call
    y = lin(tensor.from_numpy(x, cpu)).to_numpy()
    np.testing.assert_allclose(y, x @ lin.W.to_numpy().T + lin.b.to_numpy(), rtol=1e-5, atol=1e-6)
    assert lin.in_features == 7 and layer.Linear(7, 3)(tensor.from_numpy(x, cpu)).shape == (5, 3)
    with pytest.raises(ValueError, match="Flatten"):
        layer.Linear(3)(tensor.from_numpy(rand((2, 3, 4)), cpu))


def test_pooling_relu_flatten_against_numpy(cpu):
    x = rand((2, 3, 6, 6))
    t = tensor.from_numpy(x, cpu)
    np.testing.assert_allclose(layer.MaxPool2d(2, 2)(t).to_numpy(), pool_ref(x, 2, 2, np.max), rtol=1e-6)
    np.testing.assert_allclose(layer.AvgPool2d(3, 1)(t).to_numpy(), pool_ref(x, 3, 1, np.mean), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(layer.ReLU()(t).to_numpy(), np.maximum(x, 0))
    np.testing.assert_array_equal(layer.Flatten()(t).to_numpy(), x.reshape(2, -1))
    np.testing.assert_allclose(layer.Sigmoid()(t).to_numpy(), 1 / (1 + np.exp(-x)), rtol=1e-5)


def test_softmax_cross_entropy_against_numpy(cpu):
    logits = rand((4, 5))
    labels = np.array([0, 3, 4, 1], dtype=np.int32)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    expected = -np.mean(np.log(p[np.arange(4), labels]))
    sce = layer.SoftMaxCrossEntropy()
    loss = sce(tensor.from_numpy(logits, cpu), tensor.from_numpy(labels, cpu))
    assert loss.shape == (1,)  # SINGA's loss shape: the guide reads tensor.to_numpy(loss)[0]
    assert loss.to_numpy()[0] == pytest.approx(expected, rel=1e-5)
    one_hot = np.eye(5, dtype=np.int32)[labels]
    assert sce(tensor.from_numpy(logits, cpu), tensor.from_numpy(one_hot, cpu)).item() == pytest.approx(expected, rel=1e-5)


def test_softmax_cross_entropy_targets(cpu):
    """SINGA's float one-hot targets (batch, classes) give the class-index loss; other targets give
    -sum(t * log softmax) / N with its gradient; labels of any other shape are refused."""
    logits = rand((8, 10), seed=3)
    labels = np.array([3, 0, 9, 9, 1, 4, 7, 2], dtype=np.int32)
    sce = layer.SoftMaxCrossEntropy()
    log_p = logits - logits.max(1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(1, keepdims=True))
    expected = -np.mean(log_p[np.arange(8), labels])
    by_index = sce(tensor.from_numpy(logits, cpu), tensor.from_numpy(labels, cpu)).item()
    one_hot = np.eye(10, dtype=np.float32)[labels]
    by_one_hot = sce(tensor.from_numpy(logits, cpu), tensor.from_numpy(one_hot, cpu)).item()
    assert by_index == pytest.approx(expected, rel=1e-6)
    assert by_one_hot == pytest.approx(expected, rel=1e-6)

    soft = np.random.RandomState(4).uniform(0, 1, (8, 10)).astype(np.float32)
    soft[:4] /= soft[:4].sum(1, keepdims=True)  # half the rows distributions, half other weights
    x = tensor.from_numpy(logits, cpu)
    x.requires_grad = True
    loss = sce(x, tensor.from_numpy(soft, cpu))
    assert loss.shape == (1,)
    assert loss.item() == pytest.approx(-np.sum(soft * log_p) / 8, rel=1e-5)
    loss.backward()
    p = np.exp(log_p)
    np.testing.assert_allclose(x.grad.to_numpy(), (p * soft.sum(1, keepdims=True) - soft) / 8, rtol=1e-5, atol=1e-7)

    # Labels [N, 1] hold class indices, as SINGA reads labels of N elements.
    assert sce(tensor.from_numpy(logits, cpu), tensor.from_numpy(labels.reshape(8, 1), cpu)).item() == \
        pytest.approx(expected, rel=1e-6)
    refused = (r"labels \w+\[.*\] on cpu do not fit logits f32\[8, 10\] on cpu; "
               r"give class indices \[8\] \(i32 or i64\) or targets \[8, 10\]")
    for bad in (labels[:7].reshape(7, 1), np.ascontiguousarray(one_hot[:, :2]), labels[:7]):
        with pytest.raises(ValueError, match=refused):
            sce(tensor.from_numpy(logits, cpu), tensor.from_numpy(bad, cpu))


def test_batchnorm_and_dropout(cpu):
    x = rand((4, 3, 2, 2)) * 3 + 1
    bn = layer.BatchNorm2d(3, momentum=0.9)
    y = bn(tensor.from_numpy(x, cpu)).to_numpy()
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    np.testing.assert_allclose(y, (x - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5),
                               rtol=1e-4, atol=1e-4)
    states = bn.get_states()
    unbiased = x.var(axis=(0, 2, 3), ddof=1)  # SINGA's momentum: the running statistics keep 0.9
    np.testing.assert_allclose(states["running_mean"].to_numpy(), 0.1 * mean, rtol=1e-5)
    np.testing.assert_allclose(states["running_var"].to_numpy(), 0.9 + 0.1 * unbiased, rtol=1e-5)
    bn.eval()
    np.testing.assert_allclose(bn(tensor.from_numpy(x, cpu)).to_numpy(),
                               (x - 0.1 * mean[None, :, None, None]) /
                               np.sqrt(0.9 + 0.1 * unbiased[None, :, None, None] + 1e-5), rtol=1e-4, atol=1e-5)

    drop = layer.Dropout(0.5)
    ones = tensor.ones((1000,), cpu)
    out = drop(ones).to_numpy()
    assert set(np.unique(out)) == {0.0, 2.0} and 400 < np.count_nonzero(out) < 600
    drop.eval()
    np.testing.assert_array_equal(drop(ones).to_numpy(), np.ones(1000))


def test_precision_scope(cpu):
    assert autograd.current_precision() == autograd.Precision.f32
    with autograd.precision("bf16"):
        assert autograd.current_precision() == autograd.Precision.bf16
        with autograd.precision(autograd.Precision.tf32):
            assert autograd.current_precision() == autograd.Precision.tf32
        x = tensor.from_numpy(rand((2, 3)), cpu)
        w = tensor.from_numpy(rand((4, 3), seed=1), cpu)
        y = _tandem.linear(x, w, relu=True).to_numpy()  # the CPU computes exact f32 at any precision
    assert autograd.current_precision() == autograd.Precision.f32
    np.testing.assert_allclose(y, np.maximum(x.to_numpy() @ w.to_numpy().T, 0), rtol=1e-5, atol=1e-6)
    assert autograd.default_precision(cpu) == autograd.Precision.f32
    with pytest.raises(ValueError, match="tf32"):
        autograd.precision("f8")


def test_guide_cnn_matches_the_cpp_model(cpu):
    cpu.SetRandSeed(7)
    net = CNN()
    x = tensor.from_numpy(rand((3, 1, 28, 28), seed=1), cpu)
    y = tensor.from_numpy(np.array([1, 7, 3], dtype=np.int32), cpu)
    net.compile([x], is_train=True)
    cpp = _tandem.make_model("cnn", seed=7)  # `tandem train --model cnn --seed 7`
    ours, theirs = net.get_params(), dict(cpp.named_parameters())
    assert list(ours) == ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "linear1.weight",
                          "linear1.bias", "linear2.weight", "linear2.bias"]
    assert list(theirs) == list(ours)
    assert sum(p.size() for p in ours.values()) == 431080
    for name in ours:  # same generator, same order of draws: identical initial values
        np.testing.assert_array_equal(ours[name].to_numpy(), theirs[name].to_numpy(), err_msg=name)

    loss = layer.SoftMaxCrossEntropy()(net.forward(x), y)
    ref = _tandem.softmax_cross_entropy(cpp(x), y)
    assert loss.item() == ref.item()
    loss.backward()
    ref.backward()
    for name in ours:
        np.testing.assert_array_equal(ours[name].grad.to_numpy(), theirs[name].grad.to_numpy(), err_msg=name)
