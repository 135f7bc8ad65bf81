"""How the type of a loop-carried value may change in the loop body (the rules are in control_flow.py's
docstring; loops.py applies them): a body value whose type changed only because a literal won the promotion
is converted back (`is_literal_promotion`), and a literal initial value adopts the type the body gives it.
So does a nested loop's initial value computed from an enclosing loop's literal (`literals_reaching`): the
nested loop takes its body's type as the literal would, and the enclosing loop then sees the change, so that
nested loops promote as one loop does."""

from __future__ import annotations

from ..ir import OpCode, Value
from ..ir.ops import ELEMENTWISE
from ..language import promotion
from ..language.dtypes import DType, shape_of
from .control_flow import _element
from .scope import is_runtime

# Ops that reshape a value without changing its elements (broadcasting an operand inserts them).
_RESHAPES = frozenset({OpCode.SPLAT, OpCode.BROADCAST, OpCode.EXPAND_DIMS})
# Ops whose value is a function of their operands alone, and constants.
_PURE = (ELEMENTWISE - {OpCode.ADDPTR}) | _RESHAPES | {OpCode.CONSTANT}
# Ops whose value memory gives, not their operands: a literal in an address does not reach what is loaded.
_MEMORY_READS = frozenset({OpCode.LOAD, OpCode.ATOMIC_RMW, OpCode.ATOMIC_CAS, OpCode.DESCRIPTOR_LOAD})


def _without_reshapes(value: Value) -> Value:
    while value.defining_op is not None and value.defining_op.opcode in _RESHAPES:
        value = value.defining_op.operands[0]
    return value


def is_literal_promotion(value: Value, carried_type) -> bool:
    """Whether `value`'s type differs from the carried type only because literals won the promotion: it is
    computed, by elementwise ops alone, from literals and one value x of the carried element type converted
    as the promotion converts it, and its element type is a literal's own (a float literal's float32, a large
    int's int64 / uint64), which wins the promotion against the carried type: `x + 1.5`, `x // 2.0` (a few
    ops: a float floor division), `x * 0.5 + 0.25`. Not one: `load_f32 + 1` into an int32 carry (the load
    made it float, not the literal), `x.to(dsl.int32) + 1` into a float32 carry (the conversion did),
    `x + dsl.full((), 1, dsl.int64)` (a typed constant, not a literal) and `dsl.exp(x)` (no literal)."""
    carried, result = _element(carried_type), _element(value.type)
    if shape_of(value.type) != shape_of(carried_type) or not isinstance(carried, DType) or result == carried:
        return False
    sources, literals, pending, seen = set(), [], [value], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        op = current.defining_op
        if op is None or op.opcode not in _PURE:
            return False        # a block argument (another carry, the induction variable), memory, ...
        if op.opcode == OpCode.CONSTANT:
            literals.append(promotion.literal_dtype(op.attrs["value"]))
        elif op.opcode == OpCode.CAST and _element(op.operands[0].type) == carried and _element(current.type) == result:
            sources.add(id(_without_reshapes(op.operands[0])))
        else:
            pending.extend(op.operands)
    return len(sources) == 1 and any(literal == result and promotion.promote(carried, literal) == result
                                     for literal in literals)


def literals_reaching(carry_inits: dict, value) -> list:
    """The literal initial values (`acc = 0`) of the loops being compiled that `value` is computed from,
    through any ops but memory reads (a literal in an address is not in the value loaded), `if`s and loops
    (`carry_inits`: each loop's block argument -> its initial value, a number or an IR value, while the
    loop's body compiles)."""
    found, pending, seen = [], [value], set()
    while pending:
        value = pending.pop()
        if not is_runtime(value):
            found.append(value)
            continue
        if value in seen:
            continue
        seen.add(value)
        if value in carry_inits:
            pending.append(carry_inits[value])
            continue
        op = value.defining_op
        if op is not None and op.opcode not in _MEMORY_READS:
            pending.extend(op.operands)
            pending.extend(v for region in op.regions if region.terminator is not None
                           for v in region.terminator.operands)
    return found


def carried_source(carry_inits: dict, value: Value, name: str):
    """The block argument carrying `name` through a loop being compiled (`carry_inits`' keys) that `value` is,
    or is computed from by elementwise ops (`acc * 2 + i`, `acc + step` with `step` carried too, through the
    branches of inner `if`s: an `elif`); None when there is none. `name` None: a block argument of any name, None
    when there is more than one."""
    found, pending, seen = None, [value], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if current in carry_inits:
            if name is not None and current.name != name:
                continue        # another carried variable taking part in the value (`acc = acc + step`)
            if found is not None and found is not current:
                return None
            found = current
            continue
        op = current.defining_op
        if op is not None and op.opcode == OpCode.IF:      # an inner `if`'s result: what its branches yield
            index = op.results.index(current)
            pending.extend(region.terminator.operands[index] for region in op.regions)
            continue
        if op is not None and op.opcode in _PURE:
            pending.extend(op.operands)
        # (other values, such as the loop's index or a load, take part in the value without being the carry)
    return found
