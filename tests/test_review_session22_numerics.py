"""Review (session 22, numerics): the public ops through the interpreter (FUSEDOPS_INTERPRET=1, the `interpret`
fixture: the kernels CUDA tensors run) on special values drawn from peer projects' bug reports: rows of +-inf /
NaN / only -inf in softmax and log_softmax (one pass, the online path, the row sweeps, dim != -1 on transposed
inputs, fused dtype= upcasts), LayerNorm / RMSNorm rows holding inf / NaN, constant rows, fp16 rows of
+-65504 (x^2 past fp16's range) in the whole-row, row-sweep and split-window kernels; attention with additive
masks whose whole rows are huge (-1e30, finfo.min, Hugging Face's padding convention) beside -inf, fully masked
rows under bool + causal masks with L != S over several blocks, NaN in q; matmul with inf / NaN operands and
every activation.

Nothing broke: every case matches torch (same dtype, or float64 where torch's same-dtype op is the less accurate)
including its NaN / inf pattern, so every test here passes (no strict xfails). Two torch deviations found on the
way are checked against the mathematical definition instead (see the attention tests): torch's CPU SDPA drops a
NaN of q from its output, and its backward does not renormalize P on rows of huge additive-mask logits (dV 3x
too large on a row of three -1e30 keys), where ours is right.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import fusedops
from fusedops.autograd import norms as autograd_norms
from fusedops.dsl.runtime.bounded_cache import BoundedCache
from fusedops.kernels import norm_backward_launcher
from fusedops.kernels import norm_forward_launcher
from fusedops.kernels import norms
from fusedops.kernels import softmax as softmax_kernels
from fusedops.kernels.norm_backward_config import BackwardConfig
from fusedops.kernels.norm_forward_config import ForwardConfig
from fusedops.kernels.softmax_configs import Config

INF, NAN = math.inf, math.nan


def _grads(fn, inputs, dy, **kwargs):
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves, **kwargs)
    grads = torch.autograd.grad(out, [t for t in leaves if t is not None], dy.to(out.dtype))
    return (out, *grads)


def _assert_matches(ours, expected, atol, rtol=0.0):
    """Same NaN and +-inf positions (with signs), finite values within atol + rtol * |expected|."""
    ours, expected = ours.double(), expected.double()
    assert ours.shape == expected.shape
    assert torch.equal(ours.isnan(), expected.isnan()), (ours, expected)
    infinite = expected.isinf()
    assert torch.equal(ours.isinf(), infinite), (ours, expected)
    assert torch.equal(ours[infinite], expected[infinite])
    finite = expected.isfinite()
    torch.testing.assert_close(ours[finite], expected[finite], atol=atol, rtol=rtol)


# ================================================================================================
# softmax / log_softmax
# ================================================================================================
def _special_rows(n: int) -> torch.Tensor:
    rows = torch.randn(8, n, generator=torch.Generator().manual_seed(1))
    rows[0] = -INF                              # only -inf: NaN (torch)
    rows[1, n - 1] = INF                        # +inf in the last chunk: NaN
    rows[2, 0] = INF                            # +inf in the first chunk
    rows[3, n - 2] = NAN                        # NaN propagates
    rows[4, : n // 2] = -INF                    # first chunks all -inf, then finite (online rescale from -inf)
    rows[5, n // 2:] = -INF                     # last chunks all -inf
    rows[6, :] = -INF
    rows[6, n - 3] = 0.0                        # one finite key: y = 1 there, log y = 0
    rows[7, 3], rows[7, n - 1] = 3e4, -3e4      # a spread of 6e4 (fp16-representable)
    return rows


SOFTMAX_PATHS = {
    "default": {},
    "online": dict(max_one_pass_block=4),
    "row_sweeps": dict(config=Config("rows", 1, 8, False, 2, 1, ("evict_last", "evict_first", ".cs"))),
    "row_sweeps_reversed": dict(config=Config("rows", 1, 4, False, 1, 1, reverse=True)),
}


@pytest.mark.parametrize("path", list(SOFTMAX_PATHS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_rows_of_infinities_and_nan_match_torch(path, dtype, log, interpret):
    x = _special_rows(37).to(dtype)
    options = SOFTMAX_PATHS[path]
    torch_op = torch.log_softmax if log else torch.softmax
    expected = torch_op(x.float(), -1).to(dtype)     # torch's fp16/bf16 op: float32 math, rounded once
    if options:
        ours = softmax_kernels.softmax_forward(x, 1, log=log, **options)
    else:
        ours = (fusedops.log_softmax if log else fusedops.softmax)(x, -1)
    _assert_matches(ours, expected, atol=1e-6 if dtype == torch.float32 else 0.0,
                    rtol=2e-6 if dtype == torch.float32 else 0.0)
    assert ours[0].isnan().all() and ours[1].isnan().all() and ours[3].isnan().all()
    assert (ours[6, -3] == (0.0 if log else 1.0)).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("dim", [0, 1])
def test_softmax_strided_dims_with_infinities_forward_and_gradient(dtype, log, dim, interpret):
    """Column tiles (dim not last) and a transposed input, -inf / +inf / NaN spread over several rows."""
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(9, 13, 5, generator=generator)
    x[:, 2, 1] = -INF
    x[3, 4, 2] = INF
    x[2, 5, 3] = NAN
    x[0, :, 4] = -INF
    x = x.to(dtype).transpose(0, 2)                  # (5, 13, 9), non-contiguous
    ours_op = fusedops.log_softmax if log else fusedops.softmax
    torch_op = torch.log_softmax if log else torch.softmax
    _assert_matches(ours_op(x, dim), torch_op(x.float(), dim).to(dtype), atol=1e-6 if dtype == torch.float32 else 0.0,
                    rtol=2e-6 if dtype == torch.float32 else 0.0)
    dy = torch.randn(x.shape, generator=generator).to(dtype)
    (_, ours), (_, theirs) = _grads(ours_op, [x], dy, dim=dim), _grads(torch_op, [x.float()], dy.float(), dim=dim)
    _assert_matches(ours, theirs.to(dtype), atol=1e-6 if dtype == torch.float32 else 2e-3, rtol=1e-2)


@pytest.mark.parametrize("source", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_fused_upcast_to_float64_is_float64_accurate(source, log, interpret):
    """dtype=torch.float64 on a 16-bit / float32 input is fused into the kernel's loads: the statistics must be
    float64 then (torch computes in float64), not the input's float32 accumulation."""
    x = (torch.randn(4, 37, generator=torch.Generator().manual_seed(3)) * 5).to(source)
    ours = (fusedops.log_softmax if log else fusedops.softmax)(x, -1, dtype=torch.float64)
    expected = (torch.log_softmax if log else torch.softmax)(x.double(), -1)
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, expected, atol=1e-14, rtol=1e-14)


