"""Block pointers (Triton's `tl.make_block_ptr` / `tl.advance`): `dsl.make_block_ptr(base, shape, strides, offsets,
block_shape, order)`, `dsl.advance(ptr, offsets)` (also `ptr.advance(offsets)`), and `dsl.load(ptr,
boundary_check=..., padding_option=...)` / `dsl.store(ptr, value, boundary_check=...)` of one.

A block pointer names the `block_shape` block at `offsets` of an N-d tensor (`base`, its `shape` and element
`strides`, one entry per dim). Element i (a tuple of N indices, 0 <= i[d] < block_shape[d]) of the block is

    base[sum_d (offsets[d] + i[d]) * strides[d]]

    p = dsl.make_block_ptr(a_ptr, (M, K), (stride_am, stride_ak), (pid_m * BM, 0), (BM, BK), (1, 0))
    for k in range(0, dsl.cdiv(K, BK)):
        a = dsl.load(p, boundary_check=(0, 1))      # zeros where row >= M or column >= K
        p = dsl.advance(p, (0, BK))

Semantics (Triton 3.6's documentation of load / store / make_block_ptr / advance, and this file):
- shape, strides and offsets are int scalars (kernel values or ints); the start `sum_d offsets[d] * strides[d]`
  is computed in int64 (tensors of 2**31 elements or more), as is each stride that is an int64 value. An int32
  stride gives int32 in-block offsets `i[d] * strides[d]`, which is exact for every element inside a tensor of
  fewer than 2**31 elements (the plain pointers' int32 arithmetic), and for larger tensors where
  (block_shape[d] - 1) * strides[d] < 2**31. block_shape is constexpr powers of two; order (a permutation of
  the dims, fastest-varying first in memory: Triton's hint) is checked and kept, not needed: the compiler finds
  contiguity from the strides (a unit stride must be known at compile time to vectorize: a literal 1, or an
  argument equal to 1, which the launch specializes, unless do_not_specialize names it).
- `load` without boundary_check reads every element unmasked (an element outside the tensor is the user's
  error: undefined on the GPU, an out-of-bounds error in the interpreter). With boundary_check (constexpr dims)
  an element whose index along a listed dim is outside [0, shape[d]) is not read and is padding_option's fill:
  "zero" -> 0, "nan" -> NaN (float tensors only), "" (Triton: undefined) -> 0 here too.
- `store` writes `value` (a scalar, or a block_shape block, converted to the element type); with
  boundary_check, elements outside the listed dims' ranges are not written.
- `advance(ptr, offsets)` returns the pointer moved by `offsets` (int scalars, may be negative); it reads no
  memory and checks nothing. Block pointers are compile-time objects of kernel values: they are carried through
  loops (only their changed items, usually the offsets, are loop-carried values), merged after a runtime `if`
  (both branches must give a block pointer of one block_shape and order) and passed to and returned from
  @dsl.jit helpers; they cannot be stored, compared, or passed to a kernel.

Lowering: plain pointer arithmetic and masks (`base + start + sum_d arange_d[...] * strides[d]`, masks
`arange_d < clamp(shape[d] - offsets[d], 0, B_d)`), as the tutorials' pointer blocks are written, so the pointer
analysis, vectorization and the pipelining of loads that feed `dot` apply unchanged.

Errors (CompilationError, naming the argument): entries of shape / strides / offsets / order not one per dim of
block_shape; block sizes not constexpr powers of two; order not a permutation; non-integer shapes, strides or
offsets; boundary_check dims out of range or repeated; padding_option not "", "zero" or "nan" ("nan" for a
non-float tensor); mask / other given with a block pointer; a stored block of another shape.
"""

from __future__ import annotations

from ..errors import CompilationError
from ..ir import OpCode, Value
from .composite import Composite
from .core import builtin, constexpr
from .dtypes import BlockType, DType, PointerType, int32, int64
from .shape_ops import check_block_size, shown

PADDING_OPTIONS = ("", "zero", "nan")
_INT64_RANGE = (-2**63, 2**63)


