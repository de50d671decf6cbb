"""The example scripts: the guide's for one short epoch under each launcher (tandem launch, mpiexec,
the multiprocessing ticket), which are one computation and must print the same numbers; and the
model written from layers."""
import multiprocessing
import re
import shutil
import sys

import pytest

import ticket_worker
from conftest import EXAMPLES, needs_fashion, needs_gloo, run, tandem_command
from tandem import NcclIdHolder

SHORT = ["--epochs", "1", "--limit-train", "4096", "--limit-test", "512", "--device", "cpu"]
TRAIN = str(EXAMPLES / "doc_dist_train.py")
results = {}


def epoch_lines(out):
    lines = re.findall(r"^(Training loss = .*|Evaluation accuracy = [0-9.]+)", out, re.M)
    assert len(lines) == 2, out
    return lines


def check_run(name, rc, out):
    assert rc == 0, out
    assert "Starting Epoch 0:" in out, out
    accuracy = float(re.search(r"Evaluation accuracy = ([0-9.]+)", out).group(1))
    assert accuracy > 0.25, out  # 32 steps learn well past a guess (0.1)
    results[name] = epoch_lines(out)


@needs_gloo
@needs_fashion
def test_guide_script_under_tandem_launch():
    check_run("launch", *run([tandem_command(), "launch", "-n", "2", "--", sys.executable, TRAIN] + SHORT))


@needs_gloo
@needs_fashion
@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="no mpiexec (Debian package openmpi-bin)")
def test_guide_script_under_mpiexec(tmp_path):
    rc, info = run([tandem_command(), "info"])
    if "mpi: yes" not in info:
        pytest.skip("tandem was built without MPI")
    host_file = tmp_path / "host_file"
    host_file.write_text("localhost slots=2\n")
    env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    check_run("mpiexec", *run(["mpiexec", "--hostfile", str(host_file), "-n", "2", sys.executable, TRAIN] + SHORT,
                              env=env))


@needs_gloo
@needs_fashion
def test_guide_multiprocessing_script():
    check_run("multiprocessing",
              *run([sys.executable, str(EXAMPLES / "doc_dist_multiprocess.py"), "2"] + SHORT, cwd=str(EXAMPLES)))


def test_multiprocessing_script_without_a_process_count_says_how_to_call_it():
    for args in ([], ["--help"], ["0"]):
        rc, out = run([sys.executable, str(EXAMPLES / "doc_dist_multiprocess.py")] + args, cwd=str(EXAMPLES))
        assert rc == 1 and "usage:" in out and "Traceback" not in out, out


def test_launchers_agree():
    if len(results) < 2:
        pytest.skip("fewer than two launchers ran")
    first = next(iter(results.values()))
    for name, lines in results.items():
        assert lines == first, f"{name} printed {lines}, another launcher {first}"


@needs_gloo
def test_ticket_pickles_for_spawned_processes():
    ctx = multiprocessing.get_context("spawn")
    ticket = NcclIdHolder()
    queue = ctx.Queue()
    procs = [ctx.Process(target=ticket_worker.reduce_rank, args=(ticket, i, 2, queue)) for i in range(2)]
    for p in procs:
        p.start()
    got = sorted(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert got == [(0, 2, [3.0, 3.0]), (1, 2, [3.0, 3.0])]



@needs_fashion
def test_model_from_layers_example():
    rc, out = run([sys.executable, str(EXAMPLES / "model_from_layers.py"), "--limit-train", "1024", "--limit-test",
                   "256"])
    assert rc == 0, out
    trained = re.search(r"evaluation accuracy ([0-9.]+)\n", out).group(1)
    reloaded = re.search(r"reloaded .*: evaluation accuracy ([0-9.]+)", out).group(1)
    assert reloaded == trained and float(trained) > 0.25, out
