"""Triton's `tl.gather`, `tl.histogram` and `tl.cat` (README, "Coming from Triton"), built from the DSL's block ops
without a new IR op: signatures and results are Triton 3.6's (its language reference), and where this DSL pins
down what Triton leaves undefined (an out-of-range gather index) the docstring says so.

`gather` and `histogram` are one-hot forms: every output element compares its index (or every bin its number)
with all candidates, which costs O(output elements x candidates) compares and registers, against Triton's
dedicated lowerings. They suit the small blocks of a lookup table or a few dozen bins; for
large ones, write the indexed loads (`dsl.load(ptr + index)`) or `dsl.atomic_add(hist_ptr + bins, 1)`.

`gather` and `cat` move values exactly (every bit: -0.0 and NaN payloads survive): gather selects with an integer
sum of the values' bits where at most one term is non-zero; cat is `join` + `permute` + `reshape`.
"""

from __future__ import annotations

from ..errors import CompilationError
from .block_builtins import VALUE_METHODS
from .core import builtin, constexpr
from .dtypes import PointerType, int1, int32, shape_of
from .semantics import element_of
from .shape_ops import compile_time_bool, shown
from .triton_compat import _as_bits, _block, join


def _dim(value, rank: int, what: str) -> int:
    """`value` (a constexpr int in [-rank, rank)) as a dim in [0, rank), or CompilationError naming `what`."""
    if isinstance(value, constexpr):
        value = value.value
    if isinstance(value, bool) or not isinstance(value, int) or not -rank <= value < rank:
        raise CompilationError(f"{what} must be a constexpr int in [{-rank}, {rank}) for a block of rank {rank}, "
                               f"got {shown(value)}")
    return value % rank


def _is_integer(element) -> bool:
    return not isinstance(element, PointerType) and element.is_integer and element != int1


@builtin
def gather(src, index, axis, *, _semantic=None):
    """Values of `src` picked along `axis` by `index`, Triton's `tl.gather` (torch.gather's rule): for a 2-D
    block, `out[i, j] = src[index[i, j], j]` (axis 0) or `src[i, index[i, j]]` (axis 1), and so on for any rank.

    src: a block of any dtype but pointers. index: an integer block of src's rank whose sizes equal src's in
    every dim but `axis` (any power of two there). axis: a constexpr int, negative from the end. Returns a block
    of index's shape and src's dtype, bit-exact (-0.0, NaN payloads). An index outside [0, src.shape[axis])
    (negative included) gives 0 (+0.0, False): Triton leaves it undefined; here it is pinned down and never
    reads outside the block.

    Cost: O(index.numel * src.shape[axis]) compares and adds, the one-hot form of a gather: each output compares
    its index with arange(0, src.shape[axis]) and sums the bits of the matching value (a block sum over the
    candidates, which may exchange through shared memory as dsl.sum does), not Triton's warp-shuffle /
    shared-memory lowering. For a large src, load with `dsl.load(src_ptr + offsets(index))` instead.

    Raises:
        CompilationError: scalars, a pointer src, a non-integer index, ranks or sizes that do not match, a bad
        axis.
    """
    src = _block(_semantic, src, "gather: src")
    index = _block(_semantic, index, "gather: index")
    src_shape, index_shape = shape_of(src.type), shape_of(index.type)
    rank = len(src_shape)
    axis = _dim(axis, rank, "gather: axis")
    if not _is_integer(element_of(index)):
        raise CompilationError(f"gather: index must be a block of integers, got {element_of(index)}")
    if len(index_shape) != rank or any(a != b for d, (a, b) in enumerate(zip(src_shape, index_shape)) if d != axis):
        raise CompilationError(f"gather: index must have src's rank and src's sizes in every dim but axis {axis}; "
                               f"got src {src_shape} and index {index_shape}")
    bits, restore = _as_bits(_semantic, src, "gather: src")
    size = src_shape[axis]
    # dims of the one-hot block: index's, with src's axis (the candidates) inserted after `axis`
    bits = _semantic.reshape(bits, src_shape[:axis] + (1,) + src_shape[axis:])
    wanted = _semantic.reshape(index, index_shape[:axis + 1] + (1,) + index_shape[axis + 1:])
    candidates = _semantic.reshape(_semantic.arange(0, size), (1,) * (axis + 1) + (size,) + (1,) * (rank - axis - 1))
    match = _semantic.binary("eq", wanted, candidates)
    picked = _semantic.reduce(_semantic.where(match, bits, 0), axis + 1, "sum")
    return restore(picked)


