"""The char model's PyTorch peer: nanoGPT's Shakespeare-char recipe (6 layers, 6 heads, width 384,
context 256, dropout 0.2; batch 64, AdamW lr 1e-3 with betas 0.9/0.99 and weight decay 0.1 (none on
biases, norms and embeddings), 100 warm-up steps then cosine decay to 1e-4 at 5000 steps, gradients
clipped to norm 1.0, bf16 autocast) on the byte-level shards `tandem data text` writes (llm.c's format:
a 256 x int32 header, then uint16 tokens; vocabulary 256), with the same model as bench's gpt2_peer.py
(pre-LayerNorm blocks, causal flash SDPA, tanh-GELU MLP, learned positions, tied embeddings).
Validation loss (nats per byte) over `--eval-batches` sequential windows of the held-out works, every
`--eval-every` steps and at the end; RESULT {json} with the final validation loss and the wall time
from process start.
  python3 gpt_char_peer.py DATA_DIR [--steps 5000] [--compile]"""
import argparse
import glob
import json
import math
import os
import time

START = time.time()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def load_tokens(pattern):
    parts = []
    for path in sorted(glob.glob(pattern)):
        header = np.fromfile(path, dtype=np.int32, count=256)
        # uint16 tokens (magic 20240520), or uint32 ones (20240801: a vocabulary beyond 65,536 tokens)
        dtypes = {20240520: np.uint16, 20240801: np.uint32}
        if header[0] not in dtypes:
            raise SystemExit(f"{path}: not a token shard in llm.c's format (magic {header[0]})")
        tokens = np.memmap(path, dtype=dtypes[int(header[0])], mode="r", offset=256 * 4, shape=(int(header[2]),))
        parts.append(np.asarray(tokens))
    if not parts:
        raise SystemExit(f"no shards match {pattern}")
    return torch.from_numpy(np.concatenate(parts).astype(np.int64))


def attention(q, k, v, p):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
    # PyTorch before 2.0 (a CPU check of this script): the same causal attention, unfused
    T = q.shape[-2]
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    att = att.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return F.dropout(att.softmax(-1), p) @ v


class Block(nn.Module):
    def __init__(s, d, h, dropout):
        super().__init__()
        s.h, s.p = h, dropout
        s.ln1, s.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        s.qkv, s.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        s.fc, s.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        s.drop = nn.Dropout(dropout)

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, s.h, C // s.h).transpose(1, 2) for t in (q, k, v))
        y = attention(q, k, v, s.p if s.training else 0.0)
        x = x + s.drop(s.proj(y.transpose(1, 2).reshape(B, T, C)))
        return x + s.drop(s.out(F.gelu(s.fc(s.ln2(x)), approximate="tanh")))


class GPT(nn.Module):
    def __init__(s, vocab, seq, layers, heads, d, dropout):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        s.drop = nn.Dropout(dropout)
        s.blocks = nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        s.lnf = nn.LayerNorm(d)
        s.head = nn.Linear(d, vocab, bias=False)
        s.head.weight = s.wte.weight
        for m in s.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(s, idx, tgt):
        x = s.drop(s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device)))
        for b in s.blocks:
            x = b(x)
        logits = s.head(s.lnf(x))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), tgt.reshape(-1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data_dir")
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--width", type=int, default=384)
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--eval-batches", type=int, default=200)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device(a.device)
    train = load_tokens(os.path.join(a.data_dir, "train_*.bin")).to(dev)
    val = load_tokens(os.path.join(a.data_dir, "val_*.bin")).to(dev)
    m = GPT(256, a.seq, a.layers, a.heads, a.width, a.dropout).to(dev)
    decay = [t for n, t in m.named_parameters() if t.dim() >= 2 and "wpe" not in n and "wte" not in n]
    rest = [t for n, t in m.named_parameters() if not (t.dim() >= 2 and "wpe" not in n and "wte" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.99), **({"fused": True} if dev.type == "cuda" else {}))
    run = torch.compile(m) if a.compile else m
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    offsets = torch.arange(a.seq + 1, device=dev)

    def lr_at(step):  # linear warm-up, then cosine decay to min_lr at the last step
        if step < a.warmup:
            return a.lr * (step + 1) / a.warmup
        frac = (step - a.warmup) / max(1, a.steps - a.warmup)
        return a.min_lr + 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))) * (a.lr - a.min_lr)

    @torch.no_grad()
    def evaluate():
        m.eval()
        n = min(a.eval_batches * a.batch, (len(val) - 1) // a.seq)
        total, count = 0.0, 0
        for b in range(0, n, a.batch):
            starts = torch.arange(b, min(b + a.batch, n), device=dev) * a.seq
            w = val[starts[:, None] + offsets]
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                total += run(w[:, :-1], w[:, 1:]).item() * len(starts)
            count += len(starts)
        m.train()
        return total / count

    curve = []
    t0 = time.time()
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        starts = torch.randint(0, len(train) - a.seq - 1, (a.batch,), device=dev, generator=gen)
        w = train[starts[:, None] + offsets]
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = run(w[:, :-1], w[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            v = evaluate()
            curve.append((step + 1, round(loss.item(), 4), round(v, 4)))
            print(f"step {step + 1}: train loss {loss.item():.4f}, val loss {v:.4f}", flush=True)
    print("RESULT " + json.dumps({"system": "pytorch", "torch": torch.__version__, "compile": a.compile,
          "steps": a.steps, "val_loss": curve[-1][2], "train_s": round(time.time() - t0, 1),
          "wall_s": round(time.time() - START, 1), "curve": curve}), flush=True)


if __name__ == "__main__":
    main()
