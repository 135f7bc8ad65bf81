"""The public ops: `fusedops.softmax(x, dim)`, ... with torch's semantics (re-exported lazily by
fusedops/__init__.py).

Each op checks its arguments the way torch does, then routes: CUDA tensors of the dtypes the
kernels support run the fusedops kernels (through their autograd Function when a gradient is
needed); CPU tensors run the native torch op, unless FUSEDOPS_INTERPRET=1, in which case the
kernels run in the NumPy interpreter (how the CPU test tier exercises them). Anything else (other
devices, float64 on CUDA) falls back to the native torch op.

While torch.compile traces (`torch.compiler.is_compiling()`), the kernel path calls the custom
operators of fusedops/library.py (`torch.ops.fusedops.*`) instead, so the graph has no breaks; eager
calls launch the kernels directly (a custom-op dispatch costs ~20 us of host time). Autocast follows
torch's lists (`library.autocast_dtype`): under CUDA autocast softmax, log_softmax, layer_norm and
(with torch 2.12 or later, as torch) rms_norm run in float32 and matmul and scaled_dot_product_attention
in the autocast dtype.
"""

from __future__ import annotations

import operator
from typing import Optional

import torch
import torch.autograd.forward_ad as _forward_ad
from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor as _FunctionalTensor

from fusedops import library as _library
from fusedops.library.common import matmul_runs_kernels, runs_kernels, wrap_dim
from fusedops.autograd import matmul as _matmul
from fusedops.autograd import matmul_reference as _matmul_reference
from fusedops.autograd.function_host import torch_modes_active
from fusedops.autograd import norms as _norms
from fusedops.autograd import softmax as _softmax_autograd

# torch._C._is_any_autocast_enabled (private; torch >= 2.4): autocast on for CPU, CUDA or another of
# torch's usual devices. Without it, the answer that sends _autocast_dtype to its full check.
_any_autocast_enabled = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)
_STRIDED = torch.strided


# torch.func transforms (vmap, grad, jacrev, ...) pass wrapped tensors without storage, which the kernels
# cannot read: while one is active every op runs torch's (torch._C's check costs ~0.1 us).
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)


_is_compiling = torch.compiler.is_compiling
# The tensor types the ops take while a graph is traced: plain tensors and parameters (what dynamo sees), and the
# fake and functional tensors that torch.export's non-strict tracing runs the Python code on.
_TRACED_TENSOR_TYPES = frozenset((torch.Tensor, torch.nn.Parameter, _FakeTensor, _FunctionalTensor))
# torch.jit.is_tracing without its Python wrapper (~0.1 us instead of ~0.25 us; it is on every call's path).
_is_jit_tracing = torch._C._is_tracing


def needs_torch(*tensors) -> bool:
    """Whether tensors among `tensors` (None and non-tensors are skipped) hold what the kernels, which read
    plain strided memory, would get wrong, so that torch's op runs instead: a tensor subclass (FakeTensor
    of a FakeTensorMode, ...; nn.Parameter is plain), a sparse or nested tensor, the negative bit (a view whose
    memory reads negated, e.g. `z.conj().imag`), or a dual tensor of forward-mode AD (its tangent). Also
    while torch.jit.trace runs: a trace records torch's ops only (a kernel launch would be left out of it,
    and sizes are 0-d tensors then), and while a torch dispatch or function mode is active (but
    torch.device's). While torch.compile or torch.export traces, the custom ops take plain tensors (and the
    fake tensors of export's tracing), but a dual level of forward-mode AD (the custom ops have no
    forward-mode formula, torch's ops do) or a tensor subclass still runs torch's op, as in eager: a DTensor of
    tensor parallelism, say, has no sharding rule for the custom ops ("no sharding strategy registered")."""
    if _is_compiling():
        return _forward_ad._current_level >= 0 or any(
            type(t) not in _TRACED_TENSOR_TYPES and isinstance(t, torch.Tensor) for t in tensors)
    if _is_jit_tracing() or torch_modes_active():
        return True
    dual = _forward_ad._current_level >= 0
    for t in tensors:
        cls = type(t)
        if cls is torch.Tensor or cls is torch.nn.Parameter:
            if (t.layout is not _STRIDED or t.is_nested or t.is_neg()
                    or (dual and _forward_ad.unpack_dual(t).tangent is not None)):
                return True
        elif t is not None and isinstance(t, torch.Tensor):
            return True
    return False


