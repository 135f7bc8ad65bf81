"""Review (session 27, matmul): a fresh reviewer tried to break fusedops.matmul, fusedops.nn.Linear (and its
functional fusedops.nn.linear.linear) and the custom operator torch.ops.fusedops.matmul against torch.matmul /
F.linear / torch.nn.Linear, on the CPU: the kernels in the NumPy interpreter (FUSEDOPS_INTERPRET=1, what CUDA
tensors take), torch's fallback (CPU tensors by default) and, where the GPU path has its own code, the prepared
launches of fusedops.autograd.matmul (session 26's `prepared` stand-in: autograd.matmul believes it is on a GPU,
the launches run matmul_into in the interpreter).

What was tried, with the peer bug reports the cases come from:
- torch.matmul's shape rules: 1-D x 1-D (0-d result), 1-D x N-D, N-D x 1-D, batch dims that broadcast (1 against
  n, missing dims, 4-D against 3-D), size-1 and size-0 M / N / K / batch (K = 0 gives zeros, or act(bias)),
  shapes that are not multiples of the interpreter's 16 x 16 x 16 tile, K = 1 (triton#934), ragged K
  (triton#630, triton#5990); the gradients of every operand reduced over broadcast batch dims (pytorch#1787,
  flashlight#760) and of 1-D operands (harvard-edge/cs249r_book#1781), with only some inputs needing grad.
- Layouts: expanded (stride 0) M or K dims, an overlapping as_strided operand, permuted 4-D operands that need
  a copy, stepped slices, a huge stride on a size-1 dim (int64 offsets: also compiled for sm_90a and assembled
  by ptxas), an expanded / strided bias; batches over the CUDA grid's y limit (MAX_GRID_Y lowered to 2 so that
  the interpreter splits a batch of 5 into slices).
- dtype rules: mixed operand dtypes (errors naming both), float64, integer / complex / bool operands
  (pytorch#72408 and pytorch#65133: torch.matmul multiplies integer tensors on the CPU; intel-extension-for-
  pytorch#609: an unclear error for them), CPU autocast in bfloat16 and float16 (float64 not cast; the backward
  in the autocast dtype, pytorch#105682), the activation epilogue at +-inf, NaN and large |z|.
- Errors: mismatched K, non-broadcastable batch dims, 0-d operands, non-tensor arguments, as torch's.
- nn.Linear: positional constructor arguments (bias, device, dtype), the same initialization under one seed,
  state_dict both ways, extra_repr, deepcopy, torch.save / load and pickle, meta device + to_empty +
  reset_parameters, in_features = 0 (pytorch#42082, pytorch#48152, the bias gradient of pytorch PR #190051),
  out_features = 0, batch 0 (pytorch#27619), in-place ops on the output of a 3-D input (a view of the Function's
  output), a stride-0 grad_output (apex#1601).
- Transforms: torch.func vmap / grad / jacrev / jvp, gradcheck with check_batched_grad and check_forward_ad,
  torch.ops.fusedops.matmul called directly (its own backward).

DEFECTS found (all fixed in session 27; their tests, strict xfails until then, now pass; defect 2's errors are
ValueErrors naming both shapes on both routes, and the operands are named input / other in every message):

1. Integer and complex operands raise instead of running torch's op. On the CPU torch.matmul / F.linear multiply
   int64 (and int32) and complex tensors; the README says "inputs the kernels do not take (CPU tensors, other
   dtypes) run torch's op, so the same code runs anywhere", and fusedops.nn.linear.linear already sends complex
   tensors to F.linear.
       a = torch.tensor([[2**30, 3], [5, -7]]); fusedops.matmul(a, a)
   expected: torch.matmul(a, a) (int64, exact); actual: TypeError "fusedops.matmul(): expected floating-point
   operands, got torch.int64". Same for complex64 (torch gives the complex product) and for
   fusedops.nn.linear.linear(int_x, int_w) (torch's F.linear gives the int64 result).
   Cause: fusedops/autograd/matmul_reference.py check_arguments refuses every non-floating dtype before the routing. Note
   for the fix: the fallback `reference` computes in _wide(dtype), i.e. float32 for every non-float64 dtype, so
   merely letting these dtypes through would round int64 products (2**30 * 2**30 is not exact in float32) and
   drop imaginary parts; they must reach torch.matmul in their own dtype (bias / activation / out_dtype aside).
   (Bool stays an error: torch raises too.)

2. Batch dims that do not broadcast give an error that names neither operand nor their shapes on the kernel
   route (the interpreter, and so CUDA tensors), and a different one from the fallback route's:
       fusedops.matmul(torch.randn(2, 3, 4), torch.randn(3, 4, 5))      # FUSEDOPS_INTERPRET=1
   expected: an error naming the operands or their shapes, as for a K mismatch ("fusedops.matmul(): shapes
   (2, 3, 4) and (3, 4, 5) cannot be multiplied ...") or torch's ("The size of tensor a (2) must match the size
   of tensor b (3) at non-singleton dimension 0"); actual: RuntimeError "Attempting to broadcast a dimension of
   length 3 at -1! Mismatching argument at index 1 had torch.Size([3]); but expected shape should be
   broadcastable to [2]" (the batch shapes only, and "at -1" for dim 0). Same from torch.ops.fusedops.matmul.
   Cause: check_arguments checks K and the bias but not the batch dims; the error comes from
   torch.broadcast_shapes in fusedops/autograd/matmul.py _operands (and library/matmul_ops.py _matmul_shape).

3. fusedops.nn.Linear (fusedops.nn.linear.linear) given a non-tensor weight or bias raises AttributeError
   naming neither argument:
       lin = fusedops.nn.Linear(3, 4); lin.weight = None; lin(torch.randn(2, 3))
   expected (torch.nn.Linear): TypeError "linear(): argument 'weight' (position 2) must be Tensor, not
   NoneType"; actual: AttributeError "'NoneType' object has no attribute 'layout'". A bias that is not a
   tensor (`del lin.bias; lin.bias = "x"`, or linear(x, w, [1., 2., 3., 4.])): AttributeError "... has no
   attribute 'dtype'" (torch: TypeError "linear(): argument 'bias' (position 3) must be Tensor, not str").
   Cause: fusedops/nn/linear.py linear reads weight.layout / bias.dtype before any type check (only `input`
   is checked).

4. fusedops.matmul does not take torch.matmul's argument names: torch.matmul(input=a, other=b) works,
   fusedops.matmul(input=a, other=b) raises TypeError "matmul() got an unexpected keyword argument 'input'"
   (its parameters are a and b), while the README says "The ops take torch's arguments" and every other public
   op (softmax, log_softmax, layer_norm, rms_norm, scaled_dot_product_attention) uses torch's names.
   Cause: the signature of fusedops/functional.py matmul (and the custom op's).

Checked and matching torch (plain tests): every shape rule above on the interpreter, fallback and prepared
routes, values and the gradients of every subset of a / b / bias (float64, tight tolerances); 16-bit values
within the DESIGN.md tolerances; the layouts; the grid-slice split of large batches; the activations at
+-inf / NaN / +-100 in float64; dtype and shape errors naming both dtypes or shapes; CPU autocast dtypes, values
and gradient dtypes; nn.Linear's constructor, initialization, state_dict, repr, deepcopy / pickle / torch.save,
meta device, zero-sized features and batches with gradients, in-place ops on 3-D outputs; torch.func
transforms and batched / forward-mode gradcheck; the custom operator called directly; PTX with an int64 stride.

Not reported (documented choices): shape / device errors are ValueError and operand dtype errors TypeError where
torch raises RuntimeError (fusedops.matmul's docstring lists them); a bias must be exactly (N,) and of a floating
dtype, the result has a's dtype whatever the bias's; double backward raises; torch.jit.script of
fusedops.nn.Linear fails (not claimed; torch.jit.trace works); the gradient of the relu epilogue at a NaN
pre-activation is 0 where torch passes the incoming gradient (NaN inputs, no defined gradient); torch's own
float32 gelu(inf) is NaN on this CPU where float64 gives inf (fusedops gives inf).
"""

