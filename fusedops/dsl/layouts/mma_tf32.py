"""Tensor-core register layouts of the tf32 mma.sync: `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`.

Per-warp fragments follow the PTX ISA, section 9.7.14.5 "Matrix Fragments for mma.m16n8k8" (the .tf32 case:
one .b32 register per element). With groupID = lane >> 2 and threadID_in_group = lane % 4:
  A (16x8, a0..a3): row = groupID + 8 * (i & 1),   col = threadID_in_group + 4 * (i >> 1)
  B (8x8,  b0..b1): row = threadID_in_group + 4 * i,   col = groupID
  C (16x8, c0..c3): as for m16n8k16 (`layouts.mma.mma_accumulator`).
Warp numbering as in `layouts.mma`: warp = wi + wm * wj, A broadcast over the wj bits, B over the wi
bits. The block repeats the warp tile along K first (8 per instruction), then along M (A) or N (B), so
A register a + 4 * (kk + repK * i) is element a of the 16x8 tile (i, kk) and B register
b + 2 * (kk + repK * j) element b of the 8x8 tile (kk, j).
"""

from __future__ import annotations

from typing import Sequence

from .linear import LinearLayout, distributed, log2_exact, zero
from .mma import MMA_M, MMA_N, _check_shape, _check_warps, _repeats, _steps

MMA_TF32_K = 8

# lane = 4 * groupID + threadID_in_group: lane bits 0-1 are threadID_in_group, bits 2-4 groupID.
_LANE_A = [(0, 1), (0, 2), (1, 0), (2, 0), (4, 0)]     # A: (row, k)
_LANE_B = [(1, 0), (2, 0), (0, 1), (0, 2), (0, 4)]     # B: (k, col)


def mma_tf32_operand_a(shape: Sequence[int], warps_per_cta: Sequence[int]) -> LinearLayout:
    """The m16n8k8 .tf32 A operand layout of an (M, K) float32 block: register r = a + 4 * (kk + repK * i)
    is element a (a0..a3) of the 16x8 tile (i, kk). Warps along N hold copies. M >= 16, K >= 8 (powers of
    two); ValueError otherwise."""
    shape = _check_shape(shape, (MMA_M, MMA_TF32_K), "tf32 mma operand A")
    wm, wn = _check_warps(warps_per_cta)
    register = [(8, 0), (0, 4)] + _repeats(shape, 1, MMA_TF32_K) + _repeats(shape, 0, MMA_M * wm)
    warp = _steps(shape, 0, MMA_M, wm) + [zero(2)] * log2_exact(wn)
    return distributed(shape, register, _LANE_A, warp)


def mma_tf32_operand_b(shape: Sequence[int], warps_per_cta: Sequence[int]) -> LinearLayout:
    """The m16n8k8 .tf32 B operand layout of a (K, N) float32 block: register r = b + 2 * (kk + repK * j)
    is element b (b0, b1) of the 8x8 tile (kk, j). Warps along M hold copies. K >= 8, N >= 8 (powers of
    two); ValueError otherwise."""
    shape = _check_shape(shape, (MMA_TF32_K, MMA_N), "tf32 mma operand B")
    wm, wn = _check_warps(warps_per_cta)
    register = [(4, 0)] + _repeats(shape, 0, MMA_TF32_K) + _repeats(shape, 1, MMA_N * wn)
    warp = [zero(2)] * log2_exact(wm) + _steps(shape, 1, MMA_N, wn)
    return distributed(shape, register, _LANE_B, warp)