# The routing rules, shared with the custom operators (module attributes: tests patch them here).
_runs_kernels = runs_kernels
_matmul_runs_kernels = matmul_runs_kernels


def _autocast_dtype(op: str, x: torch.Tensor) -> Optional[torch.dtype]:
    """_library.autocast_dtype(op, x's device type), asked only when autocast is on for that device
    type (cheaper: x.device.type costs ~0.4 us, is_cuda ~0.1 us; the policy lookup ~0.5 us). Whether
    autocast is on for any of torch's usual device types (CPU and CUDA among them) is one call without
    arguments to parse, a quarter of torch.is_autocast_enabled(device_type)."""
    if not _any_autocast_enabled() and (x.is_cuda or x.device.type == "cpu"):
        return None
    device_type = "cuda" if x.is_cuda else x.device.type
    if device_type in ("cuda", "cpu") and not torch.is_autocast_enabled(device_type):
        return None
    return _library.autocast_dtype(op, device_type)


def normalize_dim(name: str, dim, ndim: int) -> int:
    """`dim` in [0, max(ndim, 1)), torch's way: a 0-d tensor has one dim (-1 or 0).

    Raises TypeError for a non-integer dim and IndexError, with torch's message, out of range.
    """
    try:
        # torch rejects a bool dim (operator.index would take it as 0 or 1) and a tensor of one or more dims
        if isinstance(dim, bool) or (isinstance(dim, torch.Tensor) and dim.dim() != 0):
            raise TypeError
        dim = operator.index(dim)
    except TypeError:
        raise TypeError(f"{name}(): argument 'dim' must be int, not {type(dim).__name__}") from None
    return wrap_dim(dim, ndim)


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
        A contiguous tensor shaped like `input`, as torch's. A row of only -inf gives NaN, like torch.
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
    if _transforms_active() or needs_torch(input) or (type(dim) is not int and torch.compiler.is_compiling()):
        # (under torch.compile a NumPy integer made in the compiled code is a traced tensor, which the checks
        # below would read back into an int: a graph break; torch's op takes it in the graph)
        return (torch.log_softmax if log else torch.softmax)(input, dim, dtype=dtype)
    # Arguments laid out like ones that took the kernel path before (without autocast, an int dim) need
    # neither checks nor routing.
    if type(dim) is int and not torch.compiler.is_compiling() and not _any_autocast_enabled():
        launches = _softmax_autograd.known_launches(input, dim, dtype, log)
        if launches is not None:
            return _softmax_autograd.softmax(input, launches)
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"fusedops.{name}(): argument 'input' must be a torch.Tensor, not {type(input).__name__}")
    if dtype is float:              # torch's argument parser maps the Python type to float64
        dtype = torch.float64
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"fusedops.{name}(): argument 'dtype' must be a floating-point torch.dtype, got {dtype!r}")
    in_dtype = input.dtype
    if dtype is None and not in_dtype.is_floating_point:
        raise TypeError(f"fusedops.{name}(): argument 'input' must be a floating-point tensor, got {in_dtype}; "
                        "pass dtype=torch.float32 to cast it first")
    given, ndim = (dim, dtype), input.dim()
    if type(dim) is int and 0 <= dim < ndim:
        pass                        # the common case, checked without a call
    elif type(dim) is int and -ndim <= dim < 0:
        dim += ndim
    else:
        dim = normalize_dim(name, dim, ndim)
    if dtype is None and in_dtype != torch.float64:
        dtype = _autocast_dtype(name, input)    # float32 under CUDA autocast, as torch
    out_dtype = dtype or in_dtype
    if dtype is not None and dtype != in_dtype and (in_dtype, dtype) not in _EXACT_UPCASTS:
        input = input.to(dtype)     # torch casts first; only exact upcasts are fused into the kernel
        in_dtype, given = dtype, None
    if not _runs_kernels(input, in_dtype, out_dtype):
        native = torch.log_softmax if log else torch.softmax
        return native(input, dim, dtype=dtype)
    if torch.compiler.is_compiling():   # a custom op in the graph (fusedops/library.py)
        return _library.softmax(input, dim, out_dtype if out_dtype != in_dtype else None, log=log)
    if ndim == 0:
        return _softmax(name, input.reshape(1), 0, dtype, log=log).reshape(())
    remember = given is not None and type(given[0]) is int and not _any_autocast_enabled()
    launches = _softmax_autograd.kernel_launches(input, dim, out_dtype if out_dtype != in_dtype else None, log,
                                                 given if remember else None)
    return _softmax_autograd.softmax(input, launches)