from __future__ import annotations

import copy
import io
import math
import pickle

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.autograd.matmul as amm
import fusedops.kernels.matmul as kmm
from fusedops.kernels.matmul_configs import SMALL_CONFIG
from fusedops.kernels.matmul_kernels import matmul_kernel
import fusedops.library  # noqa: F401  (registers torch.ops.fusedops.*)
import fusedops.nn as fnn
from fusedops.nn.linear import linear as flinear
from helpers import assert_close
from test_review_session26_matmul import _gen, _randn, path, prepared  # noqa: F401  (path, prepared: fixtures)

D = torch.float64
ACT = {None: lambda z: z, "relu": F.relu, "gelu": F.gelu,
       "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"), "silu": F.silu}


@pytest.fixture(params=["interpret", "fallback"])
def route(request, monkeypatch):
    if request.param == "interpret":
        monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    else:
        monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)
    return request.param


def _reference(a, b, bias, activation):
    z = torch.matmul(a, b)
    return ACT[activation](z if bias is None else z + bias)


# ------------------------------------------------------------------------------------------------
# torch.matmul's shape rules: values and gradients, every route
# ------------------------------------------------------------------------------------------------
SHAPES = [
    ((5,), (5,)),                   # dot product: 0-d
    ((5,), (5, 3)),                 # 1-D x 2-D
    ((3, 5), (5,)),                 # 2-D x 1-D
    ((5,), (2, 5, 3)),              # 1-D x batched
    ((2, 3, 5), (5,)),              # batched x 1-D
    ((2, 1, 3, 5), (4, 5, 3)),      # 4-D x 3-D, batch 1 against 4
    ((1, 3, 5), (2, 5, 7)),         # a's batch of 1 broadcast
    ((3, 5), (2, 2, 5, 1)),         # 2-D x 4-D, N = 1
    ((4,), (3, 4, 1)),              # 1-D x batched, N = 1
    ((1, 1, 5), (3, 5, 1)),
    ((37, 45), (45, 29)),           # more than one 16 x 16 x 16 tile, none a power of two
    ((3, 1), (1, 64)),              # K = 1 (triton#934)
    ((2, 1, 0, 5), (3, 5, 2)),      # M = 0
    ((3, 0), (0, 4)),               # K = 0: zeros (or act(bias))
    ((0,), (0,)),                   # K = 0 dot product
    ((2, 3, 0), (0, 4)),
    ((4,), (0, 4, 3)),              # batch 0
    ((1, 1), (1, 1)),
]
NEEDS = [(True, True, True), (True, False, False), (False, True, False), (False, False, True)]


