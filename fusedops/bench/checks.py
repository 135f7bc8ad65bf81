"""Correctness of a benchmarked result against its float64 reference.

Two error measures per output tensor, both relative to the reference's scale (DESIGN.md "Testing"):
    relative = ||actual - reference||_2 / ||reference||_2
    element  = max_i |actual_i - reference_i| / max_i |reference_i|
The second catches a few wrong elements that the norm would hide (a tail-mask bug). NaN or an
infinity where the reference has a finite value, or a wrong shape, is an infinite error.

A result passes when each measure is within the larger of
    - the dtype's tolerance (RELATIVE_TOLERANCE; ELEMENT_FACTOR times it for `element`), and
    - twice the error of native PyTorch computing the same thing in the same dtype
(the rule of FlashAttention's tests: a long fp16 reduction may be legitimately less exact than
the flat tolerance, but then no worse than twice what PyTorch does).

The tolerances are those of tests/helpers.py (the test suite's copy cannot be imported by the
installed package).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch

RELATIVE_TOLERANCE = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1e-2,
}
ELEMENT_FACTOR = 4.0
BASELINE_FACTOR = 2.0


@dataclasses.dataclass(frozen=True)
class Error:
    """The error of one output tensor (see the module docstring); inf when not comparable."""

    relative: float
    element: float

    @property
    def finite(self) -> bool:
        return math.isfinite(self.relative) and math.isfinite(self.element)


INFINITE = Error(math.inf, math.inf)


def tolerance(dtype: torch.dtype) -> float:
    """The norm-relative tolerance of results computed in `dtype`."""
    try:
        return RELATIVE_TOLERANCE[dtype]
    except KeyError:
        raise ValueError(f"no tolerance for {dtype}; the benchmarks compare float16, bfloat16, float32 "
                         "and float64 results") from None


@torch.no_grad()
def measure_error(actual: torch.Tensor, reference: torch.Tensor) -> Error:
    """The error of `actual` (any float dtype) against `reference` (float64, same device and shape)."""
    if not isinstance(actual, torch.Tensor) or actual.shape != reference.shape:
        return INFINITE
    a = actual.to(torch.float64)
    finite = torch.isfinite(reference)
    # Non-finite reference values must be matched exactly (NaN by NaN, +inf by +inf, ...).
    if not bool(finite.all()):
        if not bool((torch.isnan(a) == torch.isnan(reference)).all()):
            return INFINITE
        infinite = torch.isinf(reference)
        if not bool((a[infinite] == reference[infinite]).all()):
            return INFINITE
        a, reference = a[finite], reference[finite]
    if a.numel() == 0:
        return Error(0.0, 0.0)
    if not bool(torch.isfinite(a).all()):
        return INFINITE
    difference = a - reference
    norm = float(torch.linalg.vector_norm(reference))
    peak = float(reference.abs().max())
    relative = float(torch.linalg.vector_norm(difference)) / (norm if norm > 0 else 1.0)
    element = float(difference.abs().max()) / (peak if peak > 0 else 1.0)
    return Error(relative, element)


def allowed_error(dtype: torch.dtype, baseline: Optional[Error]) -> Error:
    """The largest error that passes for results in `dtype`, given PyTorch's own error `baseline`
    on the same computation (None, or not finite: the flat tolerance alone)."""
    tol = tolerance(dtype)
    flat = Error(tol, ELEMENT_FACTOR * tol)
    if baseline is None or not baseline.finite:
        return flat
    return Error(max(flat.relative, BASELINE_FACTOR * baseline.relative),
                 max(flat.element, BASELINE_FACTOR * baseline.element))


def within(error: Error, allowed: Error) -> bool:
    """True when both measures of `error` are within `allowed` (NaN never is)."""
    return error.relative <= allowed.relative and error.element <= allowed.element
