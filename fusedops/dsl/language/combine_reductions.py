"""Reductions and scans with a user combine function: `dsl.reduce` and `dsl.associative_scan` (Triton's
`tl.reduce(input, axis, combine_fn, keep_dims=False)` and `tl.associative_scan(input, axis, combine_fn,
reverse=False)`).

`combine_fn` is a `@dsl.jit` function; for k input blocks (one block, or a tuple of k blocks of one shape that
are combined together, e.g. (value, index) for an argmax) it takes 2k arguments `a_0, ..., a_{k-1}, b_0, ...,
b_{k-1}` (the left operand's k values, then the right's) and returns k values (one value, or a tuple of k),
elementwise: it is inlined on blocks of the operands' shape (Triton traces it on scalars), so it chooses with
`dsl.where`, not with an `if` on its operands (a CompilationError at that line of combine_fn, as is any error
in its body). It must be associative; it need not be commutative: operands are always combined in their order
along the axis (left operand = lower indices).

Both are built from the block ops the language already has (no new IR), as a log-depth tree:

- reduce: the axis is moved last, and log2(N) times the elements are paired with their neighbour
  (`reshape(..., N/2, 2)` + `split`) and combined: ((x0 + x1) + (x2 + x3)) + ... -- the pairwise tree of a
  parallel reduction.
- scan: log2(N) levels of merging neighbouring scanned runs (lengths 1, 2, 4, ...): the right run's elements
  are combined with the left run's total (its last element, read with `split`s and broadcast), as in the
  recursive-doubling / divide-and-conquer prefix computation of Ladner & Fischer ("Parallel prefix
  computation", JACM 1980) and Blelloch ("Prefix sums and their applications", 1990); N/2 combines a level.

Since block dims are powers of two no padding is needed. Integer and bitwise combines are exact (the same bits as
the builtins: dsl.sum / max / min / xor_sum); floating-point sums associate in the tree order above, which
differs from the builtins' order in the last bits.
"""

from __future__ import annotations

import inspect

from ..errors import CompilationError
from ..runtime.jit import jit
from .block_builtins import VALUE_METHODS
from .core import builtin, constexpr, static_range
from .dtypes import BlockType, PointerType, shape_of
from .semantics import element_of
from .shape_ops import compile_time_flag, shown
from .triton_compat import _as_bits, join, split


# -- argument checks ----------------------------------------------------------------------------------------
def _unwrap(value):
    return value.value if isinstance(value, constexpr) else value


def _inputs(_semantic, input, what: str) -> tuple:
    """`input` (a block or a tuple of blocks) as a non-empty tuple of blocks of one shape."""
    input = _unwrap(input)
    values = tuple(input) if isinstance(input, (tuple, list)) else (input,)
    if not values:
        raise CompilationError(f"{what}: input must be a block or a tuple of blocks, got an empty tuple")
    for i, value in enumerate(values):
        name = "input" if len(values) == 1 and not isinstance(input, (tuple, list)) else f"input[{i}]"
        if not hasattr(value, "type"):
            raise CompilationError(f"{what}: {name} must be a block, got {shown(value)}")
        if not isinstance(value.type, BlockType):
            raise CompilationError(f"{what}: {name} must be a block, got a scalar of type {value.type}")
        if isinstance(element_of(value), PointerType):
            raise CompilationError(f"{what}: {name} must be a block of numbers, got pointers")
        if shape_of(value.type) != shape_of(values[0].type):
            raise CompilationError(f"{what}: the input blocks must have one shape, got {shape_of(values[0].type)} "
                                   f"and {shape_of(value.type)}")
    return values


def _check_combine_fn(combine_fn, count: int, what: str) -> None:
    """combine_fn must be a @dsl.jit function that takes 2 * count positional arguments."""
    combine_fn = _unwrap(combine_fn)
    if getattr(type(combine_fn), "__dsl_jit__", False) is not True:
        raise CompilationError(f"{what}: combine_fn must be a @dsl.jit function, got {shown(combine_fn)}")
    try:
        inspect.signature(combine_fn.fn).bind(*range(2 * count))
    except (TypeError, ValueError):
        raise CompilationError(f"{what}: combine_fn `{combine_fn.__name__}` must take {2 * count} arguments (the "
                               f"{count} left operand{'s' if count > 1 else ''}, then the {count} right "
                               f"one{'s' if count > 1 else ''}), one pair per input block") from None


