"""Tensor-descriptor loads become ordinary masked loads, marked where the copy engine could do them;
descriptor stores become TMA stores or masked stores.

`desc.load((o0, o1))` (DESCRIPTOR_LOAD, language/descriptors.py) is rewritten, in its block, into

    rows = o0 + arange(0, B0);  cols = o1 + arange(0, B1)
    mask = (0 <= rows < shape0)[:, None] & (0 <= cols < shape1)[None, :]
    load(base + rows[:, None] * stride0 + cols[None, :] * stride1, mask)        (zeros where masked)

(the non-unit stride's product in int64, so tensors over 2**31 elements work), which every later
pass and every target already handles: on sm_80, with FUSEDOPS_TMA=0, or where the copy engine
does not apply, a descriptor is only a way to write a tile load.

On sm_90a with FUSEDOPS_TMA=1 the load also gets attr `tma` (a `TmaSource`: the descriptor's base,
shape, strides, the offsets and the contiguous dim) when the specialization proves that the host can
encode a tensor map for it: the base 16-byte aligned, one stride the constant 1 and the other a
multiple of 16 bytes (an argument specialized as divisible by enough elements and positive, or such a
constant: a stride of 0, a broadcast operand, keeps the masked load). The
pipelining pass then fills the ring of a wgmma operand from such loads with `cp.async.bulk.tensor`
(passes/pipelining.py); a marked load it does not pipeline stays the masked load above.

`desc.store((o0, o1), value)` (DESCRIPTOR_STORE) becomes the masked store of the same box, or, under
the same conditions, for a block of whole 128-byte swizzle atoms along its contiguous dim (2- or
4-byte elements, the other dim at most 256: the copy engine's box limit), `tma_store` (codegen/
tma_store.py: the block goes through a swizzled shared tile and the copy engine writes it, clipping
what lies outside the tensor). `desc.atomic_add` (DESCRIPTOR_STORE {reduce="add"}) becomes a masked
relaxed `atomic_add` of the box, or the same `tma_store` with {reduce="add"}: the copy engine adds the
tile into global memory (cp.reduce.async.bulk.tensor).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..ir import Block, Builder, Function, OpCode, Operation, Value
from ..ir.rewrite import replace_all_uses
from ..language.dtypes import int64
from ..language.semantics import Semantics
from .pointer_roots import pointer_roots


@dataclasses.dataclass(frozen=True)
class TmaSource:
    """What a load marked for TMA reads: a 2-D tensor (base pointer argument, shape and element
    strides: arguments or constants) at `coordinates` (int32 values, dims outermost first);
    `contiguous_dim` is the dim whose stride is 1."""

    base: Value
    shape: tuple
    strides: tuple
    coordinates: tuple
    contiguous_dim: int
    multicast: bool = False     # `desc.load(..., multicast=True)`: the cluster's programs load the same box

    def __repr__(self) -> str:      # printed in the IR dump
        return f"tma(contiguous_dim={self.contiguous_dim}{', multicast' if self.multicast else ''})"


def expand_descriptor_loads(function: Function, arch: Optional[str] = None) -> bool:
    """Rewrite every DESCRIPTOR_LOAD and DESCRIPTOR_STORE of `function` (see the module docstring);
    marks loads for TMA, and makes stores TMA_STORE where they qualify, on sm_90a when FUSEDOPS_TMA=1.
    Returns whether the IR changed."""
    from ..runtime import knobs
    mark = arch == "sm_90a" and knobs.current().tma
    ops = [op for op in function.walk() if op.opcode in (OpCode.DESCRIPTOR_LOAD, OpCode.DESCRIPTOR_STORE)]
    for op in ops:
        if op.opcode == OpCode.DESCRIPTOR_LOAD:
            _expand(function, op, mark)
        else:
            _expand_store(function, op, mark)
    for op in function.walk():
        if op.opcode == OpCode.TMA_STORE:
            op.attrs["fence_global"] = _generic_global_access_may_precede(function, op)
    return bool(ops)


def _constant(value: Value):
    op = value.defining_op
    return op.attrs.get("value") if op is not None and op.opcode == OpCode.CONSTANT else None


def _box_access(s: Semantics, op: Operation) -> tuple:
    """(pointer block, in-bounds mask block) of the box of descriptor op `op`, built with `s`."""
    base, shape0, shape1, stride0, stride1, offset0, offset1 = op.operands[:7]
    block_shape = op.attrs["block_shape"]
    masks, terms = [], []
    for dim, (offset, size, stride) in enumerate(((offset0, shape0, stride0), (offset1, shape1, stride1))):
        if size.type == int64:      # offset + i may pass 2**31 inside such a dim
            offset = s.cast(offset, int64)
        index = s.binary("add", offset, s.arange(0, block_shape[dim]))
        inside = s.logical("and", s.binary("ge", index, 0), s.binary("lt", index, size))
        term = index if _constant(stride) == 1 else s.binary("mul", s.cast(index, int64), stride)
        masks.append(s.expand_dims(inside, 1 - dim))
        terms.append(s.expand_dims(term, 1 - dim))
    pointer = s.binary("add", s.binary("add", base, terms[0]), terms[1])
    return pointer, s.logical("and", masks[0], masks[1])


def _replace(op: Operation, scratch: Block) -> None:
    """Put the ops of `scratch` where `op` is in its block, and drop `op`."""
    block = op.parent
    position = next(i for i, other in enumerate(block.ops) if other is op)
    for new in scratch.ops:
        new.parent = block
    block.ops[position:position + 1] = scratch.ops


def _semantics(op: Operation) -> tuple:
    scratch = Block()
    builder = Builder(scratch)
    builder.loc = op.loc
    return scratch, Semantics(builder)


def _expand(function: Function, op: Operation, mark: bool) -> None:
    scratch, s = _semantics(op)
    loaded = s.load(*_box_access(s, op))
    _replace(op, scratch)
    replace_all_uses(function, op.result, loaded)
    source = _tma_source(function, op) if mark else None
    if source is not None:
        loaded.defining_op.attrs["tma"] = dataclasses.replace(source, multicast=bool(op.attrs.get("multicast")))


def _expand_store(function: Function, op: Operation, mark: bool) -> None:
    """A descriptor store: TMA_STORE where the copy engine can do it (`_tma_store_box`), else a masked
    store of the box."""
    target = _tma_source(function, op) if mark else None
    value = op.operands[7]
    itemsize = value.type.element.itemsize
    reduce = op.attrs.get("reduce")
    if target is not None and _tma_store_box(op.attrs["block_shape"], target.contiguous_dim, itemsize):
        attrs = dict(block_shape=op.attrs["block_shape"], contiguous_dim=target.contiguous_dim,
                     drain=_memory_may_follow(op))
        if reduce:
            attrs["reduce"] = reduce
        store = Operation(OpCode.TMA_STORE, [value, *op.operands[:7]], [], attrs, (), op.loc)
        scratch = Block()
        store.parent = scratch
        scratch.ops.append(store)
    else:
        scratch, s = _semantics(op)
        pointer, mask = _box_access(s, op)
        if reduce:
            s.atomic_rmw(reduce, pointer, value, mask, sem="relaxed")
        else:
            s.store(pointer, value, mask)
    _replace(op, scratch)


_GENERIC_WRITES = frozenset({OpCode.STORE, OpCode.ATOMIC_RMW, OpCode.ATOMIC_CAS})


def _generic_global_access_may_precede(function: Function, store: Operation) -> bool:
    """Whether a generic-proxy global access that a TMA store (or bulk reduction) must follow may run before
    it: any generic write of the function (st.global, atomics), or a load that may read what the store writes
    and may still be in flight (a load marked for the copy engine may stay a generic one): every load but
    those of a pointer derived from other kernel arguments than the stored tensor's (passes/pointer_roots.py:
    distinct pointer arguments are taken not to overlap, as pipelining takes them). Even a load the stored
    block is computed from may be in flight, where LLVM folds its use away (`where(True, tile, old)`). Where
    nothing remains, the store's proxy fence covers only its shared tile (codegen/tma_store.py): a
    `fence.proxy.async` of every state space cost the persistent matmul 1-2% on the H200 (session 11)."""
    written = pointer_roots(store.operands[1])
    for op in function.walk():
        if op.opcode in _GENERIC_WRITES:
            return True
        if op.opcode == OpCode.LOAD and not _apart(pointer_roots(op.operands[0]), written):
            return True
    return False


def _apart(roots: Optional[frozenset], other: Optional[frozenset]) -> bool:
    """Whether two pointers' roots (pointer_roots) are both known and share no kernel argument."""
    return bool(roots) and bool(other) and not roots & other


