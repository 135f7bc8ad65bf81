"""Softmax and log-softmax along one dimension: host-side launch (launch plans, prepared launches, entry points).

    y = softmax(x)      = exp(x - max(x)) / sum(exp(x - max(x)))
    y = log_softmax(x)  = x - max(x) - log(sum(exp(x - max(x))))
    dx (softmax)        = y * (dy - sum(dy * y))
    dx (log_softmax)    = dy - exp(y) * sum(dy)

A launch addresses the tensors as rows (softmax_rows.plan_rows), takes a Config
(softmax_configs.choose_config) and runs softmax_kernels._forward_kernel or _backward_kernel,
whose programs reduce tiles of rows (softmax_tiles) or sweep long rows (softmax_row_sweeps).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional

import torch

import fusedops.dsl as dsl
from fusedops.dsl.runtime.bounded_cache import BoundedCache
from fusedops.dsl.runtime.knobs import interpret_enabled as _interpret_enabled
from fusedops.kernels.allocation import alias, contiguous_allocator
from fusedops.kernels.device_info import INTERPRETER_SMS, sm_count as device_sm_count
from fusedops.kernels.sizes import INT32_LIMIT
from fusedops.kernels.softmax_configs import Config, choose_config
from fusedops.kernels.softmax_kernels import _backward_kernel, _forward_kernel
from fusedops.kernels.softmax_rows import RowLayout, contiguous_strides, empty_in_order_of, plan_rows


@dataclasses.dataclass(frozen=True)
class _Launch:
    """Everything a launch derives from shapes, strides and dtypes. Cached, so that a launch's
    host work is one dictionary lookup."""

    layout: RowLayout
    config: Config
    grid: tuple
    arguments: tuple        # n_rows, n_cols, n_inner, inner_blocks, then the strides in kernel order
    constexprs: dict        # the kernel's constexprs and num_warps


def _run_alignment(layout: RowLayout, config: Config) -> int:
    """The largest power of two up to 16 dividing where every contiguous run of a tile starts:
    row starts for "rows"; for "columns", outer and col strides and the run's first inner index,
    a multiple of `rows`."""
    def divisor(stride: int) -> int:
        return 16 if stride == 0 else min(16, stride & -stride)

    starts = [s[0] for s in layout.strides]
    if config.tile == "columns":
        starts += [s[2] for s in layout.strides] + [config.rows]
    elif layout.inner > 1:
        starts += [s[1] for s in layout.strides]
    return min(divisor(abs(stride)) for stride in starts)


def _row_shift(layout: RowLayout, config: Config, dtypes: tuple, align: int) -> int:
    """The SHIFT of the kernels (see `softmax_tiles._tile`): the elements of a 16-byte vector of the narrowest
    dtype when rows start off vector boundaries (align below it) and the shifted window applies
    ("rows" tiles, no inner dim, unit column strides, one row stride for every tensor, and a
    one-pass block that still covers the shifted row); else 0."""
    vector = 16 // min(dtype.itemsize for dtype in dtypes)
    if align >= vector or config.tile != "rows" or layout.inner > 1:
        return 0
    if any(s[2] != 1 or s[0] != layout.strides[0][0] for s in layout.strides):
        return 0
    if config.one_pass and config.block < layout.n_cols + vector - 1:
        return 0
    return vector


def _persistent_constexprs(config: Config, dtypes: tuple) -> dict:
    """PERSISTENT, and the chunk's load layout the row sweeps reduce along (THREADS threads of VECTOR
    consecutive elements; see softmax_row_sweeps.forward_row_sweeps): what the default 1-D blocked layout gives a
    block of config.block elements of the narrowest dtype over config.num_warps warps."""
    if not config.programs_per_sm:
        return {}
    vector = max(1, min(16 // min(dtype.itemsize for dtype in dtypes), config.block // (32 * config.num_warps)))
    vector = min(vector, config.block)
    hints = dict(zip(("FIRST_EVICTION", "SECOND_EVICTION", "STORE_CACHE"), config.sweep_hints))
    if config.reverse:
        hints["REVERSE"] = True
    if config.min_blocks_per_sm:
        hints["MIN_BLOCKS"] = config.min_blocks_per_sm
    return dict(PERSISTENT=True, THREADS=min(32 * config.num_warps, config.block // vector), VECTOR=vector, **hints)


@functools.lru_cache(maxsize=1024)
def _plan_launch(shape: tuple, dim: int, strides: tuple, dtypes: tuple, backward: bool, log: bool,
                 config: Optional[Config], max_one_pass_block: Optional[int], device: Optional[torch.device] = None,
                 sm_count: Optional[int] = None) -> Optional[_Launch]:
    # strides, dtypes: (x, y) for the forward, (y, dy, dx) for the backward (the first tensor's
    # memory order groups the rows); the kernels take strides in (x, y) and (dx, dy, y) order.
    # Persistent configs size their grid by sm_count, else by the SMs of `device` (asked only then),
    # else by device_info.INTERPRETER_SMS.
    layout = plan_rows(shape, dim, strides)
    if layout is None:
        return None
    if config is None:
        config = choose_config(layout, backward=backward, element_bytes=dtypes[0].itemsize,
                               max_one_pass_block=max_one_pass_block)
    if config.tile != "columns":
        inner_blocks = 1
        grid = (dsl.cdiv(layout.n_rows, config.rows),)
    else:
        inner_blocks = dsl.cdiv(layout.inner, config.rows)
        grid = (layout.outer * inner_blocks,)
    if config.programs_per_sm:
        if sm_count is None:
            sm_count = INTERPRETER_SMS if device is None else device_sm_count(device)
        grid = (max(1, min(grid[0], sm_count * config.programs_per_sm)),)
    # WIDE: column offsets (up to n_cols + block, times the col stride) may pass int32.
    widest = max(abs(s[2]) for s in layout.strides) * (layout.n_cols + config.block + 16)
    accumulate = dsl.float64 if torch.float64 in dtypes else dsl.float32
    align = _run_alignment(layout, config)
    constexprs = dict(LOG=log, TILE=config.tile, ROWS=config.rows, BLOCK=config.block, ONE_PASS=config.one_pass,
                      SPLIT=layout.inner > 1, WIDE=widest >= INT32_LIMIT, ALIGN=align, ACC=accumulate,
                      SHIFT=_row_shift(layout, config, dtypes, align), num_warps=config.num_warps,
                      **_persistent_constexprs(config, dtypes))
    kernel_order = layout.strides[::-1] if backward else layout.strides
    arguments = (layout.n_rows, layout.n_cols, layout.inner, inner_blocks,
                 *[stride for per_tensor in kernel_order for stride in per_tensor])
    return _Launch(layout, config, grid, arguments, constexprs)


# Launches prepared (JITFunction.prepare) per everything a launch derives from its tensors but their
# addresses: shapes, strides, dtypes, devices, options and the interpreter flag; a cached launch costs
# the output's allocation, this key and the launch itself. Forward: a SoftmaxLaunches per key (it keeps
# the autograd backward's launches too); backward: softmax_backward's launches.
_FORWARD_LAUNCHES = BoundedCache(1024)
_BACKWARD_LAUNCHES = BoundedCache(1024)


def _no_launch(*tensors) -> None:
    return None


def _dense_allocator(x: torch.Tensor, dtype: torch.dtype) -> Callable:
    """`new(x)`: empty_in_order_of(x, dtype) for tensors laid out like x, at the least host cost."""
    if not x.is_contiguous():
        return lambda x: empty_in_order_of(x, dtype)
    if dtype == x.dtype:
        return torch.empty_like
    if x.numel() == 0:
        return lambda x: torch.empty_like(x, dtype=dtype)
    new = contiguous_allocator(tuple(x.shape), dtype, x.device)
    return lambda x: new()


def _prepare_forward(x: torch.Tensor, y: torch.Tensor, dim: int, log: bool, config: Optional[Config],
                     max_one_pass_block: Optional[int]) -> Callable:
    """`launch(y, x)` for tensors shaped, strided and typed like these, on their device; it returns
    None, or the output when it had to copy x (other dims that do not collapse, see plan_rows)."""
    if y.numel() == 0:
        return _no_launch
    options = ((x.dtype, y.dtype), False, log, config, max_one_pass_block, x.device)
    launch = _plan_launch(x.shape, dim, (x.stride(), y.stride()), *options)
    if launch is None:
        def copy_and_launch(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            x = x.contiguous()
            y = torch.empty(x.shape, dtype=y.dtype, device=x.device)
            plan = _plan_launch(x.shape, dim, (x.stride(), y.stride()), *options)
            _forward_kernel[plan.grid](y, x, *plan.arguments, **plan.constexprs)
            return y
        return copy_and_launch
    return _forward_kernel.prepare(launch.grid, y, x, *launch.arguments, **launch.constexprs)


class SoftmaxLaunches:
    """The launches of one softmax layout (x's shape, strides, dtype and device, dim, log, the output
    dtype, options, the interpreter flag):

    forward(x) -> y: softmax_forward(x, dim, log=log, dtype=the output dtype) for an x of this layout.
    backward(dy, y) -> dx: softmax_backward(dy, y, dim, log=log, dtype=x's dtype) for the y of such a
        forward, with launches prepared per layout of dy and y (in that forward's mode: GPU or
        interpreter) and kept here, so that the autograd Function's backward skips softmax_backward's key.
    """

    __slots__ = ("_launch", "_new_output", "_permuted", "_strides", "_dim", "_log", "_dtype", "_backward")

    def __init__(self, x: torch.Tensor, dim: int, log: bool, out_dtype: torch.dtype, config: Optional[Config],
                 max_one_pass_block: Optional[int]):
        self._new_output = _dense_allocator(x, out_dtype)
        y = self._new_output(x)
        self._launch = _prepare_forward(x, y, dim, log, config, max_one_pass_block)
        # the kernels write y in x's dim order (coalesced like x's reads); torch returns a contiguous
        # tensor, so a permuted x's result is copied to one (torch copies x to a contiguous one first: the
        # same traffic); and with torch's strides, which a contiguous tensor's size-1 (or empty) dims may
        # not have (a view of the same memory then)
        self._permuted = not y.is_contiguous()
        standard = contiguous_strides(tuple(y.shape))
        self._strides = standard if (y.contiguous() if self._permuted else y).stride() != standard else None
        self._dim, self._log, self._dtype = dim, log, x.dtype
        self._backward = BoundedCache(16)

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def log(self) -> bool:
        return self._log

    @property
    def input_dtype(self) -> torch.dtype:
        """x's dtype (dx's)."""
        return self._dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._new_output(x)
        copied = self._launch(y, x)
        if copied is not None:
            return copied
        if self._permuted:
            y = y.contiguous()
        if self._strides is None:
            return y
        # torch's strides on the same memory, not as a view (y.as_strided): autograd refuses an in-place change of
        # a view made inside a custom Function, where torch's result takes it (y.masked_fill_ of a batch-1
        # x.transpose(0, 1))
        return alias(y, y.shape, self._strides)

    def backward(self, dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # y's strides too: the output of a copied x, or a saved-tensor hook (torch.autograd.graph.save_on_cpu),
        # may lay y out otherwise than the planned output
        key = (dy.stride(), dy.dtype, y.stride())
        launch = self._backward.get(key)
        if launch is None:
            launch = self._backward.put(key, _backward_launcher(dy, y, self._dim, self._log, self._dtype, None, None))
        return launch(dy, y)


def softmax_forward(x: torch.Tensor, dim: int, *, log: bool, dtype: Optional[torch.dtype] = None,
                    config: Optional[Config] = None, max_one_pass_block: Optional[int] = None) -> torch.Tensor:
    """softmax (log=False) or log_softmax (log=True) of `x` over `dim`, by the DSL kernels.

    x: a float16/bfloat16/float32 tensor on a CUDA device (any float dtype, CPU tensors too, when
        FUSEDOPS_INTERPRET=1), of rank >= 1, any strides; dim in [0, x.dim()).
    dtype: the output dtype (default x.dtype); statistics are float32 (float64 for float64).
    config: use this Config instead of `choose_config`'s (benchmark sweeps).
    max_one_pass_block: override the one-pass limits (tests use it to reach the online path).
    Returns a new contiguous tensor shaped like `x` (as torch's softmax).
    """
    return softmax_launches(x, dim, log=log, dtype=dtype, config=config,
                            max_one_pass_block=max_one_pass_block).forward(x)


def softmax_launches(x: torch.Tensor, dim: int, *, log: bool, dtype: Optional[torch.dtype] = None,
                     config: Optional[Config] = None, max_one_pass_block: Optional[int] = None) -> SoftmaxLaunches:
    """The SoftmaxLaunches of tensors like x (arguments as for softmax_forward), made once per layout."""
    out_dtype = dtype or x.dtype
    key = (x.shape, x.stride(), x.dtype, out_dtype, x.get_device(), dim, log, config, max_one_pass_block,
           _interpret_enabled())
    launches = _FORWARD_LAUNCHES.get(key)
    if launches is None:
        launches = _FORWARD_LAUNCHES.put(key, SoftmaxLaunches(x, dim, log, out_dtype, config, max_one_pass_block))
    return launches


def _prepare_backward(dy: torch.Tensor, y: torch.Tensor, dx: torch.Tensor, dim: int, log: bool,
                      config: Optional[Config], max_one_pass_block: Optional[int]) -> Callable:
    """`launch(dx, dy, y)` for tensors like these (see _prepare_forward)."""
    if dx.numel() == 0:
        return _no_launch
    options = ((y.dtype, dy.dtype, dx.dtype), True, log, config, max_one_pass_block, y.device)
    launch = _plan_launch(y.shape, dim, (y.stride(), dy.stride(), dx.stride()), *options)
    if launch is None:
        def copy_and_launch(dx: torch.Tensor, dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            dy, y = dy.contiguous(), y.contiguous()
            dx = torch.empty(y.shape, dtype=dx.dtype, device=y.device)
            plan = _plan_launch(y.shape, dim, (y.stride(), dy.stride(), dx.stride()), *options)
            _backward_kernel[plan.grid](dx, dy, y, *plan.arguments, **plan.constexprs)
            return dx
        return copy_and_launch
    return _backward_kernel.prepare(launch.grid, dx, dy, y, *launch.arguments, **launch.constexprs)


def _backward_launcher(dy: torch.Tensor, y: torch.Tensor, dim: int, log: bool, dtype: torch.dtype,
                       config: Optional[Config], max_one_pass_block: Optional[int]) -> Callable:
    """`launch(dy, y) -> dx` (dx in `dtype`) for tensors like these (see softmax_backward)."""
    new_gradient = _dense_allocator(y, dtype)
    launch = _prepare_backward(dy, y, new_gradient(y), dim, log, config, max_one_pass_block)

    def gradient(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        dx = new_gradient(y)
        copied = launch(dx, dy, y)
        return dx if copied is None else copied

    return gradient


def softmax_backward(dy: torch.Tensor, y: torch.Tensor, dim: int, *, log: bool, dtype: Optional[torch.dtype] = None,
                     config: Optional[Config] = None, max_one_pass_block: Optional[int] = None) -> torch.Tensor:
    """The gradient of softmax (log=False) or log_softmax (log=True) with respect to its input.

    dy: the gradient of the output; y: the output (same shape; any strides, e.g. an expanded
    dy); dim in [0, y.dim()); dtype: dx's dtype (default y.dtype; the input's dtype when the
    forward cast it up); config, max_one_pass_block: as for `softmax_forward`.
    Returns dx, dense, with its dims in y's memory order.
    """
    dx_dtype = dtype or y.dtype
    key = (y.shape, y.stride(), dy.stride(), y.dtype, dy.dtype, dx_dtype, y.get_device(), dy.get_device(), dim, log,
           config, max_one_pass_block, _interpret_enabled())
    launch = _BACKWARD_LAUNCHES.get(key)
    if launch is None:
        launch = _BACKWARD_LAUNCHES.put(key, _backward_launcher(dy, y, dim, log, dx_dtype, config, max_one_pass_block))
    return launch(dy, y)
