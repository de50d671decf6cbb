"""The reductions, shape and indexing ops and products of tandem.autograd under SINGA's names and
signatures, against NumPy (values and gradients); tensor indexing against NumPy's; the Gemm, Reshape
and 1-d pooling layers."""
import inspect

import numpy as np
import pytest

from tandem import autograd, layer, tensor

REQUIRED = inspect.Parameter.empty
RNG = np.random.default_rng(7)

# SINGA's signatures (python/singa/autograd.py): (name, [(parameter, default or REQUIRED), ...]).
FUNCTIONS = [
    ("matmul", [("x", REQUIRED), ("w", REQUIRED)]),
    ("reshape", [("x", REQUIRED), ("shape", REQUIRED)]),
    ("flatten", [("x", REQUIRED), ("axis", 1)]),
    ("transpose", [("x", REQUIRED), ("shape", REQUIRED)]),
    ("squeeze", [("x", REQUIRED), ("axis", [])]),
    ("unsqueeze", [("x", REQUIRED), ("axis", -1)]),
    ("cat", [("xs", REQUIRED), ("axis", 0)]),
    ("reduce_sum", [("x", REQUIRED), ("axes", None), ("keepdims", 1)]),
    ("reduce_mean", [("x", REQUIRED), ("axes", None), ("keepdims", 1)]),
    ("slice", [("x", REQUIRED), ("starts", REQUIRED), ("ends", REQUIRED), ("axes", None), ("steps", None)]),
    ("split", [("x", REQUIRED), ("axis", REQUIRED), ("parts", REQUIRED), ("num_output", None)]),
    ("gather", [("x", REQUIRED), ("axis", REQUIRED), ("indices", REQUIRED)]),
    ("tile", [("x", REQUIRED), ("repeats", REQUIRED)]),
    ("nonzero", [("x", REQUIRED)]),
    ("onehot", [("axis", REQUIRED), ("indices", REQUIRED), ("depth", REQUIRED), ("values", REQUIRED)]),
    ("cossim", [("a", REQUIRED), ("b", REQUIRED)]),
    ("expand", [("x", REQUIRED), ("shape", REQUIRED)]),
    ("pad", [("x", REQUIRED), ("mode", REQUIRED), ("pads", REQUIRED), ("constant", 0.0)]),
    ("upsample", [("x", REQUIRED), ("mode", REQUIRED), ("scales", REQUIRED)]),
    ("depth_to_space", [("x", REQUIRED), ("blocksize", REQUIRED), ("mode", "DCR")]),
    ("space_to_depth", [("x", REQUIRED), ("blocksize", REQUIRED), ("mode", "DCR")]),
    ("scatter_elements", [("x", REQUIRED), ("indices", REQUIRED), ("updates", REQUIRED), ("axis", 0)]),
    ("gemm", [("A", REQUIRED), ("B", REQUIRED), ("C", None), ("alpha", 1.0), ("beta", 1.0), ("transA", 0),
              ("transB", 0)]),
    ("globalaveragepool", [("x", REQUIRED), ("data_format", "channels_first")]),
    ("constant_of_shape", [("x", REQUIRED), ("value", 0)]),
    ("shape", [("x", REQUIRED)]),
    ("ranking_loss", [("pos", REQUIRED), ("neg", REQUIRED), ("M", 0.2)]),
]

# Operator classes: (name, constructor parameters after self).
OPERATORS = [
    ("Matmul", []), ("Reshape", [("shape", REQUIRED)]), ("Flatten", [("axis", 1)]), ("Transpose", [("perm", REQUIRED)]),
    ("Squeeze", [("axis", [])]), ("Unsqueeze", [("axis", REQUIRED)]), ("Concat", [("axis", 0)]),
    ("ReduceSum", [("axes", None), ("keepdims", 1)]), ("ReduceMean", [("axes", None), ("keepdims", 1)]),
    ("Slice", [("starts", REQUIRED), ("ends", REQUIRED), ("axes", None), ("steps", None)]),
    ("Split", [("axis", REQUIRED), ("parts", REQUIRED), ("num_output", None)]),
    ("Gather", [("axis", REQUIRED), ("indices", REQUIRED)]), ("Tile", [("repeats", REQUIRED)]), ("NonZero", []),
    ("OneHot", [("axis", REQUIRED), ("depth", REQUIRED), ("values", REQUIRED)]), ("CosSim", []),
    ("Expand", [("shape", REQUIRED)]), ("Pad", [("mode", REQUIRED), ("pads", REQUIRED), ("constant", 0.0)]),
    ("UpSample", [("mode", REQUIRED), ("scales", REQUIRED)]), ("DepthToSpace", [("blocksize", REQUIRED), ("mode", "DCR")]),
    ("SpaceToDepth", [("blocksize", REQUIRED), ("mode", "DCR")]),
    ("ScatterElements", [("indices", REQUIRED), ("updates", REQUIRED), ("axis", 0)]),
    ("Gemm", [("alpha", 1.0), ("beta", 1.0), ("transA", 0), ("transB", 0)]),
    ("GlobalAveragePool", [("data_format", "channels_first")]), ("ConstantOfShape", [("value", 0.0)]), ("Shape", []),
    ("RankingLoss", [("M", 0.2)]),
]


