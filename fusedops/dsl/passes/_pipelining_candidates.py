"""The loads of a `for` loop that passes/pipelining.py can move into a ring: dot operands whose
address is recomputable for a later iteration, reading memory the loop does not write, in copies wide
enough for cp.async, or filled by the copy engine (TMA, with multicast across a cluster).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..ir import Block, Function, Operation, OpCode, Value
from ..ir.ops import ELEMENTWISE
from ..language.dtypes import int32, shape_of
from ..layouts.mma_shared import (is_shared_layout, mma_operand_shared, shared_contiguous_dim,
                                  wgmma_operand_tile)
from ..layouts.swizzle import contiguous_dim
from ._copy_width import MIN_COPY_BYTES, copy_width
from ._rewriting import constant_int, is_zero_constant
from .descriptors import TmaSource
from .pointer_roots import pointer_roots, written_roots


# Ops an address computation may consist of to be recomputed for a later iteration (pure, cheap).
ADDRESS_OPS = ELEMENTWISE | frozenset({
    OpCode.CONSTANT, OpCode.SPLAT, OpCode.ARANGE, OpCode.BROADCAST, OpCode.EXPAND_DIMS, OpCode.RESHAPE,
    OpCode.TRANS, OpCode.PROGRAM_ID, OpCode.NUM_PROGRAMS,
})


@dataclasses.dataclass
class Candidate:
    load: Operation
    convert: Operation
    address_ops: list          # the ops computing the load's pointer and mask, in dependency order
    contiguous_dim: int
    width: int                 # elements per cp.async
    swizzle_bytes: Optional[int] = None   # a wgmma operand: the ring holds canonical wgmma tiles
    tma: Optional[TmaSource] = None       # a descriptor load the copy engine can do (passes/descriptors.py)
    multicast: int = 0                    # TMA multicast to this many CTAs of the cluster (`with_multicast`)
    multicast_rows: bool = False          # ... each copying a share of the rows of every box (else of the boxes)

    @property
    def alloc_attrs(self) -> dict:
        attrs = {"contiguous_dim": self.contiguous_dim}
        if self.swizzle_bytes is not None:
            attrs["swizzle_bytes"] = self.swizzle_bytes
        return attrs


def use_counts(function: Function) -> dict:
    counts: dict = {}
    for op in function.walk():
        for operand in op.operands:
            counts[id(operand)] = counts.get(id(operand), 0) + 1
    return counts


def _address_slice(body: Block, roots: list) -> Optional[list]:
    """The ops of `body` computing `roots` from the induction variable and outside values, in
    dependency order; None when they depend on a loop-carried value or an op that cannot be
    recomputed."""
    induction = body.args[0]
    ops, seen = [], set()

    def visit(value: Value) -> bool:
        if value is induction:
            return True
        if isinstance(value.owner, Block):
            return value.owner is not body
        op = value.defining_op
        if op.parent is not body:
            return True
        if id(op) in seen:
            return True
        if op.opcode not in ADDRESS_OPS or op.regions:
            return False
        if not all(visit(operand) for operand in op.operands):
            return False
        seen.add(id(op))
        ops.append(op)
        return True

    return ops if all(visit(root) for root in roots) else None


def find_candidates(loop: Operation, analysis, uses: dict) -> list:
    body = loop.regions[0]
    lower, upper, step = loop.operands[:3]
    induction = body.args[0]
    step_value = constant_int(step)
    if step_value is None or step_value <= 0 or not (lower.type == upper.type == induction.type == int32):
        return []
    written = written_roots(body)       # a load from memory the loop writes must not be fetched early
    if written is None:
        return []
    out = []
    for dot in body.ops:
        if dot.opcode != OpCode.DOT or dot.attrs.get("engine") not in ("mma", "wgmma"):
            continue
        for index in (0, 1):
            convert = dot.operands[index].defining_op
            if (convert is None or convert.opcode != OpCode.CONVERT_LAYOUT or "dot_operand" not in convert.attrs
                    or convert.parent is not body or uses.get(id(convert.result)) != 1):
                continue
            load = convert.operands[0].defining_op
            if load is None or load.opcode != OpCode.LOAD or load.parent is not body \
                    or uses.get(id(load.result)) != 1:
                continue
            if load.attrs.get("has_other") and not is_zero_constant(load.operands[-1]):
                continue
            read = pointer_roots(load.operands[0])
            if read is None or read & written:
                continue
            roots = load.operands[:2] if load.attrs.get("masked") else load.operands[:1]
            address_ops = _address_slice(body, roots)
            if address_ops is None:
                continue
            element = load.result.type.element
            dim = contiguous_dim(load.result.layout, element.bits)
            swizzle = None
            if is_shared_layout(convert.result.layout):       # a wgmma operand tile
                tile = convert.result.layout
                swizzle = wgmma_operand_tile(tile, index, element.bits).swizzle_bytes
                if shared_contiguous_dim(tile) != dim:
                    continue
            else:
                tile = mma_operand_shared(shape_of(load.result.type), element.bits, dim)
            width = copy_width(analysis, load, tile)
            tma = load.attrs.get("tma")
            if swizzle is None or tma is None or tma.contiguous_dim != dim:
                tma = None
            if width * element.itemsize < MIN_COPY_BYTES and tma is None:
                continue
            out.append(Candidate(load, convert, address_ops, dim, width, swizzle, tma))
    return out


# Rows of a swizzled tile that one swizzle pattern spans (1024 / 512 / 256 bytes for 128 / 64 / 32-byte rows): a
# share of a multicast tile split by rows starts on a multiple of it.
SWIZZLE_PATTERN_ROWS = 8


def with_multicast(candidates: list, cluster: int) -> list:
    """The candidates with `multicast` set to the cluster size where the copy engine fills their ring
    from a `desc.load(..., multicast=True)` of a kernel launched in clusters, and the tile splits evenly
    among the cluster's CTAs: by its boxes (one per swizzle atom along its contiguous dim), else by rows
    (`multicast_rows`: each CTA copies rows / cluster rows of every box, a whole number of swizzle
    patterns)."""
    out = []
    for candidate in candidates:
        source = candidate.tma
        if cluster > 1 and source is not None and source.multicast:
            element = candidate.load.result.type.element
            shape = shape_of(candidate.load.result.type)
            boxes = shape[candidate.contiguous_dim] * element.itemsize // candidate.swizzle_bytes
            rows = shape[1 - candidate.contiguous_dim]
            if boxes % cluster == 0:
                candidate = dataclasses.replace(candidate, multicast=cluster)
            elif rows % (SWIZZLE_PATTERN_ROWS * cluster) == 0:
                candidate = dataclasses.replace(candidate, multicast=cluster, multicast_rows=True)
        out.append(candidate)
    return out


def with_copy_engine(candidates: list) -> list:
    """The candidates of one loop, all filled by TMA when every one can be (one kind of wait per
    ring), else all by cp.async (dropping those too narrow for it)."""
    if candidates and all(c.tma is not None for c in candidates):
        return candidates
    return [dataclasses.replace(c, tma=None) for c in candidates
            if c.width * c.load.result.type.element.itemsize >= MIN_COPY_BYTES]