# ------------------------------------------------------------------------------------------------
# layer_norm, rms_norm
# ------------------------------------------------------------------------------------------------
def layer_norm(input: torch.Tensor, normalized_shape, weight: Optional[torch.Tensor] = None,
               bias: Optional[torch.Tensor] = None, eps: float = 1e-5) -> torch.Tensor:
    """Layer normalization over the trailing dims `normalized_shape`, like
    `torch.nn.functional.layer_norm`: (x - mean) / sqrt(var + eps) * weight + bias, with the biased
    variance, per row of the flattened leading dims.

    Args:
        input: float16/bfloat16/float32/float64 tensor whose trailing dims equal normalized_shape, any
            strides (expanded and transposed inputs are read in place where the flattened rows have one
            stride; otherwise copied once).
        normalized_shape: an int or a sequence of ints.
        weight, bias: tensors shaped normalized_shape with input's dtype, or None (each independently);
            on the CPU, as torch's CPU kernel, float32 ones with a float16/bfloat16 input.
        eps: added to the variance; statistics are float32 (float64 for float64 input).
    Returns:
        A contiguous tensor shaped and typed like input.
    Raises:
        TypeError: input not floating, or weight/bias dtype differs from input's (named in the message;
            torch's CUDA kernel rejects that too; the CPU's mixed case above excepted).
        ValueError: empty normalized_shape, mismatched shapes, parameters on another device.

    fp16/bf16/fp32 CUDA tensors run the fusedops kernels (forward, and backward when a gradient is
    needed, with deterministic dweight/dbias); float64 on CUDA and CPU tensors run torch's op, unless
    FUSEDOPS_INTERPRET=1 runs the kernels in the interpreter. Under CUDA autocast the inputs are cast to
    float32 first and the result is float32, as torch's autocast does for layer_norm.
    """
    if _transforms_active() or needs_torch(input, weight, bias):
        return torch.nn.functional.layer_norm(input, _norms.normalized_shape_tuple(normalized_shape), weight, bias, eps)
    # CUDA autocast runs layer_norm in float32 (it is on torch's "autocast to float32" list).
    autocast = _autocast_dtype("layer_norm", input) if isinstance(input, torch.Tensor) else None
    if autocast is not None:
        input, weight, bias = (_library.autocast_cast(t, autocast) for t in (input, weight, bias))
    # Arguments laid out like ones that took the kernel path before need neither checks nor routing.
    known = None if torch.compiler.is_compiling() else _norms.known_launches(
        "layer_norm", input, normalized_shape, weight, bias, eps)
    if known is None:
        shape = _norms.check_layer_norm_arguments(input, normalized_shape, weight, bias)
        if not _runs_kernels(input, input.dtype):
            return torch.nn.functional.layer_norm(input, shape, weight, bias, eps)
        if torch.compiler.is_compiling():
            return _library.layer_norm(input, shape, weight, bias, _norms.eps_number("layer_norm", eps))
        known = _norms.kernel_launches("layer_norm", input, shape, weight, bias, eps)
    return _norms.normalize(input, weight, bias, *known)


