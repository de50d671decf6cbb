"""GPT-2's language model built from tandem.layer's layers, the same model as the C++ ``nn::GPT`` (parameter
names, initialisation, checkpoints): ``tandem generate`` samples from what ``save_states(path, net.meta())``
writes.

    net = GPT.from_config("char")
    net.set_optimizer(opt.Adam(lr=1e-3))
    net.compile([tokens], is_train=True)
    logits, loss = net(tokens, targets)       # a training step
    text = net.generate(list(b"ROMEO:"), 100, temperature=0.8, top_k=200, seed=1)
"""
import numpy as np

from .. import _tandem, layer, tensor
from ..model import Model

_KEYS = ("layers", "heads", "width", "context", "vocab", "dropout", "bias")


class GPT(Model):
    """Tokens [B, T] (int32 / int64, T <= context) to logits [B, T, vocab]: token plus position embedding
    (wte, wpe), ``layers`` TransformerBlocks (h.0, h.1, ...), a final LayerNorm (ln_f), and logits through the
    token table (tied: one parameter, wte.weight). GPT-2's initialisation from the device's generator: both
    tables and the weights from N(0, 0.02^2), the blocks' output projections from N(0, (0.02 / sqrt(2 layers))^2),
    biases zero. ``dropout`` acts after the embeddings, on attention probabilities and on each residual branch,
    in training. ``train_one_batch(tokens, targets)`` steps the optimizer on the mean cross-entropy (targets of
    -100 ignored) and returns ``(logits, loss)``."""

    def __init__(self, vocab=256, context=256, layers=6, heads=6, width=384, dropout=0.0, bias=True):
        super().__init__()
        self.config = {"layers": int(layers), "heads": int(heads), "width": int(width), "context": int(context),
                       "vocab": int(vocab), "dropout": float(dropout), "bias": bool(bias)}
        # The C++ checks of the configuration, with its messages.
        _tandem.GptConfig.from_json(_tandem.GptConfig.to_json(_cpp_config(self.config)))
        self.wte = layer.Embedding(vocab, width)
        self.wpe = layer.Embedding(context, width)
        self.drop = layer.Dropout(dropout) if dropout > 0 else None
        self.h = layer.Sequential(*[layer.TransformerBlock(heads, width, dropout=dropout, bias=bias,
                                                           residual_layers=layers) for _ in range(layers)])
        self.ln_f = layer.LayerNorm(width, bias=bias)

    @classmethod
    def from_config(cls, config, **overrides):
        """A GPT of a named configuration ("gpt2", "gpt2-medium", "char"), or of a dict with the keys of
        :meth:`meta`'s "gpt" (a checkpoint's), with ``overrides`` (e.g. ``vocab=256``) applied."""
        if isinstance(config, str):
            c = _tandem.gpt_config(config)
            config = {k: getattr(c, k) for k in _KEYS}
        unknown = set(config) - set(_KEYS) | set(overrides) - set(_KEYS)
        if unknown:
            raise ValueError(f"GPT.from_config: unknown keys {sorted(unknown)} (it takes {', '.join(_KEYS)})")
        return cls(**{**config, **overrides})

    def meta(self):
        """What a checkpoint of this model says about it: ``{"model": "gpt", "gpt": {...}}`` (pass it to
        ``save_states`` so that ``tandem generate`` and the C++ model can read the file)."""
        return {"model": "gpt", "gpt": dict(self.config)}

    def num_parameters(self, include_position_table=True):
        return _tandem.gpt_num_parameters(_cpp_config(self.config), include_position_table)

    def flops_per_token(self, seq_len=None):
        """A training step's FLOPs per token, 6 N + 12 layers width T (nanoGPT's estimate)."""
        return _tandem.gpt_flops_per_token(_cpp_config(self.config), seq_len or 0)

    def initialize(self, tokens):
        dev = tokens.device
        for table in (self.wte, self.wpe):
            table._build(dev)
            table.W.gaussian(0.0, 0.02)

    def _check(self, tokens, start=0):
        if tokens.ndim != 2:
            raise ValueError(f"GPT expects tokens [B, T], got {tokens}")
        t = tokens.shape[1]
        if start + t > self.config["context"]:
            raise ValueError(f"GPT: {t} tokens{f' after {start}' if start else ''} exceed the context of "
                             f"{self.config['context']}")

    _doc_positions = None

    def set_document_positions(self, positions):
        """Packed documents: ``positions`` (int32 [B, T], on the model's device) holds each token's position in its
        document (0 at each document's first token). The forwards of tokens [B, T] that follow see each document
        alone: no attention across documents, and the position table's row of each token is its position in its
        document. ``None``: one sequence per row (forward_cached ignores them)."""
        self._doc_positions = positions
        for block in self.h._layers.values():
            block.set_document_positions(positions)

    def _embed(self, tokens, start, documents=True):
        t = tokens.shape[1]
        if self._doc_positions is not None and documents:
            if tuple(self._doc_positions.shape) != tuple(tokens.shape):
                raise ValueError(f"GPT: document positions {self._doc_positions} do not match the tokens {tokens}")
            return _tandem.add(self.wte(tokens), _tandem.embedding(self.wpe.W, self._doc_positions))
        return _tandem.add(self.wte(tokens), _tandem.slice(self.wpe.W, 0, start, t))

    def forward(self, tokens):
        self._check(tokens)
        x = self._embed(tokens, 0)
        if self.drop is not None:
            x = self.drop(x)
        x = self.ln_f(self.h(x))
        return _tandem.linear(x, self.wte.W, None)

    def train_one_batch(self, tokens, targets):
        logits = self.forward(tokens)
        loss = _tandem.cross_entropy_loss(logits, targets)
        self.optimizer(loss)
        return logits, loss

    def forward_cached(self, tokens, caches, start):
        """Logits for the next tokens [B, Tn] of sequences whose first ``start`` tokens the per-block
        ``_tandem.KVCache`` list ``caches`` holds (appended to); no gradient, no dropout."""
        self._check(tokens, start)
        with _tandem.no_grad():
            x = self._embed(tokens, start, documents=False)
            for blk, cache in zip(self.h._layers.values(), caches):
                x = blk.forward_cached(x, cache, self.config["context"])
            return _tandem.linear(self.ln_f(x), self.wte.W, None)

    def generate(self, prompt, n, temperature=1.0, top_k=0, seed=0):
        """``n`` tokens continuing ``prompt`` (a list of ints), drawn one at a time as the C++ GPT.generate
        draws them (the same tokens for the same weights, seed and device): the prompt runs once, then each new
        token against the cached keys and values; past the context each token is drawn from the last
        ``context`` tokens. Returns the new tokens."""
        prompt = [int(t) for t in prompt]
        context = self.config["context"]
        if not prompt:
            raise ValueError("GPT.generate: the prompt must hold at least one token")
        if len(prompt) > context:
            raise ValueError(f"GPT.generate: the prompt's {len(prompt)} tokens exceed the context of {context}")
        dev = self.wte.W.device if self.wte.W is not None else _tandem.device(None)

        def as_tensor(tokens):
            return tensor.from_numpy(np.asarray([tokens], dtype=np.int32), dev)

        was_training = self.training
        self.eval()
        try:
            if not self._initialized:
                with _tandem.no_grad():
                    self.forward(as_tensor(prompt))
                self._initialized = True
            gen = _tandem.Generator(seed)
            caches = [_tandem.KVCache() for _ in range(self.config["layers"])]

            def last_row(tokens, start):
                logits = self.forward_cached(as_tensor(tokens), caches, start)
                return _tandem.slice(logits, 1, logits.shape[1] - 1, 1).to_numpy().reshape(-1).tolist()

            seq, out = list(prompt), []
            row, length = last_row(seq, 0), len(seq)
            for i in range(int(n)):
                nxt = _tandem.sample_logits(row, temperature, top_k, gen)
                seq.append(nxt)
                out.append(nxt)
                if i + 1 == n:
                    break
                if length < context:
                    row, length = last_row([nxt], length), length + 1
                else:
                    for c in caches:
                        c.clear()
                    row, length = last_row(seq[-context:], 0), context
            return out
        finally:
            self.train(was_training)


def _cpp_config(config):
    c = _tandem.GptConfig()
    for k in _KEYS:
        setattr(c, k, config[k])
    return c
