"""Lowering of the pipelining ops: shared buffers, cp.async copies into them, group waits, and
`local_load` (a dot operand read with ldmatrix, or ld.shared for tf32, see `mma.py`).

Shared memory: `local_alloc` places its buffer after the buffers still alive (a stack: the IR is
structured and `local_dealloc` follows the loop in the same block), and scratch users in between
start after them (`ctx.scratch_offset`). `local_alloc` begins with a CTA barrier, so no thread
writes the region while another may still read an earlier use of it; `local_dealloc` waits for
this thread's copies still in flight (`cp.async.wait_all`) and synchronizes the CTA before the
region is reused (the first of a run of allocs / deallocs does it for the run).

wgmma (sm_90a): a ring of wgmma operand tiles (attr `swizzle_bytes`: the canonical wgmma layout,
`layouts.mma_shared.operand_tile_layout`) starts on a 1024-byte boundary (its slots are multiples
of their swizzle pattern), and its `local_load` is no load: the dot reads the slot through a
descriptor (`wgmma.py`). An `async_wait` with attr `proxy_fence` (its ring feeds wgmma) adds
`fence.proxy.async.shared::cta` between the wait and the barrier: cp.async writes shared memory
through the generic proxy, wgmma reads it through the async proxy.

cp.async (PTX ISA 9.7.9.25): `cp.async.cg.shared.global [dst], [src], 16, src_size` for 16-byte
copies (L2 only), `cp.async.ca` for 4 and 8 bytes; src_size 0 reads nothing and writes zeros,
which is how masked-off elements become 0. Intrinsic names: TOOLCHAIN.md section 2.
"""

from __future__ import annotations

import contextlib
import dataclasses

from llvmlite import ir

from ..errors import CompilationError
from ..ir import OpCode
from ..layouts.mma_shared import is_shared_layout, operand_tile_layout
from ..target import llvm_types as T
from .mma import StagedOperand, operand_loader, byte_pointer, combine_offset, thread_offset, tile_store_groups
from .registry import lowering
from .shared import align_shared_memory, barrier, shared_base
from . import tma
from .control import lower_block
from ..passes.dot_layouts import MAX_THREAD_REGISTERS, PRODUCER_WARPS, REGISTERS_PER_SM, thread_register_cap
from .wgmma import WGMMA_ALIGN, SharedOperand, fence_generic_to_async

BUFFER_ALIGN = 128
SCRATCH_ALIGN = 16             # where scratch starts after live buffers (16-byte vector accesses)


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
    if _is_mbarrier_array(op):
        _alloc_mbarriers(ctx, op)
        return
    swizzle = op.attrs.get("swizzle_bytes")
    alignment = BUFFER_ALIGN if swizzle is None else WGMMA_ALIGN
    if swizzle is not None:
        align_shared_memory(ctx, WGMMA_ALIGN)
    offset = (ctx.scratch_offset + alignment - 1) // alignment * alignment
    _push_live(ctx, op.result, offset + buffer_type.nbytes)
    tile = operand_tile_layout(buffer_type.tile_shape, buffer_type.element.bits, op.attrs["contiguous_dim"], swizzle)
    ctx.set(op.result, SharedBuffer(offset, buffer_type, tile))


def _push_live(ctx, buffer, end: int) -> None:
    """Mark `buffer` live up to byte `end`; scratch users start after it, on a 16-byte boundary (their
    vector accesses need it: a ring of 8-byte mbarriers may end on an 8-byte one)."""
    end = (end + SCRATCH_ALIGN - 1) // SCRATCH_ALIGN * SCRATCH_ALIGN
    ctx.live_buffers[id(buffer)] = end
    ctx.scratch_offset = end
    ctx.shared_bytes = max(ctx.shared_bytes, end)


