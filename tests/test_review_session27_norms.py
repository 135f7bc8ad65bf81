"""Review (session 27, norms): a demanding PyTorch / Triton user tried to break fusedops.layer_norm,
fusedops.rms_norm, fusedops.nn.LayerNorm and fusedops.nn.RMSNorm on the CPU, on both routes: the kernels in the
NumPy interpreter (`interpret`, FUSEDOPS_INTERPRET=1, the path CUDA tensors take) and torch's fallback
(`fallback`). torch 2.13 on this machine is the oracle: its values (float64 references where numerics matter),
dtypes and errors. Numerical bar (the repo's, tests/test_norms.py): torch's NaN/inf pattern, and finite entries
within twice torch's own same-dtype error against float64 plus one unit in the last place of the largest entry.

What was tried, with the peer bug reports the cases come from:
- normalized_shape as int, tuple, list, torch.Size, numpy ints, multi-dim, empty, negative, float, longer than the
  input, mismatched with the input's trailing dims (tvm-style spellings; torch's errors).
- weight and bias present or absent independently, each alone requiring grad (pytorch#80952, ExpandedWeights with an
  input that does not require grad; unsloth#45 / #4533, RMSNorm weight gradients never computed), against float64.
- Parameter dtypes and shapes: layer_norm's mixed dtypes (errors naming both dtypes; torch's CPU "mixed" fp16/bf16
  input with float32 parameters), rms_norm with every floating, integer and bool weight dtype, gradients included.
- rms_norm eps=None (pytorch#155527 and PR #173039: torch uses the accumulation dtype's epsilon, float32's for 16-bit
  inputs, not finfo(input.dtype) as its old docs said), eps 0, huge (1e30, inf), negative, NaN, sub-float32.
- Rows of zeros and constants in fp16 / bf16 (TF PR #24979: a too small eps for fp16), fp16 values near 65504
  (pytorch#66707, onnxruntime#29034 / PR #29045, ConvNeXt#80: variance overflow), float32 rows of 1e17..3e38
  (pytorch#162489 / PR #178123: float32 variance overflow; torch itself overflows there, so that range is not
  pinned), NaN / inf in one row and in the incoming gradient.
- Rows longer than one block (xformers#785: columns past BLOCK_SIZE_N ignored): 5000, 8193, 12289, 16385, 20000,
  32768, 70000 and 2**20 columns; normalized_shape=(1,) (pytorch#188375: a nonzero weight gradient; fusedops gets
  the exact zero); more than 65535 rows of 3 columns (apex#411: FusedLayerNorm wrong from 2**16 rows).
- Layouts (kernl#193, TransformerEngine PR #1017, LightLLM#1467: a column stride dropped in one pass, unsloth PR
  #10675: strided inputs and gradients, DirectML#588: permuted input): transposed, column-strided, expanded
  (stride 0 in rows or columns), overlapping (as_strided, unfold), channels_last, storage offsets 1..7 elements for
  16-bit rows of 515..4097 columns (the aligned and split windows), permuted multi-dim normalized shapes; grad
  outputs transposed, expanded, offset, and of another dtype than the output; non-contiguous, expanded and flipped
  weights whose base requires grad.
- Autograd: retain_graph twice, create_graph (double backward raises naming the op), anomaly mode, meta and fake
  tensors, eight threads at once, torch.compile(fullgraph, aot_eager) of the ops and modules.
- Modules (apex#403: elementwise_affine=False): every constructor argument, repr / extra_repr, state_dict keys and
  load_state_dict both ways with torch's modules, reset_parameters, to(dtype), meta device, their errors.
- Deterministic results run to run.

Everything above agrees with torch except the numbered defects below (each has a strict xfail test asserting
torch's behaviour). Not reported, as torch is no better or documents it: float32 rows whose sum or variance
overflows float32 (|x| past ~1e19: torch gives NaN or zeros there too; only an exactly constant float32 row of
|x| > FLT_MAX / N gives NaN where torch gives 0); an infinite grad_output gives a row of NaN and inf in dx where
torch's CPU kernel gives all NaN; the documented differences (functional errors are ValueError / TypeError where
torch raises RuntimeError; an int normalized_shape is accepted; a complex weight of rms_norm is refused;
TorchScript of the modules, tests/test_review_session13_nn.py).

DEFECTS (all fixed in session 27; their tests, strict xfails until then, now pass)

1. fusedops.rms_norm and fusedops.nn.RMSNorm refuse complex input, which torch computes.
   - Repro: `x = torch.randn(3, 4, dtype=torch.complex64); fusedops.rms_norm(x, (4,))`, and
     `fusedops.nn.RMSNorm(4, dtype=torch.complex64)(x)`; both routes.
   - Expected: what `F.rms_norm(x, (4,))` / `torch.nn.RMSNorm(4, dtype=torch.complex64)(x)` give: a complex64 result
     (x * rsqrt(mean(x * x) + eps)), with gradients. torch's OpInfo for nn.functional.rms_norm lists
     floating_and_complex_types_and(half, bfloat16); the README says "inputs the kernels do not take (CPU tensors,
     other dtypes) run torch's op" (session 27 already made complex matmul follow that rule).
   - Actual: `TypeError: fusedops.rms_norm(): the input has dtype torch.complex64; supported: float16, bfloat16,
     float32, float64` (the module: the same as RuntimeError).
   - Cause: fusedops/autograd/norms.py `_check_input` (through check_rms_norm_arguments, called by
     fusedops.functional.rms_norm before any routing) rejects every dtype outside _FLOATING; complex input should
     take torch's op, as needs_torch sends other inputs. (tests/test_review_session24_tensors.py::
     test_non_floating_dtypes_clear_errors pins the TypeError for complex rms_norm; it would need the same update.
     That test already fails at HEAD, on its matmul line, since the session-27 matmul fix.)
2. fusedops.nn.LayerNorm / RMSNorm turn a TypeError about their own configuration into RuntimeError.
   - Repro: `fusedops.nn.LayerNorm(4, eps="a")(torch.randn(2, 4))`; also eps=None, `RMSNorm(4, eps="a")`, and
     `LayerNorm((4.0,), elementwise_affine=False)` (a float in normalized_shape); both routes.
   - Expected: TypeError, as torch.nn.LayerNorm / RMSNorm raise (`layer_norm(): argument 'eps' (position 5) must
     be float, not str`).
   - Actual: RuntimeError with the same text; on the fallback route it is torch's own TypeError, re-raised as
     RuntimeError.
   - Cause: fusedops/nn/normalization.py `_as_torch_error` converts every ValueError / TypeError raised for a tensor
     input, not only the input checks its docstring means (trailing dims, the parameters' dtype).
3. fusedops.nn.RMSNorm raises RuntimeError where torch.nn.RMSNorm raises ValueError for an input with fewer dims
   than normalized_shape.
   - Repro: `fusedops.nn.RMSNorm((2, 3, 4))(torch.randn(3, 4))`, or `RMSNorm(1)(torch.tensor(1.0))`; both routes.
   - Expected: ValueError, as torch.nn.RMSNorm (`Input tensor must have at least 3 dimensions, but got 2`);
     fusedops.rms_norm itself raises ValueError there.
   - Actual: RuntimeError (`fusedops.rms_norm(): given normalized_shape=[2, 3, 4], ...`).
   - Cause: the same `_as_torch_error`, which turns rms_norm's ValueError into RuntimeError (right for
     LayerNorm, whose torch error is a RuntimeError, wrong for RMSNorm).
4. float32 LayerNorm rows of more than 16384 columns (float64: more than 8192) that are constant or nearly so
   normalize to garbage: up to +-0.5 (eps=1e-5) or +-1 (eps=1e-12) where the answer is exactly the bias.
   - Repro (interpreter, the kernel path): `x = torch.full((1, 16385), 12345.678); fusedops.layer_norm(x,
     (16385,))`.
   - Expected: zeros, as `F.layer_norm` gives (its Welford merge keeps a constant row's mean exact, on the CPU and
     on CUDA), and as fusedops gives for rows of up to 16384 columns. For a row 12345.678 + 1e-3 * noise: within
     twice torch's error (torch 0.10 against float64).
   - Actual: |y| = 0.525 for the constant row (its saved mean is 12345.676, 2 ulp off; rstd 269); 1.0 with
     eps=1e-12; float64 at 8193 columns: 1.2e-9 instead of 0. The noisy row: 0.43-0.77 against float64, where
     torch's error is 0.10 (4-8x; 12345.678 + 0.01 * noise and better-conditioned rows are fine).
   - Cause: fusedops/kernels/norm_forward_kernels.py `_normalize_row_looped` (forward_looped_kernel, the
     forward_config of float32 rows past 64 KiB) merges the lane means as `sum(count * lane_mean) / n_cols` in the accumulation dtype;
     that rounding (1-2 ulp of the mean) is multiplied by rstd (up to 1/sqrt(eps)) in `x - mean`. The whole-row
     tiles and the row sweeps (which shift by x[row, 0]) do not lose it.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.nn as fnn

D = torch.float64
F32_EPS = torch.finfo(torch.float32).eps
NAN, INF = float("nan"), float("inf")
FLOATS = [torch.float32, torch.float16, torch.bfloat16]


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(g, *shape, dtype=torch.float32, scale=1.0, shift=0.0):
    return (torch.randn(*shape, generator=g, dtype=D) * scale + shift).to(dtype)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.0 if a.numel() == 0 else (a.double() - b.double()).abs().max().item()


def _same_nonfinite(a: torch.Tensor, b: torch.Tensor) -> None:
    assert torch.equal(a.isnan(), b.isnan()), (a, b)
    assert torch.equal(a.isinf(), b.isinf()) and torch.equal(a[a.isinf()], b[b.isinf()]), (a, b)


def _no_worse_than_torch(ours: torch.Tensor, same: torch.Tensor, exact: torch.Tensor) -> None:
    """torch's same-dtype NaN/inf pattern, and finite entries within twice torch's error against float64 plus one
    ulp of the largest entry (the repo's bar)."""
    assert ours.shape == same.shape and ours.dtype == same.dtype, (ours.shape, ours.dtype, same.shape, same.dtype)
    _same_nonfinite(ours, same)
    finite = torch.isfinite(exact) & torch.isfinite(same)
    if finite.any():
        ulp = torch.finfo(same.dtype).eps * exact[finite].abs().max().item()
        assert _max_diff(ours[finite], exact[finite]) <= 2 * _max_diff(same[finite], exact[finite]) + ulp


def _grads(fn, tensors, dy, wanted):
    """[y, *gradients of the tensors whose flag in `wanted` is set] of fn(*tensors) against dy (None stays None)."""
    leaves = [None if t is None else t.detach().clone().requires_grad_(bool(w)) for t, w in zip(tensors, wanted)]
    y = fn(*leaves)
    needed = [t for t in leaves if t is not None and t.requires_grad]
    return [y, *torch.autograd.grad(y, needed, dy)] if needed else [y]


def _wide(t):
    return None if t is None else t.double()


def _check_against_torch(ours_fn, torch_fn, tensors, dy, wanted, float64_fn=None):
    """Outputs and gradients of ours_fn against torch_fn in the same dtypes and in float64 (float64_fn, default
    torch_fn)."""
    got = _grads(ours_fn, tensors, dy, wanted)
    same = _grads(torch_fn, tensors, dy, wanted)
    exact = _grads(float64_fn or torch_fn, [_wide(t) for t in tensors], dy.double(), wanted)
    assert len(got) == len(same) == len(exact)
    for g, s, e in zip(got, same, exact):
        _no_worse_than_torch(g, s, e)


def _ln(shape):
    return (lambda x, w, b: fusedops.layer_norm(x, shape, w, b)), (lambda x, w, b: F.layer_norm(x, shape, w, b))


def _rms(shape, eps=None):
    # float64 references take the eps torch uses for the narrower dtypes (float32's), handled by the caller
    return (lambda x, w: fusedops.rms_norm(x, shape, w, eps)), (lambda x, w: F.rms_norm(x, shape, w, eps))


# =================================================================================================
# Defects (strict xfails: they fail now and pass once fixed)
# =================================================================================================
def test_rms_norm_of_complex_input_runs_torch(route):
    g = _gen(1)
    x = torch.complex(_randn(g, 3, 4), _randn(g, 3, 4))
    want = F.rms_norm(x, (4,))
    got = fusedops.rms_norm(x, (4,))
    assert got.dtype == want.dtype == torch.complex64
    torch.testing.assert_close(got, want)
    # and its gradient, as torch's
    leaf = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad(fusedops.rms_norm(leaf, (4,)).abs().sum(), leaf)
    leaf2 = x.clone().requires_grad_()
    (want_grad,) = torch.autograd.grad(F.rms_norm(leaf2, (4,)).abs().sum(), leaf2)
    torch.testing.assert_close(grad, want_grad)


def test_rms_norm_module_of_complex_dtype_runs_torch(route):
    g = _gen(2)
    x = torch.complex(_randn(g, 2, 3, 4), _randn(g, 2, 3, 4))
    theirs = torch.nn.RMSNorm(4, dtype=torch.complex64)
    ours = fnn.RMSNorm(4, dtype=torch.complex64)
    ours.load_state_dict(theirs.state_dict())
    torch.testing.assert_close(ours(x), theirs(x))


@pytest.mark.parametrize("make", [
    lambda nn: nn.LayerNorm(4, eps="a"),
    lambda nn: nn.LayerNorm(4, eps=None),
    lambda nn: nn.RMSNorm(4, eps="a"),
    lambda nn: nn.LayerNorm((4.0,), elementwise_affine=False),
    lambda nn: nn.RMSNorm((4.0,), elementwise_affine=False),
], ids=["LayerNorm-eps-str", "LayerNorm-eps-None", "RMSNorm-eps-str", "LayerNorm-float-shape",
        "RMSNorm-float-shape"])
def test_module_configuration_type_errors_stay_type_errors(route, make):
    x = torch.randn(2, 4)
    with pytest.raises(TypeError):
        make(torch.nn)(x)           # torch's module
    with pytest.raises(TypeError):
        make(fnn)(x)


@pytest.mark.parametrize("shape, x", [((2, 3, 4), torch.ones(3, 4)), ((1,), torch.tensor(1.0))],
                         ids=["2d-input-3d-shape", "0d-input"])
def test_rms_norm_module_too_few_dims_is_a_value_error_like_torch(route, shape, x):
    with pytest.raises(ValueError, match="at least"):
        torch.nn.RMSNorm(shape)(x)
    with pytest.raises(ValueError):
        fnn.RMSNorm(shape)(x)


@pytest.mark.parametrize("dtype, n, tol", [(torch.float32, 16385, 1e-3), (D, 8193, 1e-12)], ids=["f32", "f64"])
def test_constant_rows_past_one_block_normalize_to_the_bias(interpret, dtype, n, tol):
    x = torch.full((2, n), 12345.678, dtype=dtype)
    x[1] = -3.3
    bias = torch.linspace(-1, 1, n, dtype=dtype)
    want = F.layer_norm(x, (n,), None, bias)
    assert torch.equal(want, bias.expand(2, n))         # torch: exactly the bias
    got = fusedops.layer_norm(x, (n,), None, bias)
    assert _max_diff(got, want) <= tol


def test_nearly_constant_float32_rows_past_one_block_no_worse_than_torch(interpret):
    n = 16385
    x = _randn(_gen(4), 2, n, scale=1e-3, shift=12345.678)
    got, same, exact = fusedops.layer_norm(x, (n,)), F.layer_norm(x, (n,)), F.layer_norm(x.double(), (n,))
    _no_worse_than_torch(got, same, exact)


# =================================================================================================
# Checked and matching (contrast cases of the defects first)
# =================================================================================================
@pytest.mark.parametrize("n", [4096, 16384])
def test_constant_float32_rows_in_one_block_normalize_to_the_bias(interpret, n):
    # defect 4's contrast: the whole-row tiles keep a constant row's mean exact, as torch
    x = torch.full((2, n), 12345.678)
    x[1] = -3.3
    bias = torch.linspace(-1, 1, n)
    assert torch.equal(fusedops.layer_norm(x, (n,), None, bias), F.layer_norm(x, (n,), None, bias))
    x = _randn(_gen(5), 2, n, scale=1e-3, shift=12345.678)
    _no_worse_than_torch(fusedops.layer_norm(x, (n,)), F.layer_norm(x, (n,)), F.layer_norm(x.double(), (n,)))


def test_complex_and_integer_layer_norm_raise_like_torch(route):
    # defect 1's contrast: torch's layer_norm has no complex (or integer) kernel either
    for dtype in (torch.complex64, torch.int64):
        x = torch.ones(3, 4, dtype=dtype)
        with pytest.raises(RuntimeError):
            F.layer_norm(x, (4,))
        with pytest.raises(TypeError, match="fusedops.layer_norm.*dtype"):
            fusedops.layer_norm(x, (4,))
    with pytest.raises(TypeError, match="fusedops.rms_norm.*dtype"):
        fusedops.rms_norm(torch.ones(3, 4, dtype=torch.int64), (4,))


def test_module_input_errors_are_torch_errors(route):
    # defects 2 and 3's contrast: a mismatched input is a RuntimeError for both torch modules, and fusedops'
    # functional ops raise ValueError / TypeError naming the argument
    x = torch.randn(3, 5)
    for ours, theirs in ((fnn.LayerNorm(4), torch.nn.LayerNorm(4)), (fnn.RMSNorm(4), torch.nn.RMSNorm(4))):
        with pytest.raises(RuntimeError, match="normalized_shape"):
            theirs(x)
        with pytest.raises(RuntimeError, match="normalized_shape"):
            ours(x)
    with pytest.raises(RuntimeError):
        torch.nn.LayerNorm(4)(x[:, :4].double())            # the parameters' dtype (RMSNorm takes any)
    with pytest.raises(RuntimeError, match="dtype"):
        fnn.LayerNorm(4)(x[:, :4].double())
    with pytest.raises(ValueError, match="at least 3"):
        F.rms_norm(torch.ones(3, 4), (2, 3, 4))
    with pytest.raises(ValueError, match=r"normalized_shape=\[2, 3, 4\]"):
        fusedops.rms_norm(torch.ones(3, 4), (2, 3, 4))
    with pytest.raises(TypeError, match="eps"):
        fusedops.layer_norm(x, (5,), eps="a")


# -------------------------------------------------------------------------------------------------
# normalized_shape
# -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [4, (4,), [4], torch.Size([4]), (3, 4), [3, 4], torch.Size([3, 4]), (2, 3, 4)],
                         ids=repr)
