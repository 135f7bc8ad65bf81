"""Global accesses through transposed views and tile conversions through shared memory.

A tile read through a transposed view (K^T from a row-major K: consecutive addresses along the tile's
first dim) gets a blocked layout whose leading registers step along that dim; codegen/memory.py moves
them as 16-byte vectors along it (before: one 2-byte access per element, 32 per thread for the attention
forward's first K^T block). A conversion of a 2-D tile of 16- or 32-bit elements between two layouts goes
through a swizzled shared tile with vector accesses (codegen/swizzled_exchange.py; before: one scalar
st.shared / ld.shared per element, row-major, with bank conflicts).

CPU tier: the PTX of both (vector accesses, no 2-byte ones; ptxas accepts it without spills), and a
ragged edge falling back to narrower accesses; the kernels in the interpreter against torch.
GPU tier: the same kernels on the GPU against torch, poisoned outputs, ragged and aligned shapes,
fp16 / bf16 / fp32.
"""

from __future__ import annotations

import re

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.target import assemble, ptxas_available
from helpers import poison

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


@dsl.jit
def transposed_copy_kernel(out_ptr, x_ptr, ROWS, COLS, stride_x, stride_out, BLOCK_C: dsl.constexpr,
                           BLOCK_R: dsl.constexpr):
    # out = 2 * x, both (ROWS, COLS) row-major, in tiles of x^T: the tile's first dim runs along x's
    # columns (consecutive addresses), its second along x's rows, for the load and the store alike.
    rc = dsl.program_id(0) * BLOCK_C + dsl.arange(0, BLOCK_C)
    rr = dsl.program_id(1) * BLOCK_R + dsl.arange(0, BLOCK_R)
    mask = (rc[:, None] < COLS) & (rr[None, :] < ROWS)
    tile = dsl.load(x_ptr + rr[None, :].to(dsl.int64) * stride_x + rc[:, None], mask=mask, other=0.0)
    dsl.store(out_ptr + rr[None, :].to(dsl.int64) * stride_out + rc[:, None], tile * 2, mask=mask)


@dsl.jit
def add_transposed_kernel(out_ptr, x_ptr, y_ptr, M, N, stride_xm, stride_ym, stride_om, BLOCK_M: dsl.constexpr,
                          BLOCK_N: dsl.constexpr):
    # out = x + y^T: x (M, N) read along its rows, y (N, M) through the transposed view: the two tiles
    # arrive in different layouts, so one is converted to the other's.
    rm = dsl.program_id(0) * BLOCK_M + dsl.arange(0, BLOCK_M)
    rn = dsl.program_id(1) * BLOCK_N + dsl.arange(0, BLOCK_N)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    x = dsl.load(x_ptr + rm[:, None].to(dsl.int64) * stride_xm + rn[None, :], mask=mask, other=0.0)
    y = dsl.load(y_ptr + rn[None, :].to(dsl.int64) * stride_ym + rm[:, None], mask=mask, other=0.0)
    dsl.store(out_ptr + rm[:, None].to(dsl.int64) * stride_om + rn[None, :], x + y, mask=mask)


