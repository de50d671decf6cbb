"""SINGA's autograd, tensor and device APIs on tandem: signatures as SINGA's source declares them,
the distributed-training guide's backward loop, the losses' values, the functional operations against
NumPy, and the devices' time profiles."""
import inspect
import re

import numpy as np
import pytest

from tandem import autograd, device, layer, model, opt, tensor

CPU = device.get_default_device()
REQUIRED = inspect.Parameter.empty

# Signatures as SINGA declares them (python/singa/{autograd,tensor,device}.py, src/api/core_device.i):
# (name, [(parameter, default or REQUIRED), ...]); "*l" is a variadic parameter. A tandem function may
# add parameters after SINGA's, each with a default.
AUTOGRAD = [
    ("backward", [("y", REQUIRED), ("dy", None)]),
    ("gradients", [("y", REQUIRED), ("dy", None)]),
    ("relu", [("x", REQUIRED)]),
    ("sigmoid", [("x", REQUIRED)]),
    ("tanh", [("x", REQUIRED)]),
    ("exp", [("a", REQUIRED)]),
    ("log", [("x", REQUIRED)]),
    ("identity", [("x", REQUIRED)]),
    ("negative", [("x", REQUIRED)]),
    ("matmul", [("x", REQUIRED), ("w", REQUIRED)]),
    ("add_bias", [("x", REQUIRED), ("b", REQUIRED), ("axis", 0)]),
    ("add", [("a", REQUIRED), ("b", REQUIRED)]),
    ("sub", [("a", REQUIRED), ("b", REQUIRED)]),
    ("mul", [("x", REQUIRED), ("y", REQUIRED)]),
    ("div", [("a", REQUIRED), ("b", REQUIRED)]),
    ("greater", [("x", REQUIRED), ("y", REQUIRED)]),
    ("less", [("x", REQUIRED), ("y", REQUIRED)]),
    ("equal", [("x", REQUIRED), ("y", REQUIRED)]),
    ("reshape", [("x", REQUIRED), ("shape", REQUIRED)]),
    ("flatten", [("x", REQUIRED), ("axis", 1)]),
    ("transpose", [("x", REQUIRED), ("shape", REQUIRED)]),
    ("squeeze", [("x", REQUIRED), ("axis", [])]),
    ("unsqueeze", [("x", REQUIRED), ("axis", -1)]),
    ("cat", [("xs", REQUIRED), ("axis", 0)]),
    ("softmax", [("x", REQUIRED), ("axis", 1)]),
    ("sum", [("*l", REQUIRED)]),
    ("mean", [("*l", REQUIRED)]),
    ("add_all", [("*xs", REQUIRED)]),
    ("softmax_cross_entropy", [("x", REQUIRED), ("t", REQUIRED)]),
    ("cross_entropy", [("x", REQUIRED), ("t", REQUIRED)]),
    ("mse_loss", [("x", REQUIRED), ("t", REQUIRED)]),
    ("dropout", [("x", REQUIRED), ("seed", 0), ("ratio", 0.5)]),
    ("where", [("x", REQUIRED), ("y", REQUIRED), ("condition", REQUIRED)]),
    ("binary_cross_entropy", [("x", REQUIRED), ("t", REQUIRED)]),
    ("reduce_sum", [("x", REQUIRED), ("axes", None), ("keepdims", 1)]),
    ("reduce_mean", [("x", REQUIRED), ("axes", None), ("keepdims", 1)]),
    ("expand", [("x", REQUIRED), ("shape", REQUIRED)]),
    ("slice", [("x", REQUIRED), ("starts", REQUIRED), ("ends", REQUIRED), ("axes", None), ("steps", None)]),
    # operator classes: their constructors
    ("Operator", [("name", None)]),
    ("AddBias", [("axis", 0)]),
    ("Reshape", [("shape", REQUIRED)]),
    ("Flatten", [("axis", 1)]),
    ("Transpose", [("perm", REQUIRED)]),
    ("Squeeze", [("axis", [])]),
    ("Unsqueeze", [("axis", REQUIRED)]),
    ("Concat", [("axis", 0)]),
    ("SoftMax", [("axis", 1)]),
    ("SoftMaxCrossEntropy", [("t", REQUIRED)]),
    ("CrossEntropy", [("t", REQUIRED)]),
    ("MeanSquareError", [("t", REQUIRED)]),
    ("Dropout", [("seed", 0), ("ratio", 0.5)]),
    ("Where", [("condition", REQUIRED)]),
    ("BinaryCrossEntropy", [("t", REQUIRED)]),
    ("ReduceSum", [("axes", None), ("keepdims", 1)]),
    ("ReduceMean", [("axes", None), ("keepdims", 1)]),
    ("Expand", [("shape", REQUIRED)]),
    ("Slice", [("starts", REQUIRED), ("ends", REQUIRED), ("axes", None), ("steps", None)]),
]
for _name in ("ReLU", "Sigmoid", "Tanh", "Exp", "Log", "Identity", "Negative", "Matmul", "Add", "Sub", "Mul", "Div",
              "Greater", "Less", "Equal", "Sum", "Mean"):
    AUTOGRAD.append((_name, [("name", None)]))  # SINGA's take no argument; Operator's name is optional

