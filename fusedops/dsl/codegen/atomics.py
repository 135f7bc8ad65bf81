"""Lowering of atomic read-modify-write and compare-and-swap.

LLVM 22's NVPTX back end drops the ordering and scope of `atomicrmw` (TOOLCHAIN.md), so the
requested semantics are made explicit with fences around a monotonic atomic: release before,
acquire after, at the requested scope. A compare-and-swap keeps them: `cmpxchg` takes its ordering
and a syncscope (`.gpu` / `.cta`; none: `.sys`), which llvmlite's builder does not write
(`_ScopedCmpXchg`). Masked-off elements and non-owning copies skip the atomic; a masked-off
element's result is 0, and copies get their owner's old value (`owners_values`). A scalar atomic
runs once per program, in thread 0, and its result is broadcast to every thread; with release
semantics (release, acq_rel) a CTA barrier comes first, so that the program's earlier writes, made
by all its threads, are released by it (a flag set after storing a tile), as its acquire orders the
reads of all threads after it (through the broadcast's barriers).
"""

from __future__ import annotations

from llvmlite import ir
from llvmlite.ir import instructions

from ..ir import OpCode
from ..language.dtypes import BlockType, float32
from ..target import llvm_types as T
from .memory import vector_widths
from .ownership import owned_registers, owner_predicate, owners_values
from .reduce import combined
from .registry import lowering
from .shared import barrier, element_pointer, reserve

_SCOPE = {"gpu": "device", "cta": "block", "sys": ""}


# cmpxchg's (success, failure) orderings by `sem` (the failure ordering drops the release, as C++'s default)
_CAS_ORDERINGS = {"relaxed": ("monotonic", "monotonic"), "acquire": ("acquire", "acquire"),
                  "release": ("release", "monotonic"), "acq_rel": ("acq_rel", "acquire")}


class _ScopedCmpXchg(instructions.CmpXchg):
    """`cmpxchg` with a syncscope (LLVM LangRef, cmpxchg; llvmlite's writes none, i.e. system scope)."""

    def __init__(self, parent, ptr, cmp, val, ordering, failordering, scope: str):
        super().__init__(parent, ptr, cmp, val, ordering, failordering, name="")
        self.scope = scope

    def descr(self, buf):
        ptr, cmp, val = self.operands
        scope = f'syncscope("{self.scope}") ' if self.scope else ""
        buf.append(f"cmpxchg {ptr.type} {ptr.get_reference()}, {cmp.type} {cmp.get_reference()}, {val.type} "
                   f"{val.get_reference()} {scope}{self.ordering} {self.failordering}"
                   f"{self._stringify_metadata(leading_comma=True)}\n")


def _cmpxchg(b, pointer, compare, value, sem: str, scope: str):
    """The old value of a compare-and-swap with ordering `sem` at `scope` (an IR struct's field 0)."""
    ordering, failure = _CAS_ORDERINGS[sem]
    inst = _ScopedCmpXchg(b.block, pointer, compare, value, ordering, failure, _SCOPE[scope])
    b._insert(inst)
    return b.extract_value(inst, 0)


def _rmw_name(kind: str, element) -> str:
    if element.is_floating:
        return {"add": "fadd", "max": "fmaximum", "min": "fminimum", "xchg": "xchg"}[kind]
    if kind in ("max", "min"):
        return kind if element.is_signed else "u" + kind
    return kind


# System-scope read-modify-writes (scope="sys"), which LLVM's `atomicrmw` would emit GPU-scoped: PTX `atom`
# op and type by (kind, float?, bits) where one instruction does it (PTX ISA, atom: `.noftz.bf16` from sm_90);
# the others (8- and 16-bit integers, float max / min, bf16 before sm_90) loop on a system-scope CAS.
_SYSTEM_ATOM = {("add", False, 32): "add.u32", ("add", False, 64): "add.u64", ("add", True, 32): "add.f32",
                ("add", True, 64): "add.f64", ("xchg", False, 32): "exch.b32", ("xchg", False, 64): "exch.b64",
                ("xchg", True, 32): "exch.b32", ("xchg", True, 64): "exch.b64", ("and", False, 32): "and.b32",
                ("and", False, 64): "and.b64", ("or", False, 32): "or.b32", ("or", False, 64): "or.b64",
                ("xor", False, 32): "xor.b32", ("xor", False, 64): "xor.b64"}
_REGISTER = {16: "h", 32: "r", 64: "l"}


def _system_atom(ctx, kind: str, element) -> str:
    """The `atom` op.type of a system-scope RMW of `element`s, or "" where none does it."""
    if kind in ("max", "min") and not element.is_floating and element.bits >= 32:
        return f"{kind}.{'s' if element.is_signed else 'u'}{element.bits}"
    if kind == "add" and element.is_floating and element.bits == 16:
        return "add.noftz.f16" if element.name == "float16" else ("add.noftz.bf16" if ctx.arch_at_least(90) else "")
    return _SYSTEM_ATOM.get((kind, element.is_floating, element.bits), "")