def _transposed_copy(x, interpret=False, block=(64, 64)):
    rows, cols = x.shape
    out = poison(torch.empty_like(x))
    grid = (-(-cols // block[0]), -(-rows // block[1]))
    transposed_copy_kernel[grid](out, x, rows, cols, x.stride(0), out.stride(0), BLOCK_C=block[0], BLOCK_R=block[1],
                                 num_warps=4, interpret=interpret)
    return out


def _add_transposed(x, y, interpret=False, block=(64, 64)):
    m, n = x.shape
    out = poison(torch.empty(m, n, dtype=x.dtype, device=x.device))
    grid = (-(-m // block[0]), -(-n // block[1]))
    add_transposed_kernel[grid](out, x, y, m, n, x.stride(0), y.stride(0), out.stride(0), BLOCK_M=block[0],
                                BLOCK_N=block[1], num_warps=4, interpret=interpret)
    return out


def _ptx(kernel, dtype, m, n, arch="sm_90a"):
    x = torch.empty(16, dtype=dtype)
    if kernel is transposed_copy_kernel:
        return kernel.compile(x, x, m, n, n, n, target=arch, num_warps=4, BLOCK_C=64, BLOCK_R=64).asm["ptx"]
    return kernel.compile(x, x, x, m, n, n, m, n, target=arch, num_warps=4, BLOCK_M=64, BLOCK_N=64).asm["ptx"]


def _accesses(ptx: str, space: str) -> dict:
    """{'ld.global.v4.b32': count, ...}: the `space` (global / shared) loads and stores of `ptx` by width."""
    counts = {}
    for match in re.finditer(rf"\b((?:ld|st)\.{space}(?:\.[a-z0-9]+)*)\s", ptx):
        counts[match.group(1)] = counts.get(match.group(1), 0) + 1
    return counts


# -- CPU tier: PTX ----------------------------------------------------------------------------------------

@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_transposed_view_moves_16_byte_vectors(arch, dtype, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    ptx = _ptx(transposed_copy_kernel, dtype, 4096, 4096, arch)
    accesses = _accesses(ptx, "global")
    # 64 x 64 elements over 128 threads: 16-byte vectors along the tile's first dim, nothing narrower
    vectors = 64 * 64 * dtype.itemsize // 16 // 128
    assert accesses == {"ld.global.v4.b32": vectors, "st.global.v4.b32": vectors}, accesses
    assert assemble(ptx, arch).spill_bytes == 0


@needs_ptxas
def test_transposed_view_with_a_ragged_edge_narrows_the_vectors(tmp_path, monkeypatch):
    # M = 4095 is not a multiple of 16: the mask along the first dim is constant over single elements
    # only, so each 16-byte group is loaded whole where in bounds and element by element at the edge
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    x = torch.empty(16, dtype=torch.float16)
    ptx = transposed_copy_kernel.compile(x, x, 4096, 4095, 4095, 4095, target="sm_90a", num_warps=4, BLOCK_C=64,
                                         BLOCK_R=64).asm["ptx"]
    accesses = _accesses(ptx, "global")
    # the row stride 4095 makes x's columns start off 16-byte boundaries: no vector can be proven
    assert "ld.global.v4.b32" not in accesses and accesses.get("ld.global.b16", 0) == 32, accesses
    assert assemble(ptx, "sm_90a").spill_bytes == 0


@needs_ptxas
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_tile_conversion_goes_through_a_swizzled_tile_with_vectors(dtype, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    ptx = _ptx(add_transposed_kernel, dtype, 4096, 4096)
    shared = _accesses(ptx, "shared")
    # one conversion of a 64 x 64 tile over 128 threads: a transpose, so the tile is contiguous along the
    # dim of one side only: 16-byte vectors there, one element per access on the other (before: one
    # element per access on both sides)
    elements = 64 * 64 // 128
    vectors = elements * dtype.itemsize // 16
    scalar = "ld.shared.b16" if dtype.itemsize == 2 else "ld.shared.b32"
    assert shared == {"st.shared.v4.b32": vectors, scalar: elements}, shared
    assert ptx.count("bar.sync") == 2
    assert assemble(ptx, "sm_90a").spill_bytes == 0


def test_attention_forward_converts_q_with_vectors(tmp_path, monkeypatch):
    # Q (loaded in 16-byte rows) into the wgmma A fragment (pairs): before the swizzled exchange it took 64
    # 2-byte st.shared and 34 ld.shared per thread, and the first K^T block 32 2-byte global loads
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    from test_attention import compile_forward
    ptx = compile_forward(128).asm["ptx"]
    assert not re.search(r"\b(ld|st)\.(shared|global)\.b16\b", ptx)
    assert not re.search(r"\b(ld|st)\.shared\.v2\.b16\b", ptx)


# -- CPU tier: interpreter ----------------------------------------------------------------------------------

@pytest.mark.parametrize("m, n", [(1, 1), (17, 33), (64, 64), (100, 70)])
def test_kernels_in_the_interpreter(m, n, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n, generator=generator, dtype=torch.float32)
    y = torch.randn(n, m, generator=generator, dtype=torch.float32)
    torch.testing.assert_close(_transposed_copy(x, interpret=True, block=(16, 16)), x * 2, rtol=0, atol=0)
    torch.testing.assert_close(_add_transposed(x, y, interpret=True, block=(16, 16)), x + y.T, rtol=0, atol=0)


# -- GPU tier ------------------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m, n", [(1, 1), (8, 8), (17, 33), (64, 64), (256, 128), (1000, 777), (4096, 4095)])
def test_gpu_transposed_views_and_conversions(dtype, m, n, seed):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, n, generator=generator, device="cuda").to(dtype)
    y = torch.randn(n, m, generator=generator, device="cuda").to(dtype)
    assert torch.equal(_transposed_copy(x), x * 2)
    assert torch.equal(_add_transposed(x, y), x + y.T)
