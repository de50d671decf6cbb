"""tandem.layer.TransformerBlock and tandem.models.GPT: the block against NumPy, the GPT's loss and every gradient
against PyTorch's (tests/fixtures/pytorch/gpt.json, as the C++ test reads it), training with tandem.opt,
sampling with the key-value cache (the same tokens as the C++ GPT), and checkpoints `tandem generate` reads."""
import json
import math
import pathlib
import subprocess

import numpy as np
import pytest

from conftest import run, tandem_command
from tandem import _tandem, layer, models, opt, tensor

FIXTURE = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "pytorch" / "gpt.json"


def ints(a, dev):
    return tensor.from_numpy(np.asarray(a, dtype=np.int32), dev)


def np_layer_norm(x, w, b, eps=1e-5):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    y = (x - m) / np.sqrt(v + eps) * w
    return y + b if b is not None else y


def np_gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def np_block(x, p, heads, causal=True):
    """GPT-2's block in NumPy from parameters by name."""
    b, t, c = x.shape
    hd = c // heads
    y = np_layer_norm(x, p["ln_1.weight"], p.get("ln_1.bias"))
    qkv = y @ p["attn.c_attn.weight"].T + p.get("attn.c_attn.bias", 0)
    q, k, v = (qkv[..., i * c:(i + 1) * c].reshape(b, t, heads, hd).transpose(0, 2, 1, 3) for i in range(3))
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
    if causal:
        s = np.where(np.tril(np.ones((t, t), dtype=bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    a = (e / e.sum(-1, keepdims=True)) @ v
    x = x + a.transpose(0, 2, 1, 3).reshape(b, t, c) @ p["attn.c_proj.weight"].T + p.get("attn.c_proj.bias", 0)
    y = np_layer_norm(x, p["ln_2.weight"], p.get("ln_2.bias"))
    y = np_gelu_tanh(y @ p["mlp.c_fc.weight"].T + p.get("mlp.c_fc.bias", 0))
    return x + y @ p["mlp.c_proj.weight"].T + p.get("mlp.c_proj.bias", 0)


def test_transformer_block_takes_its_width_at_the_first_call(cpu):
    rng = np.random.RandomState(0)
    for causal, bias in ((True, True), (False, False)):
        blk = layer.TransformerBlock(2, causal=causal, bias=bias)
        x = rng.uniform(-1, 1, (2, 5, 8)).astype(np.float32)
        y = blk(tensor.from_numpy(x, cpu))
        assert blk.width == 8
        params = {k: v.to_numpy() for k, v in blk.get_params().items()}
        want = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                "mlp.c_proj.weight", "mlp.c_proj.bias"]
        assert list(params) == (want if bias else [n for n in want if not n.endswith("bias")])
        assert params["attn.c_attn.weight"].shape == (24, 8)
        # Values away from the initial ones (zero biases, unit LayerNorm weights) before comparing.
        blk.set_params({k: rng.uniform(-0.5, 0.5, v.shape).astype(np.float32) + (1 if "ln_" in k and "weight" in k
                                                                                  else 0) for k, v in params.items()})
        params = {k: v.to_numpy().astype(np.float64) for k, v in blk.get_params().items()}
        y = blk(tensor.from_numpy(x, cpu)).to_numpy()
        np.testing.assert_allclose(y, np_block(x.astype(np.float64), params, 2, causal), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="not a multiple of num_heads 3"):
        layer.TransformerBlock(3)(tensor.from_numpy(np.zeros((1, 2, 8), np.float32), cpu))
    with pytest.raises(ValueError, match=r"\[B, T, width\]"):
        layer.TransformerBlock(2)(tensor.from_numpy(np.zeros((2, 8), np.float32), cpu))


def test_transformer_block_gradients_reach_every_parameter(cpu):
    blk = layer.TransformerBlock(2, dropout=0.1)
    x = tensor.from_numpy(np.random.RandomState(1).uniform(-1, 1, (2, 4, 8)).astype(np.float32), cpu)
    x.requires_grad = True
    _tandem.backward(_tandem.sum(blk(x)))
    for name, p in blk.get_params().items():
        assert p.grad is not None, name
    assert x.grad is not None


def fixture_cases():
    return json.loads(FIXTURE.read_text())["cases"]


def built(case, dev):
    cfg = case["config"]
    net = models.GPT.from_config(cfg)
    tokens = ints(case["tokens"], dev)
    net.compile([tokens], is_train=False)
    params = net.get_params()
    assert list(params) == [p["name"] for p in case["params"]]
    net.set_params({p["name"]: np.asarray(p["data"], np.float32).reshape(p["shape"]) for p in case["params"]})
    return net, tokens


@pytest.mark.parametrize("index", [0, 1])
def test_gpt_loss_and_every_gradient_match_pytorch(cpu, index):
    case = fixture_cases()[index]
    net, tokens = built(case, cpu)
    logits = net.forward(tokens)
    want = np.asarray(case["logits"]["data"]).reshape(case["logits"]["shape"])
    np.testing.assert_allclose(logits.to_numpy(), want, rtol=1e-5, atol=1e-6)
    loss = _tandem.cross_entropy_loss(logits, ints(case["targets"], cpu))
    assert loss.item() == pytest.approx(case["loss"], rel=1e-5)
    _tandem.backward(loss)
    params = net.get_params()
    for g in case["grads"]:
        np.testing.assert_allclose(params[g["name"]].grad.to_numpy(), np.asarray(g["data"]).reshape(g["shape"]),
                                   rtol=1e-5, atol=1e-6, err_msg=g["name"])


def test_gpt_trains_with_tandem_opt(cpu):
    net = models.GPT(vocab=16, context=8, layers=2, heads=2, width=16)
    rng = np.random.RandomState(3)
    seq = rng.randint(0, 16, (4, 9))
    x, y = ints(seq[:, :-1], cpu), ints(seq[:, 1:], cpu)
    net.set_optimizer(opt.Adam(lr=3e-3))
    net.compile([x], is_train=True)
    losses = [net(x, y)[1].item() for _ in range(40)]
    assert losses[0] == pytest.approx(math.log(16), rel=0.1)  # GPT-2's initialisation: nearly uniform logits
    assert losses[-1] < 0.5 * losses[0]
    assert net.num_parameters() == sum(p.to_numpy().size for p in net.get_params().values())
    assert net.flops_per_token() == 6 * net.num_parameters(False) + 12 * 2 * 16 * 8


def test_gpt_initialisation_is_gpt2s(cpu):
    net = models.GPT(vocab=512, context=64, layers=4, heads=4, width=64)
    net.compile([ints(np.zeros((1, 4)), cpu)], is_train=False)
    p = {k: v.to_numpy() for k, v in net.get_params().items()}
    assert p["wte.weight"].std() == pytest.approx(0.02, rel=0.05)
    assert p["wpe.weight"].std() == pytest.approx(0.02, rel=0.1)
    assert p["h.1.attn.c_attn.weight"].std() == pytest.approx(0.02, rel=0.1)
    assert p["h.1.mlp.c_proj.weight"].std() == pytest.approx(0.02 / math.sqrt(8), rel=0.1)
    assert not p["h.1.mlp.c_fc.bias"].any()


def test_cached_logits_equal_the_full_forward(cpu):
    case = fixture_cases()[0]
    net, tokens = built(case, cpu)
    net.eval()
    full = net.forward(tokens).to_numpy()
    caches = [_tandem.KVCache() for _ in range(2)]
    seq = np.asarray(case["tokens"])
    parts = [net.forward_cached(ints(seq[:, :3], cpu), caches, 0).to_numpy()]
    for t in range(3, 8):
        parts.append(net.forward_cached(ints(seq[:, t:t + 1], cpu), caches, t).to_numpy())
    np.testing.assert_allclose(np.concatenate(parts, axis=1), full, rtol=1e-5, atol=1e-5)
    assert caches[0].length == 8 and caches[0].capacity == 8


def test_generate_matches_the_cpp_gpt_and_is_reproducible(cpu):
    net = models.GPT(vocab=32, context=8, layers=2, heads=2, width=16, dropout=0.1)
    net.compile([ints(np.zeros((1, 8)), cpu)], is_train=True)
    cfg = _tandem.GptConfig.from_json(json.dumps(net.meta()["gpt"]))
    cpp = _tandem.GPT(cfg, 5)
    values = net.get_params()
    for name, p in cpp.named_parameters():
        p.copy_(values[name])
    prompt = [3, 1, 4]
    a = net.generate(prompt, 12, temperature=0.9, top_k=6, seed=7)  # passes the context: cropped
    assert len(a) == 12 and all(0 <= t < 32 for t in a)
    assert a == cpp.generate(prompt, 12, 0.9, 6, 7)
    assert net.generate(prompt, 12, temperature=0.9, top_k=6, seed=7) == a
    assert net.generate(prompt, 12, temperature=0.9, top_k=6, seed=8) != a
    assert net.training  # the mode is restored
    with pytest.raises(ValueError, match="exceed the context of 8"):
        net.generate(list(range(9)), 2)
    with pytest.raises(ValueError, match="9 tokens exceed the context of 8"):
        net.forward(ints(np.zeros((1, 9)), cpu))


def test_a_saved_gpt_samples_with_tandem_generate(cpu, tmp_path):
    exe = tandem_command()
    if exe is None:
        pytest.skip("the tandem command is not installed")
    net = models.GPT(vocab=256, context=16, layers=1, heads=2, width=16)
    net.compile([ints(np.zeros((1, 4)), cpu)], is_train=False)
    path = tmp_path / "gpt.ckpt"
    net.save_states(path, net.meta())
    assert json.loads(_tandem.checkpoint_meta(str(path)))["model"] == "gpt"
    p = subprocess.run([exe, "generate", "--checkpoint", str(path), "--prompt", "hi", "-n", "30", "--seed", "3",
                        "--temperature", "0.8", "--top-k", "200"], capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout == b"hi" + bytes(net.generate(list(b"hi"), 30, temperature=0.8, top_k=200, seed=3))
    # A GPT of another vocabulary is refused, saying why.
    small = models.GPT(vocab=64, context=16, layers=1, heads=2, width=16)
    small.compile([ints(np.zeros((1, 4)), cpu)], is_train=False)
    small.save_states(tmp_path / "v64.ckpt", small.meta())
    rc, out = run([exe, "generate", "--checkpoint", str(tmp_path / "v64.ckpt")])
    assert rc == 2 and "byte vocabulary of 256" in out


def test_from_config_and_errors():
    net = models.GPT.from_config("char", vocab=128)
    assert net.config == {"layers": 6, "heads": 6, "width": 384, "context": 256, "vocab": 128, "dropout": 0.2,
                          "bias": True}
    with pytest.raises(ValueError, match="unknown keys"):
        models.GPT.from_config("char", rope=True)
    with pytest.raises(ValueError, match="width 18 must be a multiple of heads 4"):
        models.GPT(width=18, heads=4)
    assert _tandem.gpt_num_parameters(_tandem.gpt_config("gpt2")) == 124475904
