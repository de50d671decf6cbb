#!/usr/bin/env python3
"""PyTorch's peer of tandem_ops_bench: the same ops at the same shapes, forward and forward + backward, timed
the same way. On the GPU: GPT-2 (124M) shapes (batch 16, 1024 positions, 12 heads of 64, width 768,
vocabulary 50257, bf16), CUDA events around the timed iterations on the current stream, after three untimed
ones; attention is F.scaled_dot_product_attention with the flash kernel (causal). With --device cpu: batch 4,
256 positions, 4 heads of 32, width 128, vocabulary 256, f32, on --threads threads (2), wall time, the median
of --repeats rounds; attention is F.scaled_dot_product_attention where this PyTorch has it (2.0 and later),
else the same computation written out (matmul, causal mask, softmax, matmul). Layer norm is F.layer_norm;
softmax torch.softmax; the loss F.cross_entropy. One line per op: "<op> <ms> ms".

    python3 bench/ops_peer.py [--device cuda|cpu] [--iters N] [--dtype bf16|f16|f32] [--threads N]
                              [--repeats N] [--ops attention,layer_norm,softmax,cross_entropy]
"""
import argparse
import contextlib
import math
import sys
import time

import torch
import torch.nn.functional as F


def time_ms(f, iters):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        f()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / iters


def cpu_time_ms(f, iters, repeats):
    for _ in range(3):
        f()
    rounds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            f()
        rounds.append((time.perf_counter() - t0) * 1000.0 / iters)
    return sorted(rounds)[len(rounds) // 2]


def attention(q, k, v):
    """Causal attention: F.scaled_dot_product_attention where present, else written out."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.shape[-2]
    s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    return torch.matmul(torch.softmax(s.masked_fill(mask, float("-inf")), -1), v)


def flash_only():
    """Restricts F.scaled_dot_product_attention to the flash kernel where this PyTorch can say so."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    except ImportError:
        pass
    if hasattr(torch.backends.cuda, "sdp_kernel"):
        return torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False, enable_mem_efficient=False)
    return contextlib.nullcontext()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--dtype", choices=["bf16", "f16", "f32"], help="default: bf16 on the GPU, f32 on the CPU")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (--device cpu)")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds, the median reported (--device cpu)")
    ap.add_argument("--ops", default="attention,layer_norm,softmax,cross_entropy")
    a = ap.parse_args()
    cpu = a.device == "cpu"
    if not cpu and not torch.cuda.is_available():
        print("ops_peer: no CUDA GPU: skipped (--device cpu times the CPU)")
        return 0
    dtype = a.dtype or ("f32" if cpu else "bf16")
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dtype]
    dev = a.device
    if cpu:
        torch.set_num_threads(a.threads)
        timer = lambda f, iters: cpu_time_ms(f, iters, a.repeats)  # noqa: E731
        B, T, H, D, C, V = 4, 256, 4, 32, 128, 256
    else:
        timer = time_ms
        B, T, H, D, C, V = 16, 1024, 12, 64, 768, 50257
    ops = set(a.ops.split(","))
    torch.manual_seed(1)

    def leaf(*shape, lo=-1.0, hi=1.0):
        return (torch.rand(*shape, device=dev) * (hi - lo) + lo).to(dt).requires_grad_()

    def row(name, ms):
        print(f"{name:<26} {ms:9.3f} ms")

    threads = f", {a.threads} threads" if cpu else ""
    print(f"# pytorch {torch.__version__}, {dev}, {dtype}{threads}, B={B} T={T} H={H} d={D} C={C} V={V}")
    if "attention" in ops:
        q, k, v = leaf(B, H, T, D), leaf(B, H, T, D), leaf(B, H, T, D)
        dout = torch.rand(B, H, T, D, device=dev).to(dt) * 2 - 1
        with (contextlib.nullcontext() if cpu else flash_only()):
            with torch.no_grad():
                row("attention_fwd", timer(lambda: attention(q, k, v), a.iters))

            def fwd_bwd():
                q.grad = k.grad = v.grad = None
                attention(q, k, v).backward(dout)

            row("attention_fwd_bwd", timer(fwd_bwd, a.iters))
    if "layer_norm" in ops:
        x, w, b = leaf(B * T, C), leaf(C, lo=0.5, hi=1.5), leaf(C)
        dy = torch.rand(B * T, C, device=dev).to(dt) * 2 - 1
        with torch.no_grad():
            row("layer_norm_fwd", timer(lambda: F.layer_norm(x, (C,), w, b), a.iters))

        def fwd_bwd():
            x.grad = w.grad = b.grad = None
            F.layer_norm(x, (C,), w, b).backward(dy)

        row("layer_norm_fwd_bwd", timer(fwd_bwd, a.iters))
    if "softmax" in ops:
        x = leaf(B * H * T, T, lo=-4, hi=4)
        dy = torch.rand(B * H * T, T, device=dev).to(dt) * 2 - 1
        with torch.no_grad():
            row("softmax_fwd", timer(lambda: torch.softmax(x, -1), a.iters))

        def fwd_bwd():
            x.grad = None
            torch.softmax(x, -1).backward(dy)

        row("softmax_fwd_bwd", timer(fwd_bwd, a.iters))
    if "cross_entropy" in ops:
        logits = leaf(B * T, V, lo=-4, hi=4)
        targets = torch.randint(0, V, (B * T,), device=dev)
        with torch.no_grad():
            row("cross_entropy_fwd", timer(lambda: F.cross_entropy(logits, targets), a.iters))

        def fwd_bwd():
            logits.grad = None
            F.cross_entropy(logits, targets).backward()

        row("cross_entropy_fwd_bwd", timer(fwd_bwd, a.iters))
    return 0


if __name__ == "__main__":
    sys.exit(main())
