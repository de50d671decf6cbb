"""Models and optimizers in one process: compile, training and evaluation calls, parameters by name,
checkpoints, and the optimizers' update rules."""
import numpy as np
import pytest

from tandem import layer, model, opt, tensor


class Small(model.Model):
    def __init__(self):
        super().__init__()
        self.conv = layer.Conv2d(2, 3, padding=1)
        self.bn = layer.BatchNorm2d()
        self.flatten = layer.Flatten()
        self.fc = layer.Linear(4)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc(self.flatten(self.bn(self.conv(x))))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def batch(cpu, seed=0):
    rng = np.random.RandomState(seed)
    x = tensor.from_numpy(rng.standard_normal((8, 1, 5, 5)).astype(np.float32), cpu)
    y = tensor.from_numpy(rng.randint(0, 4, 8).astype(np.int32), cpu)
    return x, y


def test_compile_train_eval(cpu):
    net = Small()
    x, y = batch(cpu)
    net.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    net.compile([x], is_train=True, use_graph=True, sequential=True)
    assert list(net.get_params()) == ["conv.weight", "conv.bias", "bn.gamma", "bn.beta", "fc.weight", "fc.bias"]
    assert list(net.get_states())[-2:] == ["bn.running_mean", "bn.running_var"]
    losses = [net(x, y)[1].item() for _ in range(20)]  # training mode: train_one_batch steps
    assert losses[-1] < 0.5 * losses[0]
    net.eval()
    out = net(x)  # evaluation mode: forward
    assert out.shape == (8, 4)
    assert net.conv.training is False and net.bn._cpp.training is False


def test_params_by_name_and_checkpoint(cpu, tmp_path):
    net = Small()
    x, y = batch(cpu)
    net.set_optimizer(opt.Adam(lr=0.01))
    net.compile([x])
    net(x, y)
    path = tmp_path / "small.ckpt"
    net.save_states(path, {"epoch": 3})
    saved = {k: v.to_numpy() for k, v in net.get_states().items()}
    net(x, y)
    assert not np.array_equal(net.get_params()["fc.weight"].to_numpy(), saved["fc.weight"])
    assert net.load_states(path) == {"epoch": 3}
    for k, v in net.get_states().items():
        np.testing.assert_array_equal(v.to_numpy(), saved[k], err_msg=k)

    net.set_params({"fc.bias": np.full(4, 0.5, dtype=np.float32)})
    np.testing.assert_array_equal(net.get_params()["fc.bias"].to_numpy(), np.full(4, 0.5))
    with pytest.raises(KeyError, match="fc.nothing"):
        net.set_params({"fc.nothing": np.zeros(4)})
    with pytest.raises(FileNotFoundError):
        net.load_states(tmp_path / "missing.ckpt")


def test_sgd_update_rule_without_a_model(cpu):
    w0 = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    w = tensor.from_numpy(w0, cpu)
    w.requires_grad = True
    x = tensor.from_numpy(np.array([3.0, 1.0, -4.0], dtype=np.float32), cpu)
    sgd = opt.SGD(lr=0.1, momentum=0.9, weight_decay=0.01)
    # The parameters come from the loss's graph when no model was given.
    for _ in range(2):
        sgd(((w * x).reshape((1, 3)) @ tensor.ones((3, 1), cpu)).reshape((1,)))
    g1 = x.to_numpy() + 0.01 * w0
    w1 = w0 - 0.1 * g1
    g2 = x.to_numpy() + 0.01 * w1
    w2 = w1 - 0.1 * (0.9 * g1 + g2)
    np.testing.assert_allclose(w.to_numpy(), w2, rtol=1e-6)
    sgd.lr = 0.05
    assert sgd._impl.lr == 0.05
    with pytest.raises(ValueError, match="tensor.float32, tensor.float16 or tensor.bfloat16"):
        opt.SGD(dtype=tensor.int32)


def test_one_rank_distopt(cpu):
    sgd = opt.DistOpt(opt.SGD(lr=0.1))  # no launcher: one rank
    assert (sgd.world_size, sgd.rank_in_global, sgd.rank_in_local) == (1, 0, 0)
    net = Small()
    x, y = batch(cpu)
    net.set_optimizer(sgd)
    net.compile([x])
    losses = [net(x, y)[1].item() for _ in range(10)]
    assert losses[-1] < losses[0]
    loss = net.loss(net.forward(x), y)
    sgd.backward_and_sync(loss)  # the step split around the (one-rank) synchronisation
    assert sgd.clip_grad_norm(1e-3).item() > 1e-3
    assert sgd.update() is True
    with pytest.raises(RuntimeError, match="no parameters yet"):
        opt.DistOpt(opt.SGD()).no_sync()


def test_distopt_release_gradients(cpu):
    # Gradients held only from backward to update(): the same steps, bit for bit, and no gradient after them.
    start = {}

    def train(release):
        net = Small()
        d = opt.DistOpt(opt.Adam(lr=0.01), release_gradients=release)
        x, y = batch(cpu)
        net.set_optimizer(d)
        net.compile([x])
        if start:
            net.set_params({k: tensor.from_numpy(v, cpu) for k, v in start.items()})
        else:
            start.update({k: tensor.to_numpy(v) for k, v in net.get_params().items()})
        losses = []
        for s in range(4):
            x, y = batch(cpu, seed=s)
            loss = net.loss(net.forward(x), y)
            d.backward_and_sync(loss)
            assert all(p.grad is not None for p in net.get_params().values())
            d.clip_grad_norm(0.5)
            d.update()
            losses.append(loss.item())
        grads = [p.grad for p in net.get_params().values()]
        return losses, {k: tensor.to_numpy(v) for k, v in net.get_params().items()}, grads

    kept_losses, kept, kept_grads = train(False)
    losses, released, grads = train(True)
    assert losses == kept_losses
    for name in kept:
        np.testing.assert_array_equal(released[name], kept[name], err_msg=name)
    assert all(g is not None for g in kept_grads)
    assert all(g is None for g in grads), "update() left gradients behind"


def test_distopt_offload_takes_the_steps_of_the_device(cpu):
    # offload="optimizer" (the state and the stepped values on the host) and "parameters" (stage 3's slices there
    # too) give the parameters of the same steps without offload, bit for bit (one rank, the CPU backend).
    start = {}

    def train(**kw):
        net = Small()
        d = opt.DistOpt(opt.Adam(lr=0.01), **kw)
        x, y = batch(cpu)
        net.set_optimizer(d)
        net.compile([x])
        if start:
            net.set_params({k: tensor.from_numpy(v, cpu) for k, v in start.items()})
        else:
            start.update({k: tensor.to_numpy(v) for k, v in net.get_params().items()})
        losses = []
        for s in range(4):
            x, y = batch(cpu, seed=s)
            out, loss = net(x, y)
            losses.append(loss.item())
        return losses, {k: tensor.to_numpy(v) for k, v in net.get_params().items()}

    base_losses, base = train()
    for kw in (dict(offload="optimizer"), dict(shard="parameters"), dict(offload="parameters")):
        losses, params = train(**kw)
        assert losses == base_losses, kw
        for name in base:
            np.testing.assert_array_equal(params[name], base[name], err_msg=f"{kw}: {name}")
    with pytest.raises(ValueError, match="offload"):
        opt.DistOpt(opt.Adam(lr=0.01), offload="disk")
    with pytest.raises(ValueError, match="shard='parameters'"):
        opt.DistOpt(opt.Adam(lr=0.01), offload="parameters", shard="optimizer")
