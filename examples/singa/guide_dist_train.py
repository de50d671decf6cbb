#!/usr/bin/env python3
"""The distributed-training guide's code, step by step as the guide shows it, in one script (the
import changed to tandem). The guide leaves out, as "...", the loading of the data and the
hyper-parameters; they are filled in below, and the reporting of each epoch prints what the guide's
output shows.

    tandem launch -n 2 -- python3 guide_dist_train.py               # MPI-style launch, one machine
    mpiexec -n 2 python3 guide_dist_train.py                        # Open MPI as root: --allow-run-as-root
    python3 guide_dist_train.py --multiprocess 2                    # the guide's multiprocessing launch

-d picks the guide's call of each optimisation (plain: backward_and_update, half, partialUpdate,
sparseTopK, sparseThreshold); --max-steps stops each epoch early. Ranks use GPU rank_in_local where
the machine has GPUs, else the CPU.
"""
import argparse
import multiprocessing
import sys

import numpy as np

from tandem import singa_wrap as singa
from tandem import autograd, data, device, opt, tensor

# The hyper-parameters of the guide's example (its "...").
max_epoch = 10
batch_size = 64
IMG_SIZE = 28
num_classes = 10
ARGS = None  # the command line, below


# 1. Define the neural network model
class CNN:
    def __init__(self):
        self.conv1 = autograd.Conv2d(1, 20, 5, padding=0)
        self.conv2 = autograd.Conv2d(20, 50, 5, padding=0)
        self.linear1 = autograd.Linear(4 * 4 * 50, 500)
        self.linear2 = autograd.Linear(500, 10)
        self.pooling1 = autograd.MaxPool2d(2, 2, padding=0)
        self.pooling2 = autograd.MaxPool2d(2, 2, padding=0)

    def forward(self, x):
        y = self.conv1(x)
        y = autograd.relu(y)
        y = self.pooling1(y)
        y = self.conv2(y)
        y = autograd.relu(y)
        y = self.pooling2(y)
        y = autograd.flatten(y)
        y = self.linear1(y)
        y = autograd.relu(y)
        y = self.linear2(y)
        return y


# 3. Load and partition the training/validation data
def data_partition(dataset_x, dataset_y, rank_in_global, world_size):
    data_per_rank = dataset_x.shape[0] // world_size
    idx_start = rank_in_global * data_per_rank
    idx_end = (rank_in_global + 1) * data_per_rank
    return dataset_x[idx_start:idx_end], dataset_y[idx_start:idx_end]


def load_dataset():
    """Fashion-MNIST (MNIST's file format), images scaled to [0, 1] and labels one-hot, as the
    guide's targets ``ty`` of shape (batch_size, num_classes) take them."""
    train_x, train_y, test_x, test_y = data.load_fashion_mnist(ARGS.data_dir)
    eye = np.eye(num_classes, dtype=np.int32)
    return train_x, eye[train_y], test_x, eye[test_y]


# 4. Initialize and synchronize the model parameters among all workers
def synchronize(tensor, dist_opt):
    dist_opt.all_reduce(tensor.data)
    tensor /= dist_opt.world_size


# 5. Run BackPropagation and distributed SGD, with the optimisation the command line picks
def backward_and_update(sgd, loss):
    option = ARGS.dist_option
    if option == "plain":
        sgd.backward_and_update(loss)
    elif option == "half":
        sgd.backward_and_update_half(loss)
    elif option == "partialUpdate":
        sgd.backward_and_partial_update(loss)
    elif option == "sparseTopK":
        sgd.backward_and_sparse_update(loss = loss, spars = ARGS.spars, topK = True)  # noqa: E251 (the guide's)
    else:
        sgd.backward_and_sparse_update(loss = loss, spars = ARGS.spars, topK = False)  # noqa: E251


def accuracy(pred, target):
    return int(np.sum(np.argmax(pred, axis=1) == np.argmax(target, axis=1)))


def total(value, sgd, reducer):
    reducer.copy_from_numpy(np.array([value], dtype=np.float32))
    sgd.all_reduce(reducer.data)
    sgd.wait()
    return float(tensor.to_numpy(reducer)[0])


