"""Lowering of reductions (sum, max, min, xor, argmax, argmin) and scans (cumsum, cumprod).

Reductions follow `layouts.reduction_plan`: combine a thread's own registers, then a butterfly of
`shfl.sync.bfly` over the lane bits along the axis, then partials through shared memory over the
warp bits, combined in warp order (deterministic). Every thread ends with the result of each element
it holds in the sliced layout. Scans use a Hillis-Steele inclusive scan in shared memory: log2(n)
steps, each adding (multiplying, for cumprod) the value 2^s positions back (Hillis & Steele, "Data
parallel algorithms", 1986).
"""

from __future__ import annotations

from llvmlite import ir

from ..ir import OpCode
from ..language.dtypes import BlockType
from ..layouts.reduction import reduction_plan
from ..target import llvm_types as T
from . import layout_access
from .elementwise import float_min_max
from .registry import lowering
from .shared import barrier, element_pointer, linear_index, reserve, storage_bytes


def combined(ctx, kind: str, element, a, b):
    """a + b (kind "sum"), a * b ("prod"), a ^ b ("xor", integers), max or min of two registers of `element`s
    (floats: float_min_max's NaN rule)."""
    bld = ctx.builder
    if kind == "sum":
        if element.is_floating:     # with fp_fusion, a product summed here may become an FMA
            return bld.fadd(a, b, flags=("contract",) if ctx.fp_fusion else ())
        return bld.add(a, b)
    if kind == "prod":
        return bld.fmul(a, b) if element.is_floating else bld.mul(a, b)
    if kind == "xor":
        return bld.xor(a, b)
    maximum = kind == "max"
    if element.is_floating:
        return float_min_max(ctx, bld, a, b, maximum)
    signed = "s" if element.is_signed else "u"
    ty = a.type
    fn = T.declare_intrinsic(ctx.module, f"llvm.{signed}{'max' if maximum else 'min'}.i{ty.width}", ty, [ty, ty])
    return bld.call(fn, [a, b])


def _is_nan(bld, value, element):
    if element.is_floating:
        return bld.fcmp_unordered("uno", value, value)
    return ir.Constant(T.i1, 0)


def _combine_arg(ctx, kind: str, element, a, b):
    """(value, index) pairs: the extreme wins, NaN counts as the extreme, ties go to the lower index."""
    bld = ctx.builder
    (va, ia), (vb, ib) = a, b
    if element.is_floating:
        better = bld.fcmp_ordered(">" if kind == "argmax" else "<", va, vb)
        equal = bld.fcmp_ordered("==", va, vb)
    else:
        cmp = bld.icmp_signed if element.is_signed else bld.icmp_unsigned
        better = cmp(">" if kind == "argmax" else "<", va, vb)
        equal = cmp("==", va, vb)
    a_nan, b_nan = _is_nan(bld, va, element), _is_nan(bld, vb, element)
    lower = bld.icmp_signed("<", ia, ib)
    tie = bld.or_(equal, bld.and_(a_nan, b_nan))
    pick_a = bld.or_(bld.and_(a_nan, bld.not_(b_nan)), bld.or_(bld.and_(better, bld.not_(b_nan)), bld.and_(tie, lower)))
    return bld.select(pick_a, va, vb), bld.select(pick_a, ia, ib)


def shuffle_xor(ctx, value, offset: int):
    """`value` from lane (lane ^ offset) of the warp, for any scalar width up to 64 bits."""
    bld = ctx.builder
    ty = value.type
    fn = T.declare_intrinsic(ctx.module, "llvm.nvvm.shfl.sync.bfly.i32", T.i32, [T.i32, T.i32, T.i32, T.i32],
                             attributes=("convergent", "nounwind"))
    mask, clamp = ir.Constant(T.i32, -1), ir.Constant(T.i32, 31)
    lane = ir.Constant(T.i32, offset)
    bits = ty.width if isinstance(ty, ir.IntType) else {"half": 16, "bfloat": 16, "float": 32, "double": 64}[str(ty)]
    as_int = value if isinstance(ty, ir.IntType) else bld.bitcast(value, ir.IntType(bits))
    if bits == 64:
        low = bld.trunc(as_int, T.i32)
        high = bld.trunc(bld.lshr(as_int, ir.Constant(T.i64, 32)), T.i32)
        low = bld.call(fn, [mask, low, lane, clamp])
        high = bld.call(fn, [mask, high, lane, clamp])
        result = bld.or_(bld.zext(low, T.i64), bld.shl(bld.zext(high, T.i64), ir.Constant(T.i64, 32)))
    elif bits == 32:
        result = bld.call(fn, [mask, as_int, lane, clamp])
    else:
        result = bld.trunc(bld.call(fn, [mask, bld.zext(as_int, T.i32), lane, clamp]), ir.IntType(bits))
    return result if isinstance(ty, ir.IntType) else bld.bitcast(result, ty)


