"""Native launch stubs (runtime/native_launch.py) on the CPU: a ctypes callback stands in for the
driver's cuLaunchKernel and records what the stub passes it, read back through kernelParams."""

from __future__ import annotations

import ctypes
import struct
import types

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.errors import LaunchError
from fusedops.dsl.runtime import driver, kernel_launcher, native_launch
from fusedops.dsl.runtime.launcher_args import ParamKind
from helpers import run_in_threads

pytest.importorskip("llvmlite")

_LAUNCH_TYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                                ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)


class _FakeDriver:
    """cuLaunchKernel as a C function pointer; `launches` records (function, grid, block, shared bytes,
    stream, extra, the bytes of each parameter)."""

    def __init__(self, kinds, result=0):
        self.kinds, self.result, self.launches = list(kinds), result, []
        self.callback = _LAUNCH_TYPE(self._launch)
        self.address = ctypes.cast(self.callback, ctypes.c_void_p).value

    def _launch(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        values = tuple(ctypes.string_at(params[i], kind.size) for i, kind in enumerate(self.kinds))
        self.launches.append((function, (gx, gy, gz), (bx, by, bz), shared, stream, extra, values))
        return self.result


def _stub(kinds, result=0, function=0x1234, block_x=128, shared=0):
    fake = _FakeDriver(kinds, result)
    stub = native_launch.make_stub(kinds, fake.address, function, block_x, shared)
    if stub is None:
        pytest.skip("llvmlite cannot compile for this machine")
    return stub, fake


_ALL_KINDS = [ParamKind.POINTER, ParamKind.INT32, ParamKind.INT64, ParamKind.UINT32, ParamKind.UINT64,
              ParamKind.FLOAT32, ParamKind.FLOAT64, ParamKind.FLOAT16]


@pytest.mark.parametrize("values", [
    (0x7F0000001000, -2**31, -2**63, 2**32 - 1, 2**64 - 1, 1.5, -0.0, 65504.0),
    (16, 2**31 - 1, 2**63 - 1, 0, 0, float("inf"), float("nan"), -1e-8),
    (0, 1, -1, 7, 1, -3.4028234663852886e38, 1e300, 3),     # an int where a float goes, as struct takes it
])
def test_stub_passes_what_struct_packs(values):
    stub, fake = _stub(_ALL_KINDS, function=0xABC0, block_x=256, shared=4096)
    assert stub(3, 2, 1, 0, *values) == 0
    (function, grid, block, shared, stream, extra, packed), = fake.launches
    assert (function, grid, block, shared, stream, extra) == (0xABC0, (3, 2, 1), (256, 1, 1), 4096, None, None)
    expected = [struct.pack("<" + kind.format, value) for kind, value in zip(_ALL_KINDS, values)]
    assert list(packed) == expected


def test_stub_passes_the_stream_and_returns_the_driver_result():
    stub, fake = _stub([ParamKind.POINTER], result=700)
    assert stub(1, 1, 1, 0x5555AAAA0000, 64) == 700
    assert fake.launches[0][4] == 0x5555AAAA0000


@pytest.mark.parametrize("kind, value, error", [
    (ParamKind.INT32, 2**31, OverflowError), (ParamKind.INT32, -2**31 - 1, OverflowError),
    (ParamKind.POINTER, -16, OverflowError), (ParamKind.UINT32, 2**32, OverflowError),
    (ParamKind.INT64, 2**63, OverflowError), (ParamKind.FLOAT32, 1e39, OverflowError),
    (ParamKind.FLOAT16, 65520.0, OverflowError), (ParamKind.INT32, 1.0, TypeError),
    (ParamKind.POINTER, None, TypeError), (ParamKind.FLOAT64, "1", TypeError),
])
def test_stub_rejects_what_struct_rejects_and_launches_nothing(kind, value, error):
    stub, fake = _stub([kind])
    with pytest.raises((struct.error, OverflowError, TypeError)):
        struct.pack("<" + kind.format, value)
    with pytest.raises(error):
        stub(1, 1, 1, 0, value)
    assert fake.launches == []


def test_stub_checks_its_argument_count_and_grid():
    stub, fake = _stub([ParamKind.POINTER, ParamKind.INT32])
    with pytest.raises(TypeError, match="takes 6 arguments"):
        stub(1, 1, 1, 0, 16)
    with pytest.raises(OverflowError):
        stub(2**32, 1, 1, 0, 16, 1)
    with pytest.raises(TypeError):
        stub(1, 1, 1, None, 16, 1)
    assert fake.launches == []


def test_unsupported_kinds_get_no_stub():
    assert native_launch.make_stub([ParamKind.BFLOAT16], 1, 1, 32, 0) is None
    assert native_launch.make_stub([ParamKind.INT8, ParamKind.POINTER], 1, 1, 32, 0) is None
    assert native_launch.make_stub([], 1, 1, 32, 0) is None


def test_stubs_can_be_disabled(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_NATIVE_LAUNCH", "0")
    assert not native_launch.enabled()
    monkeypatch.setenv("FUSEDOPS_NATIVE_LAUNCH", "1")
    monkeypatch.setenv("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "1")
    assert not native_launch.enabled()


# -- cached and prepared launches through a stub ------------------------------------------------------
@dsl.jit
def _scale_kernel(x_ptr, y_ptr, n, factor, BLOCK: dsl.constexpr):
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    dsl.store(y_ptr + offsets, dsl.load(x_ptr + offsets, mask=mask) * factor, mask=mask)


@pytest.fixture
def stub_gpu(monkeypatch, tmp_path):
    """A mocked driver whose launchers get stubs over `_FakeDriver`s; returns the fakes made."""
    from cuda.bindings import driver as cuda_driver

    fakes = []

    def make(function, kinds, block_x, shared_bytes):
        fake = _FakeDriver(kinds, result=fakes_result[0])
        fakes.append(fake)
        return native_launch.make_stub(kinds, fake.address, 0x1234, block_x, shared_bytes)

    fakes_result = [0]
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FUSEDOPS_DEFAULT_ARCH", "sm_90a")
    monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)
    monkeypatch.setattr(driver, "cuda_driver", lambda: types.SimpleNamespace(
        cuLaunchKernel=lambda *args: pytest.fail("cuda-python's cuLaunchKernel was called"),
        CUresult=cuda_driver.CUresult))
    monkeypatch.setattr(driver, "load_module", lambda ptx, name, index=None: driver.LoadedKernel(
        name, None, None, None, 32, 0, 0, 1024, driver.DEFAULT_SHARED_MEMORY_LIMIT))
    monkeypatch.setattr(driver, "raw_stream_getter", lambda: (lambda index: 0))
    monkeypatch.setattr(kernel_launcher, "_native_stub", make)
    from fusedops.dsl.runtime import jit as jit_module
    monkeypatch.setattr(jit_module, "cuda_device", lambda kernel, params, values: torch.device("cuda", 0))
    return fakes, fakes_result


def test_cached_and_prepared_launches_go_through_the_stub(stub_gpu, monkeypatch):
    fakes, _ = stub_gpu
    kernel = dsl.jit(_scale_kernel.fn)
    x, y = torch.zeros(64), torch.zeros(64)
    monkeypatch.setattr(kernel_launcher.KernelLauncher, "_build_launch", lambda self: lambda grid, stream, args: None)
    kernel[(2,)](x, y, 64, 2.0, BLOCK=32)      # the full path (its launch is the launcher's own)
    kernel[(3,)](x, y, 48, 3.0, BLOCK=32)      # cached: through the stub
    (fake,) = fakes
    kinds = fake.kinds
    expected = tuple(struct.pack("<" + kind.format, value)
                     for kind, value in zip(kinds, [x.data_ptr(), y.data_ptr(), 48, 3.0]))
    assert [launch[1] for launch in fake.launches] == [(3, 1, 1)]
    assert fake.launches[-1][6] == expected
    prepared = kernel.prepare((4,), x, y, 64, 0.5, BLOCK=32)
    x2, y2 = torch.zeros(64), torch.zeros(64)
    prepared(x2, y2)
    packed = [struct.pack("<" + kind.format, value) for kind, value in zip(kinds, [x2.data_ptr(), y2.data_ptr(), 64, 0.5])]
    assert fakes[-1].launches[-1][1] == (4, 1, 1) and fakes[-1].launches[-1][6] == tuple(packed)


def test_a_failed_stub_launch_raises_launch_error(stub_gpu, monkeypatch):
    fakes, result = stub_gpu
    kernel = dsl.jit(_scale_kernel.fn)
    x, y = torch.zeros(64), torch.zeros(64)
    monkeypatch.setattr(kernel_launcher.KernelLauncher, "_build_launch", lambda self: lambda grid, stream, args: None)
    kernel[(1,)](x, y, 64, 2.0, BLOCK=32)
    result[0] = 1       # CUDA_ERROR_INVALID_VALUE
    fakes.clear()
    kernel2 = dsl.jit(_scale_kernel.fn)
    kernel2[(1,)](x, y, 64, 2.0, BLOCK=32)
    with pytest.raises(LaunchError, match="CUDA_ERROR_INVALID_VALUE"):
        kernel2[(1,)](x, y, 64, 2.0, BLOCK=32)
    with pytest.raises(LaunchError, match="argument 3"):        # a float32 out of range, named
        kernel2[(1,)](x, y, 64, 1e300, BLOCK=32)


# -- GPU tier -----------------------------------------------------------------------------------------
@pytest.mark.cuda
def test_stub_launches_on_the_gpu_from_several_threads():
    kernel = dsl.jit(_scale_kernel.fn)
    x = torch.randn(4096, device="cuda")
    y = torch.empty_like(x)
    kernel[(1,)](x, y, 100, 2.0, BLOCK=128)
    launcher = next(iter(kernel._cache.values())).compiled.launcher(x.device.index)
    assert launcher.native_stub() is not None
    outputs = [torch.full_like(x, float("nan")) for _ in range(8)]

    def work(index):
        for _ in range(50):
            kernel[(32,)](x, outputs[index], 4096, float(index), BLOCK=128)

    errors = run_in_threads(work, 8)
    torch.cuda.synchronize()
    assert not errors
    for index, output in enumerate(outputs):
        torch.testing.assert_close(output, x * float(index), rtol=0, atol=0)
    prepared = kernel.prepare((32,), x, y, 4096, 0.5, BLOCK=128)
    z = torch.full_like(x, float("nan"))
    prepared(x, z)
    torch.cuda.synchronize()
    torch.testing.assert_close(z, x * 0.5, rtol=0, atol=0)
