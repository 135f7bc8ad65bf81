"""The building blocks of a pipelined loop's ring (passes/pipelining.py): its shared-memory tiles and
mbarriers, the copies into a slot, the prologue, the reads from it, the carried slot indices, and what
follows the loop (the in-flight wgmma's wait, the deallocs).
"""

from __future__ import annotations

from typing import Optional

from ..ir import Block, Operation, OpCode, Value
from ..ir.shared_buffer import SharedBufferType
from ..language.dtypes import BlockType, int1, int32, int64, shape_of
from ._pipelining_candidates import Candidate
from ._pipelining_overlap import Overlap
from ._rewriting import Inserter, constant_int, replace_uses


def _clone_address_ops(at: Inserter, candidate: Candidate, induction: Value, iteration: Value) -> dict:
    """Clone `candidate`'s address computation for the iteration whose induction value is
    `iteration`; returns id(original value) -> its clone (the induction variable -> `iteration`)."""
    mapping = {id(induction): iteration}
    for op in candidate.address_ops:
        clone = at.op(op.opcode, [mapping.get(id(v), v) for v in op.operands], [r.type for r in op.results],
                      dict(op.attrs), op.loc)
        for old, new in zip(op.results, clone.results):
            new.layout = old.layout
            mapping[id(old)] = new
    return mapping


def issue_copy(at: Inserter, candidate: Candidate, buffer: Value, index: Value, induction: Value,
               iteration: Value, upper: Value) -> None:
    """async_copy of `candidate`'s tile for the iteration whose induction value is `iteration`."""
    mapping = _clone_address_ops(at, candidate, induction, iteration)
    load = candidate.load
    layout = load.result.layout
    shape = shape_of(load.result.type)
    pointer = mapping.get(id(load.operands[0]), load.operands[0])
    in_range = at.value(OpCode.LT, [iteration, upper], int1)
    mask = at.value(OpCode.SPLAT, [in_range], BlockType(shape, int1), layout=layout)
    if load.attrs.get("masked"):
        mask = at.value(OpCode.AND, [mapping.get(id(load.operands[1]), load.operands[1]), mask],
                        BlockType(shape, int1), layout=layout)
    at.op(OpCode.ASYNC_COPY, [buffer, index, pointer, mask], [], {"masked": True, "width": candidate.width},
          load.loc)


def issue_tma_copy(at: Inserter, candidate: Candidate, buffer: Value, index: Value, barriers: Value,
                   induction: Value, iteration: Value, upper: Value) -> None:
    """tma_copy of `candidate`'s tile for the iteration whose induction value is `iteration` (the
    coordinates recomputed for it; nothing is copied past the loop's end)."""
    mapping = _clone_address_ops(at, candidate, induction, iteration)
    source = candidate.tma
    coordinates = [mapping.get(id(c), c) for c in source.coordinates]
    # Constant sizes and strides (ints specialized as 1) are made again here: the load that used
    # them is gone, and dead-code elimination may have removed their ops since.
    tensor = [at.constant(constant_int(v), v.type) if constant_int(v) is not None else v
              for v in (*source.shape, *source.strides)]
    in_range = at.value(OpCode.LT, [iteration, upper], int1)
    attrs = {"multicast": candidate.multicast} if candidate.multicast else {}
    if candidate.multicast_rows:
        attrs["multicast_rows"] = True
    at.op(OpCode.TMA_COPY, [buffer, index, barriers, source.base, *tensor, *coordinates, in_range], [], attrs,
          candidate.load.loc)


def next_index(at: Inserter, index: Value, num_stages: int) -> Value:
    incremented = at.value(OpCode.ADD, [index, at.constant(1)], int32)
    wrapped = at.value(OpCode.EQ, [incremented, at.constant(num_stages)], int1)
    return at.value(OpCode.WHERE, [wrapped, at.constant(0), incremented], int32)


def allocate_ring(before: Inserter, candidates: list, num_stages: int) -> list:
    """One `local_alloc` of `num_stages` tiles per candidate (its ring)."""
    buffers = []
    for candidate in candidates:
        element = candidate.load.result.type.element
        buffer_type = SharedBufferType(num_stages, shape_of(candidate.load.result.type), element)
        buffers.append(before.value(OpCode.LOCAL_ALLOC, [], buffer_type, candidate.alloc_attrs))
    return buffers


