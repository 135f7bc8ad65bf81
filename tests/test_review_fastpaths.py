"""Review tests of the host fast paths (prepared launches, generated binders) and the new softmax
SHIFT / online / LayerNorm ALIGN paths, on the CPU (interpreter, or the CUDA driver mocked)."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

import fusedops
from fusedops.autograd import matmul as MA
from fusedops.autograd import matmul_reference
from fusedops.autograd.matmul_reference import input_gradients
from fusedops.kernels import softmax as SK
from test_launch_fast_path import _symbolic, gpu, launches  # noqa: F401  (the mocked driver's fixtures)


@pytest.fixture
def interp(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")


def _ref_softmax(x, dim, log):
    x64 = x.double()
    return torch.log_softmax(x64, dim) if log else torch.softmax(x64, dim)


def _special_rows(n, dtype):
    x = torch.randn(6, n, dtype=torch.float64) * 3
    x[1, :] = -math.inf                 # all -inf
    x[2, n // 2] = math.inf             # one +inf
    x[3, 3] = math.nan                  # one NaN
    x[4, ::2] = -math.inf               # half -inf
    x[5, 0] = 1e4                       # one dominating value
    return x.to(dtype)


@pytest.mark.parametrize("n,block", [(37, None), (37, 16), (13, 8)])
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_softmax_odd_rows_special_values(interp, n, block, log, dtype):
    x = _special_rows(n, dtype)
    y = SK.softmax_forward(x, 1, log=log, max_one_pass_block=block)
    ref = _ref_softmax(x, 1, log)
    torch.testing.assert_close(y.double(), ref, atol=2e-3, rtol=2e-3, equal_nan=True)


@pytest.mark.parametrize("n,block", [(37, None), (37, 16)])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_odd_rows_backward(interp, n, block, log):
    x = torch.randn(5, n, dtype=torch.float32)
    y = _ref_softmax(x, 1, log).float()
    dy = torch.randn(5, n)
    dx = SK.softmax_backward(dy, y, 1, log=log, max_one_pass_block=block)
    x64 = x.double().requires_grad_()
    (torch.log_softmax(x64, 1) if log else torch.softmax(x64, 1)).backward(dy.double())
    torch.testing.assert_close(dx.double(), x64.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("block", [None, 16])
def test_softmax_outer_strides_differ(interp, block):
    # x's rows are 40 apart, y's 37: the SHIFT path needs one row stride, so it must not apply
    buf = torch.randn(4, 40, dtype=torch.float16)
    x = buf[:, :37]
    y = SK.softmax_forward(x, 1, log=False, max_one_pass_block=block)
    torch.testing.assert_close(y.double(), _ref_softmax(x, 1, False), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("offset", [0, 1, 3, 8])
def test_softmax_storage_offsets_share_a_cached_launch(interp, offset):
    buf = torch.randn(4 * 37 + 16, dtype=torch.float16)
    x = buf[offset:offset + 4 * 37].view(4, 37)
    for _ in range(2):
        y = fusedops.softmax(x, -1)
        torch.testing.assert_close(y.double(), _ref_softmax(x, 1, False), atol=2e-3, rtol=2e-3)


def test_softmax_gradcheck_float64(interp):
    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: fusedops.softmax(t, -1), (x,))
    assert torch.autograd.gradcheck(lambda t: fusedops.log_softmax(t, 0), (x,))


def test_layer_norm_gradcheck_float64(interp):
    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: fusedops.layer_norm(t[0], (7,), t[1], t[2], 1e-5), (x, w, b))


@pytest.mark.parametrize("make", [
    lambda: torch.randn(37).expand(4, 37),                       # rows stride 0
    lambda: torch.randn(4, 1).expand(4, 37),                     # columns stride 0
    lambda: torch.randn(4, 41)[:, 2:39],                         # sliced rows, odd N
    lambda: torch.randn(37, 4).t(),                              # transposed
    lambda: torch.randn(2, 3, 37)[:, 1:],                        # leading dims that do not merge
])
def test_layer_norm_strided_inputs(interp, make):
    x = make()
    w, b = torch.randn(37), torch.randn(37)
    for eps in (1e-5, 1e-1):        # eps is part of the cached launch's key
        for _ in range(2):
            xr = x.detach().clone().requires_grad_()
            wr, br = w.clone().requires_grad_(), b.clone().requires_grad_()
            y = fusedops.layer_norm(xr, (37,), wr, br, eps)
            ref = torch.nn.functional.layer_norm(x.double(), (37,), w.double(), b.double(), eps)
            torch.testing.assert_close(y.double(), ref, atol=1e-4, rtol=1e-4)
            dy = torch.randn_like(y)
            y.backward(dy)
            x64 = x.double().requires_grad_()
            w64, b64 = w.double().requires_grad_(), b.double().requires_grad_()
            torch.nn.functional.layer_norm(x64, (37,), w64, b64, eps).backward(dy.double())
            torch.testing.assert_close(xr.grad.double(), x64.grad, atol=1e-3, rtol=1e-3)
            torch.testing.assert_close(wr.grad.double(), w64.grad, atol=1e-3, rtol=1e-3)


def test_layer_norm_none_then_weight(interp):
    x = torch.randn(4, 37)
    w, b = torch.randn(37), torch.randn(37)
    for weight, bias in [(None, None), (w, b), (None, b), (w, None), (None, None)]:
        y = fusedops.layer_norm(x, (37,), weight, bias, 1e-5)
        ref = torch.nn.functional.layer_norm(x.double(), (37,), None if weight is None else weight.double(),
                                             None if bias is None else bias.double(), 1e-5)
        torch.testing.assert_close(y.double(), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("block", [None, 4, 16])
def test_softmax_upcast_output_odd_rows(interp, block):
    x = _special_rows(37, torch.float16)
    y = SK.softmax_forward(x, 1, log=False, dtype=torch.float32, max_one_pass_block=block)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double(), _ref_softmax(x, 1, False), atol=1e-3, rtol=1e-3, equal_nan=True)


@pytest.mark.parametrize("shape,dim", [((0, 5), 1), ((5, 0), 1), ((5, 0), 0), ((2, 37, 3), 1), ((3, 1), 1)])
def test_softmax_odd_shapes(interp, shape, dim):
    x = torch.randn(shape, requires_grad=True)
    y = fusedops.softmax(x, dim - x.dim())
    x64 = x.detach().double().requires_grad_()
    ref = torch.softmax(x64, dim)
    torch.testing.assert_close(y.double(), ref, atol=1e-5, rtol=1e-5)
    dy = torch.randn(shape)
    y.backward(dy)
    ref.backward(dy.double())
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-5, rtol=1e-5)


def test_layer_norm_zero_rows(interp):
    x = torch.randn(0, 37, requires_grad=True)
    w = torch.randn(37, requires_grad=True)
    y = fusedops.layer_norm(x, (37,), w, None, 1e-5)
    y.sum().backward()
    assert y.shape == (0, 37) and torch.equal(w.grad, torch.zeros(37))


# -- the kernel paths' remembered arguments and per-layout backward launches ---------------------------
# fusedops.scaled_dot_product_attention and fusedops.matmul remember the launches of arguments that took
# the kernel path, per argument layout (the checks and routing are skipped for arguments laid out the
# same way); each forward layout keeps the backward's launches per layout of the gradient and of the
# saved tensors, which a saved-tensor hook may lay out anew.
def _sdpa_reference(q, k, v, mask, do):
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    o = torch.nn.functional.scaled_dot_product_attention(*leaves, attn_mask=mask)
    o.backward(do.double())
    return [o.detach()] + [t.grad for t in leaves]


def test_sdpa_arguments_laid_out_like_known_ones_are_still_checked(interp, monkeypatch):
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    mask = torch.randn(1, 2, 5, 5)
    expected = fusedops.scaled_dot_product_attention(q, k, v, mask)
    assert torch.equal(fusedops.scaled_dot_product_attention(q, k, v, mask), expected)     # remembered
    with pytest.raises(RuntimeError, match="attn_mask dtype"):
        fusedops.scaled_dot_product_attention(q, k, v, mask.to(torch.int32))
    with pytest.raises(RuntimeError, match="same dtype"):
        fusedops.scaled_dot_product_attention(q, k.double(), v, mask)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        fusedops.scaled_dot_product_attention(q, k, v, mask, dropout_p=0.1)
    # a mask that needs a gradient takes torch's op, whose result is torch's to the bit
    trained = mask.clone().requires_grad_()
    assert torch.equal(fusedops.scaled_dot_product_attention(q, k, v, trained),
                       torch.nn.functional.scaled_dot_product_attention(q, k, v, trained))
    monkeypatch.delenv("FUSEDOPS_INTERPRET")                # CPU tensors: torch's op again
    assert torch.equal(fusedops.scaled_dot_product_attention(q, k, v, mask),
                       torch.nn.functional.scaled_dot_product_attention(q, k, v, mask))


def test_sdpa_saved_tensor_hooks_that_lay_tensors_out_anew(interp):
    # q in the (B, L, H, E) memory order of a transformer and an expanded (stride-0 heads) mask:
    # save_on_cpu gives both back contiguous.
    q = torch.randn(1, 5, 2, 8).transpose(1, 2)
    k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    mask = torch.rand(1, 1, 5, 5) > 0.3
    mask[..., 0] = True         # no fully masked row (their gradients differ from torch's by design)
    mask = mask.expand(1, 2, 5, 5)
    do = torch.randn(1, 2, 5, 8)
    expected = _sdpa_reference(q, k, v, mask, do)
    for hooks in (contextlib.nullcontext(), torch.autograd.graph.save_on_cpu(),
                  torch.autograd.graph.saved_tensors_hooks(lambda t: t.contiguous(), lambda t: t)):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        assert not leaves[0].is_contiguous()
        with hooks:
            o = fusedops.scaled_dot_product_attention(*leaves, mask)
        o.backward(do)
        for actual, reference in zip([o.detach()] + [t.grad for t in leaves], expected):
            torch.testing.assert_close(actual.double(), reference, atol=1e-4, rtol=1e-4)


def test_sdpa_double_backward_raises(interp):
    q, k, v = (torch.randn(1, 1, 3, 4, requires_grad=True) for _ in range(3))
    (dq,) = torch.autograd.grad(fusedops.scaled_dot_product_attention(q, k, v).square().sum(), q,
                                create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        dq.sum().backward()


@pytest.fixture
def kernel_launches(launches, monkeypatch):
    """The recorded launches of the mocked driver (test_launch_fast_path.launches), with the launches the
    kernel paths remember forgotten (made on another test's driver); CPU tensors take the kernel path
    (standing in for CUDA ones), matmuls on the cp.async kernel."""
    import fusedops.functional as functional
    from fusedops.autograd import attention as attention_autograd
    from fusedops.autograd import norms as norms_autograd
    from fusedops.autograd import softmax as softmax_autograd

    monkeypatch.setenv("FUSEDOPS_TMA", "0")
    monkeypatch.setattr(functional, "_matmul_runs_kernels", lambda a, out_dtype, bias: True)
    for cache in (MA._KNOWN_PRODUCTS, norms_autograd._KNOWN_LAUNCHES, softmax_autograd._KNOWN_LAUNCHES,
                  attention_autograd._KNOWN_LAUNCHES):
        cache.clear()
    return launches


def _masked(launch: tuple, **tensors) -> tuple:
    """_symbolic(launch, **tensors) with the addresses of other tensors (scratch, copies) as "?"."""
    name, grid, args = _symbolic(launch, **tensors)
    return name, grid, tuple("?" if isinstance(a, int) and a > 1 << 20 else a for a in args)


def _transposed(shape: tuple) -> torch.Tensor:
    """A float16 tensor of `shape` whose last two dims are transposed in memory (nn.Linear's weight.t())."""
    return torch.randn(*shape[:-2], shape[-1], shape[-2], dtype=torch.float16).transpose(-1, -2)


@pytest.mark.parametrize("a_shape, b_shape, b_transposed, prepared", [
    ((8, 16), (16, 24), False, True),
    ((8, 16), (16, 24), True, True),
    ((2, 8, 16), (16, 24), True, True),         # b shared by the batch: dB is one (K, rows) @ (rows, N)
    ((2, 8, 16), (2, 16, 24), False, True),
    ((2, 8, 16), (2, 16, 24), True, True),
    ((1, 8, 16), (2, 16, 24), False, False),    # a broadcast: dA is summed over the batch
    ((16,), (16, 24), False, False),            # a 1-D operand
], ids=str)
def test_matmul_gradient_launches_match_input_gradients(kernel_launches, monkeypatch, a_shape, b_shape,
                                                        b_transposed, prepared):
    general = []
    original = input_gradients
    counted = lambda *args: general.append(1) or original(*args)     # noqa: E731
    for module in (MA, matmul_reference):       # the Function's backward, and the exact-gradient path
        monkeypatch.setattr(module, "input_gradients", counted)
    a = torch.randn(a_shape, dtype=torch.float16, requires_grad=True)
    b = (_transposed(b_shape) if b_transposed else torch.randn(b_shape, dtype=torch.float16)).requires_grad_()
    for _ in range(2):      # the second step takes the remembered and prepared launches
        a.grad = b.grad = None
        c = fusedops.matmul(a, b)
        dc = torch.randn(c.shape, dtype=torch.float16)
        start, calls = len(kernel_launches), len(general)
        c.backward(dc)
        assert (len(general) == calls) == prepared      # input_gradients did not run in the backward
        ours = [_masked(launch, dz=dc, a=a, b=b) for launch in kernel_launches[start:]]
        start = len(kernel_launches)
        original(dc, a.detach(), b.detach(), (True, True, False), None, MA.forward_kernel)
        assert ours == [_masked(launch, dz=dc, a=a, b=b) for launch in kernel_launches[start:]]
    assert a.grad.shape == a.shape and b.grad.shape == b.shape


def test_matmul_gradient_launches_follow_the_saved_operands_layout(kernel_launches):
    # A saved-tensor hook that gives the transposed b back contiguous (as save_on_cpu(pin_memory=True)
    # does): the gradients' launches must read it so.
    a = torch.randn(8, 16, dtype=torch.float16, requires_grad=True)
    b = _transposed((16, 24)).requires_grad_()
    dc = torch.randn(8, 24, dtype=torch.float16)
    fusedops.matmul(a, b).backward(dc)        # the launches of the transposed b, prepared
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.contiguous(), lambda t: t):
        c = fusedops.matmul(a, b)
    start = len(kernel_launches)
    c.backward(dc)
    ours = [_masked(launch, dz=dc) for launch in kernel_launches[start:]]
    start = len(kernel_launches)
    input_gradients(dc, a.detach(), b.detach().contiguous(), (True, True, False), None, MA.forward_kernel)
    assert ours == [_masked(launch, dz=dc) for launch in kernel_launches[start:]]


@pytest.mark.cuda
@pytest.mark.parametrize("a_shape, b_shape, b_transposed", [
    ((64, 96), (96, 80), False), ((3, 33, 96), (96, 80), True), ((3, 33, 96), (3, 96, 80), True),
    ((1, 33, 96), (3, 96, 80), False), ((96,), (96, 80), True)], ids=str)
@pytest.mark.parametrize("hooks", ["none", "save_on_cpu"])
def test_gpu_matmul_gradients_every_layout(a_shape, b_shape, b_transposed, hooks):
    a = torch.randn(a_shape, dtype=torch.float16, device="cuda", requires_grad=True)
    b = (_transposed(b_shape) if b_transposed else torch.randn(b_shape, dtype=torch.float16)).cuda()
    b.requires_grad_()
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    c64 = torch.matmul(a64, b64)
    dc = torch.randn(c64.shape, dtype=torch.float16, device="cuda")
    c64.backward(dc.double())
    for _ in range(2):      # the second step takes the remembered and prepared launches
        a.grad = b.grad = None
        with torch.autograd.graph.save_on_cpu(pin_memory=True) if hooks == "save_on_cpu" else contextlib.nullcontext():
            c = fusedops.matmul(a, b)
        c.backward(dc)
        for actual, reference in ((c, c64), (a.grad, a64.grad), (b.grad, b64.grad)):
            torch.testing.assert_close(actual.double(), reference.detach(), atol=2e-2, rtol=2e-2)


@pytest.mark.cuda
@pytest.mark.parametrize("hooks", ["none", "save_on_cpu"])
def test_gpu_training_steps_take_the_remembered_launches(hooks):
    # Two steps of every op through autograd (the second one on the remembered launches), strided
    # inputs and expanded gradients included, against torch in float64.
    torch.manual_seed(0)
    x = torch.randn(16, 40, 24, dtype=torch.float16, device="cuda").transpose(1, 2)    # (16, 24, 40)
    w, bias = (torch.randn(40, dtype=torch.float16, device="cuda") for _ in range(2))
    q = torch.randn(2, 33, 4, 64, dtype=torch.float16, device="cuda").transpose(1, 2)
    k, v = (torch.randn(2, 4, 33, 64, dtype=torch.float16, device="cuda") for _ in range(2))
    cases = [
        (lambda t: fusedops.softmax(t[0], -1), lambda t: torch.softmax(t[0], -1), (x,)),
        (lambda t: fusedops.log_softmax(t[0], 1), lambda t: torch.log_softmax(t[0], 1), (x,)),
        (lambda t: fusedops.layer_norm(t[0], (40,), t[1], t[2]),
         lambda t: torch.nn.functional.layer_norm(t[0], (40,), t[1], t[2]), (x, w, bias)),
        (lambda t: fusedops.rms_norm(t[0], (40,), t[1]),
         lambda t: torch.nn.functional.rms_norm(t[0], (40,), t[1], torch.finfo(torch.float32).eps), (x, w)),
        (lambda t: fusedops.scaled_dot_product_attention(*t, is_causal=True),
         lambda t: torch.nn.functional.scaled_dot_product_attention(*t, is_causal=True), (q, k, v)),
    ]
    for ours, theirs, inputs in cases:
        for expanded in (False, True, False):
            leaves = [t.clone().requires_grad_() for t in inputs]
            references = [t.detach().double().requires_grad_() for t in inputs]
            expected = theirs(references)
            dy = torch.randn(expected.shape, dtype=torch.float16, device="cuda")
            if expanded:
                dy = dy[:1].expand(expected.shape)
            expected.backward(dy.double())
            with torch.autograd.graph.save_on_cpu(pin_memory=True) if hooks == "save_on_cpu" \
                    else contextlib.nullcontext():
                y = ours(leaves)
            y.backward(dy)
            torch.testing.assert_close(y.double(), expected.detach(), atol=2e-2, rtol=2e-2)
            for leaf, reference in zip(leaves, references):
                torch.testing.assert_close(leaf.grad.double(), reference.grad, atol=5e-2, rtol=5e-2)
