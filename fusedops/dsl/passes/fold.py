"""Constant folding and algebraic simplification.

`fold_constants(function)` replaces ops whose operands are constants by a CONSTANT holding the exact
result (numeric rules in `_constant_eval.py`), turns shape ops on constants (splat, broadcast,
expand_dims, reshape, trans) into block constants, resolves `where` with a constant condition, and
applies identities that hold for every integer value:

    x + 0 -> x    x - 0 -> x    x - x -> 0    x * 1 -> x    x * 0 -> 0    x // 1 -> x
    x | 0 -> x    x ^ 0 -> x    x << 0 -> x   x >> 0 -> x   addptr(p, 0) -> p
    where(c, x, x) -> x

(integers only: `x * 0` is not 0 for a float NaN, `x + 0` not x for a float -0.0). The folded ops
are removed; the constants they become are inserted where the op was.
"""

from __future__ import annotations

from typing import Optional, Union

from ..ir.core import Block, Function, Operation, Value
from ..ir.ops import BINARY, OpCode, UNARY
from ..ir.rewrite import ValueSubstitution
from ..language.dtypes import BlockType, DType, PointerType
from ._constant_eval import evaluate_binary, evaluate_cast, evaluate_unary, wrap

_SHAPE_OPS = frozenset({OpCode.SPLAT, OpCode.BROADCAST, OpCode.EXPAND_DIMS, OpCode.RESHAPE,
                        OpCode.TRANS})


class _Constant:
    """A folded scalar value to materialize as a CONSTANT of the op's result type."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


_Folded = Union[Value, _Constant, None]


def fold_constants(function: Function) -> bool:
    """Fold constant expressions and integer identities in `function`; True when the IR changed."""
    return _fold_block(function.body, ValueSubstitution())


def _fold_block(block: Block, substitution: ValueSubstitution) -> bool:
    changed = False
    kept = []
    for op in block.ops:
        changed |= substitution.apply(op)
        for region in op.regions:
            changed |= _fold_block(region, substitution)
        folded = _fold(op)
        if folded is None:
            kept.append(op)
            continue
        if isinstance(folded, _Constant):
            constant = Operation(OpCode.CONSTANT, [], [op.result.type], {"value": folded.value},
                                 loc=op.loc)
            constant.parent = block
            constant.result.layout = op.result.layout
            kept.append(constant)
            folded = constant.result
        substitution.add(op.result, folded)
        op.parent = None
        changed = True
    block.ops = kept
    return changed


def _element(value: Value):
    return value.type.element if isinstance(value.type, BlockType) else value.type


def _constant_value(value: Value):
    """The attr value of the CONSTANT defining `value` (a splat for blocks), or None."""
    op = value.defining_op
    if op is None or op.opcode != OpCode.CONSTANT:
        return None
    return op.attrs.get("value")


def _is_integer(value: Value) -> bool:
    element = _element(value)
    return isinstance(element, DType) and element.is_integer and not element.is_bool


def _int_constant(value: Value) -> Optional[int]:
    """The integer value of a constant integer (non-bool) operand, or None."""
    if not _is_integer(value):
        return None
    constant = _constant_value(value)
    return None if constant is None else wrap(int(constant), _element(value))


def _fold(op: Operation) -> _Folded:
    if len(op.results) != 1 or op.regions:
        return None
    code = op.opcode
    if code in _SHAPE_OPS:
        constant = _constant_value(op.operands[0])
        if constant is not None and isinstance(_element(op.operands[0]), DType):
            return _Constant(constant)
        return None
    if code == OpCode.WHERE:
        return _fold_where(op)
    if code == OpCode.ADDPTR:
        return op.operands[0] if _int_constant(op.operands[1]) == 0 else None
    if code == OpCode.CAST:
        return _fold_cast(op)
    if code in BINARY:
        return _fold_binary(op)
    if code in UNARY:
        constant = _constant_value(op.operands[0])
        if constant is None:
            return None
        value = evaluate_unary(code, _element(op.operands[0]), constant)
        return None if value is None else _Constant(value)
    return None


def _fold_where(op: Operation) -> _Folded:
    condition, a, b = op.operands
    if a is b:
        return a
    constant = _constant_value(condition)
    if constant is None:
        return None
    return a if constant else b


def _fold_cast(op: Operation) -> _Folded:
    source, target = _element(op.operands[0]), _element(op.result)
    if isinstance(source, PointerType) or isinstance(target, PointerType):
        return None
    constant = _constant_value(op.operands[0])
    if constant is None:
        return None
    value = evaluate_cast(source, target, constant)
    return None if value is None else _Constant(value)


def _fold_binary(op: Operation) -> _Folded:
    a, b = op.operands
    element = _element(a)
    if isinstance(element, PointerType):
        return None
    ca, cb = _constant_value(a), _constant_value(b)
    if ca is not None and cb is not None:
        value = evaluate_binary(op.opcode, element, ca, cb)
        return None if value is None else _Constant(value)
    if not _is_integer(a):
        return None
    return _integer_identity(op.opcode, a, b)


def _integer_identity(code: OpCode, a: Value, b: Value) -> _Folded:
    ia, ib = _int_constant(a), _int_constant(b)
    if code == OpCode.ADD:
        if ib == 0:
            return a
        if ia == 0:
            return b
    elif code == OpCode.SUB:
        if ib == 0:
            return a
        if a is b:
            return _Constant(0)
    elif code == OpCode.MUL:
        if ib == 1:
            return a
        if ia == 1:
            return b
        if ia == 0 or ib == 0:
            return _Constant(0)
    elif code == OpCode.IDIV:
        if ib == 1:
            return a
    elif code in (OpCode.OR, OpCode.XOR):
        if ib == 0:
            return a
        if ia == 0:
            return b
    elif code in (OpCode.SHL, OpCode.SHR):
        if ib == 0:
            return a
    return None
