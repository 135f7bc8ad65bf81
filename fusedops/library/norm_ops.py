"""The custom operators fusedops::layer_norm, fusedops::rms_norm and their backward,
fusedops::norm_backward, and `layer_norm` / `rms_norm`, what fusedops.functional calls while a graph
is traced.

| operator                       | returns                      | gradient through               |
|--------------------------------|------------------------------|--------------------------------|
| layer_norm(input, normalized_shape, weight, bias, eps) | (output, mean, rstd) | norm_backward |
| rms_norm(input, normalized_shape, weight, eps) | (output, rstd) | norm_backward               |

The operators also return their row statistics (like aten::native_layer_norm): mean and rstd, shaped
(rows,), float32 (float64 for float64 input), not differentiable; the Python wrappers return the
output alone.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import torch

from fusedops.autograd import norms as _autograd_norms
from fusedops.kernels import norms as _kernel_norms
from fusedops.kernels.norm_rows import as_rows
from fusedops.library.common import accumulation_dtype, refuse_dual, runs_kernels, unviewed


def _rows_and_columns(x: torch.Tensor, normalized_shape: Sequence[int]) -> Tuple[int, int]:
    return math.prod(x.shape[:x.dim() - len(normalized_shape)]), math.prod(normalized_shape)


def _norm_forward(x, normalized_shape, weight, bias, eps, subtract_mean: bool):
    """(y, mean or None, rstd): y contiguous like x; mean, rstd (rows,) in the accumulation dtype."""
    refuse_dual("layer_norm" if subtract_mean else "rms_norm", x, weight, bias)
    n_rows, n_cols = _rows_and_columns(x, normalized_shape)
    dtypes = (x.dtype,) + tuple(p.dtype for p in (weight, bias) if p is not None)
    if runs_kernels(x, *dtypes):
        y, mean, rstd = _kernel_norms.norm_forward(as_rows(x, n_rows, n_cols), weight, bias, eps,
                                                   subtract_mean=subtract_mean)
        return unviewed(y, x.shape), mean, rstd     # (no view: it may be modified in place)
    # torch's op for the output (the same numbers as the eager fallback), the statistics with torch ops.
    rows = x.reshape(n_rows, n_cols).to(accumulation_dtype(x.dtype))
    if subtract_mean:
        y = torch.nn.functional.layer_norm(x, normalized_shape, weight, bias, eps)
        mean = rows.mean(1)
        rstd = torch.rsqrt((rows.var(1, unbiased=False) if n_cols else mean) + eps)   # (no columns: NaN, no warning)
    else:
        y = torch.nn.functional.rms_norm(x, normalized_shape, weight, eps)
        mean = None
        rstd = torch.rsqrt(rows.square().mean(1) + eps)
    return y.to(x.dtype).contiguous(), mean, rstd


def _fake_norm_forward(x, normalized_shape, subtract_mean: bool):
    n_rows, _ = _rows_and_columns(x, normalized_shape)
    stat = lambda: x.new_empty((n_rows,), dtype=accumulation_dtype(x.dtype))  # noqa: E731
    y = x.new_empty(x.shape)
    return (y, stat(), stat()) if subtract_mean else (y, stat())


@torch.library.custom_op("fusedops::layer_norm", mutates_args=())
def _layer_norm_op(input: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor],
                   bias: Optional[torch.Tensor], eps: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LayerNorm over the trailing `normalized_shape` dims (see fusedops.layer_norm): (output, mean, rstd).
    Checks its arguments as fusedops.layer_norm does (the op may be called directly)."""
    _autograd_norms.check_layer_norm_arguments(input, normalized_shape, weight, bias)
    return _norm_forward(input, tuple(normalized_shape), weight, bias, eps, subtract_mean=True)


