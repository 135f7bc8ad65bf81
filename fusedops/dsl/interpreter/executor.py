"""Runs a block-IR function on the CPU, program instance by program instance.

`Interpreter(function)` prepares the function once (looks up the rule of every op, evaluates constants
and aranges); `Interpreter.launch(grid, args)` binds the arguments and runs every program of the grid
in row-major order over (z, y, x), x fastest (a kernel launched in clusters, `dsl.cluster_dims`, has
its grid and its multicast loads checked: cluster.py). Programs run one after another, except the
programs of a cluster of a kernel that calls `dsl.cluster_sum`: those run side by side, one at a time,
switching only inside cluster_sum (cooperative.py), and clusters run one after another. Either way
one program runs at a time, so atomics are sequential, every launch runs in the same order, and a
kernel that is only correct under some interleaving is not detected. A program that spins waiting for a
later one (a `while` iteration that changes neither its loop variables nor memory) raises InterpreterError
instead of hanging (rules_control.py).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..errors import LaunchError
from ..ir.core import Block, Function
from ..ir.ops import TERMINATORS, OpCode
from . import rules_block, rules_cluster, rules_control, rules_descriptors, rules_elementwise, rules_memory, rules_pipelining  # noqa: F401,E501 (register rules)
from .arguments import bind_arguments
from .cluster import ClusterLog
from .cooperative import ClusterExchange
from .context import RULES, ProgramContext


def _static_step(value):
    def step(ctx, op):
        return value
    return step


def normalize_grid(grid) -> tuple:
    """`grid` (1 to 3 non-negative ints, x first) as an (x, y, z) tuple padded with 1s.
    Raises LaunchError otherwise."""
    if isinstance(grid, (int, np.integer)):
        grid = (grid,)
    try:
        dims = tuple(grid)
    except TypeError:
        raise LaunchError(f"grid must be a tuple of 1 to 3 ints, got {grid!r}") from None
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool)
                                          and d >= 0 for d in dims):
        raise LaunchError(f"grid must be a tuple of 1 to 3 non-negative ints, got {grid!r}")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


class Interpreter:
    """A function prepared for interpretation; reuse it across launches (preparation is per function).

    Raises NotImplementedError naming the op code when the function holds an op without a rule.
    """

    def __init__(self, function: Function):
        self.function = function
        self._plans: dict = {}
        self._prepare(function.body)
        names = list(function.arg_names)
        if len(names) != len(function.args):
            names = [v.name or f"arg{i}" for i, v in enumerate(function.args)]
        self.arg_names = names
        self._has_cluster_sum = any(op.opcode == OpCode.CLUSTER_SUM for op in function.walk())

    def _prepare(self, block: Block) -> None:
        steps, terminator = [], None
        for op in block.ops:
            if op.opcode in TERMINATORS:
                terminator = tuple(op.operands)
                continue
            rule = RULES.get(op.opcode)
            if rule is None:
                raise NotImplementedError(
                    f"the interpreter has no rule for op {op.opcode.value!r} (at {op.loc})")
            function = _static_step(rule.fn(None, op)) if rule.static else rule.fn
            steps.append((function, op, tuple(op.operands), tuple(op.results), rule.multiple_results))
            for region in op.regions:
                self._prepare(region)
        self._plans[id(block)] = (steps, terminator)

    def launch(self, grid, args: Sequence, *, kernel_name: Optional[str] = None) -> None:
        """Run the function over `grid` with `args` (one per function argument: a torch.Tensor (or
        None) for each pointer, a Python/NumPy scalar for each scalar). Tensors are updated in place.

        Raises LaunchError for a bad grid, TypeError/ValueError for bad arguments, InterpreterError for
        a fault in the kernel (out-of-bounds or misaligned access, failed assertion, programs of a cluster
        making different multicast loads or cluster_sum calls).
        """
        grid = normalize_grid(grid)
        name = kernel_name or self.function.name
        cluster = ClusterLog(self.function, grid, name)
        bound = bind_arguments(self.function, args, self.arg_names)
        side_by_side = self._has_cluster_sum and cluster.size > 1

        def new_context(x, y, z):
            return ProgramContext((x, y, z), grid, bound.memory, self._plans, name, self.function,
                                  bound.pointer_names)

        def run(ctx):
            if cluster.checked:
                ctx.cluster_log = cluster
            ctx.run_region(self.function.body, bound.values)
            if cluster.checked:
                cluster.finish(ctx)

        try:
            with np.errstate(all="ignore"):   # IEEE results (inf, NaN) are the semantics, not errors
                for z in range(grid[2]):
                    for y in range(grid[1]):
                        if side_by_side:
                            for first in range(0, grid[0], cluster.size):
                                ClusterExchange([new_context(first + rank, y, z)
                                                 for rank in range(cluster.size)]).run(run)
                        else:
                            for x in range(grid[0]):
                                run(new_context(x, y, z))
        finally:
            bound.finish()


def launch(function: Function, grid: tuple, args: Sequence, *, kernel_name: Optional[str] = None) -> None:
    """Interpret `function` over `grid` with `args`; see `Interpreter.launch`. Prepares the function
    on every call: callers that launch one function repeatedly should keep an `Interpreter`."""
    Interpreter(function).launch(grid, args, kernel_name=kernel_name)
