"""Lowering of global loads, stores and atomics.

A thread's registers that its layout maps to consecutive elements along the last dim, with the
pointer's divisibility and the mask's constancy proven by the pointer analysis, become one vector
access of up to 16 bytes under one predicate. Everything else is split into scalar
accesses, so correctness never depends on the vector path. Masked groups are predicated
instructions (see `predicated.py`).

Elements held by more than one thread (a block smaller than the CTA) are stored and atomically
updated only by their owner (see `ownership.py`).
"""

from __future__ import annotations

from llvmlite import ir

from ..ir import OpCode
from ..language.dtypes import BlockType
from ..passes.pointer_analysis import vector_width
from ..target import llvm_types as T
from . import layout_access
from .ownership import owner_predicate, owned_registers
from .predicated import predicated_load, predicated_store
from .registry import lowering


def _contiguous_registers(layout) -> int:
    """How many leading registers hold consecutive elements along the last dim (a power of two)."""
    bases = layout_access.register_bases(layout)
    rank = len(layout_access.shape(layout))
    count = 1
    for i, basis in enumerate(bases):
        expected = tuple(0 if d < rank - 1 else 1 << i for d in range(rank))
        if basis != expected:
            break
        count *= 2
    return count


def _vector_width(ctx, op, pointer, mask, element_bytes: int) -> int:
    if not isinstance(pointer.type, BlockType):
        return 1
    width = vector_width(ctx.axis_info, pointer, mask, element_bytes)
    return max(1, min(width, _contiguous_registers(pointer.layout)))


def _pack(b, scalars, vector_type):
    value = ir.Constant(vector_type, ir.Undefined)
    for i, scalar in enumerate(scalars):
        value = b.insert_element(value, scalar, ir.Constant(T.i32, i))
    return value


def _to_memory(b, value, element):
    return b.zext(value, T.i8) if element.is_bool else value


def _from_memory(b, value, element):
    return b.icmp_unsigned("!=", value, ir.Constant(T.i8, 0)) if element.is_bool else value


@lowering(OpCode.LOAD)
def _load(ctx, op):
    b = ctx.builder
    pointer = op.operands[0]
    mask = op.operands[1] if op.attrs.get("masked") else None
    other = op.operands[-1] if op.attrs.get("has_other") else None
    element = pointer.type.scalar.element
    memory_type = T.llvm_memory_type(element)
    size = element.itemsize
    pointers = ctx.get(pointer)
    if not isinstance(pointer.type, BlockType):
        ctx.set(op.result, _load_group(ctx, [pointers], ctx.get(mask) if mask else None,
                                       [ctx.get(other)] if other else None, element, memory_type, size, 1)[0])
        return
    masks = ctx.get(mask) if mask is not None else None
    others = ctx.get(other) if other is not None else None
    width = _vector_width(ctx, op, pointer, mask, size)
    out = []
    for start in range(0, len(pointers), width):
        group_others = others[start:start + width] if others is not None else None
        out.extend(_load_group(ctx, [pointers[start]], masks[start] if masks else None, group_others,
                               element, memory_type, size, width))
    ctx.set(op.result, out)


def _load_group(ctx, first_pointer, mask, others, element, memory_type, size, width):
    b = ctx.builder
    pointer = first_pointer[0]
    align = size * width
    vector_type = ir.VectorType(memory_type, width)
    if mask is None:
        loaded = b.load(pointer, typ=vector_type, align=align)
    else:
        if others is not None:
            passthru = _pack(b, [_to_memory(b, o, element) for o in others], vector_type)
        else:
            passthru = ir.Constant(vector_type, None)
        loaded = predicated_load(b, pointer, mask, passthru, vector_type, align)
    return [_from_memory(b, b.extract_element(loaded, ir.Constant(T.i32, i)), element) for i in range(width)]


@lowering(OpCode.STORE)
def _store(ctx, op):
    b = ctx.builder
    pointer, value = op.operands[0], op.operands[1]
    mask = op.operands[2] if op.attrs.get("masked") else None
    element = pointer.type.scalar.element
    memory_type = T.llvm_memory_type(element)
    size = element.itemsize
    if not isinstance(pointer.type, BlockType):
        groups = [([ctx.get(pointer)], [ctx.get(value)], ctx.get(mask) if mask else None, 1)]
        owner = None
    else:
        width = _vector_width(ctx, op, pointer, mask, size)
        pointers, values = ctx.get(pointer), ctx.get(value)
        masks = ctx.get(mask) if mask is not None else None
        owned = owned_registers(pointer.layout)
        groups = [([pointers[s]], values[s:s + width], masks[s] if masks else None, width)
                  for s in range(0, len(pointers), width) if s in owned]
        owner = owner_predicate(ctx, pointer.layout)
    for first_pointer, group_values, group_mask, width in groups:
        predicate = group_mask
        if owner is not None:
            predicate = owner if predicate is None else b.and_(predicate, owner)
        vector_type = ir.VectorType(memory_type, width)
        packed = _pack(b, [_to_memory(b, v, element) for v in group_values], vector_type)
        align = size * width
        if predicate is None:
            b.store(packed, first_pointer[0], align=align)
            continue
        predicated_store(b, first_pointer[0], predicate, packed, align)
