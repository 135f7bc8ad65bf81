"""Review of the native launch stubs (runtime/native_launch.py) and their use by cached and prepared
launches (kernel_launcher.py, launch_plans.py), on the CPU.

The stub is called directly against a ctypes callback standing in for cuLaunchKernel (it reads the
parameters back through kernelParams), or against libc functions whose C signature fits (`abs` as a
driver that returns the CUfunction handle, `usleep` as one that sleeps); the launch paths run with a
driver module that passes for cuda-python (`__name__` "cuda.bindings.driver"), so the real
`kernel_launcher._native_stub` decides whether a launcher gets a stub.
"""

from __future__ import annotations

import contextlib
import ctypes
import fractions
import struct
import sys
import threading
import time
import types

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.errors import LaunchError
from fusedops.dsl.runtime import driver, kernel_launcher, native_launch
from fusedops.dsl.runtime.launcher_args import ParamKind
from helpers import run_in_threads
from test_native_launch import _scale_kernel  # the same small test kernel

pytest.importorskip("llvmlite")

K = ParamKind
_ALL_KINDS = [K.POINTER, K.INT32, K.INT64, K.UINT32, K.UINT64, K.FLOAT16, K.FLOAT32, K.FLOAT64]
_LAUNCH_TYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                                ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)
_LIBC = ctypes.CDLL(None)


def _address(function) -> int:
    return ctypes.cast(function, ctypes.c_void_p).value


