"""Softmax, normalisation, losses and attention from Python: tandem.autograd's functions (SINGA's names and
tandem's) and tandem.layer's layers, against NumPy (and PyTorch where it is installed), values and
gradients; the errors Python sees."""
import math

import numpy as np
import pytest

from conftest import TORCH_SKIP, torch_for_numpy
from tandem import _tandem, autograd, layer, tensor


def rand(shape, seed=0, lo=-1.0, hi=1.0):
    return np.random.RandomState(seed).uniform(lo, hi, shape).astype(np.float32)


def leaf(a, dev):
    t = tensor.from_numpy(a, dev)
    t.requires_grad = True
    return t


def grads_of(y, dy, *leaves):
    """Back-propagates dy (an array of y's shape) and returns the leaves' gradients as arrays."""
    list(autograd.backward(y, tensor.from_numpy(np.asarray(dy, dtype=np.float32), y.device)))
    return [l.grad.to_numpy() for l in leaves]


def np_softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_softmax_and_log_softmax_singa_axis(cpu):
    x = rand((3, 4, 5), 1, -3, 3)
    t = leaf(x, cpu)
    # SINGA's axis: the dimensions from axis on, taken together.
    y = autograd.softmax(t, 1)
    np.testing.assert_allclose(y.to_numpy(), np_softmax(x.reshape(3, 20), 1).reshape(3, 4, 5), rtol=1e-5, atol=1e-6)
    ly = autograd.log_softmax(t, 2)
    np.testing.assert_allclose(ly.to_numpy(), np.log(np_softmax(x, 2)), rtol=1e-5, atol=1e-5)
    (g,) = grads_of(ly, np.ones((3, 4, 5)), t)
    np.testing.assert_allclose(g, 1 - 5 * np_softmax(x, 2), rtol=1e-4, atol=1e-5)
    op = autograd.LogSoftmax(-1)
    assert op(t)[0].shape == (3, 4, 5)
    with pytest.raises(ValueError, match="axis 3"):
        autograd.log_softmax(t, 3)


def test_softmax_on_any_axis_through_the_module(cpu):
    x = rand((4, 6, 3), 2)
    y = _tandem.softmax(tensor.from_numpy(x, cpu), 1).to_numpy()
    np.testing.assert_allclose(y, np_softmax(x, 1), rtol=1e-5, atol=1e-6)
    ly = _tandem.log_softmax(tensor.from_numpy(x, cpu), 0).to_numpy()
    np.testing.assert_allclose(ly, np.log(np_softmax(x, 0)), rtol=1e-5, atol=1e-5)


def test_layer_norm_and_rms_norm(cpu):
    x, w, b = rand((2, 3, 8), 3), rand((8,), 4, 0.5, 1.5), rand((8,), 5)
    tx, tw, tb = leaf(x, cpu), leaf(w, cpu), leaf(b, cpu)
    y = autograd.layer_norm(tx, 8, tw, tb, 1e-5)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(y.to_numpy(), (x - mu) / np.sqrt(var + 1e-5) * w + b, rtol=1e-5, atol=1e-5)
    gx, gw, gb = grads_of(y, np.ones(x.shape), tx, tw, tb)
    np.testing.assert_allclose(gb, np.full(8, 6.0), rtol=1e-6)
    np.testing.assert_allclose(gw, ((x - mu) / np.sqrt(var + 1e-5)).sum((0, 1)), rtol=1e-4, atol=1e-5)
    # With dy = 1: dx = rstd * (w - mean(w) - xhat * mean(w * xhat)).
    xhat = (x - mu) / np.sqrt(var + 1e-5)
    ref = (w - w.mean() - xhat * (w * xhat).mean(-1, keepdims=True)) / np.sqrt(var + 1e-5)
    np.testing.assert_allclose(gx, ref, rtol=1e-4, atol=1e-4)
    r = autograd.rms_norm(tensor.from_numpy(x, cpu), [3, 8], eps=1e-6).to_numpy()
    ms = (x ** 2).mean((1, 2), keepdims=True)
    np.testing.assert_allclose(r, x / np.sqrt(ms + 1e-6), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="normalized_shape"):
        autograd.layer_norm(tx, [5])


