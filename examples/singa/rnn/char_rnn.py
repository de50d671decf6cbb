#!/usr/bin/env python3
"""A character-level LSTM language model, with the calls of SINGA's char-RNN example: a model.Model of
layer.LSTM (one input tensor per time step, its states kept by the model between calls), layer.Cat,
layer.Reshape, layer.Linear and layer.SoftMaxCrossEntropy, an opt.SGD held as an attribute and called on
the loss inside train_one_batch, model.graph(True, False), get_states/set_states that carry the recurrent
states too, and text sampled one character at a time from tensor.softmax of the last output.

    python3 char_rnn.py                                   # the text below, 3 epochs
    python3 char_rnn.py --text FILE -m 10 -b 32 -l 64 -d 128
    python3 char_rnn.py --steps 5 --sample 40 --prime "the "

Each epoch prints the mean training and validation loss per character; then a sample of the text.
"""
import argparse
import sys

import numpy as np

from tandem import autograd, device, layer, model, opt, tensor

# A few sentences, repeated: a text small enough to learn in seconds.
TEXT = ("a small model reads the text one letter at a time and guesses the next one. "
        "at first its guesses are random; after a few passes over the text it knows that a space "
        "follows a word, that the letter after t is often h, and that the text repeats. ") * 12


class CharLSTM(model.Model):
    """LSTM -> one row of hidden values per step and sequence -> Linear to a score per character."""

    def __init__(self, vocab_size, hidden_size=32, lr=0.5, momentum=0.9):
        super().__init__()
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.lstm = layer.LSTM(vocab_size, hidden_size)
        self.join = layer.Cat()
        self.rows = layer.Reshape()
        self.scores = layer.Linear(hidden_size, vocab_size)
        self.label_rows = layer.Reshape()
        self.loss = layer.SoftMaxCrossEntropy()
        self.optimizer = opt.SGD(lr, momentum=momentum)

    def initialize(self, inputs):
        """The recurrent states, one row per sequence of the first batch."""
        n = inputs[0].shape[0]
        self.hx = tensor.Tensor((n, self.hidden_size))
        self.cx = tensor.Tensor((n, self.hidden_size))
        self.reset_states(inputs[0].device)

    def reset_states(self, dev):
        for state in (self.hx, self.cx):
            state.to_device(dev)
            state.set_value(0.0)

    def forward(self, inputs):
        outputs, hy, cy = self.lstm(inputs, (self.hx, self.cx))
        self.hx.copy_data(hy)  # the states go on into the next call
        self.cx.copy_data(cy)
        y = self.rows(self.join(outputs), (-1, self.hidden_size))
        return self.scores(y)

    def train_one_batch(self, inputs, labels):
        scores = self.forward(inputs)
        loss = self.loss(scores, self.label_rows(labels, (-1, 1)))
        self.optimizer(loss)
        return scores, loss

    def get_states(self):
        states = super().get_states()
        states["hx"], states["cx"] = self.hx, self.cx
        return states

    def set_states(self, states):
        self.hx.copy_from(states["hx"])
        self.cx.copy_from(states["cx"])
        super().set_states({k: v for k, v in states.items() if k not in ("hx", "cx")})


