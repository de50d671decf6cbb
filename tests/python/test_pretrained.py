"""Hugging Face models through Python (tests/fixtures/hf): tandem.models.from_pretrained gives transformers'
logits (the fixture's, in f32), trains as a Model, generates greedily as transformers did, and save_pretrained
writes a directory read back to the same weights; with transformers installed, transformers itself loads the
exported directory and gives tandem's logits."""
import json
import os

import numpy as np
import pytest

from tandem import device, models, opt, tensor

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "hf")


def reference(case):
    safetensors = pytest.importorskip("safetensors.numpy")
    return safetensors.load_file(os.path.join(FIX, case, "reference.safetensors"))


@pytest.mark.parametrize("case", ["llama_tied_gqa", "llama_untied_mha", "gpt2_tiny"])
def test_from_pretrained_gives_transformers_logits_and_generation(case):
    ref = reference(case)
    dev = device.get_default_device()
    net = models.from_pretrained(os.path.join(FIX, case), device=dev)
    net.eval()
    tokens = tensor.from_numpy(ref["tokens"].astype(np.int32), dev)
    logits = net(tokens).to_numpy()
    want = ref["logits"]
    assert np.max(np.abs(logits - want)) <= 1e-5 * np.max(np.abs(want))
    got = net.generate(ref["prompt"].tolist(), 32, temperature=0)
    assert got == ref["generated"].tolist()


def test_a_llama_trains_and_round_trips_through_save_pretrained(tmp_path):
    ref = reference("llama_tied_gqa")
    dev = device.get_default_device()
    net = models.from_pretrained(os.path.join(FIX, "llama_tied_gqa"), device=dev)
    tokens = tensor.from_numpy(ref["tokens"].astype(np.int32), dev)
    targets = tensor.from_numpy(ref["targets"].astype(np.int32), dev)
    net.set_optimizer(opt.Adam(lr=1e-2, decoupled=True))
    net.compile([tokens], is_train=True, use_graph=False)
    net.train()
    losses = [float(net(tokens, targets)[1].to_numpy()) for _ in range(5)]
    assert losses[-1] < losses[0]
    net.save_pretrained(tmp_path / "out")
    back = models.from_pretrained(tmp_path / "out", device=dev)
    for (n1, a), (n2, b) in zip(net._module().named_parameters(), back._module().named_parameters()):
        assert n1 == n2
        np.testing.assert_array_equal(a.to_numpy(), b.to_numpy())
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    with torch.no_grad():
        theirs = hf(torch.from_numpy(ref["tokens"].astype(np.int64))).logits.numpy()
    back.eval()
    ours = back(tokens).to_numpy()
    assert np.max(np.abs(ours - theirs)) <= 1e-5 * np.max(np.abs(theirs))


def test_a_gpt2_pads_its_table_inside_and_writes_the_files_vocabulary(tmp_path):
    """gpt2_tiny's 97 tokens in a table of 128 rows: the logits handed out have the 97 columns, AdamW with weight
    decay keeps the padding rows zero, and save_pretrained writes the file's 97 rows (bit for bit before
    training, the trained rows after)."""
    safetensors = pytest.importorskip("safetensors.numpy")
    ref = reference("gpt2_tiny")
    dev = device.get_default_device()
    path = os.path.join(FIX, "gpt2_tiny")
    net = models.from_pretrained(path, device=dev)
    cfg = net.config()
    assert (cfg["vocab"], cfg["logical_vocab"]) == (128, 97)
    table = net._model().wte.weight
    assert table.shape == (128, 32)
    assert not table.to_numpy()[97:].any()
    net.save_pretrained(tmp_path / "as_read")
    original = safetensors.load_file(os.path.join(path, "model.safetensors"))
    written = safetensors.load_file(str(tmp_path / "as_read" / "model.safetensors"))
    for name, t in written.items():
        assert t.shape == original[name].shape, name
        np.testing.assert_array_equal(t, original[name], err_msg=name)
    tokens = tensor.from_numpy(ref["tokens"].astype(np.int32), dev)
    targets = tensor.from_numpy(ref["targets"].astype(np.int32), dev)
    net.eval()
    assert net(tokens).shape == (2, 12, 97)
    net.set_optimizer(opt.Adam(lr=1e-2, decoupled=True, weight_decay=0.1))
    net.compile([tokens], is_train=True, use_graph=False)
    net.train()
    losses = [float(net(tokens, targets)[1].to_numpy()) for _ in range(3)]
    assert losses[-1] < losses[0]
    rows = net._model().wte.weight.to_numpy()
    assert not rows[97:].any()
    assert np.any(rows[:97] != original["transformer.wte.weight"])
    net.save_pretrained(tmp_path / "trained")
    with open(tmp_path / "trained" / "config.json") as f:
        assert json.load(f)["vocab_size"] == 97
    np.testing.assert_array_equal(
        safetensors.load_file(str(tmp_path / "trained" / "model.safetensors"))["transformer.wte.weight"], rows[:97])


def test_a_named_llama_and_its_refusals():
    net = models.Llama("llama-1b", layers=1, width=64, heads=4, kv_heads=2, mlp_hidden=96, vocab=50, context=16)
    assert net.config()["kv_heads"] == 2
    with pytest.raises(ValueError, match="kv_heads 3 must divide heads 4"):
        models.Llama("llama-1b", layers=1, width=64, heads=4, kv_heads=3, mlp_hidden=96, vocab=50)
    with pytest.raises(ValueError, match="unknown field"):
        models.Llama("llama-1b", colour="red")
    with pytest.raises(ValueError, match="no config.json"):
        models.from_pretrained(FIX)
