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
mask along the tile's contiguous dim. It must also read memory the loop does not write: its pointer's
kernel arguments (passes/pointer_roots.py) are not those of any store or atomic in the loop, and a loop
writing through a pointer of unknown origin is not pipelined (a later trip's copy would be issued before
this trip's store to the same memory). Loops with nothing that qualifies are left alone (the dot
then stages its operands through scratch shared memory synchronously).

wgmma dots (sm_90a, `dot_layouts.uses_wgmma`): the dot-operand conversion asks for a *shared*
layout, the canonical wgmma tile; the ring's tiles take that layout (`local_alloc {swizzle_bytes}`),
`local_load` gives the dot the slot itself (wgmma reads it through a descriptor), and the
`async_wait` carries `proxy_fence` (codegen adds `fence.proxy.async.shared::cta` before its barrier:
cp.async writes through the generic proxy, wgmma reads through the async proxy). When the loop's
only dot is such a wgmma reading both operands from the ring into a carried accumulator that
nothing else reads (`_overlappable_dot`) and num_stages >= 3, the dot stays in flight into the next
iteration (`dot {pending=1}`: `wgmma.wait_group 1` after it) and the copies run one iteration less
ahead, so the slot the in-flight wgmma reads is not overwritten:

    (prologue: iterations 0 .. S-3)
    for %k ... iter(%acc, %read = 0, %write = S-2):
        async_wait {pending = S-3, proxy_fence}   (tile k landed; the barrier also means every
                                                   warpgroup retired the wgmma of iteration k-2)
        async_copy %buf[%write], <address at %k + (S-2)*STEP>      (slot of iteration k-2)
        %acc2 = dot local_load %a[%read], local_load %b[%read], %acc {pending = 1}
    %acc3 = wgmma_wait %acc_final {pending = 0}       (before local_dealloc and any use)

A persistent kernel's flattened loop may read the accumulator in the loop, in an `if` whose
else-region passes the dot's result on (`if last_k: epilogue(acc); acc = zeros`): the dot stays in
flight and the then-region begins with `wgmma_wait {pending = 0}` of it.

TMA (sm_90a, FUSEDOPS_TMA=1): when every candidate of the loop is a wgmma operand loaded by a
tensor descriptor that the copy engine can read (`load {tma}`, passes/descriptors.py), the ring is
filled by `tma_copy` instead (one thread: mbarrier expect_tx + one cp.async.bulk.tensor per swizzle
atom of the tile, out-of-bounds boxes zero-filled by the engine), with one mbarrier per slot
(`local_alloc {mbarrier_arrivals}`: each copy into the slot arrives once) and a carried phase bit:

    for %k ... iter(%acc, %read, %write, %phase = 0):
        mbarrier_wait %barriers[%read], %phase     (tile k landed; then a CTA barrier, as above)
        tma_copy %buf[%write], <coordinates at %k + ahead * STEP>, predicate %k + ahead * STEP < %ub
        ...
        yield ..., %phase ^ (next %read == 0)

Copies past the loop's end are not issued, so no copy is in flight after it and no barrier phase is
left pending; the barriers' dealloc invalidates them (mbarrier.inval) before the memory is reused.
The same schedule (ahead_by, the in-flight wgmma) applies; only the wait and the copies differ.

TMA with FUSEDOPS_WS=1 (runtime/knobs.py): no CTA barrier in the loop. A second array of mbarriers,
"empty" (`local_alloc {mbarrier_per_warp}`: one arrival per warp completes a phase), tells the issuing
thread that every warp retired the wgmma reading a slot. With lag = 1 when the wgmma stays in flight
(it still reads the previous slot) and 0 otherwise, copies run ahead_by = S - lag iterations ahead
(one more than above) and iteration k does

    mbarrier_wait %full[%read], %phase {cta_barrier = false}      (every thread: tile k landed)
    %acc2 = dot local_load ..[%read] {pending = lag}               (wgmma k-1 retired when lag = 1)
    mbarrier_arrive %empty[%write] if k >= lag                     (slot of iteration k - lag free:
                                                                    one arrival per warp)
    mbarrier_wait %empty[%write], %write_phase ^ 1 {issuer}         (thread 0: every warp released it)
    tma_copy %buf[%write], <at %k + ahead_by * STEP>                (iteration j = k + ahead_by)

