"""Tensors: NumPy round trips for every dtype, DLPack both ways (NumPy, PyTorch, GPU memory), attributes and arithmetic."""
import numpy as np
import pytest

import tandem
from tandem import tensor

needs_gpu = pytest.mark.skipif(tandem.device.get_num_gpus() == 0, reason="no CUDA GPU")

DTYPES = [
    (tensor.float32, np.float32),
    (tensor.float64, np.float64),
    (tensor.float16, np.float16),
    (tensor.int32, np.int32),
    (tensor.int64, np.int64),
    (tensor.uint8, np.uint8),
]


def sample(np_dtype):
    a = np.arange(24).reshape(2, 3, 4)
    if np.issubdtype(np_dtype, np.signedinteger) or np.issubdtype(np_dtype, np.floating):
        a = a - 7
    if np.issubdtype(np_dtype, np.floating):
        a = a * 0.25
    return a.astype(np_dtype)


@pytest.mark.parametrize("dtype,np_dtype", DTYPES)
def test_numpy_round_trip(cpu, dtype, np_dtype):
    a = sample(np_dtype)
    t = tensor.from_numpy(a, cpu, dtype)
    assert t.dtype == dtype and t.shape == (2, 3, 4) and t.ndim == 3 and len(t) == 2 and t.size() == 24
    b = tensor.to_numpy(t)
    assert b.dtype == np_dtype
    np.testing.assert_array_equal(a, b)

    u = tensor.Tensor((2, 3, 4), cpu, dtype)
    assert u.copy_from_numpy(a) is u
    np.testing.assert_array_equal(u.to_numpy(), a)
    np.testing.assert_array_equal(np.asarray(u), a)


def test_from_numpy_makes_float64_float32_and_int64_int32_as_singa(cpu):
    for np_dtype, dtype in [(np.float64, tensor.float32), (np.int64, tensor.int32), (np.float32, tensor.float32),
                            (np.float16, tensor.float16), (np.int32, tensor.int32), (np.uint8, tensor.uint8)]:
        a = sample(np_dtype)
        t = tensor.from_numpy(a, cpu)
        assert t.dtype == dtype, np_dtype
        np.testing.assert_array_equal(t.to_numpy(), a.astype(t.to_numpy().dtype))


def test_bfloat16_round_trip(cpu):
    exact = np.array([1.5, -2.25, 0.0, 2.0**100, -1.0 / 1024], dtype=np.float32)  # representable in bfloat16
    t = tensor.Tensor((5,), cpu, tensor.bfloat16)
    t.copy_from_numpy(exact)
    back = tensor.to_numpy(t)
    assert back.dtype == np.float32  # NumPy has no bfloat16
    np.testing.assert_array_equal(back, exact)
    # Values between two bfloat16 numbers round to the nearest (to even on ties).
    t.copy_from_numpy(np.array([1 + 2**-9, 1 + 3 * 2**-9, 1 + 2**-8, 1 + 3 * 2**-8, 0], dtype=np.float32))
    np.testing.assert_array_equal(tensor.to_numpy(t)[:4], [1.0, 1 + 2**-7, 1.0, 1 + 2**-6])
    assert tensor.from_numpy(exact).as_type(tensor.bfloat16).dtype == tensor.bfloat16


def test_copy_from_numpy_converts_and_checks_size(cpu):
    t = tensor.Tensor((4,), cpu, tensor.int32)
    t.copy_from_numpy(np.array([1, 2, 3, 2**40 + 4], dtype=np.int64)[:3].repeat(2)[:4])
    np.testing.assert_array_equal(t.to_numpy(), [1, 1, 2, 2])
    f = tensor.Tensor((2, 2), cpu)
    f.copy_from_numpy(np.array([[0.5, 1.5], [2.5, 3.5]], dtype=np.float64))
    np.testing.assert_array_equal(f.to_numpy(), [[0.5, 1.5], [2.5, 3.5]])
    f.copy_from_numpy(np.arange(8, dtype=np.float32).reshape(2, 4)[:, ::2])  # strided source
    np.testing.assert_array_equal(f.to_numpy(), [[0, 2], [4, 6]])
    with pytest.raises(ValueError, match="element count"):
        f.copy_from_numpy(np.zeros(5, dtype=np.float32))


def test_to_numpy_is_a_copy(cpu):
    t = tensor.from_numpy(np.ones(3, dtype=np.float32), cpu)
    a = t.to_numpy()
    a[0] = 7
    assert t.to_numpy()[0] == 1


def test_dlpack_numpy_shares_memory(cpu):
    t = tensor.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3), cpu)
    assert t.__dlpack_device__() == (1, 0)
    v = np.from_dlpack(t)
    assert v.shape == (2, 3) and v.dtype == np.float32
    t += 1  # NumPy sees the tensor's memory
    np.testing.assert_array_equal(v, np.arange(1, 7).reshape(2, 3))
    if v.flags.writeable:  # NumPy 1.x makes DLPack imports read-only
        v[1, 2] = -1
        assert t.to_numpy()[1, 2] == -1

    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    u = tensor.from_dlpack(a)
    assert u.dtype == tensor.int64 and u.shape == (3, 4)
    a[0, 0] = 42
    assert u.to_numpy()[0, 0] == 42
    s = tensor.from_dlpack(a[:, 1::2])  # a strided view stays a view
    assert s.shape == (3, 2) and s.strides == (4, 2)
    np.testing.assert_array_equal(s.to_numpy(), a[:, 1::2])
    del a  # the tensor keeps the array's memory alive
    np.testing.assert_array_equal(u.to_numpy()[2], [8, 9, 10, 11])


