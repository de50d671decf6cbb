"""DistOpt(shard="parameters") (ZeRO stage 3) on SINGA-style Python models, on the ranks of a job: each
sublayer of the model holding parameters is a layer group, gathered whole only while it is called.
Run by test_distopt_shard_parameters.py under `tandem launch -n N` with a scratch directory as its
argument; prints "rank R ok NAME" per check. Expectations come from the same runs under shard="none"
(bit for bit on 2 ranks, where the sums are the same; within 1e-6 otherwise)."""
import pathlib
import sys

import numpy as np

from tandem import _tandem, autograd, device, layer, model, opt, tensor

STEPS = 4


def check(rank, world, name, got, want):
    """got and want: dicts of arrays. Bit for bit on 2 ranks, else within 1e-6 (relative)."""
    assert sorted(got) == sorted(want), (name, sorted(got), sorted(want))
    for k in want:
        if world == 2:
            assert np.array_equal(got[k], want[k]), f"{name}: {k} differs: {got[k]} vs {want[k]}"
        else:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-7, err_msg=f"{name}: {k}")
    print(f"rank {rank} ok {name}", flush=True)


def expect_error(rank, name, fn, kind, *fragments):
    try:
        fn()
    except kind as e:
        for f in fragments:
            assert f in str(e), f"{name}: {f!r} not in the error: {e}"
        print(f"rank {rank} ok {name}", flush=True)
        return
    raise AssertionError(f"{name}: no {kind.__name__} raised")


def params(net):
    return {k: v.to_numpy().copy() for k, v in net.get_params().items()}


def states_of(net):
    return {k: v.to_numpy().copy() for k, v in net.get_states().items()}


# ---- models

class Train(model.Model):
    """train_one_batch of the guide: loss, then the optimizer's step."""

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


class MLP(Train):
    """Registered in another order than forward calls them: the groups follow the calls."""

    def __init__(self):
        super().__init__()
        self.fc3 = layer.Linear(3)
        self.fc2 = layer.Linear(6)
        self.fc1 = layer.Linear(7)
        self.relu = layer.ReLU()
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc3(self.relu(self.fc2(self.relu(self.fc1(x)))))


class CNN(Train):
    def __init__(self):
        super().__init__()
        self.conv1 = layer.Conv2d(4, 3, padding=1, bias=False)  # batch norm follows: a bias would get rounding only
        self.bn = layer.BatchNorm2d(4)  # its statistics are buffers (each rank's own): not sharded
        self.pool = layer.MaxPool2d(2, 2)
        self.conv2 = layer.Conv2d(5, 3, padding=1, activation="RELU")
        self.flat = layer.Flatten()
        self.fc = layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc(self.flat(self.conv2(self.pool(autograd.relu(self.bn(self.conv1(x)))))))


class TwoWay(layer.Layer):
    """A layer of two inputs and two outputs (a tuple), with parameters of its own and a sublayer."""

    def __init__(self):
        super().__init__()
        self.inner = layer.Linear(5)
        self.scale = None

    def initialize(self, a, b, mix=0.5):
        self.scale = self.register_param("scale", tensor.from_numpy(np.linspace(0.5, 1.5, 5).astype(np.float32)))

    def forward(self, a, b, mix=0.5):
        h = self.inner(a)
        return autograd.mul(h, self.scale), autograd.add(h, autograd.mul(b, self.scale))


class Branches(Train):
    """A layer of several tensors in and out (and a keyword), a residual sum between layers."""

    def __init__(self):
        super().__init__()
        self.stem = layer.Linear(5)
        self.two = TwoWay()
        self.head = layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        s = autograd.relu(self.stem(x))
        p, q = self.two(s, s, mix=0.25)
        return self.head(autograd.add(autograd.relu(p), q))


