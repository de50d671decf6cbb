"""Sentence pairs for the translation example: a vocabulary per side, the pairs as padded index arrays,
and batches of them (SINGA's transformer example reads its data the same way).

The pairs come from a text file of lines "source TAB target [TAB anything]" (tokens separated by spaces
on both sides), or from toy_pairs(): number words and, as their translation, the same numbers as digits
in reverse order ("three one four" -> "4 1 3"), which a small model learns in a few hundred steps.
"""
import random
from collections import Counter

import numpy as np

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


class Vocab:
    """Tokens and their indices: the special tokens first (<pad> is 0), then by falling frequency
    (ties in token order, so that the same sentences always give the same indices)."""

    def __init__(self, sentences):
        counts = Counter(t for s in sentences for t in s)
        ordered = sorted(counts, key=lambda t: (-counts[t], t))
        self.tokens = list(SPECIALS) + [t for t in ordered if t not in SPECIALS]
        self.index = {t: i for i, t in enumerate(self.tokens)}

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, key):
        """A token's index (<unk>'s for unknown ones), an index's token, or a list of either."""
        if isinstance(key, str):
            return self.index.get(key, self.index["<unk>"])
        if isinstance(key, (int, np.integer)):
            return self.tokens[key] if 0 <= key < len(self.tokens) else "<unk>"
        return [self[k] for k in key]


def toy_pairs(count=600, seed=0, min_len=2, max_len=5):
    """count pairs (number words, the digits reversed), drawn with the seed."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        digits = [rng.randrange(10) for _ in range(rng.randint(min_len, max_len))]
        pairs.append(([WORDS[d] for d in digits], [str(d) for d in reversed(digits)]))
    return pairs


def read_pairs(path):
    """The pairs of a file of lines "source TAB target ...", lower-cased and split at spaces."""
    pairs = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if len(fields) >= 2 and fields[0].strip() and fields[1].strip():
                pairs.append((fields[0].lower().split(), fields[1].lower().split()))
    return pairs


class PairDataset:
    """The pairs as arrays: sources [N, S + 1] (padded, at least one <pad>), decoder inputs [N, T + 1]
    (<bos> then the target) and decoder targets [N, T + 1] (the target then <eos>), split into training
    and test pairs after an optional shuffle."""

    def __init__(self, pairs, batch_size=32, train_ratio=0.8, shuffle=True, seed=0):
        if not pairs:
            raise ValueError("no sentence pairs")
        self.src_vocab = Vocab([s for s, _ in pairs])
        self.tgt_vocab = Vocab([t for _, t in pairs])
        self.src_len = max(len(s) for s, _ in pairs) + 1
        self.tgt_len = max(len(t) for _, t in pairs) + 1
        pad_s, pad_t = [0] * self.src_len, [0] * self.tgt_len
        src = [(self.src_vocab[s] + pad_s)[:self.src_len] for s, _ in pairs]
        tgt_in = [([1] + self.tgt_vocab[t] + pad_t)[:self.tgt_len] for _, t in pairs]
        tgt_out = [(self.tgt_vocab[t] + [2] + pad_t)[:self.tgt_len] for _, t in pairs]
        arrays = [np.asarray(a, dtype=np.int32) for a in (src, tgt_in, tgt_out)]
        if shuffle:
            order = np.random.RandomState(seed).permutation(len(pairs))
            arrays = [a[order] for a in arrays]
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.batch_size = batch_size
        n_train = max(1, int(len(pairs) * train_ratio))
        self.parts = {"train": [a[:n_train] for a in arrays], "test": [a[n_train:] for a in arrays]}
        if len(self.parts["test"][0]) == 0:
            self.parts["test"] = self.parts["train"]

    def size(self, mode):
        return len(self.parts[mode][0])

    def num_batches(self, mode):
        return -(-self.size(mode) // self.batch_size)

    def get_batch_data(self, batch, mode="train"):
        """Batch number `batch` of the part: (sources, decoder inputs, decoder targets), batch_size rows
        each; the last batch is filled up from the part's first pairs."""
        if not 0 <= batch < self.num_batches(mode):
            raise ValueError(f"batch {batch} is outside the {self.num_batches(mode)} batches of {mode}")
        rows = np.arange(batch * self.batch_size, (batch + 1) * self.batch_size) % self.size(mode)
        return tuple(a[rows] for a in self.parts[mode])