def test_losses_and_reductions(cpu):
    logits = rand((2, 3, 5), 6, -2, 2)
    targets = np.array([[1, -100, 4], [0, 2, -100]], dtype=np.int64)
    tl, tt = leaf(logits, cpu), tensor.from_numpy(targets, cpu)
    logp = np.log(np_softmax(logits, -1))
    picked = [-logp[i, j, targets[i, j]] for i in range(2) for j in range(3) if targets[i, j] != -100]
    loss = autograd.softmax_cross_entropy(tl, tt)
    assert loss.shape == ()
    np.testing.assert_allclose(loss.to_numpy(), np.mean(picked), rtol=1e-5)
    summed = autograd.softmax_cross_entropy(tl, tt, reduction="sum").to_numpy()
    np.testing.assert_allclose(summed, np.sum(picked), rtol=1e-5)
    per = autograd.softmax_cross_entropy(tl, tt, reduction="none").to_numpy()
    assert per.shape == (2, 3) and per[0, 1] == 0.0
    nll = autograd.nll_loss(tensor.from_numpy(logp.astype(np.float32), cpu), tt).to_numpy()
    np.testing.assert_allclose(nll, np.mean(picked), rtol=1e-5)
    # SINGA's two-argument form: 2-d logits, shape (1,).
    x2, lab = rand((4, 3), 7), np.array([2, 0, 1, 1], dtype=np.int32)
    l2 = autograd.softmax_cross_entropy(tensor.from_numpy(x2, cpu), tensor.from_numpy(lab, cpu))
    assert l2.shape == (1,)
    np.testing.assert_allclose(l2.to_numpy()[0], -np.log(np_softmax(x2, 1))[range(4), lab].mean(), rtol=1e-5)
    # Mean squared error (SINGA's shape), binary cross-entropy with logits.
    a, b = rand((3, 4), 8), rand((3, 4), 9)
    m = autograd.mse_loss(tensor.from_numpy(a, cpu), tensor.from_numpy(b, cpu))
    assert m.shape == (1,)
    np.testing.assert_allclose(m.to_numpy()[0], ((a - b) ** 2).mean(), rtol=1e-5)
    t01 = rand((3, 4), 10, 0, 1)
    bce = autograd.binary_cross_entropy_with_logits(tensor.from_numpy(a, cpu), tensor.from_numpy(t01, cpu), "sum")
    ref = np.maximum(a, 0) - a * t01 + np.log1p(np.exp(-np.abs(a)))
    np.testing.assert_allclose(bce.to_numpy(), ref.sum(), rtol=1e-5)
    with pytest.raises(ValueError, match="reduction 'avg'"):
        autograd.softmax_cross_entropy(tl, tt, reduction="avg")
    with pytest.raises(ValueError, match="target 9"):
        autograd.softmax_cross_entropy(tl, tensor.from_numpy(np.full((2, 3), 9, dtype=np.int64), cpu))


def np_attention(q, k, v, causal, scale=None):
    s = q @ np.swapaxes(k, -1, -2) * (scale or 1.0 / math.sqrt(q.shape[-1]))
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
    return np_softmax(s, -1) @ v


@pytest.mark.parametrize("causal", [False, True])
def test_scaled_dot_product_attention(cpu, causal):
    q, k, v = rand((2, 2, 5, 4), 11), rand((2, 2, 7, 4), 12), rand((2, 2, 7, 3), 13)
    tq, tk, tv = leaf(q, cpu), leaf(k, cpu), leaf(v, cpu)
    o = autograd.scaled_dot_product_attention(tq, tk, tv, causal=causal, scale=0.6)
    np.testing.assert_allclose(o.to_numpy(), np_attention(q, k, v, causal, 0.6), rtol=1e-5, atol=1e-5)
    gq, gk, gv = grads_of(o, np.ones(o.shape), tq, tk, tv)
    assert gq.shape == q.shape and gk.shape == k.shape and gv.shape == v.shape
    if causal:  # keys after the last query's position get no attention, hence no gradient
        np.testing.assert_array_equal(gk[:, :, 5:], 0.0)
    # Dropout from a generator: the same seed gives the same output.
    a = autograd.scaled_dot_product_attention(tq, tk, tv, causal, 0.5, generator=_tandem.Generator(3)).to_numpy()
    b = autograd.scaled_dot_product_attention(tq, tk, tv, causal, 0.5, generator=_tandem.Generator(3)).to_numpy()
    np.testing.assert_array_equal(a, b)


