"""Review (session 23): a demanding PyTorch user tried to break fusedops.scaled_dot_product_attention,
fusedops.matmul / fusedops.nn.Linear and fusedops.nn.MultiheadAttention on the CPU, with torch 2.13 itself as
the oracle (float64 where numerics matter), on both CPU routes: the kernels in the NumPy interpreter
(FUSEDOPS_INTERPRET=1, what CUDA tensors take) and the torch fallback (what a CPU user gets by default).

Cases were drawn from bug reports of peer projects (pytorch/pytorch, Dao-AILab/flash-attention, transformers):
  - SDPA: causal masks with L != S (torch's top-left alignment, flash-attention's bottom-right debate), rows
    masked everywhere (pytorch#103963/#103749: torch now gives 0, fusedops documents 0 and finite gradients),
    finfo.min masks (pytorch#110213), NaN in masked-out keys (pytorch#101967), -inf / +inf additive masks,
    mask dtypes/shapes/devices, GQA (enable_gqa, K and V head counts differing), heads and batch broadcasting,
    3-D/5-D inputs, scale 0 / negative / numpy / 0-d tensor, dropout_p, empty dims (B, L, S, E, Ev = 0),
    non-contiguous / expanded / packed-qkv inputs and grad outputs, float64 gradcheck, torch.func (grad,
    vmap), forward-mode AD, torch.compile (aot_eager), autocast, a randomized forward+backward sweep.
  - matmul / Linear: torch.matmul's 1-D and batch-broadcast shape rules and their gradients, zero sizes,
    bias shapes/dtypes, transposed/strided/expanded operands and grad outputs, int/bool/complex rejection,
    16-bit numerics ("linear bias fp16 accumulate overflow"), out_dtype.
  - MultiheadAttention (need_weights=False, the flash path): key_padding_mask / attn_mask (bool, float, 2-D,
    3-D, merged, fully masked), the is_causal hint, batch_first, unbatched inputs, kdim/vdim, bias=False,
    torch's errors, against torch.nn.MultiheadAttention with the same state_dict.

Defects found are strict xfails asserting torch's behaviour (see each reason):
  1. the torch fallback of fusedops.matmul (autograd/matmul_reference.py `reference`) rounds a 16-bit product to 16 bits
     before adding the bias / casting to out_dtype: fusedops.nn.Linear(fp16) on the CPU gives inf where
     torch.nn.Linear gives 40000, matmul(out_dtype=float32) inf where the kernels give 80000 (also under
     torch.vmap on the kernel route, which runs that reference);
  2. under torch.compile, scaled_dot_product_attention(attn_mask=..., is_causal=True) raises wherever the
     compiled path runs torch's op (library/attention_ops.py calls F.scaled_dot_product_attention directly
     instead of autograd.attention.torch_attention), though eager fusedops documents and supports the pair;
  3. the input gradient of fusedops.matmul(a16, b16, out_dtype=float32) rounds dC to float16 first
     (MatmulFunction.backward's dc.to(a.dtype)), so a float32 output gradient over 65504 (loss scaling)
     gives an inf dA where dC @ B^T is finite;
  4. on the kernel route, is_causal=1 / enable_gqa=1 (TypeError in torch and in a first fusedops call) is
     accepted once a call with True and the same layouts was remembered: autograd/attention._argument_key
     puts the flags in a dict key, where 1 == True.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.nn as fnn

D = torch.float64
sdpa = fusedops.scaled_dot_product_attention


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    return 0.0 if a.numel() == 0 else (a.double() - b.double()).abs().max().item()


def _torch_sdpa(q, k, v, attn_mask=None, is_causal=False, **kwargs):
    """torch's SDPA with fusedops' documented semantics for attn_mask + is_causal (both apply, top-left)."""
    if attn_mask is not None and is_causal:
        keep = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool).tril()
        attn_mask = attn_mask & keep if attn_mask.dtype == torch.bool else attn_mask.masked_fill(~keep, -math.inf)
        is_causal = False
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kwargs)


def _outputs_and_grads(fn, tensors, grad_out=None):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    if grad_out is None:
        grad_out = torch.ones_like(out)
    grads = torch.autograd.grad(out, leaves, grad_out(out) if callable(grad_out) else grad_out, allow_unused=True)
    return out, grads


def _assert_attention_like_torch(q, k, v, tol=1e-12, grad_out=None, **kwargs):
    torch.manual_seed(7)
    gen = grad_out or (lambda o: torch.randn(o.shape, dtype=o.dtype))
    go_holder = {}

    def go(o):
        if "go" not in go_holder:
            go_holder["go"] = gen(o)
        return go_holder["go"]

    o1, g1 = _outputs_and_grads(lambda a, b, c: sdpa(a, b, c, **kwargs), (q, k, v), go)
    o2, g2 = _outputs_and_grads(lambda a, b, c: _torch_sdpa(a, b, c, **kwargs), (q, k, v), go)
    assert _max_diff(o1, o2) < tol
    assert not o1.isnan().any()
    for x, y in zip(g1, g2):
        assert _max_diff(x, y) < tol


# =================================================================================================
# Defects
# =================================================================================================
def _fp16_overflow_operands():
    a = torch.full((2, 4), 100.0, dtype=torch.float16)
    b = torch.full((4, 3), 200.0, dtype=torch.float16)          # a @ b = 80000 > finfo(float16).max
    bias = torch.full((3,), -40000.0, dtype=torch.float16)     # a @ b + bias = 40000: representable
    return a, b, bias


def _fp16_linear_pair():
    a, b, bias = _fp16_overflow_operands()
    ours = fnn.Linear(4, 3, dtype=torch.float16)
    ref = torch.nn.Linear(4, 3, dtype=torch.float16)
    with torch.no_grad():
        ref.weight.copy_(b.t())
        ref.bias.copy_(bias)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ours, ref, a


def test_fp16_linear_bias_is_added_before_rounding_on_the_kernel_route(interpret):
    ours, ref, x = _fp16_linear_pair()
    want = ref(x)
    assert want[0, 0].item() == 40000.0      # torch's addmm: a @ b + bias accumulated in float32
    assert torch.equal(ours(x), want)
    a, b, bias = _fp16_overflow_operands()
    assert torch.equal(fusedops.matmul(a, b, bias), torch.addmm(bias, a, b))
    assert fusedops.matmul(a, b, out_dtype=torch.float32)[0, 0].item() == 80000.0


# Fixed in session 23 (was: matmul's torch fallback (autograd/matmul_reference.reference) rounds the fp16 ...).
def test_fp16_linear_bias_is_added_before_rounding_on_the_cpu(fallback):
    ours, ref, x = _fp16_linear_pair()
    want = ref(x)
    assert want[0, 0].item() == 40000.0
    assert torch.equal(ours(x), want)


# Fixed in session 23 (was: matmul's torch fallback computes a 16-bit product in 16 bits and casts ...).
def test_fp16_matmul_out_dtype_float32_on_the_cpu(fallback):
    a, b, bias = _fp16_overflow_operands()
    assert torch.equal(fusedops.matmul(a, b, bias), torch.addmm(bias, a, b))
    assert fusedops.matmul(a, b, out_dtype=torch.float32)[0, 0].item() == 80000.0


# Fixed in session 23 (was: under torch.vmap the kernel route runs matmul's torch fallback, which ...).
def test_fp16_matmul_under_vmap_on_the_kernel_route(interpret):
    a, b, bias = _fp16_overflow_operands()
    batch = a.expand(3, 2, 4)
    got = torch.vmap(lambda x: fusedops.matmul(x, b, out_dtype=torch.float32))(batch)
    assert (got == 80000.0).all()
    got = torch.vmap(lambda x: fusedops.matmul(x, b, bias))(batch)
    assert torch.equal(got, torch.addmm(bias, a, b).expand(3, 2, 3))


# Fixed in session 23 (was: MatmulFunction.backward rounds a float32 dC to the fp16 inputs' dtype ...).
def test_fp16_matmul_out_dtype_float32_input_gradient(route):
    a = torch.randn(2, 3, dtype=torch.float16, requires_grad=True)
    b = torch.full((3, 4), 1e-3, dtype=torch.float16)
    out = fusedops.matmul(a, b, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    grad_out = torch.full((2, 4), 1e5)                  # a float32 gradient (e.g. a scaled loss)
    (da,) = torch.autograd.grad(out, a, grad_out)
    want = (grad_out.double() @ b.double().t()).to(torch.float16)   # 400.25: representable in float16
    assert torch.isfinite(want).all()
    assert torch.equal(da, want)


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="aot_eager", fullgraph=True)


def _mask_and_causal_case(head_dim=4):
    q = torch.randn(1, 2, 3, head_dim, dtype=D)
    k = torch.randn(1, 2, 5, head_dim, dtype=D)
    v = torch.randn(1, 2, 5, 3, dtype=D)
    mask = torch.randn(3, 5, dtype=D)
    return q, k, v, mask


def test_compiled_attention_with_mask_and_causal_on_the_kernel_route(interpret):
    q, k, v, mask = _mask_and_causal_case()
    want = _torch_sdpa(q, k, v, attn_mask=mask, is_causal=True)
    assert _max_diff(sdpa(q, k, v, attn_mask=mask, is_causal=True), want) < 1e-12   # eager: both apply
    got = _compiled(lambda a, b, c, m: sdpa(a, b, c, attn_mask=m, is_causal=True))(q, k, v, mask)
    assert _max_diff(got, want) < 1e-12


# Fixed in session 23 (was: torch.compile of sdpa(attn_mask=..., is_causal=True) raises on the CPU: ...).
def test_compiled_attention_with_mask_and_causal_on_the_cpu(fallback):
    q, k, v, mask = _mask_and_causal_case()
    want = _torch_sdpa(q, k, v, attn_mask=mask, is_causal=True)
    assert _max_diff(sdpa(q, k, v, attn_mask=mask, is_causal=True), want) < 1e-12     # eager works
    got = _compiled(lambda a, b, c, m: sdpa(a, b, c, attn_mask=m, is_causal=True))(q, k, v, mask)
    assert _max_diff(got, want) < 1e-12


# Fixed in session 23 (was: torch.compile of sdpa(attn_mask=..., is_causal=True) raises when the ...).
@pytest.mark.parametrize("case", ["mask_requires_grad", "head_dim_300"])
def test_compiled_attention_with_mask_and_causal_where_torch_runs(interpret, case):
    q, k, v, mask = _mask_and_causal_case(300 if case == "head_dim_300" else 4)
    if case == "mask_requires_grad":
        mask.requires_grad_()
    want = _torch_sdpa(q, k, v, attn_mask=mask, is_causal=True)
    assert _max_diff(sdpa(q, k, v, attn_mask=mask, is_causal=True), want) < 1e-12     # eager works
    got = _compiled(lambda a, b, c, m: sdpa(a, b, c, attn_mask=m, is_causal=True))(q, k, v, mask)
    assert _max_diff(got, want) < 1e-12


# =================================================================================================
# scaled_dot_product_attention: checked, matches torch
# =================================================================================================
def _qkv(b=2, h=3, hk=None, l=5, s=7, e=4, ev=6):
    hk = h if hk is None else hk
    return (torch.randn(b, h, l, e, dtype=D), torch.randn(b, hk, s, e, dtype=D), torch.randn(b, hk, s, ev, dtype=D))


def _row_mask():
    mask = torch.zeros(5, 7, dtype=torch.bool)
    mask[0, 0] = True
    mask[2:] = True
    mask[3, 4] = False          # row 1 masked everywhere
    return mask


ATTENTION_CASES = {
    "plain": (lambda: _qkv(), {}),
    "causal_L_lt_S": (lambda: _qkv(l=5, s=7), dict(is_causal=True)),
    "causal_L_gt_S": (lambda: _qkv(l=9, s=4), dict(is_causal=True)),
    "causal_multi_block_L_gt_S": (lambda: _qkv(b=1, h=1, l=40, s=19, e=3, ev=5), dict(is_causal=True)),
    "fully_masked_row_bool": (lambda: _qkv(), dict(attn_mask=_row_mask())),
    "fully_masked_row_neg_inf": (lambda: _qkv(), dict(attn_mask=torch.zeros(5, 7, dtype=D).masked_fill(
        ~_row_mask(), -math.inf))),
    "mask_and_causal_fully_masked_row": (lambda: _qkv(), dict(attn_mask=_row_mask(), is_causal=True)),
    "float32_mask_float64_query": (lambda: _qkv(), dict(attn_mask=torch.randn(5, 7))),
    "mask_broadcast_keys_only": (lambda: _qkv(), dict(attn_mask=torch.rand(2, 1, 1, 7) > 0.3)),
    "scale_zero": (lambda: _qkv(), dict(scale=0.0)),
    "scale_negative": (lambda: _qkv(), dict(scale=-2.5)),
    "gqa": (lambda: _qkv(h=6, hk=3), dict(enable_gqa=True)),
    "gqa_causal_mask": (lambda: _qkv(h=6, hk=2, l=17, s=20), dict(enable_gqa=True, is_causal=True,
                                                              attn_mask=torch.randn(6, 17, 20, dtype=D))),
    "gqa_kv_head_counts_differ": (lambda: (torch.randn(1, 4, 5, 8, dtype=D), torch.randn(1, 2, 6, 8, dtype=D),
                                           torch.randn(1, 1, 6, 8, dtype=D)), dict(enable_gqa=True)),
    "kv_heads_broadcast": (lambda: _qkv(h=6, hk=1), {}),
    "q_heads_broadcast": (lambda: (torch.randn(1, 1, 5, 8, dtype=D), torch.randn(1, 4, 6, 8, dtype=D),
                                   torch.randn(1, 4, 6, 8, dtype=D)), {}),
    "three_d": (lambda: tuple(t[0] for t in _qkv()), {}),
    "two_d": (lambda: tuple(t[0, 0] for t in _qkv()), {}),
    "two_d_query_four_d_kv": (lambda: (_qkv()[0][0, 0], *_qkv()[1:]), {}),
    "five_d_broadcast": (lambda: (torch.randn(2, 2, 3, 5, 4, dtype=D), torch.randn(2, 1, 3, 7, 4, dtype=D),
                                  torch.randn(1, 2, 3, 7, 6, dtype=D)), {}),
    "batch_broadcast_kv": (lambda: (_qkv()[0], *(t[:1] for t in _qkv()[1:])), {}),
    "head_dims_not_powers_of_two": (lambda: _qkv(b=1, h=1, l=33, s=37, e=3, ev=5), dict(is_causal=True)),
    "size_one_dims": (lambda: _qkv(b=1, h=1, l=1, s=1, e=1, ev=1), {}),
    "empty_L": (lambda: _qkv(l=0), {}),
    "empty_S": (lambda: _qkv(s=0), {}),
    "empty_E": (lambda: _qkv(e=0), {}),
    "empty_Ev": (lambda: _qkv(ev=0), {}),
    "empty_batch": (lambda: _qkv(b=0), {}),
}


@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_attention_values_and_gradients_like_torch(route, case):
    make, kwargs = ATTENTION_CASES[case]
    torch.manual_seed(sum(map(ord, case)))
    q, k, v = make()
    _assert_attention_like_torch(q, k, v, **kwargs)


@pytest.mark.parametrize("layout", ["transposed_inputs", "expanded_inputs", "packed_qkv",
                                    "expanded_grad_out", "transposed_grad_out"])
def test_attention_strided_inputs_and_grad_outputs(route, layout):
    q, k, v = _qkv()
    grad_out = None
    if layout == "transposed_inputs":
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
        k = k.transpose(-1, -2).contiguous().transpose(-1, -2)
        v = torch.randn(2, 3, 7, 12, dtype=D)[..., ::2]
    elif layout == "expanded_inputs":
        q = q[:1].expand(2, -1, -1, -1)
        k = k[:, :1].expand(-1, 3, -1, -1)
    elif layout == "packed_qkv":
        packed = torch.randn(2, 7, 3, 3, 4, dtype=D)
        q, k, v = (packed[:, :, i].transpose(1, 2) for i in range(3))
    elif layout == "expanded_grad_out":
        grad_out = lambda o: torch.randn(1, 1, 1, o.size(-1), dtype=D).expand(o.shape)  # noqa: E731
    else:
        grad_out = lambda o: torch.randn(o.shape[::-1], dtype=D).permute(3, 2, 1, 0)  # noqa: E731
    _assert_attention_like_torch(q, k, v, grad_out=grad_out, is_causal=True)


def test_attention_same_tensor_for_query_key_value(route):
    x = torch.randn(1, 2, 5, 4, dtype=D, requires_grad=True)
    (g1,) = torch.autograd.grad((sdpa(x, x, x) ** 2).sum(), x)
    (g2,) = torch.autograd.grad((F.scaled_dot_product_attention(x, x, x) ** 2).sum(), x)
    assert _max_diff(g1, g2) < 1e-12


def test_attention_randomized_sweep(interpret):
    """Random shapes, layouts, masks (bool, float, -inf, broadcast), causal, scale and GQA: output and
    gradients against torch's float64 SDPA (pytorch's own flash/efficient kernels were hit by many of these)."""
    rng = random.Random(23)
    for _ in range(30):
        hk, group = rng.choice([1, 2]), rng.choice([1, 2, 3])
        gqa = group > 1 or rng.random() < 0.3
        b, h = rng.choice([1, 2]), (hk * group if gqa else hk)
        l, s = rng.choice([1, 2, 16, 17, 33]), rng.choice([1, 3, 16, 17, 40])
        e, ev = rng.choice([1, 3, 8, 17]), rng.choice([1, 5, 16])
        kind = rng.choice(["none", "bool", "float", "neg_inf"])
        shape = rng.choice([(l, s), (1, h, l, s), (b, 1, 1, s), (b, h, l, s), (h, 1, s)])
        mask = None
        if kind == "bool":
            mask = torch.rand(shape) > 0.3
        elif kind == "float":
            mask = torch.randn(shape, dtype=D)
        elif kind == "neg_inf":
            mask = torch.randn(shape, dtype=D).masked_fill(torch.rand(shape) < 0.4, -math.inf)
        q, k, v = (torch.randn(b, h, l, e, dtype=D), torch.randn(b, hk, s, e, dtype=D),
                   torch.randn(b, hk, s, ev, dtype=D))
        if rng.random() < 0.3:
            q = q.transpose(1, 2).contiguous().transpose(1, 2)
        if rng.random() < 0.3 and b == 2:
            k = k[:1].expand(2, -1, -1, -1)
        _assert_attention_like_torch(q, k, v, tol=1e-11, attn_mask=mask, is_causal=rng.random() < 0.5,
                                     scale=rng.choice([None, 0.3, -1.0]), enable_gqa=gqa)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_attention_low_precision_against_float64(interpret, dtype):
    q, k, v = (torch.randn(1, 2, 20, 8, dtype=dtype), torch.randn(1, 2, 37, 8, dtype=dtype),
               torch.randn(1, 2, 37, 8, dtype=dtype))
    mask = torch.randn(20, 37)          # a float32 mask: torch accepts it for 16-bit queries
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask.double())
    ours = sdpa(q, k, v, attn_mask=mask)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert ours.dtype == dtype
    assert _max_diff(ours.double(), want) <= 2 * _max_diff(theirs.double(), want) + 1e-6
    # Hugging Face's finfo.min padding (pytorch#110213): no NaN, torch's values
    hf = torch.zeros(20, 37, dtype=dtype)
    hf[:, 5:] = torch.finfo(dtype).min
    hf[3] = torch.finfo(dtype).min      # a row masked everywhere by finfo.min attends to every key
    got, want = sdpa(q, k, v, attn_mask=hf), F.scaled_dot_product_attention(q, k, v, attn_mask=hf)
    assert not got.isnan().any()
    assert _max_diff(got, want) < {torch.float16: 2e-3, torch.bfloat16: 8e-3, torch.float32: 1e-6}[dtype]


def test_attention_nan_in_masked_out_keys_stays_out(route):
    """pytorch#101967: a NaN key that the boolean mask leaves out. torch 2.13 still gives NaN rows; fusedops
    (kernels) gives the rows of attention over the kept keys; either way never a NaN where torch has none."""
    q, k, v = _qkv(b=1, h=1, l=4, s=6, e=8, ev=8)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[:, 5] = False
    k[0, 0, 5] = float("nan")
    got = sdpa(q, k, v, attn_mask=mask)
    clean = F.scaled_dot_product_attention(q, k[:, :, :5], v[:, :, :5])
    if route == "interpret":
        assert _max_diff(got, clean) < 1e-12
    else:
        assert torch.equal(got.isnan(), F.scaled_dot_product_attention(q, k, v, attn_mask=mask).isnan())
    # a NaN key cut off by is_causal stays out on both
    k2 = torch.randn(1, 1, 6, 8, dtype=D)
    k2[0, 0, 5] = float("nan")
    got = sdpa(q, k2, v, is_causal=True)
    assert _max_diff(got, F.scaled_dot_product_attention(q, k2, v, is_causal=True)) < 1e-12


def test_attention_special_values_like_torch(route):
    q, k, v = _qkv(b=1, h=1, l=4, s=6)
    q_inf = q.clone()
    q_inf[0, 0, 0, 0] = float("inf")
    plus_inf = torch.zeros(4, 6, dtype=D)
    plus_inf[0, 0] = float("inf")
    for args, kwargs in (((q_inf, k, v), {}), ((q, k, v), dict(attn_mask=plus_inf)),
                         ((q, k, v), dict(scale=float("inf")))):
        got, want = sdpa(*args, **kwargs), F.scaled_dot_product_attention(*args, **kwargs)
        assert torch.equal(got.isnan(), want.isnan())
        assert _max_diff(got.nan_to_num(0.0), want.nan_to_num(0.0)) < 1e-12


def test_attention_scale_and_dropout_argument_types(route):
    import numpy as np

    q, k, v = _qkv(b=1, h=1)
    for scale in (np.float64(0.5), np.float32(0.5), np.int64(2), torch.tensor(0.5), 2):
        assert _max_diff(sdpa(q, k, v, scale=scale), F.scaled_dot_product_attention(q, k, v, scale=scale)) < 1e-12
    for p in (np.float64(0.0), 0, torch.tensor(0.0)):
        assert _max_diff(sdpa(q, k, v, dropout_p=p), F.scaled_dot_product_attention(q, k, v, dropout_p=p)) < 1e-12


ERROR_CASES = {
    "mask_float16_for_float64": (dict(attn_mask=torch.zeros(5, 7, dtype=torch.float16)), RuntimeError, "attn_mask"),
    "mask_uint8": (dict(attn_mask=torch.ones(5, 7, dtype=torch.uint8)), RuntimeError, "attn_mask"),
    "mask_int64": (dict(attn_mask=torch.ones(5, 7, dtype=torch.int64)), RuntimeError, "attn_mask"),
    "mask_bad_shape": (dict(attn_mask=torch.ones(5, 6, dtype=torch.bool)), RuntimeError, "attn_mask"),
    "mask_list": (dict(attn_mask=[[True] * 7] * 5), TypeError, "attn_mask"),
    "mask_meta": (dict(attn_mask=torch.zeros(5, 7, device="meta")), RuntimeError, "attn_mask"),
    "scale_str": (dict(scale="a"), TypeError, "scale"),
    "dropout_str": (dict(dropout_p="0"), TypeError, "dropout_p"),
    "is_causal_str": (dict(is_causal="yes"), TypeError, "is_causal"),
    "is_causal_int": (dict(is_causal=1), TypeError, "is_causal"),
    "is_causal_none": (dict(is_causal=None), TypeError, "is_causal"),
    "enable_gqa_none": (dict(enable_gqa=None), TypeError, "enable_gqa"),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_attention_argument_errors_name_the_argument(route, case):
    kwargs, error, word = ERROR_CASES[case]
    q, k, v = _qkv(b=1, h=1, l=5, s=7, e=3, ev=2)    # a layout no other test runs (see the cached-launch defect)
    with pytest.raises(error, match=word):
        sdpa(q, k, v, **kwargs)
    if case != "mask_meta":     # (torch 2.13 does not check a meta mask against CPU inputs)
        with pytest.raises(error):
            F.scaled_dot_product_attention(q, k, v, **kwargs)


# Fixed in session 23 (was: a call with is_causal/enable_gqa 1 or 0 hits the launch cache of an ...).
@pytest.mark.parametrize("flag", ["is_causal", "enable_gqa"])
def test_attention_int_flags_refused_after_a_cached_call(interpret, flag):
    q, k, v = _qkv(b=1, h=2, l=3, s=4, e=5, ev=3)
    with pytest.raises(TypeError, match=flag):          # a first call: refused, as torch
        sdpa(q, k, v, **{flag: 1})
    with pytest.raises(TypeError, match=flag):
        F.scaled_dot_product_attention(q, k, v, **{flag: 1})
    sdpa(q, k, v, **{flag: True})                       # the same layouts with a bool: remembered
    with pytest.raises(TypeError, match=flag):
        sdpa(q, k, v, **{flag: 1})


@pytest.mark.parametrize("case", ["heads_do_not_divide", "kv_heads_over_query_heads", "dtypes_differ",
                                  "head_dims_differ", "key_value_lengths_differ", "one_d"])
def test_attention_shape_and_dtype_errors_like_torch(route, case):
    q, k, v = _qkv(h=6, hk=4)
    kwargs = dict(enable_gqa=True)
    if case == "kv_heads_over_query_heads":
        q = q[:, :2]
    elif case == "dtypes_differ":
        k, kwargs = k.float(), {}
    elif case == "head_dims_differ":
        k, kwargs = k[..., :3], {}
    elif case == "key_value_lengths_differ":
        q, k, v = q[:, :4], k[:, :2], v[:, :2, :6]      # heads divide; S = 7 for key, 6 for value
    elif case == "one_d":
        q, kwargs = q[0, 0, 0], {}
    with pytest.raises(RuntimeError) as theirs:
        F.scaled_dot_product_attention(q, k, v, **kwargs)
    with pytest.raises(type(theirs.value)):
        sdpa(q, k, v, **kwargs)


def test_attention_dropout_is_refused_on_the_kernel_route_only(route):
    q, k, v = _qkv()
    if route == "interpret":
        with pytest.raises(NotImplementedError, match="dropout_p"):
            sdpa(q, k, v, dropout_p=0.1)
    else:
        torch.manual_seed(0)
        got = sdpa(q, k, v, dropout_p=0.1)
        torch.manual_seed(0)
        assert _max_diff(got, F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)) < 1e-12


def test_attention_gradcheck_float64(interpret):
    q = torch.randn(1, 2, 3, 4, dtype=D, requires_grad=True)
    k = torch.randn(1, 1, 5, 4, dtype=D, requires_grad=True)
    v = torch.randn(1, 1, 5, 3, dtype=D, requires_grad=True)
    mask = torch.randn(2, 3, 5, dtype=D)
    assert torch.autograd.gradcheck(
        lambda a, b, c: sdpa(a, b, c, attn_mask=mask, is_causal=True, enable_gqa=True, scale=0.7), (q, k, v))


def test_attention_mask_gradient_like_torch(route):
    q, k, v = _qkv()
    mask = torch.randn(3, 5, 7, dtype=D, requires_grad=True)
    (g1,) = torch.autograd.grad(sdpa(q, k, v, attn_mask=mask).pow(2).sum(), mask)
    (g2,) = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, attn_mask=mask).pow(2).sum(), mask)
    assert _max_diff(g1, g2) < 1e-12


def test_attention_double_backward_is_a_python_error(interpret):
    q, k, v = (t.requires_grad_() for t in _qkv())
    (g,) = torch.autograd.grad(sdpa(q, k, v).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="twice"):
        g.sum().backward()


def test_attention_under_torch_func(route):
    from torch.func import grad, jvp, vmap

    q, k, v = _qkv(b=1, h=2, hk=1, l=3, s=5)
    mask = torch.randn(2, 3, 5, dtype=D)
    g1 = grad(lambda a: sdpa(a, k, v, enable_gqa=True).pow(2).sum())(q)
    g2 = grad(lambda a: F.scaled_dot_product_attention(a, k, v, enable_gqa=True).pow(2).sum())(q)
    assert _max_diff(g1, g2) < 1e-12
    qs = torch.randn(3, *q.shape, dtype=D)
    got = vmap(lambda a: sdpa(a, k, v, attn_mask=mask, is_causal=True, enable_gqa=True))(qs)
    want = vmap(lambda a: _torch_sdpa(a, k, v, attn_mask=mask, is_causal=True, enable_gqa=True))(qs)
    assert _max_diff(got, want) < 1e-12
    tangent = torch.randn_like(q)
    _, t1 = jvp(lambda a: sdpa(a, k, v, enable_gqa=True), (q,), (tangent,))
    _, t2 = jvp(lambda a: F.scaled_dot_product_attention(a, k, v, enable_gqa=True), (q,), (tangent,))
    assert _max_diff(t1, t2) < 1e-12


@pytest.mark.parametrize("kwargs", [{}, dict(is_causal=True), dict(attn_mask="mask"),
                                    dict(attn_mask="mask", is_causal=True), dict(enable_gqa=True)])
def test_compiled_attention_gradients(interpret, kwargs):
    q, k, v = _qkv(b=2, h=4, hk=2 if kwargs.get("enable_gqa") else 4, l=3, s=5, e=4, ev=3)
    if kwargs.get("attn_mask") == "mask":
        mask = torch.rand(3, 5) > 0.4
        mask[:, 0] = True
        mask[1] = False
        kwargs = dict(kwargs, attn_mask=mask)
    go = torch.randn(2, 4, 3, 3, dtype=D)
    o1, g1 = _outputs_and_grads(_compiled(lambda a, b, c: sdpa(a, b, c, **kwargs)), (q, k, v), go)
    o2, g2 = _outputs_and_grads(lambda a, b, c: _torch_sdpa(a, b, c, **kwargs), (q, k, v), go)
    for x, y in zip((o1, *g1), (o2, *g2)):
        assert _max_diff(x, y) < 1e-12


def test_attention_under_cpu_autocast(route):
    q, k, v = (torch.randn(1, 2, 5, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8))
    mask = torch.randn(5, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = sdpa(q, k, v, attn_mask=mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert got.dtype == want.dtype == torch.bfloat16
    assert _max_diff(got, want) < 1e-2


# =================================================================================================
# matmul / Linear: checked, match torch
# =================================================================================================
MATMUL_CASES = {
    "2d": ((3, 4), (4, 5), None),
    "1d_2d": ((4,), (4, 5), None),
    "2d_1d": ((3, 4), (4,), None),
    "1d_1d": ((4,), (4,), None),
    "1d_1d_bias": ((4,), (4,), 1),
    "1d_3d_bias": ((4,), (2, 4, 5), 5),
    "3d_1d_bias": ((2, 3, 4), (4,), 1),
    "broadcast_batches": ((2, 1, 3, 4), (5, 4, 6), 6),
    "broadcast_batches_both": ((2, 1, 3, 4), (1, 5, 4, 6), None),
    "4d_2d": ((2, 3, 3, 4), (4, 6), 6),
    "2d_4d": ((3, 4), (2, 3, 4, 6), None),
    "k0_bias": ((3, 0), (0, 5), 5),
    "k0": ((3, 0), (0, 5), None),
    "m0": ((0, 4), (4, 5), 5),
    "n0": ((3, 4), (4, 0), 0),
    "batch0": ((0, 3, 4), (4, 5), None),
    "batch0_broadcast": ((0, 1, 3, 4), (2, 4, 5), None),
}


@pytest.mark.parametrize("case", list(MATMUL_CASES))
def test_matmul_shapes_values_and_gradients(route, case):
    a_shape, b_shape, bias_size = MATMUL_CASES[case]
    tensors = [torch.randn(a_shape, dtype=D), torch.randn(b_shape, dtype=D)]
    if bias_size is not None:
        tensors.append(torch.randn(bias_size, dtype=D))
    o1, g1 = _outputs_and_grads(lambda *t: fusedops.matmul(*t), tensors, lambda o: torch.ones_like(o) * 0.5)
    o2, g2 = _outputs_and_grads(lambda a, b, *bias: torch.matmul(a, b) + (bias[0] if bias else 0), tensors,
                                lambda o: torch.ones_like(o) * 0.5)
    for x, y in zip((o1, *g1), (o2, *g2)):
        assert _max_diff(x, y) < 1e-12


@pytest.mark.parametrize("layout", ["transposed", "strided", "expanded", "expanded_grad_out",
                                    "transposed_grad_out"])
def test_matmul_strided_operands_and_grad_outputs(route, layout):
    a, b, bias = torch.randn(2, 3, 4, dtype=D), torch.randn(4, 5, dtype=D), torch.randn(5, dtype=D)
    grad_out = lambda o: torch.randn(o.shape, dtype=D)  # noqa: E731
    if layout == "transposed":
        a, b = torch.randn(2, 4, 3, dtype=D).transpose(1, 2), torch.randn(5, 4, dtype=D).t()
    elif layout == "strided":
        a, b = torch.randn(2, 6, 8, dtype=D)[:, ::2, ::2], torch.randn(8, 10, dtype=D)[::2, 1::2]
    elif layout == "expanded":
        a = torch.randn(1, 3, 4, dtype=D).expand(2, 3, 4)
    elif layout == "expanded_grad_out":
        grad_out = lambda o: torch.randn(1, 5, dtype=D).expand(o.shape)  # noqa: E731
    else:
        grad_out = lambda o: torch.randn(o.shape[::-1], dtype=D).permute(2, 1, 0)  # noqa: E731
    torch.manual_seed(3)
    o1, g1 = _outputs_and_grads(lambda x, y, z: fusedops.matmul(x, y, z, activation="gelu"), (a, b, bias), grad_out)
    torch.manual_seed(3)
    o2, g2 = _outputs_and_grads(lambda x, y, z: F.gelu(x @ y + z), (a, b, bias), grad_out)
    for x, y in zip((o1, *g1), (o2, *g2)):
        assert _max_diff(x, y) < 1e-12


@pytest.mark.parametrize("case", ["int", "bool", "complex", "mixed_dtypes", "zero_d", "mismatch",
                                  "bias_2d", "bias_0d", "bias_wrong_length", "bad_activation", "not_a_tensor"])
def test_matmul_rejections_name_the_argument(route, case):
    a, b = torch.randn(3, 4, dtype=D), torch.randn(4, 5, dtype=D)
    kwargs, error, word = {}, ValueError, "bias"
    if case in ("int", "complex"):      # torch.matmul's product since session 27; with an activation a TypeError
        a, b = (a.long(), b.long()) if case == "int" else (a.cfloat(), b.cfloat())
        assert torch.equal(fusedops.matmul(a, b), torch.matmul(a, b))
        a, b, kwargs, error, word = a, b, dict(activation="relu"), TypeError, "floating"
    elif case == "bool":
        a, b, error, word = a > 0, b > 0, TypeError, "floating"
    elif case == "mixed_dtypes":
        b, error, word = b.float(), TypeError, "dtype"
    elif case == "zero_d":
        a, error, word = torch.tensor(2.0, dtype=D), ValueError, "'input'"
    elif case == "mismatch":
        b, error, word = torch.randn(5, 5, dtype=D), ValueError, "cannot be multiplied"
    elif case == "bias_2d":
        kwargs = dict(bias=torch.randn(3, 5, dtype=D))
    elif case == "bias_0d":
        kwargs = dict(bias=torch.tensor(1.0, dtype=D))
    elif case == "bias_wrong_length":
        kwargs = dict(bias=torch.randn(4, dtype=D))
    elif case == "bad_activation":
        kwargs, word = dict(activation="tanh"), "activation"
    else:
        a, error, word = [[1.0] * 4] * 3, TypeError, "'input'"
    with pytest.raises(error, match=word):
        fusedops.matmul(a, b, **kwargs)


def test_matmul_bias_of_another_float_dtype(route):
    a, b = torch.randn(3, 4, dtype=D), torch.randn(4, 5, dtype=D)
    bias = torch.randn(5, dtype=torch.float32, requires_grad=True)
    out = fusedops.matmul(a, b, bias)
    assert out.dtype == D
    assert _max_diff(out, a @ b + bias.double()) < 1e-12
    (g,) = torch.autograd.grad(out.sum(), bias)
    assert g.dtype == torch.float32 and torch.equal(g, torch.full((5,), 3.0))


def _linear_pair(*args, **kwargs):
    ref = torch.nn.Linear(*args, **kwargs)
    ours = fnn.Linear(*args, **kwargs)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ours, ref


LINEAR_CASES = {
    "2d": ((4, 3), (5, 4), ()),
    "1d": ((4, 3), (4,), ()),
    "4d": ((4, 3), (2, 3, 2, 4), ()),
    "in_features_0": ((0, 3), (5, 0), ()),
    "out_features_0": ((4, 0), (5, 4), ()),
    "rows_0": ((4, 3), (0, 4), ()),
    "no_bias": ((4, 3, False), (5, 4), ()),
    "frozen_weight": ((4, 3), (5, 4), ("weight",)),
    "frozen_bias": ((4, 3), (5, 4), ("bias",)),
}


@pytest.mark.parametrize("case", list(LINEAR_CASES))
def test_linear_like_torch(route, case):
    args, shape, frozen = LINEAR_CASES[case]
    ours, ref = _linear_pair(*args, dtype=D)
    x = torch.randn(shape, dtype=D)
    for module in (ours, ref):
        for name in frozen:
            getattr(module, name).requires_grad_(False)
    results = []
    for module in (ours, ref):
        leaves = [x.clone().requires_grad_()] + [p for p in module.parameters() if p.requires_grad]
        out = module(leaves[0])
        results.append((out, torch.autograd.grad(out, leaves, torch.ones_like(out) * 0.25)))
    (o1, g1), (o2, g2) = results
    for a, b in zip((o1, *g1), (o2, *g2)):
        assert _max_diff(a, b) < 1e-12


@pytest.mark.parametrize("layout", ["transposed_3d", "expanded", "strided_last_dim"])
def test_linear_strided_inputs(route, layout):
    ours, ref = _linear_pair(4, 3, dtype=D)
    x = {"transposed_3d": torch.randn(5, 2, 4, dtype=D).transpose(0, 1),
         "expanded": torch.randn(1, 5, 4, dtype=D).expand(2, 5, 4),
         "strided_last_dim": torch.randn(5, 8, dtype=D)[:, ::2]}[layout]
    o1, g1 = _outputs_and_grads(lambda t: ours(t), (x,))
    o2, g2 = _outputs_and_grads(lambda t: ref(t), (x,))
    assert _max_diff(o1, o2) < 1e-12 and _max_diff(g1[0], g2[0]) < 1e-12


@pytest.mark.parametrize("case", ["zero_d", "wrong_features", "float32_input", "int_input"])
def test_linear_errors_are_runtime_errors_like_torch(route, case):
    ours, ref = _linear_pair(4, 3, dtype=D)
    x = {"zero_d": torch.tensor(1.0, dtype=D), "wrong_features": torch.randn(5, 5, dtype=D),
         "float32_input": torch.randn(5, 4), "int_input": torch.ones(5, 4, dtype=torch.int64)}[case]
    with pytest.raises(RuntimeError):
        ref(x)
    with pytest.raises(RuntimeError, match="input"):
        ours(x)


def test_linear_output_can_be_modified_in_place(route):
    ours, ref = _linear_pair(4, 3, dtype=D)
    x = torch.randn(5, 4, dtype=D)
    for module in (ours, ref):
        y = module(x)
        y.add_(1)           # y += residual-style, then an in-place activation
        torch.relu_(y).pow(2).sum().backward()
    assert _max_diff(ours.weight.grad, ref.weight.grad) < 1e-12
    assert _max_diff(ours.bias.grad, ref.bias.grad) < 1e-12


# =================================================================================================
# MultiheadAttention (need_weights=False: the flash path): checked, matches torch
# =================================================================================================
L_, S_, N_, E_ = 3, 4, 2, 8


def _mha_pair(dtype=D, **kwargs):
    ref = torch.nn.MultiheadAttention(E_, 2, dtype=dtype, **kwargs)
    ours = fnn.MultiheadAttention(E_, 2, dtype=dtype, **kwargs)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ours, ref


def _mha_inputs():
    torch.manual_seed(11)
    return torch.randn(L_, N_, E_, dtype=D), torch.randn(S_, N_, E_, dtype=D), torch.randn(S_, N_, E_, dtype=D)


_KPM = torch.tensor([[False, True, False, True], [True, True, False, False]])
_KPM_FULL = torch.tensor([[True] * 4, [False, True, True, True]])
_AM = torch.tensor([[False, True, False, False], [True, False, False, True], [False, False, True, False]])
_AM_FULL = torch.tensor([[False] * 4, [True] * 4, [False, True, False, False]])
_CAUSAL = torch.nn.Transformer.generate_square_subsequent_mask(L_, dtype=D)

MHA_CASES = {
    "plain": ({}, {}, "cross"),
    "kpm_bool": ({}, dict(key_padding_mask=_KPM), "cross"),
    "kpm_float": ({}, dict(key_padding_mask=torch.linspace(-2, 1, 8, dtype=D).view(2, 4)), "cross"),
    "kpm_float32": ({}, dict(key_padding_mask=torch.linspace(-2, 1, 8).view(2, 4)), "cross"),
    "kpm_fully_masked": ({}, dict(key_padding_mask=_KPM_FULL), "cross"),
    "kpm_neg_inf_float_rows": ({}, dict(key_padding_mask=torch.full((2, 4), -math.inf, dtype=D)), "cross"),
    "am_bool": ({}, dict(attn_mask=_AM), "cross"),
    "am_bool_fully_masked_row": ({}, dict(attn_mask=_AM_FULL), "cross"),
    "am_3d_bool": ({}, dict(attn_mask=_AM.expand(4, 3, 4) ^ torch.eye(3, 4, dtype=torch.bool)), "cross"),
    "am_float32": ({}, dict(attn_mask=torch.linspace(-1, 1, 12).view(3, 4)), "cross"),
    "am_bool_kpm_float": ({}, dict(attn_mask=_AM, key_padding_mask=torch.linspace(-2, 1, 8, dtype=D).view(2, 4)),
                          "cross"),
    "am_float_kpm_bool": ({}, dict(attn_mask=torch.linspace(-1, 1, 12, dtype=D).view(3, 4), key_padding_mask=_KPM),
                          "cross"),
    "is_causal_hint": ({}, dict(attn_mask=_CAUSAL, is_causal=True), "self"),
    "is_causal_hint_with_kpm": ({}, dict(attn_mask=_CAUSAL, is_causal=True, key_padding_mask=_KPM[:, :3]), "self"),
    "is_causal_hint_cross_L_ne_S": ({}, dict(attn_mask=torch.ones(3, 4, dtype=torch.bool).triu(1), is_causal=True),
                                    "cross"),
    "batch_first": (dict(batch_first=True), dict(key_padding_mask=_KPM), "batch_first"),
    "unbatched": ({}, dict(key_padding_mask=_KPM[0]), "unbatched"),
    "unbatched_float_kpm": (dict(batch_first=True), dict(key_padding_mask=torch.tensor([1.0, 0, 2, 0.5], dtype=D)),
                            "unbatched"),
    "unbatched_3d_mask": ({}, dict(attn_mask=_AM.expand(2, 3, 4)), "unbatched"),
    "kdim_vdim": (dict(kdim=5, vdim=3), dict(key_padding_mask=_KPM), "kdim_vdim"),
    "no_bias": (dict(bias=False), dict(key_padding_mask=_KPM), "cross"),
    "eval_with_dropout": (dict(dropout=0.5), dict(key_padding_mask=_KPM), "eval"),
    "add_bias_kv": (dict(add_bias_kv=True), dict(key_padding_mask=_KPM), "cross"),
    "add_zero_attn": (dict(add_zero_attn=True), dict(key_padding_mask=_KPM), "cross"),
    "empty_keys": ({}, {}, "empty_keys"),
}


@pytest.mark.parametrize("case", list(MHA_CASES))
def test_mha_flash_path_like_torch(route, case):
    module_kwargs, call_kwargs, inputs = MHA_CASES[case]
    ours, ref = _mha_pair(**module_kwargs)
    q, k, v = _mha_inputs()
    if inputs == "self":
        k = v = q
    elif inputs == "batch_first":
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    elif inputs == "unbatched":
        q, k, v = (t[:, 0] for t in (q, k, v))
    elif inputs == "kdim_vdim":
        k, v = torch.randn(S_, N_, 5, dtype=D), torch.randn(S_, N_, 3, dtype=D)
    elif inputs == "eval":
        ours.eval(), ref.eval()
    elif inputs == "empty_keys":
        k, v = k[:0], v[:0]
    results = []
    for module in (ours, ref):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out, weights = module(*leaves, need_weights=False, **call_kwargs)
        assert weights is None
        torch.manual_seed(5)
        grads = torch.autograd.grad(out, leaves + list(module.parameters()), torch.randn_like(out), allow_unused=True)
        results.append((out, grads))
    (o1, g1), (o2, g2) = results
    assert not o1.isnan().any()
    assert _max_diff(o1, o2) < 1e-12
    for a, b in zip(g1, g2):
        assert (a is None) == (b is None)
        if a is not None:
            assert _max_diff(a, b) < 1e-12


def test_mha_float_mask_gradient_like_torch(route):
    ours, ref = _mha_pair()
    q, k, v = _mha_inputs()
    grads = []
    for module in (ours, ref):
        mask = torch.linspace(-1, 1, 12, dtype=D).view(3, 4).requires_grad_()
        kpm = torch.linspace(-2, 1, 8, dtype=D).view(2, 4).requires_grad_()
        out = module(q, k, v, need_weights=False, attn_mask=mask, key_padding_mask=kpm)[0]
        grads.append(torch.autograd.grad(out.pow(2).sum(), (mask, kpm)))
    for a, b in zip(*grads):
        assert _max_diff(a, b) < 1e-12


@pytest.mark.parametrize("case", ["kpm_int", "am_uint8", "am_bad_shape", "kpm_bad_shape", "am_4d",
                                  "is_causal_without_mask", "key_value_lengths_differ"])
def test_mha_errors_like_torch(route, case):
    ours, ref = _mha_pair()
    q, k, v = _mha_inputs()
    kwargs = dict(need_weights=False)
    if case == "kpm_int":
        kwargs["key_padding_mask"] = _KPM.long()
    elif case == "am_uint8":
        kwargs["attn_mask"] = _AM.to(torch.uint8)
    elif case == "am_bad_shape":
        kwargs["attn_mask"] = _AM[:, :3]
    elif case == "kpm_bad_shape":
        kwargs["key_padding_mask"] = _KPM[:, :3]
    elif case == "am_4d":
        kwargs["attn_mask"] = _AM.expand(2, 2, 3, 4)
    elif case == "is_causal_without_mask":
        kwargs["is_causal"] = True
    else:
        v = v[:3]
    with pytest.raises((AssertionError, RuntimeError)) as theirs:
        ref(q, k, v, **kwargs)
    with pytest.raises(type(theirs.value)):
        ours(q, k, v, **kwargs)


def test_mha_under_cpu_autocast(route):
    ref = torch.nn.MultiheadAttention(E_, 2)
    ours = fnn.MultiheadAttention(E_, 2)
    ours.load_state_dict(ref.state_dict(), strict=True)
    x, y = torch.randn(5, 2, E_), torch.randn(6, 2, E_)
    kpm = torch.tensor([[False] * 5 + [True], [False] * 6])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = ours(x, y, y, key_padding_mask=kpm, need_weights=False)[0]
        want = ref(x, y, y, key_padding_mask=kpm, need_weights=False)[0]
    assert got.dtype == want.dtype == torch.bfloat16
    assert _max_diff(got, want) < 2e-2


def test_mha_need_weights_runs_torchs_forward(route):
    ours, ref = _mha_pair()
    q, k, v = _mha_inputs()
    for kwargs in (dict(average_attn_weights=False, key_padding_mask=_KPM), dict(attn_mask=_AM)):
        o1, w1 = ours(q, k, v, need_weights=True, **kwargs)
        o2, w2 = ref(q, k, v, need_weights=True, **kwargs)
        assert torch.equal(o1, o2) and torch.equal(w1, w2)