def _params(f, skip_self=False):
    ps = list(inspect.signature(f).parameters.values())
    return [(p.name, p.default) for p in (ps[1:] if skip_self else ps)]


@pytest.mark.parametrize("name,expected", FUNCTIONS, ids=[f[0] for f in FUNCTIONS])
def test_functions_take_singas_arguments(name, expected):
    got = _params(getattr(autograd, name))
    assert got[:len(expected)] == expected
    assert all(d is not REQUIRED for _, d in got[len(expected):])


@pytest.mark.parametrize("name,expected", OPERATORS, ids=[o[0] for o in OPERATORS])
def test_operator_classes_take_singas_arguments(name, expected):
    cls = getattr(autograd, name)
    assert issubclass(cls, autograd.Operator)
    assert _params(cls.__init__, skip_self=True)[:len(expected)] == expected


def t64(a, grad=True):
    """A float64 leaf tensor of the array's values (requiring a gradient)."""
    t = tensor.from_numpy(np.asarray(a, dtype=np.float64), dtype=tensor.float64)
    t.requires_grad = grad
    return t


def grads(y, *xs):
    """The gradients of sum(y * w) for fixed random w, as arrays, and w."""
    w = RNG.uniform(-1, 1, size=y.shape)
    autograd_loss = autograd.reduce_sum(autograd.mul(y, t64(w, False)), None, 0)
    autograd_loss.backward()
    return [x.grad.to_numpy() for x in xs], w


def close(t, expected, rtol=1e-10, atol=1e-12):
    np.testing.assert_allclose(t.to_numpy() if not isinstance(t, np.ndarray) else t, expected, rtol=rtol, atol=atol)


# ---- reductions
def test_reductions_against_numpy():
    a = RNG.uniform(-1, 1, (2, 3, 4))
    x = t64(a)
    close(autograd.reduce_sum(x, [0, -1]), a.sum(axis=(0, 2), keepdims=True))
    close(autograd.reduce_mean(x, [1], 0), a.mean(axis=1))
    close(autograd.reduce_max(x, [1, 2], 0), a.max(axis=(1, 2)))
    close(autograd.reduce_min(x), a.min(keepdims=True))
    close(autograd.globalaveragepool(x.reshape(1, 2, 3, 4)), a.reshape(1, 2, 3, 4).mean(axis=(2, 3), keepdims=True))
    close(autograd.globalaveragepool(x.reshape(1, 2, 3, 4), "channels_last"),
          a.reshape(1, 2, 3, 4).mean(axis=(1, 2), keepdims=True))


def test_reduce_max_shares_the_gradient_of_ties():
    x = t64([[1.0, 3.0, 3.0], [2.0, 0.0, -1.0]])
    (gx,), w = grads(autograd.reduce_max(x, [1], 0), x)
    np.testing.assert_allclose(gx, [[0, w[0] / 2, w[0] / 2], [w[1], 0, 0]])


# ---- shapes
def test_views_reshape_transpose_squeeze():
    a = RNG.uniform(-1, 1, (2, 1, 3))
    x = t64(a)
    close(autograd.reshape(x, [0, -1]), a.reshape(2, 3))  # 0 keeps x's extent
    close(autograd.transpose(x, [2, 0, 1]), a.transpose(2, 0, 1))
    close(autograd.squeeze(x), a.squeeze())
    close(autograd.unsqueeze(x, [0, 4]), a[None, :, :, :, None])
    close(autograd.flatten(x, 2), a.reshape(2, 3))
    t = tensor.from_numpy(a.astype(np.float32))
    assert t.transpose(0, 2).shares_storage(t) and t.T().shape == (3, 1, 2) and t.T().shares_storage(t)  # views
    np.testing.assert_array_equal(t.T().to_numpy(), a.astype(np.float32).T)
    assert t.reshape(3, 2).shape == (3, 2) and t.reshape((6,)).shape == (6,)


