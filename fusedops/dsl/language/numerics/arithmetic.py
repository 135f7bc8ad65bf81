"""Elementwise arithmetic, comparisons, math functions, FMA and WHERE, as the package docstring
(numerics/__init__.py) states them.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ..dtypes import DType, float32, float64
from .conversions import UNSIGNED_OF_WIDTH, int_result, int_view, is_half, round_to_type, scalar_type


def _all_ones(dtype: DType) -> int:
    return -1 if dtype.is_signed else (1 << max(dtype.bits, 8)) - 1


def _compute_in_float32(fn, dtype: DType, *operands):
    """fp16/bf16 math: computed in float32 and rounded once to the type; wider floats compute natively."""
    if is_half(dtype):
        return round_to_type(fn(*[np.asarray(v).astype(np.float32) for v in operands]), dtype)
    return fn(*operands)


# -- elementwise arithmetic -------------------------------------------------------------------------

def _arith(name: str, float_fn, int_fn, doc: str):
    def rule(a, b, dtype):
        dtype = scalar_type(dtype)
        if dtype.is_floating:
            return _compute_in_float32(float_fn, dtype, a, b)
        return int_result(int_fn(int_view(a, dtype), int_view(b, dtype)), dtype)
    rule.__name__ = rule.__qualname__ = name
    rule.__doc__ = doc
    return rule


add = _arith("add", np.add, np.add,
             "a + b (ADD): wraps around for integers; fp16/bf16 computed in float32 and rounded.")
sub = _arith("sub", np.subtract, np.subtract,
             "a - b (SUB): wraps around for integers; fp16/bf16 computed in float32 and rounded.")
mul = _arith("mul", np.multiply, np.multiply,
             "a * b (MUL): wraps around for integers; fp16/bf16 computed in float32 and rounded.")


def _ordered_zeros(function, maximum: bool):
    """NumPy's minimum / maximum with -0.0 below +0.0 whichever operand holds it (IEEE 754-2019 minimum /
    maximum, as the compiled code: llvm.minimum / llvm.maximum). Ties of zeros: max(a, b) = a + b
    (+0.0 unless both are -0.0), min(a, b) = -(-a - b)."""
    def ordered(a, b):
        a, b = np.asarray(a), np.asarray(b)
        result = function(a, b)
        zeros = (a == 0) & (b == 0)
        if np.any(zeros):
            tie = a + b if maximum else -((-a) - b)
            result = np.where(zeros, tie, result)
        return result
    return ordered


minimum = _arith("minimum", _ordered_zeros(np.minimum, False), np.minimum,
                 "Elementwise minimum (MINIMUM); NaN in either operand gives NaN (torch.minimum); -0.0 < +0.0.")
maximum = _arith("maximum", _ordered_zeros(np.maximum, True), np.maximum,
                 "Elementwise maximum (MAXIMUM); NaN in either operand gives NaN (torch.maximum); -0.0 < +0.0.")


def true_divide(a, b, dtype: DType) -> np.ndarray:
    """a / b for floats (DIV), IEEE correctly rounded; fp16/bf16 computed in float32 and rounded."""
    return _compute_in_float32(np.true_divide, dtype, a, b)


def int_divide(a, b, dtype: DType) -> np.ndarray:
    """a // b for integers (IDIV), truncating toward zero; x // 0 = -1 (all ones), MIN // -1 = MIN."""
    dtype = scalar_type(dtype)
    a, b = int_view(a, dtype), int_view(b, dtype)
    zero = np.equal(b, 0)
    if not dtype.is_signed:
        quotient = np.floor_divide(a, np.where(zero, 1, b))
        return int_result(np.where(zero, _all_ones(dtype), quotient), dtype)
    minus_one = np.equal(b, -1)
    safe = np.where(zero | minus_one, 1, b)
    remainder_ = np.fmod(a, safe)                       # C remainder: the sign of the dividend
    quotient = np.floor_divide(np.subtract(a, remainder_), safe)   # exact division
    quotient = np.where(minus_one, np.negative(a), quotient)
    return np.where(zero, -1, quotient).astype(a.dtype)


