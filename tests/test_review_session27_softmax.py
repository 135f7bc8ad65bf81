"""Session 27 break-it review of fusedops.softmax / fusedops.log_softmax and fusedops.nn.Softmax / LogSoftmax.

A fresh reviewer (CPU only: the kernels run in the interpreter, FUSEDOPS_INTERPRET=1) tried to break the
softmax area with cases drawn from peer projects' bug reports and the project's general rules, with torch
(and a float64 reference where numerics matter) as the oracle.

What was tried
--------------
- dim handling: 0-d tensors (dim 0 / -1, out of range), 1-d, negative dims, out-of-range dims (torch's
  IndexError), dims that are not ints (None, float, bool, str, tuple, list, 1-d tensors: TypeError naming
  'dim'), integer-like dims (NumPy integers, 0-d integer tensors) eagerly and under torch.compile;
  the nn modules' legacy implicit dim (dim=None) with its deprecation warning, eager, under torch.compile,
  torch.export and torch.fx.symbolic_trace (also after fusedops.nn.patch).
- dtype=: half/bfloat16 to float32 (fused into the loads), float32 to float64, downcasts (float32 to
  float16/bfloat16: torch casts first; the fused result is correctly rounded, torch's CPU bf16 log_softmax
  is not, so a float64 reference of the cast input is the oracle), integer and bool inputs with a floating
  dtype, the Python type `float`, non-floating dtypes and non-floating inputs (TypeError naming the
  argument); pytorch#102723 (bf16 input, dtype=float).
- empty dims and empty tensors, forward and backward; rows of size 1; 0-d tensors of +-inf and NaN.
- special values (pytorch#6864, pytorch#31829, mindspore#378, torch-mojo-backend#319, burn#5742): rows of
  only -inf, a single +inf, NaN, -inf prefixes (lanes of the online path that see only -inf first), a
  single finite value at the row's head / middle / tail, magnitudes near float32's and float16's limits,
  subnormals; in one-pass rows, online rows (float32, 20000 columns), the persistent row sweeps (float16
  and bfloat16, 20000 and 33001 columns), one-pass and online column tiles (dim not last).
- rows longer than one block: 5000 and 70000 columns (float32 and float16), forward and backward;
  odd row lengths (the shifted 16-byte window; apex/TF "channels not a multiple of 4" class of bugs,
  tensorflow#108244).
- layouts (FlagGems#5723 / Torch-FL#171, rocm-libraries#11387, burn#4815, mlx#658, pytorch#93545):
  transposed, expanded (stride 0 in a row dim and in the reduced dim), channels_last over every dim,
  sliced 4-d views, overlapping unfold / as_strided views, storage offsets; outputs' strides against torch's.
- gradients: non-contiguous grad_output (transposed, strided, expanded, the stride-0 scalar of
  `y.sum().backward()`, a lazily negated view), pytorch#30572 (float32 softmax of a float16 tensor over a
  dim that is not last), pytorch#85504 / #85497 (the gradient comes back in the input's dtype),
  pytorch#139740 (a saved output laid out anew by saved-tensor hooks), pytorch#17261 (double backward of a
  half-to-float softmax: here a clear error naming the op), gradcheck (batched grads, forward AD),
  in-place modification of the output (torch's version-counter error), checkpointing.
- torch.func (vmap incl. nested and in_dims, grad, jacrev, jacfwd, jvp, hessian), forward-mode AD dual
  tensors, torch.compile (aot_eager and inductor, fullgraph, dynamic shapes, backward, compile of vmap /
  grad), torch.export (dynamic dims), torch.jit.trace, FlopCounterMode, FakeTensorMode, meta tensors.

Everything above matches torch except the defects below (the kept passing tests are the meaningful ones).
Not reported: `fusedops.softmax(x)` without a dim normalizes over dim -1 (the documented signature default),
where torch.softmax requires a dim and F.softmax(x) takes the legacy implicit dim (0 for 3-d inputs);
float32 softmax values off by 2 ulps (exp's rounding), bf16 log_softmax gradients that differ from a
float64 reference by ~1 ulp of the rounded saved output (torch does the same); under
torch.compile(fullgraph=True) an argument error surfaces as dynamo's "Observed exception" wrapping the
IndexError, as for any Python-level check.

DEFECTS (both fixed in session 27; their tests, strict xfails until then, now pass: an fx-wrapped leaf picks
the implicit dim; under torch.compile a dim that is not a Python int takes torch's op)
-------
1. torch.fx.symbolic_trace of fusedops.nn.Softmax() / fusedops.nn.LogSoftmax() with dim=None (torch's
   legacy implicit dim) fails, and so does tracing any model that fusedops.nn.patch() gave such a module
   (which test_tracing.py says it supports for the other modules).
   Repro:  torch.fx.symbolic_trace(fusedops.nn.Softmax())
           model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Softmax()); fusedops.nn.patch(model)
           torch.fx.symbolic_trace(model)
   Expected: a GraphModule computing what torch.nn.Softmax() computes (torch's module traces: it is a leaf
   and F.softmax resolves the implicit dim at run time).
   Actual: torch.fx.proxy.TraceError "symbolically traced variables cannot be used as inputs to control flow".
   Cause: fusedops/nn/softmax.py, Softmax.forward / LogSoftmax.forward call
   `_legacy_dim(name, input.dim())`, whose `ndim in (0, 1, 3)` branches on a Proxy; the implicit-dim case
   needs a recorded leaf (e.g. an fx-wrapped helper that picks the dim at run time).

2. A NumPy integer dim (accepted eagerly, as torch accepts it) breaks the graph under torch.compile.
   Repro:  torch.compile(lambda a: fusedops.softmax(a, np.int64(0)), fullgraph=True)(torch.randn(3, 5))
   Expected: compiles as `torch.softmax(a, np.int64(0))` does (fullgraph), result softmax over dim 0.
   Actual: torch._dynamo.exc.Unsupported "torch.* op returned non-Tensor" at functional.normalize_dim's
   `operator.index(dim)` (dynamo turns the NumPy scalar into a tensor and `.item()`). Without fullgraph,
   dynamo falls back to compiling fusedops' own frames one by one (softmax, _softmax, ...); the eager
   kernel path runs under it and dynamo traces the launch down into the interpreter. When that kernel
   specialization was not launched before in the process (e.g. the first call in a fresh process:
   `torch.compile(lambda a: fusedops.softmax(a, np.int64(0)))(torch.randn(3, 4))`), this crashes with
   `AssertionError: Expected np.nditer base, got <class 'torch.Tensor'>` (dynamo meeting the interpreter's
   NumPy views of torch tensors); when it was, the result is right.
   Cause: fusedops/functional.py normalize_dim (called before the `torch.compiler.is_compiling()` branch of
   _softmax) graph-breaks on a NumPy integer; and the eager kernel path (launchers, interpreter) is not
   shielded from dynamo (torch.compiler.disable) for the frames it falls back to.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import fusedops
import fusedops.nn as fnn
from fusedops.kernels.softmax_kernels import _backward_kernel, _forward_kernel
from helpers import assert_close
from test_softmax import poisoned_outputs  # noqa: F401  (a fixture)

OPS = {
    "softmax": (fusedops.softmax, torch.softmax),
    "log_softmax": (fusedops.log_softmax, torch.log_softmax),
}
NAMES = list(OPS)


@pytest.fixture
def interpreted(monkeypatch, poisoned_outputs):
    """The kernels run in the interpreter, every output they allocate starts as NaN (a missed element cannot
    pass), and the launch caches start empty (no earlier test's layouts: test_softmax's poisoned_outputs)."""
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")


@pytest.fixture
def kernel_runs(monkeypatch):
    """Counts the launches of the forward and backward kernels (the interpreter's prepared launches call
    `run`), to show that a case took the kernel path and not torch's fallback."""
    counts = {"forward": 0, "backward": 0}
    for name, kernel in (("forward", _forward_kernel), ("backward", _backward_kernel)):
        def counted(*args, _run=kernel.run, _name=name, **kwargs):
            counts[_name] += 1
            return _run(*args, **kwargs)
        monkeypatch.setattr(kernel, "run", counted)
    return counts


