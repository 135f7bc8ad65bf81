"""The numeric rules of the kernel language, written as NumPy reference functions.

These functions *are* the semantics: the interpreter calls them, and the compiler's lowering must give
the same results (bit for bit for integer, comparison, cast and rounding rules; within the documented
error for transcendental functions and for the order of floating-point sums).

Values are NumPy arrays (0-d for scalars) in the *compute representation* of their dtype:
`DType.numpy_dtype`, i.e. int1 is `np.bool_` and bfloat16 is `np.float32` holding only values that are
exactly representable in bfloat16. Every function takes the operands' element `DType` because the NumPy
dtype alone cannot tell bfloat16 from float32.

Floating point follows IEEE 754: overflow, division by zero and invalid operations give inf/NaN. NumPy
reports those as `RuntimeWarning`s; callers that do not want them wrap calls in
`np.errstate(all="ignore")` (the interpreter does so once per launch). Integer rules never warn.

Integer rules, shared by every width (int1 is treated as an unsigned 1-bit integer, so `+` on int1 is
xor, `*` is and, sums are parities):
- arithmetic wraps around (two's complement), like LLVM's `add`/`mul` without `nsw`;
- `//` (IDIV) truncates toward zero and `%` (MOD) has the sign of the dividend (C); `x // 0` is -1
  (all ones for unsigned) and `x % 0` is x (PTX `div`/`rem`); `MIN // -1` wraps to MIN and `MIN % -1`
  is 0;
- shifts by an amount >= the bit width (negative signed amounts count as huge) give 0 for `<<` and
  logical `>>`, and the sign fill for arithmetic `>>` of signed types (PTX `shl`/`shr` clamp the amount).

Floating-point rules:
- fp16/bf16 arithmetic and math are computed in float32 and rounded once (to nearest even) to the
  type; float32 math is computed in float32, float64 math in float64;
- `%` is C `fmod`; minimum/maximum and max/min reductions propagate NaN; argmax/argmin give the first
  index of the extreme, NaN counting as the extreme (torch semantics);
- conversions (`cast`): float -> int truncates toward zero and saturates, NaN -> 0; every rounding to a
  narrower float is one round-to-nearest-even.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from .dtypes import ALL_DTYPES, DType, PointerType, bfloat16, float16, float32, float64, int1, int64, uint64

# -- representation helpers -------------------------------------------------------------------------

_UNSIGNED_OF_WIDTH = {1: np.dtype(np.uint8), 8: np.dtype(np.uint8), 16: np.dtype(np.uint16),
                      32: np.dtype(np.uint32), 64: np.dtype(np.uint64)}


def _scalar_type(dtype) -> DType:
    """Pointers compute as int64 byte addresses."""
    return int64 if isinstance(dtype, PointerType) else dtype


def _is_half(dtype: DType) -> bool:
    return dtype.is_floating and dtype.bits == 16


def _int_view(x, dtype: DType) -> np.ndarray:
    """int1 values as uint8 0/1 so that NumPy does integer (not logical) arithmetic on them."""
    x = np.asarray(x)
    return x.view(np.uint8) if dtype.is_bool else x


def _int_result(r, dtype: DType):
    """Back from `_int_view`'s representation: int1 keeps the low bit."""
    return np.bitwise_and(r, 1).astype(np.bool_) if dtype.is_bool else r


def _all_ones(dtype: DType) -> int:
    return -1 if dtype.is_signed else (1 << max(dtype.bits, 8)) - 1


# -- rounding ---------------------------------------------------------------------------------------

def round_to_bfloat16(x) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 value, ties to even; returned as float32.

    Works on the bits: add 0x7FFF plus the lowest kept bit, then clear the low 16 bits. Infinities stay,
    values past the largest bfloat16 become inf, NaN stays NaN (its sign and high payload bits are kept
    and it is made quiet, so a NaN whose payload was only in the low bits does not turn into inf).
    """
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    lsb = np.bitwise_and(np.right_shift(bits, 16), 1)
    rounded = np.bitwise_and(bits + np.uint32(0x7FFF) + lsb, np.uint32(0xFFFF0000))
    quiet_nan = np.bitwise_and(np.bitwise_or(bits, np.uint32(0x00400000)), np.uint32(0xFFFF0000))
    return np.where(np.isnan(x), quiet_nan, rounded).astype(np.uint32).view(np.float32)


def _float64_to_float32_round_to_odd(x: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounding to odd: exact results stay, inexact ones get an odd last bit.

    Rounding to odd first and then to nearest-even in fewer bits gives the correctly rounded result
    (Boldo & Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms using rounding
    to odd", 2008), which a plain float64 -> float32 -> bfloat16 chain does not.
    """
    nearest = x.astype(np.float32)
    bits = nearest.view(np.uint32)
    inexact = (nearest.astype(np.float64) != x) & ~np.isnan(x)
    even = np.bitwise_and(bits, 1) == 0
    toward_zero = np.abs(nearest.astype(np.float64)) > np.abs(x)   # sign-magnitude: step the magnitude
    stepped = np.where(toward_zero, bits - np.uint32(1), bits + np.uint32(1))
    return np.where(inexact & even, stepped, bits).astype(np.uint32).view(np.float32)


