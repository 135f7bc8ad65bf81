"""Review (session 24): unusual kinds of tensors through the public ops and fusedops.nn modules.

Both CPU routes (`route` fixture: the kernels in the interpreter, what CUDA tensors take, and torch's
fallback) are checked against float64 torch. Passing tests pin tricky cases that work; the defects found
(fixed in the same session: a dispatch mode or a non-device function mode routes every op to torch's,
fusedops/functional.py `needs_torch`; the interpreter route takes its float dtypes only,
library/common.py INTERPRETER_DTYPES):

1. Under an active TorchFunctionMode / TorchDispatchMode (a user mode, torch.utils.flop_counter's
   FlopCounterMode) the kernel route never shows the op to the mode: a TorchFunctionMode that overrides
   torch.softmax is honoured by torch (and by fusedops' own fallback route) but bypassed by the kernel
   route, and FlopCounterMode counts 0 FLOPs for fusedops.matmul (torch.matmul: 2*M*N*K).
2. float8 tensors (torch.float8_e4m3fn, ...; `is_floating_point()` is True) reach the interpreter's kernels,
   which fail with an internal error naming a kernel pointer ("argument `c_ptr` of kernel `matmul_kernel`:
   torch dtype torch.float8_e4m3fn has no fusedops.dsl equivalent"): fusedops.matmul (float8 operands, a
   float8 bias or out_dtype) where torch.matmul and fusedops' fallback route compute the product, and
   softmax / scaled_dot_product_attention, whose error names neither the op nor the argument.

(torch.jit.script of fusedops.nn modules also fails; that is tests/test_review_session13_nn.py's known
defect, not repeated here.)
"""

from __future__ import annotations

import copy
import io
import pickle
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.nn as fnn

F64 = torch.float64


def _close(actual, expected, atol=1e-5, rtol=1e-4):
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=rtol, equal_nan=True)


# ------------------------------------------------------------------------------------------------
# memory layouts: storage offsets, overlapping / zero strides, channels_last, huge strides
# ------------------------------------------------------------------------------------------------
def _all_ops(x):
    """(fusedops result, float64 torch reference) for every op on x (rank >= 2, last dim n)."""
    n = x.shape[-1]
    x64 = x.double()
    q = x.reshape(1, *x.shape) if x.dim() == 2 else x
    q64 = q.double()
    return [
        (fusedops.softmax(x, -1), torch.softmax(x64, -1)),
        (fusedops.softmax(x, 0), torch.softmax(x64, 0)),
        (fusedops.log_softmax(x, -2), torch.log_softmax(x64, -2)),
        (fusedops.layer_norm(x, (n,)), F.layer_norm(x64, (n,))),
        (fusedops.rms_norm(x, (n,)), F.rms_norm(x64, (n,))),
        (fusedops.matmul(x, x.transpose(-1, -2)), x64 @ x64.transpose(-1, -2)),
        (fusedops.scaled_dot_product_attention(q, q, q, is_causal=True),
         F.scaled_dot_product_attention(q64, q64, q64, is_causal=True)),
    ]


def _layouts():
    base = torch.randn(400)
    return {
        "storage_offset": base[7:7 + 4 * 9].view(4, 9),
        "overlapping_rows": base.as_strided((6, 9), (3, 1)),
        "zero_strides": base[:1].as_strided((3, 4, 9), (0, 0, 0)),
        "expanded_rows": base[:9].expand(5, 9),
        "noncontiguous_last": base[:4 * 18].view(4, 18)[:, ::2],
        "transposed": base[:36].view(9, 4).t(),
        "huge_size1_strides": base[:27].as_strided((1, 3, 9), (2 ** 40, 9, 1)),
        "huge_stride_trailing_1": base[:27].as_strided((3, 9, 1), (9, 1, 2 ** 40))[..., 0],
    }


@pytest.mark.parametrize("layout", list(_layouts()))
def test_memory_layouts_all_ops(route, layout):
    x = _layouts()[layout]
    for got, want in _all_ops(x):
        _close(got, want)


