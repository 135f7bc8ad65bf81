"""Review (session 31, API): a demanding new user tried to break fusedops.layer_norm, fusedops.rms_norm,
fusedops.nn.LayerNorm and fusedops.nn.RMSNorm (forward and autograd) on the CPU, with the kernels running in the
NumPy interpreter (FUSEDOPS_INTERPRET=1: the path CUDA tensors take) and torch as the oracle (float64 references
from F.layer_norm / F.rms_norm on .double() inputs; torch's own dtypes, errors and NaN patterns).

Where the kernel path is expected, the fusedops call runs inside `_kernels_only()`, which makes
torch.nn.functional.layer_norm / rms_norm raise, so a silent fallback to torch's op fails the test.

What was checked (cases drawn from peer bug reports: Triton's layer-norm tutorial, Apex FusedLayerNorm /
FusedRMSNorm, flash-attn's layer_norm, Liger-Kernel, xformers, torch's own layer_norm / rms_norm issues):
- multi-dim normalized_shape (2-D and 3-D, permuted inputs), normalized_shape spellings (int, list, torch.Size);
- parameter dtypes against the input's: torch's CPU "mixed" LayerNorm (fp16 / bf16 input, fp32 weight and bias,
  also bias alone), every rms_norm weight dtype (output in x's dtype, gradients in each tensor's dtype), and the
  mismatches torch refuses (refused here too, naming both dtypes);
- CPU autocast (bfloat16 and float16): dtypes and values as torch's (layer_norm / rms_norm are not on torch's CPU
  autocast lists), eagerly and under torch.compile;
- rms_norm eps=None: float32's machine epsilon for fp16 / bf16 / fp32 inputs, float64's for float64 (what torch
  computes), at input scales where the eps choice moves the result; eps spelled as numpy scalars, 0-d tensors,
  int, bool;
- 0 rows, 0 columns, 0 x 0, one column, 1-D input;
- layouts: transposed, column-strided, expanded (stride 0 in rows and in columns), storage offsets, overlapping
  rows (unfold), permuted leading dims, channels_last; grad_output expanded / transposed / offset; weights strided,
  expanded, transposed (2-D), aliased (weight is bias, input is weight is bias);
- requires_grad subsets (x only, weight only, bias only, none), no_grad, inference_mode, retain_graph twice;
- double backward: raises a RuntimeError naming the op (never silently wrong); torch.func.hessian / jvp / vmap,
  forward-mode AD and autograd.functional.jacobian(vectorize=True) / is_grads_batched give torch's values;
- modules: state_dict both ways with torch.nn, repr / extra_repr, reset_parameters, elementwise_affine=False,
  bias=False, eps, device / dtype kwargs, deepcopy, load_state_dict(assign=True), meta-device init + to_empty,
  parametrizations, checkpointing and save_on_cpu;
- torch.compile of a model holding both modules (inductor; aot_eager with dynamic shapes and fullgraph);
- very wide rows (70000 columns: the looped path), more than 65535 rows, NaN / inf propagation, rows of large
  mean and small spread, determinism run to run (bitwise).

Result: no defect found in what this file covers (every test below is a plain pass asserting real values). Seen
but not reported, as documented or as torch is no better: the functional ops raise ValueError / TypeError where
torch raises RuntimeError / NotImplementedError (the modules raise RuntimeError); torch.jit.script of the modules
fails (tests/test_review_session13_nn.py); float32 rows whose variance overflows float32 (|x| ~ 1e19) are wrong
as torch's float32 op is. A GPU probe on one H200 (torch 2.11) of the same layouts, storage offsets 1..7 on
16-bit rows of 515..32761 columns, 70000 columns, 66000 / 70000 rows, CUDA autocast dtypes and CUDA's refusal of
mixed LayerNorm dtypes agreed with torch as well (not part of this file).
"""

from __future__ import annotations

import contextlib
import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.nn
from helpers import assert_close, random_tensor

F32_EPS = torch.finfo(torch.float32).eps
F64_EPS = torch.finfo(torch.float64).eps
HALF = [torch.float16, torch.bfloat16]


@contextlib.contextmanager
def _kernels_only():
    """torch's layer_norm / rms_norm raise inside: the fusedops call must take the kernel path."""
    def refuse(*args, **kwargs):
        raise AssertionError("fusedops fell back to torch's op where the kernels were expected")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.nn.functional, "layer_norm", refuse)
        patch.setattr(torch.nn.functional, "rms_norm", refuse)
        yield


def _leaves(tensors, double=False):
    out = []
    for t in tensors:
        if t is None:
            out.append(None)
        else:
            t = t.detach().double() if double else t.detach().clone()
            out.append(t.requires_grad_())
    return out


def _ours(op, x, ns, w, b, eps):
    if op == "layer_norm":
        return fusedops.layer_norm(x, ns, w, b, eps)
    return fusedops.rms_norm(x, ns, w, eps)


def _theirs(op, x, ns, w, b, eps):
    if op == "layer_norm":
        return F.layer_norm(x, ns, w, b, eps)
    return F.rms_norm(x, ns, w, eps)


