"""Rules for program ids, structured control flow (for, while, if) and debugging (print, assert)."""

from __future__ import annotations

import sys

import numpy as np

from ..ir.ops import OpCode
from ..language.numerics import conversions
from .context import element_type, register


@register(OpCode.PROGRAM_ID)
def _program_id(ctx, op):
    return np.asarray(ctx.program_id[op.attrs["axis"]], dtype=np.int32)


@register(OpCode.NUM_PROGRAMS)
def _num_programs(ctx, op):
    return np.asarray(ctx.grid[op.attrs["axis"]], dtype=np.int32)


@register(OpCode.FOR, multiple_results=True)
def _for(ctx, op, lower, upper, step, *initial):
    """Python `range(lower, upper, step)` semantics; the induction variable has lower's type."""
    if int(step) == 0:
        raise ctx.error(op, "for loop step is zero")
    body = op.regions[0]
    induction_type = element_type(op.operands[0].type)
    carried = list(initial)
    for i in range(int(lower), int(upper), int(step)):
        carried = ctx.run_region(body, [conversions.from_python(i, induction_type)] + carried)
    return carried


@register(OpCode.WHILE, multiple_results=True)
def _while(ctx, op, *initial):
    """Run the before-region on the carried values; its CONDITION(cond, forwarded...) either ends the
    loop with `forwarded` as results or passes them to the after-region, whose YIELD is carried.

    Raises InterpreterError where an iteration changed neither the carried values (bit for bit) nor memory
    (`Memory.version`): the next would be the same, for ever (a spin wait on a later program's flag)."""
    before, after = op.regions[0], op.regions[1]
    carried = list(initial)
    while True:
        version = ctx.memory.version
        condition, *forwarded = ctx.run_region(before, carried)
        if not bool(condition):
            return forwarded
        previous, carried = carried, ctx.run_region(after, forwarded)
        if ctx.memory.version == version and ctx.cluster_exchange is None and _same_values(previous, carried):
            # One program runs at a time and none other runs meanwhile (except beside a cluster_sum, whose
            # programs switch inside it: not checked), so this iteration's state repeats for ever.
            raise ctx.error(op, "while loop cannot end: an iteration changed neither its loop variables nor "
                                "memory, and the interpreter runs one program at a time, in order of program id "
                                "(x fastest), so no other program can change them meanwhile (a spin wait on a "
                                "flag or lock that a later program sets never ends here)")


def _same_values(a: list, b: list) -> bool:
    """Whether the values `a` and `b` are the same bit for bit (NaN equal to itself, -0.0 not to 0.0)."""
    return all(np.shape(x) == np.shape(y) and np.asarray(x).dtype == np.asarray(y).dtype
               and np.asarray(x).tobytes() == np.asarray(y).tobytes() for x, y in zip(a, b))


@register(OpCode.IF, multiple_results=True)
def _if(ctx, op, condition):
    if bool(condition):
        return ctx.run_region(op.regions[0])
    return ctx.run_region(op.regions[1]) if len(op.regions) > 1 else []


def _format(value: np.ndarray, dtype, as_hex: bool) -> str:
    value = np.asarray(value)
    if as_hex:   # the bit pattern, for floats too
        value = conversions.to_bits(value, dtype)
        formatter = {"int": lambda v: f"0x{int(v):x}"}
    else:
        formatter = None
    text = np.array2string(value, separator=", ", formatter=formatter, threshold=sys.maxsize,
                           max_line_width=sys.maxsize)
    return " ".join(text.split())


@register(OpCode.PRINT)
def _print(ctx, op, *values):
    """One line per operand: `pid (x, y, z) prefix value`, blocks written on one line."""
    x, y, z = ctx.program_id
    prefix = op.attrs.get("prefix", "")
    as_hex = bool(op.attrs.get("hex"))
    if not op.operands:     # the prefix alone, as the compiled kernel prints it
        print(f"pid ({x}, {y}, {z}) {prefix}")
    for operand, value in zip(op.operands, values):
        text = _format(value, element_type(operand.type), as_hex)
        print(f"pid ({x}, {y}, {z}) " + (f"{prefix} " if prefix else "") + text)


@register(OpCode.BARRIER)
def _barrier(ctx, op):
    """A program's elements run together in the interpreter: nothing to wait for."""


@register(OpCode.LAUNCH_BOUNDS)
def _launch_bounds(ctx, op):
    """A directive for ptxas: nothing to run."""


@register(OpCode.CLUSTER_DIMS)
def _cluster_dims(ctx, op):
    """A launch directive (the grid is checked before the programs run): nothing to run."""


@register(OpCode.ASSERT)
def _assert(ctx, op, condition):
    condition = np.asarray(condition)
    if not condition.all():
        failed = np.flatnonzero(~condition.reshape(-1).astype(bool))
        where = ""
        if condition.ndim:
            where = f" ({failed.size} of {condition.size} elements false, first at index " \
                    f"{tuple(int(i) for i in np.unravel_index(failed[0], condition.shape))})"
        raise ctx.error(op, f"device assertion failed: {op.attrs.get('message', '')}{where}")