@pytest.mark.parametrize("case", range(len(SHAPES)), ids=lambda i: f"{SHAPES[i][0]}x{SHAPES[i][1]}")
def test_shape_rules_values_and_gradients(path, case):
    sa, sb = SHAPES[case]
    g = _gen(100 + case)
    a, b = _randn(g, *sa), _randn(g, *sb)
    n = sb[-1] if len(sb) > 1 else 1
    bias = _randn(g, n)
    for with_bias, activation in ((False, None), (True, "gelu")):
        bias_in = bias if with_bias else None
        for needs in NEEDS:
            if not with_bias and needs == (False, False, True):
                continue
            ours = [t.clone().requires_grad_(need) if t is not None else None
                    for t, need in zip((a, b, bias_in), needs)]
            theirs = [t.clone().requires_grad_(need) if t is not None else None
                      for t, need in zip((a, b, bias_in), needs)]
            y = fusedops.matmul(*ours, activation)
            yr = _reference(*theirs, activation)
            assert y.shape == yr.shape and y.dtype == yr.dtype, (case, needs, y.shape, yr.shape)
            assert torch.allclose(y, yr, rtol=1e-10, atol=1e-10), (case, needs)
            wanted = [t for t in ours if t is not None and t.requires_grad]
            wanted_r = [t for t in theirs if t is not None and t.requires_grad]
            go = _randn(_gen(7), *y.shape)
            grads = torch.autograd.grad(y, wanted, go)
            grads_r = torch.autograd.grad(yr, wanted_r, go)
            for x, r in zip(grads, grads_r):
                assert x.shape == r.shape and x.dtype == r.dtype, (case, needs, x.shape, r.shape)
                assert torch.allclose(x, r, rtol=1e-10, atol=1e-10), (case, needs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_16_and_32_bit_values_within_design_tolerances(route, dtype):
    g = _gen(5)
    for sa, sb in (((37, 45), (45, 29)), ((2, 1, 17, 33), (3, 33, 9)), ((33,), (2, 33, 9))):
        a, b, bias = _randn(g, *sa), _randn(g, *sb), _randn(g, sb[-1])
        for activation in (None, "silu"):
            y = fusedops.matmul(a.to(dtype), b.to(dtype), bias.to(dtype), activation)
            assert y.dtype == dtype
            # the reference from the rounded operands, in float64
            ref = _reference(a.to(dtype).double(), b.to(dtype).double(), bias.to(dtype).double(), activation)
            assert_close(y, ref, dtype, tol=5e-3 if dtype == torch.float16 else None)


def test_batches_over_the_grid_limit_are_sliced(monkeypatch):
    """matmul_into launches batches over MAX_GRID_Y in slices, broadcast operands (batch 1) unsliced: lowered to
    2 here, a batch of 5 takes three launches."""
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    monkeypatch.setattr(kmm, "MAX_GRID_Y", 2)
    g = _gen(11)
    for sa, sb in (((5, 3, 4), (5, 4, 2)), ((1, 3, 4), (5, 4, 2)), ((5, 3, 4), (4, 2)), ((4,), (5, 4, 2)),
                   ((5, 3, 4), (1, 4, 2))):
        a = _randn(g, *sa).requires_grad_()
        b = _randn(g, *sb).requires_grad_()
        bias = _randn(g, 2).requires_grad_()
        y = fusedops.matmul(a, b, bias, "silu")
        yr = F.silu(a @ b + bias)
        assert torch.allclose(y, yr, rtol=1e-10, atol=1e-12)
        for x, r in zip(torch.autograd.grad(y.sum(), [a, b, bias]), torch.autograd.grad(yr.sum(), [a, b, bias])):
            assert torch.allclose(x, r, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# layouts
# ------------------------------------------------------------------------------------------------
def _layouts(g):
    base = _randn(g, 20)
    return {
        "a expanded along K": (_randn(g, 4, 1).expand(4, 6), _randn(g, 6, 3), None),
        "a expanded along M": (_randn(g, 1, 6).expand(5, 6), _randn(g, 6, 3), None),
        "b one value": (_randn(g, 5, 6), torch.tensor(2.0, dtype=D).expand(6, 3), None),
        "a overlapping": (base.as_strided((5, 6), (1, 1)), _randn(g, 6, 3), None),
        "b overlapping": (_randn(g, 5, 6), base.as_strided((6, 3), (2, 1)), None),
        "a permuted 4-D": (_randn(g, 3, 5, 2, 6).permute(2, 0, 1, 3), _randn(g, 6, 4), None),
        "b permuted 4-D": (_randn(g, 2, 3, 5, 6), _randn(g, 3, 4, 6, 2).permute(3, 0, 2, 1), None),
        "stepped slices": (_randn(g, 10, 12)[::2, ::3], _randn(g, 4, 7)[:, ::2], None),
        "1-D strided": (_randn(g, 12)[::3], _randn(g, 8, 4)[::2], None),
        "1-D expanded": (torch.tensor(1.5, dtype=D).expand(4), _randn(g, 4, 3), None),
        "batch expanded": (_randn(g, 1, 3, 4).expand(5, 3, 4), _randn(g, 5, 4, 2), None),
        "huge stride on a size-1 M": (base[:4].as_strided((1, 4), (2 ** 40, 1)), _randn(g, 4, 3), None),
        "huge stride on a size-1 K": (base[:4].as_strided((4, 1), (1, 2 ** 40)), _randn(g, 1, 3), None),
        "huge batch stride": (base[:4].as_strided((1, 4, 1), (2 ** 35, 1, 2 ** 35)), _randn(g, 5, 1, 3), None),
        "bias expanded": (_randn(g, 3, 4), _randn(g, 4, 5), torch.tensor(0.5, dtype=D).expand(5)),
        "bias strided": (_randn(g, 3, 4), _randn(g, 4, 5), _randn(g, 10)[::2]),
    }


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_operand_layouts_read_in_place(route, dtype):
    for name, (a, b, bias) in _layouts(_gen(3)).items():
        a, b = a.to(dtype) if dtype != D else a, b.to(dtype) if dtype != D else b
        bias = None if bias is None else (bias.to(dtype) if dtype != D else bias)
        y = fusedops.matmul(a, b, bias, "gelu")
        ref = _reference(a.double(), b.double(), None if bias is None else bias.double(), "gelu")
        assert y.shape == ref.shape and y.dtype == dtype, name
        assert_close(y, ref, dtype)


def test_layout_gradients_reach_the_views_bases(route):
    """Gradients through expanded, permuted and sliced views of leaves (the view's backward sums or scatters)."""
    g = _gen(4)
    cases = [
        (lambda p: p.expand(5, 3, 4), (1, 3, 4), lambda q: q, (5, 4, 2)),
        (lambda p: p.permute(2, 0, 1, 3), (3, 5, 2, 6), lambda q: q, (6, 4)),
        (lambda p: p[::2, ::3], (10, 12), lambda q: q[:, ::2], (4, 7)),
        (lambda p: p, (4, 6), lambda q: q.expand(6, 3), (6, 1)),
    ]
    for view_a, shape_a, view_b, shape_b in cases:
        pa, pb = _randn(g, *shape_a), _randn(g, *shape_b)
        bias = _randn(g, view_b(pb).shape[-1])
        ours = [pa.clone().requires_grad_(), pb.clone().requires_grad_(), bias.clone().requires_grad_()]
        theirs = [pa.clone().requires_grad_(), pb.clone().requires_grad_(), bias.clone().requires_grad_()]
        y = fusedops.matmul(view_a(ours[0]), view_b(ours[1]), ours[2], "relu")
        yr = F.relu(view_a(theirs[0]) @ view_b(theirs[1]) + theirs[2])
        go = _randn(_gen(9), 1).expand(yr.shape)     # a stride-0 grad_output (apex#1601, pytorch#3303)
        for x, r in zip(torch.autograd.grad(y, ours, go), torch.autograd.grad(yr, theirs, go)):
            assert torch.allclose(x, r, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# activations at special values
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu"])
def test_activation_epilogue_at_special_values(route, activation):
    # float64: torch's own float32 CPU gelu gives NaN at +inf (its vectorized path), float64 gives inf
    z = torch.tensor([[math.inf], [-math.inf], [math.nan], [100.0], [-100.0], [-1e4], [0.0], [1e-300]], dtype=D)
    y = fusedops.matmul(z, torch.ones(1, 1, dtype=D), None, activation)
    ref = ACT[activation](z)
    assert torch.equal(y.isnan(), ref.isnan()), (y.flatten().tolist(), ref.flatten().tolist())
    finite = ~ref.isnan()
    assert torch.allclose(y[finite], ref[finite], rtol=1e-12, atol=1e-300)


# ------------------------------------------------------------------------------------------------
# dtype rules and errors
# ------------------------------------------------------------------------------------------------
def test_mixed_dtype_errors_name_both_dtypes(route):
    a, b = torch.randn(3, 4), torch.randn(4, 2, dtype=D)
    with pytest.raises(TypeError, match=r"torch\.float32.*torch\.float64"):
        fusedops.matmul(a, b)
    with pytest.raises(RuntimeError):    # torch's exception type for F.linear, naming both dtypes
        torch.nn.functional.linear(a.double(), b.t().float())
    with pytest.raises(RuntimeError, match=r"float32.*float64"):
        flinear(a.double(), b.t().float())
    lin = fnn.Linear(4, 2)
    with pytest.raises(RuntimeError, match=r"float32.*float64"):
        lin(torch.randn(3, 4, dtype=D))
    with pytest.raises(TypeError, match="bool"):     # torch: NotImplementedError "addmm_impl_cpu_" for 'Bool'
        fusedops.matmul(torch.ones(2, 2, dtype=torch.bool), torch.ones(2, 2, dtype=torch.bool))


def test_shape_errors_name_the_shapes(route):
    with pytest.raises(ValueError, match=r"\(3, 4\) and \(5, 6\)"):
        fusedops.matmul(torch.randn(3, 4), torch.randn(5, 6))
    with pytest.raises(ValueError, match=r"\(2, 3, 4\) and \(5,\)"):
        fusedops.matmul(torch.randn(2, 3, 4), torch.randn(5))
    with pytest.raises(ValueError, match="'input' is 0-d"):
        fusedops.matmul(torch.tensor(1.0), torch.randn(5, 5))
    with pytest.raises(ValueError, match="'other' is 0-d"):
        fusedops.matmul(torch.randn(5), torch.tensor(1.0))
    with pytest.raises(TypeError, match="'other' must be a torch.Tensor"):
        fusedops.matmul(torch.randn(2, 3), [[1.0], [2.0], [3.0]])
    with pytest.raises(ValueError, match="bias must be a 1-D tensor of 2 elements"):
        fusedops.matmul(torch.randn(3, 4), torch.randn(4, 2), torch.randn(3))
    with pytest.raises(RuntimeError, match="in_features"):
        fnn.Linear(3, 4)(torch.randn(2, 5))


def test_batch_mismatch_fallback_route_names_the_operands(monkeypatch):
    # (torch's RuntimeError "tensor a ... tensor b" until session 27; now the kernel route's error on both routes)
    monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)
    with pytest.raises(ValueError, match=r"\(2, 3, 4\) and \(3, 4, 5\).*do not broadcast"):
        fusedops.matmul(torch.randn(2, 3, 4), torch.randn(3, 4, 5))


@pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, torch.float16])
def test_cpu_autocast_dtypes_values_and_gradient_dtypes(route, autocast_dtype):
    """As torch's CPU autocast: float16/bfloat16/float32 operands run in the autocast dtype, float64 ones are not
    cast; the gradients reach the leaves in their own dtype, computed from autocast-dtype products
    (pytorch#105682: a bf16 autocast must not run the backward in fp16)."""
    g = _gen(21)
    for x_dtype in (torch.float32, torch.float64, torch.float16):
        a0, b0, bias0 = _randn(g, 3, 5, dtype=x_dtype), _randn(g, 5, 4, dtype=x_dtype), _randn(g, 4, dtype=x_dtype)
        ours = [t.clone().requires_grad_() for t in (a0, b0, bias0)]
        theirs = [t.clone().requires_grad_() for t in (a0, b0, bias0)]
        with torch.autocast("cpu", dtype=autocast_dtype):
            y = fusedops.matmul(ours[0], ours[1])
            yr = torch.matmul(theirs[0], theirs[1])
            yl = flinear(ours[0], ours[1].t(), ours[2])
            ylr = F.linear(theirs[0], theirs[1].t(), theirs[2])
        assert y.dtype == yr.dtype and yl.dtype == ylr.dtype, (x_dtype, y.dtype, yr.dtype, yl.dtype, ylr.dtype)
        work = yr.dtype
        # products of operands rounded to the autocast dtype, summed exactly: ours rounds once at the end
        ref = (a0.to(work).double() @ b0.to(work).double())
        assert_close(y, ref, work)
        grads = torch.autograd.grad((y.double().sum() + yl.double().sum()), ours)
        grads_r = torch.autograd.grad((yr.double().sum() + ylr.double().sum()), theirs)
        for x, r in zip(grads, grads_r):
            assert x.dtype == r.dtype == x_dtype
            assert_close(x, r.double(), work)


