"""Triton's smaller `triton.language` names, as thin layers over the DSL's own ops (README, "Coming from Triton"):
`dsl.range`, `debug_barrier`, `static_print`, `assume`, `zeros_like` / `full_like`, `ravel`, `view`, `permute`,
`broadcast`, `div_rn` / `fdiv` / `sqrt_rn`, `cumprod`, `xor_sum`, `flip`, `join` / `split` / `interleave` and
`swizzle2d`. Signatures and results are Triton 3.6's (its language reference); where this DSL differs, the
docstring says so.

`join`, `split`, `interleave` and `flip` move values exactly (every bit, NaN payloads and -0.0 included) without a
gather op: `join` is a `where` over a new size-2 dim; `split` and `flip` read the values as integers of their width
and use integer sums over size-2 dims (a + 0 = a; (a + b) - b = a in wrapping arithmetic), which the interpreter and
the compiled reductions give alike.
"""

from __future__ import annotations

import inspect

from ..errors import CompilationError
from ..ir import OpCode
from ..runtime.jit import jit
from .block_builtins import VALUE_METHODS
from .core import builtin, constexpr
from .dtypes import (BlockType, DType, PointerType, bfloat16, float32, int1, int8, int16, int32, int64, shape_of,
                     uint32)
from .elementwise_builtins import minimum
from .semantics import element_of
from .shape_ops import compile_time_bool, compile_time_flag, shown


def _value(_semantic, x, what: str):
    """`x` as an IR value (int / float literals typed as literals are), or CompilationError naming it."""
    if isinstance(x, constexpr):
        x = x.value
    if not (hasattr(x, "type") or (isinstance(x, (bool, int, float)))):
        raise CompilationError(f"{what} must be a kernel value (a block or a scalar), got {shown(x)}")
    return _semantic.to_value(x)


def _block(_semantic, x, what: str):
    x = _value(_semantic, x, what)
    if not isinstance(x.type, BlockType):
        raise CompilationError(f"{what} must be a block, got a scalar of type {x.type}")
    return x


# -- loops --------------------------------------------------------------------------------------------------
class range:
    """`for i in dsl.range(arg1, arg2=None, step=None, num_stages=None, loop_unroll_factor=None,
    disallow_acc_multi_buffer=False, flatten=False, warp_specialize=False, disable_licm=False)`: Triton's
    `tl.range`, a loop that stays a loop, exactly as Python's `range(arg1)` / `range(arg1, arg2[, step])` in a
    kernel (runtime or constexpr integer bounds; `step` None is 1).

    The compiler hints are checked (num_stages: None or a constexpr int >= 1; loop_unroll_factor: None or a
    constexpr int >= 0; the others constexpr bools) and otherwise ignored: this compiler software-pipelines the
    loads of a loop that feed a `dsl.dot` with the launch's `num_stages` (whatever the loop's), and does not unroll,
    flatten or warp-specialize loops on request. Use `dsl.static_range` for a loop unrolled at compile time.

    Raises (CompilationError): bounds that are not integers, a zero step, a bad hint, `dsl.range(...)` used other
    than as a `for` loop's iterable.
    """

    def __init__(self, arg1, arg2=None, step=None, num_stages=None, loop_unroll_factor=None,
                 disallow_acc_multi_buffer=False, flatten=False, warp_specialize=False, disable_licm=False):
        raise RuntimeError("dsl.range can only be iterated inside a @dsl.jit kernel")


