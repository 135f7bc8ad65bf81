"""The host cost of the autograd Functions: `apply` and `once_differentiable` without the parts a plain
eager step does not need.

A training step runs every op's Function forward and backward, and on small tensors their Python
layers cost more than the kernels (measured on the CPU with the driver mocked: a trivial Function's
forward + backward ~80 us, of which `Function.apply`'s Python wrapper ~3 us and `once_differentiable`
~5 us; `tensor.backward()` itself ~45 us).

- `apply_of(cls)`: `cls.apply` that calls the C implementation (`torch._C._FunctionBase.apply`, what
  `Function.apply` ends in) directly while no functorch transform is active, after the same
  dead-wrapper unwrapping; under a transform (or on a torch without those names) it is `cls.apply`.
  Only for Functions without `setup_context` (whose `apply` rebinds default arguments first).
- `once_differentiable(backward)`: torch's decorator of that name, whose no_grad context runs only when
  the backward is itself recorded (create_graph=True, grad mode on). Then every gradient it returns
  raises on a second differentiation, also when the incoming gradients do not require grad (torch's
  decorator returns plain tensors then, which would silently drop the terms through the saved inputs,
  e.g. a gradient penalty's), and with respect to the incoming gradients (torch's decorator leaves them
  out of the graph: torch.autograd.functional.jvp, a double vjp, silently gave zeros). A backward given a
  batched (vmap) or dual (forward-AD) gradient runs torch's ops, recorded as they are.
- `vmapped(grad)`: whether a backward was given a gradient under vmap, which the kernels cannot read (a
  batched tensor has no storage): the backward then computes its gradients with torch ops instead.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable

import torch
from torch.autograd import forward_ad as _forward_ad
from torch.autograd import function as _function

_FUNCTION_BASE_APPLY = getattr(getattr(torch._C, "_FunctionBase", None), "__dict__", {}).get("apply")
_TRANSFORMS_ACTIVE = getattr(torch._C, "_are_functorch_transforms_active", None)
_UNWRAP_IF_DEAD = getattr(getattr(torch._C, "_functorch", None), "unwrap_if_dead", None)
_IS_LEGACY_BATCHED = getattr(getattr(torch._C, "_functorch", None), "is_legacy_batchedtensor", lambda t: False)
_transforms_active = _TRANSFORMS_ACTIVE or (lambda: False)


def apply_of(cls, tensor_positions: tuple = (0,)) -> Callable:
    """`cls.apply` (a torch.autograd.Function without setup_context) minus its Python wrapper's cost;
    `tensor_positions`: the positions of the arguments that may be tensors (the only ones unwrapped)."""
    if _function._is_setup_context_defined(cls.setup_context):
        raise TypeError(f"{cls.__name__} defines setup_context: use its apply")
    if _FUNCTION_BASE_APPLY is None or _TRANSFORMS_ACTIVE is None or _UNWRAP_IF_DEAD is None:
        return cls.apply
    raw_apply = _FUNCTION_BASE_APPLY.__get__(None, cls)
    apply, transforms_active, unwrap = cls.apply, _TRANSFORMS_ACTIVE, _UNWRAP_IF_DEAD

    if tensor_positions == (0,):
        def fast_apply(x, *args):
            if transforms_active():
                return apply(x, *args)
            return raw_apply(unwrap(x), *args)
    else:
        def fast_apply(*args):
            if transforms_active():
                return apply(*args)
            args = list(args)
            for position in tensor_positions:
                if args[position] is not None:
                    args[position] = unwrap(args[position])
            return raw_apply(*args)

    return functools.wraps(cls.apply)(fast_apply)


# Active TorchDispatchModes (FlopCounterMode, FakeTensorMode, DebugMode, ...) and TorchFunctionModes see torch's
# ops, not a kernel launch. The one function mode left out is torch.device(...) as a context manager
# (DeviceContext: it only fills in factory functions' device), common around model code.
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)
_function_modes_enabled = getattr(torch._C, "_is_torch_function_mode_enabled", lambda: False)


def torch_modes_active() -> bool:
    """Whether a torch dispatch mode, or a function mode other than torch.device's, is active (two C calls
    when none is): the ops then run torch's, so that the mode sees them as it sees torch's own calls."""
    if _dispatch_modes():
        return True
    if not _function_modes_enabled():
        return False
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._device import DeviceContext

    return any(not isinstance(mode, DeviceContext) for mode in _get_current_function_mode_stack())


# torch._C._is_any_autocast_enabled (private; torch >= 2.4): autocast on for CPU, CUDA or another usual device
_any_autocast_enabled = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


def autocast_off(device_type: str):
    """A context in which torch's autocast for `device_type` is off, or a null context where it is off already
    (one C call while autocast is off everywhere): for torch ops that must not be cast, e.g. the float32 product
    of matmul's reference, whose operands fusedops.matmul has cast already, or an op that stands in for code
    that autocast does not touch (a patched transformers RMSNorm)."""
    if (_any_autocast_enabled() and torch.amp.is_autocast_available(device_type)
            and torch.is_autocast_enabled(device_type)):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def backward_runs_torch(grad: torch.Tensor) -> bool:
    """Whether a backward computes its gradients with torch ops instead of the kernels: while torch.compile
    traces it (the backward of an op that ran eagerly, traced by compiled autograd or by a torch.compile'd
    training step that calls backward: dynamo cannot trace a kernel launch, and tracing into the interpreter
    crashed it; torch's ops are traced into its graph), under vmap (`vmapped`), for a dual incoming gradient
    (`dual`: forward-over-reverse, whose tangent the kernels would drop), for one the kernels would misread
    (the negative bit of a lazily negated view; not strided) or while a torch mode is active
    (`torch_modes_active`: a FlopCounterMode around the backward counts it). (is_compiling first: the checks
    after it are C calls dynamo cannot trace.)"""
    return (torch.compiler.is_compiling() or vmapped(grad) or dual(grad) or torch_modes_active()
            or (isinstance(grad, torch.Tensor) and (grad.is_neg() or grad.layout is not torch.strided)))


def dual(grad) -> bool:
    """Whether `grad` is a dual tensor of forward-mode AD with a tangent at the current level (one attribute
    read when no dual level is active)."""
    return (_forward_ad._current_level >= 0 and isinstance(grad, torch.Tensor)
            and _forward_ad.unpack_dual(grad).tangent is not None)


def vmapped(grad: torch.Tensor) -> bool:
    """Whether a backward's incoming gradient `grad` comes from a vmap over the backward, which the kernels
    cannot read (a batched tensor has no storage: "Cannot access data pointer"):
    - torch.autograd.grad(..., is_grads_batched=True), torch.autograd.functional.jacobian / hessian(...,
      vectorize=True) and gradcheck(check_batched_grad=True) run the backward under torch's legacy vmap:
      `grad` is a legacy batched tensor, and no functorch transform is active;
    - torch.func.vmap over torch.autograd.grad of a graph recorded outside it, or any other functorch
      transform active during the backward: `grad` may be one of its wrappers.
    Costs about 0.3 us (two C calls) per backward; the saved tensors need no check, as the forwards run
    only outside transforms (fusedops.functional sends the ops under a transform to torch)."""
    return _transforms_active() or _IS_LEGACY_BATCHED(grad)


def once_differentiable(backward: Callable) -> Callable:
    """torch.autograd.function.once_differentiable, free in a backward that is not recorded; recorded
    (create_graph=True), the gradients it returns raise RuntimeError when differentiated."""

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        if not torch.is_grad_enabled():
            return backward(ctx, *grads)
        message = double_backward_message(ctx)
        if any(vmapped(g) or dual(g) for g in grads if isinstance(g, torch.Tensor)):
            # The backward runs torch's ops (backward_runs_torch), recorded: differentiable in the incoming
            # gradient (vmap, jvp, jacrev over it), and a batched or dual gradient could not be detached and
            # wrapped below. But they read statistics the kernels saved without a graph (mean, rstd, a
            # pre-activation): a derivative in the op's inputs must raise, so every gradient also carries a
            # zero that depends on them through the error node (an empty slice's sum: 0 whatever they hold).
            return _with_error_anchor(ctx, backward(ctx, *grads), message)
        with torch.no_grad():
            outputs = backward(ctx, *grads)
        single = not isinstance(outputs, tuple)
        outputs = (outputs,) if single else outputs
        # The gradients depend on the saved inputs too, so they raise whatever the incoming ones need; the
        # error node also takes the saved tensors that require grad, so that differentiating a gradient
        # with respect to the op's input (torch.autograd.grad(g, x)) reaches it and raises, rather than
        # finding x unused (None with allow_unused: a silent zero second derivative), and the incoming
        # gradients that require grad, which the gradients are linear in: differentiating them with respect
        # to those (the double-vjp trick of torch.autograd.functional.jvp, pytorch#145356) must raise too,
        # not find them unused (jvp then returned zeros)
        saved = _saved_requiring_grad(ctx)
        incoming = [g for g in grads if isinstance(g, torch.Tensor) and g.requires_grad]
        delayed = _DelayedError(message, len(outputs) + len(saved) + len(incoming))(
            *[t.detach().requires_grad_() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
              for t in outputs], *saved, *incoming)
        delayed = (delayed if isinstance(delayed, tuple) else (delayed,))[:len(outputs)]
        return delayed[0] if single else delayed

    return wrapper


def _saved_requiring_grad(ctx) -> list:
    """The tensors a backward's context saved that require grad: what its error node connects to."""
    return [t for t in ctx.saved_tensors if isinstance(t, torch.Tensor) and t.requires_grad]


def _with_error_anchor(ctx, outputs, message: bytes):
    """`outputs` (a backward's gradients), each floating one plus a zero whose gradient in the saved tensors
    that require grad raises the double-backward error `message`."""
    saved = _saved_requiring_grad(ctx)
    if not saved:
        return outputs
    delayed = _DelayedError(message, len(saved))(*saved)
    delayed = delayed if isinstance(delayed, tuple) else (delayed,)
    zero = sum(t.flatten()[:0].sum() for t in delayed)
    single = not isinstance(outputs, tuple)
    anchored = tuple(o + zero.to(o.dtype) if isinstance(o, torch.Tensor) and o.is_floating_point() else o
                     for o in ((outputs,) if single else outputs))
    return anchored[0] if single else anchored


_DelayedError = torch._C._functions.DelayedError


def double_backward_message(ctx) -> bytes:
    """The error of differentiating the gradients that the backward of `ctx` (an autograd Function's
    context) returns, naming the ops of that Function (its OPS, e.g. "fusedops.softmax / log_softmax")."""
    function = getattr(ctx, "_forward_cls", None)
    ops = getattr(function, "OPS", None) or getattr(function, "__name__", "a fusedops op")
    return (f"trying to differentiate twice a fusedops op ({ops}): its backward is a kernel, which cannot be "
            "differentiated again (double backward, create_graph=True); use the torch op for higher-order "
            "gradients").encode()
