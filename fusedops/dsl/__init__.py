"""The kernel language, imported as `import fusedops.dsl as dsl` (re-exports only).

Importing it loads neither LLVM nor CUDA nor torch: those are imported when a kernel is first
compiled or launched.
"""

from .errors import BackendError, CompilationError, FusedOpsError, InterpreterError, LaunchError, UnsupportedError
from .language.block_builtins import (arange, argmax, argmin, broadcast_to, cumsum, dot, expand_dims, full, max,
                                      max_contiguous, min, multiple_of, reshape, sum, trans, zeros)
from .language.core import constexpr, static_range
from .language.elementwise_builtins import (abs, cast, cdiv, ceil, clamp, cos, erf, exp, exp2, floor, fma, log, log2,
                                            maximum, minimum, rsqrt, sigmoid, sin, sqrt, tanh, where)
from .language.memory_builtins import (atomic_add, atomic_and, atomic_cas, atomic_max, atomic_min, atomic_or,
                                       atomic_xchg, atomic_xor, load, store)
from .language.program_builtins import (barrier, cluster_dims, cluster_sum, device_assert, device_print, launch_bounds,
                                        num_programs, program_id, static_assert)
from .language.descriptors import TensorDescriptor, make_tensor_descriptor
from .language.block_pointers import BlockPointer, advance, make_block_ptr
from .language.random import (pair_uniform_to_normal, philox, philox_impl, rand, rand4x, randint, randint4x, randn,
                              randn4x, uint_to_uniform_float, umulhi)
from .language.sorting import sort, topk
from .language.gather_ops import cat, gather, histogram
from .language.combine_reductions import associative_scan, reduce
from .language.triton_compat import (assume, broadcast, cumprod, debug_barrier, div_rn, fdiv, flip, full_like,
                                     interleave, join, permute, range, ravel, split, sqrt_rn, static_print, swizzle2d,
                                     view, xor_sum, zeros_like)
from .language import triton_math as math
import sys as _sys
_sys.modules.setdefault(__name__ + ".math", math)   # `from fusedops.dsl.math import ...`, as triton.language.math
from . import extra          # dsl.extra.cuda.libdevice / dsl.extra.libdevice, as triton.language.extra's
from .language.dtypes import (BlockType, DType, PointerType, bfloat16, float16, float32, float64, int1, int8,
                              int16, int32, int64, pointer_type, uint8, uint16, uint32, uint64)
from .runtime.autotune import Autotuner, Config, autotune
from .runtime.jit import JITFunction, jit

__all__ = [
    "jit", "JITFunction", "constexpr", "static_range", "autotune", "Autotuner", "Config",
    "FusedOpsError", "CompilationError", "UnsupportedError", "LaunchError", "InterpreterError", "BackendError",
    "DType", "PointerType", "BlockType", "pointer_type",
    "int1", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64",
    "program_id", "num_programs", "arange", "zeros", "full", "load", "store", "where", "minimum", "maximum",
    "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "abs", "sin", "cos", "sigmoid", "erf", "tanh", "floor",
    "ceil", "fma", "cdiv", "cast", "clamp", "sum", "max", "min", "argmax", "argmin", "cumsum", "dot",
    "atomic_add", "atomic_max", "atomic_min", "atomic_and", "atomic_or", "atomic_xor", "atomic_xchg",
    "atomic_cas", "reshape", "trans", "broadcast_to", "expand_dims", "multiple_of", "max_contiguous",
    "device_print", "device_assert", "static_assert", "launch_bounds", "cluster_dims", "cluster_sum", "barrier",
    "make_tensor_descriptor", "TensorDescriptor", "make_block_ptr", "advance", "BlockPointer",
    "umulhi", "philox", "philox_impl", "randint", "randint4x", "rand", "rand4x", "randn", "randn4x",
    "uint_to_uniform_float", "pair_uniform_to_normal",
    # (dsl.range and dsl.math are left out: a star import would hide Python's range and math module)
    "debug_barrier", "static_print", "assume", "zeros_like", "full_like", "ravel", "view", "permute",
    "broadcast", "div_rn", "fdiv", "sqrt_rn", "cumprod", "xor_sum", "flip", "join", "split", "interleave",
    "swizzle2d", "sort", "topk", "gather", "histogram", "cat",
    "reduce", "associative_scan",
]


def __getattr__(name: str):
    """`dsl.<name>` of a Triton name the language does not have (`@dsl.heuristics`, written on the host): the
    AttributeError says what to use instead, as the kernel frontend's error does (README, "Coming from Triton")."""
    from .language.triton_names import missing_name_hint

    raise AttributeError(f"module 'fusedops.dsl' has no attribute {name!r}{missing_name_hint(name)}")
