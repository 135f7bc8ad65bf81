"""Lowering of structured control flow (FOR, WHILE, IF) with loop-carried block values.

Each carried block value becomes one phi per register, but for 16-bit float blocks (carried by a FOR or
merged after an IF), whose registers 2k and 2k + 1 share one <2 x T> phi (`_pairing`: ptxas gives a 16-bit
scalar a 32-bit register of its own; a pair packed as it was loaded needs one). H200, LayerNorm's backward
at 16384 columns with the next row prefetched (loop-carried fp16 x and dy): 152 -> 56 bytes of spills,
1.17x -> 1.76x torch's. An IF packs its 16-bit results in each branch: a tile converted in a branch and
carried to a later iteration is then not unpacked and repacked at the join, which made ptxas serialize
the wgmmas in flight across that branch (C7514; tests/test_tensor_core_carries.py).
Regions are lowered in place by `lower_block`, which dispatches each op to its rule.
"""

from __future__ import annotations

from llvmlite import ir

from ..ir import Block, OpCode
from ..language.dtypes import BlockType
from ..target import llvm_types as T
from . import layout_access
from .registry import lower_op, lowering
from .shared import barrier


def lower_block(ctx, block: Block):
    """Lower every op of `block` but its terminator; return the terminator's lowered operands."""
    for op in block.ops:
        if op.opcode in (OpCode.YIELD, OpCode.CONDITION):
            return [ctx.get(v) for v in op.operands]
        lower_op(ctx, op)
    return []


def _flat(values):
    """Flatten lowered values (scalars or register lists) to one list of LLVM values."""
    out = []
    for value in values:
        out.extend(value if isinstance(value, list) else [value])
    return out


def _unflat(flat, like_values):
    """The inverse of `_flat`, shaped like `like_values` (IR values)."""
    out, i = [], 0
    for value in like_values:
        if isinstance(value.type, BlockType):
            n = layout_access.num_registers(value.layout)
            out.append(list(flat[i:i + n]))
            i += n
        else:
            out.append(flat[i])
            i += 1
    return out


def _phis(builder, values, name: str):
    return [builder.phi(v.type, name=name) for v in values]


_PAIRED_TYPES = ("half", "bfloat")


def _pairing(values) -> list:
    """How loop-carried values (lowered: a scalar, or a block's list of registers) travel through the loop's
    phis: a list of (first index into `_flat(values)`, count), count 2 for registers 2k and 2k + 1 of one
    16-bit float block (carried as one <2 x T> phi: one 32-bit register, where ptxas gives each 16-bit scalar
    a register of its own; the pairs a vector load made), else 1. Pairs never span two values: a carried
    16-bit scalar before a block would shift every pair of the block (repacked each iteration)."""
    plan, start = [], 0
    for value in values:
        registers = value if isinstance(value, list) else [value]
        i = 0
        while i < len(registers):
            kind = str(registers[i].type)
            if kind in _PAIRED_TYPES and i + 1 < len(registers) and str(registers[i + 1].type) == kind:
                plan.append((start + i, 2))
                i += 2
            else:
                plan.append((start + i, 1))
                i += 1
        start += len(registers)
    return plan


def _pack(builder, values, plan) -> list:
    """`values` as the phis carry them (see `_pairing`)."""
    out = []
    for first, count in plan:
        if count == 1:
            out.append(values[first])
            continue
        pair = ir.Constant(ir.VectorType(values[first].type, 2), ir.Undefined)
        for lane in range(2):
            pair = builder.insert_element(pair, values[first + lane], ir.Constant(T.i32, lane))
        out.append(pair)
    return out


def _unpack(builder, carried, plan) -> list:
    """The inverse of `_pack`: one LLVM value per carried register."""
    out = []
    for value, (_, count) in zip(carried, plan):
        if count == 1:
            out.append(value)
        else:
            out.extend(builder.extract_element(value, ir.Constant(T.i32, lane)) for lane in range(2))
    return out


