#!/usr/bin/env python3
"""The guide's multiprocessing launch: `python3 doc_dist_multiprocess.py 2` starts two training
processes on this machine (one per GPU, or CPU ranks over Gloo where there is no GPU). Further
arguments go to the training (see doc_dist_train.py --help)."""
import multiprocessing
import sys

import tandem
from doc_dist_train import parse_args, run

if __name__ == "__main__":
    # The ticket: the processes holding it find each other (the guide's NCCL id).
    nccl_id = tandem.NcclIdHolder()
    if len(sys.argv) < 2 or not sys.argv[1].isdigit() or int(sys.argv[1]) < 1:
        sys.exit(f"usage: {sys.argv[0]} PROCESSES [training options]\n{__doc__}")
    gpu_per_node = int(sys.argv[1])
    args = parse_args(sys.argv[2:])

    process = []
    for gpu_num in range(0, gpu_per_node):
        process.append(multiprocessing.Process(target=run, args=(args,),
                                               kwargs=dict(local_rank=gpu_num, world_size=gpu_per_node,
                                                           nccl_id=nccl_id)))
    for p in process:
        p.start()
    for p in process:
        p.join()
    sys.exit(1 if any(p.exitcode for p in process) else 0)
