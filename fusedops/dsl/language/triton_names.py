"""Names of Triton's `triton.language` that `fusedops.dsl` does not have, with what to write instead: the
frontend adds the hint to its "module `fusedops.dsl` has no attribute ..." error (README, "Coming from Triton").
"""

from __future__ import annotations

_MATH = ("the math builtins are exp, exp2, log, log2, sqrt, rsqrt, sin, cos, sigmoid, erf, tanh, floor, ceil, fma "
         "and abs (dsl.<name>)")
_SCANS = ("the reductions and scans are dsl.sum / max / min / argmax / argmin and dsl.cumsum (there is no custom "
          "combine_fn)")
_NOT_HERE = "it is not in the language"

TRITON_ONLY = {
    "range": "use Python's range (loops that feed a dsl.dot are pipelined with the launch's num_stages)",
    "debug_barrier": "use dsl.barrier()",
    "static_print": "use print(...) or dsl.device_print(...)",
    "math": _MATH, "extra": _MATH, "libdevice": _MATH, "log1p": _MATH, "expm1": _MATH,
    "pow": "multiply, or use dsl.exp2(y * dsl.log2(x)) for x > 0",
    "sqrt_rn": "use dsl.sqrt (correctly rounded)", "div_rn": "use / (a float / is the IEEE division)",
    "fdiv": "use / (a float / is the IEEE division)",
    "load_tensor_descriptor": "use desc.load(offsets) of a dsl.make_tensor_descriptor",
    "store_tensor_descriptor": "use desc.store(offsets, value) of a dsl.make_tensor_descriptor",
    "permute": "use dsl.trans(x, *dims)",
    "broadcast": "use dsl.broadcast_to(x, shape) (operators broadcast their operands)",
    "view": "use dsl.reshape (it keeps the element order)",
    "ravel": "use dsl.reshape(x, (N,)) with N the number of elements",
    "zeros_like": "use dsl.zeros(x.shape, x.dtype)",
    "full_like": "use dsl.full(x.shape, value, x.dtype)",
    "associative_scan": _SCANS, "reduce": _SCANS, "cumprod": _SCANS, "xor_sum": _SCANS,
    "histogram": "count with dsl.atomic_add(hist_ptr + bins, 1, mask=...)",
    "softmax": "write it out: dsl.exp(x - dsl.max(x, axis)) / dsl.sum(..., axis)",
    "sort": _NOT_HERE, "flip": _NOT_HERE, "topk": _NOT_HERE, "gather": _NOT_HERE, "cat": _NOT_HERE,
    "join": _NOT_HERE, "split": _NOT_HERE, "interleave": _NOT_HERE,
    "swizzle2d": ("write the grouped ordering out, as Triton's matmul tutorial does: group_id = pid // "
                  "num_pid_in_group, pid_m = group_id * GROUP_SIZE_M + (pid % num_pid_in_group) % group_size_m, "
                  "pid_n = (pid % num_pid_in_group) // group_size_m"),
    "heuristics": "compute the value on the host and pass it as a dsl.constexpr argument",
    "inline_asm_elementwise": _NOT_HERE, "dot_scaled": "fp8 and scaled dots are not in the language",
    "assume": "use dsl.multiple_of / dsl.max_contiguous for what the compiler may assume of offsets",
    "max_constancy": "use dsl.multiple_of / dsl.max_contiguous for what the compiler may assume of offsets",
    "map_elementwise": _NOT_HERE,
    "PropagateNan": "dsl.minimum / maximum / clamp always propagate NaN (PropagateNan.ALL): leave out propagate_nan=",
    "float8e4nv": "fp8 types are not in the language", "float8e5": "fp8 types are not in the language",
    "float8e4b15": "fp8 types are not in the language", "float8e4b8": "fp8 types are not in the language",
    "float8e5b16": "fp8 types are not in the language",
}


def missing_name_hint(name: str) -> str:
    """What to write instead of Triton's `tl.<name>` ('' for a name Triton does not have either)."""
    hint = TRITON_ONLY.get(name)
    owner = "triton" if name == "heuristics" else "tl"     # (@triton.heuristics decorates on the host)
    return f" (Triton's {owner}.{name}: {hint})" if hint else ""
