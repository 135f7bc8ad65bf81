"""Whether a pipelined loop's wgmma may stay in flight into the next iteration (`dot {pending=1}`,
passes/pipelining.py): the loop's only dot, reading both operands from the ring into an accumulator
that nothing else reads.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..ir import Operation, OpCode


@dataclasses.dataclass
class Overlap:
    """A wgmma that may stay in flight into the next iteration: its carried accumulator `index`, the
    `dot`, and the `branch` (an `if` of the body) whose then-region reads its result, or None."""
    index: int
    dot: Operation
    branch: Optional[Operation] = None


def overlappable_dot(loop: Operation, candidates: list, uses: dict, num_stages: int) -> Optional[Overlap]:
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
        return Overlap(index, dot) if uses.get(id(dot.result)) == 1 else None
    branch = yielded.defining_op
    if branch is None or branch.opcode != OpCode.IF or branch.parent is not body or uses.get(id(yielded)) != 1:
        return None
    then_region, else_region = branch.regions
    if else_region.terminator.operands[yielded.index] is not dot.result:
        return None
    in_then = sum(v is dot.result for op in then_region.ops for nested in op.walk() for v in nested.operands)
    return Overlap(index, dot, branch) if in_then + 1 == uses.get(id(dot.result)) else None