@lowering(OpCode.LOCAL_DEALLOC)
def _local_dealloc(ctx, op):
    if not _follows(op, OpCode.LOCAL_DEALLOC):
        _void_intrinsic(ctx, "llvm.nvvm.cp.async.wait.all", [], [])
        barrier(ctx)
    if _is_mbarrier_array(op.operands[0].defining_op):
        barriers: SharedBuffer = ctx.get(op.operands[0])
        with first_thread(ctx):
            for slot in range(barriers.type.num_buffers):
                tma.mbarrier_inval(ctx.builder, barriers.tile_pointer(ctx, ir.Constant(T.i32, slot)))
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
    if op.attrs.get("proxy_fence"):
        fence_generic_to_async(ctx)
    barrier(ctx)


@lowering(OpCode.LOCAL_LOAD)
def _local_load(ctx, op):
    buffer: SharedBuffer = ctx.get(op.operands[0])
    if is_shared_layout(op.result.layout):      # a wgmma operand: the dot reads the slot in place
        if op.result.layout != buffer.tile:
            raise CompilationError("internal error: a wgmma operand tile differs from its ring's tile", op.loc)
        ctx.set(op.result, SharedOperand(buffer.tile, base=buffer.tile_pointer(ctx, ctx.get(op.operands[1]))))
        return
    loader = operand_loader(op.result.layout, buffer.tile, buffer.type.element)
    ctx.set(op.result, StagedOperand(loader, base=buffer.tile_pointer(ctx, ctx.get(op.operands[1]))))


# -- TMA rings (sm_90a, FUSEDOPS_TMA=1): mbarriers, bulk tensor copies, phase waits ---------------------

@contextlib.contextmanager
def first_thread(ctx, predicate=None):
    """Emit the body for thread 0 of the CTA only (a producer warp's lane 0 in its region:
    `ctx.issuing_thread`), and only where `predicate`, an i1, holds."""
    b = ctx.builder
    condition = b.icmp_unsigned("==", ctx.thread_id, ir.Constant(T.i32, ctx.issuing_thread))
    if predicate is not None:
        condition = b.and_(condition, predicate)
    with b.if_then(condition):
        yield


def _is_mbarrier_array(alloc) -> bool:
    return "mbarrier_arrivals" in alloc.attrs or "mbarrier_per_warp" in alloc.attrs


def _alloc_mbarriers(ctx, op) -> None:
    """A `local_alloc {mbarrier_arrivals}` (or `{mbarrier_per_warp}`: one arrival per warp of the
    CTA): one 8-byte mbarrier per slot, initialized by thread 0 to expect that many arrivals per
    phase, the init fenced for the copy engine and ordered before any copy by a CTA barrier. All
    threads first fence their earlier generic-proxy writes to shared memory, which the copy engine's
    async-proxy writes to the ring must come after."""
    buffer_type = op.result.type
    offset = (ctx.scratch_offset + 15) // 16 * 16
    _push_live(ctx, op.result, offset + buffer_type.nbytes)
    barriers = SharedBuffer(offset, buffer_type, None)
    ctx.set(op.result, barriers)
    fence_generic_to_async(ctx)
    with first_thread(ctx):
        for slot in range(buffer_type.num_buffers):
            tma.mbarrier_init(ctx.builder, barriers.tile_pointer(ctx, ir.Constant(T.i32, slot)),
                              op.attrs.get("mbarrier_arrivals", ctx.num_warps))
        tma.fence_mbarrier_init(ctx.builder)
    if op.attrs.get("cluster_sync"):    # other CTAs' multicast copies complete these barriers too
        tma.cluster_barrier(ctx.builder)
    else:
        barrier(ctx)


