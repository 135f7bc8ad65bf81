"""torch.autograd.Function for softmax and log_softmax over one dim (fusedops/kernels/softmax.py).

The forward saves its output y, not its input: both gradients need only y,
    softmax:      dx = y * (dy - sum(dy * y))
    log_softmax:  dx = dy - exp(y) * sum(dy)
(sums over `dim`), so the input can be freed as soon as the forward returns.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.autograd.function import once_differentiable

from fusedops.kernels import softmax as kernels


class SoftmaxFunction(torch.autograd.Function):
    """softmax (log=False) or log_softmax (log=True) of `x` over `dim`, differentiable once.

    forward(x, dim, log, dtype):
        x: float16/bfloat16/float32 CUDA tensor (any float dtype on the CPU under
            FUSEDOPS_INTERPRET=1), rank >= 1, any strides; dim: in [0, x.dim()).
        dtype: the output dtype, or None for x.dtype. The kernel reads x in its own dtype and
            writes `dtype`; the gradient is returned in x.dtype.
    Returns y, shaped like x, dense with x's dim order.
    Double backward is not supported (the backward is a kernel): it raises RuntimeError.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, log: bool, dtype: Optional[torch.dtype]) -> torch.Tensor:
        y = kernels.softmax_forward(x, dim, log=log, dtype=dtype)
        ctx.save_for_backward(y)
        ctx.dim = dim
        ctx.log = log
        ctx.input_dtype = x.dtype
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: torch.Tensor):
        (y,) = ctx.saved_tensors
        dx = kernels.softmax_backward(dy, y, ctx.dim, log=ctx.log, dtype=ctx.input_dtype)
        return dx, None, None, None