@pytest.mark.parametrize("fmt", ["channels_last", "channels_last_3d"])
def test_channels_last(route, fmt):
    if fmt == "channels_last":
        x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    else:
        x = torch.randn(2, 3, 2, 4, 5).to(memory_format=torch.channels_last_3d)
    x64 = x.double()
    for d in range(x.dim()):
        _close(fusedops.softmax(x, d), torch.softmax(x64, d))
    _close(fusedops.layer_norm(x, x.shape[2:]), F.layer_norm(x64, x.shape[2:]))
    _close(fusedops.rms_norm(x, x.shape[-1:]), F.rms_norm(x64, x.shape[-1:]))
    _close(fusedops.scaled_dot_product_attention(x, x, x), F.scaled_dot_product_attention(x64, x64, x64))


def test_overlapping_and_zero_stride_gradients(route):
    """Gradients through self-overlapping and fully expanded inputs accumulate into the base like torch's."""
    cases = [
        (torch.randn(40), lambda t, op: op(t.as_strided((5, 20), (3, 1)))),
        (torch.randn(1, 1), lambda t, op: op(t.expand(3, 4, 20))),
    ]
    ours = lambda v: (fusedops.rms_norm(v, (20,)).sum(-1) + fusedops.softmax(v, 0)[..., 0] * 3
                      + fusedops.layer_norm(v, (20,))[..., 1]).sum()
    theirs = lambda v: (F.rms_norm(v, (20,)).sum(-1) + torch.softmax(v, 0)[..., 0] * 3
                        + F.layer_norm(v, (20,))[..., 1]).sum()
    for base, view in cases:
        a = base.clone().requires_grad_()
        b = base.double().requires_grad_()
        view(a, ours).backward()
        view(b, theirs).backward()
        _close(a.grad, b.grad, atol=1e-4)


def test_matmul_zero_stride_operands_and_bias(route):
    a = torch.randn(1, 1).requires_grad_()
    a64 = a.detach().double().requires_grad_()
    y = fusedops.matmul(a.expand(4, 5, 6), a[0].expand(6, 3), a[0].expand(3), activation="silu")
    r = F.silu(a64.expand(4, 5, 6) @ a64[0].expand(6, 3) + a64[0].expand(3))
    _close(y, r)
    y.sum().backward()
    r.sum().backward()
    _close(a.grad, a64.grad, atol=1e-4)


# ------------------------------------------------------------------------------------------------
# aliasing inputs: query is key is value, x is weight is bias, a is b
# ------------------------------------------------------------------------------------------------
def _grads(fn, base):
    a = base.clone().requires_grad_()
    y = fn(a)
    g = torch.randn(y.shape, dtype=F64)
    (ga,) = torch.autograd.grad(y, a, g.to(y.dtype))
    return y, ga


@pytest.mark.parametrize("case", ["ln_x_is_w_is_b", "rms_x_is_w", "ln_w_is_row_of_x", "mm_a_is_b",
                                  "mm_a_is_bT_bias_col", "sdpa_qkv_same", "sdpa_mask_is_view_of_q"])
