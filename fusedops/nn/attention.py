"""Attention adapters: `fusedops.nn.MultiheadAttention`, a drop-in for torch.nn.MultiheadAttention, and
`transformers_attention_forward`, an attention function for Hugging Face transformers' registry
(AttentionInterface), registered under "fusedops" by `register_transformers_attention()` (which
fusedops.nn.patch calls; transformers is imported only then).

It subclasses the torch module, so the constructor, parameters, state_dict keys and pickling are
torch's. `forward` takes torch's arguments; when the attention weights are not needed
(need_weights=False) and no feature outside the flash path is in use (attention dropout while
training, bias_k/bias_v, add_zero_attn), the heads run `fusedops.scaled_dot_product_attention` on
strided views of the projections (no copies); otherwise torch's exact forward runs.

Mask conventions are torch.nn.MultiheadAttention's: a boolean attn_mask / key_padding_mask marks
positions that may *not* be attended (True = masked, the opposite of scaled_dot_product_attention's
boolean mask); float masks are added to the logits. The flash path checks the inputs and masks as torch's
forward does (ranks, shapes, bool or floating masks, projection weights against the input widths; torch's
error types and messages). A float mask keeps its values as torch's forward does: one in float32 or the
query's dtype is read as it is (a float32 mask of a 16-bit module is not rounded to 16 bits); one of another
floating dtype, which torch's SDPA rejects in some cases, is cast to float32 (16-bit queries) or the
query's dtype. Under torch.jit.script the module runs torch's F.multi_head_attention_forward (TorchScript cannot
compile the calls into the kernels).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from fusedops import functional


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive form of an attn_mask / key_padding_mask for queries of `dtype` (see the module docstring:
    a float mask keeps float32, or the query's dtype)."""
    if mask.dtype == torch.bool:
        # out of place: under torch.vmap a per-sample mask cannot be written into an unbatched tensor
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))
    if mask.dtype in (dtype, torch.float32):
        return mask
    return mask.to(torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype)


def _check_mask_dtype(mask: Optional[torch.Tensor], name: str) -> None:
    if mask is not None and mask.dtype != torch.bool and not mask.dtype.is_floating_point:
        # torch's error (an integer mask, e.g. a legacy uint8 one, is neither additive nor boolean)
        raise AssertionError(f"only bool and floating types of {name} are supported")


def _check_ranks(query, key, value, key_padding_mask, attn_mask, heads: int) -> bool:
    """Whether the inputs are unbatched (2-D query), after torch's rank checks (AssertionError, its messages)."""
    if query.dim() not in (2, 3):
        raise AssertionError(f"query should be unbatched 2D or batched 3D tensor but received {query.dim()}-D query "
                             "tensor")
    batched = query.dim() == 3
    kind = "batched (3-D)" if batched else "unbatched (2-D)"
    if key.dim() != query.dim() or value.dim() != query.dim():
        raise AssertionError(f"For {kind} `query`, expected `key` and `value` to be {query.dim()}-D but found "
                             f"{key.dim()}-D and {value.dim()}-D tensors respectively")
    if key_padding_mask is not None and key_padding_mask.dim() != query.dim() - 1:
        raise AssertionError(f"For {kind} `query`, expected `key_padding_mask` to be `None` or "
                             f"{query.dim() - 1}-D but found {key_padding_mask.dim()}-D tensor instead")
    if attn_mask is not None:
        if attn_mask.dim() not in (2, 3):
            raise AssertionError(f"For {kind} `query`, expected `attn_mask` to be `None`, 2-D or 3-D but found "
                                 f"{attn_mask.dim()}-D tensor instead")
        if not batched and attn_mask.dim() == 3 and tuple(attn_mask.shape) != (heads, query.size(0), key.size(0)):
            raise AssertionError(f"Expected `attn_mask` shape to be {(heads, query.size(0), key.size(0))} but got "
                                 f"{attn_mask.shape}")
    return not batched


def _check_projection(name: str, weight: torch.Tensor, bias: Optional[torch.Tensor], embed: int, width: int):
    # torch's _in_projection checks of one separate projection (kdim / vdim modules)
    if weight.shape != (embed, width):
        raise AssertionError(f"expecting {name} weights shape of {(embed, width)}, but got {weight.shape}")
    if bias is not None and bias.shape != (embed,):
        raise AssertionError(f"expecting {name} bias shape of {(embed,)}, but got {bias.shape}")


