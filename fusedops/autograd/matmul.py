"""`fusedops.matmul`'s kernel path and its autograd Function (its argument checks, torch reference and gradient
formulas: autograd/matmul_reference.py).

    C = activation(A @ B + bias)         Z = A @ B + bias (the pre-activation)
    dZ = dC * activation'(Z);  dA = dZ @ B^T;  dB = A^T @ dZ;  dbias = sum of dZ over all rows

Shapes follow torch.matmul for 1-D, 2-D and batched operands: a (..., M, K), b (..., K, N), the
batch dims broadcast (an operand without batch dims, or with batch size 1, is shared by every
batch via a batch stride of 0, without a copy). Operands with more than one batch dim are
flattened to one (a copy when their strides do not allow a view).

The forward runs one fused kernel. When a gradient is needed and an activation is fused, the
forward keeps Z: it runs the kernel without the activation, applies the activation with torch,
and saves Z for activation'(Z) (recomputing Z in the backward would cost another matmul). The
gradient matmuls run the same kernel on transposed views (no copies). On the GPU every launch is
prepared once per operand layout (_Product), the gradient matmuls of the usual layouts too, as launches
that read dZ, A and B in place without making the views each time.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from fusedops.autograd.function_host import apply_of, backward_runs_torch, once_differentiable
from fusedops.autograd.matmul_reference import activation_grad, apply_activation, bias_gradient, \
    exact_input_gradients, input_gradients, reference, wide_dtype
from fusedops.dsl.runtime.bounded_cache import BoundedCache
from fusedops.dsl.runtime.knobs import interpret_enabled as _interpret_enabled, stream_k_enabled as _stream_k_enabled, \
    persistent_enabled as _persistent_enabled, \
    tma_enabled as _tma_enabled
from fusedops.kernels import matmul as kernels
from fusedops.kernels.allocation import contiguous_allocator


# -- shapes --------------------------------------------------------------------------------------------

def _as_3d(x: torch.Tensor, batch_shape: tuple) -> torch.Tensor:
    """x (..., R, C) broadcast to batch_shape and viewed as (batch, R, C) (batch stride 0 when x has
    no batch dims or only ones)."""
    matrix = x.shape[-2:]
    if x.dim() == 2 or all(s == 1 for s in x.shape[:-2]):
        return x.reshape(1, *matrix) if x.dim() != 3 else x
    x = x.expand(*batch_shape, *matrix)
    return x.reshape(math.prod(batch_shape), *matrix)     # the count spelled out: -1 is ambiguous for 0 elements


# _Product per everything forward_kernel derives from its operands but their addresses (shapes, strides,
# dtypes, devices, the bias's, activation, out_dtype) and the FUSEDOPS_TMA setting: its prepared launches.
_FORWARD_LAUNCHES = BoundedCache(1024)


def forward_kernel(a, b, bias, activation, out_dtype) -> torch.Tensor:
    """The kernel path with torch.matmul's shape rules (see the module docstring). GPU launches are
    prepared once per operand shapes, strides, dtypes and devices; the interpreter takes the general
    path (kernels.matmul) each time."""
    product = _product(a, b, bias, activation, out_dtype)
    if product is None:
        return _forward_general(a, b, bias, activation, out_dtype)
    return product.forward(a, b, bias)


def _product(a, b, bias, activation, out_dtype) -> Optional["_Product"]:
    """The _Product of operands like these, made once per layout; None under the interpreter."""
    if _interpret_enabled():
        return None
    key = (a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.get_device(), b.get_device(),
           None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.get_device()), activation, out_dtype,
           _tma_enabled(), _stream_k_enabled(), _persistent_enabled())     # the knobs pick the kernel: a changed setting is seen next call
    product = _FORWARD_LAUNCHES.get(key)
    if product is None:
        product = _FORWARD_LAUNCHES.put(key, _Product(a, b, bias, activation, out_dtype))
    return product


def _operands(a, b):
    """(a, b) as 3-D (batch or 1, M, K), (batch or 1, K, N) views, the batch shape, m, n."""
    a_vector, b_vector = a.dim() == 1, b.dim() == 1
    a2 = a.unsqueeze(0) if a_vector else a
    b2 = b.unsqueeze(-1) if b_vector else b
    batch_shape = torch.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    return _as_3d(a2, batch_shape), _as_3d(b2, batch_shape), batch_shape, a2.shape[-2], b2.shape[-1]


def _output_shape(a, b, batch_shape, m, n, bias) -> tuple:
    """torch.matmul(a, b) + bias's shape: a dot product of two 1-D operands is 0-d, and (1,) with its bias."""
    if a.dim() == 1 and b.dim() == 1:
        return () if bias is None else (1,)
    return (*batch_shape, *(() if a.dim() == 1 else (m,)), *(() if b.dim() == 1 else (n,)))