TENSOR = [
    ("from_numpy", [("np_array", REQUIRED), ("dev", None)]),
    ("to_numpy", [("t", REQUIRED)]),
    ("to_host", [("t", REQUIRED)]),
    ("from_raw_tensor", [("t", REQUIRED)]),
    ("from_raw_tensors", [("tt", REQUIRED)]),
    ("zeros_like", [("t", REQUIRED)]),
    ("ones_like", [("t", REQUIRED)]),
    ("product", [("shape", REQUIRED)]),
    ("sizeof", [("dtype", REQUIRED)]),
    ("contiguous", [("tensor", REQUIRED)]),
    ("reshape", [("tensor", REQUIRED), ("shape", REQUIRED)]),
    ("transpose", [("t", REQUIRED), ("axes", None)]),
    ("copy_data_to_from", [("dst", REQUIRED), ("src", REQUIRED), ("size", REQUIRED), ("dst_offset", 0),
                           ("src_offset", 0)]),
    ("copy_from_numpy", [("data", REQUIRED), ("np_array", REQUIRED)]),
    ("concatenate", [("tensors", REQUIRED), ("axis", REQUIRED)]),
    ("softmax", [("t", REQUIRED), ("out", None)]),
    ("sum", [("t", REQUIRED), ("axis", None), ("out", None)]),
    ("average", [("t", REQUIRED), ("axis", None)]),
    ("pow", [("t", REQUIRED), ("x", REQUIRED), ("out", None)]),
    ("exp", [("t", REQUIRED)]),
    ("log", [("t", REQUIRED)]),
    ("sigmoid", [("t", REQUIRED)]),
    ("tanh", [("t", REQUIRED)]),
    ("square", [("t", REQUIRED)]),
    ("lt", [("t", REQUIRED), ("x", REQUIRED)]),
    ("le", [("t", REQUIRED), ("x", REQUIRED)]),
    ("gt", [("t", REQUIRED), ("x", REQUIRED)]),
    ("ge", [("t", REQUIRED), ("x", REQUIRED)]),
    ("eq", [("t", REQUIRED), ("x", REQUIRED)]),
    ("add", [("lhs", REQUIRED), ("rhs", REQUIRED), ("ret", None)]),
    ("sub", [("lhs", REQUIRED), ("rhs", REQUIRED), ("ret", None)]),
    ("eltwise_mult", [("lhs", REQUIRED), ("rhs", REQUIRED), ("ret", None)]),
    ("div", [("lhs", REQUIRED), ("rhs", REQUIRED), ("ret", None)]),
    ("mult", [("A", REQUIRED), ("B", REQUIRED), ("C", None), ("alpha", 1.0), ("beta", 0.0)]),
    ("axpy", [("alpha", REQUIRED), ("x", REQUIRED), ("y", REQUIRED)]),
    ("bernoulli", [("p", REQUIRED), ("t", REQUIRED)]),
    ("gaussian", [("mean", REQUIRED), ("std", REQUIRED), ("t", REQUIRED)]),
    ("uniform", [("low", REQUIRED), ("high", REQUIRED), ("t", REQUIRED)]),
    ("random", [("shape", REQUIRED), ("device", CPU)]),
    ("zeros", [("shape", REQUIRED), ("device", CPU)]),
    ("ones", [("shape", REQUIRED), ("device", CPU)]),
]

TENSOR_METHODS = [
    ("__init__", [("shape", ()), ("device", None), ("dtype", tensor.float32), ("data", None), ("requires_grad", True),
                  ("stores_grad", False), ("creator", None), ("name", None)]),
    ("is_dummy", []),
    ("is_empty", []),
    ("is_transpose", []),
    ("transpose", [("axes", None)]),
    ("size", []),
    ("memsize", []),
    ("contiguous", []),
    ("reshape", [("shape", REQUIRED)]),
    ("as_type", [("dtype", REQUIRED)]),
    ("to_type", [("dtype", REQUIRED)]),
    ("to_device", [("device", REQUIRED)]),
    ("to_host", []),
    ("l2", []),
    ("l1", []),
    ("set_value", [("x", REQUIRED), ("inplace", True)]),
    ("copy_from_numpy", [("np_array", REQUIRED), ("offset", 0)]),
    ("copy_data", [("t", REQUIRED)]),
    ("copy_from", [("t", REQUIRED), ("offset", 0)]),
    ("clone", []),
    ("copy", []),
    ("deepcopy", []),
    ("bernoulli", [("p", REQUIRED), ("inplace", True)]),
    ("gaussian", [("mean", REQUIRED), ("std", REQUIRED), ("inplace", True)]),
    ("uniform", [("low", REQUIRED), ("high", REQUIRED), ("inplace", True)]),
]

DEVICE = [
    ("get_num_gpus", []),
    ("get_gpu_ids", []),
    ("create_cpu_device", []),
    ("create_cuda_gpus", [("num", REQUIRED)]),
    ("create_cuda_gpu", []),
    ("create_cuda_gpus_on", [("device_ids", REQUIRED)]),
    ("create_cuda_gpu_on", [("device_id", REQUIRED)]),
    ("get_default_device", []),
]