class BlockPointer(Composite):
    """What `make_block_ptr` returns: the base (a pointer scalar), shape, strides and offsets (tuples of
    int scalars: IR values or ints), block_shape and order (tuples of ints). A compile-time object (see the
    module docstring); its items are carried through loops one by one (language/composite.py)."""

    __slots__ = ("base", "shape", "strides", "offsets", "nonnegative", "block_shape", "order")

    def __init__(self, base: Value, shape: tuple, strides: tuple, offsets: tuple, nonnegative: tuple,
                 block_shape: tuple, order: tuple):
        self.base, self.shape, self.strides, self.offsets = base, shape, strides, offsets
        # per dim, True where the offset is known to be >= 0 (a load's boundary_check then skips the lower bound);
        # an item like the others, so that a loop that may move it below 0 carries it as a runtime (unknown) flag
        self.nonnegative = nonnegative
        self.block_shape, self.order = block_shape, order

    @property
    def element(self):
        return self.base.type.element

    @property
    def rank(self) -> int:
        return len(self.block_shape)

    def items(self) -> tuple:
        return (self.base, *self.shape, *self.strides, *self.offsets, *self.nonnegative)

    def item_names(self) -> tuple:
        dims = range(self.rank)
        return ("base", *(f"shape[{d}]" for d in dims), *(f"strides[{d}]" for d in dims),
                *(f"offsets[{d}]" for d in dims), *(f"offsets[{d}] >= 0" for d in dims))

    def with_items(self, items: tuple) -> "BlockPointer":
        n = self.rank
        items = tuple(items)
        return BlockPointer(items[0], items[1:1 + n], items[1 + n:1 + 2 * n], items[1 + 2 * n:1 + 3 * n],
                            items[1 + 3 * n:], self.block_shape, self.order)

    def same_layout(self, other) -> bool:
        return isinstance(other, BlockPointer) and other.block_shape == self.block_shape and other.order == self.order

    def __repr__(self) -> str:
        element = self.base.type.element if isinstance(self.base, Value) else "?"
        return f"a block pointer to {self.block_shape} blocks of {element} (order {self.order})"


# -- arguments ------------------------------------------------------------------------------------------
def _unwrapped(value):
    return value.value if isinstance(value, constexpr) else value


def _int_scalar(value, what: str):
    """`value` (an int, or an integer IR scalar) as given; CompilationError naming `what` otherwise."""
    value = _unwrapped(value)
    if isinstance(value, Value):
        type_ = value.type
        if isinstance(type_, DType) and type_.is_integer and not type_.is_bool:
            return value
        raise CompilationError(f"{what} must be an integer scalar (an int or an int kernel value), got a {type_} value")
    if isinstance(value, bool) or not isinstance(value, int):
        raise CompilationError(f"{what} must be an integer scalar (an int or an int kernel value), got {shown(value)}")
    if not _INT64_RANGE[0] <= value < _INT64_RANGE[1]:
        raise CompilationError(f"{what} {value} does not fit in int64")
    return value


def _per_dim(values, rank: int, what: str, where: str) -> tuple:
    values = _unwrapped(values)
    if not isinstance(values, (tuple, list)) or len(values) != rank:
        got = f"{len(values)} entries" if isinstance(values, (tuple, list)) else shown(values)
        raise CompilationError(f"{where}: {what} must be a tuple of {rank} entries (one per dim of block_shape), "
                               f"got {got}")
    return tuple(values)


def _block_shape(block_shape) -> tuple:
    block_shape = _unwrapped(block_shape)
    if not isinstance(block_shape, (tuple, list)) or not block_shape:
        raise CompilationError(f"make_block_ptr: block_shape must be a non-empty tuple of constexpr powers of two, "
                               f"got {shown(block_shape)}")
    block_shape = tuple(_unwrapped(b) for b in block_shape)
    if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 or b & (b - 1) for b in block_shape):
        raise CompilationError(f"make_block_ptr: block_shape must be constexpr powers of two, got {shown(block_shape)}")
    check_block_size(block_shape, "make_block_ptr: block_shape")
    return block_shape


def _order(order, rank: int) -> tuple:
    order = tuple(_unwrapped(o) for o in _per_dim(order, rank, "order", "make_block_ptr"))
    if sorted(o if isinstance(o, int) and not isinstance(o, bool) else -1 for o in order) != list(range(rank)):
        raise CompilationError(f"make_block_ptr: order must be a permutation of the dims {tuple(range(rank))} "
                               f"(constexpr ints), got {shown(order)}")
    return order