def range_bounds(args: list, kwargs: dict) -> tuple:
    """(start, stop, step) of a `for` loop over `dsl.range(*args, **kwargs)` (values the frontend evaluated),
    after checking the arguments and the hints (range's docstring)."""
    try:
        bound = inspect.signature(range.__init__).bind(None, *args, **kwargs)
    except TypeError as e:
        raise CompilationError(f"bad arguments to dsl.range(): {e}") from None
    bound.apply_defaults()
    values = {k: (v.value if isinstance(v, constexpr) else v) for k, v in bound.arguments.items() if k != "self"}
    for name in ("num_stages", "loop_unroll_factor"):
        hint, least = values[name], 1 if name == "num_stages" else 0
        if hint is not None and (isinstance(hint, bool) or not isinstance(hint, int) or hint < least):
            raise CompilationError(f"dsl.range: {name} must be None or a constexpr int >= {least}, got {shown(hint)}")
    for name in ("disallow_acc_multi_buffer", "flatten", "warp_specialize", "disable_licm"):
        compile_time_bool(values[name], f"dsl.range: {name}")
    arg1, arg2, step = values["arg1"], values["arg2"], values["step"]
    start, stop = (0, arg1) if arg2 is None else (arg1, arg2)
    return start, stop, 1 if step is None else step


# -- program-level --------------------------------------------------------------------------------------------
@builtin
def debug_barrier(*, _semantic=None):
    """Triton's `tl.debug_barrier()`: `dsl.barrier()` (a `bar.sync` of the program's threads)."""
    return _semantic.barrier()


def _printed(value) -> str:
    if isinstance(value, constexpr):
        value = value.value
    if hasattr(value, "type") and not isinstance(value, (DType, PointerType)):
        return f"<runtime {value.type}>"          # a kernel value: only its type is known at compile time
    if isinstance(value, (tuple, list)):          # a tuple of kernel values: each item as above
        items = [_printed(v) for v in value]
        return f"({items[0]},)" if isinstance(value, tuple) and len(items) == 1 else \
            ("({})" if isinstance(value, tuple) else "[{}]").format(", ".join(items))
    return str(value)


@builtin
def static_print(*values, sep=" ", end="\n", file=None, flush=False, _semantic=None):
    """Print at compile time (Triton's `tl.static_print`), once per compilation of the kernel (a cached kernel
    prints nothing): constexprs and Python values as `print` shows them, kernel values as `<runtime TYPE>` (their
    values exist only when the kernel runs: `dsl.device_print` prints those). `sep`, `end`, `flush` as `print`'s;
    `file` must be None (standard output).

    Raises:
        CompilationError: `sep` / `end` not a str, `file` not None.
    """
    for name, text in (("sep", sep), ("end", end)):
        if not isinstance(text, str):
            raise CompilationError(f"static_print: {name} must be a str, got {shown(text)}")
    if file is not None:
        raise CompilationError("static_print: file must be None (it prints to standard output)")
    print(*(_printed(v) for v in values), sep=sep, end=end, flush=compile_time_flag(flush, "static_print: flush"))


@builtin
def assume(cond, *, _semantic=None):
    """Triton's `tl.assume(cond)`: a promise that `cond` holds. Accepted and checked, not used: this compiler
    derives nothing from it (`dsl.multiple_of` / `dsl.max_contiguous` are the hints it reads).

    cond: an int1 (bool) scalar or block, or a compile-time bool.

    Raises:
        CompilationError: cond is False at compile time, or not a boolean.
    """
    if isinstance(cond, bool):
        if not cond:
            raise CompilationError("assume: the condition is False at compile time")
        return None
    if not hasattr(cond, "type") or element_of(cond) != int1:
        got = element_of(cond) if hasattr(cond, "type") else shown(cond)
        raise CompilationError(f"assume: cond must be a boolean (an int1 scalar or block, e.g. `x > 0`), got {got}")
    return None


# -- creation and shapes ---------------------------------------------------------------------------------------
def _like(_semantic, input, value, dtype, what: str):
    x = _value(_semantic, input, f"{what}: input")
    if dtype is None:
        dtype = element_of(x)
    if not isinstance(dtype, DType):
        raise CompilationError(f"{what}: dtype must be a dsl dtype such as dsl.float32 (or None for the input's), "
                               f"got {shown(dtype) if not isinstance(dtype, PointerType) else dtype}")
    shape = shape_of(x.type)
    if not shape:
        return _semantic.cast(_semantic.to_value(value, dtype), dtype)
    return _semantic.full(shape, value, dtype)


