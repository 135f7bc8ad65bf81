"""Simplification: constant folding, CSE and DCE run together until none of them changes the IR."""

from __future__ import annotations

from ..ir.core import Function
from .cse import eliminate_common_subexpressions
from .dce import eliminate_dead_code
from .fold import fold_constants

# Each round strictly shrinks or folds the IR, so this bound is only a guard against a pass bug
# that would make two rewrites undo each other forever.
_MAX_ROUNDS = 32


def simplify(function: Function) -> bool:
    """Run fold -> CSE -> DCE on `function` to a fixed point; True when the IR changed.

    Raises RuntimeError when the passes still change the IR after `_MAX_ROUNDS` rounds (a bug).
    """
    changed = False
    for _ in range(_MAX_ROUNDS):
        round_changed = fold_constants(function)
        round_changed |= eliminate_common_subexpressions(function)
        round_changed |= eliminate_dead_code(function)
        if not round_changed:
            return changed
        changed = True
    raise RuntimeError(f"simplify did not reach a fixed point in {_MAX_ROUNDS} rounds on {function.name}")
