"""libdevice's math functions as DSL builtins: the module `dsl.extra.cuda.libdevice` (also `dsl.extra.libdevice`,
as Triton's `triton.language.extra.cuda.libdevice` / `triton.language.extra.libdevice`); the new names are in
`dsl.math` too (Triton 2.x's `tl.math.log1p`, `tl.math.pow`, ...). README, "Coming from Triton".

Each float function is one MATH op (one argument) or MATH2 op (two) naming it; the code generator calls
libdevice's `__nv_<name>f` for float32 and `__nv_<name>` for float64 (NVIDIA's libdevice user's guide), whose
maximum errors are the CUDA C++ Programming Guide's (its tables of standard functions; `FUNCTIONS[name].ulps`).
The interpreter computes them with NumPy (numerics/libdevice_math.py: float32 through float64, so within 1 ulp
of the exact value). Special values follow C99 Annex F as libdevice does; each docstring gives its function's.

Operand dtypes (the DSL's rule for its math builtins, dsl.exp's): float32 and float64 are computed in their type;
float16 and bfloat16 in float32, rounded back to the input dtype once; integers (int1 too) are converted to
float32 and give float32. Triton's libdevice refuses all but float32 and float64. Two-operand functions promote
their operands as arithmetic does (a Python literal takes the other operand's type) and broadcast them.

Not ops of their own: isnan / isinf / isfinite (Triton's finitef / isfinited) are comparisons giving int1, as
Triton's `.to(int1)` does; signbit reads the sign bit and gives int32 0 / 1, as Triton's does. libdevice names
this module does not have (erfinv, lgamma, j0, the rounding-mode variants, ...) are errors listing those it has.
"""

from __future__ import annotations

import dataclasses

from ..errors import CompilationError
from ..ir import OpCode, Value
from . import promotion
from .core import builtin, constexpr
from .dtypes import DType, PointerType, float32, int1, int16, int32, int64, shape_of
from .elementwise_builtins import abs, ceil, cos, erf, exp2, floor, fma, log, log2, rsqrt, sin, sqrt, tanh
from .semantics import element_of, is_literal
from .shape_ops import shown
from .triton_compat import div_rn, sqrt_rn


@dataclasses.dataclass(frozen=True)
class MathFunction:
    """A libdevice function: `symbols` its (float32, float64) libdevice names, `ulps` their maximum error in
    ulps against the correctly rounded result (CUDA C++ Programming Guide, Mathematical Functions appendix,
    "Standard Functions" tables, full range; where its editions differ, the larger figure; 0: exact), `doc`
    what it computes and its special values."""

    arity: int
    symbols: tuple
    ulps: tuple
    doc: str


def _f(arity: int, name: str, ulps: tuple, doc: str) -> MathFunction:
    return MathFunction(arity, (f"__nv_{name}f", f"__nv_{name}"), ulps, doc)


