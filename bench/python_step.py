#!/usr/bin/env python3
"""Training-step time of the guide's CNN written in Python, measured as `tandem bench train` measures
the C++ one: synthetic data (the same values), SGD in DistOpt, warm-up steps, then timed steps.
Prints RESULT {json} with ms_per_step. Runs under `tandem launch` too (rank 0 reports)."""
import argparse
import json
import pathlib
import sys
import time

import numpy as np

from tandem import _tandem, autograd, device, opt, tensor

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples" / "python"))
from doc_dist_train import CNN  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("-b", "--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: the cores' share of this rank)")
    p.add_argument("--precision", default=None, help="f32, tf32, bf16 or f16 (default: tf32 on CUDA, f32 on the CPU)")
    p.add_argument("--cuda-graph", choices=["on", "off"], default="on",
                   help="record the step once and replay it on a GPU (compile(use_graph=True)), as the CLI does")
    args = p.parse_args()

    sgd = opt.DistOpt(opt.SGD(lr=0.005, momentum=0.9, weight_decay=1e-5))
    if args.threads:
        device.set_num_threads(args.threads)
    dev = device.create_cuda_gpu_on(sgd.rank_in_local) if args.device == "cuda" else device.get_default_device()
    # The synthetic batch of `tandem bench train`: normal images and uniform labels from seed 1234 + rank.
    gen = _tandem.Generator(1234 + sgd.rank_in_global)
    tx = _tandem.random([args.batch_size, 1, 28, 28], True, 0.0, 1.0, gen, dev)
    labels = [gen.next_below(10) for _ in range(args.batch_size)]
    ty = tensor.from_numpy(np.array(labels, dtype=np.int32), dev)

    precision_name = args.precision or autograd.default_precision(dev).name  # as tandem bench train
    precision = autograd.precision(precision_name)
    net = CNN()
    net.set_optimizer(sgd)
    net.compile([tx], is_train=True, use_graph=args.cuda_graph == "on")

    def step():
        with precision:
            net(tx, ty)

    before = sum(np.abs(p.to_numpy()).sum() for p in net.get_params().values())
    for _ in range(args.warmup):
        step()
    comm = sgd.communicator(dev)
    dev.synchronize()
    comm.barrier()
    sgd.reset_stats()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    dev.synchronize()
    comm.barrier()
    dt = time.perf_counter() - t0
    after = sum(np.abs(p.to_numpy()).sum() for p in net.get_params().values())
    if not np.isfinite(after) or after == before:
        raise RuntimeError("benchmark steps did not change the parameters: the measurement would be meaningless")
    if sgd.rank_in_global == 0:
        print("RESULT " + json.dumps({
            "system": "tandem-python", "model": "cnn", "device": str(dev), "world": sgd.world_size,
            "batch_per_rank": args.batch_size, "steps": args.steps, "threads": device.num_threads(),
            "precision": precision_name, "cuda_graph": net.replays > 0,
            "images_per_s": round(args.batch_size * sgd.world_size * args.steps / dt),
            "ms_per_step": dt / args.steps * 1e3, "params_changed": True}), flush=True)


if __name__ == "__main__":
    main()
