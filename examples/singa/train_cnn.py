#!/usr/bin/env python3
"""Trains an example model (cnn, mlp, alexnet, resnet, xceptionnet) on MNIST-shaped images, one process.

    python3 train_cnn.py cnn                      # Fashion-MNIST, 100 epochs, on a GPU where there is one
    python3 train_cnn.py mlp fashion-mnist -m 1 --device cpu
    python3 train_cnn.py resnet mnist --data-dir DIR --max-steps 20

The same run() serves train_mpi.py (ranks from tandem launch or mpiexec) and train_multiprocess.py
(ranks started here with a ticket). Images are padded, cropped and flipped at random for training and
resized to the model's input size (224 for alexnet and resnet, 299 for xceptionnet).
"""
import argparse
import time

import numpy as np

from tandem import data as datasets
from tandem import device, opt, tensor

from model.classifier import DIST_OPTIONS

MODELS = ("cnn", "mlp", "alexnet", "resnet", "xceptionnet")
NP_DTYPES = {"float32": np.float32, "float16": np.float16}
DTYPES = {"float32": tensor.float32, "float16": tensor.float16}


def create_model(name, num_channels, num_classes, data_size):
    """The model called ``name``, for inputs of num_channels channels (or data_size values, mlp)."""
    if name == "mlp":
        from model import mlp
        return mlp.create_model(data_size=data_size, num_classes=num_classes)
    if name == "cnn":
        from model import cnn as module
    elif name == "alexnet":
        from model import alexnet as module
    elif name == "resnet":
        from model import resnet as module
    elif name == "xceptionnet":
        from model import xceptionnet as module
    else:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    return module.create_model(num_channels=num_channels, num_classes=num_classes)


def augment(x, rng):
    """Each image shifted by up to 4 pixels (its borders mirrored) and flipped left-right half the time."""
    n, _, h, w = x.shape
    padded = np.pad(x, [(0, 0), (0, 0), (4, 4), (4, 4)], mode="symmetric")
    out = np.empty_like(x)
    shifts = rng.randint(0, 9, size=(n, 2))
    flips = rng.randint(0, 2, size=n).astype(bool)
    for i, (dy, dx) in enumerate(shifts):
        img = padded[i, :, dy:dy + h, dx:dx + w]
        out[i] = img[:, :, ::-1] if flips[i] else img
    return out


def resize(x, size):
    """Bilinear resize of NCHW images to size x size (pixel centres aligned)."""
    n, c, h, w = x.shape
    if (h, w) == (size, size):
        return x

    def axis(src, dst):
        pos = np.clip((np.arange(dst) + 0.5) * src / dst - 0.5, 0, src - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, src - 1)
        return lo, hi, (pos - lo).astype(np.float32)

    y0, y1, fy = axis(h, size)
    x0, x1, fx = axis(w, size)
    rows = x[:, :, y0, :] * (1 - fy)[:, None] + x[:, :, y1, :] * fy[:, None]
    return (rows[:, :, :, x0] * (1 - fx) + rows[:, :, :, x1] * fx).astype(np.float32)


def shard(x, y, rank, world_size):
    """This rank's contiguous share of the samples (the same size on every rank)."""
    per_rank = x.shape[0] // world_size
    return x[rank * per_rank:(rank + 1) * per_rank], y[rank * per_rank:(rank + 1) * per_rank]


def sum_over_ranks(value, sgd, reducer):
    """A NumPy number summed over the ranks through a one-element tensor."""
    reducer.copy_from_numpy(np.asarray(value, dtype=np.float32).reshape(1))
    sgd.all_reduce(reducer.data)
    sgd.wait()
    return float(tensor.to_numpy(reducer)[0])


def correct(scores, labels):
    return int(np.sum(np.argmax(scores, axis=1) == labels))


def pick_device(args, local_rank):
    """The GPU of this rank (or -i's) when asked for or present, else the CPU."""
    use_gpu = args.device == "cuda" or (args.device == "auto" and device.get_num_gpus() > 0)
    if not use_gpu:
        return device.get_default_device()
    return device.create_cuda_gpu_on(local_rank if local_rank is not None else args.device_id)


