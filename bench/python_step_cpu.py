#!/usr/bin/env python3
"""CPU time per training step of the guide's CNN, stepped from Python (bench/python_step.py) and by
`tandem bench train`, on one thread: each program runs with two step counts, and the difference of
the processes' user + system time over the difference of steps leaves start-up out. CPU time, unlike
wall time, barely changes when other processes load the machine.
    bench/python_step_cpu.py TANDEM_BIN [ROUNDS]"""
import os
import resource
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHORT, LONG = 50, 250


def cpu_seconds(cmd):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def per_step(cmd):
    return (cpu_seconds(cmd + ["--steps", str(LONG)]) - cpu_seconds(cmd + ["--steps", str(SHORT)])) / (LONG - SHORT)


def main():
    tandem, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
    cpp_cmd = [tandem, "bench", "train", "--model", "cnn", "-b", "64", "--threads", "1"]
    py_cmd = [sys.executable, os.path.join(HERE, "python_step.py"), "-b", "64", "--threads", "1"]
    cpp, py = [], []
    for i in range(rounds):
        cpp.append(per_step(cpp_cmd) * 1e3)
        py.append(per_step(py_cmd) * 1e3)
        print(f"round {i + 1}: C++ {cpp[-1]:.3f} ms CPU/step, Python {py[-1]:.3f} ms CPU/step", flush=True)
    mc, mp = statistics.median(cpp), statistics.median(py)
    print(f"median: C++ {mc:.3f} ms CPU/step, Python {mp:.3f} ms CPU/step, Python / C++ = {mp / mc:.4f}")


if __name__ == "__main__":
    main()