# ================================================================================================
# layer_norm / rms_norm
# ================================================================================================
FC, BC = ForwardConfig, BackwardConfig
NORM_PATHS = {
    "default": None,
    "looped_split": (FC(True, 1, 8, 1), BC(True, 2, 8, 1, 1, input_block_rows=1, input_block_n=8, input_num_warps=1)),
    "row_sweeps_shifted": (FC(False, 1, 8, 1, row_sweeps=True, shifted_sums=True),
                           BC(False, 1, 8, 1, 1, persistent=True, two_pass=True, chunk=4)),
    "split_window": (FC(False, 1, 32, 1, split_window=True), BC(False, 1, 32, 1, 1, split_window=True)),
}


@pytest.fixture
def norm_path(request, monkeypatch):
    configs = NORM_PATHS[request.param]
    # launches are remembered per layout across calls and tests: a forced config applies only to fresh caches
    monkeypatch.setattr(norms, "_FORWARD_LAUNCHES", BoundedCache(1024))
    monkeypatch.setattr(norms, "_BACKWARD_LAUNCHES", BoundedCache(1024))
    monkeypatch.setattr(autograd_norms, "_KNOWN_LAUNCHES", BoundedCache(1024))
    if configs is not None:
        monkeypatch.setattr(norm_forward_launcher, "forward_config", lambda n, d, **_: configs[0])
        monkeypatch.setattr(norm_backward_launcher, "backward_config", lambda n, d, **_: configs[1])
    return request.param