def _warp_axis_index(ctx, warp_bits):
    bld = ctx.builder
    index = ir.Constant(T.i32, 0)
    for i, bit in enumerate(warp_bits):
        flag = bld.and_(bld.lshr(ctx.warp_id, ir.Constant(T.i32, bit)), ir.Constant(T.i32, 1))
        index = bld.or_(index, bld.shl(flag, ir.Constant(T.i32, i)))
    return index


def _reduce_common(ctx, op, arg: bool):
    plan, partials, combine = _warp_partials(ctx, op, arg)
    if plan.warp_bits:
        partials = _combine_warps(ctx, plan, [partials], op.operands[0].type.element, combine, arg)[0]
    return plan, partials


def _warp_partials(ctx, op, arg: bool):
    """(plan, the partials of each result element this thread holds after the lane shuffles, combine)."""
    source = op.operands[0]
    element = source.type.element
    kind = op.attrs["kind"]
    plan = reduction_plan(source.layout, op.attrs["axis"])
    registers = ctx.get(source)
    table = layout_access.register_table(source.layout)
    axis = plan.axis
    lane_axis = ctx.lane_warp_coordinates(source.layout)[axis]
    num_results = 1 << len(plan.kept_register_bits)
    combine = (lambda a, b: _combine_arg(ctx, kind, element, a, b)) if arg else \
        (lambda a, b: combined(ctx, kind, element, a, b))
    partials = []
    for j in range(num_results):
        acc = None
        for r in plan.parent_registers(j):
            value = (registers[r], ctx.builder.xor(lane_axis, ir.Constant(T.i32, table[r][axis]))) if arg \
                else registers[r]
            acc = value if acc is None else combine(acc, value)
        partials.append(acc)
    for offset in plan.lane_xor_offsets:
        partials = [combine(p, tuple(shuffle_xor(ctx, x, offset) for x in p) if arg else shuffle_xor(ctx, p, offset))
                    for p in partials]
    return plan, partials, combine


def _combine_warps(ctx, plan, members, element, combine, arg):
    """Each of `members` (one list of lane-combined partials per reduction, all of one plan and
    element) combined over the warps through one shared-memory exchange: a barrier (the scratch may
    still be read), every warp's partials stored, a barrier, all of them loaded and combined in warp
    order. Returns the results, a list per member."""
    bld = ctx.builder
    result_layout = plan.result_layout
    shape = layout_access.shape(result_layout)
    numel = 1
    for size in shape:
        numel *= size
    num_groups = 1 << len(plan.warp_bits)
    value_type = members[0][0][0].type if arg else members[0][0].type
    value_bytes = storage_bytes(element)
    slots_per_member = numel * num_groups
    total = slots_per_member * len(members)
    index_base = (total * value_bytes + 3) // 4 * 4 // 4   # i32 slots after the values
    reserve(ctx, total * value_bytes + (total * 4 + 4 if arg else 0))
    group = _warp_axis_index(ctx, plan.warp_bits)
    element_indices = [linear_index(ctx, ctx.element_coordinates(result_layout, j), shape) if shape
                       else ir.Constant(T.i32, 0) for j in range(len(members[0]))]
    barrier(ctx)
    for m, partials in enumerate(members):
        for element_index, p in zip(element_indices, partials):
            slot = bld.add(bld.add(bld.mul(group, ir.Constant(T.i32, numel)), element_index),
                           ir.Constant(T.i32, m * slots_per_member))
            bld.store(p[0] if arg else p, element_pointer(ctx, value_type, slot))
            if arg:
                bld.store(p[1], element_pointer(ctx, T.i32, bld.add(slot, ir.Constant(T.i32, index_base))))
    barrier(ctx)
    results = []
    for m in range(len(members)):
        out = []
        for element_index in element_indices:
            acc = None
            for g in range(num_groups):
                slot = bld.add(element_index, ir.Constant(T.i32, m * slots_per_member + g * numel))
                value = bld.load(element_pointer(ctx, value_type, slot), typ=value_type)
                if arg:
                    index = bld.load(element_pointer(ctx, T.i32, bld.add(slot, ir.Constant(T.i32, index_base))),
                                     typ=T.i32)
                    value = (value, index)
                acc = value if acc is None else combine(acc, value)
            out.append(acc)
        results.append(out)
    return results