def _forward_general(a, b, bias, activation, out_dtype) -> torch.Tensor:
    # c in its final shape, the kernel writing a (batch, M, N) view of it: the Function's output is then no
    # view, so that in-place ops on it (y += residual, an in-place ReLU after a Linear) stay allowed
    a3, b3, batch_shape, m, n = _operands(a, b)
    c = torch.empty(_output_shape(a, b, batch_shape, m, n, bias), dtype=out_dtype or a.dtype, device=a.device)
    kernels.matmul_into(c.view(kernels.product_batch(a3, b3), m, n), a3, b3, bias, activation)
    return c


def _prepared_product(a, b, bias, activation, out_dtype) -> Optional[tuple]:
    """(launch(a, b, bias) -> c, c's shape): forward_kernel for operands like these as one prepared
    launch that reads a and b in place (the kernel's 3-D operands are views of them, never copies); c
    is allocated in its final shape (contiguous, so its memory is the kernel's (batch, M, N) output).
    None where that does not hold (operands that need copies to be 3-D, empty outputs, batches over the
    grid limit). The launch reads only its tensors' addresses: it may be given any tensors whose memory
    is laid out as these operands' (e.g. b for the transposed view of b it was prepared with)."""
    a3, b3, batch_shape, m, n = _operands(a, b)
    if a3.data_ptr() != a.data_ptr() or b3.data_ptr() != b.data_ptr():     # copies, not views
        return None
    shape = _output_shape(a, b, batch_shape, m, n, bias)
    dtype = out_dtype or a.dtype
    c = torch.empty(shape, dtype=dtype, device=a.device)
    prepared = kernels.prepare_matmul(c.view(kernels.product_batch(a3, b3), m, n), a3, b3, bias, activation)
    if prepared is None:
        return None
    new_output = contiguous_allocator(shape, dtype, a.device)

    def launch(a, b, bias):
        c = new_output()
        prepared(c, a, b, bias)
        return c

    return launch, shape


class _Product:
    """The launches of forward_kernel for one operand layout: `forward(a, b, bias) -> c`, and for
    MatmulFunction's backward `gradients(dz, a, b, input_grad, weight_grad) -> (dA, dB)` (as
    input_gradients computes them), whose launches are prepared per layout of dz, a and b."""

    __slots__ = ("forward", "_gradients")

    def __init__(self, a, b, bias, activation, out_dtype):
        prepared = _prepared_product(a, b, bias, activation, out_dtype)
        if prepared is None:
            self.forward = lambda a, b, bias: _forward_general(a, b, bias, activation, out_dtype)
        else:
            self.forward = prepared[0]
        self._gradients = BoundedCache(16)      # per (layouts of dz, a, b; the gradients asked for)

    def gradients(self, dz: torch.Tensor, a: torch.Tensor, b: torch.Tensor, input_grad: bool,
                  weight_grad: bool) -> tuple:
        # a's and b's strides too: a saved-tensor hook (torch.autograd.graph.save_on_cpu) may lay them out anew
        key = (dz.stride(), dz.dtype, a.stride(), b.stride(), input_grad, weight_grad)
        launch = self._gradients.get(key, _UNKNOWN)
        if launch is _UNKNOWN:
            launch = self._gradients.put(key, _gradient_launches(dz, a, b, input_grad, weight_grad))
        if launch is None:
            return input_gradients(dz, a, b, (input_grad, weight_grad, False), None, forward_kernel)[:2]
        return launch(dz, a, b)


_UNKNOWN = object()