def _check_against_float64(op, x, ns, w, b, dy, eps=1e-5, tol_dtype=None, kernels=True, reference_eps=None):
    """y and every gradient of fusedops' op against torch's float64, dtypes as the leaves'."""
    ours = _leaves((x, w, b))
    wide = _leaves((x, w, b), double=True)
    with (_kernels_only() if kernels else contextlib.nullcontext()):
        y = _ours(op, ours[0], ns, ours[1], ours[2], eps)
        grads = torch.autograd.grad(y, [t for t in ours if t is not None], dy)
    ref_eps = eps if reference_eps is None else reference_eps
    r = _theirs(op, wide[0], ns, wide[1], wide[2], ref_eps)
    ref_grads = torch.autograd.grad(r, [t for t in wide if t is not None], dy.double())
    tol_dtype = tol_dtype or x.dtype
    assert y.dtype == x.dtype and y.shape == x.shape and y.is_contiguous()
    assert_close(y, r.detach(), tol_dtype)
    for got, want, leaf in zip(grads, ref_grads, [t for t in ours if t is not None]):
        assert got.dtype == leaf.dtype and got.shape == leaf.shape
        assert_close(got, want, tol_dtype)
    return y


OPS = ["layer_norm", "rms_norm"]


# -- shapes ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape, ns", [((3, 4, 5), (4, 5)), ((2, 3, 4, 5), (3, 4, 5)), ((7,), (7,)),
                                       ((2, 3), (2, 3)), ((5, 1, 6), (1, 6))])
def test_multi_dim_and_1d_normalized_shapes(interpret, op, shape, ns, seed):
    x = random_tensor(shape, torch.float32, seed=seed)
    w = random_tensor(ns, torch.float32, seed=seed + 1) + 1
    b = random_tensor(ns, torch.float32, seed=seed + 2) if op == "layer_norm" else None
    dy = random_tensor(shape, torch.float32, seed=seed + 3)
    _check_against_float64(op, x, ns, w, b, dy)


@pytest.mark.parametrize("ns", [6, [6], torch.Size([6]), (6,)])
def test_normalized_shape_spellings(interpret, ns, seed):
    x = random_tensor((4, 6), torch.float32, seed=seed)
    with _kernels_only():
        y = fusedops.layer_norm(x, ns)
        z = fusedops.rms_norm(x, ns)
    assert_close(y, F.layer_norm(x.double(), (6,)), torch.float32)
    assert_close(z, F.rms_norm(x.double(), (6,), eps=F32_EPS), torch.float32)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", [(0, 8), (3, 0), (0, 0), (2, 0, 5)])
def test_empty_inputs(interpret, op, shape, seed):
    n = shape[-1]
    x = torch.randn(shape).requires_grad_()
    w = torch.randn(n).requires_grad_()
    b = torch.randn(n).requires_grad_() if op == "layer_norm" else None
    y = _ours(op, x, (n,), w, b, 1e-5)
    assert y.shape == x.shape and y.dtype == x.dtype
    y.backward(torch.randn(shape))
    assert x.grad.shape == x.shape
    # no rows: the parameters' gradients are exact zeros (sums over no rows), as torch's
    assert torch.equal(w.grad, torch.zeros(n))
    if b is not None:
        assert torch.equal(b.grad, torch.zeros(n))


def test_one_column_layer_norm_is_the_bias(interpret, seed):
    x = random_tensor((5, 1), torch.float32, seed=seed).requires_grad_()
    w = torch.randn(1).requires_grad_()
    b = torch.randn(1).requires_grad_()
    with _kernels_only():
        y = fusedops.layer_norm(x, (1,), w, b)
        dy = torch.rand(5, 1) + 0.5         # positive: the float32 sum has no cancellation
        dx, dw, db = torch.autograd.grad(y, (x, w, b), dy)
    assert torch.equal(y, b.detach().expand(5, 1))
    assert torch.equal(dx, torch.zeros(5, 1)) and torch.equal(dw, torch.zeros(1))
    assert_close(db, dy.double().sum(0), torch.float32)


def test_one_column_rms_norm(interpret, seed):
    x = random_tensor((6, 1), torch.float32, seed=seed)
    w = torch.randn(1)
    with _kernels_only():
        y = fusedops.rms_norm(x, (1,), w, 1e-5)
    assert_close(y, F.rms_norm(x.double(), (1,), w.double(), 1e-5), torch.float32)


# -- dtypes ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("with_weight", [True, False])
def test_layer_norm_cpu_mixed_half_input_float32_params(interpret, dtype, with_weight, seed):
    x = random_tensor((6, 33), dtype, seed=seed)
    w = random_tensor((33,), torch.float32, seed=seed + 1) + 1 if with_weight else None
    b = random_tensor((33,), torch.float32, seed=seed + 2)
    dy = random_tensor((6, 33), dtype, seed=seed + 3)
    y = _check_against_float64("layer_norm", x, (33,), w, b, dy, tol_dtype=dtype)
    # torch's CPU kernel takes this mix too and returns the input's dtype
    assert y.dtype == F.layer_norm(x, (33,), w, b).dtype == dtype