def test_normalized_shape_forms_match_torch(route, shape):
    as_tuple = (shape,) if isinstance(shape, int) else tuple(shape)     # torch's functional takes no bare int
    g = _gen(6)
    x, dy = _randn(g, 2, 3, 4), _randn(g, 2, 3, 4)
    w, b = _randn(g, *as_tuple), _randn(g, *as_tuple)
    _check_against_torch(lambda x, w, b: fusedops.layer_norm(x, shape, w, b),
                         lambda x, w, b: F.layer_norm(x, as_tuple, w, b), (x, w, b), dy, (1, 1, 1))
    _check_against_torch(lambda x, w: fusedops.rms_norm(x, shape, w), lambda x, w: F.rms_norm(x, as_tuple, w),
                         (x, w), dy, (1, 1), float64_fn=lambda x, w: F.rms_norm(x, as_tuple, w, F32_EPS))
    # the modules take the same spellings
    for ours, theirs in ((fnn.LayerNorm(shape), torch.nn.LayerNorm(shape)),
                         (fnn.RMSNorm(shape), torch.nn.RMSNorm(shape))):
        assert ours.normalized_shape == theirs.normalized_shape == as_tuple
        torch.testing.assert_close(ours(x), theirs(x))


@pytest.mark.parametrize("shape, error, message", [
    ((), ValueError, "at least 1-dimensional"),
    ((3,), ValueError, r"normalized_shape=\[3\]"),
    ((5, 2, 3, 4), ValueError, r"normalized_shape=\[5, 2, 3, 4\]"),
    ((-4,), ValueError, r"normalized_shape=\[-4\]"),
    ((4.0,), TypeError, "normalized_shape"),
    (None, TypeError, "normalized_shape"),
    (torch.tensor([4]), TypeError, "normalized_shape"),
], ids=["empty", "mismatched", "longer-than-input", "negative", "float", "None", "tensor"])
def test_bad_normalized_shape_is_a_clear_error(route, shape, error, message):
    x = torch.randn(2, 3, 4)
    for ours, theirs in ((fusedops.layer_norm, F.layer_norm), (fusedops.rms_norm, F.rms_norm)):
        with pytest.raises((RuntimeError, ValueError, TypeError)):     # torch refuses it too
            theirs(x, shape)
        with pytest.raises(error, match=message):
            ours(x, shape)


