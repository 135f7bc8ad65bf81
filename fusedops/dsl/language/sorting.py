"""`dsl.sort` and `dsl.topk`, Triton's `tl.sort` / `tl.topk`, as a bitonic sorting network (K. E. Batcher,
"Sorting networks and their applications", AFIPS Spring Joint Computer Conference 1968) built from the DSL's
own block ops, so the interpreter and the compiled kernel run the same IR (README, "Coming from Triton").

The values are first mapped to signed integer keys of their width whose order is the sort order (floats: the
IEEE-754 total order with -0.0 < +0.0 and every NaN above +inf; unsigned ints: the sign bit flipped; int1: int8),
sorted as integers, and mapped back exactly. One compare-and-exchange step of the network pairs element i with
element i ^ s along the sorted dim: the partner is read by swapping neighbouring runs of s elements
(triton_compat's `_swap_halves`: integer sums over a size-2 dim, exact in wrapping arithmetic), and element i keeps
min(key, partner) or max(key, partner) according to the bits s and m of its index (m the size of the bitonic
runs being merged). A dim of n = 2^p elements takes p (p + 1) / 2 such steps.
`topk` sorts runs of k only and then halves the dim with elementwise maxima of opposite runs (see its docstring).
"""

from __future__ import annotations

from ..errors import CompilationError
from .block_builtins import VALUE_METHODS
from .core import builtin, constexpr
from .dtypes import PointerType, int1, int8, int16, int32, int64, shape_of
from .semantics import element_of
from .shape_ops import compile_time_flag, shown
from .triton_compat import _block, _swap_halves

_SIGNED = {8: int8, 16: int16, 32: int32, 64: int64}


def _to_keys(_semantic, x, what: str):
    """(signed integer keys of x's width ordered as the sort orders x, a function taking keys back to x's dtype)."""
    element = element_of(x)
    if isinstance(element, PointerType):
        raise CompilationError(f"{what}: blocks of pointers cannot be sorted (sort the offsets, then add them to the "
                               "base pointer)")
    if element == int1:
        return _semantic.cast(x, int8), lambda k: _semantic.cast(k, int1)
    signed = _SIGNED[element.bits]
    top = element.bits - 1
    if element.is_floating:
        magnitude = (1 << top) - 1
        bits = _semantic.cast(x, signed, True)
        # every NaN the positive canonical quiet NaN (exponent all ones, the top mantissa bit): above +inf; then
        # negative floats' magnitude bits complemented, so that the integers order as the floats (-0.0 just below
        # +0.0). The map is its own inverse. (Not `bits & magnitude` for the NaNs, keeping their payloads: LLVM
        # folds that `and` of a float's bits into fabs, which NVPTX lowers to abs.f64, and on the GPU abs.f64 of a
        # NaN gave the negative canonical NaN: float64 NaNs sorted first, session 42 on an H100.)
        mantissa = element.fp_mantissa_width
        canonical_nan = magnitude - ((1 << mantissa) - 1) + (1 << (mantissa - 1))     # sign 0, exponent 1s, 10..0
        bits = _semantic.where(_semantic.binary("ne", x, x), _semantic.cast(canonical_nan, signed), bits)

        def flip_negatives(v):
            return _semantic.binary("xor", v, _semantic.binary("and", _semantic.binary("rshift", v, top), magnitude))

        return flip_negatives(bits), lambda k: _semantic.cast(flip_negatives(k), element, True)
    if element.kind == "uint":
        sign = 1 << top
        return (_semantic.cast(_semantic.binary("xor", x, sign), signed, True),
                lambda k: _semantic.binary("xor", _semantic.cast(k, element, True), sign))
    return x, lambda k: k


def _index_bit_clear(_semantic, n: int, rank: int, dim: int, bit: int):
    """The int1 block of shape (1, ..., n at dim, ..., 1): index & bit == 0 (true everywhere for bit >= n)."""
    index = _semantic.arange(0, n)
    clear = _semantic.binary("eq", _semantic.binary("and", index, bit), 0)
    return _semantic.reshape(clear, tuple(n if d == dim else 1 for d in range(rank)))


def _merge_runs(_semantic, keys, dim: int, run: int, descending: bool):
    """Each bitonic run of `run` elements along `dim` sorted (steps run/2, ..., 1), the runs alternately ascending
    and descending (run 0 ascending; the other way round when `descending`)."""
    shape = shape_of(keys.type)
    n, rank = shape[dim], len(shape)
    ascending_run = _index_bit_clear(_semantic, n, rank, dim, run)      # true everywhere when run == n
    if descending:
        ascending_run = _semantic.binary("xor", ascending_run, True)
    step = run // 2
    while step >= 1:                                  # compare-and-exchange i with i ^ step
        partner = _swap_halves(_semantic, keys, dim, step)
        lower = _index_bit_clear(_semantic, n, rank, dim, step)
        keeps_min = _semantic.binary("eq", lower, ascending_run)
        keys = _semantic.where(keeps_min, _semantic.binary("minimum", keys, partner),
                               _semantic.binary("maximum", keys, partner))
        step //= 2
    return keys


