"""Review (session 26, matmul): a fresh reviewer tried to break fusedops.matmul, fusedops.nn.Linear (and its
functional fusedops.nn.linear.linear) against torch.matmul / F.linear / torch.nn.Linear, with cases taken from
PyTorch and Triton bug reports: a bias that alone needs a gradient (the weight frozen, the input frozen), every
fused activation with and without a bias, out_dtype (fp16 products past 65504 kept in a float32 output),
batched and broadcast operands (3-D/4-D x with a 2-D weight, a batched b, batch dims of 1 and 0), 1-D operands
and the dot product, empty M/N/K, transposed / sliced / expanded (stride 0) operands and grad_outputs (the
stride-0 gradient of .sum(), pytorch#3303), a strided or expanded bias view, a bias of another dtype than the
input (torch's F.linear raises, fusedops.matmul documents any float bias), K = 4096, backward twice with
retain_graph and gradient accumulation into .grad, a tied / transposed weight (x @ x.T, an embedding matrix used
as E[idx] @ E.T @ E), in-place changes after the forward, torch.no_grad / inference_mode / inference tensors,
gradcheck in float64. Values and gradients (inputs, weight, bias) are compared with a float64 reference, with
torch's own error in the same dtype as the bar (2x, plus a few ulps of the output's scale).

Three routes (`path`): the kernels in the NumPy interpreter (FUSEDOPS_INTERPRET=1, what CUDA tensors take),
torch's fallback (CPU tensors by default), and `prepared`: the GPU path of fusedops.autograd.matmul, whose
prepared launches (_Product, _gradient_launches: the backward changed in this session, dA and dB by prepared
launches and the bias's column sums by torch.sum(dtype=float32)) never run under the interpreter. There only
the GPU-only pieces are stood in for: autograd.matmul._interpret_enabled answers False (as on a GPU) and
kernels.matmul.prepare_matmul returns a launch that re-creates the prepared views (their shapes and strides at
the given tensors' addresses, as the real launch reads only data pointers) and runs matmul_into in the
interpreter; the module's launch caches are replaced by private ones for the test.

Defect found (fixed in session 26: contiguous_allocator takes its plain form for a 0-d shape; its test, a strict
xfail until then, now passes):
- The GPU path of fusedops.matmul cannot take a dot product of two 1-D operands without a bias (a 0-d result):
  with the prepared launches (`prepared` route, i.e. float16/bfloat16 CUDA tensors),
      fusedops.matmul(torch.randn(6), torch.randn(6))
  raises RuntimeError "expand(torch.FloatTensor{[1]}, size=[]): the number of sizes provided (0) must be
  greater or equal to the number of dimensions in the tensor (1)" where torch.matmul returns a 0-d tensor
  (the interpreter and fallback routes give it). Cause: _prepared_product allocates the output with
  kernels.allocation.contiguous_allocator(shape=()), whose fast form expands a 1-element tensor to `shape`;
  expand cannot drop the dim for shape () (the `0 not in shape` test lets () through).

Checked and matching torch (plain tests): every subset of input / weight / bias needing a gradient for 1-D to
4-D and transposed inputs in float64/32/16/bfloat16; all activations with and without a bias (values and the
three gradients); broadcast batches, 1-D operands, the dot product with a (1,) bias; M/N/K/batch = 0 with bias
and activation; stride-0, transposed and sliced grad_outputs and operands, strided and expanded bias views;
out_dtype float32/float16/bfloat16/float64 values and gradients (gradients in the operands' dtype); fp16
products past 65504 in a float32 output; the bias dtype rules (F.linear's RuntimeError for a mismatched bias,
TypeError for an integer bias in fusedops.matmul, float32 bias gradients of float16 operands); K = 4096;
retain_graph + accumulation; tied weights; in-place checks as torch's (raise when the saved operand changed, no
error when it is not needed); no_grad / inference_mode / inference tensors; gradcheck in float64 on all routes;
create_graph=True first-order gradients (a second derivative on the kernel routes raises, as documented).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.autograd.matmul as amm
import fusedops.kernels.matmul as kmm
import fusedops.nn as fnn
from fusedops.dsl.runtime.bounded_cache import BoundedCache
from fusedops.nn.linear import linear as flinear

D = torch.float64
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
EPS = {torch.float64: 2e-16, torch.float32: 1.2e-7, torch.float16: 1e-3, torch.bfloat16: 8e-3}
ACTIVATIONS = {None: lambda z: z, "relu": F.relu, "gelu": F.gelu,
               "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"), "silu": F.silu}


# ------------------------------------------------------------------------------------------------
# routes
# ------------------------------------------------------------------------------------------------
class _Launches:
    """The stand-in for kernels.matmul.prepare_matmul (GPU-only): counts the launches it runs."""

    def __init__(self):
        self.count = 0

    def prepare(self, c, a, b, bias=None, activation=None):
        if c.numel() == 0 or c.shape[0] > kmm.MAX_GRID_Y:
            return None
        spec = [(t.shape, t.stride()) for t in (c, a, b)]
        bias_spec = None if bias is None else (bias.shape, bias.stride())

        def launch(c2, a2, b2, bias2):
            self.count += 1
            views = [t.as_strided(shape, stride, t.storage_offset()) for t, (shape, stride) in zip((c2, a2, b2), spec)]
            bias_view = None if bias_spec is None else bias2.as_strided(*bias_spec, bias2.storage_offset())
            kmm.matmul_into(*views, bias_view, activation, interpret=True)

        return launch


@pytest.fixture
def prepared(monkeypatch):
    """The GPU path of fusedops.autograd.matmul (prepared launches), its kernels in the interpreter."""
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    launches = _Launches()
    monkeypatch.setattr(amm, "_interpret_enabled", lambda: False)
    monkeypatch.setattr(kmm, "prepare_matmul", launches.prepare)
    monkeypatch.setattr(amm, "_FORWARD_LAUNCHES", BoundedCache(64))
    monkeypatch.setattr(amm, "_KNOWN_PRODUCTS", BoundedCache(64))
    return launches


@pytest.fixture(params=["interpret", "fallback", "prepared"])
def path(request, monkeypatch):
    if request.param == "prepared":
        request.getfixturevalue("prepared")
    elif request.param == "interpret":
        monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    else:
        monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)
    return request.param


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _randn(g, *shape, dtype=D):
    return torch.randn(shape, generator=g, dtype=D).to(dtype)


def _err(x, ref):
    return (x.double() - ref.double()).abs().max().item() if x.numel() else 0.0


def check(ours, theirs, ref, k=1, what=""):
    """ours / theirs (torch in the same dtype) against ref (float64): shape and dtype as torch's, the error at
    most twice torch's plus a few ulps of the scale."""
    assert isinstance(ours, torch.Tensor), (what, type(ours))
    assert ours.shape == theirs.shape, (what, ours.shape, theirs.shape)
    assert ours.dtype == theirs.dtype, (what, ours.dtype, theirs.dtype)
    if ours.numel() == 0:
        return
    assert torch.equal(ours.isnan(), theirs.isnan()), (what, "NaN positions differ")
    finite = ref.isfinite()
    if not finite.all():
        assert torch.equal(ours.double()[~finite], ref[~finite]), (what, "non-finite values differ")
    o, t, r = ours.double()[finite], theirs.double()[finite], ref.double()[finite]
    scale = 1 + (r.abs().max().item() if r.numel() else 0)
    bar = 2 * _err(t, r) + 4 * EPS[theirs.dtype] * scale * (1 + math.sqrt(max(k, 1)))
    assert _err(o, r) <= bar, (what, _err(o, r), _err(t, r), bar)