def _norm_rows(n: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(4)
    rows = torch.randn(7, n, generator=generator)
    rows[0] = 3.0                               # constant: variance 0
    rows[1, 5] = INF
    rows[2, 7] = NAN
    rows[3, n - 1] = -INF
    rows[4] = 65504.0                           # fp16 max, alternating sign: x^2 overflows fp16, not fp32
    rows[4, ::2] = -65504.0
    rows[5] = torch.randn(n, generator=generator) * 2e4
    return rows.to(dtype)


@pytest.mark.parametrize("norm_path", list(NORM_PATHS), indirect=True)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_norm_rows_of_infinities_nan_and_fp16_extremes_forward_and_gradients(norm_path, dtype, op, interpret):
    n = 27 if norm_path == "split_window" else 24
    x = _norm_rows(n, dtype)
    generator = torch.Generator().manual_seed(5)
    w = (torch.rand(n, generator=generator) + 0.5).to(dtype)
    b = torch.randn(n, generator=generator).to(dtype)
    dy = torch.randn(x.shape, generator=generator).to(dtype)
    if op == "layer_norm":
        ours = _grads(lambda *t: fusedops.layer_norm(t[0], (n,), *t[1:], eps=1e-5), [x, w, b], dy)
        ref = _grads(lambda *t: F.layer_norm(t[0], (n,), *t[1:], eps=1e-5), [x.double(), w.double(), b.double()],
                     dy.double())
    else:
        ours = _grads(lambda *t: fusedops.rms_norm(t[0], (n,), t[1]), [x, w], dy)
        eps = torch.finfo(torch.float32).eps        # eps=None: float32's machine epsilon (documented)
        ref = _grads(lambda *t: F.rms_norm(t[0], (n,), t[1], eps=eps), [x.double(), w.double()], dy.double())
    # y and dx: every row independent; the inf / NaN rows give NaN rows (as torch), the others float64-accurate;
    # dweight (dbias) sum over the rows: NaN where torch's is (dbias = sum(dy) stays finite)
    tol = 2e-3 if dtype == torch.float16 else 2e-5
    for got, want in zip(ours, ref):
        want = want.to(dtype)
        scale = max(1.0, want[want.isfinite()].abs().max().item()) if want.isfinite().any() else 1.0
        _assert_matches(got, want, atol=tol * scale, rtol=2e-2 if dtype == torch.float16 else 1e-4)
    assert ours[1][[1, 2, 3]].isnan().all()


@pytest.mark.parametrize("eps", [1e-5, 1.0])
def test_layer_norm_constant_rows_give_bias_and_finite_gradients(eps, interpret):
    """Variance 0 (eps tiny or larger than the variance): y = bias, dx = 0 (x - mean = 0, rstd finite)."""
    x = torch.full((3, 40), 7.25)
    w, b = torch.rand(40) + 0.5, torch.randn(40)
    dy = torch.randn(3, 40)
    y, dx, dw, db = _grads(lambda *t: fusedops.layer_norm(t[0], (40,), *t[1:], eps=eps), [x, w, b], dy)
    torch.testing.assert_close(y, b.expand(3, 40), atol=0, rtol=0)
    ref = _grads(lambda *t: F.layer_norm(t[0], (40,), *t[1:], eps=eps), [x.double(), w.double(), b.double()],
                 dy.double())
    for got, want in zip((dx, dw, db), ref[1:]):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


# ================================================================================================
# scaled_dot_product_attention
# ================================================================================================
def _math_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(E) + mask) v by the definition (float64; rows of only -inf give 0)."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1)) + mask
    return torch.softmax(s, -1).nan_to_num(0.0) @ v


@pytest.mark.parametrize("huge", [-1e30, torch.finfo(torch.float32).min])
@pytest.mark.parametrize("padding", [True, False])
def test_attention_rows_of_huge_additive_mask_logits_gradients_follow_the_definition(huge, padding, interpret):
    """Hugging Face's masks: a row whose every unpadded key carries the same huge value (-1e30 or finfo.min),
    padding keys -inf. The logits' q.k part rounds away, so P is uniform over the unpadded keys. Our backward
    recomputes P from the (hi, lo) lse pair and gets that; torch's own SDPA backward (float32 and float64 alike)
    uses P = exp(s - lse) with lse = s + log(n) rounded back to s, i.e. P = 1 per key: its dV is n times too
    large (checked below, so that this test says which side is right)."""
    generator = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 1, n, 16, generator=generator) for n in (3, 4, 4))
    dy = torch.randn(1, 1, 3, 16, generator=generator)
    mask = torch.full((3, 4), huge)
    if padding:
        mask[:, 3] = -INF
    expected = _grads(_math_attention, [q.double(), k.double(), v.double()], dy.double(), mask=mask.double())
    ours = _grads(fusedops.scaled_dot_product_attention, [q, k, v], dy, attn_mask=mask)
    for got, want in zip(ours, expected):
        torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=1e-5)
    keys = 3 if padding else 4
    torch.testing.assert_close(ours[3][0, 0, :keys], dy[0, 0].sum(0).expand(keys, 16) / keys, atol=2e-6, rtol=1e-5)
    theirs = _grads(F.scaled_dot_product_attention, [q.double(), k.double(), v.double()], dy.double(), attn_mask=mask.double())
    if not torch.allclose(theirs[3], expected[3]):       # torch's deviation (2.13: dV x keys)
        torch.testing.assert_close(theirs[3], expected[3] * keys)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(37, 45), (45, 17)])
