#!/usr/bin/env python3
"""A model of one's own from tandem's layers: convolutions with batch normalisation, average pooling
and dropout, trained with Adam on Fashion-MNIST, then saved and loaded back.

    python3 model_from_layers.py --epochs 2
    tandem launch -n 2 -- python3 model_from_layers.py     # the same model on 2 ranks
"""
import argparse
import os
import tempfile

import numpy as np

from tandem import data, device, layer, model, opt, tensor


class ConvBlock(layer.Layer):
    """Convolution, batch normalisation, ReLU: a layer made of layers."""

    def __init__(self, out_channels):
        super().__init__()
        self.conv = layer.Conv2d(out_channels, 3, padding=1, bias=False)
        self.bn = layer.BatchNorm2d()
        self.relu = layer.ReLU()

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


class SmallNet(model.Model):
    def __init__(self, num_classes=10):
        super().__init__()
        self.block1 = ConvBlock(16)
        self.pool1 = layer.MaxPool2d(2)
        self.block2 = ConvBlock(32)
        self.pool2 = layer.AvgPool2d(2)
        self.classifier = layer.Sequential(layer.Flatten(), layer.Dropout(0.25), layer.Linear(128), layer.ReLU(),
                                           layer.Linear(num_classes))
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.classifier(self.pool2(self.block2(self.pool1(self.block1(x)))))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def evaluate(net, x, y, dev, batch_size):
    net.eval()
    correct = 0
    for b in range(0, len(x), batch_size):
        out = net(tensor.from_numpy(x[b:b + batch_size], dev))
        correct += int(np.sum(np.argmax(tensor.to_numpy(out), axis=1) == y[b:b + batch_size]))
    return correct / len(x)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--limit-train", type=int, default=12000)
    p.add_argument("--limit-test", type=int, default=2000)
    p.add_argument("--data-dir", default=None)
    args = p.parse_args()

    sgd = opt.DistOpt(opt.Adam(lr=0.002))
    dev = device.create_cuda_gpu_on(sgd.rank_in_local) if device.get_num_gpus() else device.get_default_device()
    dev.SetRandSeed(1)
    train_x, train_y, test_x, test_y = data.load_fashion_mnist(args.data_dir)
    per_rank = args.limit_train // sgd.world_size
    train_x = train_x[sgd.rank_in_global * per_rank:(sgd.rank_in_global + 1) * per_rank]
    train_y = train_y[sgd.rank_in_global * per_rank:(sgd.rank_in_global + 1) * per_rank]
    test_x, test_y = test_x[:args.limit_test], test_y[:args.limit_test]

    net = SmallNet()
    tx = tensor.Tensor((args.batch_size, 1, 28, 28), dev)
    ty = tensor.Tensor((args.batch_size,), dev, tensor.int32)
    net.set_optimizer(sgd)
    net.compile([tx], is_train=True)
    if sgd.rank_in_global == 0:
        print(f"{sum(p.size() for p in net.get_params().values())} parameters:", ", ".join(net.get_params()))

    rng = np.random.RandomState(sgd.rank_in_global)
    for epoch in range(args.epochs):
        net.train()
        idx = rng.permutation(len(train_x))
        total = 0.0
        for b in range(len(idx) // args.batch_size):
            batch = idx[b * args.batch_size:(b + 1) * args.batch_size]
            tx.copy_from_numpy(train_x[batch])
            ty.copy_from_numpy(train_y[batch])
            total += tensor.to_numpy(net(tx, ty)[1])[0]
        sgd.average_buffers()  # every rank evaluates with the same batch-norm statistics
        acc = evaluate(net, test_x, test_y, dev, args.batch_size)
        if sgd.rank_in_global == 0:
            print(f"epoch {epoch}: training loss {total:.3f} (rank 0), evaluation accuracy {acc:.4f}", flush=True)

    if sgd.rank_in_global == 0:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "smallnet.ckpt")
            net.save_states(path, {"epochs": args.epochs, "accuracy": acc})
            fresh = SmallNet()
            fresh.compile([tx], is_train=False)
            aux = fresh.load_states(path)
            print(f"reloaded {aux}: evaluation accuracy {evaluate(fresh, test_x, test_y, dev, args.batch_size):.4f}")


if __name__ == "__main__":
    main()
