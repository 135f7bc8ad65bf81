"""Session 29 break-it review of fusedops.softmax / log_softmax and fusedops.nn.Softmax / LogSoftmax (CPU only,
kernels in the interpreter with FUSEDOPS_INTERPRET=1 and NaN-poisoned outputs), against float64 torch.

Peer bug reports the cases come from: pytorch/pytorch#25110 and NVIDIA/apex#1390 (fully masked -inf rows),
pytorch/pytorch#6864 and jax-ml/jax#21495 (+inf in a row), mindspore-ai/mindspore#374 (NaN propagation),
gabrieldemarmiesse/torch-mojo-backend#319 (-inf lanes of an online kernel), linkedin/Liger-Kernel#1252 and #1139
(rows wider than one block), kaldi-asr/kaldi#985 (input and output with different strides), torch/nn#832 and
pytorch/pytorch#139740 (non-contiguous grad_output / saved output), NVIDIA/apex#1430 (backward writing into
grad_output), pytorch/pytorch#30572 and #85504 (fused half-to-float over a non-last dim, gradient dtype),
pytorch/pytorch#17261 (double backward), NVIDIA/apex#1493 (fused result differing from torch's).

No defect was found: every test below passes (none is xfail). See the session report for what was tried.
"""

from __future__ import annotations

import copy
import pickle
import random

import pytest
import torch

import fusedops
import fusedops.nn as fnn
from helpers import assert_close, tolerance
from test_softmax import poisoned_outputs  # noqa: F401  (a fixture)

OPS = {"softmax": (fusedops.softmax, torch.softmax), "log_softmax": (fusedops.log_softmax, torch.log_softmax)}
SPECIALS = [float("-inf"), float("inf"), float("nan"), 3e38, -3e38, 1e-40, 65504.0, -65504.0, 0.0]


@pytest.fixture
def interpreted(monkeypatch, poisoned_outputs):  # noqa: F811
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")


def _grad(fn, x, dim, dy, **kwargs):
    x = x.detach().requires_grad_()
    y = fn(x, dim, **kwargs)
    (g,) = torch.autograd.grad(y, x, dy)
    return y, g


def _random_view(shape, dtype, rng):
    """A strided view of `shape`: dims permuted in memory, every other element, sometimes an expanded dim."""
    nd = len(shape)
    steps = [rng.choice([1, 2]) for _ in shape]
    order = list(range(nd))
    rng.shuffle(order)
    base = torch.randn([shape[d] * steps[d] for d in order]).to(dtype)
    view = base.permute([order.index(d) for d in range(nd)])
    return view[tuple(slice(None, None, s) for s in steps)]


