"""The custom operator fusedops::scaled_dot_product_attention and its backward,
fusedops::scaled_dot_product_attention_backward, and `scaled_dot_product_attention`, what
fusedops.functional calls while a graph is traced.

| operator                       | returns                      | gradient through               |
|--------------------------------|------------------------------|--------------------------------|
| scaled_dot_product_attention(query, key, value, attn_mask, is_causal, scale, enable_gqa)       |
|                                | (output, lse)                | scaled_dot_product_attention_backward |

Like the norms' statistics, the operator also returns the base-2 log-sum-exp of each row (the kernels'
(hi, lo) pair, shaped (*output.shape[:-2], 2, L)), which its backward reads; the Python wrapper returns
the output alone. The operator has no dropout argument (the kernels have no attention dropout).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from fusedops.autograd import attention as _attention
from fusedops.autograd.arguments import known_true
from fusedops.kernels import attention as _attention_kernels
from fusedops.kernels.allocation import ordered_strides
from fusedops.library.common import (INTERPRETER_DTYPES, accumulation_dtype, interpret_enabled, recomputed_gradients,
                                      refuse_dual, unviewed)


def attention_runs_kernels(query: torch.Tensor, value: torch.Tensor) -> bool:
    """The routing rule of fusedops.scaled_dot_product_attention: float16/bfloat16 CUDA tensors (CPU
    tensors of any float dtype under FUSEDOPS_INTERPRET=1) with head dims up to the kernels' maximum
    (and a scale they take: `_op_runs_kernels`). A symbolic head dim (torch.compile or torch.export with a dynamic
    one) that is not known to exceed the maximum counts as one up to it, without a guard: the operator routes on the
    concrete head dims when it runs (the math attention above the maximum), so the traced graph holds for every
    head dim, as torch's does (comparing it guarded the graph: an exported program with a dynamic head dim refused
    one of 300, "Guard failed: max(...) <= 256")."""
    if any(map(known_true, (query.size(-1) > _attention_kernels.MAX_HEAD_DIM,
                             value.size(-1) > _attention_kernels.MAX_HEAD_DIM))):
        return False
    if query.is_cuda:
        return query.dtype in (torch.float16, torch.bfloat16)
    return query.device.type == "cpu" and query.dtype in INTERPRETER_DTYPES and interpret_enabled()


def _op_runs_kernels(query: torch.Tensor, value: torch.Tensor, scale: Optional[float]) -> bool:
    """The operators' routing: attention_runs_kernels, and a scale the kernels take (a float64 scale past
    float32's range runs the math attention: autograd.attention.scale_beyond_kernels)."""
    return attention_runs_kernels(query, value) and not _attention.scale_beyond_kernels(query, scale)


def _attention_batch(query, key, value) -> tuple:
    """The broadcast batch dims (those before heads) of the three inputs, at least one dim."""
    rank = max(query.dim(), key.dim(), value.dim(), 4)
    return torch.broadcast_shapes(*(((1,) * (rank - t.dim()) + tuple(t.shape))[:-3] for t in (query, key, value)))


def _attention_probabilities(q, k, v, mask, causal: bool, scale: float):
    """The math fallback on 4-D operands: (P, K, V) in the accumulation dtype with K and V repeated to
    H heads (GQA); P = softmax(scale * q k^T + mask), 0 on fully masked rows; also the base-2 lse (the
    kernels' (hi, lo) pair, `_lse_pair`)."""
    wide = accumulation_dtype(q.dtype)
    group = q.size(1) // max(k.size(1), 1)
    k, v = (t.to(wide).repeat_interleave(group, 1) for t in (k, v))
    s = q.to(wide) @ k.transpose(-1, -2) * scale
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask.to(wide)
    if causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, -math.inf)
    # softmax, not exp(s - logsumexp(s)): a row of finfo.min logits has a logsumexp that rounds to its
    # logits, which would make every P of the row 1
    p = torch.softmax(s, -1).nan_to_num(0.0)                # fully masked rows (all -inf): 0
    return p, k, v, _lse_pair(s)