def _in_range(b, iv, ub, step, signed):
    """Whether an iteration at `iv` runs: iv < ub for a positive step, iv > ub for a negative one (Python's
    `range`); never for a zero step (where Python raises ValueError and the interpreter InterpreterError)."""
    cmp = b.icmp_signed if signed else b.icmp_unsigned
    zero = ir.Constant(step.type, 0)
    forward = b.and_(cmp(">", step, zero), cmp("<", iv, ub))
    backward = b.and_(cmp("<", step, zero), cmp(">", iv, ub))
    return b.or_(forward, backward)


def _cannot_overflow(lb, ub, step, signed) -> bool:
    """Whether no `iv + step` of the loop can leave the induction type: a step of +-1 (iv is short of ub,
    so iv + step is at most ub), or constant bounds that rule it out."""
    if isinstance(step, ir.Constant) and (step.constant == 1 or signed and step.constant == -1):
        return True
    if not all(isinstance(v, ir.Constant) for v in (lb, ub, step)):
        return False
    width = lb.type.width
    low, high = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed else (0, (1 << width) - 1)
    values = range(lb.constant, ub.constant, step.constant) if step.constant else range(0)
    return not values or low <= values[-1] + step.constant <= high


def _sign(value, llvm_value) -> int:
    """1 if the loop bound `value` (DSL IR) is known positive, 0 if known non-negative, -1 if unknown:
    constants and the maximum / minimum of such. (Not program ids and counts: grid-stride loops keep
    the saturating add, which ptxas handled without spills in the norm row sweeps at their caps.)"""
    if isinstance(llvm_value, ir.Constant):
        return 1 if llvm_value.constant > 0 else 0 if llvm_value.constant == 0 else -1
    op = value.defining_op
    if op is None:
        return -1
    if op.opcode == OpCode.CONSTANT and isinstance(op.attrs.get("value"), int):
        return 1 if op.attrs["value"] > 0 else 0 if op.attrs["value"] == 0 else -1
    if op.opcode in (OpCode.MAXIMUM, OpCode.MINIMUM):
        signs = [_sign(operand, None) for operand in op.operands]
        return max(signs) if op.opcode == OpCode.MAXIMUM else min(signs)
    return -1


def _wraps_below_zero(op, lb, step, signed) -> bool:
    """Whether every wrapped `iv + step` is negative while every iv of the loop is not: a signed loop
    from a known non-negative lb with a known positive step (a wrapped value is at most
    (2**(w-1) - 2) + (2**(w-1) - 1) - 2**w < 0). Then the unsigned `iv < max(ub, 0)` ends the loop (it
    takes ub's place: no extra live register)."""
    return signed and _sign(op.operands[0], lb) >= 0 and _sign(op.operands[2], step) == 1


def _saturating_add(b, iv, step, signed):
    """`iv + step` saturated at the type's bounds: a saturated value is never short of ub in the step's
    direction, so the loop ends where Python's range does."""
    name = f"llvm.{'s' if signed else 'u'}add.sat.i{iv.type.width}"
    function = T.declare_intrinsic(b.module, name, iv.type, [iv.type, iv.type], attributes=("nounwind",))
    return b.call(function, [iv, step])