def reference(x: torch.Tensor, dim: int, name: str) -> torch.Tensor:
    return OPS[name][1](x.double(), dim)


def reference_grad(x: torch.Tensor, dim: int, name: str, dy: torch.Tensor) -> torch.Tensor:
    xd = x.detach().double().requires_grad_()
    (g,) = torch.autograd.grad(OPS[name][1](xd, dim), xd, dy.double())
    return g


def forward_backward(x: torch.Tensor, dim: int, name: str, dy: torch.Tensor, **kwargs):
    xr = x.detach().requires_grad_()
    y = OPS[name][0](xr, dim, **kwargs)
    (g,) = torch.autograd.grad(y, xr, dy)
    return y, g


def same_nan_pattern(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert torch.equal(actual.isnan(), expected.isnan()), (actual, expected)


# ------------------------------------------------------------------------------------------------
# Routing: the cases below run the kernels, not torch's op
# ------------------------------------------------------------------------------------------------
def test_cpu_tensors_take_the_kernels_in_the_interpreter(interpreted, kernel_runs):
    x = torch.randn(6, 37)
    dy = torch.randn(6, 37)
    y, g = forward_backward(x, 1, "softmax", dy)
    assert kernel_runs == {"forward": 1, "backward": 1}
    assert_close(y, reference(x, 1, "softmax"), torch.float32)
    assert_close(g, reference_grad(x, 1, "softmax", dy), torch.float32)


# ------------------------------------------------------------------------------------------------
# dim handling
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape, dim", [((), 0), ((), -1), ((7,), 0), ((7,), -1), ((3, 5, 4), -2),
                                        ((3, 5, 4), -3), ((2, 3, 4, 5), 2)])