def test_split_slice_tile_expand():
    a = RNG.uniform(-1, 1, (6, 4))
    x = t64(a)
    parts = autograd.split(x, 0, [1, 5])
    close(parts[0], a[:1])
    close(parts[1], a[1:])
    even = autograd.split(x, 1, None, 2)
    assert [p.shape for p in even] == [(6, 2), (6, 2)]
    close(autograd.slice(x, [1, -1], [100, 0], [0, 1], [2, -1]), a[1:100:2, -1:0:-1])
    close(autograd.slice(x, [-3], [6]), a[-3:6])
    close(autograd.tile(x, [2, 1, 3]), np.tile(a, (2, 1, 3)))
    close(autograd.tile(x, 2), np.tile(a, 2))
    close(autograd.expand(t64(a[:, :1]), [6, 4]), np.broadcast_to(a[:, :1], (6, 4)))


def test_pad_modes_match_numpy_and_send_every_copy_back():
    a = RNG.uniform(-1, 1, (3, 4))
    for mode, np_mode in (("constant", "constant"), ("reflect", "reflect"), ("edge", "edge")):
        x = t64(a)
        kw = {"constant_values": 0.5} if mode == "constant" else {}
        y = autograd.pad(x, mode, [1, 2, 2, 3], 0.5)
        close(y, np.pad(a, ((1, 2), (2, 3)), mode=np_mode, **kw))
        (gx,), w = grads(y, x)
        # The gradient of element (i, j) sums w over every output position that copies it.
        positions = np.pad(np.arange(a.size).reshape(a.shape), ((1, 2), (2, 3)), mode=np_mode,
                           **({"constant_values": -1} if mode == "constant" else {}))
        expected = np.zeros(a.size)
        np.add.at(expected, positions[positions >= 0], w[positions >= 0])
        np.testing.assert_allclose(gx, expected.reshape(a.shape), rtol=1e-12)
    with pytest.raises(ValueError, match="reflect"):
        autograd.pad(t64(a), "reflect", [0, 4, 0, 0])


def test_upsample_depth_space():
    a = RNG.uniform(-1, 1, (1, 8, 2, 3))
    x = t64(a)
    close(autograd.upsample(x, "nearest", [1, 1, 2, 3]), a.repeat(2, axis=2).repeat(3, axis=3))
    b = 2
    dcr = a.reshape(1, b, b, 2, 2, 3).transpose(0, 3, 4, 1, 5, 2).reshape(1, 2, 4, 6)
    crd = a.reshape(1, 2, b, b, 2, 3).transpose(0, 1, 4, 2, 5, 3).reshape(1, 2, 4, 6)
    close(autograd.depth_to_space(x, 2), dcr)
    close(autograd.depth_to_space(x, 2, "CRD"), crd)
    close(autograd.space_to_depth(t64(dcr), 2), a)
    close(autograd.space_to_depth(t64(crd), 2, "CRD"), a)
    with pytest.raises(ValueError, match="nearest"):
        autograd.upsample(x, "linear", [1, 1, 2, 2])


# ---- indexing
def test_gather_sums_the_gradient_of_repeated_indices():
    a = RNG.uniform(-1, 1, (4, 3))
    x = t64(a)
    idx = [[0, 2], [2, -1]]
    y = autograd.gather(x, 0, idx)
    close(y, a[np.array(idx) % 4])
    (gx,), w = grads(y, x)
    expected = np.zeros_like(a)
    np.add.at(expected, np.array(idx).reshape(-1) % 4, w.reshape(-1, 3))
    np.testing.assert_allclose(gx, expected)  # SINGA's gather keeps one copy of index 2's gradient
    close(autograd.gather(t64(a), 1, [2, 0]), a[:, [2, 0]])


