"""Lowering of `dsl.cluster_sum`: a sum over the CTAs of a thread block cluster through distributed
shared memory (sm_90; PTX ISA "mapa", "st", ".shared::cluster" and "barrier.cluster"; CUDA
Programming Guide, "Distributed Shared Memory").

A kernel with cluster_sum ops keeps, for its whole run, a slot region at the start of its shared
memory: 2 buffers x `size` ranks x the largest op's values. A call writes this CTA's values (their
owning threads, once per element) into slot [buffer][rank] of every CTA of the cluster (`mapa` to
the peer's address, `st.shared::cluster`), meets the cluster at a barrier (arrive.release /
wait.acquire), then every thread adds, for each element it holds, the `size` slots of its own
shared memory in rank order: the same sum in every CTA, deterministic.

Buffers alternate call by call (a per-thread counter in a stack slot, promoted to registers by
LLVM): the writes of call c + 2 into a peer's buffer follow the barrier of call c + 1, which the
peer reaches only after its reads of call c; so one cluster barrier per call suffices. The kernel
starts with a cluster barrier so that no CTA writes into one that has not started. After a CTA's
last call no peer writes into it again, so CTAs may exit without a final barrier.

Cost (session 34, H200, LayerNorm backward in clusters, 12289-32768 columns): the barrier's stalls (a third of
the kernel's samples under Nsight Compute at 12289) are the wait for the cluster's slowest CTA, not the
release: with `arrive.relaxed` (unsafe) the backward ran within 0.5% of the shipped one.
"""

from __future__ import annotations

from llvmlite import ir

from ..errors import CompilationError
from ..ir import Function, OpCode
from ..language.dtypes import BlockType
from ..target import llvm_types as T
from . import layout_access, tma
from .ownership import owned_registers, owner_predicate
from .registry import lowering
from .shared import linear_index, shared_base, storage_bytes, storage_type

_REGION_KEY = "cluster_sum_slots"     # ctx.live_buffers key of the slot region (never freed)


def _numel(type_) -> int:
    return type_.numel if isinstance(type_, BlockType) else 1


def _value_offsets(op) -> tuple:
    """(byte offset of each operand's slots within a rank's slot, bytes of a rank's slot)."""
    offsets, end = [], 0
    for value in op.operands:
        size = storage_bytes(value.type.element if isinstance(value.type, BlockType) else value.type)
        end = (end + size - 1) // size * size
        offsets.append(end)
        end += size * _numel(value.type)
    return tuple(offsets), end


def prepare(ctx, function: Function, cluster: int, arch_number: int) -> None:
    """Before the body is lowered: reserve the slot region, start the call counter and meet the
    cluster once (where the kernel has cluster_sum ops and clusters of more than one CTA).

    Raises:
        CompilationError: cluster_sum with clusters of more than one CTA on a GPU before sm_90.
    """
    ops = [op for op in function.walk() if op.opcode == OpCode.CLUSTER_SUM]
    if not ops or cluster == 1:
        return
    if arch_number < 90:
        raise CompilationError(f"cluster_sum needs thread block clusters (sm_90 or later); kernel "
                               f"`{function.name}` has clusters of {cluster} programs and is compiled for "
                               f"sm_{arch_number}", ops[0].loc)
    rank_bytes = max(_value_offsets(op)[1] for op in ops)
    rank_bytes = (rank_bytes + 15) // 16 * 16
    end = 2 * cluster * rank_bytes
    ctx.cluster_sum = (cluster, rank_bytes, ctx.prologue.alloca(T.i32, name="cluster_sum_calls"))
    ctx.prologue.store(ir.Constant(T.i32, 0), ctx.cluster_sum[2])
    ctx.live_buffers[_REGION_KEY] = end
    ctx.scratch_offset = max(ctx.scratch_offset, end)
    ctx.shared_bytes = max(ctx.shared_bytes, end)
    tma.cluster_barrier(ctx.builder)


