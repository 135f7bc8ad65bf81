"""float32 `dsl.dot(..., input_precision="tf32")` on the tensor cores:
mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 on sm_80 and sm_90a (codegen/mma_tf32.py, layouts/mma_tf32.py), operands rounded with cvt.rna.tf32.f32.

CPU: a simulation of the lowering (tile stores -> swizzled shared tile -> the loader's ld.shared offsets ->
m16n8k8 fragments by the PTX ISA's formulas, written here independently) against A @ B; the PTX of direct
dots and K loops (pipelined, transposed views, column-major B, masked tails) has the tf32 mma and no FMA dot,
and ptxas assembles it without spills; the interpreter rounds the operands to tf32 (nearest, ties away)
and matches a float64 reference of the rounded operands; the compiled kernel run on the host (session 38's
emulation of mma.sync / cvt / cp.async) matches the interpreter. GPU (`cuda`): compiled results on odd
M / N / K against the reference and the interpreter.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl import CompilationError
from fusedops.dsl.codegen.mma import operand_loader, operand_tile, tile_store_groups
from fusedops.dsl.codegen.mma_tf32 import mma_tf32_schedule
from fusedops.dsl.language.dtypes import float32
from fusedops.dsl.layouts import default_blocked, mma_accumulator, transpose
from fusedops.dsl.layouts.mma_tf32 import mma_tf32_operand_a, mma_tf32_operand_b
from fusedops.dsl.passes.dot_layouts import mma_warps
from fusedops.dsl.target import assemble, ptxas_available
from codegen_helpers import vector_accesses, xor_bits
from helpers import poison

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
_MMA = "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"


@dsl.jit
def _matmul(c_ptr, a_ptr, b_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, BM: dsl.constexpr, BN: dsl.constexpr,
            BK: dsl.constexpr, B_VIEW: dsl.constexpr, PREC: dsl.constexpr):
    # c (M, N) = a (M, K) @ b (K, N), any strides; B_VIEW "load": B loaded as a (BK, BN) tile, "trans": loaded as
    # its (BN, BK) transpose and turned with dsl.trans. Masked tails along M, N and K.
    rm = dsl.program_id(0) * BM + dsl.arange(0, BM)
    rn = dsl.program_id(1) * BN + dsl.arange(0, BN)
    rk = dsl.arange(0, BK)
    acc = dsl.zeros((BM, BN), dsl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        a = dsl.load(a_ptr + rm[:, None] * s_am + kk[None, :] * s_ak, mask=(rm[:, None] < M) & (kk[None, :] < K),
                     other=0.0)
        if B_VIEW == "trans":
            bt = dsl.load(b_ptr + rn[:, None] * s_bn + kk[None, :] * s_bk, mask=(rn[:, None] < N) & (kk[None, :] < K),
                          other=0.0)
            b = dsl.trans(bt)
        else:
            b = dsl.load(b_ptr + kk[:, None] * s_bk + rn[None, :] * s_bn, mask=(kk[:, None] < K) & (rn[None, :] < N),
                         other=0.0)
        acc = dsl.dot(a, b, acc, input_precision=PREC)
    dsl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@dsl.jit
def _one_dot(c_ptr, a_ptr, b_ptr, M: dsl.constexpr, N: dsl.constexpr, K: dsl.constexpr):
    rm, rn, rk = dsl.arange(0, M), dsl.arange(0, N), dsl.arange(0, K)
    a = dsl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = dsl.load(b_ptr + rk[:, None] * N + rn[None, :])
    dsl.store(c_ptr + rm[:, None] * N + rn[None, :], dsl.dot(a, b, input_precision="tf32"))


# -- the reference ---------------------------------------------------------------------------------------------

def _tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 x rounded to tf32 (to nearest, ties away from zero: cvt.rna.tf32.f32), as float64."""
    bits = x.detach().cpu().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rounded = ((bits + 0x1000) & 0xFFFFE000)
    rounded = torch.where(rounded >= 1 << 31, rounded - (1 << 32), rounded).to(torch.int32)
    return rounded.view(torch.float32).double()


def _check(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, factor: float = 2.0) -> None:
    """c (float32) is the float64 product of the tf32-rounded a and b within float32 accumulation error:
    factor * K roundings of 2**-24 of the sum of |products| per element."""
    x, y = _tf32(a), _tf32(b)
    reference, magnitude = x @ y, x.abs() @ y.abs()
    bound = factor * a.shape[1] * 2.0 ** -24 * magnitude + 1e-30
    error = (c.detach().cpu().double() - reference).abs()
    assert (error <= bound).all(), (error - bound).max()