# -- forward: special values in every path (one pass, online rows, row sweeps, columns) ----------------------
@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str)
def test_special_values_in_random_layouts_match_torch(interpreted, name, dtype, seed):
    # pytorch#25110 / apex#1390: an all -inf row is NaN in torch; pytorch#6864: one +inf makes the row NaN;
    # mindspore#374: NaN spreads over its row only. Reference: float64 torch rounded to the dtype (so fp16
    # log_softmax values below -65504 are -inf on both sides).
    ours, theirs = OPS[name]
    rng = random.Random(seed)
    specials = torch.tensor(SPECIALS, dtype=torch.float64)
    for _ in range(6):
        nd = rng.randint(1, 4)
        shape = [rng.randint(1, 4) for _ in range(nd)]
        dim = rng.randrange(nd)
        shape[dim] = rng.choice([1, 3, 17, 1000, 2049, 4097])
        x = torch.randn(shape, dtype=torch.float64) * rng.uniform(1, 40)
        x = torch.where(torch.rand(shape) < 0.05, specials[torch.randint(0, len(specials), shape)], x).to(dtype)
        first_row = [0] * nd
        first_row[dim] = slice(None)
        x[tuple(first_row)] = float("-inf")
        order = list(range(nd))
        rng.shuffle(order)
        view = x.permute(order).contiguous().permute([order.index(d) for d in range(nd)])
        y = ours(view, dim)
        expected = theirs(view.double(), dim).to(dtype)
        assert y.dtype == dtype and y.shape == view.shape and y.is_contiguous()
        assert torch.equal(y.isnan(), expected.isnan()), (shape, dim)
        finite = ~expected.isnan()
        assert_close(y[finite], expected[finite], dtype)


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str)
def test_long_rows_with_special_values_forward_and_backward(interpreted, name, dtype, seed):
    # Liger-Kernel#1252 / #1139 (rows wider than one block); torch-mojo-backend#319 (-inf in the first chunks
    # of an online row); the same rows as "rows" tiles and, transposed in memory, as online "columns" tiles.
    ours, theirs = OPS[name]
    n = 16385
    x = torch.randn(4, n, dtype=torch.float64) * 10
    x[0, : n // 2] = float("-inf")
    x[1, n - 5] = float("nan")
    x[2, n - 3] = float("inf")
    x[3] += 100
    x = x.to(dtype)
    dy = torch.randn(4, n).to(dtype)
    for view in (x, x.t().contiguous().t()):
        y, g = _grad(ours, view, 1, dy)
        ry, rg = _grad(theirs, view.double(), 1, dy.double())
        assert g.dtype == dtype
        for actual, expected in ((y, ry), (g, rg)):
            assert torch.equal(actual.isnan(), expected.isnan())
            finite = ~expected.isnan()
            assert_close(actual[finite], expected[finite], dtype)


# -- backward -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_gradients_for_random_input_and_grad_output_layouts(interpreted, name, dtype, seed):
    # kaldi#985, torch/nn#832, pytorch#139740: x and dy each strided, permuted and sliced their own way.
    ours, theirs = OPS[name]
    rng = random.Random(seed)
    for _ in range(6):
        nd = rng.randint(2, 4)
        shape = [rng.choice([1, 2, 3, 5]) for _ in range(nd)]
        dim = rng.randrange(nd)
        shape[dim] = rng.choice([1, 5, 33, 130])
        x, dy = _random_view(shape, dtype, rng), _random_view(shape, dtype, rng)
        y, g = _grad(ours, x, dim, dy)
        ry, rg = _grad(theirs, x.double(), dim, dy.double())
        assert g.dtype == dtype and g.shape == x.shape
        assert_close(y, ry, dtype)
        assert_close(g, rg, dtype)


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("shape, dim", [((4, 33), 1), ((33, 4), 0), ((2, 5, 7), 1), ((2, 20001), 1)], ids=str)
def test_grad_output_expanded_over_rows(interpreted, name, shape, dim):
    # dy of `y.mean(other dims)`-like losses: stride 0 across rows, varying along the reduced dim.
    ours, theirs = OPS[name]
    x = torch.randn(shape)
    small = [1] * len(shape)
    small[dim] = shape[dim]
    dy = torch.randn(small).expand(shape)
    y, g = _grad(ours, x, dim, dy)
    _, rg = _grad(theirs, x.double(), dim, dy.double())
    assert_close(g, rg, torch.float32)


@pytest.mark.parametrize("name", list(OPS))
def test_backward_leaves_grad_output_input_and_saved_output_untouched(interpreted, name):
    # NVIDIA/apex#1430: the fused backward wrote its result into grad_output.
    ours, _ = OPS[name]
    for shape, dim in (((4, 33), 1), ((33, 4), 0), ((2, 20001), 1)):
        x = torch.randn(shape, requires_grad=True)
        x0 = x.detach().clone()
        y = ours(x, dim)
        y0 = y.detach().clone()
        dy = torch.randn(shape)
        dy0 = dy.clone()
        (g,) = torch.autograd.grad(y, x, dy, retain_graph=True)
        (g2,) = torch.autograd.grad(y, x, dy)
        assert torch.equal(dy, dy0) and torch.equal(y, y0) and torch.equal(x.detach(), x0)
        assert torch.equal(g, g2) and g.data_ptr() != dy.data_ptr()


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("source, dtype", [(torch.float16, torch.float32), (torch.bfloat16, torch.float64),
                                           (torch.float32, torch.float64), (torch.float64, torch.float32),
                                           (torch.float32, torch.float16), (torch.bfloat16, torch.float16)], ids=str)
def test_dtype_argument_gradient_through_every_tile(interpreted, name, source, dtype):
    # pytorch#30572 / #85504: the output in `dtype`, the gradient in the input's, dim last and not last.
    ours, theirs = OPS[name]
    for shape, dim in (((3, 4097), 1), ((4097, 3), 0), ((2, 5, 7), 1)):
        x = torch.randn(shape).to(source)
        dy = torch.randn(shape).to(dtype)
        y, g = _grad(ours, x, dim, dy, dtype=dtype)
        ry, rg = _grad(theirs, x.to(dtype).double(), dim, dy.double())   # torch casts the input first
        assert y.dtype == dtype and g.dtype == source
        assert_close(y, ry, dtype)
        assert_close(g, rg.to(source), max((source, dtype), key=tolerance))   # the coarser of the two


def test_double_backward_is_a_clear_error_where_torch_computes_it(interpreted):
    # pytorch#17261: torch differentiates softmax twice; fusedops documents (SoftmaxFunction) a RuntimeError.
    x = torch.randn(5, dtype=torch.float64)
    h = torch.autograd.functional.hessian(lambda t: torch.log_softmax(t, 0)[0], x)
    assert h.shape == (5, 5) and h.abs().sum() > 0
    with pytest.raises(RuntimeError, match="fusedops"):
        torch.autograd.functional.hessian(lambda t: fusedops.log_softmax(t, 0)[0], x)


# -- output layout --------------------------------------------------------------------------------------------
def test_output_strides_and_dtype_match_torch_for_random_views(interpreted, seed):
    rng = random.Random(seed)
    for _ in range(40):
        nd = rng.randint(1, 4)
        shape = [rng.choice([0, 1, 1, 2, 3]) for _ in range(nd)]
        x = _random_view(shape, rng.choice([torch.float32, torch.float16]), rng)
        dim = rng.randint(-nd, nd - 1)
        for dtype in (None, torch.float64):
            for ours, theirs in OPS.values():
                y, r = ours(x, dim, dtype=dtype), theirs(x, dim, dtype=dtype)
                assert (y.shape, y.stride(), y.dtype) == (r.shape, r.stride(), r.dtype), (x.shape, x.stride(), dim)
                assert torch.allclose(y.double(), r.double(), rtol=4e-3, atol=4e-3, equal_nan=True)


# -- nn modules -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ours, theirs", [(fnn.Softmax, torch.nn.Softmax), (fnn.LogSoftmax, torch.nn.LogSoftmax)])
def test_modules_backward_hooks_repr_pickle_and_state_dict_like_torch(interpreted, ours, theirs):
    x0 = torch.randn(3, 5, 7, dtype=torch.float64)
    dy = torch.randn(3, 5, 7, dtype=torch.float64)
    results = []
    for cls in (ours, theirs):
        module, seen = cls(dim=1), []
        module.register_full_backward_hook(lambda m, gi, go: seen.append((gi[0].clone(), go[0].clone())))
        x = x0.clone().requires_grad_()
        y = module(x)
        y.backward(dy)
        results.append((y.detach(), x.grad, *seen[0]))
    for a, b in zip(*results):
        assert_close(a, b, torch.float64)
    module = ours(dim=-1)
    assert repr(module) == repr(theirs(dim=-1)) and repr(ours()) == repr(theirs())
    assert module.state_dict() == theirs(dim=-1).state_dict() == {}
    for clone in (pickle.loads(pickle.dumps(module)), copy.deepcopy(module)):
        assert type(clone) is ours and clone.dim == -1
        assert_close(clone(x0), theirs(dim=-1)(x0), torch.float64)
    state = ours(dim=1).__dict__.copy()
    del state["dim"]                       # a module pickled before `dim` existed: torch's __setstate__
    legacy = ours.__new__(ours)
    legacy.__setstate__(state)
    with pytest.warns(UserWarning, match="Implicit dimension"):
        assert_close(legacy(x0), theirs()(x0), torch.float64)
