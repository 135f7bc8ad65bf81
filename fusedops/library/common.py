"""What the operator modules of fusedops.library share: the namespace, the names of the operators that
public functions route to, and the routing rule that picks an implementation per call (the same rule
as fusedops.functional's)."""

from __future__ import annotations

import contextlib
import inspect
from typing import Callable, List, Optional, Sequence

import torch
from torch.autograd import forward_ad as _forward_ad

from fusedops.dsl.runtime import knobs
from fusedops.kernels.allocation import alias

NAMESPACE = "fusedops"
# The operators that public functions route to (backward operators are internal).
OPS = ("softmax", "log_softmax", "layer_norm", "rms_norm", "matmul", "scaled_dot_product_attention")

KERNEL_DTYPES = frozenset((torch.float16, torch.bfloat16, torch.float32))
# The float dtypes the interpreter runs the kernels in (FUSEDOPS_INTERPRET=1, CPU tensors); others (float8)
# take torch's op, as they do on CUDA.
INTERPRETER_DTYPES = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))


@torch.compiler.assume_constant_result
def interpret_enabled() -> bool:
    """knobs.interpret_enabled(), read once per compiled graph: torch.compile treats the result as a
    constant instead of tracing the environment lookup (a graph compiled without FUSEDOPS_INTERPRET
    keeps its routing if the variable changes later; torch._dynamo.reset() recompiles)."""
    return knobs.interpret_enabled()


def runs_kernels(x: torch.Tensor, *dtypes: torch.dtype) -> bool:
    """The routing rule of fusedops.functional: CUDA tensors of the kernels' dtypes, or CPU tensors of the
    interpreter's under FUSEDOPS_INTERPRET=1."""
    if x.is_cuda:
        return KERNEL_DTYPES.issuperset(dtypes)
    return x.device.type == "cpu" and INTERPRETER_DTYPES.issuperset(dtypes) and interpret_enabled()


MATMUL_DTYPES = frozenset((torch.float16, torch.bfloat16))
# The bias dtypes the matmul kernels read (any other floating bias, float8, takes torch's route: the kernels
# have no pointer type for it).
MATMUL_BIAS_DTYPES = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))


def matmul_runs_kernels(a: torch.Tensor, out_dtype: Optional[torch.dtype], bias: Optional[torch.Tensor]) -> bool:
    """The routing rule of fusedops.matmul and its operator: float16/bfloat16 CUDA operands with a kernel
    output dtype and a bias (or None) of MATMUL_BIAS_DTYPES; on the CPU under FUSEDOPS_INTERPRET=1, operands,
    output and bias of the interpreter's float dtypes."""
    out = out_dtype or a.dtype
    if a.is_cuda:
        return (a.dtype in MATMUL_DTYPES and out in KERNEL_DTYPES
                and (bias is None or bias.dtype in MATMUL_BIAS_DTYPES))
    return (a.device.type == "cpu" and interpret_enabled()
            and INTERPRETER_DTYPES.issuperset((a.dtype, out, a.dtype if bias is None else bias.dtype)))


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernels accumulate and keep statistics in: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def wrap_dim(dim: int, ndim: int) -> int:
    """`dim` (an int) in [0, max(ndim, 1)), torch's way (a 0-d tensor has one dim). Raises IndexError, with
    torch's message, out of range."""
    rank = max(ndim, 1)
    if not -rank <= dim < rank:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-rank}, {rank - 1}], but got {dim})")
    return dim % rank


def refuse_dual(op: str, *tensors: Optional[torch.Tensor]) -> None:
    """Raise RuntimeError where one of `tensors` is a dual tensor of forward-mode AD (a tangent at the current
    level): the custom operators have no forward-mode formula, and their outputs would carry no tangent (read
    as zero downstream: an exported program or a direct call of torch.ops.fusedops.*). The public functions
    run torch's ops for dual tensors (functional.needs_torch)."""
    if _forward_ad._current_level < 0:
        return
    for t in tensors:
        if isinstance(t, torch.Tensor) and _forward_ad.unpack_dual(t).tangent is not None:
            raise RuntimeError(f"torch.ops.{NAMESPACE}.{op}: a dual tensor of forward-mode AD; the operator has no "
                               "forward-mode formula (the public fusedops functions run torch's ops for dual tensors)")