def run(fn, inputs, needs, grad_out=None, dtype=None):
    """fn(*inputs) with `needs` saying which inputs require grad; (output, gradients) for grad_out (default a
    fixed random one), the inputs cast to `dtype` first (a copy, same layout) when given."""
    ins = []
    for t, need in zip(inputs, needs):
        if t is None:
            ins.append(None)
            continue
        t = t.detach() if dtype is None else t.detach().to(dtype)
        ins.append(t.requires_grad_(need) if need else t)
    y = fn(*ins)
    wanted = [t for t in ins if t is not None and t.requires_grad]
    if not wanted:
        return y, []
    go = grad_out if grad_out is not None else torch.randn(y.shape, generator=_gen(99), dtype=D)
    return y, list(torch.autograd.grad(y, wanted, go.to(y.dtype), allow_unused=True))


def compare(ours_fn, torch_fn, inputs, needs, dtype, k=1, grad_out=None, what=""):
    """ours_fn vs torch_fn on inputs of `dtype` (torch's error in that dtype is the bar), both vs torch_fn in
    float64. grad_out (float64, any layout) is cast to the output dtype keeping its strides."""
    def cast_go(dt):
        return None if grad_out is None else grad_out.to(dt)

    y, g = run(ours_fn, inputs, needs, cast_go(dtype))
    yt, gt = run(torch_fn, inputs, needs, cast_go(dtype))
    yr, gr = run(torch_fn, [None if t is None else t.to(D) for t in inputs], needs, cast_go(D))
    check(y, yt, yr, k, f"{what} value")
    assert len(g) == len(gt)
    for i, (x, t, r) in enumerate(zip(g, gt, gr)):
        assert (x is None) == (t is None), (what, i)
        if x is not None:
            check(x, t, r, k, f"{what} grad {i}")


