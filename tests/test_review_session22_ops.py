"""Review (session 22): a demanding PyTorch user tried to break the public ops and fusedops.nn on the CPU,
with torch itself as the oracle (same inputs, same weights), on both CPU routes: the kernel path in the
NumPy interpreter (the `interpret` fixture, FUSEDOPS_INTERPRET=1: what CUDA tensors take) and the torch
fallback (the `fallback` fixture: what a CPU user gets by default).

Defects found (all fixed in session 22) assert torch's behaviour; the other tests pin tricky cases
that were checked and match torch (values, dtypes, gradients, errors).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.nn as fnn

D = torch.float64


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    return 0.0 if a.numel() == 0 else (a.double() - b.double()).abs().max().item()


def _mha_pair(**kwargs):
    ref = torch.nn.MultiheadAttention(8, 2, dtype=D, **kwargs)
    ours = fnn.MultiheadAttention(8, 2, dtype=D, **kwargs)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ours, ref


def _linear_pair(*args, **kwargs):
    ref = torch.nn.Linear(*args, **kwargs)
    ours = fnn.Linear(*args, **kwargs)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ours, ref


# -------------------------------------------------------------------------------------------------
# Defects
# -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["key_padding_mask", "attn_mask"])
def test_mha_under_vmap_with_per_sample_boolean_masks(route, which):
    ours, ref = _mha_pair()
    x = torch.randn(5, 3, 8, dtype=D)           # 5 unbatched sequences of length 3
    if which == "key_padding_mask":
        mask = torch.rand(5, 3) > 0.6
        mask[:, 0] = False
    else:
        mask = torch.rand(5, 3, 3) > 0.6
        mask[..., 0] = False

    def per_sample(module):
        return lambda t, m: module(t, t, t, need_weights=False, **{which: m})[0]

    want = torch.vmap(per_sample(ref))(x, mask)
    got = torch.vmap(per_sample(ours))(x, mask)
    assert _max_diff(got, want) < 1e-12


@pytest.mark.parametrize("bias_dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_linear_bias_of_another_dtype_raises_like_torch(route, bias_dtype):
    ours, ref = _linear_pair(4, 3)
    for module in (ours, ref):
        module.bias.data = module.bias.data.to(bias_dtype)
    x = torch.randn(2, 4)
    with pytest.raises(RuntimeError):
        ref(x)
    with pytest.raises(RuntimeError):
        ours(x)


def test_complex_linear_like_torch(route):
    ours, ref = _linear_pair(4, 2, dtype=torch.cdouble)
    x = torch.randn(3, 4, dtype=torch.cdouble)
    got, want = ours(x), ref(x)
    assert got.dtype == want.dtype and (got - want).abs().max().item() < 1e-12


def _sparse_dense():
    a = torch.randn(3, 4, dtype=D)
    a[a < 0] = 0
    return a, torch.randn(4, 2, dtype=D)


def test_matmul_sparse_coo_operand_on_the_kernel_path(interpret):
    a, b = _sparse_dense()
    assert _max_diff(fusedops.matmul(a.to_sparse(), b), torch.matmul(a.to_sparse(), b)) < 1e-12


def test_matmul_sparse_csr_operand(route):
    a, b = _sparse_dense()
    assert _max_diff(fusedops.matmul(a.to_sparse_csr(), b), torch.matmul(a.to_sparse_csr(), b)) < 1e-12


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_linear_sparse_input(route, layout):
    ours, ref = _linear_pair(4, 2, dtype=D)
    a, _ = _sparse_dense()
    x = a.to_sparse() if layout == "coo" else a.to_sparse_csr()
    assert _max_diff(ours(x), ref(x)) < 1e-12


# -------------------------------------------------------------------------------------------------
# What held up
# -------------------------------------------------------------------------------------------------
def test_mha_under_vmap_with_float_and_shared_masks(route):
    # the vmap cases that do work: a per-sample float mask, and a boolean mask shared by every sample
    ours, ref = _mha_pair()
    x = torch.randn(5, 3, 8, dtype=D)
    kpm = torch.rand(5, 3) > 0.6
    kpm[:, 0] = False
    additive = torch.zeros(5, 3, dtype=D).masked_fill(kpm, -1e9)
    for module_args in [lambda m: torch.vmap(lambda t, k: m(t, t, t, key_padding_mask=k, need_weights=False)[0])(
                            x, additive),
                        lambda m: torch.vmap(lambda t: m(t, t, t, key_padding_mask=kpm[0], need_weights=False)[0])(x)]:
        assert _max_diff(module_args(ours), module_args(ref)) < 1e-12


def test_mha_flash_path_gradients_of_every_parameter(interpret):
    # kdim/vdim, batch_first, unbatched inputs, masks of both kinds: output and every gradient as torch's
    L, S, N = 4, 5, 2
    q, k, v = torch.randn(L, N, 8, dtype=D), torch.randn(S, N, 6, dtype=D), torch.randn(S, N, 3, dtype=D)
    kpm = torch.rand(N, S) > 0.6
    kpm[:, 0] = False
    runs = [({"kdim": 6, "vdim": 3}, [q, k, v], {"key_padding_mask": kpm}),
            ({"kdim": 6, "vdim": 3, "batch_first": True}, [t.transpose(0, 1) for t in (q, k, v)],
             {"attn_mask": torch.randn(L, S, dtype=D)}),
            ({"kdim": 6, "vdim": 3}, [q[:, 0], k[:, 0], v[:, 0]], {"key_padding_mask": kpm[0]}),
            ({"bias": False}, [q, q, q], {"attn_mask": torch.rand(L, L) > 0.7})]
    for ctor, inputs, kwargs in runs:
        ours, ref = _mha_pair(**ctor)
        results = []
        for module in (ours, ref):
            leaves = [t.clone().requires_grad_() for t in inputs]
            y = module(*leaves, need_weights=False, **kwargs)[0]
            weight = torch.arange(y.numel(), dtype=D).view(y.shape).sin()
            results.append((y, torch.autograd.grad((y * weight).sum(), leaves + list(module.parameters()))))
        (y, grads), (y_ref, grads_ref) = results
        assert _max_diff(y, y_ref) < 1e-12, ctor
        assert max(map(_max_diff, grads, grads_ref)) < 1e-12, ctor


@pytest.mark.parametrize("batch_first", [False, True])
def test_mha_eval_no_grad_against_torchs_fast_path(route, batch_first):
    # eval + no_grad + self-attention: torch runs its native fast path; ours the flash path
    ours, ref = _mha_pair(batch_first=batch_first)
    ours.eval()
    ref.eval()
    x = torch.randn(2, 5, 8, dtype=D) if batch_first else torch.randn(5, 2, 8, dtype=D)
    kpm = torch.tensor([[False, False, False, True, True], [False] * 5])
    am = torch.rand(5, 5) > 0.7
    am.fill_diagonal_(False)
    with torch.no_grad():
        for kwargs in [{"key_padding_mask": kpm}, {"attn_mask": am, "key_padding_mask": kpm},
                       {"attn_mask": am.expand(4, 5, 5)},
                       {"attn_mask": torch.nn.Transformer.generate_square_subsequent_mask(5, dtype=D),
                        "is_causal": True}]:
            got, want = ours(x, x, x, need_weights=False, **kwargs), ref(x, x, x, need_weights=False, **kwargs)
            assert got[1] is None and want[1] is None
            assert _max_diff(got[0], want[0]) < 1e-12, list(kwargs)


def test_matmul_shapes_biases_activations_and_gradients_exhaustively(interpret):
    # every pairing of 1-D, 2-D, batched, broadcast and empty operands, with and without bias and activation:
    # values, shapes, gradients and (for shapes that do not multiply) the fact of an error, as torch's
    shapes_a = [(3,), (2, 3), (1, 2, 3), (4, 2, 3), (0, 2, 3), (5, 1, 2, 3), (1, 3)]
    shapes_b = [(3,), (3, 4), (1, 3, 4), (4, 3, 4), (3, 0), (1, 5, 3, 4), (3, 1)]
    for sa in shapes_a:
        for sb in shapes_b:
            a, b = torch.randn(*sa, dtype=D), torch.randn(*sb, dtype=D)
            n = 1 if b.dim() == 1 else b.shape[-1]
            for bias in (None, torch.randn(n, dtype=D)):
                try:
                    torch.matmul(a, b)
                except RuntimeError:
                    with pytest.raises((ValueError, RuntimeError)):
                        fusedops.matmul(a, b, bias, "relu")
                    continue
                leaves = [t.clone().requires_grad_() for t in (a, b) + (() if bias is None else (bias,))]
                leaves_ref = [t.clone().requires_grad_() for t in leaves]
                y = fusedops.matmul(*leaves[:2], leaves[2] if bias is not None else None, "relu")
                z = torch.matmul(*leaves_ref[:2])
                y_ref = F.relu(z if bias is None else z + leaves_ref[2])
                assert _max_diff(y, y_ref) < 1e-12, (sa, sb)
                if y.numel():
                    g = torch.randn_like(y_ref)
                    grads = torch.autograd.grad(y, leaves, g)
                    grads_ref = torch.autograd.grad(y_ref, leaves_ref, g)
                    assert max(map(_max_diff, grads, grads_ref)) < 1e-12, (sa, sb)


def test_norms_mixed_dtypes_like_torch_on_the_cpu(route):
    x = torch.randn(3, 4)
    w16, w64 = torch.randn(4).half(), torch.randn(4, dtype=D)
    # rms_norm: any floating weight, the input's dtype out (as torch 2.13's CPU op)
    for inp, weight in [(x, w16), (x, w64), (x.half(), x[0]), (x.bfloat16(), x[0]), (x.double(), x[0])]:
        got, want = fusedops.rms_norm(inp, (4,), weight), F.rms_norm(inp, (4,), weight)
        assert _max_diff(got, want) < (1e-2 if inp.dtype in (torch.half, torch.bfloat16) else 1e-5)
    # layer_norm: float32 parameters with a 16-bit input are torch's CPU "mixed type"; others raise
    got, want = fusedops.layer_norm(x.half(), (4,), x[0]), F.layer_norm(x.half(), (4,), x[0])
    assert _max_diff(got, want) < 1e-2
    for bad in [lambda f: f(x, (4,), w64), lambda f: f(x.half(), (4,), x[0], x[1].half())]:
        with pytest.raises(RuntimeError):
            bad(F.layer_norm)
        with pytest.raises((TypeError, RuntimeError)):
            bad(fusedops.layer_norm)


def test_norm_gradients_with_strided_and_expanded_grad_outputs(interpret):
    x, w, b = torch.randn(3, 4, 5, dtype=D), torch.randn(5, dtype=D), torch.randn(5, dtype=D)
    for g in [torch.randn(5, 4, 3, dtype=D).permute(2, 1, 0), torch.randn(5, dtype=D).expand(3, 4, 5)]:
        for requires in [(False, True, False), (False, False, True), (True, True, True)]:
            grads = []
            for op in (fusedops.layer_norm, F.layer_norm):
                leaves = [t.clone().requires_grad_(r) for t, r in zip((x, w, b), requires)]
                y = op(leaves[0], (5,), leaves[1], leaves[2])
                grads.append(torch.autograd.grad(y, [t for t in leaves if t.requires_grad], g))
            assert max(map(_max_diff, *grads)) < 1e-12


def test_sdpa_broadcasting_masks_and_gqa_gradients(interpret):
    q = torch.randn(1, 2, 3, 4, dtype=D)
    k = torch.randn(1, 2, 5, 4, dtype=D)
    v = torch.randn(1, 2, 5, 3, dtype=D)
    cases = [((torch.randn(3, 2, 3, 4, dtype=D), k, v), {}),                     # query's batch broadcast
             ((q, k[:, :1], v[:, :1]), {}),                                        # heads broadcast
             ((torch.randn(2, 1, 2, 3, 4, dtype=D), torch.randn(3, 2, 5, 4, dtype=D), v), {}),   # 5-D
             ((torch.randn(1, 4, 7, 4, dtype=D), k, v), {"is_causal": True, "enable_gqa": True}),  # L > S
             ((q, k, v), {"attn_mask": torch.tensor([[True] * 5, [False] * 5, [True, False] * 2 + [True]])})]
    for inputs, kwargs in cases:
        grads = []
        for op in (fusedops.scaled_dot_product_attention, F.scaled_dot_product_attention):
            leaves = [t.clone().requires_grad_() for t in inputs]
            y = op(*leaves, **kwargs)
            grads.append((y, *torch.autograd.grad((y * y.detach().sin()).sum(), leaves)))
        assert max(map(_max_diff, *grads)) < 1e-12, kwargs


def test_cpu_autocast_matches_torch(route):
    x = torch.randn(3, 4)
    ours, ref = _linear_pair(4, 2)
    q = torch.randn(1, 2, 3, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for got, want in [(fusedops.softmax(x, -1), torch.softmax(x, -1)),
                          (fusedops.layer_norm(x, (4,)), F.layer_norm(x, (4,))),
                          (fusedops.rms_norm(x, (4,)), F.rms_norm(x, (4,))),
                          (fusedops.matmul(x, x.t()), torch.matmul(x, x.t())),
                          (fusedops.scaled_dot_product_attention(q, q, q), F.scaled_dot_product_attention(q, q, q)),
                          (ours(x), ref(x))]:
            assert _max_diff(got, want) < 5e-2


def test_checkpoint_and_save_on_cpu_through_every_op(interpret):
    w = torch.randn(8, dtype=D, requires_grad=True)
    W = torch.randn(8, 8, dtype=D, requires_grad=True)

    def block(softmax, layer_norm, rms_norm, linear_gelu, attention):
        def f(x):
            y = rms_norm(layer_norm(x, (8,), w, w), (8,), w)
            q = linear_gelu(y).view(2, 3, 8)[None]
            return softmax(attention(q, q, q, is_causal=True), -1)
        return f

    ours = block(fusedops.softmax, fusedops.layer_norm, fusedops.rms_norm,
                 lambda y: fusedops.matmul(y, W, w, "gelu"), fusedops.scaled_dot_product_attention)
    ref = block(torch.softmax, F.layer_norm, F.rms_norm, lambda y: F.gelu(y @ W + w), F.scaled_dot_product_attention)
    x0 = torch.randn(6, 8, dtype=D)
    weight = torch.arange(8.0, dtype=D)

    def grads(f, mode):
        x = x0.clone().requires_grad_()
        if mode == "checkpoint":
            y = torch.utils.checkpoint.checkpoint(f, x, use_reentrant=False)
        elif mode == "save_on_cpu":
            with torch.autograd.graph.save_on_cpu():
                y = f(x)
        else:
            y = f(x)
        return torch.autograd.grad((y * weight).sum(), [x, w, W])

    expected = grads(ref, "plain")
    for mode in ("plain", "checkpoint", "save_on_cpu"):
        assert max(map(_max_diff, grads(ours, mode), expected)) < 1e-12, mode


def test_modules_on_meta_and_fake_tensors(route):
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.empty(2, 3, 8, device="meta")
    for module in [fnn.Linear(8, 4, device="meta"), fnn.LayerNorm(8, device="meta"), fnn.RMSNorm(8, device="meta"),
                   fnn.Softmax(-1)]:
        y = module(x)
        assert y.device.type == "meta" and y.shape[:2] == (2, 3)
    mha = fnn.MultiheadAttention(8, 2, device="meta")
    assert mha(x, x, x, need_weights=False)[0].shape == (2, 3, 8)
    with FakeTensorMode():
        y = torch.empty(2, 3, 8)
        assert fnn.MultiheadAttention(8, 2)(y, y, y, need_weights=False)[0].shape == (2, 3, 8)
        assert copy.copy(fnn.Linear(8, 4))(y).shape == (2, 3, 4)


def test_transformers_attention_trims_a_four_d_mask_to_the_key_length(interpret):
    # transformers' "sdpa" attention slices a 4-D mask built for a longer (static) cache to the keys it
    # attends to; the adapter does the same (no transformers needed: the function takes any module)
    from fusedops.nn.attention import transformers_attention_forward

    class Module(torch.nn.Module):
        is_causal = False
        num_key_value_groups = 1

    generator = torch.Generator().manual_seed(22)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=generator) for _ in range(3))
    mask = torch.randn(2, 1, 5, 9, generator=generator)          # 9 cached positions, 5 keys filled
    out, weights = transformers_attention_forward(Module(), q, k, v, mask)
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask[..., :5].double())
    assert weights is None
    torch.testing.assert_close(out, expected.transpose(1, 2).float(), atol=1e-5, rtol=1e-5)