def _axis(values: tuple, axis, what: str, allow_none: bool):
    axis = _unwrap(axis)
    rank = len(shape_of(values[0].type))
    if axis is None and allow_none:
        return None
    if isinstance(axis, bool) or not isinstance(axis, int):
        expected = "a constexpr int or None" if allow_none else "a constexpr int"
        raise CompilationError(f"{what}: axis must be {expected}, got {shown(axis)}")
    if not -rank <= axis < rank:
        raise CompilationError(f"{what}: axis {axis} is out of range for a block of shape {shape_of(values[0].type)}")
    return axis % rank


def _axis_last(_semantic, value, axis: int):
    rank = len(shape_of(value.type))
    if axis == rank - 1:
        return value
    order = tuple(d for d in range(rank) if d != axis) + (axis,)
    return _semantic.trans(value, *order)


def _levels(n: int) -> int:
    return n.bit_length() - 1


def _results(_semantic, results, like: tuple, what: str) -> tuple:
    """combine_fn's results as a tuple of len(like) values broadcast to the operands' shape, or CompilationError."""
    results = tuple(results) if isinstance(results, (tuple, list)) else (results,)
    if len(results) != len(like):
        raise CompilationError(f"{what}: combine_fn must return {len(like)} value{'s' if len(like) > 1 else ''} "
                               f"(one per input block), got {len(results)}")
    shape = shape_of(like[0].type)
    checked = []
    for i, value in enumerate(results):
        if isinstance(value, constexpr):
            value = value.value
        if not (hasattr(value, "type") or isinstance(value, (bool, int, float))):
            raise CompilationError(f"{what}: combine_fn's result {i} must be a kernel value, got {shown(value)}")
        value = _semantic.to_value(value, element_of(like[i]))
        if shape_of(value.type) != shape:
            try:
                value = _semantic.broadcast_to(value, shape)
            except CompilationError:
                raise CompilationError(f"{what}: combine_fn's result {i} has shape {shape_of(value.type)}, "
                                       f"expected the operands' shape {shape}") from None
        checked.append(value)
    return tuple(checked)


# -- exact data movement on any dtype (triton_compat's dsl.split / dsl.join and their bit view) ------------------
def _squeeze_last(_semantic, x):
    """x without its last dim (of size 1): a scalar for shape (1,)."""
    shape = shape_of(x.type)
    if len(shape) > 1:
        return _semantic.reshape(x, shape[:-1])
    bits, restore = _as_bits(_semantic, x, "reduce")
    return restore(_semantic.cast(_semantic.reduce(bits, 0, "sum"), element_of(bits)))


# -- reduce ---------------------------------------------------------------------------------------------------
@builtin
def _reduce_begin(input, axis, combine_fn, keep_dims, *, _semantic=None):
    """(the inputs with the reduced axis last (flattened for axis None), the number of pairing levels)."""
    values = _inputs(_semantic, input, "reduce")
    _check_combine_fn(combine_fn, len(values), "reduce")
    axis = _axis(values, axis, "reduce", allow_none=True)
    compile_time_flag(keep_dims, "reduce keep_dims")
    if axis is None:
        size = 1
        for d in shape_of(values[0].type):
            size *= d
        values = tuple(_semantic.reshape(v, (size,)) for v in values)
    else:
        values = tuple(_axis_last(_semantic, v, axis) for v in values)
    return values, _levels(shape_of(values[0].type)[-1])