@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("w_dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_rms_norm_every_weight_dtype(interpret, x_dtype, w_dtype, seed):
    x = random_tensor((5, 24), x_dtype, seed=seed)
    w = (random_tensor((24,), torch.float64, seed=seed + 1, scale=0.5) + 1).to(w_dtype)
    dy = random_tensor((5, 24), x_dtype, seed=seed + 2)
    loosest = max([x_dtype, w_dtype], key=lambda d: {torch.float64: 0, torch.float32: 1, torch.float16: 2,
                                                      torch.bfloat16: 3}[d])
    y = _check_against_float64("rms_norm", x, (24,), w, None, dy, eps=1e-6, tol_dtype=loosest)
    assert y.dtype == F.rms_norm(x, (24,), w, 1e-6).dtype == x_dtype


@pytest.mark.parametrize("x_dtype, p_dtype", [(torch.float32, torch.bfloat16), (torch.float32, torch.float16),
                                              (torch.float64, torch.float32), (torch.float16, torch.bfloat16),
                                              (torch.float32, torch.float64)])
def test_layer_norm_param_dtype_mismatch_refused_like_torch(interpret, x_dtype, p_dtype):
    x = torch.randn(3, 8, dtype=x_dtype)
    w = torch.randn(8, dtype=p_dtype)
    with pytest.raises(RuntimeError):
        F.layer_norm(x, (8,), w, None)
    with pytest.raises(TypeError, match=str(p_dtype)) as info:
        fusedops.layer_norm(x, (8,), w, None)
    assert str(x_dtype) in str(info.value)
    with pytest.raises(RuntimeError):      # the module: torch's error class
        m = fusedops.nn.LayerNorm(8, dtype=p_dtype)
        m(x)


def test_layer_norm_half_input_float32_bias_only_backward(interpret, seed):
    # torch's own CPU backward refuses this combination ("expected scalar type Half but found Float"); fusedops
    # computes it: checked against float64.
    x = random_tensor((4, 16), torch.float16, seed=seed)
    b = random_tensor((16,), torch.float32, seed=seed + 1)
    dy = random_tensor((4, 16), torch.float16, seed=seed + 2)
    _check_against_float64("layer_norm", x, (16,), None, b, dy, tol_dtype=torch.float16)


@pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cls", ["LayerNorm", "RMSNorm"])
def test_cpu_autocast_like_torch(interpret, autocast_dtype, cls, seed):
    torch.manual_seed(seed)
    ours = getattr(fusedops.nn, cls)(32)
    theirs = getattr(torch.nn, cls)(32)
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_()
    ours.load_state_dict(theirs.state_dict())
    linear = torch.nn.Linear(32, 32)
    x = torch.randn(5, 32)
    with torch.autocast("cpu", dtype=autocast_dtype):
        h = linear(x)
        with _kernels_only():
            y = ours(h)
        r = theirs(h)
        y32 = ours(x)                   # a float32 input stays float32, as torch's
    assert h.dtype == autocast_dtype
    assert y.dtype == r.dtype == autocast_dtype and y32.dtype == torch.float32
    params = [p.double() for p in theirs.parameters()]
    if cls == "LayerNorm":
        reference = F.layer_norm(h.double(), (32,), *params)
    else:
        reference = F.rms_norm(h.double(), (32,), params[0], F32_EPS)
    assert_close(y, reference, autocast_dtype)


# -- eps ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_rms_norm_eps_none_is_float32_epsilon(interpret, dtype, seed):
    # mean(x^2) ~ 1e-7: float32's epsilon (1.2e-7) moves the result by ~half, float16's (9.8e-4) or bfloat16's
    # (7.8e-3) would shrink it ~100x, and eps=0 would leave it ~1: only the right eps passes.
    x = (random_tensor((4, 64), torch.float64, seed=seed) * 3e-4).to(dtype)
    with _kernels_only():
        y = fusedops.rms_norm(x, (64,))
        ym = fusedops.nn.RMSNorm(64, dtype=dtype)(x)
    reference = F.rms_norm(x.double(), (64,), eps=F32_EPS)
    assert_close(y, reference, dtype)
    assert_close(ym, reference, dtype)
    assert torch.equal(y, F.rms_norm(x, (64,)))


def test_rms_norm_eps_none_float64(interpret, seed):
    x = random_tensor((4, 16), torch.float64, seed=seed) * 1e-8
    with _kernels_only():
        y = fusedops.rms_norm(x, (16,))
    assert_close(y, F.rms_norm(x, (16,), eps=F64_EPS), torch.float64)
    # and eps = float32's epsilon would be far off here
    assert (y - F.rms_norm(x, (16,), eps=F32_EPS)).abs().max() > 0.1


@pytest.mark.parametrize("eps", [np.float32(1e-3), np.float64(1e-3), torch.tensor(1e-3), 1, True, 0.25])
@pytest.mark.parametrize("op", OPS)
def test_eps_spellings(interpret, op, eps, seed):
    x = random_tensor((3, 8), torch.float32, seed=seed) * 0.05
    with _kernels_only():
        y = _ours(op, x, (8,), None, None, eps)
    assert_close(y, _theirs(op, x.double(), (8,), None, None, float(eps)), torch.float32)


# -- layouts -----------------------------------------------------------------------------------------------------
def _layout(name, seed):
    g = torch.Generator().manual_seed(seed)
    if name == "transposed_2d_ns":
        return torch.randn(5, 7, 6, generator=g).transpose(1, 2), (6, 7)
    if name == "transposed_last":
        return torch.randn(6, 5, generator=g).t(), (6,)
    if name == "expanded_rows":
        return torch.randn(1, 9, generator=g).expand(4, 9), (9,)
    if name == "storage_offset":
        return torch.randn(100, generator=g)[3:43].view(5, 8), (8,)
    if name == "column_step_2":
        return torch.randn(5, 16, generator=g)[:, ::2], (8,)
    if name == "flipped":
        return torch.randn(5, 8, generator=g).flip(0), (8,)
    if name == "permuted_3d_ns":
        return torch.randn(2, 3, 4, 5, generator=g).permute(0, 3, 1, 2), (5, 3, 4)
    if name == "permuted_rows":
        return torch.randn(3, 4, 5, generator=g).permute(2, 0, 1), (4,)
    if name == "channels_last":
        return torch.randn(2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last), (5,)
    if name == "channels_last_3d_ns":
        return torch.randn(2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last), (3, 4, 5)
    raise ValueError(name)


LAYOUTS = ["transposed_2d_ns", "transposed_last", "expanded_rows", "storage_offset", "column_step_2", "flipped",
           "permuted_3d_ns", "permuted_rows", "channels_last", "channels_last_3d_ns"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_input_layouts(interpret, op, layout, seed):
    x, ns = _layout(layout, seed)
    w = random_tensor(ns, torch.float32, seed=seed + 1) + 1
    b = random_tensor(ns, torch.float32, seed=seed + 2) if op == "layer_norm" else None
    dy = random_tensor(x.shape, torch.float32, seed=seed + 3)
    _check_against_float64(op, x, ns, w, b, dy)


@pytest.mark.parametrize("op", OPS)
def test_expanded_columns_constant_rows(interpret, op, seed):
    x = random_tensor((4, 1), torch.float32, seed=seed).expand(4, 9)
    w = torch.randn(9).requires_grad_()
    xr = x.detach().clone().requires_grad_()
    dy = torch.randn(4, 9)
    with _kernels_only():
        y = _ours(op, xr, (9,), w, None, 1e-5)
        dx, dw = torch.autograd.grad(y, (xr, w), dy)
    wide = _leaves((x, w), double=True)
    r = _theirs(op, wide[0], (9,), wide[1], None, 1e-5)
    rdx, rdw = torch.autograd.grad(r, wide, dy.double())
    assert_close(y, r.detach(), torch.float32)
    assert_close(dx, rdx, torch.float32)
    if op == "layer_norm":      # xhat = 0 exactly: dweight is 0 (float64 gives ~1e-14 noise)
        assert dw.abs().max() <= 1e-6
    else:
        assert_close(dw, rdw, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n, step", [(9, 1), (16, 3), (17, 2)])
@pytest.mark.parametrize("op", OPS)
def test_overlapping_rows_unfold(interpret, op, dtype, n, step, seed):
    base = random_tensor((120,), dtype, seed=seed).requires_grad_()
    w = random_tensor((n,), dtype, seed=seed + 1)
    x = base.unfold(0, n, step)
    dy = random_tensor(x.shape, dtype, seed=seed + 2)
    with _kernels_only():
        y = _ours(op, x, (n,), w, None, 1e-5)
        (dbase,) = torch.autograd.grad(y, base, dy)
    wide = base.detach().double().requires_grad_()
    r = _theirs(op, wide.unfold(0, n, step), (n,), w.double(), None, 1e-5)
    (rbase,) = torch.autograd.grad(r, wide, dy.double())
    assert_close(y, r.detach(), dtype)
    assert_close(dbase, rbase, dtype)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("kind", ["expanded_row", "expanded_scalar", "transposed", "offset"])
def test_grad_output_layouts(interpret, op, kind, seed):
    g = torch.Generator().manual_seed(seed)
    dy = {"expanded_row": lambda: torch.randn(1, 9, generator=g).expand(4, 9),
          "expanded_scalar": lambda: torch.randn((), generator=g).expand(4, 9),
          "transposed": lambda: torch.randn(9, 4, generator=g).t(),
          "offset": lambda: torch.randn(50, generator=g)[5:41].view(4, 9)}[kind]()
    x = random_tensor((4, 9), torch.float32, seed=seed + 1)
    w = random_tensor((9,), torch.float32, seed=seed + 2) + 1
    b = random_tensor((9,), torch.float32, seed=seed + 3) if op == "layer_norm" else None
    _check_against_float64(op, x, (9,), w, b, dy)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("kind", ["strided", "expanded", "transposed_2d"])
def test_parameter_layouts(interpret, op, kind, seed):
    g = torch.Generator().manual_seed(seed)
    if kind == "strided":
        shape, ns = (4, 9), (9,)
        w, b = torch.randn(18, generator=g)[::2], torch.randn(9, 2, generator=g)[:, 1]
    elif kind == "expanded":
        shape, ns = (4, 9), (9,)
        w, b = torch.randn(1, generator=g).expand(9), torch.randn(1, generator=g).expand(9)
    else:
        shape, ns = (4, 3, 5), (3, 5)
        w, b = torch.randn(5, 3, generator=g).t(), torch.randn(5, 3, generator=g).t()
    x = torch.randn(shape, generator=g)
    dy = torch.randn(shape, generator=g)
    _check_against_float64(op, x, ns, w, b if op == "layer_norm" else None, dy)


def test_aliased_parameters(interpret, seed):
    p = random_tensor((8,), torch.float32, seed=seed).requires_grad_()
    x = random_tensor((5, 8), torch.float32, seed=seed + 1).requires_grad_()
    dy = random_tensor((5, 8), torch.float32, seed=seed + 2)
    with _kernels_only():
        y = fusedops.layer_norm(x, (8,), p, p)              # weight is bias
        dx, dp = torch.autograd.grad(y, (x, p), dy)
        z = fusedops.layer_norm(p, (8,), p, p)              # input is weight is bias
        (dz,) = torch.autograd.grad(z.sum(), p)
    xd, pd = _leaves((x, p), double=True)
    r = F.layer_norm(xd, (8,), pd, pd)
    rdx, rdp = torch.autograd.grad(r, (xd, pd), dy.double())
    assert_close(y, r.detach(), torch.float32)
    assert_close(dx, rdx, torch.float32)
    assert_close(dp, rdp, torch.float32)
    pd2 = p.detach().double().requires_grad_()
    rz = F.layer_norm(pd2, (8,), pd2, pd2)
    (rdz,) = torch.autograd.grad(rz.sum(), pd2)
    assert_close(z, rz.detach(), torch.float32)
    assert_close(dz, rdz, torch.float32)


# -- autograd ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["x", "weight", "bias", "weight_bias"])
def test_requires_grad_subsets(interpret, which, seed):
    x = random_tensor((6, 10), torch.float32, seed=seed)
    w = random_tensor((10,), torch.float32, seed=seed + 1) + 1
    b = random_tensor((10,), torch.float32, seed=seed + 2)
    dy = random_tensor((6, 10), torch.float32, seed=seed + 3)
    leaves = {"x": [x], "weight": [w], "bias": [b], "weight_bias": [w, b]}[which]
    for t in leaves:
        t.requires_grad_()
    with _kernels_only():
        y = fusedops.layer_norm(x, (10,), w, b)
        grads = torch.autograd.grad(y, leaves, dy)
    assert type(y.grad_fn).__name__ == "NormFunctionBackward"
    wide = {id(t): t.detach().double().requires_grad_(id(t) in {id(u) for u in leaves}) for t in (x, w, b)}
    r = F.layer_norm(wide[id(x)], (10,), wide[id(w)], wide[id(b)])
    ref = torch.autograd.grad(r, [wide[id(t)] for t in leaves], dy.double())
    for got, want in zip(grads, ref):
        assert_close(got, want, torch.float32)


def test_no_grad_paths(interpret, seed):
    x = random_tensor((3, 5), torch.float32, seed=seed)
    reference = F.layer_norm(x.double(), (5,))
    with _kernels_only():
        y = fusedops.layer_norm(x, (5,))
        assert not y.requires_grad and y.grad_fn is None
        with torch.no_grad():
            y2 = fusedops.layer_norm(x.clone().requires_grad_(), (5,))
        assert not y2.requires_grad
        with torch.inference_mode():
            y3 = fusedops.rms_norm(x, (5,))
        assert y3.is_inference()
        # an inference tensor as input of a differentiable call
        with torch.inference_mode():
            xi = x.clone()
        w = torch.ones(5, requires_grad=True)
        y4 = fusedops.layer_norm(xi, (5,), w, None)
        (dw,) = torch.autograd.grad(y4.sum(), w)
    for t in (y, y2, y4):
        assert_close(t, reference, torch.float32)
    assert_close(y3, F.rms_norm(x.double(), (5,), eps=F32_EPS), torch.float32)
    wd = torch.ones(5, dtype=torch.float64, requires_grad=True)
    (rdw,) = torch.autograd.grad(F.layer_norm(x.double(), (5,), wd, None).sum(), wd)
    assert_close(dw, rdw, torch.float32)


def test_retain_graph_twice(interpret, seed):
    x = random_tensor((3, 7), torch.float32, seed=seed).requires_grad_()
    dy = random_tensor((3, 7), torch.float32, seed=seed + 1)
    y = fusedops.rms_norm(x, (7,))
    y.backward(dy, retain_graph=True)
    first = x.grad.clone()
    y.backward(dy)
    assert torch.equal(x.grad, 2 * first)


@pytest.mark.parametrize("op", OPS)
def test_double_backward_raises_clearly(interpret, op, seed):
    x = random_tensor((3, 5), torch.float64, seed=seed).requires_grad_()
    w = random_tensor((5,), torch.float64, seed=seed + 1).requires_grad_()
    y = _ours(op, x, (5,), w, None, 1e-5)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        (g,) = torch.autograd.grad(y.pow(2).sum(), x, create_graph=True)
        torch.autograd.grad(g.sum(), w)


def test_func_transforms_match_torch(interpret, seed):
    x = random_tensor((3, 5), torch.float64, seed=seed)
    t = random_tensor((3, 5), torch.float64, seed=seed + 1)
    h = torch.func.hessian(lambda v: fusedops.layer_norm(v, (5,)).pow(3).sum())(x)
    hr = torch.func.hessian(lambda v: F.layer_norm(v, (5,)).pow(3).sum())(x)
    assert_close(h, hr, torch.float64)
    _, tangent = torch.func.jvp(lambda v: fusedops.rms_norm(v, (5,)), (x,), (t,))
    _, tangent_r = torch.func.jvp(lambda v: F.rms_norm(v, (5,)), (x,), (t,))
    assert_close(tangent, tangent_r, torch.float64)
    xs = random_tensor((4, 3, 5), torch.float64, seed=seed + 2)
    ws = random_tensor((4, 5), torch.float64, seed=seed + 3)
    v = torch.vmap(lambda a, b: fusedops.rms_norm(a, (5,), b))(xs, ws)
    assert_close(v, torch.vmap(lambda a, b: F.rms_norm(a, (5,), b))(xs, ws), torch.float64)
    import torch.autograd.forward_ad as fwad
    with fwad.dual_level():
        d = fwad.make_dual(x, t)
        out = fwad.unpack_dual(fusedops.layer_norm(d, (5,))).tangent
    assert_close(out, torch.func.jvp(lambda v: F.layer_norm(v, (5,)), (x,), (t,))[1], torch.float64)


def test_vectorized_jacobian_and_batched_grads(interpret, seed):
    x = random_tensor((2, 3, 4), torch.float64, seed=seed)
    w = random_tensor((3, 4), torch.float64, seed=seed + 1)
    b = random_tensor((3, 4), torch.float64, seed=seed + 2)
    jac = torch.autograd.functional.jacobian(lambda *a: fusedops.layer_norm(a[0], (3, 4), a[1], a[2]), (x, w, b),
                                             vectorize=True)
    ref = torch.autograd.functional.jacobian(lambda *a: F.layer_norm(a[0], (3, 4), a[1], a[2]), (x, w, b),
                                             vectorize=True)
    for got, want in zip(jac, ref):
        assert_close(got, want, torch.float64)
    # mixed precision, is_grads_batched (the backward under vmap)
    xb = random_tensor((3, 8), torch.bfloat16, seed=seed + 3).requires_grad_()
    wb = random_tensor((8,), torch.float32, seed=seed + 4).requires_grad_()
    bb = random_tensor((8,), torch.float32, seed=seed + 5).requires_grad_()
    v = random_tensor((4, 3, 8), torch.bfloat16, seed=seed + 6)
    grads = torch.autograd.grad(fusedops.layer_norm(xb, (8,), wb, bb), (xb, wb, bb), v, is_grads_batched=True)
    wide = _leaves((xb, wb, bb), double=True)
    refs = torch.autograd.grad(F.layer_norm(wide[0], (8,), wide[1], wide[2]), wide, v.double(),
                               is_grads_batched=True)
    for got, want, dtype in zip(grads, refs, (torch.bfloat16, torch.float32, torch.float32)):
        assert got.dtype == dtype
        assert_close(got, want, torch.bfloat16)


def test_checkpoint_and_saved_tensor_hooks(interpret, seed):
    from torch.utils.checkpoint import checkpoint
    m = fusedops.nn.LayerNorm(8)
    with torch.no_grad():
        m.weight.normal_()
        m.bias.normal_()
    x = random_tensor((4, 8), torch.float32, seed=seed)
    dy = random_tensor((4, 8), torch.float32, seed=seed + 1)
    xd = x.double().requires_grad_()
    (ref,) = torch.autograd.grad(F.layer_norm(xd, (8,), m.weight.double(), m.bias.double()), xd, dy.double())
    for reentrant in (False, True):
        xr = x.clone().requires_grad_()
        y = checkpoint(m, xr, use_reentrant=reentrant)
        y.backward(dy)
        assert_close(xr.grad, ref, torch.float32)
    xr = x.clone().requires_grad_()
    with torch.autograd.graph.save_on_cpu():
        y = m(xr)
    y.backward(dy)
    assert_close(xr.grad, ref, torch.float32)


# -- modules -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{}, {"elementwise_affine": False}, {"bias": False}, {"eps": 1e-3},
                                    {"dtype": torch.float64}, {"device": "cpu", "dtype": torch.bfloat16}])
def test_layer_norm_module_like_torch(interpret, kwargs, seed):
    torch.manual_seed(seed)
    theirs = torch.nn.LayerNorm((3, 4), **kwargs)
    ours = fusedops.nn.LayerNorm((3, 4), **kwargs)
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_()
    ours.load_state_dict(theirs.state_dict())
    assert repr(ours) == repr(theirs) and ours.extra_repr() == theirs.extra_repr()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert isinstance(ours, torch.nn.LayerNorm)
    dtype = kwargs.get("dtype", torch.float32)
    x = random_tensor((2, 3, 4), dtype, seed=seed)
    with _kernels_only():
        y = ours(x)
    params = [p.double() for p in theirs.parameters()] if kwargs.get("elementwise_affine", True) else []
    weight = params[0] if params else None
    bias = params[1] if len(params) > 1 else None
    assert y.dtype == theirs(x).dtype
    assert_close(y, F.layer_norm(x.double(), (3, 4), weight, bias, kwargs.get("eps", 1e-5)), dtype)
    # and back: torch's module loads ours
    back = torch.nn.LayerNorm((3, 4), **kwargs)
    back.load_state_dict(ours.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(back.parameters(), theirs.parameters()))


@pytest.mark.parametrize("kwargs", [{}, {"elementwise_affine": False}, {"eps": 1e-3}, {"eps": None},
                                    {"dtype": torch.float64}, {"device": "cpu", "dtype": torch.float16}])
def test_rms_norm_module_like_torch(interpret, kwargs, seed):
    torch.manual_seed(seed)
    theirs = torch.nn.RMSNorm([3, 4], **kwargs)
    ours = fusedops.nn.RMSNorm([3, 4], **kwargs)
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_()
    ours.load_state_dict(theirs.state_dict())
    assert repr(ours) == repr(theirs)
    assert isinstance(ours, torch.nn.RMSNorm)
    dtype = kwargs.get("dtype", torch.float32)
    x = random_tensor((2, 3, 4), dtype, seed=seed).requires_grad_()
    with _kernels_only():
        y = ours(x)
        y.sum().backward()
    eps = kwargs.get("eps")
    eps = (F64_EPS if dtype == torch.float64 else F32_EPS) if eps is None else eps
    weight = theirs.weight.double() if theirs.weight is not None else None
    assert y.dtype == dtype
    assert_close(y, F.rms_norm(x.detach().double(), (3, 4), weight, eps), dtype)
    if ours.weight is not None:
        xd = x.detach().double()
        wd = theirs.weight.detach().double().requires_grad_()
        (ref,) = torch.autograd.grad(F.rms_norm(xd, (3, 4), wd, eps).sum(), wd)
        assert_close(ours.weight.grad, ref, dtype)


def test_module_reset_copy_assign_meta(interpret, seed):
    m = fusedops.nn.LayerNorm(5)
    with torch.no_grad():
        m.weight.normal_()
        m.bias.normal_()
    m.reset_parameters()
    assert torch.equal(m.weight, torch.ones(5)) and torch.equal(m.bias, torch.zeros(5))
    r = fusedops.nn.RMSNorm(5)
    with torch.no_grad():
        r.weight.normal_()
    c = copy.deepcopy(r)
    assert type(c) is fusedops.nn.RMSNorm and torch.equal(c.weight, r.weight)
    x64 = random_tensor((2, 5), torch.float64, seed=seed)
    t = torch.nn.RMSNorm(5, dtype=torch.float64)
    with torch.no_grad():
        t.weight.normal_()
    c.load_state_dict(t.state_dict(), assign=True)
    assert c.weight.dtype == torch.float64
    with _kernels_only():
        y64 = c(x64)
    assert_close(y64, F.rms_norm(x64, (5,), t.weight.detach(), F64_EPS), torch.float64)
    with torch.device("meta"):
        lazy = fusedops.nn.LayerNorm(5)
    lazy.to_empty(device="cpu")
    lazy.reset_parameters()
    x = random_tensor((2, 5), torch.float32, seed=seed + 1)
    with _kernels_only():
        y = lazy(x)
    assert_close(y, F.layer_norm(x.double(), (5,)), torch.float32)


def test_module_with_parametrized_weight(interpret, seed):
    import torch.nn.utils.parametrize as parametrize

    class Double(torch.nn.Module):
        def forward(self, w):
            return 2 * w

    ours, theirs = fusedops.nn.LayerNorm(6), torch.nn.LayerNorm(6)
    for m in (ours, theirs):
        parametrize.register_parametrization(m, "weight", Double())
    with torch.no_grad():
        theirs.parametrizations.weight.original.normal_()
    ours.load_state_dict(theirs.state_dict())
    x = random_tensor((3, 6), torch.float32, seed=seed)
    with _kernels_only():
        y = ours(x)
        y.sum().backward()
    wd = theirs.parametrizations.weight.original.detach().double().requires_grad_()
    r = F.layer_norm(x.double(), (6,), 2 * wd, theirs.bias.detach().double())
    r.sum().backward()
    assert_close(y, r.detach(), torch.float32)
    assert_close(ours.parametrizations.weight.original.grad, wd.grad, torch.float32)


# -- torch.compile -----------------------------------------------------------------------------------------------
def test_compile_model_with_both_modules(interpret, reset_dynamo, seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), fusedops.nn.LayerNorm(8), torch.nn.ReLU(),
                                fusedops.nn.RMSNorm(8))
    x = random_tensor((4, 8), torch.float32, seed=seed).requires_grad_()
    compiled = torch.compile(model)
    y = compiled(x)
    y.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    expected = model(x)
    expected.sum().backward()
    assert_close(y, expected.detach(), torch.float32)
    assert_close(grad, x.grad, torch.float32)


