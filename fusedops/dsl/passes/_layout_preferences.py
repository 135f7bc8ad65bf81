"""The layouts loop-carried values take, chosen before the layout pass walks the kernel
(passes/layout_assignment.py): tensor-core accumulators and tiles computed from them are carried in the
accumulator layout.
"""

from __future__ import annotations

from ..ir import Block, Function, OpCode, Value
from ..ir.ops import ELEMENTWISE
from ..language.dtypes import shape_of
from ._layout_state import FLEXIBLE, State, is_block
from .dot_layouts import accumulator_layout, uses_tensor_cores, uses_wgmma


def prefer_mma_accumulators(state: State, function: Function) -> None:
    """Record the mma/wgmma accumulator layout for loop block arguments used as tensor-core dot
    accumulators."""
    for op in function.walk():
        if op.opcode != OpCode.DOT or not uses_tensor_cores(op, state.arch):
            continue
        acc = op.operands[2]
        owner = acc.owner
        if isinstance(owner, Block) and owner.parent is not None and owner.parent.opcode == OpCode.FOR \
                and acc.index > 0:
            state.preferred[id(acc)] = accumulator_layout(op, state.arch, state.num_warps)
        if uses_wgmma(op, state.arch, state.num_warps):
            state.wgmma_accumulators.add(accumulator_layout(op, state.arch, state.num_warps))


def _tensor_core_source(state: State, value: Value, carried: Value, depth: int = 16):
    """The accumulator layout of the tensor-core dot that `value` is computed from elementwise (casts,
    activations, a broadcast bias added), through `if` results (either branch but the one passing
    `carried` on), loop arguments and inner loops' results carried in an accumulator layout; None if
    it is not such a value."""
    if depth == 0 or value is carried or not is_block(value):
        return None
    if isinstance(value.owner, Block):
        return state.preferred.get(id(value))
    op = value.defining_op
    if op.opcode == OpCode.DOT:
        return accumulator_layout(op, state.arch, state.num_warps) if uses_tensor_cores(op, state.arch) else None
    if op.opcode == OpCode.IF:
        index = op.results.index(value)
        for region in op.regions:
            found = _tensor_core_source(state, region.terminator.operands[index], carried, depth - 1)
            if found is not None:
                return found
        return None
    if op.opcode == OpCode.FOR:     # an inner loop's accumulator, carried in the accumulator layout
        return state.preferred.get(id(op.regions[0].args[1 + value.index]))
    if op.opcode not in ELEMENTWISE:
        return None
    for operand in op.operands:
        if is_block(operand) and shape_of(operand.type) == shape_of(value.type) \
                and (operand.defining_op is None or operand.defining_op.opcode != OpCode.BROADCAST):
            found = _tensor_core_source(state, operand, carried, depth - 1)
            if found is not None:
                return found
    return None


def prefer_tensor_core_carries(state: State, function: Function) -> None:
    """Record the accumulator layout for loop arguments that start as a constant block (flexible: any
    layout is free) and are yielded as a value computed elementwise from a tensor-core dot's result,
    such as a tile's output held for a later iteration's store. Carried in the initial value's
    default layout instead, every trip would move the tile through shared memory at the yield."""
    for op in function.walk():
        if op.opcode != OpCode.FOR:
            continue
        region = op.regions[0]
        for arg, init, yielded in zip(region.args[1:], op.operands[3:], region.terminator.operands):
            if id(arg) in state.preferred or not is_block(arg) or init.defining_op is None \
                    or init.defining_op.opcode not in FLEXIBLE:
                continue
            layout = _tensor_core_source(state, yielded, arg)
            if layout is not None:
                state.preferred[id(arg)] = layout
