"""The torch.autograd.Function of layer_norm and rms_norm (kernels: fusedops/kernels/norms.py), the
argument checks that give them torch's semantics, and their kernel path (fusedops.functional calls it
once the arguments are checked; arguments laid out like earlier ones skip the checks).

The input's trailing dims (normalized_shape) are flattened into N columns and its leading dims into
M rows, read in place through one row and one column stride wherever torch could express them as a
view (else copied, kernels.norm_rows.as_rows). The forward saves x, weight, and the per-row statistics
(LayerNorm: mean and rstd; RMSNorm: rstd) in float32 (float64 for float64 inputs); the backward
recomputes xhat from them.

Dtype rules, as torch's:
- layer_norm: weight and bias must have the input's dtype. (torch's CPU kernel also accepts float32
  weight/bias with a float16/bfloat16 input, but its CUDA kernel, the one these kernels replace,
  rejects that; we reject it on every device so that a model behaves the same on both.)
- rms_norm: weight may be any floating dtype; the output has the input's dtype. eps=None means
  torch.finfo of the accumulation dtype: float32's epsilon for float16/bfloat16/float32 inputs,
  float64's for float64 (what torch computes; its documentation says finfo(x.dtype), which differs
  for 16-bit inputs).
"""

from __future__ import annotations

import math
import numbers
from typing import Optional, Sequence, Tuple

import torch

from fusedops.autograd.arguments import definitely, float_argument
from fusedops.autograd.function_host import apply_of, backward_runs_torch, once_differentiable
from fusedops.dsl.runtime.bounded_cache import BoundedCache
from fusedops.dsl.runtime.knobs import interpret_enabled
from fusedops.kernels import norms
from fusedops.kernels.norm_rows import accumulation_dtype

_FLOATING = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))
_HALF_DTYPES = frozenset((torch.float16, torch.bfloat16))


def is_size(d) -> bool:
    """An entry of a shape as torch's parser takes it: an integer (not a bool), a symbolic one (torch.SymInt,
    a size while torch.export or make_fx traces) or a 0-d integer tensor."""
    if isinstance(d, torch.Tensor):
        return d.dim() == 0 and not d.is_floating_point() and not d.is_complex() and d.dtype != torch.bool
    return (isinstance(d, numbers.Integral) and not isinstance(d, bool)) or isinstance(d, torch.SymInt)


def normalized_shape_tuple(normalized_shape) -> Tuple[int, ...]:
    """`normalized_shape` (an int or a sequence of ints, as torch.nn.LayerNorm accepts) as a tuple of ints.
    Symbolic sizes (torch.SymInt, while torch.compile, torch.export or make_fx traces) stay symbolic, as torch's
    ops take them: the kernels launch only outside tracing, with concrete sizes, and int() of a dynamic size would
    specialize it (torch.export with a dynamic normalized dim failed: "Constraints violated")."""
    if type(normalized_shape) is tuple and len(normalized_shape) == 1 and type(normalized_shape[0]) is int:
        return normalized_shape     # what torch.nn.LayerNorm holds, checked without the ABCs below
    if type(normalized_shape) is int:
        return (normalized_shape,)
    if is_size(normalized_shape) and not isinstance(normalized_shape, torch.Tensor):
        return (_size(normalized_shape),)
    if isinstance(normalized_shape, torch.Size) or isinstance(normalized_shape, Sequence):
        shape = tuple(normalized_shape)
        if all(is_size(d) for d in shape):
            return tuple(_size(d) for d in shape)
    raise TypeError(f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}")


def _size(d):
    """An entry that is_size takes, as an int (a torch.SymInt as itself)."""
    return d if isinstance(d, torch.SymInt) else int(d)


def _check_input(name: str, x, normalized_shape: Tuple[int, ...]) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"fusedops.{name}(): argument 'input' must be a torch.Tensor, not {type(x).__name__}")
    if x.dtype not in _FLOATING:
        raise TypeError(f"fusedops.{name}(): the input has dtype {x.dtype}; supported: float16, bfloat16, float32, "
                        "float64")
    if len(normalized_shape) == 0:
        raise ValueError(f"fusedops.{name}(): expected normalized_shape to be at least 1-dimensional, i.e., "
                         "containing at least one element, but got normalized_shape = []")
    rank, count = x.dim(), len(normalized_shape)
    # (`definitely`: an unbacked size of a traced graph is not compared; the operator checks it when it runs)
    if rank < count or (definitely(x.size(-1) != normalized_shape[0]) if count == 1
                        else any(definitely(a != b) for a, b in zip(x.shape[rank - count:], normalized_shape))):
        raise ValueError(f"fusedops.{name}(): given normalized_shape={list(normalized_shape)}, expected input with "
                         f"shape [*, {', '.join(map(str, normalized_shape))}], but got input of size "
                         f"{list(x.shape)}")