# -------------------------------------------------------------------------------------------------
# weight and bias
# -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
def test_weight_and_bias_present_or_absent_with_each_gradient_alone(route, dtype):
    g = _gen(7)
    n = 37
    x, dy = _randn(g, 5, n, dtype=dtype, shift=0.5), _randn(g, 5, n, dtype=dtype)
    w, b = _randn(g, n, dtype=dtype), _randn(g, n, dtype=dtype)
    ours, theirs = _ln((n,))
    for weight, bias in ((w, b), (w, None), (None, b), (None, None)):
        for wanted in ((1, 1, 1), (1, 0, 0), (0, 1, 0), (0, 0, 1)):
            if (weight is None and wanted[1]) or (bias is None and wanted[2]):
                continue
            _check_against_torch(ours, theirs, (x, weight, bias), dy, wanted)
    ours, theirs = _rms((n,))
    for weight in (w, None):
        for wanted in ((1, 1), (1, 0), (0, 1)):
            if weight is None and wanted[1]:
                continue
            _check_against_torch(ours, theirs, (x, weight), dy, wanted,
                                 float64_fn=lambda x, w: F.rms_norm(x, (n,), w, F32_EPS))


def test_parameter_dtype_and_shape_errors_name_the_argument(route):
    x, x16 = torch.randn(3, 4), torch.randn(3, 4).half()
    cases = [
        (lambda m: m.layer_norm(x, (4,), torch.ones(4).half()), TypeError,
         r"weight has dtype torch.float16 but the input has dtype torch.float32"),
        (lambda m: m.layer_norm(x, (4,), None, torch.ones(4).double()), TypeError,
         r"bias has dtype torch.float64 but the input has dtype torch.float32"),
        (lambda m: m.layer_norm(x16, (4,), torch.ones(4), torch.ones(4).half()), TypeError,
         r"weight has dtype torch.float32 but the input has dtype torch.float16"),
        (lambda m: m.layer_norm(x, (4,), torch.ones(3)), ValueError,
         r"weight of shape \[3\].*normalized_shape = \[4\]"),
        (lambda m: m.layer_norm(x, (4,), None, torch.ones(1, 4)), ValueError, r"bias of shape \[1, 4\]"),
        (lambda m: m.rms_norm(x, (4,), torch.ones(5)), ValueError, r"weight of shape \[5\]"),
        (lambda m: m.layer_norm(x, (4,), torch.ones(4, device="meta")), ValueError, r"weight is on meta"),
    ]
    for call, error, message in cases:
        with pytest.raises((RuntimeError, ValueError, TypeError)):
            call(F)
        with pytest.raises(error, match=message):
            call(fusedops)
    # torch's CPU kernel takes a 16-bit input with float32 parameters (its "mixed" case), and so does fusedops
    w, b = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(fusedops.layer_norm(x16, (4,), w, b), F.layer_norm(x16, (4,), w, b))


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")     # torch's, about its fused kernel
@pytest.mark.parametrize("x_dtype", [torch.float16, torch.float32, D])
def test_rms_norm_takes_any_weight_dtype_like_torch(route, x_dtype):
    g = _gen(8)
    x, dy = _randn(g, 4, 9, dtype=x_dtype), _randn(g, 4, 9, dtype=x_dtype)
    tol = {torch.float16: 4e-3, torch.float32: 1e-5, D: 1e-12}
    for w_dtype in (torch.float16, torch.bfloat16, torch.float32, D, torch.int64, torch.bool):
        w = (_randn(g, 9) * 3).to(w_dtype)
        trainable = w_dtype.is_floating_point
        got = _grads(lambda x, w: fusedops.rms_norm(x, (9,), w), (x, w), dy, (1, trainable))
        want = _grads(lambda x, w: F.rms_norm(x, (9,), w), (x, w), dy, (1, trainable))
        for a, t in zip(got, want):
            assert a.dtype == t.dtype and a.shape == t.shape
            bound = max(tol[x_dtype], tol.get(t.dtype, 3e-2))
            assert _max_diff(a, t) <= bound * (1 + t.double().abs().max().item()), (w_dtype, a.dtype)