# ------------------------------------------------------------------------------------------------
# nn.Linear parity
# ------------------------------------------------------------------------------------------------
def test_linear_constructor_init_state_dict_and_repr():
    m = fnn.Linear(3, 4, False, "cpu", torch.float64, activation="gelu")
    assert m.bias is None and m.weight.dtype == torch.float64 and m.weight.shape == (4, 3)
    assert repr(m) == "Linear(in_features=3, out_features=4, bias=False, activation='gelu')"
    assert repr(fnn.Linear(3, 4)) == repr(torch.nn.Linear(3, 4))
    assert isinstance(m, torch.nn.Linear)
    torch.manual_seed(1)
    t = torch.nn.Linear(5, 6)
    torch.manual_seed(1)
    f = fnn.Linear(5, 6)
    assert torch.equal(t.weight, f.weight) and torch.equal(t.bias, f.bias)     # same initialization
    assert list(f.state_dict()) == list(t.state_dict()) == ["weight", "bias"]
    t.load_state_dict(f.state_dict())
    f.load_state_dict(torch.nn.Linear(5, 6).state_dict())
    weight = f.weight.detach().clone()
    f.reset_parameters()
    assert not torch.equal(weight, f.weight)
    with pytest.raises(ValueError, match="activation must be one of"):
        fnn.Linear(3, 4, activation="tanh")


