"""The small GPT's CPU training step, tandem beside PyTorch (bench/gpt_cpu_peer.py), interleaved: for each round,
thread count and configuration, `tandem bench train --model gpt --device cpu` then the peer, so both see the
same minute of a shared machine. Prints every run, then per configuration and thread count the medians of
the milliseconds per step each program reports (wall time over the timed steps) and of its CPU time per step
(user + system of a run of S + 30 steps minus one of S steps, divided by 30: start-up and warm-up cancel
out, and waiting for a core does not count), and the load average before and after.

  python3 bench/gpt_cpu_compare.py [--rounds 5] [--threads 1 2] [--configs tiny big] [--tandem build/bin/tandem]
                                   [--python /usr/bin/python3] [--cpu-time]

Configurations: tiny = 2 layers, width 128, 4 heads, context 64, vocabulary 256, batch 8, 30 timed steps
after 5 (docs/benchmarks.md, "A tiny GPT on the CPU"); big = 4 layers, context 128, batch 16, 10 timed steps
after 3, the rest as tiny."""
import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time

CONFIGS = {
    "tiny": dict(layers=2, heads=4, width=128, context=64, vocab=256, batch=8, steps=30, warmup=5),
    "big": dict(layers=4, heads=4, width=128, context=128, vocab=256, batch=16, steps=10, warmup=3),
}


def tandem_cmd(binary, c, threads, steps):
    return [binary, "bench", "train", "--model", "gpt", "--device", "cpu", "--threads", str(threads),
            "--layers", str(c["layers"]), "--heads", str(c["heads"]), "--width", str(c["width"]),
            "--context", str(c["context"]), "--vocab", str(c["vocab"]), "--batch-size", str(c["batch"]),
            "--steps", str(steps), "--warmup", str(c["warmup"])]


def peer_cmd(python, c, threads, steps):
    here = os.path.dirname(os.path.abspath(__file__))
    return [python, os.path.join(here, "gpt_cpu_peer.py"), "--threads", str(threads), "--layers", str(c["layers"]),
            "--heads", str(c["heads"]), "--width", str(c["width"]), "--seq", str(c["context"]),
            "--vocab", str(c["vocab"]), "--batch", str(c["batch"]), "--steps", str(steps),
            "--warmup", str(c["warmup"])]


def run(cmd, threads):
    """(ms per step the program reports, CPU seconds the run took)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        sys.exit(f"gpt_cpu_compare.py: {' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT ")), None)
    if line is None:
        sys.exit(f"gpt_cpu_compare.py: no RESULT line from {' '.join(cmd)}:\n{out.stdout[-2000:]}")
    ms = float(json.loads(line[len("RESULT "):])["ms_per_step"])
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return ms, cpu


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--configs", nargs="+", default=["tiny", "big"], choices=sorted(CONFIGS))
    p.add_argument("--tandem", default="build/bin/tandem")
    p.add_argument("--python", default="/usr/bin/python3")
    p.add_argument("--cpu-time", action="store_true", help="also the CPU time per step (two more runs each)")
    a = p.parse_args()
    if not os.access(a.tandem, os.X_OK):
        sys.exit(f"gpt_cpu_compare.py: no tandem program at {a.tandem} (./tandem.sh build)")
    load = lambda: " ".join(f"{x:.2f}" for x in os.getloadavg())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit or 'unknown'}, {os.cpu_count()} cores, "
          f"load average {load()}")
    ms = {}
    cpu = {}
    for r in range(a.rounds):
        for name in a.configs:
            c = CONFIGS[name]
            for th in a.threads:
                for prog, make in (("tandem", lambda s: tandem_cmd(a.tandem, c, th, s)),
                                   ("pytorch", lambda s: peer_cmd(a.python, c, th, s))):
                    step_ms, _ = run(make(c["steps"]), th)
                    ms.setdefault((name, th, prog), []).append(step_ms)
                    extra = ""
                    if a.cpu_time:
                        _, c0 = run(make(1), th)
                        _, c1 = run(make(31), th)
                        cpu.setdefault((name, th, prog), []).append((c1 - c0) / 30 * 1e3)
                        extra = f", CPU {cpu[(name, th, prog)][-1]:.2f} ms/step"
                    print(f"round {r + 1} {name} threads={th} {prog}: {step_ms:.2f} ms/step{extra}", flush=True)
    print(f"# medians over {a.rounds} rounds (load average now {load()}):")
    for name in a.configs:
        for th in a.threads:
            t, q = statistics.median(ms[(name, th, "tandem")]), statistics.median(ms[(name, th, "pytorch")])
            line = f"{name} threads={th}: tandem {t:.2f} ms/step, pytorch {q:.2f} ms/step, pytorch/tandem {q / t:.2f}"
            if a.cpu_time:
                tc, qc = statistics.median(cpu[(name, th, "tandem")]), statistics.median(cpu[(name, th, "pytorch")])
                line += f"; CPU {tc:.2f} and {qc:.2f} ms/step ({qc / tc:.2f})"
            print(line)


if __name__ == "__main__":
    main()
