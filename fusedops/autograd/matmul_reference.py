"""`fusedops.matmul` in torch ops: its argument checks (torch.matmul's errors), its reference, and its gradient
formulas over any matmul, with torch.matmul's shape rules (the kernel path and the Function: autograd/matmul.py).

    C = activation(A @ B + bias)         Z = A @ B + bias (the pre-activation)
    dZ = dC * activation'(Z);  dA = dZ @ B^T;  dB = A^T @ dZ;  dbias = sum of dZ over all rows
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from fusedops.autograd.arguments import definitely
from fusedops.autograd.function_host import autocast_off
from fusedops.kernels import matmul as kernels

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
    if definitely(k_a != k_b):     # (`definitely`: an unbacked size is checked when the op runs)
        raise ValueError(f"fusedops.matmul(): shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied "
                         f"({k_a} != {k_b})")
    # (compared here, not by torch.broadcast_shapes: under torch.compile its error is dynamo's, not this one; an
    # unbacked size that may be 1 is left to torch's broadcasting, which asserts it when the graph runs)
    if any(definitely(x != y) and definitely(x != 1) and definitely(y != 1)
           for x, y in zip(reversed(a.shape[:-2]), reversed(b.shape[:-2]))):
        raise ValueError(f"fusedops.matmul(): shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied "
                         f"(batch dims {tuple(a.shape[:-2])} and {tuple(b.shape[:-2])} do not broadcast)")
    n = 1 if b.dim() == 1 else b.shape[-1]
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"fusedops.matmul(): argument 'bias' must be a torch.Tensor or None, not "
                            f"{type(bias).__name__}")
        if bias.dim() != 1 or definitely(bias.shape[0] != n):
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
        return (~(z <= 0)).to(z.dtype)     # as torch's threshold_backward: a NaN z passes the gradient
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
    is inf in float16 before a bias of -40000 could bring it back to 40000.) Also under autocast, which
    would run the float32 product in the autocast dtype: it runs with autocast off (the operands are
    cast by the caller, fusedops.matmul). Integer and complex operands (check_arguments: no bias,
    activation or out_dtype) take torch.matmul in their own dtype."""
    if not a.dtype.is_floating_point:
        return torch.matmul(a, b)
    acc = torch.promote_types(wide_dtype(a.dtype), wide_dtype(b.dtype))
    with autocast_off(a.device.type):     # (autocast would run the float32 product in its 16-bit dtype)
        z = torch.matmul(a.to(acc), b.to(acc))
    if bias is not None:
        z = z + bias.to(acc)
    return apply_activation(z, activation).to(out_dtype or a.dtype)


def _sum_to(gradient: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Reduce a broadcast gradient back to `shape` (torch's sum_to_size for leading batch dims): the dims `shape`
    has one of summed. (Decided by `definitely`, not by sum_to_size, which guards on its sizes: a traced backward's
    unbacked batch size, which may be 1, could not be compared.)"""
    while gradient.dim() > len(shape):
        gradient = gradient.sum(0)
    dims = [d for d, (size, target) in enumerate(zip(gradient.shape, shape))
            if definitely(target == 1) and not definitely(size == 1)]
    return gradient.sum(dims, keepdim=True) if dims else gradient


def exact_input_gradients(dc, a, b, z, activation, needs_input_grad, bias_dtype) -> tuple:
    """(dA, dB, dbias) where dC's dtype is not a's (an out_dtype, e.g. float32 of float16 operands): dZ is
    kept in float32 (float64) and the gradient products computed by `reference`, since dZ in a's dtype
    can overflow where dA and dB fit (a scaled loss: dC = 1e5 times B = 1e-3 over K = 4 gives dA = 400,
    but 1e5 is inf in float16). z: the saved pre-activation (None without an activation)."""
    wide = torch.promote_types(wide_dtype(a.dtype), dc.dtype)
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


def wide_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of Z when an activation is fused: float32 (float64 for float64 operands)."""
    return torch.float64 if dtype == torch.float64 else torch.float32