def test_scatter_elements_onehot_nonzero_shape():
    x = t64(np.zeros((3, 3)))
    idx = np.array([[1, 0, 2], [0, 2, 1]])
    upd = np.array([[1.0, 1.1, 1.2], [2.0, 2.1, 2.2]])
    y = autograd.scatter_elements(x, idx, upd, 0)
    close(y, [[2.0, 1.1, 0.0], [1.0, 0.0, 2.2], [0.0, 2.1, 1.2]])  # SINGA's docstring example
    (gx,), w = grads(y, x)
    mask = np.ones((3, 3))
    mask[idx, np.arange(3)[None, :].repeat(2, 0)] = 0
    np.testing.assert_allclose(gx, w * mask)
    labels = tensor.from_numpy(np.array([[0, 3], [2, -1]], dtype=np.int32))
    hot = autograd.onehot(-1, labels, 4, [0.0, 5.0])
    np.testing.assert_array_equal(hot.to_numpy(), 5.0 * np.eye(4)[np.array([[0, 3], [2, 3]])])
    assert hot.dtype == tensor.float32
    np.testing.assert_array_equal(autograd.onehot(0, labels, 4, [0, 1]).to_numpy(),
                                  np.moveaxis(np.eye(4)[np.array([[0, 3], [2, 3]])], -1, 0))
    z = np.array([[0.0, 1.5, 0.0], [-2.0, 0.0, 3.0]])
    nz = autograd.nonzero(t64(z, False))
    assert nz.dtype == tensor.int32
    np.testing.assert_array_equal(nz.to_numpy(), np.array(np.nonzero(z)))
    np.testing.assert_array_equal(autograd.shape(t64(z)).to_numpy(), [2, 3])
    c = autograd.constant_of_shape(tensor.from_numpy(np.array([2, 3])), 1.5)
    assert c.shape == (2, 3) and c.dtype == tensor.float32 and (c.to_numpy() == 1.5).all()


# ---- products
def test_matmul_broadcasts_and_its_gradients():
    a, b = RNG.uniform(-1, 1, (2, 1, 3, 4)), RNG.uniform(-1, 1, (5, 4, 2))
    x, w = t64(a), t64(b)
    y = autograd.matmul(x, w)
    close(y, np.matmul(a, b))
    (ga, gb), g = grads(y, x, w)
    np.testing.assert_allclose(ga, (g @ np.swapaxes(b, -1, -2)).sum(axis=1, keepdims=True), rtol=1e-10)
    np.testing.assert_allclose(gb, (np.swapaxes(a, -1, -2) @ g).sum(axis=0), rtol=1e-10)
    v = RNG.uniform(-1, 1, 4)
    close(autograd.matmul(t64(v), t64(b)), np.matmul(v, b))
    close(autograd.matmul(t64(a), t64(v)), np.matmul(a, v))
    close(autograd.matmul(t64(v), t64(v)), np.matmul(v, v))
    assert (tensor.from_numpy(a) @ tensor.from_numpy(b)).shape == (2, 5, 3, 2)


def test_gemm_cossim_ranking_loss():
    a, b, c = RNG.uniform(-1, 1, (4, 3)), RNG.uniform(-1, 1, (5, 4)), RNG.uniform(-1, 1, (5,))
    close(autograd.gemm(t64(a), t64(b), t64(c), 0.5, 2.0, 1, 1), 0.5 * a.T @ b.T + 2.0 * c)
    close(autograd.gemm(t64(a.T), t64(b.T)), a.T @ b.T)
    p, q = RNG.uniform(-1, 1, (3, 4)), RNG.uniform(-1, 1, (3, 4))
    close(autograd.cossim(t64(p), t64(q)),
          (p * q).sum(1) / np.linalg.norm(p, axis=1) / np.linalg.norm(q, axis=1))
    pos, neg = RNG.uniform(-1, 1, 6), RNG.uniform(-1, 1, 6)
    close(autograd.ranking_loss(t64(pos), t64(neg), 0.3), np.maximum(0, 0.3 - pos + neg).sum() / 6)


# ---- tensor indexing against NumPy
INDEX_CASES = [
    (np.s_[1], np.s_[1:2]),  # an int keeps its dimension, as SINGA's indexing does
    (np.s_[-1, 1:3], np.s_[-1:, 1:3]),
    (np.s_[:, 1:3], np.s_[:, 1:3]),
    (np.s_[..., ::2], np.s_[..., ::2]),
    (np.s_[::-1], np.s_[::-1]),
    (np.s_[1::-2, ..., -1:0:-2], np.s_[1::-2, ..., -1:0:-2]),
    (np.s_[None, :, 1], np.s_[None, :, 1:2]),
    (np.s_[:, :, [3, 0, 3]], np.s_[:, :, [3, 0, 3]]),
    (np.s_[[2, -1]], np.s_[[2, -1]]),
    (np.s_[7:100], np.s_[7:100]),
]


