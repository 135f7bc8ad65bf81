"""Which engine a `dot` runs on, and the layouts of its operands and accumulator there.

- Tensor cores (`mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}`, sm_80+): float16/bfloat16 inputs,
  float32 accumulator, M >= 16, N >= 8, K >= 16. The accumulator takes the mma accumulator layout
  and A/B the mma operand layouts of `layouts.mma`, with the CTA's warps tiling (M, N).
- Otherwise the FMA path (`layout_assignment.fma_operand_layout`): exact float32/float64, int8,
  small blocks, and targets before sm_80.
"""

from __future__ import annotations

from typing import Optional

from ..ir import Operation
from ..language.dtypes import bfloat16, float16, float32, shape_of
from ..layouts.mma import MMA_K, MMA_M, MMA_N, mma_accumulator, mma_operand_a, mma_operand_b

TENSOR_CORE_INPUTS = (float16, bfloat16)


def arch_number(arch: Optional[str]) -> int:
    """"sm_90a" -> 90; None (no target: the FMA path everywhere) -> 0."""
    return int(arch[3:5]) if arch else 0


def uses_tensor_cores(op: Operation, arch: Optional[str]) -> bool:
    """Whether `dot` op runs on mma.sync for `arch` (see the module docstring)."""
    a, _, acc = op.operands
    m, k = shape_of(a.type)
    n = shape_of(acc.type)[1]
    return (arch_number(arch) >= 80 and a.type.element in TENSOR_CORE_INPUTS and acc.type.element == float32
            and m >= MMA_M and n >= MMA_N and k >= MMA_K)


def mma_warps(shape, num_warps: int) -> tuple:
    """(wm, wn) warps along M and N for an (M, N) accumulator.

    Each doubling goes to the dim whose per-warp tile is larger (M on ties), as long as the tile
    stays at least one 16x8 mma tile: square-ish warp tiles read the fewest operand bytes from
    shared memory per mma. Warps left once both dims are at one tile per warp go along M, where
    they hold copies (as in `layouts.mma.mma_warps_per_cta`).
    """
    m, n = shape
    wm = wn = 1
    left = num_warps
    while left > 1:
        can_m, can_n = m // (2 * wm) >= MMA_M, n // (2 * wn) >= MMA_N
        if can_m and (m // wm >= n // wn or not can_n):
            wm *= 2
        elif can_n:
            wn *= 2
        else:
            break
        left //= 2
    return wm * left, wn


def mma_dot_layouts(op: Operation, num_warps: int) -> tuple:
    """(A layout, B layout, accumulator layout) of a tensor-core `dot`."""
    a, b, acc = op.operands
    warps = mma_warps(shape_of(acc.type), num_warps)
    return (mma_operand_a(shape_of(a.type), warps), mma_operand_b(shape_of(b.type), warps),
            mma_accumulator(shape_of(acc.type), warps))
