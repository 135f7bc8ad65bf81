"""The cached-launch fast path of `kernel[grid](...)` (runtime/jit.py), on the CPU with the CUDA
driver mocked: a cached launch packs the same bytes as the full path, and every argument the full
path rejects or specializes differently misses the cache (and is rejected or compiled anew).

Tensors pass for CUDA tensors through `_FakeCudaTensor` (a CPU tensor whose `device` and
`get_device()` name a CUDA device); the driver's `cuLaunchKernel` only records its arguments.
"""

from __future__ import annotations

import ctypes
import types

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.runtime import driver, kernel_launcher
from fusedops.dsl.runtime.jit import JITFunction


class _FakeCudaTensor(torch.Tensor):
    """A CPU tensor that claims to live on CUDA device `fake_index`."""

    fake_index = 0

    @property
    def device(self):
        return torch.device("cuda", self.fake_index)

    def get_device(self) -> int:
        return self.fake_index


def _cuda(tensor: torch.Tensor, index: int = 0) -> torch.Tensor:
    fake = torch.Tensor._make_subclass(_FakeCudaTensor, tensor)
    fake.fake_index = index
    return fake


@pytest.fixture
def gpu(monkeypatch, tmp_path):
    """Mocks the driver; returns the list of recorded launches (grid, kernelParams address)."""
    launches = []

    def cu_launch_kernel(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        launches.append(((gx, gy, gz), params))
        return (0,)

    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FUSEDOPS_DEFAULT_ARCH", "sm_90a")     # no device capability query
    monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)
    monkeypatch.setattr(driver, "cuda_driver", lambda: types.SimpleNamespace(cuLaunchKernel=cu_launch_kernel))
    monkeypatch.setattr(driver, "load_module", lambda ptx, name, index=None: driver.LoadedKernel(
        name, None, None, None, 32, 0, 0, 1024, driver.DEFAULT_SHARED_MEMORY_LIMIT))
    monkeypatch.setattr(driver, "raw_stream_getter", lambda: (lambda index: 0))
    return launches


def _new_kernel() -> JITFunction:
    # A fresh JITFunction per test, so that no plan or specialization leaks between tests.
    def scale_kernel(x_ptr, y_ptr, n, factor, BLOCK: dsl.constexpr, bias=0.5):
        offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
        mask = offsets < n
        dsl.store(y_ptr + offsets, dsl.load(x_ptr + offsets, mask=mask) * factor + bias, mask=mask)

    return dsl.jit(scale_kernel)


