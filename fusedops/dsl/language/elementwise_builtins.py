"""The elementwise builtins: `dsl.where`, `minimum` / `maximum` / `clamp`, the math functions (`dsl.exp`,
`dsl.sqrt`, ...), `abs`, `sigmoid`, `fma`, `cdiv` and `cast` (the builtin machinery: core.py).
"""

from __future__ import annotations

from ..errors import CompilationError
from .core import builtin


@builtin
def where(condition, x, y, *, _semantic=None):
    """Elementwise `x if condition else y`; the three broadcast together, x and y promote."""
    return _semantic.where(condition, x, y)


@builtin
def minimum(x, y, *, _semantic=None):
    """Elementwise minimum of `x` and `y` (promoted, broadcast)."""
    return _semantic.binary("minimum", x, y)


@builtin
def maximum(x, y, *, _semantic=None):
    """Elementwise maximum of `x` and `y` (promoted, broadcast)."""
    return _semantic.binary("maximum", x, y)


@builtin
def clamp(x, min, max, *, _semantic=None):
    """Elementwise `minimum(maximum(x, min), max)` (promoted, broadcast; a NaN propagates, as in
    dsl.minimum / maximum and torch.clamp), Triton's `tl.clamp(x, min, max)`; min <= max is the caller's
    to ensure."""
    return _semantic.binary("minimum", _semantic.binary("maximum", x, min), max)


def _math(name: str, doc: str):
    def function(x, *, _semantic=None):
        return _semantic.unary(name, x)

    function.__name__ = function.__qualname__ = name
    function.__doc__ = (f"Elementwise {doc}. Integer inputs are computed in float32; float16 and "
                        "bfloat16 in float32, rounded back to the input dtype.")
    return builtin(function)


def _exponential(name: str, doc: str):
    def function(x, *, ftz=False, _semantic=None):
        return _semantic.unary(name, x, ftz=ftz)

    function.__name__ = function.__qualname__ = name
    function.__doc__ = (
        f"Elementwise {doc}, in float32 with `ex2.approx.f32` (PTX ISA: max relative error 2^-22 over the full "
        "range, plus the rounding of x * log2(e) for exp) and in float64 with libdevice. Integer inputs are "
        "computed in float32; float16 and bfloat16 in float32, rounded back to the input dtype.\n\n"
        "ftz (constexpr bool, default False): in float32, flush subnormal results (below 2^-126, float32's "
        "smallest normal) to +0, as `ex2.approx.ftz.f32` does (CUDA's `exp2f` under -ftz=true): one MUFU.EX2 "
        "instead of the subnormal-range fix-up around it (a compare and two multiplies per element in SASS). "
        "Where results that small cannot matter (softmax weights beside a row maximum of 1) this saves about "
        "10% of a flash attention kernel on the H200. float64 ignores it. Raises CompilationError if ftz is "
        "not a bool known at compile time.")
    return builtin(function)


exp = _exponential("exp", "e**x")
exp2 = _exponential("exp2", "2**x")
log = _math("log", "natural logarithm")
log2 = _math("log2", "base-2 logarithm")
sqrt = _math("sqrt", "square root (correctly rounded)")
rsqrt = _math("rsqrt", "1 / sqrt(x)")
sin = _math("sin", "sine")
cos = _math("cos", "cosine")
erf = _math("erf", "error function")
tanh = _math("tanh", "hyperbolic tangent")
floor = _math("floor", "round toward -inf")
ceil = _math("ceil", "round toward +inf")


@builtin
def abs(x, *, _semantic=None):
    """Elementwise absolute value, in x's dtype (unsigned and int1 values are returned as is)."""
    return _semantic.unary("abs", x)


@builtin
def sigmoid(x, *, _semantic=None):
    """Elementwise 1 / (1 + exp(-x)); integer and 16-bit float inputs are computed in float32."""
    return _semantic.sigmoid(x)


@builtin
def fma(x, y, z, *, _semantic=None):
    """Elementwise x * y + z with a single rounding, in the promoted floating dtype."""
    return _semantic.fma(x, y, z)


@builtin(host=True)
def cdiv(x, div, *, _semantic=None):
    """Ceiling division ceil(x / div) for positive div (and non-negative x for floats).

    In a kernel it is `x // div`, plus 1 where the remainder is positive: exact up to the type's maximum
    (the textbook `(x + div - 1) // div` wraps for x near it). Evaluated in Python when both are ints:
    constexprs in a kernel (the result is then a constexpr), or on the host, where `dsl.cdiv(n, BLOCK)`
    computes a grid size."""
    if _semantic is None or (isinstance(x, int) and isinstance(div, int)):
        if div == 0:
            raise CompilationError("cdiv by zero")
        return -(-x // div)
    quotient = _semantic.binary("floordiv", x, div)
    remainder = _semantic.binary("mod", x, div)
    return _semantic.where(_semantic.binary("gt", remainder, 0), _semantic.binary("add", quotient, 1), quotient)


@builtin
def cast(input, dtype, bitcast=False, *, _semantic=None):
    """`input` converted to element dtype `dtype` (value conversion; `bitcast=True` reinterprets
    the bits, which needs equal widths). Float to int truncates toward zero."""
    return _semantic.cast(input, dtype, bitcast)


__all__ = [
    "where", "minimum", "maximum", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "abs", "sin", "cos",
    "sigmoid", "erf", "tanh", "floor", "ceil", "fma", "cdiv", "cast", "clamp",
]