# -------------------------------------------------------------------------------------------------
# eps
# -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, D])
def test_rms_norm_default_eps_is_the_accumulation_dtypes(route, dtype):
    # pytorch#155527 / PR #173039: eps=None is finfo(float32).eps for 16-bit and float32 input (not finfo(input)),
    # finfo(float64).eps for float64. Rows of mean square ~1e-8 (1e-17 for float64) tell them apart.
    g = _gen(9)
    scale = 1e-8 if dtype == D else 1e-4
    x = _randn(g, 3, 16, dtype=dtype, scale=scale)
    want = F.rms_norm(x, (16,))
    got = fusedops.rms_norm(x, (16,))
    accumulation_eps = torch.finfo(D if dtype == D else torch.float32).eps
    exact = F.rms_norm(x.double(), (16,), None, accumulation_eps)
    _no_worse_than_torch(got, want, exact)
    if dtype in (torch.float16, torch.bfloat16):    # finfo(input.dtype).eps would give a visibly smaller output
        other = F.rms_norm(x.double(), (16,), None, torch.finfo(dtype).eps)
        assert (got.double() - other).abs().max().item() > 10 * (got.double() - exact).abs().max().item()
    with torch.no_grad():
        theirs = torch.nn.RMSNorm(16, dtype=dtype)
        torch.testing.assert_close(fnn.RMSNorm(16, dtype=dtype)(x), theirs(x))


