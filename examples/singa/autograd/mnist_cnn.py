#!/usr/bin/env python3
"""The guide's CNN trained with autograd directly: layers called from a plain class, the loss from
autograd.softmax_cross_entropy on one-hot targets, and the optimizer called on the loss.

    python3 mnist_cnn.py                       # one process
    tandem launch -n 2 -- python3 mnist_dist.py -d sparseTopK
    python3 mnist_multiprocess.py 2 -d half

Without a Model there is no recorded step: every step runs eagerly.
"""
import argparse
import time

import numpy as np

from tandem import autograd, data, device, layer, opt, tensor

DIST_OPTIONS = ("plain", "half", "partialUpdate", "sparseTopK", "sparseThreshold")
DTYPES = {"float32": tensor.float32, "float16": tensor.float16}


class CNN:
    """Two 5x5 convolutions with ReLU and 2x2 max pooling, 500 hidden units, 10 classes."""

    def __init__(self, num_channels=1, num_classes=10):
        self.conv1 = layer.Conv2d(num_channels, 20, 5, padding=0)
        self.conv2 = layer.Conv2d(20, 50, 5, padding=0)
        self.fc1 = layer.Linear(4 * 4 * 50, 500)
        self.fc2 = layer.Linear(500, num_classes)
        self.pool1 = layer.MaxPool2d(2, 2, padding=0)
        self.pool2 = layer.MaxPool2d(2, 2, padding=0)
        self.relu1, self.relu2, self.relu3 = layer.ReLU(), layer.ReLU(), layer.ReLU()
        self.flatten = layer.Flatten()

    def forward(self, x):
        x = self.pool1(self.relu1(self.conv1(x)))
        x = self.pool2(self.relu2(self.conv2(x)))
        return self.fc2(self.relu3(self.fc1(self.flatten(x))))


def one_hot(labels, num_classes):
    return np.eye(num_classes, dtype=np.float32)[labels]


def hits(scores, targets):
    """Samples whose highest score is their target's class."""
    return int(np.sum(np.argmax(scores, axis=1) == np.argmax(targets, axis=1)))


def shift_and_flip(x, rng):
    """Each image moved by up to 4 pixels (mirrored borders) and flipped left-right half the time."""
    n, _, h, w = x.shape
    padded = np.pad(x, [(0, 0), (0, 0), (4, 4), (4, 4)], mode="symmetric")
    out = np.empty_like(x)
    for i in range(n):
        dy, dx = rng.randint(0, 9, size=2)
        out[i] = padded[i, :, dy:dy + h, dx:dx + w]
        if rng.randint(2):
            out[i] = out[i, :, :, ::-1]
    return out


def partition(x, y, rank, world_size):
    n = x.shape[0] // world_size
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def synchronize(t, sgd):
    """Averages a tensor over the ranks, in place."""
    sgd.all_reduce(t.data)
    sgd.wait()
    t /= sgd.world_size


def total(value, sgd, reducer):
    """A number summed over the ranks."""
    reducer.copy_from_numpy(np.array([value], dtype=np.float32))
    sgd.all_reduce(reducer.data)
    sgd.wait()
    return float(tensor.to_numpy(reducer)[0])


def step(sgd, loss, dist_option, spars, distributed):
    if not distributed:
        sgd(loss)
    elif dist_option == "plain":
        sgd.backward_and_update(loss, threshold=50000)
    elif dist_option == "half":
        sgd.backward_and_update_half(loss)
    elif dist_option == "partialUpdate":
        sgd.backward_and_partial_update(loss)
    else:
        sgd.backward_and_sparse_update(loss, spars=spars, topK=dist_option == "sparseTopK", corr=True)