def _integer_to_float64_round_to_odd(x: np.ndarray) -> np.ndarray:
    """int64 / uint64 -> float64 rounding to odd (53 significant bits: exact below 2**53; above, the bits
    past the 53rd dropped and the last kept one set where any was nonzero), so that a later rounding to
    fewer bits is the single correct one (see `_float64_to_float32_round_to_odd`)."""
    negative = x < 0 if x.dtype.kind == "i" else np.zeros(x.shape, dtype=bool)
    magnitude = x.astype(np.uint64)
    magnitude = np.where(negative, ~magnitude + np.uint64(1), magnitude)        # |INT64_MIN| = 2**63
    length = sum((magnitude >> np.uint64(k)) != 0 for k in range(64)).astype(np.uint64)
    shift = np.where(length > 53, length - np.uint64(53), np.uint64(0))
    kept = (magnitude >> shift) << shift
    odd = np.where(kept != magnitude, kept | (np.uint64(1) << shift), kept)
    value = odd.astype(np.float64)                                                # exact: 53 bits
    return np.where(negative, -value, value)


def round_to_type(x, dtype: DType) -> np.ndarray:
    """Round float values (float16/32/64 arrays) to the floating `dtype`, to nearest, ties to even.

    One correct rounding for every source: float64 -> bfloat16 goes through round-to-odd (PTX
    `cvt.rn.bf16.f64`), so it can differ from torch, whose double -> bfloat16 rounds twice.
    """
    x = np.asarray(x)
    if dtype == bfloat16:
        if x.dtype == np.float64:
            x = _float64_to_float32_round_to_odd(x)
        return round_to_bfloat16(x.astype(np.float32, copy=False))
    return x.astype(dtype.numpy_dtype, copy=False)


def _compute_in_float32(fn, dtype: DType, *operands):
    """fp16/bf16 math: computed in float32 and rounded once to the type; wider floats compute natively."""
    if _is_half(dtype):
        return round_to_type(fn(*[np.asarray(v).astype(np.float32) for v in operands]), dtype)
    return fn(*operands)


# -- conversions ------------------------------------------------------------------------------------

def _python_source_dtype(value):
    if isinstance(value, (bool, np.bool_)):
        return int1
    if isinstance(value, np.generic):
        return next(d for d in ALL_DTYPES if d.numpy_dtype == value.dtype and d != bfloat16)
    if isinstance(value, int):
        if -(1 << 63) <= value < (1 << 64):
            return int64 if value < (1 << 63) else uint64
        raise OverflowError(f"integer {value} does not fit in 64 bits")
    if isinstance(value, float):
        return float64
    raise TypeError(f"expected a Python or NumPy scalar, got {type(value).__name__}")


def from_python(value, dtype) -> np.ndarray:
    """A Python/NumPy scalar as a 0-d array of `dtype`, converted with `cast` (bool -> int1,
    int -> int64 (uint64 above 2**63-1), float -> float64 first). Raises TypeError for non-scalars."""
    if _scalar_type(dtype).is_floating and type(value) is int and not -2**63 <= value < 2**64:
        value = float(value)    # (a float parameter given an int wider than 64 bits: as the GPU's packer)
    source = _python_source_dtype(value)
    with np.errstate(all="ignore"):     # a float too large for the type becomes inf: the rule, not an error
        return np.asarray(cast(np.asarray(value, dtype=source.numpy_dtype), source, dtype))