def _sort_keys(_semantic, keys, dim: int, descending: bool, longest: int = None):
    """`keys` (signed integers) along `dim` sorted by the bitonic network: runs of 2, 4, ... merged up to runs of
    `longest` (default: the whole dim, sorted as `descending` says; shorter runs alternate in direction)."""
    run, longest = 2, shape_of(keys.type)[dim] if longest is None else longest
    while run <= longest:
        keys = _merge_runs(_semantic, keys, dim, run, descending)
        run *= 2
    return keys


def _dim_of(shape: tuple, dim, what: str) -> int:
    if isinstance(dim, constexpr):
        dim = dim.value
    dim = len(shape) - 1 if dim is None else dim
    if isinstance(dim, bool) or not isinstance(dim, int) or not -len(shape) <= dim < len(shape):
        raise CompilationError(f"{what}: dim must be None or a constexpr int in range for a block of shape {shape}, "
                               f"got {shown(dim)}")
    return dim % len(shape)


@builtin
def sort(x, dim=None, descending=False, *, _semantic=None):
    """`x` sorted along `dim` (None: the last dim), ascending or, with `descending`, descending: Triton's
    `tl.sort(x, dim=None, descending=False)` (also `x.sort(...)`). Same shape and dtype as x: a block of any
    integer (signed, unsigned, int1) or float dtype; dim a constexpr int (negative from the end), any dim of the
    block (Triton's accepts only the last), descending a constexpr bool. Each slice along dim is sorted on its own
    (a 2-D block sorted along dim 1 sorts each row).

    The order is total and exact (the result is a permutation of x's values, bit for bit, but for NaNs):
    floats order -inf < ... < -0.0 < +0.0 < ... < +inf < NaN, so ascending puts every NaN last and descending
    first, as torch.sort does; every NaN of the result is the positive canonical quiet NaN (its sign and payload
    are not kept). Unsigned ints order as unsigned.

    Algorithm: Batcher's bitonic sorting network (AFIPS 1968) over the values as integer keys: p (p + 1) / 2
    compare-and-exchange steps for a dim of 2^p elements; a size-1 dim is returned as it is (but NaNs).

    Raises:
        CompilationError: a scalar, a pointer block, dim not None / a constexpr int in range, descending not a
        constexpr bool.
    """
    x = _block(_semantic, x, "sort: x")
    shape = shape_of(x.type)
    dim = _dim_of(shape, dim, "sort")
    descending = compile_time_flag(descending, "sort: descending")
    keys, restore = _to_keys(_semantic, x, "sort")
    return restore(_sort_keys(_semantic, keys, dim, descending))


@builtin
def topk(x, k, dim=None, *, _semantic=None):
    """The `k` largest elements of `x` along `dim` (None: the last dim), largest first: Triton's
    `tl.topk(x, k, dim=None)` (also `x.topk(k)`). The result has x's dtype and x's shape with dim's size made k;
    it is `sort(x, dim, descending=True)` cut to its first k along dim, so the order and NaNs are sort's (NaNs
    count as the largest values). k: a constexpr power of two, 1 <= k <= the size of dim. Any dim of the block
    (Triton's accepts only the last).

    Algorithm: bitonic top-k: runs of k sorted by Batcher's network, alternately descending and ascending; then,
    until k elements are left, the elementwise max of each pair of neighbouring runs (a bitonic run of their k
    largest, Batcher's half-cleaner) halves the dim, and its runs are merged again (log2 k steps each).

    Raises:
        CompilationError: a scalar, a pointer block, a bad dim, k not a constexpr power of two in [1, size of dim].
    """
    x = _block(_semantic, x, "topk: x")
    shape = shape_of(x.type)
    dim = _dim_of(shape, dim, "topk")
    if isinstance(k, constexpr):
        k = k.value
    n = shape[dim]
    if isinstance(k, bool) or not isinstance(k, int) or k < 1 or k & (k - 1) or k > n:
        raise CompilationError(f"topk: k must be a constexpr power of two from 1 to the size of dim {dim} ({n}) of "
                               f"the block of shape {shape}, got {shown(k)}")
    keys, restore = _to_keys(_semantic, x, "topk")
    keys = _sort_keys(_semantic, keys, dim, True, k)          # runs of k, alternately descending and ascending
    while n > k:
        # the larger of each pair of opposite runs, element by element, is a bitonic run holding their k largest
        # (Batcher's half-cleaner); it halves the dim, and the new runs are sorted, alternating, again
        keys = _semantic.reshape(keys, shape[:dim] + (n // (2 * k), 2, k) + shape[dim + 1:])
        n //= 2
        keys = _semantic.reshape(_semantic.reduce(keys, dim + 1, "max"), shape[:dim] + (n,) + shape[dim + 1:])
        keys = _merge_runs(_semantic, keys, dim, k, True)
    return restore(keys)


# Triton's tensor member functions `x.sort(...)` / `x.topk(k)`
VALUE_METHODS.update({f.__name__: f for f in (sort, topk)})

__all__ = ["sort", "topk"]
