"""Sibling reductions: independent reductions along one axis of one layout share a cross-warp exchange.

A reduction whose axis spans several warps ends in an exchange through shared memory
(codegen/reduce.py): a barrier, each warp's partials stored, a barrier, every thread loading the
partials of all warps. Two such reductions that do not depend on each other (LayerNorm's backward:
sum(xhat * g) and sum(g) of a row; the dweight and dbias column sums) can store their partials side by
side and pay for one exchange: two barriers instead of four, and the shuffle trees of both in flight
together.

This pass groups them, block by block: for each REDUCE whose plan crosses warps, the later REDUCEs of
the same block with the same kind, axis, element type and operand layout whose operand does not depend
on it (directly or through the ops between them) join its group. Each joining reduction moves to right
after the group's last member, and the ops between them that compute its operand, all pure (no load,
store, atomic, barrier or control flow; at most MAX_MOVED of them), move to before the group's first
member, in their order; a group stays within MAX_GROUP members, MAX_GROUP_SCRATCH_BYTES of shared
memory and MAX_GROUP_LOADS partials loaded per thread. The first member records the group's size in attr `exchange_group`, the others
are marked `exchange_follower`; codegen lowers the group at its first member. A reordering of
independent pure ops: the program's results are unchanged, bit for bit (each reduction still combines
its own values in the same order). (Moved layout conversions stay safe: every user of the shared
scratch starts with a barrier.)

Runs after layout assignment (it compares layouts and needs the reduction plan). Of the library's
kernels, the norms' take it (the fused, persistent and split backward's c1/c2 row sums, the dweight/dbias
column sums, the looped forward). H200, fp16, M = 8192, the backward kernels x torch's (aten) in the
same process, without -> with the pass (2026-12-01, two runs each): LayerNorm N = 1024 1.93 -> 1.95,
2048 1.86-1.88 -> 1.89-1.91, 4096 1.80 -> 1.81, 8192 2.02 -> 2.05-2.07, 16384 1.18 -> 1.18.
"""

from __future__ import annotations

from typing import Optional

from ..errors import UnsupportedError
from ..ir.core import Block, Function, Operation
from ..ir.ops import ELEMENTWISE, OpCode
from ..codegen import layout_access
from ..codegen.shared import storage_bytes
from ..layouts.reduction import reduction_plan

# Ops that may move (pure, no memory access, no regions): elementwise math and shape ops.
_MOVABLE = ELEMENTWISE | frozenset({
    OpCode.CONSTANT, OpCode.SPLAT, OpCode.BROADCAST, OpCode.EXPAND_DIMS, OpCode.RESHAPE, OpCode.TRANS,
    OpCode.CONVERT_LAYOUT, OpCode.ARANGE, OpCode.PROGRAM_ID, OpCode.NUM_PROGRAMS,
}) - frozenset({OpCode.ADDPTR})
# At most this many ops move in front of a group for one joining reduction (its operand's computation).
MAX_MOVED = 16
# At most this many reductions share one exchange.
MAX_GROUP = 4
# A group's exchange holds every member's partials at once: at most this many bytes of shared memory
# (the members' scratch side by side; a kernel whose single exchanges fit must not stop launching: two
# float32 column sums of a (32, 2048) tile on 16 warps would take 256 KiB; the norms' dweight and dbias
# sums of 2048 columns take 32 KiB), and
# at most this many partials loaded by each thread after its second barrier (members x result elements
# per thread x warp groups; ptxas spilled 3.6 KB where four int8 -> int32 column sums of a (128, 64) tile
# on 8 warps, 4 x 8 x 8 loads, were grouped, none at four sums of 4 x 4 x 8; the norms' row sums load
# 2 x 2 x 8).
MAX_GROUP_SCRATCH_BYTES = 32 * 1024
MAX_GROUP_LOADS = 128


def group_sibling_reductions(function: Function) -> bool:
    """Group the independent cross-warp reductions of every block of `function` (see the module
    docstring); True when the IR changed."""
    changed = False
    for op in list(function.walk()):
        for region in op.regions:
            changed |= _group_block(region)
    return _group_block(function.body) or changed


def _exchange_cost(op: Operation) -> Optional[tuple]:
    """(scratch bytes, partials each thread loads) of `op`'s cross-warp exchange, or None where it has
    none (the axis within a warp, or a layout the reduction plan does not take)."""
    source = op.operands[0]
    if source.layout is None or not hasattr(source.type, "shape"):
        return None
    try:
        plan = reduction_plan(source.layout, op.attrs["axis"])
    except UnsupportedError:
        return None
    if not plan.warp_bits:
        return None
    groups = 1 << len(plan.warp_bits)
    numel = 1
    for size in layout_access.shape(plan.result_layout):
        numel *= size
    per_thread = 1 << len(plan.kept_register_bits)
    return numel * groups * storage_bytes(source.type.element), per_thread * groups


def _siblings(a: Operation, b: Operation) -> bool:
    return (b.opcode == OpCode.REDUCE and b.attrs.get("kind") == a.attrs.get("kind")
            and b.attrs.get("axis") == a.attrs.get("axis") and b.operands[0].type == a.operands[0].type
            and b.operands[0].layout == a.operands[0].layout and "exchange_group" not in b.attrs
            and "exchange_follower" not in b.attrs)


def _operand_computation(ops: list, start: int, end: int, candidate: Operation, group: list) -> Optional[list]:
    """The ops of ops[start:end] that compute `candidate`'s operand, in order, or None where one of
    them is not movable or uses a result of `group` (the operand depends on the group)."""
    needed = {id(v) for v in candidate.operands}
    moved = []
    group_results = {id(r) for member in group for r in member.results}
    if needed & group_results:
        return None
    for op in reversed(ops[start:end]):
        if not any(id(r) in needed for r in op.results):
            continue
        if op.opcode not in _MOVABLE or op.regions or any(id(v) in group_results for v in op.operands):
            return None
        moved.append(op)
        needed.update(id(v) for v in op.operands)
        if len(moved) > MAX_MOVED:
            return None
    moved.reverse()
    return moved


def _group_block(block: Block) -> bool:
    changed = False
    i = 0
    while i < len(block.ops):
        first = block.ops[i]
        cost = None
        if first.opcode == OpCode.REDUCE and not {"exchange_group", "exchange_follower"} & first.attrs.keys():
            cost = _exchange_cost(first)
        if cost is None:
            i += 1
            continue
        scratch, loads = cost
        most = min(MAX_GROUP, MAX_GROUP_SCRATCH_BYTES // scratch, MAX_GROUP_LOADS // loads)
        group = [first]
        j = i + 1
        while j < len(block.ops) and len(group) < most:
            candidate = block.ops[j]
            last = block.ops.index(group[-1])
            if _siblings(first, candidate):
                moved = _operand_computation(block.ops, last + 1, j, candidate, group)
                if moved is not None:
                    _move(block, moved, candidate, first, group[-1])
                    group.append(candidate)
                    changed = True
            j += 1
        if len(group) > 1:
            first.attrs["exchange_group"] = len(group)
            for member in group[1:]:
                member.attrs["exchange_follower"] = True
        i = block.ops.index(group[-1]) + 1
    return changed


def _move(block: Block, moved: list, candidate: Operation, first: Operation, last: Operation) -> None:
    """Move `moved` to just before `first` and `candidate` to just after `last` (in block.ops)."""
    skip = {id(op) for op in moved} | {id(candidate)}
    ops = []
    for op in block.ops:
        if id(op) in skip:
            continue
        if op is first:
            ops.extend(moved)
        ops.append(op)
        if op is last:
            ops.append(candidate)
    block.ops = ops