def _check_parameter(name: str, role: str, p: Optional[torch.Tensor], x: torch.Tensor,
                     normalized_shape: Tuple[int, ...], same_dtype: bool) -> None:
    if p is None:
        return
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"fusedops.{name}(): argument '{role}' must be a torch.Tensor or None, not "
                        f"{type(p).__name__}")
    if p.dim() != len(normalized_shape) or any(definitely(a != b) for a, b in zip(p.shape, normalized_shape)):
        raise ValueError(f"fusedops.{name}(): expected {role} to be of same shape as normalized_shape, but got "
                         f"{role} of shape {list(p.shape)} and normalized_shape = {list(normalized_shape)}")
    # get_device() is cheaper than .device, but -1 for every non-CUDA device
    device = p.get_device()
    if device != x.get_device() or (device < 0 and p.device != x.device):
        raise ValueError(f"fusedops.{name}(): {role} is on {p.device} but the input is on {x.device}")
    if same_dtype and p.dtype != x.dtype:
        raise TypeError(f"fusedops.{name}(): {role} has dtype {p.dtype} but the input has dtype {x.dtype}; they "
                        f"must be the same (torch.nn.functional.{name} rejects mixed dtypes on CUDA too; on the "
                        f"CPU it also takes a float16/bfloat16 input with float32 weight and bias): convert one "
                        f"of them")
    if not same_dtype and p.dtype not in _FLOATING:
        # (float8 is floating too, but torch's rms_norm cannot promote it either)
        raise TypeError(f"fusedops.{name}(): {role} has dtype {p.dtype}; it must be float16, bfloat16, float32 or "
                        f"float64 (input: {x.dtype}; fusedops.rms_norm converts an integer or bool weight first)")


def check_layer_norm_arguments(x, normalized_shape, weight, bias) -> Tuple[int, ...]:
    """normalized_shape as a tuple, after checking the arguments as torch does.

    Raises:
        TypeError: a non-tensor, a non-floating input, or a weight/bias whose dtype is not the input's (on
            the CPU, as torch's CPU kernel, a float16/bfloat16 input may have float32 weight and bias).
        ValueError: an empty normalized_shape, shapes that do not match, parameters on another device.
    """
    normalized_shape = normalized_shape_tuple(normalized_shape)
    _check_input("layer_norm", x, normalized_shape)
    # torch's CPU kernel also takes a 16-bit input with float32 weight and bias (its "mixed type": what
    # CPU autocast hands a LayerNorm after a bfloat16 Linear); its CUDA kernel does not.
    mixed = (x.dtype in _HALF_DTYPES and x.device.type == "cpu"
             and all(p is None or (isinstance(p, torch.Tensor) and p.dtype == torch.float32) for p in (weight, bias)))
    _check_parameter("layer_norm", "weight", weight, x, normalized_shape, same_dtype=not mixed)
    _check_parameter("layer_norm", "bias", bias, x, normalized_shape, same_dtype=not mixed)
    return normalized_shape


def check_rms_norm_arguments(x, normalized_shape, weight) -> Tuple[int, ...]:
    """normalized_shape as a tuple, after checking the arguments as torch does (weight: any floating
    dtype). Raises as check_layer_norm_arguments."""
    normalized_shape = normalized_shape_tuple(normalized_shape)
    _check_input("rms_norm", x, normalized_shape)
    _check_parameter("rms_norm", "weight", weight, x, normalized_shape, same_dtype=False)
    return normalized_shape


def default_rms_norm_eps(dtype: torch.dtype) -> float:
    """The eps torch's rms_norm uses when eps is None: the epsilon of the accumulation dtype."""
    return _FLOAT64_EPS if accumulation_dtype(dtype) == torch.float64 else _FLOAT32_EPS


_FLOAT32_EPS, _FLOAT64_EPS = torch.finfo(torch.float32).eps, torch.finfo(torch.float64).eps


def _columns(normalized_shape: Tuple[int, ...]) -> int:
    return normalized_shape[0] if len(normalized_shape) == 1 else math.prod(normalized_shape)