DEVICE_METHODS = [
    ("SetRandSeed", [("seed", REQUIRED)]),
    ("id", []),
    ("Sync", []),
    ("SetVerbosity", [("verbosity", REQUIRED)]),
    ("SetSkipIteration", [("skip_iteration", REQUIRED)]),
    ("PrintTimeProfiling", []),
    ("EnableGraph", [("enable", REQUIRED)]),
    ("ResetGraph", []),
    ("graph_enabled", []),
    ("Reset", []),
    ("host", []),
]

_NB_DEFAULT = re.compile(r"^\\(\d+)$")


def parameters(fn):
    """[(name, default or REQUIRED)] without self, from inspect or from nanobind's signature record."""
    try:
        sig = inspect.signature(fn)
    except (ValueError, TypeError):
        sig = None
    if sig is not None:
        out = []
        for p in sig.parameters.values():
            if p.name == "self":
                continue
            name = "*" + p.name if p.kind == p.VAR_POSITIONAL else p.name
            out.append((name, p.default))
        return out
    text, _, defaults = fn.__nb_signature__[0]
    inner = text[text.index("(") + 1:text.rindex(")")]
    out = []
    for part in [p.strip() for p in re.split(r",\s*(?![^\[]*\])", inner) if p.strip()]:
        name = part.split(":")[0].split("=")[0].strip()
        if name == "self":
            continue
        default = REQUIRED
        if "=" in part:
            m = _NB_DEFAULT.match(part.split("=", 1)[1].strip())
            default = defaults[int(m.group(1))] if m else part.split("=", 1)[1].strip()
        out.append((name, default))
    return out


def same_default(ours, theirs):
    if isinstance(theirs, (tuple, list)) and isinstance(ours, (tuple, list)):
        return tuple(ours) == tuple(theirs)
    return ours is theirs or ours == theirs


def check(owner, table):
    for name, expected in table:
        fn = getattr(owner, name, None)
        assert fn is not None, f"{name} is missing"
        got = parameters(fn)
        assert [n for n, _ in got[:len(expected)]] == [n for n, _ in expected], f"{name}: {got} vs {expected}"
        for (n, d), (_, e) in zip(got, expected):
            assert same_default(d, e), f"{name}: default of {n} is {d!r}, SINGA's is {e!r}"
        for n, d in got[len(expected):]:
            assert d is not REQUIRED or n.startswith("*"), f"{name}: parameter {n} beyond SINGA's needs a default"


def test_signatures_are_singas():
    check(autograd, AUTOGRAD)
    check(tensor, TENSOR)
    check(tensor.Tensor, TENSOR_METHODS)
    check(device, DEVICE)
    check(device.Device, DEVICE_METHODS)


# ---- backward
def mlp(seed=0):
    """SINGA's examples/mlp/native.py model: parameters made by hand, in its order."""
    rng = np.random.RandomState(seed)
    params = {}
    for name, shape in (("w0", (2, 3)), ("b0", (3,)), ("w1", (3, 2)), ("b1", (2,))):
        t = tensor.Tensor(shape=shape, device=CPU, requires_grad=True, stores_grad=True, name=name)
        t.copy_from_numpy(rng.standard_normal(shape).astype(np.float32))
        params[name] = t
    return params


def mlp_loss(p, x, y):
    h = autograd.relu(autograd.add_bias(autograd.matmul(x, p["w0"]), p["b0"]))
    return autograd.softmax_cross_entropy(autograd.add_bias(autograd.matmul(h, p["w1"]), p["b1"]), y)


def numpy_mlp_gradients(p, x, y):
    w0, b0, w1, b1 = (p[k].to_numpy().astype(np.float64) for k in ("w0", "b0", "w1", "b1"))
    a = x @ w0 + b0
    h = np.maximum(a, 0)
    z = h @ w1 + b1
    s = np.exp(z - z.max(1, keepdims=True))
    s /= s.sum(1, keepdims=True)
    dz = s.copy()
    dz[np.arange(len(y)), y] -= 1
    dz /= len(y)
    dh = dz @ w1.T
    da = dh * (a > 0)
    return {"w0": x.T @ da, "b0": da.sum(0), "w1": h.T @ dz, "b1": dz.sum(0)}


