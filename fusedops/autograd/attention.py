"""scaled_dot_product_attention: argument checks with torch's semantics and messages, the reshaping of
any-rank inputs to (B, H, L, E), and the autograd Function over the flash-attention kernels
(fusedops/kernels/attention.py).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from fusedops.autograd.arguments import definitely, float_argument
from fusedops.autograd.function_host import apply_of, backward_runs_torch, once_differentiable
from fusedops.dsl.runtime import knobs
from fusedops.dsl.runtime.bounded_cache import BoundedCache
from fusedops.kernels import attention as _kernels
from fusedops.library.common import INTERPRETER_DTYPES

# Masks the kernels read: boolean (True = keep) or additive float (torch also accepts float32 masks
# for float16/bfloat16 queries, and a mask of the query's dtype).
_CUDA_DTYPES = (torch.float16, torch.bfloat16)
_SDPA = "scaled_dot_product_attention"     # the name torch's argument errors give


class AttentionFunction(torch.autograd.Function):
    """o = softmax(scale * q k^T + mask) v on 4-D (B, H, L, E) / (B, H_kv, S, E) / (B, H_kv, S, Ev)
    tensors; gradients for q, k and v (a mask gets none: see `scaled_dot_product_attention`).
    `launches`: the kernels.attention.AttentionLaunches of these tensors' layouts, causal and scale
    (attention_launches). Double backward is not supported (the backward is a kernel): it raises
    RuntimeError."""

    OPS = "fusedops.scaled_dot_product_attention"     # named by the double-backward error

    @staticmethod
    def forward(ctx, q, k, v, mask, causal: bool, scale: float, launches):
        o, lse = _kernels.attention_forward(q, k, v, mask, causal, scale, launches=launches)
        ctx.save_for_backward(q, k, v, o, lse, mask)
        ctx.causal, ctx.scale, ctx.launches = causal, scale, launches
        return o

    @staticmethod
    @once_differentiable
    def backward(ctx, do):
        q, k, v, o, lse, mask = ctx.saved_tensors
        if backward_runs_torch(do):
            dq, dk, dv = _torch_backward(do, q, k, v, o, mask, ctx.causal, ctx.scale)
        else:
            dq, dk, dv = _kernels.attention_backward(do, q, k, v, o, lse, mask, ctx.causal, ctx.scale,
                                                     launches=ctx.launches, needs=tuple(ctx.needs_input_grad[:3]))
        return dq, dk, dv, None, None, None, None


def _torch_backward(do, q, k, v, o, mask, causal: bool, scale: float) -> tuple:
    """The backward kernels' (dq, dk, dv) with torch ops (which vmap can batch), for a dO the kernels
    cannot read (function_host.vmapped); shapes as AttentionFunction's. The math backward, with the
    kernels' semantics: logits S = scale q k^T masked (a boolean mask keeps True, an additive one is added,
    causal is top-left aligned, a fully masked row has P = 0), P = softmax(S) recomputed (with torch's
    softmax rather than from the kernels' lse, whose layout is theirs), delta = rowsum(dO * O),
    dS = P * (dO V^T - delta), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO, dK and dV summed over each
    key/value head's group of query heads; in the kernels' accumulation dtype (float64 for float64, else
    float32), the gradients in q's, k's and v's dtypes."""
    wide = torch.float64 if q.dtype == torch.float64 else torch.float32
    group = q.size(1) // max(k.size(1), 1)
    q_, do_ = q.to(wide), do.to(wide)
    k_, v_ = (t.to(wide).repeat_interleave(group, dim=1) for t in (k, v))    # query head h reads h // group
    s = (q_ @ k_.transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask.to(wide)
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(), -math.inf)
    empty = (s == -math.inf).all(-1, keepdim=True)     # fully masked rows: output 0, no gradient
    p = torch.softmax(s.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)
    delta = (o.to(wide) * do_).sum(-1, keepdim=True)
    ds = p * (do_ @ v_.transpose(-1, -2) - delta)
    dq = (ds @ k_) * scale
    dk = (ds.transpose(-1, -2) @ q_) * scale
    dv = p.transpose(-1, -2) @ do_
    if group != 1:
        dk, dv = (t.reshape(t.size(0), k.size(1), group, *t.shape[2:]).sum(2) for t in (dk, dv))
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# AttentionFunction.apply without the Python layer of torch's (function_host.py)
_attention_apply = apply_of(AttentionFunction, (0, 1, 2, 3))


def check_arguments(query, key, value, attn_mask, dropout_p, enable_gqa, scale=None, is_causal=False) -> None:
    """Raise torch's errors (RuntimeError, same messages where torch has one) for bad arguments; a
    dropout_p or scale that is not a number, an is_causal or enable_gqa that is not a bool, is a
    TypeError naming it, as torch's (a truthy string must not turn causal masking on)."""
    for name, flag in (("is_causal", is_causal), ("enable_gqa", enable_gqa)):
        if type(flag) is not bool:
            kind = type(flag)       # (numpy's bool is named bool too: its module says which)
            shown = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"
            raise TypeError(f"scaled_dot_product_attention(): argument '{name}' must be bool, not {shown}")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"scaled_dot_product_attention(): argument '{name}' must be Tensor, not {type(t).__name__}")
    if not (query.dtype == key.dtype == value.dtype):
        raise RuntimeError("Expected query, key, and value to have the same dtype, but got query.dtype: "
                           f"{query.dtype} key.dtype: {key.dtype} and value.dtype: {value.dtype} instead.")
    if not query.dtype.is_floating_point:
        raise RuntimeError(f"scaled_dot_product_attention(): expected a floating-point dtype, got {query.dtype}")
    device = query.get_device()     # cheaper than .device, but -1 for every non-CUDA device
    if not (device >= 0 and device == key.get_device() == value.get_device()) \
            and not (query.device == key.device == value.device):
        raise RuntimeError("Expected query, key, and value to have the same device type, but got query.device: "
                           f"{query.device} key.device: {key.device} and value.device: {value.device} instead.")
    if min(query.dim(), key.dim(), value.dim()) < 2:
        raise RuntimeError("Expected query, key, and value to all be  at least 2 dimensional, but got query.dim: "
                           f"{query.dim()} key.dim: {key.dim()} and value.dim: {value.dim()} instead.")
    if definitely(query.size(-1) != key.size(-1)):     # (`definitely`: unbacked sizes are checked when run)
        raise RuntimeError(f"Expected query and key to have the same head dim (last dim), but got "
                           f"{query.size(-1)} and {key.size(-1)}.")
    if definitely(key.size(-2) != value.size(-2)):
        raise RuntimeError(f"Expected key and value to have the same sequence length (dim -2), but got "
                           f"{key.size(-2)} and {value.size(-2)}.")
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor):
            raise TypeError(f"scaled_dot_product_attention(): argument 'attn_mask' must be Tensor, "
                            f"not {type(attn_mask).__name__}")
        if attn_mask.dtype not in (torch.bool, torch.float32, query.dtype):
            raise RuntimeError("Expected attn_mask dtype to be bool or float or to match query dtype, but got "
                               f"attn_mask.dtype: {attn_mask.dtype} and  query.dtype: {query.dtype} instead.")
        if not (device >= 0 and attn_mask.get_device() == device) and attn_mask.device != query.device:
            raise RuntimeError(f"Expected attn_mask on {query.device}, got {attn_mask.device}")
    if scale is not None:
        float_argument(_SDPA, "scale", scale)
    if not 0.0 <= float_argument(_SDPA, "dropout_p", dropout_p) <= 1.0:
        raise RuntimeError(f"dropout probability has to be between 0 and 1, but got {dropout_p}")
    if enable_gqa and query.dim() >= 3:
        # as torch: key's and value's head counts each divide query's (they may differ: see _runs_kernels)
        heads = query.size(-3)      # 0 query heads: an empty result, as torch (whatever key's and value's)
        if heads and any(h == 0 or heads % h != 0 for h in (_heads(key), _heads(value))):
            raise RuntimeError("Number of heads in key and value must divide the number of heads in query")
    _check_broadcasting(query, key, value, attn_mask, enable_gqa)