def _gradient_launches(dz, a, b, input_grad: bool, weight_grad: bool) -> Optional[Callable]:
    """`launch(dz, a, b) -> (dA, dB)`: input_gradients' matmuls for tensors laid out like these as
    prepared launches that read dz, a and b in place, without the transposed and reshaped views
    input_gradients makes (each costs about as much host time as a launch). None where one of them is
    not a single such launch: 1-D operands, broadcast batches whose gradients are summed, operands that
    must be copied, a dz of another dtype than a's."""
    if a.dim() == 1 or b.dim() == 1 or dz.dtype != a.dtype:
        return None
    da = db = None
    if input_grad:      # dA = dZ @ B^T
        da = _prepared_product(dz, b.transpose(-1, -2), None, None, a.dtype)
        if da is None or da[1] != a.shape:
            return None
        da = da[0]
    if weight_grad:     # dB = A^T @ dZ; B shared by every batch: one (K, rows) @ (rows, N)
        if b.dim() == 2 and dz.dim() > 2:
            rows = math.prod(dz.shape[:-1])
            x = a.expand(*dz.shape[:-2], *a.shape[-2:]).reshape(rows, a.shape[-1]).transpose(0, 1)
            y = dz.reshape(rows, dz.shape[-1])
        else:
            x, y = a.transpose(-1, -2), dz
        in_place = x.data_ptr() == a.data_ptr() and y.data_ptr() == dz.data_ptr()
        db = _prepared_product(x, y, None, None, b.dtype) if in_place else None
        if db is None or db[1] != b.shape:
            return None
        db = db[0]

    def launch(dz, a, b):
        return (None if da is None else da(dz, b, None)), (None if db is None else db(a, dz, None))

    return launch


class MatmulFunction(torch.autograd.Function):
    """activation(a @ b + bias) with gradients for a, b and bias (double backward unsupported).

    forward(a, b, bias, activation, out_dtype): a, b with torch.matmul's shapes and one float
    dtype (float16/bfloat16 on the GPU); bias (N,) or None; returns C of out_dtype (default a's).
    product: the _Product of the kernel launch it runs (activation(A @ B + bias) without the activation,
    into out_dtype, or float32 with an activation), when the caller has it (kernel_products).
    """

    OPS = "fusedops.matmul / nn.Linear"     # named by the double-backward error

    @staticmethod
    def forward(ctx, a, b, bias, activation, out_dtype, product=None):
        out_dtype = out_dtype or a.dtype
        if activation is None:
            product = product or _product(a, b, bias, None, out_dtype)
            z = None
            c = _forward_general(a, b, bias, None, out_dtype) if product is None else product.forward(a, b, bias)
        else:
            wide = wide_dtype(a.dtype)
            product = product or _product(a, b, bias, None, wide)
            z = _forward_general(a, b, bias, None, wide) if product is None else product.forward(a, b, bias)
            c = apply_activation(z, activation).to(out_dtype)
        # As torch.matmul: an operand is kept only where the other's gradient reads it (dA = dZ @ B^T, dB =
        # A^T @ dZ), so an operand changed in place after the call, whose partner needs no gradient (a frozen
        # weight), does not fail the backward; the other is kept as a meta tensor (its shape, strides, dtype).
        # An input that needs a gradient but is not saved gets an anchor saved instead (`_error_anchor`), so that
        # differentiating its gradient again raises (once_differentiable) instead of finding it unused.
        needs = ctx.needs_input_grad
        unsaved = [t for t, need, saved in ((a, needs[0], needs[1]), (b, needs[1], needs[0]), (bias, needs[2], False))
                   if need and not saved]
        ctx.save_for_backward(a if needs[1] else None, b if needs[0] else None, z, *map(_error_anchor, unsaved))
        ctx.stand_ins = (None if needs[1] else _stand_in(a), None if needs[0] else _stand_in(b))
        ctx.activation, ctx.bias_dtype, ctx.product = activation, None if bias is None else bias.dtype, product
        return c

    @staticmethod
    @once_differentiable
    def backward(ctx, dc):
        a, b, z = ctx.saved_tensors[:3]
        a, b = (saved if saved is not None else stand_in for saved, stand_in in zip((a, b), ctx.stand_ins))
        needs, product = ctx.needs_input_grad, ctx.product
        if dc.dtype != a.dtype:     # out_dtype other than a's: dZ kept wide (exact_input_gradients)
            return (*exact_input_gradients(dc, a, b, z, ctx.activation, needs, ctx.bias_dtype), None, None, None)
        if ctx.activation is None:
            dz = dc
        else:
            dz = (dc.to(z.dtype) * activation_grad(z, ctx.activation)).to(a.dtype)
        if backward_runs_torch(dc):     # a dz the kernels cannot read: the same gradients by torch.matmul
            da, db, dbias = input_gradients(dz, a, b, needs, ctx.bias_dtype, reference)
        elif product is None or (ctx.bias_dtype is not None and needs[2] and min(a.dim(), b.dim()) < 2):
            da, db, dbias = input_gradients(dz, a, b, needs, ctx.bias_dtype, forward_kernel)
        else:   # the usual case: launches prepared for these layouts (_Product), and the bias's column sums
            (da, db), dbias = product.gradients(dz, a, b, needs[0], needs[1]), None
            if ctx.bias_dtype is not None and needs[2]:
                dbias = bias_gradient(dz, ctx.bias_dtype)
        return da, db, dbias, None, None, None