def test_backward_yields_every_parameter_once_with_its_gradient():
    rng = np.random.RandomState(1)
    xs = rng.standard_normal((6, 2)).astype(np.float32)
    ys = np.array([0, 1, 1, 0, 1, 0], dtype=np.int32)
    p = mlp()
    x, y = tensor.from_numpy(xs), tensor.from_numpy(ys)
    loss = mlp_loss(p, x, y)
    pending = autograd.backward(loss)
    assert inspect.isgenerator(pending)
    assert all(t.grad is None for t in p.values())  # a generator: nothing ran yet
    seen = {}
    for param, grad in pending:
        assert param.name not in seen, f"{param.name} yielded twice"
        seen[param.name] = grad.to_numpy()
        np.testing.assert_array_equal(param.grad.to_numpy(), seen[param.name])
    assert sorted(seen) == ["b0", "b1", "w0", "w1"]
    expected = numpy_mlp_gradients(p, xs.astype(np.float64), ys)
    for name, g in seen.items():
        np.testing.assert_allclose(g, expected[name], rtol=1e-5, atol=1e-6, err_msg=name)

    # Each pass gives its own gradients (not the sum of two passes); dy scales them.
    again = {q.name: g.to_numpy() for q, g in autograd.backward(mlp_loss(p, x, y))}
    scaled = {q.name: g.to_numpy() for q, g in autograd.backward(mlp_loss(p, x, y), 3.0)}
    for name in seen:
        np.testing.assert_allclose(again[name], seen[name], rtol=1e-6)
        np.testing.assert_allclose(scaled[name], 3 * seen[name], rtol=1e-5, atol=1e-7)
    assert sorted(autograd.gradients(mlp_loss(p, x, y))) == ["b0", "b1", "w0", "w1"]
    # SINGA's default tensor (requires_grad=True, stores_grad=False) gets no gradient.
    assert x.grad is None and not x.stores_grad


class GuideCNN(model.Model):
    """The distributed-training guide's CNN."""

    def __init__(self):
        super().__init__()
        self.conv1 = layer.Conv2d(1, 4, 3, padding=0, activation="RELU")
        self.pooling1 = layer.MaxPool2d(2, 2, padding=0)
        self.flatten = layer.Flatten()
        self.linear1 = layer.Linear(10)

    def forward(self, x):
        return self.linear1(self.flatten(self.pooling1(self.conv1(x))))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = autograd.softmax_cross_entropy(out, y)
        self.optimizer(loss)
        return out, loss


def synchronize(t, dist_opt):
    """The guide's helper: the tensor averaged over the ranks, in place."""
    dist_opt.all_reduce(t.data)
    dist_opt.wait()
    t /= dist_opt.world_size


def test_the_guides_synchronizing_loop_meets_every_parameter_once():
    CPU.SetRandSeed(0)
    sgd = opt.DistOpt(opt.SGD(lr=0.05, momentum=0.9))
    net = GuideCNN()
    rng = np.random.RandomState(2)
    tx = tensor.Tensor((4, 1, 8, 8), CPU, tensor.float32)
    ty = tensor.Tensor((4,), CPU, tensor.int32)
    tx.copy_from_numpy(rng.standard_normal((4, 1, 8, 8)).astype(np.float32))
    ty.copy_from_numpy(np.array([1, 2, 3, 4], dtype=np.int32))
    net.set_optimizer(sgd)
    net.compile([tx], is_train=True, use_graph=False, sequential=False)
    assert autograd.training is True

    out = net.forward(tx)
    loss = autograd.softmax_cross_entropy(out, ty)
    before = {k: v.to_numpy() for k, v in net.get_params().items()}
    names = []
    for p, g in autograd.backward(loss):
        synchronize(p, sgd)
        names.append(p.name)
        assert tuple(g.shape) == tuple(p.shape)
    assert sorted(names) == sorted(net.get_params())  # named by their path, each once
    for k, v in net.get_params().items():  # one rank: the average is the value
        np.testing.assert_array_equal(v.to_numpy(), before[k])
    net(tx, ty)  # then a training step, as the guide goes on
    net.eval()
    assert autograd.training is False


class GuideAutogradCNN:
    """The guide's CNN as its text writes it: a plain class of SINGA 3.0's autograd layers."""

    def __init__(self):
        self.conv1 = autograd.Conv2d(1, 20, 5, padding=0)
        self.conv2 = autograd.Conv2d(20, 50, 5, padding=0)
        self.linear1 = autograd.Linear(4 * 4 * 50, 500)
        self.linear2 = autograd.Linear(500, 10)
        self.pooling1 = autograd.MaxPool2d(2, 2, padding=0)
        self.pooling2 = autograd.MaxPool2d(2, 2, padding=0)

    def forward(self, x):
        y = self.pooling1(autograd.relu(self.conv1(x)))
        y = self.pooling2(autograd.relu(self.conv2(y)))
        y = autograd.relu(self.linear1(autograd.flatten(y)))
        return self.linear2(y)


def test_the_guides_autograd_layers_build_and_train_its_cnn():
    # SINGA 3.0 kept its layers in autograd; they are tandem.layer's classes.
    for name in ("Layer", "Conv2d", "SeparableConv2d", "Linear", "BatchNorm2d", "Pooling2d", "MaxPool2d",
                 "AvgPool2d", "MaxPool1d", "AvgPool1d"):
        assert getattr(autograd, name) is getattr(layer, name), name
    CPU.SetRandSeed(0)
    net = GuideAutogradCNN()
    rng = np.random.RandomState(5)
    tx = tensor.Tensor((4, 1, 28, 28), CPU, tensor.float32)
    ty = tensor.Tensor((4, 10), CPU, tensor.int32)  # the guide's one-hot targets
    tx.copy_from_numpy(rng.random_sample((4, 1, 28, 28)).astype(np.float32))
    ty.copy_from_numpy(np.eye(10, dtype=np.int32)[[1, 3, 5, 7]])
    autograd.training = True
    sgd = opt.SGD(lr=0.05, momentum=0.9, weight_decay=1e-5)
    losses = []
    for _ in range(3):
        loss = autograd.softmax_cross_entropy(net.forward(tx), ty)
        losses.append(tensor.to_numpy(loss)[0])
        sgd(loss)
    shapes = sorted(tuple(p.shape) for p, _ in autograd.backward(autograd.softmax_cross_entropy(net.forward(tx), ty)))
    assert shapes == sorted([(20, 1, 5, 5), (20,), (50, 20, 5, 5), (50,), (500, 800), (500,), (10, 500), (10,)])
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