def _check_broadcasting(query, key, value, attn_mask, enable_gqa) -> None:
    """RuntimeError naming them where the batch dims (or, without enable_gqa, the heads) of query, key and
    value do not broadcast, or where attn_mask does not broadcast to the attention weights' shape
    (*batch, heads, L, S) in the rank of the highest-rank input (a mask of more dims neither)."""
    rank = max(query.dim(), key.dim(), value.dim())
    shapes = [(1,) * (max(rank, 4) - t.dim()) + tuple(t.shape) for t in (query, key, value)]
    batch = _broadcast_shapes("batch dims", *(shape[:-3] for shape in shapes))
    heads = shapes[0][-3] if enable_gqa else _broadcast_shapes("heads", *(shape[-3:-2] for shape in shapes))[0]
    if attn_mask is None:
        return
    weights = (*batch, heads, shapes[0][-2], shapes[1][-2])[-rank:]
    mask = tuple(attn_mask.shape)
    if len(mask) > rank or any(definitely(m != 1) and definitely(m != w)
                               for m, w in zip(reversed(mask), reversed(weights))):
        raise RuntimeError(f"scaled_dot_product_attention: attn_mask of shape {mask} does not broadcast to the "
                           f"attention weights' shape {weights} (batch dims, heads, L, S)")


