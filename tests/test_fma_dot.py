"""The FMA `dsl.dot` (codegen/dot.py: float32 "ieee" / "tf32", float64, int8, and 16-bit blocks too small for
tensor cores): A and B staged in shared memory from whatever layout they have and read one k at a time.
CPU: ptxas assembles tiles up to 128 x 128 x 64 without spills for sm_80 and sm_90a. GPU: exact results
against float64 (int64) references for operands loaded row-major, transposed and broadcast, in a K loop,
at odd block shapes and several num_warps, with poisoned outputs."""

from __future__ import annotations

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.target import assemble, ptxas_available
from helpers import poison

_OUT = {torch.float32: torch.float32, torch.float64: torch.float64, torch.int8: torch.int32,
        torch.float16: torch.float32}


@dsl.jit
def _dot_loop(c_ptr, a_ptr, b_ptr, K, stride_am, stride_ak, stride_bk, stride_bn, BM: dsl.constexpr,
              BN: dsl.constexpr, BK: dsl.constexpr, PREC: dsl.constexpr, ACC: dsl.constexpr):
    # c (BM, BN) = a (BM, K) @ b (K, BN), K a multiple of BK, any operand strides (0: broadcast)
    rm, rn, rk = dsl.arange(0, BM), dsl.arange(0, BN), dsl.arange(0, BK)
    acc = dsl.zeros((BM, BN), ACC)
    for k0 in range(0, K, BK):
        a = dsl.load(a_ptr + rm[:, None] * stride_am + (k0 + rk)[None, :] * stride_ak)
        b = dsl.load(b_ptr + (k0 + rk)[:, None] * stride_bk + rn[None, :] * stride_bn)
        acc = dsl.dot(a, b, acc, input_precision=PREC)
    dsl.store(c_ptr + rm[:, None] * BN + rn[None, :], acc)


def _acc(dtype):
    return {torch.float64: dsl.float64, torch.int8: dsl.int32}.get(dtype, dsl.float32)


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dtype, shape, num_warps", [
    (torch.float32, (64, 64, 32), 4), (torch.float32, (128, 128, 32), 8), (torch.float32, (128, 64, 64), 8),
    (torch.float64, (64, 64, 16), 4), (torch.int8, (64, 64, 64), 4), (torch.float32, (16, 256, 16), 2),
])
def test_fma_dot_tiles_assemble_without_spills(arch, dtype, shape, num_warps):
    bm, bn, bk = shape
    a, c = torch.empty(4, dtype=dtype), torch.empty(4, dtype=_OUT[dtype])
    compiled = _dot_loop.compile(c, a, a, 256, 256, 1, 256, 1, target=arch, num_warps=num_warps, BM=bm, BN=bn,
                                 BK=bk, PREC=None, ACC=_acc(dtype))
    result = assemble(compiled.asm["ptx"], arch)
    assert result.spill_bytes == 0, result.log
    assert "ld.shared" in compiled.asm["ptx"] and "st.shared" in compiled.asm["ptx"]


def _operands(dtype, m, n, k, layout, generator):
    if dtype == torch.int8:
        a = torch.randint(-100, 100, (m, k), generator=generator, dtype=torch.int8)
        b = torch.randint(-100, 100, (k, n), generator=generator, dtype=torch.int8)
    else:
        a = torch.randn(m, k, generator=generator, dtype=torch.float64).to(dtype)
        b = torch.randn(k, n, generator=generator, dtype=torch.float64).to(dtype)
    a, b = a.cuda(), b.cuda()
    if layout == "broadcast":       # stride 0: one row of A for every row, one column of B for every column
        a, b = a[:1].expand(m, k), b[:, :1].expand(k, n)
    if layout == "transposed":       # column-major operands
        a, b = a.t().contiguous().t(), b.t().contiguous().t()
    return a, b


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["row_major", "transposed", "broadcast"])
@pytest.mark.parametrize("dtype, shape, num_warps", [
    (torch.float32, (64, 64, 32), 4), (torch.float32, (128, 128, 32), 8), (torch.float32, (32, 16, 8), 1),
    (torch.float64, (64, 32, 16), 4), (torch.int8, (64, 64, 64), 4), (torch.float16, (8, 8, 8), 2),
    (torch.float32, (2, 4, 2), 4),
])
def test_gpu_fma_dot_is_exact(layout, dtype, shape, num_warps, seed):
    bm, bn, bk = shape
    k = 3 * bk
    generator = torch.Generator().manual_seed(seed)
    a, b = _operands(dtype, bm, bn, k, layout, generator)
    c = poison(torch.empty(bm, bn, dtype=_OUT[dtype], device="cuda"))
    _dot_loop[(1,)](c, a, b, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), num_warps=num_warps,
                    BM=bm, BN=bn, BK=bk, PREC=None, ACC=_acc(dtype))
    if dtype == torch.int8:
        expected = (a.cpu().long() @ b.cpu().long()).to(torch.int32)      # (no integer matmul on CUDA)
        torch.testing.assert_close(c.cpu(), expected, rtol=0, atol=0)
        return
    reference = a.double() @ b.double()
    # float32 / float64 sums of k products in k order: within k roundings of the exact result
    unit = torch.finfo(c.dtype).eps
    bound = k * unit * (a.double().abs() @ b.double().abs()) + 1e-30
    assert ((c.double() - reference).abs() <= bound).all(), (c.double() - reference).abs().max()


@pytest.mark.cuda
def test_gpu_fma_dot_tf32_rounds_the_inputs(seed):
    generator = torch.Generator().manual_seed(seed)
    a, b = _operands(torch.float32, 32, 32, 32, "row_major", generator)
    c = poison(torch.empty(32, 32, device="cuda"))
    _dot_loop[(1,)](c, a, b, 32, 32, 1, 32, 1, BM=32, BN=32, BK=32, PREC="tf32", ACC=dsl.float32)
    # tf32 inputs (10 mantissa bits, each rounded by at most 2**-11 relative): every product within 2**-10
    # of its exact value, plus float32 sums of 32 terms
    magnitude = a.double().abs() @ b.double().abs()
    error = (c.double() - a.double() @ b.double()).abs()
    assert (error <= (2.0 ** -10 + 32 * 2.0 ** -24) * magnitude).all(), (error / magnitude).max()
    assert (error > 0).any()        # the inputs were rounded: not the exact float32 path
