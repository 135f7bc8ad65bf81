"""The rule registry and the per-program context that rules run in.

A rule evaluates one op code: `rule(ctx, op, *operand_values) -> result` (a sequence of results when
registered with `multiple_results=True`, None for ops without results). Rules register themselves with
`@register(OpCode.X)` in the `rules_*.py` modules; `executor.py` imports those modules, looks every op
of a function up once when it prepares the function, and raises NotImplementedError for an op code
without a rule (the same scheme as JAX Pallas' lowering rules).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from ..errors import InterpreterError
from ..ir.core import Operation
from ..ir.ops import OpCode
from ..language.dtypes import BlockType


@dataclasses.dataclass(frozen=True)
class Rule:
    """`fn(ctx, op, *operands)`; `static` rules depend on the op alone (CONSTANT, ARANGE) and are
    evaluated once per prepared function, with ctx None."""

    fn: Callable
    multiple_results: bool = False
    static: bool = False


RULES: dict = {}   # OpCode -> Rule, filled at import time by the rules_*.py modules


def register(*opcodes: OpCode, multiple_results: bool = False, static: bool = False):
    def decorate(fn):
        for opcode in opcodes:
            if opcode in RULES:
                raise RuntimeError(f"two interpreter rules for {opcode.value}")
            RULES[opcode] = Rule(fn, multiple_results, static)
        return fn
    return decorate


def element_type(type_):
    """The scalar type of a scalar or block type."""
    return type_.element if isinstance(type_, BlockType) else type_


class ProgramContext:
    """State of one program instance: its ids, the memory, and the value of every IR value so far.

    `plans` maps id(Block) to (steps, terminator operands); see `executor.py`.
    """

    __slots__ = ("program_id", "grid", "memory", "env", "plans", "kernel_name", "function",
                 "pointer_names", "cluster_log", "multicast_calls", "cluster_exchange", "cluster_sum_calls")

    def __init__(self, program_id: tuple, grid: tuple, memory, plans: dict, kernel_name: str,
                 function, pointer_names: dict):
        self.program_id = program_id      # (x, y, z)
        self.grid = grid                  # (x, y, z) program counts
        self.memory = memory
        self.env: dict = {}               # Value -> NumPy array (0-d for scalars)
        self.plans = plans
        self.kernel_name = kernel_name
        self.function = function
        self.pointer_names = pointer_names   # id(pointer argument Value) -> its name
        self.cluster_log = None              # cluster.ClusterLog where multicast loads are checked
        self.multicast_calls: dict = {}      # id(multicast load op) -> calls so far
        self.cluster_exchange = None         # cooperative.ClusterExchange where cluster_sum adds across programs
        self.cluster_sum_calls = 0           # cluster_sum calls so far

    def run_region(self, block, args=()) -> list:
        """Bind `block`'s arguments to `args`, run its ops, and return its terminator's operand values
        ([] when it has none)."""
        env = self.env
        for param, value in zip(block.args, args):
            env[param] = value
        steps, terminator = self.plans[id(block)]
        for fn, op, operands, results, multiple in steps:
            out = fn(self, op, *[env[v] for v in operands])
            if multiple:
                for result, value in zip(results, out):
                    env[result] = value
            elif results:
                env[results[0]] = out
        return [env[v] for v in terminator] if terminator is not None else []

    def error(self, op: Operation, message: str) -> InterpreterError:
        """An InterpreterError at `op`'s source location, naming the kernel and this program."""
        return InterpreterError(f"kernel {self.kernel_name!r}: {message}", loc=op.loc,
                                program_id=self.program_id)


def read_only(value):
    """Mark a cached array read-only so that a rule writing into its input fails loudly."""
    if isinstance(value, np.ndarray):
        value.flags.writeable = False
    return value
