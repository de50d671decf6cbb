"""Recorded steps from Python (``compile(use_graph=True)``): on a GPU the step is recorded after three
eager calls and replayed, with the same results as eager steps; on the CPU, or where a step cannot be
recorded, steps run eagerly (with the reason printed once on the GPU)."""
import numpy as np
import pytest

import tandem
from tandem import layer, model, opt, tensor

needs_gpu = pytest.mark.skipif(tandem.device.get_num_gpus() == 0, reason="no CUDA GPU")


class Net(model.Model):
    def __init__(self):
        super().__init__()
        self.conv = layer.Conv2d(1, 8, 3, padding=1, activation="RELU")
        self.pool = layer.MaxPool2d(2, 2)
        self.flatten = layer.Flatten()
        self.fc = layer.Linear(10)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc(self.flatten(self.pool(self.conv(x))))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def batches(n, seed=0):
    rng = np.random.RandomState(seed)
    return [(rng.standard_normal((16, 1, 8, 8)).astype(np.float32), rng.randint(0, 10, 16).astype(np.int32))
            for _ in range(n)]


def train(dev, use_graph, optimizer, data):
    """Trains on data the guide's way: one input tensor pair, each batch copied into it. Returns the
    model, the losses read after every call and the final parameters."""
    dev.SetRandSeed(3)
    net = Net()
    tx = tensor.Tensor((16, 1, 8, 8), dev, tensor.float32)
    ty = tensor.Tensor((16,), dev, tensor.int32)
    net.set_optimizer(optimizer)
    net.compile([tx], is_train=True, use_graph=use_graph)
    losses = []
    for x, y in data:
        tx.copy_from_numpy(x)
        ty.copy_from_numpy(y)
        _, loss = net(tx, ty)
        losses.append(float(tensor.to_numpy(loss).reshape(-1)[0]))
    return net, losses, {k: v.to_numpy() for k, v in net.get_params().items()}


def test_use_graph_on_the_cpu_runs_eagerly(cpu):
    data = batches(6)
    net, losses, params = train(cpu, True, opt.SGD(lr=0.05, momentum=0.9), data)
    _, want_losses, want = train(cpu, False, opt.SGD(lr=0.05, momentum=0.9), data)
    assert net.replays == 0
    assert losses == want_losses
    for k in want:
        np.testing.assert_array_equal(params[k], want[k])


@needs_gpu
@pytest.mark.parametrize("distributed", [False, True])
def test_replayed_steps_match_eager_steps_bit_for_bit(distributed):
    dev = tandem.device.create_cuda_gpu_on(0)
    data = batches(10)

    def sgd():
        s = opt.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4)
        return opt.DistOpt(s) if distributed else s

    tandem.autograd.set_deterministic_algorithms(True)  # the same bits on every run, recorded or not
    try:
        with tandem.autograd.precision("f32"):
            net, losses, params = train(dev, True, sgd(), data)
            _, want_losses, want = train(dev, False, sgd(), data)
    finally:
        tandem.autograd.set_deterministic_algorithms(False)
    assert net.replays == 7  # calls 1-3 eager, the 4th recorded and replayed, then 6 replays
    assert losses == want_losses  # the returned loss is rewritten by every replay
    for k in want:
        np.testing.assert_array_equal(params[k], want[k], err_msg=k)
    if distributed:
        assert net.optimizer.stats.steps == 10  # replays count as steps


@needs_gpu
def test_steps_that_cannot_be_recorded_run_eagerly_and_say_why(capfd):
    dev = tandem.device.create_cuda_gpu_on(0)
    net, losses, _ = train(dev, True, opt.Adam(lr=0.01), batches(6))
    assert net.replays == 0
    assert "tandem: steps run eagerly:" in capfd.readouterr().err
    assert all(np.isfinite(losses))


@needs_gpu
def test_enable_graph_and_reset_graph_of_the_device():
    dev = tandem.device.create_cuda_gpu_on(0)
    try:
        dev.EnableGraph(False)  # every step eager
        net, _, _ = train(dev, True, opt.SGD(lr=0.05), batches(6))
        assert net.replays == 0
        dev.EnableGraph(True)
        dev.SetRandSeed(3)
        net = Net()
        tx = tensor.Tensor((16, 1, 8, 8), dev, tensor.float32)
        ty = tensor.Tensor((16,), dev, tensor.int32)
        net.set_optimizer(opt.SGD(lr=0.05))
        net.compile([tx], is_train=True, use_graph=True)
        data = batches(11)
        for i, (x, y) in enumerate(data):
            if i == 6:
                first = net._recorded["step"]
                assert net.replays == 3  # calls 1-3 eager, the 4th recorded, replayed from then on
                dev.ResetGraph()  # the recording is dropped: three eager calls with the same tensors, a new one
            tx.copy_from_numpy(x)
            ty.copy_from_numpy(y)
            net(tx, ty)
        assert net._recorded["step"] is not first and net.replays == 2
    finally:
        dev.EnableGraph(True)
