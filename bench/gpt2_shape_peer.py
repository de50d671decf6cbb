"""The GPT-2 peer (the shared gpt2_peer.py: nanoGPT's model, bf16 autocast, fused AdamW, torch.compile) at any
width and head count, for the larger GPT-2 shapes (medium 24x1024x16, large 36x1280x20, XL 48x1600x25).
Prints RESULT {json} as gpt2_peer.py does, with the peak of torch.cuda.max_memory_allocated.
  python3 bench/gpt2_shape_peer.py PEER_DIR --layers 48 --width 1600 --heads 25 --batch 8 [--compile]"""
import argparse, json, sys, time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("peer_dir", help="the folder holding gpt2_peer.py")
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--width", type=int, default=1600)
    p.add_argument("--heads", type=int, default=25)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--compile", action="store_true")
    a = p.parse_args()
    sys.path.insert(0, a.peer_dir)
    import torch
    from gpt2_peer import GPT
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device("cuda")
    m = GPT(seq=a.seq, layers=a.layers, heads=a.heads, d=a.width).to(dev)
    nparams = sum(t.numel() for t in m.parameters())
    opt = torch.optim.AdamW(m.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    run = torch.compile(m) if a.compile else m
    g = torch.Generator(device=dev).manual_seed(0)
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
    t = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t) / a.steps
    tok = a.batch * a.seq / dt
    print("RESULT " + json.dumps({"system": "pytorch", "torch": torch.__version__, "compile": a.compile,
          "params": nparams, "layers": a.layers, "width": a.width, "heads": a.heads, "batch": a.batch,
          "seq": a.seq, "ms_per_step": round(dt * 1e3, 2), "tokens_per_s": round(tok),
          "loss": round(loss.item(), 3), "peak_mib": round(torch.cuda.max_memory_allocated() / 2**20)}), flush=True)


if __name__ == "__main__":
    main()
