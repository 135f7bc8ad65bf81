"""Exact evaluation of one op on constant scalars, by the kernel language's own numeric rules.

Constant folding calls the functions of `language/numerics/` (the rules the interpreter runs and
the compiler's lowering must match bit for bit), on the constants as `conversions.from_python` reads a
CONSTANT attr, so a folded value is the value the unfolded op computes. Every function here returns
the folded Python value (int, bool or float), or None when the op must not be folded:
- float16/bfloat16 arithmetic and casts to or from them are never folded; float32/float64 fold only
  add/sub/mul/neg (IEEE round-to-nearest-even, as on the device), comparisons and casts;
- the edge cases a lowering is most likely to get wrong are left to run: integer division or
  remainder by zero, MIN // -1 and MIN % -1, shifts by a negative amount or by >= the bit width;
- pointer values are never folded.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..ir.ops import COMPARISON, OpCode
from ..language.numerics import arithmetic, conversions
from ..language.dtypes import DType

_EXACT_FLOATS = ("float32", "float64")

_INT_BINARY = {
    OpCode.ADD: arithmetic.add, OpCode.SUB: arithmetic.sub, OpCode.MUL: arithmetic.mul,
    OpCode.IDIV: arithmetic.int_divide, OpCode.MOD: arithmetic.remainder, OpCode.AND: arithmetic.bitwise_and,
    OpCode.OR: arithmetic.bitwise_or, OpCode.XOR: arithmetic.bitwise_xor, OpCode.SHL: arithmetic.shift_left,
    OpCode.SHR: arithmetic.shift_right, OpCode.MINIMUM: arithmetic.minimum, OpCode.MAXIMUM: arithmetic.maximum,
    OpCode.UMULHI: arithmetic.multiply_high_unsigned,
}
_FLOAT_BINARY = {OpCode.ADD: arithmetic.add, OpCode.SUB: arithmetic.sub, OpCode.MUL: arithmetic.mul}
_INT_UNARY = {OpCode.NEG: arithmetic.negative, OpCode.INVERT: arithmetic.invert, OpCode.ABS: arithmetic.absolute}


def wrap(value: int, dtype: DType):
    """`value` reduced to `dtype`'s width: two's complement for int, modulo 2**bits for uint, the
    low bit for int1 (as integer arithmetic on int1 is)."""
    bits = dtype.bits
    value = int(value) & ((1 << bits) - 1)
    if dtype.is_bool:
        return bool(value)
    if dtype.is_signed and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def _foldable(dtype) -> bool:
    return isinstance(dtype, DType) and (not dtype.is_floating or dtype.name in _EXACT_FLOATS)


def _read(value, dtype: DType) -> np.ndarray:
    """A CONSTANT attr as the interpreter reads it."""
    return conversions.from_python(value, dtype)


def _python(result: np.ndarray):
    return np.asarray(result).item()


def _undefined_edge(opcode: OpCode, dtype: DType, a: int, b: int) -> bool:
    if opcode in (OpCode.IDIV, OpCode.MOD):
        return b == 0 or (dtype.is_signed and b == -1 and a == -(1 << (dtype.bits - 1)))
    if opcode in (OpCode.SHL, OpCode.SHR):
        return not 0 <= b < dtype.bits
    return False


def evaluate_binary(opcode: OpCode, dtype: DType, a, b):
    """`a <opcode> b` for constants of element type `dtype` (the operands'), or None."""
    if not _foldable(dtype):
        return None
    x, y = _read(a, dtype), _read(b, dtype)
    with np.errstate(all="ignore"):
        if opcode in COMPARISON:
            return bool(_python(arithmetic.compare(opcode.value, x, y)))
        if dtype.is_floating:
            rule = _FLOAT_BINARY.get(opcode)
            return None if rule is None else float(_python(rule(x, y, dtype)))
        rule = _INT_BINARY.get(opcode)
        if rule is None or _undefined_edge(opcode, dtype, int(_python(x)), int(_python(y))):
            return None
        return _python(rule(x, y, dtype))


def evaluate_unary(opcode: OpCode, dtype: DType, a):
    """`opcode(a)` for a constant of element type `dtype`, or None."""
    if not _foldable(dtype):
        return None
    x = _read(a, dtype)
    with np.errstate(all="ignore"):
        if dtype.is_floating:
            return float(_python(arithmetic.negative(x, dtype))) if opcode == OpCode.NEG else None
        rule = _INT_UNARY.get(opcode)
        return None if rule is None else _python(rule(x, dtype))


def evaluate_cast(source: DType, target: DType, a) -> Optional[object]:
    """The value conversion (CAST) of constant `a` from `source` to `target`, or None."""
    if not (_foldable(source) and _foldable(target)):
        return None
    with np.errstate(all="ignore"):
        return _python(conversions.cast(_read(a, source), source, target))
