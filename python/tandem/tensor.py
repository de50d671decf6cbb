"""Tensors (SINGA's ``singa.tensor``): ``Tensor(shape, dev, dtype)``, NumPy copies, DLPack views."""
import numpy as np

from . import _tandem

Tensor = _tandem.Tensor
DType = _tandem.DType

float32 = DType.float32
float64 = DType.float64
float16 = DType.float16
bfloat16 = DType.bfloat16
int32 = DType.int32
int64 = DType.int64
uint8 = DType.uint8

_DLPACK_CUDA = 2


def from_numpy(array, dev=None, dtype=None):
    """A new tensor with a copy of the array's values, on ``dev`` (None: the CPU)."""
    return _tandem.from_array(np.asarray(array), dev, dtype)


def to_numpy(t):
    """A NumPy copy of the tensor's values (bfloat16 arrives as float32)."""
    return t.to_numpy()


def from_dlpack(x):
    """A tensor sharing the memory of a DLPack producer (a NumPy array, a PyTorch tensor, a capsule).

    No copy is made: writes through either side are seen by the other. GPU producers are asked to
    order their pending work before tandem's stream.
    """
    if hasattr(x, "__dlpack_device__") and hasattr(x, "__dlpack__"):
        dev_type, dev_id = x.__dlpack_device__()
        if int(dev_type) == _DLPACK_CUDA:
            stream = _tandem._compute_stream(int(dev_id))
            return _tandem._from_dlpack(x.__dlpack__(stream=stream) if stream else x.__dlpack__())
    return _tandem._from_dlpack(x)


def zeros(shape, dev=None, dtype=float32):
    return _tandem.full(list(shape), 0.0, dev, dtype)


def ones(shape, dev=None, dtype=float32):
    return _tandem.full(list(shape), 1.0, dev, dtype)


def full(shape, value, dev=None, dtype=float32):
    return _tandem.full(list(shape), float(value), dev, dtype)