def test_dims_like_torch(interpreted, name, shape, dim):
    x = torch.randn(shape)
    dy = torch.randn(shape)
    y, g = forward_backward(x, dim, name, dy)
    expected = OPS[name][1](x, dim)
    assert (y.shape, y.dtype, y.stride()) == (expected.shape, expected.dtype, expected.stride())
    assert_close(y, reference(x, dim, name), torch.float32)
    assert_close(g, reference_grad(x, dim, name, dy), torch.float32)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape, dim", [((), 1), ((), -2), ((7,), 1), ((7,), -2), ((3, 4), 2), ((3, 4), -3),
                                        ((0, 4), 2)])
def test_out_of_range_dims_raise_torchs_index_error(interpreted, name, shape, dim):
    ours, theirs = OPS[name]
    x = torch.randn(shape)
    with pytest.raises(IndexError) as expected:
        theirs(x, dim)
    with pytest.raises(IndexError) as actual:
        ours(x, dim)
    assert str(actual.value) == str(expected.value)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dim", [None, 1.0, True, "1", (1,), [1], torch.tensor([1]), torch.tensor(1.0)],
                         ids=["None", "float", "bool", "str", "tuple", "list", "1d-tensor", "float-tensor"])
def test_dims_that_are_not_ints_raise_type_error_naming_dim(interpreted, name, dim):
    ours, theirs = OPS[name]
    x = torch.randn(3, 4)
    with pytest.raises(TypeError):
        theirs(x, dim)
    with pytest.raises(TypeError, match="'dim'"):
        ours(x, dim)


@pytest.mark.parametrize("dim", [np.int64(0), np.int32(-1), torch.tensor(1)], ids=["np.int64", "np.int32", "tensor"])
def test_integer_like_dims_eagerly(interpreted, dim):
    x = torch.randn(3, 5)
    assert_close(fusedops.softmax(x, dim), torch.softmax(x.double(), int(dim)), torch.float32)
    assert_close(fusedops.log_softmax(x, dim), torch.log_softmax(x.double(), int(dim)), torch.float32)


# ------------------------------------------------------------------------------------------------
# dtype=
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("source, dtype", [
    (torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float32, torch.float64),
    (torch.float16, torch.float64), (torch.float32, torch.float16), (torch.float32, torch.bfloat16),
    (torch.float64, torch.float32), (torch.bfloat16, torch.float16), (torch.int64, torch.float32),
    (torch.bool, torch.float32), (torch.float32, float),
], ids=str)
def test_dtype_argument_casts_like_torch(interpreted, name, source, dtype):
    ours, theirs = OPS[name]
    base = torch.randn(5, 37) * 3
    x = base.to(source) if source.is_floating_point else (base > 0 if source == torch.bool else base.round().to(source))
    y = ours(x, 1, dtype=dtype)
    expected = theirs(x, 1, dtype=dtype)
    assert (y.dtype, y.shape, y.stride()) == (expected.dtype, expected.shape, expected.stride())
    # torch casts the input first: the oracle is the float64 op of the cast input, to the output's precision
    assert_close(y, theirs(x.to(y.dtype).double(), 1), y.dtype)


