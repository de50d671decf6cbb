#!/usr/bin/env python3
"""Trains the MLP GANs of models.py with the calls of SINGA's GAN examples: placeholder tensors filled
each iteration (copy_from_numpy, uniform noise drawn in place), model.compile([noise], is_train=True,
use_graph=False, sequential=True) after set_optimizer, opt.Adam stepped per parameter by the model's
train_one_batch_dis (the discriminator, on real then generated images) and train_one_batch (the
generator), and images generated in evaluation mode.

    python3 train.py --kind vanilla                    # Fashion-MNIST where installed, else synthetic images
    python3 train.py --kind lsgan --d-steps 3 --iterations 2000
    python3 train.py --data synthetic --iterations 20 --interval 5 --out images/

Every --interval iterations it prints the generator's and the discriminator's losses and, with --out,
writes a grid of 25 generated images as a PGM file.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import KINDS, MLPGAN  # noqa: E402

from tandem import data, device, opt, tensor  # noqa: E402

FASHION = "/usr/share/datasets/fashion-mnist"


def synthetic_images(count, seed, size=28):
    """count images of a bright square of side 6 to 12 at a random place on a dark ground, in [0, 1]."""
    rng = np.random.RandomState(seed)
    images = np.zeros((count, size, size), dtype=np.float32)
    for img in images:
        side = rng.randint(6, 13)
        r, c = rng.randint(0, size - side, size=2)
        img[r:r + side, c:c + side] = rng.uniform(0.7, 1.0)
    return images.reshape(count, -1)


def load_images(which, data_dir, seed):
    if which == "synthetic" or (which == "auto" and not os.path.exists(os.path.join(data_dir, "train-images-idx3-ubyte.gz"))):
        return synthetic_images(2000, seed), "synthetic squares"
    x, _ = data.load_dataset("fashion-mnist", data_dir, train=True)
    return x.reshape(x.shape[0], -1).astype(np.float32), "Fashion-MNIST"


def write_grid(images, side, path):
    """A 5 x 5 grid of the first 25 images as an 8-bit PGM."""
    tiles = images[:25].reshape(5, 5, side, side)
    grid = (np.clip(tiles.transpose(0, 2, 1, 3).reshape(5 * side, 5 * side), 0, 1) * 255).astype(np.uint8)
    with open(path, "wb") as f:
        f.write(b"P5 %d %d 255\n" % (grid.shape[1], grid.shape[0]))
        f.write(grid.tobytes())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kind", choices=KINDS, default="vanilla")
    p.add_argument("--data", choices=("auto", "fashion-mnist", "synthetic"), default="auto")
    p.add_argument("--data-dir", default=FASHION)
    p.add_argument("--iterations", type=int, default=500)
    p.add_argument("--interval", type=int, default=100)
    p.add_argument("--batch", type=int, default=64, help="images per discriminator step (real and generated alike)")
    p.add_argument("--noise-size", type=int, default=32)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--d-steps", type=int, default=1, help="discriminator steps per generator step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="a directory for the image grids")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    args = p.parse_args(argv)

    use_gpu = args.device == "cuda" or (args.device == "auto" and device.get_num_gpus() > 0)
    dev = device.create_cuda_gpu_on(0) if use_gpu else device.get_default_device()
    dev.SetRandSeed(args.seed)
    rng = np.random.RandomState(args.seed)
    images, source = load_images(args.data, args.data_dir, args.seed)
    side = int(round(images.shape[1] ** 0.5))
    print(f"{args.kind} GAN on {len(images)} {source} images of {side} x {side}")

    net = MLPGAN(args.kind, args.noise_size, images.shape[1], args.hidden_size)
    noise = tensor.Tensor((args.batch, args.noise_size), dev, tensor.float32)
    real = tensor.Tensor((args.batch, images.shape[1]), dev, tensor.float32)
    real_labels = tensor.Tensor((args.batch, 1), dev, tensor.float32)
    fake_labels = tensor.Tensor((args.batch, 1), dev, tensor.float32)
    gen_targets = tensor.Tensor((args.batch, 1), dev, tensor.float32)
    net.set_optimizer(opt.Adam(lr=args.lr))
    net.compile([noise], is_train=True, use_graph=False, sequential=True)
    real_labels.set_value(1.0)
    fake_labels.set_value(0.0 if args.kind == "vanilla" else -1.0)
    gen_targets.set_value(1.0 if args.kind == "vanilla" else 0.0)
    demo = tensor.Tensor((25, args.noise_size), dev, tensor.float32)
    if args.out:
        os.makedirs(args.out, exist_ok=True)

    for it in range(args.iterations):
        net.train()
        for _ in range(args.d_steps):
            real.copy_from_numpy(images[rng.randint(0, len(images), args.batch)])
            _, d_real = net.train_one_batch_dis(real, real_labels)
            noise.uniform(-1, 1)
            fake = net.forward_gen(noise)
            _, d_fake = net.train_one_batch_dis(fake, fake_labels)
        noise.uniform(-1, 1)
        _, g_loss = net.train_one_batch(noise, gen_targets)
        if it % args.interval == 0 or it == args.iterations - 1:
            net.eval()
            d_loss = tensor.to_numpy(d_real)[0] + tensor.to_numpy(d_fake)[0]
            demo.uniform(-1, 1)
            generated = tensor.to_numpy(net.forward_gen(demo))
            print(f"iteration {it}: G loss {tensor.to_numpy(g_loss)[0]:.4f}, D loss {d_loss:.4f}, generated mean "
                  f"{generated.mean():.4f}", flush=True)
            if args.out:
                write_grid(generated, side, os.path.join(args.out, f"{it}.pgm"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