def _lse_pair(s: torch.Tensor) -> torch.Tensor:
    """The kernels' base-2 lse of logits s (..., L, S) as their (hi, lo) pair (..., 2, L)
    (kernels/attention.py, "Saved statistics"): hi = m + log2(l) rounded, lo its rounding error (TwoSum),
    with m the row maximum in base 2 (held at the dtype's minimum where it overflows, as the kernels hold
    logits) and l = sum(exp2(s2 - m)); (+inf, 0) for fully masked rows."""
    m = s.amax(-1, keepdim=True) if s.size(-1) else s.new_full((*s.shape[:-1], 1), -math.inf)    # (no keys)
    dead = m == -math.inf
    m = m.masked_fill(dead, 0.0)
    log_l = torch.log2(torch.exp(s - m).sum(-1, keepdim=True)).squeeze(-1)
    m = (m.squeeze(-1) * _attention_kernels.LOG2E).clamp(min=torch.finfo(s.dtype).min)
    log_l = log_l.masked_fill(dead.squeeze(-1), 0.0)
    hi = m + log_l
    rounded = hi - m
    lo = (m - (hi - rounded)) + (log_l - rounded)
    return torch.stack((hi.masked_fill(dead.squeeze(-1), math.inf), lo.masked_fill(dead.squeeze(-1), 0.0)), -2)


@torch.library.custom_op("fusedops::scaled_dot_product_attention", mutates_args=())
def _attention_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Optional[torch.Tensor],
                  is_causal: bool, scale: Optional[float], enable_gqa: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """torch.nn.functional.scaled_dot_product_attention without dropout (see
    fusedops.scaled_dot_product_attention): (output, lse), new tensors: output laid out as the eager path and
    torch's attention lay it out (`_output_strides`), lse contiguous and shaped
    (*output.shape[:-2], 2, L), float32 (float64 for float64 input): the base-2 log-sum-exp of each row's
    logits as an unevaluated sum lse[..., 0, :] + lse[..., 1, :] (+inf and 0 for fully masked rows;
    fusedops/kernels/attention.py). Checks its arguments as fusedops.scaled_dot_product_attention does (the op
    may be called directly)."""
    _attention.check_arguments(query, key, value, attn_mask, 0.0, enable_gqa, scale, is_causal)
    refuse_dual("scaled_dot_product_attention", query, key, value, attn_mask)
    runs_kernels = _op_runs_kernels(query, value, scale)
    q, k, v, mask, out_shape = _attention._as_4d(query, key, value, attn_mask, enable_gqa)
    scale = _attention.attention_scale(query, scale)
    if runs_kernels:
        o, lse = _attention_kernels.attention_forward(q, k, v, mask, is_causal, scale)
    else:       # math attention in the accumulation dtype (the L x S logits are materialized)
        p, _, v_heads, lse = _attention_probabilities(q, k, v, mask, is_causal, scale)
        o = (p @ v_heads).to(query.dtype)
    strides = _output_strides(q, out_shape)
    o = unviewed(o, out_shape)     # (no view: see unviewed)
    if o.stride() != strides:
        o = o.new_empty_strided(out_shape, strides).copy_(o)
    return o, unviewed(lse.contiguous(), (*out_shape[:-2], 2, out_shape[-2]))


def _output_strides(q: torch.Tensor, out_shape: tuple) -> tuple:
    """The output's strides: in the memory order of the 4-D query the kernels read (kernels.attention.output_order,
    torch's layout: nanoGPT's heads merge by a view) where the output has its shape's first three dims, else
    contiguous."""
    order = _attention_kernels.output_order(q) if tuple(out_shape[:3]) == tuple(q.shape[:3]) else range(len(out_shape))
    return ordered_strides(tuple(out_shape), tuple(order))


@torch.library.custom_op("fusedops::scaled_dot_product_attention_backward", mutates_args=())
def _attention_backward_op(grad_output: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           output: torch.Tensor, lse: torch.Tensor, attn_mask: Optional[torch.Tensor],
                           is_causal: bool, scale: Optional[float],
                           enable_gqa: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dquery, dkey, dvalue), contiguous, shaped and typed like query, key, value (gradients of
    broadcast dims summed), from the output gradient and the forward's output and lse."""
    refuse_dual("scaled_dot_product_attention_backward", grad_output, query, key, value, output, lse, attn_mask)
    runs_kernels = _op_runs_kernels(query, value, scale)
    q, k, v, mask, _ = _attention._as_4d(query, key, value, attn_mask, enable_gqa)
    scale = _attention.attention_scale(query, scale)
    rows = (q.size(0), q.size(1), q.size(2))
    o, do = output.reshape(*rows, v.size(-1)), grad_output.reshape(*rows, v.size(-1))   # (no -1: 0 elements)
    if runs_kernels:
        dq, dk, dv = _attention_kernels.attention_backward(do, q, k, v, o, lse.reshape(*rows[:2], 2, rows[2]), mask,
                                                           is_causal, scale)
    else:       # dS = P * (dP - rowsum(dO * O)), dP = dO V^T (Dao 2023, Algorithm 2)
        p, k_heads, v_heads, _ = _attention_probabilities(q, k, v, mask, is_causal, scale)
        do = do.to(p.dtype)
        ds = p * (do @ v_heads.transpose(-1, -2) - (do * o.to(p.dtype)).sum(-1, keepdim=True))
        # sum the H query heads' gradients into the H_kv key/value heads they read
        group = q.size(1) // k.size(1) if k.size(1) else 1      # spelled out: -1 is ambiguous for 0 elements
        group_sum = lambda t: t.reshape(k.size(0), k.size(1), group, *t.shape[2:]).sum(2)  # noqa: E731
        dq = (ds @ k_heads * scale).to(q.dtype)
        dk = group_sum(ds.transpose(-1, -2) @ q.to(p.dtype) * scale).to(k.dtype)
        dv = group_sum(p.transpose(-1, -2) @ do).to(v.dtype)
    # undo the flattening of the batch dims and sum over the dims _as_4d broadcast
    batch = _attention_batch(query, key, value)
    return tuple(grad.reshape(*batch, *grad.shape[1:]).sum_to_size(t.shape).contiguous()
                 for grad, t in ((dq, query), (dk, key), (dv, value)))


