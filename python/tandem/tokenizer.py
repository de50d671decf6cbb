"""Byte-level BPE tokenizers read from Hugging Face's ``tokenizer.json`` (GPT-2's and Llama 3's kind).

    from tandem.tokenizer import Tokenizer

    tok = Tokenizer.from_file("tokenizer.json")
    ids = tok.encode("Hello, world!")          # the ids of tokenizers' encode(text, add_special_tokens=False)
    text = tok.decode(ids)                     # "Hello, world!"
    batches = tok.encode_batch(texts)          # every core; long texts are cut and encoded in parallel

``encode`` takes ``str`` or ``bytes``; bytes that are not UTF-8 are read as
``bytes.decode("utf-8", errors="replace")`` reads them. A file tandem cannot read (another model,
normalizer or split pattern, BPE dropout...) raises ``ValueError`` naming the file and the problem.
"""
from . import _tandem

__all__ = ["Tokenizer"]


class Tokenizer:
    """A tokenizer.json's stages (added tokens, pre-tokenizer, BPE model, decoder), in C++."""

    def __init__(self, impl):
        self._impl = impl

    @classmethod
    def from_file(cls, path):
        """Reads a tokenizer.json."""
        return cls(_tandem.Tokenizer.from_file(str(path)))

    @classmethod
    def from_str(cls, json):
        """Reads a tokenizer.json's text."""
        return cls(_tandem.Tokenizer.from_str(json))

    def encode(self, text):
        """The ids of text (str or bytes), as a list of int."""
        return self._impl.encode(text)

    def encode_batch(self, texts, threads=0):
        """The ids of each text, encoded on ``threads`` threads (0: every core)."""
        return self._impl.encode_batch(list(texts), threads)

    def decode(self, ids, skip_special_tokens=False):
        """The text of ids (bytes that are not UTF-8 become U+FFFD)."""
        return self._impl.decode(list(ids), skip_special_tokens)

    def decode_bytes(self, ids, skip_special_tokens=False):
        """The bytes ids stand for, without replacing what is not UTF-8."""
        return self._impl.decode_bytes(list(ids), skip_special_tokens)

    @property
    def vocab_size(self):
        """Ids are below this: the largest id of the vocabulary and the added tokens, plus one."""
        return self._impl.vocab_size

    def token_to_id(self, token):
        """The id of a token string, or None."""
        return self._impl.token_to_id(token)

    def id_to_token(self, id):
        """The string of a token id, or None."""
        return self._impl.id_to_token(id)

    def is_special(self, id):
        """Whether id is an added token marked special."""
        return self._impl.is_special(id)

    @property
    def document_token(self):
        """The id of the token between documents (<|endoftext|>, or <|begin_of_text|>), or None."""
        return self._impl.document_token

    @property
    def path(self):
        return self._impl.path

    def __repr__(self):
        return repr(self._impl)
