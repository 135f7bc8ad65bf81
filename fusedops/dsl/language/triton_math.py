"""`dsl.math`: Triton's `tl.math` namespace, the DSL's builtins under Triton's names (`dsl.math.exp2(x)` is
`dsl.exp2(x)`). A name with no builtin here (libdevice's `pow`, `log1p`, ...) is an error that lists the names
there are (language/triton_names.py).
"""

from __future__ import annotations

from .elementwise_builtins import (abs, cdiv, ceil, clamp, cos, erf, exp, exp2, floor, fma, log, log2, maximum,
                                   minimum, rsqrt, sigmoid, sin, sqrt, tanh)
from .random import umulhi
from .triton_compat import div_rn, fdiv, sqrt_rn

__all__ = [
    "abs", "cdiv", "ceil", "clamp", "cos", "div_rn", "erf", "exp", "exp2", "fdiv", "floor", "fma", "log", "log2",
    "maximum", "minimum", "rsqrt", "sigmoid", "sin", "sqrt", "sqrt_rn", "tanh", "umulhi",
]


def __getattr__(name: str):
    """`dsl.math.<name>` of a name it does not have, on the host: the AttributeError lists those it has."""
    from .triton_names import missing_math_hint

    raise AttributeError(f"module 'fusedops.dsl.math' has no attribute {name!r}{missing_math_hint(name)}")