def _system_rmw(ctx, kind: str, element, pointer, value):
    """The old value of a relaxed system-scope RMW: one `atom.relaxed.sys.global` where PTX has it (operands
    as integers of their width), else a loop of system-scope compare-and-swaps."""
    b = ctx.builder
    ty, bits = value.type, element.bits
    integer = ir.IntType(bits)
    op = _system_atom(ctx, kind, element)
    if op:
        register = "f" if op.endswith("f32") else "d" if op.endswith("f64") else _REGISTER[bits]
        operand = value if register in "fd" else b.bitcast(value, integer) if element.is_floating else value
        old = T.inline_asm(b, f"atom.relaxed.sys.global.{op} $0, [$1], $2;", f"={register},l,{register}",
                           [pointer, operand], operand.type)
        return b.bitcast(old, ty) if old.type != ty else old
    entry = b.block
    start = b.bitcast(b.load(pointer, typ=ty), integer) if element.is_floating else b.load(pointer, typ=ty)
    loop, done = b.append_basic_block("atomic.sys"), b.append_basic_block("atomic.sys.done")
    b.branch(loop)
    b.position_at_end(loop)
    expected = b.phi(integer)
    expected.add_incoming(start, entry)
    current = b.bitcast(expected, ty) if element.is_floating else expected
    new = _stored(ctx, kind, element, current, value)
    seen = _cmpxchg(b, pointer, expected, b.bitcast(new, integer) if element.is_floating else new, "relaxed", "sys")
    expected.add_incoming(seen, b.block)
    b.cbranch(b.icmp_unsigned("==", seen, expected), done, loop)
    b.position_at_end(done)
    return current


def _stored(ctx, kind: str, element, old, value):
    """What an RMW of `kind` stores over `old`: the interpreter's rule (add, max and min as reductions combine:
    float max / min propagate NaN)."""
    b = ctx.builder
    if kind == "xchg":
        return value
    if kind in ("and", "or", "xor"):
        return {"and": b.and_, "or": b.or_, "xor": b.xor}[kind](old, value)
    return combined(ctx, "sum" if kind == "add" else kind, element, old, value)


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
    """The old values: a scalar's broadcast from thread 0, a block's from each element's owner (through
    shared memory where the layout replicates it), or nothing moved where nobody reads them (dce's
    `result_unused`: passes/wgmma_waits.py lets an in-flight wgmma pass such an atomic, so it must not
    touch shared memory)."""
    if registers == [None]:
        ctx.set(op.result, _broadcast_scalar(ctx, out[0]))
    elif op.attrs.get("result_unused"):
        ctx.set(op.result, out)
    else:
        ctx.set(op.result, owners_values(ctx, op.operands[0].layout, out, element))


def _get(ctx, value, r):
    lowered = ctx.get(value)
    return lowered if r is None else lowered[r]


_VECTOR_REDUCTION_MAX = 4       # elements: red.global.add.v4.f32 is the widest


def _reduction_width(ctx, op) -> int:
    """The elements per vector reduction (`red.global.add.v2/.v4.f32`, sm_90) for a relaxed float32 add
    of a block whose old values nobody reads (dce's `result_unused`) and whose consecutive registers
    address consecutive elements (memory.vector_widths); 1: one atomic per element."""
    pointer = op.operands[0]
    if not (op.attrs.get("result_unused") and op.attrs["kind"] == "add" and op.attrs["sem"] == "relaxed"
            and op.attrs["scope"] in ("gpu", "cta") and pointer.type.scalar.element == float32
            and isinstance(pointer.type, BlockType) and ctx.arch_at_least(90)):
        return 1
    mask = op.operands[2] if op.attrs.get("masked") else None
    return min(_VECTOR_REDUCTION_MAX, vector_widths(ctx, pointer, mask, 4)[1])


def _vector_reductions(ctx, op, width: int) -> None:
    """`red.relaxed.<scope>.global.add.v<width>.f32` per group of `width` registers (owners only, under
    the mask): a warp's lanes then cover whole 32-byte sectors with a quarter or half the instructions."""
    b = ctx.builder
    owned = owned_registers(op.operands[0].layout)
    owner = owner_predicate(ctx, op.operands[0].layout)
    pointers, values = ctx.get(op.operands[0]), ctx.get(op.operands[1])
    masks = ctx.get(op.operands[2]) if op.attrs.get("masked") else None
    names = ", ".join(f"${i + 1}" for i in range(width))
    asm = f"red.relaxed.{op.attrs['scope']}.global.add.v{width}.f32 [$0], {{{names}}};"
    constraints = ",".join(["l"] + ["f"] * width)
    for start in range(0, len(pointers), width):
        if start not in owned:
            continue
        predicate = masks[start] if masks is not None else None
        if owner is not None:
            predicate = owner if predicate is None else b.and_(predicate, owner)

        def emit(start=start):
            T.inline_asm(b, asm, constraints, [pointers[start]] + list(values[start:start + width]))
        if predicate is None:
            emit()
        else:
            with b.if_then(predicate):
                emit()
    ctx.set(op.result, [ir.Constant(T.f32, None)] * len(pointers))


@lowering(OpCode.ATOMIC_RMW)
def _atomic_rmw(ctx, op):
    b = ctx.builder
    element = op.operands[0].type.scalar.element
    ty = T.llvm_type(element)
    kind, sem, scope = op.attrs["kind"], op.attrs["sem"], op.attrs["scope"]
    width = _reduction_width(ctx, op)
    if width > 1:
        _vector_reductions(ctx, op, width)
        return
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
            if scope == "sys":
                old = _system_rmw(ctx, kind, element, pointer, value)
            else:   # GPU scope (`atomicrmw` without a scope), which covers a CTA's
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
    sem, scope = op.attrs["sem"], op.attrs["scope"]
    registers, owned, owner = _registers(ctx, op, False)
    if registers == [None] and sem in ("release", "acq_rel"):
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
                old = _cmpxchg(b, pointer, b.bitcast(compare, int_type), b.bitcast(value, int_type), sem, scope)
                return b.bitcast(old, ty)
            return _cmpxchg(b, pointer, compare, value, sem, scope)
        out.append(_guarded(ctx, owner, emit, ty))
    _set_result(ctx, op, registers, out, element)