def _broadcast_shapes(what: str, query, key, value) -> tuple:
    """torch.broadcast_shapes of query's, key's and value's int tuples of dims `what` ("batch dims",
    "heads"), without its tracing machinery (tens of microseconds).

    Raises:
        RuntimeError: the three do not broadcast, naming them and their sizes.
    """
    shapes = (query, key, value)
    ndim = max(map(len, shapes))
    result = [1] * ndim
    for shape in shapes:
        for axis, size in enumerate(shape, ndim - len(shape)):
            # (`definitely`, as torch's broadcasting decides: an unbacked size that may be 1 is taken as the size)
            if not definitely(size == 1):
                if definitely(result[axis] == 1):
                    result[axis] = size
                elif definitely(result[axis] != size):
                    hint = " (grouped-query attention: pass enable_gqa=True)" if what == "heads" else ""
                    raise RuntimeError(f"scaled_dot_product_attention: the {what} of query {tuple(query)}, key "
                                       f"{tuple(key)} and value {tuple(value)} do not broadcast{hint}")
    return tuple(result)


def _expand(t: torch.Tensor, shape: tuple) -> torch.Tensor:
    # (a view costs about a microsecond; sizes compared by `definitely`: unbacked ones are left to expand's checks)
    same = len(t.shape) == len(shape) and all(definitely(x == y) for x, y in zip(t.shape, shape))
    return t if same else t.expand(shape)


def attention_scale(query: torch.Tensor, scale: Optional[float]) -> float:
    """The logits' scale: `scale`, or 1 / sqrt(E) for query's head dim E (torch's default). With E = 0 every
    logit is 0 whatever the scale (torch gives the rows' uniform average of V), so 1.0 stands in for inf."""
    if scale is not None:
        return float(scale)
    return 1.0 / math.sqrt(query.size(-1)) if query.size(-1) > 0 else 1.0


def _as_4d(query, key, value, attn_mask, enable_gqa):
    """(q, k, v, mask, output shape): views of shape (B, H, L, E), (B, H_kv, S, E), (B, H_kv, S, Ev)
    with the batch dims broadcast (stride 0, no copy for up to 4-D inputs) and the mask expanded to
    (B, H, L, S). Inputs over 4-D have their batch dims flattened (a copy where strides do not allow)."""
    rank = max(query.dim(), key.dim(), value.dim(), 4)
    q, k, v = (t.reshape((1,) * (rank - t.dim()) + tuple(t.shape)) if t.dim() < rank else t
               for t in (query, key, value))
    batch = _broadcast_shapes("batch dims", q.shape[:-3], k.shape[:-3], v.shape[:-3])
    heads_q, heads_kv = q.size(-3), k.size(-3)
    if enable_gqa:
        heads = heads_q
        if v.size(-3) != heads_kv or heads_kv == 0 or heads_q % heads_kv:
            raise RuntimeError("Number of heads in key and value must divide the number of heads in query")
    else:
        heads = _broadcast_shapes("heads", (heads_q,), (heads_kv,), (v.size(-3),))[0]
        heads_kv = heads
    length_q, length_k = q.size(-2), k.size(-2)
    q = _expand(q, (*batch, heads, length_q, q.size(-1)))
    k = _expand(k, (*batch, heads_kv, length_k, k.size(-1)))
    v = _expand(v, (*batch, heads_kv, length_k, v.size(-1)))
    mask = None
    if attn_mask is not None:
        mask = _expand(attn_mask, (*batch, heads, length_q, length_k))    # torch's broadcasting error if not
    out_shape = (*batch, heads, length_q, v.size(-1))
    if len(batch) != 1:
        count = math.prod(batch)    # spelled out: -1 is ambiguous for 0 elements
        q, k, v = (t.reshape(count, *t.shape[-3:]) for t in (q, k, v))
        mask = None if mask is None else mask.reshape(count, *mask.shape[-3:])
    # drop the dims the caller did not have (the output has the rank of the highest-rank input)
    out_rank = max(query.dim(), key.dim(), value.dim())
    return q, k, v, mask, out_shape[len(out_shape) - out_rank:]