def test_aliasing_inputs(route, case):
    fns = {
        "ln_x_is_w_is_b": (torch.randn(37), lambda t, m: m.ln(t, (37,), t, t)),
        "rms_x_is_w": (torch.randn(37), lambda t, m: m.rms(t, (37,), t)),
        "ln_w_is_row_of_x": (torch.randn(4, 37), lambda t, m: m.ln(t, (37,), t[0], t[1])),
        "mm_a_is_b": (torch.randn(8, 8), lambda t, m: m.mm(t, t, t[0], "gelu")),
        "mm_a_is_bT_bias_col": (torch.randn(8, 8), lambda t, m: m.mm(t, t.t(), t[:, 0], "silu")),
        "sdpa_qkv_same": (torch.randn(2, 3, 5, 8), lambda t, m: m.sdpa(t, t, t, is_causal=True)),
        "sdpa_mask_is_view_of_q": (torch.randn(2, 3, 5, 8),
                                   lambda t, m: m.sdpa(t, t, t, attn_mask=t[0, 0, :, :5].detach())),
    }

    class Ours:
        ln, rms, sdpa = staticmethod(fusedops.layer_norm), staticmethod(fusedops.rms_norm), \
            staticmethod(fusedops.scaled_dot_product_attention)
        mm = staticmethod(fusedops.matmul)

    class Torch:
        ln, rms, sdpa = staticmethod(F.layer_norm), staticmethod(F.rms_norm), \
            staticmethod(F.scaled_dot_product_attention)

        @staticmethod
        def mm(a, b, bias, act):
            return getattr(F, {"gelu": "gelu", "silu": "silu"}[act])(a @ b + bias)

    base, fn = fns[case]
    torch.manual_seed(1)
    y, g = _grads(lambda t: fn(t, Ours), base)
    torch.manual_seed(1)
    r, gr = _grads(lambda t: fn(t, Torch), base.double())
    _close(y, r)
    _close(g, gr, atol=1e-4, rtol=1e-3)


# ------------------------------------------------------------------------------------------------
# dtypes: clear errors for integer / bool / complex / quantized, float64 works, 0-d and empty dims
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.uint8, torch.complex64])
def test_non_floating_dtypes_clear_errors(route, dtype):
    t = torch.ones(3, 4, dtype=dtype)
    with pytest.raises(TypeError, match="fusedops.softmax.*floating"):
        fusedops.softmax(t, -1)
    with pytest.raises(TypeError, match="fusedops.layer_norm.*dtype"):
        fusedops.layer_norm(t, (4,))
    if dtype == torch.complex64:     # torch's rms_norm takes complex input, and so does fusedops' (session 27)
        assert torch.allclose(fusedops.rms_norm(t, (4,)), torch.nn.functional.rms_norm(t, (4,)))
    else:
        with pytest.raises(TypeError, match="fusedops.rms_norm.*dtype"):
            fusedops.rms_norm(t, (4,))
    if dtype == torch.bool:
        with pytest.raises(TypeError, match="fusedops.matmul.*floating"):
            fusedops.matmul(t, t.t())
    else:                            # integer and complex products are torch.matmul's (session 27)
        assert torch.equal(fusedops.matmul(t, t.t()), torch.matmul(t, t.t()))
    with pytest.raises(RuntimeError, match="floating-point"):
        fusedops.scaled_dot_product_attention(t[None], t[None], t[None])
    # an integer input with a floating dtype= is cast first, as torch
    _close(fusedops.softmax(t.to(torch.int32) if dtype != torch.complex64 else t.real.int(), -1,
                            dtype=torch.float32),
           torch.softmax(torch.ones(3, 4, dtype=F64), -1))


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_quantized_tensor_clear_errors(route):
    q = torch.quantize_per_tensor(torch.randn(3, 8), 0.1, 0, torch.qint8)
    with pytest.raises(TypeError, match="floating"):
        fusedops.softmax(q, -1)
    with pytest.raises(TypeError, match="qint8"):
        fusedops.layer_norm(q, (8,))
    with pytest.raises(TypeError, match="qint8"):
        fusedops.matmul(q, q.t())


