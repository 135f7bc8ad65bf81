"""`fusedops.matmul`'s argument handling, its torch reference, and its autograd Function.

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
from fusedops.dsl.runtime.bounded_cache import BoundedCache
from fusedops.dsl.runtime.knobs import interpret_enabled as _interpret_enabled, stream_k_enabled as _stream_k_enabled, \
    persistent_enabled as _persistent_enabled, \
    tma_enabled as _tma_enabled
from fusedops.kernels import matmul as kernels
from fusedops.kernels.allocation import contiguous_allocator

ACTIVATIONS = kernels.ACTIVATIONS


# Integer operands take torch.matmul's product (as complex ones do); bool and quantized ones are refused.
_INTEGER_DTYPES = frozenset((torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64))


def check_arguments(a, b, bias, activation, out_dtype) -> None:
    """Raise TypeError / ValueError the way torch.matmul would for bad operands (named in messages)."""
    for name, value in (("input", a), ("other", b)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"fusedops.matmul(): argument '{name}' must be a torch.Tensor, not {type(value).__name__}")
        if value.dim() == 0:
            raise ValueError(f"fusedops.matmul(): both arguments need at least 1 dimension, '{name}' is 0-d")
    if a.dtype != b.dtype:
        raise TypeError(f"fusedops.matmul(): expected input and other to have the same dtype, got {a.dtype} and "
                        f"{b.dtype}")
    if not a.dtype.is_floating_point:
        if not (a.dtype.is_complex or a.dtype in _INTEGER_DTYPES):        # bool, quantized
            raise TypeError(f"fusedops.matmul(): expected floating-point, integer or complex operands, got {a.dtype}")
        extras = [name for name, value in (("bias", bias), ("activation", activation), ("out_dtype", out_dtype))
                  if value is not None]
        if extras:
            raise TypeError(f"fusedops.matmul(): {' and '.join(extras)} need floating-point operands, got {a.dtype} "
                            f"(integer and complex operands take torch.matmul's product alone)")
    device = a.get_device()     # cheaper than .device, but -1 for every non-CUDA device
    if device != b.get_device() or (device < 0 and a.device != b.device):
        raise ValueError(f"fusedops.matmul(): input is on {a.device} but other is on {b.device}")
    k_a, k_b = a.shape[-1], (b.shape[0] if b.dim() == 1 else b.shape[-2])
    if k_a != k_b:
        raise ValueError(f"fusedops.matmul(): shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied "
                         f"({k_a} != {k_b})")
    # (compared here, not by torch.broadcast_shapes: under torch.compile its error is dynamo's, not this one)
    if any(x != y and x != 1 and y != 1 for x, y in zip(reversed(a.shape[:-2]), reversed(b.shape[:-2]))):
        raise ValueError(f"fusedops.matmul(): shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied "
                         f"(batch dims {tuple(a.shape[:-2])} and {tuple(b.shape[:-2])} do not broadcast)")
    n = 1 if b.dim() == 1 else b.shape[-1]
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"fusedops.matmul(): argument 'bias' must be a torch.Tensor or None, not "
                            f"{type(bias).__name__}")
        if bias.dim() != 1 or bias.shape[0] != n:
            raise ValueError(f"fusedops.matmul(): bias must be a 1-D tensor of {n} elements, got {tuple(bias.shape)}")
        if not bias.dtype.is_floating_point:
            raise TypeError(f"fusedops.matmul(): bias must be a floating-point tensor, got {bias.dtype}")
        if bias.get_device() != device or (device < 0 and bias.device != a.device):
            raise ValueError(f"fusedops.matmul(): bias must be on input's device ({a.device}), got {bias.device}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"fusedops.matmul(): activation must be one of {ACTIVATIONS}, got {activation!r}")
    if out_dtype is not None and not (isinstance(out_dtype, torch.dtype) and out_dtype.is_floating_point):
        raise TypeError(f"fusedops.matmul(): out_dtype must be a floating-point torch.dtype, got {out_dtype!r}")


def apply_activation(z: torch.Tensor, activation: Optional[str]) -> torch.Tensor:
    """activation(z) with torch ops (the reference, and the forward when Z is kept for backward)."""
    if activation is None:
        return z
    if activation == "relu":
        return torch.relu(z)
    if activation == "gelu":
        return torch.nn.functional.gelu(z)
    if activation == "gelu_tanh":
        return torch.nn.functional.gelu(z, approximate="tanh")
    return torch.nn.functional.silu(z)


def activation_grad(z: torch.Tensor, activation: Optional[str]) -> torch.Tensor:
    """d activation / dz at z (float32 or wider)."""
    if activation == "relu":
        return (z > 0).to(z.dtype)
    if activation == "gelu":
        cdf = 0.5 * (1.0 + torch.erf(z * (1.0 / math.sqrt(2.0))))
        return cdf + z * torch.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    if activation == "gelu_tanh":
        c = math.sqrt(2.0 / math.pi)
        inner = c * (z + 0.044715 * z ** 3)
        t = torch.tanh(inner)
        return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * z * z)
    s = torch.sigmoid(z)
    return s * (1.0 + z * (1.0 - s))


def reference(a, b, bias=None, activation=None, out_dtype=None) -> torch.Tensor:
    """The same op with torch ops (CPU tensors, unsupported dtypes, torch transforms), with the kernel's
    numerics: 16-bit operands multiplied and summed in float32 (float64 where one is float64), the bias
    added and the activation applied there, then one rounding to out_dtype (default a's dtype), as
    torch.nn.Linear's addmm does. (A 16-bit torch.matmul rounds A @ B first: 100 x 200 summed over 4
    is inf in float16 before a bias of -40000 could bring it back to 40000.) Integer and complex operands
    (check_arguments: no bias, activation or out_dtype) take torch.matmul in their own dtype."""
    if not a.dtype.is_floating_point:
        return torch.matmul(a, b)
    acc = torch.promote_types(_wide(a.dtype), _wide(b.dtype))
    z = torch.matmul(a.to(acc), b.to(acc))
    if bias is not None:
        z = z + bias.to(acc)
    return apply_activation(z, activation).to(out_dtype or a.dtype)


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


def _sum_to(gradient: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Reduce a broadcast gradient back to `shape` (torch's sum_to_size for leading batch dims)."""
    while gradient.dim() > len(shape):
        gradient = gradient.sum(0)
    return gradient.sum_to_size(shape) if gradient.shape != shape else gradient


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
            wide = _wide(a.dtype)
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


