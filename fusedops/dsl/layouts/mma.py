"""Tensor-core register layouts: mma.sync m16n8k16 operands and accumulator, wgmma m64nNk16 accumulator.

Per-warp fragments follow the PTX ISA, section 9.7.14.5.8 "Matrix Fragments for mma.m16n8k16 with
floating point type" (.f16/.bf16 A and B, .f32 C/D), and section 9.7.15.5.1.1.1 "Matrix Fragments for
wgmma.mma_async.m64nNk16" (accumulator D). With groupID = lane >> 2 and threadID_in_group = lane % 4:
  A (16x16, a0..a7): row = groupID + 8 * ((i >> 1) & 1), col = 2 * threadID_in_group + (i & 1) + 8 * (i >> 2)
  B (16x8,  b0..b3): row = 2 * threadID_in_group + (i & 1) + 8 * (i >> 1),    col = groupID
  C (16x8,  c0..c3): row = groupID + 8 * (i >> 1),                           col = 2 * threadID_in_group + (i & 1)
  wgmma D (64xN, d0..d(N/2-1)), warp w of the warpgroup:
           row = 16 * w + groupID + 8 * ((i >> 1) & 1),   col = 8 * (i >> 2) + 2 * threadID_in_group + (i & 1)
  wgmma A from registers (64x16, a0..a7 in four .f16x2 registers; section 9.7.15.5.1.1.1, "register
  fragment layout for matrix A" of .m64nNk16), warp w of the warpgroup:
           row = 16 * w + groupID + 8 * ((i >> 1) & 1),   col = 2 * threadID_in_group + (i & 1) + 8 * (i >> 2)
  i.e. each warp holds the mma.sync A fragment of its 16 rows, and elements d0..d7 of the wgmma
  accumulator's columns 16 * c .. 16 * c + 15 sit where a0..a7 of K slice c do: an accumulator
  converted to 16 bits *is* the A operand of the next wgmma (FlashAttention-3's P @ V).
Each of these is linear in the bits of (i, lane, warp), so it is a LinearLayout; the CTA tile adds
warp bits and the block adds repetition register bits on top.

Warp numbering for mma.sync layouts with warps_per_cta = (wm, wn): warp = wi + wm * wj, where wi
indexes the 16-row slab along M and wj the 8-column slab along N. Operand A is shared by the warps
of one row (its wj bits are broadcast), operand B by the warps of one column.
"""

from __future__ import annotations

from typing import Optional, Sequence

from .linear import LinearLayout, distributed, log2_exact, maybe_unit, unit, zero

MMA_M, MMA_N, MMA_K = 16, 8, 16
WGMMA_M, WGMMA_K = 64, 16
WGMMA_MAX_N = 256
WARPGROUP_WARPS = 4

# lane = 4 * groupID + threadID_in_group: lane bits 0-1 are threadID_in_group, bits 2-4 groupID.
_LANE_AC = [(0, 2), (0, 4), (1, 0), (2, 0), (4, 0)]   # A and C: (row, col)
_LANE_B = [(2, 0), (4, 0), (0, 1), (0, 2), (0, 4)]                       # B: (k, n)


def _check_shape(shape: Sequence[int], minimum: tuple, what: str) -> tuple:
    shape = tuple(shape)
    if len(shape) != 2:
        raise ValueError(f"{what} must be a 2-D block, got shape {shape}")
    for size, least, name in zip(shape, minimum, ("rows", "columns")):
        log2_exact(size, f"{what} {name}")
        if size < least:
            raise ValueError(f"{what} needs at least {least} {name}, got shape {shape}")
    return shape


def _check_warps(warps_per_cta: Sequence[int]) -> tuple:
    wm, wn = warps_per_cta
    log2_exact(wm, "warps_per_cta[0]")
    log2_exact(wn, "warps_per_cta[1]")
    return wm, wn


