"""Which thread and register own an element that several threads or registers hold.

A layout whose block is smaller than the CTA maps some lane, warp or register bits to the zero
vector: those bits replicate elements. The owner of an element is the copy whose replicating bits
are all zero. Stores and atomics are done by owners only (an atomic done by every copy would count
several times); `owners_values` then hands each owner's result to its copies.
"""

from __future__ import annotations

import functools

from llvmlite import ir

from ..target import llvm_types as T
from . import layout_access
from .shared import barrier, element_pointer, linear_index, reserve_block


def _zero_bits(bases) -> int:
    mask = 0
    for bit, basis in enumerate(bases):
        if not any(basis):
            mask |= 1 << bit
    return mask


def owned_registers(layout) -> frozenset:
    """Register indices that own their element (no replicating register bit set)."""
    return _owned(layout_access.register_bases(layout))


@functools.lru_cache(maxsize=1024)
def _owned(bases) -> frozenset:
    mask = _zero_bits(bases)
    return frozenset(r for r in range(1 << len(bases)) if r & mask == 0)


def owner_predicate(ctx, layout):
    """An i1 that is true in the threads owning their elements, or None when every thread does."""
    lane_mask = _zero_bits(layout_access.lane_bases(layout))
    warp_mask = _zero_bits(layout_access.warp_bases(layout))
    # Warps beyond the layout's warp bits replicate too (a layout for fewer warps than launched).
    warp_mask |= ~((1 << len(layout_access.warp_bases(layout))) - 1) & 0xFFFF
    if ctx.num_warps <= 1 << len(layout_access.warp_bases(layout)):
        warp_mask &= (1 << len(layout_access.warp_bases(layout))) - 1
    if lane_mask == 0 and warp_mask == 0:
        return None
    b = ctx.prologue
    zero = ir.Constant(T.i32, 0)
    predicate = ir.Constant(T.i1, 1)
    if lane_mask:
        predicate = b.and_(predicate, b.icmp_unsigned("==", b.and_(ctx.lane_id, ir.Constant(T.i32, lane_mask)), zero))
    if warp_mask:
        predicate = b.and_(predicate, b.icmp_unsigned("==", b.and_(ctx.warp_id, ir.Constant(T.i32, warp_mask)), zero))
    return predicate


def owners_values(ctx, layout, registers, element):
    """`registers` of a block in `layout` where only owners hold meaningful values (an atomic's old
    values): every copy gets its owner's value. Register copies read the owning register; copies in
    other threads read it through shared memory (barrier, owners write, barrier, all read)."""
    b = ctx.builder
    replicated = _zero_bits(layout_access.register_bases(layout))
    registers = [registers[r & ~replicated] for r in range(len(registers))]
    owner = owner_predicate(ctx, layout)
    if owner is None:
        return registers
    shape, storage = reserve_block(ctx, layout, element)
    slots = [element_pointer(ctx, storage, linear_index(ctx, ctx.element_coordinates(layout, r), shape))
             for r in range(len(registers))]
    barrier(ctx)
    with b.if_then(owner):
        for r in owned_registers(layout):
            b.store(registers[r], slots[r])
    barrier(ctx)
    return [b.load(slot, typ=storage) for slot in slots]
