"""Per-kernel GPU time of one training step, tandem next to the PyTorch peer, from Nsight Compute.

  python3 bench/kernel_profile.py --model resnet50 --batch 256 --precision bf16 \
      --tandem build-gpu/bin/tandem --peer ../shared/bench/pytorch_ddp.py [--top 25] [--out DIR]

Each side runs a few warm-up steps unprofiled, then --steps steps under
`ncu --profile-from-start off --clock-control none --cache-control none --metrics gpu__time_duration.sum`; the table lists the kernels by their
share of the step's summed kernel time (launch gaps are not counted: compare with the step times of
the benchmarks). Precision maps to the peer's closest setting: f32 -> --no-tf32, tf32 -> --channels-last,
bf16 -> --bf16."""
import argparse
import shlex
import collections
import csv
import io
import os
import re
import subprocess
import sys

PEER_FLAGS = {"f32": ["--no-tf32"], "tf32": ["--channels-last"], "bf16": ["--bf16"], "f16": ["--bf16"]}


def ncu(cmd, log):
    full = ["ncu", "--profile-from-start", "off", "--clock-control", "none", "--cache-control", "none", "--metrics", "gpu__time_duration.sum",
            "--csv", "--page", "raw", "--log-file", log] + cmd
    r = subprocess.run(full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"profiling failed ({r.returncode}): {' '.join(full)}\n{r.stdout[-3000:]}")
    return parse(log)


def parse(log):
    with open(log) as f:
        text = f.read()
    start = text.find('"ID"')
    if start < 0:
        sys.exit(f"no kernel records in {log}")
    rows = list(csv.reader(io.StringIO(text[start:])))
    head = rows[0]
    name_col, time_col = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
    unit = rows[1][time_col] if len(rows) > 1 else "ns"
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(unit, 1e-3)
    totals = collections.defaultdict(lambda: [0, 0.0])
    for row in rows[2:]:
        if len(row) <= max(name_col, time_col):
            continue
        value = row[time_col].replace(",", "")  # ncu writes thousands separators
        try:
            us = float(value) * scale
        except ValueError:
            continue
        t = totals[short(row[name_col])]
        t[0] += 1
        t[1] += us
    return totals


def _top_level(text):
    """text with bracketed parts removed, and the contents of its first <...>."""
    out, first, depth, cur = [], None, 0, []
    for ch in text:
        if ch in "<(":
            depth += 1
            if depth == 1 and ch == "<":
                cur = []
                continue
        elif ch in ">)":
            depth = max(depth - 1, 0)
            if depth == 0 and ch == ">" and first is None:
                first = "".join(cur)
            if depth == 0:
                continue
        if depth == 0:
            out.append(ch)
        else:
            cur.append(ch)
    return "".join(out), first


def short(name, with_arg=True):
    """The kernel's own name with its first template argument (namespaces, function arguments and
    the return type dropped; brackets matched, so arguments holding '::', '(' or '<unnamed>' do not
    cut the name short)."""
    for anon in ("(anonymous namespace)::", "<unnamed>::"):
        name = name.replace(anon, "")
    bare, targs = _top_level(name)
    words = bare.split()
    parts = (words[-1] if words else name).split("::")
    base = "::".join(parts[-2:]) if parts[-1].startswith("{lambda") else parts[-1] or name
    if with_arg and targs:
        depth, arg = 0, []
        for ch in targs:
            depth += ch in "<("
            depth -= ch in ">)"
            if ch == "," and depth == 0:
                break
            arg.append(ch)
        first = short("".join(arg).strip(), with_arg=False)
        if first and not first[0].isdigit():
            base += f"<{first}>"
    return base[:70]


def table(title, totals, steps, top):
    total = sum(t[1] for t in totals.values())
    lines = [f"== {title}: {total / steps / 1e3:.2f} ms of kernel time per step, {sum(t[0] for t in totals.values()) // steps} launches",
             f"{'share':>6} {'ms/step':>8} {'calls':>6}  kernel"]
    for name, (calls, us) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"{100 * us / total:5.1f}% {us / steps / 1e3:8.3f} {calls // steps:6d}  {name}")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--from-logs", nargs=2, metavar=("TANDEM_CSV", "PEER_CSV"),
                   help="summarise two earlier ncu logs instead of profiling")
    p.add_argument("--model", default="resnet50", choices=["cnn", "resnet18", "resnet50", "gpt", "bigram", "llama"])
    p.add_argument("--geometry", default="", help="tandem only: input as 'IMAGE CHANNELS CLASSES' (default: the "
                   "model's; resnet50 224 3 1000)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--precision", default="tf32", choices=["f32", "tf32", "bf16", "f16"])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--tandem", default="build-gpu/bin/tandem")
    p.add_argument("--peer", default="", help="path of pytorch_ddp.py (without it, tandem alone)")
    p.add_argument("--out", default="/tmp", help="where the ncu logs go")
    p.add_argument("--tandem-args", default="", help="more flags for tandem's bench train (e.g. '--shard optimizer')")
    p.add_argument("--label", default="", help="added to the log's name (to profile one model under two settings)")
    a = p.parse_args()
    geometry = ["--image", "224", "--channels", "3", "--classes", "1000"] if a.model == "resnet50" else []
    if a.geometry:
        image, channels, classes = a.geometry.split()
        geometry = ["--image", image, "--channels", channels, "--classes", classes]
    here = os.path.dirname(os.path.abspath(__file__))
    if a.from_logs:
        tandem, peer = (parse(path) for path in a.from_logs)
        print(table(f"tandem {a.model} batch {a.batch} {a.precision}", tandem, a.steps, a.top))
        print()
        print(table(f"PyTorch {a.model} batch {a.batch} {' '.join(PEER_FLAGS[a.precision])}", peer, a.steps, a.top))
        return
    tandem = ncu([a.tandem, "bench", "train", "--model", a.model, "-b", str(a.batch), "--device", "cuda",
                  "--precision", a.precision, "--steps", str(a.steps), "--warmup", "5", "--profile"] + geometry +
                 shlex.split(a.tandem_args),
                 os.path.join(a.out, f"ncu_tandem_{a.model}_{a.precision}{a.label}.csv"))
    print(table(f"tandem {a.model} batch {a.batch} {a.precision} {a.tandem_args}".rstrip(), tandem, a.steps, a.top))
    if not a.peer:
        return
    peer = ncu([sys.executable, os.path.join(here, "peer_profile.py"), "--peer", a.peer, "--model", a.model,
                "--batch", str(a.batch), "--steps", str(a.steps)] + PEER_FLAGS[a.precision],
               os.path.join(a.out, f"ncu_peer_{a.model}_{a.precision}.csv"))
    print()
    print(table(f"PyTorch {a.model} batch {a.batch} {' '.join(PEER_FLAGS[a.precision])}", peer, a.steps, a.top))


if __name__ == "__main__":
    main()
