"""dsl.launch_bounds(min_blocks_per_sm): `.minnctapersm` in the PTX, registers capped by ptxas,
clear errors, values unchanged (interpreter on the CPU, compiled on the GPU)."""

from __future__ import annotations

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.errors import CompilationError
from fusedops.dsl.target import ptxas
from helpers import assert_close, poison, random_tensor


@dsl.jit
def bounded_softmax(y_ptr, x_ptr, n, BLOCK: dsl.constexpr, MIN_BLOCKS: dsl.constexpr, AGAIN: dsl.constexpr):
    # one row of n <= BLOCK elements per program
    if MIN_BLOCKS:
        dsl.launch_bounds(MIN_BLOCKS)
    if AGAIN:
        dsl.launch_bounds(AGAIN)
    row = dsl.program_id(0).to(dsl.int64)
    cols = dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + row * n + cols, mask=cols < n, other=-float("inf")).to(dsl.float32)
    e = dsl.exp(x - dsl.max(x, axis=0))
    dsl.store(y_ptr + row * n + cols, e / dsl.sum(e, axis=0), mask=cols < n)


def _ptx(min_blocks, again=0, block=16384):
    x = torch.empty(16, dtype=torch.float16, device="meta")
    return bounded_softmax.compile(x, x, block, BLOCK=block, MIN_BLOCKS=min_blocks, AGAIN=again, num_warps=16,
                                   target="sm_90a").asm["ptx"]


def test_the_directive_reaches_the_ptx_and_caps_registers(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    free, capped = _ptx(0), _ptx(4)
    assert ".minnctapersm" not in free and ".minnctapersm 4" in capped and ".maxntid 512, 1, 1" in capped
    assert ".minnctapersm 4" in _ptx(4, again=4)          # the same value twice is one directive
    if ptxas.ptxas_available():
        # 4 CTAs of 512 threads share 65536 registers: at most 32 each (the uncapped kernel takes more)
        assert ptxas.assemble(free, "sm_90a").registers > 32
        assert ptxas.assemble(capped, "sm_90a").registers <= 32


@pytest.mark.parametrize("min_blocks, again, message", [
    (33, 0, "from 1 to 32"), (-1, 0, "from 1 to 32"), (2.0, 0, "constexpr int"), (2, 3, r"different min_blocks_per_sm \[2, 3\]"),
])
def test_bad_values_are_clear_errors(min_blocks, again, message, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    with pytest.raises(CompilationError, match=message):
        _ptx(min_blocks, again)


def test_interpreter_ignores_it(seed):
    x = random_tensor((3, 1000), torch.float16, seed=seed, scale=3.0)
    y = poison(torch.empty(3, 1000, dtype=torch.float32))
    bounded_softmax[(3,)](y, x, 1000, BLOCK=1024, MIN_BLOCKS=2, AGAIN=0, interpret=True)
    assert_close(y, torch.softmax(x.double(), dim=1), torch.float32)


@pytest.mark.cuda
@pytest.mark.parametrize("min_blocks", [1, 2, 4])
def test_gpu_values_unchanged(min_blocks, seed):
    x = random_tensor((67, 16381), torch.float16, "cuda", seed, scale=3.0)
    y = poison(torch.empty(67, 16381, dtype=torch.float32, device="cuda"))
    bounded_softmax[(67,)](y, x, 16381, BLOCK=16384, MIN_BLOCKS=min_blocks, AGAIN=0, num_warps=16)
    assert_close(y, torch.softmax(x.double(), dim=1), torch.float32)