def _set_result(op, ctx, values):
    if isinstance(op.result.type, BlockType):
        ctx.set(op.result, values)
    else:
        ctx.set(op.result, values[0])


@lowering(OpCode.REDUCE)
def _reduce(ctx, op):
    size = op.attrs.get("exchange_group", 1)
    if size > 1:
        _reduce_group(ctx, op, size)
    elif not op.attrs.get("exchange_follower"):        # else lowered with its group's first member
        _, partials = _reduce_common(ctx, op, arg=False)
        _set_result(op, ctx, partials)


def _reduce_group(ctx, first, size: int):
    """`first` and the size - 1 reductions after it in its block (passes/sibling_reductions.py: one kind,
    axis, element and operand layout; independent), their warp partials through one exchange."""
    ops = first.parent.ops
    start = ops.index(first)
    members = ops[start:start + size]
    lowered = [_warp_partials(ctx, op, arg=False) for op in members]
    plan, _, combine = lowered[0]
    results = _combine_warps(ctx, plan, [partials for _, partials, _ in lowered], first.operands[0].type.element,
                             combine, arg=False)
    for op, values in zip(members, results):
        _set_result(op, ctx, values)


@lowering(OpCode.ARGREDUCE)
def _argreduce(ctx, op):
    _, partials = _reduce_common(ctx, op, arg=True)
    _set_result(op, ctx, [index for _, index in partials])


@lowering(OpCode.SCAN)
def _scan(ctx, op):
    bld = ctx.builder
    source = op.operands[0]
    layout = source.layout
    element = source.type.element
    shape = layout_access.shape(layout)
    axis, reverse = op.attrs["axis"], op.attrs.get("reverse", False)
    length = shape[axis]
    stride = 1
    for size in shape[axis + 1:]:
        stride *= size
    numel = 1
    for size in shape:
        numel *= size
    reserve(ctx, numel * storage_bytes(element))
    storage = source.type.element
    value_type = ctx.get(source)[0].type
    coords = [ctx.element_coordinates(layout, r) for r in range(layout_access.num_registers(layout))]
    indices = [linear_index(ctx, c, shape) for c in coords]
    values = list(ctx.get(source))
    barrier(ctx)
    for index, value in zip(indices, values):
        bld.store(value, element_pointer(ctx, value_type, index))
    step = 1
    while step < length:
        barrier(ctx)
        updated = []
        for c, index, value in zip(coords, indices, values):
            if reverse:
                has = bld.icmp_signed("<", c[axis], ir.Constant(T.i32, length - step))
                neighbor = bld.add(index, ir.Constant(T.i32, step * stride))
            else:
                has = bld.icmp_signed(">=", c[axis], ir.Constant(T.i32, step))
                neighbor = bld.sub(index, ir.Constant(T.i32, step * stride))
            safe = bld.select(has, neighbor, index)
            other = bld.load(element_pointer(ctx, value_type, safe), typ=value_type)
            added = combined(ctx, op.attrs.get("kind", "sum"), storage, value, other)
            updated.append(bld.select(has, added, value))
        barrier(ctx)
        for index, value in zip(indices, updated):
            bld.store(value, element_pointer(ctx, value_type, index))
        values = updated
        step *= 2
    ctx.set(op.result, values)