@builtin
def make_block_ptr(base, shape, strides, offsets, block_shape, order, *, _semantic=None):
    """A pointer to the `block_shape` block at `offsets` of the tensor at `base` (a pointer scalar: a tensor
    argument, plus an offset) of `shape`, with element `strides`; see the module docstring for the semantics.

    shape, strides, offsets: tuples of int scalars (ints or int kernel values), one per dim of `block_shape`
    (a tuple of constexpr powers of two); order: a permutation of the dims (Triton's memory-order hint).
    Raises CompilationError for a wrong length, a non-integer entry, a block size that is not a power of two,
    or an order that is not a permutation. Triton: `tl.make_block_ptr`."""
    if isinstance(base, BlockPointer):
        raise CompilationError("make_block_ptr: base is a block pointer already; pass the tensor's pointer")
    if not isinstance(base, Value) or not isinstance(base.type, PointerType):
        got = f"a {base.type} value" if isinstance(base, Value) else shown(base)
        raise CompilationError(f"make_block_ptr: base must be a pointer scalar (a tensor argument, plus an offset), "
                               f"got {got}")
    block_shape = _block_shape(block_shape)
    rank = len(block_shape)
    fields = []
    for what, values in (("shape", shape), ("strides", strides), ("offsets", offsets)):
        values = _per_dim(values, rank, what, "make_block_ptr")
        fields.append(tuple(_int_scalar(v, f"make_block_ptr: {what}[{d}]") for d, v in enumerate(values)))
    nonnegative = tuple(_known_nonnegative(offset) for offset in fields[2])
    return BlockPointer(base, *fields, nonnegative, block_shape, _order(order, rank))


def _checked(ptr, what: str) -> BlockPointer:
    if not isinstance(ptr, BlockPointer):
        got = f"a {ptr.type} value" if isinstance(ptr, Value) else shown(ptr)
        raise CompilationError(f"{what} expects a block pointer (made by dsl.make_block_ptr), got {got}")
    return ptr


# Ops whose result is >= 0 when their operands are (ignoring wrap-around, as the pointer analysis does).
_MONOTONE = (OpCode.ADD, OpCode.MUL, OpCode.MULTIPLE_OF, OpCode.MAX_CONTIGUOUS)


def _known_nonnegative(value, depth: int = 8) -> bool:
    """Whether the int scalar `value` is known to be >= 0 where it is built: an int >= 0, an unsigned value, a
    program id or count, a constant >= 0, a widening cast of such a value, or sums and products of them."""
    if isinstance(value, int):
        return value >= 0
    if not value.type.is_signed:
        return True
    op = value.defining_op
    if op is None or depth == 0:
        return False
    if op.opcode in (OpCode.PROGRAM_ID, OpCode.NUM_PROGRAMS):
        return True
    if op.opcode == OpCode.CONSTANT:
        return op.attrs["value"] >= 0
    if op.opcode == OpCode.CAST:
        # a widening cast (an unsigned source must be narrower: uint32 -> int32 wraps values >= 2**31 negative)
        source = op.operands[0].type
        if not (isinstance(source, DType) and source.is_integer):
            return False
        widening = source.bits <= value.type.bits if source.is_signed else source.bits < value.type.bits
        return widening and _known_nonnegative(op.operands[0], depth - 1)
    return op.opcode in _MONOTONE and all(_known_nonnegative(v, depth - 1) for v in op.operands)


def _add(semantic, a, b, what: str):
    """a + b of two int scalars (ints stay ints; an int 0 adds nothing)."""
    if isinstance(b, int) and b == 0:
        return a
    if isinstance(a, int) and isinstance(b, int):
        return _int_scalar(a + b, what)
    if isinstance(a, int) and a == 0:
        return b
    return semantic.binary("add", a, b)


@builtin
def advance(base, offsets, *, _semantic=None):
    """The block pointer `base` moved by `offsets` (a tuple of int scalars, one per dim, may be negative):
    its offsets plus these; nothing else changes and no memory is read. Also `base.advance(offsets)`.
    Raises CompilationError for a non-block-pointer `base` or offsets of the wrong length or type.
    Triton: `tl.advance`."""
    ptr = _checked(base, "advance")
    deltas = _per_dim(offsets, ptr.rank, "offsets", "advance")
    deltas = tuple(_int_scalar(delta, f"advance: offsets[{d}]") for d, delta in enumerate(deltas))
    moved = tuple(_add(_semantic, old, delta, f"advance: offsets[{d}]")
                  for d, (old, delta) in enumerate(zip(ptr.offsets, deltas)))
    # a move by a known non-negative amount keeps the flag (the same object: a loop does not carry it)
    nonnegative = tuple(flag if _known_nonnegative(delta) else False
                        for flag, delta in zip(ptr.nonnegative, deltas))
    return BlockPointer(ptr.base, ptr.shape, ptr.strides, moved, nonnegative, ptr.block_shape, ptr.order)


BLOCK_POINTER_METHODS = {"advance": advance}


