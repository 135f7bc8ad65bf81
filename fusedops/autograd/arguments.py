"""Checks of the ops' scalar arguments shared by the autograd modules, with torch's errors."""

from __future__ import annotations

import torch


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
