"""Lowering of `tma_store` (sm_90a): a block written to global memory by the bulk tensor copy engine (or,
with attr reduce="add", `desc.atomic_add`: added there, cp.reduce.async.bulk.tensor .add).

The block goes, from the layout it has (a wgmma accumulator: no conversion), into a shared tile in
the canonical 128-byte-swizzled layout (`layouts.mma_shared.operand_tile_layout`: boxes of one swizzle
atom along the contiguous dim, each `rows x 128` bytes, one after the other), then thread 0 issues one
`cp.async.bulk.tensor.2d.global.shared::cta` per box, commits them as a group and waits until the
engine has read the tile (`cp.async.bulk.wait_group.read 0`); the writes to global memory complete
on their own (by the end of the kernel), and box elements outside the tensor are not written.

Protocol (shared.py): barrier, st.shared, fence.proxy.async (the generic-proxy writes, to the tile and
any earlier ones to global memory, become visible to the engine's async-proxy accesses; only
`.shared::cta`, the tile, where the kernel has no generic global access the engine's writes must follow:
attr `fence_global`, passes/descriptors.py), barrier, thread 0 copies and waits. The next scratch user begins
with a barrier that thread 0 reaches only after its wait, so the tile is not overwritten while read.
Where the kernel may touch global memory after the store (attr `drain`, passes/descriptors.py: a later
access, or the store in a loop), thread 0 waits until the writes are done (`wait_group 0`, then
`fence.proxy.async.global`: the async proxy's writes ordered before generic accesses) and a CTA barrier
makes every thread wait for it; a store with nothing after it only waits for the read of its tile
(the writes complete by the kernel's end). Nothing is issued for an empty tensor (its map is zeros).

Shared memory: the tile lives in scratch on a 1024-byte boundary (the swizzle pattern is tied to
address bits). Where the buffers still alive (a pipelined loop's ring around a persistent kernel's
epilogue) leave less room than the tile (MAX_SHARED_BYTES, the H100/H200 per-CTA limit), the boxes go
out in chunks (a register group goes in its box's chunk: known at compile time when lane and warp bits
stay below the box bits, else tested per thread), through two buffers of half the room where each holds
a box (`chunk_buffers`): the CTA writes chunk i + 1 while the engine reads chunk i, and thread 0 waits
for the read of chunk i - 1 (`wait_group.read 1`) before the barrier that lets the CTA overwrite its
buffer; only the last chunk is waited for as above.

A box that starts before the tensor or, along the contiguous dim, off a 16-byte boundary (the H200
raises "illegal instruction" for such a store; loads take any start) takes the other side of a
branch on the offsets (uniform over the CTA) after each chunk reached shared memory: the CTA copies
the chunk to global memory itself, element by element with bounds checks (`_ElementStores`), each
thread then fencing its generic writes for the async proxy (`fence.proxy.async.global`: a later TMA
store of the same elements may fence only its tile).

PTX ISA 9.7.9.25.5.2 (cp.async.bulk.tensor), 9.7.9.25.5.3 (cp.reduce.async.bulk.tensor),
9.7.9.25.5.4-5 (cp.async.bulk.commit_group, wait_group); TOOLCHAIN.md section 2 ("TMA store").
"""

from __future__ import annotations

from llvmlite import ir

from ..errors import CompilationError
from ..ir import OpCode
from ..layouts.mma_shared import operand_tile_layout
from ..passes.descriptors import STORE_SWIZZLE_BYTES
from ..target import llvm_types as T
from . import tma
from .async_copy import first_thread
from .registry import lowering
from .mma import byte_pointer, combine_offset, thread_offset, tile_store_groups
from .shared import align_shared_memory, barrier, reserve, shared_base
from .wgmma import WGMMA_ALIGN, fence_generic_to_async

# Bytes of shared memory one CTA may use on sm_90 (227 KB, with the opt-in).
MAX_SHARED_BYTES = 232448


