"""The layout pass's state (passes/layout_assignment.py) and the small facts its rule modules share: which
ops are flexible or memory ops, element widths, broadcast projections.
"""

from __future__ import annotations

import dataclasses

from ..ir import Function, OpCode, Value
from ..language.dtypes import BlockType, PointerType, shape_of
from ..layouts.blocked import default_blocked
from ..layouts.linear import LinearLayout


FLEXIBLE = frozenset({OpCode.CONSTANT, OpCode.SPLAT, OpCode.ARANGE})
MEMORY = frozenset({OpCode.LOAD, OpCode.STORE, OpCode.ATOMIC_RMW, OpCode.ATOMIC_CAS})


def is_block(value: Value) -> bool:
    return isinstance(value.type, BlockType)


def element_bits(type_) -> int:
    element = type_.element if isinstance(type_, BlockType) else type_
    if isinstance(element, PointerType):
        element = element.element
    return max(8, element.bits)


def project_broadcast(layout: LinearLayout, operand_shape: tuple) -> LinearLayout:
    """`layout` with the dims where `operand_shape` is 1 (and layout's is not) projected to size 1."""
    dims = [d for d, (o, s) in enumerate(zip(operand_shape, layout.shape)) if o == 1 and s != 1]
    bases = {name: [tuple(0 if d in dims else c for d, c in enumerate(v)) for v in layout.bases_of(name)]
             for name in layout.in_dims}
    return LinearLayout(bases, tuple(operand_shape))


def broadcast_projection(operand_shape: tuple, result_shape: tuple):
    dims = {d for d, (o, s) in enumerate(zip(operand_shape, result_shape)) if o == 1 and s != 1}
    return lambda coords: tuple(0 if d in dims else c for d, c in enumerate(coords))


@dataclasses.dataclass
class State:
    num_warps: int
    bits_by_shape: dict
    arch: object = None                                         # "sm_90a"...; None: FMA dots only
    axis_info: object = None                                    # pointer analysis of the input IR
    flexible: dict = dataclasses.field(default_factory=dict)   # id(value) -> {layout: value}
    preferred: dict = dataclasses.field(default_factory=dict)  # id(loop block arg) -> carried layout
    load_hints: dict = dataclasses.field(default_factory=dict)  # id(load op) -> layout of its pointer
    wgmma_accumulators: set = dataclasses.field(default_factory=set)  # layouts of wgmma dot results
    hoisted: dict = dataclasses.field(default_factory=dict)     # (id(value), layout) -> converted value
    copyable_loads: frozenset = frozenset()                     # ids of loads cp.async can copy (_layout_memory)

    def default(self, shape) -> LinearLayout:
        return default_blocked(tuple(shape), self.num_warps, self.bits_by_shape.get(tuple(shape), 32))


def memory_bits(function: Function) -> dict:
    out = {}
    for op in function.walk():
        if op.opcode in MEMORY and is_block(op.operands[0]):
            shape = shape_of(op.operands[0].type)
            out[shape] = min(out.get(shape, 64), element_bits(op.operands[0].type))
    return out