def _stand_in(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor with `t`'s shape, strides and dtype (what the backward reads of an operand it does not
    multiply by). Kept on ctx, not saved: saved-tensor hooks (save_on_cpu) cannot copy a meta tensor."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _error_anchor(t: torch.Tensor) -> torch.Tensor:
    """An empty tensor whose autograd history leads to `t` (built with grad recording on, inside a forward) and
    that has its own storage and version counter: saved for backward, it connects once_differentiable's error
    node to `t` without keeping `t`'s values or failing when `t` is changed in place. No kernel runs (0
    elements)."""
    with torch.enable_grad():
        return (t.narrow(-1, 0, 0) if t.dim() else t.reshape(1).narrow(0, 0, 0)).clone()


# MatmulFunction.apply without the Python layer of torch's (function_host.py)
matmul_apply = apply_of(MatmulFunction, (0, 1, 2))


# -- the kernel path of fusedops.matmul ---------------------------------------------------------------
# fusedops.matmul checks its arguments, then on the kernel path calls kernel_products, which remembers
# its result per argument layout (_KNOWN_PRODUCTS): a later call with arguments laid out the same way
# finds it with known_products, without the checks, the routing and the _Product key.
_KNOWN_PRODUCTS = BoundedCache(1024)


def _argument_key(a, b, bias, activation, out_dtype) -> tuple:
    """The layouts, dtypes and devices of the tensors, activation, out_dtype, the interpreter flag and
    FUSEDOPS_TMA, FUSEDOPS_STREAM_K and FUSEDOPS_PERSISTENT. Raises AttributeError for tensors that are not tensors, TypeError for
    unhashable arguments."""
    device = a.get_device()
    key = (a.shape, a.stride(), a.dtype, device, b.shape, b.stride(), b.dtype, b.get_device(),
           None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.get_device()),
           activation, out_dtype, _interpret_enabled(), _tma_enabled(), _stream_k_enabled(),
           _persistent_enabled())
    if device < 0:      # get_device() is -1 on every non-CUDA device: name them (the interpreter's CPU tensors)
        key += (a.device, b.device, None if bias is None else bias.device)
    return key


def known_products(a, b, bias, activation, out_dtype) -> Optional[tuple]:
    """kernel_products(...) as remembered for arguments laid out like these, or None."""
    try:
        return _KNOWN_PRODUCTS.get(_argument_key(a, b, bias, activation, out_dtype))
    except (AttributeError, TypeError):     # not tensors, unhashable arguments: left to the checks
        return None


def kernel_products(a, b, bias, activation, out_dtype) -> Optional[tuple]:
    """(the _Product of MatmulFunction, the _Product of the forward alone) for arguments that passed
    check_arguments and take the kernel path, remembered for known_products; None under the
    interpreter (which prepares no launches)."""
    if _interpret_enabled():
        return None
    if activation is None:
        product = _product(a, b, bias, None, out_dtype or a.dtype)
        products = (product, product)
    else:
        products = (_product(a, b, bias, None, wide_dtype(a.dtype)), _product(a, b, bias, activation, out_dtype))
    return _KNOWN_PRODUCTS.put(_argument_key(a, b, bias, activation, out_dtype), products)


def multiply(a, b, bias, activation, out_dtype, products: Optional[tuple]) -> torch.Tensor:
    """activation(a @ b + bias) on the kernel path, with the products of kernel_products (None: found
    per call): through MatmulFunction when a gradient is needed, else the forward alone."""
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad or (bias is not None and bias.requires_grad)):
        return matmul_apply(a, b, bias, activation, out_dtype, None if products is None else products[0])
    if products is None:
        return forward_kernel(a, b, bias, activation, out_dtype)
    return products[1].forward(a, b, bias)
