"""Names of Triton's `triton.language` that `fusedops.dsl` does not have, with what to write instead: the
frontend adds the hint to its "module `fusedops.dsl` has no attribute ..." error (README, "Coming from Triton").
"""

from __future__ import annotations

_LIBDEVICE = "use dsl.extra.cuda.libdevice.<name> (Triton 3's tl.extra.cuda.libdevice), or dsl.math.<name>"
_NOT_HERE = "it is not in the language"

TRITON_ONLY = {
    "libdevice": _LIBDEVICE,
    **{name: f"use dsl.math.{name} or dsl.extra.cuda.libdevice.{name}" for name in (
        "log1p", "expm1", "pow", "isnan", "isinf", "atan2", "tan", "trunc", "round", "rint", "erfc", "log10")},
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

    return f" (Triton's tl.math.{name}: dsl.math has " + ", ".join(triton_math.__all__) + ")"


def missing_libdevice_hint(name: str) -> str:
    """What `dsl.extra.cuda.libdevice` has, for a libdevice function it does not have (erfinv, lgamma, j0, the
    rounding-mode variants such as div_rz, ...)."""
    from . import libdevice

    return (f" (Triton's libdevice.{name} is not in the language: dsl.extra.cuda.libdevice has "
            + ", ".join(libdevice.__all__) + ")")


def missing_name_hint(name: str) -> str:
    """What to write instead of Triton's `tl.<name>` ('' for a name Triton does not have either)."""
    hint = TRITON_ONLY.get(name)
    owner = "triton" if name == "heuristics" else "tl"     # (@triton.heuristics decorates on the host)
    return f" (Triton's {owner}.{name}: {hint})" if hint else ""
