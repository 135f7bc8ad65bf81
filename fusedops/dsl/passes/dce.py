"""Dead-code elimination.

An op is dead when none of its results is used and it has no side effect. Side effects are those of
`ops.SIDE_EFFECTS` (stores, atomics, print, assert), anywhere inside an op's regions too; a WHILE is
always kept, since removing a loop that may not terminate changes the program. So a FOR or IF whose
body only computes values nobody reads is removed, and one that stores is kept. LOAD has no side
effect: an unused load is removed.

Loop-carried values of a FOR that nothing outside the loop reads, and that the loop's live
computation does not read either, are removed from the loop (its init operand, body argument,
yield operand and result), which makes the ops computing them dead as well.

An atomic read-modify-write whose old values nobody reads gets attr `result_unused` (codegen/atomics.py
may then issue vector reductions, which return nothing).
"""

from __future__ import annotations

from ..ir.core import Block, Function, Operation
from ..ir.ops import SIDE_EFFECTS, TERMINATORS, OpCode

_EFFECTS = SIDE_EFFECTS - TERMINATORS


def eliminate_dead_code(function: Function) -> bool:
    """Remove dead ops and dead FOR-carried values from `function`; True when the IR changed."""
    counts: dict = {}
    for op in function.walk():
        for operand in op.operands:
            counts[id(operand)] = counts.get(id(operand), 0) + 1
    changed = _sweep(function.body, counts)
    for op in function.walk():
        if op.opcode == OpCode.ATOMIC_RMW:
            op.attrs["result_unused"] = counts.get(id(op.result), 0) == 0
    return changed


def _has_side_effects(op: Operation) -> bool:
    """Whether removing `op` (and everything in its regions) could change what the program does."""
    for nested in op.walk():
        if nested.opcode in _EFFECTS or nested.opcode == OpCode.WHILE:
            return True
    return False


def _sweep(block: Block, counts: dict) -> bool:
    """Remove dead ops of `block`, last to first, so that one sweep also removes chains."""
    changed = False
    kept = []
    for op in reversed(block.ops):
        if op.opcode == OpCode.FOR:
            changed |= _drop_dead_carried(op, counts)
        if _is_dead(op, counts):
            for nested in op.walk():
                for operand in nested.operands:
                    counts[id(operand)] -= 1
            op.parent = None
            changed = True
            continue
        for region in op.regions:
            changed |= _sweep(region, counts)
        kept.append(op)
    kept.reverse()
    block.ops = kept
    return changed


def _is_dead(op: Operation, counts: dict) -> bool:
    if op.opcode in TERMINATORS:
        return False
    if any(counts.get(id(result), 0) for result in op.results):
        return False
    return not _has_side_effects(op)


def _live_in_body(body: Block, live_carried: set) -> set:
    """Ids of the body values that the loop's side effects or its live carried values read."""
    terminator = body.terminator
    live = {id(terminator.operands[i]) for i in live_carried}
    for op in reversed(body.ops[:-1]):
        if _has_side_effects(op) or any(id(result) in live for result in op.results):
            # Every operand inside a live region op counts as live: coarse, but never wrong.
            for nested in op.walk():
                live.update(id(operand) for operand in nested.operands)
    return live


def _drop_dead_carried(op: Operation, counts: dict) -> bool:
    """Remove the loop-carried values of FOR `op` that nothing live reads."""
    body = op.regions[0]
    carried = range(len(op.results))
    live_carried = {i for i in carried if counts.get(id(op.results[i]), 0)}
    while True:
        live = _live_in_body(body, live_carried)
        grown = live_carried | {i for i in carried if id(body.args[i + 1]) in live}
        if grown == live_carried:
            break
        live_carried = grown
    dead = [i for i in carried if i not in live_carried]
    if not dead:
        return False
    # The body ops that read a dead carried argument are not live, so removing the argument
    # leaves them dangling only until the sweep of the body, which removes them as dead.
    terminator = body.terminator
    for i in reversed(dead):
        counts[id(op.operands[3 + i])] -= 1
        counts[id(terminator.operands[i])] -= 1
        del op.operands[3 + i]
        del op.results[i]
        del body.args[i + 1]
        del terminator.operands[i]
    for index, result in enumerate(op.results):
        result.index = index
    for index, arg in enumerate(body.args):
        arg.index = index
    return True