def _operands(m, n, k, seed, b_layout="row"):
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=generator)
    b = torch.randn(k, n, generator=generator)
    if b_layout == "col":                    # column-major B: stride (1, K)
        b = b.t().contiguous().t()
    return a, b


def _launch(a, b, c, bm, bn, bk, view, interpret=False, **options):
    m, k = a.shape
    n = b.shape[1]
    grid = ((m + bm - 1) // bm, (n + bn - 1) // bn)
    _matmul[grid](c, a, b, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), BM=bm, BN=bn, BK=bk,
                  B_VIEW=view, PREC="tf32", interpret=interpret, **options)
    return c


# -- simulation of the lowering (pure Python) -------------------------------------------------------------------

def _ptx_a(lane, i):        # PTX ISA 9.7.14.5, m16n8k8 .tf32 A: a0..a3
    return (lane >> 2) + 8 * (i & 1), (lane % 4) + 4 * (i >> 1)


def _ptx_b(lane, i):        # B: b0, b1
    return (lane % 4) + 4 * i, lane >> 2


def _ptx_c(lane, i):        # C / D: c0..c3
    return (lane >> 2) + 8 * (i >> 1), 2 * (lane % 4) + (i & 1)


def _source(shape, contiguous, num_warps):
    """A blocked float32 layout of `shape` holding 16-byte vectors along `contiguous` (what a load gives)."""
    if contiguous == 1:
        return default_blocked(shape, num_warps, 32)
    return transpose(default_blocked((shape[1], shape[0]), num_warps, 32), (1, 0))


