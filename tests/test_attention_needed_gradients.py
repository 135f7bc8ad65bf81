"""Attention's backward computes only the gradients autograd asks for (`ctx.needs_input_grad`): a frozen
query skips the dQ sums and the dQ kernel, frozen keys and values skip the dK/dV kernel. Each case is checked
against torch's attention in float64 (interpreter), with the launched kernels counted."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import fusedops
from fusedops.dsl.runtime import jit as dsl_jit
from fusedops.kernels import attention_backward_kernels as bk

NEEDS = [n for n in itertools.product((False, True), repeat=3) if any(n)]


def _launched_kernels(monkeypatch) -> list:
    names = []
    original = dsl_jit.JITFunction.run

    def run(self, grid, *args, **kwargs):
        names.append(self.__name__)
        return original(self, grid, *args, **kwargs)
    monkeypatch.setattr(dsl_jit.JITFunction, "run", run)
    return names


@pytest.mark.parametrize("needs", NEEDS)
@pytest.mark.parametrize("mask_kind", ["none", "causal", "bool"])
def test_only_the_wanted_gradients_are_computed(interpret, monkeypatch, seed, needs, mask_kind):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, 19, 8, dtype=torch.float64, generator=generator) for _ in range(3))
    mask = torch.rand(19, 19, generator=generator) > 0.3 if mask_kind == "bool" else None
    causal = mask_kind == "causal"
    leaves = [t.clone().requires_grad_(n) for t, n in zip((q, k, v), needs)]
    out = fusedops.scaled_dot_product_attention(*leaves, attn_mask=mask, is_causal=causal)
    grad = torch.randn(out.shape, dtype=torch.float64, generator=generator)
    names = _launched_kernels(monkeypatch)
    out.backward(grad)
    reference = [t.clone().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*reference, attn_mask=mask, is_causal=causal).backward(grad)
    for leaf, ref, need in zip(leaves, reference, needs):
        if need:
            torch.testing.assert_close(leaf.grad, ref.grad, rtol=1e-9, atol=1e-9)
        else:
            assert leaf.grad is None
    need_kv = needs[1] or needs[2]
    assert (bk.attention_backward_dkdv_kernel.__name__ in names) == need_kv, names
    dq_kernels = {bk.attention_backward_dq_kernel.__name__, bk.attention_backward_dq_convert_kernel.__name__}
    assert bool(dq_kernels & set(names)) == needs[0], names


@pytest.mark.cuda
@pytest.mark.parametrize("needs", NEEDS)
@pytest.mark.parametrize("dim, causal", [(64, False), (64, True), (128, False)])
def test_gpu_only_the_wanted_gradients(needs, dim, causal):
    generator = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(2, 3, 300, dim, device="cuda", dtype=torch.float16, generator=generator)
               for _ in range(3))
    leaves = [t.clone().requires_grad_(n) for t, n in zip((q, k, v), needs)]
    out = fusedops.scaled_dot_product_attention(*leaves, is_causal=causal)
    grad = torch.randn(out.shape, device="cuda", dtype=torch.float16, generator=generator)
    out.backward(grad)
    reference = [t.double().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*reference, is_causal=causal).backward(grad.double())
    for leaf, ref, need in zip(leaves, reference, needs):
        if need:
            torch.testing.assert_close(leaf.grad.double(), ref.grad, rtol=2e-2, atol=2e-2)
        else:
            assert leaf.grad is None