def test_float64_all_ops(route):
    x = torch.randn(3, 10, dtype=F64)
    w = torch.randn(10, dtype=F64)
    torch.testing.assert_close(fusedops.softmax(x, -1), torch.softmax(x, -1), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(fusedops.layer_norm(x, (10,), w, w), F.layer_norm(x, (10,), w, w), atol=1e-12,
                               rtol=1e-12)
    torch.testing.assert_close(fusedops.rms_norm(x, (10,), w), F.rms_norm(x, (10,), w), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(fusedops.matmul(x, x.t(), torch.ones(3)), x @ x.t() + 1, atol=1e-12, rtol=1e-12)
    q = torch.randn(1, 2, 5, 4, dtype=F64)
    torch.testing.assert_close(fusedops.scaled_dot_product_attention(q, q, q, is_causal=True),
                               F.scaled_dot_product_attention(q, q, q, is_causal=True), atol=1e-12, rtol=1e-12)


def test_zero_dim(route):
    s = torch.tensor(1.5)
    _close(fusedops.softmax(s, 0), torch.softmax(s.double(), 0))
    _close(fusedops.log_softmax(s, -1), torch.log_softmax(s.double(), -1))
    with pytest.raises(ValueError, match="at least 1-dimensional"):
        fusedops.layer_norm(s, ())
    with pytest.raises(ValueError, match="at least 1 dimension"):
        fusedops.matmul(s, s)
    with pytest.raises(RuntimeError, match="at least 2 dimensional"):
        fusedops.scaled_dot_product_attention(s, s, s)


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (2, 0, 3), (0,)])
def test_empty_dims(route, shape):
    e = torch.randn(shape)
    for d in range(len(shape)):
        _close(fusedops.softmax(e, d), torch.softmax(e.double(), d))
    _close(fusedops.layer_norm(e, shape[-1:]), F.layer_norm(e.double(), shape[-1:]))
    _close(fusedops.rms_norm(e, shape[-1:]), F.rms_norm(e.double(), shape[-1:]))
    if len(shape) >= 2:
        _close(fusedops.matmul(e, e.transpose(-1, -2)), e.double() @ e.double().transpose(-1, -2))
        _close(fusedops.matmul(e.transpose(-1, -2), e), e.double().transpose(-1, -2) @ e.double())


@pytest.mark.parametrize("shapes", [((1, 2, 0, 4), (1, 2, 3, 4)), ((1, 2, 3, 4), (1, 2, 0, 4)),
                                    ((0, 2, 3, 4), (0, 2, 3, 4)), ((1, 2, 3, 0), (1, 2, 3, 0))])
def test_sdpa_empty_dims(route, shapes):
    q, k = torch.randn(shapes[0]), torch.randn(shapes[1])
    v = torch.randn(shapes[1])
    _close(fusedops.scaled_dot_product_attention(q, k, v),
           F.scaled_dot_product_attention(q.double(), k.double(), v.double()))


# ------------------------------------------------------------------------------------------------
# tensor subclasses: nn.Parameter, __torch_function__ subclasses (logging / overriding), plain ones
# ------------------------------------------------------------------------------------------------
class _Logging(torch.Tensor):
    seen: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


class _Plain(torch.Tensor):
    pass


class _Overriding(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.softmax, F.softmax, F.layer_norm, F.scaled_dot_product_attention, torch.matmul):
            return "overridden"
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("cls", [_Logging, _Plain])
def test_subclass_results_keep_type_and_values(route, cls):
    x = torch.randn(3, 8)
    t = x.as_subclass(cls)
    q = torch.randn(1, 2, 3, 8)
    tq = q.as_subclass(cls)
    pairs = [
        (fusedops.softmax(t, -1), torch.softmax(x.double(), -1)),
        (fusedops.log_softmax(t, 0), torch.log_softmax(x.double(), 0)),
        (fusedops.layer_norm(x, (8,), torch.ones(8).as_subclass(cls)), F.layer_norm(x.double(), (8,))),
        (fusedops.rms_norm(t, (8,)), F.rms_norm(x.double(), (8,))),
        (fusedops.matmul(t, t.t(), activation="relu"), F.relu(x.double() @ x.double().t())),
        (fusedops.matmul(x, x.t(), torch.ones(3).as_subclass(cls)), x.double() @ x.double().t() + 1),
        (fusedops.scaled_dot_product_attention(tq, tq, tq), F.scaled_dot_product_attention(*(q.double(),) * 3)),
    ]
    for got, want in pairs:
        assert type(got) is cls         # as torch's ops return
        _close(got.as_subclass(torch.Tensor), want)


