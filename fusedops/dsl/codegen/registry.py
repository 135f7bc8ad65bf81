"""The table of lowering rules: {OpCode: rule(ctx, op)}. Each op family registers its rules in its
own module; `lower_op` dispatches and names an op that has no rule.

A rule reads its operands with `ctx.get(value)` (a list of per-register LLVM values for a block, one
LLVM value for a scalar) and records its results with `ctx.set(result, lowered)`.
"""

from __future__ import annotations

from typing import Callable

from ..errors import UnsupportedError
from ..ir import Operation, OpCode

_RULES: dict = {}


def lowering(*opcodes: OpCode) -> Callable:
    """Register the decorated function as the lowering rule of `opcodes` (at import time only)."""
    def register(rule: Callable) -> Callable:
        for opcode in opcodes:
            if opcode in _RULES:
                raise RuntimeError(f"two lowering rules for {opcode.value}")
            _RULES[opcode] = rule
        return rule
    return register


def lower_op(ctx, op: Operation) -> None:
    rule = _RULES.get(op.opcode)
    if rule is None:
        raise UnsupportedError(f"the code generator has no lowering for `{op.opcode.value}`", op.loc)
    rule(ctx, op)
