"""Writes the mnist.pkl.gz that SINGA's GAN examples read, from Fashion-MNIST's idx files.

    python bench/make_mnist_pkl.py FASHION_MNIST_DIR OUT.pkl.gz

The pickle holds (train, valid, test), each (images float32 [N, 784] in [0, 1], labels int64 [N]):
the first 50,000 training images, the other 10,000, and the 10,000 test images.
"""
import gzip
import pickle
import sys

import numpy as np


def idx(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def main():
    src, out = sys.argv[1], sys.argv[2]
    xtr = idx(f"{src}/train-images-idx3-ubyte.gz", 16).reshape(-1, 784).astype(np.float32) / 255.0
    ytr = idx(f"{src}/train-labels-idx1-ubyte.gz", 8).astype(np.int64)
    xte = idx(f"{src}/t10k-images-idx3-ubyte.gz", 16).reshape(-1, 784).astype(np.float32) / 255.0
    yte = idx(f"{src}/t10k-labels-idx1-ubyte.gz", 8).astype(np.int64)
    sets = ((xtr[:50000], ytr[:50000]), (xtr[50000:], ytr[50000:]), (xte, yte))
    with gzip.open(out, "wb") as f:
        pickle.dump(sets, f, protocol=4)
    print(f"{out}: " + ", ".join(f"{len(s[0])}" for s in sets) + " images")


if __name__ == "__main__":
    main()