def test_subclass_torch_function_is_honoured(route):
    x = torch.randn(3, 8)
    t = x.as_subclass(_Overriding)
    assert torch.softmax(t, -1) == "overridden"
    assert fusedops.softmax(t, -1) == "overridden"
    assert fusedops.layer_norm(t, (8,)) == "overridden"
    q = torch.randn(1, 3, 8).as_subclass(_Overriding)
    assert fusedops.scaled_dot_product_attention(q, q, q) == "overridden"
    _Logging.seen.clear()
    fusedops.softmax(x.as_subclass(_Logging), -1)
    assert "softmax" in _Logging.seen


def test_subclass_with_disabled_torch_function(route):
    class NoTF(torch.Tensor):
        __torch_function__ = torch._C._disabled_torch_function_impl

    x = torch.randn(3, 8)
    t = x.as_subclass(NoTF)
    _close(fusedops.softmax(t, -1).as_subclass(torch.Tensor), torch.softmax(x.double(), -1))
    _close(fusedops.matmul(t, t.t()).as_subclass(torch.Tensor), x.double() @ x.double().t())


def test_parameter_inputs_give_plain_tensors(route):
    p = torch.nn.Parameter(torch.randn(3, 8))
    y = fusedops.softmax(p, -1)
    assert type(y) is torch.Tensor and y.requires_grad
    y[:, 0].sum().backward()
    p64 = p.detach().double().requires_grad_()
    torch.softmax(p64, -1)[:, 0].sum().backward()
    _close(p.grad, p64.grad)
    assert type(fusedops.matmul(p, p.t())) is torch.Tensor

    class MyParam(torch.nn.Parameter):
        pass

    mp = MyParam(torch.randn(3, 8))
    assert type(fusedops.softmax(mp, -1)) is type(torch.softmax(mp, -1))


def test_uninitialized_parameter_torch_error(route):
    up = torch.nn.UninitializedParameter()
    with pytest.raises(ValueError, match="uninitialized parameter"):
        fusedops.softmax(up, -1)
    with pytest.raises(ValueError, match="uninitialized parameter"):
        fusedops.layer_norm(torch.randn(3, 8), (8,), up)


def test_neg_bit_views(route):
    x = torch.randn(3, 8)
    nv = torch._neg_view(x)
    assert nv.is_neg()
    _close(fusedops.softmax(nv, -1), torch.softmax(-x.double(), -1))
    _close(fusedops.layer_norm(nv, (8,), nv[0]), F.layer_norm(-x.double(), (8,), -x[0].double()))
    _close(fusedops.matmul(x, nv.t(), nv[:, 0]), x.double() @ -x.double().t() - x[:, 0].double())
    _close(fusedops.scaled_dot_product_attention(x[None], nv[None], x[None]),
           F.scaled_dot_product_attention(x[None].double(), -x[None].double(), x[None].double()))