class TiedOut(layer.Layer):
    """An output layer that reads another layer's weight, transposed (tied weights): the tensor is an
    attribute of this layer too, so it is a parameter of both (listed once, under the first name)."""

    def __init__(self, source):
        super().__init__()
        self.__dict__["_source"] = source  # not a sublayer
        self.b = None

    def initialize(self, x):
        self.W = self._source.W
        self.b = self.register_param("b", tensor.from_numpy(np.zeros(self.W.shape[1], np.float32)))

    def forward(self, x):
        return autograd.add_bias(autograd.matmul(x, self.W), self.b, axis=0)  # W [out, in]: the encoder's map back


class Tied(Train):
    def __init__(self):
        super().__init__()
        self.enc = layer.Linear(6)  # W [6, 5]
        self.mid = layer.Linear(6)
        self.dec = TiedOut(self.enc)  # [N, 6] @ W [6, 5]: [N, 5]
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.dec(autograd.tanh(self.mid(autograd.tanh(self.enc(x)))))


MODELS = {"mlp": (MLP, (5,)), "cnn": (CNN, (2, 6, 6)), "branches": (Branches, (5,)), "tied": (Tied, (5,))}


def batch(kind, rank, step):
    shape = MODELS[kind][1]
    r = np.random.RandomState(1000 * step + rank)
    x = r.standard_normal((4,) + shape).astype(np.float32)
    y = r.randint(0, 5 if kind == "tied" else 3, 4).astype(np.int32)
    return tensor.from_numpy(x), tensor.from_numpy(y)


def make_opt(kind):
    if kind == "adam":
        return opt.Adam(lr=0.05, weight_decay=0.01)
    return opt.SGD(lr=0.1, momentum=0.9, weight_decay=0.001)


def build(kind, rank, shard, optimizer="sgd", seed=3):
    device.get_default_device().SetRandSeed(seed + 10 * rank)  # rank 0's values reach every rank at compile
    d = opt.DistOpt(make_opt(optimizer), shard=shard)
    net = MODELS[kind][0]()
    net.set_optimizer(d)
    net.compile([batch(kind, rank, 0)[0]], is_train=True)
    return d, net


def train(kind, rank, shard, optimizer="sgd", steps=STEPS, first=0, built=None):
    d, net = built or build(kind, rank, shard, optimizer)
    losses = []
    for s in range(first, first + steps):
        _, loss = net(*batch(kind, rank, s))
        losses.append(loss.to_numpy().copy())
    return d, net, losses


def group_names(d):
    return [g.name for g in d._module.layer_groups()]


# ---- checks

def same_training(rank, world):
    for kind, optimizer in (("mlp", "sgd"), ("mlp", "adam"), ("cnn", "sgd"), ("cnn", "adam"), ("branches", "adam"),
                            ("tied", "sgd"), ("tied", "adam")):
        _, ref, ref_losses = train(kind, rank, "none", optimizer)
        d, net, losses = train(kind, rank, "parameters", optimizer)
        # Between steps the parameters are not whole on any rank (a released one views a NaN): what the
        # checks below read, get_params gathered.
        first = next(iter(net._module().parameters()))
        assert np.isnan(first.to_numpy()).all(), (kind, first.to_numpy())
        want = params(ref)
        got = params(net)
        got_losses = {str(i): l for i, l in enumerate(losses)}
        check(rank, world, f"{kind} {optimizer}: losses as shard none", got_losses,
              {str(i): l for i, l in enumerate(ref_losses)})
        check(rank, world, f"{kind} {optimizer}: parameters as shard none", got, want)
        check(rank, world, f"{kind} {optimizer}: states as shard none", states_of(net), states_of(ref))
        d.check_consistency(include_buffers=False)  # batch-norm statistics are each rank's own
        # Between steps a rank keeps its pieces of the parameters only (about 1/world of them, and padding).
        whole = 4 * sum(v.size for v in want.values())
        kept = d.memory_report()["parameters"]
        assert kept < whole * (1.0 / world + 0.3), (kind, kept, whole)
        if kind == "tied":
            assert "dec.W" not in want and "enc.weight" in want, sorted(want)  # one parameter, two layers
            assert group_names(d) == ["enc", "mid", "dec"], group_names(d)
            assert [n for n, _ in net.dec._module().named_parameters()] == ["b", "W"]
        # Evaluation after training: the same outputs.
        net.eval()
        ref.eval()
        x, _ = batch(kind, rank, 99)
        check(rank, world, f"{kind} {optimizer}: evaluated as shard none", {"out": net(x).to_numpy()},
              {"out": ref(x).to_numpy()})
    print(f"rank {rank} ok same training as shard none", flush=True)