# The input shapes (and enable_gqa) for which _as_4d returns its inputs unchanged -> the output shape.
_UNCHANGED_BY_AS_4D = BoundedCache(256)
# (causal, scale, AttentionLaunches) of arguments that took the kernel path before as 4-D tensors that
# _as_4d left as they are, per everything check_arguments, the routing and the launches read from them
# (_argument_key): a later call with arguments laid out the same way needs neither (about half the
# forward's host work).
_KNOWN_LAUNCHES = BoundedCache(1024)
_IMMUTABLE_SCALARS = frozenset((bool, int, float, type(None)))


def _argument_key(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> tuple:
    """The layouts, dtypes and devices of the tensors, the other arguments and the interpreter flag.
    Raises AttributeError for tensors that are not tensors, TypeError for unhashable arguments and for
    dropout_p, is_causal, scale or enable_gqa not a Python bool, int, float or None (a 0-d tensor, which
    torch accepts for dropout_p and scale, may change in place between calls)."""
    if not _IMMUTABLE_SCALARS.issuperset((type(dropout_p), type(is_causal), type(scale), type(enable_gqa))):
        raise TypeError("scalar arguments that are not Python numbers are not remembered")
    device = query.get_device()
    layouts = (query.shape, query.stride(), query.dtype, device, key.shape, key.stride(), key.dtype, key.get_device(),
               value.shape, value.stride(), value.dtype, value.get_device(),
               None if attn_mask is None else (attn_mask.shape, attn_mask.stride(), attn_mask.dtype,
                                               attn_mask.get_device()),
               dropout_p, is_causal, scale, enable_gqa, knobs.interpret_enabled(),
               # the scalars' types too: 1 == True, but check_arguments refuses is_causal=1 (as torch does)
               type(dropout_p), type(is_causal), type(scale), type(enable_gqa))
    if device < 0:      # get_device() is -1 on every non-CUDA device: name them (the interpreter's CPU tensors)
        layouts += (query.device, key.device, value.device, None if attn_mask is None else attn_mask.device)
    return layouts


def _runs_kernels(query: torch.Tensor) -> bool:
    if query.is_cuda:
        return query.dtype in _CUDA_DTYPES and query.size(-1) <= _kernels.MAX_HEAD_DIM
    return (query.device.type == "cpu" and query.dtype in INTERPRETER_DTYPES and knobs.interpret_enabled()
            and query.size(-1) <= _kernels.MAX_HEAD_DIM)


def gqa_heads_differ(query, key, value, enable_gqa) -> bool:
    """Grouped-query attention whose key and value have different head counts (each dividing query's),
    which torch accepts (its math backend) and the kernels do not, or whose query has no heads (an empty
    result, whatever key's and value's head counts): torch's op runs it."""
    return bool(enable_gqa) and query.dim() >= 3 and (_heads(key) != _heads(value) or query.size(-3) == 0)


def _heads(t: torch.Tensor) -> int:
    """The head count (dim -3) of a query, key or value; 1 for a 2-D one, which has none (as _as_4d pads it:
    torch's op would raise IndexError for it under enable_gqa)."""
    return t.size(-3) if t.dim() >= 3 else 1


# The range of |scale| * log2(e) whose float32 (hi, lo) pair (kernels.attention._float_pair, how the scale
# reaches the kernels) keeps float64's 48 bits: hi finite, and lo (~2**-24 hi) a normal float32.
_FLOAT32_MAX = 3.4028234663852886e38
_PAIR_MIN = 2.0 ** -100


def scale_beyond_kernels(query, scale) -> bool:
    """A finite `scale` the kernels cannot take, so torch's op runs it: one whose base-2 factor is past
    float32's range (the kernels' pair is inf / NaN: NaN output, where torch's softmax stays finite, for every
    dtype: a float32 scale of 2.5e38 gives torch one-hot rows); for float64 also a non-zero one below
    _PAIR_MIN, where the pair keeps too few bits (a 1e-42 scale of logits ~3 was off by 2e-4)."""
    if scale is None:
        return False
    factor = abs(float(scale)) * _kernels.LOG2E     # (inf for a finite scale past float64's max / log2(e))
    if query.dtype != torch.float64:    # float32 / 16-bit: only a factor past float32's range (scale > 2.4e38)
        return math.isfinite(float(scale)) and factor >= _FLOAT32_MAX
    return math.isfinite(float(scale)) and factor != 0.0 and not _PAIR_MIN <= factor < _FLOAT32_MAX


def dropout_not_implemented(dropout_p: float) -> NotImplementedError:
    """The error for attention dropout, which the fusedops kernels do not implement."""
    return NotImplementedError(
        f"fusedops.scaled_dot_product_attention: dropout_p={dropout_p} is not implemented by the fusedops "
        "kernels; pass dropout_p=0.0 (e.g. in eval mode), or call torch.nn.functional."
        "scaled_dot_product_attention for attention dropout")


def torch_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                    enable_gqa=False):
    """torch's scaled_dot_product_attention with fusedops' semantics: an attn_mask and is_causal together
    both apply (torch refuses the pair), the causal mask folded into attn_mask (top-left aligned, as
    torch's is_causal). Fully masked rows keep torch's result there. The causal mask is folded in likewise for
    a scale <= 0 without a mask: torch's CPU flash kernel masks before it scales (-inf * 0 = NaN, -inf * -0.5 =
    +inf: NaN rows), where its math backend and the kernels give the softmax of the scaled, causally masked
    logits. Under enable_gqa, 2-D inputs (no heads dim: torch's op raises IndexError) take one head, as on the
    kernels' route."""
    squeeze = False
    if enable_gqa is True and all(isinstance(t, torch.Tensor) for t in (query, key, value)) \
            and min(query.dim(), key.dim(), value.dim()) == 2:
        squeeze = max(query.dim(), key.dim(), value.dim()) == 2     # the output has the inputs' highest rank
        query, key, value = (t.unsqueeze(-3) if t.dim() == 2 else t for t in (query, key, value))
    if is_causal is True and (isinstance(attn_mask, torch.Tensor) or (attn_mask is None
                                                                       and _scale_not_positive(scale))):
        keep = torch.ones(query.size(-2), key.size(-2), dtype=torch.bool, device=query.device).tril()
        if attn_mask is None:
            attn_mask = keep
        elif attn_mask.dtype == torch.bool:
            attn_mask = attn_mask & keep
        else:
            attn_mask = torch.where(keep, attn_mask, torch.full((), -math.inf, dtype=attn_mask.dtype,
                                                                device=attn_mask.device))
        is_causal = False
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
        enable_gqa=enable_gqa)
    return out.squeeze(-3) if squeeze else out


