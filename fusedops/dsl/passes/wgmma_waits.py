"""Deferred wgmma waits: a warpgroup's `wgmma.mma_async` stays in flight until its result is first read.

Code generation waits for every wgmma dot right after issuing it (`wgmma.wait_group 0`), so the next
instruction that needs no tensor core still waits for the tensor cores. This pass moves each wait of a
block down to the first op that reads the dot's result (`wgmma_wait {pending = n}` there, where n counts
the wgmmas issued after it and still allowed in flight; PTX ISA 9.7.15.7.3: a warpgroup's wgmma groups
complete in the order they were committed, `wgmma.wait_group n` leaves the n most recent in flight).
So independent work between a dot and its first use runs while the tensor cores compute, and two
independent dots issued back to back overlap:

    %s  = dot %q, %kt, 0                     %s  = dot %q, %kt, 0 {deferred}
    %dp = dot %do, %vt, 0          ->        %dp = dot %do, %vt, 0 {deferred}
    %p  = exp2(%s - %lse)                    %s2, = wgmma_wait %s {pending = 1}       (dp still in flight)
    %ds = %p * (%dp - %delta)                %p  = exp2(%s2 - %lse)
                                             %dp2, = wgmma_wait %dp {pending = 0}
                                             %ds = %p * (%dp2 - %delta)

(The FlashAttention-3 paper, Shah et al. 2024, arXiv:2407.08608, section 3.2, overlaps softmax with the
dots this way; here the compiler places the waits and the kernel orders its dots.)

A dot is deferred when it runs on wgmma with its pending count not yet set (pipelining's in-flight
accumulator keeps its own). Ring slots stay valid: every deferred dot of a loop body is retired before
the body ends (the waits are flushed before the terminator), so no wgmma reads a slot when the next
iteration's copies are issued. In-flight dots ride only over ops that touch neither their registers nor
shared memory (`_passable`: register math, shape ops, global loads and stores, relaxed atomic
reductions whose old values nobody reads, ring reads, layout conversions that relabel registers,
reductions within warps, other deferred dots whose shared operands are all ring slots); any other op
(control flow, barriers, copies, mbarriers, deallocs, a conversion or reduction through shared memory,
the terminator, a dot that is not deferred or that stages an operand from registers into scratch
shared memory) retires all of them first (`pending = 0`); ptxas serializes every wgmma of the kernel
(C7513) where a st.shared runs while one is in flight. So a dot whose operand is staged into scratch
stays in flight only across ops that write no shared memory: nothing overwrites the tile it reads.
A wait returns every dot it retires (their results tied to the instruction, so no read of their
registers is scheduled above it; codegen also keeps the A fragment registers of a register-A dot live
until it, so nothing is written into them while the wgmma reads them), and uses after it read those
results.

Runs after pipelining (which creates the ring slots and sets the in-flight accumulator's count) and after
the sibling-reduction grouping, whose members are consecutive cross-warp reductions lowered together at the
first: the first retires every in-flight dot, so no wait lands between members.
"""

from __future__ import annotations

from ..codegen import layout_access
from ..errors import UnsupportedError
from ..ir.core import Block, Function, Operation
from ..ir.ops import ELEMENTWISE, OpCode
from ..layouts.mma_shared import is_shared_layout
from ..layouts.reduction import reduction_plan

# Ops a deferred wgmma may stay in flight across: they neither write the registers it reads or writes
# (those are its own SSA values) nor shared memory, nor synchronize with anything that does. (ptxas
# serializes every wgmma of a kernel, C7513, where a st.shared runs while one is in flight: so a layout
# conversion passes only as a register relabeling, a reduction only within warps.)
_PASSABLE = ELEMENTWISE | frozenset({
    OpCode.CONSTANT, OpCode.PROGRAM_ID, OpCode.NUM_PROGRAMS, OpCode.ARANGE, OpCode.SPLAT, OpCode.BROADCAST,
    OpCode.EXPAND_DIMS, OpCode.RESHAPE, OpCode.TRANS, OpCode.LOAD, OpCode.STORE, OpCode.LOCAL_LOAD,
})