FUNCTIONS = {
    "exp": _f(1, "exp", (2, 1), "e**x as libdevice's expf (dsl.exp / dsl.math.exp are the faster ex2.approx form)"),
    "log1p": _f(1, "log1p", (1, 1), "log(1 + x), accurate for small x: -inf at -1, NaN below -1"),
    "expm1": _f(1, "expm1", (1, 1), "e**x - 1, accurate for small x: -1 at -inf"),
    "exp10": _f(1, "exp10", (2, 1), "10**x"),
    "log10": _f(1, "log10", (2, 1), "base-10 logarithm: -inf at +-0, NaN below 0"),
    "tan": _f(1, "tan", (4, 2), "tangent (radians): NaN at +-inf"),
    "asin": _f(1, "asin", (4, 2), "arc sine, in [-pi/2, pi/2]: NaN outside [-1, 1]"),
    "acos": _f(1, "acos", (3, 2), "arc cosine, in [0, pi]: NaN outside [-1, 1]"),
    "atan": _f(1, "atan", (2, 2), "arc tangent, in [-pi/2, pi/2]: +-pi/2 at +-inf"),
    "sinh": _f(1, "sinh", (3, 2), "hyperbolic sine"),
    "cosh": _f(1, "cosh", (2, 1), "hyperbolic cosine: +inf at +-inf"),
    "asinh": _f(1, "asinh", (3, 3), "inverse hyperbolic sine"),
    "acosh": _f(1, "acosh", (4, 3), "inverse hyperbolic cosine, >= 0: NaN below 1"),
    "atanh": _f(1, "atanh", (3, 2), "inverse hyperbolic tangent: +-inf at +-1, NaN outside [-1, 1]"),
    "erfc": _f(1, "erfc", (4, 5), "complementary error function 1 - erf(x), accurate where erf(x) is near 1"),
    "cbrt": _f(1, "cbrt", (1, 1), "cube root (negative for negative x)"),
    "trunc": _f(1, "trunc", (0, 0), "round toward zero to an integer (exact)"),
    "round": _f(1, "round", (0, 0), "round to the nearest integer, halfway cases away from zero (C's round; "
                                    "torch.round and NumPy round them to even: use rint for that)"),
    "rint": _f(1, "rint", (0, 0), "round to the nearest integer, halfway cases to even (exact; torch.round)"),
    "nearbyint": _f(1, "nearbyint", (0, 0), "round to the nearest integer, halfway cases to even (= rint)"),
    "pow": _f(2, "pow", (8, 2), "x**y (pow(x, +-0) = 1 and pow(1, y) = 1 for every x and y, NaN too; "
                                "pow(-1, +-inf) = 1; NaN for a negative finite x to a non-integer finite y; "
                                "+-inf for pow(+-0, y < 0), the sign kept for odd integer y)"),
    "atan2": _f(2, "atan2", (3, 2), "the angle of the point (y=x, x=y) in [-pi, pi] (C's atan2(x, y): the "
                                    "first argument is the ordinate), signs of zeros kept"),
    "hypot": _f(2, "hypot", (3, 2), "sqrt(x*x + y*y) without intermediate overflow: +inf if either is +-inf, "
                                    "even with a NaN"),
    "copysign": _f(2, "copysign", (0, 0), "|x| with the sign bit of y (exact; NaN's sign too)"),
    "fmod": _f(2, "fmod", (0, 0), "the C remainder x - trunc(x / y) * y, exact, the sign of x (= the DSL's "
                                  "float %): NaN for y = 0 or infinite x"),
}
# libdevice's x**n for an int32 n (by repeated squaring), used by pow and `**` with an integer exponent.
SYMBOLS = {name: f.symbols for name, f in FUNCTIONS.items()} | {"powi": ("__nv_powif", "__nv_powi")}


# -- building the ops ------------------------------------------------------------------------------------------
def _operand(_semantic, x, what: str):
    """`x` as an IR value or a literal, checked to be a number (not a pointer, a tuple, a string, ...)."""
    if isinstance(x, constexpr):
        x = x.value
    if isinstance(x, Value):
        if isinstance(element_of(x), PointerType):
            raise CompilationError(f"{what} must be a number (a float or integer scalar or block), got {x.type}")
        return x
    if not is_literal(x):
        raise CompilationError(f"{what} must be a number (a float or integer scalar or block), got {shown(x)}")
    return x


def unary_call(_semantic, name: str, x) -> Value:
    """The MATH op `name(x)` with the module docstring's dtype rules."""
    x = _semantic.to_value(_operand(_semantic, x, f"{name}: x"))
    element = element_of(x)
    if not element.is_floating:
        x = _semantic.cast(x, float32)
    elif element.bits == 16:
        return _semantic.cast(unary_call(_semantic, name, _semantic.cast(x, float32)), element)
    return _semantic.builder.value(OpCode.MATH, [x], x.type, fn=name)