@builtin
def _reduce_pairs(values, *, _semantic=None):
    """The left and right elements of each neighbouring pair along the last dim, as two tuples; the pair dim is
    dropped (a last dim of 2 gives the rest of the shape, scalars for shape (2,))."""
    shape = shape_of(values[0].type)
    left, right = [], []
    for v in values:
        if shape[-1] != 2:
            v = _semantic.reshape(v, shape[:-1] + (shape[-1] // 2, 2))
        a, b = split(v, _semantic=_semantic)
        left.append(a)
        right.append(b)
    return tuple(left), tuple(right)


@builtin
def _combined(results, like, what, *, _semantic=None):
    """combine_fn's results checked against its operands `like` (`_results`), as a tuple."""
    return _results(_semantic, results, like, what)


@builtin
def _reduce_end(values, input, axis, keep_dims, *, _semantic=None):
    """The reduced values in the input's form: one value or a tuple; keep_dims restores the axis with size 1."""
    single = not isinstance(_unwrap(input), (tuple, list))
    rank = len(shape_of(_inputs(_semantic, input, "reduce")[0].type))
    axis = _unwrap(axis)
    keep_dims = compile_time_flag(keep_dims, "reduce keep_dims")
    out = []
    for v in values:
        if isinstance(v.type, BlockType) and shape_of(v.type)[-1] == 1 and \
                len(shape_of(v.type)) == (1 if axis is None else rank):
            v = _squeeze_last(_semantic, v)        # a reduced axis of size 1 (no pairing level ran)
        if keep_dims:
            if axis is None:
                v = _semantic.broadcast_to(v, (1,) * rank)
            else:
                v = _semantic.expand_dims(v, axis % rank)
        out.append(v)
    return out[0] if single else tuple(out)


@jit
def reduce(input, axis, combine_fn, keep_dims=False):
    """Reduce `input` along `axis` with the associative `combine_fn` (Triton's `tl.reduce`).

    input: a block, or a tuple of blocks of one shape (any dtypes but pointers) reduced together.
    axis: a constexpr int (negative from the end), or None for all the elements (in row-major order).
    combine_fn: a `@dsl.jit` function of 2k arguments (a_0..a_{k-1}, b_0..b_{k-1}) returning k values
    (module docstring); associative; a non-commutative one sees its operands in index order.
    keep_dims: a constexpr bool: the reduced axis stays with size 1 (axis None: all dims, size 1 each).

    Returns a value (a tuple of k for a tuple input) of the input's shape without `axis` (a scalar for a 1-D block
    or axis None), with the dtypes combine_fn returns. The combine tree is pairwise (module docstring).

    Raises:
        CompilationError: input not a block or a tuple of blocks of one shape, pointers, combine_fn not a
            @dsl.jit function, combine_fn returning another number of values, axis not an int in range / None,
            keep_dims not a constexpr bool.
    """
    values, levels = _reduce_begin(input, axis, combine_fn, keep_dims)
    for _ in static_range(levels):
        left, right = _reduce_pairs(values)
        values = _combined(combine_fn(*left, *right), left, "reduce")
    return _reduce_end(values, input, axis, keep_dims)


# -- associative scan -------------------------------------------------------------------------------------------
@builtin
def _scan_begin(input, axis, combine_fn, reverse, *, _semantic=None):
    """(the inputs with the scanned axis last, split as (..., N, 1): N runs of length 1, the number of levels)."""
    values = _inputs(_semantic, input, "associative_scan")
    _check_combine_fn(combine_fn, len(values), "associative_scan")
    axis = _axis(values, axis, "associative_scan", allow_none=False)
    compile_time_flag(reverse, "associative_scan reverse")
    values = tuple(_axis_last(_semantic, v, axis) for v in values)
    shape = shape_of(values[0].type)
    return tuple(_semantic.reshape(v, shape + (1,)) for v in values), _levels(shape[-1])


def _end_of_runs(_semantic, x, last: bool):
    """The last (or first) element of each run along the last dim, kept as a dim of size 1, then broadcast back."""
    shape = shape_of(x.type)
    y = x
    while shape_of(y.type)[-1] > 1:
        s = shape_of(y.type)
        low, high = split(_semantic.reshape(y, s[:-1] + (s[-1] // 2, 2)), _semantic=_semantic)
        y = high if last else low
    return _semantic.broadcast_to(y, shape)


@builtin
def _scan_operands(values, reverse, *, _semantic=None):
    """Pair neighbouring runs (..., G, L) -> two (..., G/2, L): (carry operands, target operands, the other runs).
    Forward: carry = the left run's last element, target = the right run; reverse: carry = the right run's first
    element, target = the left run."""
    reverse = compile_time_flag(reverse, "associative_scan reverse")
    left, right = [], []
    for v in values:
        shape = shape_of(v.type)
        rest, g, length = shape[:-2], shape[-2], shape[-1]
        v = _semantic.reshape(v, rest + (g // 2, 2, length))
        v = _semantic.trans(v, *range(len(rest)), len(rest) + 0, len(rest) + 2, len(rest) + 1)
        a, b = split(v, _semantic=_semantic)
        left.append(a)
        right.append(b)
    if reverse:
        return tuple(_end_of_runs(_semantic, b, False) for b in right), tuple(left), tuple(right)
    return tuple(_end_of_runs(_semantic, a, True) for a in left), tuple(right), tuple(left)


@builtin
def _scan_merge(combined, others, reverse, *, _semantic=None):
    """The merged runs (..., G/2, 2L), the combined target in its place (right forward, left reverse)."""
    reverse = compile_time_flag(reverse, "associative_scan reverse")
    out = []
    for c, o in zip(combined, others):
        if element_of(c) != element_of(o):
            raise CompilationError(f"associative_scan: combine_fn must keep each block's dtype ({element_of(o)}), "
                                   f"got {element_of(c)}")
        joined = join(c, o, _semantic=_semantic) if reverse else join(o, c, _semantic=_semantic)
        shape = shape_of(joined.type)
        rest = shape[:-3]
        joined = _semantic.trans(joined, *range(len(rest)), len(rest), len(rest) + 2, len(rest) + 1)
        out.append(_semantic.reshape(joined, rest + (shape[-3], 2 * shape[-2])))
    return tuple(out)


@builtin
def _scan_end(values, input, axis, *, _semantic=None):
    """The scanned values in the input's layout and form (one value or a tuple)."""
    single = not isinstance(_unwrap(input), (tuple, list))
    rank = len(shape_of(values[0].type)) - 1
    axis = _unwrap(axis) % rank
    out = []
    for v in values:
        shape = shape_of(v.type)
        v = _semantic.reshape(v, shape[:-2] + (shape[-2] * shape[-1],))
        if axis != rank - 1:
            order = list(range(rank - 1))
            order.insert(axis, rank - 1)
            v = _semantic.trans(v, *order)
        out.append(v)
    return out[0] if single else tuple(out)


@jit
def associative_scan(input, axis, combine_fn, reverse=False):
    """Inclusive scan of `input` along `axis` with the associative `combine_fn` (Triton's `tl.associative_scan`).

    input: a block, or a tuple of blocks of one shape (any dtypes but pointers) scanned together.
    axis: a constexpr int (negative from the end).
    combine_fn: a `@dsl.jit` function of 2k arguments (a_0..a_{k-1}, b_0..b_{k-1}) returning k values of the
    inputs' dtypes (module docstring); associative, not necessarily commutative.
    reverse: a constexpr bool. False: result[i] = x[0] + x[1] + ... + x[i]; True: result[i] = x[N-1] + x[N-2] +
    ... + x[i] (the scan of the reversed sequence, reversed back: the later elements are the left operand, as
    jax.lax.associative_scan's reverse), where + is combine_fn and x the elements along `axis`.

    Returns a value (a tuple of k for a tuple input) of the input's shape and dtypes.

    Raises:
        CompilationError: input not a block or a tuple of blocks of one shape, pointers, combine_fn not a
            @dsl.jit function, combine_fn returning another number of values or another dtype, axis not an int
            in range, reverse not a constexpr bool.
    """
    values, levels = _scan_begin(input, axis, combine_fn, reverse)
    for _ in static_range(levels):
        carry, target, others = _scan_operands(values, reverse)
        combined = _combined(combine_fn(*carry, *target), target, "associative_scan")
        values = _scan_merge(combined, others, reverse)
    return _scan_end(values, input, axis)


# Triton's tensor member functions `x.reduce(axis, combine_fn)` / `x.associative_scan(axis, combine_fn)` (the
# frontend inlines a @dsl.jit method with the value as its first argument)
VALUE_METHODS.update({"reduce": reduce, "associative_scan": associative_scan})

__all__ = ["reduce", "associative_scan"]