class CharData:
    """The text cut into sequences of seq_length + 1 characters (inputs and the next characters),
    shuffled with the seed and split into training and validation sequences."""

    def __init__(self, text, batch_size, seq_length, train_ratio=0.8, seed=0):
        self.chars = sorted(set(text))
        self.vocab_size = len(self.chars)
        self.index = {c: i for i, c in enumerate(self.chars)}
        codes = np.array([self.index[c] for c in text], dtype=np.int32)
        count = len(codes) // (seq_length + 1)
        if count < 2:
            raise ValueError(f"the text ({len(text)} characters) is too short for sequences of {seq_length}")
        seqs = codes[:count * (seq_length + 1)].reshape(count, seq_length + 1)
        np.random.RandomState(seed).shuffle(seqs)
        split = max(1, int(count * train_ratio))
        self.train, self.val = seqs[:split], seqs[split:]
        self.batch_size, self.seq_length = batch_size, seq_length

    def batches(self, part):
        seqs = self.train if part == "train" else self.val
        for b in range(len(seqs) // self.batch_size):
            yield seqs[b * self.batch_size:(b + 1) * self.batch_size]

    def one_hot(self, codes):
        return np.eye(self.vocab_size, dtype=np.float32)[codes]


def to_tensors(batch, data, dev, inputs=None, labels=None):
    """A batch [N, T + 1] as T one-hot input tensors [N, V] and the labels [T * N] in time-major order
    (the order layer.Cat joins the outputs of the steps), copied into the given tensors when there are."""
    x = data.one_hot(batch[:, :-1])            # [N, T, V]
    y = np.ascontiguousarray(batch[:, 1:].T).reshape(-1)
    if inputs is None:
        inputs = [tensor.from_numpy(x[:, t], dev) for t in range(x.shape[1])]
        labels = tensor.from_numpy(y, dev)
    else:
        for t, xt in enumerate(inputs):
            xt.copy_from_numpy(x[:, t])
        labels.copy_from_numpy(y)
    return inputs, labels


def sample(net, data, dev, prime, count, rng, greedy=False):
    """prime followed by count characters drawn one at a time. The inputs are batches of one character,
    which the LSTM broadcasts against states of the training batch, as SINGA's script does."""
    net.eval()
    net.reset_states(dev)
    out = net([tensor.from_numpy(data.one_hot([data.index[c]]), dev) for c in prime])
    text = prime
    for _ in range(count):
        p = tensor.to_numpy(tensor.softmax(out[-1]))[0].astype(np.float64)
        code = int(np.argmax(p)) if greedy else int(rng.choice(data.vocab_size, p=p / p.sum()))
        text += data.chars[code]
        out = net([tensor.from_numpy(data.one_hot([code]), dev)])
    return text


def evaluate(net, data, dev, inputs, labels):
    """The mean loss per character over the validation batches."""
    net.eval()
    total, n = 0.0, 0
    for batch in data.batches("val"):
        inputs, labels = to_tensors(batch, data, dev, inputs, labels)
        net.reset_states(dev)
        loss = autograd.softmax_cross_entropy(net(inputs), labels)[0]
        total += tensor.to_numpy(loss)[0]
        n += 1
    return total / max(n, 1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--text", help="a text file (default: the sentences in this script)")
    p.add_argument("-b", "--batch-size", type=int, default=8)
    p.add_argument("-l", "--seq-length", type=int, default=16)
    p.add_argument("-d", "--hidden-size", type=int, default=32)
    p.add_argument("-m", "--max-epoch", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--steps", type=int, default=0, help="at most this many training batches per epoch (0: all)")
    p.add_argument("--sample", type=int, default=60, help="characters to sample after training")
    p.add_argument("--prime", default="the ", help="the text sampling starts from")
    p.add_argument("--greedy", action="store_true", help="sample the most likely character each time")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    args = p.parse_args(argv)

    text = TEXT if args.text is None else open(args.text, encoding="iso-8859-1").read()
    data = CharData(text, args.batch_size, args.seq_length, seed=args.seed)
    use_gpu = args.device == "cuda" or (args.device == "auto" and device.get_num_gpus() > 0)
    dev = device.create_cuda_gpu() if use_gpu else device.get_default_device()
    dev.SetRandSeed(args.seed)
    rng = np.random.RandomState(args.seed)
    print(f"{data.vocab_size} characters, {len(data.train)} training and {len(data.val)} validation sequences "
          f"of {args.seq_length}, on {dev}")

    net = CharLSTM(data.vocab_size, args.hidden_size, args.lr)
    net.graph(True, False)
    inputs = labels = None
    for epoch in range(args.max_epoch):
        net.train()
        total, steps = 0.0, 0
        for batch in data.batches("train"):
            if args.steps and steps == args.steps:
                break
            inputs, labels = to_tensors(batch, data, dev, inputs, labels)
            _, loss = net(inputs, labels)
            net.reset_states(dev)
            total += tensor.to_numpy(loss)[0]
            steps += 1
        val = evaluate(net, data, dev, inputs, labels)
        print(f"Epoch {epoch}: training loss {total / max(steps, 1):.4f}, validation loss {val:.4f} "
              f"({steps} steps)", flush=True)
    if args.sample > 0:
        text = sample(net, data, dev, args.prime, args.sample, rng, args.greedy)
        print(f"Sample ({len(text)} characters): {text!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
