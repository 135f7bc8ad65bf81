"""The public ops: `fusedops.softmax(x, dim)`, ... with torch's semantics (re-exported lazily by
fusedops/__init__.py).

Each op checks its arguments the way torch does, then routes: CUDA tensors of the dtypes the
kernels support run the fusedops kernels (through their autograd Function when a gradient is
needed); CPU tensors run the native torch op, unless FUSEDOPS_INTERPRET=1, in which case the
kernels run in the NumPy interpreter (how the CPU test tier exercises them). Anything else (other
devices, float64 on CUDA) falls back to the native torch op.
"""

from __future__ import annotations

import operator
from typing import Optional

import torch

from fusedops.autograd.softmax import SoftmaxFunction
from fusedops.dsl.runtime import knobs
from fusedops.kernels.softmax import softmax_forward

_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _runs_kernels(x: torch.Tensor, *dtypes: torch.dtype) -> bool:
    """Whether an op on `x` (reading/writing `dtypes`) runs the fusedops kernels."""
    if x.is_cuda:
        return all(d in _KERNEL_DTYPES for d in dtypes)
    return x.device.type == "cpu" and knobs.current().interpret


def normalize_dim(name: str, dim, ndim: int) -> int:
    """`dim` in [0, max(ndim, 1)), torch's way: a 0-d tensor has one dim (-1 or 0).

    Raises TypeError for a non-integer dim and IndexError, with torch's message, out of range.
    """
    try:
        dim = operator.index(dim)
    except TypeError:
        raise TypeError(f"{name}(): argument 'dim' must be int, not {type(dim).__name__}") from None
    rank = max(ndim, 1)
    if not -rank <= dim < rank:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-rank}, {rank - 1}], but got {dim})")
    return dim % rank


# ------------------------------------------------------------------------------------------------
# softmax, log_softmax
# ------------------------------------------------------------------------------------------------
_EXACT_UPCASTS = {(torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float16, torch.float64),
                  (torch.bfloat16, torch.float64), (torch.float32, torch.float64)}


def softmax(input: torch.Tensor, dim: int = -1, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """exp(x) / sum(exp(x)) over `dim`, like `torch.softmax(input, dim, dtype=dtype)`.

    Args:
        input: a floating-point tensor of any shape (a 0-d tensor counts as one element), any strides.
        dim: the dim to normalize over, negative counts from the end.
        dtype: if given, `input` is cast to it first and the result has this dtype.
    Returns:
        A tensor shaped like `input` (dense; its dims lie in memory in `input`'s order, where torch
        returns a contiguous tensor). A row of only -inf gives NaN, like torch.
    Raises:
        TypeError: `input` is not a floating-point tensor (and no floating `dtype` is given), or
            `dtype` is not a floating dtype.
        IndexError: `dim` is out of range.

    fp16/bf16/fp32 CUDA tensors run fused kernels (statistics in fp32); a float32 `dtype` on an
    fp16/bf16 input is fused into the kernel's loads. float64 on CUDA runs torch's kernel.
    """
    return _softmax("softmax", input, dim, dtype, log=False)


def log_softmax(input: torch.Tensor, dim: int = -1, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """x - log(sum(exp(x))) over `dim`, like `torch.log_softmax(input, dim, dtype=dtype)`.

    Arguments, result and errors as for `softmax`; a row of only -inf gives NaN, like torch.
    """
    return _softmax("log_softmax", input, dim, dtype, log=True)


def _softmax(name: str, input, dim, dtype: Optional[torch.dtype], *, log: bool) -> torch.Tensor:
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"fusedops.{name}(): argument 'input' must be a torch.Tensor, not {type(input).__name__}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"fusedops.{name}(): argument 'dtype' must be a floating-point torch.dtype, got {dtype!r}")
    if dtype is None and not input.dtype.is_floating_point:
        raise TypeError(f"fusedops.{name}(): argument 'input' must be a floating-point tensor, got {input.dtype}; "
                        "pass dtype=torch.float32 to cast it first")
    dim = normalize_dim(name, dim, input.dim())
    out_dtype = dtype or input.dtype
    if dtype is not None and dtype != input.dtype and (input.dtype, dtype) not in _EXACT_UPCASTS:
        input = input.to(dtype)     # torch casts first; only exact upcasts are fused into the kernel
    if not _runs_kernels(input, input.dtype, out_dtype):
        native = torch.log_softmax if log else torch.softmax
        return native(input, dim, dtype=dtype)
    if input.dim() == 0:
        return _softmax(name, input.reshape(1), 0, dtype, log=log).reshape(())
    kernel_dtype = out_dtype if out_dtype != input.dtype else None
    if input.requires_grad and torch.is_grad_enabled():
        return SoftmaxFunction.apply(input, dim, log, kernel_dtype)
    return softmax_forward(input, dim, log=log, dtype=kernel_dtype)