Phase bookkeeping (PTX ISA 9.7.13.15: a phase completes when its pending arrivals and transaction
bytes reach zero; `try_wait.parity P` succeeds once the phase of parity P is complete, and waiting
on the parity of the phase *before* the current one succeeds at once). Fill j of slot j % S is the
(j // S)-th fill of that slot, so consumers wait full[j % S] with parity (j // S) & 1 (%phase flips
when %read wraps). Fill j may start once the (j // S - 1)-th release of its slot, that of iteration
j - S, completed: parity (j // S - 1) & 1 = ((j // S) & 1) ^ 1 (%write_phase = (j // S) & 1 flips
when %write wraps). For j < S that is the phase "before" phase 0 of a fresh barrier: no wait, no
special case. Neither barrier can run two phases ahead of its waiter: fill j waits for the release
of j - S, and that release follows the consumers' wait for fill j - S. Iteration k releases the
slot of k - lag = j - S (so %write is the slot released and refilled), the copy waits for the
releases of this same iteration by the other warps only, and those depend on nothing this thread
has still to do: no cycle. Fills past the loop's end are not issued; the releases that no fill
waits for leave phases pending, which mbarrier.inval at the dealloc discards.
tests/test_warp_specialization.py simulates this protocol (ragged trip counts, 0 and 1 steps).

TMA with FUSEDOPS_WS=2: the same barriers, with a producer warpgroup (`_pipeline_with_producer_warp`): 4
more warps of the CTA run a `producer_warp` region before the loop, a loop of its own that waits on the empty
barriers and issues every fill, then leaves the kernel; the consumer warps only wait for full slots and
release them. Only for a loop of the kernel's top-level block with nothing but register computations
before it (the producer runs those too); elsewhere 1's schedule. The producer gives most of its registers
to the consumers (setmaxnreg, codegen/async_copy.py). tests/test_producer_warp.py.

TMA multicast (`desc.load(..., multicast=True)` in a kernel with `dsl.cluster_dims(n)`, n > 1): the n CTAs of
a cluster load the same tile, so each copies 1/n of it (`_with_multicast`: its share of the boxes, or of
every box's rows where the boxes do not split) into the same slot of all n (`tma_copy {multicast = n}`),
and every CTA still expects the whole tile on its own slot barrier (a peer's bytes may land before this
CTA's expect_tx: the transaction count goes negative meanwhile, which the mbarrier allows). A slot is
refilled once every CTA of the cluster is done with it, so the CTA barrier of the schedule above becomes
a cluster barrier split in halves around the loop's back edge (FUSEDOPS_WS=1's empty barriers do not
apply: a release would have to reach every CTA's barrier):

    local_alloc {mbarrier_arrivals, cluster_sync}    (init, fence, then a whole cluster barrier: the
                                                      peers' first copies complete on these barriers)
    (prologue copies);  cluster_barrier {half = arrive}
    for %k ...:
        mbarrier_wait %barriers[%read], %phase {cluster_wait}   (tile k landed; every thread of every
                                         CTA arrived after retiring the wgmma of k - 2: its slot is free)
        tma_copy {multicast = n} ...;  dot ...  (wgmma k - 1 retired)
        cluster_barrier {half = arrive}                       (relaxed: a completed read to publish)
    cluster_barrier {half = wait}        (no CTA leaves or reuses its ring while a peer may write it)

Source of the schedule: the multistage mainloop of CUTLASS (`MmaMultistage`) and Triton's
software pipeliner, written here for our IR.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..ir import Block, Function, Operation, OpCode, Value
from ..ir.ops import ELEMENTWISE, cluster_size
from ..ir.shared_buffer import SharedBufferType
from ..language.dtypes import BlockType, int1, int32, int64, shape_of
from ..layouts.mma_shared import (is_shared_layout, mma_operand_shared, shared_contiguous_dim,
                                  wgmma_operand_tile)
from ..layouts.shared import shared_offsets
from ..layouts.swizzle import contiguous_dim
from ..layouts.vectorize import vector_width as register_vector_width
from ._axis_info import floor_pow2
from .dce import eliminate_dead_code
from .descriptors import TmaSource
from .pointer_analysis import analyze_pointers
from .pointer_roots import pointer_roots, written_roots

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
    swizzle_bytes: Optional[int] = None   # a wgmma operand: the ring holds canonical wgmma tiles
    tma: Optional[TmaSource] = None       # a descriptor load the copy engine can do (passes/descriptors.py)
    multicast: int = 0                    # TMA multicast to this many CTAs of the cluster (`_with_multicast`)
    multicast_rows: bool = False          # ... each copying a share of the rows of every box (else of the boxes)

    @property
    def alloc_attrs(self) -> dict:
        attrs = {"contiguous_dim": self.contiguous_dim}
        if self.swizzle_bytes is not None:
            attrs["swizzle_bytes"] = self.swizzle_bytes
        return attrs


def pipeline_loops(function: Function, num_stages: int, num_warps: int = 4) -> bool:
    """Pipeline every `for` loop with qualifying dot-operand loads `num_stages` deep (see the
    module docstring). num_stages < 2 does nothing. Returns whether the IR changed. A TMA ring
    synchronizes as FUSEDOPS_WS says (runtime/knobs.py)."""
    if num_stages < 2:
        return False
    from ..runtime import knobs
    mode = knobs.current().ws
    analysis = analyze_pointers(function)
    uses = _use_counts(function)
    cluster = cluster_size(function)
    changed = False
    for loop in [op for op in function.walk() if op.opcode == OpCode.FOR]:
        candidates = _with_multicast(_with_copy_engine(_candidates(loop, analysis, uses)), cluster)
        if candidates:
            overlapped = _overlappable_dot(loop, candidates, uses, num_stages)
            if candidates[0].tma is not None and mode >= 1 and not any(c.multicast for c in candidates):
                if mode == 2 and cluster == 1 and _producer_warp_fits(function, loop, num_warps):
                    _pipeline_with_producer_warp(loop, candidates, num_stages, overlapped)
                else:
                    _pipeline_with_empty_barriers(loop, candidates, num_stages, overlapped)
            else:
                _pipeline(loop, candidates, num_stages, overlapped)
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


def constant_int(value: Value) -> Optional[int]:
    op = value.defining_op
    if op is None or op.opcode != OpCode.CONSTANT or isinstance(value.type, BlockType):
        return None
    constant = op.attrs.get("value")
    return constant if isinstance(constant, int) and not isinstance(constant, bool) else None


def is_zero_constant(value: Value) -> bool:
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


def copy_width(analysis, load: Operation, tile) -> int:
    """Elements per cp.async along the tile's contiguous dim that the layout, the tile and the
    proven facts allow."""
    pointer = load.operands[0]
    element = pointer.type.element.element
    layout = pointer.layout
    dim = shared_contiguous_dim(tile)
    width = min(register_vector_width(layout, dim, element.bits),
                register_vector_width(shared_offsets(layout, tile), 0, element.bits))
    return floor_pow2(max(1, min(width, proven_copy_width(analysis, load, dim))))


def proven_copy_width(analysis, load: Operation, dim: int) -> int:
    """Elements per copy along `dim` that the pointer analysis proves for `load` (contiguous, aligned,
    and masked alike), whatever the layouts; 1 when nothing is known."""
    info = analysis.get(load.operands[0])
    if info is None:
        return 1
    width = min(info.contiguity[dim], info.divisibility[dim] // load.result.type.element.itemsize)
    if load.attrs.get("masked"):
        mask_info = analysis.get(load.operands[1])
        width = min(width, mask_info.constancy[dim] if mask_info is not None else 1)
    return width


def _candidates(loop: Operation, analysis, uses: dict) -> list:
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
            out.append(_Candidate(load, convert, address_ops, dim, width, swizzle, tma))
    return out


# Rows of a swizzled tile that one swizzle pattern spans (1024 / 512 / 256 bytes for 128 / 64 / 32-byte rows): a
# share of a multicast tile split by rows starts on a multiple of it.
SWIZZLE_PATTERN_ROWS = 8


def _with_multicast(candidates: list, cluster: int) -> list:
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


def _with_copy_engine(candidates: list) -> list:
    """The candidates of one loop, all filled by TMA when every one can be (one kind of wait per
    ring), else all by cp.async (dropping those too narrow for it)."""
    if candidates and all(c.tma is not None for c in candidates):
        return candidates
    return [dataclasses.replace(c, tma=None) for c in candidates
            if c.width * c.load.result.type.element.itemsize >= MIN_COPY_BYTES]


@dataclasses.dataclass
class _Overlap:
    """A wgmma that may stay in flight into the next iteration: its carried accumulator `index`, the
    `dot`, and the `branch` (an `if` of the body) whose then-region reads its result, or None."""
    index: int
    dot: Operation
    branch: Optional[Operation] = None


def _overlappable_dot(loop: Operation, candidates: list, uses: dict, num_stages: int) -> Optional[_Overlap]:
    """The loop's wgmma when it may stay in flight into the next iteration (wait_group 1): the body's
    only dot is a wgmma reading both operands from the ring, accumulating into a carried value that
    nothing else in the loop reads; at least 3 stages (the in-flight wgmma keeps one slot). Its result
    is either yielded and read by nothing else, or read in the then-region of an `if` of the body
    whose else-region yields it unchanged to the carried accumulator (a persistent kernel's
    `if last k: epilogue(acc); acc = zeros`): that region waits for it first. None otherwise."""
    body = loop.regions[0]
    dots = [op for op in body.walk() if op.opcode == OpCode.DOT]
    if num_stages < 3 or len(dots) != 1 or dots[0].attrs.get("engine") != "wgmma" or dots[0].parent is not body:
        return None
    dot = dots[0]
    ring = {id(c.convert.result) for c in candidates}
    if not all(id(v) in ring for v in dot.operands[:2]):
        return None
    acc, terminator = dot.operands[2], body.terminator
    if acc.owner is not body or acc.index == 0 or uses.get(id(acc)) != 1:
        return None
    index = acc.index - 1
    yielded = terminator.operands[index]
    if yielded is dot.result:
        return _Overlap(index, dot) if uses.get(id(dot.result)) == 1 else None
    branch = yielded.defining_op
    if branch is None or branch.opcode != OpCode.IF or branch.parent is not body or uses.get(id(yielded)) != 1:
        return None
    then_region, else_region = branch.regions
    if else_region.terminator.operands[yielded.index] is not dot.result:
        return None
    in_then = sum(v is dot.result for op in then_region.ops for nested in op.walk() for v in nested.operands)
    return _Overlap(index, dot, branch) if in_then + 1 == uses.get(id(dot.result)) else None


def replace_uses(block: Block, start: int, old: Value, new: Value) -> None:
    """Make the ops of `block` from index `start` on (and their regions) use `new` for `old`."""
    for op in block.ops[start:]:
        for nested in op.walk():
            nested.operands = [new if v is old else v for v in nested.operands]


# -- rewriting -------------------------------------------------------------------------------------------

class Inserter:
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


def _clone_address_ops(at: Inserter, candidate: _Candidate, induction: Value, iteration: Value) -> dict:
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


def _issue_copy(at: Inserter, candidate: _Candidate, buffer: Value, index: Value, induction: Value,
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


def _issue_tma_copy(at: Inserter, candidate: _Candidate, buffer: Value, index: Value, barriers: Value,
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


def _next_index(at: Inserter, index: Value, num_stages: int) -> Value:
    incremented = at.value(OpCode.ADD, [index, at.constant(1)], int32)
    wrapped = at.value(OpCode.EQ, [incremented, at.constant(num_stages)], int1)
    return at.value(OpCode.WHERE, [wrapped, at.constant(0), incremented], int32)


def _allocate_ring(before: Inserter, candidates: list, num_stages: int) -> list:
    """One `local_alloc` of `num_stages` tiles per candidate (its ring)."""
    buffers = []
    for candidate in candidates:
        element = candidate.load.result.type.element
        buffer_type = SharedBufferType(num_stages, shape_of(candidate.load.result.type), element)
        buffers.append(before.value(OpCode.LOCAL_ALLOC, [], buffer_type, candidate.alloc_attrs))
    return buffers


def _full_barriers(before: Inserter, candidates: list, num_stages: int) -> Value:
    """One mbarrier per slot, on which every TMA copy into the slot arrives (with its bytes); with
    multicast copies, initialized before any CTA of the cluster copies (attr cluster_sync)."""
    attrs = {"mbarrier_arrivals": len(candidates)}
    if any(c.multicast for c in candidates):
        attrs["cluster_sync"] = True
    return before.value(OpCode.LOCAL_ALLOC, [], SharedBufferType(num_stages, (1,), int64), attrs)


def _prologue(before: Inserter, issue, lower: Value, step_value: int, ahead_by: int) -> None:
    """Before the loop: `issue` the tiles of iterations 0 .. ahead_by - 1 into slots 0 .. ahead_by - 1."""
    for stage in range(ahead_by):
        iteration = lower if stage == 0 else before.value(
            OpCode.ADD, [lower, before.constant(stage * step_value)], int32)
        issue(before, before.constant(stage), iteration)


def _read_from_ring(body: Block, candidates: list, buffers: list, read: Value) -> None:
    """Replace each candidate's load and dot-operand conversion by a `local_load` of slot `read`."""
    for candidate, buffer in zip(candidates, buffers):
        convert = candidate.convert
        at = Inserter(body, convert)
        loaded = at.value(OpCode.LOCAL_LOAD, [buffer, read], convert.result.type, layout=convert.result.layout)
        for user in body.ops:
            user.operands = [loaded if v is convert.result else v for v in user.operands]
        body.ops.remove(convert)
        body.ops.remove(candidate.load)


def _carry(loop: Operation, before: Inserter, name: str, initial: int) -> Value:
    """A new int32 value carried by `loop` (block argument `name`, starting at `initial`) and its
    loop result; returns the block argument."""
    argument = loop.regions[0].add_argument(int32, name)
    loop.operands.append(before.constant(initial))
    loop.results.append(Value(int32, loop, len(loop.results)))
    return argument


def _flip_on_wrap(at: Inserter, phase: Value, next_index: Value) -> Value:
    """`phase ^ 1` when the ring index `next_index` wrapped to 0, else `phase`."""
    wrapped = at.value(OpCode.EQ, [next_index, at.constant(0)], int1)
    flipped = at.value(OpCode.XOR, [phase, at.constant(1)], int32)
    return at.value(OpCode.WHERE, [wrapped, flipped, phase], int32)


def _finish(loop: Operation, overlapped: Optional[_Overlap], buffers: list, multicast: bool = False) -> None:
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


def _pipeline(loop: Operation, candidates: list, num_stages: int, overlapped: Optional[_Overlap]) -> None:
    """Rewrite `loop` (see the module docstring). overlapped: the wgmma that may stay in flight
    (`_overlappable_dot`), or None."""
    outer = loop.parent
    body = loop.regions[0]
    lower, upper, step = loop.operands[:3]
    induction = body.args[0]
    step_value = constant_int(step)
    # Copies run `ahead` iterations ahead; an in-flight wgmma still reads the previous slot.
    ahead_by = num_stages - 1 if overlapped is None else num_stages - 2
    before = Inserter(outer, loop)
    buffers = _allocate_ring(before, candidates, num_stages)
    barriers = _full_barriers(before, candidates, num_stages) if candidates[0].tma is not None else None

    def issue(at: Inserter, index: Value, iteration: Value) -> None:
        for candidate, buffer in zip(candidates, buffers):
            if barriers is not None:
                _issue_tma_copy(at, candidate, buffer, index, barriers, induction, iteration, upper)
            else:
                _issue_copy(at, candidate, buffer, index, induction, iteration, upper)
        if barriers is None:
            at.op(OpCode.ASYNC_COMMIT, [], [])

    _prologue(before, issue, lower, step_value, ahead_by)

    # Loop-carried ring indices: the tile this iteration reads, and the one it fills (and with TMA
    # the parity of the read slot's barrier phase, which flips each time the read index wraps).
    read = _carry(loop, before, "read_stage", 0)
    write = _carry(loop, before, "write_stage", ahead_by)
    phase = _carry(loop, before, "read_phase", 0) if barriers is not None else None

    multicast = any(c.multicast for c in candidates)
    head = Inserter(body, body.ops[0])
    if barriers is not None:
        if multicast:       # the cluster barrier's arrival is the previous iteration's last op
            before.op(OpCode.CLUSTER_BARRIER, [], [], {"half": "arrive"})
        head.op(OpCode.MBARRIER_WAIT, [barriers, read, phase], [], {"cluster_wait": True} if multicast else {})
    else:
        wait_attrs = {"pending": ahead_by - 1}
        if any(c.swizzle_bytes is not None for c in candidates):
            wait_attrs["proxy_fence"] = True       # cp.async wrote through the generic proxy; wgmma reads async
        head.op(OpCode.ASYNC_WAIT, [], [], wait_attrs)
    ahead = head.value(OpCode.ADD, [induction, head.constant(ahead_by * step_value)], int32)
    issue(head, write, ahead)
    _read_from_ring(body, candidates, buffers, read)

    tail = Inserter(body, body.terminator)
    next_read = _next_index(tail, read, num_stages)
    body.terminator.operands.extend([next_read, _next_index(tail, write, num_stages)])
    if phase is not None:
        body.terminator.operands.append(_flip_on_wrap(tail, phase, next_read))
    if multicast:
        tail.op(OpCode.CLUSTER_BARRIER, [], [], {"half": "arrive"})
    _finish(loop, overlapped, ([barriers] if barriers is not None else []) + buffers, multicast)


def _ring_with_empty_barriers(before: Inserter, candidates: list, num_stages: int) -> tuple:
    """(ring buffers, full barriers, empty barriers) of a TMA ring whose slots are released through per-stage
    "empty" mbarriers, one arrival per warp (FUSEDOPS_WS >= 1)."""
    buffers = _allocate_ring(before, candidates, num_stages)
    full = _full_barriers(before, candidates, num_stages)
    empty = before.value(OpCode.LOCAL_ALLOC, [], SharedBufferType(num_stages, (1,), int64),
                         {"mbarrier_per_warp": True})
    return buffers, full, empty


def _wait_full(body: Block, candidates: list, buffers: list, full: Value, read: Value, read_phase: Value) -> None:
    """At the head of the loop body: every thread waits until slot `read` landed (no CTA barrier), and the
    candidates read it from the ring."""
    Inserter(body, body.ops[0]).op(OpCode.MBARRIER_WAIT, [full, read, read_phase], [], {"cta_barrier": False})
    _read_from_ring(body, candidates, buffers, read)


def _release(at: Inserter, empty: Value, slot: Value, induction: Value, lower: Value, lag: int) -> None:
    """One arrival per warp on slot `slot`'s empty barrier: the wgmma that read it retired (with lag = 1, the
    previous iteration's, so the first iteration releases nothing)."""
    released = (at.value(OpCode.NE, [induction, lower], int1) if lag
                else at.value(OpCode.CONSTANT, [], int1, {"value": True}))
    at.op(OpCode.MBARRIER_ARRIVE, [empty, slot, released], [])


def _wait_released(at: Inserter, empty: Value, slot: Value, write_phase: Value) -> None:
    """The issuing thread waits until slot `slot` was released for its fill of parity `write_phase` (the
    release of the fill before it; a fresh slot's "phase before phase 0" passes at once)."""
    waited = at.value(OpCode.XOR, [write_phase, at.constant(1)], int32)
    at.op(OpCode.MBARRIER_WAIT, [empty, slot, waited], [], {"cta_barrier": False, "issuer": True})


def _pipeline_with_empty_barriers(loop: Operation, candidates: list, num_stages: int,
                                  overlapped: Optional[_Overlap]) -> None:
    """Rewrite `loop`, whose candidates are all TMA copies, with per-stage full and empty mbarriers
    and no CTA barrier in the loop (FUSEDOPS_WS=1; the module docstring has the schedule and its
    phase bookkeeping)."""
    outer = loop.parent
    body = loop.regions[0]
    lower, upper, step = loop.operands[:3]
    induction = body.args[0]
    step_value = constant_int(step)
    lag = 0 if overlapped is None else 1
    ahead_by = num_stages - lag
    before = Inserter(outer, loop)
    buffers, full, empty = _ring_with_empty_barriers(before, candidates, num_stages)

    def issue(at: Inserter, index: Value, iteration: Value) -> None:
        for candidate, buffer in zip(candidates, buffers):
            _issue_tma_copy(at, candidate, buffer, index, full, induction, iteration, upper)

    _prologue(before, issue, lower, step_value, ahead_by)     # fresh slots: no release to wait for

    read = _carry(loop, before, "read_stage", 0)
    read_phase = _carry(loop, before, "read_phase", 0)
    write = _carry(loop, before, "write_stage", ahead_by % num_stages)
    write_phase = _carry(loop, before, "write_phase", (ahead_by // num_stages) & 1)

    _wait_full(body, candidates, buffers, full, read, read_phase)

    tail = Inserter(body, body.terminator)
    _release(tail, empty, write, induction, lower, lag)
    _wait_released(tail, empty, write, write_phase)
    issue(tail, write, tail.value(OpCode.ADD, [induction, tail.constant(ahead_by * step_value)], int32))

    next_read = _next_index(tail, read, num_stages)
    next_write = _next_index(tail, write, num_stages)
    body.terminator.operands.extend([next_read, _flip_on_wrap(tail, read_phase, next_read),
                                     next_write, _flip_on_wrap(tail, write_phase, next_write)])
    _finish(loop, overlapped, [empty, full] + buffers)


# Ops that may come before a loop given a producer (`_producer_warp_fits`): every warp of the CTA runs
# them, the producer too, whose warp index lies outside the block layouts; these touch no memory.
_BEFORE_PRODUCER_OPS = _ADDRESS_OPS | frozenset({OpCode.LOCAL_ALLOC})
# The most threads a CTA may have; the producer warpgroup's warps.
MAX_CTA_THREADS = 1024
PRODUCER_WARPS = 4


def _producer_warp_fits(function: Function, loop: Operation, num_warps: int) -> bool:
    """Whether `loop` may take a producer warpgroup (FUSEDOPS_WS=2): it is an op of the kernel's top-level
    block, after nothing but pure register computations (the producer runs them too, then leaves the
    kernel: no memory access, shared-memory exchange or barrier of the other warps may come before); no
    other loop of the kernel took one (one per kernel); the CTA stays within 1024 threads with its 4 more
    warps; and the kernel asks for no `dsl.launch_bounds` (its CTAs per SM and register cap were meant for
    num_warps warps)."""
    body = function.body
    if loop.parent is not body or 32 * (num_warps + PRODUCER_WARPS) > MAX_CTA_THREADS:
        return False
    if any(op.opcode == OpCode.LAUNCH_BOUNDS for op in function.walk()):
        return False
    before = body.ops[:body.ops.index(loop)]
    if not all(op.opcode in _BEFORE_PRODUCER_OPS and not op.regions for op in before):
        return False
    return not any(op.opcode == OpCode.PRODUCER_WARP for op in function.walk())


def _pipeline_with_producer_warp(loop: Operation, candidates: list, num_stages: int,
                                 overlapped: Optional[_Overlap]) -> None:
    """Rewrite `loop`, whose candidates are all TMA copies, with a producer warpgroup (FUSEDOPS_WS=2): the
    full and empty mbarriers of `_pipeline_with_empty_barriers`, but the copies of every iteration are
    issued by 4 more warps of the CTA (lane 0 of the first), which run only the `producer_warp` region:

        producer_warp {
            for %j in range(%lb, %ub, STEP) iter(%write = 0, %write_phase = 0):
                mbarrier_wait %empty[%write], %write_phase ^ 1 {issuer}    (its lane 0: slot released)
                tma_copy %buf[%write], <coordinates at %j>, %full[%write]
                yield next %write, %write_phase flipped on wrap
        }
        for %k ... iter(%acc, %read = 0, %read_phase = 0, %release = -lag mod S):
            mbarrier_wait %full[%read], %read_phase {cta_barrier = false}
            %acc2 = dot local_load ..[%read] {pending = lag}
            mbarrier_arrive %empty[%release] if %k >= lag          (one arrival per consumer warp; with
                                                                    lag = 1 right after the dot, before
                                                                    an epilogue in the iteration)

    The consumer warps never wait for a release, so neither warpgroup stalls behind a refill; the
    producer runs up to S fills ahead, as far as the releases let it. The phase bookkeeping is that of
    FUSEDOPS_WS=1 (module docstring) with ahead_by = S: fill j waits for the release of iteration j - S.
    Source of the scheme: the warp-specialized mainloops of CUTLASS 3 (sm90 TMA "producer" warp) and
    FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608, section 3.1)."""
    outer = loop.parent
    body = loop.regions[0]
    lower, upper, step = loop.operands[:3]
    induction = body.args[0]
    lag = 0 if overlapped is None else 1
    before = Inserter(outer, loop)
    buffers, full, empty = _ring_with_empty_barriers(before, candidates, num_stages)
    _insert_producer(outer, loop, candidates, buffers, full, empty, num_stages)

    read = _carry(loop, before, "read_stage", 0)
    read_phase = _carry(loop, before, "read_phase", 0)
    release = _carry(loop, before, "release_stage", -lag % num_stages)
    _wait_full(body, candidates, buffers, full, read, read_phase)
    tail = Inserter(body, body.terminator)
    # an in-flight wgmma's slot is released right after the dot (its wait_group 1 retired the previous
    # one), before any epilogue of the iteration; a dot that is waited for, at the end of the iteration
    at = tail if overlapped is None else Inserter(body, body.ops[body.ops.index(overlapped.dot) + 1])
    _release(at, empty, release, induction, lower, lag)
    next_read = _next_index(tail, read, num_stages)
    body.terminator.operands.extend([next_read, _flip_on_wrap(tail, read_phase, next_read),
                                     _next_index(tail, release, num_stages)])
    _finish(loop, overlapped, [empty, full] + buffers)


def _insert_producer(outer: Block, loop: Operation, candidates: list, buffers: list, full: Value, empty: Value,
                     num_stages: int) -> None:
    """The `producer_warp` op, just before `loop`, whose loop issues the copies of every iteration of
    `loop` (see `_pipeline_with_producer_warp`)."""
    lower, upper, step = loop.operands[:3]
    induction = loop.regions[0].args[0]
    region = Block()
    producer_body = Block([int32, int32, int32], ["iteration", "write_stage", "write_phase"])
    producer_loop = Operation(OpCode.FOR, [], [int32, int32], {}, (producer_body,), loop.loc)
    region.append(producer_loop)
    region.append(Operation(OpCode.YIELD, [], [], {}, (), loop.loc))
    init = Inserter(region, producer_loop)
    producer_loop.operands = [lower, upper, step, init.constant(0), init.constant(0)]
    end = producer_body.append(Operation(OpCode.YIELD, [], [], {}, (), loop.loc))
    at = Inserter(producer_body, end)
    iteration, write, write_phase = producer_body.args
    _wait_released(at, empty, write, write_phase)
    for candidate, buffer in zip(candidates, buffers):
        _issue_tma_copy(at, candidate, buffer, write, full, induction, iteration, upper)
    next_write = _next_index(at, write, num_stages)
    end.operands = [next_write, _flip_on_wrap(at, write_phase, next_write)]
    producer = Operation(OpCode.PRODUCER_WARP, [], [], {}, (region,), loop.loc)
    producer.parent = outer
    outer.ops.insert(outer.ops.index(loop), producer)
