"""fusedops' public ops as PyTorch custom operators (`torch.ops.fusedops.*`), for torch.compile.

torch.compile cannot trace into a kernel launch, so under tracing the public functions of
fusedops.functional call these operators instead: each is registered with
`torch.library.custom_op` (opaque to the compiler: a node in the graph), `register_fake` (output
shapes, dtypes and strides computed from the inputs' metadata, without running a kernel) and
`register_autograd` (the backward calls the fusedops backward operators, themselves custom ops),
so `torch.compile(model, fullgraph=True)` traces a model that uses fusedops without graph breaks.

Eager calls do not go through these operators: a custom-op dispatch costs ~20 us of host time on
the CPU (57 us with autograd; measured on the CI machine, against ~2 us for torch.softmax), more
than a whole fused kernel on small inputs. fusedops.functional therefore checks
`torch.compiler.is_compiling()` (~0.2 us) and uses the operators only while a graph is traced; the
eager path launches the kernels directly. Calling `torch.ops.fusedops.*` directly works eagerly too.

| operator                       | returns                      | gradient through               |
|--------------------------------|------------------------------|--------------------------------|
| softmax(input, dim, dtype)     | output                       | softmax_backward               |
| log_softmax(input, dim, dtype) | output                       | softmax_backward               |
| layer_norm(input, normalized_shape, weight, bias, eps) | (output, mean, rstd) | norm_backward |
| rms_norm(input, normalized_shape, weight, eps) | (output, rstd) | norm_backward               |
| matmul(a, b, bias, activation, out_dtype) | output            | matmul (transposed operands)   |

layer_norm and rms_norm also return their row statistics (like aten::native_layer_norm): mean and
rstd, shaped (rows,), float32 (float64 for float64 input), not differentiable; the Python
wrappers below return the output alone. Every output is a new contiguous tensor (a strided input
is read in place by the kernels, but softmax copies a non-contiguous input first under tracing,
so that the fake implementation can promise a contiguous output).

Which implementation runs is decided per call, as in fusedops.functional: CUDA tensors of the
kernels' dtypes run the fusedops kernels; CPU tensors run torch ops unless FUSEDOPS_INTERPRET=1
runs the kernels in the interpreter (how `torch.library.opcheck` is exercised on the CPU).

Autocast: `autocast_dtype(op, device_type)` states torch's autocast policy for each op (softmax,
log_softmax, layer_norm: float32 on CUDA; rms_norm: not cast; matmul: the autocast dtype on CUDA and
CPU);
fusedops.functional applies it in eager mode and under tracing, and the operators register the
same policy with `torch.library.register_autocast` for direct callers.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import torch

from fusedops.autograd import matmul as _matmul
from fusedops.dsl.runtime import knobs
from fusedops.kernels import norms as _norm_kernels
from fusedops.kernels import softmax as _softmax_kernels

NAMESPACE = "fusedops"
# The operators that public functions route to (backward operators are internal).
OPS = ("softmax", "log_softmax", "layer_norm", "rms_norm", "matmul")

_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_EXACT_UPCASTS = {(torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float16, torch.float64),
                  (torch.bfloat16, torch.float64), (torch.float32, torch.float64)}


@torch.compiler.assume_constant_result
def interpret_enabled() -> bool:
    """knobs.interpret_enabled(), read once per compiled graph: torch.compile treats the result as a
    constant instead of tracing the environment lookup (a graph compiled without FUSEDOPS_INTERPRET
    keeps its routing if the variable changes later; torch._dynamo.reset() recompiles)."""
    return knobs.interpret_enabled()


def _runs_kernels(x: torch.Tensor, *dtypes: torch.dtype) -> bool:
    """The routing rule of fusedops.functional: CUDA tensors of the kernels' dtypes, or CPU tensors
    under FUSEDOPS_INTERPRET=1."""
    if x.is_cuda:
        return all(d in _KERNEL_DTYPES for d in dtypes)
    return x.device.type == "cpu" and interpret_enabled()


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# ------------------------------------------------------------------------------------------------
# Autocast policy
# ------------------------------------------------------------------------------------------------
# op -> {device type: "float32" | "lower"}, as torch's autocast lists (aten/src/ATen/autocast_mode.cpp):
# on CUDA softmax/log_softmax/layer_norm run in float32 and matmul/linear in the autocast dtype; on the
# CPU only matmul/linear are autocast. rms_norm is on no list: torch runs it in the input's dtype
# (seen on the H200 with torch 2.11: an fp16 input under fp16 autocast gives an fp16 output).
_AUTOCAST_POLICY = {
    "softmax": {"cuda": "float32"},
    "log_softmax": {"cuda": "float32"},
    "layer_norm": {"cuda": "float32"},
    "matmul": {"cuda": "lower", "cpu": "lower"},
}


def autocast_dtype(op: str, device_type: str) -> Optional[torch.dtype]:
    """The dtype torch's autocast would run `op` in on `device_type` right now, or None when autocast
    is off there or leaves the op alone. Only float16/bfloat16/float32 tensors are cast (float64 is
    not eligible, as in torch)."""
    policy = _AUTOCAST_POLICY.get(op, {}).get(device_type)
    if policy is None or not torch.is_autocast_enabled(device_type):
        return None
    return torch.float32 if policy == "float32" else torch.get_autocast_dtype(device_type)


def autocast_cast(tensor: Optional[torch.Tensor], dtype: Optional[torch.dtype]) -> Optional[torch.Tensor]:
    """`tensor` cast to `dtype` if autocast would cast it (a floating tensor other than float64)."""
    if (dtype is None or not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point()
            or tensor.dtype in (dtype, torch.float64)):
        return tensor
    return tensor.to(dtype)


# ------------------------------------------------------------------------------------------------
# softmax, log_softmax
# ------------------------------------------------------------------------------------------------
def _softmax_output_dtype(input: torch.Tensor, dtype: Optional[torch.dtype]) -> torch.dtype:
    return dtype if dtype is not None else input.dtype


def _softmax_forward(input: torch.Tensor, dim: int, dtype: Optional[torch.dtype], log: bool) -> torch.Tensor:
    dim = dim % max(input.dim(), 1)
    x = input.contiguous()
    if dtype is not None and dtype != x.dtype and (x.dtype, dtype) not in _EXACT_UPCASTS:
        x = x.to(dtype)         # torch casts first; only exact upcasts are fused into the kernel's loads
    out_dtype = _softmax_output_dtype(input, dtype)
    if not _runs_kernels(x, x.dtype, out_dtype):
        native = torch.log_softmax if log else torch.softmax
        return native(x, dim, dtype=out_dtype).contiguous()
    if x.dim() == 0:
        return _softmax_forward(x.reshape(1), 0, dtype, log).reshape(())
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
    dim = dim % max(output.dim(), 1)
    y = output.contiguous()
    if not _runs_kernels(y, y.dtype, grad_output.dtype, input_dtype):
        wide = _wide(y.dtype)
        dy, yw = grad_output.to(wide), y.to(wide)
        if log:
            dx = dy - torch.exp(yw) * dy.sum(dim, keepdim=True)
        else:
            dx = yw * (dy - (dy * yw).sum(dim, keepdim=True))
        return dx.to(input_dtype).contiguous()
    if y.dim() == 0:
        return _softmax_backward_op(grad_output.reshape(1), y.reshape(1), 0, log, input_dtype).reshape(())
    return _softmax_kernels.softmax_backward(grad_output, y, dim, log=log, dtype=input_dtype)


def _fake_softmax(input, dim, dtype=None):
    return input.new_empty(input.shape, dtype=_softmax_output_dtype(input, dtype))


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
    return output.new_empty(output.shape, dtype=input_dtype)


# ------------------------------------------------------------------------------------------------
# layer_norm, rms_norm
# ------------------------------------------------------------------------------------------------
def _rows_and_columns(x: torch.Tensor, normalized_shape: Sequence[int]) -> Tuple[int, int]:
    return math.prod(x.shape[:x.dim() - len(normalized_shape)]), math.prod(normalized_shape)


def _norm_forward(x, normalized_shape, weight, bias, eps, subtract_mean: bool):
    """(y, mean or None, rstd): y contiguous like x; mean, rstd (rows,) in the accumulation dtype."""
    n_rows, n_cols = _rows_and_columns(x, normalized_shape)
    dtypes = (x.dtype,) + tuple(p.dtype for p in (weight, bias) if p is not None)
    if _runs_kernels(x, *dtypes):
        y, mean, rstd = _norm_kernels.norm_forward(_norm_kernels.as_rows(x, n_rows, n_cols), weight, bias, eps,
                                                   subtract_mean=subtract_mean)
        return y.view(x.shape), mean, rstd
    # torch's op for the output (the same numbers as the eager fallback), the statistics with torch ops.
    rows = x.reshape(n_rows, n_cols).to(_wide(x.dtype))
    if subtract_mean:
        y = torch.nn.functional.layer_norm(x, normalized_shape, weight, bias, eps)
        mean = rows.mean(1)
        rstd = torch.rsqrt(rows.var(1, unbiased=False) + eps)
    else:
        y = torch.nn.functional.rms_norm(x, normalized_shape, weight, eps)
        mean = None
        rstd = torch.rsqrt(rows.square().mean(1) + eps)
    return y.to(x.dtype).contiguous(), mean, rstd


def _fake_norm_forward(x, normalized_shape, subtract_mean: bool):
    n_rows, _ = _rows_and_columns(x, normalized_shape)
    stat = lambda: x.new_empty((n_rows,), dtype=_wide(x.dtype))  # noqa: E731
    y = x.new_empty(x.shape)
    return (y, stat(), stat()) if subtract_mean else (y, stat())


@torch.library.custom_op("fusedops::layer_norm", mutates_args=())
def _layer_norm_op(input: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor],
                   bias: Optional[torch.Tensor], eps: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LayerNorm over the trailing `normalized_shape` dims (see fusedops.layer_norm): (output, mean, rstd)."""
    return _norm_forward(input, tuple(normalized_shape), weight, bias, eps, subtract_mean=True)


