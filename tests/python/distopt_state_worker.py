"""DistOpt and the model's frozen parameters on the ranks of a job. Run by test_distopt.py under `tandem
launch -n 2` with a scratch directory as its argument; prints "rank R ok NAME" per check. Expectations come
from rank 0's values."""
import sys

import numpy as np

from tandem import autograd, layer, model, opt, tensor


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


def main():
    probe = opt.DistOpt(opt.SGD())
    rank, world = probe.global_rank, probe.world_size
    assert world == 2, world
    frozen(rank, world)
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