def exact_input_gradients(dc, a, b, z, activation, needs_input_grad, bias_dtype) -> tuple:
    """(dA, dB, dbias) where dC's dtype is not a's (an out_dtype, e.g. float32 of float16 operands): dZ is
    kept in float32 (float64) and the gradient products computed by `reference`, since dZ in a's dtype
    can overflow where dA and dB fit (a scaled loss: dC = 1e5 times B = 1e-3 over K = 4 gives dA = 400,
    but 1e5 is inf in float16). z: the saved pre-activation (None without an activation)."""
    wide = torch.promote_types(_wide(a.dtype), dc.dtype)
    dz = dc.to(wide) if activation is None else dc.to(wide) * activation_grad(z.to(wide), activation)
    return input_gradients(dz, a, b, needs_input_grad, bias_dtype, reference)


def input_gradients(dz, a, b, needs_input_grad, bias_dtype, matmul):
    """(dA, dB, dbias) of C = act(A @ B + bias) from dZ = dC * act'(Z), with torch.matmul's shape rules
    (1-D operands, batch broadcasting): dA = dZ @ B^T, dB = A^T @ dZ, dbias = the column sums of dZ
    (accumulated in float32, float64 for float64). `needs_input_grad` says which to compute;
    `bias_dtype` is None without a bias; `matmul(x, y, bias, activation, out_dtype)` computes x @ y
    (the kernel launcher, the custom op under torch.compile, or `reference` under vmap).
    """
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    if a.dim() == 1 and b.dim() == 1:           # a dot product: dz is 0-d
        dz2 = dz.reshape(1, 1)
    else:
        dz2 = dz.unsqueeze(-2) if a.dim() == 1 else dz
        dz2 = dz2.unsqueeze(-1) if b.dim() == 1 else dz2
    da = db = dbias = None
    if needs_input_grad[0]:
        da = _sum_to(matmul(dz2, b2.transpose(-1, -2), None, None, a.dtype), a2.shape).reshape(a.shape)
    if needs_input_grad[1]:
        if b2.dim() == 2 and dz2.dim() > 2:     # b shared by every batch: one (K, rows) @ (rows, N)
            rows = math.prod(dz2.shape[:-1])     # spelled out: -1 is ambiguous for 0 elements
            rows_a = a2.expand(*dz2.shape[:-2], *a2.shape[-2:]).reshape(rows, a2.shape[-1])
            db = matmul(rows_a.transpose(0, 1), dz2.reshape(rows, dz2.shape[-1]), None, None, b.dtype)
        else:
            db = _sum_to(matmul(a2.transpose(-1, -2), dz2, None, None, b.dtype), b2.shape)
        db = db.reshape(b.shape)
    if bias_dtype is not None and needs_input_grad[2]:
        dbias = bias_gradient(dz2, bias_dtype)
    return da, db, dbias


def bias_gradient(dz: torch.Tensor, bias_dtype: torch.dtype) -> torch.Tensor:
    """The column sums of dZ (..., N) over all its rows, accumulated in float32 (float64 for float64) without
    a widened copy of dZ (a float32 copy of a 16-bit dZ cost more than the sum: Linear's backward at
    4096^3 fp16 on the H200 ran at 0.85x torch's), in bias_dtype."""
    wide = torch.float64 if dz.dtype == torch.float64 else torch.float32
    return dz.reshape(math.prod(dz.shape[:-1]), dz.shape[-1]).sum(0, dtype=wide).to(bias_dtype)


# MatmulFunction.apply without the Python layer of torch's (function_host.py)
matmul_apply = apply_of(MatmulFunction, (0, 1, 2))


def _wide(dtype: torch.dtype) -> torch.dtype:
    """The dtype of Z when an activation is fused: float32 (float64 for float64 operands)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


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
        products = (_product(a, b, bias, None, _wide(a.dtype)), _product(a, b, bias, activation, out_dtype))
    return _KNOWN_PRODUCTS.put(_argument_key(a, b, bias, activation, out_dtype), products)


def multiply(a, b, bias, activation, out_dtype, products: Optional[tuple]) -> torch.Tensor:
    """activation(a @ b + bias) on the kernel path, with the products of kernel_products (None: found
    per call): through MatmulFunction when a gradient is needed, else the forward alone."""
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad or (bias is not None and bias.requires_grad)):
        return matmul_apply(a, b, bias, activation, out_dtype, None if products is None else products[0])
    if products is None:
        return forward_kernel(a, b, bias, activation, out_dtype)
    return products[1].forward(a, b, bias)