def _slot_pointer(ctx, buffer_base, rank, offset: int, index, element_type):
    """`ptr addrspace(3)` to element `index` of the operand at byte `offset` in rank `rank`'s slot."""
    b = ctx.builder
    _, rank_bytes, _ = ctx.cluster_sum
    start = b.add(buffer_base, b.mul(rank, ir.Constant(T.i32, rank_bytes)) if not isinstance(rank, int)
                  else ir.Constant(T.i32, rank * rank_bytes))
    start = b.add(start, ir.Constant(T.i32, offset))
    byte = b.gep(shared_base(ctx), [start], source_etype=T.i8)
    return b.gep(byte, [index], source_etype=element_type)


def _element_index(ctx, value, register: int):
    if not isinstance(value.type, BlockType):
        return ir.Constant(T.i32, 0)
    layout = value.layout
    return linear_index(ctx, ctx.element_coordinates(layout, register), layout_access.shape(layout))


def _write_slots(ctx, op, buffer_base, rank, offsets) -> None:
    """Each element's owner writes it into this rank's slot of every CTA of the cluster."""
    b = ctx.builder
    size = ctx.cluster_sum[0]
    cluster_pointer = ir.PointerType(addrspace=tma.SHARED_CLUSTER_ADDRESS_SPACE)
    mapa = T.declare_intrinsic(ctx.module, "llvm.nvvm.mapa.shared.cluster", cluster_pointer, [T.pointer(3), T.i32])
    for value, offset in zip(op.operands, offsets):
        block = isinstance(value.type, BlockType)
        element = value.type.element if block else value.type
        registers = ctx.get(value) if block else [ctx.get(value)]
        owned = sorted(owned_registers(value.layout)) if block else [0]
        owner = owner_predicate(ctx, value.layout) if block else \
            ctx.prologue.icmp_unsigned("==", ctx.thread_id, ir.Constant(T.i32, 0))
        with b.if_then(owner if owner is not None else ir.Constant(T.i1, 1)):
            for r in owned:
                local = _slot_pointer(ctx, buffer_base, rank, offset, _element_index(ctx, value, r),
                                      storage_type(element))
                for peer in range(size):       # (explicitly aligned: the module has no data layout)
                    b.store(registers[r], b.call(mapa, [local, ir.Constant(T.i32, peer)]),
                            align=storage_bytes(element))


@lowering(OpCode.CLUSTER_SUM)
def _cluster_sum(ctx, op):
    if ctx.cluster_sum is None:        # clusters of one CTA: the values themselves
        for value, result in zip(op.operands, op.results):
            ctx.set(result, ctx.get(value))
        return
    b = ctx.builder
    size, rank_bytes, counter = ctx.cluster_sum
    calls = b.load(counter, typ=T.i32)
    b.store(b.add(calls, ir.Constant(T.i32, 1)), counter)
    parity = b.and_(calls, ir.Constant(T.i32, 1))
    buffer_base = b.mul(parity, ir.Constant(T.i32, size * rank_bytes))
    offsets, _ = _value_offsets(op)
    _write_slots(ctx, op, buffer_base, tma.cluster_rank(b, ctx.module), offsets)
    tma.cluster_barrier(b)
    for value, result, offset in zip(op.operands, op.results, offsets):
        block = isinstance(value.type, BlockType)
        element = value.type.element if block else value.type
        memory_type = storage_type(element)
        sums = []
        for r in range(layout_access.num_registers(value.layout) if block else 1):
            index = _element_index(ctx, value, r)
            total = None
            for rank in range(size):
                slot = b.load(_slot_pointer(ctx, buffer_base, rank, offset, index, memory_type), typ=memory_type,
                              align=storage_bytes(element))
                total = slot if total is None else (b.fadd(total, slot) if element.is_floating
                                                    else b.add(total, slot))
            sums.append(total)
        ctx.set(result, sums if block else sums[0])
