"""Test-suite configuration: the GPU tier, deterministic seeds, Hypothesis settings.

- Tests marked `cuda` are skipped when torch sees no CUDA GPU, so `python -m pytest -q tests`
  runs the CPU tier anywhere (CI adds `-n auto --maxprocesses 8`, see README); `python -m pytest -q -m cuda tests`
  runs only the GPU tier.
- The `seed` fixture gives each test case its own fixed seed (derived from its node id): fresh
  data per parametrized case, the same data on every run. The global torch/NumPy RNGs are seeded
  with it too, so a test that draws from them is reproducible as well.
- Tests marked `large_memory` run one at a time across pytest-xdist workers (a file lock).
- Hypothesis runs derandomized (the same examples every run) and without deadlines (the
  interpreter is slow on a shared 2-core CI machine).
"""

from __future__ import annotations

import gc
import os
import tempfile

import filelock
import numpy as np
import pytest
import torch

from helpers import seed_for

try:
    from hypothesis import settings as _hypothesis_settings
except ImportError:  # hypothesis is in the [test] extra; the suite still collects without it
    _hypothesis_settings = None

if _hypothesis_settings is not None:
    _hypothesis_settings.register_profile("fusedops", derandomize=True, deadline=None, print_blob=True)
    _hypothesis_settings.load_profile("fusedops")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _one_large_memory_test_at_a_time(request):
    """Tests marked `large_memory` (tensors of 2**31 elements and more) hold a file lock shared by the
    pytest-xdist workers while they run: several of them at once (4-25 GiB each) ran the GPU out of memory
    under `-m cuda -n 12`, while the other tests take well under a GiB each. The test's memory goes back to
    the driver before the lock does (torch's caching allocator would keep it for this worker alone)."""
    if request.node.get_closest_marker("large_memory") is None:
        yield
        return
    with filelock.FileLock(os.path.join(tempfile.gettempdir(), "fusedops-large-memory-tests.lock")):
        try:
            yield
        finally:
            gc.collect()
            if torch.cuda.is_initialized():
                torch.cuda.empty_cache()


@pytest.fixture
def seed(request) -> int:
    """This test case's seed; pass it to `helpers.random_tensor`."""
    return seed_for(request.node.nodeid)


@pytest.fixture(autouse=True)
def _seed_global_rngs(request):
    value = seed_for(request.node.nodeid)
    torch.manual_seed(value)
    np.random.seed(value)
    yield


@pytest.fixture
def reset_dynamo():
    """torch._dynamo.reset() before and after a test that compiles (a fresh cache and recompile budget)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def tma_ws0(monkeypatch, tmp_path):
    """Compile with FUSEDOPS_TMA=1 and FUSEDOPS_WS=0 into a fresh kernel cache (the knobs are read at
    compile time, so cached kernels of other settings must not be found)."""
    monkeypatch.setenv("FUSEDOPS_TMA", "1")
    monkeypatch.setenv("FUSEDOPS_WS", "0")
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    return monkeypatch


@pytest.fixture
def interpret(monkeypatch):
    """The library's ops run their kernels in the interpreter (FUSEDOPS_INTERPRET=1); files may define their own."""
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")


@pytest.fixture
def fallback(monkeypatch):
    """The library's ops on CPU tensors take their torch fallback (FUSEDOPS_INTERPRET unset)."""
    monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)


@pytest.fixture(params=["interpret", "fallback"])
def route(request, monkeypatch):
    """Both CPU routes of the public ops: the kernels in the interpreter (FUSEDOPS_INTERPRET=1, what CUDA
    tensors take) and torch's op (what a CPU user gets by default); the parameter's name."""
    if request.param == "interpret":
        monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    else:
        monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)
    return request.param
