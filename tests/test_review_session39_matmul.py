"""Review (session 39, matmul): a fresh reviewer tried to break fusedops.matmul, fusedops.nn.Linear (and
fusedops.nn.linear.linear) and the host side of the matmul launcher (kernels/matmul.py) the way a PyTorch /
Triton user would, on the CPU: the kernels in the NumPy interpreter (FUSEDOPS_INTERPRET=1, what CUDA tensors
take), torch's fallback route, and session 26's `prepared` route (autograd.matmul's GPU launches, run in the
interpreter). Tests marked `cuda` repeat the cases that only a GPU can show.

What was tried (peer report -> case):
- FlagGems PR #4471 / issue #2489 (mm on Hopper crashed building TMA descriptors: a gapped view with a 130-byte
  row stride, a stride-contiguous view at an odd storage offset, a clean transpose whose M is not 16-byte
  aligned, an M == 1 operand), triton#1297 (misaligned address from an odd inner dim with unusual strides),
  triton PR #10931 / #10927 (descriptor strides not 16-byte aligned), triton PR #3952 (column-major operand
  with padded columns), triton_kernels PR #8774 (the output's strides): every such layout through
  fusedops.matmul; `_uses_tma` (which layouts take the descriptor kernels) checked against the driver's own
  encoding rules (runtime/tensor_map.encode_arguments) for many random layouts: whatever takes TMA must be
  encodable.
- TransformerEngine #3562 (a bias of another dtype than the output, misread by the GEMM epilogue): bias dtypes
  float16 / bfloat16 / float32 / float64 / float8 against fp16 operands, on every route.
- candle #3744 / PR #3960 (a stride-0 broadcast batch silently wrong), pytorch#3303 (stride-0 gradients):
  expanded batches and their gradients on the interpreter, fallback and prepared routes.
- pytorch fp16 overflow semantics: products past 65504 are inf as in torch.matmul; F.linear's addmm rounds once,
  so a bias can bring the sum back (fusedops.nn.Linear must give what F.linear gives); inf * 0, inf - inf and NaN
  operands give NaN where torch does.
- Also tried and right (not kept as tests, or covered by earlier reviews): 1-D / batched / broadcast shapes,
  K = 0, M or N = 0, int / bool / mixed dtypes, F.linear bias shapes (1,), (), (M, N), a wrong size, 1-D and 3-D
  weights, 0-d input; a random fuzz of 240 cases (1-D to 4-D operands, transposed, stepped, expanded, offset and
  permuted layouts, bias, every activation, every subset of gradients) on the three routes in float64/float32 and
  100 in float16/bfloat16: values, gradients and contiguous outputs all matched torch; torch.compile
  (aot_eager, fullgraph) of 1-D, broadcast and K = 0 products with gradients; torch.func ensembling
  (stack_module_state + vmap + functional_call), per-sample gradients; register_full_backward_hook and
  torch.utils.checkpoint on fusedops.nn.Linear (same behaviour as torch.nn.Linear, the in-place error included).

DEFECTS found (both fixed; their tests pass):

1. On CUDA, fusedops.matmul of float16/bfloat16 operands with a float8 bias raised a raw kernel error,
       fusedops.matmul(a16, b16, bias=torch.randn(n, device="cuda").to(torch.float8_e4m3fn))
   TypeError "argument `bias_ptr` of kernel `matmul_kernel`: torch dtype torch.float8_e4m3fn has no
   fusedops.dsl equivalent", where the docstring promises "bias: (N,) tensor of any floating dtype" and the CPU
   and interpreter routes give the product (torch's route). Cause: library/common.py matmul_runs_kernels checked
   the bias dtype on the interpreter's route only. Fix: the CUDA rule also needs a bias of MATMUL_BIAS_DTYPES
   (float16, bfloat16, float32, float64: the pointer types the kernels take); any other floating bias takes
   torch's route, as on the CPU.

2. A size-1 dim may have any stride (`x[::2**40]`, a slice whose step passes the tensor: shape (1, K), stride
   2**40 * K). `kernels.matmul._uses_tma` sent such an operand to the descriptor kernels (16-byte aligned, one
   unit stride, the other a multiple of 16 elements: all the kernel's specialization proves), but a tensor map's
   strides must be below 2**40 bytes, so on an sm_90a GPU the launch raised LaunchError "cannot build a TMA
   tensor map ... strides of (140737488355328,) bytes: each must be a positive multiple of 16 below 2**40"
   instead of multiplying (torch.matmul and the interpreter route give the product). Fix: _uses_tma also checks
   the map's magnitude limits (byte strides below 2**40, sizes up to 2**32), which the specialization cannot see;
   such operands take matmul_kernel (int64 offsets).
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.dsl as dsl
import fusedops.kernels.matmul as kmm
import fusedops.library  # noqa: F401  (registers torch.ops.fusedops.*)
import fusedops.nn as fnn
from fusedops.dsl.runtime import tensor_map
from fusedops.dsl.errors import LaunchError
from fusedops.library import common
from fusedops.nn.linear import linear as flinear
from helpers import TF32, assert_close
from test_review_session26_matmul import path, prepared  # noqa: F401  (fixtures)

D = torch.float64
H = torch.float16


def _randn(g, *shape, dtype=H):
    return torch.randn(shape, generator=g, dtype=D).to(dtype)


def _ref(a, b, bias=None):
    z = a.double() @ b.double()
    return z if bias is None else z + bias.double()


# ------------------------------------------------------------------------------------------------
# DEFECT 1: a float8 bias on the CUDA route
# ------------------------------------------------------------------------------------------------
class _CudaLike:
    """What matmul_runs_kernels reads of a CUDA tensor (is_cuda, dtype), without a GPU."""

    is_cuda = True

    def __init__(self, dtype):
        self.dtype = dtype


@pytest.mark.parametrize("bias_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_defect1_cuda_rule_sends_a_float8_bias_to_torch(bias_dtype):
    a = _CudaLike(H)
    assert common.matmul_runs_kernels(a, None, None)
    for readable in (H, torch.bfloat16, torch.float32, torch.float64):
        assert common.matmul_runs_kernels(a, None, _CudaLike(readable)), readable
    assert not common.matmul_runs_kernels(a, None, _CudaLike(bias_dtype))
    assert not common.matmul_runs_kernels(a, torch.float32, _CudaLike(bias_dtype))
    # why: the kernels have no pointer type for it (what the CUDA route raised before the fix)
    g = torch.Generator().manual_seed(1)
    a3, b3 = _randn(g, 1, 4, 8), _randn(g, 1, 8, 3)
    with pytest.raises(TypeError, match="bias_ptr"):
        kmm.matmul(a3, b3, torch.ones(3).to(bias_dtype), interpret=True)


@pytest.mark.parametrize("bias_dtype", [torch.float8_e4m3fn, torch.float64, torch.bfloat16])
def test_defect1_float8_and_other_bias_dtypes_values_every_route(path, bias_dtype, seed):
    g = torch.Generator().manual_seed(seed)
    a, b = _randn(g, 5, 24), _randn(g, 24, 7)
    bias = _randn(g, 7, dtype=torch.float32).to(bias_dtype)
    y = fusedops.matmul(a, b, bias)
    assert y.dtype == H and y.shape == (5, 7)
    assert_close(y, _ref(a, b, bias), H)
    op = torch.ops.fusedops.matmul(a, b, bias, "relu", None)
    assert_close(op, torch.relu(_ref(a, b, bias)), H)


@pytest.mark.cuda
@pytest.mark.parametrize("bias_dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.float64, torch.float32])
def test_defect1_gpu_float8_bias(bias_dtype, seed):
    g = torch.Generator().manual_seed(seed)
    a, b = _randn(g, 64, 128).cuda(), _randn(g, 128, 48).cuda()
    bias = _randn(g, 48, dtype=torch.float32).to(bias_dtype).cuda()
    y = fusedops.matmul(a, b, bias)
    assert_close(y.cpu(), _ref(a.cpu(), b.cpu(), bias.cpu()), H)
    y = fusedops.matmul(a, b, bias, "gelu", out_dtype=torch.float32)
    assert_close(y.cpu(), F.gelu(_ref(a.cpu(), b.cpu(), bias.cpu())), TF32)     # (torch's float32 route)


# ------------------------------------------------------------------------------------------------
# DEFECT 2: a size-1 dim with a stride past a tensor map's limit
# ------------------------------------------------------------------------------------------------
def _plain(x: torch.Tensor) -> torch.Tensor:
    """x copied to canonical strides (x.contiguous() returns a size-1 dim's odd stride as it is)."""
    return torch.empty(x.shape, dtype=x.dtype).copy_(x)


def _huge_stride_operands(g):
    """(a, b): a (1, 64) row whose size-1 dim has a stride of 2**40 * 64 elements (x[::2**40]), b (64, 48)."""
    a = _randn(g, 4, 64)[:: 2 ** 40]
    assert a.shape == (1, 64) and a.stride() == (2 ** 40 * 64, 1)
    return a, _randn(g, 64, 48)


def test_defect2_huge_stride_of_a_size1_dim_keeps_off_the_descriptor_kernels(monkeypatch, seed):
    monkeypatch.setenv("FUSEDOPS_TMA", "1")
    g = torch.Generator().manual_seed(seed)
    a, b = _huge_stride_operands(g)
    c = torch.empty(1, 1, 48, dtype=H)
    # the driver cannot describe it (what an sm_90a launch raised)
    with pytest.raises(LaunchError, match="below 2\\*\\*40"):
        tensor_map.encode_arguments(tensor_map.matrix_spec(dsl.float16, a.shape, a.stride(), (64, 64)), a.data_ptr())
    assert not kmm._uses_tma(c, a[None], b[None])
    assert kmm._uses_tma(c, _plain(a)[None], b[None])        # the same row, laid out plainly: TMA
    # the same for B: a (1, N) operand (K = 1) with a huge stride, next to a TMA-describable A
    a1 = _randn(g, 16, 32).t()[:, :1]                                   # (32, 1), strides (1, 32)
    b1 = _randn(g, 4, 48)[:: 2 ** 40]
    assert kmm._uses_tma(torch.empty(1, 32, 48, dtype=H), a1[None], _plain(b1)[None])
    assert not kmm._uses_tma(torch.empty(1, 32, 48, dtype=H), a1[None], b1[None])


def test_defect2_huge_stride_values_and_gradients(path, seed):
    g = torch.Generator().manual_seed(seed)
    a, b = _huge_stride_operands(g)
    bias = _randn(g, 48)
    assert_close(fusedops.matmul(a, b, bias, "silu"), F.silu(_ref(a, b, bias)), H)
    w = b.t().contiguous().requires_grad_()
    x = a.detach().requires_grad_()
    y = flinear(x, w, None)
    (y.double() * torch.arange(48, dtype=D)).sum().backward()
    assert_close(y, _ref(a, b), H)
    go = torch.arange(48, dtype=D)[None]
    assert_close(x.grad, go @ w.detach().double(), H)
    assert_close(w.grad, go.t() @ a.double(), H)


@pytest.mark.cuda
def test_defect2_gpu_huge_stride_operand(monkeypatch, seed):
    monkeypatch.setenv("FUSEDOPS_TMA", "1")
    g = torch.Generator().manual_seed(seed)
    a = _randn(g, 4, 256).cuda()[:: 2 ** 40]
    b = _randn(g, 256, 128).cuda()
    assert_close(fusedops.matmul(a, b).cpu(), _ref(a.cpu(), b.cpu()), H)
    lin = fnn.Linear(256, 128, device="cuda", dtype=H)
    assert_close(lin(a).cpu(), _ref(a.cpu(), lin.weight.detach().cpu().t(), lin.bias.detach().cpu()), H)


# ------------------------------------------------------------------------------------------------
# TMA routing of misaligned layouts (FlagGems #4471, triton#1297, triton#10931)
# ------------------------------------------------------------------------------------------------
def _spec_of(operand: torch.Tensor):
    """The tensor-map spec the descriptor kernels describe a 2-D operand by: its unit-stride dim innermost."""
    (r, c), (sr, sc) = operand.shape, operand.stride()
    if sc == 1:
        return tensor_map.matrix_spec(dsl.float16, (r, c), (sr, 1), (64, 64))
    return tensor_map.matrix_spec(dsl.float16, (c, r), (sc, 1), (64, 64))


def _encodable(operand: torch.Tensor) -> bool:
    try:
        tensor_map.encode_arguments(_spec_of(operand), operand.data_ptr())
    except LaunchError:
        return False
    return True


def _layouts(g, device="cpu"):
    """(name, A (M, K), expected _uses_tma of A next to a plain B) for the peer reports' layouts, made on
    `device` (a copy to another device would not keep the strides)."""
    def randn(*shape):
        return _randn(g, *shape).to(device)

    base = randn(64 * 65 + 64)
    plain = randn(48, 64)
    return [
        ("aligned control", plain, True),
        ("gapped rows, 130-byte stride (FlagGems #2489)", base.as_strided((48, 64), (65, 1)), False),
        ("odd storage offset (FlagGems #4471)", base[1:1 + 48 * 64].view(48, 64), False),
        ("offset of 8 elements: 16-byte aligned", base[8:8 + 48 * 64].view(48, 64), True),
        ("clean transpose, M = 20 not 16-byte aligned (FlagGems #4471)", randn(64, 20).t(), False),
        ("clean transpose, M = 48", randn(64, 48).t(), True),
        ("M == 1 operand from a transposed column (strides (1, 1))", randn(64, 1).t(), False),
        ("M == 1 row slice", plain[16:17], True),
        ("column-major, columns padded to 50 (triton PR #3952)", randn(64, 50).t()[:48], False),
        ("column-major, columns padded to 64", randn(64, 64).t()[:48], True),
        ("row stride 24: 48 bytes (TMA-legal, not what the kernel proves)", randn(48, 24)[:, :16], False),
        ("expanded rows (stride 0)", plain[:1].expand(48, 64), False),
        ("size-1 dim, stride 2**40 * 64", randn(4, 64)[:: 2 ** 40], False),
    ]


def test_uses_tma_on_peer_report_layouts_and_the_driver_agrees(monkeypatch, seed):
    monkeypatch.setenv("FUSEDOPS_TMA", "1")
    g = torch.Generator().manual_seed(seed)
    b = _randn(g, 64, 48)
    for name, a, expected in _layouts(g):
        k = a.shape[1]
        bb = b[:k]
        c = torch.empty(1, a.shape[0], 48, dtype=H)
        assert kmm._uses_tma(c, a[None], bb[None]) is expected, name
        assert not expected or _encodable(a), name
        # the same layout as B (the transposed problem)
        c2 = torch.empty(1, 48, a.shape[0], dtype=H)
        at = a.t()
        assert kmm._uses_tma(c2, bb.t().contiguous()[None], at[None]) is expected, name


def test_uses_tma_implies_encodable_for_random_layouts(monkeypatch, seed):
    """Whatever _uses_tma takes, the driver's encoding rules accept (both operands)."""
    monkeypatch.setenv("FUSEDOPS_TMA", "1")
    rng = random.Random(seed)
    storage = torch.zeros(1 << 16, dtype=H)
    taken = 0
    for _ in range(400):
        rows, cols = rng.choice([1, 2, 16, 24, 48]), rng.choice([1, 8, 16, 32, 40, 64])
        unit = rng.random() < 0.5
        outer = rng.choice([0, 1, 7, 8, 16, 24, 32, 64, 80, 2 ** 38, 2 ** 40, 2 ** 41]) if min(rows, cols) == 1 \
            else rng.choice([0, 1, 8, 16, 24, 64, 80, 128])
        strides = (outer, 1) if unit else (1, outer)
        offset = rng.choice([0, 1, 4, 8, 16, 64])
        extent = offset + sum((s - 1) * st for s, st in zip((rows, cols), strides))
        if extent >= storage.numel():
            continue
        a = storage.as_strided((rows, cols), strides, offset)
        b = storage[:cols * 16].view(cols, 16)
        if kmm._uses_tma(torch.empty(1, rows, 16, dtype=H), a[None], b[None]):
            taken += 1
            assert _encodable(a), (a.shape, a.stride(), a.storage_offset())
    assert taken > 20


def test_peer_report_layouts_values_through_matmul_and_linear(path, seed):
    g = torch.Generator().manual_seed(seed)
    b = _randn(g, 64, 24)
    bias = _randn(g, 24)
    for name, a, _ in _layouts(g):
        bb = b[:a.shape[1]]
        assert_close(fusedops.matmul(a, bb, bias), _ref(a, bb, bias), H)
        # the layout as nn.Linear's weight (out_features = rows), and grad_w = x.t() @ grad_out's operands
        x = _randn(g, 3, a.shape[1]).requires_grad_()
        w = a.detach().requires_grad_()           # the layout itself (a view of its base)
        y = flinear(x, w)
        go = _randn(g, 3, a.shape[0])
        y.backward(go)
        assert_close(y, x.detach().double() @ a.double().t(), H)
        assert_close(w.grad, go.double().t() @ x.detach().double(), H)
        assert_close(x.grad, go.double() @ a.double(), H)


@pytest.mark.cuda
def test_gpu_peer_report_layouts(monkeypatch, seed):
    monkeypatch.setenv("FUSEDOPS_TMA", "1")
    g = torch.Generator().manual_seed(seed)
    b = _randn(g, 64, 24).cuda()
    for name, a, _ in _layouts(g, "cuda"):
        bb = b[:a.shape[1]]
        assert_close(fusedops.matmul(a, bb).cpu(), _ref(a.cpu(), bb.cpu()), H)
        x = _randn(g, 3, a.shape[1]).cuda().requires_grad_()
        w = a.detach().requires_grad_()
        y = flinear(x, w)
        go = _randn(g, 3, a.shape[0]).cuda()
        y.backward(go)
        assert_close(y.cpu(), x.detach().cpu().double() @ a.cpu().double().t(), H)
        assert_close(w.grad.cpu(), go.cpu().double().t() @ x.detach().cpu().double(), H)
        assert_close(x.grad.cpu(), go.cpu().double() @ a.cpu().double(), H)


# ------------------------------------------------------------------------------------------------
# stride-0 batches (candle #3744) and their gradients
# ------------------------------------------------------------------------------------------------
def test_stride0_batches_values_and_gradients(path, seed):
    g = torch.Generator().manual_seed(seed)
    a0, b0 = _randn(g, 1, 5, 16, dtype=D), _randn(g, 16, 7, dtype=D)
    for a_expanded in (True, False):
        a = a0.clone().requires_grad_()
        b = b0.clone().requires_grad_()
        aa = a.expand(4, 5, 16) if a_expanded else torch.randn(4, 5, 16, generator=g, dtype=D)
        bb = b.expand(4, 16, 7)                 # batch stride 0 (candle #3744)
        y = fusedops.matmul(aa, bb)
        go = torch.randn(4, 5, 7, generator=g, dtype=D)
        y.backward(go)
        ref = torch.matmul(aa.detach(), b0)
        torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(b.grad, (aa.detach().transpose(-1, -2) @ go).sum(0), rtol=1e-12, atol=1e-12)
        if a_expanded:
            torch.testing.assert_close(a.grad, (go @ b0.t()).sum(0, keepdim=True), rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# fp16 overflow, inf and NaN as torch
# ------------------------------------------------------------------------------------------------
def test_fp16_overflow_inf_nan_as_torch(route):
    a = torch.full((3, 4), 200.0, dtype=H)
    b = torch.full((4, 5), 200.0, dtype=H)
    b[:, 1] = -200.0
    b[:, 2] = 0.0
    a[1, 0] = float("inf")          # inf * 0 in column 2: NaN; inf * -200: -inf
    a[2, 3] = float("nan")
    got = fusedops.matmul(a, b)
    want = torch.matmul(a.double(), b.double()).to(H)   # 160000 per row: inf in float16, as torch.matmul gives
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isnan(), torch.matmul(a, b).isnan())
    finite = ~want.isnan()
    assert torch.equal(got[finite], want[finite])
    assert got[0, 0] == float("inf") and got[0, 1] == -float("inf") and got[0, 2] == 0
    # inf - inf in one sum: NaN
    c = torch.tensor([[float("inf"), -float("inf")]], dtype=H)
    assert fusedops.matmul(c, torch.ones(2, 3, dtype=H)).isnan().all()
    # nn.Linear rounds once, as F.linear's addmm: a bias brings 80000 back to 40000 (torch.matmul + bias: inf)
    x = torch.full((2, 4), 100.0, dtype=H)
    w = torch.full((3, 4), 200.0, dtype=H)
    bias = torch.full((3,), -40000.0, dtype=H)
    lin = fnn.Linear(4, 3, dtype=H)
    with torch.no_grad():
        lin.weight.copy_(w)
        lin.bias.copy_(bias)
    assert torch.equal(lin(x), F.linear(x, w, bias))
    assert torch.equal(lin(x), torch.full((2, 3), 40000.0, dtype=H))