def _counting_lookups(kernel, monkeypatch) -> list:
    """Records each full-path lookup of `kernel` (the fast path makes none)."""
    calls = []
    original = kernel._lookup

    def lookup(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(kernel, "_lookup", lookup)
    return calls


def _packed(kernel, params: int) -> tuple:
    """(argument bytes at `params`, a kernelParams address; the packer) of the kernel's only launcher."""
    (entry,) = [e for e in kernel._cache.values() if e.compiled is not None]
    packer = entry.compiled.launcher(0).packer
    return ctypes.string_at(params + packer.values_offset, packer.values_size), packer


def test_cached_launch_skips_the_full_path_and_packs_the_same_bytes(gpu, monkeypatch):
    kernel = _new_kernel()
    lookups = _counting_lookups(kernel, monkeypatch)
    x, y = _cuda(torch.zeros(64)), _cuda(torch.zeros(64))
    kernel[(2,)](x, y, 64, 2.0, BLOCK=32)
    assert len(lookups) == 1 and len(kernel._plans) == 1
    x2, y2 = _cuda(torch.zeros(64)), _cuda(torch.zeros(64))
    kernel[(3, 1)](x2, y2, 48, 3.0, BLOCK=32)
    assert len(lookups) == 1, "the second launch should take the fast path"
    assert [grid for grid, _ in gpu] == [(2, 1, 1), (3, 1, 1)]
    raw, packer = _packed(kernel, gpu[1][1])
    # runtime parameters: x_ptr, y_ptr, n (48: divisible by 16, still runtime), factor, bias (default)
    assert raw == packer.pack_values([x2.data_ptr(), y2.data_ptr(), 48, 3.0, 0.5])


def test_fast_path_grids_keywords_and_zero_grids(gpu, monkeypatch):
    kernel = _new_kernel()
    lookups = _counting_lookups(kernel, monkeypatch)
    x, y = _cuda(torch.zeros(64)), _cuda(torch.zeros(64))
    kernel[(1,)](x, y, 64, 2.0, BLOCK=32, bias=1.5)     # a runtime parameter by keyword
    kernel[(1,)](x, y, 64, 2.0, BLOCK=32, bias=1.5)     # the generated binder binds keywords: fast path
    assert len(lookups) == 1 and len(kernel._plans) == 1
    raw, packer = _packed(kernel, gpu[-1][1])
    assert raw == packer.pack_values([x.data_ptr(), y.data_ptr(), 64, 2.0, 1.5])
    kernel[(1,)](x, y, 64, 2.0, 32)                     # BLOCK by position, bias by default: the same plan
    assert len(lookups) == 1 and len(kernel._plans) == 1
    raw, _ = _packed(kernel, gpu[-1][1])
    assert raw == packer.pack_values([x.data_ptr(), y.data_ptr(), 64, 2.0, 0.5])
    seen = {}
    kernel[lambda meta: seen.update(meta) or (meta["n"] // meta["BLOCK"],)](x, y, 64, 2.0, 32)
    assert len(lookups) == 1
    assert gpu[-1][0] == (2, 1, 1) and seen["BLOCK"] == 32 and seen["bias"] == 0.5 and seen["num_warps"] == 4
    count = len(gpu)
    kernel[(0,)](x, y, 64, 2.0, 32)
    kernel[(4, 0)](x, y, 64, 2.0, 32)
    assert len(gpu) == count and len(lookups) == 1      # an empty grid launches nothing


def test_fast_path_rejects_what_the_full_path_rejects(gpu):
    kernel = _new_kernel()
    x, y = _cuda(torch.zeros(64)), _cuda(torch.zeros(64))
    kernel[(1,)](x, y, 64, 2.0, BLOCK=32)
    kernel[(1,)](x, y, 64, 2.0, BLOCK=32)
    assert len(kernel._plans) == 1
    with pytest.raises(TypeError, match="missing argument `factor`"):
        kernel[(1,)](x, y, 64, BLOCK=32)
    with pytest.raises(TypeError, match="takes 6 arguments"):
        kernel[(1,)](x, y, 64, 2.0, 32, 0.5, 7)
    with pytest.raises(TypeError, match="unexpected keyword argument `BLOK`"):
        kernel[(1,)](x, y, 64, 2.0, BLOK=32)
    with pytest.raises(TypeError, match="argument `n` .* must be"):
        kernel[(1,)](x, y, "64", 2.0, BLOCK=32)
    with pytest.raises(ValueError, match="argument `y_ptr`.*cpu tensor"):
        kernel[(1,)](x, torch.zeros(64), 64, 2.0, BLOCK=32)
    with pytest.raises(ValueError, match="argument `y_ptr`.*is on cuda:1 but an earlier tensor argument is on cuda:0"):
        kernel[(1,)](x, _cuda(torch.zeros(64), 1), 64, 2.0, BLOCK=32)
    with pytest.raises(dsl.LaunchError, match="grid entry 0"):
        kernel[(-1,)](x, y, 64, 2.0, BLOCK=32)
    with pytest.raises(dsl.LaunchError, match="num_warps"):
        kernel[(1,)](x, y, 64, 2.0, BLOCK=32, num_warps=3)
    with pytest.raises(dsl.LaunchError, match="num_warps"):
        kernel[(1,)](x, y, 64, 2.0, BLOCK=32, num_warps=4.0)
    with pytest.raises(TypeError, match="argument `n` .* does not fit in 64 bits"):
        kernel[(1,)](x, y, 2**70, 2.0, BLOCK=32)


def _specializations(kernel) -> set:
    return {tuple((spec.type, spec.equal_to_one, spec.divisibility, spec.value) for spec in key.args)
            for key in kernel._cache}


def test_what_specialization_reads_makes_a_new_specialization(gpu, monkeypatch):
    kernel = _new_kernel()
    lookups = _counting_lookups(kernel, monkeypatch)
    base = torch.zeros(80)
    x, y = _cuda(base[:64]), _cuda(torch.zeros(64))
    variants = [
        (x, y, 64, 2.0, 32),                                        # the first specialization
        (_cuda(base[:64].half()), _cuda(torch.zeros(64).half()), 64, 2.0, 32),   # dtype
        (_cuda(base[1:65]), y, 64, 2.0, 32),                        # x no longer 16-byte aligned
        (x, y, 1, 2.0, 32),                                         # n == 1
        (x, y, 63, 2.0, 32),                                        # n not divisible by 16
        (x, y, 56, 2.0, 32),                                        # n divisible by 8, not by 16
        (x, y, 2**40, 2.0, 32),                                     # n needs int64
        (x, y, 2**40 + 8, 2.0, 32),                                 # an int64 divisible by 8, not by 16
        (x, y, 2**40 + 1, 2.0, 32),                                 # an int64 divisible by neither
        (x, y, 64, 2, 32),                                          # factor an int
        (x, y, 64, 2.0, 64),                                        # BLOCK
    ]
    for count, args in enumerate(variants, start=1):
        kernel[(1,)](*args)
        kernel[(1,)](*args)                         # the second launch of each takes the fast path
        assert len(lookups) == count and len(_specializations(kernel)) == count
    assert gpu[-1][0] == (1, 1, 1)
    kernel[(1,)](x, y, 64, 2.0, True)               # True == 1 == 1.0 must not share a plan with 1
    kernel[(1,)](x, y, 64, 2.0, 1)
    assert len(lookups) == len(variants) + 2


GLOBAL_SCALE = 2.0


def _global_kernel() -> JITFunction:
    """A fresh kernel that stores the module global GLOBAL_SCALE (read when it compiles)."""
    def global_kernel(y_ptr):
        dsl.store(y_ptr, GLOBAL_SCALE)

    return dsl.jit(global_kernel)


def test_rebinding_a_global_the_kernel_read_misses_the_plan(gpu, monkeypatch):
    kernel = _global_kernel()
    lookups = _counting_lookups(kernel, monkeypatch)
    y = _cuda(torch.zeros(4))
    kernel[(1,)](y)
    kernel[(1,)](y)
    assert len(lookups) == 1
    monkeypatch.setitem(globals(), "GLOBAL_SCALE", 3.0)
    kernel[(1,)](y)
    kernel[(1,)](y)
    assert len(lookups) == 2        # regenerated once, then cached again
    (entry,) = kernel._cache.values()
    assert [obj for _, name, obj in entry.kernel.used_globals if name == "GLOBAL_SCALE"] == [3.0]


def test_interpreter_and_cpu_tensors_never_take_the_fast_path(gpu, monkeypatch):
    kernel = _new_kernel()
    x, y = _cuda(torch.arange(64.0)), _cuda(torch.zeros(64))
    kernel[(1,)](x, y, 64, 2.0, BLOCK=64)
    kernel[(1,)](x, y, 64, 2.0, BLOCK=64)
    cpu_x, cpu_y = torch.arange(64.0), torch.zeros(64)
    kernel[(1,)](cpu_x, cpu_y, 64, 2.0, BLOCK=64, interpret=True)
    assert torch.equal(cpu_y, cpu_x * 2.0 + 0.5)
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    cpu_y.zero_()
    kernel[(1,)](cpu_x, cpu_y, 64, 3.0, BLOCK=64)
    assert torch.equal(cpu_y, cpu_x * 3.0 + 0.5)


# ------------------------------------------------------------------------------------------------
# The generated entry of kernel[grid] (fast_path.make_entry): what the full path says, said again
# ------------------------------------------------------------------------------------------------
def test_entry_binding_errors_are_the_full_paths(gpu):
    kernel = _new_kernel()
    x, y = _cuda(torch.zeros(64)), _cuda(torch.zeros(64))
    kernel[(1,)](x, y, 64, 2.0, BLOCK=32)
    assert kernel._launch_entry is not None     # made by the first GPU launch
    with pytest.raises(TypeError, match="kernel `scale_kernel` is missing argument `n`"):
        kernel[(1,)](x, y, factor=2.0, BLOCK=32)
    with pytest.raises(TypeError, match="missing argument `BLOCK`"):
        kernel[(1,)](x, y, 64, 2.0)
    with pytest.raises(TypeError, match="takes 6 arguments .* but 8 were given"):
        kernel[(1,)](x, y, 64, 2.0, 32, 0.5, 7, 8)
    with pytest.raises(TypeError, match="unexpected keyword argument `BLOK`"):
        kernel[(1,)](x, y, 64, 2.0, BLOK=32)
    with pytest.raises(TypeError, match="multiple values for argument"):
        kernel[(1,)](x, y, 64, 2.0, 32, BLOCK=32)
    with pytest.raises(dsl.LaunchError, match="num_stages"):
        kernel[(1,)](x, y, 64, 2.0, BLOCK=32, num_stages=True)
    launches = len(gpu)
    kernel[(1,)](x, y, n=64, factor=2.0, BLOCK=32)     # all by keyword: still the cached plan
    assert len(gpu) == launches + 1 and len(kernel._plans) == 1


def test_entry_grid_callables_see_every_argument(gpu):
    kernel = _new_kernel()
    x, y = _cuda(torch.zeros(64)), _cuda(torch.zeros(64))
    kernel[(1,)](x, y, 64, 2.0, BLOCK=32)
    seen = []
    kernel[lambda meta: seen.append(meta) or (3, 2)](x, y, 64, 2.0, BLOCK=16, num_warps=2)
    kernel[lambda meta: seen.append(meta) or (3, 2)](x, y, 64, 2.0, BLOCK=16, num_warps=2)
    assert [grid for grid, _ in gpu[-2:]] == [(3, 2, 1)] * 2
    assert seen[-1]["BLOCK"] == 16 and seen[-1]["bias"] == 0.5 and seen[-1]["num_warps"] == 2
    with pytest.raises(dsl.LaunchError, match="grid entry 1"):
        kernel[(1, 70000)](x, y, 64, 2.0, BLOCK=16, num_warps=2)


# ------------------------------------------------------------------------------------------------
# Prepared launches (JITFunction.prepare), what the library's launch wrappers cache
# ------------------------------------------------------------------------------------------------
def test_prepared_launch_packs_what_a_launch_would(gpu, monkeypatch):
    kernel = _new_kernel()
    lookups = _counting_lookups(kernel, monkeypatch)
    x, y = _cuda(torch.zeros(64)), _cuda(torch.zeros(64))
    prepared = kernel.prepare((4,), x, y, 64, 2.0, BLOCK=16)
    assert not gpu and len(lookups) == 1             # checked and compiled, not launched
    x2, y2 = _cuda(torch.ones(64)), _cuda(torch.ones(64))
    prepared(x2, y2)
    prepared(x2, y2)
    assert len(lookups) == 1 and [grid for grid, _ in gpu] == [(4, 1, 1)] * 2
    (entry,) = kernel._cache.values()
    packer = entry.compiled.launcher(0).packer
    assert packer.read(gpu[-1][1]) == packer.read(packer.pack([x2.data_ptr(), y2.data_ptr(), 64, 2.0, 0.5]))


def test_prepared_launch_packs_its_constants_once(gpu, monkeypatch):
    def scalar_first_kernel(n, scale, x_ptr, y_ptr, BLOCK: dsl.constexpr):
        offsets = dsl.arange(0, BLOCK)
        dsl.store(y_ptr + offsets, dsl.load(x_ptr + offsets, mask=offsets < n) * scale, mask=offsets < n)

    kernel = dsl.jit(scalar_first_kernel)
    x, y = _cuda(torch.zeros(64)), _cuda(torch.zeros(64))
    prepared = kernel.prepare((2,), 48, 0.5, x, y, BLOCK=16)
    (entry,) = kernel._cache.values()
    packer = entry.compiled.launcher(0).packer
    for _ in range(2):      # the constants come first in the kernel's parameters, the pointers first in the buffer
        x2, y2 = _cuda(torch.zeros(64)), _cuda(torch.zeros(64))
        prepared(x2, y2)
        assert packer.read(gpu[-1][1]) == (48, 0.5, x2.data_ptr(), y2.data_ptr())
    with pytest.raises(dsl.LaunchError, match=r"argument 1 \(scale\) of kind float32"):
        kernel.prepare((1,), 48, 1e39, x, y, BLOCK=16)


def test_prepared_launch_takes_the_full_path_for_what_it_was_not_prepared_for(gpu, monkeypatch):
    kernel = _new_kernel()
    lookups = _counting_lookups(kernel, monkeypatch)
    base = torch.zeros(80)
    x, y = _cuda(base[:64]), _cuda(torch.zeros(64))
    prepared = kernel.prepare((1,), x, y, 64, 2.0, BLOCK=16)
    prepared(_cuda(base[1:65]), y)                  # x no longer 16-byte aligned: a new specialization
    assert len(lookups) == 2 and len(_specializations(kernel)) == 2
    unaligned = [k for k in kernel._cache if not k.args[0].divisible_by_16]
    assert unaligned, "the launch of the unaligned tensor must use a kernel specialized for it"
    prepared(x, y)                                  # aligned again: the prepared launch
    assert len(lookups) == 2

    def optional_kernel(x_ptr, y_ptr, n, BLOCK: dsl.constexpr):
        offsets = dsl.arange(0, BLOCK)
        value = dsl.load(x_ptr + offsets, mask=offsets < n)
        if y_ptr is not None:
            dsl.store(y_ptr + offsets, value, mask=offsets < n)

    optional = dsl.jit(optional_kernel)
    lookups = _counting_lookups(optional, monkeypatch)
    prepared = optional.prepare((1,), x, None, 64, BLOCK=64)
    prepared(x, None)
    assert len(lookups) == 1
    prepared(x, y)                                  # a tensor where None was prepared: compiled for it
    assert len(lookups) == 2 and len(optional._cache) == 2


def test_prepared_launch_errors_and_interpreter(gpu, monkeypatch):
    kernel = _new_kernel()
    x, y = _cuda(torch.zeros(64)), _cuda(torch.zeros(64))
    with pytest.raises(ValueError, match="argument `y_ptr`.*cpu tensor"):
        kernel.prepare((1,), x, torch.zeros(64), 64, 2.0, BLOCK=16)
    with pytest.raises(TypeError, match="argument `n` .* must be"):
        kernel.prepare((1,), x, y, "64", 2.0, BLOCK=16)
    with pytest.raises(TypeError, match="missing argument `factor`"):
        kernel.prepare((1,), x, y, 64, BLOCK=16)
    with pytest.raises(dsl.LaunchError, match="num_warps"):
        kernel.prepare((1,), x, y, 64, 2.0, BLOCK=16, num_warps=3)
    assert not gpu
    cpu_x, cpu_y = torch.arange(64.0), torch.zeros(64)
    prepared = kernel.prepare((1,), cpu_x, cpu_y, 64, 2.0, BLOCK=64, interpret=True)
    other = torch.zeros(64)
    prepared(cpu_x, other)
    assert torch.equal(other, cpu_x * 2.0 + 0.5) and not gpu


def test_prepared_launch_keeps_no_tensor_alive(gpu):
    import weakref

    kernel = _new_kernel()
    x, y = _cuda(torch.zeros(64)), _cuda(torch.zeros(64))
    prepared = kernel.prepare((1,), x, y, 64, 2.0, BLOCK=16)
    references = [weakref.ref(x), weakref.ref(y)]
    del x, y
    assert all(reference() is None for reference in references)
    prepared(_cuda(torch.zeros(64)), _cuda(torch.zeros(64)))
    assert len(gpu) == 1


def test_prepared_launch_rereads_rebound_globals(gpu, monkeypatch):
    kernel = _global_kernel()
    lookups = _counting_lookups(kernel, monkeypatch)
    y = _cuda(torch.zeros(4))
    prepared = kernel.prepare((1,), y)
    prepared(y)
    assert len(lookups) == 1
    monkeypatch.setitem(globals(), "GLOBAL_SCALE", 5.0)
    prepared(y)
    assert len(lookups) == 2
    (entry,) = [e for e in kernel._cache.values() if e.compiled is not None]
    assert [obj for _, name, obj in entry.kernel.used_globals if name == "GLOBAL_SCALE"] == [5.0]


def test_prepared_launch_is_per_device_and_thread_safe(gpu, monkeypatch):
    import threading

    streams = []
    monkeypatch.setattr(driver, "raw_stream_getter", lambda: (lambda index: streams.append(index) or 0))
    packed = []

    def record(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        first_value = ctypes.c_uint64.from_address(params).value     # kernelParams[0]: where x_ptr's value is
        packed.append(ctypes.string_at(first_value, 16))             # x_ptr, y_ptr
        return (0,)

    monkeypatch.setattr(driver, "cuda_driver", lambda: types.SimpleNamespace(cuLaunchKernel=record))
    kernel = _new_kernel()
    on_1 = kernel.prepare((1,), _cuda(torch.zeros(64), 1), _cuda(torch.zeros(64), 1), 64, 2.0, BLOCK=16)
    on_1(_cuda(torch.zeros(64), 1), _cuda(torch.zeros(64), 1))
    assert streams[-1] == 1         # the stream of device 1
    on_0 = kernel.prepare((1,), _cuda(torch.zeros(64)), _cuda(torch.zeros(64)), 64, 2.0, BLOCK=16)
    on_0(_cuda(torch.zeros(64)), _cuda(torch.zeros(64)))
    assert streams[-1] == 0

    tensors = [(_cuda(torch.zeros(64)), _cuda(torch.zeros(64))) for _ in range(4)]
    expected = {ctypes.string_at(ctypes.addressof(ctypes.c_uint64(x.data_ptr())), 8)
                + ctypes.string_at(ctypes.addressof(ctypes.c_uint64(y.data_ptr())), 8) for x, y in tensors}

    def worker(x, y):
        for _ in range(200):
            on_0(x, y)

    threads = [threading.Thread(target=worker, args=pair) for pair in tensors]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {bytes_[:16] for bytes_ in packed[-800:]} == expected    # every launch read its own thread's arguments


# ------------------------------------------------------------------------------------------------
# The library's launch wrappers: launches cached per layout launch exactly what the uncached path
# launches, for each call's own tensors, and a new layout, dtype or device makes a new entry
# ------------------------------------------------------------------------------------------------
def _forget_library_launchers() -> None:
    """Drop every launcher the library kernels hold (built on another test's mocked driver), and the
    launches cached on them: the next launch builds them on this test's driver."""
    from fusedops.autograd import attention as attention_autograd, matmul as matmul_autograd
    from fusedops.autograd import norms as norms_autograd, softmax as softmax_autograd
    from fusedops.bench.selfcheck import library_kernels
    from fusedops.kernels import attention, norms, softmax

    # every library module's kernels, so that a kernel moved to another module is still found
    kernels, import_failures = library_kernels()
    assert not import_failures, import_failures
    for kernel in kernels:
        kernel._plans.clear()
        for entry in kernel._cache.values():
            if entry.compiled is not None:
                entry.compiled._launchers.clear()
    for cache in (softmax._FORWARD_LAUNCHES, softmax._BACKWARD_LAUNCHES, norms._FORWARD_LAUNCHES,
                  norms._BACKWARD_LAUNCHES, matmul_autograd._FORWARD_LAUNCHES, attention._FORWARD_LAUNCHES,
                  attention._BACKWARD_LAUNCHES, attention_autograd._KNOWN_LAUNCHES, matmul_autograd._KNOWN_PRODUCTS,
                  norms_autograd._KNOWN_LAUNCHES, softmax_autograd._KNOWN_LAUNCHES):
        cache.clear()


@pytest.fixture
def launches(gpu, monkeypatch):
    """The (kernel name, grid, argument values) of every launch, read back from the kernelParams the
    driver is given (so launches inlined into generated code are seen too); CPU tensors pass for cuda:0."""
    from fusedops.dsl.runtime import jit as jit_module

    _forget_library_launchers()
    recorded = []
    loaded = {}         # the stand-in CUfunction of each loaded kernel -> (its name, its launcher's packer)

    class _Function:    # one per loaded module
        pass

    def load_module(ptx, name, index=None):
        return driver.LoadedKernel(name, None, _Function(), None, 32, 0, 0, 1024, driver.DEFAULT_SHARED_MEMORY_LIMIT)

    init = kernel_launcher.KernelLauncher.__init__

    def recording_init(self, kernel, *args, **kwargs):
        init(self, kernel, *args, **kwargs)
        loaded[kernel.function] = (kernel.name, self.packer)

    def cu_launch_kernel(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        name, packer = loaded[function]
        recorded.append((name, (gx, gy, gz), packer.read(params)))
        return (0,)

    monkeypatch.setattr(driver, "load_module", load_module)
    monkeypatch.setattr(kernel_launcher.KernelLauncher, "__init__", recording_init)
    monkeypatch.setattr(driver, "cuda_driver", lambda: types.SimpleNamespace(cuLaunchKernel=cu_launch_kernel))
    monkeypatch.setattr(jit_module, "cuda_device", lambda kernel, params, values: torch.device("cuda", 0))
    yield recorded
    _forget_library_launchers()


def _symbolic(launch: tuple, **tensors) -> tuple:
    """A recorded launch with the data pointers of `tensors` replaced by their names."""
    names = {t.data_ptr(): name for name, t in tensors.items() if t is not None}
    name, grid, args = launch
    return name, grid, tuple(names.get(a, a) if isinstance(a, int) and a > 4096 else a for a in args)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_softmax_launches_cached_per_layout(launches, dtype):
    from fusedops.kernels import softmax as K
    from fusedops.kernels.softmax_kernels import _forward_kernel
    from fusedops.kernels.softmax_rows import empty_in_order_of

    K._FORWARD_LAUNCHES.clear()
    shapes = [((4, 100), 1, False), ((4, 100), 1, True), ((100, 4), 0, False), ((3, 5, 8), 1, False)]
    for shape, dim, transposed in shapes:
        for _ in range(2):      # the second call takes the cached launch
            base = torch.randn(*shape[::-1] if transposed else shape, dtype=dtype)
            x = base.t() if transposed else base
            # the prepared launch of softmax_forward's cached SoftmaxLaunches, into a y laid out as the kernels
            # write it (x's dim order: softmax_forward returns a permuted x's result copied to a contiguous one)
            y = empty_in_order_of(x, x.dtype)
            K.softmax_launches(x, dim, log=False)._launch(y, x)
            cached = _symbolic(launches[-1], x=x, y=y)
            plan = K._plan_launch(x.shape, dim, (x.stride(), y.stride()), (x.dtype, y.dtype), False, False, None, None)
            _forward_kernel[plan.grid](y, x, *plan.arguments, **plan.constexprs)     # the uncached launch
            assert cached == _symbolic(launches[-1], x=x, y=y)
    assert len(K._FORWARD_LAUNCHES) == len(shapes)
    K.softmax_forward(torch.randn(4, 100, dtype=torch.float64 if dtype == torch.float32 else torch.float32), 1,
                      log=False)
    assert len(K._FORWARD_LAUNCHES) == len(shapes) + 1     # a new dtype: a new entry


def test_softmax_backward_plan_matches_softmax_backward(launches, monkeypatch):
    import fusedops.functional as functional
    from fusedops.kernels import softmax as K

    monkeypatch.setattr(functional, "_runs_kernels", lambda x, *dtypes: True)
    for make_dy in (lambda y: torch.randn_like(y), lambda y: torch.randn(y.shape[1]).expand(y.shape)):
        x = torch.randn(4, 100, requires_grad=True)
        y = functional.softmax(x, -1)
        dy = make_dy(y)
        y.backward(dy)
        planned = _symbolic(launches[-1], dy=dy, y=y, dx=x.grad)
        dx = K.softmax_backward(dy, y.detach(), 1, log=False)
        assert planned == _symbolic(launches[-1], dy=dy, y=y, dx=dx)


@pytest.mark.parametrize("subtract_mean", [True, False])
def test_norm_launches_cached_per_layout(launches, subtract_mean):
    from fusedops.kernels import norms as N
    from fusedops.kernels.norm_forward_config import forward_config
    from fusedops.kernels.norm_rows import as_rows

    N._FORWARD_LAUNCHES.clear()
    N._BACKWARD_LAUNCHES.clear()
    cases = [(lambda: torch.randn(3, 4, 64), True), (lambda: torch.randn(64, 12).t().reshape(3, 4, 64), True),
             (lambda: torch.randn(3, 4, 64), False), (lambda: torch.randn(3, 1, 64).expand(3, 4, 64), True)]
    for make_x, affine in cases:
        for _ in range(2):
            x = make_x()
            w = torch.randn(64) if affine else None
            b = torch.randn(64) if affine and subtract_mean else None
            y, mean, rstd = N.norm_forward(x, w, b, 1e-5, subtract_mean=subtract_mean, n_cols=64)
            names = dict(x=x, w=w, b=b, y=y, mean=mean, rstd=rstd)
            cached = _symbolic(launches[-1], **names)
            rows = as_rows(x, 12, 64)
            names["x"] = rows           # the uncached path reads the (12, 64) view (or copy) of x
            reference = N.norm_forward(rows, w, b, 1e-5, subtract_mean=subtract_mean,
                                       config=forward_config(64, x.dtype))
            names.update(y=reference[0], mean=reference[1], rstd=reference[2])
            if rows.data_ptr() == x.data_ptr():
                assert cached == _symbolic(launches[-1], **names)

            dy = torch.randn(3, 4, 64)
            grads = N.norm_backward(dy, x, w, mean, rstd, subtract_mean=subtract_mean, input_grad=True,
                                    weight_grad=affine, bias_grad=b is not None, bias_dtype=torch.float32, n_cols=64)
            assert grads[0].shape == x.shape and grads[0].is_contiguous()
            assert (grads[1] is not None) == affine
    assert len(N._FORWARD_LAUNCHES) == len(cases)


def test_matmul_and_attention_launches_cached_per_layout(launches):
    from fusedops.autograd import matmul as M
    from fusedops.kernels import attention as A
    from fusedops.kernels.attention_configs import forward_config
    from fusedops.kernels import matmul as MK

    M._FORWARD_LAUNCHES.clear()
    cases = [((8, 16), (16, 24), False), ((2, 8, 16), (16, 24), True), ((16,), (16, 24), False)]
    for a_shape, b_shape, transpose_b in cases:
        for _ in range(2):
            a = torch.randn(a_shape, dtype=torch.float16)
            b = torch.randn(b_shape, dtype=torch.float16)
            if transpose_b:     # read through its strides, in place
                b = torch.randn(b_shape[::-1], dtype=torch.float16).t()
            c = M.forward_kernel(a, b, None, None, None)
            cached = _symbolic(launches[-1], a=a, b=b, c=c)
            a3, b3, batch, m, n = M._operands(a, b)
            c3 = c.view(max(a3.shape[0], b3.shape[0]), m, n)
            MK.matmul_into(c3, a3, b3)
            assert cached == _symbolic(launches[-1], a=a, b=b, c=c)
    assert len(M._FORWARD_LAUNCHES) == 3

    A._FORWARD_LAUNCHES.clear()
    for mask_dtype in (None, torch.bool, torch.float16):
        for _ in range(2):
            q, k, v = (torch.randn(1, 2, 32, 16, dtype=torch.float16) for _ in range(3))
            mask = None if mask_dtype is None else torch.ones(32, 32, dtype=mask_dtype).expand(1, 2, 32, 32)
            o, lse = A.attention_forward(q, k, v, mask, False, 0.25)
            cached = _symbolic(launches[-1], q=q, k=k, v=v, o=o, lse=lse, mask=mask)
            reference = A.attention_forward(q, k, v, mask, False, 0.25, config=forward_config(16, 16))
            names = dict(q=q, k=k, v=v, o=reference[0], lse=reference[1], mask=mask)
            assert cached == _symbolic(launches[-1], **names)
    assert len(A._FORWARD_LAUNCHES) == 6        # 3 layouts, each with the table's config and the forced one


def test_entry_of_a_kernel_whose_parameters_shadow_builtins(gpu, monkeypatch):
    def shadowing_kernel(type, len, tuple, callable, float, int, BLOCK: dsl.constexpr):
        offsets = dsl.arange(0, BLOCK)
        dsl.store(len + offsets, dsl.load(type + offsets) * float + int + tuple + callable)

    kernel = dsl.jit(shadowing_kernel)
    lookups = _counting_lookups(kernel, monkeypatch)
    x, y = _cuda(torch.zeros(16)), _cuda(torch.zeros(16))
    for _ in range(3):
        kernel[(1,)](x, y, 2, 3, 1.5, 7, BLOCK=16)
    assert len(lookups) == 1 and len(gpu) == 3


# ------------------------------------------------------------------------------------------------
# What the launch key keeps apart, what the cached launch re-reads each call
# ------------------------------------------------------------------------------------------------
def _constant_kernel() -> JITFunction:
    def constant_kernel(y_ptr, C: dsl.constexpr):
        dsl.store(y_ptr + dsl.arange(0, 2), dsl.full((2,), 1.0, dsl.float32) / C)

    return dsl.jit(constant_kernel)


def test_launch_key_keeps_constexprs_apart_that_compare_equal(gpu, monkeypatch):
    kernel = _constant_kernel()
    lookups = _counting_lookups(kernel, monkeypatch)
    y = _cuda(torch.zeros(2))
    values = [0.0, -0.0, float("nan"), 2, 2.0, -float("nan")]   # 0.0 == -0.0 and 2 == 2.0; nan != nan
    for count, value in enumerate(values, start=1):
        for _ in range(2):                          # the second launch of each takes its plan
            kernel[(1,)](y, C=value)
        assert len(lookups) == count, value
    kernel[(1,)](y, C=float("nan"))                 # another nan object, the same bits: the same plan
    assert len(lookups) == len(values) and len(kernel._plans) == len(values)
    assert len({key.args[1].value_key for key in kernel._cache}) == len(values)


def test_launch_key_keeps_devices_and_alignments_apart(gpu, monkeypatch):
    kernel = _new_kernel()
    lookups = _counting_lookups(kernel, monkeypatch)
    streams = []
    monkeypatch.setattr(driver, "raw_stream_getter", lambda: (lambda index: streams.append(index) or 0))
    base = [torch.zeros(80), torch.zeros(80)]
    # (device, aligned): the slot of each is distinct, and each launch runs on its tensors' device
    for device, offset in [(0, 0), (1, 0), (0, 1), (1, 1), (0, 0), (1, 1)]:
        x, y = _cuda(base[device][offset:offset + 64], device), _cuda(torch.zeros(64), device)
        kernel[(1,)](x, y, 64, 2.0, BLOCK=32)
        kernel[(1,)](x, y, 64, 2.0, BLOCK=32)
        assert streams[-1] == device
    assert len(lookups) == 4 and len(kernel._plans) == 4
    with pytest.raises(ValueError, match="is on cuda:1 but an earlier tensor argument is on cuda:0"):
        kernel[(1,)](_cuda(torch.zeros(64)), _cuda(torch.zeros(64), 1), 64, 2.0, BLOCK=32)


def test_cached_launch_reads_the_interpreter_setting_each_call(gpu, monkeypatch):
    import os

    kernel = _new_kernel()
    lookups = _counting_lookups(kernel, monkeypatch)
    x, y = _cuda(torch.arange(64.0)), _cuda(torch.zeros(64))
    kernel[(1,)](x, y, 64, 2.0, BLOCK=64)
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "0")
    kernel[(1,)](x, y, 64, 2.0, BLOCK=64)
    assert len(lookups) == 1 and len(gpu) == 2      # set, but off: still the cached launch
    cpu_x, cpu_y = torch.arange(64.0), torch.zeros(64)
    monkeypatch.setattr(os, "environ", {"FUSEDOPS_INTERPRET": "1"})    # a replaced os.environ is read too
    kernel[(1,)](cpu_x, cpu_y, 64, 3.0, BLOCK=64)
    assert torch.equal(cpu_y, cpu_x * 3.0 + 0.5) and len(gpu) == 2


def test_cached_launch_grids(gpu):
    kernel = _new_kernel()
    x, y = _cuda(torch.zeros(64)), _cuda(torch.zeros(64))
    grids = [(1,), [2], 3, (2, 3), (1, 2, 3), [4, 1]]
    for grid in grids:
        kernel[grid](x, y, 64, 2.0, BLOCK=32)
    assert [launched for launched, _ in gpu] == [(1, 1, 1), (2, 1, 1), (3, 1, 1), (2, 3, 1), (1, 2, 3), (4, 1, 1)]
    assert len(kernel._plans) == 1
    for grid, pattern in [((1.0,), "grid entry 0 of `scale_kernel` must be an int"), ((True,), "grid entry 0 .* bool"),
                          ((2**31,), r"grid entry 0 .* must be in \[0, 2147483647\]"), ((1, -1), "grid entry 1"),
                          ((1, 1, 1, 1), "1 to 3 dimensions"), ("1", "must be a tuple")]:
        with pytest.raises(dsl.LaunchError, match=pattern):
            kernel[grid](x, y, 64, 2.0, BLOCK=32)


def test_launchers_that_wrap_a_kernel_launcher_are_called_not_inlined(gpu, monkeypatch):
    # runtime.tensor_map's launcher appends arguments in its `launch`: cached launches must call it
    from fusedops.dsl import compiler

    wrapped = []

    class Wrapper:
        def __init__(self, inner):
            self.inner = inner
            self.stream_of = inner.stream_of

        def launch(self, grid, stream, values):
            wrapped.append(tuple(values))
            self.inner.launch(grid, stream, values)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    original = compiler.CompiledKernel.launcher

    def launcher(self, index):      # stored like runtime.tensor_map's, in place of the one it wraps
        inner = original(self, index)
        if not isinstance(inner, Wrapper):
            inner = self._launchers[index] = Wrapper(inner)
        return inner

    monkeypatch.setattr(compiler.CompiledKernel, "launcher", launcher)
    kernel = _new_kernel()
    x, y = _cuda(torch.zeros(64)), _cuda(torch.zeros(64))
    kernel[(1,)](x, y, 64, 2.0, BLOCK=32)
    kernel[(1,)](x, y, 48, 2.0, BLOCK=32)
    kernel.prepare((1,), x, y, 64, 2.0, BLOCK=32)(x, y)
    pointers = (x.data_ptr(), y.data_ptr())
    assert wrapped == [(*pointers, 64, 2.0, 0.5), (*pointers, 48, 2.0, 0.5), (*pointers, 64, 2.0, 0.5)]
    assert len(gpu) == 3