def test_linear_copies_pickles_and_meta_device(route):
    m = fnn.Linear(3, 4, activation="silu").double()
    x = _randn(_gen(2), 2, 3)
    for clone in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert type(clone) is fnn.Linear and clone.activation == "silu"
        assert torch.allclose(clone(x), m(x), rtol=0, atol=0)
    buffer = io.BytesIO()
    torch.save(m, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert loaded.activation == "silu" and torch.equal(loaded(x), m(x))
    meta = fnn.Linear(3, 4, device="meta", activation="relu")
    assert meta(torch.empty(2, 3, device="meta")).shape == (2, 4)
    real = meta.to_empty(device="cpu")
    real.reset_parameters()
    y = real(torch.randn(2, 3))
    assert y.shape == (2, 4) and bool((y >= 0).all())


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors is a no-op")
@pytest.mark.parametrize("sizes", [(0, 5, (3, 0)), (0, 5, (0,)), (4, 1, (0, 4)), (4, 0, (2, 4)), (0, 5, (2, 3, 0)),
                                   (3, 2, (2, 0, 3)), (1, 7, (5, 1))])
def test_linear_empty_features_and_batches_with_gradients(route, sizes):
    """nn.Linear(0, k) (pytorch#42082, #48152: the output is the bias, whose gradient is the column sum of the
    incoming one, pytorch PR #190051), Linear(k, 0), a batch of 0 (pytorch#27619)."""
    in_features, out_features, shape = sizes
    torch.manual_seed(0)
    t = torch.nn.Linear(in_features, out_features).double()
    f = fnn.Linear(in_features, out_features).double()
    f.load_state_dict(t.state_dict())
    x = _randn(_gen(3), *shape)
    xt, xf = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, yr = f(xf), t(xt)
    assert y.shape == yr.shape and torch.allclose(y, yr, rtol=1e-12, atol=1e-12)
    go = _randn(_gen(4), *yr.shape)
    grads = torch.autograd.grad(y, [xf, f.weight, f.bias], go)
    grads_r = torch.autograd.grad(yr, [xt, t.weight, t.bias], go)
    for x_, r in zip(grads, grads_r):
        assert x_.shape == r.shape and torch.allclose(x_, r, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("activation", [None, "gelu"])
def test_linear_in_place_ops_on_outputs(route, activation):
    """The output of a 3-D (or 1-D) input is a reshape of the Function's output: in-place ops on it and the
    backward through them as torch's."""
    for shape in ((2, 3, 4), (4,)):
        f = fnn.Linear(4, 5, activation=activation).double()
        t = torch.nn.Linear(4, 5).double()
        t.load_state_dict(f.state_dict())
        x = _randn(_gen(6), *shape)
        xf, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
        y = f(xf)
        y.mul_(2)
        torch.relu_(y)
        yr = torch.relu(ACT[activation](t(xt)) * 2)
        assert torch.allclose(y, yr, rtol=1e-12, atol=1e-12)
        y.sum().backward()
        yr.sum().backward()
        assert torch.allclose(xf.grad, xt.grad) and torch.allclose(f.weight.grad, t.weight.grad)
        assert torch.allclose(f.bias.grad, t.bias.grad)


# ------------------------------------------------------------------------------------------------
# transforms, gradcheck, the custom operator
# ------------------------------------------------------------------------------------------------
# torch's own functorch / gradcheck internals call the deprecated torch.jit.script
_JIT_SCRIPT_DEPRECATED = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


@_JIT_SCRIPT_DEPRECATED
def test_torch_func_transforms(route):
    from torch.func import grad, jacrev, jvp, vmap

    g = _gen(8)
    a, b, bias, v = _randn(g, 4, 3, 5), _randn(g, 5, 2), _randn(g, 2), _randn(g, 5)
    assert torch.allclose(vmap(fusedops.matmul, in_dims=(0, None, None))(a, b, bias), a @ b + bias)
    assert torch.allclose(vmap(fusedops.matmul, in_dims=(1, None))(a, b), a.transpose(0, 1) @ b)
    bs = _randn(g, 3, 5, 2)
    assert torch.allclose(vmap(lambda m: fusedops.matmul(v, m))(bs), v @ bs)
    assert torch.allclose(jacrev(lambda u: fusedops.matmul(u, b, bias, "silu"))(v),
                          jacrev(lambda u: F.silu(u @ b + bias))(v))
    assert torch.allclose(grad(lambda c: fusedops.matmul(a, b, c, "relu").sum())(bias),
                          grad(lambda c: F.relu(a @ b + c).sum())(bias))
    tangent = torch.ones_like(a)
    assert torch.allclose(jvp(lambda x: fusedops.matmul(x, b), (a,), (tangent,))[1], tangent @ b)


@_JIT_SCRIPT_DEPRECATED
def test_gradcheck_batched_and_forward_mode(route):
    g = _gen(10)
    for sa, sb, activation in (((2, 1, 3, 4), (2, 4, 2), "gelu"), ((4,), (4,), None), ((4,), (2, 4, 3), "silu"),
                               ((3, 4), (4,), "gelu_tanh")):
        a = _randn(g, *sa).requires_grad_()
        b = _randn(g, *sb).requires_grad_()
        bias = _randn(g, sb[-1] if len(sb) > 1 else 1).requires_grad_()
        assert torch.autograd.gradcheck(lambda x, y, c: fusedops.matmul(x, y, c, activation), (a, b, bias),
                                        check_batched_grad=True, check_forward_ad=True)


def test_custom_operator_called_directly(route):
    op = torch.ops.fusedops.matmul
    g = _gen(12)
    for sa, sb, activation in (((2, 1, 3, 5), (4, 5, 2), "gelu"), ((5,), (5,), None), ((5,), (3, 5, 2), "relu"),
                               ((3, 5), (5,), "silu")):
        a, b = _randn(g, *sa), _randn(g, *sb)
        bias = _randn(g, sb[-1] if len(sb) > 1 else 1)
        ours = [t.clone().requires_grad_() for t in (a, b, bias)]
        theirs = [t.clone().requires_grad_() for t in (a, b, bias)]
        y = op(*ours, activation)
        yr = _reference(*theirs, activation)
        assert y.shape == yr.shape and torch.allclose(y, yr, rtol=1e-10, atol=1e-12)
        for x, r in zip(torch.autograd.grad(y.sum(), ours), torch.autograd.grad(yr.sum(), theirs)):
            assert torch.allclose(x, r, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match=r"\(3, 4\) and \(5, 6\)"):
        op(torch.randn(3, 4), torch.randn(5, 6))


def test_ptx_with_an_int64_stride_assembles(tmp_path, monkeypatch):
    """The kernel of a (1, K) view whose row stride needs int64 (a size-1 dim may have any stride), with a float32
    output and a stride-0 float32 bias, compiled for sm_90a and assembled by ptxas."""
    from fusedops.dsl.target.ptxas import assemble, ptxas_available
    import fusedops.dsl as dsl

    if not ptxas_available():
        pytest.skip("ptxas is not on the PATH")
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    x = torch.empty(16, dtype=torch.float16)
    c = torch.empty(16, dtype=torch.float32)
    bias = torch.empty(4, dtype=torch.float32)
    config = SMALL_CONFIG
    compiled = dsl.jit(matmul_kernel.fn).compile(
        c, x, x, bias, 1, 77, 45, 0, 2 ** 40, 1, 0, 1, 45, 77, 77, 1, 0, target="sm_90a",
        num_warps=config.num_warps, num_stages=config.num_stages, HAS_BIAS=True, ACTIVATION="relu",
        ACC=dsl.float32, **config.constexprs)
    ptx = compiled.asm["ptx"]
    assert ".s64" in ptx or ".u64" in ptx
    assemble(ptx, "sm_90a")


# ------------------------------------------------------------------------------------------------
# defect 1: integer and complex operands
# ------------------------------------------------------------------------------------------------
_INT_A = torch.tensor([[2 ** 30, 3, -1], [5, -7, 2 ** 29 + 1]])
_INT_B = torch.tensor([[2 ** 30 + 7, 1], [-3, 2 ** 28], [11, 2 ** 30 - 5]])


def test_integer_matmul_matches_torch(route):
    expected = torch.matmul(_INT_A, _INT_B)
    got = fusedops.matmul(_INT_A, _INT_B)
    assert got.dtype == torch.int64 and torch.equal(got, expected)     # exact: not through float32
    a32 = torch.tensor([[3, -7], [2 ** 12 + 1, 5]], dtype=torch.int32)      # no int32 overflow
    b32 = torch.tensor([[2 ** 12 - 3, 1], [-9, 2 ** 11]], dtype=torch.int32)
    got32 = fusedops.matmul(a32, b32)
    assert got32.dtype == torch.int32 and torch.equal(got32, torch.matmul(a32, b32))


def test_complex_matmul_matches_torch(route):
    g = _gen(13)
    a = torch.complex(_randn(g, 3, 4, dtype=torch.float32), _randn(g, 3, 4, dtype=torch.float32))
    b = torch.complex(_randn(g, 4, 2, dtype=torch.float32), _randn(g, 4, 2, dtype=torch.float32))
    got = fusedops.matmul(a, b)
    assert got.dtype == torch.complex64
    assert torch.allclose(got, torch.matmul(a, b), rtol=1e-5, atol=1e-5)


def test_complex_linear_runs_torch(route):
    g = _gen(14)
    x = torch.complex(_randn(g, 3, 4, dtype=torch.float32), _randn(g, 3, 4, dtype=torch.float32))
    w = torch.complex(_randn(g, 2, 4, dtype=torch.float32), _randn(g, 2, 4, dtype=torch.float32))
    assert torch.allclose(flinear(x, w), F.linear(x, w))


def test_integer_linear_matches_torch(route):
    expected = F.linear(_INT_A, _INT_B.t())
    got = flinear(_INT_A, _INT_B.t())
    assert got.dtype == torch.int64 and torch.equal(got, expected)


# ------------------------------------------------------------------------------------------------
# defect 2: non-broadcastable batch dims on the kernel route
# ------------------------------------------------------------------------------------------------
def _names_the_operands(message: str) -> bool:
    return ("(2, 3, 4)" in message and "(3, 4, 5)" in message) or ("tensor a" in message and "tensor b" in message)


def test_batch_mismatch_error_names_the_operands_on_the_kernel_route(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    a, b = torch.randn(2, 3, 4), torch.randn(3, 4, 5)
    for call in (lambda: fusedops.matmul(a, b), lambda: torch.ops.fusedops.matmul(a, b),
                 lambda: fusedops.matmul(a.requires_grad_(), b, torch.randn(5), "gelu")):
        with pytest.raises((ValueError, RuntimeError)) as error:
            call()
        assert _names_the_operands(str(error.value)), str(error.value)


# ------------------------------------------------------------------------------------------------
# defect 3: non-tensor weight / bias of nn.Linear
# ------------------------------------------------------------------------------------------------
def test_linear_non_tensor_weight_or_bias_raise_type_error_naming_it(route):
    x = torch.randn(2, 3)
    lin = fnn.Linear(3, 4)
    lin.weight = None       # allowed by Module.__setattr__ for a registered parameter
    with pytest.raises(TypeError, match="weight"):
        lin(x)
    lin = fnn.Linear(3, 4)
    del lin.bias
    lin.bias = "x"
    with pytest.raises(TypeError, match="bias"):
        lin(x)
    with pytest.raises(TypeError, match="weight"):
        flinear(x, [[1.0, 2.0, 3.0]])
    with pytest.raises(TypeError, match="bias"):
        flinear(x, torch.randn(4, 3), [1.0, 2.0, 3.0, 4.0])


def test_torch_linear_names_the_non_tensor_argument():
    """What torch.nn.Linear does in the cases of defect 3 (the oracle)."""
    lin = torch.nn.Linear(3, 4)
    lin.weight = None
    with pytest.raises(TypeError, match="argument 'weight'"):
        lin(torch.randn(2, 3))


# ------------------------------------------------------------------------------------------------
# defect 4: torch.matmul's argument names
# ------------------------------------------------------------------------------------------------
def test_matmul_takes_torch_argument_names(route):
    g = _gen(15)
    a, b = _randn(g, 3, 4), _randn(g, 4, 2)
    expected = torch.matmul(input=a, other=b)
    assert torch.allclose(fusedops.matmul(input=a, other=b), expected, rtol=1e-12, atol=1e-12)
    assert torch.allclose(fusedops.matmul(a, other=b), expected, rtol=1e-12, atol=1e-12)