def test_compile_dynamic_fullgraph_against_float64(interpret, reset_dynamo, seed):
    def f(x, w, b):
        return fusedops.layer_norm(x.transpose(1, 2), (5, 4), w, b) + fusedops.rms_norm(x.transpose(1, 2), (5, 4), w)

    compiled = torch.compile(f, dynamic=True, fullgraph=True, backend="aot_eager")
    for batch in (2, 3, 6):
        x = random_tensor((batch, 4, 5), torch.float32, seed=seed + batch).requires_grad_()
        w = random_tensor((5, 4), torch.float32, seed=seed + 1).requires_grad_()
        b = random_tensor((5, 4), torch.float32, seed=seed + 2).requires_grad_()
        dy = random_tensor((batch, 5, 4), torch.float32, seed=seed + 3)
        y = compiled(x, w, b)
        grads = torch.autograd.grad(y, (x, w, b), dy)
        wide = _leaves((x, w, b), double=True)
        xt = wide[0].transpose(1, 2)
        r = F.layer_norm(xt, (5, 4), wide[1], wide[2]) + F.rms_norm(xt, (5, 4), wide[1], F32_EPS)
        refs = torch.autograd.grad(r, wide, dy.double())
        assert_close(y, r.detach(), torch.float32)
        for got, want in zip(grads, refs):
            assert_close(got, want, torch.float32)