def cast(x, src, dst) -> np.ndarray:
    """Value conversion from `src` to `dst` (CAST).

    - anything -> int1: `x != 0` (NaN -> True); int1 -> number: 0 or 1;
    - float -> int: truncate toward zero, saturate at the target's range, NaN -> 0 (PTX `cvt.rzi.sat`);
    - int -> int: two's complement truncation, or sign/zero extension by the *source's* signedness;
    - -> float16/bfloat16: round to nearest even, once (64-bit ints through float64 rounded to odd);
    - int -> float32/float64: round to nearest even; float widening is exact.
    Pointers convert as int64 byte addresses.
    """
    src, dst = _scalar_type(src), _scalar_type(dst)
    x = np.asarray(x)
    if dst.is_bool:
        return np.not_equal(x, 0)
    if src.is_bool:
        return x.astype(dst.numpy_dtype)
    if dst.is_floating:
        if src.is_floating:
            return round_to_type(x, dst)
        if dst == bfloat16:
            wide = x.dtype.itemsize == 8 and x.dtype.kind in "iu"
            return round_to_type(_integer_to_float64_round_to_odd(x) if wide else x.astype(np.float64), dst)
        if dst == float16:
            return x.astype(np.float32).astype(np.float16)   # exact below 2**24; above, inf either way
        return x.astype(dst.numpy_dtype)
    if src.is_floating:
        return _float_to_int(x, dst)
    return x.astype(dst.numpy_dtype)


def _float_to_int(x: np.ndarray, dst: DType) -> np.ndarray:
    target = dst.numpy_dtype
    info = np.iinfo(target)
    truncated = np.trunc(x.astype(np.float64))       # exact for every float source
    low, high = float(info.min), float(info.max) + 1.0   # high is a power of two, exact in float64
    in_range = (truncated >= low) & (truncated < high)
    converted = np.where(in_range, truncated, 0.0).astype(target)
    saturated = np.where(truncated >= high, info.max, np.where(truncated < low, info.min, converted))
    return np.where(np.isnan(truncated), 0, saturated).astype(target)


def to_bits(x, dtype) -> np.ndarray:
    """The bit pattern of `x` as an unsigned integer of the type's width (uint8 for int1)."""
    dtype = _scalar_type(dtype)
    x = np.asarray(x)
    if dtype == bfloat16:
        return np.right_shift(x.astype(np.float32).view(np.uint32), 16).astype(np.uint16)
    return x.view(_UNSIGNED_OF_WIDTH[dtype.bits])


def from_bits(bits, dtype) -> np.ndarray:
    """Inverse of `to_bits`: unsigned integers of the type's width reinterpreted as `dtype`."""
    dtype = _scalar_type(dtype)
    bits = np.asarray(bits)
    if dtype == bfloat16:
        return np.left_shift(bits.astype(np.uint32), 16).view(np.float32)
    if dtype.is_bool:
        return np.not_equal(bits, 0)
    return bits.view(dtype.numpy_dtype)


def bitcast(x, src, dst) -> np.ndarray:
    """Reinterpret the bits of `x` (same bit width) as `dst` (BITCAST). Raises ValueError on a width
    mismatch."""
    src, dst = _scalar_type(src), _scalar_type(dst)
    if src.bits != dst.bits:
        raise ValueError(f"bitcast needs equal bit widths, got {src} and {dst}")
    return from_bits(to_bits(x, src), dst)


# -- elementwise arithmetic -------------------------------------------------------------------------

def _arith(name: str, float_fn, int_fn, doc: str):
    def rule(a, b, dtype):
        dtype = _scalar_type(dtype)
        if dtype.is_floating:
            return _compute_in_float32(float_fn, dtype, a, b)
        return _int_result(int_fn(_int_view(a, dtype), _int_view(b, dtype)), dtype)
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
    dtype = _scalar_type(dtype)
    a, b = _int_view(a, dtype), _int_view(b, dtype)
    zero = np.equal(b, 0)
    if not dtype.is_signed:
        quotient = np.floor_divide(a, np.where(zero, 1, b))
        return _int_result(np.where(zero, _all_ones(dtype), quotient), dtype)
    minus_one = np.equal(b, -1)
    safe = np.where(zero | minus_one, 1, b)
    remainder_ = np.fmod(a, safe)                       # C remainder: the sign of the dividend
    quotient = np.floor_divide(np.subtract(a, remainder_), safe)   # exact division
    quotient = np.where(minus_one, np.negative(a), quotient)
    return np.where(zero, -1, quotient).astype(a.dtype)