def _stage_and_load(values, shape, source, operand, num_warps):
    """{(register, lane, warp): value} of `operand` after storing `values` (in `source`) into the staging tile
    and reading each register at the loader's offset (thread part XOR the register's constant)."""
    shared = operand_tile(shape, source, float32)
    width, groups, lanes, warps = tile_store_groups(source, shared, 32)
    memory = {}
    for warp, lane, first, address in vector_accesses(groups, lanes, warps, num_warps):
        for i in range(width):
            coords = source.apply(register=first + i, lane=lane, warp=warp)
            assert memory.setdefault(address // 4 + i, coords) == coords
    assert len(memory) == shape[0] * shape[1]
    loader = operand_loader(operand, shared, float32)
    assert type(loader).__name__ == "Tf32OperandLoader"
    out = {}
    for warp in range(num_warps):
        for lane in range(32):
            thread = xor_bits(loader.lane_bytes, lane) ^ xor_bits(loader.warp_bytes, warp)
            for entries in loader.slices.values():
                for register, constant in entries:
                    address = thread ^ constant
                    assert address % 4 == 0
                    out[(register, lane, warp)] = values[memory[address // 4]]
    assert len(out) == operand.num_registers * 32 * num_warps
    return out


@pytest.mark.parametrize("m,n,k,num_warps,a_contiguous,b_contiguous", [
    (16, 8, 8, 1, 1, 1), (64, 64, 32, 4, 1, 0), (32, 64, 16, 2, 0, 1), (128, 32, 16, 8, 0, 0),
])
def test_simulated_tf32_lowering_computes_a_times_b(m, n, k, num_warps, a_contiguous, b_contiguous, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(-4, 5, size=(m, k)).astype(np.float64)
    b = rng.integers(-4, 5, size=(k, n)).astype(np.float64)
    warps = mma_warps((m, n), num_warps)
    layout_a, layout_b = mma_tf32_operand_a((m, k), warps), mma_tf32_operand_b((k, n), warps)
    layout_acc = mma_accumulator((m, n), warps)
    a_regs = _stage_and_load(a, (m, k), _source((m, k), a_contiguous, num_warps), layout_a, num_warps)
    b_regs = _stage_and_load(b, (k, n), _source((k, n), b_contiguous, num_warps), layout_b, num_warps)
    acc = {(r, lane, w): 0.0 for r in range(layout_acc.num_registers) for lane in range(32) for w in range(num_warps)}
    schedule = mma_tf32_schedule(m, n, k, num_warps)
    assert len(schedule) * num_warps >= (m // 16) * (n // 8) * (k // 8)
    for _, a_registers, b_registers, acc_registers in schedule:
        for warp in range(num_warps):
            tile_a, tile_b, tile_c = np.zeros((16, 8)), np.zeros((8, 8)), np.zeros((16, 8))
            for lane in range(32):
                for e in range(4):
                    tile_a[_ptx_a(lane, e)] = a_regs[(a_registers[e], lane, warp)]
                    tile_c[_ptx_c(lane, e)] = acc[(acc_registers[e], lane, warp)]
                for e in range(2):
                    tile_b[_ptx_b(lane, e)] = b_regs[(b_registers[e], lane, warp)]
            tile_d = tile_a @ tile_b + tile_c
            for lane in range(32):
                for e in range(4):
                    acc[(acc_registers[e], lane, warp)] = tile_d[_ptx_c(lane, e)]
    expected = a @ b
    for (register, lane, warp), value in acc.items():
        assert value == expected[layout_acc.apply(register=register, lane=lane, warp=warp)]


# -- PTX ------------------------------------------------------------------------------------------------------

def _assembled(kernel, args, arch, num_warps, **constexprs):
    ptx = kernel.compile(*args, target=arch, num_warps=num_warps, **constexprs).asm["ptx"]
    assert re.search(re.escape(_MMA), ptx) and "cvt.rna.tf32.f32" in ptx
    assert not re.search(r"\bfma\.rn\.f32\b", ptx)            # no FMA dot left beside it
    assert "ldmatrix" not in ptx                               # (32-bit operands: ld.shared)
    result = assemble(ptx, arch)
    assert result.spill_bytes == 0, result.log
    return ptx


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_tf32_dot_tiles_assemble_without_spills(arch):
    t = torch.empty(4)
    # one dot: 64x64x32 on 4 warps (32 mmas each), 128x128x32 on 4 warps (128 each)
    for (m, n, k), warps in (((64, 64, 32), 4), ((128, 128, 32), 4)):
        ptx = _assembled(_one_dot, (t, t, t), arch, warps, M=m, N=n, K=k)
        assert len(re.findall(re.escape(_MMA), ptx)) == m * n * k // (16 * 8 * 8) // warps
    # loop-carried accumulators over K (the cp.async ring): B loaded as (BK, BN) or transposed from (BN, BK), a
    # non-square tile; 128x128x32 on 4 warps in a pipelined loop spills (60-70 bytes, as the 16-bit dot of the same
    # tile bytes, 128x128x64, spills 240-280): see README
    for (bm, bn, bk), warps, view in (((64, 64, 32), 4, "load"), ((128, 128, 32), 8, "trans"),
                                      ((128, 64, 32), 4, "load")):
        ptx = _assembled(_matmul, (t, t, t, 100, 100, 100, 100, 1, 100, 1), arch, warps, BM=bm, BN=bn, BK=bk,
                         B_VIEW=view, PREC="tf32")
        assert "cp.async" in ptx


@needs_ptxas
def test_ieee_float32_dots_stay_on_the_fma_path():
    t = torch.empty(4)
    ptx = _matmul.compile(t, t, t, 100, 100, 100, 100, 1, 100, 1, target="sm_80", num_warps=4, BM=32, BN=32, BK=16,
                          B_VIEW="load", PREC="ieee").asm["ptx"]
    assert "mma.sync" not in ptx and "cvt.rna.tf32" not in ptx and re.search(r"\bfma\.rn\.f32\b", ptx)


def test_tf32x3_is_refused_by_name():
    t = torch.empty(4)
    with pytest.raises(CompilationError, match=r"input_precision must be one of .*'tf32x3'"):
        _matmul.compile(t, t, t, 8, 8, 8, 8, 1, 8, 1, target="sm_80", BM=16, BN=16, BK=16, B_VIEW="load",
                        PREC="tf32x3")


# -- the interpreter ----------------------------------------------------------------------------------------------

def test_interpreter_rounds_tf32_operands_to_nearest_ties_away():
    a, b = torch.zeros(16, 16), torch.zeros(16, 16)
    a[0, 0], a[1, 0], a[2, 0], a[3, 0], a[4, 0] = 1 + 2 ** -11, 1 + 2 ** -12, -(1 + 2 ** -11), 1 + 3 * 2 ** -11, 2.0
    b[0, 0], b[0, 1] = 1.0, 1 + 2 ** -11
    c = torch.full((16, 16), -777.0)
    _launch(a, b, c, 16, 16, 16, "load", interpret=True)
    assert c[:5, 0].tolist() == [1 + 2 ** -10, 1.0, -(1 + 2 ** -10), 1 + 2 ** -9, 2.0]
    assert c[4, 1].item() == 2 * (1 + 2 ** -10)
    exact = torch.full((16, 16), -777.0)
    _matmul[(1, 1)](exact, a, b, 16, 16, 16, 16, 1, 16, 1, BM=16, BN=16, BK=16, B_VIEW="load", PREC="ieee",
                    interpret=True)
    assert exact[0, 0].item() == 1 + 2 ** -11                  # "ieee" stays exact


@pytest.mark.parametrize("view,b_layout", [("load", "row"), ("trans", "col")])
def test_interpreter_matches_the_tf32_reference_on_ragged_shapes(view, b_layout, seed):
    a, b = _operands(37, 21, 45, seed, b_layout)
    c = _launch(a, b, poison(torch.empty(37, 21)), 32, 16, 16, view, interpret=True)
    _check(c, a, b, factor=1.0)
    assert not torch.equal(c.double(), a.double() @ b.double())     # the rounding is there


# -- the compiled kernel, run on the host ---------------------------------------------------------------------------

@pytest.mark.parametrize("view,b_layout,num_warps", [("load", "row", 2), ("trans", "col", 1)])
def test_emulated_compiled_tf32_dot_matches_the_interpreter(view, b_layout, num_warps, seed):
    from test_review_session38_dsl_blocks import _run_emulated
    a, b = _operands(29, 13, 40, seed, b_layout)                  # one 32 x 16 tile, K: 16, 16, 8 of 16
    c = poison(torch.empty(29, 13))
    _run_emulated(_matmul, (c, a, b, 29, 13, 40, a.stride(0), a.stride(1), b.stride(0), b.stride(1)),
                  num_warps=num_warps, target="sm_80", num_stages=2, BM=32, BN=16, BK=16, B_VIEW=view, PREC="tf32")
    _check(c, a, b)
    interpreted = _launch(a, b, poison(torch.empty(29, 13)), 32, 16, 16, view, interpret=True)
    # (the emulated mma rounds its float32 accumulator after each 8-wide K step; the interpreter once)
    bound = 2.0 * 40 * 2.0 ** -24 * (_tf32(a).abs() @ _tf32(b).abs())
    assert ((c.double() - interpreted.double()).abs() <= bound).all()


# -- GPU ----------------------------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("shape,num_warps,num_stages", [
    ((64, 64, 32), 4, 3), ((128, 128, 32), 8, 3), ((128, 64, 32), 4, 2), ((16, 8, 8), 1, 1), ((32, 64, 16), 2, 3),
])
@pytest.mark.parametrize("view,b_layout", [("load", "row"), ("load", "col"), ("trans", "col")])
def test_gpu_tf32_dot_matches_the_reference_and_the_interpreter(shape, num_warps, num_stages, view, b_layout, seed):
    bm, bn, bk = shape
    m, n, k = 2 * bm + 3, bn + 5, 3 * bk + 7                      # ragged tails along M, N and K
    a, b = _operands(m, n, k, seed, b_layout)
    c = _launch(a.cuda(), b.cuda(), poison(torch.empty(m, n, device="cuda")), bm, bn, bk, view,
                num_warps=num_warps, num_stages=num_stages)
    torch.cuda.synchronize()
    _check(c, a, b)
    interpreted = _launch(a, b, poison(torch.empty(m, n)), bm, bn, bk, view, interpret=True)
    x, y = _tf32(a), _tf32(b)
    bound = 3.0 * k * 2.0 ** -24 * (x.abs() @ y.abs()) + 1e-30
    assert ((c.cpu().double() - interpreted.double()).abs() <= bound).all()
    assert not torch.allclose(c.cpu().double(), a.double() @ b.double(), rtol=1e-7, atol=0)   # tf32, not fp32


@pytest.mark.cuda
@pytest.mark.parametrize("arch_warps", [4, 8])
def test_gpu_tf32_single_dot_and_size_one_edges(arch_warps, seed):
    a, b = _operands(1, 1, 1, seed)                               # one element, masked everywhere else
    c = _launch(a.cuda(), b.cuda(), poison(torch.empty(1, 1, device="cuda")), 64, 64, 32, "load",
                num_warps=arch_warps)
    torch.cuda.synchronize()
    assert c.item() == _tf32(a).item() * _tf32(b).item()
    a, b = _operands(128, 128, 32, seed + 1)
    c = poison(torch.empty(128, 128, device="cuda"))
    _one_dot[(1,)](c, a.cuda(), b.cuda(), M=128, N=128, K=32, num_warps=arch_warps)
    torch.cuda.synchronize()
    _check(c, a, b)