def _check_inputs(query, key, value, key_padding_mask, attn_mask, embed_dim: int, heads: int,
                  same_embed_dim: bool) -> None:
    """The checks of torch.nn.functional.multi_head_attention_forward, with its error types and messages,
    for (L, N, E) / (S, N, E_k) / (S, N, E_v) inputs (unbatched ones already given a batch dim of 1), so that
    the flash path rejects what torch's forward rejects instead of reading masks of other shapes. In torch's
    order: embedding dims, key and value shapes, the attn_mask's shape, then the key_padding_mask's (the
    separate projections' weights against the inputs' widths: `_check_projection`, where torch projects)."""
    length_q, batch, embed = query.shape
    length_k = key.size(0)
    if embed != embed_dim:
        raise AssertionError(f"was expecting embedding dimension of {embed_dim}, but got {embed}")
    if same_embed_dim and key.shape != value.shape:
        raise AssertionError(f"key shape {key.shape} does not match value shape {value.shape}")
    if not same_embed_dim and key.shape[:2] != value.shape[:2]:
        raise AssertionError(f"key's sequence and batch dims {key.shape[:2]} do not match value's {value.shape[:2]}")
    if attn_mask is not None:
        expected = (length_q, length_k) if attn_mask.dim() == 2 else (batch * heads, length_q, length_k)
        if tuple(attn_mask.shape) != expected:
            raise RuntimeError(f"The shape of the {attn_mask.dim()}D attn_mask is {attn_mask.shape}, but should be "
                               f"{expected}.")
    if key_padding_mask is not None and tuple(key_padding_mask.shape) != (batch, length_k):
        raise AssertionError(f"Expected key_padding_mask of shape {(batch, length_k)}, but got "
                             f"{tuple(key_padding_mask.shape)}")