@torch.library.custom_op("fusedops::rms_norm", mutates_args=())
def _rms_norm_op(input: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor],
                 eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the trailing `normalized_shape` dims (see fusedops.rms_norm): (output, rstd)."""
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
    normalized_shape = tuple(normalized_shape)
    n_rows, n_cols = _rows_and_columns(input, normalized_shape)
    dtypes = (input.dtype, grad_output.dtype) + (() if weight is None else (weight.dtype,))
    if _runs_kernels(input, *dtypes):
        dx, dweight, dbias = _norm_kernels.norm_backward(
            _norm_kernels.as_rows(grad_output, n_rows, n_cols), _norm_kernels.as_rows(input, n_rows, n_cols), weight,
            mean, rstd, subtract_mean=mean is not None, input_grad=input_grad, weight_grad=weight_grad,
            bias_grad=bias_grad, bias_dtype=bias_dtype)
    else:
        dx, dweight, dbias = _norm_backward_reference(grad_output, input, n_rows, n_cols, weight, mean, rstd)
        dx = dx.to(input.dtype) if input_grad else None
        dweight = dweight.to(weight.dtype) if weight_grad else None
        dbias = dbias.to(bias_dtype) if bias_grad else None
    return (None if dx is None else dx.reshape(input.shape).contiguous(),
            None if dweight is None else dweight.reshape(normalized_shape).contiguous(),
            None if dbias is None else dbias.reshape(normalized_shape).contiguous())


def _norm_backward_reference(grad_output, input, n_rows, n_cols, weight, mean, rstd):
    """(dx, dweight, dbias) in the accumulation dtype, with torch ops: xhat = (x - mean) * rstd,
    g = dy * weight, dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) (no mean(g) term for RMSNorm)."""
    wide = rstd.dtype
    x = input.reshape(n_rows, n_cols).to(wide)
    dy = grad_output.reshape(n_rows, n_cols).to(wide)
    xhat = (x if mean is None else x - mean[:, None]) * rstd[:, None]
    g = dy if weight is None else dy * weight.reshape(n_cols).to(wide)
    correction = xhat * (g * xhat).mean(1, keepdim=True)
    if mean is not None:
        correction = correction + g.mean(1, keepdim=True)
    return rstd[:, None] * (g - correction), (dy * xhat).sum(0), dy.sum(0)


@_layer_norm_op.register_fake
def _(input, normalized_shape, weight, bias, eps):
    return _fake_norm_forward(input, normalized_shape, subtract_mean=True)


@_rms_norm_op.register_fake
def _(input, normalized_shape, weight, eps):
    return _fake_norm_forward(input, normalized_shape, subtract_mean=False)


@_norm_backward_op.register_fake
def _(grad_output, input, normalized_shape, weight, mean, rstd, input_grad, weight_grad, bias_grad, bias_dtype):
    return (input.new_empty(input.shape) if input_grad else None,
            weight.new_empty(weight.shape) if weight_grad else None,
            input.new_empty(tuple(normalized_shape), dtype=bias_dtype) if bias_grad else None)


def _setup_layer_norm(ctx, inputs, output):
    input, normalized_shape, weight, bias, _ = inputs
    _, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)
    ctx.save_for_backward(input, weight, mean, rstd)
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
    ctx.save_for_backward(input, weight, rstd)
    ctx.normalized_shape = normalized_shape


def _rms_norm_backward(ctx, grad_output, grad_rstd):
    input, weight, rstd = ctx.saved_tensors
    needs = ctx.needs_input_grad
    dx, dweight, _ = torch.ops.fusedops.norm_backward(grad_output, input, ctx.normalized_shape, weight, None, rstd,
                                                      needs[0], needs[2], False, None)
    return dx, None, dweight, None


_layer_norm_op.register_autograd(_layer_norm_backward, setup_context=_setup_layer_norm)
_rms_norm_op.register_autograd(_rms_norm_backward, setup_context=_setup_rms_norm)


# ------------------------------------------------------------------------------------------------
# matmul
# ------------------------------------------------------------------------------------------------
@torch.library.custom_op("fusedops::matmul", mutates_args=())
def _matmul_op(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None,
               activation: Optional[str] = None, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """activation(a @ b + bias) with torch.matmul's shapes (see fusedops.matmul); a new contiguous tensor."""
    out = out_dtype or a.dtype
    if a.is_cuda:
        runs = a.dtype in (torch.float16, torch.bfloat16) and out in _KERNEL_DTYPES
    else:
        runs = a.device.type == "cpu" and interpret_enabled()
    if runs:
        return _matmul.forward_kernel(a, b, bias, activation, out)
    return _matmul.reference(a, b, bias, activation, out).contiguous()


