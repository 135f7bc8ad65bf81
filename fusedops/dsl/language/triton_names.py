"""Names of Triton's `triton.language` that `fusedops.dsl` does not have, with what to write instead: the
frontend adds the hint to its "module `fusedops.dsl` has no attribute ..." error (README, "Coming from Triton").
"""

from __future__ import annotations

_MATH = ("the math builtins are exp, exp2, log, log2, sqrt, rsqrt, sin, cos, sigmoid, erf, tanh, floor, ceil, fma "
         "and abs (dsl.<name> or dsl.math.<name>)")
_POW = "multiply, or use dsl.exp2(y * dsl.log2(x)) for x > 0 (there is no pow nor `**`)"
_NOT_HERE = "it is not in the language"

TRITON_ONLY = {
    "extra": _MATH, "libdevice": _MATH, "log1p": _MATH, "expm1": _MATH,
    "pow": _POW,
    "load_tensor_descriptor": "use desc.load(offsets) of a dsl.make_tensor_descriptor",
    "store_tensor_descriptor": "use desc.store(offsets, value) of a dsl.make_tensor_descriptor",
    "softmax": "write it out: dsl.exp(x - dsl.max(x, axis)) / dsl.sum(..., axis)",
    "heuristics": "compute the value on the host and pass it as a dsl.constexpr argument",
    "inline_asm_elementwise": _NOT_HERE, "dot_scaled": "fp8 and scaled dots are not in the language",
    "max_constancy": "use dsl.multiple_of / dsl.max_contiguous for what the compiler may assume of offsets",
    "map_elementwise": _NOT_HERE,
    "PropagateNan": "dsl.minimum / maximum / clamp always propagate NaN (PropagateNan.ALL): leave out propagate_nan=",
    "float8e4nv": "fp8 types are not in the language", "float8e5": "fp8 types are not in the language",
    "float8e4b15": "fp8 types are not in the language", "float8e4b8": "fp8 types are not in the language",
    "float8e5b16": "fp8 types are not in the language",
}


def missing_math_hint(name: str) -> str:
    """What `dsl.math` has, for `dsl.math.<name>` of a name it does not have (Triton's libdevice functions)."""
    from . import triton_math

    hint = _POW if name == "pow" else "dsl.math has " + ", ".join(triton_math.__all__)
    return f" (Triton's tl.math.{name}: {hint})"


def missing_name_hint(name: str) -> str:
    """What to write instead of Triton's `tl.<name>` ('' for a name Triton does not have either)."""
    hint = TRITON_ONLY.get(name)
    owner = "triton" if name == "heuristics" else "tl"     # (@triton.heuristics decorates on the host)
    return f" (Triton's {owner}.{name}: {hint})" if hint else ""