def refuse_duals_at_autograd() -> None:
    """Make every custom operator of NAMESPACE run refuse_dual on its arguments at its autograd kernel too, before
    the one torch generated: torch.func.jvp / jacfwd / linearize keep the tangents in wrappers that torch unwraps
    before an operator's own kernels (which call refuse_dual), and torch's generated autograd kernel, which has no
    forward formula, runs the operator without one when nothing requires grad, so a direct call or an exported
    program under those transforms returned zero tangents silently. (torch.autograd.forward_ad's dual tensors reach
    the kernels, which refuse them already.) Called once, by fusedops.library's __init__, after every operator
    module has been imported; a torch without the names used here (torch._library's operator table and autograd
    generator) keeps its own kernels."""
    import warnings

    make_autograd_impl = getattr(getattr(torch._library, "autograd", None), "make_autograd_impl", None)
    definitions = getattr(getattr(torch._library, "custom_ops", None), "OPDEFS", None)
    if make_autograd_impl is None or definitions is None:
        return
    # (torch >= 2.9 names the override allowed; an older one may refuse it: that operator keeps its kernel)
    takes_override = "allow_override" in inspect.signature(torch.library.Library.impl).parameters
    override = {"allow_override": True} if takes_override else {}
    for qualname, op_def in list(definitions.items()):
        if qualname.partition("::")[0] != NAMESPACE:
            continue
        try:
            generated, name = make_autograd_impl(op_def._opoverload, op_def), op_def._name
        except (AttributeError, TypeError, ValueError):     # another torch's private names: keep its kernels
            return

        def autograd_kernel(keyset, *args, _generated=generated, _name=name, **kwargs):
            refuse_dual(_name, *args)
            return _generated(keyset, *args, **kwargs)

        with warnings.catch_warnings():     # torch warns (once) of the kernel replaced, as for its own overrides
            warnings.filterwarnings("ignore", message="Warning only once for all operators", category=UserWarning)
            with contextlib.suppress(RuntimeError):
                op_def._lib.impl(name, autograd_kernel, "Autograd", with_keyset=True, **override)


def recomputed_gradients(forward: Callable, inputs: Sequence[Optional[torch.Tensor]], needs: Sequence[bool],
                         grad_output: torch.Tensor) -> List[Optional[torch.Tensor]]:
    """The gradients of `forward(*inputs)` (torch's ops, recomputed inside an operator's backward) in the
    inputs whose `needs` holds, None for the others: for what the kernels' backward does not cover (a complex
    product, an attention mask that requires grad). Under create_graph (grad mode on in the backward) the
    gradients keep a graph to the inputs (a Hessian); an input the output does not use (an empty dim) gets
    zeros."""
    create_graph = torch.is_grad_enabled()
    with torch.enable_grad():
        leaves = [t if t is None or create_graph else t.detach().requires_grad_(need) for t, need in zip(inputs, needs)]
        wanted = [t for t, need in zip(leaves, needs) if need]
        grads = iter(torch.autograd.grad(forward(*leaves), wanted, grad_output, create_graph=create_graph,
                                         allow_unused=True))
    return [(_or_zeros(next(grads), t) if need else None) for t, need in zip(leaves, needs)]


def _or_zeros(grad: Optional[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(like) if grad is None else grad


def unviewed(t: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """`t` (an operator's new output) reshaped to `shape` as a tensor that is not a view: an operator's output that
    is a view (t.view(shape), even of its own shape) is, to autograd, a view made inside a custom Function, which
    may not be modified in place (`y += residual` after torch.ops.fusedops.layer_norm raised "Output 0 of ... is a
    view and is being modified inplace", where torch's op and fusedops' eager path allow it). The memory is t's
    (no copy where t.reshape(shape) is a view: a tensor over the same storage, shape and strides)."""
    shape = tuple(shape)
    if tuple(t.shape) == shape and not t._is_view():
        return t
    view = t.reshape(shape)
    if not view._is_view():     # reshape copied
        return view
    return alias(view, view.shape, view.stride())
