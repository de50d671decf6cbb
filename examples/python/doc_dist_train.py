#!/usr/bin/env python3
"""The distributed-training guide's CNN on Fashion-MNIST, in Python.

    tandem launch -n 2 -- python3 doc_dist_train.py                    # 2 processes on one machine
    mpiexec --hostfile host_file -n 2 python3 doc_dist_train.py        # Open MPI: `localhost slots=2`
    python3 doc_dist_multiprocess.py 2                                 # processes started by multiprocessing

Each process trains on its share of the data; DistOpt averages the gradients. Ranks use GPUs when
the machine has them (one per rank), else the CPU.
"""
import argparse
import time

import numpy as np

from tandem import autograd, data, device, distributed, layer, model, opt, tensor


class CNN(model.Model):
    """The guide's CNN: two 5x5 convolutions with ReLU and 2x2 max pooling, then 500 and 10 units."""

    def __init__(self, num_classes=10, num_channels=1):
        super().__init__()
        self.conv1 = layer.Conv2d(num_channels, 20, 5, padding=0, activation="RELU")
        self.conv2 = layer.Conv2d(20, 50, 5, padding=0, activation="RELU")
        self.linear1 = layer.Linear(500)
        self.linear2 = layer.Linear(num_classes)
        self.pooling1 = layer.MaxPool2d(2, 2, padding=0)
        self.pooling2 = layer.MaxPool2d(2, 2, padding=0)
        self.relu = layer.ReLU()
        self.flatten = layer.Flatten()
        self.softmax_cross_entropy = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        y = self.pooling1(self.conv1(x))
        y = self.pooling2(self.conv2(y))
        y = self.relu(self.linear1(self.flatten(y)))
        return self.linear2(y)

    def train_one_batch(self, x, y, dist_option="plain", spars=None):
        out = self.forward(x)
        loss = self.softmax_cross_entropy(out, y)
        if dist_option == "plain":
            self.optimizer(loss)
        elif dist_option == "half":
            self.optimizer.backward_and_update_half(loss)
        elif dist_option == "partialUpdate":
            self.optimizer.backward_and_partial_update(loss)
        elif dist_option == "sparseTopK":
            self.optimizer.backward_and_sparse_update(loss, topK=True, spars=spars)
        elif dist_option == "sparseThreshold":
            self.optimizer.backward_and_sparse_update(loss, topK=False, spars=spars)
        else:
            raise ValueError(f"unknown dist_option {dist_option!r}")
        return out, loss


def data_partition(dataset_x, dataset_y, rank_in_global, world_size):
    """This rank's contiguous share of the samples."""
    per_rank = dataset_x.shape[0] // world_size
    start = rank_in_global * per_rank
    return dataset_x[start:start + per_rank], dataset_y[start:start + per_rank]


def synchronize(t, dist_opt):
    """Averages a tensor across ranks, in place."""
    dist_opt.all_reduce(t.data)
    dist_opt.wait()
    t /= dist_opt.world_size


def reduce_variable(value, dist_opt, reducer):
    """Sums a NumPy value across ranks through a one-element tensor."""
    reducer.copy_from_numpy(value)
    dist_opt.all_reduce(reducer.data)
    dist_opt.wait()
    return tensor.to_numpy(reducer)


def accuracy(pred, target):
    return np.sum(np.argmax(pred, axis=1) == target)


