"""The FUSEDOPS_WS >= 1 rewrites of a TMA ring (passes/pipelining.py has the schedules): per-stage
"empty" mbarriers that the warps release slots on instead of a CTA barrier, and with FUSEDOPS_WS=2 a
producer warpgroup that issues every copy.
"""

from __future__ import annotations

from typing import Optional

from ..ir import Block, Function, Operation, OpCode, Value
from ..ir.shared_buffer import SharedBufferType
from ..language.dtypes import int1, int32, int64
from ._pipelining_candidates import ADDRESS_OPS
from ._pipelining_overlap import Overlap
from ._pipelining_ring import (allocate_ring, carry, finish, flip_on_wrap, full_barriers, issue_tma_copy,
                               next_index, prologue, read_from_ring)
from ._rewriting import Inserter, constant_int
from .dot_layouts import PRODUCER_WARPS


def _ring_with_empty_barriers(before: Inserter, candidates: list, num_stages: int) -> tuple:
    """(ring buffers, full barriers, empty barriers) of a TMA ring whose slots are released through per-stage
    "empty" mbarriers, one arrival per warp (FUSEDOPS_WS >= 1)."""
    buffers = allocate_ring(before, candidates, num_stages)
    full = full_barriers(before, candidates, num_stages)
    empty = before.value(OpCode.LOCAL_ALLOC, [], SharedBufferType(num_stages, (1,), int64),
                         {"mbarrier_per_warp": True})
    return buffers, full, empty


def _wait_full(body: Block, candidates: list, buffers: list, full: Value, read: Value, read_phase: Value) -> None:
    """At the head of the loop body: every thread waits until slot `read` landed (no CTA barrier), and the
    candidates read it from the ring."""
    Inserter(body, body.ops[0]).op(OpCode.MBARRIER_WAIT, [full, read, read_phase], [], {"cta_barrier": False})
    read_from_ring(body, candidates, buffers, read)


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


def pipeline_with_empty_barriers(loop: Operation, candidates: list, num_stages: int,
                                 overlapped: Optional[Overlap]) -> None:
    """Rewrite `loop`, whose candidates are all TMA copies, with per-stage full and empty mbarriers
    and no CTA barrier in the loop (FUSEDOPS_WS=1; passes/pipelining.py's docstring has the schedule
    and its phase bookkeeping)."""
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
            issue_tma_copy(at, candidate, buffer, index, full, induction, iteration, upper)

    prologue(before, issue, lower, step_value, ahead_by)     # fresh slots: no release to wait for

    read = carry(loop, before, "read_stage", 0)
    read_phase = carry(loop, before, "read_phase", 0)
    write = carry(loop, before, "write_stage", ahead_by % num_stages)
    write_phase = carry(loop, before, "write_phase", (ahead_by // num_stages) & 1)

    _wait_full(body, candidates, buffers, full, read, read_phase)

    tail = Inserter(body, body.terminator)
    _release(tail, empty, write, induction, lower, lag)
    _wait_released(tail, empty, write, write_phase)
    issue(tail, write, tail.value(OpCode.ADD, [induction, tail.constant(ahead_by * step_value)], int32))

    next_read = next_index(tail, read, num_stages)
    next_write = next_index(tail, write, num_stages)
    body.terminator.operands.extend([next_read, flip_on_wrap(tail, read_phase, next_read),
                                     next_write, flip_on_wrap(tail, write_phase, next_write)])
    finish(loop, overlapped, [empty, full] + buffers)


# Ops that may come before a loop given a producer (`producer_warp_fits`): every warp of the CTA runs
# them, the producer too, whose warp index lies outside the block layouts; these touch no memory.
_BEFORE_PRODUCER_OPS = ADDRESS_OPS | frozenset({OpCode.LOCAL_ALLOC})
# The most threads a CTA may have.
MAX_CTA_THREADS = 1024


def producer_warp_fits(function: Function, loop: Operation, num_warps: int) -> bool:
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


def pipeline_with_producer_warp(loop: Operation, candidates: list, num_stages: int,
                                overlapped: Optional[Overlap]) -> None:
    """Rewrite `loop`, whose candidates are all TMA copies, with a producer warpgroup (FUSEDOPS_WS=2): the
    full and empty mbarriers of `pipeline_with_empty_barriers`, but the copies of every iteration are
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
    FUSEDOPS_WS=1 (passes/pipelining.py) with ahead_by = S: fill j waits for the release of iteration j - S.
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

    read = carry(loop, before, "read_stage", 0)
    read_phase = carry(loop, before, "read_phase", 0)
    release = carry(loop, before, "release_stage", -lag % num_stages)
    _wait_full(body, candidates, buffers, full, read, read_phase)
    tail = Inserter(body, body.terminator)
    # an in-flight wgmma's slot is released right after the dot (its wait_group 1 retired the previous
    # one), before any epilogue of the iteration; a dot that is waited for, at the end of the iteration
    at = tail if overlapped is None else Inserter(body, body.ops[body.ops.index(overlapped.dot) + 1])
    _release(at, empty, release, induction, lower, lag)
    next_read = next_index(tail, read, num_stages)
    body.terminator.operands.extend([next_read, flip_on_wrap(tail, read_phase, next_read),
                                     next_index(tail, release, num_stages)])
    finish(loop, overlapped, [empty, full] + buffers)


def _insert_producer(outer: Block, loop: Operation, candidates: list, buffers: list, full: Value, empty: Value,
                     num_stages: int) -> None:
    """The `producer_warp` op, just before `loop`, whose loop issues the copies of every iteration of
    `loop` (see `pipeline_with_producer_warp`)."""
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
        issue_tma_copy(at, candidate, buffer, write, full, induction, iteration, upper)
    next_write = next_index(at, write, num_stages)
    end.operands = [next_write, flip_on_wrap(at, write_phase, next_write)]
    producer = Operation(OpCode.PRODUCER_WARP, [], [], {}, (region,), loop.loc)
    producer.parent = outer
    outer.ops.insert(outer.ops.index(loop), producer)