_MEMORY_OPS = frozenset({OpCode.LOAD, OpCode.STORE, OpCode.ATOMIC_RMW, OpCode.ATOMIC_CAS, OpCode.DESCRIPTOR_LOAD,
                         OpCode.DESCRIPTOR_STORE, OpCode.TMA_STORE})


def _memory_may_follow(op: Operation) -> bool:
    """Whether a global memory access may run after `op` in the same thread: a later op of its block or
    of an enclosing one, or anything in an enclosing loop (which comes round again). A TMA store then
    waits until its writes are done (codegen/tma_store.py), not only until its shared tile was read."""
    block = op.parent
    while block is not None:
        later = block.ops[block.ops.index(op) + 1:]
        if any(nested.opcode in _MEMORY_OPS for other in later for nested in other.walk()):
            return True
        op = block.parent if isinstance(block.parent, Operation) else None
        if op is None:
            return False
        if op.opcode in (OpCode.FOR, OpCode.WHILE):
            return True
        block = op.parent
    return False


# The copy engine's limits for the boxes of a TMA store: at most 256 elements per dim; the block is cut
# into boxes of one 128-byte swizzle atom along the contiguous dim (codegen/tma_store.py), each of at
# least 8 rows where there are several: the swizzle pattern spans 8 rows of 128 bytes and the engine
# takes its phase from the shared address, so a box of fewer rows leaves the next one mid-pattern.
MAX_BOX_ELEMENTS = 256
MIN_BOX_ROWS = 8
STORE_SWIZZLE_BYTES = 128


