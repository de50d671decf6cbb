"""Llama-family language models (Llama 3, and models of the same design) in Python: the C++ ``nn::Llama`` as a
``Model``, built from a named shape or read from a Hugging Face directory, trained with tandem.opt, written back
as a Hugging Face directory.

    net = from_pretrained("Llama-3.2-1B", device=dev)        # config.json + model.safetensors
    logits = net(tokens)                                     # [B, T, vocab]
    net.set_optimizer(opt.Adam(lr=2e-5, decoupled=True))
    net.compile([tokens], is_train=True)
    logits, loss = net(tokens, targets)                      # a training step
    ids = net.generate(prompt_ids, 32, temperature=0)        # greedy
    net.save_pretrained("out")                              # transformers loads it
"""
import json

from .. import _tandem, layer
from ..model import Model
from .gpt import GPT

_KEYS = ("layers", "width", "heads", "kv_heads", "mlp_hidden", "vocab", "context", "rope_theta", "rms_eps", "tied",
         "attention_bias", "mlp_bias", "init_std", "dropout")


class _Cpp(layer.Layer):
    """A C++ model as one layer (its parameters under their own names)."""

    def __init__(self, make):
        super().__init__()
        self._make = make

    def initialize(self, x):
        self._set_cpp(self._make(), x.device)

    def forward(self, x):
        return self._cpp(x)


class Llama(Model):
    """Tokens [B, T] (int32 / int64, T <= context) to logits [B, T, vocab]: the C++ ``nn::Llama`` (RMSNorm,
    rotary positions, grouped-query attention, SwiGLU, tied or untied head; parameter names wte.weight,
    h.{i}.ln_1.weight, h.{i}.attn.c_attn.weight, ..., ln_f.weight, lm_head.weight when untied).
    ``Llama("llama-1b")`` builds a named shape, ``Llama({...})`` one of the given fields (the keys of
    ``config()``), with ``overrides``. ``train_one_batch(tokens, targets)`` steps the optimizer on the mean
    cross-entropy (targets of -100 ignored) and returns ``(logits, loss)``."""

    def __init__(self, config="llama-1b", seed=0, **overrides):
        super().__init__()
        if isinstance(config, str):
            c = _tandem.llama_config(config)
        elif isinstance(config, dict):
            c = _tandem.LlamaConfig.from_json(json.dumps(_full(config)))
        else:
            c = config
        for k, v in overrides.items():
            if k not in _KEYS:
                raise ValueError(f"Llama: unknown field {k!r} (it takes {', '.join(_KEYS)})")
            setattr(c, k, v)
        c = _tandem.LlamaConfig.from_json(c.to_json())  # the C++ checks, with their messages
        self._config = c
        self._hf_config = ""
        self.net = _Cpp(lambda: _tandem.Llama(c, seed))

    def config(self):
        """The shape as a dict (rope_scaling included)."""
        return json.loads(self._config.to_json())

    def meta(self):
        """What a checkpoint of this model says about it (``tandem generate`` reads it)."""
        return {"model": "llama", "llama": self.config(), "context": self._config.context, "vocab": self._config.vocab}

    def num_parameters(self, include_token_table=True):
        return _tandem.llama_num_parameters(self._config, include_token_table)

    def flops_per_token(self, seq_len=None):
        return _tandem.llama_flops_per_token(self._config, seq_len or 0)

    def _model(self):
        if self.net._cpp is None:
            raise RuntimeError("Llama: call the model once first (or read it with from_pretrained)")
        return self.net._cpp

    def forward(self, tokens):
        return self.net(tokens)

    def set_document_positions(self, positions):
        """Packed documents: ``positions`` (int32 [B, T], on the model's device) holds each token's position in its
        document (0 at each document's first token). The forwards of tokens [B, T] that follow see each document
        alone: no attention across documents, rotary positions counted from each document's start. ``None``: one
        sequence per row. The tensor is read at each forward (refill it in place for the next batch)."""
        self._model().set_document_positions(positions)

    def train_one_batch(self, tokens, targets):
        logits = self.forward(tokens)
        loss = _tandem.cross_entropy_loss(logits, targets)
        self.optimizer(loss)
        return logits, loss

    def generate(self, prompt, n, temperature=1.0, top_k=0, top_p=1.0, seed=0, stop_token=-1):
        """Up to ``n`` tokens continuing ``prompt`` (a list of ints) through the key-value cache; temperature 0 is
        greedy; ``stop_token`` (>= 0) ends the generation once drawn (it is returned). Returns the new tokens."""
        return self._model().generate([int(t) for t in prompt], int(n), float(temperature), int(top_k),
                                      float(top_p), int(seed), int(stop_token))

    def save_pretrained(self, path, dtype="f32"):
        """Writes a Hugging Face directory (config.json, model.safetensors in f32, bf16 or f16) that transformers
        loads with from_pretrained; a model read with from_pretrained keeps its config.json's other fields."""
        _tandem.save_pretrained(self._model(), str(path), self._hf_config, _dtype(dtype))


def _dtype(name):
    table = {"f32": _tandem.DType.float32, "float32": _tandem.DType.float32, "bf16": _tandem.DType.bfloat16,
             "bfloat16": _tandem.DType.bfloat16, "f16": _tandem.DType.float16, "float16": _tandem.DType.float16}
    if name not in table:
        raise ValueError(f"save_pretrained: dtype {name!r} (f32, bf16 or f16)")
    return table[name]


def _full(d):
    """A dict of some fields on top of llama-1b's."""
    base = json.loads(_tandem.llama_config("llama-1b").to_json())
    unknown = set(d) - set(base)
    if unknown:
        raise ValueError(f"Llama: unknown fields {sorted(unknown)} (it takes {', '.join(sorted(base))})")
    base.update(d)
    return base


def from_pretrained(path, device=None, context=0):
    """The model in a Hugging Face directory (config.json and model.safetensors, or shards with their index):
    a :class:`Llama` for LlamaForCausalLM, a :class:`GPT`-shaped C++ model for GPT2LMHeadModel, its parameters on
    ``device`` (a tandem device; default the CPU). Its forward gives logits; it trains like any Model.
    Configurations tandem cannot represent are refused, naming the field."""
    from ..device import get_default_device

    dev = device if device is not None else get_default_device()
    family, cpp, config_json = _tandem.from_pretrained(str(path), dev, int(context))
    if family == "llama":
        net = Llama(cpp.config)
    else:
        net = _PretrainedGpt(cpp.config)
    net._hf_config = config_json
    net.net._set_cpp(cpp, dev)
    net.net._make = lambda: cpp
    net._initialized = True
    return net


class _PretrainedGpt(Llama):
    """A GPT-2 read from a Hugging Face directory: the C++ ``nn::GPT`` as a Model (generate, save_pretrained)."""

    def __init__(self, config):
        Model.__init__(self)
        self._gpt_config = config
        self._hf_config = ""
        self.net = _Cpp(lambda: _tandem.GPT(config, 0))

    def config(self):
        return json.loads(self._gpt_config.to_json())

    def meta(self):
        return {"model": "gpt", "gpt": self.config()}

    def generate(self, prompt, n, temperature=1.0, top_k=0, top_p=1.0, seed=0, stop_token=-1):
        return self._model().generate([int(t) for t in prompt], int(n), float(temperature), int(top_k), int(seed))


__all__ = ["Llama", "from_pretrained", "GPT"]