def train_mnist_cnn(args, distributed=False, local_rank=None, world_size=None, nccl_id=None):
    """Trains the CNN; distributed: with a DistOpt whose ranks come from the launcher or from nccl_id."""
    b = args.batch_size
    sgd = opt.SGD(lr=args.lr, momentum=0.9, weight_decay=1e-5, dtype=DTYPES[args.precision])
    train_x, train_y, test_x, test_y = data.load_fashion_mnist(args.data_dir)
    num_classes = int(train_y.max()) + 1
    train_y, test_y = one_hot(train_y, num_classes), one_hot(test_y, num_classes)
    rank, world = 0, 1
    if distributed:
        sgd = opt.DistOpt(sgd, nccl_id=nccl_id, local_rank=local_rank, world_size=world_size)
        rank, world = sgd.global_rank, sgd.world_size
        train_x, train_y = partition(train_x, train_y, rank, world)
        test_x, test_y = partition(test_x, test_y, rank, world)
    use_gpu = args.device == "cuda" or (args.device == "auto" and device.get_num_gpus() > 0)
    dev = device.create_cuda_gpu_on(sgd.local_rank if distributed else 0) if use_gpu else device.get_default_device()
    dev.SetRandSeed(args.seed)
    dev.SetVerbosity(args.verbosity)
    rng = np.random.RandomState(args.seed)

    net = CNN(train_x.shape[1], num_classes)
    tx = tensor.Tensor((b,) + train_x.shape[1:], dev, tensor.float32)
    ty = tensor.Tensor((b, num_classes), dev, tensor.int32)
    train_batches, test_batches = train_x.shape[0] // b, test_x.shape[0] // b
    if args.max_steps:
        train_batches, test_batches = min(train_batches, args.max_steps), min(test_batches, args.max_steps)
    # float16 computes in tandem's f16 precision: the inputs and parameters stay float32, GPU convolutions
    # and products take 16-bit copies. Otherwise tandem's default: tf32 on GPUs, f32 on CPUs.
    compute = sgd.precision or autograd.default_precision(dev)

    if distributed:  # every rank starts from the average of the ranks' initial parameters
        autograd.training = True
        tx.copy_from_numpy(rng.standard_normal(tx.shape))
        ty.copy_from_numpy(np.zeros((b, num_classes), dtype=np.int32))
        with autograd.precision(compute):
            loss = autograd.softmax_cross_entropy(net.forward(tx), ty)
        for p, _ in autograd.backward(loss):
            synchronize(p, sgd)
    reducer = tensor.Tensor((1,), dev, tensor.float32)

    order = np.arange(train_x.shape[0])
    for epoch in range(args.max_epoch):
        started = time.time()
        rng.shuffle(order)
        if rank == 0:
            print(f"Starting Epoch {epoch}:", flush=True)
        autograd.training = True
        loss_sum, right = 0.0, 0
        for i in range(train_batches):
            rows = order[i * b:(i + 1) * b]
            tx.copy_from_numpy(shift_and_flip(train_x[rows], rng))
            ty.copy_from_numpy(train_y[rows].astype(np.int32))
            with autograd.precision(compute):
                out = net.forward(tx)
                loss = autograd.softmax_cross_entropy(out, ty)
                right += hits(tensor.to_numpy(out), train_y[rows])
                loss_sum += float(tensor.to_numpy(loss)[0])
                step(sgd, loss, args.dist_option, args.spars, distributed)
        if distributed:
            loss_sum, right = total(loss_sum, sgd, reducer), total(right, sgd, reducer)
            if args.dist_option == "partialUpdate":
                sgd.average_parameters()
        if rank == 0:
            print("Training loss = %f, training accuracy = %f" % (loss_sum, right / (train_batches * b * world)),
                  flush=True)
        autograd.training = False
        right = 0
        for i in range(test_batches):
            tx.copy_from_numpy(test_x[i * b:(i + 1) * b])
            with autograd.precision(compute):
                right += hits(tensor.to_numpy(net.forward(tx)), test_y[i * b:(i + 1) * b])
        if distributed:
            right = total(right, sgd, reducer)
        if rank == 0:
            print("Evaluation accuracy = %f, Elapsed Time = %fs" % (right / (test_batches * b * world),
                                                                    time.time() - started), flush=True)
    dev.PrintTimeProfiling()


def parser(description, distributed):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("-p", choices=list(DTYPES), default="float32", dest="precision",
                   help="dtype of the optimizer (float16: 16-bit training in tandem's f16 precision)")
    p.add_argument("-m", "--max-epoch", type=int, default=10, dest="max_epoch", help="epochs")
    p.add_argument("-b", "--batch-size", type=int, default=64, dest="batch_size", help="batch size (per rank)")
    p.add_argument("-l", "--learning-rate", type=float, default=0.005, dest="lr", help="learning rate")
    p.add_argument("-v", "--log-verbosity", type=int, default=0, dest="verbosity",
                   help="time profiling of the device's operations (1-3), printed at the end")
    if distributed:
        p.add_argument("-d", "--dist-option", choices=DIST_OPTIONS, default="plain", dest="dist_option",
                       help="how the ranks exchange gradients")
        p.add_argument("-s", "--sparsification", type=float, default=0.05, dest="spars",
                       help="sparseTopK: the fraction of gradients sent; sparseThreshold: the magnitude one must reach")
    else:
        p.set_defaults(dist_option="plain", spars=None)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: a GPU per rank where the machine has them, else the CPU")
    p.add_argument("--data-dir", default=None, help="Fashion-MNIST's directory (IDX files, MNIST's format)")
    p.add_argument("--max-steps", type=int, default=0,
                   help="at most this many training steps and evaluation batches per epoch (0: all)")
    p.add_argument("--seed", type=int, default=0, help="seeds the parameters, the shuffling and the augmentation")
    return p


if __name__ == "__main__":
    train_mnist_cnn(parser(__doc__.splitlines()[0], distributed=False).parse_args())
