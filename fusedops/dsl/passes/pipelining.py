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
nothing else reads (`_pipelining_overlap.overlappable_dot`) and num_stages >= 3, the dot stays in
flight into the next iteration (`dot {pending=1}`: `wgmma.wait_group 1` after it) and the copies run
one iteration less ahead, so the slot the in-flight wgmma reads is not overwritten:

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

TMA with FUSEDOPS_WS=2: the same barriers, with a producer warpgroup
(`_pipelining_warp_specialized.pipeline_with_producer_warp`): 4 more warps of the CTA run a `producer_warp`
region before the loop, a loop of its own that waits on the empty barriers and issues every fill, then
leaves the kernel; the consumer warps only wait for full slots and release them. Only for a loop of the
kernel's top-level block with nothing but register computations before it (the producer runs those too);
elsewhere 1's schedule. The producer gives most of its registers to the consumers (setmaxnreg,
codegen/async_copy.py). tests/test_producer_warp.py.

TMA multicast (`desc.load(..., multicast=True)` in a kernel with `dsl.cluster_dims(n)`, n > 1): the n CTAs of
a cluster load the same tile, so each copies 1/n of it (`_pipelining_candidates.with_multicast`: its share
of the boxes, or of every box's rows where the boxes do not split) into the same slot of all n
(`tma_copy {multicast = n}`), and every CTA still expects the whole tile on its own slot barrier (a peer's
bytes may land before this CTA's expect_tx: the transaction count goes negative meanwhile, which the
mbarrier allows). A slot is refilled once every CTA of the cluster is done with it, so the CTA barrier of
the schedule above becomes a cluster barrier split in halves around the loop's back edge (FUSEDOPS_WS=1's
empty barriers do not apply: a release would have to reach every CTA's barrier):

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

This file drives the pass and holds the CTA-barrier rewrite (cp.async; TMA with FUSEDOPS_WS=0 or
multicast); which loads qualify is `_pipelining_candidates.py`, whether the wgmma stays in flight
`_pipelining_overlap.py`, the ring's ops `_pipelining_ring.py`, the FUSEDOPS_WS >= 1 rewrites
`_pipelining_warp_specialized.py`.
"""

from __future__ import annotations

from typing import Optional

from ..ir import Function, Operation, OpCode, Value
from ..ir.ops import cluster_size
from ..language.dtypes import int32
from ._pipelining_candidates import find_candidates, use_counts, with_copy_engine, with_multicast
from ._pipelining_overlap import Overlap, overlappable_dot
from ._pipelining_ring import (allocate_ring, carry, finish, flip_on_wrap, full_barriers, issue_copy,
                               issue_tma_copy, next_index, prologue, read_from_ring)
from ._pipelining_warp_specialized import (pipeline_with_empty_barriers, pipeline_with_producer_warp,
                                           producer_warp_fits)
from ._rewriting import Inserter, constant_int
from .dce import eliminate_dead_code
from .pointer_analysis import analyze_pointers


def pipeline_loops(function: Function, num_stages: int, num_warps: int = 4) -> bool:
    """Pipeline every `for` loop with qualifying dot-operand loads `num_stages` deep (see the
    module docstring). num_stages < 2 does nothing. Returns whether the IR changed. A TMA ring
    synchronizes as FUSEDOPS_WS says (runtime/knobs.py)."""
    if num_stages < 2:
        return False
    from ..runtime import knobs
    mode = knobs.current().ws
    analysis = analyze_pointers(function)
    uses = use_counts(function)
    cluster = cluster_size(function)
    changed = False
    for loop in [op for op in function.walk() if op.opcode == OpCode.FOR]:
        candidates = with_multicast(with_copy_engine(find_candidates(loop, analysis, uses)), cluster)
        if candidates:
            overlapped = overlappable_dot(loop, candidates, uses, num_stages)
            if candidates[0].tma is not None and mode >= 1 and not any(c.multicast for c in candidates):
                if mode == 2 and cluster == 1 and producer_warp_fits(function, loop, num_warps):
                    pipeline_with_producer_warp(loop, candidates, num_stages, overlapped)
                else:
                    pipeline_with_empty_barriers(loop, candidates, num_stages, overlapped)
            else:
                _pipeline(loop, candidates, num_stages, overlapped)
            changed = True
    if changed:
        eliminate_dead_code(function)
    return changed


def _pipeline(loop: Operation, candidates: list, num_stages: int, overlapped: Optional[Overlap]) -> None:
    """Rewrite `loop` (see the module docstring). overlapped: the wgmma that may stay in flight
    (`overlappable_dot`), or None."""
    outer = loop.parent
    body = loop.regions[0]
    lower, upper, step = loop.operands[:3]
    induction = body.args[0]
    step_value = constant_int(step)
    # Copies run `ahead` iterations ahead; an in-flight wgmma still reads the previous slot.
    ahead_by = num_stages - 1 if overlapped is None else num_stages - 2
    before = Inserter(outer, loop)
    buffers = allocate_ring(before, candidates, num_stages)
    barriers = full_barriers(before, candidates, num_stages) if candidates[0].tma is not None else None

    def issue(at: Inserter, index: Value, iteration: Value) -> None:
        for candidate, buffer in zip(candidates, buffers):
            if barriers is not None:
                issue_tma_copy(at, candidate, buffer, index, barriers, induction, iteration, upper)
            else:
                issue_copy(at, candidate, buffer, index, induction, iteration, upper)
        if barriers is None:
            at.op(OpCode.ASYNC_COMMIT, [], [])

    prologue(before, issue, lower, step_value, ahead_by)

    # Loop-carried ring indices: the tile this iteration reads, and the one it fills (and with TMA
    # the parity of the read slot's barrier phase, which flips each time the read index wraps).
    read = carry(loop, before, "read_stage", 0)
    write = carry(loop, before, "write_stage", ahead_by)
    phase = carry(loop, before, "read_phase", 0) if barriers is not None else None

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
    read_from_ring(body, candidates, buffers, read)

    tail = Inserter(body, body.terminator)
    next_read = next_index(tail, read, num_stages)
    body.terminator.operands.extend([next_read, next_index(tail, write, num_stages)])
    if phase is not None:
        body.terminator.operands.append(flip_on_wrap(tail, phase, next_read))
    if multicast:
        tail.op(OpCode.CLUSTER_BARRIER, [], [], {"half": "arrive"})
    finish(loop, overlapped, ([barriers] if barriers is not None else []) + buffers, multicast)
