"""The custom operator fusedops::matmul (its own backward: the input gradients are matmuls of the
transposed operands), and `matmul`, what fusedops.functional calls while a graph is traced.

| operator                       | returns                      | gradient through               |
|--------------------------------|------------------------------|--------------------------------|
| matmul(a, b, bias, activation, out_dtype) | output            | matmul (transposed operands)   |
"""

from __future__ import annotations

from typing import List, Optional

import torch

from fusedops.autograd import matmul as _matmul
from fusedops.autograd import matmul_reference as _matmul_reference
from fusedops.library.common import accumulation_dtype, matmul_runs_kernels, recomputed_gradients, refuse_dual


@torch.library.custom_op("fusedops::matmul", mutates_args=())
def _matmul_op(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None,
               activation: Optional[str] = None, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """activation(a @ b + bias) with torch.matmul's shapes (see fusedops.matmul); a new contiguous tensor.
    Checks its arguments as fusedops.matmul does (the op may be called directly)."""
    _matmul_reference.check_arguments(a, b, bias, activation, out_dtype)
    refuse_dual("matmul", a, b, bias)
    out = out_dtype or a.dtype
    if matmul_runs_kernels(a, out_dtype, bias):
        return _matmul.forward_kernel(a, b, bias, activation, out)
    return _matmul_reference.reference(a, b, bias, activation, out).contiguous()


def _matmul_shape(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None) -> List:
    # torch.matmul: broadcast batch dims, then M unless a is 1-D, then N unless b is 1-D; then broadcast
    # with the bias (a dot product plus a (1,) bias is (1,), as torch.matmul(a, b) + bias).
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m = list(a.shape[-2:-1])
    n = list(b.shape[-1:]) if b.dim() > 1 else []
    shape = [*batch, *m, *n]
    return shape if bias is None else list(torch.broadcast_shapes(shape, bias.shape))


@_matmul_op.register_fake
def _(a, b, bias=None, activation=None, out_dtype=None):
    _matmul_reference.check_arguments(a, b, bias, activation, out_dtype)
    return a.new_empty(_matmul_shape(a, b, bias), dtype=out_dtype or a.dtype)


def _setup_matmul(ctx, inputs, output):
    a, b, bias, activation, _ = inputs
    # As torch.matmul (and MatmulFunction): without an activation to recompute Z from (or torch's complex product),
    # an operand is saved only where the other's gradient reads it, so that one changed in place after the call
    # whose partner needs no gradient (a frozen weight) does not fail the backward; the other is kept as a meta
    # stand-in (its shape, strides and dtype, all the backward reads of it).
    needs, recompute = ctx.needs_input_grad, activation is not None or a.is_complex()
    keep_a, keep_b = recompute or needs[1], recompute or needs[0]
    ctx.save_for_backward(a if keep_a else None, b if keep_b else None, bias if activation is not None else None)
    ctx.stand_ins = (None if keep_a else _matmul._stand_in(a), None if keep_b else _matmul._stand_in(b))
    ctx.activation = activation
    ctx.bias_dtype = None if bias is None else bias.dtype


def _matmul_backward(ctx, dc):
    """dZ = dC * activation'(Z) (Z recomputed by one more matmul); dA = dZ @ B^T; dB = A^T @ dZ;
    dbias = the column sums of dZ (fusedops.autograd.matmul_reference.input_gradients, with the custom op)."""
    a, b, bias = ctx.saved_tensors
    a, b = (saved if saved is not None else stand_in for saved, stand_in in zip((a, b), ctx.stand_ins))
    mm = torch.ops.fusedops.matmul
    if a.is_complex():          # torch.matmul's product (the only one complex operands take): its gradients
        return (*recomputed_gradients(torch.matmul, (a, b), ctx.needs_input_grad[:2], dc), None, None, None)
    if dc.dtype != a.dtype:     # an out_dtype other than a's: dZ kept wide (exact_input_gradients)
        z = None if ctx.activation is None else mm(a, b, bias, None, accumulation_dtype(a.dtype))
        da, db, dbias = _matmul_reference.exact_input_gradients(dc, a, b, z, ctx.activation, ctx.needs_input_grad,
                                                      ctx.bias_dtype)
        return da, db, dbias, None, None
    if ctx.activation is None:
        dz = dc
    else:
        z = mm(a, b, bias, None, accumulation_dtype(a.dtype))
        dz = (dc.to(z.dtype) * _matmul_reference.activation_grad(z, ctx.activation)).to(a.dtype)
    da, db, dbias = _matmul_reference.input_gradients(dz, a, b, ctx.needs_input_grad, ctx.bias_dtype, mm)
    return da, db, dbias, None, None


_matmul_op.register_autograd(_matmul_backward, setup_context=_setup_matmul)


def matmul(a, b, bias, activation, out_dtype) -> torch.Tensor:
    """torch.ops.fusedops.matmul; with an activation and a gradient to compute, the matmul without the
    activation plus the activation in torch ops (which the compiler fuses), so that the backward has
    the pre-activation without recomputing it (as fusedops.autograd.matmul.MatmulFunction does)."""
    tensors = (a, b) if bias is None else (a, b, bias)
    if activation is None or not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        return torch.ops.fusedops.matmul(a, b, bias, activation, out_dtype)
    z = torch.ops.fusedops.matmul(a, b, bias, None, accumulation_dtype(a.dtype))
    return _matmul_reference.apply_activation(z, activation).to(out_dtype or a.dtype)
