#!/usr/bin/env python3
"""mnist_cnn.py's training on the ranks of a job started by a launcher.

    tandem launch -n 2 -- python3 mnist_dist.py -d sparseThreshold -s 0.01
    mpiexec -n 2 python3 mnist_dist.py                  # Open MPI as root: --allow-run-as-root
"""
from mnist_cnn import parser, train_mnist_cnn

if __name__ == "__main__":
    train_mnist_cnn(parser(__doc__.splitlines()[0], distributed=True).parse_args(), distributed=True)