def remainder(a, b, dtype: DType) -> np.ndarray:
    """a % b (MOD): C semantics, the sign of the dividend; floats use fmod; integer x % 0 = x."""
    dtype = _scalar_type(dtype)
    if dtype.is_floating:
        return _compute_in_float32(np.fmod, dtype, a, b)
    a, b = _int_view(a, dtype), _int_view(b, dtype)
    zero = np.equal(b, 0)
    bad = zero | np.equal(b, -1) if dtype.is_signed else zero
    result = np.fmod(a, np.where(bad, 1, b))            # x % 1 == 0 == x % -1
    return _int_result(np.where(zero, a, result), dtype)


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
    dtype = _scalar_type(dtype)
    a = _int_view(a, dtype)
    amount = np.asarray(amount).view(_UNSIGNED_OF_WIDTH[dtype.bits])   # negative -> huge
    too_far = amount >= dtype.bits
    safe = np.where(too_far, 0, amount).astype(a.dtype)
    if left:
        return _int_result(np.where(too_far, 0, np.left_shift(a, safe)), dtype)
    fill = np.where(np.less(a, 0), -1, 0) if dtype.is_signed else 0
    return _int_result(np.where(too_far, fill, np.right_shift(a, safe)).astype(a.dtype), dtype)


def shift_left(a, amount, dtype: DType) -> np.ndarray:
    """a << amount (SHL); an amount >= the bit width (or negative) gives 0."""
    return _shift(a, amount, dtype, left=True)


def shift_right(a, amount, dtype: DType) -> np.ndarray:
    """a >> amount (SHR): arithmetic for signed types, logical for unsigned; an amount >= the bit width
    (or negative) gives the sign fill (-1 or 0) for signed types and 0 for unsigned ones."""
    return _shift(a, amount, dtype, left=False)


_COMPARISONS = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
                "gt": np.greater, "ge": np.greater_equal}


def compare(predicate: str, a, b) -> np.ndarray:
    """`a <predicate> b` as int1, predicate one of eq/ne/lt/le/gt/ge (IEEE: NaN compares unequal and
    unordered; int1 orders False < True; pointers compare as addresses)."""
    return _COMPARISONS[predicate](a, b)


def negative(x, dtype: DType) -> np.ndarray:
    """-x (NEG): wraps around for integers (-MIN == MIN, unsigned -x == 2**bits - x); int1 -x == x."""
    dtype = _scalar_type(dtype)
    if dtype.is_bool:
        return np.asarray(x)
    return np.negative(x)


def invert(x, dtype: DType) -> np.ndarray:
    """~x (INVERT): bitwise not; logical not for int1."""
    return np.invert(x)


def absolute(x, dtype: DType) -> np.ndarray:
    """|x| (ABS): clears the sign bit of floats (NaN stays NaN); abs(MIN) == MIN for signed integers;
    unsigned values and int1 are unchanged."""
    dtype = _scalar_type(dtype)
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


# -- block-wide -------------------------------------------------------------------------------------

def _accumulation_type(dtype: DType):
    """Sums of fp16/bf16 accumulate in float32 and round once at the end."""
    return np.dtype(np.float32) if _is_half(dtype) else None


def reduce(x, kind: str, axis, dtype: DType) -> np.ndarray:
    """Reduce along `axis` (None: every axis) with kind sum/max/min (REDUCE).

    sum: integers wrap around (int1 sums are parities); fp16/bf16 accumulate in float32 and round once;
    the summation order is unspecified (NumPy: pairwise); a sum of -0.0s is -0.0, as the compiled tree
    adds only the elements (IEEE 754: -0 + -0 = -0; NumPy starts from +0.0). max/min propagate NaN and
    order -0.0 < +0.0.
    """
    dtype = _scalar_type(dtype)
    x = np.asarray(x)
    if kind == "sum":
        if dtype.is_floating:
            accumulate = _accumulation_type(dtype)
            total = np.sum(x if accumulate is None else x.astype(accumulate), axis=axis)
            if np.any(total == 0):      # (the sign of a zero sum: only then are the elements looked at again)
                total = np.where(np.all((x == 0) & np.signbit(x), axis=axis), -0.0, total).astype(total.dtype)
            return round_to_type(total, dtype) if accumulate is not None else np.asarray(total)
        view = _int_view(x, dtype)
        return _int_result(np.sum(view, axis=axis, dtype=view.dtype), dtype)
    if kind in ("max", "min"):
        extreme = np.asarray((np.max if kind == "max" else np.min)(x, axis=axis))
        return _order_zeros(extreme, x, kind, lambda found: np.any(found, axis=axis))
    raise NotImplementedError(f"reduce kind {kind!r}")