def remainder(a, b, dtype: DType) -> np.ndarray:
    """a % b (MOD): C semantics, the sign of the dividend; floats use fmod; integer x % 0 = x."""
    dtype = scalar_type(dtype)
    if dtype.is_floating:
        return _compute_in_float32(np.fmod, dtype, a, b)
    a, b = int_view(a, dtype), int_view(b, dtype)
    zero = np.equal(b, 0)
    bad = zero | np.equal(b, -1) if dtype.is_signed else zero
    result = np.fmod(a, np.where(bad, 1, b))            # x % 1 == 0 == x % -1
    return int_result(np.where(zero, a, result), dtype)


def bitwise_and(a, b, dtype: DType) -> np.ndarray:
    """a & b (AND); logical and for int1."""
    return np.bitwise_and(a, b)


def bitwise_or(a, b, dtype: DType) -> np.ndarray:
    """a | b (OR); logical or for int1."""
    return np.bitwise_or(a, b)


def bitwise_xor(a, b, dtype: DType) -> np.ndarray:
    """a ^ b (XOR); logical xor for int1."""
    return np.bitwise_xor(a, b)


def _shift(a, amount, dtype: DType, left: bool):
    dtype = scalar_type(dtype)
    a = int_view(a, dtype)
    amount = np.asarray(amount).view(UNSIGNED_OF_WIDTH[dtype.bits])   # negative -> huge
    too_far = amount >= dtype.bits
    safe = np.where(too_far, 0, amount).astype(a.dtype)
    if left:
        return int_result(np.where(too_far, 0, np.left_shift(a, safe)), dtype)
    fill = np.where(np.less(a, 0), -1, 0) if dtype.is_signed else 0
    return int_result(np.where(too_far, fill, np.right_shift(a, safe)).astype(a.dtype), dtype)


def shift_left(a, amount, dtype: DType) -> np.ndarray:
    """a << amount (SHL); an amount >= the bit width (or negative) gives 0."""
    return _shift(a, amount, dtype, left=True)


def shift_right(a, amount, dtype: DType) -> np.ndarray:
    """a >> amount (SHR): arithmetic for signed types, logical for unsigned; an amount >= the bit width
    (or negative) gives the sign fill (-1 or 0) for signed types and 0 for unsigned ones."""
    return _shift(a, amount, dtype, left=False)


def multiply_high_unsigned(a, b, dtype: DType) -> np.ndarray:
    """The high N bits of the 2N-bit product of a and b read as N-bit unsigned integers (UMULHI), returned
    in `dtype` (bits reinterpreted for a signed one); exact: 64-bit operands multiply in 32-bit halves."""
    dtype = scalar_type(dtype)
    bits, unsigned = dtype.bits, UNSIGNED_OF_WIDTH[dtype.bits]
    x, y = (np.asarray(v).astype(dtype.numpy_dtype).view(unsigned).astype(np.uint64) for v in (a, b))
    if bits <= 32:
        high = np.right_shift(np.multiply(x, y), np.uint64(bits))
    else:
        low32, shift = np.uint64(0xFFFFFFFF), np.uint64(32)
        xh, xl, yh, yl = np.right_shift(x, shift), x & low32, np.right_shift(y, shift), y & low32
        cross1, cross2 = np.multiply(xh, yl), np.multiply(xl, yh)
        carry = np.right_shift((cross1 & low32) + (cross2 & low32) + np.right_shift(np.multiply(xl, yl), shift), shift)
        high = np.multiply(xh, yh) + np.right_shift(cross1, shift) + np.right_shift(cross2, shift) + carry
    return high.astype(unsigned).view(dtype.numpy_dtype)


_COMPARISONS = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
                "gt": np.greater, "ge": np.greater_equal}


def compare(predicate: str, a, b) -> np.ndarray:
    """`a <predicate> b` as int1, predicate one of eq/ne/lt/le/gt/ge (IEEE: NaN compares unequal and
    unordered; int1 orders False < True; pointers compare as addresses)."""
    return _COMPARISONS[predicate](a, b)


def negative(x, dtype: DType) -> np.ndarray:
    """-x (NEG): wraps around for integers (-MIN == MIN, unsigned -x == 2**bits - x); int1 -x == x."""
    dtype = scalar_type(dtype)
    if dtype.is_bool:
        return np.asarray(x)
    return np.negative(x)


def invert(x, dtype: DType) -> np.ndarray:
    """~x (INVERT): bitwise not; logical not for int1."""
    return np.invert(x)


def absolute(x, dtype: DType) -> np.ndarray:
    """|x| (ABS): clears the sign bit of floats (NaN stays NaN); abs(MIN) == MIN for signed integers;
    unsigned values and int1 are unchanged."""
    dtype = scalar_type(dtype)
    if dtype.is_floating or dtype.is_signed:
        return np.abs(x)
    return np.asarray(x)