def test_compile_mixed_precision_module(interpret, reset_dynamo, seed):
    m = fusedops.nn.LayerNorm(8)
    with torch.no_grad():
        m.weight.normal_()
        m.bias.normal_()
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    x = random_tensor((4, 8), torch.bfloat16, seed=seed).requires_grad_()
    y = compiled(x)
    y.sum().backward()
    assert y.dtype == torch.bfloat16 and m.weight.grad.dtype == torch.float32
    assert_close(y, F.layer_norm(x.detach().double(), (8,), m.weight.double(), m.bias.double()), torch.bfloat16)


# -- sizes, values, determinism ----------------------------------------------------------------------------------
@pytest.mark.parametrize("op, dtype", [("layer_norm", torch.float32), ("rms_norm", torch.bfloat16),
                                       ("layer_norm", torch.float16)])
def test_very_wide_rows(interpret, op, dtype, seed):
    n = 70000
    x = random_tensor((2, n), dtype, seed=seed)
    if dtype == torch.float16:
        x = (x.float() + 30).half()         # a mean far from 0
    w = random_tensor((n,), dtype, seed=seed + 1)
    b = random_tensor((n,), dtype, seed=seed + 2) if op == "layer_norm" else None
    dy = random_tensor((2, n), dtype, seed=seed + 3)
    _check_against_float64(op, x, (n,), w, b, dy)


