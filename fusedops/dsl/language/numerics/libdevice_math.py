"""The libdevice math functions of `dsl.math` / `dsl.extra.cuda.libdevice` (language/libdevice.py) as NumPy
reference functions: what the interpreter computes for the MATH and MATH2 ops.

float32 operands are computed in float64 with NumPy (glibc's functions; torch's for erfc) and rounded once to
float32: within 1 ulp of the exact value, nearly always the correctly rounded one. The compiled code calls
libdevice (`__nv_<name>f`), whose error bounds are those of the CUDA C++ Programming Guide's tables of
standard functions (`FUNCTIONS[name].ulps` in language/libdevice.py), so the two agree within that bound plus
one ulp. float64 operands are computed in float64 by the same NumPy functions (glibc: within 1-2 ulp; erfc
5). The rounding functions (trunc, round, rint, nearbyint), copysign and fmod are exact in both, and so equal
bit for bit; so is `powi`, which repeats libdevice's own sequence of multiplications.

Special values follow C99 Annex F (IEEE 754), as libdevice does: NaN in gives NaN out except where Annex F
says otherwise (pow(x, +-0) = 1 and pow(1, y) = 1 for every x and y, NaN included; hypot(+-inf, NaN) = +inf);
arguments outside a function's domain give NaN (log1p(x < -1), asin(|x| > 1), acosh(x < 1), atanh(|x| > 1),
a negative finite base to a non-integer finite power); poles give signed infinities (log1p(-1) = -inf,
atanh(+-1) = +-inf, pow(+-0, y < 0)).
"""

from __future__ import annotations

import numpy as np

from ..dtypes import DType, float64
from .conversions import round_to_type


def _erfc(x):
    import torch    # NumPy has no erfc; torch.special.erfc (float64) is the reference, as `_erf`'s in arithmetic.py
    return torch.special.erfc(torch.from_numpy(np.array(x, dtype=np.float64, order="C"))).numpy()


def _round_half_away(x):
    """C's round: to the nearest integer, halfway cases away from zero (libdevice __nv_roundf: trunc(x +
    copysign(0.5, x)) with the addition rounded toward zero). x - trunc(x) is exact, so the test is too."""
    whole = np.trunc(x)
    return np.where(np.abs(x - whole) >= 0.5, whole + np.copysign(1.0, x), whole)


def _pow(a, b):
    """C's pow elementwise. NumPy's power takes shortcuts for an exponent that is a scalar or a broadcast view
    (0.5 as sqrt: pow(-0.0, 0.5) gave -0.0 and pow(-inf, 0.5) NaN, where C gives +0.0 and +inf), so both
    operands are made whole contiguous arrays first."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    shape = a.shape
    return np.power(np.array(a).reshape(-1), np.array(b).reshape(-1)).reshape(shape)


def _exp10(x):
    return _pow(10.0, x)


UNARY = {
    "exp": np.exp, "log1p": np.log1p, "expm1": np.expm1, "exp10": _exp10, "log10": np.log10, "tan": np.tan,
    "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh,
    "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "erfc": _erfc, "cbrt": np.cbrt,
    "trunc": np.trunc, "round": _round_half_away, "rint": np.rint, "nearbyint": np.rint,
}
BINARY = {"pow": _pow, "atan2": np.arctan2, "hypot": np.hypot, "copysign": np.copysign, "fmod": np.fmod}


def unary(name: str, x, dtype: DType) -> np.ndarray:
    """The function `name` (a key of UNARY) of `x`, whose element type is `dtype` (float32 or float64; the
    language widens 16-bit floats and integers to float32 before the op)."""
    wide = UNARY[name](np.asarray(x, dtype=np.float64))
    return np.asarray(wide, dtype=np.float64) if dtype == float64 else round_to_type(wide, dtype)


def binary(name: str, a, b, dtype: DType) -> np.ndarray:
    """`name(a, b)` (a key of BINARY, or "powi"), `dtype` the element type of `a` (and of `b`, except for
    powi, whose exponent `b` is int32)."""
    if name == "powi":
        return power_by_squaring(a, b, dtype)
    wide = BINARY[name](np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    return np.asarray(wide, dtype=np.float64) if dtype == float64 else round_to_type(wide, dtype)


def power_by_squaring(x, n, dtype: DType) -> np.ndarray:
    """x ** n for an int32 exponent n, as libdevice's __nv_powif / __nv_powi compute it (its bitcode): r = 1;
    for each bit of |n| from the lowest, r *= x where the bit is set, then x *= x; 1 / r for n < 0. Every
    product is rounded to `dtype` (IEEE, no flush to zero), so the result is bit-exact against the compiled
    code. x ** 0 is 1 for every x (NaN too); 0 ** -n is inf of the sign of 0 ** n; |n| = 2**31 works."""
    compute = np.float64 if dtype == float64 else np.float32
    base = np.array(x, dtype=compute)
    n = np.asarray(n).astype(np.int64)
    base, n = np.broadcast_arrays(base, n)
    base = base.copy()
    bits = np.abs(n).astype(np.uint64)
    result = np.ones(base.shape, dtype=compute)
    for _ in range(32):
        odd = (bits & np.uint64(1)) != 0
        result = np.where(odd, result * base, result).astype(compute)
        bits = bits >> np.uint64(1)
        base = (base * base).astype(compute)
    result = np.where(n < 0, compute(1) / result, result).astype(compute)
    return result if dtype == float64 or dtype.bits == 32 else round_to_type(result, dtype)
