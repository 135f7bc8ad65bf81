"""Review (session 25, today's changes): a fresh reviewer tried to break, as a user would and on the CPU only,
what f3ec72b..HEAD changed in fusedops/: (1) arithmetic.fma in the interpreter (TwoSum + rounding to odd) against
the compiled llvm.fma (run on the host, tests/host_jit.py) and rationals; (2) function_host.dual /
once_differentiable / functional.needs_torch for forward-mode AD, vmap and torch.compile; (3) nn.Linear's bias
shape routing; (4) the launcher: the `positive` hint of ints divisible by 16 (keys 16 / 17), refusing tensors
with the negative bit, the fast path's RuntimeError fallback and annotated int ranges, the interpreter's float
range check, do_not_specialize indices, descriptor strides and TMA; (6) the odd 16-bit norm rows' configs.

Defects found (each fixed; its test below now passes):

1. A gradient computed with create_graph=True from a dual (forward-over-reverse), vmapped or batched
   (is_grads_batched) incoming gradient now differentiates again, through torch's ops on the *saved* tensors,
   but the norms' saved mean / rstd and matmul's saved pre-activation z are kernel outputs with no graph:
   layer_norm / rms_norm give a silently wrong second derivative (max abs error 3-25 against torch on a
   (3, 5) float64 input), matmul with an activation raises "element 0 of tensors does not require grad"
   where torch returns the value. Before today these raised the clear "differentiate twice" error.
2. A grad_output with the negative bit (`z.conj().imag`) given to the backward of a kernel-path op now raises
   the launcher's TypeError ("argument `dy_ptr` of kernel `_backward_kernel` has its negative bit set")
   through autograd; torch returns the gradient (the forward routes such inputs to torch, the backward does
   not check its incoming gradient).
3. An `int1`-annotated parameter: after a launch with 0, `k[(1,)](o, -16)` is accepted and packed as True
   (0 and -16 share the launch key class 17); a fresh kernel raises TypeError "annotated int1; got -16,
   which is not a bool". (`fast_path._int_range` leaves int1 at int32's range.)
4. `uint32` / `uint64`-annotated parameters: after a valid launch above int32's range (2**31 + 1, 2**40 + 1),
   a negative value (-1) raises LaunchError from the packer instead of the full path's TypeError
   ("annotated uint32; got -1, outside its range"): `_other_key` ignores the annotation, and -1 keys like
   2**31 + 1. (The fix of the narrow-int case covered only the inline range.)
5. The interpreter raises ValueError for a float-annotated parameter given an int beyond float64's range
   (10**400), where a GPU launch raises LaunchError (the change made the other out-of-range floats
   LaunchErrors on both).
6. fusedops.nn.linear.linear (fusedops.nn.Linear's forward) with a 1-D weight and no bias raises
   "RuntimeError: shape '[4, 3]' is invalid for input of size 4" where F.linear returns x @ w; with a 1-D
   weight and a bias of its length it raises ValueError (fusedops.matmul's) where torch raises RuntimeError,
   and a 0-d weight raises IndexError (torch: RuntimeError). The bias-shape rule `bias.shape !=
   weight.shape[:1]` assumes a 2-D weight.
Fixes: once_differentiable adds to such gradients a zero tied to the saved inputs through the error node
(function_host._with_error_anchor: a derivative in the inputs raises "differentiate twice"; derivatives in
the incoming gradient stay right); backward_runs_torch also for a negated or non-strided gradient; the fast
path checks an annotated int's whole range (int1: 0 and 1) inline and in `_other_key`; the interpreter's
OverflowError for a float parameter is a LaunchError; nn.linear sends weights that are not 2-D to F.linear.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch.func import vmap

import fusedops
import fusedops.dsl as dsl
from fusedops.dsl.errors import LaunchError
from fusedops.dsl.language.numerics import arithmetic
from fusedops.dsl.language.dtypes import bfloat16, float16, float32
from fusedops.nn.linear import linear as fused_linear
from host_jit import run_on_host
from kernel_source import jit_from_source
from test_launch_fast_path import _cuda, gpu  # noqa: F401  (the mocked driver: a fixture, fake CUDA tensors)
from test_review_session25_launch import _descriptor_matmul, _strided_copy_kernel

D = torch.float64


@pytest.fixture(autouse=True)
def _private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path / "kernels"))


def _kernel(source: str, tag: str):
    return jit_from_source(source, f"<review25 changes {tag}>")


def _same_float(x: float, y: float) -> bool:
    """Equal bit for bit up to NaN payloads (the sign of zero counts)."""
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return x == y and math.copysign(1.0, x) == math.copysign(1.0, y)


# ================================================================================================
# (1) arithmetic.fma against the compiled llvm.fma and rationals
# ================================================================================================
_FMA_LOOP = _kernel("def k(o_ptr, a_ptr, b_ptr, c_ptr, n):\n    for i in range(n):\n"
                    "        dsl.store(o_ptr + i, dsl.fma(dsl.load(a_ptr + i), dsl.load(b_ptr + i), dsl.load(c_ptr + i)))\n",
                    "fma_loop")
_INF, _NAN = math.inf, math.nan
_F32MAX = float(np.finfo(np.float32).max)
_TINY = 2.0 ** -149
_FMA_SPECIALS = [
    (_INF, 0.0, 1.0), (_INF, 1.0, -_INF), (_INF, 2.0, 1.0), (_NAN, 1.0, 1.0), (1.0, 1.0, _NAN), (-_INF, -1.0, _INF),
    (_F32MAX, 2.0, -_F32MAX), (_F32MAX, 1.0, _F32MAX), (_F32MAX, 2.0, 0.0), (-_F32MAX, 2.0, _F32MAX),
    (_F32MAX, _F32MAX, -_INF), (3.0, 2.0 ** 127, -_F32MAX),
    (_TINY, 0.5, 0.0), (-_TINY, 0.5, 0.0), (_TINY, 0.75, 0.0), (_TINY, 0.5, -0.0), (-_TINY, 0.5, -0.0),
    (2.0 ** -126, 0.5, 0.0), (1e-45, 1e-45, 1e-45),
    (0.0, -1.0, 0.0), (-0.0, 1.0, -0.0), (1.0, 1.0, -1.0), (-1.0, 1.0, 1.0), (1 + 2 ** -23, 1 - 2 ** -23, -1.0),
    # a subnormal result whose float64 sum is a float32 tie: the exact sum is above it (2**-130 + 2**-149),
    # rounding the float64 sum to float32 again would give 2**-130
    (-2.0 ** -75 * (1 + 2 ** -23), 2.0 ** -75 * (1 - 2 ** -23), 2.0 ** -130 + 2.0 ** -149),
    (2.0 ** -75 * (1 + 2 ** -23), 2.0 ** -75 * (1 - 2 ** -23), -(2.0 ** -130 + 2.0 ** -149)),
]


def test_float32_fma_special_values_match_the_compiled_code_bit_for_bit():
    n = len(_FMA_SPECIALS)
    a, b, c = (torch.tensor([case[i] for case in _FMA_SPECIALS], dtype=torch.float32) for i in range(3))
    compiled, interpreted = torch.zeros(n), torch.zeros(n)
    run_on_host(_FMA_LOOP, compiled, a, b, c, n)
    _FMA_LOOP[(1,)](interpreted, a, b, c, n, interpret=True)
    for i in range(n):
        assert _same_float(compiled[i].item(), interpreted[i].item()), (_FMA_SPECIALS[i], compiled[i], interpreted[i])
    assert compiled[-2].item() == 2.0 ** -130 + 2.0 ** -149


def test_float32_fma_keeps_subnormals_in_the_ptx():
    t = torch.zeros(4)
    ptx = _FMA_LOOP.compile(t, t, t, t, 4, target="sm_90a").asm["ptx"]
    assert set(re.findall(r"fma\.[\w.]+", ptx)) == {"fma.rn.f32"}       # no .ftz: as the interpreter


def test_float32_fma_random_bits_subnormals_and_cancellations_match_the_compiled_code():
    rng = np.random.default_rng(2025)
    n = 30000
    a, b, c = (rng.integers(0, 2 ** 32, size=n, dtype=np.uint64).astype(np.uint32).view(np.float32) for _ in range(3))
    with np.errstate(all="ignore"):
        third = n // 3
        c[:third] = (-(a[:third].astype(np.float64) * b[:third])).astype(np.float32)       # near cancellation
        sub = slice(third, 2 * third)                                                       # tiny products
        for v in (a, b):
            v[sub] = ((v[sub].view(np.uint32) & 0x807FFFFF)
                      | (rng.integers(40, 90, third).astype(np.uint32) << 23)).view(np.float32)
        c[sub] = (c[sub].view(np.uint32) & 0x80FFFFFF).view(np.float32)                  # subnormal / tiny c
    compiled = torch.zeros(n)
    run_on_host(_FMA_LOOP, compiled, *(torch.from_numpy(v) for v in (a, b, c)), n)
    with np.errstate(all="ignore"):
        interpreted = np.asarray(arithmetic.fma(a, b, c, float32), dtype=np.float32)
    got = compiled.numpy()
    same = (got.view(np.uint32) == interpreted.view(np.uint32)) | (np.isnan(got) & np.isnan(interpreted))
    assert same.all(), np.nonzero(~same)[0][:5]


def _bf16_values(bits: np.ndarray) -> np.ndarray:
    return torch.from_numpy(bits.astype(np.uint16).view(np.int16)).view(torch.bfloat16).double().numpy()


def test_bfloat16_fma_rounds_the_exact_sum_once_including_overflow():
    finite = _bf16_values(np.arange(2 ** 16))
    finite = np.unique(np.abs(finite[np.isfinite(finite)]))
    largest = finite[-1]
    overflow = Fraction(largest) + (Fraction(2.0 ** 128) - Fraction(largest)) / 2

    def nearest(exact: Fraction) -> float:
        if exact == 0:
            return 0.0
        sign, mag = (1 if exact > 0 else -1), abs(exact)
        if mag >= overflow:
            return sign * math.inf
        i = int(np.searchsorted(finite, float(mag)))
        cands = [finite[j] for j in range(max(i - 2, 0), min(i + 2, len(finite)))]
        best = min(cands, key=lambda v: (abs(Fraction(v) - mag),
                                         int(torch.tensor(v).to(torch.bfloat16).view(torch.int16)) & 1))
        return sign * float(best)

    rng = np.random.default_rng(7)
    n = 3000
    a, b = (_bf16_values(rng.integers(0, 2 ** 16, n)) for _ in range(2))
    with np.errstate(all="ignore"):
        c = -(a * b) * (1 + rng.choice([0.0, 2.0 ** -8, -2.0 ** -8, 2.0 ** -9], n))
        c = np.where(rng.random(n) < 0.3, _bf16_values(rng.integers(0, 2 ** 16, n)), c)
        c = torch.from_numpy(c).to(torch.bfloat16).double().numpy()
        out = np.asarray(arithmetic.fma(a.astype(np.float32), b.astype(np.float32), c.astype(np.float32), bfloat16),
                         dtype=np.float32).astype(np.float64)
    for i in range(n):
        if np.isfinite(a[i]) and np.isfinite(b[i]) and np.isfinite(c[i]):
            expected = nearest(Fraction(a[i]) * Fraction(b[i]) + Fraction(c[i]))
            assert out[i] == expected or (expected == 0 and out[i] == 0), (a[i], b[i], c[i], out[i], expected)
        elif np.isnan(a[i] * b[i] + c[i]):
            assert np.isnan(out[i])


def test_float16_fma_at_the_overflow_boundary():
    kernel = _kernel("def k(o_ptr, a_ptr, b_ptr, c_ptr):\n    i = dsl.arange(0, 4)\n"
                     "    dsl.store(o_ptr + i, dsl.fma(dsl.load(a_ptr + i), dsl.load(b_ptr + i), dsl.load(c_ptr + i)))\n",
                     "fma16_edge")
    h = torch.float16
    a = torch.tensor([256.0, 256.0, 256.0, -256.0], dtype=h)
    b = torch.tensor([256.0, 256.0, 256.0, 256.0], dtype=h)
    c = torch.tensor([-16.0, -16.015625, -32.0, 16.0], dtype=h)     # exact: 65520 (the tie), 65519.98, 65504, -65520
    out = torch.zeros(4, dtype=h)
    kernel[(1,)](out, a, b, c, interpret=True)
    assert out.double().tolist() == [math.inf, 65504.0, 65504.0, -math.inf]


def test_numerics_fma_shapes_scalars_and_broadcasting():
    r = arithmetic.fma(np.float32(1.5), np.float32(2.0), np.float32(-0.0), float32)
    assert np.asarray(r).shape == () and float(r) == 3.0
    r = arithmetic.fma(np.ones((2, 1), np.float32), np.arange(3, dtype=np.float32), np.float32(2 ** -30), float32)
    assert np.asarray(r).shape == (2, 3)
    assert np.asarray(r, dtype=np.float32).tolist() == [[2 ** -30, 1.0, 2.0]] * 2
    r = arithmetic.fma(np.float16(1.0), np.float16(1.0), np.float16(2 ** -24), float16)    # 1 + 2**-24: below a tie
    assert float(r) == 1.0


# ================================================================================================
# (2) forward-mode AD, vmap and torch.compile around the kernels' backward
# ================================================================================================
_W = torch.randn(5, dtype=D, generator=torch.Generator().manual_seed(11))
_B = torch.randn(5, dtype=D, generator=torch.Generator().manual_seed(12))
_M = torch.randn(5, 3, dtype=D, generator=torch.Generator().manual_seed(13))


def _sdpa_math(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.size(-1)), -1) @ v


OPS = {
    "softmax": (lambda x: fusedops.softmax(x, -1), lambda x: torch.softmax(x, -1)),
    "log_softmax": (lambda x: fusedops.log_softmax(x, 0), lambda x: torch.log_softmax(x, 0)),
    "layer_norm": (lambda x: fusedops.layer_norm(x, (5,), _W, _B), lambda x: F.layer_norm(x, (5,), _W, _B)),
    "rms_norm": (lambda x: fusedops.rms_norm(x, (5,), _W), lambda x: F.rms_norm(x, (5,), _W)),
    "matmul": (lambda x: fusedops.matmul(x, _M), lambda x: x @ _M),
    "matmul_gelu": (lambda x: fusedops.matmul(x, _M, _B[:3], "gelu_tanh"),
                    lambda x: F.gelu(x @ _M + _B[:3], approximate="tanh")),
    "attention": (lambda x: fusedops.scaled_dot_product_attention(x.view(1, 1, 3, 5), x.view(1, 1, 3, 5) * _W,
                                                                  x.view(1, 1, 3, 5)),
                  lambda x: _sdpa_math(x.view(1, 1, 3, 5), x.view(1, 1, 3, 5) * _W, x.view(1, 1, 3, 5))),
}


def _second_derivative(op, mode: str):
    """d/dx sum(g**2), g the gradient of op at x pulled back (create_graph=True) from a dual, vmapped or batched
    incoming gradient."""
    x = torch.randn(3, 5, dtype=D, generator=torch.Generator().manual_seed(3)).requires_grad_()
    y = op(x)
    v = torch.randn(y.shape, dtype=D, generator=torch.Generator().manual_seed(4))
    if mode == "dual":
        with fwAD.dual_level():
            g = torch.autograd.grad(y, x, fwAD.make_dual(v, torch.ones_like(v)), create_graph=True)[0]
            g = fwAD.unpack_dual(g).primal
    elif mode == "vmap":
        g = vmap(lambda v: torch.autograd.grad(y, x, v, retain_graph=True, create_graph=True)[0])(torch.stack([v, 2 * v]))
    else:
        g = torch.autograd.grad(y, x, torch.stack([v, 2 * v]), is_grads_batched=True, create_graph=True)[0]
    return torch.autograd.grad(g.square().sum(), x)[0]


def _check_second_derivative(name: str, mode: str):
    ours, theirs = OPS[name]
    try:
        got = _second_derivative(ours, mode)
    except RuntimeError as error:
        # the one acceptable alternative to torch's value: the clear double-backward error
        assert "differentiate twice" in str(error), str(error)
        return
    torch.testing.assert_close(got, _second_derivative(theirs, mode), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("mode", ["dual", "vmap", "batched"])
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "attention"])
def test_second_derivative_after_a_dual_or_batched_create_graph_gradient(interpret, name, mode):
    _check_second_derivative(name, mode)


@pytest.mark.parametrize("mode", ["dual", "vmap", "batched"])
@pytest.mark.parametrize("name", ["layer_norm", "rms_norm"])
def test_norm_second_derivative_after_a_dual_or_batched_create_graph_gradient(interpret, name, mode):
    _check_second_derivative(name, mode)


@pytest.mark.parametrize("mode", ["dual", "batched"])
def test_matmul_activation_second_derivative_after_a_dual_or_batched_gradient(interpret, mode):
    _check_second_derivative("matmul_gelu", mode)


@pytest.mark.parametrize("name", ["softmax", "layer_norm", "rms_norm", "matmul_gelu", "attention"])
def test_plain_create_graph_gradient_still_raises_on_double_backward_even_in_a_dual_level(interpret, name):
    ours, _ = OPS[name]
    for in_level in (False, True):
        x = torch.randn(3, 5, dtype=D, generator=torch.Generator().manual_seed(5)).requires_grad_()
        y = ours(x)
        if in_level:
            with fwAD.dual_level():
                fwAD.make_dual(torch.zeros(2, dtype=D), torch.ones(2, dtype=D))    # an unrelated dual tensor
                (g,) = torch.autograd.grad(y, x, torch.ones_like(y), create_graph=True)
        else:
            (g,) = torch.autograd.grad(y, x, torch.ones_like(y), create_graph=True)
        assert g.requires_grad
        with pytest.raises(RuntimeError, match="differentiate twice"):
            torch.autograd.grad(g.square().sum(), x)


def test_forward_over_reverse_first_order_values_and_tangents(interpret):
    for name in ("softmax", "log_softmax", "layer_norm", "rms_norm", "matmul_gelu"):
        ours, theirs = OPS[name]
        results = []
        for op in (ours, theirs):
            x = torch.randn(3, 5, dtype=D, generator=torch.Generator().manual_seed(6)).requires_grad_()
            y = op(x)
            v, t = (torch.randn(y.shape, dtype=D, generator=torch.Generator().manual_seed(s)) for s in (7, 8))
            with fwAD.dual_level():
                g = fwAD.unpack_dual(torch.autograd.grad(y, x, fwAD.make_dual(v, t), create_graph=True)[0])
                results.append((g.primal.detach(), g.tangent.detach()))
        for a, b in zip(*results):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def _graph_recorder():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm.forward
    return graphs, backend


def test_compile_in_a_dual_level_without_dual_inputs_runs_torch_and_recompiles_outside(interpret, reset_dynamo):
    """Acceptable by design (needs_torch's docstring): inside a dual level the compiled graph takes torch's ops
    even with no dual input (correct values, torch's speed); leaving the level recompiles to the custom op."""
    graphs, backend = _graph_recorder()
    f = torch.compile(lambda x: fusedops.layer_norm(x, (5,), _W, _B), backend=backend)
    x = torch.randn(3, 5, dtype=D)
    with fwAD.dual_level():
        inside = f(x)
    outside = f(x)
    assert len(graphs) == 2
    assert "fusedops" not in graphs[0] and "fusedops" in graphs[1]
    torch.testing.assert_close(inside, F.layer_norm(x, (5,), _W, _B))
    torch.testing.assert_close(outside, inside)


def test_compiled_outside_then_called_with_a_dual_input_keeps_the_tangent(interpret, reset_dynamo):
    graphs, backend = _graph_recorder()
    f = torch.compile(lambda x: fusedops.rms_norm(x, (5,), _W), backend=backend)
    x, t = torch.randn(3, 5, dtype=D), torch.randn(3, 5, dtype=D)
    f(x)
    with fwAD.dual_level():
        got = fwAD.unpack_dual(f(fwAD.make_dual(x, t))).tangent
        expected = fwAD.unpack_dual(F.rms_norm(fwAD.make_dual(x, t), (5,), _W)).tangent
    assert got is not None
    torch.testing.assert_close(got, expected)
    assert "fusedops" in graphs[0] and "fusedops" not in graphs[1]


# ================================================================================================
# (3) nn.Linear's bias shapes
# ================================================================================================
@pytest.mark.parametrize("bias_shape", [(4, 2), (1,), (), (2,), "strided", "expanded", None])
def test_linear_bias_shapes_values_and_gradients_match_torch(interpret, bias_shape):
    g = torch.Generator().manual_seed(9)
    x = torch.randn(4, 3, dtype=D, generator=g)
    w = torch.randn(2, 3, dtype=D, generator=g)
    if bias_shape == "strided":
        bias = torch.randn(4, dtype=D, generator=g)[::2]
    elif bias_shape == "expanded":
        bias = torch.randn(1, dtype=D, generator=g).expand(2)
    else:
        bias = None if bias_shape is None else torch.randn(bias_shape, dtype=D, generator=g)
    results = []
    for fn in (fused_linear, F.linear):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        bs = None if bias is None else bias.detach().clone().requires_grad_()
        out = fn(xs, ws, bs)
        out.backward(torch.ones_like(out) * torch.arange(out.numel(), dtype=D).view_as(out))
        results.append((out, xs.grad, ws.grad, None if bs is None else bs.grad))
    for a, b in zip(*results):
        if a is None:
            assert b is None
        else:
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_linear_bias_that_does_not_broadcast_raises_torchs_error(interpret):
    x, w = torch.randn(4, 3, dtype=D), torch.randn(2, 3, dtype=D)
    with pytest.raises(RuntimeError):
        F.linear(x, w, torch.randn(3, dtype=D))
    with pytest.raises(RuntimeError):
        fused_linear(x, w, torch.randn(3, dtype=D))


def test_linear_with_a_one_dimensional_weight_returns_torchs_value(interpret):
    x, w = torch.randn(4, 3, dtype=D), torch.randn(3, dtype=D)
    torch.testing.assert_close(fused_linear(x, w), F.linear(x, w))


@pytest.mark.parametrize("weight_shape,bias_shape", [((3,), (3,)), ((), ()), ((), None)])
def test_linear_with_a_weight_that_is_not_2d_raises_torchs_runtime_error(interpret, weight_shape, bias_shape):
    x = torch.randn(4, 3 if weight_shape else 1, dtype=D)
    w = torch.randn(weight_shape, dtype=D)
    b = None if bias_shape is None else torch.randn(bias_shape, dtype=D)
    with pytest.raises(RuntimeError):
        F.linear(x, w, b)
    with pytest.raises(RuntimeError):
        fused_linear(x, w, b)


# ================================================================================================
# (4) the launcher: positive hints, negative bits, sparse tensors, ranges, do_not_specialize
# ================================================================================================
def _launched(kernel, params: int) -> tuple:
    entries = [e for e in kernel._cache.values() if e.compiled is not None]
    return entries[-1].compiled.launcher(0).packer.read(params)


def _stride_specs(kernel) -> set:
    return {(k.args[2].type, k.args[2].divisible_by_16, k.args[2].positive) for k in kernel._cache if k.arch}


def test_positive_and_non_positive_multiples_of_16_take_their_own_kernels_and_plans(gpu):
    kernel = _strided_copy_kernel()
    x, y = _cuda(torch.zeros(64)), _cuda(torch.zeros(64))
    strides = (16, 32, 0, -16, -32, 16, 0, 2 ** 40, -2 ** 40, 2 ** 40 + 16, -2 ** 31, 2 ** 31 - 15, 3, -3)
    for stride in strides:
        kernel[(1,)](x, y, stride, 4, BLOCK=4)
        type_ = dsl.int32 if -2 ** 31 <= stride < 2 ** 31 else dsl.int64
        matching = [(k, e) for k, e in kernel._cache.items() if k.arch and k.args[2].type == type_
                    and k.args[2].divisible_by_16 == (stride % 16 == 0) and k.args[2].divisible_by_8 is False
                    and k.args[2].positive == (stride > 0 and stride % 16 == 0)]
        assert len(matching) == 1, stride
        assert matching[0][1].compiled.launcher(0).packer.read(gpu[-1][1])[2] == stride
    assert _stride_specs(kernel) == {(dsl.int32, True, True), (dsl.int32, True, False), (dsl.int64, True, True),
                                     (dsl.int64, True, False), (dsl.int32, False, False)}
    assert len(gpu) == len(strides)
    hints = {key.args[2].positive: entry.kernel.function.arg_hints[2] for key, entry in kernel._cache.items()
             if key.arch and key.args[2].type == dsl.int32 and key.args[2].divisible_by_16}
    assert hints == {True: {"divisibility": 16, "positive": True}, False: {"divisibility": 16}}


def test_annotated_int_positive_hint_and_uint64_above_int64(gpu):
    def ann(o_ptr, a: dsl.int64, u: dsl.uint64):
        dsl.store(o_ptr, a + u.to(dsl.int64))
    kernel = dsl.jit(ann)
    o = _cuda(torch.zeros(1, dtype=torch.int64))
    for a, u in ((16, 2 ** 63 + 16), (-16, 0), (0, 16)):
        kernel[(1,)](o, a, u)
        key = [k for k in kernel._cache if k.arch][-1]
        assert (key.args[1].positive, key.args[2].positive) == (a > 0, u > 0)
        assert _launched(kernel, gpu[-1][1])[1:] == (a, u)


def test_descriptor_with_a_negative_row_stride_keeps_the_masked_load(gpu, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_TMA", "1")
    g = torch.Generator().manual_seed(1)
    base, b = torch.randn(64, 64, generator=g).half(), torch.randn(64, 64, generator=g).half()
    c = torch.zeros(64, 64, dtype=torch.float16)
    for stride, bulk in ((64, True), (-64, False), (-16, False), (0, False), (16, True)):
        ptx = _descriptor_matmul().compile(c, base, b, 64, 64, 64, stride, 64, 64, BM=64, BN=64, BK=32,
                                           target="sm_90a").asm["ptx"]
        assert ("cp.async.bulk.tensor" in ptx) == bulk, stride
    # rows read backwards from the last one: the interpreter, and a (mocked) sm_90a launch builds no tensor map
    _descriptor_matmul()[(1, 1)](c, base[63:], b, 64, 64, 64, -64, 64, 64, BM=64, BN=64, BK=32, interpret=True)
    torch.testing.assert_close(c.float(), (base.flip(0).double() @ b.double()).float(), atol=2e-2, rtol=2e-2)
    kernel = _descriptor_matmul()
    for stride in (-64, -128):
        kernel[(1, 1)](_cuda(c), _cuda(base[63:]), _cuda(b), 64, 64, 64, stride, 64, 64, BM=64, BN=64, BK=32)
    assert len(gpu) == 2 and len([k for k in kernel._cache if k.arch]) == 1


def _copy():
    def copy(x_ptr, y_ptr, n, BLOCK: dsl.constexpr):
        offs = dsl.arange(0, BLOCK)
        m = offs < n
        dsl.store(y_ptr + offs, dsl.load(x_ptr + offs, mask=m), mask=m)
    return dsl.jit(copy)


def _negated(n: int) -> torch.Tensor:
    view = torch.tensor([1 + 2j, 3 + 4j] * (n // 2), dtype=torch.complex64).conj().imag
    assert view.is_neg()
    return view


def test_negated_parameters_and_subclasses_are_refused_after_a_cached_launch(gpu):
    kernel = _copy()
    x, y = _cuda(torch.zeros(16)), _cuda(torch.zeros(16))
    kernel[(1,)](x, y, 16, BLOCK=16)
    kernel[(1,)](x, y, 16, BLOCK=16)
    assert len(kernel._plans) == 1
    neg = _negated(16)
    for arg in (_cuda(neg), torch.nn.Parameter(neg, requires_grad=False)):
        assert arg.is_neg()
        with pytest.raises(TypeError, match="`x_ptr`.*negative bit"):
            kernel[(1,)](arg, y, 16, BLOCK=16)
    with pytest.raises(TypeError, match="`y_ptr`.*negative bit"):
        kernel[(1,)](x, _cuda(neg), 16, BLOCK=16)
    with pytest.raises(TypeError, match="`x_ptr`.*negative bit"):
        kernel[(1,)](torch.nn.Parameter(neg, requires_grad=False), torch.zeros(16), 16, BLOCK=16, interpret=True)
    kernel[(1,)](_cuda(neg.resolve_neg()), y, 16, BLOCK=16)      # resolved: accepted
    assert len(gpu) == 3


def test_sparse_parameters_and_subclasses_after_a_cached_launch(gpu):
    kernel = _copy()
    x, y = _cuda(torch.zeros(16)), _cuda(torch.zeros(16))
    kernel[(1,)](x, y, 16, BLOCK=16)
    kernel[(1,)](x, y, 16, BLOCK=16)
    sparse = torch.zeros(16).to_sparse()
    for arg in (sparse, _cuda(sparse), torch.nn.Parameter(sparse, requires_grad=False), torch.zeros(4, 4).to_sparse_csr()):
        with pytest.raises(TypeError, match=r"`x_ptr`.*dense \(strided\)"):
            kernel[(1,)](arg, y, 16, BLOCK=16)
    kernel[(1,)](x, y, 16, BLOCK=16)
    assert len(gpu) == 3


def _scalar_kernel(annotation):
    if annotation == "float16":
        def k(o_ptr, a: dsl.float16):
            dsl.store(o_ptr, a.to(dsl.float32))
    elif annotation == "bfloat16":
        def k(o_ptr, a: dsl.bfloat16):
            dsl.store(o_ptr, a.to(dsl.float32))
    elif annotation == "float32":
        def k(o_ptr, a: dsl.float32):
            dsl.store(o_ptr, a)
    else:
        def k(o_ptr, a):
            dsl.store(o_ptr, a)
    return dsl.jit(k)


_TIE = _F32MAX + 2.0 ** 103      # float32's largest plus half an ulp: rounds to inf


@pytest.mark.parametrize("annotation,value,expected", [
    ("float16", 65504.0, 65504.0), ("float16", 65519.99, 65504.0), ("float16", 65520.0, LaunchError),
    ("float16", -65520.0, LaunchError), ("float16", math.inf, math.inf), ("float16", -math.inf, -math.inf),
    ("float16", math.nan, math.nan), ("float16", 65519, 65504.0), ("float16", 65520, LaunchError),
    ("float16", np.float64(65520.0), LaunchError), ("float16", np.float32(65520.0), LaunchError),
    ("float16", 2 ** 70, LaunchError), ("float16", 1e-8, 0.0), ("float16", -1e-8, -0.0),
    (None, _F32MAX, _F32MAX), (None, _TIE, LaunchError), (None, math.nextafter(_TIE, 0.0), _F32MAX),
    (None, -_TIE, LaunchError), (None, math.inf, math.inf), (None, math.nan, math.nan), (None, 1e-46, 0.0),
    ("float32", 10 ** 39, LaunchError), ("float32", np.float32(3e38), float(np.float32(3e38))),
    ("bfloat16", 1e39, math.inf), ("bfloat16", 3.4e38, math.inf), ("bfloat16", math.nan, math.nan),
], ids=repr)
def test_float_arguments_interpreter_and_gpu_packing_agree(gpu, annotation, value, expected):
    kernel = _scalar_kernel(annotation)
    out = torch.zeros(1)
    if expected is LaunchError:
        with pytest.raises(LaunchError, match=r"`?a`?"):
            kernel[(1,)](out, value, interpret=True)
        with pytest.raises(LaunchError, match=r"\(a\)"):
            _scalar_kernel(annotation)[(1,)](_cuda(torch.zeros(1)), value)
        return
    kernel[(1,)](out, value, interpret=True)
    assert _same_float(out.item(), expected)
    kernel = _scalar_kernel(annotation)
    kernel[(1,)](_cuda(torch.zeros(1)), value)
    packed = _launched(kernel, gpu[-1][1])[1]
    if annotation == "bfloat16":
        packed = torch.tensor([packed], dtype=torch.int32).to(torch.int16).view(torch.bfloat16).item()
    assert _same_float(float(packed), expected)


@pytest.mark.parametrize("annotation", ["float16", "float32"])
def test_an_int_beyond_float64_for_a_float_parameter_is_a_launch_error_in_the_interpreter(gpu, annotation):
    with pytest.raises(LaunchError, match=r"\(a\)"):
        _scalar_kernel(annotation)[(1,)](_cuda(torch.zeros(1)), 10 ** 400)
    with pytest.raises(LaunchError):
        _scalar_kernel(annotation)[(1,)](torch.zeros(1), 10 ** 400, interpret=True)


def _annotated_int_kernel(annotation: str, tag: str):
    return _kernel(f"def k(o_ptr, a: dsl.{annotation}):\n    dsl.store(o_ptr, a.to(dsl.int64))\n", tag)


@pytest.mark.parametrize("annotation,good,bad", [("int8", 0, -144), ("int8", -16, 128), ("int16", 16, 2 ** 15),
                                                 ("uint8", 0, 256), ("uint32", 6, -16), ("int64", 2 ** 40, 2 ** 63)])
def test_annotated_int_out_of_range_after_a_cached_launch(gpu, annotation, good, bad):
    kernel = _annotated_int_kernel(annotation, f"ok {annotation} {good} {bad}")
    o = _cuda(torch.zeros(1, dtype=torch.int64))
    kernel[(1,)](o, good)
    kernel[(1,)](o, good)
    assert _launched(kernel, gpu[-1][1])[1] == good
    with pytest.raises(TypeError, match=f"annotated {annotation}"):
        kernel[(1,)](o, bad)


@pytest.mark.parametrize("bad", [-16, -32, -2 ** 31])
def test_int1_annotation_refuses_a_negative_multiple_of_16_after_a_cached_launch(gpu, bad):
    kernel = _kernel("def k(o_ptr, a: dsl.int1):\n    dsl.store(o_ptr, a.to(dsl.int32))\n", f"int1 {bad}")
    o = _cuda(torch.zeros(1, dtype=torch.int32))
    with pytest.raises(TypeError, match="annotated int1"):
        kernel[(1,)](o, bad)            # the full path
    kernel[(1,)](o, 0)
    with pytest.raises(TypeError, match="annotated int1"):
        kernel[(1,)](o, bad)


@pytest.mark.parametrize("annotation,good,bad", [("uint32", 2 ** 31 + 1, -1), ("uint32", 2 ** 31 + 1, -2 ** 31 - 1),
                                                 ("uint64", 2 ** 40 + 1, -1), ("uint64", 2 ** 40 + 1, -2 ** 40 - 1)])
def test_unsigned_annotation_refuses_negatives_after_a_launch_past_int32(gpu, annotation, good, bad):
    kernel = _annotated_int_kernel(annotation, f"bad {annotation} {good} {bad}")
    o = _cuda(torch.zeros(1, dtype=torch.int64))
    with pytest.raises(TypeError, match=f"annotated {annotation}"):
        kernel[(1,)](o, bad)
    kernel[(1,)](o, good)
    with pytest.raises(TypeError, match=f"annotated {annotation}"):
        kernel[(1,)](o, bad)


def test_do_not_specialize_indices():
    def three(a, b, c):
        pass
    assert [p.name for p in dsl.jit(do_not_specialize=[-1, 0])(three).params if p.do_not_specialize] == ["a", "c"]
    assert [p.name for p in dsl.jit(do_not_specialize=[-3, "b"])(three).params if p.do_not_specialize] == ["a", "b"]
    for bad in ([3], [-4], [0, 7]):
        with pytest.raises(TypeError, match=r"out of range for the 3 parameters"):
            dsl.jit(do_not_specialize=bad)(three)
    with pytest.raises(TypeError, match="'d'"):
        dsl.jit(do_not_specialize=["d"])(three)


def test_do_not_specialize_int_shares_one_kernel_for_every_sign(gpu):
    kernel = _strided_copy_kernel()
    kernel = dsl.jit(do_not_specialize=["stride"])(kernel.fn)
    x, y = _cuda(torch.zeros(64)), _cuda(torch.zeros(64))
    for stride in (16, -16, 0, 1, 3):
        kernel[(1,)](x, y, stride, 4, BLOCK=4)
        assert _launched(kernel, gpu[-1][1])[2] == stride
    assert len([k for k in kernel._cache if k.arch]) == 1


# ------------------------------------------------------------------------------------------------
# a grad_output with the negative bit, given to a kernel backward
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["softmax", "layer_norm", "rms_norm", "matmul", "attention"])
def test_a_negated_grad_output_gives_torchs_gradient(interpret, name):
    ours, theirs = OPS[name]
    x = torch.randn(3, 5, dtype=D, generator=torch.Generator().manual_seed(14))
    shape = theirs(x).shape
    dy = torch.randn(shape, dtype=torch.complex128, generator=torch.Generator().manual_seed(15)).conj().imag
    assert dy.is_neg()
    grads = []
    for op in (ours, theirs):
        xs = x.clone().requires_grad_()
        grads.append(torch.autograd.grad(op(xs), xs, dy)[0])
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-9, atol=1e-9)


def test_negated_forward_inputs_still_run_torch(interpret):
    x = torch.randn(3, 5, dtype=D)
    w, b = (torch.randn(5, dtype=torch.complex128).conj().imag for _ in range(2))
    assert w.is_neg()
    torch.testing.assert_close(fusedops.layer_norm(x, (5,), w, b), F.layer_norm(x, (5,), w, b))
    m = torch.randn(5, 4, dtype=torch.complex128).conj().imag
    torch.testing.assert_close(fusedops.matmul(x, m), x @ m)
    torch.testing.assert_close(fused_linear(x, m.t(), None), F.linear(x, m.t()))


@pytest.mark.parametrize("eps", [1e39, 3.5e38, 70000.0])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_norm_eps_past_float32_is_not_a_launch_error(interpret, eps, dtype):
    """The interpreter's new float32 range check reaches the library's eps argument: torch rounds eps to the
    accumulation type (1e39 -> inf). (At HEAD this raised LaunchError in the interpreter; the working tree's
    norm_forward_launcher.forward_launcher rounds eps itself.)"""
    x = torch.randn(3, 4, dtype=dtype, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(fusedops.layer_norm(x, (4,), eps=eps).double(), F.layer_norm(x, (4,), eps=eps).double(),
                               atol=2e-3, rtol=2e-3, equal_nan=True)
    torch.testing.assert_close(fusedops.rms_norm(x, (4,), eps=eps).double(), F.rms_norm(x, (4,), eps=eps).double(),
                               atol=2e-3, rtol=2e-3, equal_nan=True)


# ================================================================================================
# (6) odd 16-bit norm rows around the new config boundaries
# ================================================================================================
def test_odd_row_config_boundaries():
    from fusedops.kernels.norm_backward_config import backward_config
    from fusedops.kernels.norm_forward_config import _odd_row_window_config
    assert _odd_row_window_config(12799, True).block_n == 2048
    assert _odd_row_window_config(12801, True).block_n == 4096
    assert _odd_row_window_config(8191, False).block_n == 1024
    assert backward_config(16377, torch.float16).block_n == 2048         # N + 7 == 8 * 2048
    assert backward_config(16378, torch.float16).block_n == 4096
    assert backward_config(16377, torch.float16, clusters=False).cluster is False


@pytest.mark.parametrize("n,offset", [(12799, 3), (12801, 5), (16377, 1), (16377, 7), (8193, 4)])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_odd_16bit_rows_at_the_boundaries_misaligned(interpret, monkeypatch, n, offset, op):
    from fusedops.autograd import norms as norms_autograd
    from fusedops.kernels import norms
    from fusedops.kernels.norm_backward_kernels import backward_persistent_kernel
    norms._FORWARD_LAUNCHES.clear()         # prepare anew (the spy below sees the cluster size)
    norms._BACKWARD_LAUNCHES.clear()
    norms_autograd._KNOWN_LAUNCHES.clear()
    clusters = []
    prepare = backward_persistent_kernel.prepare

    def spy(*args, **kwargs):
        clusters.append(kwargs.get("CLUSTER"))
        return prepare(*args, **kwargs)
    monkeypatch.setattr(backward_persistent_kernel, "prepare", spy)
    g = torch.Generator().manual_seed(n + offset)
    x = torch.randn(2 * n + 16, generator=g).half()[offset:offset + 2 * n].view(2, n).requires_grad_()
    w = torch.randn(n, generator=g).half().requires_grad_()
    b = torch.randn(n, generator=g).half().requires_grad_()
    dy = torch.randn(2 * n + 16, generator=g).half()[7:7 + 2 * n].view(2, n)
    if op == "layer_norm":
        y = fusedops.layer_norm(x, (n,), w, b)
        ref = lambda xx, ww, bb: F.layer_norm(xx, (n,), ww, bb)     # noqa: E731
    else:
        y = fusedops.rms_norm(x, (n,), w)
        ref = lambda xx, ww, bb: F.rms_norm(xx, (n,), ww)           # noqa: E731
    gx, gw = torch.autograd.grad(y, (x, w), dy)
    xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, b))
    yr = ref(xd, wd, bd)
    rx, rw = torch.autograd.grad(yr, (xd, wd), dy.double())
    for got, want in ((y, yr), (gx, rx), (gw, rw)):
        torch.testing.assert_close(got.double(), want.detach(), atol=1.5e-2, rtol=1e-2)
    if n > 12800:
        assert clusters and all(c >= 2 for c in clusters), clusters
    if n == 16377:
        assert max(clusters) == 8
