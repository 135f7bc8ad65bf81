"""torch.autograd.Function for softmax and log_softmax over one dim (fusedops/kernels/softmax.py), and
the kernel path of fusedops.softmax / fusedops.log_softmax.

The forward saves its output y, not its input: both gradients need only y,
    softmax:      dx = y * (dy - sum(dy * y))
    log_softmax:  dx = dy - exp(y) * sum(dy)
(sums over `dim`), so the input can be freed as soon as the forward returns.
"""

from __future__ import annotations

from typing import Optional

import torch

from fusedops.autograd.function_host import apply_of, backward_runs_torch, once_differentiable
from fusedops.dsl.runtime.bounded_cache import BoundedCache
from fusedops.dsl.runtime.knobs import interpret_enabled
from fusedops.kernels import softmax as kernels


class SoftmaxFunction(torch.autograd.Function):
    """softmax or log_softmax of `x` by `launches` (a kernels.softmax.SoftmaxLaunches, which holds dim,
    log and the output dtype), differentiable once.

    forward(x, launches):
        x: float16/bfloat16/float32 CUDA tensor (any float dtype on the CPU under
            FUSEDOPS_INTERPRET=1), rank >= 1, laid out as `launches` was made for.
    Returns y, shaped like x, contiguous, in the launches' output dtype; the gradient is
    returned in x.dtype. Double backward is not supported (the backward is a kernel): it raises
    RuntimeError.
    """

    OPS = "fusedops.softmax / log_softmax"     # named by the double-backward error

    @staticmethod
    def forward(ctx, x: torch.Tensor, launches: kernels.SoftmaxLaunches) -> torch.Tensor:
        y = launches.forward(x)
        ctx.save_for_backward(y)
        ctx.launches = launches
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: torch.Tensor):
        (y,) = ctx.saved_tensors
        if backward_runs_torch(dy):
            return _torch_backward(dy, y, ctx.launches), None
        return ctx.launches.backward(dy, y), None


def reference_backward(dy: torch.Tensor, y: torch.Tensor, dim: int, log: bool, wide: torch.dtype) -> torch.Tensor:
    """The backward kernel's dx with torch ops, in `wide`: softmax y * (dy - sum(dy * y)), log_softmax
    dy - exp(y) * sum(dy) (sums over `dim`). Also the custom op's fallback (library/softmax_ops.py)."""
    dy, y = dy.to(wide), y.to(wide)
    if log:
        return dy - torch.exp(y) * dy.sum(dim, keepdim=True)
    return y * (dy - (dy * y).sum(dim, keepdim=True))


def _torch_backward(dy: torch.Tensor, y: torch.Tensor, launches: kernels.SoftmaxLaunches) -> torch.Tensor:
    """The backward kernel's dx with torch ops (which vmap can batch), for a dy the kernel cannot read
    (function_host.vmapped): sums in the kernel's accumulation dtype (float64 when any of y, dy, dx is
    float64, else float32), dx in the input's dtype."""
    dtype = launches.input_dtype
    wide = torch.float64 if torch.float64 in (y.dtype, dy.dtype, dtype) else torch.float32
    return reference_backward(dy, y, launches.dim, launches.log, wide).to(dtype)


# SoftmaxFunction.apply(x, launches) without the Python layer of torch's apply (function_host.py)
_softmax_apply = apply_of(SoftmaxFunction)


def softmax(x: torch.Tensor, launches: kernels.SoftmaxLaunches) -> torch.Tensor:
    """The softmax of x by `launches`: through SoftmaxFunction when x needs a gradient."""
    if x.requires_grad and torch.is_grad_enabled():
        return _softmax_apply(x, launches)
    return launches.forward(x)


# -- the kernel path of fusedops.softmax / log_softmax ----------------------------------------------
# fusedops.functional checks the arguments, then on the kernel path calls kernel_launches, which also
# remembers the launches per argument layout (_KNOWN_LAUNCHES): a later call with arguments laid out the
# same way finds them with known_launches, without the checks, the routing and the kernels' own key.
_KNOWN_LAUNCHES = BoundedCache(1024)


def _argument_key(x, dim, dtype, log: bool) -> tuple:
    """x's layout, dtype and device, dim and dtype as given, log and the interpreter flag. Raises
    AttributeError for an x that is not a tensor, TypeError for unhashable arguments."""
    device = x.get_device()
    key = (x.shape, x.stride(), x.dtype, device, dim, dtype, log, interpret_enabled())
    # get_device() is -1 on every non-CUDA device: name it (the interpreter's CPU tensors)
    return key if device >= 0 else (*key, x.device)


def known_launches(x, dim, dtype, log: bool) -> Optional[kernels.SoftmaxLaunches]:
    """The launches kernel_launches remembered for arguments laid out like these, or None."""
    try:
        return _KNOWN_LAUNCHES.get(_argument_key(x, dim, dtype, log))
    except (AttributeError, TypeError):     # not a tensor, an unhashable dim or dtype: left to the checks
        return None


def kernel_launches(x: torch.Tensor, dim: int, kernel_dtype: Optional[torch.dtype], log: bool,
                    given: Optional[tuple] = None) -> kernels.SoftmaxLaunches:
    """The SoftmaxLaunches of x over dim (in [0, x.dim())) into kernel_dtype (None: x's), for checked
    arguments on the kernel path. given: (dim, dtype) as the caller was given them, when x is the
    caller's tensor: the launches are then remembered for known_launches."""
    launches = kernels.softmax_launches(x, dim, log=log, dtype=kernel_dtype)
    if given is not None:
        _KNOWN_LAUNCHES.put(_argument_key(x, *given, log), launches)
    return launches
