"""torch.autograd.Function for softmax and log_softmax over one dim (fusedops/kernels/softmax.py).

The forward saves its output y, not its input: both gradients need only y,
    softmax:      dx = y * (dy - sum(dy * y))
    log_softmax:  dx = dy - exp(y) * sum(dy)
(sums over `dim`), so the input can be freed as soon as the forward returns.
"""

from __future__ import annotations

from typing import Optional

import torch

from fusedops.autograd.function_host import apply_of, once_differentiable
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
        y, plan = kernels.softmax_forward_planned(x, dim, log=log, dtype=dtype)
        ctx.save_for_backward(y)
        ctx.options = (plan, dim, log, x.dtype)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: torch.Tensor):
        (y,) = ctx.saved_tensors
        plan, dim, log, input_dtype = ctx.options
        if plan is not None:    # the launches prepared for this layout (kernels.softmax._Softmax)
            return plan.backward(dy, y, input_dtype), None, None, None
        return kernels.softmax_backward(dy, y, dim, log=log, dtype=input_dtype), None, None, None


# SoftmaxFunction.apply(x, dim, log, dtype) without the Python layer of torch's apply (function_host.py)
softmax_apply = apply_of(SoftmaxFunction)
