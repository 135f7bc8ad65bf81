"""The block IR's data structures: values, operations, blocks and functions.

The IR is structured (like MLIR's scf dialect): control flow is an operation that owns regions, each
region a single `Block` with arguments and a list of operations ending in a terminator. Values are
defined once, by an operation result or a block argument.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Optional

from ..language.dtypes import Type
from .ops import OpCode


@dataclasses.dataclass(frozen=True)
class Location:
    """Where in the kernel source an operation came from (1-based line, 0-based column)."""

    file: str
    line: int
    col: int
    function: str = ""
    source: str = ""   # the source line's text

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


UNKNOWN_LOCATION = Location("<unknown>", 0, 0)


class Value:
    """An SSA value: the result of an operation or the argument of a block."""

    __slots__ = ("type", "owner", "index", "name", "layout")

    def __init__(self, type_: Type, owner: Any = None, index: int = 0, name: str = ""):
        self.type = type_
        self.owner = owner        # the defining Operation, or the Block for a block argument
        self.index = index
        self.name = name          # a hint for the printer (kernel argument names)
        self.layout = None        # set by the layout pass

    @property
    def defining_op(self) -> Optional["Operation"]:
        return self.owner if isinstance(self.owner, Operation) else None

    def __repr__(self) -> str:
        return f"Value({self.name or '?'}: {self.type})"


class Operation:
    """One IR operation. See `ops.py` for each op code's operands, attrs and results."""

    __slots__ = ("opcode", "operands", "results", "attrs", "regions", "loc", "parent")

    def __init__(self, opcode: OpCode, operands, result_types, attrs=None, regions=(),
                 loc: Location = UNKNOWN_LOCATION):
        self.opcode = opcode
        self.operands = list(operands)
        self.results = [Value(t, self, i) for i, t in enumerate(result_types)]
        self.attrs = dict(attrs or {})
        self.regions = list(regions)
        self.loc = loc
        self.parent: Optional[Block] = None
        for region in self.regions:
            region.parent = self

    @property
    def result(self) -> Value:
        if len(self.results) != 1:
            raise ValueError(f"{self.opcode.value} has {len(self.results)} results, not 1")
        return self.results[0]

    def walk(self) -> Iterator["Operation"]:
        """This op, then every op nested in its regions, in program order."""
        yield self
        for region in self.regions:
            yield from region.walk()

    def __repr__(self) -> str:
        return f"Operation({self.opcode.value}, {len(self.operands)} operands)"


class Block:
    """A single-block region: typed arguments and a list of operations."""

    __slots__ = ("args", "ops", "parent")

    def __init__(self, arg_types=(), arg_names=()):
        names = list(arg_names) + [""] * (len(arg_types) - len(arg_names))
        self.args = [Value(t, self, i, n) for i, (t, n) in enumerate(zip(arg_types, names))]
        self.ops: list[Operation] = []
        self.parent: Optional[Operation] = None

    def append(self, op: Operation) -> Operation:
        op.parent = self
        self.ops.append(op)
        return op

    def add_argument(self, type_: Type, name: str = "") -> Value:
        value = Value(type_, self, len(self.args), name)
        self.args.append(value)
        return value

    @property
    def terminator(self) -> Optional[Operation]:
        return self.ops[-1] if self.ops and self.ops[-1].opcode in (OpCode.YIELD, OpCode.CONDITION) else None

    def walk(self) -> Iterator[Operation]:
        for op in self.ops:
            yield from op.walk()


@dataclasses.dataclass
class Function:
    """A kernel after the frontend: its name, argument values and body.

    `arg_names` are the Python parameter names of the runtime (non-constexpr) arguments, in order,
    one per `body.args` entry. `arg_hints` holds, per runtime argument, what the specialization
    proved about it: {"divisibility": 16} for an int divisible by 16 or a 16-byte aligned pointer, and
    "positive": True for an int divisible by 8 and above 0.
    """

    name: str
    body: Block
    arg_names: list
    loc: Location = UNKNOWN_LOCATION
    arg_hints: list = dataclasses.field(default_factory=list)

    @property
    def args(self) -> list:
        return self.body.args

    def walk(self) -> Iterator[Operation]:
        return self.body.walk()