@builtin
def zeros_like(input, dtype=None, *, _semantic=None):
    """A block of 0 with `input`'s shape and dtype (Triton's `tl.zeros_like`; a scalar input gives a scalar).
    `dtype` (an extension, as torch's): another element dtype.

    Raises:
        CompilationError: input not a kernel value, a pointer input without a number `dtype`.
    """
    return _like(_semantic, input, 0, dtype, "zeros_like")


@builtin
def full_like(input, value, dtype=None, *, _semantic=None):
    """A block of `value` (a number or a runtime scalar, converted as `dsl.full` converts it) with `input`'s shape
    and dtype, or `dtype` (torch's `full_like`; a scalar input gives a scalar).

    Raises:
        CompilationError: input not a kernel value, a block `value`, a pointer input without a number `dtype`.
    """
    return _like(_semantic, input, value, dtype, "full_like")


@builtin
def ravel(x, can_reorder=False, *, _semantic=None):
    """`x` as a 1-D block of its numel elements, in row-major order (Triton's `tl.ravel`). `can_reorder` (a
    constexpr bool) is accepted: the order is kept either way.

    Raises:
        CompilationError: x not a kernel value, can_reorder not a compile-time bool.
    """
    compile_time_bool(can_reorder, "ravel: can_reorder")
    x = _value(_semantic, x, "ravel: x")
    numel = x.type.numel if isinstance(x.type, BlockType) else 1
    return _semantic.reshape(x, (numel,))


@builtin
def view(input, *shape, _semantic=None):
    """`input` with `shape` (one tuple, or the sizes as separate arguments), Triton's `tl.view`: here the
    row-major `dsl.reshape`, which keeps the element order (Triton's view may reorder the elements).

    Raises:
        CompilationError: a shape of another number of elements, sizes that are not constexpr powers of two.
    """
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    return _semantic.reshape(_value(_semantic, input, "view: input"), tuple(shape))


@builtin
def permute(input, *dims, _semantic=None):
    """`input` with its dims reordered to `dims` (one tuple or separate ints; a permutation of range(rank)):
    Triton's `tl.permute`, `dsl.trans(input, *dims)` without trans's default of reversing the dims.

    Raises:
        CompilationError: no dims, or dims that are not a permutation of the block's.
    """
    if not dims:
        raise CompilationError("permute needs the new order of the dims (e.g. permute(x, (1, 0))); dsl.trans(x) "
                               "reverses them")
    return _semantic.trans(_value(_semantic, input, "permute: input"), *dims)


@builtin
def broadcast(input, other, *, _semantic=None):
    """Both blocks broadcast to their common shape (NumPy rules), Triton's `tl.broadcast`: returns the pair. The
    element types are kept (an int literal adopts the other's type).

    Raises:
        CompilationError: shapes that do not broadcast together.
    """
    a, b = _semantic._pair(input, other)
    return _semantic.broadcast_pair(a, b)


# -- rounding-explicit math -----------------------------------------------------------------------------------
def _float_pair(_semantic, x, y, what: str):
    a, b = _semantic._pair(x, y)
    for name, value in (("x", a), ("y", b)):
        element = element_of(value)
        if isinstance(element, PointerType) or not element.is_floating:
            raise CompilationError(f"{what}: {name} must be a floating-point scalar or block, got {element} "
                                   "(convert it with .to(dsl.float32))")
    return a, b


@builtin
def div_rn(x, y, *, _semantic=None):
    """x / y rounded to nearest even (Triton's `tl.div_rn`): the DSL's float `/`, which is the IEEE division
    (`div.rn`). x, y: floating scalars or blocks (promoted, broadcast).

    Raises:
        CompilationError: an operand that is not floating-point.
    """
    return _semantic.binary("truediv", *_float_pair(_semantic, x, y, "div_rn"))