# ---- losses
def test_softmax_cross_entropy_with_labels_and_one_hot_targets():
    logits = np.array([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0], [0.5, -2.0, 4.0]], dtype=np.float32)
    labels = np.array([2, 0, 1], dtype=np.int32)
    z = logits.astype(np.float64)
    expected = np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(3), labels])
    x = tensor.from_numpy(logits)
    loss = autograd.softmax_cross_entropy(x, tensor.from_numpy(labels))
    assert loss.shape == (1,)  # as SINGA's: scripts read tensor.to_numpy(loss)[0]
    by_label = tensor.to_numpy(loss)[0]
    one_hot = np.eye(3, dtype=np.int32)[labels]  # SINGA's MNIST example: int32 one-hot rows
    by_target = autograd.softmax_cross_entropy(x, tensor.from_numpy(one_hot)).item()
    by_float_target = autograd.softmax_cross_entropy(x, tensor.from_numpy(one_hot.astype(np.float32))).item()
    assert by_label == pytest.approx(expected, rel=1e-6)
    assert by_target == pytest.approx(expected, rel=1e-6)
    assert by_float_target == pytest.approx(expected, rel=1e-6)
    # SINGA's class form gives the same.
    assert autograd.SoftMaxCrossEntropy(tensor.from_numpy(labels))(x)[0].item() == pytest.approx(expected, rel=1e-6)
    # cross_entropy takes probabilities.
    probs = autograd.softmax(x)
    assert autograd.cross_entropy(probs, tensor.from_numpy(one_hot)).item() == pytest.approx(expected, rel=1e-5)
    assert autograd.cross_entropy(probs, tensor.from_numpy(labels)).item() == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="2-d"):
        autograd.softmax_cross_entropy(tensor.from_numpy(logits.reshape(-1)), tensor.from_numpy(labels))


def test_mse_loss_and_its_gradient():
    a = np.array([[1.0, -2.0], [0.5, 3.0]], dtype=np.float32)
    t = np.array([[0.0, -1.0], [0.5, 1.0]], dtype=np.float32)
    x = tensor.Tensor(data=a, requires_grad=True, stores_grad=True)
    loss = autograd.mse_loss(x, tensor.from_numpy(t))
    assert loss.shape == (1,) and loss.item() == pytest.approx(np.mean((a - t) ** 2))
    (p, g), = list(autograd.backward(loss))
    np.testing.assert_allclose(g.to_numpy(), 2 * (a - t) / a.size, rtol=1e-6)


