"""The compute representation of values, rounding, and conversions between types (CAST, BITCAST, bit
patterns), as the package docstring (numerics/__init__.py) states them.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import ALL_DTYPES, DType, PointerType, bfloat16, float16, float64, int1, int64, uint64

# -- representation helpers -------------------------------------------------------------------------

UNSIGNED_OF_WIDTH = {1: np.dtype(np.uint8), 8: np.dtype(np.uint8), 16: np.dtype(np.uint16),
                     32: np.dtype(np.uint32), 64: np.dtype(np.uint64)}


def scalar_type(dtype) -> DType:
    """Pointers compute as int64 byte addresses."""
    return int64 if isinstance(dtype, PointerType) else dtype


def is_half(dtype: DType) -> bool:
    return dtype.is_floating and dtype.bits == 16


def int_view(x, dtype: DType) -> np.ndarray:
    """int1 values as uint8 0/1 so that NumPy does integer (not logical) arithmetic on them."""
    x = np.asarray(x)
    return x.view(np.uint8) if dtype.is_bool else x


def int_result(r, dtype: DType):
    """Back from `int_view`'s representation: int1 keeps the low bit."""
    return np.bitwise_and(r, 1).astype(np.bool_) if dtype.is_bool else r


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
    if scalar_type(dtype).is_floating and type(value) is int and not -2**63 <= value < 2**64:
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
    src, dst = scalar_type(src), scalar_type(dst)
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
    dtype = scalar_type(dtype)
    x = np.asarray(x)
    if dtype == bfloat16:
        return np.right_shift(x.astype(np.float32).view(np.uint32), 16).astype(np.uint16)
    return x.view(UNSIGNED_OF_WIDTH[dtype.bits])


def from_bits(bits, dtype) -> np.ndarray:
    """Inverse of `to_bits`: unsigned integers of the type's width reinterpreted as `dtype`."""
    dtype = scalar_type(dtype)
    bits = np.asarray(bits)
    if dtype == bfloat16:
        return np.left_shift(bits.astype(np.uint32), 16).view(np.float32)
    if dtype.is_bool:
        return np.not_equal(bits, 0)
    return bits.view(dtype.numpy_dtype)


def bitcast(x, src, dst) -> np.ndarray:
    """Reinterpret the bits of `x` (same bit width) as `dst` (BITCAST). Raises ValueError on a width
    mismatch."""
    src, dst = scalar_type(src), scalar_type(dst)
    if src.bits != dst.bits:
        raise ValueError(f"bitcast needs equal bit widths, got {src} and {dst}")
    return from_bits(to_bits(x, src), dst)