@_attention_op.register_fake
def _(query, key, value, attn_mask, is_causal, scale, enable_gqa):
    q, _, _, _, out_shape = _attention._as_4d(query, key, value, attn_mask, enable_gqa)
    return (query.new_empty_strided(out_shape, _output_strides(q, out_shape)),
            query.new_empty((*out_shape[:-2], 2, out_shape[-2]), dtype=accumulation_dtype(query.dtype)))


@_attention_backward_op.register_fake
def _(grad_output, query, key, value, output, lse, attn_mask, is_causal, scale, enable_gqa):
    return tuple(t.new_empty(t.shape) for t in (query, key, value))


def _setup_attention(ctx, inputs, output):
    query, key, value, attn_mask, is_causal, scale, enable_gqa = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(query, key, value, out, lse, attn_mask)
    ctx.is_causal, ctx.scale, ctx.enable_gqa = is_causal, scale, enable_gqa


def _attention_backward(ctx, grad_output, grad_lse):
    query, key, value, out, lse, attn_mask = ctx.saved_tensors
    if ctx.needs_input_grad[3]:
        return _recomputed_gradients(ctx, grad_output, query, key, value, attn_mask)
    dq, dk, dv = torch.ops.fusedops.scaled_dot_product_attention_backward(
        grad_output, query, key, value, out, lse, attn_mask, ctx.is_causal, ctx.scale, ctx.enable_gqa)
    return dq, dk, dv, None, None, None, None


def _recomputed_gradients(ctx, grad_output, query, key, value, attn_mask) -> tuple:
    """The gradients of a call whose float attn_mask requires grad (a learned bias; the public function runs
    torch's op for it, a direct call of the operator comes here): torch's attention recomputed, and its
    gradients, the mask's (dS, summed over the dims it broadcasts) among them."""
    def forward(query, key, value, attn_mask):
        return _attention.torch_attention(query, key, value, attn_mask=attn_mask, dropout_p=0.0,
                                          is_causal=ctx.is_causal, scale=ctx.scale, enable_gqa=ctx.enable_gqa)
    grads = recomputed_gradients(forward, (query, key, value, attn_mask), ctx.needs_input_grad[:4], grad_output)
    return (*grads, None, None, None)


_attention_op.register_autograd(_attention_backward, setup_context=_setup_attention)


def scaled_dot_product_attention(query, key, value, attn_mask, dropout_p: float, is_causal: bool,
                                 scale: Optional[float], enable_gqa: bool) -> torch.Tensor:
    """fusedops.scaled_dot_product_attention while a graph is traced (inputs already autocast): torch's
    argument errors, then the output of torch.ops.fusedops.scaled_dot_product_attention, or torch's op
    where fusedops.functional runs torch's op (other devices and dtypes, a mask that requires grad)."""
    _attention.check_arguments(query, key, value, attn_mask, dropout_p, enable_gqa, scale, is_causal)
    mask_grad = attn_mask is not None and attn_mask.requires_grad and torch.is_grad_enabled()
    if (not attention_runs_kernels(query, value) or mask_grad
            or _attention.gqa_heads_differ(query, key, value, enable_gqa)
            or _attention.scale_beyond_kernels(query, scale)):
        return _attention.torch_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    if dropout_p > 0.0:
        raise _attention.dropout_not_implemented(dropout_p)
    scale = None if scale is None else float(scale)
    return torch.ops.fusedops.scaled_dot_product_attention(query, key, value, attn_mask, bool(is_causal), scale,
                                                           bool(enable_gqa))[0]