@builtin
def histogram(input, num_bins, mask=None, *, _semantic=None):
    """Counts of the values 0, 1, ..., num_bins - 1 in `input`, Triton's `tl.histogram` (bins of width 1
    starting at 0): `out[b]` = the number of elements equal to b, where `mask` is true.

    input: a block of integers (any rank here, every element counted; Triton documents 1-D). num_bins: a
    constexpr power-of-two int. mask: None, or an int1 block (or scalar) that broadcasts to input's shape;
    elements where it is false are not counted. Returns an int32 block of shape (num_bins,). Values outside
    [0, num_bins) (negative included) are not counted: Triton leaves them unspecified (its NVIDIA lowering drops
    them too; mask them off to be portable).

    Cost: a one-hot count, input.numel * num_bins compares and int32 adds (a block sum over the elements, no
    atomics), the one-hot form of a histogram; for many elements or bins, `dsl.atomic_add(hist_ptr + values, 1,
    mask=...)` is cheaper.

    Raises:
        CompilationError: a scalar or non-integer input, num_bins not a constexpr power of two, a mask that
        does not broadcast to input's shape.
    """
    x = _block(_semantic, input, "histogram: input")
    if not _is_integer(element_of(x)):
        raise CompilationError(f"histogram: input must be a block of integers, got {element_of(x)}")
    bins = num_bins.value if isinstance(num_bins, constexpr) else num_bins
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1 or bins & (bins - 1):
        raise CompilationError(f"histogram: num_bins must be a constexpr power-of-two int, got {shown(bins)}")
    shape = shape_of(x.type)
    numel = x.type.numel
    match = _semantic.binary("eq", _semantic.reshape(x, (numel, 1)),
                             _semantic.reshape(_semantic.arange(0, bins), (1, bins)))
    if mask is not None:
        if isinstance(mask, constexpr):
            mask = mask.value
        if not (hasattr(mask, "type") or isinstance(mask, bool)):
            raise CompilationError(f"histogram: mask must be None or an int1 block / scalar, got {shown(mask)}")
        keep = _semantic.to_condition(mask, allow_block=True)
        try:
            keep = _semantic.broadcast_to(keep, shape)
        except CompilationError:
            raise CompilationError(f"histogram: mask of shape {shape_of(keep.type)} does not broadcast to input's "
                                   f"shape {shape}") from None
        match = _semantic.logical("and", match, _semantic.reshape(keep, (numel, 1)))
    return _semantic.reduce(_semantic.cast(match, int32), 0, "sum")


@builtin
def cat(input, other, can_reorder=False, dim=0, *, _semantic=None):
    """`input` and `other` concatenated along `dim`, Triton's `tl.cat`: the result's `dim` has input's elements
    first, then other's, as torch.cat. The order is always kept, so `can_reorder` (a constexpr bool, Triton's hint
    that the order may change) is accepted either way. Exact (every bit), any dtype; the element types are
    promoted as `dsl.where` promotes them.

    Both must be blocks of one shape (the result's `dim` doubles, as block sizes are powers of two); dim: a
    constexpr int, negative from the end (Triton's `dim`, default 0). Built as `join` (a new last dim of 2),
    `permute` (that dim moved before `dim`) and a row-major `reshape`.

    Raises:
        CompilationError: scalars, blocks of different shapes, a bad dim or can_reorder.
    """
    compile_time_bool(can_reorder, "cat: can_reorder")
    a = _block(_semantic, input, "cat: input")
    b = _block(_semantic, other, "cat: other")
    shape = shape_of(a.type)
    if shape_of(b.type) != shape:
        raise CompilationError(f"cat: input and other must have the same shape, got {shape} and {shape_of(b.type)}")
    rank = len(shape)
    dim = _dim(dim, rank, "cat: dim")
    pairs = join(a, b, _semantic=_semantic)                    # shape + (2,)
    order = tuple(range(dim)) + (rank,) + tuple(range(dim, rank))
    if order != tuple(range(rank + 1)):
        pairs = _semantic.trans(pairs, *order)
    return _semantic.reshape(pairs, shape[:dim] + (2 * shape[dim],) + shape[dim + 1:])


# Triton's tensor member functions: `x.gather(index, axis)`, `x.histogram(num_bins)`
VALUE_METHODS.update({f.__name__: f for f in (gather, histogram)})

__all__ = ["gather", "histogram", "cat"]
