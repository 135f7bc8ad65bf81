"""Software pipelining: the loads that feed a tensor-core `dot` inside a `for` loop become
`cp.async` copies into a ring of `num_stages` shared-memory tiles, issued `num_stages - 1`
iterations ahead, so the copies of later iterations are in flight while this one computes.

Before (the layout pass made A a dot operand through `convert_layout {dot_operand}`):

    for %k in range(%lb, %ub, STEP) iter(%acc):
        %p = <address of A at %k>;  %m = <mask at %k>
        %a = load %p, %m, 0.0;  %a_op = convert_layout %a {dot_operand=0}
        %acc2 = dot %a_op, ..., %acc

After, with S = num_stages:

    %buf = local_alloc : !shared<S x tile>
    for s in 0 .. S-2:                                   (prologue, unrolled)
        async_copy %buf[s], <address at %lb + s*STEP>, <mask> & (%lb + s*STEP < %ub);  async_commit
    for %k ... iter(%acc, %read = 0, %write = S-1):
        async_wait {pending = S-2}     (this iteration's tile has landed; a CTA barrier also makes
                                        every thread done reading the tile written next)
        async_copy %buf[%write], <address at %k + (S-1)*STEP>, <mask> & (%k + (S-1)*STEP < %ub)
        async_commit
        %a_op = local_load %buf[%read]            (ldmatrix, in the dot operand layout)
        %acc2 = dot %a_op, ..., %acc
        yield %acc2, (%read + 1) mod S, (%write + 1) mod S
    local_dealloc %buf                             (waits for the copies still in flight)

Masked-off elements are zero-filled (cp.async with src-size 0), so a load qualifies when its
`other` is 0 (or absent), its only use is the dot-operand conversion, its address and mask depend
only on the induction variable and values defined outside the loop (they are recomputed for the
later iteration), the step is a positive constant, and the pointer analysis proves copies of at
least 4 bytes (16 for `cp.async.cg`): contiguity and alignment of the pointer and constancy of the
mask along the tile's contiguous dim. Loops with nothing that qualifies are left alone (the dot
then stages its operands through scratch shared memory synchronously).

Source of the schedule: the multistage mainloop of CUTLASS (`MmaMultistage`) and Triton's
software pipeliner, written here for our IR.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..ir import Block, Function, Operation, OpCode, Value
from ..ir.ops import ELEMENTWISE
from ..ir.shared_buffer import SharedBufferType
from ..language.dtypes import BlockType, int1, int32, shape_of
from ..layouts.mma_shared import mma_operand_shared
from ..layouts.shared import shared_offsets
from ..layouts.swizzle import contiguous_dim
from ..layouts.vectorize import vector_width as register_vector_width
from ._axis_info import floor_pow2
from .dce import eliminate_dead_code
from .pointer_analysis import analyze_pointers

# Ops an address computation may consist of to be recomputed for a later iteration (pure, cheap).
_ADDRESS_OPS = ELEMENTWISE | frozenset({
    OpCode.CONSTANT, OpCode.SPLAT, OpCode.ARANGE, OpCode.BROADCAST, OpCode.EXPAND_DIMS, OpCode.RESHAPE,
    OpCode.TRANS, OpCode.PROGRAM_ID, OpCode.NUM_PROGRAMS,
})
MIN_COPY_BYTES = 4


@dataclasses.dataclass
class _Candidate:
    load: Operation
    convert: Operation
    address_ops: list          # the ops computing the load's pointer and mask, in dependency order
    contiguous_dim: int
    width: int                 # elements per cp.async


def pipeline_loops(function: Function, num_stages: int) -> bool:
    """Pipeline every `for` loop with qualifying dot-operand loads `num_stages` deep (see the
    module docstring). num_stages < 2 does nothing. Returns whether the IR changed."""
    if num_stages < 2:
        return False
    analysis = analyze_pointers(function)
    uses = _use_counts(function)
    changed = False
    for loop in [op for op in function.walk() if op.opcode == OpCode.FOR]:
        candidates = _candidates(loop, analysis, uses)
        if candidates:
            _pipeline(loop, candidates, num_stages)
            changed = True
    if changed:
        eliminate_dead_code(function)
    return changed


def _use_counts(function: Function) -> dict:
    counts: dict = {}
    for op in function.walk():
        for operand in op.operands:
            counts[id(operand)] = counts.get(id(operand), 0) + 1
    return counts


def _constant_int(value: Value) -> Optional[int]:
    op = value.defining_op
    if op is None or op.opcode != OpCode.CONSTANT or isinstance(value.type, BlockType):
        return None
    constant = op.attrs.get("value")
    return constant if isinstance(constant, int) and not isinstance(constant, bool) else None


def _is_zero_constant(value: Value) -> bool:
    op = value.defining_op
    return op is not None and op.opcode == OpCode.CONSTANT and op.attrs.get("value") == 0


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
        if op.opcode not in _ADDRESS_OPS or op.regions:
            return False
        if not all(visit(operand) for operand in op.operands):
            return False
        seen.add(id(op))
        ops.append(op)
        return True

    return ops if all(visit(root) for root in roots) else None


def _copy_width(analysis, load: Operation, dim: int) -> int:
    """Elements per cp.async along `dim` that the layout, the tile and the proven facts allow."""
    pointer = load.operands[0]
    element = pointer.type.element.element
    size = element.itemsize
    layout = pointer.layout
    tile = mma_operand_shared(shape_of(pointer.type), element.bits, dim)
    width = min(register_vector_width(layout, dim, element.bits),
                register_vector_width(shared_offsets(layout, tile), 0, element.bits))
    info = analysis.get(pointer)
    if info is None:
        return 1
    width = min(width, info.contiguity[dim], info.divisibility[dim] // size)
    if load.attrs.get("masked"):
        mask_info = analysis.get(load.operands[1])
        width = min(width, mask_info.constancy[dim] if mask_info is not None else 1)
    return floor_pow2(max(1, width))


def _candidates(loop: Operation, analysis, uses: dict) -> list:
    body = loop.regions[0]
    lower, upper, step = loop.operands[:3]
    induction = body.args[0]
    step_value = _constant_int(step)
    if step_value is None or step_value <= 0 or not (lower.type == upper.type == induction.type == int32):
        return []
    out = []
    for dot in body.ops:
        if dot.opcode != OpCode.DOT or dot.attrs.get("engine") != "mma":
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
            if load.attrs.get("has_other") and not _is_zero_constant(load.operands[-1]):
                continue
            roots = load.operands[:2] if load.attrs.get("masked") else load.operands[:1]
            address_ops = _address_slice(body, roots)
            if address_ops is None:
                continue
            element = load.result.type.element
            dim = contiguous_dim(load.result.layout, element.bits)
            width = _copy_width(analysis, load, dim)
            if width * element.itemsize < MIN_COPY_BYTES:
                continue
            out.append(_Candidate(load, convert, address_ops, dim, width))
    return out


# -- rewriting -------------------------------------------------------------------------------------------

class _Inserter:
    """Creates ops before a fixed anchor op (or at the end of a block's non-terminator ops)."""

    def __init__(self, block: Block, anchor: Operation):
        self.block, self.anchor = block, anchor

    def op(self, opcode: OpCode, operands, result_types, attrs=None, loc=None, layout=None) -> Operation:
        op = Operation(opcode, operands, result_types, attrs, (), loc or self.anchor.loc)
        op.parent = self.block
        self.block.ops.insert(self.block.ops.index(self.anchor), op)
        if layout is not None:
            for result in op.results:
                result.layout = layout
        return op

    def value(self, opcode, operands, result_type, attrs=None, layout=None) -> Value:
        return self.op(opcode, operands, [result_type], attrs, layout=layout).results[0]

    def constant(self, value: int, type_=int32) -> Value:
        return self.value(OpCode.CONSTANT, [], type_, {"value": value})


def _issue_copy(at: _Inserter, candidate: _Candidate, buffer: Value, index: Value, induction: Value,
                iteration: Value, upper: Value) -> None:
    """async_copy of `candidate`'s tile for the iteration whose induction value is `iteration`."""
    mapping = {id(induction): iteration}
    for op in candidate.address_ops:
        clone = at.op(op.opcode, [mapping.get(id(v), v) for v in op.operands], [r.type for r in op.results],
                      dict(op.attrs), op.loc)
        for old, new in zip(op.results, clone.results):
            new.layout = old.layout
            mapping[id(old)] = new
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


def _next_index(at: _Inserter, index: Value, num_stages: int) -> Value:
    incremented = at.value(OpCode.ADD, [index, at.constant(1)], int32)
    wrapped = at.value(OpCode.EQ, [incremented, at.constant(num_stages)], int1)
    return at.value(OpCode.WHERE, [wrapped, at.constant(0), incremented], int32)


def _pipeline(loop: Operation, candidates: list, num_stages: int) -> None:
    outer = loop.parent
    body = loop.regions[0]
    lower, upper, step = loop.operands[:3]
    induction = body.args[0]
    step_value = _constant_int(step)
    before = _Inserter(outer, loop)
    buffers = []
    for candidate in candidates:
        element = candidate.load.result.type.element
        buffer_type = SharedBufferType(num_stages, shape_of(candidate.load.result.type), element)
        buffers.append(before.value(OpCode.LOCAL_ALLOC, [], buffer_type, {"contiguous_dim": candidate.contiguous_dim}))

    # Prologue: the tiles of iterations 0 .. num_stages - 2.
    for stage in range(num_stages - 1):
        iteration = lower if stage == 0 else before.value(
            OpCode.ADD, [lower, before.constant(stage * step_value)], int32)
        for candidate, buffer in zip(candidates, buffers):
            _issue_copy(before, candidate, buffer, before.constant(stage), induction, iteration, upper)
        before.op(OpCode.ASYNC_COMMIT, [], [])

    # Loop-carried ring indices: the tile this iteration reads, and the one it fills.
    read = body.add_argument(int32, "read_stage")
    write = body.add_argument(int32, "write_stage")
    loop.operands.extend([before.constant(0), before.constant(num_stages - 1)])
    for _ in range(2):
        loop.results.append(Value(int32, loop, len(loop.results)))

    head = _Inserter(body, body.ops[0])
    head.op(OpCode.ASYNC_WAIT, [], [], {"pending": num_stages - 2})
    ahead = head.value(OpCode.ADD, [induction, head.constant((num_stages - 1) * step_value)], int32)
    for candidate, buffer in zip(candidates, buffers):
        _issue_copy(head, candidate, buffer, write, induction, ahead, upper)
    head.op(OpCode.ASYNC_COMMIT, [], [])

    for candidate, buffer in zip(candidates, buffers):
        convert = candidate.convert
        at = _Inserter(body, convert)
        loaded = at.value(OpCode.LOCAL_LOAD, [buffer, read], convert.result.type, layout=convert.result.layout)
        for user in body.ops:
            user.operands = [loaded if v is convert.result else v for v in user.operands]
        body.ops.remove(convert)
        body.ops.remove(candidate.load)

    tail = _Inserter(body, body.terminator)
    body.terminator.operands.extend([_next_index(tail, read, num_stages), _next_index(tail, write, num_stages)])

    after_index = outer.ops.index(loop) + 1
    for buffer in buffers:
        dealloc = Operation(OpCode.LOCAL_DEALLOC, [buffer], [], {}, (), loop.loc)
        dealloc.parent = outer
        outer.ops.insert(after_index, dealloc)
