"""Messages for faulting memory accesses: which lanes, which byte offset, relative to which argument.

The GPU gives no bounds checking; the interpreter's message should say enough to find the bug: the
kernel, the op's source line (via `ProgramContext.error`), the program id, how many lanes faulted, the
first faulting lane's block index, and its byte offset from the pointer argument the address was
computed from (found by walking the IR from the access back to a function argument, best effort) or
else from the nearest tensor storage.
"""

from __future__ import annotations

import numpy as np

from ..errors import InterpreterError
from ..ir.core import Block, Operation, Value
from ..ir.ops import OpCode
from .memory import AccessFault, Memory

# Ops whose pointer result is derived from their first operand's pointer.
_FROM_FIRST_OPERAND = frozenset({
    OpCode.ADDPTR, OpCode.SPLAT, OpCode.BROADCAST, OpCode.EXPAND_DIMS, OpCode.RESHAPE, OpCode.TRANS,
    OpCode.MULTIPLE_OF, OpCode.MAX_CONTIGUOUS, OpCode.CONVERT_LAYOUT, OpCode.BITCAST, OpCode.CAST,
})


def pointer_origin(value: Value, body: Block):
    """The function argument (an arg of `body`) that `value`'s pointer derives from, or None.

    Follows addptr/splat/broadcast/... to their pointer operand, the `a` branch of where, loop-carried
    block arguments to their initial values, and if results to the then-branch.
    """
    for _ in range(10_000):   # a bound, not a limit real IR reaches
        owner = value.owner
        if isinstance(owner, Block):
            if owner is body:
                return value
            parent = owner.parent
            if parent is None:
                return None
            if parent.opcode == OpCode.FOR and value.index >= 1:
                value = parent.operands[3 + value.index - 1]
            elif parent.opcode == OpCode.WHILE and owner is parent.regions[0]:
                value = parent.operands[value.index]
            elif parent.opcode == OpCode.WHILE:
                value = parent.regions[0].terminator.operands[1 + value.index]
            else:
                return None
        elif isinstance(owner, Operation):
            code = owner.opcode
            if code in _FROM_FIRST_OPERAND:
                value = owner.operands[0]
            elif code == OpCode.WHERE:
                value = owner.operands[1]
            elif code == OpCode.FOR:
                value = owner.operands[3 + value.index]
            elif code == OpCode.WHILE:
                value = owner.operands[value.index]
            elif code == OpCode.IF:
                value = owner.regions[0].terminator.operands[value.index]
            else:
                return None
        else:
            return None
    return None


def _region_containing(memory: Memory, address: int):
    for region in memory.regions:
        if region.base <= address < region.base + max(region.nbytes, 1):
            return region
    return None


def _nearest_region(memory: Memory, address: int):
    def distance(region):
        if address < region.base:
            return region.base - address
        return max(0, address - (region.base + region.nbytes) + 1)
    return min(memory.regions, key=distance) if memory.regions else None


def _relative_to_origin(ctx, op, address: int) -> str:
    origin = pointer_origin(op.operands[0], ctx.function.body)
    if origin is None or id(origin) not in ctx.pointer_names:
        return ""
    name = ctx.pointer_names[id(origin)]
    start = int(ctx.env[origin])
    text = f"byte offset {address - start} from pointer argument {name!r}"
    region = _region_containing(ctx.memory, start)
    if region is None:
        return text + " (which points to no tensor storage)"
    low, high = region.base - start, region.base + region.nbytes - start
    return text + f" (its tensor storage spans byte offsets [{low}, {high}) from that pointer)"


def _relative_to_nearest(memory: Memory, address: int, itemsize: int) -> str:
    region = _nearest_region(memory, address)
    if region is None:
        return f"address {address:#x}; no tensor storage is registered"
    names = ", ".join(repr(n) for n in region.names)
    if address < region.base:
        where = f"{region.base - address} bytes before the start"
    elif address + itemsize > region.base + region.nbytes:
        where = f"{address + itemsize - (region.base + region.nbytes)} bytes past the end"
    else:
        where = f"byte offset {address - region.base} into"
    return (f"address {address:#x}, {where} of the storage of argument {names} "
            f"({region.nbytes} bytes)")


def access_error(ctx, op: Operation, fault: AccessFault, access: str, dtype, shape: tuple,
                 positions: np.ndarray) -> InterpreterError:
    """The InterpreterError for `fault` in a `access` ("load", "store", "atomic") of `dtype` elements.

    `positions` are the flat block indices of the accessed (unmasked) lanes, in access order, or None
    when every lane is accessed; `shape` is the block shape (() for a scalar access).
    """
    if positions is None:
        positions = np.arange(int(np.prod(shape, dtype=np.int64)))
    count, total = len(fault.lanes), len(positions)
    first = int(positions[fault.lanes[0]])
    index = tuple(int(i) for i in np.unravel_index(first, shape)) if shape else ()
    address = int(fault.addresses[0])
    relation = _relative_to_origin(ctx, op, address) or \
        _relative_to_nearest(ctx.memory, address, fault.itemsize)
    lane = f" at block index {index}" if shape else ""
    if fault.kind == "misaligned":
        what = (f"misaligned {access} of {dtype}: {count} of {total} accessed lanes are not "
                f"{fault.itemsize}-byte aligned")
    else:
        what = (f"out-of-bounds {access} of {dtype}: {count} of {total} accessed lanes fall outside "
                f"every tensor argument's storage")
    return ctx.error(op, f"{what}; the first{lane} is {relation}")