# ---- functional operations against NumPy
def test_functional_operations_match_numpy():
    rng = np.random.RandomState(3)
    a = rng.standard_normal((2, 3)).astype(np.float32)
    b = rng.standard_normal((3,)).astype(np.float32)
    c = rng.standard_normal((2,)).astype(np.float32)
    x4 = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    ta, tb, tc, t4 = (tensor.from_numpy(v) for v in (a, b, c, x4))
    close = np.testing.assert_allclose
    close(autograd.add_bias(ta, tb).to_numpy(), a + b, rtol=1e-6)
    close(autograd.add_bias(ta, tc, axis=1).to_numpy(), a + c[:, None], rtol=1e-6)
    close(autograd.add(ta, tb).to_numpy(), a + b, rtol=1e-6)  # broadcast
    close(autograd.sub(ta, tb).to_numpy(), a - b, rtol=1e-6)
    close(autograd.mul(ta, tb).to_numpy(), a * b, rtol=1e-6)
    close(autograd.div(ta, tensor.from_numpy(np.abs(b) + 1)).to_numpy(), a / (np.abs(b) + 1), rtol=1e-6)
    close(autograd.matmul(ta, tensor.from_numpy(a.T.copy())).to_numpy(), a @ a.T, rtol=1e-5)
    close(autograd.sigmoid(ta).to_numpy(), 1 / (1 + np.exp(-a)), rtol=1e-6)
    close(autograd.tanh(ta).to_numpy(), np.tanh(a), rtol=1e-6)
    close(autograd.exp(ta).to_numpy(), np.exp(a), rtol=1e-6)
    assert autograd.reshape(t4, [0, -1]).shape == (2, 60)
    assert autograd.reshape(t4, [2, 0, -1, 5]).shape == (2, 3, 4, 5)
    assert autograd.flatten(t4).shape == (2, 60)
    assert autograd.flatten(t4, 2).shape == (6, 20)
    assert autograd.flatten(t4, 0).shape == (1, 120)
    close(autograd.transpose(t4, [0, 2, 1, 3]).to_numpy(), x4.transpose(0, 2, 1, 3))
    assert autograd.unsqueeze(ta, [0]).shape == (1, 2, 3)
    assert autograd.unsqueeze(ta, 2).shape == (2, 3, 1)
    assert autograd.squeeze(autograd.unsqueeze(ta, [0, 3])).shape == (2, 3)
    assert autograd.squeeze(autograd.unsqueeze(ta, [0]), [0]).shape == (2, 3)
    with pytest.raises(ValueError, match="extent"):
        autograd.squeeze(ta, [0])
    close(autograd.cat([ta, ta * 2.0], 1).to_numpy(), np.concatenate([a, 2 * a], 1))
    close(autograd.cat([ta, ta], axis=0).to_numpy(), np.concatenate([a, a], 0))
    close(autograd.sum(ta, ta, ta).to_numpy(), 3 * a, rtol=1e-6)
    close(autograd.mean(ta, ta * 3.0).to_numpy(), 2 * a, rtol=1e-6)
    # softmax over the dimensions from axis on, together (SINGA's definition); per row for 2-d.
    e = np.exp(a - a.max(1, keepdims=True))
    close(autograd.softmax(ta).to_numpy(), e / e.sum(1, keepdims=True), rtol=1e-6)
    flat = x4.reshape(2, -1)
    e4 = np.exp(flat - flat.max(1, keepdims=True))
    close(autograd.softmax(t4, 1).to_numpy(), (e4 / e4.sum(1, keepdims=True)).reshape(x4.shape), rtol=1e-5)
    e_last = np.exp(x4 - x4.max(-1, keepdims=True))
    close(autograd.softmax(t4, axis=-1).to_numpy(), e_last / e_last.sum(-1, keepdims=True), rtol=1e-5)
    cond = a > 0
    close(autograd.where(ta, tensor.from_numpy(np.zeros_like(a)), cond).to_numpy(), np.where(cond, a, 0))
    close(autograd.greater(ta, tensor.from_numpy(np.zeros(3, dtype=np.float32))).to_numpy(), (a > 0).astype(np.float32))
    close(autograd.reduce_sum(t4, [1, -1]).to_numpy(), x4.sum((1, 3), keepdims=True), rtol=1e-5)
    close(autograd.reduce_mean(t4, keepdims=0).to_numpy(), x4.mean(), rtol=1e-5)
    close(autograd.expand(tb, [2, 1]).to_numpy(), np.broadcast_to(b, (2, 3)))
    close(autograd.slice(t4, [1, 0], [3, 4], axes=[1, 3], steps=[1, 2]).to_numpy(), x4[:, 1:3, :, 0:4:2])
    close(autograd.slice(t4, [-1], [-4], axes=[2], steps=[-1]).to_numpy(), x4[:, :, -1:-4:-1])
    p = tensor.from_numpy(np.array([[0.9, 0.2], [0.1, 0.7]], dtype=np.float32))
    q = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    pv = p.to_numpy().astype(np.float64)
    want = -(np.sum(q * np.log(pv + 1e-4)) + np.sum((1 - q) * np.log(1.0001 - pv))) / 2
    assert autograd.binary_cross_entropy(p, tensor.from_numpy(q)).item() == pytest.approx(want, rel=1e-5)
    # SINGA's operator classes return tuples.
    ys = autograd.ReLU()(ta)
    assert isinstance(ys, tuple) and len(ys) == 1
    close(ys[0].to_numpy(), np.maximum(a, 0))
    close(autograd.Matmul()(ta, tensor.from_numpy(a.T.copy()))[0].to_numpy(), a @ a.T, rtol=1e-5)


def test_functional_operations_differentiate_through_broadcasts_and_joins():
    rng = np.random.RandomState(4)
    a = rng.standard_normal((3, 3)).astype(np.float32)
    b = rng.standard_normal((3,)).astype(np.float32)
    ta = tensor.Tensor(data=a, stores_grad=True, name="a")
    tb = tensor.Tensor(data=b, stores_grad=True, name="b")
    y = autograd.cat([autograd.mul(ta, tb), autograd.transpose(ta, (1, 0))[0:2]], 0)  # [5, 3]
    loss = autograd.mse_loss(y, tensor.Tensor(y.shape))
    grads = {p.name: g.to_numpy() for p, g in autograd.backward(loss)}
    yv = np.concatenate([a * b, a.T[0:2]], 0)
    dy = 2 * yv / yv.size
    np.testing.assert_allclose(grads["b"], (dy[:3] * a).sum(0), rtol=1e-5)
    expected_a = dy[:3] * b
    expected_a[:, 0:2] += dy[3:5].T
    np.testing.assert_allclose(grads["a"], expected_a, rtol=1e-5)


