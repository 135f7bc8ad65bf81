"""Checks of the ops' scalar arguments shared by the autograd modules, with torch's errors, and `definitely` /
`known_true`, how the shape checks and routing decide comparisons of symbolic sizes."""

from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false, statically_known_true


def definitely(condition) -> bool:
    """`condition`, a comparison of sizes, as a bool. A symbolic one (torch.SymBool: sizes of a graph traced with
    dynamic shapes) is decided as bool() decides it (a guard), but one its sizes cannot decide (unbacked sizes, from
    nonzero or .item(): data-dependent) is False instead of an error (torch's guard_or_false), as torch's own shape
    checks take it: a check then raises only for shapes known to be wrong, and torch's ops assert the rest when the
    graph runs. Under torch.jit.trace, where sizes are 0-d tensors, a 0-d bool tensor's value."""
    if condition is True or condition is False:      # plain sizes (eager): no call into torch's shape code
        return condition
    if isinstance(condition, torch.Tensor):
        return bool(condition)
    return guard_or_false(condition)     # (under dynamo a SymBool may pass for a bool: it is decided here)


def known_true(condition) -> bool:
    """`condition`, a comparison of sizes, only where the sizes decide it without a guard (torch's
    statically_known_true: a symbolic one that depends on a dynamic size is False, and the traced graph stays good
    for every size); a 0-d bool tensor's value under torch.jit.trace."""
    return bool(condition) if isinstance(condition, torch.Tensor) else statically_known_true(condition)


def float_argument(function: str, name: str, value, expected: str = "float") -> float:
    """float(value) for argument `name` of `function`, taken as torch's argument parser takes a float: a
    Python or NumPy number, or a 0-d tensor that does not require grad; not a string (float() would parse
    it), None, a tensor that requires grad or a tensor of one or more dims (float() takes one element).

    Raises:
        TypeError: "{function}(): argument '{name}' must be {expected}, not {type}", as torch.
    """
    try:
        if isinstance(value, (str, bytes)) or (isinstance(value, torch.Tensor)
                                               and (value.requires_grad or value.dim() != 0)):
            raise TypeError
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{function}(): argument '{name}' must be {expected}, not {type(value).__name__}") from None
