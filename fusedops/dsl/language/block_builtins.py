"""The builtins that make, reshape and reduce blocks: `dsl.arange` / `zeros` / `full`, the shape builtins, the
reductions and scans, `dsl.dot`, and the methods of block values (`x.to(...)`, `x.sum()`, ...) (the builtin
machinery: core.py).
"""

from __future__ import annotations

from ..errors import CompilationError
from . import elementwise_builtins as _elementwise
from .core import builtin, constexpr
from .shape_ops import compile_time_bool, shown


# -- block creation -----------------------------------------------------------------------------------
@builtin
def arange(start, end, *, _semantic=None):
    """The int32 block [start, ..., end - 1]; constexpr bounds, end - start a power of two."""
    return _semantic.arange(start, end)


@builtin
def zeros(shape, dtype, *, _semantic=None):
    """A block of `shape` (a tuple of constexpr powers of two) filled with 0 of `dtype`."""
    return _semantic.full(shape, 0, dtype)


@builtin
def full(shape, value, dtype, *, _semantic=None):
    """A block of `shape` filled with the scalar `value` (literal or runtime), converted to `dtype`."""
    return _semantic.full(shape, value, dtype)


# -- reductions and scans ----------------------------------------------------------------------------
@builtin
def sum(input, axis=None, keep_dims=False, dtype=None, *, _semantic=None):
    """Sum of a block along `axis` (all axes when None). int1/8/16 accumulate in int32 (uint8/16 in uint32),
    float16 and bfloat16 in float32; the result has that accumulation dtype. `dtype` (a dsl number dtype, as
    Triton's `tl.sum(..., dtype=)`): `input` is converted to it first and the result is of it (the sum
    accumulated as that dtype's is, then converted)."""
    return _semantic.reduce(input, axis, "sum", keep_dims, dtype)


def _extreme(kind: str, input, axis, keep_dims, return_indices, tie_break_left, _semantic):
    # Triton's keyword arguments: `return_indices` adds the arg-extreme (the first index on ties, which every
    # `return_indices_tie_break_left` / `tie_break_left` allows: False only lets Triton pick any)
    compile_time_bool(tie_break_left, f"{kind}: tie_break_left")
    value = _semantic.reduce(input, axis, kind, keep_dims)
    if not compile_time_bool(return_indices, f"{kind}: return_indices"):
        return value
    return value, _semantic.argreduce(input, axis, f"arg{kind}", keep_dims)


@builtin
def max(input, axis=None, keep_dims=False, *, return_indices=False, return_indices_tie_break_left=True,
        _semantic=None):
    """Maximum of a block along `axis` (all axes when None), in the input dtype. `return_indices=True`
    (keyword, as Triton's): the pair (maximum, argmax), the index the first on ties (with either
    `return_indices_tie_break_left`). Note `keep_dims` is the third positional argument here (Triton's is
    `return_indices`)."""
    return _extreme("max", input, axis, keep_dims, return_indices, return_indices_tie_break_left, _semantic)


@builtin
def min(input, axis=None, keep_dims=False, *, return_indices=False, return_indices_tie_break_left=True,
        _semantic=None):
    """Minimum of a block along `axis` (all axes when None), in the input dtype; `return_indices` as for
    `max`."""
    return _extreme("min", input, axis, keep_dims, return_indices, return_indices_tie_break_left, _semantic)


@builtin
def argmax(input, axis, keep_dims=False, *, tie_break_left=True, _semantic=None):
    """int32 index of the maximum along `axis` (the first one on ties; `tie_break_left`, Triton's keyword,
    may be True or False: False lets Triton return any of the tied indices)."""
    compile_time_bool(tie_break_left, "argmax: tie_break_left")
    return _semantic.argreduce(input, axis, "argmax", keep_dims)


@builtin
def argmin(input, axis, keep_dims=False, *, tie_break_left=True, _semantic=None):
    """int32 index of the minimum along `axis` (the first one on ties; `tie_break_left` as for argmax)."""
    compile_time_bool(tie_break_left, "argmin: tie_break_left")
    return _semantic.argreduce(input, axis, "argmin", keep_dims)


@builtin
def cumsum(input, axis=0, reverse=False, dtype=None, *, _semantic=None):
    """Inclusive prefix sum along `axis` (from the end when `reverse`), accumulated as `sum` does; `dtype` as
    for `sum`."""
    return _semantic.cumsum(input, axis, reverse, dtype)


