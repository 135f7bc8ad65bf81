"""Review (session 3) of the host fast paths since 8f619ac: arguments that must not find a launch
remembered for others (the launch entry's constexpr keys, the per-layout caches of the autograd
paths), on the CPU (the interpreter, or the CUDA driver mocked as in test_launch_fast_path)."""

from __future__ import annotations

import pytest
import torch

import fusedops
import fusedops.dsl as dsl
from fusedops.kernels import matmul as matmul_launch
from test_launch_fast_path import _constant_kernel, _counting_lookups, _cuda, _new_kernel, gpu, launches  # noqa: F401
from test_review_fastpaths import kernel_launches  # noqa: F401


@pytest.fixture
def interp(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")


# ------------------------------------------------------------------------------------------------
# The generated launch entry (runtime/fast_path.py)
# ------------------------------------------------------------------------------------------------
def test_wrapped_constexpr_is_keyed_by_the_value_it_wraps(gpu, monkeypatch):
    # dsl.constexpr(-0.0) == dsl.constexpr(0.0), but the full path specializes on the wrapped float's
    # bits (1 / C is -inf, not inf): the cached launch of 0.0 must not run for -0.0
    kernel = _constant_kernel()
    lookups = _counting_lookups(kernel, monkeypatch)
    y = _cuda(torch.zeros(2))
    for value in (0.0, 0.0, -0.0, -0.0):
        kernel[(1,)](y, C=dsl.constexpr(value))
    assert len(lookups) == 2 and len(kernel._cache) == 2
    kernel[(1,)](y, C=-0.0)             # the unwrapped value: the same specialization and plan
    kernel[(1,)](y, C=dsl.constexpr(float("nan")))
    kernel[(1,)](y, C=dsl.constexpr(float("nan")))  # another NaN object: found again
    assert len(lookups) == 3 and len(kernel._plans) == 3


def test_grid_none_after_the_first_launch_is_a_launch_error(gpu):
    kernel = _new_kernel()
    x, y = _cuda(torch.zeros(64)), _cuda(torch.zeros(64))
    kernel[(1,)](x, y, 64, 2.0, BLOCK=32)       # makes the generated entry
    with pytest.raises(dsl.LaunchError, match="grid"):
        kernel[None](x, y, 64, 2.0, BLOCK=32)


# ------------------------------------------------------------------------------------------------
# The per-layout caches of fusedops.layer_norm / rms_norm / scaled_dot_product_attention
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_norm_eps_tensor_changed_in_place_is_read_again(interp, op):
    # torch accepts a 0-d tensor eps; remembering the launches by the tensor object kept its old value
    x = torch.randn(2, 4)
    eps = torch.tensor(0.5)
    ours, theirs = getattr(fusedops, op), getattr(torch.nn.functional, op)
    ours(x, (4,), eps=eps)
    eps.fill_(100.0)
    torch.testing.assert_close(ours(x, (4,), eps=eps), theirs(x, (4,), eps=100.0))


def test_layer_norm_eps_none_is_a_type_error_as_in_torch(interp):
    # None is rms_norm's default eps only; the kernel path gave layer_norm rms_norm's default
    x = torch.randn(2, 4)
    with pytest.raises(TypeError):
        torch.nn.functional.layer_norm(x, (4,), eps=None)
    with pytest.raises(TypeError):
        fusedops.layer_norm(x, (4,), eps=None)


def test_sdpa_scalar_tensors_changed_in_place_are_read_again(interp):
    q, k, v = (torch.randn(1, 1, 3, 4) for _ in range(3))
    scale = torch.tensor(0.5)
    fusedops.scaled_dot_product_attention(q, k, v, scale=scale)
    scale.fill_(3.0)
    torch.testing.assert_close(fusedops.scaled_dot_product_attention(q, k, v, scale=scale),
                               torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=3.0))
    dropout_p = torch.tensor(0.0)
    fusedops.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    dropout_p.fill_(0.5)        # must not be silently ignored
    with pytest.raises(NotImplementedError, match="dropout_p"):
        fusedops.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)


def test_layer_norm_backward_follows_the_saved_weights_layout(interp):
    # An expanded (stride-0) weight that a saved-tensor hook gives back contiguous in one step and not
    # in the next: the backward launch prepared for the contiguous weight read the expanded one as 8
    # elements (out of bounds; on the GPU, silently wrong dweight and dx).
    x = torch.randn(3, 8, requires_grad=True)
    w0 = torch.randn(1, requires_grad=True)
    bias = torch.randn(8)
    x64, w64 = x.detach().double().requires_grad_(), w0.detach().double().requires_grad_()
    torch.nn.functional.layer_norm(x64, (8,), w64.expand(8), bias.double()).pow(2).sum().backward()
    for hooks in (torch.autograd.graph.saved_tensors_hooks(lambda t: t.contiguous(), lambda t: t), None):
        x.grad = w0.grad = None
        if hooks is None:
            y = fusedops.layer_norm(x, (8,), w0.expand(8), bias)
        else:
            with hooks:
                y = fusedops.layer_norm(x, (8,), w0.expand(8), bias)
        y.pow(2).sum().backward()
        torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(w0.grad.double(), w64.grad, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------------------------------------
# Settings (runtime/knobs.py: "a test (or a user) that changes a variable sees the change on the next call")
# ------------------------------------------------------------------------------------------------
def test_matmul_sees_a_changed_tma_setting(kernel_launches, monkeypatch):
    decisions = []      # the TMA setting each time the kernel path chooses between the TMA and cp.async kernels
    monkeypatch.setattr(matmul_launch, "_uses_tma",
                        lambda c, a, b: decisions.append(matmul_launch._tma_enabled()) or False)
    a, b = torch.randn(64, 64, dtype=torch.float16), torch.randn(64, 64, dtype=torch.float16)
    fusedops.matmul(a, b)       # FUSEDOPS_TMA=0 (the fixture's)
    monkeypatch.setenv("FUSEDOPS_TMA", "1")
    fusedops.matmul(a, b)
    assert decisions == [False, True]
