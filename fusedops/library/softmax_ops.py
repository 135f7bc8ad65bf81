"""The custom operators fusedops::softmax, fusedops::log_softmax and their backward,
fusedops::softmax_backward, and `softmax`, what fusedops.functional calls while a graph is traced.

| operator                       | returns                      | gradient through               |
|--------------------------------|------------------------------|--------------------------------|
| softmax(input, dim, dtype)     | output                       | softmax_backward               |
| log_softmax(input, dim, dtype) | output                       | softmax_backward               |

Under tracing softmax copies a non-contiguous input first, so that the fake implementation can
promise a contiguous output.
"""

from __future__ import annotations

from typing import Optional

import torch

from fusedops.autograd import softmax as _autograd_softmax
from fusedops.kernels import softmax as _softmax_kernels
from fusedops.library.common import accumulation_dtype, refuse_dual, runs_kernels, unviewed, wrap_dim

_EXACT_UPCASTS = {(torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float16, torch.float64),
                  (torch.bfloat16, torch.float64), (torch.float32, torch.float64)}


def _softmax_output_dtype(input: torch.Tensor, dtype: Optional[torch.dtype]) -> torch.dtype:
    return dtype if dtype is not None else input.dtype


def _softmax_forward(input: torch.Tensor, dim: int, dtype: Optional[torch.dtype], log: bool) -> torch.Tensor:
    refuse_dual("log_softmax" if log else "softmax", input)
    dim = wrap_dim(dim, input.dim())
    x = input.contiguous()
    if dtype is not None and dtype != x.dtype and (x.dtype, dtype) not in _EXACT_UPCASTS:
        x = x.to(dtype)         # torch casts first; only exact upcasts are fused into the kernel's loads
    out_dtype = _softmax_output_dtype(input, dtype)
    if not runs_kernels(x, x.dtype, out_dtype):
        native = torch.log_softmax if log else torch.softmax
        return native(x, dim, dtype=out_dtype).contiguous()
    if x.dim() == 0:
        return unviewed(_softmax_forward(x.reshape(1), 0, dtype, log), ())     # (no view: see unviewed)
    kernel_dtype = out_dtype if out_dtype != x.dtype else None
    return _softmax_kernels.softmax_forward(x, dim, log=log, dtype=kernel_dtype)


@torch.library.custom_op("fusedops::softmax", mutates_args=())
def _softmax_op(input: torch.Tensor, dim: int, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """softmax of `input` over `dim` (see fusedops.softmax); a new contiguous tensor of `dtype`."""
    return _softmax_forward(input, dim, dtype, log=False)


@torch.library.custom_op("fusedops::log_softmax", mutates_args=())
def _log_softmax_op(input: torch.Tensor, dim: int, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """log_softmax of `input` over `dim` (see fusedops.log_softmax); a new contiguous tensor of `dtype`."""
    return _softmax_forward(input, dim, dtype, log=True)


@torch.library.custom_op("fusedops::softmax_backward", mutates_args=())
def _softmax_backward_op(grad_output: torch.Tensor, output: torch.Tensor, dim: int, log: bool,
                         input_dtype: torch.dtype) -> torch.Tensor:
    """The input gradient of (log_)softmax from the output gradient and the output (any strides):
    softmax: y * (dy - sum(dy * y)); log_softmax: dy - exp(y) * sum(dy); a contiguous tensor of input_dtype."""
    refuse_dual("log_softmax_backward" if log else "softmax_backward", grad_output, output)
    dim = _check_backward_arguments(grad_output, output, dim, input_dtype)
    y = output.contiguous()
    if not runs_kernels(y, y.dtype, grad_output.dtype, input_dtype):
        dx = _autograd_softmax.reference_backward(grad_output, y, dim, log, accumulation_dtype(y.dtype))
        return dx.to(input_dtype).contiguous()
    if y.dim() == 0:
        return _softmax_backward_op(grad_output.reshape(1), y.reshape(1), 0, log, input_dtype).reshape(())
    return _softmax_kernels.softmax_backward(grad_output, y, dim, log=log, dtype=input_dtype)


def _check_backward_arguments(grad_output: torch.Tensor, output: torch.Tensor, dim: int,
                              input_dtype: torch.dtype) -> int:
    """dim in [0, max(output.dim(), 1)), for the checked arguments of softmax_backward (as torch's
    _softmax_backward_data checks them; the kernels would read grad_output out of bounds).

    Raises: RuntimeError for a grad_output shaped otherwise than output or on another device; IndexError for dim
    out of range; TypeError for a non-floating grad_output, output or input_dtype."""
    if grad_output.shape != output.shape:
        raise RuntimeError(f"fusedops softmax_backward: grad_output of shape {tuple(grad_output.shape)} for an output "
                           f"of shape {tuple(output.shape)} (they must be equal)")
    if grad_output.device != output.device:
        raise RuntimeError(f"fusedops softmax_backward: grad_output on {grad_output.device}, output on {output.device} "
                           "(they must be on one device)")
    for what, dtype in (("grad_output", grad_output.dtype), ("output", output.dtype), ("input_dtype", input_dtype)):
        if not dtype.is_floating_point:
            raise TypeError(f"fusedops softmax_backward: {what} must be of a floating dtype, got {dtype}")
    return wrap_dim(dim, output.dim())


def _fake_softmax(input, dim, dtype=None):
    wrap_dim(dim, input.dim())
    # as the real op (torch's) raises: a non-floating input is cast to a floating dtype first
    out_dtype = _softmax_output_dtype(input, dtype)
    if not out_dtype.is_floating_point:
        raise NotImplementedError(f"fusedops softmax: not implemented for {out_dtype} (a floating dtype is needed)")
    return input.new_empty(input.shape, dtype=out_dtype)


def _setup_softmax(ctx, inputs, output):
    input, dim, _ = inputs
    ctx.save_for_backward(output)
    ctx.dim = dim
    ctx.input_dtype = input.dtype


def _softmax_backward(ctx, grad_output, log: bool):
    (output,) = ctx.saved_tensors
    return torch.ops.fusedops.softmax_backward(grad_output, output, ctx.dim, log, ctx.input_dtype), None, None


_softmax_op.register_fake(_fake_softmax)
_log_softmax_op.register_fake(_fake_softmax)
_softmax_op.register_autograd(lambda ctx, g: _softmax_backward(ctx, g, False), setup_context=_setup_softmax)
_log_softmax_op.register_autograd(lambda ctx, g: _softmax_backward(ctx, g, True), setup_context=_setup_softmax)


@_softmax_backward_op.register_fake
def _(grad_output, output, dim, log, input_dtype):
    _check_backward_arguments(grad_output, output, dim, input_dtype)
    return output.new_empty(output.shape, dtype=input_dtype)


def softmax(input: torch.Tensor, dim: int, dtype: Optional[torch.dtype], *, log: bool) -> torch.Tensor:
    """torch.ops.fusedops.(log_)softmax(input, dim, dtype) (what fusedops.functional calls while a graph
    is traced, arguments already checked and autocast)."""
    op = torch.ops.fusedops.log_softmax if log else torch.ops.fusedops.softmax
    return op(input, dim, dtype)