# -- lowering ------------------------------------------------------------------------------------------
def _as_int64(semantic, value):
    return value if isinstance(value, int) else semantic.cast(value, int64)


def _start(semantic, ptr: BlockPointer):
    """sum_d offsets[d] * strides[d], in int64 (an int where every term is known)."""
    known, terms = 0, []
    for offset, stride in zip(ptr.offsets, ptr.strides):
        if isinstance(offset, int) and isinstance(stride, int):
            known += offset * stride
        elif not (isinstance(offset, int) and offset == 0) and not (isinstance(stride, int) and stride == 0):
            terms.append(semantic.binary("mul", _as_int64(semantic, offset), _as_int64(semantic, stride)))
    total = None
    for term in terms:
        total = term if total is None else semantic.binary("add", total, term)
    if known:
        _int_scalar(known, "the block pointer's start offset")
        total = known if total is None else semantic.binary("add", total, semantic.constant(known, int64))
    return 0 if total is None else total


def _index(semantic, ptr: BlockPointer, d: int) -> Value:
    """arange(0, block_shape[d]) laid along dim d of a rank-N block (size 1 along the others)."""
    index = semantic.arange(0, ptr.block_shape[d])
    for axis in range(ptr.rank):
        if axis != d:
            index = semantic.expand_dims(index, axis)
    return index


def _addresses(semantic, ptr: BlockPointer, indices: list) -> Value:
    """The block of element addresses: the base plus index_d * strides[d], one dim at a time (as
    `a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak` adds them: per-row pointers plus column
    offsets, which the code generator keeps cheap), then plus the start, last: in a loop that advances the
    pointer only the start changes, and the rest is computed once before it. Each term is int32 for an int32
    stride (or a literal one whose products fit), else int64 (see the module docstring)."""
    pointers = ptr.base
    for d, stride in enumerate(ptr.strides):
        index = indices[d]
        if isinstance(stride, int):
            if stride == 0:
                continue
            if (ptr.block_shape[d] - 1) * abs(stride) >= 2**31:
                index = semantic.cast(index, int64)
            term = index if stride == 1 else semantic.binary("mul", index, stride)
        else:
            if stride.type != int32:     # narrow ints in int32; uint32 and 64-bit ones in int64
                stride = semantic.cast(stride, int32 if stride.type.bits < 32 else int64)
            if stride.type == int64:
                index = semantic.cast(index, int64)
            term = semantic.binary("mul", index, stride)
        pointers = semantic.add_pointer(pointers, term)
    start = _start(semantic, ptr)
    if not (isinstance(start, int) and start == 0):
        pointers = semantic.add_pointer(pointers, start)
    return semantic.broadcast_to(pointers, ptr.block_shape)


def _clamped(semantic, value, limit: int):
    """min(max(value, 0), limit) as an int32 scalar (value: an int64 IR scalar)."""
    value = semantic.binary("minimum", semantic.binary("maximum", value, 0), limit)
    return semantic.cast(value, int32)


def _mask(semantic, ptr: BlockPointer, dims: tuple, indices: list):
    """The elements inside [0, shape[d]) along each dim of `dims` (None: no dim needs a mask)."""
    mask = None
    for d in dims:
        offset, size, length = ptr.offsets[d], ptr.shape[d], ptr.block_shape[d]
        index = indices[d]
        conditions = []
        if isinstance(offset, int) and isinstance(size, int):
            high, low = min(max(size - offset, 0), length), min(max(-offset, 0), length)
            if high < length:
                conditions.append(semantic.binary("lt", index, high))
            if low > 0:
                conditions.append(semantic.binary("ge", index, low))
        elif ptr.nonnegative[d] is True and all(_fits_int32(v) for v in (offset, size)):
            # 0 <= offset and 0 <= shape (a size) both int32: shape - offset cannot wrap (the tutorials' mask)
            conditions.append(semantic.binary("lt", index, semantic.binary("sub", size, offset)))
        else:
            # index < shape - offset and index >= -offset, the bounds clamped to [0, length] in int64 first
            remaining = semantic.binary("sub", _as_int64(semantic, size), _as_int64(semantic, offset))
            conditions.append(semantic.binary("lt", index, _clamped(semantic, remaining, length)))
            if ptr.nonnegative[d] is not True:
                # (0 - offset, not a negation: the pointer analysis knows the divisibility of a difference)
                before = semantic.binary("sub", 0, _as_int64(semantic, offset)) if isinstance(offset, Value) \
                    else semantic.constant(-offset, int64)
                conditions.append(semantic.binary("ge", index, _clamped(semantic, before, length)))
        for condition in conditions:
            mask = condition if mask is None else semantic.binary("and", mask, condition)
    return None if mask is None else semantic.broadcast_to(mask, ptr.block_shape)


