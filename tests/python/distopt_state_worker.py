"""DistOpt's state on the ranks of a job: checkpoints of sharded runs, parameter groups changed after
compile, frozen parameters. Run by test_distopt.py under `tandem launch -n 2` with a scratch directory as
its argument; prints "rank R ok NAME" per check. Expectations come from runs on these ranks without the
feature under test (an uninterrupted run, an unsharded one) or from rank 0's values."""
import json
import pathlib
import struct
import sys

import numpy as np

from tandem import autograd, device, layer, model, opt, tensor


def check(rank, name, got, expected, atol=0.0):
    for k in expected:
        np.testing.assert_allclose(got[k], expected[k], rtol=0, atol=atol, err_msg=f"{name}: {k}")
    print(f"rank {rank} ok {name}", flush=True)


class WithFrozen(model.Model):
    """A model with two frozen parameters: a pretrained table and a tensor a layer registered itself."""

    def __init__(self, rank):
        super().__init__()
        self.table = layer.Embedding(5, 3)
        self.fc = layer.Linear(2)
        self.loss = layer.SoftMaxCrossEntropy()
        self.scale = self.register_param("scale", tensor.from_numpy(np.full(3, 1.0 + rank, np.float32)))
        self.scale.requires_grad = False

    def forward(self, x):
        return self.fc(autograd.mul(autograd.reshape(self.table(x), [-1, 3]), self.scale))

    def train_one_batch(self, x, y):
        loss = self.loss(self.forward(x), y)
        self.optimizer(loss)
        return loss


def frozen(rank, world):
    x = tensor.from_numpy(np.array([[0, 1], [2, 4]], dtype=np.int32))
    y = tensor.from_numpy(np.array([0, 1, 1, 0], dtype=np.int32))
    table = lambda r: np.arange(15, dtype=np.float32).reshape(5, 3) / 15 + r  # noqa: E731
    net = WithFrozen(rank)
    net.compile([x], is_train=True)
    net.table.from_pretrained(tensor.from_numpy(table(rank)), freeze=True)  # each rank its own table
    d = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9, weight_decay=0.1))
    net.set_optimizer(d)  # DistOpt starts every rank from rank 0's model: the frozen parameters too
    got = {k: v.to_numpy() for k, v in net.get_states().items()}
    check(rank, "frozen parameters from rank 0", got, {"table.weight": table(0), "scale": np.ones(3, np.float32)})
    for s in range(2):
        net(x, y)
    check(rank, "frozen parameters stay frozen", {k: v.to_numpy() for k, v in net.get_states().items()},
          {"table.weight": table(0), "scale": np.ones(3, np.float32)})
    assert not net.scale.requires_grad and not net.table.W.requires_grad
    d.check_consistency()
    net.table.W.copy_from_numpy(table(rank))  # the ranks' tables differ again
    try:
        d.check_consistency()
        raise AssertionError("different frozen tables compared equal")
    except ValueError as e:
        assert "table.weight" in str(e), e
    d.sync_parameters()
    d.check_consistency()
    check(rank, "check_consistency and sync_parameters of frozen parameters",
          {"t": net.table.W.to_numpy()}, {"t": table(0)})
    # Frozen after DistOpt took the parameters, a parameter would still be stepped: refused.
    net.fc.W.requires_grad = False
    try:
        net(x, y)
        raise AssertionError("a parameter frozen after DistOpt was built was stepped")
    except ValueError as e:
        assert "frozen" in str(e) and "fc." in str(e), e
    print(f"rank {rank} ok frozen after DistOpt took the parameters", flush=True)


# ---- parameter groups changed after compile
STEPS, CUT = 6, 3


class Net(model.Model):
    def __init__(self):
        super().__init__()
        self.fc1 = layer.Linear(4)
        self.fc2 = layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc2(autograd.relu(self.fc1(x)))

    def train_one_batch(self, x, y):
        loss = self.loss(self.forward(x), y)
        self.optimizer(loss)
        return loss


def batch(rank, step):
    r = np.random.RandomState(100 * step + rank)
    return (tensor.from_numpy(r.standard_normal((6, 5)).astype(np.float32)),
            tensor.from_numpy(r.randint(0, 3, 6).astype(np.int32)))


def adam():
    # A decaying rate: a resumed run must take the schedule up where it was.
    return opt.Adam(lr=opt.ExponentialDecay(0.05, 1, 0.8), weight_decay=0.01)