@lowering(OpCode.TMA_COPY)
def _tma_copy(ctx, op):
    """Thread 0 (where the predicate holds): expect the tile's bytes on the slot's mbarrier, then one
    `cp.async.bulk.tensor.2d` per swizzle atom of the tile (atoms are consecutive in the canonical
    wgmma layout, each one box of the tensor map). Attr multicast = n: this CTA copies the boxes
    rank * boxes / n .. (rank + 1) * boxes / n - 1 (with attr multicast_rows: rows rank * rows / n ..
    of every box, the map's box being that share) into all n CTAs of its cluster, and the others copy
    the rest into it (every CTA still expects the whole tile)."""
    buffer: SharedBuffer = ctx.get(op.operands[0])
    index = ctx.get(op.operands[1])
    barriers: SharedBuffer = ctx.get(op.operands[2])
    coordinates = [ctx.get(v) for v in op.operands[8:10]]
    tensor_map, param = ctx.tensor_maps[id(op)]
    contiguous = param.contiguous_dim
    rows, atom = param.box
    itemsize = buffer.type.element.itemsize
    box_bytes = buffer.type.tile_shape[1 - contiguous] * atom * itemsize      # a whole column of atoms
    boxes = buffer.type.tile_shape[contiguous] // atom
    multicast = op.attrs.get("multicast", 0)
    with first_thread(ctx, ctx.get(op.operands[10])):
        b = ctx.builder
        slot_barrier = barriers.tile_pointer(ctx, index)
        tma.mbarrier_arrive_expect_tx(b, slot_barrier, buffer.type.tile_bytes)
        tile = buffer.tile_pointer(ctx, index)
        zero = ir.Constant(T.i32, 0)
        rank = tma.cluster_rank(b, ctx.module) if multicast else None
        if multicast and not op.attrs.get("multicast_rows"):      # this CTA's share of the boxes, all rows
            share = boxes // multicast
            first = b.mul(rank, ir.Constant(T.i32, share))
            issued = [(b.add(first, ir.Constant(T.i32, i)) if i else first, zero) for i in range(share)]
        elif multicast:                                            # every box, this CTA's share of its rows
            first_row = b.mul(rank, ir.Constant(T.i32, rows))
            issued = [(ir.Constant(T.i32, box), first_row) for box in range(boxes)]
        else:
            issued = [(ir.Constant(T.i32, box), zero) for box in range(boxes)]
        mask = (1 << multicast) - 1 if multicast else 0
        for box, row in issued:
            offset = b.add(b.mul(box, ir.Constant(T.i32, box_bytes)), b.mul(row, ir.Constant(T.i32, atom * itemsize)))
            inner = b.add(coordinates[contiguous], b.mul(box, ir.Constant(T.i32, atom)))
            outer = b.add(coordinates[1 - contiguous], row)
            tma.tma_load_2d(b, ctx.module, byte_pointer(ctx, tile, offset), slot_barrier, tensor_map, inner, outer,
                            mask)


@lowering(OpCode.MBARRIER_WAIT)
def _mbarrier_wait(ctx, op):
    """Every thread (attr issuer: thread 0, the one issuing the copies) waits for the slot's phase,
    then a CTA barrier unless attr cta_barrier is False (FUSEDOPS_WS=0: every thread is also done
    reading the slot the copies issued next overwrite); attr cluster_wait: the wait of the cluster
    barrier instead, whose arrivals the previous iteration made (multicast rings: every thread of every
    CTA of the cluster is done reading it)."""
    barriers: SharedBuffer = ctx.get(op.operands[0])
    index, phase = ctx.get(op.operands[1]), ctx.get(op.operands[2])
    if op.attrs.get("issuer"):
        with first_thread(ctx):
            tma.mbarrier_wait(ctx.builder, barriers.tile_pointer(ctx, index), phase)
    else:
        tma.mbarrier_wait(ctx.builder, barriers.tile_pointer(ctx, index), phase)
    if op.attrs.get("cluster_wait"):
        tma.cluster_wait(ctx.builder)
    elif op.attrs.get("cta_barrier", True):
        barrier(ctx)