@builtin
def dot(a, b, acc=None, input_precision=None, allow_tf32=None, max_num_imprecise_acc=None, out_dtype=None, *,
        _semantic=None):
    """Matrix product a (M x K) @ b (K x N) + acc (M x N); M, N, K powers of two. The arguments are Triton's
    `tl.dot(input, other, acc, input_precision, allow_tf32, max_num_imprecise_acc, out_dtype)`.

    a and b share a dtype: float16/bfloat16/float32 accumulate in float32, float64 in float64, int8
    in int32. input_precision: "ieee" (default: exact float32 multiply-adds on the CUDA cores) or "tf32"
    (float32 inputs rounded to tf32, 10 mantissa bits, to nearest with ties away, and multiplied on the
    tensor cores with float32 accumulation: mma.sync m16n8k8 .tf32 on sm_80+ for M >= 16, N >= 8, K >= 8,
    codegen/mma_tf32.py; smaller blocks round the same way on the CUDA cores). Other values (Triton's
    "tf32x3") raise CompilationError. allow_tf32 (Triton's older flag, a constexpr bool): True is
    input_precision="tf32", False "ieee"; not both. max_num_imprecise_acc: None or a constexpr int >= 0,
    accepted and ignored (Triton uses it for fp8 dots only, which this DSL has not). out_dtype: None or
    the accumulation dtype above.
    """
    if allow_tf32 is not None:
        if input_precision is not None:
            raise CompilationError("dot: give input_precision or allow_tf32, not both (allow_tf32=True is "
                                   "input_precision=\"tf32\")")
        input_precision = "tf32" if compile_time_bool(allow_tf32, "dot: allow_tf32") else "ieee"
    limit = max_num_imprecise_acc.value if isinstance(max_num_imprecise_acc, constexpr) else max_num_imprecise_acc
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise CompilationError(f"dot: max_num_imprecise_acc must be None or a constexpr int >= 0, got {shown(limit)}")
    return _semantic.dot(a, b, acc, input_precision, out_dtype)


# -- shapes -------------------------------------------------------------------------------------------
@builtin
def reshape(input, *shape, _semantic=None):
    """Row-major reshape of a block to `shape` (same number of elements): one tuple, or the sizes as separate
    arguments, as Triton takes them (`dsl.reshape(x, (M, N))` or `dsl.reshape(x, M, N)`)."""
    return _semantic.reshape(input, _shape_argument(shape))


@builtin
def trans(input, *dims, _semantic=None):
    """Permute the dims of a block (`dims` a permutation); with none, reverse them."""
    return _semantic.trans(input, *dims)


@builtin
def broadcast_to(input, *shape, _semantic=None):
    """`input` stretched to `shape` by NumPy broadcasting (scalars are splatted): one tuple, or the sizes as
    separate arguments (as reshape)."""
    return _semantic.broadcast_to(input, _shape_argument(shape))


def _shape_argument(sizes: tuple):
    # reshape's / broadcast_to's shape: a single tuple or list stands for itself, else the separate sizes
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        return sizes[0]
    return sizes


@builtin
def expand_dims(input, axis, *, _semantic=None):
    """`input` with a new size-1 dim at `axis` (negative counts from the end)."""
    return _semantic.expand_dims(input, axis)


@builtin
def multiple_of(input, values, *, _semantic=None):
    """Promise the compiler that `input`'s values are multiples of `values` (one int per dim)."""
    return _semantic.multiple_of(input, values)


@builtin
def max_contiguous(input, values, *, _semantic=None):
    """Promise the compiler that `input` holds runs of `values` consecutive integers (one per dim)."""
    return _semantic.max_contiguous(input, values)


# Methods of block values (`x.to(dsl.float32)`, `x.reshape(...)`, ...): name -> builtin taking x first.
@builtin
def _to(input, dtype, bitcast=False, *, _semantic=None):
    return _semantic.cast(input, dtype, bitcast)


VALUE_METHODS = {
    "to": _to, "reshape": reshape, "trans": trans, "broadcast_to": broadcast_to,
    "expand_dims": expand_dims, "sum": sum, "max": max, "min": min, "argmax": argmax,
    "argmin": argmin, "cumsum": cumsum,
    # Triton's tensor member functions that are dsl builtins too (`x.exp()`, `x.abs()`, `x.cast(dtype)`, ...)
    **{name: getattr(_elementwise, name) for name in (
        "cast", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "erf", "floor", "ceil", "abs",
        "sigmoid", "cdiv")},
}

__all__ = [
    "arange", "zeros", "full", "sum", "max", "min", "argmax", "argmin", "cumsum", "dot", "reshape", "trans",
    "broadcast_to", "expand_dims", "multiple_of", "max_contiguous",
]
