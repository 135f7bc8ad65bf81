"""Block-wide rules: reductions (sum / max / min, argmax / argmin), scans and DOT, as the package docstring
(numerics/__init__.py) states them.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import DType, float64
from .conversions import int_result, int_view, is_half, round_to_type, scalar_type
from .tf32 import round_to_tf32


def _accumulation_type(dtype: DType):
    """Sums of fp16/bf16 accumulate in float32 and round once at the end."""
    return np.dtype(np.float32) if is_half(dtype) else None


def reduce(x, kind: str, axis, dtype: DType) -> np.ndarray:
    """Reduce along `axis` (None: every axis) with kind sum/max/min/xor (REDUCE; xor: bitwise, of integers).

    sum: integers wrap around (int1 sums are parities); fp16/bf16 accumulate in float32 and round once;
    the summation order is unspecified (NumPy: pairwise); a sum of -0.0s is -0.0, as the compiled tree
    adds only the elements (IEEE 754: -0 + -0 = -0; NumPy starts from +0.0). max/min propagate NaN and
    order -0.0 < +0.0.
    """
    dtype = scalar_type(dtype)
    x = np.asarray(x)
    if kind == "sum":
        if dtype.is_floating:
            accumulate = _accumulation_type(dtype)
            total = np.sum(x if accumulate is None else x.astype(accumulate), axis=axis)
            if np.any(total == 0):      # (the sign of a zero sum: only then are the elements looked at again)
                total = np.where(np.all((x == 0) & np.signbit(x), axis=axis), -0.0, total).astype(total.dtype)
            return round_to_type(total, dtype) if accumulate is not None else np.asarray(total)
        view = int_view(x, dtype)
        return int_result(np.sum(view, axis=axis, dtype=view.dtype), dtype)
    if kind == "xor":       # integers only (xor_sum)
        return int_result(np.bitwise_xor.reduce(int_view(x, dtype), axis=axis), dtype)
    if kind in ("max", "min"):
        extreme = np.asarray((np.max if kind == "max" else np.min)(x, axis=axis))
        return _order_zeros(extreme, x, kind, lambda found: np.any(found, axis=axis))
    raise NotImplementedError(f"reduce kind {kind!r}")


def _order_zeros(extreme: np.ndarray, x: np.ndarray, kind: str, gather) -> np.ndarray:
    """`extreme` (a max or min of x's floats) with its zeros signed as IEEE 754-2019 maximum / minimum
    order them, -0.0 below +0.0 (the compiled llvm.maximum / llvm.minimum; NumPy keeps whichever zero it
    met first): a max is +0.0 where the elements `gather` covers hold a +0.0, a min -0.0 where they hold
    a -0.0. `gather(found)` reduces a boolean array of x's shape as extreme was reduced."""
    if x.dtype.kind != "f" or not np.any(extreme == 0):
        return extreme
    sign = np.signbit(x)
    found = gather((x == 0) & (~sign if kind == "max" else sign))
    signed = np.where(found, 0.0, -0.0) if kind == "max" else np.where(found, -0.0, 0.0)
    return np.where(extreme == 0, signed.astype(extreme.dtype), extreme)


def argreduce(x, kind: str, axis) -> np.ndarray:
    """Index (int32) of the first maximum (kind argmax) or minimum (argmin) along `axis` (None: of the
    flattened block). NaN counts as the extreme, so the first NaN wins (torch.argmax/argmin)."""
    x = np.asarray(x)
    if kind not in ("argmax", "argmin"):
        raise NotImplementedError(f"argreduce kind {kind!r}")
    find = np.argmax if kind == "argmax" else np.argmin
    index = find(x, axis=axis)
    if x.dtype.kind == "f":   # explicit, rather than relying on NumPy's NaN ordering
        nan = np.isnan(x)
        index = np.where(np.any(nan, axis=axis), np.argmax(nan, axis=axis), index)
    return np.asarray(index).astype(np.int32)


def scan(x, kind: str, axis: int, reverse: bool, dtype: DType) -> np.ndarray:
    """Inclusive prefix scan along `axis` (SCAN), from the end when `reverse`.

    sum: sequential order; integers wrap around; fp16/bf16 accumulate in float32 and each output is
    rounded once. prod: sequential order, in x's type (integers wrap around). max/min: running extreme, NaN
    propagates, -0.0 < +0.0.
    """
    dtype = scalar_type(dtype)
    x = np.asarray(x)
    if reverse:
        x = np.flip(x, axis)
    if kind == "sum":
        if dtype.is_floating:
            accumulate = _accumulation_type(dtype)
            if accumulate is None:
                result = np.cumsum(x, axis=axis, dtype=x.dtype)
            else:
                result = round_to_type(np.cumsum(x.astype(accumulate), axis=axis), dtype)
        else:
            view = int_view(x, dtype)
            result = int_result(np.cumsum(view, axis=axis, dtype=view.dtype), dtype)
    elif kind == "prod":    # sequential order; integers wrap around (cumprod: float32 / float64 / 32- and 64-bit ints)
        view = int_view(x, dtype) if not dtype.is_floating else x
        result = np.cumprod(view, axis=axis, dtype=view.dtype)
        result = result if dtype.is_floating else int_result(result, dtype)
    elif kind in ("max", "min"):
        result = (np.maximum if kind == "max" else np.minimum).accumulate(x, axis=axis)
        result = _order_zeros(result, x, kind, lambda found: np.logical_or.accumulate(found, axis=axis))
    else:
        raise NotImplementedError(f"scan kind {kind!r}")
    return np.flip(result, axis) if reverse else result


def dot(a, b, acc, input_dtype: DType, acc_dtype: DType, input_precision=None) -> np.ndarray:
    """a (MxK) @ b (KxN) + acc (MxN) (DOT), returned in acc's type.

    Floating inputs: the product a @ b is accumulated in float64 (the products of float32 and narrower inputs
    are exact there) and rounded once to float32 (float64 when either input or acc is float64), then acc is
    added in that type and the result rounded to acc's type: at least as accurate as the GPU's float32
    accumulation, and the same whichever order the products are added in (the BLAS's float32 kernels add them
    in an order that depends on the CPU and on the operands' layout, so a product recomputed transposed, as
    attention's backward recomputes Q K^T as K Q^T, could differ from the first in its last bits: at large
    logits its exp no longer matched the forward's log-sum-exp). `x + dot(a, b)` and `dot(a, b, x)` agree
    bitwise (passes/dot_accumulation.py folds one into the other). Integer inputs (int8 -> int32) are exact
    products summed with wrap-around in acc's type. input_precision "tf32" (float32 inputs) first rounds a
    and b to tf32 as the tensor cores' operands are (`tf32.round_to_tf32`: nearest, ties away); their
    products are exact in float64 as well.
    """
    if input_precision == "tf32" and input_dtype.is_floating and input_dtype.bits == 32:
        a, b = round_to_tf32(a), round_to_tf32(b)
    if input_dtype.is_floating:
        compute = np.float64 if float64 in (input_dtype, acc_dtype) else np.float32
        total = np.matmul(np.asarray(a).astype(np.float64), np.asarray(b).astype(np.float64)).astype(compute)
        return round_to_type(np.add(total, np.asarray(acc).astype(compute)), acc_dtype)
    # Integers: exact float64 products and sums while |sum| < 2**53 (always for 8-bit inputs and
    # K < 2**37), otherwise int64 matmul; then wrap into acc's type.
    if input_dtype.bits <= 8:
        total = np.matmul(np.asarray(a).astype(np.float64), np.asarray(b).astype(np.float64))
        total = total.astype(np.int64)
    else:
        total = np.matmul(np.asarray(a).astype(np.int64), np.asarray(b).astype(np.int64))
    return np.add(total.astype(acc_dtype.numpy_dtype), np.asarray(acc))