def _erf(x):
    import torch   # NumPy has no erf; torch.special.erf is the float32/float64 reference
    # a writable copy: torch.from_numpy warns about read-only arrays (a constant block's broadcast view)
    return torch.special.erf(torch.from_numpy(np.array(x, order="C"))).numpy()


def _rsqrt(x):
    return np.divide(1, np.sqrt(x))


UNARY_MATH = {"exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "sqrt": np.sqrt,
              "rsqrt": _rsqrt, "sin": np.sin, "cos": np.cos, "erf": _erf, "tanh": np.tanh,
              "floor": np.floor, "ceil": np.ceil}


def unary_math(name: str, x, dtype: DType, ftz: bool = False) -> np.ndarray:
    """The float function `name` (a key of UNARY_MATH: exp, exp2, log, log2, sqrt, rsqrt, sin, cos, erf,
    tanh, floor, ceil) computed in float32 for float32/fp16/bf16 (rounded to 16-bit types once) and in
    float64 for float64. Accuracy is NumPy's (a few ulp for float32 transcendentals). `ftz`: float32
    subnormal results become zeros of their sign (PTX's `.ftz`; float64 keeps them)."""
    result = _compute_in_float32(UNARY_MATH[name], dtype, x)
    if ftz and dtype == float32:
        result = np.asarray(result)
        result = np.where(np.abs(result) < np.finfo(np.float32).tiny, np.copysign(np.float32(0), result), result)
    return result


def fma(a, b, c, dtype: DType) -> np.ndarray:
    """a * b + c rounded once to `dtype` (FMA), as the compiled `llvm.fma` rounds.

    fp16/bf16/float32: the product is exact in float64 (at most 48 significant bits), the sum is not
    (c may lie more than 53 bits below it), so rounding the float64 sum to the type could round twice.
    The sum's rounding error (Knuth's TwoSum, "The Art of Computer Programming" vol. 2, 4.2.2) turns it
    into the exact sum rounded to odd in float64: where inexact and even, the neighbour toward the
    exact sum. A value rounded to odd with at least two more bits than the type rounds to the type as
    the exact value does (S. Boldo and G. Melquiond, "Emulation of FMA and correctly rounded sums:
    proved algorithms using rounding to odd", IEEE Trans. Computers 2008). float64: exactly in
    rationals (`_fma_float64`). Non-finite operands: as a * b + c."""
    if dtype == float64:
        return _fma_float64(a, b, c)
    a, b, c = np.broadcast_arrays(*(np.asarray(v).astype(np.float64) for v in (a, b, c)))
    with np.errstate(invalid="ignore", over="ignore"):
        product = np.multiply(a, b)
        total = np.add(product, c)
        virtual = total - product
        error = (product - (total - virtual)) + (c - virtual)
    even = (np.asarray(total, dtype=np.float64).view(np.int64) & 1) == 0
    step = np.isfinite(total) & np.isfinite(error) & (error != 0) & even
    if np.any(step):
        total = np.where(step, np.nextafter(total, np.where(error > 0, np.inf, -np.inf)), total)
    return round_to_type(total, dtype)


def _fma_float64(a, b, c) -> np.ndarray:
    """a * b + c rounded once (float64): exact rational arithmetic where all three are finite (Python's
    float(Fraction) rounds to nearest even; past float64's range, +-inf)."""
    a, b, c = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (a, b, c)))
    result = np.add(np.multiply(a, b), c)
    finite = np.isfinite(a) & np.isfinite(b) & np.isfinite(c)
    out = np.array(result, dtype=np.float64, copy=True)
    for index in zip(*np.nonzero(finite)) if out.ndim else ([()] if finite else []):
        exact = Fraction(float(a[index])) * Fraction(float(b[index])) + Fraction(float(c[index]))
        try:
            value = float(exact)
        except OverflowError:
            value = math.inf if exact > 0 else -math.inf
        if value == 0.0:        # an exact zero takes the sign the rounding rules give a*b + c in float64
            value = float(result[index]) if result[index] == 0.0 else 0.0
        out[index] = value
    return out


def where(condition, a, b) -> np.ndarray:
    """`a` where `condition` (int1) is true, else `b` (WHERE)."""
    return np.where(condition, a, b)
