"""tandem: data-parallel training on CPUs and NVIDIA GPUs.

The Python API follows Apache SINGA's distributed-training guide::

    from tandem import device, tensor, layer, model, opt

    sgd = opt.DistOpt(opt.SGD(lr=0.005, momentum=0.9, weight_decay=1e-5))
    dev = device.create_cuda_gpu_on(sgd.rank_in_local)   # or device.get_default_device()

Run the same script under ``tandem launch -n 2 -- python3 train.py``, under
``mpiexec --hostfile host_file python3 train.py``, or start the processes yourself with
``multiprocessing`` and a :class:`NcclIdHolder` ticket.
"""
from . import _tandem
from . import autograd, data, device, layer, model, models, opt, singa_wrap, tensor, tokenizer
from .device import set_num_threads, num_threads
from .distributed import NcclIdHolder, detect_env

try:
    from importlib.metadata import version as _version

    __version__ = _version("tandem")
except Exception:  # running from a build tree without the package's metadata
    __version__ = "unknown"

__all__ = ["autograd", "data", "device", "layer", "model", "models", "opt", "singa_wrap", "tensor", "tokenizer",
           "NcclIdHolder",
           "detect_env", "set_num_threads", "num_threads"]
