"""Type promotion and broadcasting rules of the kernel language (the written rules; tests in
tests/test_semantics.py).

Promotion of two operand element types for arithmetic:
- float with float: the same type stays; float64 wins; else float32 wins; float16 with bfloat16 gives
  float32.
- float with integer: the float type.
- integer with integer: int1 yields to any other integer; otherwise the wider type; at equal width a
  signed and an unsigned type give the unsigned one (C's rule). Arithmetic (+ - * // %) and shifts
  (<< >>) of two int1 operands compute in int32 (C's integer promotion: True + True is 2, True << 1 is
  2); the bitwise & | ^, min/max and comparisons keep int1. Unary `~` of an int1 is logical not, `-`
  of one is an error (as in NumPy and torch).
Python literals are *weak*: a literal adopts the other operand's type when that type can hold its kind
(an int literal with an integer or float operand, a float literal with a float operand); alone, an int
literal is int32 (int64 if it does not fit, uint64 beyond that) and a float literal float32. A float literal
converted to an integer type (`dsl.cast` / `.to()`, `dsl.full`, a store, a load's `other`, an annotated
assignment) converts from its exact value, as Python's int() and torch.full do (123456789.0 -> 123456789, not
float32's 123456792).

Broadcasting is NumPy's: shapes align at the right, size-1 dims stretch, missing leading dims are added.

These are torch's rules where Triton's differ (README, "Coming from Triton"): Triton computes `/` and `%` of
float16 / bfloat16 in float32 and returns float32, gives float16 for float16 with bfloat16 and float32 for an
integer with bfloat16, and makes a float literal outside float32's normal range a float64.
"""

from __future__ import annotations

from .dtypes import (DType, float16, float32, float64, int1, int8, int16, int32, int64, uint8, uint16, uint32,
                     uint64)


class PromotionError(TypeError):
    pass


def printable(value) -> str:
    """repr(value) for an error message, or what it is where Python refuses to print it (an int of over 4300
    digits: sys.get_int_max_str_digits; or a tuple of one)."""
    try:
        return repr(value)
    except ValueError:
        if isinstance(value, int):
            return f"<an int of {value.bit_length()} bits>"
        return f"<a {type(value).__name__} holding an int too long to print>"


def promote(a: DType, b: DType) -> DType:
    """The element type two operands of an arithmetic op are computed in."""
    if a == b:
        return a
    if a.is_floating or b.is_floating:
        if a.is_floating and b.is_floating:
            if float64 in (a, b):
                return float64
            return float32   # float32 with a 16-bit float, or float16 with bfloat16
        return a if a.is_floating else b
    if a.is_bool:
        return b
    if b.is_bool:
        return a
    if a.bits != b.bits:
        return a if a.bits > b.bits else b
    return a if a.kind == "uint" else b


def literal_dtype(value) -> DType:
    """The type of a Python literal standing alone."""
    if isinstance(value, bool):
        return int1
    if isinstance(value, int):
        if -2**31 <= value < 2**31:
            return int32
        if -2**63 <= value < 2**63:
            return int64
        if 0 <= value < 2**64:
            return uint64
        raise PromotionError(f"integer literal {printable(value)} does not fit in 64 bits")
    if isinstance(value, float):
        return float32
    raise PromotionError(f"{printable(value)} of type {type(value).__name__} is not a kernel-language value")


def literal_fits(value, dtype: DType) -> bool:
    """Whether a literal can adopt `dtype` without changing its kind or overflowing."""
    if isinstance(value, bool):
        return True
    if isinstance(value, int):
        if dtype.is_floating:
            return True
        if dtype.is_bool:
            return value in (0, 1)
        if dtype.kind == "uint":
            return 0 <= value < 2**dtype.bits
        return -2**(dtype.bits - 1) <= value < 2**(dtype.bits - 1)
    if isinstance(value, float):
        return dtype.is_floating
    return False


def ints_of_bits(bits: int) -> tuple:
    """The integer types `bits` wide, signed first (the types an int literal's bits may take)."""
    return {8: (int8, uint8), 16: (int16, uint16), 32: (int32, uint32), 64: (int64, uint64)}.get(bits, ())


def float_of_bits(bits: int) -> DType:
    """The float type a float literal takes to be `bits` wide (float16 for 16: bfloat16 has no literals)."""
    return {16: float16, 32: float32, 64: float64}.get(bits, float32)


def broadcast_shapes(a: tuple, b: tuple) -> tuple:
    """NumPy broadcasting of two block shapes; PromotionError when they do not broadcast."""
    rank = max(len(a), len(b))
    a = (1,) * (rank - len(a)) + tuple(a)
    b = (1,) * (rank - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise PromotionError(f"shapes {a} and {b} do not broadcast")
        out.append(max(x, y))
    return tuple(out)
