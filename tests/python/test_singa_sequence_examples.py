"""examples/singa/rnn, trans and gan (the calls of SINGA's char-RNN, transformer and GAN examples): each
script runs a few steps and learns, and their models keep what the scripts rely on: the LSTM's states
in get_states/set_states, sampled text of the asked length, the transformer's list-held layers and
tensor parameters trained, its frozen position table unchanged, and each GAN step updating its own side
only."""
import importlib.util
import math
import re
import sys

import numpy as np
import pytest

from conftest import ROOT, run
from tandem import opt, tensor

SINGA = ROOT / "examples" / "singa"


def script(*parts):
    return [sys.executable, str(SINGA.joinpath(*parts))]


def load(name, *parts):
    """An example's module, imported under a name of its own (the scripts' own imports are by file name)."""
    directory = str(SINGA.joinpath(*parts[:-1]))
    sys.path.insert(0, directory)
    try:
        spec = importlib.util.spec_from_file_location(name, SINGA.joinpath(*parts))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(directory)
    return module


# ---- rnn/char_rnn.py
def test_char_rnn_learns_and_samples():
    rc, out = run(script("rnn", "char_rnn.py") + ["-m", "3", "--sample", "30", "--prime", "the "])
    assert rc == 0, out
    train = [float(v) for v in re.findall(r"training loss (\S+),", out)]
    val = [float(v) for v in re.findall(r"validation loss (\S+) ", out)]
    assert len(train) == 3 and len(val) == 3, out
    assert all(math.isfinite(v) for v in train + val), out
    assert train[-1] < train[0] - 0.2 and val[-1] < val[0], out
    m = re.search(r"Sample \((\d+) characters\): '(.*)'$", out, re.M)
    assert m and int(m.group(1)) == 34 and m.group(2).startswith("the "), out


def test_char_rnn_states_travel_with_the_model(cpu):
    mod = load("char_rnn_example", "rnn", "char_rnn.py")
    data = mod.CharData(mod.TEXT, batch_size=4, seq_length=8)
    net = mod.CharLSTM(data.vocab_size, hidden_size=8)
    batches = data.batches("train")
    inputs, labels = mod.to_tensors(next(batches), data, cpu)
    assert len(inputs) == 8 and inputs[0].shape == (4, data.vocab_size) and labels.shape == (32,)
    net.train()
    scores, loss = net(inputs, labels)
    assert scores.shape == (32, data.vocab_size) and math.isfinite(tensor.to_numpy(loss)[0])
    states = net.get_states()
    assert {"hx", "cx"} <= set(states) and states["hx"].shape == (4, 8)
    assert any(name.startswith("lstm.") for name in states) and "scores.weight" in states
    saved = {k: v.to_numpy().copy() for k, v in states.items()}
    assert np.abs(saved["hx"]).sum() > 0  # the states after the batch, kept by forward
    inputs, labels = mod.to_tensors(next(batches), data, cpu, inputs, labels)
    net(inputs, labels)
    net.set_states(saved)
    for k, v in net.get_states().items():
        np.testing.assert_array_equal(v.to_numpy(), saved[k], err_msg=k)
    text = mod.sample(net, data, cpu, "a ", 12, np.random.RandomState(0))
    assert len(text) == 14 and text.startswith("a ") and set(text) <= set(data.chars)


# ---- trans/
def test_transformer_learns_the_toy_translation():
    rc, out = run(script("trans", "train.py") + ["--max-epoch", "3", "--log-every", "100"])
    assert rc == 0, out
    losses = [float(v) for v in re.findall(r"mean loss (\S+),", out)]
    accuracy = [float(v) for v in re.findall(r"test accuracy (\S+)", out)]
    assert len(losses) == 3 and len(accuracy) == 3, out
    assert all(math.isfinite(v) for v in losses) and losses[-1] < 0.7 * losses[0], out
    assert 0.0 <= accuracy[0] < accuracy[-1] <= 1.0, out
    assert re.search(r"^translation: [a-z ]+ -> ", out, re.M), out


