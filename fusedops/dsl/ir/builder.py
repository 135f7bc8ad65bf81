"""Builds IR: appends operations at an insertion point, stamping each with the current location.

The builder does no type inference; typing rules live in `language/semantics.py`, which calls it.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

from .core import UNKNOWN_LOCATION, Block, Location, Operation, Value
from .ops import OpCode


class Builder:
    def __init__(self, block: Block):
        self._blocks = [block]
        self.loc: Location = UNKNOWN_LOCATION

    @property
    def block(self) -> Block:
        return self._blocks[-1]

    @contextlib.contextmanager
    def insert_into(self, block: Block) -> Iterator[Block]:
        """Append to `block` inside the `with`, then return to the previous insertion point."""
        self._blocks.append(block)
        try:
            yield block
        finally:
            self._blocks.pop()

    def create(self, opcode: OpCode, operands: Sequence[Value] = (), result_types=(), attrs=None,
               regions=()) -> Operation:
        for operand in operands:
            if not isinstance(operand, Value):
                raise TypeError(f"{opcode.value}: operand {operand!r} is not an IR value")
        op = Operation(opcode, operands, result_types, attrs, regions, self.loc)
        return self.block.append(op)

    def value(self, opcode: OpCode, operands: Sequence[Value], result_type, **attrs) -> Value:
        """Create a single-result op and return its result."""
        return self.create(opcode, operands, [result_type], attrs).result