@lowering(OpCode.FOR)
def _for(ctx, op):
    """Python's `range` semantics, also when `iv + step` after the last iteration is past the induction
    type's range: a plain add where the step (+-1) or constant bounds rule the overflow out; where a
    wrapped value is always negative and the loop's values are not (`_wraps_below_zero`), an unsigned
    comparison with max(ub, 0); else a saturating add. Neither adds a live register (comparing with a
    precomputed `ub - step` did, and made ptxas spill in the norm row sweeps at their register caps);
    the H200 timed matmul, attention and LayerNorm alike before and after (session 7)."""
    b = ctx.builder
    lb, ub, step = (ctx.get(v) for v in op.operands[:3])
    signed = op.operands[0].type.is_signed
    plain = _cannot_overflow(lb, ub, step, signed)
    non_negative = not plain and _wraps_below_zero(op, lb, step, signed)
    if non_negative:
        zero = ir.Constant(ub.type, 0)
        bound = b.select(b.icmp_signed(">", ub, zero), ub, zero)
    inits = [ctx.get(v) for v in op.operands[3:]]
    plan = _pairing(inits)
    flat_inits = _pack(b, _flat(inits), plan)
    region = op.regions[0]
    preheader = b.block
    header = b.append_basic_block("for.header")
    body = b.append_basic_block("for.body")
    exit_ = b.append_basic_block("for.exit")
    b.branch(header)

    b.position_at_end(header)
    iv = b.phi(lb.type, name="iv")
    carried = _phis(b, flat_inits, "carried")
    iv.add_incoming(lb, preheader)
    for phi, value in zip(carried, flat_inits):
        phi.add_incoming(value, preheader)
    if non_negative:        # iv < max(ub, 0) as unsigned: a wrapped (negative) iv is too large
        proceed = b.icmp_unsigned("<", iv, bound)
    else:
        proceed = _in_range(b, iv, ub, step, signed)
    b.cbranch(proceed, body, exit_)

    b.position_at_end(body)
    ctx.set(region.args[0], iv)
    for arg, value in zip(region.args[1:], _unflat(_unpack(b, carried, plan), region.args[1:])):
        ctx.set(arg, value)
    yielded = _pack(b, _flat(lower_block(ctx, region)), plan)
    latch = b.block
    next_iv = b.add(iv, step) if plain or non_negative else _saturating_add(b, iv, step, signed)
    b.branch(header)
    iv.add_incoming(next_iv, latch)
    for phi, value in zip(carried, yielded):
        phi.add_incoming(value, latch)

    b.position_at_end(exit_)
    for result, value in zip(op.results, _unflat(_unpack(b, carried, plan), op.results)):
        ctx.set(result, value)


@lowering(OpCode.BARRIER)
def _barrier(ctx, op):
    barrier(ctx)


@lowering(OpCode.WHILE)
def _while(ctx, op):
    b = ctx.builder
    before, after = op.regions
    flat_inits = _flat([ctx.get(v) for v in op.operands])
    preheader = b.block
    header = b.append_basic_block("while.header")
    body = b.append_basic_block("while.body")
    exit_ = b.append_basic_block("while.exit")
    b.branch(header)

    b.position_at_end(header)
    carried = _phis(b, flat_inits, "carried")
    for phi, value in zip(carried, flat_inits):
        phi.add_incoming(value, preheader)
    for arg, value in zip(before.args, _unflat(carried, before.args)):
        ctx.set(arg, value)
    condition, *forwarded = lower_block(ctx, before)
    flat_forwarded = _flat(forwarded)
    b.cbranch(condition, body, exit_)

    b.position_at_end(body)
    for arg, value in zip(after.args, _unflat(flat_forwarded, after.args)):
        ctx.set(arg, value)
    yielded = _flat(lower_block(ctx, after))
    for phi, value in zip(carried, yielded):
        phi.add_incoming(value, b.block)
    b.branch(header)

    b.position_at_end(exit_)
    for result, value in zip(op.results, _unflat(flat_forwarded, op.results)):
        ctx.set(result, value)


@lowering(OpCode.IF)
def _if(ctx, op):
    b = ctx.builder
    condition = ctx.get(op.operands[0])
    then_region, else_region = op.regions
    then_bb = b.append_basic_block("if.then")
    else_bb = b.append_basic_block("if.else")
    join = b.append_basic_block("if.join")
    b.cbranch(condition, then_bb, else_bb)
    incoming, plan = [], None
    for region, bb in ((then_region, then_bb), (else_region, else_bb)):
        b.position_at_end(bb)
        values = lower_block(ctx, region)
        if plan is None:        # 16-bit pairs merge as <2 x T>, packed in each branch (as a FOR carries them)
            plan = _pairing(values)
        incoming.append((_pack(b, _flat(values), plan), b.block))
        b.branch(join)
    b.position_at_end(join)
    merged = []
    for (then_value, then_end), (else_value, else_end) in [((t, incoming[0][1]), (e, incoming[1][1]))
                                                           for t, e in zip(incoming[0][0], incoming[1][0])]:
        phi = b.phi(then_value.type)
        phi.add_incoming(then_value, then_end)
        phi.add_incoming(else_value, else_end)
        merged.append(phi)
    for result, value in zip(op.results, _unflat(_unpack(b, merged, plan), op.results)):
        ctx.set(result, value)