@pytest.mark.parametrize("op", OPS)
def test_more_than_65535_rows(interpret, op, seed):
    rows = 65537
    x = random_tensor((rows, 3), torch.float32, seed=seed)
    w = random_tensor((3,), torch.float32, seed=seed + 1) + 1
    b = random_tensor((3,), torch.float32, seed=seed + 2) if op == "layer_norm" else None
    dy = random_tensor((rows, 3), torch.float32, seed=seed + 3)
    ours = _leaves((x, w, b))
    with _kernels_only():
        y = _ours(op, ours[0], (3,), ours[1], ours[2], 1e-5)
        grads = torch.autograd.grad(y, [t for t in ours if t is not None], dy)
    wide = _leaves((x, w, b), double=True)
    r = _theirs(op, wide[0], (3,), wide[1], wide[2], 1e-5)
    refs = torch.autograd.grad(r, [t for t in wide if t is not None], dy.double())
    assert_close(y, r.detach(), torch.float32)
    # the last rows (past 65535 programs) on their own
    assert_close(y[-3:], r.detach()[-3:], torch.float32)
    # dx of 3-column rows cancels badly in some rows: torch's own float32 error is the bar there
    tx = x.clone().requires_grad_()
    t = _theirs(op, tx, (3,), w, b, 1e-5)
    (tdx,) = torch.autograd.grad(t, tx, dy)
    err, torch_err = (grads[0].double() - refs[0]).norm(), (tdx.double() - refs[0]).norm()
    assert err <= 2 * torch_err + 1e-6 * refs[0].norm()
    for got, want in zip(grads[1:], refs[1:]):
        assert_close(got, want, torch.float32)


