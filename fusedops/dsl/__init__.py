"""The kernel language, imported as `import fusedops.dsl as dsl` (re-exports only).

Importing it loads neither LLVM nor CUDA nor torch: those are imported when a kernel is first
compiled or launched.
"""

from .errors import BackendError, CompilationError, FusedOpsError, InterpreterError, LaunchError, UnsupportedError
from .language.core import (abs, arange, argmax, argmin, atomic_add, atomic_and, atomic_cas, atomic_max,
                            atomic_min, atomic_or, atomic_xchg, atomic_xor, barrier, broadcast_to, cast, cdiv, ceil,
                            clamp, cluster_dims, cluster_sum,
                            constexpr, cos, cumsum, device_assert, device_print, dot, erf, exp, exp2,
                            expand_dims, floor, fma, full, launch_bounds, load, log, log2, max, max_contiguous, maximum, min,
                            minimum, multiple_of, num_programs, program_id, reshape, rsqrt, sigmoid, sin, sqrt,
                            static_assert, static_range, store, sum, tanh, trans, where, zeros)
from .language.descriptors import TensorDescriptor, make_tensor_descriptor
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
    "make_tensor_descriptor", "TensorDescriptor",
]
