"""The LayerNorm/RMSNorm backward's launcher: `backward_launcher` prepares the kernel launches of one layout (the
fused, split, persistent or split-window backward by BackwardConfig, then the column sums of dweight and dbias).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

import fusedops.dsl as dsl
from fusedops.dsl.ir.ops import MAX_CLUSTER_SIZE
from fusedops.dsl.runtime.knobs import interpret_enabled as _interpret_enabled
from fusedops.kernels.allocation import contiguous_allocator
from fusedops.kernels.device_info import sm_count as _sm_count
from fusedops.kernels.norm_backward_config import backward_config, column_sum_tiling
from fusedops.kernels.norm_backward_kernels import backward_fused_kernel, backward_input_kernel, \
    backward_partials_kernel, backward_persistent_kernel, column_sum_kernel
from fusedops.kernels.norm_rows import as_rows, contiguous_or_none, output_allocator, round_up, row_geometry, \
    stride_alignment, window_shift
from fusedops.kernels.norm_split_window import backward_split_kernel
from fusedops.kernels.sizes import next_power_of_2


def backward_launcher(dy, x, weight, mean, rstd, subtract_mean, input_grad, weight_grad, bias_grad, bias_dtype,
                      n_cols, config, interpret, allocate) -> Callable:
    """`launch(dy, x, weight, mean, rstd) -> (dx, dweight, dbias)` for tensors like these (see
    norms.norm_backward)."""
    n_cols = x.shape[-1] if n_cols is None else n_cols
    n_rows, x_row_stride, x_col_stride = row_geometry(tuple(x.shape), x.stride(), n_cols)
    _, dy_row_stride, dy_col_stride = row_geometry(tuple(dy.shape), dy.stride(), n_cols)
    x_in_place, dy_in_place = x_row_stride is not None, dy_row_stride is not None
    if not x_in_place:      # as_rows copies: contiguous rows
        x_row_stride, x_col_stride = n_cols, 1
    if not dy_in_place:
        dy_row_stride, dy_col_stride = n_cols, 1
    device, acc = x.device, rstd.dtype
    new_dx = output_allocator(x, allocate)
    new_dweight = contiguous_allocator((n_cols,), weight.dtype, device, allocate) if weight_grad else None
    new_dbias = contiguous_allocator((n_cols,), bias_dtype, device, allocate) if bias_grad else None
    copy_weight = weight is not None and not weight.is_contiguous()

    def allocate_gradients(x):
        return (new_dx(x) if input_grad else None, new_dweight() if weight_grad else None,
                new_dbias() if bias_grad else None)

    if n_rows == 0 or n_cols == 0:
        def no_rows(dy, x, weight, mean, rstd):
            dx, dweight, dbias = allocate_gradients(x)
            for grad in (dweight, dbias):
                if grad is not None:
                    grad.zero_()
            return dx, dweight, dbias
        return no_rows
    clusters = _has_clusters(device, interpret)
    config = config or backward_config(n_cols, x.dtype, subtract_mean=subtract_mean, clusters=clusters)
    strides = (x_row_stride, x_col_stride, dy_row_stride, dy_col_stride)
    split_shift = 0
    if config.split_window:
        align = min(stride_alignment(x_row_stride, n_cols, x.element_size()),
                    stride_alignment(dy_row_stride, n_cols, x.element_size()))
        split_shift = window_shift(True, None, n_cols, align, x.element_size(), (x_row_stride, x_col_stride),
                                   (dy_row_stride, dy_col_stride))
        if not split_shift:
            config = backward_config(n_cols, x.dtype, subtract_mean=subtract_mean, split_window=False,
                                     clusters=clusters)
    target_programs = _sm_count(device) * config.programs_per_sm
    tiling = dict(SUBTRACT_MEAN=subtract_mean, BLOCK_ROWS=config.block_rows, BLOCK_N=config.block_n,
                  PREFETCH=config.prefetch, num_warps=config.num_warps, interpret=interpret)
    # Example tensors to prepare the launches with (the launches take each call's own).
    dx, dweight, dbias = allocate_gradients(x)
    dy_rows = dy if dy_in_place else as_rows(dy, n_rows, n_cols)
    x_rows = x if x_in_place else as_rows(x, n_rows, n_cols)
    weight = contiguous_or_none(weight)
    if split_shift:
        if config.block_n < n_cols - 1:
            raise ValueError(f"split window: block_n={config.block_n} is smaller than the row ({n_cols} columns) "
                             f"less one")
        groups = round_up(min(dsl.cdiv(n_rows, config.block_rows), max(1, target_programs)), split_shift)
        new_partial = contiguous_allocator((groups * config.block_rows, n_cols), acc, device, allocate)
        dweight_partial = new_partial() if weight_grad else None
        dbias_partial = new_partial() if bias_grad else None
        main = backward_split_kernel.prepare((groups,), dx, dweight_partial, dbias_partial, dy_rows, x_rows, weight,
                                             mean, rstd, n_rows, n_cols, n_cols, SHIFT=split_shift, **tiling)
        new_chunk_partial, input_kernel = None, None
    elif config.persistent:
        main, new_partial, dweight_partial, dbias_partial = _persistent_backward(
            config, dx, dy_rows, x_rows, weight, mean, rstd, n_rows, n_cols, strides, subtract_mean, weight_grad,
            bias_grad, target_programs, allocate, interpret)
        new_chunk_partial, input_kernel = None, None
    elif not config.split:
        if config.block_n < n_cols:
            raise ValueError(f"block_n={config.block_n} is smaller than the row ({n_cols} columns)")
        rows_per_program, groups = _row_groups(n_rows, config.block_rows, target_programs)
        chunks, new_partial, new_chunk_partial = 0, contiguous_allocator((groups, n_cols), acc, device, allocate), None
        dweight_partial = new_partial() if weight_grad else None
        dbias_partial = new_partial() if bias_grad else None
        main = backward_fused_kernel.prepare((groups,), dx, dweight_partial, dbias_partial, dy_rows, x_rows, weight,
                                             mean, rstd, n_rows, n_cols, rows_per_program, *strides, n_cols,
                                             **tiling)
        input_kernel = None
    else:
        chunks = dsl.cdiv(n_cols, config.block_n)
        rows_per_program, groups = _row_groups(n_rows, config.block_rows, max(1, target_programs // chunks))
        new_partial = contiguous_allocator((groups, n_cols), acc, device, allocate)
        new_chunk_partial = contiguous_allocator((n_rows, chunks), acc, device, allocate)
        dweight_partial = new_partial() if weight_grad else None
        dbias_partial = new_partial() if bias_grad else None
        c1_partial = new_chunk_partial() if input_grad else None
        c2_partial = new_chunk_partial() if input_grad and subtract_mean else None
        main = backward_partials_kernel.prepare((groups * chunks,), c1_partial, c2_partial, dweight_partial,
                                                dbias_partial, dy_rows, x_rows, weight, mean, rstd, n_rows, n_cols,
                                                rows_per_program, *strides, **tiling)
        input_kernel = None
        if input_grad:
            grid = (dsl.cdiv(n_rows, config.input_block_rows) * dsl.cdiv(n_cols, config.input_block_n),)
            input_kernel = backward_input_kernel.prepare(
                grid, dx, dy_rows, x_rows, weight, mean, rstd, c1_partial, c2_partial, n_rows, n_cols, chunks,
                *strides, n_cols, SUBTRACT_MEAN=subtract_mean, BLOCK_ROWS=config.input_block_rows,
                BLOCK_N=config.input_block_n, BLOCK_CHUNKS=min(next_power_of_2(chunks), 64),
                num_warps=config.input_num_warps, interpret=interpret)
    column_sums = None
    if weight_grad or bias_grad:
        column_sums = _column_sums(dweight, dweight_partial, dbias, dbias_partial, interpret)

    split = config.split and not config.persistent

    def launch(dy, x, weight, mean, rstd):
        dx = new_dx(x) if input_grad else None
        dweight = new_dweight() if weight_grad else None
        dbias = new_dbias() if bias_grad else None
        if not dy_in_place:
            dy = as_rows(dy, n_rows, n_cols)
        if not x_in_place:
            x = as_rows(x, n_rows, n_cols)
        if copy_weight:
            weight = weight.reshape(-1).contiguous()
        # Two allocations, not one with dbias's partials a view of its second half: a view costs about the host
        # time of an allocation (measured on the CPU with the driver mocked: the one-buffer variant was slower).
        dweight_partial = new_partial() if weight_grad else None
        dbias_partial = new_partial() if bias_grad else None
        if not split:
            main(dx, dweight_partial, dbias_partial, dy, x, weight, mean, rstd)
        else:
            c1_partial = new_chunk_partial() if input_grad else None
            c2_partial = new_chunk_partial() if input_grad and subtract_mean else None
            main(c1_partial, c2_partial, dweight_partial, dbias_partial, dy, x, weight, mean, rstd)
            if input_kernel is not None:
                input_kernel(dx, dy, x, weight, mean, rstd, c1_partial, c2_partial)
        if column_sums is not None:
            column_sums(dweight, dweight_partial, dbias, dbias_partial)
        return dx, dweight, dbias

    return launch


def _persistent_backward(config, dx, dy, x, weight, mean, rstd, n_rows, n_cols, strides, subtract_mean,
                         weight_grad, bias_grad, target_programs, allocate, interpret) -> tuple:
    """(prepared backward_persistent_kernel taking (dx, dweight_partial, dbias_partial, dy, x, weight, mean,
    rstd), the partial buffers' allocator, and the example dweight and dbias partials it was prepared with)
    for config.persistent (see norm_backward_config.BackwardConfig)."""
    x_row_stride, x_col_stride, dy_row_stride, dy_col_stride = strides
    align = stride_alignment(x_row_stride, n_cols, x.element_size())
    align = min(align, stride_alignment(dy_row_stride, n_cols, x.element_size()))
    shift = window_shift(config.aligned_window, None, n_cols, align, x.element_size(),
                         (x_row_stride, x_col_stride), (dy_row_stride, dy_col_stride))
    parts = dsl.cdiv(n_cols + max(shift - 1, 0), config.block_n)
    clusters = config.cluster and _has_clusters(x.device, interpret)
    # rows off 16-byte boundaries in clusters: whole vectors in the parts (n_cols - 1 positions at most), the
    # window's edges in part 0 (backward_persistent_kernel's EDGES; one pass: config.two_pass keeps the aligned
    # window's parts, whose two passes sum each row in every program)
    edges = (bool(shift) and clusters and not config.two_pass
             and 1 < dsl.cdiv(n_cols - 1, config.block_n) <= MAX_CLUSTER_SIZE)
    if edges:
        parts = dsl.cdiv(n_cols - 1, config.block_n)
    cluster = parts if clusters and 1 < parts <= MAX_CLUSTER_SIZE else 1
    groups = min(dsl.cdiv(n_rows, config.block_rows), max(1, target_programs // parts))
    options = dict(SUBTRACT_MEAN=subtract_mean, BLOCK_ROWS=config.block_rows, BLOCK_N=config.block_n,
                   TWO_PASS=(parts > 1 and cluster == 1) or config.two_pass, CHUNK=min(config.chunk, config.block_n),
                   PREFETCH=config.prefetch, ALIGN=align, SHIFT=shift, CLUSTER=cluster,
                   MIN_BLOCKS_PER_SM=config.min_blocks_per_sm, num_warps=config.num_warps)
    if edges:       # (only where taken: the other launches compile as before)
        options["EDGES"] = True

    def prepare(groups: int) -> tuple:
        new_partial = contiguous_allocator((groups * config.block_rows, n_cols), rstd.dtype, x.device, allocate)
        dweight_partial = new_partial() if weight_grad else None
        dbias_partial = new_partial() if bias_grad else None
        args = (dx, dweight_partial, dbias_partial, dy, x, weight, mean, rstd, n_rows, n_cols, groups, parts, *strides,
                n_cols)
        return args, new_partial, dweight_partial, dbias_partial

    groups = round_up(groups, max(shift, 1))
    args, new_partial, dweight_partial, dbias_partial = prepare(groups)
    if cluster > 1 and not _interpreting(interpret):
        # every cluster at once: a GPC holds a whole number of clusters, so the device may hold fewer than
        # SMs * programs_per_sm / cluster (a grid of more runs its last clusters after the others)
        resident = backward_persistent_kernel.max_active_clusters(*args, **options)
        if resident < groups:
            groups = max(resident // max(shift, 1), 1) * max(shift, 1)
            args, new_partial, dweight_partial, dbias_partial = prepare(groups)
    main = backward_persistent_kernel.prepare((groups * parts,), *args, interpret=interpret, **options)
    return main, new_partial, dweight_partial, dbias_partial


def _interpreting(interpret: Optional[bool]) -> bool:
    """Whether launches with this `interpret` argument run in the interpreter (None: FUSEDOPS_INTERPRET)."""
    return _interpret_enabled() if interpret is None else bool(interpret)


def _has_clusters(device: torch.device, interpret: Optional[bool]) -> bool:
    """Whether kernels on `device` can run in thread block clusters (sm_90 and later; the interpreter can)."""
    if _interpreting(interpret) or device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device)[0] >= 9


def _column_sums(dweight, dweight_partial, dbias, dbias_partial, interpret) -> Callable:
    """The prepared launch `sums(dweight, dweight_partial, dbias, dbias_partial)` that sets
    dweight = dweight_partial.sum(0) and dbias = dbias_partial.sum(0) in one launch (for tensors like
    these; either pair may be None)."""
    first = dweight_partial if dweight is not None else dbias_partial
    n_partials, n_cols = first.shape
    block_p, block_n, num_warps = column_sum_tiling(n_partials, n_cols, first.element_size())
    grid = (dsl.cdiv(n_cols, block_n),)
    options = dict(BLOCK_P=block_p, BLOCK_N=block_n, num_warps=num_warps, interpret=interpret)
    if dweight is None:
        prepared = column_sum_kernel.prepare(grid, dbias, dbias_partial, None, None, n_partials, n_cols, **options)
        return lambda dweight, dweight_partial, dbias, dbias_partial: prepared(dbias, dbias_partial, None, None)
    return column_sum_kernel.prepare(grid, dweight, dweight_partial, dbias, dbias_partial, n_partials, n_cols,
                                     **options)


def _row_groups(n_rows: int, block_rows: int, target_programs: int) -> tuple:
    """(rows_per_program, number of groups): about `target_programs` contiguous groups of rows, each a
    multiple of block_rows rows."""
    tiles = dsl.cdiv(n_rows, block_rows)
    tiles_per_group = dsl.cdiv(tiles, max(1, min(tiles, target_programs)))
    rows_per_program = tiles_per_group * block_rows
    return rows_per_program, dsl.cdiv(n_rows, rows_per_program)
