#!/usr/bin/env python3
"""PyTorch's peer of tandem_ops_bench: the same ops at the same GPT-2 (124M) shapes (batch 16, 1024
positions, 12 heads of 64, width 768, vocabulary 50257, bf16), forward and forward + backward, timed the
same way (CUDA events around the timed iterations on the current stream, after three untimed ones).
Attention is F.scaled_dot_product_attention with the flash kernel (causal); layer norm F.layer_norm; softmax
torch.softmax; the loss F.cross_entropy on bf16 logits. One line per op: "<op> <ms> ms".

    python3 bench/ops_peer.py [--iters N] [--dtype bf16|f16] [--ops attention,layer_norm,softmax,cross_entropy]
"""
import argparse
import contextlib
import sys

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
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--ops", default="attention,layer_norm,softmax,cross_entropy")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("ops_peer: no CUDA GPU: skipped")
        return 0
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    dev = "cuda"
    B, T, H, D, C, V = 16, 1024, 12, 64, 768, 50257
    ops = set(a.ops.split(","))
    torch.manual_seed(1)

    def leaf(*shape, lo=-1.0, hi=1.0):
        return (torch.rand(*shape, device=dev) * (hi - lo) + lo).to(dt).requires_grad_()

    def row(name, ms):
        print(f"{name:<26} {ms:9.3f} ms")

    print(f"# pytorch {torch.__version__}, {a.dtype}, B={B} T={T} H={H} d={D} C={C} V={V}")
    if "attention" in ops:
        q, k, v = leaf(B, H, T, D), leaf(B, H, T, D), leaf(B, H, T, D)
        dout = torch.rand(B, H, T, D, device=dev).to(dt) * 2 - 1
        with flash_only():
            with torch.no_grad():
                row("attention_fwd", time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), a.iters))

            def fwd_bwd():
                q.grad = k.grad = v.grad = None
                F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(dout)

            row("attention_fwd_bwd", time_ms(fwd_bwd, a.iters))
    if "layer_norm" in ops:
        x, w, b = leaf(B * T, C), leaf(C, lo=0.5, hi=1.5), leaf(C)
        dy = torch.rand(B * T, C, device=dev).to(dt) * 2 - 1
        with torch.no_grad():
            row("layer_norm_fwd", time_ms(lambda: F.layer_norm(x, (C,), w, b), a.iters))

        def fwd_bwd():
            x.grad = w.grad = b.grad = None
            F.layer_norm(x, (C,), w, b).backward(dy)

        row("layer_norm_fwd_bwd", time_ms(fwd_bwd, a.iters))
    if "softmax" in ops:
        x = leaf(B * H * T, T, lo=-4, hi=4)
        dy = torch.rand(B * H * T, T, device=dev).to(dt) * 2 - 1
        with torch.no_grad():
            row("softmax_fwd", time_ms(lambda: torch.softmax(x, -1), a.iters))

        def fwd_bwd():
            x.grad = None
            torch.softmax(x, -1).backward(dy)

        row("softmax_fwd_bwd", time_ms(fwd_bwd, a.iters))
    if "cross_entropy" in ops:
        logits = leaf(B * T, V, lo=-4, hi=4)
        targets = torch.randint(0, V, (B * T,), device=dev)
        with torch.no_grad():
            row("cross_entropy_fwd", time_ms(lambda: F.cross_entropy(logits, targets), a.iters))

        def fwd_bwd():
            logits.grad = None
            F.cross_entropy(logits, targets).backward()

        row("cross_entropy_fwd_bwd", time_ms(fwd_bwd, a.iters))
    return 0


if __name__ == "__main__":
    sys.exit(main())
