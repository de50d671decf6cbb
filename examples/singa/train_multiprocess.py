#!/usr/bin/env python3
"""Trains an example model on -w processes started here with multiprocessing, joined by a ticket.

    python3 train_multiprocess.py cnn -w 2 -d half

The parent makes the ticket (SINGA's NCCL id holder); each process becomes rank local_rank of
world_size through it, on GPU local_rank where the machine has GPUs, else on the CPU (Gloo).
"""
import multiprocessing
import sys

from tandem import opt, singa_wrap

import train_cnn


def train(args, local_rank, world_size, nccl_id):
    sgd = opt.DistOpt(train_cnn.make_sgd(args), nccl_id=nccl_id, local_rank=local_rank, world_size=world_size)
    train_cnn.run(sgd.global_rank, sgd.world_size, sgd.local_rank, args, sgd)


if __name__ == "__main__":
    cli = train_cnn.parser(__doc__.splitlines()[0], distributed=True, max_epoch=10)
    cli.add_argument("-w", "--world-size", type=int, default=2, dest="world_size", help="processes to start")
    args = cli.parse_args()
    if args.world_size < 1:
        cli.error("--world-size must be at least 1")
    ticket = singa_wrap.NcclIdHolder()
    workers = [multiprocessing.Process(target=train, args=(args, r, args.world_size, ticket))
               for r in range(args.world_size)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    sys.exit(max(abs(w.exitcode or 0) for w in workers))
