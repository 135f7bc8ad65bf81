"""Which kernel arguments a pointer value is derived from: the base-pointer alias facts passes/pipelining.py
needs before it moves a load ahead of a store.

`pointer_roots(value)` follows a pointer (scalar or block) back through address arithmetic (addptr,
splat, broadcast, expand_dims, reshape, trans, layout conversions, hints), selects (`where`, the results of
`if` and `for`) and loop-carried values (their initial and yielded values) to the kernel's pointer
arguments. It returns their ids, or None when some path leaves that set (a pointer loaded from memory,
a `while` loop's value): then anything may alias. Two pointers with disjoint roots are taken not to alias:
like Triton, the compiler assumes distinct pointer arguments do not overlap (a launch passing one tensor
as an input and as an output of the same loop gets no such guarantee).
"""

from __future__ import annotations

from typing import Optional

from ..ir import Block, Operation, OpCode, Value

_THROUGH = frozenset({OpCode.ADDPTR, OpCode.SPLAT, OpCode.BROADCAST, OpCode.EXPAND_DIMS, OpCode.RESHAPE,
                      OpCode.TRANS, OpCode.CONVERT_LAYOUT, OpCode.MULTIPLE_OF, OpCode.MAX_CONTIGUOUS})
# Where each memory-writing op takes its pointer (the base pointer of a descriptor store).
WRITE_POINTER = {OpCode.STORE: 0, OpCode.ATOMIC_RMW: 0, OpCode.ATOMIC_CAS: 0, OpCode.DESCRIPTOR_STORE: 0,
                 OpCode.TMA_STORE: 1}


def pointer_roots(value: Value) -> Optional[frozenset]:
    """The ids of the kernel arguments `value` derives from, or None when it is not known."""
    return _roots(value, set())


def written_roots(block: Block) -> Optional[frozenset]:
    """The roots of every pointer written in `block` (nested regions included); None when one is unknown."""
    found = set()
    for op in block.walk():
        index = WRITE_POINTER.get(op.opcode)
        if index is None:
            continue
        roots = pointer_roots(op.operands[index])
        if roots is None:
            return None
        found |= roots
    return frozenset(found)


def _union(parts) -> Optional[frozenset]:
    found = set()
    for part in parts:
        if part is None:
            return None
        found |= part
    return frozenset(found)


def _roots(value: Value, visiting: set) -> Optional[frozenset]:
    if id(value) in visiting:       # around a loop: the other paths bring the roots
        return frozenset()
    visiting.add(id(value))
    owner = value.owner
    if isinstance(owner, Block):
        loop = owner.parent
        if loop is None:            # the kernel's body: an argument
            return frozenset({id(value)})
        if loop.opcode == OpCode.FOR and value.index > 0:
            carried = value.index - 1
            return _union([_roots(loop.operands[3 + carried], visiting),
                           _roots(owner.terminator.operands[carried], visiting)])
        return None                 # an induction variable, a while loop's argument
    op: Operation = owner
    if op.opcode in _THROUGH:
        return _roots(op.operands[0], visiting)
    if op.opcode == OpCode.WHERE:
        return _union([_roots(op.operands[1], visiting), _roots(op.operands[2], visiting)])
    if op.opcode == OpCode.IF:
        return _union([_roots(region.terminator.operands[value.index], visiting) for region in op.regions])
    if op.opcode == OpCode.FOR:
        return _union([_roots(op.operands[3 + value.index], visiting),
                       _roots(op.regions[0].terminator.operands[value.index], visiting)])
    return None