class MultiheadAttention(torch.nn.MultiheadAttention):
    """Multi-head attention (see torch.nn.MultiheadAttention) with the flash-attention kernels."""

    def _uses_flash_path(self, need_weights: bool) -> bool:
        return (not need_weights and self.bias_k is None and not self.add_zero_attn
                and (not self.training or self.dropout == 0.0))

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: Optional[torch.Tensor] = None, need_weights: bool = True,
                attn_mask: Optional[torch.Tensor] = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        if torch.jit.is_scripting():     # torch.jit.script: torch's functional forward (the kernels are Python calls)
            return self._scripted_forward(query, key, value, key_padding_mask, need_weights, attn_mask,
                                          average_attn_weights, is_causal)
        return self._fused_forward(query, key, value, key_padding_mask, need_weights, attn_mask,
                                   average_attn_weights, is_causal)

    @torch.jit.unused
    def _fused_forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       key_padding_mask: Optional[torch.Tensor], need_weights: bool,
                       attn_mask: Optional[torch.Tensor], average_attn_weights: bool,
                       is_causal: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        return multi_head_attention(self, query, key, value, key_padding_mask, need_weights, attn_mask,
                                    average_attn_weights, is_causal)

    def _scripted_forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          key_padding_mask: Optional[torch.Tensor], need_weights: bool,
                          attn_mask: Optional[torch.Tensor], average_attn_weights: bool,
                          is_causal: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The forward under torch.jit.script: F.multi_head_attention_forward in torch's (L, N, E) layout, as
        torch's module calls it outside its fast path (batch_first inputs transposed in and out)."""
        transpose = self.batch_first and query.dim() == 3
        if transpose:
            query, key, value = query.transpose(1, 0), key.transpose(1, 0), value.transpose(1, 0)
        out, weights = F.multi_head_attention_forward(
            query, key, value, self.embed_dim, self.num_heads, self.in_proj_weight, self.in_proj_bias,
            self.bias_k, self.bias_v, self.add_zero_attn, self.dropout, self.out_proj.weight, self.out_proj.bias,
            training=self.training, key_padding_mask=key_padding_mask, need_weights=need_weights,
            attn_mask=attn_mask, use_separate_proj_weight=not self._qkv_same_embed_dim,
            q_proj_weight=self.q_proj_weight, k_proj_weight=self.k_proj_weight, v_proj_weight=self.v_proj_weight,
            average_attn_weights=average_attn_weights, is_causal=is_causal)
        return (out.transpose(1, 0) if transpose else out), weights

    def _attention_forward(self, query, key, value, key_padding_mask, need_weights, attn_mask,
                           average_attn_weights, is_causal):
        nested = any(isinstance(t, torch.Tensor) and t.is_nested for t in (query, key, value))
        if nested or not self._uses_flash_path(need_weights):     # nested: torch's fast path, or its error
            return super().forward(query, key, value, key_padding_mask=key_padding_mask, need_weights=need_weights,
                                   attn_mask=attn_mask, average_attn_weights=average_attn_weights,
                                   is_causal=is_causal)
        # torch's order of checks (MultiheadAttention.forward, then F.multi_head_attention_forward): the masks'
        # dtypes, the ranks, a missing mask for the is_causal hint; then, without a key_padding_mask, the hint
        # drops attn_mask (SDPA's is_causal runs instead) before its shape would be checked.
        _check_mask_dtype(key_padding_mask, "key_padding_mask")
        _check_mask_dtype(attn_mask, "attn_mask")
        unbatched = _check_ranks(query, key, value, key_padding_mask, attn_mask, self.num_heads)
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the Transformer "
                               "module method `generate_square_subsequent_mask` to create this mask.")
        # as torch: a key_padding_mask turns the hint off; otherwise is_causal reaches the attention as given (a
        # None or another non-bool is SDPA's TypeError there, as in torch, not taken for its truth value)
        causal = False if key_padding_mask is not None else is_causal
        if is_causal and key_padding_mask is None:
            attn_mask = None
        if unbatched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            key_padding_mask = None if key_padding_mask is None else key_padding_mask.unsqueeze(0)
        if self.batch_first and not unbatched:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        # (L, N, E) from here on
        _check_inputs(query, key, value, key_padding_mask, attn_mask, self.embed_dim, self.num_heads,
                      self._qkv_same_embed_dim)
        length_q, batch, embed = query.shape
        length_k = key.size(0)
        heads, head_dim = self.num_heads, self.head_dim
        if self._qkv_same_embed_dim:
            w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        else:
            w_q, w_k, w_v = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        b_q, b_k, b_v = self.in_proj_bias.chunk(3) if self.in_proj_bias is not None else (None,) * 3
        if not self._qkv_same_embed_dim:
            for name, x, weight, bias in (("query", query, w_q, b_q), ("key", key, w_k, b_k),
                                          ("value", value, w_v, b_v)):
                _check_projection(name, weight, bias, embed, x.size(-1))

        def heads_view(x, weight, bias, length):     # (length, N, E) -> (N, H, length, head_dim), a view
            return F.linear(x, weight, bias).view(length, batch, heads, head_dim).permute(1, 2, 0, 3)

        q = heads_view(query, w_q, b_q, length_q)
        k = heads_view(key, w_k, b_k, length_k)
        v = heads_view(value, w_v, b_v, length_k)
        mask = None
        if attn_mask is not None:
            mask = _additive(attn_mask, q.dtype)
            if mask.dim() == 3:                      # (N * H, L, S)
                mask = mask.view(batch, heads, length_q, length_k)
        if key_padding_mask is not None:
            padding = _additive(key_padding_mask, q.dtype).view(batch, 1, 1, length_k)
            mask = padding if mask is None else mask + padding
        out = functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        out = out.permute(2, 0, 1, 3).reshape(length_q, batch, embed)
        out = F.linear(out, self.out_proj.weight, self.out_proj.bias)
        if self.batch_first and not unbatched:
            out = out.transpose(0, 1)
        return (out.squeeze(1) if unbatched else out), None