# -- the kernel path -------------------------------------------------------------------------------
# fusedops.layer_norm and fusedops.rms_norm check their arguments, then run
#     known = kernel_launches(op, x, normalized_shape, weight, bias, eps)   # on the kernel path
#     y = normalize(x, weight, bias, *known)
# kernel_launches remembers its result per argument layout (_KNOWN_LAUNCHES), so that a later call with
# arguments laid out the same way finds it with known_launches instead, without the checks and the
# kernels' own key (together about as costly as the rest of the forward's host work).
_KNOWN_LAUNCHES = BoundedCache(1024)
_IMMUTABLE_EPS = frozenset((float, int, type(None)))


def _argument_key(op: str, x: torch.Tensor, normalized_shape: Tuple[int, ...], weight, bias, eps) -> tuple:
    """Everything the argument checks, the kernel-path decision (fusedops.functional) and the launches
    read from the arguments of `op`: the layouts, dtypes and devices of the tensors, the shape, eps and
    the interpreter flag. Raises AttributeError / TypeError for arguments that are not tensors, and
    TypeError for an eps that is not a Python float, int or None (a 0-d tensor, which torch accepts,
    may change in place between calls: its value is read anew each time)."""
    if type(eps) not in _IMMUTABLE_EPS:
        raise TypeError("an eps that is not a Python number is not remembered")
    device = x.get_device()
    key = (op, normalized_shape, x.shape, x.stride(), x.dtype, device,
           None if weight is None else (weight.shape, weight.stride(), weight.dtype, weight.get_device()),
           None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.get_device()),
           eps, interpret_enabled())
    if device < 0:      # get_device() is -1 on every non-CUDA device: name them (the interpreter's CPU tensors)
        key += (x.device, None if weight is None else weight.device, None if bias is None else bias.device)
    return key


def eps_number(op: str, eps) -> float:
    """float(eps), or torch's TypeError naming the argument (arguments.float_argument; rms_norm's default
    None is resolved by the caller)."""
    return float_argument(f"fusedops.{op}", "eps", eps, expected="a number")


def known_launches(op: str, x, normalized_shape, weight, bias, eps) -> Optional[tuple]:
    """kernel_launches(op, ...) as remembered for arguments laid out like these, or None (arguments
    not seen before, which the caller checks and routes in full). Raises only what
    normalized_shape_tuple raises."""
    normalized_shape = normalized_shape_tuple(normalized_shape)
    try:
        return _KNOWN_LAUNCHES.get(_argument_key(op, x, normalized_shape, weight, bias, eps))
    except (AttributeError, TypeError):     # not tensors, an unhashable eps: left to the checks
        return None


def kernel_launches(op: str, x: torch.Tensor, normalized_shape, weight: Optional[torch.Tensor],
                    bias: Optional[torch.Tensor], eps) -> tuple:
    """(NormLaunches, normalized_shape as a tuple) of `op` ("layer_norm" or "rms_norm") for arguments
    that passed its checks and take the kernel path (remembered for known_launches). eps: as given
    (None: rms_norm's default). Raises TypeError for an eps that is not a number."""
    normalized_shape = normalized_shape_tuple(normalized_shape)
    eps_value = default_rms_norm_eps(x.dtype) if eps is None and op == "rms_norm" else eps_number(op, eps)
    launches = norms.norm_launches(x, weight, bias, eps_value, subtract_mean=op == "layer_norm",
                                   n_cols=_columns(normalized_shape))
    known = (launches, normalized_shape)
    try:
        _KNOWN_LAUNCHES.put(_argument_key(op, x, normalized_shape, weight, bias, eps), known)
    except TypeError:       # an unhashable eps (a float-like object): not remembered
        pass
    return known


def normalize(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
              launches: norms.NormLaunches, normalized_shape: Tuple[int, ...]) -> torch.Tensor:
    """The normalization of x by `launches` (kernel_launches): through NormFunction when a gradient
    is needed, else the forward alone. Returns y shaped like x, contiguous, in x's dtype."""
    if torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad)
                                    or (bias is not None and bias.requires_grad)):
        if x.is_inference():    # made under torch.inference_mode(): autograd may not save it, a copy it may
            x = x.clone()
        return _norm_apply(x, weight, bias, launches, normalized_shape)
    return launches.forward(x, weight, bias)[0]