@pytest.mark.parametrize("eps", [0.0, 1e30, INF, -1.0, NAN], ids=repr)
def test_eps_extremes_match_torch(route, eps):
    g = _gen(10)
    for dtype in (torch.float32, torch.float16):
        x, dy = _randn(g, 4, 6, dtype=dtype), _randn(g, 4, 6, dtype=dtype)
        x[0] = 0.0                                  # a zero row: 0 / sqrt(0 + eps)
        w = _randn(g, 6, dtype=dtype)
        got = _grads(lambda x, w: fusedops.layer_norm(x, (6,), w, None, eps), (x, w), dy, (1, 1))
        want = _grads(lambda x, w: F.layer_norm(x, (6,), w, None, eps), (x, w), dy, (1, 1))
        for a, t in zip(got, want):
            _same_nonfinite(a, t)
        got = _grads(lambda x, w: fusedops.rms_norm(x, (6,), w, eps), (x, w), dy, (1, 1))
        want = _grads(lambda x, w: F.rms_norm(x, (6,), w, eps), (x, w), dy, (1, 1))
        for a, t in zip(got, want):
            _same_nonfinite(a, t)


# -------------------------------------------------------------------------------------------------
# Special rows
# -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [9, 1001, 5000])
def test_zero_and_constant_16bit_rows_normalize_to_the_bias(interpret, dtype, n):
    # (constant rows of |x| > FLT_MAX / N overflow the float32 sum of the mean: torch gives NaN there too)
    values = [0.0, 1.0, -3.5, 1e-4, 65504.0, -65504.0]
    x = torch.tensor(values, dtype=dtype)[:, None].expand(len(values), n).contiguous()
    bias = torch.linspace(-1, 1, n, dtype=dtype)
    weight = torch.linspace(0.5, 2, n, dtype=dtype)
    # (torch's CPU kernel gives 0.71, not 0, for a float16 row of 65504: the float64 result is the reference)
    assert torch.equal(fusedops.layer_norm(x, (n,), weight, bias), bias.expand_as(x))
    exact = F.rms_norm(x.double(), (n,), weight.double(), F32_EPS)
    _no_worse_than_torch(fusedops.rms_norm(x, (n,), weight), F.rms_norm(x, (n,), weight), exact)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_rows_near_the_dtype_max_do_not_overflow(interpret, dtype):
    # pytorch#66707 / onnxruntime#29034: the variance of fp16 rows of |x| ~ 6e4 overflows fp16; fusedops keeps its
    # statistics in float32, as torch. bfloat16 rows up to 1e18 (their float32 squares stay finite).
    g = _gen(11)
    big = 6e4 if dtype == torch.float16 else 1e18
    x = (torch.rand(4, 37, generator=g, dtype=D) * 2 - 1).mul(big).to(dtype)
    x[1, 5] = big
    dy = _randn(g, 4, 37, dtype=dtype)
    for ours, theirs, exact in (
            (lambda x: fusedops.layer_norm(x, (37,)), lambda x: F.layer_norm(x, (37,)), None),
            (lambda x: fusedops.rms_norm(x, (37,)), lambda x: F.rms_norm(x, (37,)),
             lambda x: F.rms_norm(x, (37,), None, F32_EPS))):
        got, same = _grads(ours, (x,), dy, (1,)), _grads(theirs, (x,), dy, (1,))
        ref = _grads(exact or theirs, (x.double(),), dy.double(), (1,))
        for a, s, r in zip(got, same, ref):
            assert torch.isfinite(a).all()
            _no_worse_than_torch(a, s, r)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("row", [[NAN, 1, 2, 3, 4, 5], [INF, 1, 2, 3, 4, 5], [-INF, INF, 0, 0, 0, 0], [INF] * 6],
                         ids=["nan", "inf", "both-infs", "all-inf"])