def _order_zeros(extreme: np.ndarray, x: np.ndarray, kind: str, gather) -> np.ndarray:
    """`extreme` (a max or min of x's floats) with its zeros signed as IEEE 754-2019 maximum / minimum
    order them, -0.0 below +0.0 (the compiled llvm.maximum / llvm.minimum; NumPy keeps whichever zero it
    met first): a max is +0.0 where the elements `gather` covers hold a +0.0, a min -0.0 where they hold
    a -0.0. `gather(found)` reduces a boolean array of x's shape as extreme was reduced."""
    if x.dtype.kind != "f" or not np.any(extreme == 0):
        return extreme
    sign = np.signbit(x)
    found = gather((x == 0) & (~sign if kind == "max" else sign))
    signed = np.where(found, 0.0, -0.0) if kind == "max" else np.where(found, -0.0, 0.0)
    return np.where(extreme == 0, signed.astype(extreme.dtype), extreme)


def argreduce(x, kind: str, axis) -> np.ndarray:
    """Index (int32) of the first maximum (kind argmax) or minimum (argmin) along `axis` (None: of the
    flattened block). NaN counts as the extreme, so the first NaN wins (torch.argmax/argmin)."""
    x = np.asarray(x)
    if kind not in ("argmax", "argmin"):
        raise NotImplementedError(f"argreduce kind {kind!r}")
    find = np.argmax if kind == "argmax" else np.argmin
    index = find(x, axis=axis)
    if x.dtype.kind == "f":   # explicit, rather than relying on NumPy's NaN ordering
        nan = np.isnan(x)
        index = np.where(np.any(nan, axis=axis), np.argmax(nan, axis=axis), index)
    return np.asarray(index).astype(np.int32)


def scan(x, kind: str, axis: int, reverse: bool, dtype: DType) -> np.ndarray:
    """Inclusive prefix scan along `axis` (SCAN), from the end when `reverse`.

    sum: sequential order; integers wrap around; fp16/bf16 accumulate in float32 and each output is
    rounded once. max/min: running extreme, NaN propagates, -0.0 < +0.0.
    """
    dtype = _scalar_type(dtype)
    x = np.asarray(x)
    if reverse:
        x = np.flip(x, axis)
    if kind == "sum":
        if dtype.is_floating:
            accumulate = _accumulation_type(dtype)
            if accumulate is None:
                result = np.cumsum(x, axis=axis, dtype=x.dtype)
            else:
                result = round_to_type(np.cumsum(x.astype(accumulate), axis=axis), dtype)
        else:
            view = _int_view(x, dtype)
            result = _int_result(np.cumsum(view, axis=axis, dtype=view.dtype), dtype)
    elif kind in ("max", "min"):
        result = (np.maximum if kind == "max" else np.minimum).accumulate(x, axis=axis)
        result = _order_zeros(result, x, kind, lambda found: np.logical_or.accumulate(found, axis=axis))
    else:
        raise NotImplementedError(f"scan kind {kind!r}")
    return np.flip(result, axis) if reverse else result


def dot(a, b, acc, input_dtype: DType, acc_dtype: DType) -> np.ndarray:
    """a (MxK) @ b (KxN) + acc (MxN) (DOT), returned in acc's type.

    Floating inputs: the product a @ b is accumulated in float64 (the products of float32 and narrower inputs
    are exact there) and rounded once to float32 (float64 when either input or acc is float64), then acc is
    added in that type and the result rounded to acc's type: at least as accurate as the GPU's float32
    accumulation, and the same whichever order the products are added in (the BLAS's float32 kernels add them
    in an order that depends on the CPU and on the operands' layout, so a product recomputed transposed, as
    attention's backward recomputes Q K^T as K Q^T, could differ from the first in its last bits: at large
    logits its exp no longer matched the forward's log-sum-exp). `x + dot(a, b)` and `dot(a, b, x)` agree
    bitwise (passes/dot_accumulation.py folds one into the other). Integer inputs (int8 -> int32) are exact
    products summed with wrap-around in acc's type. `input_precision` (tf32) is not emulated: the
    interpreter is at least as accurate.
    """
    if input_dtype.is_floating:
        compute = np.float64 if float64 in (input_dtype, acc_dtype) else np.float32
        total = np.matmul(np.asarray(a).astype(np.float64), np.asarray(b).astype(np.float64)).astype(compute)
        return round_to_type(np.add(total, np.asarray(acc).astype(compute)), acc_dtype)
    # Integers: exact float64 products and sums while |sum| < 2**53 (always for 8-bit inputs and
    # K < 2**37), otherwise int64 matmul; then wrap into acc's type.
    if input_dtype.bits <= 8:
        total = np.matmul(np.asarray(a).astype(np.float64), np.asarray(b).astype(np.float64))
        total = total.astype(np.int64)
    else:
        total = np.matmul(np.asarray(a).astype(np.int64), np.asarray(b).astype(np.int64))
    return np.add(total.astype(acc_dtype.numpy_dtype), np.asarray(acc))
