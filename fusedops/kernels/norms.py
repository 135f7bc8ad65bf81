"""Launchers of the LayerNorm/RMSNorm kernels (norm_kernels.py): layouts, configurations, grids.

The tensors here are already flattened to (M, N) row matrices by `as_rows` (M rows, N normalized
columns); argument checking and torch's dtype rules live in fusedops.autograd.norms. Every function
takes `interpret` (None: follow FUSEDOPS_INTERPRET) and an optional config that overrides the
heuristics (tests use it to force the looped and split paths at small sizes; bench/layernorm.py to
sweep configurations).

Layouts: an input is passed to the kernels with its row and column strides, so transposed batches,
sliced columns and expanded (stride-0) tensors such as the gradient of `y.sum()` are read in place.
A copy is made only when the flattened (M, N) view has no single row stride and column stride (e.g.
normalized dims that are not collapsible, torch.Tensor.view would fail), or when column offsets
would not fit in int32. weight and bias are made contiguous (N elements, negligible). Outputs are
contiguous.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional

import torch

import fusedops.dsl as dsl
from fusedops.kernels import norm_kernels as K

_INT32_LIMIT = 2**31
# In the interpreter (CPU tensors) the grid of the backward is sized as for a small GPU of this many
# SMs: the interpreter's cost grows with the number of programs, not with their size.
_INTERPRETER_SMS = 4


@dataclasses.dataclass(frozen=True)
class ForwardConfig:
    """Tiling of the forward. looped=False: forward_kernel, (block_rows, block_n) tiles of whole rows
    (block_n >= N). looped=True: forward_looped_kernel, one row per program in block_n-column chunks."""

    looped: bool
    block_rows: int
    block_n: int
    num_warps: int


@dataclasses.dataclass(frozen=True)
class BackwardConfig:
    """Tiling of the backward.

    split=False: backward_fused_kernel over (block_rows, block_n) tiles of whole rows (block_n >= N),
    programs_per_sm programs per SM, each owning a contiguous group of rows.
    split=True: backward_partials_kernel over (block_rows, block_n) tiles of (row group, column chunk)
    with programs_per_sm programs per SM, then backward_input_kernel over (input_block_rows,
    input_block_n) tiles with input_num_warps.
    prefetch: the row loop loads the next row block before reducing the current one (twice the bytes
    in flight, more registers).
    """

    split: bool
    block_rows: int
    block_n: int
    num_warps: int
    programs_per_sm: int
    prefetch: bool = False
    input_block_rows: int = 1
    input_block_n: int = 1
    input_num_warps: int = 4


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of statistics and sums: float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def forward_config(n_cols: int, dtype: torch.dtype) -> ForwardConfig:
    """Whole rows in registers while the padded row is at most 64 KiB of input (32768 16-bit, 16384
    float32, 8192 float64 columns; ptxas keeps these without spills), else the looped kernel. About 16
    columns per thread (8 for float64), at most 32 warps."""
    block_n = _next_power_of_2(n_cols)
    acc_bytes = accumulation_dtype(dtype).itemsize
    if block_n * dtype.itemsize <= 64 * 1024:
        num_warps = min(32, max(4, block_n * acc_bytes // 2048))
        return ForwardConfig(looped=False, block_rows=max(1, 2048 // block_n), block_n=block_n,
                             num_warps=num_warps)
    return ForwardConfig(looped=True, block_rows=1, block_n=16384 // acc_bytes, num_warps=8)


def backward_config(n_cols: int, dtype: torch.dtype) -> BackwardConfig:
    """The fused backward while the padded row is at most 16 KiB of input (8192 16-bit, 4096 float32,
    2048 float64 columns) at 16 columns per thread (8 for float64): it keeps about eight registers per
    column (x, dy, their products and the two column sums). Longer rows take the split backward."""
    block_n = _next_power_of_2(n_cols)
    acc_bytes = accumulation_dtype(dtype).itemsize
    if block_n * dtype.itemsize <= 16 * 1024:
        num_warps = min(16, max(4, block_n * acc_bytes // 2048))
        return BackwardConfig(split=False, block_rows=max(1, 1024 // block_n), block_n=block_n,
                              num_warps=num_warps, programs_per_sm=max(1, 16 // num_warps),
                              prefetch=num_warps <= 8)
    return BackwardConfig(split=True, block_rows=8 // acc_bytes, block_n=1024, num_warps=4, programs_per_sm=4,
                          prefetch=True, input_block_rows=1, input_block_n=4096, input_num_warps=8)


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return _INTERPRETER_SMS


def as_rows(t: torch.Tensor, n_rows: int, n_cols: int) -> torch.Tensor:
    """`t` (its trailing dims holding N = n_cols elements) as an (n_rows, n_cols) strided view,
    or as a contiguous copy when no such view exists (see the module docstring)."""
    try:
        rows = t.view(n_rows, n_cols)
    except RuntimeError:
        return t.reshape(n_rows, n_cols).contiguous()
    if (n_cols - 1) * rows.stride(1) >= _INT32_LIMIT:
        return rows.contiguous()
    return rows


def _contiguous_or_none(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.reshape(-1).contiguous()


def _check_rows(n_rows: int) -> None:
    if n_rows >= _INT32_LIMIT:
        raise ValueError(f"{n_rows} rows: at most {_INT32_LIMIT - 1} rows are supported (row indices are int32)")


def norm_forward(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float, *,
                 subtract_mean: bool, config: Optional[ForwardConfig] = None, interpret: Optional[bool] = None,
                 allocate: Callable = torch.empty):
    """LayerNorm (subtract_mean=True) or RMSNorm forward of the rows of `x`.

    Args:
        x: (M, N) float16/bfloat16/float32/float64, any strides.
        weight, bias: (N,) or None (any floating dtype; converted on load).
        eps: added to the variance (mean square) in the accumulation dtype.
        allocate: makes every output, called as torch.empty(shape, dtype=, device=) (tests poison them).

    Returns:
        (y, mean, rstd): y (M, N) contiguous in x's dtype; mean (M,) (None for RMSNorm) and rstd (M,) in
        the accumulation dtype (float32, float64 for float64 x).
    """
    n_rows, n_cols = x.shape
    _check_rows(n_rows)
    acc = accumulation_dtype(x.dtype)
    y = allocate((n_rows, n_cols), dtype=x.dtype, device=x.device)
    mean = allocate((n_rows,), dtype=acc, device=x.device) if subtract_mean else None
    rstd = allocate((n_rows,), dtype=acc, device=x.device)
    if n_rows == 0 or n_cols == 0:
        return y, mean, rstd
    weight, bias = _contiguous_or_none(weight), _contiguous_or_none(bias)
    config = config or forward_config(n_cols, x.dtype)
    args = (y, mean, rstd, x, weight, bias, n_rows, n_cols, x.stride(0), x.stride(1), y.stride(0), float(eps))
    if config.looped:
        K.forward_looped_kernel[(n_rows,)](*args, SUBTRACT_MEAN=subtract_mean, BLOCK_N=config.block_n,
                                           num_warps=config.num_warps, interpret=interpret)
    else:
        if config.block_n < n_cols:
            raise ValueError(f"block_n={config.block_n} is smaller than the row ({n_cols} columns)")
        K.forward_kernel[(dsl.cdiv(n_rows, config.block_rows),)](
            *args, SUBTRACT_MEAN=subtract_mean, BLOCK_ROWS=config.block_rows, BLOCK_N=config.block_n,
            num_warps=config.num_warps, interpret=interpret)
    return y, mean, rstd


def _row_groups(n_rows: int, block_rows: int, target_programs: int) -> tuple:
    """(rows_per_program, number of groups): about `target_programs` contiguous groups of rows, each a
    multiple of block_rows rows."""
    tiles = dsl.cdiv(n_rows, block_rows)
    tiles_per_group = dsl.cdiv(tiles, max(1, min(tiles, target_programs)))
    rows_per_program = tiles_per_group * block_rows
    return rows_per_program, dsl.cdiv(n_rows, rows_per_program)


def norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor], mean: Optional[torch.Tensor],
                  rstd: torch.Tensor, *, subtract_mean: bool, input_grad: bool, weight_grad: bool, bias_grad: bool,
                  bias_dtype: Optional[torch.dtype] = None, config: Optional[BackwardConfig] = None,
                  interpret: Optional[bool] = None, allocate: Callable = torch.empty):
    """Gradients of norm_forward.

    Args:
        dy, x: (M, N), any strides (dy may be expanded, stride 0); dy has x's dtype.
        weight: (N,) or None; mean (LayerNorm; else None), rstd: (M,) as returned by norm_forward.
        input_grad, weight_grad, bias_grad: which gradients to compute (weight_grad needs a weight).
        bias_dtype: the dtype of dbias (the bias's).
        allocate: makes every output and scratch buffer, as in norm_forward.

    Returns:
        (dx, dweight, dbias): dx (M, N) contiguous in x's dtype, dweight (N,) in weight's dtype, dbias
        (N,) in bias_dtype; None for a gradient that was not asked for. dweight and dbias are
        deterministic: per-program partial sums reduced in a fixed order.
    """
    n_rows, n_cols = x.shape
    device, acc = x.device, rstd.dtype
    dx = allocate((n_rows, n_cols), dtype=x.dtype, device=device) if input_grad else None
    dweight = allocate((n_cols,), dtype=weight.dtype, device=device) if weight_grad else None
    dbias = allocate((n_cols,), dtype=bias_dtype, device=device) if bias_grad else None
    if n_rows == 0 or n_cols == 0:
        for grad in (dweight, dbias):
            if grad is not None:
                grad.zero_()
        return dx, dweight, dbias
    weight = _contiguous_or_none(weight)
    config = config or backward_config(n_cols, x.dtype)
    target_programs = _sm_count(device) * config.programs_per_sm
    strides = (x.stride(0), x.stride(1), dy.stride(0), dy.stride(1))
    tiling = dict(SUBTRACT_MEAN=subtract_mean, BLOCK_ROWS=config.block_rows, BLOCK_N=config.block_n,
                  PREFETCH=config.prefetch, num_warps=config.num_warps, interpret=interpret)
    if not config.split:
        if config.block_n < n_cols:
            raise ValueError(f"block_n={config.block_n} is smaller than the row ({n_cols} columns)")
        rows_per_program, groups = _row_groups(n_rows, config.block_rows, target_programs)
        dweight_partial, dbias_partial = (allocate((groups, n_cols), dtype=acc, device=device) if wanted else None
                                          for wanted in (weight_grad, bias_grad))
        K.backward_fused_kernel[(groups,)](dx, dweight_partial, dbias_partial, dy, x, weight, mean, rstd, n_rows,
                                           n_cols, rows_per_program, *strides, n_cols, **tiling)
    else:
        chunks = dsl.cdiv(n_cols, config.block_n)
        rows_per_program, groups = _row_groups(n_rows, config.block_rows, max(1, target_programs // chunks))
        dweight_partial, dbias_partial = (allocate((groups, n_cols), dtype=acc, device=device) if wanted else None
                                          for wanted in (weight_grad, bias_grad))
        c1_partial = allocate((n_rows, chunks), dtype=acc, device=device) if input_grad else None
        c2_partial = allocate((n_rows, chunks), dtype=acc, device=device) if input_grad and subtract_mean else None
        K.backward_partials_kernel[(groups * chunks,)](c1_partial, c2_partial, dweight_partial, dbias_partial, dy, x,
                                                       weight, mean, rstd, n_rows, n_cols, rows_per_program,
                                                       *strides, **tiling)
        if input_grad:
            grid = (dsl.cdiv(n_rows, config.input_block_rows) * dsl.cdiv(n_cols, config.input_block_n),)
            K.backward_input_kernel[grid](dx, dy, x, weight, mean, rstd, c1_partial, c2_partial, n_rows, n_cols,
                                          chunks, *strides, n_cols, SUBTRACT_MEAN=subtract_mean,
                                          BLOCK_ROWS=config.input_block_rows, BLOCK_N=config.input_block_n,
                                          BLOCK_CHUNKS=min(_next_power_of_2(chunks), 64),
                                          num_warps=config.input_num_warps, interpret=interpret)
    if weight_grad or bias_grad:
        _column_sums(dweight, dweight_partial, dbias, dbias_partial, interpret)
    return dx, dweight, dbias


def _column_sums(dweight, dweight_partial, dbias, dbias_partial, interpret) -> None:
    """dweight = dweight_partial.sum(0) and dbias = dbias_partial.sum(0), in one launch."""
    if dweight is None:
        dweight, dweight_partial, dbias, dbias_partial = dbias, dbias_partial, None, None
    n_partials, n_cols = dweight_partial.shape
    # About 2048 elements per program: as many partial rows at once as possible (the loop over them is
    # latency-bound), and enough column blocks to spread over the SMs.
    block_p = min(_next_power_of_2(n_partials), 128)
    block_n = min(max(2048 // block_p, 16), _next_power_of_2(n_cols))
    K.column_sum_kernel[(dsl.cdiv(n_cols, block_n),)](dweight, dweight_partial, dbias, dbias_partial, n_partials,
                                                     n_cols, BLOCK_P=block_p, BLOCK_N=block_n, num_warps=4,
                                                     interpret=interpret)
