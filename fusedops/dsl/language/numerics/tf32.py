"""tf32 (TensorFloat-32: float32's 8 exponent bits, 10 of its 23 mantissa bits) operand rounding for the
interpreter's `dot` with input_precision "tf32", as the compiled tensor-core dot does it (`cvt.rna.tf32.f32`,
PTX ISA "cvt": round to nearest, ties away from zero; codegen/mma_tf32.py).
"""

from __future__ import annotations

import numpy as np

# The 13 low mantissa bits tf32 drops, and half of their range (the rounding increment: ties away).
_DROPPED = np.uint32(0x1FFF)
_HALF = np.uint32(0x1000)


def round_to_tf32(x) -> np.ndarray:
    """float32 array `x` rounded to tf32 (kept in float32), to nearest with ties away from zero: add half
    a tf32 unit to the magnitude's bits and clear the dropped ones (a carry into the exponent is the next
    binade, or infinity past the largest finite tf32, as cvt.rna gives). NaN and infinities are kept."""
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    rounded = ((bits + _HALF) & ~_DROPPED).view(np.float32)
    return np.where(np.isfinite(x), rounded, x)