# ------------------------------------------------------------------------------------------------
# grad modes, inference tensors, version counters, read-only numpy memory, meta tensors
# ------------------------------------------------------------------------------------------------
def test_no_grad_and_inference_mode(route):
    x = torch.randn(3, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            outs = [fusedops.softmax(x, -1), fusedops.layer_norm(x, (8,), w, w), fusedops.rms_norm(x, (8,), w),
                    fusedops.matmul(x, x.t(), None, "gelu"),
                    fusedops.scaled_dot_product_attention(x[None], x[None], x[None])]
        for y in outs:
            assert not y.requires_grad and y.grad_fn is None
            assert y.is_inference() == (ctx is torch.inference_mode)
    _close(outs[1], F.layer_norm(x.double(), (8,), w.double(), w.double()))


def test_inference_tensor_input_with_grad_parameters(route):
    """An inference tensor as the input of a norm whose weight requires grad: torch's rms_norm takes it;
    the gradient of the weight matches."""
    with torch.inference_mode():
        xi = torch.randn(3, 8)
    w = torch.randn(8, requires_grad=True)
    fusedops.rms_norm(xi, (8,), w).sum().backward()
    w64 = w.detach().double().requires_grad_()
    F.rms_norm(xi.clone().double(), (8,), w64).sum().backward()
    _close(w.grad, w64.grad, atol=1e-4)


def test_inference_tensor_saved_for_matmul_backward_raises_like_torch(route):
    with torch.inference_mode():
        bi = torch.randn(4, 8)
    a = torch.randn(3, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        fusedops.matmul(a, bi.t())


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "layer_norm", "rms_norm", "matmul", "sdpa"])
def test_inplace_modification_after_forward_is_detected(route, op):
    x = torch.randn(4, 8, requires_grad=True)
    a = x * 1
    fn = {
        "softmax": lambda t: fusedops.softmax(t, -1) * t,
        "log_softmax": lambda t: fusedops.log_softmax(t, -1) * t,
        "layer_norm": lambda t: fusedops.layer_norm(t, (8,), t[0], None),
        "rms_norm": lambda t: fusedops.rms_norm(t, (8,), t[1]),
        "matmul": lambda t: fusedops.matmul(t, t.t()),
        "sdpa": lambda t: fusedops.scaled_dot_product_attention(t[None], t[None], t[None]),
    }[op]
    y = fn(a)
    with torch.no_grad():
        a.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_readonly_numpy_inputs_are_not_written(route):
    arr = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    arr.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # torch warns (once) that the array is not writable
        t = torch.from_numpy(arr)
    before = arr.copy()
    t64 = torch.from_numpy(before).double()
    _close(fusedops.softmax(t, -1), torch.softmax(t64, -1))
    _close(fusedops.layer_norm(t, (8,), t[0], t[1]), F.layer_norm(t64, (8,), t64[0], t64[1]))
    _close(fusedops.rms_norm(t, (8,), t[2]), F.rms_norm(t64, (8,), t64[2]))
    _close(fusedops.matmul(t, t.t(), t[:, 0], "gelu"), F.gelu(t64 @ t64.t() + t64[:, 0]))
    _close(fusedops.scaled_dot_product_attention(t[None], t[None], t[None]),
           F.scaled_dot_product_attention(t64[None], t64[None], t64[None]))
    np.testing.assert_array_equal(arr, before)


def test_meta_tensors_propagate_shapes(route):
    m = torch.empty(3, 8, device="meta")
    wm = torch.empty(8, device="meta")
    assert fusedops.softmax(m, -1).device.type == "meta"
    assert fusedops.log_softmax(m, 0, dtype=F64).dtype == F64
    assert fusedops.layer_norm(m, (8,), wm, wm).shape == (3, 8)
    assert fusedops.rms_norm(m, (8,), wm).shape == (3, 8)
    y = fusedops.matmul(m.half(), m.half().t(), torch.empty(3, device="meta"), "silu", out_dtype=torch.float32)
    assert (y.shape, y.dtype, y.device.type) == ((3, 3), torch.float32, "meta")
    q = torch.empty(1, 2, 4, 8, device="meta", requires_grad=True)
    fusedops.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    assert q.grad.device.type == "meta"
    with pytest.raises(ValueError, match="weight is on cpu but the input is on meta"):
        fusedops.layer_norm(m, (8,), torch.ones(8))


def test_meta_modules(route):
    m = torch.empty(3, 8, device="meta")
    for mod in (fnn.LayerNorm(8), fnn.RMSNorm(8), fnn.Linear(8, 4, activation="gelu"), fnn.Softmax(1)):
        assert mod.to("meta")(m).device.type == "meta"
    mha = fnn.MultiheadAttention(8, 2).to("meta")
    assert mha(m, m, m, need_weights=False)[0].shape == (3, 8)