def test_attention_fully_masked_rows_under_bool_and_causal_masks_over_several_blocks(dtype, shape, interpret):
    """Rows masked everywhere (a bool mask's False rows, and rows whose causal keys the bool mask removes) give 0
    with zero, finite gradients (documented), over several 16 x 16 interpreter blocks, L != S, GQA."""
    L, S = shape
    generator = torch.Generator().manual_seed(7)
    q = torch.randn(1, 4, L, 16, generator=generator).to(dtype)
    k, v = (torch.randn(1, 2, S, 16, generator=generator).to(dtype) for _ in range(2))
    dy = torch.randn(1, 4, L, 16, generator=generator).to(dtype)
    keep = torch.rand(1, 1, L, S, generator=generator) > 0.6
    keep[..., 3, :] = False
    keep[..., L - 1, :] = False
    keep[..., 10, :11] = False                      # row 10 keeps only keys > 10: causal removes them all
    keep[..., 10, 11:] = True
    ours = _grads(fusedops.scaled_dot_product_attention, [q, k, v], dy, attn_mask=keep, is_causal=True,
                  enable_gqa=True)
    combined = keep & torch.ones(L, S, dtype=torch.bool).tril()
    expected = _grads(F.scaled_dot_product_attention, [t.double() for t in (q, k, v)], dy.double(),
                      attn_mask=combined, enable_gqa=True)
    dead = ~combined[0, 0].any(-1)
    assert dead[[3, 10, L - 1]].all()
    assert (ours[0][..., dead, :] == 0).all()
    assert (ours[1][..., dead, :] == 0).all()
    tol = 1e-5 if dtype == torch.float32 else 4e-3
    for got, want in zip(ours, expected):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), want, atol=tol * max(1.0, want.abs().max().item()), rtol=0)


def test_attention_nan_in_one_query_poisons_its_row_only(interpret):
    """NaN in q[h, i] makes row i of head h NaN (softmax of NaN logits, by the definition; torch's CPU SDPA
    returns a finite row there), and nothing else."""
    generator = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, n, 16, generator=generator) for n in (5, 7, 7))
    q[0, 0, 2, 3] = NAN
    ours = fusedops.scaled_dot_product_attention(q, k, v)
    assert ours[0, 0, 2].isnan().all()
    ours[0, 0, 2] = 0.0
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    expected[0, 0, 2] = 0.0
    torch.testing.assert_close(ours.double(), expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_attention_infinite_additive_mask_entries_and_one_visible_key(dtype, interpret):
    """-inf additive masks: a row with one visible key copies that value row (P = 1 exactly); a +inf mask entry
    gives NaN on its row, as torch."""
    generator = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 2, n, 16, generator=generator).to(dtype) for n in (5, 20, 20))
    mask = torch.zeros(5, 20)
    mask[0] = -INF
    mask[0, 19] = 0.0                               # only the last key (a ragged 16-wide block)
    mask[1, 2] = INF
    ours = fusedops.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(dtype))
    theirs = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask.double())
    assert torch.equal(ours[:, :, 0], v[:, :, 19])
    assert ours[:, :, 1].isnan().all() and theirs[:, :, 1].isnan().all()
    tol = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(ours[:, :, 2:].double(), theirs[:, :, 2:], atol=tol, rtol=0)


# ================================================================================================
# matmul
# ================================================================================================
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu"])
def test_matmul_propagates_inf_and_nan_through_bias_and_activations(dtype, activation, interpret):
    generator = torch.Generator().manual_seed(10)
    a, b = torch.randn(20, 33, generator=generator), torch.randn(33, 18, generator=generator)
    a[0, 0], a[1, 0], a[2, 5] = INF, -INF, NAN
    bias = torch.randn(18, generator=generator)
    bias[4] = -INF
    a, b, bias = a.to(dtype), b.to(dtype), bias.to(dtype)
    functions = {None: lambda t: t, "relu": torch.relu, "gelu": F.gelu, "silu": F.silu,
                 "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}
    expected = functions[activation](a.double() @ b.double() + bias.double()).to(dtype)
    ours = fusedops.matmul(a, b, bias=bias, activation=activation)
    _assert_matches(ours, expected, atol={torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-2}[dtype],
                    rtol=1e-3 if dtype == torch.float16 else 1e-5)