class _Recorder:
    """cuLaunchKernel as a C function pointer; `launches` holds (function, grid, block, shared bytes,
    stream, the bytes of each parameter of `kinds`); returns `result`."""

    def __init__(self, kinds=(), result=0):
        self.kinds, self.result, self.launches = list(kinds), result, []
        self.callback = _LAUNCH_TYPE(self._launch)
        self.address = _address(self.callback)

    def _launch(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        values = tuple(ctypes.string_at(params[i], kind.size) for i, kind in enumerate(self.kinds))
        self.launches.append((function, (gx, gy, gz), (bx, by, bz), shared, stream, values))
        return self.result


def _stub(kinds, recorder=None, function=0x1234, block_x=128, shared=0):
    recorder = recorder or _Recorder(kinds)
    stub = native_launch.make_stub(kinds, recorder.address, function, block_x, shared)
    if stub is None:
        pytest.skip("llvmlite cannot compile for this machine")
    return stub, recorder


def _null_driver_stub(kinds, result=0):
    # libc's abs as cuLaunchKernel: returns abs(CUfunction handle), so `result` is what it returns
    stub = native_launch.make_stub(kinds, _address(_LIBC.abs), result, 32, 0)
    if stub is None:
        pytest.skip("llvmlite cannot compile for this machine")
    return stub


# -- conversions: accept and reject what struct does, pack the same bytes ------------------------
class _Index:
    def __init__(self, value):
        self.value = value

    def __index__(self):
        return self.value


class _IntOnly:
    def __int__(self):
        return 5


class _FloatOnly:
    def __float__(self):
        return 2.5


class _RaisingIndex:
    def __index__(self):
        raise ZeroDivisionError("from __index__")


class _IntSubclass(int):
    pass


class _FloatSubclass(float):
    pass


_VALUES = [
    0, 1, -1, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**32 - 1, 2**32, 2**63 - 1, 2**63, -2**63, -2**63 - 1,
    2**64 - 1, 2**64, 2**100, 2**1024, True, False, 1.0, 1.5, -0.0, float("nan"), float("inf"), -float("inf"),
    65504.0, 65519.0, 65520.0, 3.4028235e38, 3.5e38, 1e39, 1e300, 1e-8, 5e-324, np.int32(7), np.int64(-7),
    np.uint64(2**64 - 1), np.uint32(5), np.float32(1.25), np.float64(2.5), np.float16(3.0), np.bool_(True),
    torch.tensor(3), torch.tensor(1.5), torch.tensor(True), _Index(9), _Index(-9), _Index(2**64), _IntOnly(),
    _FloatOnly(), _IntSubclass(11), _FloatSubclass(0.5), _RaisingIndex(), fractions.Fraction(1, 3), "1", b"1",
    None, [1],
]


def _outcome(call):
    try:
        return "packed", call()
    except Exception as error:  # noqa: BLE001 - compared by acceptance, not by type
        return "rejected", type(error)


@pytest.mark.parametrize("kind", _ALL_KINDS, ids=lambda kind: kind.name)
def test_stub_accepts_and_rejects_what_struct_does(kind):
    # struct packs what cuda-python's path launched; e.g. PyLong_AsUnsignedLongLong alone rejected
    # numpy ints, 0-d int tensors and objects with __index__ for pointers and unsigned parameters
    stub, recorder = _stub([kind])
    mismatches = []
    for value in _VALUES:
        expected = _outcome(lambda: struct.pack("<" + kind.format, value))
        recorder.launches.clear()
        got = _outcome(lambda: stub(1, 1, 1, 0, value))
        if got[0] == "packed":
            assert got[1] == 0 and len(recorder.launches) == 1
            got = ("packed", recorder.launches[0][5][0])
        else:
            assert recorder.launches == []
        if expected[0] != got[0] or (expected[0] == "packed" and expected[1] != got[1]):
            mismatches.append((repr(value)[:30], expected, got))
    assert mismatches == []


def test_unsigned_values_and_grid_sizes_convert_through_index():
    stub, recorder = _stub([K.POINTER, K.UINT32, K.UINT64])
    assert stub(np.int64(3), torch.tensor(2), _Index(1), 0, np.uint64(2**64 - 16), np.uint32(2**32 - 1),
                _Index(2**64 - 1)) == 0
    (launch,) = recorder.launches
    assert launch[1] == (3, 2, 1)
    assert launch[5] == (struct.pack("<Q", 2**64 - 16), struct.pack("<I", 2**32 - 1), struct.pack("<Q", 2**64 - 1))
    for values, error in [((np.int64(-1), 0, 0), OverflowError), ((0, _Index(2**32), 0), OverflowError),
                          ((0, 0, _Index(-1)), OverflowError), ((1.0, 0, 0), TypeError),
                          ((0, 0, _RaisingIndex()), ZeroDivisionError)]:
        with pytest.raises(error):
            stub(1, 1, 1, 0, *values)
    with pytest.raises(OverflowError):
        stub(_Index(2**32), 1, 1, 0, 0, 0, 0)
    assert len(recorder.launches) == 1


def test_stub_converts_one_hundred_and_fifty_mixed_parameters(seed):
    rng = np.random.default_rng(seed)
    kinds = [_ALL_KINDS[(i * 5) % 8] for i in range(150)]
    draw = {K.POINTER: lambda: int(rng.integers(0, 2**62)) * 4, K.INT32: lambda: int(rng.integers(-2**31, 2**31)),
            K.INT64: lambda: int(rng.integers(-2**63, 2**63)), K.UINT32: lambda: int(rng.integers(0, 2**32)),
            K.UINT64: lambda: int(rng.integers(0, 2**63)) * 2 + 1, K.FLOAT16: lambda: float(rng.uniform(-6e4, 6e4)),
            K.FLOAT32: lambda: float(rng.uniform(-3e38, 3e38)), K.FLOAT64: lambda: float(rng.standard_normal())}
    values = [draw[kind]() for kind in kinds]
    stub, recorder = _stub(kinds, function=0x77, block_x=1024, shared=99)
    assert stub(7, 8, 9, 0x5000, *values) == 0
    (launch,) = recorder.launches
    assert launch[:5] == (0x77, (7, 8, 9), (1024, 1, 1), 99, 0x5000)
    assert launch[5] == tuple(struct.pack("<" + kind.format, value) for kind, value in zip(kinds, values))
    with pytest.raises(TypeError, match="takes 154 arguments"):
        stub(7, 8, 9, 0, *values[:-1])


def test_stub_argument_count_keywords_and_stream():
    stub, recorder = _stub([K.INT32])
    for args in [(), (1,), (1, 1, 1, 0), (1, 1, 1, 0, 1, 2)]:
        with pytest.raises(TypeError, match="takes 5 arguments"):
            stub(*args)
    with pytest.raises(TypeError):
        stub(1, 1, 1, 0, value=1)
    with pytest.raises(TypeError):      # the stream is a raw handle; the plans pass stream_of's int
        stub(1, 1, 1, None, 1)
    with pytest.raises(OverflowError):
        stub(1, 1, 1, 2**64, 1)
    for grid in [(2**32, 1, 1), (1, -1, 1), (1, 1, 2**64)]:
        with pytest.raises(OverflowError):
            stub(*grid, 0, 1)
    assert recorder.launches == []
    assert stub(0, 2**31, 2**32 - 1, 0, 1) == 0      # the driver judges sizes in range of its parameters
    assert recorder.launches[0][1] == (0, 2**31, 2**32 - 1) and recorder.launches[0][4] is None
    assert native_launch.make_stub([], recorder.address, 1, 32, 0) is None
    assert native_launch.make_stub([K.BFLOAT16, K.INT32], recorder.address, 1, 32, 0) is None
    assert native_launch.make_stub([K.TENSOR_MAP], recorder.address, 1, 32, 0) is None


def test_stub_returns_the_driver_result_and_leaks_nothing():
    kinds = [K.POINTER, K.INT32, K.INT64, K.UINT32, K.UINT64, K.FLOAT16, K.FLOAT32, K.FLOAT64]
    values = [2**40 + 16, 12345678, -2**40, 2**31 + 5, 2**63 + 7, 1.5, 2.5e10, 1e300]
    for result in (0, 700, 2**31 - 1):
        stub = _null_driver_stub(kinds, result)
        assert stub(1000, 1, 1, 0x10000, *values) == result
    bad = values[:1] + [2**31] + values[2:]

    def launches(count):
        for _ in range(count):
            stub(1000, 1, 1, 0x10000, *values)
            try:
                stub(1, 1, 1, 0, *bad)
            except OverflowError:
                pass

    launches(1000)
    refcounts = [sys.getrefcount(value) for value in values]
    blocks = sys.getallocatedblocks()
    launches(100_000)
    assert sys.getallocatedblocks() - blocks < 100
    assert [sys.getrefcount(value) for value in values] == refcounts


def test_stub_releases_the_gil_while_the_driver_runs():
    stub = native_launch.make_stub([K.INT32], _address(_LIBC.usleep), 150_000, 32, 0)    # usleep(150 ms)
    if stub is None:
        pytest.skip("llvmlite cannot compile for this machine")
    results = []
    threads = [threading.Thread(target=lambda: results.append(stub(1, 1, 1, 0, 1))) for _ in range(3)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [0, 0, 0]
    assert time.perf_counter() - start < 0.4     # 0.45 s at least when the sleeps take turns


def test_stub_from_many_threads_passes_each_threads_values():
    kinds = [K.POINTER, K.INT32, K.FLOAT32]
    stub, recorder = _stub(kinds)

    def work(index):
        for step in range(500):
            stub(index + 1, 1, 1, 0, index * 1000 + step, step, float(index))

    threads = [threading.Thread(target=work, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(recorder.launches) == 4000
    for launch in recorder.launches:
        index = launch[1][0] - 1
        (pointer,), (step,), (value,) = (struct.unpack("<" + k.format, b) for k, b in zip(kinds, launch[5]))
        assert (pointer, value) == (index * 1000 + step, float(index))


def test_threads_making_stubs_of_one_signature_compile_it_once(monkeypatch):
    # Before the lock two threads could both compile; the second result replaced the first in the
    # lru_cache, freeing the code and PyMethodDef of the first thread's stub (a segfault later).
    kinds = (K.UINT32, K.FLOAT64, K.UINT32, K.INT64, K.FLOAT16, K.UINT64, K.UINT32)    # new to the cache
    original = native_launch._stub_ir
    calls, inside, most_inside = [], [0], [0]

    def slow_ir(kinds_):
        calls.append(kinds_)
        inside[0] += 1
        most_inside[0] = max(most_inside[0], inside[0])
        time.sleep(0.2)     # long enough for the other thread to miss the cache too
        inside[0] -= 1
        return original(kinds_)

    monkeypatch.setattr(native_launch, "_stub_ir", slow_ir)
    recorders = [_Recorder(kinds) for _ in range(2)]
    stubs = [None, None]

    def make(index):
        stubs[index] = native_launch.make_stub(kinds, recorders[index].address, 1, 32, 0)

    threads = [threading.Thread(target=make, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == [kinds] and most_inside[0] == 1
    for stub, recorder in zip(stubs, recorders):
        assert stub(1, 1, 1, 0, 1, 2.0, 3, 4, 5.0, 6, 7) == 0 and len(recorder.launches) == 1


@pytest.mark.parametrize("text, expected", [("0", False), ("false", False), (" Off ", False), ("no", False),
                                           ("1", True), ("true", True), ("on", True)])
def test_native_launch_knob_is_parsed_like_every_boolean_knob(monkeypatch, text, expected):
    # FUSEDOPS_NATIVE_LAUNCH=false used to leave the stubs on (only "0" turned them off)
    monkeypatch.delenv("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", raising=False)
    monkeypatch.setenv("FUSEDOPS_NATIVE_LAUNCH", text)
    assert native_launch.enabled() is expected
    monkeypatch.setenv("FUSEDOPS_NATIVE_LAUNCH", "maybe")
    with pytest.raises(ValueError, match="FUSEDOPS_NATIVE_LAUNCH"):
        native_launch.enabled()


# -- launches through stubs, with a driver that passes for cuda-python ------------------------------
@dsl.jit
def _wide_kernel(x_ptr, big, BLOCK: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK)
    dsl.store(x_ptr + offsets, dsl.load(x_ptr + offsets) + (big % 7).to(dsl.float32))


@dsl.jit
def _flag_kernel(x_ptr, flag, BLOCK: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK)
    if flag:
        dsl.store(x_ptr + offsets, dsl.load(x_ptr + offsets) + 1.0)


class _Driver:
    """What the mocked driver saw: `stub` (the native stubs' cuLaunchKernel, a _Recorder whose kinds
    the test sets), `python` (cuda-python's cuLaunchKernel calls: grid, stream, the parameters read
    through the launcher's packer), `activated` / `pushed` (context activations, pushes), `stream`
    (torch's current stream handle), `torch_device` (torch's current device in the launching thread)."""

    def __init__(self):
        self.stub, self.python, self.activated, self.pushed, self.stream = _Recorder(), [], [], [], 0
        self.torch_device = 0


@pytest.fixture
def mocked(monkeypatch, tmp_path):
    from cuda.bindings import driver as cuda_driver

    from fusedops.dsl.runtime import jit as jit_module

    state = _Driver()
    launchers = []

    def cu_launch_kernel(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        state.python.append(((gx, gy, gz), stream, launchers[-1].packer.read(params)))
        return (0,)

    module = types.ModuleType("cuda.bindings.driver")
    module.cuLaunchKernel, module.CUresult = cu_launch_kernel, cuda_driver.CUresult
    context = types.SimpleNamespace(device_index=0, activate=lambda: state.activated.append(True),
                                    pushed=lambda: state.pushed.append(True) or contextlib.nullcontext())
    original_init = kernel_launcher.KernelLauncher.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        launchers.append(self)

    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FUSEDOPS_DEFAULT_ARCH", "sm_90a")
    for name in ("FUSEDOPS_INTERPRET", "FUSEDOPS_NATIVE_LAUNCH", "CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(kernel_launcher.KernelLauncher, "__init__", init)
    monkeypatch.setattr(driver, "cuda_driver", lambda: module)
    monkeypatch.setattr(kernel_launcher, "_legacy_stream_launch_address", lambda: state.stub.address)
    monkeypatch.setattr(driver, "load_module", lambda ptx, name, index=None: driver.LoadedKernel(
        name, None, 0xF00D, context, 32, 0, 0, 1024, driver.DEFAULT_SHARED_MEMORY_LIMIT))
    monkeypatch.setattr(driver, "raw_stream_getter", lambda: (lambda index: state.stream))
    monkeypatch.setattr(kernel_launcher, "_torch_current_device", lambda: state.torch_device)
    monkeypatch.setattr(jit_module, "cuda_device", lambda kernel, params, values: torch.device("cuda", 0))
    state.launchers = launchers
    return state


_SCALE_KINDS = [K.POINTER, K.POINTER, K.INT32, K.FLOAT32]


def _packed(kinds, values) -> tuple:
    return tuple(struct.pack("<" + kind.format, value) for kind, value in zip(kinds, values))


def test_cached_and_prepared_launches_use_the_stub_and_pack_what_cuda_python_does(mocked):
    mocked.stub.kinds = _SCALE_KINDS
    kernel = dsl.jit(_scale_kernel.fn)
    x, y = torch.zeros(64), torch.zeros(64)
    kernel[(2,)](x, y, 64, 2.0, BLOCK=32)          # the full path: cuda-python
    assert [launch[2] for launch in mocked.python] == [(x.data_ptr(), y.data_ptr(), 64, 2.0)]
    mocked.stream = 0xABC0
    kernel[(3,)](x, y, 48, -0.1, BLOCK=32)
    kernel[(5, 2)](x, y, 2**31 - 16, float("inf"), BLOCK=32)   # keeps n % 16 == 0: the same plan
    prepared = kernel.prepare((4, 1, 3), x, y, -2**31, 1e-45, BLOCK=32)
    mocked.stream = 0
    x2, y2 = torch.zeros(64), torch.zeros(64)
    prepared(x2, y2)
    assert len(mocked.python) == 1
    assert [launch[:5] for launch in mocked.stub.launches] == [
        (0xF00D, (3, 1, 1), (128, 1, 1), 0, 0xABC0), (0xF00D, (5, 2, 1), (128, 1, 1), 0, 0xABC0),
        (0xF00D, (4, 1, 3), (128, 1, 1), 0, None)]
    assert [launch[5] for launch in mocked.stub.launches] == [
        _packed(_SCALE_KINDS, [x.data_ptr(), y.data_ptr(), 48, -0.1]),
        _packed(_SCALE_KINDS, [x.data_ptr(), y.data_ptr(), 2**31 - 16, float("inf")]),
        _packed(_SCALE_KINDS, [x2.data_ptr(), y2.data_ptr(), -2**31, 1e-45])]


def test_wide_ints_at_their_limits_through_the_stub(mocked):
    kernel = dsl.jit(_wide_kernel.fn)
    x = torch.zeros(16)
    for kind, values in [(K.UINT64, [2**63 + 5, 2**64 - 1, 2**63 + 1]), (K.INT64, [2**31 + 3, -2**63 + 1, 2**63 - 1])]:
        mocked.stub.kinds = [K.POINTER, kind]
        mocked.stub.launches.clear()
        for value in values:
            kernel[(1,)](x, value, BLOCK=16)
        assert [launch[5] for launch in mocked.stub.launches] == [_packed([K.POINTER, kind], [x.data_ptr(), value])
                                                                  for value in values[1:]]


def test_stubs_off_per_thread_default_stream_and_unsupported_kinds_launch_through_cuda_python(mocked,
                                                                                                monkeypatch):
    x, y = torch.zeros(64), torch.zeros(64)
    for name, value in [("FUSEDOPS_NATIVE_LAUNCH", "0"), ("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "1")]:
        monkeypatch.setenv(name, value)
        kernel = dsl.jit(_scale_kernel.fn)
        mocked.python.clear()
        for _ in range(3):
            kernel[(1,)](x, y, 64, 2.0, BLOCK=32)
        kernel.prepare((1,), x, y, 64, 2.0, BLOCK=32)(x, y)
        assert mocked.launchers[-1].native_stub() is None and len(mocked.python) == 4
        monkeypatch.delenv(name)
    flag = dsl.jit(_flag_kernel.fn)     # a bool parameter (int1): no stub
    mocked.python.clear()
    for _ in range(3):
        flag[(1,)](x, True, BLOCK=16)
    assert mocked.launchers[-1].native_stub() is None and len(mocked.python) == 3
    assert mocked.stub.launches == []


def test_interpreter_after_a_plan_launches_nothing_on_the_gpu(mocked, monkeypatch):
    mocked.stub.kinds = _SCALE_KINDS
    kernel = dsl.jit(_scale_kernel.fn)
    x, y = torch.arange(32.0), torch.zeros(32)
    kernel[(1,)](x, y, 32, 2.0, BLOCK=32)
    kernel[(1,)](x, y, 32, 2.0, BLOCK=32)
    prepared = kernel.prepare((1,), x, y, 32, 3.0, BLOCK=32)
    assert len(mocked.stub.launches) == 1
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    kernel[(1,)](x, y, 32, 2.0, BLOCK=32)
    torch.testing.assert_close(y, x * 2.0)
    assert len(mocked.stub.launches) == 1 and len(mocked.python) == 1
    assert prepared is not None


def test_stub_errors_raise_launch_errors_and_invalid_context_retries(mocked):
    mocked.stub.kinds = _SCALE_KINDS
    kernel = dsl.jit(_scale_kernel.fn)
    x, y = torch.zeros(64), torch.zeros(64)
    kernel[(1,)](x, y, 64, 2.0, BLOCK=32)
    prepared = kernel.prepare((2,), x, y, 64, 0.5, BLOCK=32)
    with pytest.raises(LaunchError, match=r"argument 3 \(factor\) of kind float32"):
        kernel[(1,)](x, y, 64, 1e300, BLOCK=32)
    with pytest.raises(LaunchError, match=r"argument 3 \(factor\) of kind float32"):
        kernel.prepare((1,), x, y, 64, -1e39, BLOCK=32)
    assert mocked.stub.launches == []
    mocked.stub.result = 1
    with pytest.raises(LaunchError, match="CUDA_ERROR_INVALID_VALUE"):
        kernel[(1,)](x, y, 64, 2.0, BLOCK=32)
    with pytest.raises(LaunchError, match="CUDA_ERROR_INVALID_VALUE"):
        prepared(x, y)
    # a thread without the context current: activated, then launched again through cuda-python
    mocked.stub.result = int(driver.cuda_driver().CUresult.CUDA_ERROR_INVALID_CONTEXT)
    mocked.python.clear()
    kernel[(3,)](x, y, 32, 4.0, BLOCK=32)
    prepared(y, x)
    assert len(mocked.activated) == 2 and mocked.pushed == []
    assert mocked.python == [((3, 1, 1), None, (x.data_ptr(), y.data_ptr(), 32, 4.0)),
                             ((2, 1, 1), None, (y.data_ptr(), x.data_ptr(), 64, 0.5))]
    # the kernel's device is not torch's current one in this thread: its context is pushed for the
    # retry alone, so the thread's current device (torch's allocations) does not move
    mocked.torch_device = 1
    mocked.python.clear()
    kernel[(3,)](x, y, 32, 4.0, BLOCK=32)
    assert len(mocked.activated) == 2 and mocked.pushed == [True]
    assert mocked.python == [((3, 1, 1), None, (x.data_ptr(), y.data_ptr(), 32, 4.0))]


def test_cached_launches_from_many_threads_through_the_stub(mocked):
    mocked.stub.kinds = _SCALE_KINDS
    kernel = dsl.jit(_scale_kernel.fn)
    pairs = [(torch.zeros(64), torch.zeros(64)) for _ in range(6)]
    kernel[(1,)](*pairs[0], 64, 1.0, BLOCK=32)
    prepared = kernel.prepare((1,), *pairs[0], 64, 0.25, BLOCK=32)

    def work(index):
        x, y = pairs[index]
        for step in range(100):
            kernel[(index + 1,)](x, y, 64 + 16 * index, float(step), BLOCK=32)
            prepared(x, y)

    errors = run_in_threads(work, 6)
    assert not errors and len(mocked.stub.launches) == 1200
    for launch in mocked.stub.launches:
        pointer, _, n, factor = (struct.unpack("<" + k.format, b)[0] for k, b in zip(_SCALE_KINDS, launch[5]))
        index = next(i for i, (x, _) in enumerate(pairs) if x.data_ptr() == pointer)
        if launch[1] == (1, 1, 1) and (n, factor) == (64, 0.25):
            continue    # a prepared launch
        assert launch[1] == (index + 1, 1, 1) and n == 64 + 16 * index