def _tma_store_box(block_shape: tuple, contiguous_dim: int, itemsize: int) -> bool:
    """Whether a block of `block_shape` (`itemsize`-byte elements) can go out as whole 128-byte-swizzled
    boxes: 2- or 4-byte elements, the contiguous extent a multiple of the atom, the other at most 256 and,
    for more than one box, at least 8."""
    atom = STORE_SWIZZLE_BYTES // itemsize if itemsize in (2, 4) else 0
    rows = block_shape[1 - contiguous_dim]
    return atom > 0 and block_shape[contiguous_dim] % atom == 0 and rows <= MAX_BOX_ELEMENTS \
        and (rows >= MIN_BOX_ROWS or block_shape[contiguous_dim] == atom)


def _divisible_by(function: Function, value: Value, factor: int) -> bool:
    """Whether kernel argument `value` was specialized as divisible by `factor` (a pointer: bytes; an int:
    itself)."""
    return (_hint(function, value, "divisibility") or 1) >= factor


def _hint(function: Function, value: Value, name: str):
    """Kernel argument `value`'s hint `name` (Function.arg_hints), or None."""
    if not (isinstance(value.owner, Block) and value.owner.parent is None):
        return None
    hints = function.arg_hints or []
    return hints[value.index].get(name) if value.index < len(hints) else None


def _tma_source(function: Function, op: Operation) -> Optional[TmaSource]:
    base, shape0, shape1, stride0, stride1, offset0, offset1 = op.operands[:7]
    itemsize = base.type.element.itemsize
    if not _divisible_by(function, base, 16):
        return None
    unit = [_constant(stride) == 1 for stride in (stride0, stride1)]
    if unit.count(True) != 1:
        return None
    contiguous = unit.index(True)
    outer = (stride0, stride1)[1 - contiguous]
    constant = _constant(outer)
    if constant is not None:
        if constant <= 0 or constant * itemsize % 16:
            return None
    elif not (_divisible_by(function, outer, max(1, 16 // itemsize)) and _hint(function, outer, "positive")):
        return None     # a positive multiple of 16 bytes (0: a broadcast operand, whose loads stay plain)
    return TmaSource(base, (shape0, shape1), (stride0, stride1), (offset0, offset1), contiguous)