def test_a_non_finite_row_stays_in_its_row(route, dtype, row):
    g = _gen(12)
    x = torch.cat([torch.tensor([row], dtype=dtype), _randn(g, 2, 6, dtype=dtype)])
    w, b, dy = _randn(g, 6, dtype=dtype), _randn(g, 6, dtype=dtype), _randn(g, 3, 6, dtype=dtype)
    got = _grads(lambda x, w, b: fusedops.layer_norm(x, (6,), w, b), (x, w, b), dy, (1, 0, 0))
    want = _grads(lambda x, w, b: F.layer_norm(x, (6,), w, b), (x, w, b), dy, (1, 0, 0))
    for a, t in zip(got, want):
        _same_nonfinite(a, t)
        assert torch.isfinite(a[1:]).all()
    got = _grads(lambda x, w: fusedops.rms_norm(x, (6,), w), (x, w), dy, (1, 0))
    want = _grads(lambda x, w: F.rms_norm(x, (6,), w), (x, w), dy, (1, 0))
    for a, t in zip(got, want):
        _same_nonfinite(a, t)
        assert torch.isfinite(a[1:]).all()


def test_normalized_shape_one_gives_the_exact_zero_weight_gradient(route):
    # pytorch#188375: with normalized_shape=(1,) the output is the bias, so the input and weight gradients are 0 and
    # the bias gradient is the sum of dy; torch's kernel returns a nonzero weight.grad (even in float64). fusedops
    # must be no worse than torch against that analytic answer (the kernel path gets the zeros).
    g = _gen(13)
    x, w, b, dy = _randn(g, 5, 1, scale=1e6), _randn(g, 1), _randn(g, 1), _randn(g, 5, 1)
    got = _grads(lambda x, w, b: fusedops.layer_norm(x, (1,), w, b), (x, w, b), dy, (1, 1, 1))
    same = _grads(lambda x, w, b: F.layer_norm(x, (1,), w, b), (x, w, b), dy, (1, 1, 1))
    exact = [b.double().expand(5, 1), torch.zeros(5, 1, dtype=D), torch.zeros(1, dtype=D), dy.double().sum(0)]
    for a, s, e in zip(got, same, exact):
        _no_worse_than_torch(a, s, e)


