"""The scripts of examples/singa run a few steps each: every trainer model in one process, the trainer
and the guide's script on 2 CPU ranks under `tandem launch`, the multiprocessing launches, and (where
there is a GPU) the trainer on cuda:0. Each must exit 0 and print a finite training loss and an
evaluation accuracy in [0, 1]."""
import math
import re
import sys

import pytest

import tandem
from conftest import ROOT, needs_fashion, needs_gloo, run, tandem_command

SINGA = ROOT / "examples" / "singa"
needs_gpu = pytest.mark.skipif(tandem.device.get_num_gpus() == 0, reason="no CUDA GPU")


def check_report(rc, out, epochs=1):
    """The run succeeded and rank 0 reported each epoch: a finite loss, an accuracy in [0, 1]."""
    assert rc == 0, out
    losses = [float(v) for v in re.findall(r"^Training loss = (\S+),", out, re.M)]
    accuracies = [float(v) for v in re.findall(r"^Evaluation accuracy = ([^,\s]+)", out, re.M)]
    assert len(losses) == epochs and len(accuracies) == epochs, out
    assert all(math.isfinite(v) and v > 0 for v in losses), out
    assert all(0.0 <= a <= 1.0 for a in accuracies), out


def script(*parts):
    return [sys.executable, str(SINGA.joinpath(*parts))]


# (model, batch size, steps): the large models on a few small batches (they resize to 224 or 299).
TRAINER_RUNS = [("cnn", 32, 5), ("mlp", 32, 5), ("alexnet", 2, 2), ("resnet", 2, 2), ("xceptionnet", 2, 1)]


@needs_fashion
@pytest.mark.parametrize("name,batch,steps", TRAINER_RUNS, ids=[r[0] for r in TRAINER_RUNS])
def test_train_cnn_runs_each_model(name, batch, steps):
    rc, out = run(script("train_cnn.py") + [name, "fashion-mnist", "-m", "1", "-b", str(batch), "--max-steps",
                                            str(steps), "--device", "cpu"])
    check_report(rc, out)


@needs_fashion
def test_train_cnn_two_epochs_in_float16():
    rc, out = run(script("train_cnn.py") + ["cnn", "-m", "2", "-b", "16", "--max-steps", "3", "-p", "float16",
                                            "--device", "cpu"])
    check_report(rc, out, epochs=2)


@needs_fashion
def test_train_cnn_prints_the_time_profile_with_verbosity():
    rc, out = run(script("train_cnn.py") + ["mlp", "-m", "1", "-b", "16", "--max-steps", "8", "-v", "2",
                                            "--device", "cpu"])
    check_report(rc, out)
    assert "Time Profiling" in out and "gemm [forward]" in out, out


@needs_fashion
def test_autograd_mnist_cnn_runs():
    rc, out = run(script("autograd", "mnist_cnn.py") + ["-m", "1", "-b", "32", "--max-steps", "5", "--device", "cpu"])
    check_report(rc, out)


@needs_fashion
@needs_gloo
@pytest.mark.parametrize("option", ["half", "sparseTopK"])
def test_train_mpi_on_two_ranks(option):
    rc, out = run([tandem_command(), "launch", "-n", "2", "--"] + script("train_mpi.py") +
                  ["cnn", "-m", "1", "-b", "32", "--max-steps", "5", "-d", option, "--device", "cpu"])
    check_report(rc, out)


@needs_fashion
@needs_gloo
def test_train_multiprocess_with_the_ticket():
    rc, out = run(script("train_multiprocess.py") + ["mlp", "-w", "2", "-m", "1", "-b", "32", "--max-steps", "5",
                                                     "-d", "partialUpdate", "--device", "cpu"])
    check_report(rc, out)


@needs_fashion
@needs_gloo
def test_autograd_mnist_dist_and_multiprocess_on_two_ranks():
    rc, out = run([tandem_command(), "launch", "-n", "2", "--"] + script("autograd", "mnist_dist.py") +
                  ["-m", "1", "-b", "32", "--max-steps", "5", "-d", "sparseThreshold", "-s", "0.01", "--device", "cpu"])
    check_report(rc, out)
    rc, out = run(script("autograd", "mnist_multiprocess.py") + ["2", "-m", "1", "-b", "32", "--max-steps", "5",
                                                                 "--device", "cpu"])
    check_report(rc, out)


@needs_fashion
def test_the_guides_script_alone():
    rc, out = run(script("guide_dist_train.py") + ["-m", "1", "--max-steps", "5", "--device", "cpu"])
    check_report(rc, out)


@needs_fashion
@needs_gloo
@pytest.mark.parametrize("option", ["plain", "partialUpdate"])
def test_the_guides_script_on_two_ranks(option):
    rc, out = run([tandem_command(), "launch", "-n", "2", "--"] + script("guide_dist_train.py") +
                  ["-m", "1", "--max-steps", "5", "-d", option, "--device", "cpu"])
    check_report(rc, out)


@needs_fashion
@needs_gloo
def test_the_guides_multiprocessing_launch():
    rc, out = run(script("guide_dist_train.py") + ["--multiprocess", "2", "-m", "1", "--max-steps", "5", "-d", "half",
                                                   "--device", "cpu"])
    check_report(rc, out)


@needs_fashion
def test_a_bad_flag_is_refused_with_usage():
    rc, out = run(script("train_mpi.py") + ["cnn", "-d", "fastest"])
    assert rc == 2 and "invalid choice: 'fastest'" in out, out


@needs_fashion
@needs_gpu
@pytest.mark.parametrize("precision", ["float32", "float16"])
def test_train_cnn_on_a_gpu(precision):
    rc, out = run(script("train_cnn.py") + ["cnn", "-m", "2", "-b", "64", "--max-steps", "20", "-p", precision,
                                            "--device", "cuda"])
    check_report(rc, out, epochs=2)


@needs_fashion
@needs_gpu
def test_the_guides_script_on_a_gpu():
    rc, out = run(script("guide_dist_train.py") + ["-m", "1", "--max-steps", "20"])
    check_report(rc, out)
