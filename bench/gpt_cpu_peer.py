"""A tiny GPT's training step on the CPU in PyTorch, the peer of
`tandem bench train --model gpt --device cpu --threads 2 ...` with the same shape: the model of gpt2_peer.py
(pre-LayerNorm blocks, causal attention, tanh-GELU MLP, learned positions, tied embeddings) in f32 on
--threads threads, AdamW (0.9, 0.95) at 6e-4 with weight decay 0.1, gradients clipped to norm 1, random
tokens; attention is F.scaled_dot_product_attention where this PyTorch has it, else written out (Debian's
1.13). Prints RESULT {json} with tokens/s after --warmup untimed steps.
  python3 bench/gpt_cpu_peer.py [--layers 2 --heads 4 --width 128 --seq 64 --vocab 256 --batch 8 --threads 2]"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def attention(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    mask = torch.ones(t, t, dtype=torch.bool).triu(1)
    return torch.softmax(s.masked_fill(mask, float("-inf")), -1) @ v


class Block(nn.Module):
    def __init__(s, d, h):
        super().__init__()
        s.h = h
        s.ln1, s.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        s.qkv, s.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        s.fc, s.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, s.h, C // s.h).transpose(1, 2) for t in (q, k, v))
        y = attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + s.proj(y)
        return x + s.out(F.gelu(s.fc(s.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s, vocab, seq, layers, heads, d):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        s.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        s.lnf = nn.LayerNorm(d)
        s.head = nn.Linear(d, vocab, bias=False)
        s.head.weight = s.wte.weight
        for mod in s.modules():  # GPT-2's initialisation: N(0, 0.02), zero biases
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                nn.init.normal_(mod.weight, std=0.02)
            if isinstance(mod, nn.Linear) and mod.bias is not None:
                nn.init.zeros_(mod.bias)

    def forward(s, idx, tgt):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1]))
        for b in s.blocks:
            x = b(x)
        logits = s.head(s.lnf(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    m = GPT(a.vocab, a.seq, a.layers, a.heads, a.width)
    opt = torch.optim.AdamW(m.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    x = torch.randint(0, a.vocab, (a.batch, a.seq))
    y = torch.randint(0, a.vocab, (a.batch, a.seq))

    def step():
        loss = m(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):
        step()
    t = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    dt = (time.perf_counter() - t) / a.steps
    print("RESULT " + json.dumps({"system": "pytorch", "torch": torch.__version__, "device": "cpu",
          "threads": a.threads, "params": sum(t.numel() for t in m.parameters()), "batch": a.batch, "seq": a.seq,
          "ms_per_step": round(dt * 1e3, 3), "tokens_per_s": round(a.batch * a.seq / dt), "loss": round(loss.item(), 3)}))


if __name__ == "__main__":
    main()
