"""GPT-2 124M data-parallel in PyTorch: the model of gpt2_peer.py (imported from --peer-dir) wrapped in
DistributedDataParallel, one process per GPU under torchrun, the same step (bf16 autocast, fused AdamW,
clipping to norm 1, optionally torch.compile) on random tokens, batch --batch per GPU. Rank 0 prints
RESULT {json} with the tokens per second of all GPUs together.
  python3 -m torch.distributed.run --standalone --nproc_per_node=2 bench/gpt2_ddp_peer.py \\
      --peer-dir .data/peer --batch 32 [--compile]"""
import argparse
import importlib.util
import json
import os
import time

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--peer-dir", required=True, help="the folder holding gpt2_peer.py")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--compile", action="store_true")
    a = p.parse_args()
    spec = importlib.util.spec_from_file_location("gpt2_peer", os.path.join(a.peer_dir, "gpt2_peer.py"))
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device("cuda", local)
    torch.manual_seed(0)
    m = peer.GPT(seq=a.seq).to(dev)
    nparams = sum(t.numel() for t in m.parameters())
    ddp = torch.nn.parallel.DistributedDataParallel(m, device_ids=[local])
    opt = torch.optim.AdamW(m.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    run = torch.compile(ddp) if a.compile else ddp
    g = torch.Generator(device=dev).manual_seed(rank)
    x = torch.randint(0, 50257, (a.batch, a.seq), device=dev, generator=g)
    y = torch.randint(0, 50257, (a.batch, a.seq), device=dev, generator=g)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = run(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    t = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t) / a.steps
    if rank == 0:
        tok = world * a.batch * a.seq / dt
        print("RESULT " + json.dumps({"system": "pytorch-ddp", "torch": torch.__version__, "compile": a.compile,
              "world": world, "params": nparams, "batch_per_gpu": a.batch, "seq": a.seq,
              "ms_per_step": round(dt * 1e3, 2), "tokens_per_s": round(tok), "loss": round(loss.item(), 3)}),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
