"""The LayerNorm/RMSNorm forward's launcher: `forward_launcher` prepares the kernel launch of one layout (its
kernel, grid and constexprs by ForwardConfig), with the row sweeps' constexprs and shifted weight and bias copies.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch

import fusedops.dsl as dsl
from fusedops.kernels.allocation import contiguous_allocator
from fusedops.kernels.device_info import sm_count as _sm_count
from fusedops.kernels.norm_forward_config import ForwardConfig, forward_config
from fusedops.kernels.norm_forward_kernels import forward_kernel, forward_looped_kernel, forward_persistent_kernel
from fusedops.kernels.norm_row_sweeps import forward_row_sweeps_kernel
from fusedops.kernels.norm_rows import check_rows, contiguous_or_none, output_allocator, round_up, row_geometry, \
    stride_alignment, window_shift, accumulation_dtype, as_rows
from fusedops.kernels.norm_split_staged import forward_split_staged_kernel
from fusedops.kernels.norm_split_window import forward_split_kernel, forward_split_persistent_kernel


def forward_launcher(x, weight, bias, eps, subtract_mean, n_cols, config, interpret, allocate) -> Callable:
    """`launch(x, weight, bias) -> (y, mean, rstd)` for tensors like these (see norms.norm_forward)."""
    n_cols = x.shape[-1] if n_cols is None else n_cols
    n_rows, row_stride, col_stride = row_geometry(tuple(x.shape), x.stride(), n_cols)
    check_rows(n_rows)
    device, acc = x.device, accumulation_dtype(x.dtype)
    new_output = output_allocator(x, allocate)
    in_place = row_stride is not None
    if not in_place:        # as_rows copies: contiguous rows
        row_stride, col_stride = n_cols, 1
    copy_weight = weight is not None and not weight.is_contiguous()
    copy_bias = bias is not None and not bias.is_contiguous()

    new_statistic = contiguous_allocator((n_rows,), acc, device, allocate)

    def allocate_outputs(x):
        return new_output(x), new_statistic() if subtract_mean else None, new_statistic()

    if n_rows == 0 or n_cols == 0:
        def no_elements(x, weight, bias):
            # rows of no columns: the mean and rstd of no elements are NaN (0 / 0, as torch.mean of an empty row,
            # and the library's torch fallback, give), not uninitialized memory
            y, mean, rstd = allocate_outputs(x)
            for statistic in (mean, rstd):
                if statistic is not None:
                    statistic.fill_(float("nan"))
            return y, mean, rstd
        return no_elements
    config = config or forward_config(n_cols, x.dtype, subtract_mean=subtract_mean)
    split_shift = 0
    if config.split_window:
        split_shift = window_shift(True, None, n_cols, stride_alignment(row_stride, n_cols, x.element_size()),
                                   x.element_size(), (row_stride, col_stride))
        if not split_shift:
            config = forward_config(n_cols, x.dtype, subtract_mean=subtract_mean, split_window=False)
    y, mean, rstd = allocate_outputs(x)
    rows = x if in_place else as_rows(x, n_rows, n_cols)
    weight, bias = contiguous_or_none(weight), contiguous_or_none(bias)
    # eps in the accumulation dtype: a float64 scalar for float64 rows, else rounded to float32 here, as torch
    # rounds it (1e39 becomes inf, where a kernel's float32 argument refuses a finite float past its range)
    with np.errstate(over="ignore", under="ignore"):
        eps = np.float64(eps) if x.dtype == torch.float64 else float(np.float32(eps))
    args = (y, mean, rstd, rows, weight, bias, n_rows, n_cols, row_stride, col_stride, n_cols, eps)
    shifted = 0         # with shifted_affine: the window's SHIFT (the number of shifted copies)
    new_copies = None   # with staged_affine: (weight, bias) -> their scratch copies
    if split_shift:
        main_tiles = config.main_tiles if config.staged_affine else 1   # (the other split kernels: one tile)
        if config.block_n * main_tiles < n_cols - 1 or config.block_n % config.output_chunks:
            raise ValueError(f"split window: main_tiles={main_tiles} x block_n={config.block_n} is smaller "
                             f"than the row ({n_cols} columns) less one, or output_chunks={config.output_chunks} "
                             f"does not divide block_n (main_tiles other than 1 takes staged_affine)")
        tiles = dict(SUBTRACT_MEAN=subtract_mean, BLOCK_ROWS=config.block_rows, BLOCK_N=config.block_n,
                     SHIFT=split_shift, num_warps=config.num_warps, interpret=interpret)
        n_tiles = dsl.cdiv(n_rows, config.block_rows)
        if config.staged_affine:
            if config.block_rows != 1 or config.programs_per_sm <= 0 or not 1 <= config.main_tiles <= 3:
                raise ValueError("staged_affine takes block_rows=1, programs_per_sm > 0 and 1 to 3 main_tiles")
            new_copies = staged_copies_allocator(weight, bias, n_cols, split_shift, allocate)
            del tiles["BLOCK_ROWS"]
            grid = (round_up(min(n_rows, _sm_count(device) * config.programs_per_sm), split_shift),)
            prepared = forward_split_staged_kernel.prepare(
                grid, *args[:6], *new_copies(weight, bias), n_rows, n_cols, row_stride,
                affine_copy_stride(n_cols, split_shift), eps, TILES=config.main_tiles, PREFETCH=config.prefetch,
                **tiles)
        elif config.programs_per_sm > 0:
            grid = (round_up(min(n_tiles, _sm_count(device) * config.programs_per_sm), split_shift),)
            prepared = forward_split_persistent_kernel.prepare(grid, *args[:9], eps, PREFETCH=config.prefetch,
                                                               **tiles)
        else:
            prepared = forward_split_kernel.prepare((n_tiles,), *args[:9], eps, CHUNKS=config.output_chunks, **tiles)
    elif config.row_sweeps:
        grid = (n_rows if config.programs_per_sm <= 0 else min(n_rows, _sm_count(device) * config.programs_per_sm),)
        constexprs = row_sweep_constexprs(config, x.dtype, weight, bias, row_stride, n_cols, subtract_mean,
                                          col_stride)
        if (config.shifted_affine and constexprs.get("SHIFT") and (weight is not None or bias is not None)
                and n_rows * n_cols >= SHIFTED_AFFINE_MIN_ELEMENTS):
            shifted = constexprs["AFFINE_SHIFTED"] = constexprs["SHIFT"]
            args = args[:4] + tuple(None if t is None else shifted_affine_copies(t, n_cols, shifted)
                                    for t in (weight, bias)) + args[6:]
        prepared = forward_row_sweeps_kernel.prepare(grid, *args, **constexprs, interpret=interpret)
    elif config.looped:
        grid = (n_rows if config.programs_per_sm <= 0 else min(n_rows, _sm_count(device) * config.programs_per_sm),)
        prepared = forward_looped_kernel.prepare(grid, *args, SUBTRACT_MEAN=subtract_mean,
                                                 BLOCK_N=config.block_n, num_warps=config.num_warps,
                                                 interpret=interpret)
    else:
        if config.block_n < n_cols:
            raise ValueError(f"block_n={config.block_n} is smaller than the row ({n_cols} columns)")
        align = stride_alignment(row_stride, n_cols, x.element_size())
        shift = window_shift(config.aligned_window, config.block_n, n_cols, align, x.element_size(),
                             (row_stride, col_stride), (n_cols, 1))
        tiles = dict(SUBTRACT_MEAN=subtract_mean, BLOCK_ROWS=config.block_rows, BLOCK_N=config.block_n, ALIGN=align,
                     SHIFT=shift, num_warps=config.num_warps, interpret=interpret)
        if config.reload or config.cache_hints:      # (else the kernels' defaults: the same PTX)
            if config.block_n % config.output_chunks:
                raise ValueError(f"output_chunks={config.output_chunks} does not divide block_n={config.block_n}")
            tiles.update(RELOAD=config.reload, CHUNKS=config.output_chunks, CACHE_HINTS=config.cache_hints)
        n_tiles = dsl.cdiv(n_rows, config.block_rows)
        if config.shifted_sums and (config.reload or config.programs_per_sm > 0):
            raise ValueError("shifted_sums is an option of the one-program-per-tile kernel without reload")
        if config.programs_per_sm > 0:
            grid = (round_up(min(n_tiles, _sm_count(device) * config.programs_per_sm), max(shift, 1)),)
            prepared = forward_persistent_kernel.prepare(grid, *args, PREFETCH=config.prefetch, **tiles)
        else:
            if config.shifted_sums and subtract_mean:
                tiles.update(SHIFTED_SUMS=True)
            prepared = forward_kernel.prepare((n_tiles,), *args, AFFINE_FIRST=config.affine_first, **tiles)

    def launch(x, weight, bias):
        y, mean, rstd = allocate_outputs(x)
        if not in_place:
            x = as_rows(x, n_rows, n_cols)
        if shifted:         # the shifted copies read weight and bias in any layout: no contiguous copy first
            weight = None if weight is None else shifted_affine_copies(weight, n_cols, shifted)
            bias = None if bias is None else shifted_affine_copies(bias, n_cols, shifted)
        else:
            if copy_weight:
                weight = weight.reshape(-1).contiguous()
            if copy_bias:
                bias = bias.reshape(-1).contiguous()
        if new_copies is not None:
            prepared(y, mean, rstd, x, weight, bias, *new_copies(weight, bias))
        else:
            prepared(y, mean, rstd, x, weight, bias)
        return y, mean, rstd

    return launch


# ForwardConfig.shifted_affine applies from this many elements of x on: below it the two copies would cost
# about as much as the window's per-element weight and bias loads save.
SHIFTED_AFFINE_MIN_ELEMENTS = 1 << 22


def shifted_affine_copies(t: torch.Tensor, n_cols: int, shift: int) -> torch.Tensor:
    """`shift` copies of the n_cols-element weight or bias `t` in one new tensor, copy f holding t[c] at
    element f * stride + c + f (stride: norm_row_sweeps.affine_copy_stride, a multiple of `shift`), so that
    the aligned window of a row starting f elements past a 16-byte boundary reads copy f in 16-byte
    vectors (the positions no copy writes are never read). One copy kernel."""
    stride = affine_copy_stride(n_cols, shift)
    copies = torch.empty(shift * stride, dtype=t.dtype, device=t.device)
    copies.as_strided((shift, n_cols), (stride + 1, 1)).copy_(t.reshape(1, n_cols).expand(shift, n_cols))
    return copies


def staged_copies_allocator(weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], n_cols: int, shift: int,
                            allocate: Callable = torch.empty) -> Callable:
    """`new(weight, bias) -> (weight copies, bias copies)`: uninitialized scratch for
    norm_split_staged.forward_split_staged_kernel's shifted copies (`shift` copies of affine_copy_stride
    elements, in each tensor's dtype; None for a None tensor), made by `allocate`."""
    size = (shift * affine_copy_stride(n_cols, shift),)
    new_weight = None if weight is None else contiguous_allocator(size, weight.dtype, weight.device, allocate)
    new_bias = None if bias is None else contiguous_allocator(size, bias.dtype, bias.device, allocate)
    return lambda weight, bias: (None if new_weight is None else new_weight(), None if new_bias is None else new_bias())


