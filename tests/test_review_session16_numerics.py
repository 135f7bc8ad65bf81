"""Review (session 16, numerics): the public ops through the interpreter (FUSEDOPS_INTERPRET=1, the `interpret`
fixture: the kernels CUDA tensors run), forward and gradients (torch.autograd.grad) in float16 / bfloat16 / float32 /
float64, against a float64 reference of plain torch ops, each error compared with torch's own same-dtype op against
the same reference. Inputs modelled on peer projects' bug reports (Apex FusedLayerNorm, Triton's layer_norm /
softmax tutorials, xformers, flash-attention): LayerNorm / RMSNorm rows offset by 300 (fp16), 1e4, 1e6 (fp32), 1e8
(fp64), constant rows, eps = 0, one huge outlier, values near fp16 subnormals, rows of 1 .. 70000 columns, extreme
weight / bias / dy; softmax / log_softmax with a -1e4 .. 1e4 spread, -inf mixed in, equal values, long rows, dtype=
upcasts and downcasts; attention with logits near 1e4 (fp16 / bf16), L or S of 1, S = 4097 with E = 16, finfo.min
and -1e9 additive masks, causal with L != S; matmul with K = 16384 and cancelling values, K = 1, broadcast bias.

Everything held (within twice torch's error, usually equal or better) except the defect below, left open
(documented in kernels/attention.py's numerics paragraph): it needs the dK/dV kernel's logits rounded as the
forward's (the same dot orientation and order) or P renormalized, for float32 inputs that only the interpreter
runs through the kernels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import pytest

import fusedops


def _grads(fn, inputs, dy):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    return torch.autograd.grad(out, leaves, dy.to(out.dtype))


# ================================================================================================
# Defect 1 (float32 attention backward, the interpreter's kernels): dV is 8-16x less accurate than torch's for
# logits in the hundreds to thousands (q, k ~ N(0, 20^2), E = 64: |logit| up to ~1.5e3; already 2-4x at logits ~60).
# The backward recomputes P = exp2(s2 - lse) from base-2 logits s2 = (q . k) * scale * log2(e), each rounded in
# float32 at |s2|'s magnitude, and from the saved lse's hi part alone (no additive mask); that lse is not the
# log-sum-exp of the logits the backward recomputes (off by 2-4 ulps of |lse|, ~5e-4 here), so the recomputed rows
# of P do not sum to 1 (|sum - 1| ~ 3e-4 where softmax of the same float32 logits sums to 1 within 1e-7) and
# dV = P^T dO inherits that error (an additive zero mask, which reads lo too, does not help). torch's float32 SDPA:
# dV within ~7e-5 of float64; ours ~1e-3 (the forward, dQ and dK stay within about twice torch's). On CUDA, float32
# attention runs torch's op, so this is reached through FUSEDOPS_INTERPRET=1 (documented "any float dtype"); the
# fp16 / bf16 kernels hide the same inconsistency under P's cast to 16 bits.
# Session 29: on a CPU whose BLAS added the float32 products in the same order both ways this passed (ours 7.5e-5,
# torch's 7.3e-5); the interpreter's float32 dots are now the float64 product rounded once, the same whichever
# orientation (tests/test_numerics.py's test_float32_dot_is_rounded_once_whatever_the_orientation guards that on
# every machine): 4.5e-5 here. Not strict: the margin still rests on the CPU's float32 exp2 / log2.
# ================================================================================================
@pytest.mark.xfail(strict=False, reason="float32 attention dV at large logits: was 8-16x torch's error where the "
                                        "recomputed logits differed from the forward's in their last bits")
def test_float32_attention_dv_with_large_logits_within_twice_torchs_error(interpret):
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, n, 64, generator=generator) * 20.0 for n in (16, 40))
    v = torch.randn(1, 2, 40, 64, generator=generator)
    dy = torch.randn(1, 2, 16, 64, generator=generator)
    reference = _grads(F.scaled_dot_product_attention, [t.double() for t in (q, k, v)], dy.double())[2]
    ours = _grads(fusedops.scaled_dot_product_attention, [q, k, v], dy)[2]
    theirs = _grads(F.scaled_dot_product_attention, [q, k, v], dy)[2]
    assert torch.isfinite(ours).all()
    ours_error = (ours.double() - reference).abs().max().item()
    torch_error = (theirs.double() - reference).abs().max().item()
    assert ours_error <= 2 * torch_error + 1e-6, (ours_error, torch_error)
