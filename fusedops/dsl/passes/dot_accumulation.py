"""Dot accumulation: `c + dot(a, b)` becomes `dot(a, b, c)`.

Kernels written the Triton way accumulate with `acc += dsl.dot(a, b)`, which the frontend builds as a
dot into a zero tile followed by an add: two M x N accumulators live at once in the K loop (a 128 x 128
float32 tile is 128 registers a thread on 4 warps: ptxas spills), and the tensor cores' own accumulation
goes unused. Where the dot's accumulator is a zero constant, its result is read by that add alone and the
add is in the dot's block, the add becomes the dot with the add's other operand as accumulator (in place:
the add's result keeps its uses); the old dot is left without uses, for DCE.

Rounding: the products are added to c in the dot's accumulation order instead of summed from zero and then
added to c, as Triton's combine pass does (for integer dots the result is the same). The interpreter runs the
frontend's IR (the add), so the two may differ in the last bits of float sums, within the dot's own
rounding.
"""

from __future__ import annotations

from ..ir.core import Function, Operation, Value
from ..ir.ops import OpCode
from ..ir.rewrite import uses


def combine_dot_accumulation(function: Function) -> bool:
    """Rewrite `c + dot(a, b, 0)` as `dot(a, b, c)` throughout `function`; True when the IR changed."""
    readers = uses(function)
    changed = False
    for op in list(function.walk()):
        if op.opcode != OpCode.ADD or len(op.operands) != 2:
            continue
        for position in (0, 1):
            dot = _zero_accumulator_dot(op.operands[position], op, readers)
            if dot is None:
                continue
            other = op.operands[1 - position]
            if other.type != op.result.type or dot.result.type != op.result.type:
                continue
            op.opcode = OpCode.DOT
            op.operands = [dot.operands[0], dot.operands[1], other]
            op.attrs = dict(dot.attrs)
            readers[id(dot.result)] = []
            changed = True
            break
    return changed


def _zero_accumulator_dot(value: Value, add: Operation, readers: dict):
    """The DOT defining `value` when its accumulator is a zero constant, `add` is its only reader and both
    are in one block; else None."""
    dot = value.defining_op
    if dot is None or dot.opcode != OpCode.DOT or dot.parent is not add.parent:
        return None
    if [reader for reader, _ in readers.get(id(value), ())] != [add]:
        return None
    accumulator = dot.operands[2].defining_op
    if accumulator is None or accumulator.opcode != OpCode.CONSTANT or accumulator.attrs.get("value") != 0:
        return None
    return dot
