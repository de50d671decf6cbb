"""tandem.tokenizer against the ids the `tokenizers` library gave (tests/fixtures/tokenizer/cases.json)."""
import json
import pathlib

import pytest

from tandem.tokenizer import Tokenizer

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "tokenizer"
CASES = json.loads((FIXTURES / "cases.json").read_text(encoding="utf-8"))


def text_of(case):
    return bytes.fromhex(case["hex"]) if "hex" in case else case["text"]


@pytest.mark.parametrize("name", sorted(CASES["files"]))
def test_ids_and_decoding_are_the_librarys(name):
    tok = Tokenizer.from_file(FIXTURES / CASES["files"][name])
    for case in CASES["cases"]:
        text = text_of(case)
        ids = tok.encode(text)
        assert ids == case["ids"][name], case["name"]
        want = case.get("decoded", {}).get(name, text)
        assert tok.decode(ids) == want, case["name"]
    # str and its UTF-8 bytes give the same ids; encode_batch gives each text's.
    assert tok.encode("naïve café") == tok.encode("naïve café".encode())
    texts = [text_of(c) for c in CASES["cases"]]
    assert tok.encode_batch(texts, threads=2) == [c["ids"][name] for c in CASES["cases"]]


def test_vocabulary_and_special_tokens():
    tok = Tokenizer.from_file(FIXTURES / "gpt2.json")
    assert tok.vocab_size == 1202
    eot = tok.document_token
    assert tok.id_to_token(eot) == "<|endoftext|>" and tok.is_special(eot)
    assert tok.token_to_id("<|endoftext|>") == eot
    assert tok.token_to_id("not a token") is None
    ids = tok.encode("a<|endoftext|>b")
    assert tok.decode(ids) == "a<|endoftext|>b"
    assert tok.decode(ids, skip_special_tokens=True) == "ab"
    assert b"".join(tok.decode_bytes([i]) for i in tok.encode("é")) == "é".encode()
    assert "1202 tokens" in repr(tok)


def test_errors_are_clear(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": {"type": "WordPiece", "vocab": {}}}')
    with pytest.raises(ValueError, match="'WordPiece' is not supported"):
        Tokenizer.from_file(bad)
    with pytest.raises(ValueError, match="not valid JSON"):
        Tokenizer.from_str("{")
    with pytest.raises(ValueError, match="missing.json"):
        Tokenizer.from_file(tmp_path / "missing.json")
    tok = Tokenizer.from_file(FIXTURES / "gpt2.json")
    with pytest.raises(TypeError):
        tok.encode(42)
    with pytest.raises(ValueError, match="id 99999"):
        tok.decode([99999])