def affine_copy_stride(n_cols: int, shift: int) -> int:
    """norm_row_sweeps.affine_copy_stride on the host: n_cols + shift - 1 positions rounded up to `shift`."""
    return (n_cols + 2 * shift - 2) // shift * shift


# forward_row_sweeps_kernel's cache hints with ForwardConfig.cache_hints: x in the first sweep, x in the
# second, weight and bias, y's stores (softmax_configs.py's L2_HINTS, plus the affine loads).
ROW_SWEEP_HINTS = dict(FIRST_EVICTION="evict_last", SECOND_EVICTION="evict_first", AFFINE_EVICTION="evict_last",
                       STORE_CACHE=".cs")


def row_sweep_constexprs(config: ForwardConfig, dtype: torch.dtype, weight: Optional[torch.Tensor],
                         bias: Optional[torch.Tensor], row_stride: int, n_cols: int, subtract_mean: bool,
                         col_stride: int = 1) -> dict:
    """The constexprs and num_warps of forward_row_sweeps_kernel for `config` (row_sweeps=True) and rows of
    n_cols columns of `dtype` at x's `row_stride` and `col_stride` (y's are n_cols and 1): the chunk's load
    layout (THREADS threads of VECTOR consecutive elements, as the default blocked layout lays out block_n
    elements of the narrowest dtype the kernel moves: 16-byte vectors), ALIGN, the hints, the register cap
    and, with config.aligned_window, SHIFT where the window applies (as for the whole-row tiles,
    `window_shift`: rows off 16-byte boundaries, x's strides (n_cols, 1); only passed when non-zero, so
    that configs without it compile as before).

    Raises:
        ValueError: block_n is not a power of two.
    """
    chunk, threads = config.block_n, 32 * config.num_warps
    if chunk & (chunk - 1):
        raise ValueError(f"row sweeps: block_n={chunk} is not a power of two")
    itemsize = min([dtype.itemsize] + [t.element_size() for t in (weight, bias) if t is not None])
    vector = max(1, min(16 // itemsize, chunk // threads))
    constexprs = dict(SUBTRACT_MEAN=subtract_mean, CHUNK=chunk, THREADS=min(threads, chunk // vector), VECTOR=vector,
                      ALIGN=stride_alignment(row_stride, n_cols, dtype.itemsize), num_warps=config.num_warps)
    if config.cache_hints:
        constexprs.update(ROW_SWEEP_HINTS)
    if config.min_blocks_per_sm:
        constexprs["MIN_BLOCKS"] = config.min_blocks_per_sm
    if config.shifted_sums and subtract_mean:
        constexprs["SHIFTED_SUMS"] = True
    shift = window_shift(config.aligned_window, None, n_cols, constexprs["ALIGN"], dtype.itemsize,
                         (row_stride, col_stride), (n_cols, 1))
    if shift:
        constexprs["SHIFT"] = shift
    return constexprs