@builtin
def fdiv(x, y, ieee_rounding=False, *, _semantic=None):
    """x / y (Triton's `tl.fdiv`). Here always the IEEE division, correctly rounded (Triton's default,
    ieee_rounding=False, is a faster division within 2 ulps). ieee_rounding: a constexpr bool.

    Raises:
        CompilationError: an operand that is not floating-point, ieee_rounding not a compile-time bool.
    """
    compile_time_bool(ieee_rounding, "fdiv: ieee_rounding")
    return _semantic.binary("truediv", *_float_pair(_semantic, x, y, "fdiv"))


@builtin
def sqrt_rn(x, *, _semantic=None):
    """The square root rounded to nearest even (Triton's `tl.sqrt_rn`): `dsl.sqrt`, which is IEEE `sqrt.rn`
    (float16 / bfloat16 in float32, rounded back). x: a floating scalar or block.

    Raises:
        CompilationError: x not floating-point.
    """
    x = _value(_semantic, x, "sqrt_rn: x")
    if isinstance(element_of(x), PointerType) or not element_of(x).is_floating:
        raise CompilationError(f"sqrt_rn: x must be a floating-point scalar or block, got {element_of(x)}")
    return _semantic.unary("sqrt", x)


# -- scans and reductions -------------------------------------------------------------------------------------
def _integer_compute_type(element):
    """The 32-bit type narrow integers (int1 / 8 / 16) are combined in; wider ones as they are."""
    if element.bits >= 32:
        return element
    return uint32 if element.kind == "uint" else int32


@builtin
def cumprod(input, axis=0, reverse=False, *, _semantic=None):
    """Inclusive prefix product along `axis` (from the end when `reverse`), Triton's `tl.cumprod`.

    Integers multiply with wrap-around in their type (int1: a running logical and); float32 / float64 in their
    type, float16 / bfloat16 in float32. The result has the input's dtype, but float32 for bfloat16 (as Triton,
    which promotes bfloat16); a float16 product is rounded to float16 once (Triton rounds each step). Float products
    are associated differently in the interpreter (left to right) and the compiled scan (Hillis-Steele, as
    cumsum's), so they agree within float rounding, not bitwise.

    Raises:
        CompilationError: a scalar or a pointer block, a bad axis, reverse not a compile-time bool.
    """
    x = _block(_semantic, input, "cumprod: input")
    element = element_of(x)
    if isinstance(element, PointerType):
        raise CompilationError("cumprod: input must be a block of numbers, got pointers")
    axis = _semantic._axis(x, axis, "cumprod")
    reverse = compile_time_flag(reverse, "cumprod reverse")
    if element.is_floating:
        compute, result = (float32, float32 if element == bfloat16 else element) if element.bits == 16 \
            else (element, element)
    else:
        compute, result = _integer_compute_type(element), element
    x = _semantic.cast(x, compute)
    scanned = _semantic.builder.value(OpCode.SCAN, [x], x.type, kind="prod", axis=axis, reverse=reverse)
    return _semantic.cast(scanned, result)


@builtin
def xor_sum(input, axis=None, keep_dims=False, *, _semantic=None):
    """Bitwise xor of the elements along `axis` (all axes when None), Triton's `tl.xor_sum`; the input's integer
    dtype (int1: the parity). keep_dims: a constexpr bool, the reduced axis kept with size 1.

    Raises:
        CompilationError: a scalar, a float or pointer block, a bad axis.
    """
    x = _block(_semantic, input, "xor_sum: input")
    element = element_of(x)
    if isinstance(element, PointerType) or not element.is_integer:
        raise CompilationError(f"xor_sum: input must be a block of integers, got {element}")
    reduced = _semantic.reduce(_semantic.cast(x, _integer_compute_type(element)), axis, "xor", keep_dims)
    return _semantic.cast(reduced, element)