def binary_call(_semantic, name: str, x, y) -> Value:
    """The MATH2 op `name(x, y)`: operands promoted (16-bit floats and integers computed in float32) and
    broadcast; the result in the promoted float type (float32 for integers)."""
    a, b = _semantic._pair(_operand(_semantic, x, f"{name}: x"), _operand(_semantic, y, f"{name}: y"))
    try:
        dtype = promotion.promote(element_of(a), element_of(b))
    except promotion.PromotionError as e:
        raise CompilationError(f"{name}: {e}") from None
    compute = dtype if dtype.is_floating and dtype.bits > 16 else float32
    if dtype.is_floating:   # an integer operand rounds to the promoted type first, as in arithmetic
        a, b = _semantic.cast(a, dtype), _semantic.cast(b, dtype)
    a, b = _semantic.broadcast_pair(_semantic.cast(a, compute), _semantic.cast(b, compute))
    result = _semantic.builder.value(OpCode.MATH2, [a, b], a.type, fn=name)
    return _semantic.cast(result, dtype) if dtype.is_floating and dtype.bits == 16 else result


def _int32_exponent(_semantic, n, what: str) -> Value:
    """An integer exponent (a literal, or a value of at most 32 bits, signed below 32) as int32."""
    if isinstance(n, Value):
        element = element_of(n)
        if element.bits > 32 or (element.bits == 32 and not element.is_signed):
            raise CompilationError(f"{what}: an integer exponent must fit int32 (libdevice's powi takes int32), "
                                   f"got {element}; convert it with .to(dsl.int32) or .to(dsl.float32)")
        return _semantic.cast(n, int32)
    if not -2**31 <= n < 2**31:
        raise CompilationError(f"{what}: the integer exponent {n} does not fit int32; write it as a float")
    return int(n)


def power_by_squaring(_semantic, x, n) -> Value:
    """x**n for a float x (promoted as unary_call's) and an int32 exponent n (value or literal): libdevice's
    __nv_powif / __nv_powi, r = 1; for each bit of |n| from the lowest, r *= x where it is set, then x *= x;
    1 / r for n < 0 (every product rounded in order: x**2 is the correctly rounded x * x, x**0 is 1 for every x).
    A runtime n is the MATH2 op "powi"; a literal n is those multiplications written out (the same values: 1 * x
    is x), one `*` for x**2 instead of a call."""
    x = _semantic.to_value(x)
    element = element_of(x)
    if element.is_floating and element.bits == 16:
        return _semantic.cast(power_by_squaring(_semantic, _semantic.cast(x, float32), n), element)
    if not element.is_floating:
        x = _semantic.cast(x, float32)
    n = _int32_exponent(_semantic, n, "pow")
    if not isinstance(n, Value):
        return _constant_power(_semantic, x, n)
    x, n = _semantic.broadcast_pair(x, n)
    return _semantic.builder.value(OpCode.MATH2, [x, n], x.type, fn="powi")


def _constant_power(_semantic, x: Value, n: int) -> Value:
    """x**n by the multiplications of libdevice's powi for a compile-time int n (float x: 1 / r for n < 0;
    an integer x: wrapping, n >= 0)."""
    result, bits = None, -n if n < 0 else n
    while bits:
        if bits & 1:
            result = x if result is None else _semantic.binary("mul", result, x)
        bits >>= 1
        if bits:
            x = _semantic.binary("mul", x, x)
    if result is None:
        result = _semantic.constant(1, element_of(x), shape_of(x.type))
    return _semantic.binary("truediv", 1, result) if n < 0 else result


def _is_integer(v) -> bool:
    if isinstance(v, Value):
        return isinstance(element_of(v), DType) and element_of(v).is_integer
    return isinstance(v, int)       # (bool too)


def power(_semantic, x, y) -> Value:
    """`dsl.math.pow(x, y)`: libdevice's powi where y is an integer (a literal or an integer value of at most
    32 bits), as Triton's libdevice.pow picks __nv_powif for an int32 exponent; pow otherwise."""
    x, y = _operand(_semantic, x, "pow: x"), _operand(_semantic, y, "pow: y")
    if _is_integer(y):
        if is_literal(x):
            x = _semantic.to_value(x)
        return power_by_squaring(_semantic, x, y)
    return binary_call(_semantic, "pow", x, y)