def train_mnist_cnn(nccl_id=None, gpu_num=None, gpu_per_node=None):
    # create model
    model = CNN()

    # 2. Create the DistOpt instance
    sgd = opt.SGD(lr=0.005, momentum=0.9, weight_decay=1e-5)
    if nccl_id is None:
        sgd = opt.DistOpt(sgd)
    else:  # the multiprocessing launch
        sgd = opt.DistOpt(sgd, nccl_id=nccl_id, gpu_num=gpu_num, gpu_per_node=gpu_per_node)
    if device.get_num_gpus() > 0 and ARGS.device != "cpu":
        dev = device.create_cuda_gpu_on(sgd.rank_in_local)
    else:  # a machine without GPUs: CPU ranks
        dev = device.get_default_device()

    # 3.
    train_x, train_y, test_x, test_y = load_dataset()
    train_x, train_y = data_partition(train_x, train_y,
                                      sgd.rank_in_global, sgd.world_size)
    test_x, test_y = data_partition(test_x, test_y,
                                    sgd.rank_in_global, sgd.world_size)

    # 4. Synchronize the initial parameter
    tx = tensor.Tensor((batch_size, 1, IMG_SIZE, IMG_SIZE), dev, tensor.float32)
    ty = tensor.Tensor((batch_size, num_classes), dev, tensor.int32)
    num_train_batch = train_x.shape[0] // batch_size
    num_test_batch = test_x.shape[0] // batch_size
    if ARGS.max_steps:
        num_train_batch = min(num_train_batch, ARGS.max_steps)
        num_test_batch = min(num_test_batch, ARGS.max_steps)
    idx = np.arange(train_x.shape[0], dtype=np.int32)
    autograd.training = True
    tx.copy_from_numpy(train_x[:batch_size])
    ty.copy_from_numpy(train_y[:batch_size])
    out = model.forward(tx)
    loss = autograd.softmax_cross_entropy(out, ty)
    for p, g in autograd.backward(loss):
        synchronize(p, sgd)

    # 5.
    reducer = tensor.Tensor((1,), dev, tensor.float32)
    for epoch in range(ARGS.max_epoch):
        np.random.shuffle(idx)
        if sgd.rank_in_global == 0:
            print("Starting Epoch %d:" % epoch, flush=True)
        autograd.training = True
        train_loss, train_correct = 0.0, 0
        for b in range(num_train_batch):
            x = train_x[idx[b * batch_size: (b + 1) * batch_size]]
            y = train_y[idx[b * batch_size: (b + 1) * batch_size]]
            tx.copy_from_numpy(x)
            ty.copy_from_numpy(y)
            out = model.forward(tx)
            loss = autograd.softmax_cross_entropy(out, ty)
            train_loss += float(tensor.to_numpy(loss)[0])
            train_correct += accuracy(tensor.to_numpy(out), y)
            # do backpropagation and all-reduce
            backward_and_update(sgd, loss)
        if ARGS.dist_option == "partialUpdate":
            sgd.average_parameters()  # one model to evaluate
        train_loss, train_correct = total(train_loss, sgd, reducer), total(train_correct, sgd, reducer)

        autograd.training = False
        test_correct = 0
        for b in range(num_test_batch):
            tx.copy_from_numpy(test_x[b * batch_size: (b + 1) * batch_size])
            test_correct += accuracy(tensor.to_numpy(model.forward(tx)), test_y[b * batch_size: (b + 1) * batch_size])
        test_correct = total(test_correct, sgd, reducer)
        if sgd.rank_in_global == 0:
            seen = sgd.world_size * batch_size
            print("Training loss = %f, training accuracy = %f" % (train_loss, train_correct / (num_train_batch * seen)),
                  flush=True)
            print("Evaluation accuracy = %f" % (test_correct / (num_test_batch * seen)), flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(description="The distributed-training guide's CNN on Fashion-MNIST.")
    p.add_argument("-d", "--dist-option", default="plain",
                   choices=["plain", "half", "partialUpdate", "sparseTopK", "sparseThreshold"])
    p.add_argument("-s", "--spars", type=float, default=0.05,
                   help="sparseTopK: the fraction of gradients sent; sparseThreshold: the magnitude one must reach")
    p.add_argument("-m", "--max-epoch", type=int, default=max_epoch, dest="max_epoch")
    p.add_argument("--max-steps", type=int, default=0, help="at most this many steps and test batches per epoch")
    p.add_argument("--device", choices=["auto", "cpu"], default="auto", help="cpu: CPU ranks even beside GPUs")
    p.add_argument("--data-dir", default=None, help="Fashion-MNIST's directory (default: the system's)")
    p.add_argument("--multiprocess", type=int, default=0, metavar="N",
                   help="start N processes here with multiprocessing and the guide's ticket")
    return p.parse_args(argv)


def _train_in_process(argv, nccl_id, gpu_num, gpu_per_node):
    global ARGS
    ARGS = parse_args(argv)
    train_mnist_cnn(nccl_id, gpu_num, gpu_per_node)


if __name__ == '__main__':
    ARGS = parse_args(sys.argv[1:])
    if not ARGS.multiprocess:
        train_mnist_cnn()
    else:
        # Generate a NCCL ID to be used for collective communication
        nccl_id = singa.NcclIdHolder()

        # Define the number of GPUs to be used in the training process
        gpu_per_node = ARGS.multiprocess

        # Define and launch the multi-processing
        process = []
        for gpu_num in range(0, gpu_per_node):
            process.append(multiprocessing.Process(target=_train_in_process,
                                                   args=(sys.argv[1:], nccl_id, gpu_num, gpu_per_node)))

        for p in process:
            p.start()
        for p in process:
            p.join()
        sys.exit(max(abs(p.exitcode or 0) for p in process))