@pytest.mark.parametrize("name", NAMES)
def test_half_to_float_gradient_over_a_dim_that_is_not_last(interpreted, name):
    # pytorch#30572: F.softmax(a_half, dim=1, dtype=torch.float32) failed in the backward for dim != -1
    x = torch.randn(2, 3, 4, 5).half()
    dy = torch.randn(2, 3, 4, 5)
    y, g = forward_backward(x, 1, name, dy, dtype=torch.float32)
    assert y.dtype == torch.float32 and g.dtype == torch.float16        # pytorch#85504: dx in x's dtype
    assert_close(y, reference(x, 1, name), torch.float32)
    assert_close(g, reference_grad(x, 1, name, dy), torch.float16)


@pytest.mark.parametrize("name", NAMES)
def test_bad_dtype_and_input_errors_name_the_argument(interpreted, name):
    ours, theirs = OPS[name]
    x = torch.randn(3, 4)
    for dtype in (torch.int32, "float32", torch.complex64):
        with pytest.raises(TypeError, match="'dtype'"):
            ours(x, 1, dtype=dtype)
    with pytest.raises(TypeError, match="'input'"):
        ours(torch.arange(6).view(2, 3), 1)
    with pytest.raises(TypeError, match="'input'"):
        ours([1.0, 2.0], 0)
    with pytest.raises(TypeError, match="'input'"):
        ours(None, 0)
    # torch also refuses each of them (NotImplementedError for the dtypes its kernels lack)
    with pytest.raises((TypeError, NotImplementedError)):
        theirs(torch.arange(6).view(2, 3), 1)


# ------------------------------------------------------------------------------------------------
# Empty tensors, size 1
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape, dim", [((0, 5), 0), ((0, 5), 1), ((3, 0), 1), ((3, 0, 4), 1), ((3, 0, 4), 2),
                                        ((0,), 0), ((5, 1), 1), ((1, 1, 1), 0)])
def test_empty_and_size_one_dims(interpreted, name, shape, dim):
    x = torch.randn(shape)
    dy = torch.randn(shape)
    y, g = forward_backward(x, dim, name, dy)
    expected = OPS[name][1](x, dim)
    assert (y.shape, y.dtype, y.stride()) == (expected.shape, expected.dtype, expected.stride())
    assert g.shape == x.shape
    if x.numel():
        assert_close(y, reference(x, dim, name), torch.float32)
        assert_close(g, reference_grad(x, dim, name, dy), torch.float32)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("value", [-math.inf, math.inf, math.nan, 3e38, -3e38])
def test_single_special_values(interpreted, name, value):
    ours, theirs = OPS[name]
    for x, dim in ((torch.tensor(value), 0), (torch.tensor([[value]]), 1), (torch.tensor([[value]]), 0)):
        y, expected = ours(x, dim), theirs(x, dim)
        same_nan_pattern(y, expected)
        assert torch.equal(y.nan_to_num(), expected.nan_to_num())