def test_add_all_returns_the_sum_and_its_gradients():
    # SINGA's add_all adds its (more than two) tensors and returns nothing; tandem's returns the sum.
    rng = np.random.RandomState(5)
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3), (3,), (2, 3)))
    ts = [tensor.Tensor(data=v, stores_grad=True, name=n) for v, n in zip((a, b, c), "abc")]
    y = autograd.add_all(*ts)
    np.testing.assert_allclose(y.to_numpy(), a + b + c, rtol=1e-6)
    grads = {p.name: g.to_numpy() for p, g in autograd.backward(autograd.reduce_sum(y, keepdims=0))}
    np.testing.assert_allclose(grads["a"], np.ones((2, 3)))
    np.testing.assert_allclose(grads["b"], np.full(3, 2.0))  # broadcast over 2 rows
    np.testing.assert_allclose(grads["c"], np.ones((2, 3)))
    np.testing.assert_allclose(autograd.add_all(ts[0], ts[2]).to_numpy(), a + c, rtol=1e-6)
    with pytest.raises(ValueError, match="at least one"):
        autograd.add_all()


def test_dropout_follows_the_training_flag():
    x = tensor.from_numpy(np.ones((100, 100), dtype=np.float32))
    before = autograd.training
    try:
        autograd.training = False
        np.testing.assert_array_equal(autograd.dropout(x, ratio=0.3).to_numpy(), 1.0)
        autograd.training = True
        y = autograd.dropout(x, seed=5, ratio=0.3).to_numpy()
        kept = y != 0
        np.testing.assert_allclose(y[kept], 1 / 0.7, rtol=1e-6)
        assert 0.65 < kept.mean() < 0.75
        z = autograd.dropout(x, seed=5, ratio=0.3).to_numpy()
        assert not np.array_equal(z, y)  # the seed's stream goes on: a new mask
    finally:
        autograd.training = before


# ---- tensors
def test_tensor_constructor_takes_singas_arguments():
    t = tensor.Tensor((2, 3), CPU, tensor.int32)
    assert t.shape == (2, 3) and t.dtype == tensor.int32 and t.device is CPU
    assert not t.requires_grad and not t.stores_grad  # SINGA's default: no gradient kept
    p = tensor.Tensor(shape=(3,), requires_grad=True, stores_grad=True, name="w")
    assert p.stores_grad and p.requires_grad and p.name == "w" and not p.is_dummy()
    assert tensor.Tensor((1,)).is_dummy()
    d = tensor.Tensor(data=np.arange(6).reshape(2, 3))  # an array: copied, as dtype (float32)
    assert d.dtype == tensor.float32 and d.shape == (2, 3)
    np.testing.assert_array_equal(d.to_numpy(), np.arange(6).reshape(2, 3))
    s = tensor.Tensor(data=d)  # a tensor: its memory shared
    s.set_value(7)
    np.testing.assert_array_equal(d.to_numpy(), 7)
    assert tensor.Tensor(data=np.zeros(2), dtype=tensor.int32).dtype == tensor.int32
    with pytest.raises(ValueError, match="creator"):
        tensor.Tensor((1,), creator=object())
    assert t.ndim == 2 and t.ndim() == 2 and t.size() == 6 and t.memsize() == 24


def test_tensor_methods():
    a = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    t = tensor.from_numpy(a)
    np.testing.assert_array_equal(t.transpose().to_numpy(), a.T)
    np.testing.assert_array_equal(t.transpose((1, 0)).to_numpy(), a.T)
    np.testing.assert_array_equal(t.T().to_numpy(), a.T)
    np.testing.assert_array_equal(t[1].to_numpy(), a[1:2])  # an int keeps the dimension, as SINGA's
    np.testing.assert_array_equal(t[-1, 1:3].to_numpy(), a[2:3, 1:3])
    np.testing.assert_array_equal(t[:, 2].to_numpy(), a[:, 2:3])
    with pytest.raises(ValueError):
        t[3]
    np.testing.assert_array_equal((t > 0).to_numpy(), (a > 0).astype(np.float32))
    np.testing.assert_array_equal((t <= 1).to_numpy(), (a <= 1).astype(np.float32))
    np.testing.assert_array_equal(tensor.eq(t, 2.0).to_numpy(), (a == 2).astype(np.float32))
    np.testing.assert_array_equal((t / t[0:1]).to_numpy(), a / a[0:1])
    assert t.l1() == pytest.approx(np.abs(a).mean())
    assert t.l2() == pytest.approx(np.linalg.norm(a) / a.size)
    fresh = t.set_value(2.0, inplace=False)
    assert fresh is not t and (fresh.to_numpy() == 2).all() and (t.to_numpy() == a).all()
    g = t.gaussian(0.0, 1.0, inplace=False)
    assert g.shape == t.shape and (t.to_numpy() == a).all()
    b = tensor.Tensor((10000,)).bernoulli(0.25).to_numpy()
    assert set(np.unique(b)) <= {0.0, 1.0} and 0.22 < b.mean() < 0.28
    u = tensor.Tensor((5,))
    u.copy_from_numpy(np.array([1, 2], dtype=np.float32), offset=3)
    np.testing.assert_array_equal(u.to_numpy(), [0, 0, 0, 1, 2])
    u.copy_from(tensor.from_numpy(np.full(5, 4.0)))
    np.testing.assert_array_equal(u.to_numpy(), 4)
    tensor.copy_data_to_from(u, tensor.from_numpy(np.arange(5.0)), 2, dst_offset=1, src_offset=3)
    np.testing.assert_array_equal(u.to_numpy(), [4, 3, 4, 4, 4])
    i = tensor.from_numpy(np.array([1.7, -2.2], dtype=np.float32))
    assert i.to_type(tensor.int32) is i and i.dtype == tensor.int32
    assert tensor.sum(t).item() == a.sum()
    np.testing.assert_array_equal(tensor.sum(t, 0).to_numpy(), a.sum(0))
    assert tensor.average(t) == pytest.approx(a.mean())
    np.testing.assert_allclose(tensor.average(t, 1).to_numpy(), a.mean(1))
    c = tensor.zeros((3, 3))
    tensor.mult(t, t.T(), c, alpha=2.0)
    np.testing.assert_allclose(c.to_numpy(), 2 * a @ a.T)
    np.testing.assert_allclose(tensor.axpy(0.5, t, tensor.ones((3, 4))).to_numpy(), 1 + 0.5 * a)
    np.testing.assert_allclose(tensor.softmax(t).to_numpy().sum(1), 1.0, rtol=1e-6)
    assert tensor.random((4,)).shape == (4,) and tensor.product((2, 3, 4)) == 24 and tensor.sizeof(tensor.float32) == 4