# -------------------------------------------------------------------------------------------------
# Long rows, many rows
# -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, n", [(torch.float16, 5000), (torch.bfloat16, 8193), (torch.float32, 5000),
                                      (torch.float32, 70000)])
def test_rows_longer_than_one_block(interpret, dtype, n):
    # xformers#785: columns past the first block must count
    g = _gen(14)
    rows = 1 if n > 10000 else 2
    x, dy = _randn(g, rows, n, dtype=dtype, scale=2, shift=3), _randn(g, rows, n, dtype=dtype)
    w, b = _randn(g, n, dtype=dtype), _randn(g, n, dtype=dtype)
    _check_against_torch(*_ln((n,)), (x, w, b), dy, (1, 1, 1))
    _check_against_torch(*_rms((n,)), (x, w), dy, (1, 1), float64_fn=lambda x, w: F.rms_norm(x, (n,), w, F32_EPS))


def test_more_than_65535_rows_of_few_columns(interpret):
    # apex#411: FusedLayerNorm went wrong from 2**16 rows; the weight and bias gradients sum over all of them
    g = _gen(15)
    m = 70000
    x, dy = _randn(g, m, 3, dtype=torch.float16), _randn(g, m, 3, dtype=torch.float16)
    w, b = _randn(g, 3, dtype=torch.float16), _randn(g, 3, dtype=torch.float16)
    _check_against_torch(*_ln((3,)), (x, w, b), dy, (1, 1, 1))
    _check_against_torch(*_rms((3,)), (x, w), dy, (0, 1), float64_fn=lambda x, w: F.rms_norm(x, (3,), w, F32_EPS))


# -------------------------------------------------------------------------------------------------
# Layouts of the input and of the incoming gradient
# -------------------------------------------------------------------------------------------------
def _layouts(g, m, n, dtype):
    yield "transposed", _randn(g, n, m, dtype=dtype).t()
    yield "column-strided", _randn(g, m, 2 * n, dtype=dtype)[:, 1::2]
    yield "row-padded", _randn(g, m, n + 3, dtype=dtype)[:, 2:n + 2]
    yield "expanded-rows", _randn(g, 1, n, dtype=dtype).expand(m, n)
    yield "offset-by-3", _randn(g, m * n + 8, dtype=dtype)[3:3 + m * n].view(m, n)


def _grad_layouts(g, m, n, dtype):
    yield _randn(g, n, m, dtype=dtype).t()
    yield _randn(g, n, dtype=dtype).expand(m, n)
    yield torch.ones((), dtype=dtype).expand(m, n)          # y.sum().backward()
    yield _randn(g, m, n + 5, dtype=dtype)[:, 1:n + 1]
    yield _randn(g, m * n + 8, dtype=dtype)[5:5 + m * n].view(m, n)


@pytest.mark.parametrize("dtype, n", [(torch.float32, 33), (torch.float16, 1001), (torch.bfloat16, 130)])
def test_strided_expanded_and_offset_inputs_and_gradients(interpret, dtype, n):
    # kernl#193, TransformerEngine PR #1017, LightLLM#1467, unsloth PR #10675; 16-bit rows of 1001 columns go
    # through the split window (rows off 16-byte boundaries), so the offset view matters there
    g = _gen(16)
    m = 3
    w, b = _randn(g, n, dtype=dtype), _randn(g, n, dtype=dtype)
    for (name, x), dy in zip(_layouts(g, m, n, dtype), _grad_layouts(g, m, n, dtype)):
        leaf = x.detach().requires_grad_()          # detach keeps the layout (clone would not)
        y = fusedops.layer_norm(leaf, (n,), w, b)
        (dx,) = torch.autograd.grad(y, leaf, dy)
        xd = x.detach().double().requires_grad_()
        yd = F.layer_norm(xd, (n,), w.double(), b.double())
        (dxd,) = torch.autograd.grad(yd, xd, dy.double())
        ys = F.layer_norm(x, (n,), w, b)
        leaf2 = x.detach().requires_grad_()
        (dxs,) = torch.autograd.grad(F.layer_norm(leaf2, (n,), w, b), leaf2, dy)
        _no_worse_than_torch(y, ys, yd)
        _no_worse_than_torch(dx, dxs, dxd)
        got = fusedops.rms_norm(x, (n,), w)
        _no_worse_than_torch(got, F.rms_norm(x, (n,), w), F.rms_norm(x.double(), (n,), w.double(), F32_EPS))


def test_permuted_overlapping_and_channels_last_inputs(interpret):
    # DirectML#588 (a permuted input), overlapping rows, a multi-dim normalized_shape over non-mergeable dims
    g = _gen(17)
    cases = [(_randn(g, 4, 5, 6).permute(0, 2, 1), (6, 5)),
             (_randn(g, 12).as_strided((5, 4), (2, 1)), (4,)),
             (_randn(g, 20).unfold(0, 6, 2), (6,)),
             (_randn(g, 2, 3, 4, 5).contiguous(memory_format=torch.channels_last), (4, 5)),
             (_randn(g, 2, 1, 4).expand(2, 3, 4), (3, 4))]
    for x, shape in cases:
        w, b, dy = _randn(g, *shape), _randn(g, *shape), _randn(g, *x.shape)
        _check_against_torch(*_ln(shape), (x, w, b), dy, (1, 1, 1))
        _check_against_torch(*_rms(shape), (x, w), dy, (1, 1),
                             float64_fn=lambda x, w, shape=shape: F.rms_norm(x, shape, w, F32_EPS))


