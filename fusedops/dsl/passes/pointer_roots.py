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
from ..language.dtypes import PointerType

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
    merged = _merged(value)
    if merged is not None:
        return _union([_roots(source, visiting) for source in merged])
    owner = value.owner
    if isinstance(owner, Block):    # a kernel argument; an induction variable, a while loop's argument
        return frozenset({id(value)}) if owner.parent is None else None
    op: Operation = owner
    if op.opcode == OpCode.ADDPTR and _converts_a_pointer(op.operands[1], set()):
        return None                 # an offset made from an address (y_ptr.to(int64) - x_ptr.to(int64)): anywhere
    if op.opcode in _THROUGH:
        return _roots(op.operands[0], visiting)
    if op.opcode == OpCode.WHERE:
        return _union([_roots(op.operands[1], visiting), _roots(op.operands[2], visiting)])
    return None


def _merged(value: Value) -> Optional[list]:
    """The values control flow merges into `value`: a `for` body's carried argument's or a `for` result's
    initial and yielded values, an `if` result's yielded ones; None for any other value."""
    owner = value.owner
    if isinstance(owner, Block):
        loop = owner.parent
        if loop is not None and loop.opcode == OpCode.FOR and value.index > 0:
            return [loop.operands[3 + value.index - 1], owner.terminator.operands[value.index - 1]]
        return None
    if owner.opcode == OpCode.FOR:
        return [owner.operands[3 + value.index], owner.regions[0].terminator.operands[value.index]]
    if owner.opcode == OpCode.IF:
        return [region.terminator.operands[value.index] for region in owner.regions]
    return None


def _converts_a_pointer(value: Value, seen: set) -> bool:
    """Whether integer `value` may be computed from a pointer converted to an integer (an address in an
    offset): followed through every op and control-flow merge; a `while` loop's value may be."""
    if id(value) in seen:
        return False
    seen.add(id(value))
    merged = _merged(value)
    if merged is None:
        merged = _while_merged(value)
    if merged is not None:
        return any(_converts_a_pointer(source, seen) for source in merged)
    owner = value.owner
    if isinstance(owner, Block):
        loop = owner.parent
        # a kernel argument; a for loop's induction variable: its bounds
        return loop is not None and any(_converts_a_pointer(bound, seen) for bound in loop.operands[:3])
    if owner.opcode in (OpCode.CAST, OpCode.BITCAST) and isinstance(owner.operands[0].type.scalar, PointerType):
        return True
    return any(_converts_a_pointer(operand, seen) for operand in owner.operands)


def _while_merged(value: Value) -> Optional[list]:
    """The values a `while` loop merges into `value`: a before-region argument's initial value and the
    after-region's yielded one; an after-region argument's or the loop result's forwarded one (the before
    region's condition operands); None for any other value."""
    owner = value.owner
    loop = owner.parent if isinstance(owner, Block) else owner
    if loop is None or loop.opcode != OpCode.WHILE:
        return None
    before, after = loop.regions
    if owner is before:
        return [loop.operands[value.index], after.terminator.operands[value.index]]
    return [before.terminator.operands[1 + value.index]]