# ---- devices
class Tiny(model.Model):
    def __init__(self):
        super().__init__()
        self.fc1 = layer.Linear(8)
        self.relu = layer.ReLU()
        self.fc2 = layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def train_tiny(steps):
    CPU.SetRandSeed(1)
    net = Tiny()
    rng = np.random.RandomState(5)
    x = tensor.from_numpy(rng.standard_normal((16, 5)).astype(np.float32))
    y = tensor.from_numpy(rng.randint(0, 3, 16).astype(np.int32))
    net.set_optimizer(opt.SGD(lr=0.1))
    net.compile([x], is_train=True)
    for _ in range(steps):
        net(x, y)


@pytest.fixture
def profiled_cpu():
    CPU.ResetTimeProfiling()
    yield CPU
    CPU.SetVerbosity(0)
    CPU.SetSkipIteration(5)
    CPU.ResetTimeProfiling()


def test_print_time_profiling_lists_the_models_operations_with_their_times(profiled_cpu, capsys):
    dev = profiled_cpu
    dev.SetVerbosity(2)
    dev.SetSkipIteration(1)
    train_tiny(4)
    capsys.readouterr()
    dev.PrintTimeProfiling()
    out = capsys.readouterr().out
    assert "Time Profiling: cpu, 3 iterations after the first 1 skipped" in out
    rows = re.findall(r"^OP_ID\d+\. (\S+) \[(\w+)\] : (\S+) sec, (\S+) calls?$", out, re.M)
    assert rows, out
    listed = {(name, phase) for name, phase, _, _ in rows}
    for op in [("gemm", "forward"), ("bias_add", "forward"), ("relu", "forward"), ("softmax_xent_forward", "forward"),
               ("softmax_xent_backward", "backward"), ("relu_backward", "backward"), ("gemm", "backward"),
               ("sgd_step", "update")]:
        assert op in listed, (op, out)
    for name, phase, seconds, calls in rows:
        assert float(seconds) > 0, (name, phase)
    profile = dev.time_profile()
    assert profile["iterations"] == 4 and profile["profiled_iterations"] == 3
    steps = [op for op in profile["ops"] if op["name"] == "sgd_step"]
    assert steps[0]["calls"] == 3  # the skipped first iteration's step is not counted

    dev.SetVerbosity(1)
    dev.PrintTimeProfiling()
    out = capsys.readouterr().out
    forward = float(re.search(r"Forward Propagation Time : (\S+) sec", out).group(1))
    backward = float(re.search(r"Backward Propagation Time : (\S+) sec", out).group(1))
    assert forward > 0 and backward > 0


def test_set_verbosity_zero_prints_and_times_nothing(profiled_cpu, capsys):
    dev = profiled_cpu
    dev.SetVerbosity(0)
    train_tiny(3)
    capsys.readouterr()
    dev.PrintTimeProfiling()
    assert capsys.readouterr().out == ""
    assert dev.time_profile()["ops"] == []
    with pytest.raises(ValueError, match="SetVerbosity"):
        dev.SetVerbosity(7)


def test_device_methods():
    dev = device.create_cpu_device()
    assert dev is device.get_default_device() and dev.id() == -1 and dev.host() is dev
    dev.Sync()
    assert dev.graph_enabled()
    generation = dev.graph_generation
    dev.EnableGraph(False)
    assert not dev.graph_enabled()
    dev.ResetGraph()
    assert dev.graph_generation == generation + 1
    dev.Reset()
    assert dev.graph_enabled() and dev.time_profile()["verbosity"] == 0
    assert dev.time_profile()["skip_iterations"] == 5
    assert device.get_gpu_ids() == list(range(device.get_num_gpus()))


def test_model_train_and_eval_set_the_training_flag_and_graph_switches_recording():
    net = Tiny()
    net.train()
    assert autograd.training is True
    net.eval()
    assert autograd.training is False
    net.graph(True, False)
    assert net.graph_mode and not net.sequential
    net.graph(mode=False, sequential=True)
    assert not net.graph_mode and net.sequential