def full_barriers(before: Inserter, candidates: list, num_stages: int) -> Value:
    """One mbarrier per slot, on which every TMA copy into the slot arrives (with its bytes); with
    multicast copies, initialized before any CTA of the cluster copies (attr cluster_sync)."""
    attrs = {"mbarrier_arrivals": len(candidates)}
    if any(c.multicast for c in candidates):
        attrs["cluster_sync"] = True
    return before.value(OpCode.LOCAL_ALLOC, [], SharedBufferType(num_stages, (1,), int64), attrs)


def prologue(before: Inserter, issue, lower: Value, step_value: int, ahead_by: int) -> None:
    """Before the loop: `issue` the tiles of iterations 0 .. ahead_by - 1 into slots 0 .. ahead_by - 1."""
    for stage in range(ahead_by):
        iteration = lower if stage == 0 else before.value(
            OpCode.ADD, [lower, before.constant(stage * step_value)], int32)
        issue(before, before.constant(stage), iteration)


def read_from_ring(body: Block, candidates: list, buffers: list, read: Value) -> None:
    """Replace each candidate's load and dot-operand conversion by a `local_load` of slot `read`."""
    for candidate, buffer in zip(candidates, buffers):
        convert = candidate.convert
        at = Inserter(body, convert)
        loaded = at.value(OpCode.LOCAL_LOAD, [buffer, read], convert.result.type, layout=convert.result.layout)
        for user in body.ops:
            user.operands = [loaded if v is convert.result else v for v in user.operands]
        body.ops.remove(convert)
        body.ops.remove(candidate.load)


def carry(loop: Operation, before: Inserter, name: str, initial: int) -> Value:
    """A new int32 value carried by `loop` (block argument `name`, starting at `initial`) and its
    loop result; returns the block argument."""
    argument = loop.regions[0].add_argument(int32, name)
    loop.operands.append(before.constant(initial))
    loop.results.append(Value(int32, loop, len(loop.results)))
    return argument


def flip_on_wrap(at: Inserter, phase: Value, next_index: Value) -> Value:
    """`phase ^ 1` when the ring index `next_index` wrapped to 0, else `phase`."""
    wrapped = at.value(OpCode.EQ, [next_index, at.constant(0)], int1)
    flipped = at.value(OpCode.XOR, [phase, at.constant(1)], int32)
    return at.value(OpCode.WHERE, [wrapped, flipped, phase], int32)


def finish(loop: Operation, overlapped: Optional[Overlap], buffers: list, multicast: bool = False) -> None:
    """After `loop`: (`multicast`: the wait matching the last iteration's cluster arrival, so that no CTA
    frees or reuses its ring while another's multicast copy may still write it) retire an in-flight wgmma
    (before any use of its result; a conditional epilogue in the loop retires it first thing in its
    region) and free `buffers` in order (mbarrier arrays first in the list are freed last: their dealloc
    invalidates them once the first dealloc's CTA barrier passed)."""
    outer = loop.parent
    after_index = outer.ops.index(loop) + 1
    if multicast:
        sync = Operation(OpCode.CLUSTER_BARRIER, [], [], {"half": "wait"}, (), loop.loc)
        sync.parent = outer
        outer.ops.insert(after_index, sync)
        after_index += 1
    if overlapped is not None:
        overlapped.dot.attrs["pending"] = 1
        if overlapped.branch is not None:
            _insert_wait(overlapped.branch.regions[0], 0, overlapped.dot.result, loop.loc)
        _insert_wait(outer, after_index, loop.results[overlapped.index], loop.loc)
        after_index += 1
    for buffer in buffers:
        dealloc = Operation(OpCode.LOCAL_DEALLOC, [buffer], [], {}, (), loop.loc)
        dealloc.parent = outer
        outer.ops.insert(after_index, dealloc)


def _insert_wait(block: Block, index: int, result: Value, loc) -> None:
    """`wgmma_wait {pending = 0}` of `result` at `block.ops[index]`; the ops after it use its result."""
    wait = Operation(OpCode.WGMMA_WAIT, [result], [result.type], {"pending": 0}, (), loc)
    wait.results[0].layout = result.layout
    wait.parent = block
    block.ops.insert(index, wait)
    replace_uses(block, index + 1, result, wait.results[0])
