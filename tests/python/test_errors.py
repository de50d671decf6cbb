"""tandem's errors reach Python as exceptions with tandem's messages: bad shapes and arguments
(ValueError), missing files (FileNotFoundError), corrupt files, mismatched and absent peers; the
interpreter survives each one."""
import gzip
import os
import subprocess
import sys

import numpy as np
import pytest

import tandem
from conftest import needs_gloo, run
from tandem import _tandem, data, device, layer, model, opt, tensor

JOIN = """
import sys, tandem
try:
    d = tandem.opt.DistOpt(tandem.opt.SGD(), timeout=float(sys.argv[1]))
    t = tandem.tensor.ones((1,))
    d.all_reduce(t)
    d.wait()
    print("joined")
except Exception as e:
    print(type(e).__name__ + ": " + str(e))
    sys.exit(2)
"""


def test_bad_shapes_and_arguments(cpu):
    a, b = tensor.Tensor((2, 3), cpu), tensor.Tensor((3, 2), cpu)
    with pytest.raises(ValueError, match=r"add: operands of different shapes \(f32\[2, 3\] on cpu and f32\[3, 2\]"):
        a + b
    with pytest.raises(ValueError, match="conv2d"):
        _tandem.conv2d(a, b)
    with pytest.raises(ValueError, match="unknown model 'nope'.*resnet152"):
        _tandem.make_model("nope")
    with pytest.raises(ValueError, match="invalid device 'tpu'"):
        tensor.Tensor((1,), "tpu")
    with pytest.raises(ValueError, match="activation"):
        layer.Conv2d(1, 2, 3, activation="GELU")
    with pytest.raises(ValueError):
        device.create_cuda_gpu_on(64)
    with pytest.raises(ValueError, match=r"div: operands of different shapes .* that do not broadcast"):
        a / b
    assert (a + 1).shape == (2, 3)  # the interpreter and the library carry on


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        data.load_dataset("fashion-mnist", str(tmp_path / "nowhere"))
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
        with gzip.open(tmp_path / name, "wb") as f:
            f.write(b"\x00\x00\x08\x03not an idx file")
    with pytest.raises(ValueError, match="train-images-idx3-ubyte"):
        data.load_dataset("fashion-mnist", str(tmp_path))
    with pytest.raises(ValueError, match="unknown"):
        data.load_dataset("imagenet", str(tmp_path))


def test_distopt_arguments():
    with pytest.raises(ValueError, match="launcher"):
        opt.DistOpt(opt.SGD(), local_rank=1, world_size=4)  # ranks come from the launcher or a ticket
    with pytest.raises(ValueError, match="disagree"):
        opt.DistOpt(opt.SGD(), local_rank=0, gpu_num=1)
    with pytest.raises(ValueError, match="out of range"):
        opt.DistOpt(opt.SGD(), nccl_id=tandem.NcclIdHolder(), local_rank=2, world_size=2)
    with pytest.raises(TypeError):
        opt.DistOpt(opt.DistOpt(opt.SGD()))
    with pytest.raises(ValueError, match="powerSGD"):
        opt.DistOpt(opt.SGD(), dist_option="gzip")


class _Tiny(model.Model):
    def __init__(self):
        super().__init__()
        self.fc = layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc(x)

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def test_distopt_step_misuse(cpu):
    """A second update() after one backward_and_sync would apply its gradients again, and a loss that
    reaches none of the optimizer's parameters would step nothing: both are refused, and change nothing."""
    rng = np.random.RandomState(0)
    x = tensor.from_numpy(rng.standard_normal((4, 5)).astype(np.float32), cpu)
    y = tensor.from_numpy(np.array([0, 2, 1, 2], dtype=np.int32), cpu)
    net, other = _Tiny(), _Tiny()
    sgd = opt.DistOpt(opt.SGD(lr=0.1))  # no launcher: one rank
    net.set_optimizer(sgd)
    net.compile([x])
    other.set_optimizer(opt.SGD(lr=0.1))
    other.compile([x])
    sgd.backward_and_sync(net.loss(net.forward(x), y))
    assert sgd.update() is True
    params = {k: v.to_numpy() for k, v in net.get_params().items()}
    with pytest.raises(ValueError, match=r"update\(\) called without backward_and_sync since the last update"):
        sgd.update()
    stray = "does not depend on any of the optimizer's 2 parameters"
    for call in (sgd.backward_and_sync, sgd.step, sgd, sgd.backward_and_update, sgd.backward_and_update_half,
                 sgd.backward_and_partial_update, sgd.backward_and_sparse_update):
        with pytest.raises(ValueError, match=stray):
            call(other.loss(other.forward(x), y))
    with pytest.raises(ValueError, match=r"update\(\) called without backward_and_sync"):
        sgd.update()  # a refused backward_and_sync leaves nothing to apply
    for k, v in net.get_params().items():
        np.testing.assert_array_equal(v.to_numpy(), params[k], err_msg=k)
    with sgd.no_sync():  # accumulation: several backward_and_sync, one update
        sgd.backward_and_sync(net.loss(net.forward(x), y))
    sgd.backward_and_sync(net.loss(net.forward(x), y))
    assert sgd.update() is True
    assert not np.array_equal(net.get_params()["fc.weight"].to_numpy(), params["fc.weight"])


@needs_gloo
def test_a_process_without_the_secret_is_refused():
    ticket = tandem.NcclIdHolder()
    env = dict(ticket.environment(0, 2), TANDEM_SECRET="not the job's secret, but long enough", TANDEM_TIMEOUT="5")
    rc, out = run([sys.executable, "-c", JOIN, "5"], env=env)
    assert rc == 2 and "joined" not in out, out


@needs_gloo
def test_absent_peer_is_named():
    ticket = tandem.NcclIdHolder()
    env = dict(ticket.environment(0, 2), TANDEM_TIMEOUT="2")
    rc, out = run([sys.executable, "-c", JOIN, "2"], env=env)
    assert rc == 2 and "RuntimeError: rank 1 did not join within" in out, out


@needs_gloo
def test_mismatched_peers_are_told():
    ticket = tandem.NcclIdHolder()
    procs = []
    for rank, world in ((0, 2), (1, 3)):
        env = dict(os.environ, **ticket.environment(rank, world))
        procs.append(subprocess.Popen([sys.executable, "-c", JOIN, "30"], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(p.returncode == 2 for p in procs), outs
    assert any("world size mismatch" in o for o in outs), outs
    assert all("joined" not in o for o in outs), outs


def test_numpy_types_without_a_tandem_dtype(cpu):
    with pytest.raises(ValueError, match="cannot become a tandem tensor"):
        tensor.Tensor((2,), cpu).copy_from_numpy(np.array([1 + 2j, 3j]))


@needs_gloo
def test_ranks_started_differently_are_told():
    script = ("import sys, tandem\n"
              "tandem.opt.DistOpt(timeout=30)\n"
              "try:\n"
              "    tandem.distributed.check_agreement([('batch_size', sys.argv[1], True)])\n"
              "except ValueError as e:\n"
              "    print('ValueError: ' + str(e))\n"
              "    sys.exit(2)\n")
    ticket = tandem.NcclIdHolder()
    procs = [subprocess.Popen([sys.executable, "-c", script, batch], env=dict(os.environ, **ticket.environment(r, 2)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r, batch in ((0, "64"), (1, "32"))]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(p.returncode == 2 for p in procs), outs
    assert all("different batch_size: 32 on rank 1; 64 on rank 0" in o for o in outs), outs