def _steps(shape: tuple, dim: int, first: int, count: int) -> list:
    """log2(count) bases stepping first, 2*first, ... along dim; zero (broadcast) past the block."""
    out = []
    for k in range(log2_exact(count)):
        basis = maybe_unit(shape, dim, first << k)
        out.append(basis if basis is not None else zero(2))
    return out


def _repeats(shape: tuple, dim: int, tile: int) -> list:
    """Register bases repeating a tile of `tile` elements along dim until the block is covered."""
    out, step = [], tile
    while step < shape[dim]:
        out.append(unit(2, dim, step))
        step <<= 1
    return out


def mma_warps_per_cta(shape: Sequence[int], num_warps: int) -> tuple:
    """(wm, wn) for an (M, N) accumulator: warps along M first (up to M/16 of them), then along N
    (up to N/8); warps left over go along M, where they hold duplicates."""
    m, n = shape
    log2_exact(num_warps, "num_warps")
    wm = min(num_warps, max(1, m // MMA_M))
    wn = min(num_warps // wm, max(1, n // MMA_N))
    return wm * (num_warps // (wm * wn)), wn


def mma_accumulator(shape: Sequence[int], warps_per_cta: Sequence[int]) -> LinearLayout:
    """The mma.sync.m16n8k16 .f32 accumulator (C/D) layout of an (M, N) block.

    Register r = c + 4 * (j + repN * i) is element c (c0..c3, PTX ISA 9.7.14.5.8) of the 16x8 tile
    (i, j) of this warp, i < M / (16 * wm), j < repN = N / (8 * wn). M >= 16, N >= 8.
    """
    shape = _check_shape(shape, (MMA_M, MMA_N), "mma accumulator")
    wm, wn = _check_warps(warps_per_cta)
    register = [(0, 1), (8, 0)] + _repeats(shape, 1, MMA_N * wn) + _repeats(shape, 0, MMA_M * wm)
    warp = _steps(shape, 0, MMA_M, wm) + _steps(shape, 1, MMA_N, wn)
    return distributed(shape, register, _LANE_AC, warp)


def mma_operand_a(shape: Sequence[int], warps_per_cta: Sequence[int]) -> LinearLayout:
    """The mma.sync.m16n8k16 .f16/.bf16 A operand layout of an (M, K) block.

    Register r = a + 8 * (kk + repK * i) is element a (a0..a7) of the 16x16 tile (i, kk): registers
    2p, 2p+1 form the p-th .f16x2 operand register. Warps along N hold copies. M, K >= 16.
    """
    shape = _check_shape(shape, (MMA_M, MMA_K), "mma operand A")
    wm, wn = _check_warps(warps_per_cta)
    register = [(0, 1), (8, 0), (0, 8)] + _repeats(shape, 1, MMA_K) + _repeats(shape, 0, MMA_M * wm)
    warp = _steps(shape, 0, MMA_M, wm) + [zero(2)] * log2_exact(wn)
    return distributed(shape, register, _LANE_AC, warp)


def mma_operand_b(shape: Sequence[int], warps_per_cta: Sequence[int]) -> LinearLayout:
    """The mma.sync.m16n8k16 .f16/.bf16 B operand layout of a (K, N) block.

    Register r = b + 4 * (kk + repK * j) is element b (b0..b3) of the 16x8 tile (kk, j): registers
    2p, 2p+1 form the p-th .f16x2 operand register. Warps along M hold copies. K >= 16, N >= 8.
    """
    shape = _check_shape(shape, (MMA_K, MMA_N), "mma operand B")
    wm, wn = _check_warps(warps_per_cta)
    register = [(1, 0), (8, 0)] + _repeats(shape, 0, MMA_K) + _repeats(shape, 1, MMA_N * wn)
    warp = [zero(2)] * log2_exact(wm) + _steps(shape, 1, MMA_N, wn)
    return distributed(shape, register, _LANE_B, warp)


def wgmma_warpgroups_per_cta(shape: Sequence[int], num_warps: int, instr_n: int) -> tuple:
    """(groups along M, groups along N) of warpgroups for an (M, N) wgmma accumulator: along M
    first (up to M/64), then along N in steps of instr_n; leftovers go along M (duplicates)."""
    m, n = shape
    if num_warps % WARPGROUP_WARPS:
        raise ValueError(f"wgmma needs num_warps to be a multiple of 4, got {num_warps}")
    groups = num_warps // WARPGROUP_WARPS
    log2_exact(groups, "number of warpgroups")
    gm = min(groups, max(1, m // WGMMA_M))
    gn = min(groups // gm, max(1, n // instr_n))
    return gm * (groups // (gm * gn)), gn


def wgmma_accumulator(shape: Sequence[int], num_warps: int, instr_n: Optional[int] = None) -> LinearLayout:
    """The wgmma.mma_async.m64nNk16 .f32 accumulator layout of an (M, N) block (sm_90a).

    instr_n: the instruction's N (8..256, a power of two dividing N; default min(N, 256)).
    Register r = d + (N_instr / 2) * (j + repN * i) is element d (d0..d(instr_n/2 - 1), PTX ISA
    9.7.15.5.1.1.1) of the 64 x instr_n tile (i, j) of this warpgroup. Warp bits 0-1 are the warp
    within its warpgroup (16 rows each); higher warp bits are the warpgroup, along M first
    (`wgmma_warpgroups_per_cta`). M >= 64; num_warps a multiple of 4.
    """
    shape = _check_shape(shape, (WGMMA_M, MMA_N), "wgmma accumulator")
    m, n = shape
    instr_n = min(n, WGMMA_MAX_N) if instr_n is None else instr_n
    log2_exact(instr_n, "instr_n")
    if not MMA_N <= instr_n <= min(n, WGMMA_MAX_N):
        raise ValueError(f"instr_n must be in 8..min(N, 256) = {min(n, WGMMA_MAX_N)}, got {instr_n}")
    gm, gn = wgmma_warpgroups_per_cta(shape, num_warps, instr_n)
    register = ([(0, 1), (8, 0)] + [(0, MMA_N << k) for k in range(log2_exact(instr_n // MMA_N))]
                + _repeats(shape, 1, instr_n * gn) + _repeats(shape, 0, WGMMA_M * gm))
    warp = [(16, 0), (32, 0)] + _steps(shape, 0, WGMMA_M, gm) + _steps(shape, 1, instr_n, gn)
    return distributed(shape, register, _LANE_AC, warp)


def wgmma_operand_a(shape: Sequence[int], num_warps: int, instr_n: int, accumulator_n: int) -> LinearLayout:
    """The register layout of the A operand (M x K, 16-bit) of a wgmma.m64nNk16 read from registers
    (sm_90a), for the dot whose (M, accumulator_n) accumulator is `wgmma_accumulator(..., instr_n)`.

    Register r = a + 8 * (kk + repK * i) is element a (a0..a7; 2p, 2p+1 form the p-th .f16x2
    register) of the 64x16 tile (i, kk) of this warpgroup. Warp bits 0-1 step the rows by 16, higher
    warp bits are the warpgroups: along M as the accumulator's, broadcast (copies) where the
    accumulator's warpgroups split N. For K = accumulator N and instr_n = N this is the accumulator
    layout of that N itself (see the module docstring). M >= 64, K >= 16.
    """
    shape = _check_shape(shape, (WGMMA_M, WGMMA_K), "wgmma operand A")
    gm, gn = wgmma_warpgroups_per_cta((shape[0], accumulator_n), num_warps, instr_n)
    register = [(0, 1), (8, 0), (0, 8)] + _repeats(shape, 1, WGMMA_K) + _repeats(shape, 0, WGMMA_M * gm)
    warp = [(16, 0), (32, 0)] + _steps(shape, 0, WGMMA_M, gm) + [zero(2)] * log2_exact(gn)
    return distributed(shape, register, _LANE_AC, warp)
