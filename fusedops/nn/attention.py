"""`fusedops.nn.MultiheadAttention`: a drop-in for torch.nn.MultiheadAttention.

It subclasses the torch module, so the constructor, parameters, state_dict keys and pickling are
torch's. `forward` takes torch's arguments; when the attention weights are not needed
(need_weights=False) and no feature outside the flash path is in use (attention dropout while
training, bias_k/bias_v, add_zero_attn), the heads run `fusedops.scaled_dot_product_attention` on
strided views of the projections (no copies); otherwise torch's exact forward runs.

Mask conventions are torch.nn.MultiheadAttention's: a boolean attn_mask / key_padding_mask marks
positions that may *not* be attended (True = masked, the opposite of scaled_dot_product_attention's
boolean mask); float masks are added to the logits.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from fusedops import functional


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, float("-inf"))
    return mask.to(dtype)


class MultiheadAttention(torch.nn.MultiheadAttention):
    """Multi-head attention (see torch.nn.MultiheadAttention) with the flash-attention kernels."""

    def _uses_flash_path(self, need_weights: bool) -> bool:
        return (not need_weights and self.bias_k is None and not self.add_zero_attn
                and (not self.training or self.dropout == 0.0))

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: Optional[torch.Tensor] = None, need_weights: bool = True,
                attn_mask: Optional[torch.Tensor] = None, average_attn_weights: bool = True,
                is_causal: bool = False):
        if not self._uses_flash_path(need_weights):
            return super().forward(query, key, value, key_padding_mask=key_padding_mask, need_weights=need_weights,
                                   attn_mask=attn_mask, average_attn_weights=average_attn_weights,
                                   is_causal=is_causal)
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the Transformer "
                               "module method `generate_square_subsequent_mask` to create this mask.")
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            key_padding_mask = None if key_padding_mask is None else key_padding_mask.unsqueeze(0)
        if self.batch_first and not unbatched:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        # (L, N, E) from here on
        length_q, batch, embed = query.shape
        length_k = key.size(0)
        heads, head_dim = self.num_heads, self.head_dim
        if self._qkv_same_embed_dim:
            w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        else:
            w_q, w_k, w_v = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        b_q, b_k, b_v = self.in_proj_bias.chunk(3) if self.in_proj_bias is not None else (None,) * 3

        def heads_view(x, weight, bias, length):     # (length, N, E) -> (N, H, length, head_dim), a view
            return F.linear(x, weight, bias).view(length, batch, heads, head_dim).permute(1, 2, 0, 3)

        q = heads_view(query, w_q, b_q, length_q)
        k = heads_view(key, w_k, b_k, length_k)
        v = heads_view(value, w_v, b_v, length_k)
        mask, causal = None, False
        if is_causal and key_padding_mask is None:
            causal = True            # torch drops the (causal) attn_mask and uses is_causal then
        else:
            if attn_mask is not None:
                mask = _additive(attn_mask, q.dtype)
                if mask.dim() == 3:                  # (N * H, L, S)
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
