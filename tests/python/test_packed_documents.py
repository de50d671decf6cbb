"""Packed documents from Python: a GPT and a Llama given each token's position in its document
(set_document_positions) give each document the logits it has alone, and scaled_dot_product_attention's
doc_positions keeps attention within documents."""
import numpy as np
import pytest

from tandem import _tandem, autograd, models, tensor

LENGTHS = [[3, 4, 2], [9], [1, 1, 6, 1]]


def positions():
    return np.asarray([[p for n in row for p in range(n)] for row in LENGTHS], dtype=np.int32)


def ints(a, dev):
    return tensor.from_numpy(np.asarray(a, dtype=np.int32), dev)


def alone(net, tokens, dev):
    """The logits of each document run by itself, put back in place."""
    rows = []
    for r, row in enumerate(LENGTHS):
        parts, at = [], 0
        for n in row:
            parts.append(net.forward(ints(tokens[r:r + 1, at:at + n], dev)).to_numpy())
            at += n
        rows.append(np.concatenate(parts, axis=1))
    return np.concatenate(rows, axis=0)


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_each_packed_document_gets_the_logits_it_has_alone(cpu, family):
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 40, size=(3, 9))
    if family == "gpt":
        net = models.GPT(vocab=40, context=9, layers=2, heads=2, width=16)
    else:
        net = models.Llama("llama-1b", layers=2, width=32, heads=4, kv_heads=2, mlp_hidden=48, vocab=40, context=9)
    net.forward(ints(tokens, cpu))  # built
    net.eval()
    crossing = net.forward(ints(tokens, cpu)).to_numpy()
    net.set_document_positions(tensor.from_numpy(positions(), cpu))
    packed = net.forward(ints(tokens, cpu)).to_numpy()
    net.set_document_positions(None)
    expected = alone(net, tokens, cpu)
    np.testing.assert_allclose(packed, expected, rtol=2e-5, atol=2e-5)
    assert np.abs(crossing - expected).max() > 1e-3  # without the positions the documents see each other


def test_attention_with_doc_positions_equals_each_document_alone(cpu):
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((3, 2, 9, 4)).astype(np.float32) for _ in range(3))
    t = lambda a: tensor.from_numpy(a, cpu)
    out = _tandem.scaled_dot_product_attention(t(q), t(k), t(v), causal=True,
                                               doc_positions=tensor.from_numpy(positions(), cpu)).to_numpy()
    for r, row in enumerate(LENGTHS):
        at = 0
        for n in row:
            cut = lambda a: t(np.ascontiguousarray(a[r:r + 1, :, at:at + n]))
            want = _tandem.scaled_dot_product_attention(cut(q), cut(k), cut(v), causal=True).to_numpy()
            np.testing.assert_allclose(out[r:r + 1, :, at:at + n], want, rtol=1e-5, atol=1e-6)
            at += n
    with pytest.raises(Exception, match="causal"):
        _tandem.scaled_dot_product_attention(t(q), t(k), t(v), doc_positions=tensor.from_numpy(positions(), cpu))