def rms_norm(input: torch.Tensor, normalized_shape, weight: Optional[torch.Tensor] = None,
             eps: Optional[float] = None) -> torch.Tensor:
    """Root-mean-square normalization over the trailing dims `normalized_shape`, like
    `torch.nn.functional.rms_norm`: x / sqrt(mean(x^2) + eps) * weight.

    Args:
        input: as for layer_norm.
        normalized_shape: an int or a sequence of ints.
        weight: a tensor shaped normalized_shape of any floating dtype, or None. An integer or bool weight,
            which torch also takes, is converted to float32 (float64 for a float64 input) first.
        eps: None means what torch uses: the machine epsilon of the accumulation dtype (float32's for
            float16/bfloat16/float32 input, float64's for float64 input).
    Returns:
        A contiguous tensor shaped and typed like input (whatever weight's dtype).
    Raises:
        TypeError: input neither floating nor complex, or a complex weight of a real input. ValueError: as
        for layer_norm.

    Dispatch as for layer_norm (a float64 weight of a float16/bfloat16/float32 input runs torch's op on
    every device, the interpreter's included: its weight gradient is summed in float64); a complex input runs
    torch's op (which takes it).
    """
    if (_transforms_active() or needs_torch(input, weight)
            or (isinstance(input, torch.Tensor) and input.is_complex())):
        return torch.nn.functional.rms_norm(input, _norms.normalized_shape_tuple(normalized_shape), weight, eps)
    # float32 under CUDA autocast, as torch
    autocast = _autocast_dtype("rms_norm", input) if isinstance(input, torch.Tensor) else None
    if autocast is not None:
        input, weight = (_library.autocast_cast(t, autocast) for t in (input, weight))
    # Arguments laid out like ones that took the kernel path before need neither checks nor routing.
    known = None if torch.compiler.is_compiling() else _norms.known_launches(
        "rms_norm", input, normalized_shape, weight, None, eps)
    if known is None:       # (an integer weight is never remembered: it is converted here, each call)
        if isinstance(weight, torch.Tensor) and not (weight.dtype.is_floating_point or weight.dtype.is_complex):
            weight = weight.to(torch.float64 if getattr(input, "dtype", None) == torch.float64 else torch.float32)
        shape = _norms.check_rms_norm_arguments(input, normalized_shape, weight)
        dtypes = (input.dtype,) if weight is None else (input.dtype, weight.dtype)
        # a float64 weight of a narrower input: torch's op on every device (its dweight is a float64 sum of
        # float64 products; the kernels' partial sums are in the statistics' float32)
        wide_weight = weight is not None and weight.dtype == torch.float64 and input.dtype != torch.float64
        if wide_weight or not _runs_kernels(input, *dtypes):
            return torch.nn.functional.rms_norm(input, shape, weight, eps)
        if torch.compiler.is_compiling():
            eps = _norms.default_rms_norm_eps(input.dtype) if eps is None else _norms.eps_number("rms_norm", eps)
            return _library.rms_norm(input, shape, weight, eps)
        known = _norms.kernel_launches("rms_norm", input, shape, weight, None, eps)
    return _norms.normalize(input, weight, None, *known)