def defer_wgmma_waits(function: Function) -> bool:
    """Defer the waits of `function`'s wgmma dots (see the module docstring); whether anything changed."""
    changed = False
    blocks = [function.body] + [region for op in function.body.walk() for region in op.regions]
    for block in blocks:
        changed |= _defer_in_block(block)
    return changed


def _deferrable(op: Operation) -> bool:
    """A wgmma dot without a pending count."""
    return op.opcode == OpCode.DOT and op.attrs.get("engine") == "wgmma" and "pending" not in op.attrs


def _stages_nothing(op: Operation) -> bool:
    """Whether every shared-memory operand of dot `op` is a ring slot (none is staged from registers)."""
    for operand in op.operands[:2]:
        producer = operand.defining_op
        in_ring = producer is not None and producer.opcode == OpCode.LOCAL_LOAD
        if is_shared_layout(operand.layout) and not in_ring:
            return False
    return True


def _defer_in_block(block: Block) -> bool:
    in_flight: list = []          # deferred dots of this block not yet retired, in issue order
    changed = False
    index = 0
    while index < len(block.ops):
        op = block.ops[index]
        retired = _retired_before(op, in_flight)
        if retired:
            pending = len(in_flight) - retired
            if retired == 1 and pending == 0 and block.ops[index - 1] is in_flight[0]:
                in_flight.clear()     # the wait lands right after its dot: the dot keeps its own
            else:
                _retire(block, index, in_flight[:retired], pending)
                del in_flight[:retired]
                changed = True
                index += 1
        if _deferrable(op):
            in_flight.append(op)
        index += 1
    if in_flight:
        _retire(block, len(block.ops), in_flight, 0)
        changed = True
    return changed


def _passable(op: Operation) -> bool:
    """Whether deferred wgmmas may stay in flight across `op` (`_PASSABLE`, a register-only conversion, a
    reduction within warps, or another deferred dot)."""
    if op.opcode in _PASSABLE:
        return True
    if op.opcode == OpCode.CONVERT_LAYOUT:
        return layout_access.register_map(op.operands[0].layout, op.result.layout) is not None
    if op.opcode == OpCode.REDUCE and not {"exchange_group", "exchange_follower"} & op.attrs.keys():
        try:
            return not reduction_plan(op.operands[0].layout, op.attrs["axis"]).warp_bits
        except UnsupportedError:
            return False
    if op.opcode == OpCode.ATOMIC_RMW:      # a block reduction into global memory, no fences, no old values
        return op.attrs["sem"] == "relaxed" and bool(op.attrs.get("result_unused")) and op.result.layout is not None
    return op.opcode == OpCode.DOT and _deferrable(op) and _stages_nothing(op)


def _retired_before(op: Operation, in_flight: list) -> int:
    """How many of the oldest in-flight dots must be retired before `op`: through the newest one it
    reads, or all of them before an op they may not pass."""
    if not in_flight:
        return 0
    if not _passable(op):
        return len(in_flight)
    operands = {id(v) for nested in op.walk() for v in nested.operands}
    read = [i for i, dot in enumerate(in_flight) if id(dot.result) in operands]
    return read[-1] + 1 if read else 0


def _retire(block: Block, index: int, dots: list, pending: int) -> None:
    """`wgmma_wait {pending}` of the results of `dots` at `block.ops[index]` (the ops after it read its
    results); the dots are marked `deferred` (codegen issues them without a wait)."""
    results = [dot.result for dot in dots]
    for dot in dots:
        dot.attrs["deferred"] = True
    wait = Operation(OpCode.WGMMA_WAIT, results, [r.type for r in results], {"pending": pending}, (),
                     block.ops[min(index, len(block.ops) - 1)].loc)
    for old, new in zip(results, wait.results):
        new.layout = old.layout
    wait.parent = block
    block.ops.insert(index, wait)
    replacement = {id(old): new for old, new in zip(results, wait.results)}
    for op in block.ops[index + 1:]:
        for nested in op.walk():
            nested.operands = [replacement.get(id(v), v) for v in nested.operands]