@torch.fx.wrap
def multi_head_attention(module: MultiheadAttention, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         key_padding_mask: Optional[torch.Tensor], need_weights: bool,
                         attn_mask: Optional[torch.Tensor], average_attn_weights: bool, is_causal: bool):
    """`module`'s forward (arguments and result as torch.nn.MultiheadAttention.forward's).

    A leaf function of torch.fx.symbolic_trace, recorded as one call_function node with the module as its
    first argument (a get_attr node), as torch's MultiheadAttention is a leaf module there: its forward checks
    ranks and shapes, which a Proxy cannot answer.
    """
    return module._attention_forward(query, key, value, key_padding_mask, need_weights, attn_mask,
                                     average_attn_weights, is_causal)


# ------------------------------------------------------------------------------------------------
# Hugging Face transformers: an attention function for its AttentionInterface registry
# ------------------------------------------------------------------------------------------------
TRANSFORMERS_ATTENTION = "fusedops"


def transformers_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                                   value: torch.Tensor, attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                                   scaling: Optional[float] = None, is_causal: Optional[bool] = None,
                                   position_bias: Optional[torch.Tensor] = None, **kwargs):
    """transformers' "sdpa" attention function (transformers/integrations/sdpa_attention.py) on
    fusedops.scaled_dot_product_attention: the signature of transformers' AttentionInterface.

    Args:
        module: the calling attention module (its `is_causal` and `num_key_value_groups` are read).
        query: (B, H, L, E); key: (B, H_kv, S, E); value: (B, H_kv, S, Ev), H a multiple of H_kv.
        attention_mask: None, a boolean mask (True = attend) or an additive float mask broadcastable to
            (B, H, L, S), as built by transformers' sdpa mask function (registered for this name too).
        dropout: the attention dropout probability; > 0 (training with attention dropout) runs torch's
            scaled_dot_product_attention, since the fusedops kernels have no attention dropout.
        scaling: the softmax scale (default 1 / sqrt(E)); is_causal: as for "sdpa" (default the
            module's); position_bias: an additive bias folded into the mask, as "sdpa" does.
    Returns:
        (output (B, L, H, Ev) contiguous, None): no attention weights, like "sdpa".
    Raises:
        ValueError: a `softcap` (which "sdpa" does not support either).
    """
    if kwargs.get("softcap") is not None:
        raise ValueError("the fusedops attention does not support `softcap`; use `eager` or `flex_attention`")
    groups = getattr(module, "num_key_value_groups", 1)
    length_q, length_k = query.shape[2], key.shape[2]
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # As "sdpa": is_causal only for a prefill without a mask (the mask builder returns None when the
    # mask is plain causal); a decoding step's single query attends to every cached key.
    is_causal = length_q > 1 and attention_mask is None and is_causal
    if is_causal and length_k > length_q:
        # A prefill into an empty static cache: the keys past the queries are masked anyway, and
        # torch's is_causal is aligned to the top-left corner.
        key, value = key[:, :, :length_q], value[:, :, :length_q]
        position_bias = None if position_bias is None else position_bias[..., :length_q]
    if attention_mask is not None and attention_mask.dim() == 4:
        attention_mask = attention_mask[:, :, :, :key.shape[2]]      # as "sdpa": a mask built for a longer cache
    if position_bias is not None:
        from transformers.integrations.sdpa_attention import create_position_bias_mask

        attention_mask = create_position_bias_mask(position_bias, attention_mask, is_causal, query, key)
        is_causal = False
    attend = F.scaled_dot_product_attention if dropout > 0.0 else functional.scaled_dot_product_attention
    out = attend(query, key, value, attn_mask=attention_mask, dropout_p=dropout, is_causal=is_causal, scale=scaling,
                 enable_gqa=groups > 1)
    return out.transpose(1, 2).contiguous(), None


def register_transformers_attention() -> str:
    """Register `transformers_attention_forward` in transformers' AttentionInterface, with the "sdpa"
    mask builder in its AttentionMaskInterface, under the name TRANSFORMERS_ATTENTION ("fusedops"),
    and return the name. A model then uses it with `model.set_attn_implementation("fusedops")`
    (fusedops.nn.patch does that). Idempotent. Imports transformers (ImportError without it)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(TRANSFORMERS_ATTENTION, transformers_attention_forward)
    AttentionMaskInterface.register(TRANSFORMERS_ATTENTION, sdpa_mask)
    return TRANSFORMERS_ATTENTION