# ------------------------------------------------------------------------------------------------
# matmul (with a fused epilogue)
# ------------------------------------------------------------------------------------------------
def matmul(input: torch.Tensor, other: torch.Tensor, bias: Optional[torch.Tensor] = None,
           activation: Optional[str] = None, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """activation(input @ other + bias) in one kernel, with torch.matmul's arguments and shape rules.

    Args:
        input: (..., M, K) or (K,); other: (..., K, N) or (K,); one dtype; the batch dims broadcast
            (a 2-D operand is shared by every batch without a copy); any strides: transposed and
            strided views are read in place. Any M, N, K >= 0 (K = 0 gives activation(bias), or 0).
        bias: (N,) tensor of any floating dtype, added in float32, or None.
        activation: None, "relu", "gelu" (erf), "gelu_tanh" or "silu", applied in float32.
        out_dtype: the result dtype (default input's), a floating dtype: float16, bfloat16 or float32 on the
            kernel path (a float64 out_dtype of 16-bit operands takes torch's ops on CUDA: the float32 sum,
            converted).
    Returns:
        A contiguous tensor of shape broadcast(batch) + (M, N) (dims of 1-D operands dropped).
    Raises:
        TypeError: non-tensor operands or bias, mismatched operand dtypes, bool operands, a bias,
        activation or out_dtype with integer or complex operands, a non-floating bias or out_dtype.
        ValueError: shapes that do not multiply (K, or batch dims that do not broadcast), a bias that is
        not a 1-D tensor of N elements on the operands' device, an unknown activation, operands on two
        devices.

    float16/bfloat16 CUDA tensors run the fusedops kernel (tensor cores, fp32 accumulation;
    autograd through fusedops.autograd.matmul.MatmulFunction). Other CUDA dtypes and CPU tensors
    run torch ops, unless FUSEDOPS_INTERPRET=1 runs the kernel in the interpreter (any float dtype);
    integer and complex operands take torch.matmul's product in their own dtype. Under autocast (CUDA or
    CPU) floating operands and bias other than float64 are cast to the autocast dtype first, as torch.matmul's
    autocast casts them, on every route (under torch.func transforms, torch modes and tensor subclasses too):
    the result is in that dtype (or out_dtype), its product summed in float32 and rounded once.
    """
    a, b = input, other
    autocast = _autocast_dtype("matmul", a) if isinstance(a, torch.Tensor) else None
    if autocast is not None:    # the autocast dtype (float16/bfloat16), as torch.matmul; torch's route too
        a, b, bias = (_library.autocast_cast(t, autocast) for t in (a, b, bias))
    if _transforms_active() or needs_torch(a, b, bias):
        if not (isinstance(a, torch.Tensor) and a.is_nested):     # (the checks read a's shape)
            _matmul_reference.check_arguments(a, b, bias, activation, out_dtype)
        return _matmul_reference.reference(a, b, bias, activation, out_dtype)
    # Arguments laid out like ones that took the kernel path before need neither checks nor routing.
    products = None if torch.compiler.is_compiling() else _matmul.known_products(a, b, bias, activation, out_dtype)
    if products is None:
        _matmul_reference.check_arguments(a, b, bias, activation, out_dtype)
        if not _matmul_runs_kernels(a, out_dtype, bias):
            return _matmul_reference.reference(a, b, bias, activation, out_dtype)
        if torch.compiler.is_compiling():
            return _library.matmul(a, b, bias, activation, out_dtype)
        products = _matmul.kernel_products(a, b, bias, activation, out_dtype)
    return _matmul.multiply(a, b, bias, activation, out_dtype, products)


# ------------------------------------------------------------------------------------------------
# scaled_dot_product_attention (flash attention)
# ------------------------------------------------------------------------------------------------
def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> torch.Tensor:
    """softmax(query @ key^T * scale + mask) @ value, like `torch.nn.functional.scaled_dot_product_attention`.

    Args:
        query: (..., H, L, E); key: (..., H_kv, S, E); value: (..., H_kv, S, Ev); one floating dtype,
            any strides (transposed and expanded views are read in place); the batch dims broadcast, and
            so do the heads unless enable_gqa. Any L, S >= 0 (S = 0 gives zeros, like torch).
        attn_mask: None, a boolean mask (True = take part in attention) or an additive float mask
            (float32 or query's dtype), broadcastable to (..., H, L, S). Rows whose every key is masked
            give 0 (as torch does) with zero, finite gradients. A boolean mask's False keys are dropped
            from the softmax, so a NaN or inf in their q . k does not reach the output (pytorch#101967),
            where torch's math backend adds -inf and gives NaN; their values still meet P = 0 in P @ V (a
            NaN value there gives NaN, as in torch). An additive -inf is added, as in torch.
        dropout_p: must be 0.0 where the fusedops kernels run (NotImplementedError otherwise).
        is_causal: a causal mask aligned to the top-left corner, as torch's: query i attends to keys
            j <= i, also when L != S. May be combined with attn_mask (both apply).
        scale: the softmax scale, default 1 / sqrt(E).
        enable_gqa: grouped-query attention: H_kv divides H, query head h uses key/value head
            h // (H // H_kv). As torch, key and value may have different head counts (each dividing H);
            torch's op runs that case.
    Returns:
        A tensor of shape (..., H, L, Ev) in query's dtype.
    Raises:
        RuntimeError: torch's errors (mismatched dtypes, devices, head dims or sequence lengths; a mask
            of another dtype; heads that do not divide). NotImplementedError: dropout_p > 0 on the
            kernel path.

    float16/bfloat16 CUDA tensors with head dims up to 256 run the flash-attention kernels (forward
    and backward, see fusedops/kernels/attention.py; the backward is deterministic except dQ for head
    dims <= 64 without attn_mask, whose float32 sums take atomic reductions in a varying order, as
    FlashAttention-2's do, unless torch.use_deterministic_algorithms(True) is in force); CPU tensors,
    float32/float64 on CUDA, larger head dims and a mask that requires grad run torch's op, unless
    FUSEDOPS_INTERPRET=1 runs the kernels in the interpreter (any float dtype). (A graph traced with a dynamic
    head dim holds fusedops' operator, which computes larger head dims with its math attention: torch.compile and
    torch.export do not guard the head dim.) Under autocast (CUDA or CPU) query, key, value and a float mask
    are cast to the autocast dtype first, as torch's autocast does for this op.
    """
    from fusedops.autograd import attention as _attention

    if _transforms_active() or needs_torch(query, key, value, attn_mask):
        return _attention.torch_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    autocast = _autocast_dtype("scaled_dot_product_attention", query) if isinstance(query, torch.Tensor) else None
    if autocast is not None:
        query, key, value, attn_mask = (_library.autocast_cast(t, autocast) for t in (query, key, value, attn_mask))
    if torch.compiler.is_compiling():   # a custom op in the graph (fusedops/library.py)
        return _library.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                                     enable_gqa)
    return _attention.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                                   enable_gqa)