def _matmul_shape(a: torch.Tensor, b: torch.Tensor) -> List:
    # torch.matmul: broadcast batch dims, then M unless a is 1-D, then N unless b is 1-D.
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m = list(a.shape[-2:-1])
    n = list(b.shape[-1:]) if b.dim() > 1 else []
    return [*batch, *m, *n]


@_matmul_op.register_fake
def _(a, b, bias=None, activation=None, out_dtype=None):
    return a.new_empty(_matmul_shape(a, b), dtype=out_dtype or a.dtype)


def _setup_matmul(ctx, inputs, output):
    a, b, bias, activation, _ = inputs
    ctx.save_for_backward(a, b, bias if activation is not None else None)
    ctx.activation = activation
    ctx.bias_dtype = None if bias is None else bias.dtype


def _matmul_backward(ctx, dc):
    """dZ = dC * activation'(Z) (Z recomputed by one more matmul); dA = dZ @ B^T; dB = A^T @ dZ;
    dbias = the column sums of dZ (fusedops.autograd.matmul.input_gradients, with the custom op)."""
    a, b, bias = ctx.saved_tensors
    mm = torch.ops.fusedops.matmul
    if ctx.activation is None:
        dz = dc.to(a.dtype)
    else:
        z = mm(a, b, bias, None, _wide(a.dtype))
        dz = (dc.to(z.dtype) * _matmul.activation_grad(z, ctx.activation)).to(a.dtype)
    da, db, dbias = _matmul.input_gradients(dz, a, b, ctx.needs_input_grad, ctx.bias_dtype, mm)
    return da, db, dbias, None, None


