"""What docs/python.md says about reading results: the validation-loss recipe run as the page shows it,
DistOpt.stats, data.load_dataset's arrays and GPT.generate's types."""
import math
import re

import numpy as np
import pytest

from conftest import FASHION, ROOT
from tandem import autograd, data, device, layer, model, models, opt, tensor

PAGE = ROOT / "docs" / "python.md"


def recipe(test_file):
    """The code block docs/python.md marks with `<!-- run: tests/python/<test_file> -->`."""
    text = PAGE.read_text()
    found = re.findall(r"<!-- run: tests/python/" + re.escape(test_file) + r" -->\n```python\n(.*?)```", text, re.S)
    assert len(found) == 1, f"docs/python.md has {len(found)} blocks marked for {test_file}"
    return found[0]


def test_the_validation_loss_recipe_takes_no_step():
    code = recipe("test_doc_recipes.py")
    step, evaluation = code.split("\nnet.eval()", 1)
    ns = {}
    exec(step, ns)
    net, x, y = ns["net"], ns["x"], ns["y"]
    before = {k: v.to_numpy().copy() for k, v in net.get_params().items()}
    exec("net.eval()" + evaluation, ns)

    val_loss = ns["val_loss"]
    assert isinstance(val_loss, float) and math.isfinite(val_loss)
    assert net.optimizer.step_counter == 1  # the step of the recipe's first part only
    after = net.get_params()
    for k, v in before.items():
        np.testing.assert_array_equal(after[k].to_numpy(), v, err_msg=k)
    assert net.training  # the recipe ends in training mode
    # The mean cross-entropy of the model's logits, computed here from the forward pass.
    net.eval()
    with autograd.no_grad():
        logits = net.forward(x).to_numpy().astype(np.float64)
    net.train()
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    targets = y.to_numpy()
    want = -np.take_along_axis(logp, targets[..., None].astype(np.int64), -1).mean()
    assert val_loss == pytest.approx(want, rel=1e-5)
    # The step's own loss was taken before its update, so it is not the loss after it.
    assert ns["loss"].item() != pytest.approx(val_loss, rel=1e-6)


class _Net(model.Model):
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


def test_stats_is_a_live_view_of_the_counters():
    dev = device.get_default_device()
    sgd = opt.DistOpt(opt.SGD(lr=0.1))
    with pytest.raises(RuntimeError, match="no parameters yet"):
        sgd.stats
    net = _Net()
    net.set_optimizer(sgd)
    tx = tensor.from_numpy(np.random.default_rng(1).normal(size=(4, 5)).astype(np.float32), dev)
    ty = tensor.from_numpy(np.array([0, 1, 2, 0], dtype=np.int32), dev)
    net.compile([tx], is_train=True)
    net(tx, ty)
    s = sgd.stats
    assert (s.steps, s.collectives, s.bytes_sent, s.bytes_received, s.skipped_updates) == (1, 0, 0, 0, 0)
    assert isinstance(s.wait_seconds, float)
    kept = s.steps
    net(tx, ty)
    assert s.steps == 2 and kept == 1  # the object read before shows the new count; the number kept does not
    sgd.reset_stats()
    assert s.steps == 0


@pytest.mark.skipif(not (FASHION / "t10k-labels-idx1-ubyte.gz").exists()
                    and not (FASHION / "t10k-labels-idx1-ubyte").exists(), reason="no Fashion-MNIST files")
def test_load_dataset_returns_the_documented_arrays():
    x, y = data.load_dataset("fashion-mnist", str(FASHION), train=False)
    assert isinstance(x, np.ndarray) and isinstance(y, np.ndarray)
    assert x.dtype == np.float32 and x.shape == (10000, 1, 28, 28)
    assert y.dtype == np.int32 and y.shape == (10000,)
    assert 0.0 <= x.min() and x.max() <= 1.0 and x.max() > 0.5
    assert set(np.unique(y)) == set(range(10))
    with pytest.raises(FileNotFoundError):
        data.load_dataset("fashion-mnist", "/nonexistent/tandem-data")


def test_generate_returns_a_list_of_the_new_tokens():
    dev = device.get_default_device()
    net = models.GPT(vocab=256, context=16, layers=1, heads=2, width=16)
    net.compile([tensor.from_numpy(np.zeros((1, 16), dtype=np.int32), dev)], is_train=False)
    prompt = list(b"ROMEO:")
    out = net.generate(prompt, 5, temperature=0.8, top_k=20, seed=1)
    assert isinstance(out, list) and len(out) == 5 and all(type(t) is int and 0 <= t < 256 for t in out)
    assert net.generate(prompt, 5, temperature=0.8, top_k=20, seed=1) == out
    with pytest.raises(ValueError):
        net.generate([], 3)
    with pytest.raises(ValueError):
        net.generate(list(range(17)), 3)
    with pytest.raises(ValueError, match="outside"):
        net.generate([1, 256], 3)
