"""The PyTorch peer's training step under a profiler: warm-up, then --steps steps between
cudaProfilerStart and cudaProfilerStop (for ncu --profile-from-start off). One process, the same
models and settings as the peer benchmark pytorch_ddp.py, whose path --peer names.

  python3 bench/peer_profile.py --peer ../shared/bench/pytorch_ddp.py --model resnet50 --batch 256 --bf16
"""
import argparse
import importlib.util

import torch
import torch.nn.functional as F


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--peer", required=True, help="path of pytorch_ddp.py (its CNN class is reused)")
    p.add_argument("--model", default="cnn", choices=["cnn", "resnet50"])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--no-tf32", action="store_true")
    p.add_argument("--memory", action="store_true", help="print torch.cuda.max_memory_allocated of the timed steps")
    a = p.parse_args()
    spec = importlib.util.spec_from_file_location("peer", a.peer)
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    dev = torch.device("cuda", 0)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = not a.no_tf32
    if a.model == "cnn":
        model, shape, classes = peer.CNN(), (1, 28, 28), 10
    else:
        import torchvision
        model, shape, classes = torchvision.models.resnet50(), (3, 224, 224), 1000
    fmt = torch.channels_last if (a.bf16 or a.channels_last) else torch.contiguous_format
    model = model.to(dev, memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.005, momentum=0.9, weight_decay=1e-5)
    x = torch.randn(a.batch, *shape, device=dev).to(memory_format=fmt)
    y = torch.randint(0, classes, (a.batch,), device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.bf16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.cudart().cudaProfilerStart()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    if a.memory:
        print(f"PEAK_MEMORY_MIB {torch.cuda.max_memory_allocated() / 1048576:.0f}", flush=True)


if __name__ == "__main__":
    main()