_matmul_op.register_autograd(_matmul_backward, setup_context=_setup_matmul)


# ------------------------------------------------------------------------------------------------
# Autocast for direct callers of torch.ops.fusedops.* (fusedops.functional casts before calling)
# ------------------------------------------------------------------------------------------------
def _register_autocast() -> None:
    if not hasattr(torch.library, "register_autocast"):    # torch < 2.5: only the functional path casts
        return
    for op, devices in _AUTOCAST_POLICY.items():
        for device_type, policy in devices.items():
            if policy == "float32":
                torch.library.register_autocast(f"fusedops::{op}", device_type, torch.float32)
            else:
                # Cast to whatever dtype autocast runs in (float16 or bfloat16), read at call time.
                _register_lower_precision_autocast(f"fusedops::{op}", device_type)


def _register_lower_precision_autocast(name: str, device_type: str) -> None:
    key = {"cuda": "AutocastCUDA", "cpu": "AutocastCPU"}[device_type]
    library = torch.library.Library(NAMESPACE, "IMPL")
    _LIBRARIES.append(library)      # a Library deregisters its kernels when garbage-collected
    op = getattr(torch.ops.fusedops, name.partition("::")[2]).default

    def kernel(*args, **kwargs):
        dtype = torch.get_autocast_dtype(device_type)
        args = [autocast_cast(t, dtype) if isinstance(t, torch.Tensor) else t for t in args]
        with torch.autocast(device_type, enabled=False):
            return op(*args, **kwargs)

    library.impl(name.partition("::")[2], kernel, key)


