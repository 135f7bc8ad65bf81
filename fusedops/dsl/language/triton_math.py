"""`dsl.math`: Triton's `tl.math` namespace, the DSL's builtins under Triton's names (`dsl.math.exp2(x)` is
`dsl.exp2(x)`), and libdevice's functions (`dsl.math.log1p`, `pow`, `atan2`, `isnan`, ...: language/libdevice.py,
also `dsl.extra.cuda.libdevice`), which Triton 2.x had in `tl.math` (Triton 3 moved them to
`tl.extra.cuda.libdevice`). `dsl.math.exp` stays the builtin (ex2.approx, as Triton's tl.math.exp); libdevice's
expf is `dsl.extra.cuda.libdevice.exp`. A name it does not have is an error that lists the names there are
(language/triton_names.py).
"""

from __future__ import annotations

from .elementwise_builtins import (abs, cdiv, ceil, clamp, cos, erf, exp, exp2, floor, fma, log, log2, maximum,
                                   minimum, rsqrt, sigmoid, sin, sqrt, tanh)
from .random import umulhi
from .triton_compat import div_rn, fdiv, sqrt_rn
from .libdevice import (acos, acosh, asin, asinh, atan, atan2, atanh, cbrt, copysign, cosh, erfc, exp10, expm1,
                        finitef, fmod, hypot, isfinite, isfinited, isinf, isnan, log10, log1p, nearbyint, pow, rint,
                        round, signbit, sinh, tan, trunc)

__all__ = [
    "abs", "cdiv", "ceil", "clamp", "cos", "div_rn", "erf", "exp", "exp2", "fdiv", "floor", "fma", "log", "log2",
    "maximum", "minimum", "rsqrt", "sigmoid", "sin", "sqrt", "sqrt_rn", "tanh", "umulhi",
    # libdevice's (language/libdevice.py's NEW_NAMES)
    "log1p", "expm1", "exp10", "log10", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
    "erfc", "cbrt", "trunc", "round", "rint", "nearbyint", "pow", "atan2", "hypot", "copysign", "fmod",
    "isnan", "isinf", "isfinite", "finitef", "isfinited", "signbit",
]


def __getattr__(name: str):
    """`dsl.math.<name>` of a name it does not have, on the host: the AttributeError lists those it has."""
    from .triton_names import missing_math_hint

    raise AttributeError(f"module 'fusedops.dsl.math' has no attribute {name!r}{missing_math_hint(name)}")