def test_default_device_and_dtype_contexts_do_not_leak_into_kernels(route):
    x = torch.randn(3, 8)
    q = torch.randn(1, 2, 4, 8)
    with torch.device("meta"):
        y = fusedops.layer_norm(x, (8,))
        z = fusedops.scaled_dot_product_attention(q, q, q)
    assert y.device.type == "cpu" and z.device.type == "cpu"
    _close(y, F.layer_norm(x.double(), (8,)))
    old = torch.get_default_dtype()
    torch.set_default_dtype(F64)
    try:
        s = fusedops.softmax(x, -1)
        mm = fusedops.matmul(x, x.t())
    finally:
        torch.set_default_dtype(old)
    assert s.dtype == mm.dtype == torch.float32
    _close(s, torch.softmax(x.double(), -1))


# ------------------------------------------------------------------------------------------------
# fusedops.nn modules: functional_call, deepcopy / pickle / torch.save after forward, .double()
# ------------------------------------------------------------------------------------------------
def _module_pair(name):
    return {
        "Softmax": (fnn.Softmax(-1), torch.nn.Softmax(-1)),
        "LogSoftmax": (fnn.LogSoftmax(1), torch.nn.LogSoftmax(1)),
        "LayerNorm": (fnn.LayerNorm(8), torch.nn.LayerNorm(8)),
        "RMSNorm": (fnn.RMSNorm(8), torch.nn.RMSNorm(8)),
        "Linear": (fnn.Linear(8, 6), torch.nn.Linear(8, 6)),
        "MultiheadAttention": (fnn.MultiheadAttention(8, 2, batch_first=True),
                               torch.nn.MultiheadAttention(8, 2, batch_first=True)),
    }[name]


def _call(mod, x):
    if isinstance(mod, torch.nn.MultiheadAttention):
        return mod(x, x, x, need_weights=False)[0]
    return mod(x)


MODULES = ["Softmax", "LogSoftmax", "LayerNorm", "RMSNorm", "Linear", "MultiheadAttention"]


@pytest.mark.parametrize("name", MODULES)
def test_module_copies_after_forward(route, name):
    ours, theirs = _module_pair(name)
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 5, 8)
    ref = _call(copy.deepcopy(theirs).double(), x.double())
    _close(_call(ours, x), ref)            # a forward first: caches hold launches
    _close(_call(copy.deepcopy(ours), x), ref)
    _close(_call(pickle.loads(pickle.dumps(ours)), x), ref)
    buffer = io.BytesIO()
    torch.save(ours, buffer)
    buffer.seek(0)
    _close(_call(torch.load(buffer, weights_only=False), x), ref)
    for moved in (copy.deepcopy(ours).double(), copy.deepcopy(ours).to(F64)):
        y = _call(moved, x.double())
        assert y.dtype == F64
        torch.testing.assert_close(y, ref, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name", MODULES)
def test_functional_call(route, name):
    ours, theirs = _module_pair(name)
    x = torch.randn(2, 5, 8)
    params = {k: torch.randn_like(v).requires_grad_() for k, v in ours.named_parameters()}
    params64 = {k: v.detach().double().requires_grad_() for k, v in params.items()}
    args = (x, x, x) if name == "MultiheadAttention" else (x,)
    kwargs = {"need_weights": False} if name == "MultiheadAttention" else {}
    y = torch.func.functional_call(ours, params, args, kwargs)
    r = torch.func.functional_call(theirs.double(), params64, tuple(a.double() for a in args), kwargs)
    if name == "MultiheadAttention":
        y, r = y[0], r[0]
    _close(y, r)
    if params:
        y.sum().backward()
        r.sum().backward()
        for k in params:
            _close(params[k].grad, params64[k].grad, atol=1e-4, rtol=1e-3)
        assert all(p.grad is None for p in ours.parameters())     # the module's own are untouched


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.parametrize("name", MODULES)
def test_jit_trace_modules(route, name):
    ours, theirs = _module_pair(name)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 5, 8)
    if name == "MultiheadAttention":
        traced = torch.jit.trace(ours, (x, x, x), check_trace=False)
        got = traced(x, x, x)[0]
        want = theirs(x, x, x)[0]
    else:
        traced = torch.jit.trace(ours, (x,), check_trace=False)
        got, want = traced(x), theirs(x)
    _close(got, want)