def build(rank, shard, seed=3):
    device.get_default_device().SetRandSeed(seed + 10 * rank)  # rank 0's values reach every rank at compile
    d = opt.DistOpt(adam(), shard=shard)
    net = Net()
    net.set_optimizer(d)
    net.compile([batch(rank, 0)[0]], is_train=True)
    return d, net


def params(net):
    return {k: v.to_numpy().copy() for k, v in net.get_params().items()}


def regrouped(rank, shard, moves):
    """A run whose groups change after compile: after step 1 a group of its own for fc2 (half the rate,
    no decay); after step 3, fc1's weight moves into that group."""
    d, net = build(rank, shard)
    names = list(net.get_params())
    fc2 = [n for n in names if n.startswith("fc2.")]
    fc1_w = [n for n in names if n.startswith("fc1.") and len(net.get_params()[n].shape) == 2]
    for s in range(STEPS):
        if s == 1:
            d.set_param_groups([{"params": fc2, "lr_scale": 0.5, "weight_decay": 0.0}])
        if s == 3 and moves:
            d.set_param_groups([{"params": fc2 + fc1_w, "lr_scale": 0.5, "weight_decay": 0.0}])
        net(*batch(rank, s))
    groups = [sorted(g["params"]) for g in d.param_groups]
    assert groups[0] == sorted(fc2 + (fc1_w if moves else [])), groups
    return params(net)


def groups(rank):
    for moves in (False, True):
        want = regrouped(rank, "none", moves)
        what = "a group moved into" if moves else "a group added"
        for shard in ("optimizer", "gradients"):
            check(rank, f"{what} after compile --shard {shard}", regrouped(rank, shard, moves), want, atol=1e-6)


# ---- checkpoints of sharded runs
def header(path):
    """The JSON header of a checkpoint file: magic, version (u32), header length (u64), CRC (u32), header."""
    raw = pathlib.Path(path).read_bytes()
    assert raw[:8] == b"TANDEMCK", raw[:8]
    (length,) = struct.unpack("<Q", raw[12:20])
    return json.loads(raw[24:24 + length])


def checkpoints(rank, world, scratch):
    for shard in ("optimizer", "gradients"):
        d, net = build(rank, shard)
        for s in range(STEPS):
            net(*batch(rank, s))
        whole = params(net)

        d, net = build(rank, shard)
        for s in range(CUT):
            net(*batch(rank, s))
        path = scratch / f"{shard}.ckpt"
        net.save_states(path, {"opt": d.get_states()})  # every rank: the state is gathered from all
        head = header(path)
        names = list(net.get_params())
        saved = {t["name"] for t in head["tensors"]}
        for kind in ("exp_avg", "exp_avg_sq"):
            missing = [n for n in names if f"opt/{kind}/{n}" not in saved]
            assert not missing, f"--shard {shard}: no {kind} saved for {missing}"
        assert head["optimizer_steps"] == CUT, head["optimizer_steps"]
        assert head["parameter_steps"] == {n: CUT for n in names}, head["parameter_steps"]
        assert head["meta"]["opt"] == {"step_counter": CUT}, head["meta"]
        print(f"rank {rank} ok saved state --shard {shard}", flush=True)

        # Saving took nothing from the run: it goes on as the uninterrupted one.
        for s in range(CUT, STEPS):
            net(*batch(rank, s))
        check(rank, f"going on after saving --shard {shard}", params(net), whole)

        d, net = build(rank, shard, seed=11)  # other initial values, which the checkpoint replaces
        aux = net.load_states(path)
        d.set_states(aux["opt"])
        assert d.step_counter == CUT and d.lr == d.opt.lr and abs(d.lr - 0.05 * 0.8 ** CUT) < 1e-12, d.lr
        assert abs(d.lr_value.item() - 0.05 * 0.8 ** CUT) < 1e-8, d.lr_value.item()
        for s in range(CUT, STEPS):
            net(*batch(rank, s))
        check(rank, f"resumed --shard {shard}", params(net), whole)
        d.check_consistency()


def main():
    scratch = pathlib.Path(sys.argv[1])
    probe = opt.DistOpt(opt.SGD())
    rank, world = probe.global_rank, probe.world_size
    assert world == 2, world
    frozen(rank, world)
    groups(rank)
    checkpoints(rank, world, scratch)
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
