"""The norm launchers' view of a tensor as (M, N) rows: in-place row views or copies, their geometry, the
aligned window's constexprs, and the padded row size and accumulation dtype that the configs start from.

Layouts: an input is passed to the kernels with its row and column strides, so transposed batches,
sliced columns and expanded (stride-0) tensors such as the gradient of `y.sum()` are read in place.
A copy is made only when the flattened (M, N) view has no single row stride and column stride (e.g.
normalized dims that are not collapsible, torch.Tensor.view would fail), or when column offsets
would not fit in int32. weight and bias are made contiguous (N elements, negligible). Outputs are
contiguous.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Optional

import torch

import fusedops.dsl as dsl
from fusedops.kernels.allocation import contiguous_allocator
from fusedops.kernels.sizes import INT32_LIMIT


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of statistics and sums: float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def as_rows(t: torch.Tensor, n_rows: int, n_cols: int) -> torch.Tensor:
    """`t` (its trailing dims holding N = n_cols elements) as an (n_rows, n_cols) strided view,
    or as a contiguous copy when no such view exists (see the module docstring)."""
    try:
        rows = t.view(n_rows, n_cols)
    except RuntimeError:
        return t.reshape(n_rows, n_cols).contiguous()
    if (n_cols - 1) * rows.stride(1) >= INT32_LIMIT:
        return rows.contiguous()
    return rows


def contiguous_or_none(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.reshape(-1).contiguous()


def check_rows(n_rows: int) -> None:
    if n_rows >= INT32_LIMIT:
        raise ValueError(f"{n_rows} rows: at most {INT32_LIMIT - 1} rows are supported (row indices are int32)")


@functools.lru_cache(maxsize=1024)
def row_geometry(shape: tuple, strides: tuple, n_cols: int) -> tuple:
    """(n_rows, row stride, column stride) of a tensor of `shape` and `strides` whose trailing dims hold
    n_cols elements, read as (n_rows, n_cols) rows in place: the strides of `as_rows`' view. The strides
    are None when as_rows copies (the leading or the trailing dims do not merge into one, as
    torch.Tensor.view requires, or column offsets would pass int32)."""
    split, count = len(shape), 1
    while split > 0 and (count != n_cols or split == len(shape)):
        split -= 1
        count *= shape[split]
    n_rows = math.prod(shape[:split])
    if count != n_cols:
        return n_rows, None, None

    def merged(dims) -> Optional[int]:      # the stride of `dims` viewed as one dim; 0: no dim of size > 1
        dims = [(size, stride) for size, stride in dims if size != 1]
        if any(outer != size * stride for (_, outer), (size, stride) in zip(dims, dims[1:])):
            return None
        return dims[-1][1] if dims else 0

    col_stride = merged(zip(shape[split:], strides[split:]))
    row_stride = merged(zip(shape[:split], strides[:split]))
    if col_stride is None or row_stride is None or (n_cols - 1) * col_stride >= INT32_LIMIT:
        return n_rows, None, None
    col_stride = col_stride if n_cols > 1 else 1
    return n_rows, (row_stride if n_rows > 1 else n_cols * col_stride), col_stride


def output_allocator(x: torch.Tensor, allocate: Callable) -> Callable:
    """`new(x)`: an uninitialized contiguous tensor shaped and typed like x, on its device."""
    if allocate is torch.empty and x.is_contiguous():
        return torch.empty_like     # x's strides are contiguous
    new = contiguous_allocator(tuple(x.shape), x.dtype, x.device, allocate)
    return lambda x: new()


def stride_alignment(x_row_stride: int, y_row_stride: int, element_size: int) -> int:
    """norm_forward_kernels.forward_kernel's ALIGN: the power of two, at most a 16-byte vector, dividing both
    row strides (in elements; element_size in bytes)."""
    strides = x_row_stride | y_row_stride | (16 // element_size)
    return strides & -strides


def window_shift(requested: bool, block_n: Optional[int], n_cols: int, align: int, element_size: int,
                 *strides) -> int:
    """The SHIFT constexpr of row_windows.window_offsets: the elements of a 16-byte vector when an aligned
    window is requested and applies (rows start off 16-byte boundaries, every tensor's (row stride,
    column stride) is (n_cols, 1), the window fits block_n columns unless block_n is None), else 0.
    strides: (row, column) stride pairs of the tensors addressed through the window."""
    vector = 16 // element_size
    if not requested or align >= vector or (block_n is not None and block_n < n_cols + vector - 1):
        return 0
    if any(pair != (n_cols, 1) for pair in strides):
        return 0
    return vector


def round_up(n: int, multiple: int) -> int:
    return dsl.cdiv(n, multiple) * multiple