def test_transformer_trains_its_list_held_layers_and_keeps_the_position_table(cpu):
    data_mod = load("trans_data_example", "trans", "data.py")
    model_mod = load("trans_model_example", "trans", "model.py")
    data = data_mod.PairDataset(data_mod.toy_pairs(count=64), batch_size=8)
    n_pos = max(data.src_len, data.tgt_len)
    net = model_mod.Transformer(len(data.src_vocab), len(data.tgt_vocab), n_pos, d_model=16, n_head=2,
                                dim_feedforward=16, n_layers=2)
    net.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    src, tgt_in, tgt_out = (tensor.from_numpy(a, cpu) for a in data.get_batch_data(0))
    net.train()
    out, loss, acc = net(src, tgt_in, tgt_out, 0)
    assert out.shape == (8, data.tgt_len, len(data.tgt_vocab)) and 0.0 <= acc <= 1.0
    params = net.get_params()
    for name in ("encoder.EncoderLayer_1.attention.q.W", "decoder.DecoderLayer_0.cross_attention.norm.gamma",
                 "scores.W", "encoder.tokens.weight"):
        assert name in params, sorted(params)
    table = net.get_states()["decoder.positions.weight"].to_numpy().copy()
    np.testing.assert_allclose(table, model_mod.sinusoid_table(n_pos, 16).to_numpy())
    before = {k: v.to_numpy().copy() for k, v in params.items()}
    losses = [tensor.to_numpy(loss)[0]]
    for _ in range(15):
        losses.append(tensor.to_numpy(net(src, tgt_in, tgt_out, 0)[1])[0])
    assert losses[-1] < losses[0]
    unchanged = [k for k, v in net.get_params().items() if np.array_equal(v.to_numpy(), before[k])]
    assert sorted(unchanged) == ["decoder.positions.weight", "encoder.positions.weight"], unchanged
    np.testing.assert_array_equal(net.get_states()["decoder.positions.weight"].to_numpy(), table)
    net.eval()
    logits, enc_w, dec_w, cross_w = net(src, tgt_in)
    assert len(enc_w) == 2 and enc_w[0].shape == (8, 2, data.src_len, data.src_len)
    assert cross_w[1].shape == (8, 2, data.tgt_len, data.src_len)
    # Attention to <pad> keys and to later positions is masked out.
    w = tensor.to_numpy(dec_w[0])
    assert np.all(np.triu(w[0, 0], k=1) < 1e-6)
    assert np.allclose(w.sum(-1), 1.0, atol=1e-5)


# ---- gan/
@pytest.mark.parametrize("kind", ["vanilla", "lsgan"])
def test_gan_trains_and_writes_images(kind, tmp_path):
    rc, out = run(script("gan", "train.py") + ["--kind", kind, "--data", "synthetic", "--iterations", "30",
                                               "--interval", "10", "--out", str(tmp_path)])
    assert rc == 0, out
    rows = re.findall(r"^iteration (\d+): G loss (\S+), D loss (\S+), generated mean (\S+)$", out, re.M)
    assert [int(r[0]) for r in rows] == [0, 10, 20, 29], out
    values = [float(v) for r in rows for v in r[1:]]
    assert all(math.isfinite(v) for v in values), out
    assert all(0.0 < float(r[3]) < 1.0 for r in rows), out
    grid = (tmp_path / "29.pgm").read_bytes()
    assert grid.startswith(b"P5 140 140 255\n") and len(grid) == len(b"P5 140 140 255\n") + 140 * 140


@pytest.mark.parametrize("kind", ["vanilla", "lsgan"])
def test_each_gan_step_updates_its_own_side(kind, cpu):
    mod = load(f"gan_models_{kind}", "gan", "models.py")
    net = mod.MLPGAN(kind, noise_size=4, feature_size=9, hidden_size=5)
    noise = tensor.Tensor((6, 4), cpu)
    net.set_optimizer(opt.Adam(lr=0.01))
    net.compile([noise], is_train=True, use_graph=False, sequential=True)
    names = sorted(net.get_params())
    assert {n.split("_net")[0] for n in names} == {"gen", "dis"}, names

    def snapshot():
        return {k: v.to_numpy().copy() for k, v in net.get_params().items()}

    real = tensor.from_numpy(np.random.RandomState(0).uniform(0, 1, (6, 9)).astype(np.float32), cpu)
    ones = tensor.from_numpy(np.ones((6, 1), dtype=np.float32), cpu)
    net.train()
    before = snapshot()
    noise.uniform(-1, 1)
    fake = net.forward_gen(noise)  # computed with the generator's graph, as the scripts do
    _, loss = net.train_one_batch_dis(fake, ones)
    after = snapshot()
    assert math.isfinite(tensor.to_numpy(loss)[0])
    moved = {k for k in names if not np.array_equal(before[k], after[k])}
    assert moved == {k for k in names if k.startswith("dis_net")}, moved
    noise.uniform(-1, 1)
    _, loss = net.train_one_batch(noise, ones)
    final = snapshot()
    moved = {k for k in names if not np.array_equal(after[k], final[k])}
    assert moved == {k for k in names if k.startswith("gen_net")}, moved