# ------------------------------------------------------------------------------------------------
# Defect 1: active TorchFunctionMode / TorchDispatchMode bypassed by the kernel route
# ------------------------------------------------------------------------------------------------
class _ReplaceSoftmax(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.softmax, F.softmax):
            return "from the mode"
        return func(*args, **(kwargs or {}))


def test_torch_function_mode_honoured_on_fallback(fallback):
    x = torch.randn(3, 4)
    with _ReplaceSoftmax():
        assert torch.softmax(x, -1) == "from the mode"
        assert fusedops.softmax(x, -1) == "from the mode"


def test_torch_function_mode_honoured_on_kernel_route(interpret):
    x = torch.randn(3, 4)
    with _ReplaceSoftmax():
        assert torch.softmax(x, -1) == "from the mode"
        assert fusedops.softmax(x, -1) == "from the mode"


def test_flop_counter_counts_matmul_on_kernel_route(interpret):
    from torch.utils.flop_counter import FlopCounterMode

    a, b = torch.randn(16, 32), torch.randn(32, 8)
    with FlopCounterMode(display=False) as theirs:
        torch.matmul(a, b)
    with FlopCounterMode(display=False) as ours:
        y = fusedops.matmul(a, b)
    _close(y, a.double() @ b.double())
    assert theirs.get_total_flops() == 2 * 16 * 32 * 8
    assert ours.get_total_flops() == theirs.get_total_flops()


def test_flop_counter_counts_matmul_on_fallback(fallback):
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as ours:
        fusedops.matmul(torch.randn(16, 32), torch.randn(32, 8))
    assert ours.get_total_flops() == 2 * 16 * 32 * 8


# ------------------------------------------------------------------------------------------------
# Defect 2: float8 tensors reach the interpreter's kernels
# ------------------------------------------------------------------------------------------------
FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("dtype", FLOAT8)
def test_float8_matmul_fallback(fallback, dtype):
    a, b = torch.randn(3, 8).to(dtype), torch.randn(8, 3).to(dtype)
    y = fusedops.matmul(a, b)
    assert y.dtype == dtype
    _close(y.float(), (a.double() @ b.double()).to(dtype).double(), atol=0.5, rtol=0.25)


@pytest.mark.parametrize("dtype", FLOAT8)
def test_float8_matmul_kernel_route(interpret, dtype):
    a, b = torch.randn(3, 8).to(dtype), torch.randn(8, 3).to(dtype)
    y = fusedops.matmul(a, b)
    assert y.dtype == torch.matmul(a, b).dtype == dtype
    _close(y.float(), (a.double() @ b.double()).to(dtype).double(), atol=0.5, rtol=0.25)


def test_float8_bias_and_out_dtype_kernel_route(interpret):
    a, b = torch.randn(3, 8), torch.randn(8, 3)
    bias = torch.randn(3).to(torch.float8_e4m3fn)
    _close(fusedops.matmul(a, b, bias), a.double() @ b.double() + bias.double())
    y = fusedops.matmul(a, b, out_dtype=torch.float8_e4m3fn)
    assert y.dtype == torch.float8_e4m3fn


def test_float8_softmax_sdpa_errors_name_the_op(interpret):
    x = torch.randn(3, 8).to(torch.float8_e4m3fn)
    with pytest.raises((TypeError, NotImplementedError), match="fusedops.softmax|softmax.*not implemented") as info:
        fusedops.softmax(x, -1)
    assert "_ptr" not in str(info.value)
    with pytest.raises((TypeError, NotImplementedError, RuntimeError),
                       match="scaled_dot_product_attention|not implemented") as info:
        fusedops.scaled_dot_product_attention(x[None], x[None], x[None])
    assert "_ptr" not in str(info.value)


def test_float8_softmax_with_float32_dtype_works(route):
    x = torch.randn(3, 8).to(torch.float8_e4m3fn)
    _close(fusedops.softmax(x, -1, dtype=torch.float32), torch.softmax(x.double(), -1))