def power_operator(_semantic, x, y) -> Value:
    """`x ** y` in a kernel (one side at least a kernel value):

    - an integer x (a value; int1 computes in int32) to a compile-time int y >= 0: x multiplied by itself by
      repeated squaring in x's type, wrapping as the DSL's integer `*` does (0 ** 0 is 1; torch wraps too).
      A negative or runtime exponent of an integer base is a CompilationError (Python would give a float).
    - a float x to an integer y (a literal in int32, or an integer value): libdevice's powi (power_by_squaring);
      x ** 2 is x * x. A float literal y with an integer value in [-4, 4] (x ** 2.0) counts as that integer.
    - otherwise (a float y): libdevice's pow in the promoted float type (float32 for an integer x), as pow.
    """
    x, y = _operand(_semantic, x, "`**`: the base"), _operand(_semantic, y, "`**`: the exponent")
    base_integer = _is_integer(x) and not (is_literal(x) and isinstance(y, Value) and element_of(y).is_floating)
    if base_integer and _is_integer(y):
        if isinstance(y, Value) or y < 0:
            what = "a runtime exponent" if isinstance(y, Value) else f"the exponent {y}"
            raise CompilationError(f"`**` of an integer base needs a compile-time int exponent >= 0, got {what}; "
                                   "for a float power convert the base first: x.to(dsl.float32) ** y")
        return _integer_power(_semantic, _semantic.to_value(x), int(y))
    if _is_integer(y) and not (is_literal(y) and not -2**31 <= y < 2**31):
        return power_by_squaring(_semantic, _semantic.to_value(x) if is_literal(x) else x, y)
    if isinstance(y, float) and y.is_integer() and -4 <= y <= 4 and isinstance(x, Value) \
            and element_of(x).is_floating:
        return power_by_squaring(_semantic, x, int(y))        # x ** 2.0 as x ** 2: x * x, as torch's
    return binary_call(_semantic, "pow", x, float(y) if is_literal(y) and not isinstance(y, float) else y)


def _integer_power(_semantic, x: Value, n: int) -> Value:
    return _constant_power(_semantic, _semantic.cast(x, int32) if element_of(x) == int1 else x, n)


# -- the builtins ----------------------------------------------------------------------------------------------
def _rules(ulps: tuple) -> str:
    exact = ulps == (0, 0)
    accuracy = ("Exact." if exact else f"Maximum error {ulps[0]} ulp in float32, {ulps[1]} in float64 (libdevice; "
                "the interpreter is within 1 ulp of the exact value).")
    return (f"{accuracy} float16 / bfloat16 are computed in float32 and rounded back; integer inputs give "
            "float32. Raises CompilationError for an argument that is not a number (a pointer, a tuple, ...).")


def _unary(name: str):
    function_info = FUNCTIONS[name]

    def function(x, *, _semantic=None):
        return unary_call(_semantic, name, x)

    function.__name__ = function.__qualname__ = name
    function.__doc__ = f"Elementwise {function_info.doc}: libdevice's {name}. {_rules(function_info.ulps)}"
    return builtin(function)


def _binary(name: str):
    function_info = FUNCTIONS[name]

    def function(x, y, *, _semantic=None):
        return binary_call(_semantic, name, x, y)

    function.__name__ = function.__qualname__ = name
    function.__doc__ = (f"Elementwise {function_info.doc}: libdevice's {name}; x and y promote and broadcast. "
                        f"{_rules(function_info.ulps)}")
    return builtin(function)


exp = _unary("exp")
log1p, expm1, exp10, log10 = _unary("log1p"), _unary("expm1"), _unary("exp10"), _unary("log10")
tan, asin, acos, atan = _unary("tan"), _unary("asin"), _unary("acos"), _unary("atan")
sinh, cosh, asinh, acosh, atanh = _unary("sinh"), _unary("cosh"), _unary("asinh"), _unary("acosh"), _unary("atanh")
erfc, cbrt = _unary("erfc"), _unary("cbrt")
trunc, round, rint, nearbyint = _unary("trunc"), _unary("round"), _unary("rint"), _unary("nearbyint")
atan2, hypot, copysign, fmod = _binary("atan2"), _binary("hypot"), _binary("copysign"), _binary("fmod")