@torch.library.custom_op("fusedops::rms_norm", mutates_args=())
def _rms_norm_op(input: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor],
                 eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the trailing `normalized_shape` dims (see fusedops.rms_norm): (output, rstd). Checks its
    arguments as fusedops.rms_norm does."""
    _autograd_norms.check_rms_norm_arguments(input, normalized_shape, weight)
    y, _, rstd = _norm_forward(input, tuple(normalized_shape), weight, None, eps, subtract_mean=False)
    return y, rstd


# (Tensor?, Tensor?, Tensor?) returns are not inferred from type hints, hence the explicit schema.
@torch.library.custom_op("fusedops::norm_backward", mutates_args=(), schema=(
    "(Tensor grad_output, Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? mean, Tensor rstd, "
    "bool input_grad, bool weight_grad, bool bias_grad, ScalarType? bias_dtype) -> (Tensor?, Tensor?, Tensor?)"))
def _norm_backward_op(grad_output, input, normalized_shape, weight, mean, rstd, input_grad, weight_grad, bias_grad,
                      bias_dtype):
    """Gradients of layer_norm (mean given) or rms_norm (mean None) from the saved statistics:
    (dinput or None, dweight or None, dbias or None), contiguous, in input's, weight's and bias_dtype."""
    refuse_dual("norm_backward", grad_output, input, weight, mean, rstd)
    normalized_shape = tuple(normalized_shape)
    n_rows, n_cols = _rows_and_columns(input, normalized_shape)
    dtypes = (input.dtype, grad_output.dtype) + (() if weight is None else (weight.dtype,))
    if runs_kernels(input, *dtypes):
        dx, dweight, dbias = _kernel_norms.norm_backward(
            as_rows(grad_output, n_rows, n_cols), as_rows(input, n_rows, n_cols), weight,
            mean, rstd, subtract_mean=mean is not None, input_grad=input_grad, weight_grad=weight_grad,
            bias_grad=bias_grad, bias_dtype=bias_dtype)
    else:
        dx, dweight, dbias = _autograd_norms.reference_backward(grad_output, input, n_rows, n_cols, weight, mean, rstd)
        dx = dx.to(input.dtype) if input_grad else None
        dweight = dweight.to(weight.dtype) if weight_grad else None
        dbias = dbias.to(bias_dtype) if bias_grad else None
    return (None if dx is None else dx.reshape(input.shape).contiguous(),
            None if dweight is None else dweight.reshape(normalized_shape).contiguous(),
            None if dbias is None else dbias.reshape(normalized_shape).contiguous())


@_layer_norm_op.register_fake
def _(input, normalized_shape, weight, bias, eps):
    if _concrete(normalized_shape):
        _autograd_norms.check_layer_norm_arguments(input, normalized_shape, weight, bias)
    return _fake_norm_forward(input, normalized_shape, subtract_mean=True)


@_rms_norm_op.register_fake
def _(input, normalized_shape, weight, eps):
    if _concrete(normalized_shape):
        _autograd_norms.check_rms_norm_arguments(input, normalized_shape, weight)
    return _fake_norm_forward(input, normalized_shape, subtract_mean=False)


def _concrete(normalized_shape) -> bool:
    """Whether normalized_shape holds plain ints (the fake kernels check their arguments as the real ones do;
    under torch.compile's dynamic shapes it holds SymInts, which the checks do not take)."""
    return all(type(dim) is int for dim in normalized_shape)


@_norm_backward_op.register_fake
def _(grad_output, input, normalized_shape, weight, mean, rstd, input_grad, weight_grad, bias_grad, bias_dtype):
    return (input.new_empty(input.shape) if input_grad else None,
            weight.new_empty(weight.shape) if weight_grad else None,
            input.new_empty(tuple(normalized_shape), dtype=bias_dtype) if bias_grad else None)


def _weight_to_save(ctx, weight):
    """The weight as the backward takes it: itself where dx is wanted (its values make dx), else a copy of it (the
    backward reads only its dtype and layout then), so that a weight changed in place after the forward fails the
    backward only where its values are read, as in eager (autograd/norms.NormFunction)."""
    if weight is None or ctx.needs_input_grad[0]:
        return weight
    return weight.detach().clone()


def _setup_layer_norm(ctx, inputs, output):
    input, normalized_shape, weight, bias, _ = inputs
    _, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)
    ctx.save_for_backward(input, _weight_to_save(ctx, weight), mean, rstd)
    ctx.normalized_shape = normalized_shape
    ctx.bias_dtype = None if bias is None else bias.dtype


def _layer_norm_backward(ctx, grad_output, grad_mean, grad_rstd):
    input, weight, mean, rstd = ctx.saved_tensors
    needs = ctx.needs_input_grad
    dx, dweight, dbias = torch.ops.fusedops.norm_backward(grad_output, input, ctx.normalized_shape, weight, mean, rstd,
                                                          needs[0], needs[2], needs[3], ctx.bias_dtype)
    return dx, None, dweight, dbias, None


def _setup_rms_norm(ctx, inputs, output):
    input, normalized_shape, weight, _ = inputs
    _, rstd = output
    ctx.mark_non_differentiable(rstd)
    ctx.save_for_backward(input, _weight_to_save(ctx, weight), rstd)
    ctx.normalized_shape = normalized_shape


def _rms_norm_backward(ctx, grad_output, grad_rstd):
    input, weight, rstd = ctx.saved_tensors
    needs = ctx.needs_input_grad
    dx, dweight, _ = torch.ops.fusedops.norm_backward(grad_output, input, ctx.normalized_shape, weight, None, rstd,
                                                      needs[0], needs[2], False, None)
    return dx, None, dweight, None


_layer_norm_op.register_autograd(_layer_norm_backward, setup_context=_setup_layer_norm)
_rms_norm_op.register_autograd(_rms_norm_backward, setup_context=_setup_rms_norm)


def layer_norm(input, normalized_shape, weight, bias, eps: float) -> torch.Tensor:
    """The output of torch.ops.fusedops.layer_norm (its statistics are for the backward)."""
    return torch.ops.fusedops.layer_norm(input, list(normalized_shape), weight, bias, eps)[0]


def rms_norm(input, normalized_shape, weight, eps: float) -> torch.Tensor:
    """The output of torch.ops.fusedops.rms_norm."""
    return torch.ops.fusedops.rms_norm(input, list(normalized_shape), weight, eps)[0]
