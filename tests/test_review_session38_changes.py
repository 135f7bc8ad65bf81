"""Review (session 38) of the session's own changes (`git diff 36146b5 HEAD`: the DSL's literal conversions, reshape /
broadcast_to sizes, block methods, expand_dims of several axes and the Triton-name hints; autotune under inference
mode and CUDA graph capture, hashed record names; attention's causal fold and 2-D GQA inputs; the looped LayerNorm
statistics and the NaN statistics of rows of no columns; matmul's reference without autocast and the patched
RMSNorms), read hunk by hunk and then attacked where each fix might hold only for its own test. CPU only: kernels run
in the NumPy interpreter and, for DSL kernels the host can run, compiled for sm_90a and run on the host
(test_review_session35_dsl._run_compiled) bit for bit against it. Each of the session's defect tests was also run
against the code of 36146b5 (`git archive`): every one fails there.

What was tried (peer report -> case), right unless listed under DEFECTS:
- triton #10658 / #10692 (float -> int conversions differ between JIT and interpreter), torch.full's exact value:
  float literals into integer types through full / store / `other=` / cast / atomics (add, max, min, xchg, cas,
  or) / a descriptor store: NaN -> 0, +-inf saturating, -0.9 -> 0 and 255.99 -> 255 in uint8, 2**63 -> INT64_MAX,
  4294967295.9 -> UINT32_MAX; bool literals into float32 / uint8 / int32; int literals wrapping into uint8 / int64
  (-1, 2**64 - 1); int1 from 2, 256, 0.5, 1e-50-like literals, NaN, -0.0, a float literal stored into a bool
  pointer under a block mask and as a masked load's `other`: as Python / torch (bool of any non-zero, NaN too),
  interpreted and compiled the same.
- cupynumeric#490 / numpy#9925 / zarr-python#1425 (reshape's varargs, one int, `reshape(1, (2, 3))`): reshape /
  broadcast_to with a tuple, a list, one int, separate sizes, `*S` of a constexpr tuple, a constexpr tuple, `y.shape`, `()` of a one-element block;
  a scalar broadcast to separate sizes; errors for a tuple mixed with sizes and for `shape=` (Triton's signature is
  `reshape(input, *shape)`: the keyword is refused there too; fusedops took it before this session -- noted).
  expand_dims with (0, 2), (-1, 0), a constexpr tuple, () and of a scalar; `x.cast(dtype, bitcast=True)`,
  `x.to(dtype, bitcast=True)`, `x.exp()` / `sqrt` / `floor` / `abs` / `cdiv`.
- The Triton-name hints: every `dsl.<name>` a hint names exists and no hinted name is a dsl attribute (a hint
  that would never show). Half-done: Triton's fp8 types float8e4b8 / float8e5b16, its random helpers
  (philox_impl, uint_to_uniform_float, pair_uniform_to_normal), load_tensor_descriptor / store_tensor_descriptor,
  max_constancy and map_elementwise had no hint; added to language/triton_names.py.
- The README's new control-flow claims (break / return in a loop refused, return under an `if` fine, recursion
  refused, a @dsl.jit function as a constexpr argument, 3-D dot refused): as written.
- autotune (triton #10596 / #10604, lion-pytorch#36): restores of a view of an nn.Parameter under
  inference_mode; record names of two long kernel names that share their first 150 bytes stay apart and under
  255 bytes.
- attention (pytorch#120810 mixed ranks, cudnn-frontend#804 causal before scale): enable_gqa with a 2-D key and a
  3-D value of another head count (torch's route), a 2-D query with a one-head 3-D key, a 2-D value beside 3-D
  key; causal with scale -0.5 / None; values and float64 gradients on both routes against a float64 reference,
  and under torch.compile (aot_eager) on both.
- Looped LayerNorm statistics (apex#411-style cancellation, pytorch#63541 constant rows): a forced looped config
  (block_n 16 / 32) against an exact (Fraction) reference: constant rows (0, 3, -1000, 1e30, 1e-40; eps 0 gives
  torch's NaN / inf statistics), N = 1, NaN / inf rows, the median sample an outlier (columns 0 and (N-1)//2,
  (N-1)//2 and N-1, all three, six outliers), float64 rows off 1e6, variance that underflows float32 (the second
  pass then runs: mean != 0, variance 0); a 600-row fuzz in the review (not kept) within 2x torch + 4 ulp of
  max|y|. (A review fuzz against torch's float64 LayerNorm "failed" by 1e-10: torch's float64 y = x * rstd - mean *
  rstd cancels; against the exact reference fusedops is within 4 ulp.) Rows of 0 columns: NaN mean / rstd on
  both routes and both ops, empty gradients.
- matmul's reference with autocast off, and the patched RMSNorm under autocast (compiled too): right as tested
  by the session; see DEFECT 1 for the route the fix missed.

DEFECTS
1. (fixed, fusedops/functional.py) Under autocast, fusedops.matmul (and fusedops.nn.Linear through it) inside
   torch.func.vmap / grad, under a TorchFunctionMode or another torch mode, with a tensor subclass, under
   torch.jit.trace or with forward-mode dual tensors -- the `_transforms_active() or needs_torch(...)` branch --
   returned float32 where torch.matmul / torch.nn.Linear and the same call outside vmap return the autocast dtype:
   `with torch.autocast("cpu", dtype=torch.bfloat16): torch.func.vmap(lambda x: fusedops.matmul(x, b))(a)` ->
   float32 (`fusedops.matmul(a, b)` -> bfloat16). Before this session that branch at least ran torch.matmul under
   autocast (a bfloat16 product, returned as float32); the session's fix (reference runs with autocast off, "the
   operands are cast by the caller") left that branch without any autocast cast. Fix: functional.matmul casts the
   operands and bias to the autocast dtype before choosing the route (as the kernel route did); its docstring says
   so.

2. torch.ops.fusedops.layer_norm on CPU
   rows of 0 columns (its torch route) warns "var(): degrees of freedom is <= 0" from its rstd, where
   F.layer_norm is silent (the session made these statistics NaN on the kernel route to match this route). Fixed
   (by the lead): `rstd = torch.rsqrt((rows.var(1, unbiased=False) if n_cols else mean) + eps)` (mean is NaN there).

Noted, not changed: the looped forward's Welford update overflows float32 for rows whose values span more than
~3.4e38 (bf16 rows of +-1e38 give NaN where the whole-row kernels give rstd 0); torch's float32 LayerNorm gives NaN
there too, and the code before this session did the same. `dsl.reshape(x, shape=...)` is now refused (as Triton).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, getcontext
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.dsl as dsl
import fusedops.nn as fnn
from fusedops.dsl import CompilationError
from fusedops.dsl.language.triton_names import TRITON_ONLY
from fusedops.kernels.norm_forward_config import ForwardConfig
from fusedops.kernels.norms import norm_forward
from helpers import assert_close
from kernel_source import jit_from_source
from test_launch_fast_path import _cuda
from test_review_session35_dsl import _run_compiled
from test_review_session38_runtime import _CONFIGS, _grid, _scale_in_place_kernel, _writes
from test_review_session38_runtime import mock_gpu  # noqa: F401  (the fixture)

D = torch.float64
BF16 = torch.bfloat16
NAN, INF = float("nan"), float("inf")


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "s38_changes_cache"))


def _randn(shape, seed: int, dtype=D, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen, dtype=D) * scale).to(dtype)


# =====================================================================================================================
# DEFECT 1 (fixed): fusedops.matmul under autocast on the transforms / modes route
# =====================================================================================================================
class _PassThroughMode(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_defect1_matmul_under_autocast_inside_vmap_and_modes_takes_the_autocast_dtype(route, seed):
    a, b, bias = _randn((3, 4, 16), seed, torch.float32), _randn((16, 5), seed + 1, torch.float32), \
        _randn((5,), seed + 2, torch.float32)
    linear = fnn.Linear(16, 5)
    with torch.no_grad():
        linear.weight.copy_(b.t())
        linear.bias.copy_(bias)
    exact = a.to(BF16).double() @ b.to(BF16).double() + bias.to(BF16).double()     # the cast operands, exactly
    with torch.autocast("cpu", dtype=BF16):
        assert torch.matmul(a, b).dtype == BF16
        results = {
            "plain": fusedops.matmul(a, b, bias),
            "vmap": torch.func.vmap(lambda x: fusedops.matmul(x, b, bias))(a),
            "vmap_linear": torch.func.vmap(linear)(a),
            "linear": linear(a),
            "out_dtype": torch.func.vmap(lambda x: fusedops.matmul(x, b, bias, out_dtype=torch.float32))(a),
        }
        with _PassThroughMode():
            results["mode"] = fusedops.matmul(a, b, bias)
            results["mode_gelu"] = fusedops.matmul(a, b, bias, "gelu")
    for name, got in results.items():
        want_dtype = torch.float32 if name == "out_dtype" else BF16
        assert got.dtype == want_dtype, (name, got.dtype)
        want = F.gelu(exact) if name == "mode_gelu" else exact
        # a float32 sum rounded once to bfloat16 (half an ulp: 2^-9 relative; float32: the sum's own error)
        bound = want.abs() * (2.0 ** -8 if want_dtype == BF16 else 1e-6) + 1e-5
        assert ((got.double() - want).abs() <= bound).all(), name


def test_defect1_matmul_gradients_under_autocast_inside_grad(route, seed):
    a, b = _randn((6, 8), seed, torch.float32), _randn((8, 3), seed + 1, torch.float32)
    ad, bd = a.to(BF16).double().requires_grad_(), b.to(BF16).double()
    want = torch.autograd.grad((ad @ bd).sum(), ad)[0]
    dtypes = []

    def loss(x):
        y = fusedops.matmul(x, b)
        dtypes.append(y.dtype)
        return y.float().sum()

    with torch.autocast("cpu", dtype=BF16):
        got = torch.func.grad(loss)(a)
    assert dtypes == [BF16] and got.dtype == torch.float32
    # the backward of the bfloat16 product: dY @ B^T rounded to bfloat16 once
    assert ((got.double() - want).abs() <= want.abs() * 2.0 ** -8 + 1e-6).all()


# =====================================================================================================================
# DSL: literal conversions (right), interpreted and compiled
# =====================================================================================================================
@dsl.jit
def _literal_kernel(i_ptr, u_ptr, b_ptr, f_ptr, q_ptr, B: dsl.constexpr):
    offs = dsl.arange(0, B)
    dsl.store(i_ptr + offs, dsl.full((B,), NAN, dsl.int32))
    dsl.store(i_ptr + B + offs, dsl.full((B,), INF, dsl.int32))
    dsl.store(i_ptr + 2 * B + offs, dsl.cast(-INF, dsl.int32) + offs * 0)
    dsl.store(i_ptr + 3 * B + offs, True)
    dsl.atomic_add(i_ptr + 4 * B + offs, 16777217.0)
    dsl.atomic_max(i_ptr + 5 * B + offs, NAN)
    dsl.atomic_or(i_ptr + 6 * B + offs, 7.9)
    dsl.store(u_ptr + offs, dsl.full((B,), -0.9, dsl.uint8))
    dsl.store(u_ptr + B + offs, dsl.cast(255.99, dsl.uint8) + offs * 0)
    dsl.store(u_ptr + 2 * B + offs, dsl.full((B,), True, dsl.uint8))
    dsl.store(u_ptr + 3 * B + offs, dsl.full((B,), -1, dsl.uint8))
    dsl.store(b_ptr + offs, dsl.full((B,), 2, dsl.int1))
    dsl.store(b_ptr + B + offs, dsl.full((B,), 256, dsl.int1))
    dsl.store(b_ptr + 2 * B + offs, dsl.cast(0.5, dsl.int1) | (offs < 0))
    dsl.store(b_ptr + 3 * B + offs, 0.25, mask=offs < B)
    dsl.store(b_ptr + 4 * B + offs, dsl.load(b_ptr + 4 * B + offs, mask=offs < 0, other=0.5))
    dsl.store(b_ptr + 5 * B + offs, dsl.full((B,), -0.0, dsl.int1))
    dsl.store(b_ptr + 6 * B + offs, dsl.full((B,), NAN, dsl.int1))
    dsl.store(f_ptr + offs, dsl.full((B,), True, dsl.float32))
    dsl.store(f_ptr + B + offs, dsl.full((B,), -0.0, dsl.float32))
    dsl.store(q_ptr + offs, dsl.full((B,), 2**64 - 1, dsl.int64))
    dsl.store(q_ptr + B + offs, dsl.full((B,), 1.8446744073709552e19, dsl.int64))
    dsl.atomic_cas(q_ptr + 2 * B + offs, 0.0, 2.0 ** 53 + 2.0)
    dsl.atomic_add(q_ptr + 3 * B + offs, -2.0 ** 62 - 0.5, mask=offs < 2)


def test_literals_convert_to_integer_and_bool_types_from_their_value():
    B = 4

    def buffers():
        return (torch.full((7 * B,), 0, dtype=torch.int32), torch.full((4 * B,), 9, dtype=torch.uint8),
                torch.zeros(7 * B, dtype=torch.bool), torch.full((2 * B,), 7.0), torch.zeros(4 * B, dtype=torch.int64))

    interpreted = buffers()
    _literal_kernel[(1,)](*interpreted, B=B, interpret=True)
    ints, uints, bools, floats, wide = (t.view(-1, B) for t in interpreted)
    assert ints[:, 0].tolist() == [0, 2**31 - 1, -2**31, 1, 16777217, 0, 7]
    assert uints[:, 0].tolist() == [0, 255, 1, 255]
    # Python / torch: bool() of any non-zero value (NaN too) is True, of -0.0 False
    assert bools[:, 0].tolist() == [bool(2), bool(256), bool(0.5), bool(0.25), bool(0.5), bool(-0.0), bool(NAN)]
    assert floats[0].tolist() == [1.0] * B and all(math.copysign(1, v) < 0 for v in floats[1].tolist())
    assert wide[:, 0].tolist() == [-1, 2**63 - 1, 2**53 + 2, -2**62]
    assert wide[3].tolist() == [-2**62, -2**62, 0, 0]
    assert all(torch.equal(t.view(-1, B), t.view(-1, B)[:, :1].expand(-1, B)) for t in interpreted[:3])
    compiled = buffers()
    _run_compiled(_literal_kernel, compiled, num_warps=1, B=B)
    for got, want in zip(compiled, interpreted):
        assert torch.equal(got.view(torch.int8) if got.dtype.is_floating_point else got,
                           want.view(torch.int8) if want.dtype.is_floating_point else want)


# =====================================================================================================================
# DSL: reshape / broadcast_to sizes, expand_dims of several axes, block methods (right)
# =====================================================================================================================
_SHAPE_CASES = {
    "separate": ("y = dsl.reshape(x, 4, 4)\nz = dsl.reshape(y * 2.0, 16)", lambda x: x * 2),
    "list": ("z = dsl.reshape(dsl.reshape(x, [2, 8]), [16])", lambda x: x),
    "star": ("z = dsl.reshape(dsl.reshape(x, *S), 16)", lambda x: x),
    "constexpr_tuple": ("z = dsl.reshape(dsl.reshape(x, S), (16,))", lambda x: x),
    "methods": ("z = x.reshape(4, 4).trans().reshape(16)", lambda x: x.view(4, 4).t().reshape(16)),
    "shape_attr": ("y = x.reshape(4, 4)\nz = dsl.broadcast_to(dsl.sum(y, 1, True), *y.shape).reshape(16)",
                   lambda x: x.view(4, 4).sum(1, keepdim=True).expand(4, 4).reshape(16)),
    "broadcast_sizes": ("z = dsl.reshape(dsl.broadcast_to(dsl.sum(dsl.reshape(x, 4, 4), 0, True), 4, 4), 16)",
                        lambda x: x.view(4, 4).sum(0, keepdim=True).expand(4, 4).reshape(16)),
    "scalar_broadcast": ("z = dsl.reshape(dsl.broadcast_to(2.5, 4, 4), 16) + x * 0.0",
                         lambda x: torch.full_like(x, 2.5)),
    "expand_tuple": ("y = dsl.expand_dims(x, (0, 2))\nz = dsl.reshape(y, 16) + y.shape[0] * 100 + y.shape[2] * 10",
                     lambda x: x + 110),
    "expand_negative": ("y = x.expand_dims((-1, 0))\nz = dsl.reshape(y, 16) + y.shape[1]", lambda x: x + 16),
    "expand_constexpr": ("y = dsl.expand_dims(x, E)\nz = dsl.reshape(y, 16) + y.shape[1] + 0.5 * y.shape[0]",
                         lambda x: x + 16.5),
    "expand_empty": ("z = dsl.expand_dims(x, ())", lambda x: x),
    "bitcast_methods": ("z = x.cast(dsl.int32, bitcast=True).to(dsl.float32, bitcast=True) + x.to(dsl.int32, "
                        "bitcast=True).cast(dsl.float32)", lambda x: x + x.float().view(torch.int32).double()),
    "math_methods": ("z = x.exp().log() + x.sqrt().floor() + (-x).abs() + dsl.arange(0, 16).cdiv(3).to(dsl.float32)",
                     lambda x: x + x.sqrt().floor() + x + (torch.arange(16) + 2).div(3, rounding_mode="floor")),
}


@pytest.mark.parametrize("case", list(_SHAPE_CASES))
def test_shape_arguments_and_block_methods(case):
    body, reference = _SHAPE_CASES[case]
    source = ("def k(o_ptr, x_ptr, S: dsl.constexpr, E: dsl.constexpr):\n"
              "    x = dsl.load(x_ptr + dsl.arange(0, 16))\n" + "".join(f"    {line}\n" for line in body.splitlines())
              + "    dsl.store(o_ptr + dsl.arange(0, 16), z)\n")
    kernel = jit_from_source(source, f"<s38 changes shapes {case}>")
    x = torch.rand(16, dtype=torch.float64).float() * 5 + 0.5
    out = torch.full((16,), NAN)
    kernel[(1,)](out, x, S=(4, 4), E=(0, 2), interpret=True)
    torch.testing.assert_close(out.double(), reference(x.double()).double(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("statement,message", [
    ("z = dsl.reshape(x, (4,), 4)", r"reshape shape must be powers of two \(ints\), got \(\(4,\), 4\)"),
    ("z = dsl.reshape(x, shape=(16,))", r"dsl.reshape\(\).*unexpected keyword argument 'shape'"),
    ("z = dsl.reshape(x)", r"cannot reshape a block of shape \(16,\) into \(\)"),
    ("z = dsl.expand_dims(x, (True,))", r"expand_dims axes must be constexpr ints"),
    ("z = x.tanh()", r"kernel values have no attribute `tanh`"),
    ("z = dsl.float8e4b8", r"`float8e4b8` \(Triton's tl.float8e4b8: fp8 types are not in the language\)"),
    ("z = dsl.load_tensor_descriptor(x)", r"`load_tensor_descriptor` \(Triton's tl.load_tensor_descriptor: use "
                                          r"desc.load\(offsets\)"),
])
def test_shape_and_name_errors_say_what_is_wrong(statement, message):
    source = ("def k(o_ptr, x_ptr):\n    x = dsl.load(x_ptr + dsl.arange(0, 16))\n"
              f"    {statement}\n    dsl.store(o_ptr + dsl.arange(0, 16), x)\n")
    kernel = jit_from_source(source, f"<s38 changes errors {statement}>")
    with pytest.raises(CompilationError, match=message):
        kernel[(1,)](torch.zeros(16), torch.zeros(16), interpret=True)


def test_triton_name_hints_name_only_what_the_language_has():
    for name, hint in TRITON_ONLY.items():
        assert not hasattr(dsl, name), f"dsl.{name} exists: its hint would never show"
        for mentioned in re.findall(r"dsl\.(\w+)", hint):
            assert hasattr(dsl, mentioned), f"the hint for {name} names dsl.{mentioned}, which does not exist"


# =====================================================================================================================
# autotune: restores of a Parameter's view, hashed record names (right)
# =====================================================================================================================
def test_autotune_record_names_of_long_kernel_names_stay_apart_and_short():
    def fill(o_ptr, BLOCK: dsl.constexpr):
        dsl.store(o_ptr + dsl.arange(0, BLOCK), 1.0)

    paths = []
    for suffix in ("first", "second"):
        fill.__qualname__ = "Factory" * 30 + f".<locals>.{suffix}"      # equal in their first 150 bytes
        tuner = dsl.autotune([dsl.Config({"BLOCK": 16})], key=[])(dsl.jit(fill))
        paths.append(tuner._record_path())
    assert paths[0] != paths[1]
    assert all(len(path.name.encode()) <= 255 for path in paths)
    assert paths[0].name.startswith(fill.__module__)


def test_autotune_restores_a_strided_view_of_a_parameter(mock_gpu, monkeypatch):
    # restore_value of a view of a leaf that requires grad (an optimizer-style kernel updating every other
    # element of a parameter): every tuning launch reads the original values, the real launch writes once
    monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)
    original = _randn((64,), 3, torch.float32)
    leaf = _cuda(original.clone()).requires_grad_()
    x = leaf[::2]
    seen = []
    mock_gpu.effects.append(_writes(x, lambda t: t * 3.0 + 1.0, seen))
    tuner = dsl.autotune(_CONFIGS, key=["n"], restore_value=["x_ptr"])(_scale_in_place_kernel())
    tuner[_grid](x, 32)
    assert len(seen) > 2 and all(torch.equal(read, original[::2]) for read in seen)
    assert torch.equal(leaf.detach()[::2], original[::2] * 3.0 + 1.0)
    assert torch.equal(leaf.detach()[1::2], original[1::2]) and leaf.requires_grad and leaf.is_leaf


# =====================================================================================================================
# attention: enable_gqa with 2-D inputs beside 3-D ones, causal with a negative scale (right), both routes
# =====================================================================================================================
def _gqa_reference(q, k, v, is_causal=False, scale=None):
    """float64 attention where a 2-D input has one head and key / value heads are repeated to query's."""
    q3, k3, v3 = (t.to(D).unsqueeze(-3) if t.dim() == 2 else t.to(D) for t in (q, k, v))
    heads = q3.size(-3)
    k3, v3 = (t.repeat_interleave(heads // t.size(-3), -3) for t in (k3, v3))
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    s = (q3 @ k3.transpose(-1, -2)) * scale
    if is_causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    out = torch.softmax(s, -1) @ v3
    rank = max(q.dim(), k.dim(), v.dim())
    return out.reshape(out.shape[out.dim() - rank:]) if out.dim() > rank else out


@pytest.mark.parametrize("shapes", [
    ((4, 3, 8), (5, 8), (2, 5, 6)),          # 2-D key (one head), value of 2 heads: torch's route
    ((3, 8), (1, 5, 8), (1, 5, 6)),          # 2-D query, one-head 3-D key / value: output 3-D
    ((1, 4, 3, 8), (2, 5, 8), (5, 6)),       # 2-D value beside a 2-head key
], ids=["2d_key_3d_value", "2d_query", "2d_value"])
def test_gqa_mixed_ranks_values_and_gradients(route, shapes):
    q, k, v = (_randn(shape, seed).requires_grad_() for seed, shape in enumerate(shapes))
    for kwargs in (dict(), dict(is_causal=True, scale=-0.5)):
        out = fusedops.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)
        want = _gqa_reference(q, k, v, **kwargs)
        assert out.shape == want.shape and out.dtype == D
        assert_close(out, want, D)
        grad_out = _randn(out.shape, 9)
        for got, expected in zip(torch.autograd.grad(out, (q, k, v), grad_out),
                                 torch.autograd.grad(want, (q, k, v), grad_out)):
            assert_close(got, expected, D)


@pytest.mark.usefixtures("reset_dynamo")
def test_gqa_two_dim_key_and_negative_scale_compiled(route):
    q, k, v = _randn((4, 3, 8), 1), _randn((5, 8), 2), _randn((2, 5, 6), 3)

    def f(q, k, v):
        return fusedops.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True, scale=-0.3)

    got = torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v)
    assert_close(got, _gqa_reference(q, k, v, is_causal=True, scale=-0.3), D)


