"""Loop-carried tiles computed from tensor-core dots are carried in the accumulator layout
(passes/_layout_preferences.py `prefer_tensor_core_carries`).

A kernel that keeps a finished tile for a later iteration (`out = acc.to(fp16)` in a branch, stored in
the next tile's first step: a deferred epilogue) starts `out` as a constant block. Carried in the
constant's default layout, every trip of the loop moved the tile through shared memory at the yield;
carried in the dot's accumulator layout, only the store converts it, inside its branch.

The same kernel through tensor descriptors (TMA ring, TMA store, the wgmma kept in flight across the
branches: the persistent matmul's form) at 128 x 256 tiles compiled without spills and without ptxas
serializing the wgmmas (C7514) only once an IF merges the converted tile's 16-bit pairs as pairs (packed
in the branch: codegen/control.py); merged per element, ptxas saw the tile's conversions read the
accumulator inside the wgmma pipeline. (On the H200 that deferred epilogue ran 3-4% slower than the
persistent matmul's own, session 16: not shipped.)

CPU tier: the pipelined IR on sm_80 (mma.sync) and sm_90a (wgmma) has no layout conversion in the loop
body outside the branches, the carried tile has the dot's layout, and ptxas assembles the PTX without
spills (the descriptor kernel: without C7514 either); both kernels in the interpreter against float64
(ragged M, N and K, one to several tiles).
GPU tier (`-m cuda`): the compiled kernels against float64 with a poisoned output.
"""

from __future__ import annotations

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.ir import OpCode
from fusedops.dsl.passes.manager import run_pipeline
from fusedops.dsl.passes.pipeline import default_pipeline
from fusedops.dsl.target import assemble, ptxas_available
from helpers import assert_close, poison


@dsl.jit
def deferred_tiles_kernel(c_ptr, a_ptr, b_ptr, M, N, K, BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr,
                          BLOCK_K: dsl.constexpr):
    # c_ptr: (M, N) row-major, N <= BLOCK_N; a_ptr: (M, K); b_ptr: (K, N). One program walks every row
    # tile of C, all its K steps in one loop; tile t is stored in the first K step of tile t + 1.
    tiles = dsl.cdiv(M, BLOCK_M)
    k_iters = dsl.cdiv(K, BLOCK_K)
    rm = dsl.arange(0, BLOCK_M)
    rn = dsl.arange(0, BLOCK_N)
    rk = dsl.arange(0, BLOCK_K)
    acc = dsl.zeros((BLOCK_M, BLOCK_N), dsl.float32)
    out = dsl.zeros((BLOCK_M, BLOCK_N), c_ptr.dtype.element)
    for it in range(0, tiles * k_iters):
        tile = it // k_iters
        k = it % k_iters
        if k == 0:
            if tile > 0:
                rows = (tile - 1) * BLOCK_M + rm
                dsl.store(c_ptr + rows[:, None] * N + rn[None, :], out, mask=(rows[:, None] < M) & (rn[None, :] < N))
        rows = tile * BLOCK_M + rm
        cols = k * BLOCK_K + rk
        a = dsl.load(a_ptr + rows[:, None] * K + cols[None, :], mask=(rows[:, None] < M) & (cols[None, :] < K),
                     other=0.0)
        b = dsl.load(b_ptr + cols[:, None] * N + rn[None, :], mask=(cols[:, None] < K) & (rn[None, :] < N),
                     other=0.0)
        acc = dsl.dot(a, b, acc)
        if k == k_iters - 1:
            out = acc.to(c_ptr.dtype.element)
            acc = dsl.zeros((BLOCK_M, BLOCK_N), dsl.float32)
    rows = (tiles - 1) * BLOCK_M + rm
    dsl.store(c_ptr + rows[:, None] * N + rn[None, :], out, mask=(rows[:, None] < M) & (rn[None, :] < N))


@dsl.jit
def deferred_descriptor_kernel(c_ptr, a_ptr, b_ptr, M, N, K, BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr,
                               BLOCK_K: dsl.constexpr):
    # As deferred_tiles_kernel over every (row tile, column tile) of C, through tensor descriptors.
    tiles_n = dsl.cdiv(N, BLOCK_N)
    k_iters = dsl.cdiv(K, BLOCK_K)
    a_desc = dsl.make_tensor_descriptor(a_ptr, (M, K), (K, 1), (BLOCK_M, BLOCK_K))
    b_desc = dsl.make_tensor_descriptor(b_ptr, (K, N), (N, 1), (BLOCK_K, BLOCK_N))
    c_desc = dsl.make_tensor_descriptor(c_ptr, (M, N), (N, 1), (BLOCK_M, BLOCK_N))
    acc = dsl.zeros((BLOCK_M, BLOCK_N), dsl.float32)
    out = dsl.zeros((BLOCK_M, BLOCK_N), c_ptr.dtype.element)
    done_m = 0
    done_n = 0
    for it in range(0, dsl.cdiv(M, BLOCK_M) * tiles_n * k_iters):
        tile = it // k_iters
        k = it % k_iters
        pid_m = tile // tiles_n
        pid_n = tile % tiles_n
        acc = dsl.dot(a_desc.load((pid_m * BLOCK_M, k * BLOCK_K)), b_desc.load((k * BLOCK_K, pid_n * BLOCK_N)), acc)
        if k == 0:
            if tile > 0:
                c_desc.store((done_m * BLOCK_M, done_n * BLOCK_N), out)
        if k == k_iters - 1:
            out = acc.to(c_ptr.dtype.element)
            done_m = pid_m
            done_n = pid_n
            acc = dsl.zeros((BLOCK_M, BLOCK_N), dsl.float32)
    c_desc.store((done_m * BLOCK_M, done_n * BLOCK_N), out)


