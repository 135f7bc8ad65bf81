"""Moving a large block between layouts through a swizzled shared tile, with vector accesses on both
sides: the epilogue of a wgmma matmul, where the accumulator (pairs of elements per thread, rows
spread over lanes) becomes a blocked layout whose threads store 16-byte vectors to global memory.

`convert_layout {swizzled}` (set by the layout pass, `_layout_memory.mark_swizzled_store`)
lowers here instead of `shared.exchange_through_shared` (one scalar st.shared / ld.shared per
element, row-major, no swizzle), and so does every other conversion of a 2-D tile of 16- or 32-bit
elements (`exchanges_tiles`: e.g. attention's Q, loaded in 16-byte rows, into the wgmma A fragment:
64 2-byte st.shared and 34 ld.shared per thread with 4-way bank conflicts before, 8 16-byte stores and
32 4-byte loads without conflicts after). The tile layout is `layouts.swizzle.choose_swizzle(source,
target)`: the XOR swizzle with the fewest shared-memory wavefronts for both accesses, which for the
wgmma accumulator and a blocked layout is conflict-free on both sides (4-byte stores of fp16 pairs,
16-byte loads). The tile lives in scratch (`ctx.scratch_offset`): after a pipelined K loop's
`local_dealloc` that is the start of the operand ring, so the epilogue reuses the ring's memory.
Protocol (shared.py): barrier, store, barrier, load.
"""

from __future__ import annotations

import functools

from llvmlite import ir

from ..language.dtypes import DType
from ..layouts.shared import shared_offsets
from ..layouts.swizzle import choose_swizzle
from ..layouts.vectorize import vector_width
from ..target import llvm_types as T
from .mma import byte_pointer, combine_offset, store_tile, thread_offset
from .shared import barrier, reserve, scratch_base

# Elements this path moves: plain numbers whose memory type is their register type.
_WIDTHS = (16, 32)


@functools.lru_cache(maxsize=256)
def exchange_tile(source, target, element_bits: int):
    """The shared tile layout (offset -> coords) for moving a block from `source` to `target`."""
    return choose_swizzle(source, target, element_bits).layout


def can_exchange(element) -> bool:
    """Whether `element` (a dtype) can take this path: 16- or 32-bit floats and ints."""
    return isinstance(element, DType) and element.bits in _WIDTHS and not element.is_bool


def tile_load_groups(layout, shared, element_bits: int) -> tuple:
    """(width, [(first register, byte offset)], lane byte bases, warp byte bases) of reading a
    distributed `layout` from the shared tile `shared`, `width` elements per vector load (the
    widest the two layouts allow): register group [first, first + width) of a thread comes from
    byte (XOR of its set lane and warp bits' bases) ^ offset. The counterpart of
    `mma.tile_store_groups`."""
    size = element_bits // 8
    offsets = shared_offsets(layout, shared)
    width = vector_width(offsets, 0, element_bits)
    groups = [(r, offsets.apply(register=r)[0] * size) for r in range(0, layout.num_registers, width)]
    lanes = tuple(offsets.apply(lane=1 << b)[0] * size for b in range(layout.in_dim_bits("lane")))
    warps = tuple(offsets.apply(warp=1 << b)[0] * size for b in range(layout.in_dim_bits("warp")))
    return width, groups, lanes, warps


def load_tile(ctx, layout, shared, element, base, here: bool = False) -> list:
    """A thread's registers of a block in distributed `layout`, read from the shared tile `shared` at
    `base` (`ptr addrspace(3)`) with the widest vector loads the two layouts allow (`here`: as
    `mma.store_tile`'s)."""
    width, groups, lanes, warps = tile_load_groups(layout, shared, element.bits)
    thread = thread_offset(ctx, lanes, warps, here=here)
    b = ctx.builder
    vector_type = ir.VectorType(T.llvm_memory_type(element), width)
    registers = []
    for _, constant in groups:
        pointer = byte_pointer(ctx, base, combine_offset(ctx, thread, constant))
        vector = b.load(pointer, typ=vector_type, align=width * element.bits // 8)
        registers.extend(b.extract_element(vector, ir.Constant(T.i32, i)) for i in range(width))
    return registers


def exchange_through_swizzled_shared(ctx, registers, source, target, element, here: bool = False) -> list:
    """Move a block (a thread's `registers` in layout `source`) to layout `target` through a swizzled
    scratch tile; returns the thread's registers in `target`. `element` must pass `can_exchange`.
    `here`: the threads' tile offsets computed at the conversion (not in the prologue, where they would
    stay live through every loop before it)."""
    shared = exchange_tile(source, target, element.bits)
    reserve(ctx, source.numel * element.bits // 8)
    base = scratch_base(ctx)
    barrier(ctx)
    store_tile(ctx, list(registers), source, shared, element, base, here=here)
    barrier(ctx)
    return load_tile(ctx, target, shared, element, base, here=here)


def exchanges_tiles(source, target) -> bool:
    """Whether a conversion between these layouts moves a 2-D tile (both dims above 1, the same shape
    on both sides: no broadcast), which this path does instead of one scalar access per element."""
    shape = tuple(source.shape)
    return shape == tuple(target.shape) and len(shape) == 2 and min(shape) > 1
