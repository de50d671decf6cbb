"""Devices: the CPU and CUDA GPUs (SINGA's ``singa.device``).

Each device carries the random generator its layers initialise their parameters from; seed it with
``dev.SetRandSeed(seed)`` (or ``dev.set_rand_seed``) before the model's first call. SINGA's device
methods are there too: ``Sync()``, ``SetVerbosity(n)``, ``SetSkipIteration(n)`` and
``PrintTimeProfiling()`` (time profiles of the operations run on the device), ``EnableGraph(enable)``,
``ResetGraph()``, ``graph_enabled()``, ``Reset()``, ``host()`` and ``id()``.
"""
from . import _tandem

Device = _tandem.Device

_threads_chosen = False


def get_default_device():
    """The CPU."""
    return _tandem.device("cpu")


def create_cpu_device():
    """The CPU."""
    return _tandem.device("cpu")


def create_cuda_gpu():
    """The first GPU."""
    return create_cuda_gpu_on(0)


def create_cuda_gpu_on(device_id):
    """GPU number ``device_id``; raises ValueError when this process cannot use it."""
    return _tandem.device(f"cuda:{int(device_id)}")


def create_cuda_gpus(num):
    """The first ``num`` GPUs."""
    return [create_cuda_gpu_on(i) for i in range(num)]


def create_cuda_gpus_on(device_ids):
    """The GPUs with these numbers."""
    return [create_cuda_gpu_on(i) for i in device_ids]


def get_num_gpus():
    """Number of usable CUDA GPUs (0 in a build without CUDA)."""
    return _tandem.cuda_device_count()


def get_gpu_ids():
    """The indices of the usable CUDA GPUs."""
    return list(range(get_num_gpus()))


def set_num_threads(n):
    """CPU threads for kernels and BLAS (0: all cores). Overrides the share DistOpt would pick."""
    global _threads_chosen
    _threads_chosen = True
    _tandem.set_num_threads(int(n))


def num_threads():
    """CPU threads the kernels use."""
    return _tandem.num_threads()


def _share_cores(ranks_on_host):
    """Ranks sharing a machine share its cores, unless the user chose a thread count."""
    import os

    if not _threads_chosen and ranks_on_host > 1:
        _tandem.set_num_threads(max(1, (os.cpu_count() or 1) // ranks_on_host))