# -- exact data movement ---------------------------------------------------------------------------------------
def _as_bits(_semantic, x, what: str):
    """(x's values as integers of their width, a function taking such integers back to x's dtype)."""
    element = element_of(x)
    if isinstance(element, PointerType):
        raise CompilationError(f"{what}: blocks of pointers are not supported (move the offsets, then add them to "
                               "the base pointer)")
    if element == int1:
        return _semantic.cast(x, int8), lambda v: _semantic.cast(v, int1)
    if element.is_floating:
        integer = {16: int16, 32: int32, 64: int64}[element.bits]
        return (_semantic.cast(x, integer, True),
                lambda v: _semantic.cast(_semantic.cast(v, integer), element, True))
    return x, lambda v: _semantic.cast(v, element)


def _swap_halves(_semantic, bits, dim: int, size: int):
    """Along `dim` (length n), swap each pair of neighbouring runs of `size` elements: reshaped to
    (..., n / (2 size), 2, size, ...), y = (sum over the 2) - x in the integers' wrapping arithmetic."""
    shape = shape_of(bits.type)
    split = shape[:dim] + (shape[dim] // (2 * size), 2, size) + shape[dim + 1:]
    y = _semantic.reshape(bits, split)
    total = _semantic.reduce(y, dim + 1, "sum", True)
    y = _semantic.cast(_semantic.binary("sub", total, y), element_of(bits))
    return _semantic.reshape(y, shape)


@builtin
def flip(x, dim=None, *, _semantic=None):
    """`x` reversed along `dim` (default: the last dim), Triton's `tl.flip` (whose docs allow only the last dim;
    any dim here, negative from the end). Exact: the same bits, any dtype but pointers.

    Raises:
        CompilationError: a scalar, a pointer block, dim not a constexpr int in range.
    """
    x = _block(_semantic, x, "flip: x")
    shape = shape_of(x.type)
    dim = len(shape) - 1 if dim is None else dim
    if isinstance(dim, bool) or not isinstance(dim, int) or not -len(shape) <= dim < len(shape):
        raise CompilationError(f"flip: dim must be a constexpr int in range for a block of shape {shape}, "
                               f"got {shown(dim)}")
    dim %= len(shape)
    if shape[dim] == 1:
        return x
    bits, restore = _as_bits(_semantic, x, "flip")
    size = shape[dim] // 2
    while size >= 1:             # halves, then quarters within them, ...: every index bit complemented
        bits = _swap_halves(_semantic, bits, dim, size)
        size //= 2
    return restore(bits)


def _selector(_semantic, rank: int):
    """The int1 block of shape (1, ..., 1, 2) (rank dims, at least one) that is true at index 0 of the last."""
    first = _semantic.binary("eq", _semantic.arange(0, 2), 0)
    return _semantic.reshape(first, (1,) * (rank - 1) + (2,))


@builtin
def join(a, b, *, _semantic=None):
    """The two values stacked along a new last dim of size 2: result[..., 0] = a, result[..., 1] = b (Triton's
    `tl.join`). a and b are broadcast together (two scalars give a block of shape (2,)) and their element types
    promoted as `dsl.where` promotes them. The inverse of `split`.
    """
    a, b = _semantic._pair(a, b)
    a, b = _semantic.broadcast_pair(a, b)
    shape = shape_of(a.type) + (1,)
    a, b = _semantic.reshape(a, shape), _semantic.reshape(b, shape)
    return _semantic.where(_selector(_semantic, len(shape)), a, b)


@builtin
def split(a, *, _semantic=None):
    """The two halves of a block whose last dim is 2: (a[..., 0], a[..., 1]), each of shape a.shape[:-1] (two
    scalars for shape (2,)), Triton's `tl.split`, the inverse of `join`. Exact, any dtype but pointers.

    Raises:
        CompilationError: a scalar, a last dim other than 2, a pointer block.
    """
    x = _block(_semantic, a, "split: a")
    shape = shape_of(x.type)
    if shape[-1] != 2:
        raise CompilationError(f"split: a must be a block whose last dim is 2, got shape {shape}")
    bits, restore = _as_bits(_semantic, x, "split")
    first = _selector(_semantic, len(shape))
    axis = len(shape) - 1
    low = _semantic.reduce(_semantic.where(first, bits, 0), axis, "sum")
    high = _semantic.reduce(_semantic.where(first, 0, bits), axis, "sum")
    return restore(low), restore(high)


@builtin
def interleave(a, b, *, _semantic=None):
    """a and b interleaved along their last dim: (a0, b0, a1, b1, ...), Triton's `tl.interleave`: `join(a, b)`
    reshaped to a.shape[:-1] + (2 * a.shape[-1],) (two scalars give a block of shape (2,))."""
    joined = join(a, b, _semantic=_semantic)
    shape = shape_of(joined.type)
    if len(shape) == 1:
        return joined
    return _semantic.reshape(joined, shape[:-2] + (2 * shape[-2],))


# -- program ordering -----------------------------------------------------------------------------------------
@builtin
def _swizzle_arguments(i, j, size_i, size_j, size_g, *, _semantic=None):
    for name, value in (("i", i), ("j", j), ("size_i", size_i), ("size_j", size_j), ("size_g", size_g)):
        if isinstance(value, bool) or not (isinstance(value, int) or hasattr(value, "type")):
            raise CompilationError(f"swizzle2d: {name} must be an integer scalar or block, got {shown(value)}")
        if hasattr(value, "type"):
            element = element_of(value)
            if isinstance(element, PointerType) or not element.is_integer or element.is_bool:
                raise CompilationError(f"swizzle2d: {name} must be an integer scalar or block, got {element}")
        elif name.startswith("size") and value < 1:
            raise CompilationError(f"swizzle2d: {name} must be >= 1, got {value}")


@jit
def swizzle2d(i, j, size_i, size_j, size_g):
    """Triton's `tl.swizzle2d`: the position (i, j) of a row-major size_i x size_j grid moved to the grouped
    column-major order of the matmul tutorial ("L2 cache optimizations"): the row-major rank r = i * size_j + j
    walks down columns of size_g rows (fewer in the last group when size_g does not divide size_i): group
    g = r // (size_g * size_j) starts at row g * size_g and holds rows = min(size_i - g * size_g, size_g) of
    them; the rank within it, q = r % (size_g * size_j), goes to row g * size_g + q % rows, column q // rows.
    Returns (new_i, new_j), integer scalars or blocks of i's and j's broadcast shape; a bijection of the grid
    for 0 <= i < size_i, 0 <= j < size_j (other positions are undefined).

    Raises:
        CompilationError: arguments that are not integers, a size literal below 1.
    """
    _swizzle_arguments(i, j, size_i, size_j, size_g)
    rank = i * size_j + j
    group_size = size_g * size_j
    first_row = (rank // group_size) * size_g
    rows = minimum(size_i - first_row, size_g)
    within = rank % group_size
    return first_row + within % rows, within // rows


# Triton's tensor member functions among these (`x.flip()`, `x.split()`, `x.cumprod(0)`, ...): block values'
# methods, beside block_builtins.py's own
VALUE_METHODS.update({f.__name__: f for f in (flip, ravel, view, permute, split, join, interleave, cumprod, xor_sum)})

__all__ = [
    "range", "debug_barrier", "static_print", "assume", "zeros_like", "full_like", "ravel", "view", "permute",
    "broadcast", "div_rn", "fdiv", "sqrt_rn", "cumprod", "xor_sum", "flip", "join", "split", "interleave",
    "swizzle2d",
]