# ------------------------------------------------------------------------------------------------
# Special values and magnitudes, every tile kind
# ------------------------------------------------------------------------------------------------
def _special_rows(n: int, dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(10, n) * 3
    x[0] = -math.inf                                # only -inf: NaN, as torch
    x[1, 5] = math.inf                              # one +inf: NaN row (pytorch#6864)
    x[2, n - 1] = math.nan                          # NaN in the tail
    x[3, 0] = math.inf
    x[3, n // 2] = math.inf
    x[4] = -math.inf
    x[4, n - 3] = 2.0                               # one finite value in the tail
    x[5] = -math.inf
    x[5, 0] = 2.0                                   # ... at the head
    x[6] = x[6] * (1e37 if dtype == torch.float32 else 1e4)
    x[7] = -math.inf
    x[7, n // 2 + 1] = -1.0                         # lanes see only -inf for the first chunks
    x[7, n // 2 + 7] = -1.5
    x[8] = 1e-40
    x[9, n - 1] = 1e30 if dtype == torch.float32 else 6e4
    return x.to(dtype)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype, n, layout", [
    (torch.float32, 40, "rows"), (torch.float16, 41, "columns"), (torch.float32, 20000, "rows"),
    (torch.float16, 20000, "rows"), (torch.bfloat16, 33001, "rows"), (torch.float32, 20000, "columns"),
], ids=lambda v: str(v).replace("torch.", ""))
def test_special_values(interpreted, name, dtype, n, layout):
    """one pass, online rows (float32 past 16384), the persistent row sweeps (2-byte types past 16384),
    column tiles (one pass and online)."""
    ours, theirs = OPS[name]
    x = _special_rows(n, dtype)
    if layout == "columns":
        x, dim = x.t().contiguous(), 0
    else:
        dim = 1
    y = ours(x, dim)
    expected = reference(x, dim, name)
    same_nan_pattern(y, expected)
    same_nan_pattern(y, theirs(x, dim))
    assert_close(y, expected.to(dtype), dtype)


@pytest.mark.parametrize("name", NAMES)
def test_extreme_magnitudes(interpreted, name):
    x32 = torch.tensor([[3e38, 1e38, -3e38, 0.0], [-3.4e38, -3.3e38, -3e38, -1e38], [1e-45, 0.0, -1e-45, 1e-38]])
    # (log_softmax's -6e38 rounds to -inf in float32, as torch's result does)
    assert_close(OPS[name][0](x32, 1), reference(x32, 1, name).float(), torch.float32)
    x16 = torch.tensor([[65504.0, -65504.0, 0.0, 1.0], [-65504.0, -65504.0, -65000.0, -60000.0]]).half()
    assert_close(OPS[name][0](x16, 1), reference(x16, 1, name).half(), torch.float16)


# ------------------------------------------------------------------------------------------------
# Rows longer than one block
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype, n", [(torch.float32, 5000), (torch.float16, 5001), (torch.float32, 70000),
                                      (torch.float16, 70000), (torch.bfloat16, 40001)], ids=str)
def test_long_rows(interpreted, kernel_runs, name, dtype, n):
    x = (torch.randn(3, n) * 4).to(dtype)
    dy = torch.randn(3, n).to(dtype)
    y, g = forward_backward(x, 1, name, dy)
    assert kernel_runs["forward"] == 1 and kernel_runs["backward"] == 1
    assert_close(y, reference(x, 1, name), dtype)
    assert_close(g, reference_grad(x, 1, name, dy), dtype)


# ------------------------------------------------------------------------------------------------
# Layouts
# ------------------------------------------------------------------------------------------------
LAYOUTS = {
    "transposed": lambda: torch.randn(37, 6).t(),
    "expanded_rows": lambda: torch.randn(1, 37).expand(6, 37),
    "expanded_reduced": lambda: torch.randn(6, 1).expand(6, 37),
    "channels_last": lambda: torch.randn(2, 5, 3, 4).to(memory_format=torch.channels_last),
    "sliced_4d": lambda: torch.randn(4, 6, 8, 10)[:, 1:5, ::2, 1:8:3],
    "unfold": lambda: torch.randn(40).unfold(0, 8, 3),
    "overlapping": lambda: torch.randn(40).as_strided((3, 4, 5), (1, 2, 3)),
    "offset_odd_rows": lambda: torch.randn(3 * 1001 + 3)[3:].view(3, 1001).half(),
    "permuted_3d": lambda: torch.randn(3, 4, 5).permute(2, 0, 1),
}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layouts_forward_and_backward(interpreted, name, layout):
    x = LAYOUTS[layout]()
    for dim in range(-x.dim(), 0):
        dy = torch.randn(x.shape).to(x.dtype)
        y, g = forward_backward(x, dim, name, dy)
        expected = OPS[name][1](x, dim)
        assert (y.shape, y.dtype, y.stride()) == (expected.shape, expected.dtype, expected.stride()), dim
        assert_close(y, reference(x, dim, name), x.dtype)
        assert_close(g, reference_grad(x, dim, name, dy), x.dtype)


