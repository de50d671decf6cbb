"""Runs the CPU-runnable commands of README.md and docs/*.md as written, in a scratch directory, in the
order a reader meets them, as a reader would: `tandem` is on PATH only from the docs' own
`export PATH=...` line on (applied here, with the scratch directory's `build` standing for the build
directory), and Open MPI is not told that root may run it (the commands must say so themselves). Commands that
need a GPU, several machines, a scheduler or the Python package are left out; training commands get a short-run
suffix (a repeated flag takes its last value): a few steps for language models, one short epoch for the
others. Ends with an 'N passed, N failed' line.

usage: run_doc_commands.py SOURCE_DIR TANDEM_BIN WORK_DIR
"""
import os
import re
import shutil
import subprocess
import sys

source, tandem, work = sys.argv[1:4]
SHORT = " --epochs 1 --limit-train 256 --limit-test 128 --progress off"
# Language models train by steps: a few, with one evaluation at the end.
LM_SHORT = " --steps 3 --warmup 0 --eval-every 0 --eval-steps 1"
RUNNABLE = ("tandem ", "build/bin/tandem ", "mpiexec ", "echo ", "seq ", "export PATH=")
# Python scripts need the installed package: the pytest suite runs them under the same launchers.
NEEDS_MORE = ("cuda", "srun", "--nnodes", "torchrun", "compute-sanitizer", "NCCL_", "python3 ")


def commands(path):
    text = open(path).read()
    for block in re.findall(r"```(?:sh|bash)\n(.*?)```", text, re.S):
        for cmd in block.replace("\\\n", " ").splitlines():
            cmd = re.split(r"\s{2,}#", cmd)[0].strip()  # a trailing comment follows two spaces
            if cmd.startswith(RUNNABLE) and not any(n in cmd for n in NEEDS_MORE):
                yield re.sub(r"\s+", " ", cmd)


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
# The docs spell the build directory "build": the one this tandem was built in.
os.symlink(os.path.dirname(os.path.dirname(os.path.abspath(tandem))), os.path.join(work, "build"), target_is_directory=True)
# The docs spell paths from the repository root: its test fixtures (a small tokenizer.json) are there too.
os.symlink(os.path.join(os.path.abspath(source), "tests"), os.path.join(work, "tests"), target_is_directory=True)
# A reader's PATH: no `tandem` on it (an installed one, a virtual environment's) until the docs put it there.
path = [d for d in os.environ["PATH"].split(":") if d and not os.access(os.path.join(d, "tandem"), os.X_OK)]
env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_ALLOW_RUN_AS_ROOT")}
env["PATH"] = ":".join(path)
docs = [os.path.join(source, "README.md")] + sorted(
    os.path.join(source, "docs", f) for f in os.listdir(os.path.join(source, "docs")) if f.endswith(".md"))
passed = failed = 0
for doc in docs:
    for cmd in commands(doc):
        if cmd.startswith("export PATH="):  # the reader's shell keeps it for the commands after it
            env["PATH"] = subprocess.run(["bash", "-c", cmd + ' && printf %s "$PATH"'], cwd=work, env=env,
                                         capture_output=True, text=True, check=True).stdout
            print("ok:     " + os.path.relpath(doc, source) + ": " + cmd, flush=True)
            passed += 1
            continue
        run = cmd
        if re.search(r"\btandem train\b", cmd):
            run = cmd + (LM_SHORT if re.search(r"--model (bigram|gpt|llama)\b", cmd) else SHORT)
        try:  # output is read leniently: tandem generate writes raw bytes
            r = subprocess.run(["bash", "-c", run], cwd=work, env=env, capture_output=True, text=True, errors="replace", timeout=300)
            ok, out = r.returncode == 0, r.stdout + r.stderr
        except subprocess.TimeoutExpired:
            ok, out = False, "timed out after 300 s"
        print(("ok:     " if ok else "FAILED: ") + os.path.relpath(doc, source) + ": " + cmd, flush=True)
        if not ok:
            print("  " + "\n  ".join(out.strip().splitlines()[-15:]))
        passed, failed = passed + ok, failed + (not ok)
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed or not passed else 0)
