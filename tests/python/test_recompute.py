"""Activation recompute from Python: compile(recompute="full" or "selective") gives the steps of "none" (dropout's masks
replayed) for the Python GPT (tandem.layer.TransformerBlock layers) and the C++ Llama, and a model without
blocks is told so."""
import numpy as np
import pytest

from tandem import layer, models, opt, tensor
from tandem.model import Model


def ints(a, dev):
    return tensor.from_numpy(np.asarray(a, dtype=np.int32), dev)


def train(make, policy, dev, steps=6):
    dev.set_rand_seed(11)
    net = make()
    rng = np.random.RandomState(3)
    seq = rng.randint(0, 16, (4, 9))
    x, y = ints(seq[:, :-1], dev), ints(seq[:, 1:], dev)
    net.set_optimizer(opt.Adam(lr=3e-3))
    net.compile([x], is_train=True, recompute=policy)
    losses = [net(x, y)[1].item() for _ in range(steps)]
    return losses, {k: v.to_numpy() for k, v in net.get_params().items()}, net


@pytest.mark.parametrize("make", [
    lambda: models.GPT(vocab=16, context=8, layers=2, heads=2, width=16, dropout=0.2),
    lambda: models.Llama("llama-1b", layers=2, width=32, heads=4, kv_heads=2, mlp_hidden=48, vocab=16, context=8,
                         dropout=0.2),
], ids=["gpt", "llama"])
@pytest.mark.parametrize("policy", ["full", "selective"])
def test_recompute_takes_the_steps_of_none(cpu, make, policy, monkeypatch):
    plain, p_plain, _ = train(make, "none", cpu)
    calls = []
    real = layer._tandem.recompute_module

    def counted(module, x, how):
        calls.append(how)
        return real(module, x, how)

    monkeypatch.setattr(layer._tandem, "recompute_module", counted)
    again, p_again, net = train(make, policy, cpu)
    if isinstance(net, models.GPT):
        assert calls == [policy] * (2 * 6)  # two blocks, six steps: every training call recomputes
    else:
        assert net.net._cpp.recompute == policy
    assert again == plain
    assert p_again.keys() == p_plain.keys()
    for k in p_plain:
        np.testing.assert_array_equal(p_again[k], p_plain[k], err_msg=k)
    assert net.set_recompute(policy) >= 1


def test_recompute_policies_and_models_without_blocks(cpu):
    class Mlp(Model):
        def __init__(self):
            super().__init__()
            self.fc = layer.Linear(4)

        def forward(self, x):
            return self.fc(x)

    net = Mlp()
    with pytest.raises(ValueError, match="compile"):
        net.set_recompute("full")
    net.compile([tensor.from_numpy(np.zeros((2, 3), np.float32), cpu)], is_train=True)
    with pytest.raises(ValueError, match="no transformer blocks"):
        net.set_recompute("full")
    assert net.set_recompute("none") == 0
    with pytest.raises(ValueError, match="'none', 'selective' or 'full'"):
        net.set_recompute("partial")
