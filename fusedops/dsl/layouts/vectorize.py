"""Vector width: how many consecutive registers of a thread form one contiguous, aligned vector."""

from __future__ import annotations

from .linear import LANE, REGISTER, WARP, LinearLayout, unit

MAX_VECTOR_BYTES = 16


def element_bytes(element_bits: int) -> int:
    """Bytes per element in memory (int1 is stored in a byte)."""
    return max(element_bits, 8) // 8


def vector_width(layout: LinearLayout, dim_contiguous: int, element_bits: int) -> int:
    """How many consecutive registers hold consecutive elements along `dim_contiguous`.

    The largest v (a power of two, v * element size <= 16 bytes) such that register bits 0..log2(v)-1
    step 1, 2, 4, ... along the dim and every other basis keeps the group v-aligned along it: then
    registers g*v .. g*v+v-1 of every thread are one vector in memory, if the addresses along the
    dim are contiguous (the pointer analysis decides that for global memory). Works for any layout
    with a "register" input dim, including (register, lane, warp) -> shared offset maps (dim 0).
    """
    registers = layout.bases_of(REGISTER)
    limit = MAX_VECTOR_BYTES // element_bytes(element_bits)
    k = 0
    while (k < len(registers) and (2 << k) <= limit
           and registers[k] == unit(layout.rank, dim_contiguous, 1 << k)):
        k += 1
    others = registers[k:] + layout.bases_of(LANE) + layout.bases_of(WARP)
    while k and any(v[dim_contiguous] & ((1 << k) - 1) for v in others):
        k -= 1
    return 1 << k
