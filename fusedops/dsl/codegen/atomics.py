"""Lowering of atomic read-modify-write and compare-and-swap.

LLVM 22's NVPTX back end drops the ordering and scope of `atomicrmw` (TOOLCHAIN.md), so the
requested semantics are made explicit with fences around a monotonic atomic: release before,
acquire after, at the requested scope. Masked-off elements and non-owning copies skip the atomic;
a masked-off element's result is 0, and copies get their owner's old value (`owners_values`). A
scalar atomic runs once per program, in thread 0, and its result is broadcast to every thread; with
release semantics (release, acq_rel, and every compare-and-swap) a CTA barrier comes first, so that
the program's earlier writes, made by all its threads, are released by it (a flag set after storing a
tile), as its acquire orders the reads of all threads after it (through the broadcast's barriers).
"""

from __future__ import annotations

from llvmlite import ir

from ..ir import OpCode
from ..language.dtypes import BlockType
from ..target import llvm_types as T
from .ownership import owned_registers, owner_predicate, owners_values
from .registry import lowering
from .shared import barrier, element_pointer, reserve

_SCOPE = {"gpu": "device", "cta": "block", "sys": ""}


def _rmw_name(kind: str, element) -> str:
    if element.is_floating:
        return {"add": "fadd", "max": "fmaximum", "min": "fminimum", "xchg": "xchg"}[kind]
    if kind in ("max", "min"):
        return kind if element.is_signed else "u" + kind
    return kind


def _fence(b, ordering: str, scope: str):
    b.fence(ordering, _SCOPE[scope] or None)


def _guarded(ctx, predicate, emit, result_type):
    """Run `emit()` only where `predicate` holds; 0 elsewhere."""
    b = ctx.builder
    if predicate is None:
        return emit()
    before = b.block
    then = b.append_basic_block("atomic.do")
    join = b.append_basic_block("atomic.join")
    b.cbranch(predicate, then, join)
    b.position_at_end(then)
    value = emit()
    then_end = b.block
    b.branch(join)
    b.position_at_end(join)
    phi = b.phi(result_type)
    phi.add_incoming(value, then_end)
    phi.add_incoming(ir.Constant(result_type, None), before)
    return phi


def _registers(ctx, op, count_masks: bool):
    pointer = op.operands[0]
    if isinstance(pointer.type, BlockType):
        owned = owned_registers(pointer.layout)
        owner = owner_predicate(ctx, pointer.layout)
        n = len(ctx.get(pointer))
        return [r for r in range(n)], owned, owner
    # A scalar atomic happens once per program: thread 0 does it (see `_broadcast_scalar`).
    first_thread = ctx.prologue.icmp_unsigned("==", ctx.thread_id, ir.Constant(T.i32, 0))
    return [None], None, first_thread


def _broadcast_scalar(ctx, value):
    """Thread 0's `value` in every thread of the program, through shared memory."""
    b = ctx.builder
    reserve(ctx, 8)
    slot = element_pointer(ctx, value.type, ir.Constant(T.i32, 0))
    barrier(ctx)
    with b.if_then(b.icmp_unsigned("==", ctx.thread_id, ir.Constant(T.i32, 0))):
        b.store(value, slot)
    barrier(ctx)
    return b.load(slot, typ=value.type)


def _set_result(ctx, op, registers, out, element):
    if registers == [None]:
        ctx.set(op.result, _broadcast_scalar(ctx, out[0]))
    else:
        ctx.set(op.result, owners_values(ctx, op.operands[0].layout, out, element))


def _get(ctx, value, r):
    lowered = ctx.get(value)
    return lowered if r is None else lowered[r]


@lowering(OpCode.ATOMIC_RMW)
def _atomic_rmw(ctx, op):
    b = ctx.builder
    element = op.operands[0].type.scalar.element
    ty = T.llvm_type(element)
    kind, sem, scope = op.attrs["kind"], op.attrs["sem"], op.attrs["scope"]
    registers, owned, owner = _registers(ctx, op, True)
    if registers == [None] and sem in ("release", "acq_rel"):
        barrier(ctx)
    out = []
    for r in registers:
        if owned is not None and r not in owned:
            out.append(ir.Constant(ty, None))
            continue
        predicate = _get(ctx, op.operands[2], r) if op.attrs.get("masked") else None
        if owner is not None:
            predicate = owner if predicate is None else b.and_(predicate, owner)
        pointer, value = _get(ctx, op.operands[0], r), _get(ctx, op.operands[1], r)

        def emit(pointer=pointer, value=value):
            if sem in ("release", "acq_rel"):
                _fence(b, "release", scope)
            old = b.atomic_rmw(_rmw_name(kind, element), pointer, value, "monotonic")
            if sem in ("acquire", "acq_rel"):
                _fence(b, "acquire", scope)
            return old
        out.append(_guarded(ctx, predicate, emit, ty))
    _set_result(ctx, op, registers, out, element)


@lowering(OpCode.ATOMIC_CAS)
def _atomic_cas(ctx, op):
    b = ctx.builder
    element = op.operands[0].type.scalar.element
    ty = T.llvm_type(element)
    registers, owned, owner = _registers(ctx, op, False)
    if registers == [None]:
        barrier(ctx)
    out = []
    for r in registers:
        if owned is not None and r not in owned:
            out.append(ir.Constant(ty, None))
            continue
        pointer, compare, value = (_get(ctx, v, r) for v in op.operands)

        def emit(pointer=pointer, compare=compare, value=value):
            if element.is_floating:
                int_type = ir.IntType(ty.width if hasattr(ty, "width") else element.bits)
                result = b.cmpxchg(pointer, b.bitcast(compare, int_type), b.bitcast(value, int_type),
                                   "acq_rel", "monotonic")
                return b.bitcast(b.extract_value(result, 0), ty)
            result = b.cmpxchg(pointer, compare, value, "acq_rel", "monotonic")
            return b.extract_value(result, 0)
        out.append(_guarded(ctx, owner, emit, ty))
    _set_result(ctx, op, registers, out, element)