def test_dlpack_rejects_what_it_cannot_hold(cpu):
    with pytest.raises(ValueError, match="cannot become a tandem tensor"):
        tensor.from_dlpack(np.zeros(3, dtype=np.complex64))
    with pytest.raises(ValueError, match="negative strides"):
        tensor.from_dlpack(np.arange(4, dtype=np.float32)[::-1])


def test_dlpack_torch(cpu):
    torch = pytest.importorskip("torch")
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    t = tensor.from_dlpack(x)
    x[0, 0] = 9
    assert t.to_numpy()[0, 0] == 9
    y = torch.from_dlpack(t)
    y[1, 1] = -5
    assert t.to_numpy()[1, 1] == -5 and x[1, 1].item() == -5
    b = tensor.from_numpy(np.array([1.5, -2.0], dtype=np.float32), cpu).as_type(tensor.bfloat16)
    tb = torch.from_dlpack(b)
    assert tb.dtype == torch.bfloat16 and tb.float().tolist() == [1.5, -2.0]
    back = tensor.from_dlpack(torch.tensor([1, 2, 3], dtype=torch.int32))
    assert back.dtype == tensor.int32 and back.to_numpy().tolist() == [1, 2, 3]


@needs_gpu
def test_dlpack_on_the_gpu_shares_memory():
    gpu = tandem.device.create_cuda_gpu_on(0)
    t = tensor.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3), gpu)
    assert t.__dlpack_device__() == (2, 0)  # kDLCUDA, device 0
    v = tensor.from_dlpack(t)  # a second tandem tensor over the same GPU memory
    assert v.__dlpack_device__() == (2, 0) and v.shape == (2, 3)
    t += 1
    np.testing.assert_array_equal(v.to_numpy(), np.arange(1, 7).reshape(2, 3))

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch without CUDA")
    x = torch.from_dlpack(t)  # tandem's queued work is done before PyTorch sees the memory
    assert x.is_cuda and x.device.index == 0 and x.dtype == torch.float32
    x.mul_(2)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(t.to_numpy(), 2 * np.arange(1, 7).reshape(2, 3))
    y = torch.arange(4, device="cuda", dtype=torch.float32)
    u = tensor.from_dlpack(y)  # PyTorch's pending work is ordered before tandem's stream
    assert u.__dlpack_device__() == (2, 0)
    u += 10
    assert u.to_numpy().tolist() == [10, 11, 12, 13]
    assert y.tolist() == [10, 11, 12, 13]  # the same memory


def test_arithmetic_and_in_place(cpu):
    a = tensor.from_numpy(np.array([1.0, 2.0, 3.0], dtype=np.float32), cpu)
    b = tensor.from_numpy(np.array([0.5, 0.5, 2.0], dtype=np.float32), cpu)
    np.testing.assert_allclose((a + b).to_numpy(), [1.5, 2.5, 5.0])
    np.testing.assert_allclose((a - b).to_numpy(), [0.5, 1.5, 1.0])
    np.testing.assert_allclose((a * b).to_numpy(), [0.5, 1.0, 6.0])
    np.testing.assert_allclose((2 * a + 1).to_numpy(), [3.0, 5.0, 7.0])
    np.testing.assert_allclose((10 - a / 2).to_numpy(), [9.5, 9.0, 8.5])
    np.testing.assert_allclose((-a).to_numpy(), [-1.0, -2.0, -3.0])
    m = tensor.from_numpy(np.eye(3, dtype=np.float32) * 2, cpu)
    np.testing.assert_allclose((a.reshape((1, 3)) @ m).to_numpy(), [[2.0, 4.0, 6.0]])

    before = a
    a += b
    a *= 2
    a -= 1
    a /= 4
    assert a is before  # in place: the same tensor
    np.testing.assert_allclose(a.to_numpy(), [0.5, 1.0, 2.25])
    p = tensor.from_numpy(np.array([4.0, 8.0], dtype=np.float32), cpu)
    p.requires_grad = True
    p /= 2  # the guide's synchronize() on a parameter: values change, no graph is recorded
    assert p.requires_grad and p.is_leaf
    np.testing.assert_allclose(p.to_numpy(), [2.0, 4.0])


def test_attributes_and_autograd(cpu):
    t = tensor.Tensor((2, 3), cpu)
    assert t.device is cpu and t.data is t and repr(t) == "f32[2, 3] on cpu"
    np.testing.assert_array_equal(t.to_numpy(), np.zeros((2, 3)))  # new tensors start at zero
    w = tensor.from_numpy(np.array([1.0, -2.0, 3.0], dtype=np.float32), cpu)
    w.requires_grad = True
    x = tensor.from_numpy(np.array([2.0, 4.0, 0.5], dtype=np.float32), cpu)
    loss = (w * x).reshape((1, 3)) @ tensor.ones((3, 1), cpu)
    assert w.grad is None
    loss.backward()
    np.testing.assert_allclose(w.grad.to_numpy(), [2.0, 4.0, 0.5])
    assert loss.item() == pytest.approx(2.0 - 8.0 + 1.5)
    g = tensor.zeros((3,), cpu)
    g.gaussian(0.0, 1.0)
    assert np.std(g.to_numpy()) > 0
