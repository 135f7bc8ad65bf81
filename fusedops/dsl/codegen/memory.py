"""Lowering of global loads, stores and atomics.

A thread's registers that its layout maps to consecutive elements along the last dim, with the
pointer's divisibility and the mask's constancy proven by the pointer analysis, become one vector
access of up to 16 bytes under one predicate. Everything else is split into scalar
accesses, so correctness never depends on the vector path. Masked groups, and groups with cache
qualifiers (`cache_modifier` / `eviction_policy`, cache_hints.py), are predicated inline PTX
(predicated.py).

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
from .cache_hints import cache_hint
from .ownership import owner_predicate, owned_registers
from .predicated import predicated_load, predicated_store
from .registry import lowering


_TRUE = ir.Constant(T.i1, 1)


def _contiguous_registers(layout) -> tuple:
    """(dim, count): the leading registers of a thread hold `count` consecutive elements along `dim` (a
    power of two; the last dim, count 1, where register 0's neighbour is not one step along a dim). A
    block read through a transposed view (`x.T`, K^T from a row-major K) steps along its first dim."""
    bases = layout_access.register_bases(layout)
    rank = len(layout_access.shape(layout))
    steps = [d for d, c in enumerate(bases[0]) if c] if bases else []
    if len(steps) != 1 or bases[0][steps[0]] != 1:
        return rank - 1, 1
    dim, count = steps[0], 1
    for i, basis in enumerate(bases):
        if basis != tuple(1 << i if d == dim else 0 for d in range(rank)):
            break
        count *= 2
    return dim, count


def vector_widths(ctx, pointer, mask, element_bytes: int) -> tuple:
    """(vector width the pointer allows, width over which the mask is also constant), along the dim
    the layout's leading registers step in."""
    if not isinstance(pointer.type, BlockType):
        return 1, 1
    dim, registers = _contiguous_registers(pointer.layout)
    width = max(1, min(vector_width(ctx.axis_info, pointer, None, element_bytes, dim=dim), registers))
    if mask is None:
        return width, width
    return width, max(1, min(vector_width(ctx.axis_info, pointer, mask, element_bytes, dim=dim), width))


def constant_run(ctx, value) -> int:
    """How many consecutive registers of a block `value` hold one value, as the pointer analysis proves
    (its constancy along the dim the layout's leading registers step in, up to their count; 1 where
    nothing is proven): registers [i * run, (i + 1) * run) are an aligned run of elements along that dim."""
    if not isinstance(value.type, BlockType) or ctx.axis_info is None:
        return 1
    info = ctx.axis_info.get(value)
    if info is None:
        return 1
    dim, registers = _contiguous_registers(value.layout)
    run = max(1, min(info.constancy[dim], registers))
    return 1 << (run.bit_length() - 1)


def _all(b, predicates):
    result = predicates[0]
    for predicate in predicates[1:]:
        result = b.and_(result, predicate)
    return result


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
    """Groups of `width` registers load as one vector. Where the mask is constant only over
    `mask_width` < `width` elements (e.g. `offsets < n` with n not a multiple of 16), the vector
    load runs when the whole group is in bounds and per-sub-group loads cover a partial group; both
    are predicated, so interior groups still move 16 bytes per instruction."""
    b = ctx.builder
    pointer = op.operands[0]
    mask = op.operands[1] if op.attrs.get("masked") else None
    other = op.operands[-1] if op.attrs.get("has_other") else None
    element = pointer.type.scalar.element
    memory_type = T.llvm_memory_type(element)
    size = element.itemsize
    hint = cache_hint(ctx, op)
    if not isinstance(pointer.type, BlockType):
        loaded = _load_vector(ctx, ctx.get(pointer), ctx.get(mask) if mask else None,
                              [ctx.get(other)] if other else None, element, memory_type, 1, hint)
        ctx.set(op.result, loaded[0])
        return
    pointers = ctx.get(pointer)
    masks = ctx.get(mask) if mask is not None else None
    others = ctx.get(other) if other is not None else [None] * len(pointers)
    width, mask_width = vector_widths(ctx, pointer, mask, size)
    out = []
    for start in range(0, len(pointers), width):
        group_others = others[start:start + width]
        if masks is None or mask_width == width:
            out.extend(_load_vector(ctx, pointers[start], masks[start] if masks else None,
                                    group_others, element, memory_type, width, hint))
            continue
        sub_masks = [masks[j] for j in range(start, start + width, mask_width)]
        whole = _all(b, sub_masks)
        partial = []
        for j, sub_mask in zip(range(start, start + width, mask_width), sub_masks):
            predicate = b.and_(sub_mask, b.not_(whole))
            partial.extend(_load_vector(ctx, pointers[j], predicate, others[j:j + mask_width], element,
                                        memory_type, mask_width, hint))
        out.extend(_load_vector(ctx, pointers[start], whole, partial, element, memory_type, width, hint))
    ctx.set(op.result, out)


def _load_vector(ctx, pointer, mask, others, element, memory_type, width, hint=None):
    """`width` consecutive elements from `pointer` (aligned to their total size); where `mask` is
    false, `others` (None entries: zero). hint: cache qualifiers (cache_hints.py) or None."""
    b = ctx.builder
    nbytes = element.itemsize * width
    vector_type = ir.VectorType(memory_type, width)
    if mask is None and hint is None:
        loaded = b.load(pointer, typ=vector_type, align=nbytes)
    else:
        mask = _TRUE if mask is None else mask
        if others is not None and all(o is not None for o in others):
            passthru = _pack(b, [_to_memory(b, o, element) for o in others], vector_type)
        else:
            passthru = ir.Constant(vector_type, None)
        loaded = predicated_load(b, pointer, mask, passthru, vector_type, nbytes, hint)
    return [_from_memory(b, b.extract_element(loaded, ir.Constant(T.i32, i)), element) for i in range(width)]


@lowering(OpCode.STORE)
def _store(ctx, op):
    """The mirror of `_load`: vector stores where the group is whole, sub-group stores otherwise;
    only owners of replicated elements store."""
    b = ctx.builder
    pointer, value = op.operands[0], op.operands[1]
    mask = op.operands[2] if op.attrs.get("masked") else None
    element = pointer.type.scalar.element
    hint = cache_hint(ctx, op)
    if not isinstance(pointer.type, BlockType):
        _store_vector(ctx, ctx.get(pointer), [ctx.get(value)], ctx.get(mask) if mask else None, element, hint)
        return
    width, mask_width = vector_widths(ctx, pointer, mask, element.itemsize)
    pointers, values = ctx.get(pointer), ctx.get(value)
    masks = ctx.get(mask) if mask is not None else None
    owned = owned_registers(pointer.layout)
    owner = owner_predicate(ctx, pointer.layout)
    for start in range(0, len(pointers), width):
        if start not in owned:
            continue
        if masks is None or mask_width == width:
            predicate = _and_optional(b, masks[start] if masks else None, owner)
            _store_vector(ctx, pointers[start], values[start:start + width], predicate, element, hint)
            continue
        sub_masks = [masks[j] for j in range(start, start + width, mask_width)]
        whole = _all(b, sub_masks)
        _store_vector(ctx, pointers[start], values[start:start + width], _and_optional(b, whole, owner), element,
                      hint)
        for j, sub_mask in zip(range(start, start + width, mask_width), sub_masks):
            predicate = _and_optional(b, b.and_(sub_mask, b.not_(whole)), owner)
            _store_vector(ctx, pointers[j], values[j:j + mask_width], predicate, element, hint)


def _and_optional(b, a, c):
    if a is None:
        return c
    return a if c is None else b.and_(a, c)


def _store_vector(ctx, pointer, values, predicate, element, hint=None):
    b = ctx.builder
    width = len(values)
    nbytes = element.itemsize * width
    vector_type = ir.VectorType(T.llvm_memory_type(element), width)
    packed = _pack(b, [_to_memory(b, v, element) for v in values], vector_type)
    if predicate is None and hint is None:
        b.store(packed, pointer, align=nbytes)
    else:
        predicated_store(b, pointer, _TRUE if predicate is None else predicate, packed, nbytes, hint)
