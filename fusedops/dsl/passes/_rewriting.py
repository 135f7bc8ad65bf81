"""IR-rewriting helpers the passes share: creating ops before an anchor op, replacing uses, reading
integer constants.
"""

from __future__ import annotations

from typing import Optional

from ..ir import Block, Operation, OpCode, Value
from ..language.dtypes import BlockType, int32


def constant_int(value: Value) -> Optional[int]:
    op = value.defining_op
    if op is None or op.opcode != OpCode.CONSTANT or isinstance(value.type, BlockType):
        return None
    constant = op.attrs.get("value")
    return constant if isinstance(constant, int) and not isinstance(constant, bool) else None


def is_zero_constant(value: Value) -> bool:
    op = value.defining_op
    return op is not None and op.opcode == OpCode.CONSTANT and op.attrs.get("value") == 0


def replace_uses(block: Block, start: int, old: Value, new: Value) -> None:
    """Make the ops of `block` from index `start` on (and their regions) use `new` for `old`."""
    for op in block.ops[start:]:
        for nested in op.walk():
            nested.operands = [new if v is old else v for v in nested.operands]


class Inserter:
    """Creates ops before a fixed anchor op (or at the end of a block's non-terminator ops)."""

    def __init__(self, block: Block, anchor: Operation):
        self.block, self.anchor = block, anchor

    def op(self, opcode: OpCode, operands, result_types, attrs=None, loc=None, layout=None) -> Operation:
        op = Operation(opcode, operands, result_types, attrs, (), loc or self.anchor.loc)
        op.parent = self.block
        self.block.ops.insert(self.block.ops.index(self.anchor), op)
        if layout is not None:
            for result in op.results:
                result.layout = layout
        return op

    def value(self, opcode, operands, result_type, attrs=None, layout=None) -> Value:
        return self.op(opcode, operands, [result_type], attrs, layout=layout).results[0]

    def constant(self, value: int, type_=int32) -> Value:
        return self.value(OpCode.CONSTANT, [], type_, {"value": value})
