"""Shared helpers of the Python tests: where the programs are, and running them."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import tandem

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
EXAMPLES = ROOT / "examples" / "python"
FASHION = pathlib.Path(os.environ.get("TANDEM_DATA_DIR") or "/usr/share/datasets") / "fashion-mnist"


def tandem_command():
    """The `tandem` command installed beside this interpreter by the package."""
    exe = pathlib.Path(sys.executable).parent / "tandem"
    return str(exe) if exe.exists() else shutil.which("tandem")


def run(args, timeout=180, env=None, cwd=None):
    """Runs a command; returns (exit status, stdout and stderr together)."""
    full_env = {**os.environ, "TANDEM_TIMEOUT": "60", **(env or {})}
    # A job started by a test is its own job, not part of any the test runner may belong to.
    for var in ("TANDEM_RANK", "TANDEM_WORLD_SIZE", "TANDEM_STORE_ADDR", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                "PMIX_RANK", "RANK", "WORLD_SIZE"):
        if env is None or var not in env:
            full_env.pop(var, None)
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                       env=full_env, cwd=cwd)
    return p.returncode, p.stdout


def gloo_available():
    """2-rank CPU jobs need a build with Gloo (and the `tandem` command, to ask it)."""
    cmd = tandem_command()
    if cmd is None:
        return False
    rc, out = run([cmd, "info"])
    return rc == 0 and "gloo: yes" in out


needs_gloo = pytest.mark.skipif(not gloo_available(), reason="tandem was built without Gloo: no CPU ranks")
needs_fashion = pytest.mark.skipif(not (FASHION / "train-images-idx3-ubyte.gz").exists(),
                                   reason="Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)")


def torch_for_numpy():
    """The system's PyTorch where it exchanges arrays with this NumPy, else None: Debian's 1.13 was built
    for NumPy 1 and cannot read NumPy 2's arrays ("Numpy is not available")."""
    import warnings

    try:
        import numpy as np

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its complaint about the NumPy it was not built for
            import torch

            torch.from_numpy(np.zeros(1)).numpy()
        return torch
    except Exception:  # not installed, or built for another NumPy
        return None


TORCH_SKIP = "no PyTorch that exchanges arrays with this NumPy (Debian's python3-torch needs NumPy 1)"


@pytest.fixture
def cpu():
    dev = tandem.device.get_default_device()
    dev.SetRandSeed(0)
    return dev