def param_groups(rank, world):
    got = {}
    for shard in ("none", "parameters"):
        device.get_default_device().SetRandSeed(3 + 10 * rank)
        d = opt.DistOpt(make_opt("adam"), shard=shard)
        net = MLP()
        net.set_optimizer(d)
        d.set_param_groups([{"params": ["fc2.weight", "fc2.bias"], "lr_scale": 0.5, "weight_decay": 0.1}])
        net.compile([batch("mlp", rank, 0)[0]], is_train=True)
        train("mlp", rank, shard, built=(d, net))
        got[shard] = params(net)
    check(rank, world, "parameter groups set before compile, as shard none", got["parameters"], got["none"])


def order(rank, world):
    d, net = build("mlp", rank, "parameters")
    assert list(net._layers)[:3] == ["fc3", "fc2", "fc1"], list(net._layers)
    assert group_names(d) == ["fc1", "fc2", "fc3"], group_names(d)  # the order forward calls them
    d, net = build("branches", rank, "parameters")
    assert group_names(d) == ["stem", "two", "head"], group_names(d)
    print(f"rank {rank} ok groups in the order forward calls the layers", flush=True)


def checkpoints(rank, world, scratch):
    for optimizer in ("sgd", "adam"):
        _, whole_net, _ = train("cnn", rank, "parameters", optimizer, steps=2 * STEPS)
        whole = params(whole_net)

        d, net, _ = train("cnn", rank, "parameters", optimizer)
        path = scratch / f"stage3-{optimizer}.ckpt"
        net.save_states(path, {"opt": d.get_states()})
        saved = params(net)
        # Into an unsharded model (no DistOpt): the values saved, whole.
        device.get_default_device().SetRandSeed(77)
        plain = MODELS["cnn"][0]()
        plain.compile([batch("cnn", rank, 0)[0]], is_train=False)
        plain.load_states(path)
        check(rank, world, f"checkpoint of shard parameters ({optimizer}) into an unsharded model", params(plain),
              saved)
        # Saving took nothing from the run.
        train("cnn", rank, "parameters", optimizer, steps=STEPS, first=STEPS, built=(d, net))
        check(rank, world, f"going on after saving under shard parameters ({optimizer})", params(net), whole)
        # Into a sharded model of other initial values: resumed, as the uninterrupted run.
        d, net = build("cnn", rank, "parameters", optimizer, seed=11)
        aux = net.load_states(path)
        d.set_states(aux["opt"])
        check(rank, world, f"loaded under shard parameters ({optimizer})", params(net), saved)
        train("cnn", rank, "parameters", optimizer, steps=STEPS, first=STEPS, built=(d, net))
        check(rank, world, f"resumed under shard parameters ({optimizer})", params(net), whole)
        d.check_consistency(include_buffers=False)


def states(rank, world):
    _, ref, _ = train("mlp", rank, "none")
    d, net, _ = train("mlp", rank, "parameters")
    # set_states: every rank sets the same values; each keeps its pieces of them.
    want = {k: v.to_numpy().copy() for k, v in ref.get_states().items()}
    net.set_states(want)
    check(rank, world, "set_states under shard parameters", {k: v.to_numpy() for k, v in net.get_states().items()},
          want)
    train("mlp", rank, "none", steps=2, first=STEPS, built=(None, ref))
    train("mlp", rank, "parameters", steps=2, first=STEPS, built=(d, net))
    check(rank, world, "training after set_states under shard parameters", params(net), params(ref))
    net.set_params({"fc1.weight": np.zeros_like(want["fc1.weight"])})
    assert not net.get_params()["fc1.weight"].to_numpy().any()
    d.check_consistency()
    print(f"rank {rank} ok set_params under shard parameters", flush=True)


