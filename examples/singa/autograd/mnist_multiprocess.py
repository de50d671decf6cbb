#!/usr/bin/env python3
"""mnist_cnn.py's training on N processes started here, joined by a ticket: python3 mnist_multiprocess.py N
[options of mnist_dist.py]."""
import multiprocessing
import sys

from tandem import singa_wrap

from mnist_cnn import parser, train_mnist_cnn

if __name__ == "__main__":
    cli = parser(__doc__.splitlines()[0], distributed=True)
    cli.add_argument("world_size", type=int, help="processes to start (one per GPU where there are GPUs)")
    args = cli.parse_args()
    if args.world_size < 1:
        cli.error("world_size must be at least 1")
    ticket = singa_wrap.NcclIdHolder()  # the processes holding it form one job
    procs = [multiprocessing.Process(target=train_mnist_cnn, args=(args, True, r, args.world_size, ticket))
             for r in range(args.world_size)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    sys.exit(max(abs(p.exitcode or 0) for p in procs))