GRAD_OUTPUTS = {
    "transposed": lambda s: torch.randn(s[::-1]).t(),
    "strided": lambda s: torch.randn(s[0], 2 * s[1])[:, ::2],
    "expanded_row": lambda s: torch.randn(1, s[1]).expand(s),
    "expanded_column": lambda s: torch.randn(s[0], 1).expand(s),
    "sum_backward_scalar": lambda s: torch.randn(()).expand(s),
    "negative_view": lambda s: torch._neg_view(torch.randn(s)),
}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("kind", list(GRAD_OUTPUTS))
def test_grad_output_layouts(interpreted, name, dim, kind):
    x = torch.randn(6, 37)
    dy = GRAD_OUTPUTS[kind]((6, 37))
    _, g = forward_backward(x, dim, name, dy)
    # a dy constant along `dim` makes softmax's exact gradient 0: the bound is absolute, ~8 float32 ulps of dy
    expected = reference_grad(x, dim, name, dy.resolve_neg())
    torch.testing.assert_close(g.double(), expected, rtol=1e-5, atol=1e-6 * float(dy.abs().max()))


@pytest.mark.parametrize("name", NAMES)
def test_saved_output_laid_out_anew_by_hooks(interpreted, name):
    # pytorch#139740: the backward must read the saved output through its strides
    x = torch.randn(4, 6, requires_grad=True)
    dy = torch.randn(4, 6)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.t().contiguous(), lambda t: t.t()):
        y = OPS[name][0](x, 1)
    (g,) = torch.autograd.grad(y, x, dy)
    assert_close(g, reference_grad(x, 1, name, dy), torch.float32)


# ------------------------------------------------------------------------------------------------
# Autograd
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_gradcheck_float64(interpreted, name):
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: OPS[name][0](a, 1), (x,), check_batched_grad=True,
                                    check_forward_ad=True, check_undefined_grad=True)


@pytest.mark.parametrize("name", NAMES)
def test_double_backward_raises_naming_the_op(interpreted, name):
    # pytorch#17261 (double backward of F.softmax(x_half, dtype=float) broke in torch): here it is refused
    x = torch.randn(3, 10).half().requires_grad_()
    y = OPS[name][0](x, 1, dtype=torch.float32)
    (g,) = torch.autograd.grad((y * torch.randn(3, 10)).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="fusedops.softmax / log_softmax"):
        g.float().pow(2).sum().backward()


@pytest.mark.parametrize("name", NAMES)
def test_in_place_change_of_the_output_is_caught_like_torch(interpreted, name):
    x = torch.randn(3, 5, requires_grad=True)
    y = OPS[name][0](x, 1)
    y.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("name", NAMES)
def test_torch_func_transforms_and_forward_ad(interpreted, name):
    from torch.func import grad, hessian, jacfwd, jacrev, jvp, vmap

    ours, theirs = OPS[name]
    x = torch.randn(4, 7)
    torch.testing.assert_close(vmap(lambda r: ours(r, 0))(x), theirs(x, 1))
    torch.testing.assert_close(vmap(lambda r: ours(r, 0), in_dims=1, out_dims=1)(x), theirs(x, 0))
    torch.testing.assert_close(vmap(vmap(lambda r: ours(r, -1, dtype=torch.float64)))(x[None]),
                               theirs(x[None], -1, dtype=torch.float64))
    r = x[0]
    torch.testing.assert_close(grad(lambda a: ours(a, 0)[2])(r), grad(lambda a: theirs(a, 0)[2])(r))
    torch.testing.assert_close(jacrev(lambda a: ours(a, 0))(r), jacrev(lambda a: theirs(a, 0))(r))
    torch.testing.assert_close(jacfwd(lambda a: ours(a, 0))(r), jacrev(lambda a: theirs(a, 0))(r))
    t = torch.randn(7)
    torch.testing.assert_close(jvp(lambda a: ours(a, 0), (r,), (t,))[1], jvp(lambda a: theirs(a, 0), (r,), (t,))[1])
    torch.testing.assert_close(hessian(lambda a: ours(a, 0)[1])(r), hessian(lambda a: theirs(a, 0)[1])(r))
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, torch.randn(4, 7))
        torch.testing.assert_close(fwAD.unpack_dual(ours(dual, 1)).tangent, fwAD.unpack_dual(theirs(dual, 1)).tangent)


