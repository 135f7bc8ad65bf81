"""The LayerNorm/RMSNorm launchers' entry points: norm_forward, norm_backward, and NormLaunches, the launches of
one layout prepared once.

The tensors here are already flattened to (M, N) row matrices by `as_rows` (M rows, N normalized
columns; norm_rows.py, which also says how they are laid out); argument checking and torch's dtype rules
live in fusedops.autograd.norms. Every function takes `interpret` (None: follow FUSEDOPS_INTERPRET) and
an optional config that overrides the heuristics (tests use it to force the looped and split paths at
small sizes; bench/layernorm.py to sweep configurations).

The launches are prepared by norm_forward_launcher.py and norm_backward_launcher.py with the tilings of
norm_forward_config.py and norm_backward_config.py; the kernels are norm_forward_kernels.py's, norm_row_sweeps.py's
and norm_backward_kernels.py's, and norm_split_window.py's for 16-bit rows of 514 to 4097 columns off 16-byte
boundaries (norm_split_staged.py's forward for those of 4098 to 12289).
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import torch

from fusedops.dsl.runtime.bounded_cache import BoundedCache
from fusedops.dsl.runtime.knobs import interpret_enabled as _interpret_enabled
from fusedops.kernels.norm_backward_config import BackwardConfig
from fusedops.kernels.norm_backward_launcher import backward_launcher
from fusedops.kernels.norm_forward_config import ForwardConfig
from fusedops.kernels.norm_forward_launcher import forward_launcher


def norm_forward(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float, *,
                 subtract_mean: bool, n_cols: Optional[int] = None, config: Optional[ForwardConfig] = None,
                 interpret: Optional[bool] = None, allocate: Callable = torch.empty):
    """LayerNorm (subtract_mean=True) or RMSNorm forward of the rows of `x`.

    Args:
        x: (M, N) float16/bfloat16/float32/float64, any strides; or any shape whose trailing dims hold
            n_cols = N elements (M rows: the product of the others), read as rows in place where a
            (M, N) view with one row and one column stride exists (else copied, see norm_rows.as_rows).
        weight, bias: N elements or None (any floating dtype; converted on load).
        eps: added to the variance (mean square) in the accumulation dtype.
        n_cols: N when x is not 2-D (default: x.shape[-1]).
        allocate: makes every output, called as torch.empty(shape, dtype=, device=) (tests poison them).

    Returns:
        (y, mean, rstd): y shaped like x, contiguous, in x's dtype; mean (M,) (None for RMSNorm) and rstd
        (M,) in the accumulation dtype (float32, float64 for float64 x); NaN for rows of no columns (N = 0).

    With the default config, interpret and allocate, the launch is prepared once per shapes, strides,
    dtypes, devices, flags and eps (`norm_launches`): a repeated call costs its allocations and one
    launch.
    """
    if config is None and interpret is None and allocate is torch.empty:
        return norm_launches(x, weight, bias, eps, subtract_mean=subtract_mean, n_cols=n_cols).forward(x, weight, bias)
    return forward_launcher(x, weight, bias, eps, subtract_mean, n_cols, config, interpret, allocate)(x, weight, bias)


class NormLaunches:
    """The prepared launches of norm_forward for one layout (x's shape, strides, dtype and device, the
    dtypes, layouts and devices of weight and bias, eps, subtract_mean, the interpreter flag), and of
    the backward of its results: what the autograd Function keeps from its forward to its backward.

    forward(x, weight, bias) -> (y, mean, rstd), as norm_forward, for tensors of this layout.
    backward(dy, x, weight, mean, rstd, needs_input_grad) -> (dx, dweight, dbias), as norm_backward
    with input_grad, weight_grad, bias_grad = needs_input_grad[:3] (the autograd context's tuple), for
    x, weight and the mean and rstd of a forward of this layout (dbias in the bias's dtype), prepared in
    that forward's mode (GPU or interpreter: FUSEDOPS_INTERPRET then).

    The backward finds its launch by needs_input_grad alone when dy, x and weight are contiguous (a
    step's usual case: dy laid out like y), else by their strides too (norm_backward's key costs a few
    microseconds of host time per call).
    """

    __slots__ = ("forward", "_dtype", "_subtract_mean", "_bias_dtype", "_n_cols", "_backward", "_contiguous_backward")

    def __init__(self, forward: Callable, x: torch.Tensor, bias_dtype: Optional[torch.dtype], subtract_mean: bool,
                 n_cols: Optional[int]):
        self.forward = forward
        self._dtype, self._bias_dtype, self._subtract_mean, self._n_cols = x.dtype, bias_dtype, subtract_mean, n_cols
        self._backward = BoundedCache(16)   # per (dy's, x's and weight's strides, the gradients asked for)
        self._contiguous_backward = {}      # per needs_input_grad, for contiguous dy, x and weight

    @property
    def bias_dtype(self) -> Optional[torch.dtype]:
        """dbias's dtype (the bias's), None without a bias."""
        return self._bias_dtype

    def backward(self, dy: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor], mean: Optional[torch.Tensor],
                 rstd: torch.Tensor, needs_input_grad: tuple) -> tuple:
        # x's and weight's layouts too: a saved-tensor hook (torch.autograd.graph.save_on_cpu) may give them
        # back laid out anew (an expanded weight contiguous), and a launch reads a weight as it was prepared.
        # Contiguous tensors of one shape are read alike whatever the strides of their size-1 dims.
        if (dy.dtype is self._dtype and dy.is_contiguous() and x.is_contiguous()
                and (weight is None or weight.is_contiguous())):
            launch = self._contiguous_backward.get(needs_input_grad)
            if launch is None:
                launch = self._contiguous_backward[needs_input_grad] = self._launch(dy, x, weight, mean, rstd,
                                                                                   needs_input_grad)
            return launch(dy, x, weight, mean, rstd)
        return self._launch(dy, x, weight, mean, rstd, needs_input_grad)(dy, x, weight, mean, rstd)

    def _launch(self, dy, x, weight, mean, rstd, needs_input_grad) -> Callable:
        """The backward launch for tensors laid out like these (`backward_launcher`'s)."""
        input_grad, weight_grad, bias_grad = needs_input_grad[0], needs_input_grad[1], needs_input_grad[2]
        if dy.dtype is not self._dtype:
            return functools.partial(norm_backward, subtract_mean=self._subtract_mean, input_grad=input_grad,
                                     weight_grad=weight_grad, bias_grad=bias_grad, bias_dtype=self._bias_dtype,
                                     n_cols=self._n_cols)
        key = (dy.stride(), x.stride(), None if weight is None else weight.stride(), input_grad, weight_grad,
               bias_grad)
        launch = self._backward.get(key)
        if launch is None:
            launch = self._backward.put(key, backward_launcher(
                dy, x, weight, mean, rstd, self._subtract_mean, input_grad, weight_grad, bias_grad, self._bias_dtype,
                self._n_cols, None, None, torch.empty))
        return launch


# NormLaunches per layout (see there), made by norm_launches; norm_backward's launches per everything they
# derive from their tensors but the addresses (shapes, strides, dtypes, devices, flags, the interpreter flag):
# `backward_launcher` closures whose kernels are prepared (JITFunction.prepare).
_FORWARD_LAUNCHES = BoundedCache(1024)
_BACKWARD_LAUNCHES = BoundedCache(1024)


def norm_launches(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float, *,
                  subtract_mean: bool, n_cols: Optional[int] = None) -> NormLaunches:
    """The NormLaunches of tensors like these (arguments as for norm_forward), made once per layout."""
    interpret = _interpret_enabled()
    key = (x.shape, x.stride(), x.dtype, x.get_device(), n_cols,
           None if weight is None else (weight.dtype, weight.is_contiguous(), weight.get_device()),
           None if bias is None else (bias.dtype, bias.is_contiguous(), bias.get_device()),
           eps, subtract_mean, interpret)
    launches = _FORWARD_LAUNCHES.get(key)
    if launches is None:
        forward = forward_launcher(x, weight, bias, eps, subtract_mean, n_cols, None, None, torch.empty)
        launches = _FORWARD_LAUNCHES.put(key, NormLaunches(forward, x, None if bias is None else bias.dtype,
                                                           subtract_mean, n_cols))
    return launches


def norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor], mean: Optional[torch.Tensor],
                  rstd: torch.Tensor, *, subtract_mean: bool, input_grad: bool, weight_grad: bool, bias_grad: bool,
                  bias_dtype: Optional[torch.dtype] = None, n_cols: Optional[int] = None,
                  config: Optional[BackwardConfig] = None, interpret: Optional[bool] = None,
                  allocate: Callable = torch.empty):
    """Gradients of norm_forward.

    Args:
        dy, x: (M, N), any strides (dy may be expanded, stride 0); or, with n_cols = N, any shape whose
            trailing dims hold N elements (as for norm_forward); dy has x's dtype and shape.
        weight: N elements or None; mean (LayerNorm; else None), rstd: (M,) as returned by norm_forward.
        input_grad, weight_grad, bias_grad: which gradients to compute (weight_grad needs a weight).
        bias_dtype: the dtype of dbias (the bias's).
        allocate: makes every output and scratch buffer, as in norm_forward.

    Returns:
        (dx, dweight, dbias): dx shaped like x, contiguous, in x's dtype, dweight (N,) in weight's dtype,
        dbias (N,) in bias_dtype; None for a gradient that was not asked for. dweight and dbias are
        deterministic: per-program partial sums reduced in a fixed order.

    With the default config, interpret and allocate the launches are prepared once per shapes, strides,
    dtypes, devices and flags (`_BACKWARD_LAUNCHES`).
    """
    cached = config is None and interpret is None and allocate is torch.empty
    if cached:
        key = (x.shape, x.stride(), dy.stride(), x.dtype, dy.dtype, x.get_device(), dy.get_device(), n_cols,
               None if weight is None else (weight.dtype, weight.is_contiguous(), weight.get_device()),
               mean is None, rstd.dtype, subtract_mean, input_grad, weight_grad, bias_grad, bias_dtype,
               _interpret_enabled())
        launch = _BACKWARD_LAUNCHES.get(key)
        if launch is not None:
            return launch(dy, x, weight, mean, rstd)
    launch = backward_launcher(dy, x, weight, mean, rstd, subtract_mean, input_grad, weight_grad, bias_grad,
                               bias_dtype, n_cols, config, interpret, allocate)
    if cached:
        _BACKWARD_LAUNCHES.put(key, launch)
    return launch(dy, x, weight, mean, rstd)