def _scale_not_positive(scale) -> bool:
    """Whether `scale` (None, a number or a 0-d tensor, not yet checked) is 0, -0.0 or negative (NaN is not);
    False for what is not a number (left to torch's argument error)."""
    if scale is None:
        return False
    try:
        return float(scale) <= 0.0
    except (TypeError, ValueError, RuntimeError):
        return False


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """See `fusedops.functional.scaled_dot_product_attention`."""
    try:
        known_key = _argument_key(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        known = _KNOWN_LAUNCHES.get(known_key)
    except (AttributeError, TypeError):     # not tensors, unhashable arguments: left to the checks
        known_key = known = None
    if known is not None and (attn_mask is None or not (attn_mask.requires_grad and torch.is_grad_enabled())):
        return _attend(query, key, value, attn_mask, *known)
    check_arguments(query, key, value, attn_mask, dropout_p, enable_gqa, scale, is_causal)
    native = (not _runs_kernels(query) or value.size(-1) > _kernels.MAX_HEAD_DIM or query.size(-1) == 0
              or (attn_mask is not None and attn_mask.requires_grad and torch.is_grad_enabled())
              or gqa_heads_differ(query, key, value, enable_gqa) or scale_beyond_kernels(query, scale))
    if native:
        return torch_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if dropout_p > 0.0:
        raise dropout_not_implemented(dropout_p)
    shapes = (query.shape, key.shape, value.shape, None if attn_mask is None else attn_mask.shape, enable_gqa)
    out_shape = _UNCHANGED_BY_AS_4D.get(shapes)
    if out_shape is not None:   # 4-D inputs of one batch and head count: _as_4d would return them as they are
        q, k, v, mask = query, key, value, attn_mask
    else:
        q, k, v, mask, out_shape = _as_4d(query, key, value, attn_mask, enable_gqa)
        if q is query and k is key and v is value and mask is attn_mask:
            _UNCHANGED_BY_AS_4D.put(shapes, out_shape)
    scale = attention_scale(query, scale)
    call = (bool(is_causal), scale, _kernels.attention_launches(q, k, v, mask, bool(is_causal), scale))
    if q is query and k is key and v is value and mask is attn_mask and known_key is not None:
        _KNOWN_LAUNCHES.put(known_key, call)
    o = _attend(q, k, v, mask, *call)
    return o if o.shape == out_shape else o.reshape(out_shape)


def _attend(q, k, v, mask, causal: bool, scale: float, launches) -> torch.Tensor:
    """o of 4-D q, k, v and mask by `launches` (kernels.attention.attention_launches of these layouts,
    causal and scale): through AttentionFunction when a gradient is needed."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _attention_apply(q, k, v, mask, causal, scale, launches)
    return _kernels.attention_forward(q, k, v, mask, causal, scale, launches=launches)[0]