def run(global_rank, world_size, local_rank, args, sgd):
    """Trains args.model on args.data with sgd (an SGD, or a DistOpt whose ranks split the data)."""
    distributed = isinstance(sgd, opt.DistOpt)
    dev = pick_device(args, local_rank if distributed else None)
    dev.SetRandSeed(args.seed)
    rng = np.random.RandomState(args.seed)

    train_x, train_y = datasets.load_dataset(args.data, args.data_dir, True)
    val_x, val_y = datasets.load_dataset(args.data, args.data_dir, False)
    num_channels, image_size = train_x.shape[1], train_x.shape[2]
    data_size = int(np.prod(train_x.shape[1:]))
    num_classes = int(train_y.max()) + 1
    net = create_model(args.model, num_channels, num_classes, data_size)
    if distributed:
        train_x, train_y = shard(train_x, train_y, global_rank, world_size)
        val_x, val_y = shard(val_x, val_y, global_rank, world_size)

    b = args.batch_size
    if net.dimension == 4:
        tx = tensor.Tensor((b, num_channels, net.input_size, net.input_size), dev, DTYPES[args.precision])
    else:
        tx = tensor.Tensor((b, data_size), dev, DTYPES[args.precision])
        train_x, val_x = train_x.reshape(len(train_x), -1), val_x.reshape(len(val_x), -1)
    ty = tensor.Tensor((b,), dev, tensor.int32)
    train_batches = train_x.shape[0] // b
    val_batches = val_x.shape[0] // b
    if args.max_steps:
        train_batches, val_batches = min(train_batches, args.max_steps), min(val_batches, args.max_steps)
    if train_batches == 0 or val_batches == 0:
        raise SystemExit(f"batch size {b} is larger than this rank's {train_x.shape[0]} training or "
                         f"{val_x.shape[0]} evaluation samples")

    net.set_optimizer(sgd)
    # Ranks of a job run their steps in a fixed order (SINGA's sequential graph).
    net.compile([tx], is_train=True, use_graph=args.graph, sequential=distributed)
    dev.SetVerbosity(args.verbosity)
    reducer = tensor.Tensor((1,), dev, tensor.float32)

    def batch(x, rows, training):
        x = x[rows]
        if net.dimension == 4:
            if training:
                x = augment(x, rng)
            x = resize(x, net.input_size)
        return x.astype(NP_DTYPES[args.precision])

    order = np.arange(train_x.shape[0])
    for epoch in range(args.max_epoch):
        started = time.time()
        rng.shuffle(order)
        if global_rank == 0:
            print(f"Starting Epoch {epoch}:", flush=True)
        net.train()
        loss_sum, hits = 0.0, 0
        for i in range(train_batches):
            rows = order[i * b:(i + 1) * b]
            tx.copy_from_numpy(batch(train_x, rows, True))
            ty.copy_from_numpy(train_y[rows])
            scores, loss = net(tx, ty, args.dist_option, args.spars)
            loss_sum += float(tensor.to_numpy(loss)[0])
            hits += correct(tensor.to_numpy(scores), train_y[rows])
        if distributed:
            loss_sum, hits = sum_over_ranks(loss_sum, sgd, reducer), sum_over_ranks(hits, sgd, reducer)
            if args.dist_option == "partialUpdate":
                sgd.average_parameters()  # the ranks' models drift apart between partial averages
        if global_rank == 0:
            print("Training loss = %f, training accuracy = %f" % (loss_sum, hits / (train_batches * b * world_size)),
                  flush=True)

        net.eval()
        val_hits = 0
        for i in range(val_batches):
            rows = np.arange(i * b, (i + 1) * b)
            tx.copy_from_numpy(batch(val_x, rows, False))
            val_hits += correct(tensor.to_numpy(net(tx)), val_y[rows])
        if distributed:
            val_hits = sum_over_ranks(val_hits, sgd, reducer)
        if global_rank == 0:
            print("Evaluation accuracy = %f, Elapsed Time = %fs" % (val_hits / (val_batches * b * world_size),
                                                                    time.time() - started), flush=True)
    dev.PrintTimeProfiling()


def parser(description, models=MODELS, distributed=False, max_epoch=100):
    """The command line of the trainers: SINGA's flags and a few of tandem's."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("model", nargs="?", choices=models, default="cnn")
    p.add_argument("data", nargs="?", choices=datasets.dataset_names(), default="fashion-mnist",
                   help="data set in its standard files: mnist and fashion-mnist are IDX files (MNIST's format), "
                        "cifar10 the binary batches (default: fashion-mnist)")
    p.add_argument("-p", choices=list(DTYPES), default="float32", dest="precision",
                   help="dtype of the inputs and of the optimizer (float16: 16-bit training)")
    p.add_argument("-m", "--max-epoch", type=int, default=max_epoch, dest="max_epoch", help="epochs")
    p.add_argument("-b", "--batch-size", type=int, default=64, dest="batch_size", help="batch size (per rank)")
    p.add_argument("-l", "--learning-rate", type=float, default=0.005, dest="lr", help="learning rate")
    p.add_argument("-i", "--device-id", type=int, default=0, dest="device_id", help="the GPU of a one-process run")
    p.add_argument("-g", "--disable-graph", action="store_false", dest="graph",
                   help="run every step eagerly (by default a GPU records the training step once and replays it)")
    p.add_argument("-v", "--log-verbosity", type=int, default=0, dest="verbosity",
                   help="time profiling of the device's operations (1-3), printed at the end")
    if distributed:
        p.add_argument("-d", "--dist-option", choices=DIST_OPTIONS, default="plain", dest="dist_option",
                       help="how the ranks exchange gradients")
        p.add_argument("-s", "--sparsification", type=float, default=0.05, dest="spars",
                       help="sparseTopK: the fraction of gradients sent; sparseThreshold: the magnitude one must reach")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: a GPU per rank where the machine has them, else the CPU")
    p.add_argument("--data-dir", default=None, help="directory of the data set's files (default: its system directory)")
    p.add_argument("--max-steps", type=int, default=0,
                   help="at most this many training steps and evaluation batches per epoch (0: all)")
    p.add_argument("--seed", type=int, default=0, help="seeds the parameters, the shuffling and the augmentation")
    return p


def make_sgd(args):
    """SINGA's trainers' optimizer."""
    return opt.SGD(lr=args.lr, momentum=0.9, weight_decay=1e-5, dtype=DTYPES[args.precision])


if __name__ == "__main__":
    cli = parser(__doc__.splitlines()[0])
    cli.set_defaults(dist_option="plain", spars=None)
    a = cli.parse_args()
    run(0, 1, None, a, make_sgd(a))
