#!/usr/bin/env python3
"""Trains the translation Transformer of model.py with the calls of SINGA's transformer example: the batch
copied into the same input tensors each step (copy_from_numpy), the model called in training mode with
the pad index, model.train() / model.eval() / model.graph(mode=False) per epoch, opt.SGD with momentum
and weight decay, and greedy decoding in evaluation mode.

    python3 train.py                                   # the toy pairs of data.py, 3 epochs
    python3 train.py --dataset pairs.txt --max-epoch 10 --d_model 128 --n_layers 2
    python3 train.py --steps 5 --max-epoch 1           # a few steps

Every --log-every steps it prints the batch's loss and accuracy, after each epoch the test accuracy (the
target tokens predicted from the correct earlier ones) and a greedy translation of one test sentence.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import PairDataset, read_pairs, toy_pairs  # noqa: E402
from model import Transformer  # noqa: E402

from tandem import device, opt, tensor  # noqa: E402


def test_accuracy(net, data, tx_src, tx_tgt, pad):
    """The share of non-<pad> target positions whose most likely token is the right one (teacher forcing)."""
    net.eval()
    correct = total = 0
    for b in range(data.num_batches("test")):
        src, tgt_in, tgt_out = data.get_batch_data(b, "test")
        tx_src.copy_from_numpy(src)
        tx_tgt.copy_from_numpy(tgt_in)
        out, _, _, _ = net(tx_src, tx_tgt)
        pred = np.argmax(tensor.to_numpy(out), -1)
        keep = tgt_out != pad
        correct += int(np.sum((pred == tgt_out) & keep))
        total += int(np.sum(keep))
    return correct / max(total, 1)


def translate(net, data, src_row, dev):
    """Greedy decoding of one source row: the most likely next token until <eos> or the length limit."""
    net.eval()
    src = tensor.from_numpy(src_row[None, :], dev)
    tokens = [1]  # <bos>
    for _ in range(data.tgt_len - 1):
        tgt = np.zeros((1, data.tgt_len), dtype=np.int32)
        tgt[0, :len(tokens)] = tokens
        out, _, _, _ = net(src, tensor.from_numpy(tgt, dev))
        nxt = int(np.argmax(tensor.to_numpy(out)[0, len(tokens) - 1]))
        if nxt == 2:  # <eos>
            break
        tokens.append(nxt)
    return " ".join(data.tgt_vocab[tokens[1:]])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="toy", help="a file of 'source TAB target' lines, or 'toy'")
    p.add_argument("--max-epoch", type=int, default=3, dest="max_epoch")
    p.add_argument("--batch-size", type=int, default=32, dest="batch_size")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--d_model", type=int, default=32)
    p.add_argument("--n_head", type=int, default=2)
    p.add_argument("--dim_feedforward", type=int, default=64)
    p.add_argument("--n_layers", type=int, default=1)
    p.add_argument("--steps", type=int, default=0, help="at most this many training batches per epoch (0: all)")
    p.add_argument("--log-every", type=int, default=5, dest="log_every")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    args = p.parse_args(argv)

    use_gpu = args.device == "cuda" or (args.device == "auto" and device.get_num_gpus() > 0)
    dev = device.create_cuda_gpu() if use_gpu else device.create_cpu_device()
    dev.SetRandSeed(args.seed)
    np.random.seed(args.seed)
    pairs = toy_pairs(seed=args.seed) if args.dataset == "toy" else read_pairs(args.dataset)
    data = PairDataset(pairs, batch_size=args.batch_size, shuffle=True, seed=args.seed)
    pad = data.tgt_vocab["<pad>"]
    print(f"{data.size('train')} training and {data.size('test')} test pairs; vocabularies of "
          f"{len(data.src_vocab)} and {len(data.tgt_vocab)} tokens; lengths {data.src_len} and {data.tgt_len}")

    net = Transformer(len(data.src_vocab), len(data.tgt_vocab), max(data.src_len, data.tgt_len), args.d_model,
                      args.n_head, args.dim_feedforward, args.n_layers)
    net.set_optimizer(opt.SGD(lr=args.lr, momentum=0.9, weight_decay=1e-5))
    tx_src = tensor.Tensor((args.batch_size, data.src_len), dev, tensor.int32,
                           np.zeros((args.batch_size, data.src_len), dtype=np.int32))
    tx_tgt = tensor.Tensor((args.batch_size, data.tgt_len), dev, tensor.int32,
                           np.zeros((args.batch_size, data.tgt_len), dtype=np.int32))
    ty_tgt = tensor.Tensor((args.batch_size, data.tgt_len), dev, tensor.int32,
                           np.zeros((args.batch_size, data.tgt_len), dtype=np.int32))

    for epoch in range(args.max_epoch):
        net.train()
        net.graph(mode=False, sequential=False)
        steps = data.num_batches("train") if not args.steps else min(args.steps, data.num_batches("train"))
        total_loss = total_acc = 0.0
        start = time.time()
        for b in range(steps):
            src, tgt_in, tgt_out = data.get_batch_data(b, "train")
            tx_src.copy_from_numpy(src)
            tx_tgt.copy_from_numpy(tgt_in)
            ty_tgt.copy_from_numpy(tgt_out)
            _, loss, acc = net(tx_src, tx_tgt, ty_tgt, pad)
            batch_loss = tensor.to_numpy(loss)[0]
            total_loss += batch_loss
            total_acc += acc
            if b % args.log_every == 0:
                print(f"epoch {epoch} step {b}: loss {batch_loss:.4f}, accuracy {acc:.3f}", flush=True)
        print(f"epoch {epoch}: mean loss {total_loss / steps:.4f}, mean accuracy {total_acc / steps:.3f}, "
              f"{time.time() - start:.1f} s", flush=True)
        print(f"epoch {epoch}: test accuracy {test_accuracy(net, data, tx_src, tx_tgt, pad):.3f}", flush=True)
    src_row = data.parts["test"][0][0]
    words = " ".join(t for t in data.src_vocab[list(src_row)] if t != "<pad>")
    print(f"translation: {words} -> {translate(net, data, src_row, dev)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