# ---- what cannot be grouped

class OwnParam(Train):
    def __init__(self):
        super().__init__()
        self.fc = layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()
        self.gain = self.register_param("gain", tensor.from_numpy(np.ones(3, np.float32)))

    def forward(self, x):
        return autograd.mul(self.fc(x), self.gain)


class Table(layer.Layer):
    def __init__(self):
        super().__init__()
        self.T = self.register_param("T", tensor.from_numpy(np.ones((5, 3), np.float32)))

    def forward(self, x):
        return autograd.matmul(x, self.T)


class ReadsWithoutCalling(Train):
    """Reads a layer's parameter without calling the layer (as a graph of weights would)."""

    def __init__(self):
        super().__init__()
        self.fc = layer.Linear(5)
        self.table = Table()
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return autograd.matmul(self.fc(x), self.table.T)


class Block(layer.Layer):
    def __init__(self):
        super().__init__()
        self.fc = layer.Linear(5)

    def forward(self, x):
        return autograd.relu(self.fc(x))


class CallsInside(Train):
    """Calls a layer of a block outside the block's call."""

    def __init__(self):
        super().__init__()
        self.block = Block()
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.block.fc(self.block(x))


class Opaque:
    def __init__(self, t):
        self.t = t


class Wraps(layer.Layer):
    def __init__(self):
        super().__init__()
        self.fc = layer.Linear(3)

    def forward(self, x):
        return Opaque(self.fc(x))


class ReturnsObject(Train):
    def __init__(self):
        super().__init__()
        self.wrap = Wraps()
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.wrap(x).t


def refusals(rank, world):
    x, y = batch("mlp", rank, 0)

    def compiled(cls):
        d = opt.DistOpt(opt.SGD(lr=0.1), shard="parameters")
        net = cls()
        net.set_optimizer(d)
        net.compile([x], is_train=True)
        return net

    expect_error(rank, "a parameter of the model itself", lambda: compiled(OwnParam), ValueError, "gain",
                 "belong to the model itself")
    net = compiled(ReadsWithoutCalling)
    expect_error(rank, "a parameter read without calling its layer", lambda: net(x, y), ValueError, "table.T",
                 "'table'", "not called")
    net = compiled(CallsInside)
    expect_error(rank, "a layer of a group called outside it", lambda: net(x, y), ValueError, "block.fc",
                 "'block'")
    net = compiled(ReturnsObject)
    expect_error(rank, "a layer returning an object", lambda: net(x, y), TypeError, "'wrap'", "Opaque")
    d, net = build("mlp", rank, "parameters")
    expect_error(rank, "parameter groups after compile", lambda: d.set_param_groups([{"params": ["fc1.weight"]}]),
                 ValueError, "before compile")
    again = opt.DistOpt(opt.SGD(lr=0.1), shard="parameters")
    expect_error(rank, "a second DistOpt of sharded parameters", lambda: net.set_optimizer(again), ValueError,
                 "sharded by another DistOpt")
    d = opt.DistOpt(opt.SGD(lr=0.1), shard="parameters")
    w = tensor.from_numpy(np.ones(5, np.float32))
    w.requires_grad = True
    expect_error(rank, "a loss without a model", lambda: d(_tandem.sum(_tandem.mul(w, x))), ValueError,
                 "shard='parameters'", "model")


def main():
    scratch = pathlib.Path(sys.argv[1])
    probe = opt.DistOpt(opt.SGD())
    rank, world = probe.global_rank, probe.world_size
    same_training(rank, world)
    order(rank, world)
    param_groups(rank, world)
    checkpoints(rank, world, scratch)
    states(rank, world)
    refusals(rank, world)
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
