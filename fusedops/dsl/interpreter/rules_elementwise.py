"""Rules for elementwise ops: arithmetic, comparisons, math, casts, select, and the identity hints.

Every rule defers to `language/numerics/`, which states the numeric rules.
"""

from __future__ import annotations

from ..ir.ops import COMPARISON, UNARY_MATH, OpCode
from ..language.numerics import arithmetic, conversions, libdevice_math
from .context import element_type, register

_BINARY = {
    OpCode.ADD: arithmetic.add, OpCode.SUB: arithmetic.sub, OpCode.MUL: arithmetic.mul,
    OpCode.DIV: arithmetic.true_divide, OpCode.IDIV: arithmetic.int_divide,
    OpCode.MOD: arithmetic.remainder, OpCode.AND: arithmetic.bitwise_and,
    OpCode.OR: arithmetic.bitwise_or, OpCode.XOR: arithmetic.bitwise_xor,
    OpCode.SHL: arithmetic.shift_left, OpCode.SHR: arithmetic.shift_right,
    OpCode.MINIMUM: arithmetic.minimum, OpCode.MAXIMUM: arithmetic.maximum,
    OpCode.UMULHI: arithmetic.multiply_high_unsigned,
}
_UNARY = {OpCode.NEG: arithmetic.negative, OpCode.INVERT: arithmetic.invert,
          OpCode.ABS: arithmetic.absolute}


def _binary_rule(function):
    def rule(ctx, op, a, b):
        return function(a, b, element_type(op.operands[0].type))
    return rule


def _comparison_rule(predicate: str):
    def rule(ctx, op, a, b):
        return arithmetic.compare(predicate, a, b)
    return rule


def _unary_rule(function):
    def rule(ctx, op, x):
        return function(x, element_type(op.operands[0].type))
    return rule


def _math_rule(name: str):
    def rule(ctx, op, x):
        return arithmetic.unary_math(name, x, element_type(op.operands[0].type), ftz=op.attrs.get("ftz", False))
    return rule


for _code, _function in _BINARY.items():
    register(_code)(_binary_rule(_function))
for _code in COMPARISON:
    register(_code)(_comparison_rule(_code.value))
for _code, _function in _UNARY.items():
    register(_code)(_unary_rule(_function))
for _code in UNARY_MATH:
    register(_code)(_math_rule(_code.value))


@register(OpCode.MATH)
def _libdevice_unary(ctx, op, x):
    return libdevice_math.unary(op.attrs["fn"], x, element_type(op.operands[0].type))


@register(OpCode.MATH2)
def _libdevice_binary(ctx, op, a, b):
    return libdevice_math.binary(op.attrs["fn"], a, b, element_type(op.operands[0].type))


@register(OpCode.FMA)
def _fma(ctx, op, a, b, c):
    return arithmetic.fma(a, b, c, element_type(op.results[0].type))


@register(OpCode.WHERE)
def _where(ctx, op, condition, a, b):
    return arithmetic.where(condition, a, b)


@register(OpCode.CAST)
def _cast(ctx, op, x):
    return conversions.cast(x, element_type(op.operands[0].type), element_type(op.results[0].type))


@register(OpCode.BITCAST)
def _bitcast(ctx, op, x):
    return conversions.bitcast(x, element_type(op.operands[0].type), element_type(op.results[0].type))


@register(OpCode.MULTIPLE_OF, OpCode.MAX_CONTIGUOUS, OpCode.CONVERT_LAYOUT)
def _identity(ctx, op, x):
    return x