def test_weights_that_are_views_of_a_trainable_base(route):
    g = _gen(18)
    n = 6
    x, dy = _randn(g, 5, n), _randn(g, 5, n)
    for view in (lambda t: t[:1].expand(n), lambda t: t[::2], lambda t: t[:n].flip(0)):
        grads = []
        for impl in (fusedops, F):
            base = _randn(_gen(19), 2 * n).requires_grad_()
            leaf = x.clone().requires_grad_()
            y = impl.layer_norm(leaf, (n,), view(base), None, 1e-5) + impl.rms_norm(leaf, (n,), view(base), 1e-6)
            grads.append(torch.autograd.grad(y, (leaf, base), dy))
        for a, t in zip(*grads):
            assert _max_diff(a, t) <= 2e-6 * (1 + t.abs().max().item())


# -------------------------------------------------------------------------------------------------
# Modules
# -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, kwargs", [
    ((8,), {}), (([2, 8],), {}), ((torch.Size([2, 8]),), {}), ((8,), dict(elementwise_affine=False)),
    ((8,), dict(bias=False)), ((8,), dict(eps=0.1)), ((8,), dict(dtype=torch.bfloat16)),
    ((8,), dict(elementwise_affine=False, bias=True)),
], ids=["int", "list", "Size", "no-affine", "no-bias", "eps", "bf16", "no-affine-bias-True"])
def test_layer_norm_module_matches_torch(route, args, kwargs):
    ours, theirs = fnn.LayerNorm(*args, **kwargs), torch.nn.LayerNorm(*args, **kwargs)
    assert isinstance(ours, torch.nn.LayerNorm)
    assert repr(ours) == repr(theirs) and ours.extra_repr() == theirs.extra_repr()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn(p.shape, generator=_gen(20)))
    ours.load_state_dict(theirs.state_dict())
    dtype = kwargs.get("dtype", torch.float32)
    x = _randn(_gen(21), 3, 2, 8, dtype=dtype)
    torch.testing.assert_close(ours(x), theirs(x))
    theirs.load_state_dict(ours.state_dict())         # and back
    ours.reset_parameters()
    theirs.reset_parameters()
    torch.testing.assert_close(ours(x), theirs(x))
    half = copy.deepcopy(ours).to(torch.float16)
    assert all(p.dtype == torch.float16 for p in half.parameters())
    torch.testing.assert_close(half(x.half()), copy.deepcopy(theirs).half()(x.half()))


@pytest.mark.parametrize("kwargs", [{}, dict(eps=None), dict(eps=0.1), dict(elementwise_affine=False),
                                    dict(dtype=torch.float16)], ids=["default", "eps-None", "eps", "no-affine", "fp16"])
def test_rms_norm_module_matches_torch(route, kwargs):
    ours, theirs = fnn.RMSNorm((2, 8), **kwargs), torch.nn.RMSNorm((2, 8), **kwargs)
    assert repr(ours) == repr(theirs) and list(ours.state_dict()) == list(theirs.state_dict())
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn(p.shape, generator=_gen(22)))
    ours.load_state_dict(theirs.state_dict())
    for dtype in (torch.float32, torch.float16, D):
        x = _randn(_gen(23), 3, 2, 8, dtype=dtype, scale=1e-3)
        with warnings.catch_warnings():     # torch warns that mixed dtypes skip its fused kernel
            warnings.simplefilter("ignore")
            want = theirs(x)
        got = ours(x)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, atol=4e-3 if torch.float16 in (dtype, want.dtype) else 1e-5,
                                   rtol=4e-3 if torch.float16 in (dtype, want.dtype) else 1e-5)
    ours.reset_parameters()
    assert all(torch.equal(p, torch.ones_like(p)) for p in ours.parameters())


def test_module_gradients_match_torch(route):
    g = _gen(24)
    x, dy = _randn(g, 4, 3, 10), _randn(g, 4, 3, 10)
    for make in (lambda nn: nn.LayerNorm(10), lambda nn: nn.LayerNorm(10, bias=False), lambda nn: nn.RMSNorm(10)):
        ours, theirs = make(fnn), make(torch.nn)
        with torch.no_grad():
            for p, q in zip(ours.parameters(), theirs.parameters()):
                p.copy_(torch.randn(p.shape, generator=g))
                q.copy_(p)
        results = []
        for module in (ours, theirs):
            leaf = x.clone().requires_grad_()
            y = module(leaf)
            results.append([y, *torch.autograd.grad(y, [leaf, *module.parameters()], dy)])
        for a, t in zip(*results):
            assert _max_diff(a, t) <= 2e-6 * (1 + t.abs().max().item())


# -------------------------------------------------------------------------------------------------
# Determinism
# -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_results_are_identical_run_to_run(interpret, dtype):
    g = _gen(25)
    x, dy = _randn(g, 3000, 24, dtype=dtype), _randn(g, 3000, 24, dtype=dtype)
    w, b = _randn(g, 24, dtype=dtype), _randn(g, 24, dtype=dtype)
    runs = [_grads(lambda x, w, b: fusedops.layer_norm(x, (24,), w, b), (x, w, b), dy, (1, 1, 1))
            + _grads(lambda x, w: fusedops.rms_norm(x, (24,), w), (x, w), dy, (1, 1)) for _ in range(2)]
    for a, t in zip(*runs):
        assert torch.equal(a, t)