def train_mnist_cnn(local_rank=None, world_size=None, nccl_id=None, max_epoch=10, batch_size=64, lr=0.005,
                    dist_option="plain", spars=0.05, data_dir=None, seed=0, use_gpu=None, limit_train=0,
                    limit_test=0, precision=None, graph=True):
    sgd = opt.SGD(lr=lr, momentum=0.9, weight_decay=1e-5)
    sgd = opt.DistOpt(sgd, nccl_id=nccl_id, local_rank=local_rank, world_size=world_size)
    if use_gpu is None:
        use_gpu = device.get_num_gpus() > 0
    dev = device.create_cuda_gpu_on(sgd.rank_in_local) if use_gpu else device.get_default_device()
    dev.SetRandSeed(seed)
    precision = precision or autograd.default_precision(dev)  # as tandem train: tf32 on GPUs, f32 on CPUs
    rank, world = sgd.rank_in_global, sgd.world_size
    # Ranks started with different settings stop here, each told which setting and which ranks.
    distributed.check_agreement([("batch_size", str(batch_size), True), ("epochs", str(max_epoch), True),
                                 ("dist_option", dist_option, True), ("precision", str(precision), True),
                                 ("limit_train", str(limit_train), True), ("seed", str(seed), False)])

    train_x, train_y, test_x, test_y = data.load_fashion_mnist(data_dir)
    if limit_train:
        train_x, train_y = train_x[:limit_train], train_y[:limit_train]
    if limit_test:
        test_x, test_y = test_x[:limit_test], test_y[:limit_test]
    train_x, train_y = data_partition(train_x, train_y, rank, world)
    test_x, test_y = data_partition(test_x, test_y, rank, world)
    num_train_batch = train_x.shape[0] // batch_size
    num_test_batch = (test_x.shape[0] + batch_size - 1) // batch_size

    net = CNN(num_classes=10, num_channels=train_x.shape[1])
    tx = tensor.Tensor((batch_size, train_x.shape[1], train_x.shape[2], train_x.shape[3]), dev, tensor.float32)
    ty = tensor.Tensor((batch_size,), dev, tensor.int32)
    net.set_optimizer(sgd)
    net.compile([tx], is_train=True, use_graph=graph, sequential=False)  # graph: recorded steps on a GPU
    for p in net.get_params().values():  # the guide's start: every rank holds the average
        synchronize(p, sgd)

    rng = np.random.RandomState(seed + rank)
    idx = np.arange(train_x.shape[0], dtype=np.int32)
    reducer = tensor.Tensor((1,), dev, tensor.float32)
    for epoch in range(max_epoch):
        start = time.time()
        rng.shuffle(idx)
        if rank == 0:
            print(f"Starting Epoch {epoch}:", flush=True)
        train_correct = np.zeros(shape=[1], dtype=np.float32)
        train_loss = np.zeros(shape=[1], dtype=np.float32)
        net.train()
        for b in range(num_train_batch):
            batch = idx[b * batch_size:(b + 1) * batch_size]
            tx.copy_from_numpy(train_x[batch])
            ty.copy_from_numpy(train_y[batch])
            with autograd.precision(precision):  # the math of GPU convolutions and products
                out, loss = net(tx, ty, dist_option, spars)
            train_correct += accuracy(tensor.to_numpy(out), train_y[batch])
            train_loss += tensor.to_numpy(loss)[0]
        train_correct = reduce_variable(train_correct, sgd, reducer)
        train_loss = reduce_variable(train_loss, sgd, reducer)

        if dist_option == "partialUpdate":
            sgd.average_parameters()  # ranks evaluate one model
        else:
            sgd.average_buffers()
        test_correct = np.zeros(shape=[1], dtype=np.float32)
        net.eval()
        for b in range(num_test_batch):
            x, y = test_x[b * batch_size:(b + 1) * batch_size], test_y[b * batch_size:(b + 1) * batch_size]
            with autograd.precision(precision):
                out_test = net(tensor.from_numpy(x, dev))
            test_correct += accuracy(tensor.to_numpy(out_test), y)
        test_correct = reduce_variable(test_correct, sgd, reducer)
        if rank == 0:
            print("Training loss = %f, training accuracy = %f" %
                  (train_loss[0], train_correct[0] / (num_train_batch * batch_size * world)), flush=True)
            print("Evaluation accuracy = %f, Elapsed Time = %fs" %
                  (test_correct[0] / (test_x.shape[0] * world), time.time() - start), flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", "-m", type=int, default=10)
    p.add_argument("--batch-size", "-b", type=int, default=64)
    p.add_argument("--lr", "-l", type=float, default=0.005)
    p.add_argument("--dist-option", "-d", default="plain",
                   choices=["plain", "half", "partialUpdate", "sparseTopK", "sparseThreshold"])
    p.add_argument("--spars", "-s", type=float, default=0.05)
    p.add_argument("--data-dir", default=None, help="Fashion-MNIST directory (default: Debian's dataset-fashion-mnist)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--precision", choices=["f32", "tf32", "bf16", "f16"], default=None,
                   help="math of GPU convolutions and products (default: tf32 on GPUs, f32 on CPUs, whose math "
                        "is always exact f32)")
    p.add_argument("--limit-train", type=int, default=0, help="use the first N training samples only")
    p.add_argument("--limit-test", type=int, default=0, help="use the first N test samples only")
    p.add_argument("--graph", choices=["on", "off"], default="on",
                   help="on a GPU, record the training step once and replay it (compile(use_graph=True))")
    return p.parse_args(argv)


def run(args, **job):
    """Trains with the command line's settings; job adds local_rank, world_size and nccl_id."""
    use_gpu = None if args.device == "auto" else args.device == "cuda"
    train_mnist_cnn(max_epoch=args.epochs, batch_size=args.batch_size, lr=args.lr, dist_option=args.dist_option,
                    spars=args.spars, data_dir=args.data_dir, seed=args.seed, use_gpu=use_gpu,
                    limit_train=args.limit_train, limit_test=args.limit_test, precision=args.precision,
                    graph=args.graph == "on", **job)


if __name__ == "__main__":
    run(parse_args())