@lowering(OpCode.CLUSTER_BARRIER)
def _cluster_barrier(ctx, op):
    """Attr half: "arrive" (relaxed: see tma.cluster_arrive), "wait", or neither (both, release/acquire)."""
    half = op.attrs.get("half")
    if half == "arrive":
        tma.cluster_arrive(ctx.builder)
    elif half == "wait":
        tma.cluster_wait(ctx.builder)
    else:
        tma.cluster_barrier(ctx.builder)


@lowering(OpCode.MBARRIER_ARRIVE)
def _mbarrier_arrive(ctx, op):
    """Lane 0 of every warp (where the predicate holds) arrives on the slot's barrier: the warp's
    earlier wgmma.wait_group retired the wgmmas that read the slot (a warpgroup's wgmma completes
    for all its warps; one arrival per warp keeps the count independent of that)."""
    barriers: SharedBuffer = ctx.get(op.operands[0])
    b = ctx.builder
    condition = b.and_(b.icmp_unsigned("==", ctx.lane_id, ir.Constant(T.i32, 0)), ctx.get(op.operands[2]))
    with b.if_then(condition):
        tma.mbarrier_arrive(b, barriers.tile_pointer(ctx, ctx.get(op.operands[1])))


# The registers per thread the producer warpgroup (FUSEDOPS_WS=2; its warps: dot_layouts.PRODUCER_WARPS) keeps
# where the CTA's register file is shared out again (`producer_registers`): the least setmaxnreg takes, which its
# loop fits in (ptxas: no spills); the consumers of 8 warps then get 240 (232 with 40: the persistent matmul's
# bias + gelu epilogue into float32 spilled 72 bytes, against 32 here and 16 under FUSEDOPS_WS=0's 255).
PRODUCER_REGISTERS = 24


def producer_registers(num_warps: int):
    """(producer, consumer) per-thread register maxima for `setmaxnreg` in a CTA of num_warps consumer warps
    and the producer warpgroup, or None where the launch already grants each thread the most it may use
    (ptxas sizes a kernel's registers for its `.maxntid` threads: 65536 / 384 -> 168 for 8 + 4 warps, so
    the consumers of 8 warps get 240 of them, from the producer's 128 threads)."""
    if thread_register_cap(32 * (num_warps + PRODUCER_WARPS)) == MAX_THREAD_REGISTERS:
        return None
    consumers = (REGISTERS_PER_SM - 32 * PRODUCER_WARPS * PRODUCER_REGISTERS) // (32 * num_warps) // 8 * 8
    return PRODUCER_REGISTERS, min(consumers, 240)


@lowering(OpCode.PRODUCER_WARP)
def _producer_warp(ctx, op):
    """The producer warpgroup (warps num_warps .. num_warps + 3: the launch adds them, codegen/kernel.py)
    runs the region with the lane 0 of its first warp as the issuing thread, then returns; the num_warps
    warps go on with the rest of the kernel, whose CTA barriers from here on are the consumers' named
    barrier (shared.barrier). Where the launch grants fewer registers than a thread may use, the producer
    gives most of its own back and the consumers take them (`producer_registers`, setmaxnreg: the
    register reallocation of CUTLASS 3's warp-specialized kernels)."""
    b = ctx.builder
    consumers = 32 * ctx.num_warps
    registers = producer_registers(ctx.num_warps)
    producer_bb = b.append_basic_block("producer")
    consumer_bb = b.append_basic_block("consumers")
    b.cbranch(b.icmp_unsigned(">=", ctx.thread_id, ir.Constant(T.i32, consumers)), producer_bb, consumer_bb)
    b.position_at_end(producer_bb)
    if registers is not None:
        tma.setmaxnreg(b, registers[0], increase=False)
    ctx.issuing_thread = consumers
    lower_block(ctx, op.regions[0])
    ctx.issuing_thread = 0
    b.ret_void()
    b.position_at_end(consumer_bb)
    if registers is not None:
        tma.setmaxnreg(b, registers[1], increase=True)
    ctx.barrier_threads = consumers
