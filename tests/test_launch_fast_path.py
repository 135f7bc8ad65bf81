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
from fusedops.dsl.runtime import driver
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
    monkeypatch.setattr(driver, "_driver", lambda: types.SimpleNamespace(cuLaunchKernel=cu_launch_kernel))
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
    kernel[(1,)](x, y, 64, 2.0, BLOCK=32, bias=1.5)     # a runtime parameter by keyword: full path, no plan
    kernel[(1,)](x, y, 64, 2.0, BLOCK=32, bias=1.5)
    assert len(lookups) == 2 and not kernel._plans
    raw, packer = _packed(kernel, gpu[-1][1])
    assert raw == packer.pack_values([x.data_ptr(), y.data_ptr(), 64, 2.0, 1.5])
    kernel[(1,)](x, y, 64, 2.0, 32)                     # BLOCK by position: a plan of its own
    seen = {}
    kernel[lambda meta: seen.update(meta) or (meta["n"] // meta["BLOCK"],)](x, y, 64, 2.0, 32)
    assert len(lookups) == 3
    assert gpu[-1][0] == (2, 1, 1) and seen["BLOCK"] == 32 and seen["bias"] == 0.5 and seen["num_warps"] == 4
    count = len(gpu)
    kernel[(0,)](x, y, 64, 2.0, 32)
    assert len(gpu) == count and len(lookups) == 3      # an empty grid launches nothing


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
    return {tuple((spec.type, spec.equal_to_one, spec.divisible_by_16, spec.value) for spec in key.args)
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
        (x, y, 2**40, 2.0, 32),                                     # n needs int64
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


def test_rebinding_a_global_the_kernel_read_misses_the_plan(gpu, monkeypatch):
    def global_kernel(y_ptr):
        dsl.store(y_ptr, GLOBAL_SCALE)

    kernel = dsl.jit(global_kernel)
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
