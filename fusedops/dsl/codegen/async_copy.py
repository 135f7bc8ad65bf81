"""Lowering of the pipelining ops: shared buffers, cp.async copies into them, group waits, and
`local_load` (a dot operand read with ldmatrix, see `mma.py`).

Shared memory: `local_alloc` places its buffer after the buffers still alive (a stack: the IR is
structured and `local_dealloc` follows the loop in the same block), and scratch users in between
start after them (`ctx.scratch_offset`). `local_alloc` begins with a CTA barrier, so no thread
writes the region while another may still read an earlier use of it; `local_dealloc` waits for
this thread's copies still in flight (`cp.async.wait_all`) and synchronizes the CTA before the
region is reused (the first of a run of allocs / deallocs does it for the run).

cp.async (PTX ISA 9.7.9.25): `cp.async.cg.shared.global [dst], [src], 16, src_size` for 16-byte
copies (L2 only), `cp.async.ca` for 4 and 8 bytes; src_size 0 reads nothing and writes zeros,
which is how masked-off elements become 0. Intrinsic names: TOOLCHAIN.md section 2.
"""

from __future__ import annotations

import dataclasses

from llvmlite import ir

from ..ir import OpCode
from ..layouts.mma_shared import mma_operand_shared
from ..target import llvm_types as T
from .mma import OperandLoader, StagedOperand, byte_pointer, combine_offset, thread_offset, tile_store_groups
from .registry import lowering
from .shared import barrier, shared_base

BUFFER_ALIGN = 128


@dataclasses.dataclass(frozen=True)
class SharedBuffer:
    """A lowered `local_alloc`: its byte offset in the dynamic shared buffer and its tile layout."""

    offset: int
    type: object            # ir.shared_buffer.SharedBufferType
    tile: object            # the shared layout of one tile (offset -> coords)

    def tile_pointer(self, ctx, index):
        """`ptr addrspace(3)` to tile `index` (LLVM i32)."""
        b = ctx.builder
        start = b.add(b.mul(index, ir.Constant(T.i32, self.type.tile_bytes)), ir.Constant(T.i32, self.offset))
        return byte_pointer(ctx, shared_base(ctx), start)


def _void_intrinsic(ctx, name: str, arg_types, args) -> None:
    fn = T.declare_intrinsic(ctx.module, name, T.void, arg_types)
    ctx.builder.call(fn, args)


def _follows(op, opcode) -> bool:
    """Whether the op just before `op` in its block has `opcode` (one barrier serves a run)."""
    ops = op.parent.ops if op.parent is not None else []
    index = next((i for i, other in enumerate(ops) if other is op), 0)
    return index > 0 and ops[index - 1].opcode == opcode


@lowering(OpCode.LOCAL_ALLOC)
def _local_alloc(ctx, op):
    buffer_type = op.result.type
    if not _follows(op, OpCode.LOCAL_ALLOC):
        barrier(ctx)
    offset = (ctx.scratch_offset + BUFFER_ALIGN - 1) // BUFFER_ALIGN * BUFFER_ALIGN
    end = offset + buffer_type.nbytes
    ctx.live_buffers[id(op.result)] = end
    ctx.scratch_offset = end
    ctx.shared_bytes = max(ctx.shared_bytes, end)
    tile = mma_operand_shared(buffer_type.tile_shape, buffer_type.element.bits, op.attrs["contiguous_dim"])
    ctx.set(op.result, SharedBuffer(offset, buffer_type, tile))


@lowering(OpCode.LOCAL_DEALLOC)
def _local_dealloc(ctx, op):
    if not _follows(op, OpCode.LOCAL_DEALLOC):
        _void_intrinsic(ctx, "llvm.nvvm.cp.async.wait.all", [], [])
        barrier(ctx)
    ctx.live_buffers.pop(id(op.operands[0]), None)
    ctx.scratch_offset = max(ctx.live_buffers.values(), default=0)


@lowering(OpCode.ASYNC_COPY)
def _async_copy(ctx, op):
    buffer: SharedBuffer = ctx.get(op.operands[0])
    index = ctx.get(op.operands[1])
    pointer = op.operands[2]
    pointers = ctx.get(pointer)
    masks = ctx.get(op.operands[3]) if op.attrs.get("masked") else None
    element = buffer.type.element
    width = op.attrs["width"]
    nbytes = width * element.itemsize
    _, groups, lanes, warps = tile_store_groups(pointer.layout, buffer.tile, element.bits, width)
    thread = thread_offset(ctx, lanes, warps)
    base = buffer.tile_pointer(ctx, index)
    kind = "cg" if nbytes == 16 else "ca"
    name = f"llvm.nvvm.cp.async.{kind}.shared.global.{nbytes}.s"
    fn = T.declare_intrinsic(ctx.module, name, T.void, [T.pointer(3), T.pointer(1), T.i32])
    b = ctx.builder
    full, empty = ir.Constant(T.i32, nbytes), ir.Constant(T.i32, 0)
    for first, constant in groups:
        destination = byte_pointer(ctx, base, combine_offset(ctx, thread, constant))
        size = full if masks is None else b.select(masks[first], full, empty)
        b.call(fn, [destination, pointers[first], size])


@lowering(OpCode.ASYNC_COMMIT)
def _async_commit(ctx, op):
    _void_intrinsic(ctx, "llvm.nvvm.cp.async.commit.group", [], [])


@lowering(OpCode.ASYNC_WAIT)
def _async_wait(ctx, op):
    _void_intrinsic(ctx, "llvm.nvvm.cp.async.wait.group", [T.i32], [ir.Constant(T.i32, op.attrs["pending"])])
    barrier(ctx)


@lowering(OpCode.LOCAL_LOAD)
def _local_load(ctx, op):
    buffer: SharedBuffer = ctx.get(op.operands[0])
    loader = OperandLoader(op.result.layout, buffer.tile, buffer.type.element)
    ctx.set(op.result, StagedOperand(loader, base=buffer.tile_pointer(ctx, ctx.get(op.operands[1]))))