class NormFunction(torch.autograd.Function):
    """forward(x, weight, bias, launches, normalized_shape) -> y: LayerNorm or RMSNorm (as `launches`,
    a kernels.norms.NormLaunches, was made) over the trailing dims of x.

    x: float16/bfloat16/float32 CUDA tensor (any floating dtype on the CPU under FUSEDOPS_INTERPRET=1),
    any strides; weight, bias: shaped normalized_shape (a tuple of ints, x's trailing dims) or None;
    the arguments are checked by the caller (check_layer_norm_arguments / check_rms_norm_arguments) and
    laid out as `launches` expects. Returns y shaped like x, contiguous, in x's dtype. Gradients: dx in
    x's dtype, dweight/dbias in theirs, deterministic. Double backward is not supported (the backward
    is a kernel): it raises RuntimeError.
    """

    OPS = "fusedops.layer_norm / rms_norm"     # named by the double-backward error

    @staticmethod
    def forward(ctx, x, weight, bias, launches, normalized_shape):
        # x is read (and saved) as is: the kernels take its rows through their strides (kernels.norm_rows)
        y, mean, rstd = launches.forward(x, weight, bias)
        # The weight's values reach only dx (g = dy * weight); dweight = sum(dy * xhat) and dbias read x and
        # the statistics alone. So, as torch's rms_norm, the weight is saved (and its version checked) only
        # where dx is wanted: a weight changed in place after the forward of an input that needs no gradient
        # does not fail the backward. The backward launch still takes the tensor (its dtype and layout):
        # then it is kept on ctx, unsaved (its values, unread, may change).
        saved_weight = weight if ctx.needs_input_grad[0] else None
        ctx.save_for_backward(x, saved_weight, mean, rstd)
        ctx.unsaved_weight = weight if saved_weight is None else None
        ctx.launches, ctx.normalized_shape = launches, normalized_shape
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        if weight is None:
            weight = ctx.unsaved_weight
        normalized_shape = ctx.normalized_shape
        if backward_runs_torch(dy):
            dx, dweight, dbias = _torch_backward(dy, x, weight, mean, rstd, ctx.launches, normalized_shape,
                                                 ctx.needs_input_grad)
        else:
            dx, dweight, dbias = ctx.launches.backward(dy, x, weight, mean, rstd, ctx.needs_input_grad)
        if len(normalized_shape) != 1:      # dweight and dbias are (N,)
            dweight = None if dweight is None else dweight.view(normalized_shape)
            dbias = None if dbias is None else dbias.view(normalized_shape)
        return dx, dweight, dbias, None, None


def reference_backward(dy, x, n_rows: int, n_cols: int, weight, mean, rstd) -> tuple:
    """The backward kernels' (dx (n_rows, n_cols), dweight (n_cols,), dbias (n_cols,)) with torch ops, in
    rstd's dtype (the kernels' accumulation dtype), from the saved x, weight, mean (None: RMSNorm) and rstd
    ((n_rows,)): xhat = (x - mean) * rstd, g = dy * weight, dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
    (no mean(g) term for RMSNorm), dweight = sum(dy * xhat), dbias = sum(dy) (means over a row's columns,
    sums over the rows). Also the custom op's fallback (library/norm_ops.py)."""
    wide = rstd.dtype
    x = x.reshape(n_rows, n_cols).to(wide)
    dy = dy.reshape(n_rows, n_cols).to(wide)
    xhat = (x if mean is None else x - mean[:, None]) * rstd[:, None]
    g = dy if weight is None else dy * weight.reshape(n_cols).to(wide)
    correction = xhat * (g * xhat).mean(1, keepdim=True)
    if mean is not None:
        correction = correction + g.mean(1, keepdim=True)
    return rstd[:, None] * (g - correction), (dy * xhat).sum(0), dy.sum(0)


def _torch_backward(dy, x, weight, mean, rstd, launches: norms.NormLaunches, normalized_shape: Tuple[int, ...],
                    needs_input_grad: tuple) -> tuple:
    """The backward kernels' (dx, dweight, dbias) by `reference_backward` (torch ops, which vmap can batch),
    for a dy the kernels cannot read (function_host.vmapped); dx shaped like x in its dtype, dweight and
    dbias (N,) in the parameters' dtypes, None where not needed."""
    rows = math.prod(x.shape[:x.dim() - len(normalized_shape)])
    dx, dweight, dbias = reference_backward(dy, x, rows, _columns(normalized_shape), weight, mean, rstd)
    return (dx.to(x.dtype).reshape(x.shape) if needs_input_grad[0] else None,
            dweight.to(weight.dtype) if needs_input_grad[1] and weight is not None else None,
            dbias.to(launches.bias_dtype) if needs_input_grad[2] else None)


# NormFunction.apply without the Python layer of torch's (function_host.py)
_norm_apply = apply_of(NormFunction, (0, 1, 2))
