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
- `once_differentiable(backward)`: torch's decorator of that name, whose no_grad context and checks
  run only when the backward is itself recorded (create_graph=True, grad mode on), which is the only
  case they change anything: a second differentiation then raises torch's error.
- `call_backward_directly(cls)`: the autograd engine calls `cls.backward` itself, not through the
  Python method torch's backward node class puts in between (`BackwardCFunction.apply`, which looks the
  backward up anew and checks for `vjp` on every call: ~1 us of a step's backward, measured on the CPU
  as `torch.autograd.grad` of a trivial Function, 28.1 -> 27.1 us).
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch.autograd import function as _function

_FUNCTION_BASE_APPLY = getattr(getattr(torch._C, "_FunctionBase", None), "__dict__", {}).get("apply")
_TRANSFORMS_ACTIVE = getattr(torch._C, "_are_functorch_transforms_active", None)
_UNWRAP_IF_DEAD = getattr(getattr(torch._C, "_functorch", None), "unwrap_if_dead", None)
_BACKWARD_NODE_APPLY = getattr(_function, "BackwardCFunction", None) and _function.BackwardCFunction.apply


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


def once_differentiable(backward: Callable) -> Callable:
    """torch.autograd.function.once_differentiable, free in a backward that is not recorded."""
    recorded = _function.once_differentiable(backward)

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        if torch.is_grad_enabled():     # create_graph=True: torch's wrapper makes double backward raise
            return recorded(ctx, *grads)
        return backward(ctx, *grads)

    return wrapper


def call_backward_directly(cls) -> None:
    """Make the autograd engine call `cls.backward(ctx, *grads)` (cls: a torch.autograd.Function with a
    `backward`, no `vjp`) as its backward node's `apply`, the method the engine calls (a node is an
    instance of `cls._backward_cls`, the class torch makes for cls), in place of torch's, which only
    finds `cls.backward` and calls it. Changes nothing on a torch whose node class differs (no
    `_backward_cls`, another `apply`, a Function that asks for boxed gradients); torch.compile's
    compiled autograd calls `cls.backward` itself either way. `cls.backward` is read now: set it first."""
    node_class = getattr(cls, "_backward_cls", None)
    if (_BACKWARD_NODE_APPLY is None or node_class is None or node_class.apply is not _BACKWARD_NODE_APPLY
            or cls.vjp is not _function.Function.vjp or getattr(cls, "boxed_grads_call", False)):
        return
    node_class.apply = cls.backward     # a plain function: the node (ctx) is its first argument