@pytest.mark.parametrize("key,numpy_key", INDEX_CASES)
def test_indexing_matches_numpy(key, numpy_key):
    a = RNG.uniform(-1, 1, (3, 2, 5))
    x = t64(a)
    y = x[key]
    np.testing.assert_array_equal(y.to_numpy(), a[numpy_key])
    if y.size():
        (gx,), w = grads(y, x)
        expected = np.zeros(a.size)
        np.add.at(expected, np.arange(a.size).reshape(a.shape)[numpy_key].reshape(-1), w.reshape(-1))
        np.testing.assert_allclose(gx, expected.reshape(a.shape))


def test_indexing_by_tensor_and_errors():
    a = RNG.uniform(-1, 1, (4, 3)).astype(np.float32)
    t = tensor.from_numpy(a)
    idx = tensor.from_numpy(np.array([3, 0, 3], dtype=np.int64), dtype=tensor.int64)
    np.testing.assert_array_equal(t[idx].to_numpy(), a[[3, 0, 3]])
    np.testing.assert_array_equal(t[:, tensor.from_numpy(np.array([[2, 1]]))].to_numpy(), a[:, [[2, 1]]])
    with pytest.raises(ValueError, match="step"):
        t[::0]
    with pytest.raises(ValueError, match="4"):
        t[4]
    with pytest.raises(ValueError, match="indices for a tensor of 2"):
        t[0, 0, 0]
    with pytest.raises(ValueError, match="boolean"):
        t[np.array([True, False, True, False])]
    with pytest.raises(ValueError, match="at most one"):
        t[[0], [1]]


# ---- layers
def test_gemm_layer_and_reshape_layer():
    x = tensor.from_numpy(RNG.uniform(-1, 1, (2, 3)).astype(np.float32))
    g = layer.Gemm(4)
    y = g(x)
    params = g.get_params()
    assert sorted(params) == ["W", "b"] and params["W"].shape == (4, 3) and params["b"].shape == (1, 4)
    np.testing.assert_allclose(y.to_numpy(), x.to_numpy() @ params["W"].to_numpy().T, rtol=1e-5, atol=1e-6)
    g2 = layer.Gemm(5, alpha=2.0, transA=True, transB=False, bias=False)
    xt = tensor.from_numpy(RNG.uniform(-1, 1, (3, 2)).astype(np.float32))
    y2 = g2(xt)
    assert g2.W.shape == (3, 5) and g2.b is None
    np.testing.assert_allclose(y2.to_numpy(), 2.0 * xt.to_numpy().T @ g2.W.to_numpy(), rtol=1e-5, atol=1e-6)
    assert layer.Reshape()(x, [3, -1]).shape == (3, 2)


def test_pool1d_layers():
    a = RNG.uniform(-1, 1, (2, 3, 1, 8)).astype(np.float32)
    x = tensor.from_numpy(a)
    np.testing.assert_allclose(layer.MaxPool1d(2)(x).to_numpy(), a.reshape(2, 3, 1, 4, 2).max(-1))
    np.testing.assert_allclose(layer.AvgPool1d(4, 2)(x).to_numpy(),
                               np.stack([a[..., i:i + 4].mean(-1) for i in (0, 2, 4)], -1), rtol=1e-6)


def test_contiguous_copy_of_a_view_keeps_the_gradient():
    """t.transpose(...).contiguous() copies the view and autograd records the copy (the gradient passes)."""
    a = np.arange(6.0).reshape(2, 3)
    x = tensor.Tensor((2, 3), dtype=tensor.float64, requires_grad=True, stores_grad=True)
    x.copy_from_numpy(a)
    y = x.transpose().contiguous()
    assert y.is_contiguous() and not y.shares_storage(x) and y.requires_grad
    c = np.arange(6.0).reshape(3, 2) + 1
    list(autograd.backward(autograd.reduce_sum(y * tensor.from_numpy(c, dtype=tensor.float64), [0, 1], keepdims=0)))
    np.testing.assert_array_equal(x.grad.to_numpy(), c.T)
    assert x.contiguous().shares_storage(x)  # already dense: itself