def _fits_int32(value) -> bool:
    """An int in int32's range, or an IR value of a signed type of at most 32 bits (unsigned ones may not be)."""
    if isinstance(value, int):
        return -2**31 <= value < 2**31
    return value.type.is_signed and value.type.bits <= 32


def _boundary_dims(boundary_check, rank: int, what: str) -> tuple:
    boundary_check = _unwrapped(boundary_check)
    if boundary_check is None:
        return ()
    dims = tuple(_unwrapped(d) for d in (boundary_check if isinstance(boundary_check, (tuple, list))
                                         else (boundary_check,)))
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < rank:
            raise CompilationError(f"{what}: boundary_check must hold dims of the block pointer (constexpr ints in "
                                   f"[0, {rank})), got {shown(boundary_check)}")
    if len(set(dims)) != len(dims):
        raise CompilationError(f"{what}: boundary_check names a dim twice: {shown(boundary_check)}")
    return tuple(sorted(dims))


def load_block(semantic, ptr: BlockPointer, mask, other, boundary_check, padding_option, cache_modifier: str,
               eviction_policy: str) -> Value:
    """`dsl.load` of a block pointer (see the module docstring)."""
    if mask is not None or other is not None:
        raise CompilationError("load: mask and other cannot be given with a block pointer; use "
                               "boundary_check=(dims...) and padding_option=")
    dims = _boundary_dims(boundary_check, ptr.rank, "load")
    padding_option = _unwrapped(padding_option)
    if padding_option is None:
        padding_option = ""
    if not isinstance(padding_option, str) or padding_option not in PADDING_OPTIONS:
        raise CompilationError(f"load: padding_option must be one of {PADDING_OPTIONS}, got {shown(padding_option)}")
    element = ptr.element
    if padding_option == "nan" and not (isinstance(element, DType) and element.is_floating):
        raise CompilationError(f"load: padding_option='nan' needs a floating-point tensor, not {element}")
    indices = [_index(semantic, ptr, d) for d in range(ptr.rank)]
    pointers = _addresses(semantic, ptr, indices)
    mask = _mask(semantic, ptr, dims, indices)
    fill = None if mask is None else float("nan") if padding_option == "nan" else 0
    return semantic.load(pointers, mask, fill, cache_modifier, eviction_policy)


def store_block(semantic, ptr: BlockPointer, value, mask, boundary_check, cache_modifier: str,
                eviction_policy: str) -> None:
    """`dsl.store` of a block pointer (see the module docstring)."""
    if mask is not None:
        raise CompilationError("store: mask cannot be given with a block pointer; use boundary_check=(dims...)")
    dims = _boundary_dims(boundary_check, ptr.rank, "store")
    if isinstance(value, Value) and isinstance(value.type, BlockType) and value.type.shape != ptr.block_shape:
        raise CompilationError(f"store: the value must be a {ptr.block_shape} block (the block pointer's "
                               f"block_shape) or a scalar, got a block of shape {value.type.shape}")
    if isinstance(value, BlockPointer) or (not isinstance(value, Value) and not isinstance(value, (bool, int, float))):
        raise CompilationError(f"store: the value must be a {ptr.block_shape} block or a scalar, got {shown(value)}")
    value = semantic.broadcast_to(semantic.cast(value, ptr.element), ptr.block_shape)
    indices = [_index(semantic, ptr, d) for d in range(ptr.rank)]
    pointers = _addresses(semantic, ptr, indices)
    semantic.store(pointers, value, _mask(semantic, ptr, dims, indices), cache_modifier, eviction_policy)


def check_plain_pointer(what: str, boundary_check, padding_option="") -> None:
    """Refuse boundary_check / padding_option on a load or store of a plain pointer (Triton: they must be empty)."""
    boundary_check, padding_option = _unwrapped(boundary_check), _unwrapped(padding_option)
    if boundary_check not in (None, (), []) or padding_option not in (None, ""):
        argument = "boundary_check" if boundary_check not in (None, (), []) else "padding_option"
        raise CompilationError(f"{what}: {argument} is for block pointers (dsl.make_block_ptr); a plain pointer "
                               "takes mask= (and other=) instead")


__all__ = ["BlockPointer", "make_block_ptr", "advance", "BLOCK_POINTER_METHODS", "load_block", "store_block",
           "check_plain_pointer"]