def test_attention_against_torch(cpu):
    torch = torch_for_numpy()
    if torch is None:
        pytest.skip(TORCH_SKIP)
    q, k, v = rand((1, 3, 6, 4), 14), rand((1, 3, 6, 4), 15), rand((1, 3, 6, 4), 16)
    o = autograd.scaled_dot_product_attention(tensor.from_numpy(q, cpu), tensor.from_numpy(k, cpu),
                                              tensor.from_numpy(v, cpu), causal=True).to_numpy()
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    s = (tq @ tk.transpose(-1, -2)) / 2.0
    s = s.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
    np.testing.assert_allclose(o, (torch.softmax(s, -1) @ tv).numpy(), rtol=1e-5, atol=1e-6)


def test_norm_layers_take_their_sizes_at_the_first_call(cpu):
    x = rand((2, 5, 8), 17)
    ln = layer.LayerNorm()
    y = ln(tensor.from_numpy(x, cpu))
    assert ln.normalized_shape == [8] and ln.weight.shape == (8,) and ln.bias.shape == (8,)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(y.to_numpy(), (x - mu) / np.sqrt(var + 1e-5), rtol=1e-5, atol=1e-5)
    assert sorted(ln.get_params()) == ["bias", "weight"]
    rms = layer.RMSNorm(8, elementwise_affine=False)
    rms(tensor.from_numpy(x, cpu))
    assert rms.weight is None and rms.get_params() == {}
    with pytest.raises(ValueError, match="normalized_shape"):
        layer.LayerNorm(6)(tensor.from_numpy(x, cpu))


def test_multi_head_attention_layer(cpu):
    x = rand((2, 6, 8), 18)
    mha = layer.MultiHeadAttention(2, causal=True)
    y = mha(tensor.from_numpy(x, cpu))
    assert y.shape == (2, 6, 8) and mha.embed_dim == 8
    params = mha.get_params()
    assert sorted(params) == sorted(f"{p}.{n}" for p in ("q_proj", "k_proj", "v_proj", "out_proj")
                                    for n in ("weight", "bias"))
    # The layer's output from its own parameters, in NumPy.
    P = {k: v.to_numpy() for k, v in params.items()}

    def proj(name, a):
        return a @ P[f"{name}.weight"].T + P[f"{name}.bias"]

    def heads(a):
        return a.reshape(2, 6, 2, 4).transpose(0, 2, 1, 3)

    att = np_attention(heads(proj("q_proj", x)), heads(proj("k_proj", x)), heads(proj("v_proj", x)), True)
    ref = proj("out_proj", att.transpose(0, 2, 1, 3).reshape(2, 6, 8))
    np.testing.assert_allclose(y.to_numpy(), ref, rtol=1e-4, atol=1e-5)
    # Cross-attention: queries over other keys.
    kv = rand((2, 3, 8), 19)
    assert mha(tensor.from_numpy(x, cpu), tensor.from_numpy(kv, cpu), tensor.from_numpy(kv, cpu)).shape == (2, 6, 8)
    with pytest.raises(ValueError, match="embed_dim"):
        layer.MultiHeadAttention(3)(tensor.from_numpy(x, cpu))


def test_singa_loss_layers(cpu):
    p, t = rand((4, 3), 20, 0.1, 0.9), rand((4, 3), 21, 0, 1)
    tp, tt = tensor.from_numpy(p, cpu), tensor.from_numpy(t, cpu)
    np.testing.assert_allclose(layer.MeanSquareError()(tp, tt).to_numpy()[0], ((p - t) ** 2).mean(), rtol=1e-5)
    np.testing.assert_allclose(layer.CrossEntropy()(tp, tt).to_numpy()[0], -(t * np.log(p)).sum() / 4, rtol=1e-5)
    bce = -(t * np.log(p + 1e-4) + (1 - t) * np.log(1.0001 - p)).sum() / 4
    np.testing.assert_allclose(layer.BinaryCrossEntropy()(tp, tt).to_numpy()[0], bce, rtol=1e-5)
    np.testing.assert_allclose(layer.SoftMax()(tp).to_numpy(), np_softmax(p, 1), rtol=1e-5)