TILE = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32)
DESCRIPTOR_TILE = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64)
ARCHS = ["sm_80", "sm_90a"]


def _arguments(m, n, k, device="cpu", dtype=torch.float16):
    generator = torch.Generator().manual_seed(m * 1000 + n * 10 + k)
    a = torch.randn(m, k, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(k, n, generator=generator).to(device=device, dtype=dtype)
    c = poison(torch.empty(m, n, device=device, dtype=dtype))
    return c, a, b


def _pipelined(arch):
    c, a, b = _arguments(200, 64, 96)
    function = dsl.jit(deferred_tiles_kernel.fn).ir(c, a, b, 200, 64, 96, **TILE)
    run_pipeline(function, default_pipeline(4, arch, num_stages=3))
    return function


@pytest.mark.parametrize("arch", ARCHS)
def test_carried_tile_takes_the_dot_layout_and_is_not_converted_per_trip(arch):
    function = _pipelined(arch)
    loop = next(op for op in function.body.ops if op.opcode == OpCode.FOR)
    body = loop.regions[0]
    dot = next(op for op in body.walk() if op.opcode == OpCode.DOT)
    tiles = [arg for arg in body.args[1:] if arg.type == dot.result.type or
             getattr(arg.type, "shape", None) == getattr(dot.result.type, "shape", None)]
    assert len(tiles) == 2 and all(arg.layout == dot.result.layout for arg in tiles), \
        "acc and out should both be carried in the dot's accumulator layout"
    per_trip = [op for op in body.ops if op.opcode == OpCode.CONVERT_LAYOUT
                and getattr(op.result.type, "shape", ()) == (64, 64)]
    assert not per_trip, f"{len(per_trip)} tile conversions run every trip of the loop"


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
@pytest.mark.parametrize("arch", ARCHS)
def test_ptx_assembles_without_spills(arch, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    c, a, b = _arguments(200, 64, 96)
    compiled = dsl.jit(deferred_tiles_kernel.fn).compile(c, a, b, 200, 64, 96, target=arch, num_warps=4,
                                                         num_stages=3, **TILE)
    result = assemble(compiled.asm["ptx"], arch)
    assert result.spill_bytes == 0, f"{result.registers} registers, {result.spill_bytes} bytes spilled"


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_descriptor_kernel_keeps_the_wgmma_pipeline(dtype, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FUSEDOPS_TMA", "1")
    c, a, b = _arguments(4096, 4096, 4096, dtype=dtype)
    compiled = dsl.jit(deferred_descriptor_kernel.fn).compile(c, a, b, 4096, 4096, 4096, target="sm_90a",
                                                              num_warps=8, num_stages=4, **DESCRIPTOR_TILE)
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor.2d.global.shared::cta" in ptx
    result = assemble(ptx, "sm_90a")
    assert "C7514" not in result.log, result.log
    assert result.spill_bytes == 0, f"{result.registers} registers, {result.spill_bytes} bytes spilled"


def _reference(a, b, dtype):
    return (a.double() @ b.double()).to(dtype)


def _check_against_float64(kernel, m, n, k, device="cpu", dtype=torch.float16, **options):
    c, a, b = _arguments(m, n, k, device, dtype)
    kernel[(1,)](c, a, b, m, n, k, **options)
    if device == "cuda":
        torch.cuda.synchronize()
    assert_close(c, _reference(a, b, dtype), dtype=dtype)



@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (64, 64, 32), (200, 50, 96), (129, 64, 33), (70, 17, 5)])
def test_interpreter_against_float64(m, n, k):
    _check_against_float64(deferred_tiles_kernel, m, n, k, interpret=True, **TILE)


@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (100, 70, 40), (64, 32, 96)])
def test_descriptor_kernel_interpreted_against_float64(m, n, k):
    _check_against_float64(deferred_descriptor_kernel, m, n, k, interpret=True, BLOCK_M=32, BLOCK_N=16, BLOCK_K=16)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (200, 50, 96), (1000, 64, 257)])
def test_gpu_against_float64(m, n, k, dtype):
    _check_against_float64(deferred_tiles_kernel, m, n, k, "cuda", dtype, num_warps=4, num_stages=3, **TILE)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m, n, k", [(1, 8, 8), (300, 520, 200), (1024, 1024, 512)])
def test_gpu_descriptor_kernel_against_float64(m, n, k, dtype):
    _check_against_float64(deferred_descriptor_kernel, m, n, k, "cuda", dtype, num_warps=8, num_stages=4,
                           **DESCRIPTOR_TILE)
