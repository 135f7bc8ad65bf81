"""A private kernel cache and a mocked CUDA driver for CPU-only launch and autotune tests (tests/test_review_session35_runtime.py,
tests/test_review_session38_runtime.py), and the accumulating kernel their reset_to_zero cases launch
(tests/test_review_session26_launch.py too)."""

from __future__ import annotations

import types

import fusedops.dsl as dsl
from fusedops.dsl.runtime import autotune as autotune_module
from fusedops.dsl.runtime import driver


def private_cache(monkeypatch, tmp_path) -> None:
    """Every compile and autotune record of the test in a fresh cache directory, the interpreter setting unset."""
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)
    monkeypatch.delenv("FUSEDOPS_DISABLE_CACHE", raising=False)


def mock_cuda_driver(monkeypatch, on_launch) -> list:
    """Mock the driver: compile for sm_90a, load every module as a stub (a fresh function object per load), stream
    0 on device 0, named "Fake H200" for autotune records. Every cuLaunchKernel calls `on_launch((gx, gy, gz),
    function)` and then the functions in the returned list of effects (what the kernel would do to the tests' CPU
    tensors)."""
    effects = []

    def cu_launch_kernel(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        on_launch((gx, gy, gz), function)
        for effect in effects:
            effect()
        return (0,)

    monkeypatch.setenv("FUSEDOPS_DEFAULT_ARCH", "sm_90a")
    monkeypatch.setattr(driver, "cuda_driver", lambda: types.SimpleNamespace(cuLaunchKernel=cu_launch_kernel))
    monkeypatch.setattr(driver, "load_module", lambda ptx, name, index=None: driver.LoadedKernel(
        name, None, types.SimpleNamespace(name=name), None, 32, 0, 0, 1024, driver.DEFAULT_SHARED_MEMORY_LIMIT))
    monkeypatch.setattr(driver, "raw_stream_getter", lambda: (lambda index: 0))
    monkeypatch.setattr(driver, "require_gpu", lambda index: 0)
    monkeypatch.setattr(autotune_module, "_device_name", lambda device: "Fake H200")
    return effects


def accumulate_kernel():
    """A fresh JITFunction (no plan or specialization shared between tests) of `out[i] += x[i]` (atomic_add)."""
    def accumulate(out_ptr, x_ptr, n, BLOCK: dsl.constexpr):
        offs = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
        m = offs < n
        dsl.atomic_add(out_ptr + offs, dsl.load(x_ptr + offs, mask=m), mask=m)
    return dsl.jit(accumulate)