@pytest.mark.parametrize("op", OPS)
def test_nonfinite_inputs_propagate_like_torch(interpret, op, seed):
    x = random_tensor((4, 6), torch.float32, seed=seed)
    x[0, 2] = float("nan")
    x[1, 3] = float("inf")
    x[2, 0] = float("-inf")
    with _kernels_only():
        y = _ours(op, x, (6,), None, None, 1e-5)
    r = _theirs(op, x.double(), (6,), None, None, 1e-5)
    assert torch.equal(torch.isnan(y), torch.isnan(r))
    assert_close(y, r, torch.float32)
    # the finite row is untouched
    assert_close(y[3], r[3], torch.float32)


@pytest.mark.parametrize("mean, spread", [(1e6, 1e-2), (1e7, 1.0), (1e3, 1e-4)])
def test_large_mean_small_spread(interpret, mean, spread, seed):
    x = random_tensor((4, 1000), torch.float64, seed=seed) * spread + mean
    x32 = x.float()
    with _kernels_only():
        y = fusedops.layer_norm(x32, (1000,))
    # fusedops keeps float32 accuracy (torch's float32 CPU op is off by up to ~0.1 here)
    assert_close(y, F.layer_norm(x32.double(), (1000,)), torch.float32)


def test_deterministic_run_to_run(interpret, seed):
    x = random_tensor((3000, 24), torch.float32, seed=seed)
    w = random_tensor((24,), torch.float32, seed=seed + 1).requires_grad_()
    b = random_tensor((24,), torch.float32, seed=seed + 2).requires_grad_()
    dy = random_tensor((3000, 24), torch.float32, seed=seed + 3)
    runs = []
    for _ in range(2):
        xr = x.clone().requires_grad_()
        with _kernels_only():
            y = fusedops.layer_norm(xr, (24,), w, b)
            grads = torch.autograd.grad(y, (xr, w, b), dy)
        runs.append((y,) + grads)
    for a, c in zip(*runs):
        assert torch.equal(a, c)
    wide = _leaves((x, w, b), double=True)
    refs = torch.autograd.grad(F.layer_norm(wide[0], (24,), wide[1], wide[2]), wide, dy.double())
    for got, want in zip(runs[0][1:], refs):
        assert_close(got, want, torch.float32)