_LIBRARIES: list = []
_register_autocast()


# ------------------------------------------------------------------------------------------------
# What fusedops.functional calls while torch.compile traces (arguments already checked and autocast)
# ------------------------------------------------------------------------------------------------
def softmax(input: torch.Tensor, dim: int, dtype: Optional[torch.dtype], *, log: bool) -> torch.Tensor:
    """torch.ops.fusedops.(log_)softmax(input, dim, dtype)."""
    op = torch.ops.fusedops.log_softmax if log else torch.ops.fusedops.softmax
    return op(input, dim, dtype)


def layer_norm(input, normalized_shape, weight, bias, eps: float) -> torch.Tensor:
    """The output of torch.ops.fusedops.layer_norm (its statistics are for the backward)."""
    return torch.ops.fusedops.layer_norm(input, list(normalized_shape), weight, bias, eps)[0]


def rms_norm(input, normalized_shape, weight, eps: float) -> torch.Tensor:
    """The output of torch.ops.fusedops.rms_norm."""
    return torch.ops.fusedops.rms_norm(input, list(normalized_shape), weight, eps)[0]


def matmul(a, b, bias, activation, out_dtype) -> torch.Tensor:
    """torch.ops.fusedops.matmul; with an activation and a gradient to compute, the matmul without the
    activation plus the activation in torch ops (which the compiler fuses), so that the backward has
    the pre-activation without recomputing it (as fusedops.autograd.matmul.MatmulFunction does)."""
    tensors = (a, b) if bias is None else (a, b, bias)
    if activation is None or not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        return torch.ops.fusedops.matmul(a, b, bias, activation, out_dtype)
    z = torch.ops.fusedops.matmul(a, b, bias, None, _wide(a.dtype))
    return _matmul.apply_activation(z, activation).to(out_dtype or a.dtype)
