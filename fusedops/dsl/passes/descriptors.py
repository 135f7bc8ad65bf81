"""Tensor-descriptor loads become ordinary masked loads, marked where the copy engine could do them.

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
multiple of 16 bytes (an argument divisible by 16, or such a constant). The pipelining pass then
fills the ring of a wgmma operand from such loads with `cp.async.bulk.tensor` (passes/pipelining.py);
a marked load it does not pipeline stays the masked load above.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..ir import Block, Builder, Function, OpCode, Operation, Value
from ..ir.rewrite import replace_all_uses
from ..language.dtypes import int64
from ..language.semantics import Semantics


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

    def __repr__(self) -> str:      # printed in the IR dump
        return f"tma(contiguous_dim={self.contiguous_dim})"


def expand_descriptor_loads(function: Function, arch: Optional[str] = None) -> bool:
    """Rewrite every DESCRIPTOR_LOAD of `function` (see the module docstring); marks loads for TMA
    on sm_90a when FUSEDOPS_TMA=1. Returns whether the IR changed."""
    from ..runtime import knobs
    mark = arch == "sm_90a" and knobs.current().tma
    loads = [op for op in function.walk() if op.opcode == OpCode.DESCRIPTOR_LOAD]
    for op in loads:
        _expand(function, op, mark)
    return bool(loads)


def _constant(value: Value):
    op = value.defining_op
    return op.attrs.get("value") if op is not None and op.opcode == OpCode.CONSTANT else None


def _expand(function: Function, op: Operation, mark: bool) -> None:
    base, shape0, shape1, stride0, stride1, offset0, offset1 = op.operands
    block_shape = op.attrs["block_shape"]
    scratch = Block()
    builder = Builder(scratch)
    builder.loc = op.loc
    s = Semantics(builder)
    masks, terms = [], []
    for dim, (offset, size, stride) in enumerate(((offset0, shape0, stride0), (offset1, shape1, stride1))):
        index = s.binary("add", offset, s.arange(0, block_shape[dim]))
        inside = s.logical("and", s.binary("ge", index, 0), s.binary("lt", index, size))
        term = index if _constant(stride) == 1 else s.binary("mul", s.cast(index, int64), stride)
        masks.append(s.expand_dims(inside, 1 - dim))
        terms.append(s.expand_dims(term, 1 - dim))
    pointer = s.binary("add", s.binary("add", base, terms[0]), terms[1])
    loaded = s.load(pointer, s.logical("and", masks[0], masks[1]))
    block = op.parent
    position = next(i for i, other in enumerate(block.ops) if other is op)
    for new in scratch.ops:
        new.parent = block
    block.ops[position:position + 1] = scratch.ops
    replace_all_uses(function, op.result, loaded)
    source = _tma_source(function, op) if mark else None
    if source is not None:
        loaded.defining_op.attrs["tma"] = source


def _divisible_by_16(function: Function, value: Value) -> bool:
    """Whether kernel argument `value` was specialized as divisible by 16 (a 16-byte aligned pointer)."""
    if not (isinstance(value.owner, Block) and value.owner.parent is None):
        return False
    hints = function.arg_hints or []
    return value.index < len(hints) and hints[value.index].get("divisibility", 1) >= 16


def _tma_source(function: Function, op: Operation) -> Optional[TmaSource]:
    base, shape0, shape1, stride0, stride1, offset0, offset1 = op.operands
    itemsize = base.type.element.itemsize
    if not _divisible_by_16(function, base):
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
    elif not _divisible_by_16(function, outer):
        return None
    return TmaSource(base, (shape0, shape1), (stride0, stride1), (offset0, offset1), contiguous)
