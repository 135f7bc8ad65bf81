"""Review (session 16): a demanding new user tried to break the public API on the CPU (the interpreter,
FUSEDOPS_INTERPRET=1 via the `interpret` fixture, which runs the kernel path CUDA tensors take, and the torch
fallback via the `fallback` fixture) with inputs modelled on peer projects' bug reports: 0-size and size-1
dims with odd strides, overlapping / expanded / channels_last views, special values, every mask dtype and
shape for SDPA and MultiheadAttention, GQA, scale=0, autocast, inference_mode, torch.compile(fullgraph),
torch.func transforms, module state_dict / pickle / deepcopy round-trips, argument spellings and error types.

Almost everything matched torch (or a float64 reference where torch's CPU kernel is itself wrong). The
defects found are below, each asserting torch's behaviour; all six were fixed the same session
(nn/softmax.py: no warning while dynamo traces; kernels/attention_logits.py `_held_in_range` / `base2_logits`;
nn/normalization.py RuntimeError; functional.py dtype=float and 0-d-only tensor dims; autograd/norms.py
0-d integer tensors in normalized_shape; autograd/arguments.py 0-d-only tensor floats).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.nn as fnn


# ================================================================================================
# Defect 1: torch.compile(fullgraph=True) of fusedops.nn.Softmax / LogSoftmax constructed without a dim
# (torch.nn.Softmax()'s default, dim=None, common in older models and kept by fusedops.nn.patch) fails with
# torch._dynamo.exc.Unsupported ("Dynamo does not know how to trace the Python builtin `_warnings.warn`"):
# fusedops/nn/softmax.py `_legacy_dim` calls warnings.warn itself. torch.nn.Softmax() compiles fullgraph
# (dynamo handles torch.nn.functional's own legacy-dim warning). So patching a model that compiled with
# fullgraph=True breaks its compilation. Both paths (the interpreter and the torch fallback) are affected.
# ================================================================================================
@pytest.mark.parametrize("mode", ["interpret", "fallback"])
@pytest.mark.parametrize("name", ["Softmax", "LogSoftmax"])
def test_softmax_module_without_dim_compiles_fullgraph(request, mode, name):
    request.getfixturevalue(mode)
    torch._dynamo.reset()
    x = torch.randn(3, 6, dtype=torch.float64)
    theirs = getattr(torch.nn, name)()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = torch.compile(theirs, fullgraph=True, backend="eager")(x)    # torch's module compiles
        torch._dynamo.reset()
        got = torch.compile(getattr(fnn, name)(), fullgraph=True, backend="eager")(x)
    torch.testing.assert_close(got, expected)


# ================================================================================================
# Defect 2: scaled_dot_product_attention returns NaN for logits (scale * q.k + mask) above
# finfo(float32).max / log2(e) ~= 2.36e38 (float32, also float64 at its max): the kernels move the logits
# to base 2 (times log2(e)) and that product overflows to +inf, then inf - inf = NaN. torch (and the float64
# math reference) give the finite softmax: all weight on the largest logit. Reached through a large positive
# additive float mask (e.g. torch.finfo(dtype).max as a "force attend" bias) or huge float32 q/k. The
# negative side (finfo.min masks) was made safe in earlier sessions; the positive side was not.
# ================================================================================================
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_attention_huge_positive_mask_is_not_nan(interpret, dtype):
    big = torch.finfo(dtype).max
    q = torch.randn(1, 1, 3, 4, dtype=dtype)
    k = torch.randn(1, 1, 4, 4, dtype=dtype)
    v = torch.randn(1, 1, 4, 4, dtype=dtype)
    mask = torch.zeros(3, 4, dtype=dtype)
    mask[0, 1] = big                        # row 0: all weight on key 1
    mask[1, 2] = 0.9 * big                  # 0.9 * max is still > max / log2(e)
    out = fusedops.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.isfinite(expected).all()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out[0, 0, :2], torch.stack((v[0, 0, 1], v[0, 0, 2])))


def test_attention_huge_float32_logits_are_not_nan(interpret):
    q = torch.full((1, 1, 1, 1), 1.8e19)
    k = torch.tensor([[[[1.8e19], [0.0], [-1.0]]]])        # logits 3.24e38, 0, -1.8e19 (all finite)
    v = torch.arange(3.0).reshape(1, 1, 3, 1)
    out = fusedops.scaled_dot_product_attention(q, k, v, scale=1.0)
    expected = F.scaled_dot_product_attention(q, k, v, scale=1.0)
    assert expected.item() == 0.0
    torch.testing.assert_close(out, expected)


# ================================================================================================
# Defect 3: fusedops.nn.LayerNorm / RMSNorm, drop-ins for torch.nn.LayerNorm / RMSNorm, raise ValueError for
# an input whose trailing dims are not normalized_shape (the most common LayerNorm mistake), and TypeError for
# an input of another dtype than the module's (float64 input, float32 module); torch.nn.LayerNorm / RMSNorm
# raise RuntimeError for both, so `except RuntimeError` around a model stops catching them. Session 13 fixed
# the same class of defect for fusedops.nn.Linear (which now raises RuntimeError); the norm modules were left.
# (fusedops/autograd/norms.py check_layer_norm_arguments / _check_input / _check_parameter.)
# ================================================================================================
@pytest.mark.parametrize("mode", ["interpret", "fallback"])
@pytest.mark.parametrize("case", ["LayerNorm_shape", "RMSNorm_shape", "LayerNorm_0d", "LayerNorm_dtype"])
def test_norm_modules_raise_torchs_runtime_error(request, mode, case):
    request.getfixturevalue(mode)
    name, what = case.split("_")
    x = {"shape": torch.randn(2, 5), "0d": torch.tensor(1.0), "dtype": torch.randn(2, 6, dtype=torch.float64)}[what]
    with pytest.raises(RuntimeError):
        getattr(torch.nn, name)(6)(x)
    with pytest.raises(RuntimeError):
        getattr(fnn, name)(6)(x)


# ================================================================================================
# Defect 4: fusedops.softmax / log_softmax reject a Python type as dtype (dtype=float, which torch maps to
# torch.float64, as everywhere in torch's argument parser): TypeError "argument 'dtype' must be a
# floating-point torch.dtype, got <class 'float'>". torch.softmax(x, 1, dtype=float) returns float64.
# ================================================================================================
@pytest.mark.parametrize("mode", ["interpret", "fallback"])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_dtype_given_as_python_float(request, mode, log):
    request.getfixturevalue(mode)
    x = torch.randn(3, 6)
    ours, theirs = (fusedops.log_softmax, torch.log_softmax) if log else (fusedops.softmax, torch.softmax)
    expected = theirs(x, 1, dtype=float)
    assert expected.dtype == torch.float64
    torch.testing.assert_close(ours(x, 1, dtype=float), expected)


# ================================================================================================
# Defect 5: fusedops.layer_norm / rms_norm reject a normalized_shape whose entries are 0-d integer tensors
# ([torch.tensor(6)], what shape arithmetic on tensors produces); torch's argument parser takes any
# __index__-able entry: F.layer_norm(x, [torch.tensor(6)]) works. fusedops/autograd/norms.py
# normalized_shape_tuple accepts numbers.Integral entries only ("normalized_shape must be an int or a
# sequence of ints").
# ================================================================================================
@pytest.mark.parametrize("mode", ["interpret", "fallback"])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_normalized_shape_of_0d_integer_tensors(request, mode, op):
    request.getfixturevalue(mode)
    x = torch.randn(3, 6)
    shape = [torch.tensor(6)]
    torch.testing.assert_close(getattr(fusedops, op)(x, shape), getattr(F, op)(x, shape))


# ================================================================================================
# Defect 6 (minor, too lenient): a one-element 1-D tensor is taken as softmax's dim (operator.index) and as
# layer_norm / rms_norm's eps (float()); torch rejects both with TypeError ("argument 'dim' must be int, not
# Tensor", "argument 'eps' must be float, not Tensor"), so a shape/indexing bug in user code that torch
# reports runs silently on fusedops. (dim: both paths, checked before routing; eps: the kernel path only.)
# ================================================================================================
@pytest.mark.parametrize("mode,call", [("interpret", "softmax_dim"), ("fallback", "softmax_dim"),
                                       ("interpret", "log_softmax_dim"), ("fallback", "log_softmax_dim"),
                                       ("interpret", "layer_norm_eps"), ("interpret", "rms_norm_eps")])
def test_one_element_tensors_as_dim_or_eps_are_rejected(request, mode, call):
    request.getfixturevalue(mode)
    x = torch.randn(3, 6)
    op, argument = call.rsplit("_", 1)
    if argument == "dim":
        args = (x, torch.tensor([1]))
    else:
        args = (x, (6,)) + ((None, None) if op == "layer_norm" else (None,)) + (torch.tensor([1e-5]),)
    torch_op = getattr(torch, op) if argument == "dim" else getattr(F, op)
    with pytest.raises(TypeError):
        torch_op(*args)
    with pytest.raises(TypeError):
        getattr(fusedops, op)(*args)
