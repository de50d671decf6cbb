#!/usr/bin/env python3
"""Trains an example model on the ranks of a job started by a launcher, each rank on its share of the data.

    tandem launch -n 2 -- python3 train_mpi.py cnn -d sparseTopK -s 0.05
    mpiexec -n 2 python3 train_mpi.py mlp fashion-mnist -m 1      # Open MPI as root: --allow-run-as-root

Ranks use one GPU each (cuda:local_rank) where the machine has them, else the CPU (Gloo).
"""
from tandem import opt

import train_cnn

if __name__ == "__main__":
    args = train_cnn.parser(__doc__.splitlines()[0], distributed=True, max_epoch=10).parse_args()
    sgd = opt.DistOpt(train_cnn.make_sgd(args))  # the ranks come from the launcher's environment
    train_cnn.run(sgd.global_rank, sgd.world_size, sgd.local_rank, args, sgd)
