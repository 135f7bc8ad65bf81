"""Giving an operand the layout its op needs (passes/layout_assignment.py): a flexible value is made
(or recomputed) in that layout, any other value is converted (`convert_layout`).
"""

from __future__ import annotations

from ..ir import Block, Operation, OpCode, Value
from ..ir.ops import ELEMENTWISE, LIBDEVICE_MATH, UNARY_MATH
from ..language.dtypes import shape_of
from ..layouts.linear import LinearLayout
from ._layout_state import State, is_block, project_broadcast


# Elementwise ops cheap enough to recompute in every layout a user needs (see passes/layout_assignment.py's
# docstring).
_REMATERIALIZABLE = ELEMENTWISE - UNARY_MATH - LIBDEVICE_MATH - frozenset({OpCode.DIV, OpCode.FMA})


def insert_before(anchor: Operation, new: Operation) -> None:
    block = anchor.parent
    new.parent = block
    block.ops.insert(block.ops.index(anchor), new)


def _clone_flexible(state: State, value: Value, layout, before: Operation) -> Value:
    op = value.defining_op
    clone = Operation(op.opcode, list(op.operands), [value.type], dict(op.attrs), (), op.loc)
    clone.results[0].layout = layout
    insert_before(before, clone)
    _materialize_operands(state, clone, layout)
    return clone.results[0]


def _operand_layout(op: Operation, index: int, layout):
    """The layout operand `index` of a flexible op needs for its result to have `layout`."""
    operand_shape = shape_of(op.operands[index].type)
    if op.opcode == OpCode.EXPAND_DIMS:
        axis = op.attrs["axis"]
        bases = {name: [tuple(c for d, c in enumerate(v) if d != axis) for v in layout.bases_of(name)]
                 for name in layout.in_dims}
        return LinearLayout(bases, operand_shape)
    if op.opcode == OpCode.BROADCAST:
        return project_broadcast(layout, operand_shape)
    return layout


def _materialize_operands(state: State, op: Operation, layout) -> None:
    """Materialize the flexible block operands of flexible `op` (result in `layout`) before it."""
    for index, operand in enumerate(op.operands):
        if is_block(operand):
            op.operands[index] = _materialize(state, operand, _operand_layout(op, index, layout), op)


def _materialize(state: State, value: Value, layout, before: Operation) -> Value:
    """Give a flexible value `layout`, or a clone of it in that layout."""
    versions = state.flexible[id(value)]
    if value.layout is None:
        value.layout = layout
        versions[layout] = value
        _materialize_operands(state, value.defining_op, layout)
        return value
    if layout in versions:
        found = versions[layout]
        if found is value or _dominates(found, before):
            return found
    clone = _clone_flexible(state, value, layout, before)
    versions[layout] = clone
    state.flexible[id(clone)] = versions      # a clone is flexible too, with the same versions
    return clone


def is_flexible_composite(state: State, op: Operation) -> bool:
    """A cheap op whose block operands are all flexible (so it can be recomputed in any layout)."""
    if len(op.results) != 1 or not is_block(op.result):
        return False
    if op.opcode not in _REMATERIALIZABLE and op.opcode not in (OpCode.EXPAND_DIMS, OpCode.BROADCAST):
        return False
    blocks = [v for v in op.operands if is_block(v)]
    if op.opcode == OpCode.EXPAND_DIMS and not blocks:
        return True
    return bool(blocks) and all(id(v) in state.flexible for v in blocks)


def _dominates(value: Value, before: Operation) -> bool:
    op = value.defining_op
    block = op.parent
    current = before
    while current is not None:
        if current.parent is block:
            return block.ops.index(op) < block.ops.index(current)
        current = current.parent.parent if current.parent is not None else None
    return False


def convert(value: Value, layout, before: Operation) -> Value:
    op = Operation(OpCode.CONVERT_LAYOUT, [value], [value.type], {}, (), before.loc)
    op.results[0].layout = layout
    insert_before(before, op)
    return op.results[0]


def require(state: State, op: Operation, index: int, layout) -> None:
    """Make operand `index` of `op` have `layout` (materialize a flexible value or convert)."""
    value = op.operands[index]
    if not is_block(value):
        return
    if id(value) in state.flexible:
        op.operands[index] = _materialize(state, value, layout, op)
    elif value.layout != layout:
        op.operands[index] = convert(value, layout, op)


def require_hoisted(state: State, op: Operation, index: int, layout) -> None:
    """`require`, but a conversion of a value defined in an enclosing block goes right before the
    op of that block that holds `op` (a loop-invariant operand is converted once, before the loop),
    shared by every later op that needs it in that layout."""
    value = op.operands[index]
    if value.layout == layout:
        return
    home = value.owner if isinstance(value.owner, Block) else value.defining_op.parent
    anchor = op
    while anchor.parent is not home:
        anchor = anchor.parent.parent
        if anchor is None:
            return require(state, op, index, layout)
    if anchor is op:
        return require(state, op, index, layout)
    key = (id(value), layout)
    found = state.hoisted.get(key)
    if found is None or not _dominates(found, anchor):
        found = state.hoisted[key] = convert(value, layout, anchor)
    op.operands[index] = found