# ------------------------------------------------------------------------------------------------
# torch.compile
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_compile_fullgraph_forward_and_backward(interpreted, reset_dynamo, name):
    ours, theirs = OPS[name]
    cases = [
        (lambda a: ours(a.t(), 1), lambda a: theirs(a.t(), 1), torch.randn(5, 3)),
        (lambda a: ours(a, 1, dtype=torch.float32), lambda a: theirs(a, 1, dtype=torch.float32),
         torch.randn(2, 3, 4, 5).half()),
        (lambda a: ours(a, 0), lambda a: theirs(a, 0), torch.tensor(1.5)),
        (lambda a: ours(a, 1), lambda a: theirs(a, 1), torch.randn(3, 0)),
        (lambda a: ours(a.expand(4, 7), 0), lambda a: theirs(a.expand(4, 7), 0), torch.randn(1, 7)),
    ]
    for fn, ref, x in cases:
        torch._dynamo.reset()
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = torch.compile(fn, backend="aot_eager", fullgraph=True)(xa), ref(xb)
        dy = torch.randn(ya.shape, dtype=ya.dtype)
        (ga,), (gb,) = torch.autograd.grad(ya, xa, dy), torch.autograd.grad(yb, xb, dy)
        assert (ya.dtype, ga.dtype) == (yb.dtype, gb.dtype)
        torch.testing.assert_close(ya, yb, atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(ga, gb, atol=2e-3, rtol=2e-3)


# ------------------------------------------------------------------------------------------------
# nn modules: torch's legacy implicit dim
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("module", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (2, 3, 4), (2, 3, 4, 5)], ids=str)
def test_modules_legacy_implicit_dim_warns_and_matches_torch(interpreted, module, shape):
    x = torch.randn(shape)
    with pytest.warns(UserWarning, match="Implicit dimension choice"):
        y = getattr(fnn, module)()(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = getattr(torch.nn, module)()(x.double())
    assert_close(y, expected, torch.float32)


@pytest.mark.parametrize("module", ["Softmax", "LogSoftmax"])
def test_modules_with_a_dim_trace_export_and_compile(interpreted, reset_dynamo, module):
    x = torch.randn(2, 3, 4)
    ours, theirs = getattr(fnn, module)(dim=1), getattr(torch.nn, module)(dim=1)
    torch.testing.assert_close(torch.fx.symbolic_trace(ours)(x), theirs(x))
    torch.testing.assert_close(torch.export.export(ours, (x,)).module()(x), theirs(x))
    torch.testing.assert_close(torch.compile(ours, backend="aot_eager", fullgraph=True)(x), theirs(x))


# ------------------------------------------------------------------------------------------------
# Defect 1: torch.fx.symbolic_trace and the legacy implicit dim
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("module", ["Softmax", "LogSoftmax"])
def test_fx_symbolic_trace_of_modules_with_the_implicit_dim(interpreted, module):
    x = torch.randn(2, 3, 4)                       # 3-d: the legacy rule picks dim 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = getattr(torch.nn, module)()(x)
        traced = torch.fx.symbolic_trace(getattr(fnn, module)())
        torch.testing.assert_close(traced(x), expected)


def test_fx_symbolic_trace_of_a_patched_model_with_the_implicit_dim(interpreted):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Softmax())
    x = torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = model(x)
        torch.fx.symbolic_trace(model)             # torch's modules trace
        fnn.patch(model)
        traced = torch.fx.symbolic_trace(model)
        torch.testing.assert_close(traced(x), expected)


# ------------------------------------------------------------------------------------------------
# Defect 2: a NumPy integer dim under torch.compile
# ------------------------------------------------------------------------------------------------
def test_numpy_integer_dim_compiles_with_torchs_op(reset_dynamo):
    # the oracle: torch's op takes a NumPy integer dim in a full graph
    x = torch.randn(3, 5)
    out = torch.compile(lambda a: torch.softmax(a, np.int64(0)), backend="aot_eager", fullgraph=True)(x)
    torch.testing.assert_close(out, torch.softmax(x, 0))


@pytest.mark.parametrize("name", NAMES)
def test_numpy_integer_dim_under_torch_compile(interpreted, reset_dynamo, name):
    ours, theirs = OPS[name]
    x = torch.randn(3, 11)
    fullgraph = torch.compile(lambda a: ours(a, np.int64(0)), backend="aot_eager", fullgraph=True)(x)
    torch.testing.assert_close(fullgraph, theirs(x, 0))
    torch._dynamo.reset()
    y = torch.randn(3, 13)                          # a layout not launched before
    partial = torch.compile(lambda a: ours(a, np.int64(0)), backend="aot_eager")(y)
    torch.testing.assert_close(partial, theirs(y, 0))
