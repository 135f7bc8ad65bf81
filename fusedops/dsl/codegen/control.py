"""Lowering of structured control flow (FOR, WHILE, IF) with loop-carried block values.

Each carried block value becomes one phi per register. Regions are lowered in place by
`lower_block`, which dispatches each op to its rule.
"""

from __future__ import annotations

from llvmlite import ir

from ..ir import Block, OpCode
from ..language.dtypes import BlockType
from . import layout_access
from .registry import lower_op, lowering


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


@lowering(OpCode.FOR)
def _for(ctx, op):
    b = ctx.builder
    lb, ub, step = (ctx.get(v) for v in op.operands[:3])
    inits = [ctx.get(v) for v in op.operands[3:]]
    flat_inits = _flat(inits)
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
    # Python range semantics: a positive step runs while iv < ub, a negative one while iv > ub.
    signed = op.operands[0].type.is_signed
    cmp = b.icmp_signed if signed else b.icmp_unsigned
    zero = ir.Constant(step.type, 0)
    forward = b.and_(cmp(">", step, zero), cmp("<", iv, ub))
    backward = b.and_(cmp("<", step, zero), cmp(">", iv, ub))
    b.cbranch(b.or_(forward, backward), body, exit_)

    b.position_at_end(body)
    ctx.set(region.args[0], iv)
    for arg, value in zip(region.args[1:], _unflat(carried, region.args[1:])):
        ctx.set(arg, value)
    yielded = _flat(lower_block(ctx, region))
    latch = b.block
    next_iv = b.add(iv, step)
    b.branch(header)
    iv.add_incoming(next_iv, latch)
    for phi, value in zip(carried, yielded):
        phi.add_incoming(value, latch)

    b.position_at_end(exit_)
    for result, value in zip(op.results, _unflat(carried, op.results)):
        ctx.set(result, value)


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
    incoming = []
    for region, bb in ((then_region, then_bb), (else_region, else_bb)):
        b.position_at_end(bb)
        values = _flat(lower_block(ctx, region))
        incoming.append((values, b.block))
        b.branch(join)
    b.position_at_end(join)
    flat = []
    for (then_value, then_end), (else_value, else_end) in [((t, incoming[0][1]), (e, incoming[1][1]))
                                                           for t, e in zip(incoming[0][0], incoming[1][0])]:
        phi = b.phi(then_value.type)
        phi.add_incoming(then_value, then_end)
        phi.add_incoming(else_value, else_end)
        flat.append(phi)
    for result, value in zip(op.results, _unflat(flat, op.results)):
        ctx.set(result, value)