# =====================================================================================================================
# Looped LayerNorm statistics (right): a forced looped config against an exact reference
# =====================================================================================================================
def _exact_layer_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) of each row from the exact (rational) mean and variance of its values; NaN rows
    for non-finite values or var + eps == 0."""
    getcontext().prec = 50
    rows = []
    for row in x.to(D).tolist():
        if not all(math.isfinite(v) for v in row):
            rows.append([NAN] * len(row))
            continue
        exact = [Fraction(v) for v in row]
        mean = sum(exact) / len(exact)
        centred = [v - mean for v in exact]
        var = sum(c * c for c in centred) / len(exact) + Fraction(eps)
        if var == 0:
            rows.append([NAN] * len(row))
            continue
        root = (Decimal(var.numerator) / Decimal(var.denominator)).sqrt()
        rows.append([float(Decimal(c.numerator) / Decimal(c.denominator) / root) for c in centred])
    return torch.tensor(rows, dtype=D)


def _looped(x, eps, block_n=16):
    config = ForwardConfig(looped=True, block_rows=1, block_n=block_n, num_warps=1)
    return norm_forward(x, None, None, eps, subtract_mean=True, config=config, interpret=True,
                        allocate=lambda shape, dtype, device: torch.full(shape, 777.0, dtype=dtype, device=device))


def _rows(kind: str, n: int, dtype, seed: int) -> torch.Tensor:
    x = _randn((2, n), seed) * 0.01
    mid, last = (n - 1) // 2, n - 1
    if kind == "median_is_outlier_first":        # columns 0 and (N-1)//2: the median of three is the outlier
        x[:, [0, mid]] = 1e4
    elif kind == "median_is_outlier_last":
        x[:, [mid, last]] = -1e4
    elif kind == "all_three_sampled":
        x[:, [0, mid, last]] = 1e4
    elif kind == "six_outliers":
        x[:, [0, mid, last, 3, 7, 9]] = 1e4
    elif kind == "low_outliers_in_offset_row":
        x = x + 1e4
        x[:, [0, mid]] = 0.0
    elif kind == "offset_float64":
        x = x * 0.1 + 1e6
        x[:, [0, mid]] = -1e9
    elif kind == "underflowing_variance":      # float32 variance ~1e-50 -> 0: the second pass runs
        x = x * 1e-23
        x[:, [0, mid]] = 1e-20
    return x.to(dtype)


@pytest.mark.parametrize("kind,dtype,n,eps", [
    ("median_is_outlier_first", torch.float32, 37, 1e-5), ("median_is_outlier_last", torch.float32, 37, 1e-5),
    ("all_three_sampled", torch.float32, 37, 1e-5), ("six_outliers", torch.float32, 37, 1e-5),
    ("low_outliers_in_offset_row", torch.float32, 40, 0.0), ("offset_float64", D, 37, 1e-5),
    ("underflowing_variance", torch.float32, 37, 0.0), ("plain", BF16, 33, 1e-5),
])
def test_looped_layer_norm_statistics_against_the_exact_values(seed, kind, dtype, n, eps):
    x = _rows(kind, n, dtype, seed)
    y, mean, rstd = _looped(x, eps)
    want = _exact_layer_norm(x, eps)
    theirs = F.layer_norm(x, (n,), eps=eps).to(D) if dtype != D else want
    error, torch_error = (y.to(D) - want).abs().max().item(), (theirs - want).abs().max().item()
    assert error <= 2 * torch_error + 4 * torch.finfo(dtype).eps * want.abs().max().item(), (error, torch_error)
    exact_means = [float(sum(Fraction(v) for v in row) / n) for row in x.to(D).tolist()]
    assert (mean.to(D) - torch.tensor(exact_means, dtype=D)).abs().max().item() \
        <= 8 * torch.finfo(mean.dtype).eps * x.to(D).abs().max().item()


def test_looped_layer_norm_special_rows():
    n = 37
    constants = torch.tensor([0.0, 3.0, -1000.0, 1e30, 1e-40])[:, None].expand(5, n).contiguous()
    for eps in (1e-5, 0.0):
        y, mean, rstd = _looped(constants, eps)
        assert torch.equal(mean, constants[:, 0])           # the shift is the constant: exactly
        if eps:
            assert torch.equal(y, torch.zeros_like(y))       # x - mean is 0: the bias, exactly
        else:       # torch's NaN pattern (0 * inf) and an infinite rstd
            assert y.isnan().all() and rstd.isinf().all()
            assert F.layer_norm(constants, (n,), eps=0.0).isnan().all()
    single = _randn((3, 1), 5, torch.float32)
    y, mean, rstd = _looped(single, 1e-5)
    assert torch.equal(y, torch.zeros_like(y)) and torch.equal(mean, single[:, 0])
    rows = _randn((4, n), 6, torch.float32)
    rows[0, 5], rows[1, 0], rows[2, (n - 1) // 2] = NAN, INF, -INF
    rows[3] = INF
    y, mean, rstd = _looped(rows, 1e-5)
    assert torch.equal(y.isnan(), F.layer_norm(rows, (n,)).isnan()) and y.isnan().all()
    assert rstd.isnan().all()


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_statistics_of_rows_without_columns_on_both_routes(route, op):
    x = torch.randn(3, 0, requires_grad=True)
    weight = torch.randn(0, requires_grad=True)
    if op == "layer_norm":
        outputs = torch.ops.fusedops.layer_norm(x, [0], weight, None, 1e-5)
        y = fusedops.layer_norm(x, (0,), weight)
    else:
        outputs = torch.ops.fusedops.rms_norm(x, [0], weight, 1e-5)
        y = fusedops.rms_norm(x, (0,), weight)
    for statistic in outputs[1:]:
        assert statistic.shape == (3,) and statistic.isnan().all()
    grads = torch.autograd.grad(y.sum(), (x, weight))
    assert grads[0].shape == (3, 0) and grads[1].shape == (0,)


def test_custom_layer_norm_of_rows_without_columns_does_not_warn(fallback):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        F.layer_norm(torch.randn(3, 0), (0,))       # torch's own op is silent
        _, mean, rstd = torch.ops.fusedops.layer_norm(torch.randn(3, 0), [0], None, None, 1e-5)
    assert mean.isnan().all() and rstd.isnan().all()
