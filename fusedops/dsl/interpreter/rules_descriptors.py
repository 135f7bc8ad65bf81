"""Rules for tensor-descriptor loads and stores (`desc.load(offsets)`, `desc.store(offsets, value)`: the
frontend's DESCRIPTOR_LOAD / DESCRIPTOR_STORE, and TMA_STORE, a store the copy engine does) and for the
TMA ops the pipelining pass puts in their place (TMA_COPY, MBARRIER_WAIT, MBARRIER_ARRIVE, CLUSTER_BARRIER,
PRODUCER_WARP), so
a pipelined function can be run and compared with the original.

A descriptor load reads the box at the offsets; elements outside [0, shape) per dim are zeros and
touch no memory (what the copy engine does for a tensor map with OOB fill NONE). In-bounds elements
are bounds-checked like any load. A TMA copy lands in its ring slot only when a MBARRIER_WAIT on that
slot retires it (a read of the slot before that sees the slot's poison).
"""

from __future__ import annotations

import numpy as np

from ..ir.ops import OpCode
from .context import register
from .rules_memory import _access

_PENDING = object()      # key of the program's in-flight TMA copies in ProgramContext.env


def _box(base, shape, strides, offsets, block_shape, dtype) -> tuple:
    """(flat byte addresses of the box's elements, flat positions of those inside the tensor)."""
    rows = int(offsets[0]) + np.arange(block_shape[0], dtype=np.int64)
    cols = int(offsets[1]) + np.arange(block_shape[1], dtype=np.int64)
    inside = (((rows >= 0) & (rows < int(shape[0])))[:, None] & ((cols >= 0) & (cols < int(shape[1])))[None, :])
    elements = rows[:, None] * int(strides[0]) + cols[None, :] * int(strides[1])
    return (int(base) + elements * dtype.itemsize).reshape(-1), np.flatnonzero(inside.reshape(-1))


def read_box(ctx, op, base, shape, strides, offsets, block_shape, dtype) -> np.ndarray:
    """The `block_shape` box of the 2-D tensor (base address, shape, element strides) at `offsets`,
    zeros outside the tensor (see the module docstring)."""
    addresses, positions = _box(base, shape, strides, offsets, block_shape, dtype)
    result = np.zeros(addresses.size, dtype=dtype.numpy_dtype)
    result[positions] = _access(ctx, op, "descriptor load", dtype, tuple(block_shape), positions,
                                lambda: ctx.memory.read(addresses[positions], dtype))
    return result.reshape(block_shape)


@register(OpCode.DESCRIPTOR_LOAD)
def _descriptor_load(ctx, op, base, shape0, shape1, stride0, stride1, offset0, offset1):
    dtype = op.operands[0].type.element
    if ctx.cluster_log is not None and op.attrs.get("multicast"):
        ctx.cluster_log.record(ctx, op, (int(offset0), int(offset1)))
    return read_box(ctx, op, base, (shape0, shape1), (stride0, stride1), (offset0, offset1),
                    op.attrs["block_shape"], dtype)


def write_box(ctx, op, base, shape, strides, offsets, value, dtype) -> None:
    """Write `value` (a block) to the box of the 2-D tensor at `offsets`, only its elements inside the
    tensor; with op attr reduce="add" (`desc.atomic_add`) add it there (the programs run one at a time:
    each addition is whole)."""
    block_shape = tuple(np.shape(value))
    addresses, positions = _box(base, shape, strides, offsets, block_shape, dtype)
    values = np.asarray(value).reshape(-1)[positions]
    if op.attrs.get("reduce") == "add":
        def add():
            # box elements at the same address (a stride of 0) each add, as the hardware's atomics do
            unique, inverse = np.unique(addresses[positions], return_inverse=True)
            sums = np.zeros(unique.size, dtype=values.dtype)
            with np.errstate(over="ignore"):        # int32 / uint32 wrap, as the hardware's adds do
                np.add.at(sums, inverse, values)
                ctx.memory.write(unique, ctx.memory.read(unique, dtype) + sums, dtype)
        _access(ctx, op, "descriptor atomic_add", dtype, block_shape, positions, add)
        return
    _access(ctx, op, "descriptor store", dtype, block_shape, positions,
            lambda: ctx.memory.write(addresses[positions], values, dtype))


@register(OpCode.DESCRIPTOR_STORE)
def _descriptor_store(ctx, op, base, shape0, shape1, stride0, stride1, offset0, offset1, value):
    write_box(ctx, op, base, (shape0, shape1), (stride0, stride1), (offset0, offset1), value,
              op.operands[0].type.element)


@register(OpCode.TMA_STORE)
def _tma_store(ctx, op, value, base, shape0, shape1, stride0, stride1, offset0, offset1):
    write_box(ctx, op, base, (shape0, shape1), (stride0, stride1), (offset0, offset1), value,
              op.operands[1].type.element)


@register(OpCode.TMA_COPY)
def _tma_copy(ctx, op, buffer, index, barriers, base, shape0, shape1, stride0, stride1, coord0, coord1, predicate):
    if not bool(predicate):
        return
    dtype = op.operands[0].type.element
    box = read_box(ctx, op, base, (shape0, shape1), (stride0, stride1), (coord0, coord1),
                   tuple(op.operands[0].type.tile_shape), dtype)
    ctx.env.setdefault(_PENDING, []).append((buffer, int(index), box, barriers))


@register(OpCode.MBARRIER_WAIT)
def _mbarrier_wait(ctx, op, barriers, index, phase):
    pending = ctx.env.setdefault(_PENDING, [])
    # Per ring buffer, the oldest copy into this slot completing on this barrier array lands (a ring's "empty"
    # barriers have none): the ring's phases order a slot's fills so on the GPU, and a producer's loop, run to
    # its end first (`_producer_warp`), leaves several queued per slot.
    landed = []         # buffers (one per operand ring) whose oldest copy into the slot landed
    for position, (buffer, slot, box, on) in enumerate(pending):
        if slot == int(index) and on is barriers and not any(buffer is other for other in landed):
            buffer[slot] = box
            landed.append(buffer)
            pending[position] = None
    pending[:] = [p for p in pending if p is not None]


@register(OpCode.PRODUCER_WARP)
def _producer_warp(ctx, op):
    # The producer warpgroup's loop (FUSEDOPS_WS=2) runs to its end before the consumers go on: its copies queue
    # in issue order and each full wait of the consumers lands the oldest of its slot; its own waits on the
    # empty barriers land nothing.
    ctx.run_region(op.regions[0])


@register(OpCode.MBARRIER_ARRIVE)
def _mbarrier_arrive(ctx, op, barriers, index, predicate):
    # The interpreter runs a program's ops in order, so a release orders nothing it does not already.
    return None


@register(OpCode.CLUSTER_BARRIER)
def _cluster_barrier(ctx, op):
    # Each program of a cluster gets all of its (multicast) tiles itself here: there is nothing to wait for.
    return None