@builtin
def pow(x, y, *, _semantic=None):
    """Elementwise x**y, libdevice's pow (Triton's libdevice.pow): an integer y (an int literal in int32 range,
    or an integer scalar / block of at most 32 bits, signed if 32) selects powi, x multiplied by itself by
    repeated squaring (__nv_powif / __nv_powi: x**0 = 1 for every x, x**-n = 1 / x**n, exact products in
    order); a float y selects pow (__nv_powf / __nv_pow: 8 ulp in float32, 2 in float64; C99 Annex F's
    special values: pow(x, +-0) = 1 and pow(1, y) = 1 even for NaN, pow(-1, +-inf) = 1, NaN for a negative
    finite x to a non-integer finite y, pow(+-0, y < 0) = +-inf). x and a float y promote and broadcast;
    float16 / bfloat16 compute in float32 and round back; an integer x gives float32 (`x ** n` of an integer
    block stays an integer instead).

    Raises:
        CompilationError: an argument that is not a number; an integer exponent wider than int32.
    """
    return power(_semantic, x, y)


def _float_value(_semantic, x, what: str) -> Value:
    x = _semantic.to_value(_operand(_semantic, x, what))
    return x if element_of(x).is_floating else _semantic.cast(x, float32)


@builtin
def isnan(x, *, _semantic=None):
    """Elementwise x is NaN, as int1 (Triton's libdevice.isnan, which converts to int1). Integers are never NaN.

    Raises:
        CompilationError: x is not a number.
    """
    x = _float_value(_semantic, x, "isnan: x")
    return _semantic.binary("ne", x, x)


@builtin
def isinf(x, *, _semantic=None):
    """Elementwise x is +inf or -inf, as int1 (Triton's libdevice.isinf). Integers are never infinite.

    Raises:
        CompilationError: x is not a number.
    """
    x = _float_value(_semantic, x, "isinf: x")
    return _semantic.binary("eq", _semantic.unary("abs", x), float("inf"))


@builtin
def isfinite(x, *, _semantic=None):
    """Elementwise x is neither infinite nor NaN, as int1 (Triton's libdevice.finitef / isfinited, which take
    float32 / float64 only; here both names and this one take any number).

    Raises:
        CompilationError: x is not a number.
    """
    x = _float_value(_semantic, x, "isfinite: x")
    return _semantic.binary("lt", _semantic.unary("abs", x), float("inf"))


finitef = isfinited = isfinite


@builtin
def signbit(x, *, _semantic=None):
    """Elementwise sign bit of x as int32 0 or 1 (Triton's libdevice.signbit gives int32): 1 for -0.0, for
    negative numbers and for NaNs with the sign bit set. Integers convert to float32 first (x < 0).

    Raises:
        CompilationError: x is not a number.
    """
    x = _float_value(_semantic, x, "signbit: x")
    bits = {16: int16, 32: int32, 64: int64}[element_of(x).bits]
    negative = _semantic.binary("lt", _semantic.cast(x, bits, bitcast=True), 0)
    return _semantic.cast(negative, int32)


# The names of this module a kernel may use: the builtins above, and those the DSL already had (Triton's
# libdevice.exp2, log, ..., calling the same libdevice functions; sqrt is IEEE sqrt.rn, div_rn / sqrt_rn exact).
NEW_NAMES = (
    "log1p", "expm1", "exp10", "log10", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
    "erfc", "cbrt", "trunc", "round", "rint", "nearbyint", "pow", "atan2", "hypot", "copysign", "fmod",
    "isnan", "isinf", "isfinite", "finitef", "isfinited", "signbit",
)
__all__ = ["exp", *NEW_NAMES, "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "erf", "tanh", "floor",
           "ceil", "fma", "abs", "div_rn", "sqrt_rn"]


def __getattr__(name: str):
    """`libdevice.<name>` of a libdevice function this module does not have, on the host: the AttributeError
    lists those it has."""
    from .triton_names import missing_libdevice_hint

    raise AttributeError(f"module 'fusedops.dsl.extra.cuda.libdevice' has no attribute {name!r}"
                         f"{missing_libdevice_hint(name)}")