# ------------------------------------------------------------------------------------------------
# torch.fx: the public ops are leaf functions
# ------------------------------------------------------------------------------------------------
PUBLIC_OPS = ("softmax", "log_softmax", "layer_norm", "rms_norm", "matmul", "scaled_dot_product_attention")


def _register_fx_leaves() -> None:
    """Make the public ops leaves of torch.fx.symbolic_trace: a call with a Proxy argument is recorded as one
    call_function node (target: the op here) instead of being traced through (the ops branch on shapes and
    dtypes, which a Proxy cannot answer), so a traced graph runs the fusedops op.

    torch.fx.wrap(name) registers `name` in the globals of the module whose top level calls it, and while
    symbolic_trace runs replaces it there with a recording wrapper: calls that look the name up in that
    namespace are recorded (`functional.softmax(x)` from fusedops.nn, `fusedops.functional.softmax(x)`), while
    a reference taken before (`from fusedops.functional import softmax`) calls the op itself. So the names
    are registered in this module and in the package, whose lazily exported `fusedops.softmax`, ... are
    bound here first; each wrap call is top-level code run in that namespace (exec, with its own locals so
    that nothing else lands in it), since wrap refuses calls from inside a function.
    """
    import fusedops as package

    for name in PUBLIC_OPS:
        op = globals()[name]
        if package._LAZY_EXPORTS.get(name) != f"{__name__}:{name}":
            continue
        setattr(package, name, op)
        for namespace in (globals(), vars(package)):
            exec(compile(f"wrap({name!r})", "<fusedops.functional>", "exec"), namespace, {"wrap": torch.fx.wrap})


_register_fx_leaves()