def boxes_per_chunk(scratch_offset: int, boxes: int, box_bytes: int) -> int:
    """How many boxes of `box_bytes` go out at once: all of them where they fit in MAX_SHARED_BYTES after
    `scratch_offset` (rounded up to 1024), else as many as fit, at least one."""
    room = MAX_SHARED_BYTES - (-(-scratch_offset // WGMMA_ALIGN) * WGMMA_ALIGN)
    return max(1, min(boxes, room // box_bytes))


def chunk_buffers(scratch_offset: int, boxes: int, box_bytes: int) -> tuple:
    """(boxes per chunk, buffers): the whole tile in one buffer where it fits (`boxes_per_chunk`); else
    two buffers of half the room where that holds a box each, so that the CTA writes one chunk while the
    copy engine reads the one before; else one buffer of what fits."""
    per_chunk = boxes_per_chunk(scratch_offset, boxes, box_bytes)
    if per_chunk == boxes or per_chunk < 2:
        return per_chunk, 1
    return per_chunk // 2, 2


def _wide(b, value):
    return value if value.type.width == 64 else b.sext(value, T.i64)


def _engine_takes(ctx, op):
    """i1, uniform over the CTA: whether the box starts inside the tensor on a 16-byte boundary along
    the contiguous dim (the H200 raises "illegal instruction" for a store box that starts before the
    tensor or off 16 bytes; loads take any start)."""
    b = ctx.builder
    element = op.operands[0].type.element
    offsets = [ctx.get(v) for v in op.operands[6:8]]
    zero = ir.Constant(T.i32, 0)
    aligned = b.icmp_unsigned("==", b.and_(offsets[op.attrs["contiguous_dim"]],
                                           ir.Constant(T.i32, 16 // element.itemsize - 1)), zero)
    return b.and_(aligned, b.and_(b.icmp_signed(">=", offsets[0], zero), b.icmp_signed(">=", offsets[1], zero)))


class _ElementStores:
    """The fallback for a box the engine does not take: the CTA copies each chunk of the shared tile to
    global memory itself, 16 bytes per thread at a time, every element where it lies inside the tensor
    (st.global, or for `desc.atomic_add` a relaxed atom.add). An element's block coordinates come from
    its offset in the tile through the tile's layout (the inverse of the swizzle), so each element is
    written once whatever layout the block had in registers.

    Two things keep an overlapped epilogue's wgmma pipeline whole (ptxas C7514 serializes every wgmma of
    the kernel otherwise): the fallback reads the shared tile, not the block's registers (no register
    read under control flow), and it computes from a thread id of its own branch (`begin`), not the
    prologue's: LLVM sinks prologue values to the first block that uses them, which puts them ahead of
    the loop's final `wgmma.wait_group 0`."""

    def __init__(self, ctx, op, tile):
        b = ctx.builder
        self.ctx, self.tile = ctx, tile
        self.contiguous = op.attrs["contiguous_dim"]
        self.reduce = op.attrs.get("reduce")
        self.base = ctx.get(op.operands[1])
        self.sizes, self.strides, self.offsets = ([_wide(b, ctx.get(v)) for v in op.operands[first:first + 2]]
                                                  for first in (2, 4, 6))
        element = op.operands[0].type.element
        self.memory_type = T.llvm_memory_type(element)
        self.vector = 16 // element.itemsize            # elements per 16-byte access
        bases = tile.bases_of("offset")
        low = self.vector.bit_length() - 1
        unit = [0, 0]
        for bit in range(low):      # a 16-byte access holds consecutive elements along the contiguous dim
            unit[self.contiguous] = 1 << bit
            if tuple(bases[bit]) != tuple(unit):
                raise CompilationError(f"internal error: tile offset bit {bit} maps to {bases[bit]}")
        self.high_bases = list(enumerate(bases))[low:]
        self.thread = None

    def begin(self) -> None:
        """At the head of the fallback's branch: a thread id LLVM cannot equate with the prologue's."""
        self.thread = self.ctx.fresh_thread_id()

    def copy_out(self, chunk, first_element: int, elements: int) -> None:
        """The `elements` elements of the tile from element `first_element` on, which lie in shared memory
        from `chunk` (an i8 pointer) on, to their global places."""
        ctx, b = self.ctx, self.ctx.builder
        threads = ctx.num_warps * 32
        vectors = elements // self.vector
        vector_type = ir.VectorType(self.memory_type, self.vector)
        for step in range(-(-vectors // threads)):
            index = b.add(self.thread, ir.Constant(T.i32, step * threads))
            if (step + 1) * threads > vectors:
                with b.if_then(b.icmp_unsigned("<", index, ir.Constant(T.i32, vectors))):
                    self._copy_vector(chunk, index, first_element, vector_type)
            else:
                self._copy_vector(chunk, index, first_element, vector_type)

    def _copy_vector(self, chunk, index, first_element: int, vector_type) -> None:
        b = self.ctx.builder
        source = b.gep(chunk, [b.mul(index, ir.Constant(T.i32, 16))], source_etype=T.i8)
        vector = b.load(source, typ=vector_type, align=16)
        offset = b.add(b.mul(index, ir.Constant(T.i32, self.vector)), ir.Constant(T.i32, first_element))
        coordinates = [ir.Constant(T.i32, 0), ir.Constant(T.i32, 0)]
        for bit, basis in self.high_bases:
            flag = b.and_(b.lshr(offset, ir.Constant(T.i32, bit)), ir.Constant(T.i32, 1))
            for dim in (0, 1):
                if basis[dim]:
                    coordinates[dim] = b.xor(coordinates[dim], b.mul(flag, ir.Constant(T.i32, basis[dim])))
        zero = ir.Constant(T.i64, 0)
        for i in range(self.vector):
            element, inside = zero, None
            for dim in (0, 1):
                coordinate = b.zext(coordinates[dim], T.i64)
                if dim == self.contiguous and i:
                    coordinate = b.add(coordinate, ir.Constant(T.i64, i))
                position = b.add(self.offsets[dim], coordinate)
                bounded = b.and_(b.icmp_signed(">=", position, zero), b.icmp_signed("<", position, self.sizes[dim]))
                inside = bounded if inside is None else b.and_(inside, bounded)
                element = b.add(element, b.mul(position, self.strides[dim]))
            with b.if_then(inside):
                value = b.extract_element(vector, ir.Constant(T.i32, i))
                pointer = b.gep(self.base, [element], source_etype=self.memory_type)
                if self.reduce:         # desc.atomic_add: float32, int32 or uint32
                    b.atomic_rmw("fadd" if isinstance(self.memory_type, ir.FloatType) else "add", pointer, value,
                                 "monotonic")
                else:
                    b.store(value, pointer)


@lowering(OpCode.TMA_STORE)
def _tma_store(ctx, op):
    """The block into a 128-byte-swizzled shared tile (chunk by chunk where room is short), then either
    the copy engine (thread 0, one copy per box) or, for a box it does not take, the CTA's own copy of
    the chunk (`_ElementStores`); the offsets are uniform, so every thread takes the same branch."""
    value = op.operands[0]
    element = value.type.element
    contiguous = op.attrs["contiguous_dim"]
    shape = tuple(op.attrs["block_shape"])
    atom = STORE_SWIZZLE_BYTES // element.itemsize
    box_bytes = shape[1 - contiguous] * STORE_SWIZZLE_BYTES
    boxes = shape[contiguous] // atom
    tile = operand_tile_layout(shape, element.bits, contiguous, STORE_SWIZZLE_BYTES)
    width, groups, lanes, warps = tile_store_groups(value.layout, tile, element.bits)
    per_chunk, buffers = chunk_buffers(ctx.scratch_offset, boxes, box_bytes)
    # Which chunk a register group lands in: known here when the thread's part of its offset stays
    # below the box bits, else tested per thread.
    static = all(base < box_bytes for base in lanes + warps)
    start = -ctx.scratch_offset % WGMMA_ALIGN
    reserve(ctx, start + buffers * per_chunk * box_bytes)
    align_shared_memory(ctx, WGMMA_ALIGN)
    b = ctx.builder
    base = byte_pointer(ctx, shared_base(ctx), ir.Constant(T.i32, ctx.scratch_offset + start))
    thread = thread_offset(ctx, lanes, warps, here=True)
    registers = ctx.get(value)
    vector_type = ir.VectorType(T.llvm_memory_type(element), width)
    coordinates = [ctx.get(v) for v in op.operands[6:8]]
    engine = _engine_takes(ctx, op)
    elements = _ElementStores(ctx, op, tile)
    # An empty tensor's map is not encoded (all zeros): nothing to write, no copy issued.
    sizes = [ctx.get(v) for v in op.operands[2:4]]
    non_empty = b.and_(*[b.icmp_signed(">", size, ir.Constant(size.type, 0)) for size in sizes])
    tensor_map, _ = ctx.tensor_maps[id(op)]
    for chunk, first_box in enumerate(range(0, boxes, per_chunk)):
        last_box = min(boxes, first_box + per_chunk)
        buffer = byte_pointer(ctx, base, ir.Constant(T.i32, chunk % buffers * per_chunk * box_bytes))
        if buffers > 1 and chunk >= buffers:
            # the engine has read the chunk that last used this buffer (the one since may still be read)
            with first_thread(ctx):
                tma.bulk_wait_group_read(b, ctx.module, buffers - 1)
        barrier(ctx)
        for first, constant in groups:
            if per_chunk < boxes and static and not first_box <= constant // box_bytes < last_box:
                continue
            vector = ir.Constant(vector_type, ir.Undefined)
            for i in range(width):
                vector = b.insert_element(vector, registers[first + i], ir.Constant(T.i32, i))
            offset = combine_offset(ctx, thread, constant)
            if per_chunk < boxes and not static:
                # this thread's group lands in this chunk or not (a branch: ptxas took an inline-asm
                # predicated st.shared of the registers as a read that serializes the wgmmas, C7514)
                box = b.lshr(offset, ir.Constant(T.i32, box_bytes.bit_length() - 1))
                inside = b.and_(b.icmp_unsigned(">=", box, ir.Constant(T.i32, first_box)),
                                b.icmp_unsigned("<", box, ir.Constant(T.i32, last_box)))
                shifted = b.sub(offset, ir.Constant(T.i32, first_box * box_bytes))
                with b.if_then(inside):
                    b.store(vector, byte_pointer(ctx, buffer, shifted), align=width * element.bits // 8)
                continue
            if first_box:
                offset = b.sub(offset, ir.Constant(T.i32, first_box * box_bytes))
            b.store(vector, byte_pointer(ctx, buffer, offset), align=width * element.bits // 8)
        # the tile's st.shared and, where there may be any (attr fence_global), the program's earlier
        # generic global accesses of the same elements, before the engine's async-proxy accesses
        if op.attrs.get("fence_global", True):
            tma.fence_proxy_async(b, ctx.module)
        else:
            fence_generic_to_async(ctx)
        barrier(ctx)
        drain = op.attrs.get("drain", True) and last_box == boxes
        with b.if_else(engine) as (by_engine, by_elements):
            with by_engine:
                with first_thread(ctx, non_empty):
                    for box in range(first_box, last_box):
                        source = byte_pointer(ctx, buffer, ir.Constant(T.i32, (box - first_box) * box_bytes))
                        inner = coordinates[contiguous]
                        if box:
                            inner = b.add(inner, ir.Constant(T.i32, box * atom))
                        copy = tma.tma_reduce_add_2d if op.attrs.get("reduce") else tma.tma_store_2d
                        copy(b, ctx.module, source, tensor_map, inner, coordinates[1 - contiguous])
                    tma.bulk_commit_group(b, ctx.module)
                    if drain:
                        tma.bulk_wait_group(b, ctx.module, 0)
                        tma.fence_async_global(b)
                    elif last_box == boxes or buffers == 1:
                        tma.bulk_wait_group_read(b, ctx.module, 0)
                    # else the engine reads this chunk while the CTA writes the next one to the other buffer
            with by_elements:
                elements.begin()
                elements.copy_out(buffer, first_box * box_bytes // element.itemsize,
                                  (last_box - first_box) * box_bytes // element.itemsize)
                # these generic writes before any later async-proxy access of the same elements (a later
                # TMA store, whose own fence may cover only its shared tile: attr fence_global)
                tma.fence_async_global(b)
        if drain:
            barrier(ctx)