NEEDS = [(False, False, True), (True, False, False), (False, True, False), (True, False, True),
         (False, True, True), (True, True, True)]


# ------------------------------------------------------------------------------------------------
# Linear: every subset of input / weight / bias needing a gradient
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_gradient_subsets(path, dtype, seed):
    g = _gen(seed)
    w, b = _randn(g, 3, 6), _randn(g, 3)
    xs = {"1d": _randn(g, 6), "2d": _randn(g, 4, 6), "3d": _randn(g, 2, 4, 6), "4d": _randn(g, 2, 3, 2, 6),
          "3d-T": _randn(g, 4, 2, 6).transpose(0, 1), "K-major": _randn(g, 6, 4).t()}
    for name, x in xs.items():
        for needs in NEEDS:
            compare(flinear, F.linear, [x, w, b], needs, dtype, k=6, what=f"{name} {needs}")


def test_linear_module_bias_alone_trains(path, seed):
    """The weight frozen, the input not requiring grad: only bias.grad, as torch.nn.Linear's."""
    torch.manual_seed(seed)
    theirs = torch.nn.Linear(6, 3).double()
    ours = fnn.Linear(6, 3).double()
    ours.load_state_dict(theirs.state_dict())
    for m in (theirs, ours):
        m.weight.requires_grad_(False)
    x = _randn(_gen(seed), 2, 5, 6)
    for m in (theirs, ours):
        m(x).pow(2).sum().backward()
    assert ours.weight.grad is None and theirs.weight.grad is None
    torch.testing.assert_close(ours.bias.grad, theirs.bias.grad, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# activations, with and without a bias
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_activation_with_and_without_bias(path, activation, dtype, seed):
    g = _gen(seed)
    act = ACTIVATIONS[activation]
    a, b, bias = _randn(g, 2, 4, 5), _randn(g, 5, 3), _randn(g, 3)
    for needs in ((True, True, True), (False, False, True), (True, False, True)):
        compare(lambda x, y, c: fusedops.matmul(x, y, c, activation), lambda x, y, c: act(x @ y + c),
                [a, b, bias], needs, dtype, k=5, what=f"bias {needs}")
    compare(lambda x, y: fusedops.matmul(x, y, None, activation), lambda x, y: act(x @ y), [a, b], (True, True),
            dtype, k=5, what="no bias")
    w = b.t()
    compare(lambda x, ww, c: flinear(x, ww, c, activation), lambda x, ww, c: act(F.linear(x, ww, c)),
            [a, w, bias], (True, True, True), dtype, k=5, what="linear")


# ------------------------------------------------------------------------------------------------
# shapes: broadcast batches, 1-D operands, empty dims
# ------------------------------------------------------------------------------------------------
SHAPES = [((2, 4, 5), (5, 3)), ((2, 3, 4, 5), (5, 3)), ((4, 5), (2, 5, 3)), ((2, 4, 5), (2, 5, 3)),
          ((1, 4, 5), (3, 5, 3)), ((3, 4, 5), (1, 5, 3)), ((2, 1, 4, 5), (3, 5, 3)), ((1, 1, 4, 5), (2, 3, 5, 3)),
          ((5,), (5, 3)), ((5,), (2, 5, 3)), ((2, 4, 5), (5,)), ((4, 5), (5,)), ((5,), (5,))]


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_broadcast_and_1d_with_bias_gradients(path, dtype, seed):
    g = _gen(seed)
    for sa, sb in SHAPES:
        a, b = _randn(g, *sa), _randn(g, *sb)
        n = 1 if len(sb) == 1 else sb[-1]
        bias = _randn(g, n)
        for needs in ((True, True, True), (False, False, True), (True, False, True), (False, True, False)):
            compare(lambda x, y, c: fusedops.matmul(x, y, c), lambda x, y, c: x @ y + c, [a, b, bias], needs, dtype,
                    k=5, what=f"{sa} {sb} {needs}")


@pytest.mark.parametrize("activation", [None, "gelu"])
def test_empty_dims_with_bias_and_activation(path, activation, seed):
    g = _gen(seed)
    act = ACTIVATIONS[activation]
    cases = [((0, 5), (5, 3)), ((4, 5), (5, 0)), ((4, 0), (0, 3)), ((0, 0), (0, 0)), ((0, 4, 5), (5, 3)),
             ((1, 4, 5), (0, 5, 3)), ((2, 0, 5), (5, 3)), ((0,), (0, 3)), ((2, 4, 0), (0, 3))]
    for sa, sb in cases:
        a, b, bias = _randn(g, *sa), _randn(g, *sb), _randn(g, sb[-1])
        for needs in ((True, True, True), (False, False, True)):
            compare(lambda x, y, c: fusedops.matmul(x, y, c, activation), lambda x, y, c: act(x @ y + c),
                    [a, b, bias], needs, torch.float32, what=f"{sa} {sb} {needs}")
    for n_in, n_out, x in ((0, 3, _randn(g, 2, 0)), (5, 0, _randn(g, 2, 5)), (5, 3, _randn(g, 0, 5))):
        w, bias = _randn(g, n_out, n_in), _randn(g, n_out)
        compare(lambda x, w, c: flinear(x, w, c, activation), lambda x, w, c: act(F.linear(x, w, c)),
                [x, w, bias], (True, True, True), torch.float32, what=f"linear {n_in} {n_out}")


# ------------------------------------------------------------------------------------------------
# layouts: operands, grad_outputs, bias views
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_grad_output_layouts(path, dtype, seed):
    """grad_outputs that are stride-0 (the gradient of .sum(), pytorch#3303), transposed or sliced."""
    g = _gen(seed)
    for sa, sb in (((4, 5), (5, 3)), ((2, 4, 5), (5, 3)), ((2, 4, 5), (2, 5, 3))):
        a, b, bias = _randn(g, *sa), _randn(g, *sb), _randn(g, 3)
        out = torch.broadcast_shapes(sa[:-2], sb[:-2]) + (4, 3)
        grads = {"sum": torch.ones((), dtype=D).expand(out),
                 "row-broadcast": _randn(g, 3).expand(out),
                 "transposed": _randn(g, *out[::-1]).permute(*reversed(range(len(out)))),
                 "sliced": _randn(g, *[2 * s for s in out])[tuple(slice(None, None, 2) for _ in out)]}
        for name, go in grads.items():
            for activation in (None, "silu"):
                act = ACTIVATIONS[activation]
                compare(lambda x, y, c: fusedops.matmul(x, y, c, activation), lambda x, y, c: act(x @ y + c),
                        [a, b, bias], (True, True, True), dtype, k=5, grad_out=go, what=f"{sa} {sb} {name} {activation}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_operand_and_bias_layouts(path, dtype, seed):
    g = _gen(seed)
    A, B = _randn(g, 4, 5), _randn(g, 5, 3)
    operands = {
        "T": (_randn(g, 5, 4).t(), _randn(g, 3, 5).t()),
        "sliced": (_randn(g, 9, 11)[1::2, ::2][:, :5], _randn(g, 11, 7)[::2, 1::2][:5, :3]),
        "rows-expanded": (_randn(g, 1, 5).expand(4, 5), B),
        "K-expanded": (_randn(g, 4, 1).expand(4, 5), _randn(g, 1, 3).expand(5, 3)),
        "scalar-expanded": (torch.ones((), dtype=D).expand(4, 5), B),
        "batch-expanded": (_randn(g, 1, 4, 5).expand(3, 4, 5), _randn(g, 5, 3).expand(3, 5, 3)),
        "3d-permuted": (_randn(g, 5, 3, 4).permute(1, 2, 0), B),
    }
    biases = {"plain": _randn(g, 3), "strided": _randn(g, 7)[::3], "expanded": _randn(g, 1).expand(3),
              "offset": _randn(g, 10)[4:7], "row-of-matrix": _randn(g, 3, 4)[:, 1]}
    for name, (a, b) in operands.items():
        for bname, bias in biases.items():
            compare(lambda x, y, c: fusedops.matmul(x, y, c), lambda x, y, c: x @ y + c, [a, b, bias],
                    (True, True, True), dtype, k=5, what=f"{name} {bname}")
    # Linear with a non-contiguous (transposed Parameter) weight, an expanded input and a strided bias
    w = _randn(g, 5, 3).t()
    for x in (_randn(g, 1, 5).expand(4, 5), _randn(g, 2, 5, 4).transpose(1, 2), A):
        compare(flinear, F.linear, [x, w, biases["strided"]], (True, True, True), dtype, k=5, what="linear")


def test_bias_view_gradient_reaches_its_base(path, seed):
    """A bias that is a view (a column of a matrix, an expanded scalar) that requires grad through its base."""
    g = _gen(seed)
    a, b = _randn(g, 2, 4, 5), _randn(g, 5, 3)
    base = _randn(g, 3, 4)
    results = []
    for op in (lambda x, y, c: fusedops.matmul(x, y, c, "gelu"), lambda x, y, c: F.gelu(x @ y + c)):
        m = base.clone().requires_grad_()
        s = torch.zeros((), dtype=D, requires_grad=True)
        y = op(a, b, m[:, 1] + s.expand(3))
        y.pow(2).sum().backward()
        results.append((m.grad, s.grad))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# out_dtype, overflow, bias dtypes
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("activation", [None, "gelu"])
def test_out_dtype_values_and_gradients(path, out_dtype, activation, seed):
    """torch has no out_dtype: its counterpart is the product and epilogue in float32 rounded once to
    out_dtype (torch.nn.Linear's addmm numerics); gradients come back in the operands' dtype."""
    g = _gen(seed)
    act = ACTIVATIONS[activation]
    a, b, bias = _randn(g, 2, 4, 8), _randn(g, 8, 3), _randn(g, 3)
    dtype = torch.float16

    def torch_like(x, y, c):
        wide = torch.promote_types(x.dtype, torch.float32)
        return act(x.to(wide) @ y.to(wide) + c.to(wide)).to(out_dtype)

    def ours(x, y, c):
        return fusedops.matmul(x, y, c, activation, out_dtype=out_dtype)

    for needs in ((True, True, True), (False, False, True)):
        y, gs = run(ours, [a, b, bias], needs, dtype=dtype)
        yt, gt = run(torch_like, [a, b, bias], needs, dtype=dtype)
        yr, gr = run(lambda x, y, c: act(x @ y + c), [t.to(dtype).double() for t in (a, b, bias)], needs)
        assert y.dtype == out_dtype and y.shape == yt.shape
        # the bar: out_dtype's rounding of the float64 value
        tol = EPS[out_dtype] * 2 * (1 + yr.abs().max().item()) + 1e-5 * (1 + yr.abs().max().item())
        assert _err(y, yr) <= tol, (_err(y, yr), tol)
        for x, t, r in zip(gs, gt, gr):
            assert x.dtype == t.dtype == dtype and x.shape == t.shape
            assert _err(x, r) <= 2 * _err(t, r) + 4 * EPS[dtype] * (1 + r.abs().max().item()), (_err(x, r), _err(t, r))


def test_out_dtype_float32_keeps_fp16_products_past_65504(path):
    a = torch.full((2, 4), 200.0, dtype=torch.float16, requires_grad=True)
    b = torch.full((4, 3), 100.0, dtype=torch.float16, requires_grad=True)
    y = fusedops.matmul(a, b, out_dtype=torch.float32)
    assert y.dtype == torch.float32 and torch.equal(y, torch.full((2, 3), 80000.0))
    # a float32 loss scale beyond float16's range (1e5): dA = 1e5 * 1e-3 summed over N = 3 fits in float16
    go = torch.full((2, 3), 1e5)
    b2 = torch.full((4, 3), 1e-3, dtype=torch.float16)
    a2 = a.detach().clone().requires_grad_()
    y2 = fusedops.matmul(a2, b2, out_dtype=torch.float32)
    ga, = torch.autograd.grad(y2, a2, go)
    ref = (go.double() @ b2.detach().double().t())
    assert ga.dtype == torch.float16 and torch.isfinite(ga).all()
    torch.testing.assert_close(ga.double(), ref, rtol=2e-3, atol=0)
    # a bias bringing an fp16-overflowing product back into range: one rounding, as torch.nn.Linear's addmm
    bias = torch.full((3,), -40000.0, dtype=torch.float16)
    torch.testing.assert_close(fusedops.matmul(a.detach(), b.detach(), bias), F.linear(a.detach(), b.detach().t(), bias))


def test_bias_dtype_rules(path, seed):
    g = _gen(seed)
    x, w = _randn(g, 4, 8, dtype=torch.float16), _randn(g, 3, 8, dtype=torch.float16)
    b32 = _randn(g, 3, dtype=torch.float32)
    # F.linear / nn.Linear: a bias of another dtype raises RuntimeError, as torch
    with pytest.raises(RuntimeError):
        F.linear(x, w, b32)
    with pytest.raises(RuntimeError):
        flinear(x, w, b32)
    lin = fnn.Linear(8, 3, dtype=torch.float16)
    lin.bias = torch.nn.Parameter(b32.clone())
    with pytest.raises(RuntimeError):
        lin(x)
    # fusedops.matmul documents any float bias (added in float32), output in a's dtype; integer bias refused
    with pytest.raises(TypeError, match="bias must be a floating-point tensor, got torch.int64"):
        fusedops.matmul(x, w.t(), torch.ones(3, dtype=torch.int64))
    for bias_dtype in (torch.float32, torch.float64, torch.bfloat16):
        bias = b32.to(bias_dtype)
        needs = (True, True, True)
        y, gs = run(lambda p, q, c: fusedops.matmul(p, q, c), [x, w.t(), bias], needs)
        yr, gr = run(lambda p, q, c: p @ q + c, [x.double(), w.t().double(), bias.double()], needs)
        assert y.dtype == torch.float16
        assert _err(y, yr) <= 2 * EPS[torch.float16] * (1 + yr.abs().max().item())
        assert [t.dtype for t in gs] == [torch.float16, torch.float16, bias_dtype]
        # dC is float16 (the output's dtype): its rounding is the error of the bias's column sums
        assert _err(gs[2], gr[2]) <= 8 * EPS[torch.float16] * (1 + gr[2].abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_large_k(dtype, seed, request):
    """K = 4096 on the prepared kernel path (the kernels in the interpreter; kept to one route for time)."""
    request.getfixturevalue("prepared")
    g = _gen(seed)
    a, b, bias = _randn(g, 3, 4096), _randn(g, 4096, 5), _randn(g, 5)
    compare(lambda x, y, c: fusedops.matmul(x, y, c), lambda x, y, c: x @ y + c, [a, b, bias], (True, True, True),
            dtype, k=4096)


# ------------------------------------------------------------------------------------------------
# autograd mechanics
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("activation", [None, "gelu_tanh"])
def test_retain_graph_twice_and_accumulation(path, activation, seed):
    torch.manual_seed(seed)
    theirs = torch.nn.Linear(6, 3).double()
    ours = fnn.Linear(6, 3, activation=activation).double()
    ours.load_state_dict(theirs.state_dict())
    act = ACTIVATIONS[activation]
    x = _randn(_gen(seed), 2, 5, 6)
    go = _randn(_gen(seed + 1), 2, 5, 3)
    xs = []
    for m, f in ((theirs, lambda v: act(theirs(v))), (ours, ours)):
        xx = x.clone().requires_grad_()
        y = f(xx)
        y.backward(go, retain_graph=True)
        y.backward(2 * go, retain_graph=True)
        f(xx).backward(go.transpose(0, 2).contiguous().transpose(0, 2))      # a third pass accumulates too (a non-contiguous gradient)
        xs.append(xx.grad)
    torch.testing.assert_close(xs[0], xs[1], rtol=1e-12, atol=1e-12)
    for p, q in zip(theirs.parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-12, atol=1e-12)


def test_no_grad_inference_mode_and_inference_tensors(path, seed):
    g = _gen(seed)
    w, b = _randn(g, 3, 6).requires_grad_(), _randn(g, 3).requires_grad_()
    x = _randn(g, 4, 6)
    with torch.no_grad():
        y = flinear(x, w, b, "relu")
        assert not y.requires_grad and y.grad_fn is None
        torch.testing.assert_close(y, F.relu(F.linear(x, w, b)), rtol=1e-12, atol=1e-12)
    with torch.inference_mode():
        xi = _randn(g, 4, 6)
        yi, yt = flinear(xi, w, b), F.linear(xi, w, b)
        assert yi.is_inference() and yt.is_inference() and not yi.requires_grad
        torch.testing.assert_close(yi, yt, rtol=1e-12, atol=1e-12)
        mi = fusedops.matmul(xi, w.t(), b, "silu")
        assert mi.is_inference()
    # an inference tensor saved for backward: both raise; not saved (the weight frozen): both succeed
    with pytest.raises(RuntimeError, match="[Ii]nference tensor"):
        F.linear(xi, w, b).sum().backward()
    with pytest.raises(RuntimeError, match="[Ii]nference tensor"):
        flinear(xi, w, b).sum().backward()
    bt, bo = b.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    F.linear(xi, w.detach(), bt).sum().backward()
    flinear(xi, w.detach(), bo).sum().backward()
    torch.testing.assert_close(bo.grad, bt.grad)


def test_inplace_change_after_forward(path, seed):
    g = _gen(seed)
    for op in (F.linear, flinear):
        # the weight needs a gradient: x is saved and changing it in place fails the backward, as torch
        x = _randn(g, 4, 6)
        w = _randn(g, 3, 6).requires_grad_()
        y = op(x, w)
        with torch.no_grad():
            x.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
        # the weight frozen: x is not needed, changing it after the forward is fine
        x0 = _randn(g, 4, 6).requires_grad_()
        xv = x0 * 1
        y = op(xv, _randn(g, 3, 6))
        xv.add_(1)
        y.sum().backward()
        assert x0.grad is not None
    # an in-place change of the output (y += 1, relu_) keeps the backward working
    for activation in (None, "gelu"):
        res = []
        for op in (lambda x, w: flinear(x, w, None, activation), lambda x, w: ACTIVATIONS[activation](F.linear(x, w))):
            x, w = _randn(_gen(seed), 4, 6).requires_grad_(), _randn(_gen(seed + 1), 3, 6).requires_grad_()
            y = op(x, w)
            y.add_(1).relu_()
            y.sum().backward()
            res.append((x.grad, w.grad))
        torch.testing.assert_close(res[0], res[1], rtol=1e-12, atol=1e-12)


def test_self_product_and_tied_weights(path, seed):
    g = _gen(seed)
    x = _randn(g, 4, 6)
    E = _randn(g, 10, 6)
    idx = torch.tensor([1, 7, 3, 3])
    results = []
    for mm, lin in ((fusedops.matmul, flinear), (torch.matmul, F.linear)):
        xx = x.clone().requires_grad_()
        mm(xx, xx.t()).pow(2).sum().backward()
        ee = E.clone().requires_grad_()
        h = mm(ee[idx], ee.t())            # (4, 10): an embedding's matrix reused transposed
        logits = lin(mm(h, ee), ee)        # (4, 10): an lm head tied to the embedding
        logits.logsumexp(-1).sum().backward()
        results.append((xx.grad, ee.grad))
    torch.testing.assert_close(results[0], results[1], rtol=1e-11, atol=1e-11)


def test_create_graph_first_order(path, seed):
    g = _gen(seed)
    x, w, b = _randn(g, 3, 4), _randn(g, 2, 4), _randn(g, 2)
    out = []
    for op in (lambda *t: flinear(*t, "gelu"), lambda *t: F.gelu(F.linear(*t))):
        ins = [t.clone().requires_grad_() for t in (x, w, b)]
        gs = torch.autograd.grad(op(*ins).pow(2).sum(), ins, create_graph=True)
        out.append(gs)
    torch.testing.assert_close(out[0], out[1], rtol=1e-12, atol=1e-12)
    if path == "fallback":      # torch's ops: differentiable again
        out[0][2].sum().backward()
    else:                       # documented: a kernel backward cannot be differentiated again
        with pytest.raises(RuntimeError, match="differentiate twice"):
            out[0][2].sum().backward()


GRADCHECK_CASES = [
    ((3, 4), (4, 2), True, None, (True, True, True)),
    ((3, 4), (4, 2), True, None, (False, False, True)),
    ((2, 3, 4), (4, 2), True, "gelu", (True, True, True)),
    ((2, 3, 4), (4, 2), True, "gelu_tanh", (False, True, True)),
    ((3, 4), (2, 4, 2), True, "silu", (True, True, True)),
    ((2, 1, 3, 4), (2, 4, 2), True, "relu", (True, True, True)),
    ((4,), (2, 4, 2), True, None, (True, True, True)),
    ((2, 3, 4), (4,), True, "silu", (True, True, True)),
    ((4,), (4,), True, "gelu", (True, True, True)),
    ((3, 0), (0, 2), True, "gelu", (True, True, True)),
]


@pytest.mark.parametrize("case", range(len(GRADCHECK_CASES)))
def test_gradcheck_float64(path, case, seed):
    sa, sb, with_bias, activation, needs = GRADCHECK_CASES[case]
    g = _gen(seed)
    a, b = _randn(g, *sa), _randn(g, *sb)
    bias = _randn(g, 1 if len(sb) == 1 else sb[-1]) if with_bias else None
    ins = [t.clone().requires_grad_(n) for t, n in zip((a, b, bias), needs)]
    assert torch.autograd.gradcheck(lambda x, y, c: fusedops.matmul(x, y, c, activation), ins, eps=1e-6, atol=1e-7)


# ------------------------------------------------------------------------------------------------
# the prepared (GPU) path
# ------------------------------------------------------------------------------------------------
def test_prepared_backward_runs_its_gradient_launches_with_a_bias(prepared, seed):
    """The session's change: with a bias needing a gradient, dA and dB come from the prepared launches."""
    g = _gen(seed)
    for sa in ((4, 6), (2, 4, 6)):
        x, w, b = _randn(g, *sa, dtype=torch.float16), _randn(g, 3, 6, dtype=torch.float16), _randn(
            g, 3, dtype=torch.float16)
        ins = [t.clone().requires_grad_() for t in (x, w, b)]
        y = flinear(*ins)
        before = prepared.count
        grads = torch.autograd.grad(y, ins, torch.ones_like(y))
        assert prepared.count - before == 2
        xr, wr, br = (t.double().requires_grad_() for t in (x, w, b))
        gr = torch.autograd.grad(F.linear(xr, wr, br).sum(), (xr, wr, br))
        for o, r in zip(grads, gr):
            assert o.dtype == torch.float16
            assert _err(o, r) <= 4 * EPS[torch.float16] * (1 + r.abs().max().item())


def test_prepared_dot_product_of_two_vectors(prepared, seed):
    g = _gen(seed)
    a, b = _randn(g, 6, dtype=torch.float16), _randn(g, 6, dtype=torch.float16)
    y = fusedops.matmul(a, b)
    assert y.shape == torch.matmul(a, b).shape == ()
    torch.testing.assert_close(y.double(), a.double() @ b.double(), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("route_name", ["interpret", "fallback"])
def test_dot_product_of_two_vectors_other_routes(route_name, monkeypatch, seed):
    """The same dot product on the interpreter and fallback routes: a 0-d result, gradients as torch's."""
    if route_name == "interpret":
        monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    else:
        monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)
    g = _gen(seed)
    a, b = _randn(g, 6), _randn(g, 6)
    compare(fusedops.matmul, torch.matmul, [a, b], (True, True), torch.float16, k=6)
    compare(fusedops.matmul, torch.matmul, [a, b], (True, True), torch.float64, k=6)
