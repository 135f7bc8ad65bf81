"""float64 references that need more care than running the PyTorch op on float64 inputs.

Attention: the (S, S) score matrix of a long sequence in float64 is large (2 GiB at S = 16384), so
the reference computes one (batch, head) at a time, forward and backward, and never holds more
than one head's scores.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import torch


def _head(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    # q: (L, E), k and v: (S, E). Causal masks are aligned top-left, as torch's is_causal.
    scores = (q @ k.transpose(0, 1)) * q.shape[-1] ** -0.5
    if causal:
        keep = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@torch.no_grad()
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """softmax(q k^T / sqrt(E)) v for (B, H, L, E) q and (B, H, S, E) k, v; one head at a time."""
    out = torch.empty(q.shape[:-1] + v.shape[-1:], dtype=q.dtype, device=q.device)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            out[b, h] = _head(q[b, h], k[b, h], v[b, h], causal)
    return out


def attention_grads(inputs: Sequence[torch.Tensor], grad_output: torch.Tensor,
                    causal: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of `attention` for the output gradient `grad_output`, one head at a time."""
    q, k, v = inputs
    grads = tuple(torch.empty_like(t) for t in (q, k, v))
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            leaves = tuple(t[b, h].detach().requires_grad_() for t in (q, k, v))
            with torch.enable_grad():
                out = _head(*leaves, causal)
            for grad, piece in zip(grads, torch.autograd.grad(out, leaves, grad_output[b, h])):
                grad[b, h] = piece
    return grads
