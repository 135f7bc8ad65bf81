"""Review of session 7 (a fresh reviewer tried the public API as a demanding PyTorch user, on the CPU through
the interpreter, against torch in float64): the inputs that broke it, kept as regression tests, and the
neighbouring cases that held (so that a later change cannot break them silently).

Bugs found:
- fusedops.matmul with a batch and an empty matrix (e.g. (3,) @ (2, 3, 0), (2, 2, 0, 3) @ (3, 5)): the
  batch was flattened with reshape(-1, ...), which is ambiguous for 0 elements (forward and gradients).
- fusedops.scaled_dot_product_attention of inputs over 4-D with an empty dim (L, S or heads = 0): the same.
- fusedops.scaled_dot_product_attention(enable_gqa=True) with key and value of different head counts (each
  dividing query's), which torch accepts, raised "must divide".
- fusedops.scaled_dot_product_attention with a scale or dropout_p that is not a number: a ValueError from
  float() that did not name the argument (torch: a TypeError naming it).
- fusedops.nn.MultiheadAttention (flash path, need_weights=False) read masks torch rejects: an integer
  (e.g. legacy uint8) attn_mask / key_padding_mask was *added* to the logits, a key_padding_mask of the
  wrong shape with the right element count was silently reinterpreted by view(); wrong 2-D/3-D attn_mask
  shapes, mismatched key/value shapes and embedding sizes gave unrelated errors.
- fusedops.softmax / log_softmax took dim=True as dim 1 (torch: TypeError).
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.nn
from helpers import assert_close


@pytest.fixture(autouse=True)
def interpret(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")


def _leaves(*tensors, dtype=None):
    return [t.detach().to(dtype or t.dtype).clone().requires_grad_() for t in tensors]


# ------------------------------------------------------------------------------------------------
# matmul: empty matrices inside a batch
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("a_shape, b_shape", [
    ((3,), (2, 3, 0)), ((2, 2, 4, 3), (2, 2, 3, 0)), ((2, 2, 0, 3), (3, 5)), ((2, 2, 4, 3), (3, 0)),
    ((2, 2, 4, 0), (2, 2, 0, 5)), ((2, 1, 4, 3), (1, 2, 3, 0)), ((2, 2, 0, 3), (3,)), ((3,), (2, 2, 3, 0)),
    ((2, 2, 0, 3), (2, 2, 3, 4)),
])
def test_matmul_batched_empty_matrices(a_shape, b_shape):
    a, b = torch.randn(a_shape), torch.randn(b_shape)
    expected = torch.matmul(a.double(), b.double())
    out = fusedops.matmul(a, b)
    assert out.shape == expected.shape and out.dtype == torch.float32
    assert_close(out, expected, torch.float32)
    a1, b1 = _leaves(a, b)
    a2, b2 = _leaves(a, b, dtype=torch.float64)
    grad_out = torch.randn(expected.shape)
    fusedops.matmul(a1, b1).backward(grad_out)
    torch.matmul(a2, b2).backward(grad_out.double())
    assert_close(a1.grad, a2.grad, torch.float32)
    assert_close(b1.grad, b2.grad, torch.float32)


def test_matmul_empty_rows_with_bias_gradient():
    a, b, bias = _leaves(torch.randn(2, 0, 3), torch.randn(3, 4), torch.randn(4))
    out = fusedops.matmul(a, b, bias, "relu")
    assert out.shape == (2, 0, 4)
    out.sum().backward()
    assert torch.equal(bias.grad, torch.zeros(4)) and torch.equal(b.grad, torch.zeros(3, 4))
    assert a.grad.shape == (2, 0, 3)


@pytest.mark.parametrize("a_shape, b_shape", [((3,), (3,)), ((5, 2, 3), (3,)), ((3,), (5, 3, 4)),
                                              ((2, 1, 4, 3), (5, 3, 2)), ((4, 1, 2, 3), (1, 5, 3, 2))])
def test_matmul_broadcast_shapes_and_gradients(a_shape, b_shape):
    a, b = torch.randn(a_shape), torch.randn(b_shape)
    a1, b1 = _leaves(a, b)
    a2, b2 = _leaves(a, b, dtype=torch.float64)
    out, expected = fusedops.matmul(a1, b1), torch.matmul(a2, b2)
    assert_close(out, expected, torch.float32)
    grad_out = torch.randn(expected.shape)
    out.backward(grad_out)
    expected.backward(grad_out.double())
    assert_close(a1.grad, a2.grad, torch.float32)
    assert_close(b1.grad, b2.grad, torch.float32)


# ------------------------------------------------------------------------------------------------
# scaled_dot_product_attention
# ------------------------------------------------------------------------------------------------
def _sdpa_both(q, k, v, **kwargs):
    """(output, (dq, dk, dv)) of fusedops (float32) and of torch (float64) for the same inputs."""
    grad_out = None
    results = []
    for op, dtype in ((fusedops.scaled_dot_product_attention, torch.float32),
                      (F.scaled_dot_product_attention, torch.float64)):
        leaves = _leaves(q, k, v, dtype=dtype)
        out = op(*leaves, **kwargs)
        if grad_out is None:
            grad_out = torch.randn(out.shape)
        out.backward(grad_out.to(dtype))
        results.append((out, tuple(t.grad for t in leaves)))
    return results


@pytest.mark.parametrize("q_shape, kv_shape", [
    ((2, 2, 3, 0, 8), (2, 2, 3, 5, 8)), ((2, 2, 3, 4, 8), (2, 2, 3, 0, 8)), ((2, 2, 0, 4, 8), (2, 2, 0, 5, 8)),
    ((0, 2, 3, 4, 8), (0, 2, 3, 5, 8)),
])
def test_attention_over_4d_with_an_empty_dim(q_shape, kv_shape):
    q, k, v = torch.randn(q_shape), torch.randn(kv_shape), torch.randn(kv_shape[:-1] + (6,))
    (out, grads), (expected, expected_grads) = _sdpa_both(q, k, v)
    assert out.shape == expected.shape
    assert_close(out, expected, torch.float32)
    for g, e in zip(grads, expected_grads):
        assert_close(g, e, torch.float32)


@pytest.mark.parametrize("heads_k, heads_v", [(2, 3), (3, 1), (6, 2)])
def test_attention_gqa_key_and_value_of_different_head_counts(heads_k, heads_v):
    q = torch.randn(2, 6, 4, 8)
    k, v = torch.randn(2, heads_k, 5, 8), torch.randn(2, heads_v, 5, 6)
    (out, grads), (expected, expected_grads) = _sdpa_both(q, k, v, enable_gqa=True)
    assert_close(out, expected, torch.float32)
    for g, e in zip(grads, expected_grads):
        assert_close(g, e, torch.float32)


@pytest.mark.parametrize("heads_k, heads_v", [(4, 4), (2, 4), (4, 2), (0, 2)])
def test_attention_gqa_heads_that_do_not_divide(heads_k, heads_v):
    q, k, v = torch.randn(1, 6, 3, 8), torch.randn(1, heads_k, 5, 8), torch.randn(1, heads_v, 5, 8)
    with pytest.raises(RuntimeError, match="must divide the number of heads in"):
        fusedops.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    if heads_k:     # torch accepts a value with no heads; the kernels do not
        with pytest.raises(RuntimeError, match="must divide the number of heads in"):
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


@pytest.mark.parametrize("name, value", [("scale", "a"), ("scale", [0.5]), ("dropout_p", "x"), ("dropout_p", None)])
def test_attention_scalar_arguments_that_are_not_numbers(name, value):
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(TypeError, match=f"argument '{name}' must be float"):
        fusedops.scaled_dot_product_attention(q, q, q, **{name: value})
    with pytest.raises(TypeError, match=f"argument '{name}' must be float"):
        F.scaled_dot_product_attention(q, q, q, **{name: value})


@pytest.mark.parametrize("case", ["scale0", "negative_scale", "tensor_scale", "causal_l_gt_s", "causal_l_lt_s",
                                  "mask_2d", "mask_3d", "bool_mask_with_masked_row", "float_mask_with_masked_row"])
def test_attention_against_torch(case):
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 6)
    kwargs = {}
    if case == "scale0":
        kwargs["scale"] = 0.0
    elif case == "negative_scale":
        kwargs["scale"] = -0.7
    elif case == "tensor_scale":
        kwargs["scale"] = torch.tensor(0.3)
    elif case == "causal_l_gt_s":
        q, kwargs["is_causal"] = torch.randn(2, 3, 7, 8), True
    elif case == "causal_l_lt_s":
        kwargs["is_causal"] = True
    elif case == "mask_2d":
        kwargs["attn_mask"] = torch.randn(4, 5)
    elif case == "mask_3d":
        kwargs["attn_mask"] = torch.randn(3, 1, 5)
    elif case == "bool_mask_with_masked_row":
        mask = torch.rand(2, 3, 4, 5) > 0.4
        mask[0, 1, 2] = False
        kwargs["attn_mask"] = mask
    else:
        mask = torch.randn(4, 5)
        mask[1] = float("-inf")
        kwargs["attn_mask"] = mask
    (out, grads), (expected, expected_grads) = _sdpa_both(q, k, v, **kwargs)
    assert_close(out, expected, torch.float32)
    for g, e in zip(grads, expected_grads):
        assert_close(g, e, torch.float32)


# ------------------------------------------------------------------------------------------------
# MultiheadAttention: torch's mask and shape checks on the flash path
# ------------------------------------------------------------------------------------------------
def _mha_pair(**kwargs):
    theirs = torch.nn.MultiheadAttention(8, 2, **kwargs).eval()
    ours = fusedops.nn.MultiheadAttention(8, 2, **kwargs).eval()
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def _raises_like_torch(ours, theirs, args, kwargs, error, match):
    with pytest.raises(error, match=match):
        theirs(*args, **kwargs)
    with pytest.raises(error, match=match):
        ours(*args, **kwargs)


@pytest.mark.parametrize("which, dtype", [("attn_mask", torch.uint8), ("attn_mask", torch.int64),
                                          ("key_padding_mask", torch.uint8), ("key_padding_mask", torch.int32)])
def test_mha_integer_masks_are_rejected(which, dtype):
    ours, theirs = _mha_pair()
    x = torch.randn(4, 2, 8)
    mask = torch.zeros((4, 4) if which == "attn_mask" else (2, 4), dtype=dtype)
    mask[..., -1] = 1
    _raises_like_torch(ours, theirs, (x, x, x), {which: mask, "need_weights": False}, AssertionError,
                       f"only bool and floating types of {which} are supported")


@pytest.mark.parametrize("case, error, match", [
    ("key_padding_mask_transposed", AssertionError, "key_pad"),
    ("key_padding_mask_3d", AssertionError, "expected `key_padding_mask` to be `None` or 2-D"),
    ("attn_mask_2d_transposed", RuntimeError, r"The shape of the 2D attn_mask is torch.Size\(\[5, 4\]\)"),
    ("attn_mask_2d_broadcastable", RuntimeError, r"The shape of the 2D attn_mask is torch.Size\(\[1, 5\]\)"),
    ("attn_mask_3d_wrong_heads", RuntimeError, r"The shape of the 3D attn_mask is torch.Size\(\[3, 4, 5\]\)"),
    ("attn_mask_4d", AssertionError, "expected `attn_mask` to be `None`, 2-D or 3-D"),
    ("key_value_shapes", AssertionError, "does not match value shape"),
    ("embedding", AssertionError, "was expecting embedding dimension of 8, but got 6"),
    ("query_4d", AssertionError, "query should be unbatched 2D or batched 3D tensor"),
    ("key_2d", AssertionError, "expected `key` and `value` to be 3-D"),
])
def test_mha_bad_shapes_raise_torch_s_errors(case, error, match):
    ours, theirs = _mha_pair()
    q, k, v = torch.randn(4, 2, 8), torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    kwargs = {"need_weights": False}
    if case == "key_padding_mask_transposed":       # (S, N): as many elements as (N, S)
        kwargs["key_padding_mask"] = torch.zeros(5, 2, dtype=torch.bool)
    elif case == "key_padding_mask_3d":
        kwargs["key_padding_mask"] = torch.zeros(2, 1, 5, dtype=torch.bool)
    elif case == "attn_mask_2d_transposed":
        kwargs["attn_mask"] = torch.randn(5, 4)
    elif case == "attn_mask_2d_broadcastable":
        kwargs["attn_mask"] = torch.randn(1, 5)
    elif case == "attn_mask_3d_wrong_heads":
        kwargs["attn_mask"] = torch.randn(3, 4, 5)
    elif case == "attn_mask_4d":
        kwargs["attn_mask"] = torch.randn(2, 2, 4, 5)
    elif case == "key_value_shapes":
        v = torch.randn(6, 2, 8)
    elif case == "embedding":
        q, k, v = torch.randn(4, 2, 6), torch.randn(5, 2, 6), torch.randn(5, 2, 6)
    elif case == "query_4d":
        q = torch.randn(1, 4, 2, 8)
    else:
        k, v = torch.randn(5, 8), torch.randn(5, 8)
    _raises_like_torch(ours, theirs, (q, k, v), kwargs, error, match)


def test_mha_unbatched_3d_mask_of_wrong_heads():
    ours, theirs = _mha_pair()
    q, kv = torch.randn(4, 8), torch.randn(5, 8)
    _raises_like_torch(ours, theirs, (q, kv, kv), {"attn_mask": torch.randn(3, 4, 5), "need_weights": False},
                       AssertionError, r"Expected `attn_mask` shape to be \(2, 4, 5\)")


def _mha_call(module, q, k, v, kwargs, grad):
    q, k, v = (t.clone().requires_grad_(grad) for t in (q, k, v))
    out, weights = module(q, k, v, **kwargs)
    if not grad:
        return out.detach()
    out.pow(2).sum().backward()
    w = module.in_proj_weight if module.in_proj_weight is not None else module.q_proj_weight
    return torch.cat([out.detach().flatten(), q.grad.flatten(), w.grad.flatten()])


@pytest.mark.parametrize("case", ["bool_masks", "float_masks", "float_3d_and_bool_padding", "bool_and_float",
                                  "causal_hint", "causal_hint_and_padding", "unbatched_padding", "unbatched_3d",
                                  "batch_first_kdim_vdim", "no_bias_grad", "self_attention_batch_first_grad"])
def test_mha_flash_path_against_torch(case):
    kwargs = {}
    module_kwargs = {}
    q, k, v = torch.randn(4, 2, 8), torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    padding_bool = torch.zeros(2, 5, dtype=torch.bool)
    padding_bool[0, 3:] = True
    padding_float = torch.zeros(2, 5)
    padding_float[0, 3:] = float("-inf")
    padding_float[1, 1] = -2.0
    mask_bool = torch.rand(4, 5) > 0.7
    mask_bool[:, 0] = False
    grad = case.endswith("_grad")
    if case == "bool_masks":
        kwargs = dict(attn_mask=mask_bool, key_padding_mask=padding_bool)
    elif case == "float_masks":
        kwargs = dict(attn_mask=torch.randn(4, 5), key_padding_mask=padding_float)
    elif case == "float_3d_and_bool_padding":
        kwargs = dict(attn_mask=torch.randn(4, 4, 5), key_padding_mask=padding_bool)
    elif case == "bool_and_float":
        kwargs = dict(attn_mask=mask_bool, key_padding_mask=padding_float)
    elif case in ("causal_hint", "causal_hint_and_padding"):
        k, v = torch.randn(4, 2, 8), torch.randn(4, 2, 8)
        kwargs = dict(attn_mask=torch.nn.Transformer.generate_square_subsequent_mask(4), is_causal=True)
        if case == "causal_hint_and_padding":
            kwargs["key_padding_mask"] = padding_bool[:, :4]
    elif case == "unbatched_padding":
        q, k, v = q[:, 0], k[:, 0], v[:, 0]
        kwargs = dict(key_padding_mask=padding_bool[0])
    elif case == "unbatched_3d":
        q, k, v = q[:, 0], k[:, 0], v[:, 0]
        kwargs = dict(attn_mask=torch.randn(2, 4, 5))
    elif case == "batch_first_kdim_vdim":
        module_kwargs = dict(batch_first=True, kdim=3, vdim=5)
        q, k, v = torch.randn(2, 4, 8), torch.randn(2, 5, 3), torch.randn(2, 5, 5)
        kwargs = dict(key_padding_mask=padding_bool)
    elif case == "no_bias_grad":
        module_kwargs = dict(bias=False)
    else:
        module_kwargs = dict(batch_first=True)
        q = k = v = torch.randn(2, 4, 8)
    ours, theirs = _mha_pair(**module_kwargs)
    kwargs["need_weights"] = False
    with pytest.warns() if case == "bool_and_float" else _no_context():    # torch's mismatched-masks warning
        expected = _mha_call(theirs.double(), q.double(), k.double(), v.double(), kwargs_double(kwargs), grad)
    out = _mha_call(ours, q, k, v, kwargs, grad)
    assert_close(out, expected, torch.float32)


class _no_context:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def kwargs_double(kwargs):
    return {key: (value.double() if isinstance(value, torch.Tensor) and value.dtype.is_floating_point else value)
            for key, value in kwargs.items()}


def test_mha_pickle_deepcopy_and_dtype_round_trips():
    ours, theirs = _mha_pair()
    x = torch.randn(4, 2, 8)
    expected = theirs(x, x, x, need_weights=False)[0]
    for copy_ in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        assert type(copy_) is fusedops.nn.MultiheadAttention
        assert_close(copy_(x, x, x, need_weights=False)[0], expected.double(), torch.float32)
    half = copy.deepcopy(ours).to(torch.bfloat16)
    out = half(x.bfloat16(), x.bfloat16(), x.bfloat16(), need_weights=False)[0]
    assert out.dtype == torch.bfloat16
    assert_close(out, copy.deepcopy(theirs).double()(x.double(), x.double(), x.double(), need_weights=False)[0],
                 torch.bfloat16)


# ------------------------------------------------------------------------------------------------
# softmax, log_softmax
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", [fusedops.softmax, fusedops.log_softmax])
@pytest.mark.parametrize("dim", [True, False, None, "a", 1.0])
def test_softmax_dim_that_is_not_an_int(op, dim):
    x = torch.randn(2, 3)
    with pytest.raises(TypeError, match="argument 'dim'"):
        op(x, dim)
    with pytest.raises(TypeError, match="argument 'dim'"):
        getattr(torch, op.__name__)(x, dim)


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("layout", ["channels_last", "permuted_slice", "zero_d", "empty_rows", "empty_dim"])
def test_softmax_layouts_against_torch(layout, log):
    dims = {"channels_last": range(4), "permuted_slice": range(3), "zero_d": (0, -1), "empty_rows": (0, 1),
            "empty_dim": (0, 1)}[layout]
    for dim in dims:
        if layout == "channels_last":
            x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
        elif layout == "permuted_slice":
            x = torch.randn(4, 6, 8).permute(2, 0, 1)[:, ::2]
        elif layout == "zero_d":
            x = torch.tensor(1.5)
        elif layout == "empty_rows":
            x = torch.randn(0, 5)
        else:
            x = torch.randn(3, 0)
        ours_x, = _leaves(x)
        theirs_x, = _leaves(x, dtype=torch.float64)
        name = "log_softmax" if log else "softmax"
        out, expected = getattr(fusedops, name)(ours_x, dim), getattr(torch, name)(theirs_x, dim)
        assert out.shape == expected.shape
        assert_close(out, expected, torch.float32)
        grad_out = torch.randn(x.shape)
        out.backward(grad_out)
        expected.backward(grad_out.double())
        assert_close(ours_x.grad, theirs_x.grad, torch.float32)


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_softmax_dtype_argument_gradient(log, out_dtype):
    x = torch.randn(3, 7, dtype=torch.float16) * 3
    name = "log_softmax" if log else "softmax"
    ours_x, = _leaves(x)
    out = getattr(fusedops, name)(ours_x, 1, dtype=out_dtype)
    assert out.dtype == out_dtype
    expected = getattr(torch, name)(x.double(), 1)
    assert_close(out, expected, out_dtype if out_dtype != torch.float64 else torch.float16)
    grad_out = torch.randn(3, 7)
    out.backward(grad_out.to(out_dtype))
    theirs_x, = _leaves(x)
    getattr(torch, name)(theirs_x, 1, dtype=out_dtype).backward(grad_out.to(out_dtype))
    assert ours_x.grad.dtype == torch.float16
    assert_close(ours_x.grad, theirs_x.grad.double(), torch.bfloat16 if out_dtype == torch.bfloat16 else torch.float16)


# ------------------------------------------------------------------------------------------------
# layer_norm, rms_norm: argument forms and requires_grad combinations
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("normalized_shape", [6, (6,), [6], torch.Size([6]), (2, 6), torch.Size([3, 2, 6])])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_norm_normalized_shape_forms(normalized_shape, op):
    x = torch.randn(3, 2, 6)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    w = torch.randn(shape)
    args = (w, torch.randn(shape)) if op == "layer_norm" else (w,)
    out = getattr(fusedops, op)(x, normalized_shape, *args)
    expected = getattr(F, op)(x.double(), shape, *(t.double() for t in args))
    assert_close(out, expected, torch.float32)


@pytest.mark.parametrize("needs", [(True, False, False), (False, True, False), (False, False, True),
                                   (False, True, True), (True, False, True)])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_norm_requires_grad_combinations(needs, op):
    x, w, b = torch.randn(2, 3, 4), torch.randn(3, 4), torch.randn(3, 4)
    tensors = (x, w, b) if op == "layer_norm" else (x, w)
    ours = [t.clone().requires_grad_(n) for t, n in zip(tensors, needs)]
    theirs = [t.double().requires_grad_(n) for t, n in zip(tensors, needs)]
    out = getattr(fusedops, op)(ours[0], (3, 4), *ours[1:])
    if not any(needs[:len(tensors)]):      # rms_norm has no bias
        assert not out.requires_grad and out.grad_fn is None
        assert_close(out, F.rms_norm(theirs[0], (3, 4), theirs[1]), torch.float32)
        return
    expected = getattr(F, op)(theirs[0], (3, 4), *theirs[1:])
    grad_out = torch.randn(2, 3, 4)
    out.backward(grad_out)
    expected.backward(grad_out.double())
    for a, e in zip(ours, theirs):
        assert (a.grad is None) == (e.grad is None)
        if a.grad is not None:
            assert_close(a.grad, e.grad, torch.float32)


def test_rms_norm_weight_of_another_dtype_gradients():
    x, w = _leaves(torch.randn(3, 8, dtype=torch.float16), torch.randn(8))
    out = fusedops.rms_norm(x, (8,), w)
    assert out.dtype == torch.float16
    grad_out = torch.randn(3, 8, dtype=torch.float16)
    out.backward(grad_out)
    x2, w2 = _leaves(x, w, dtype=torch.float64)
    expected = F.rms_norm(x2, (8,), w2)
    expected.backward(grad_out.double())
    assert_close(out, expected, torch.float16)
    assert x.grad.dtype == torch.float16 and w.grad.dtype == torch.float32
    assert_close(x.grad, x2.grad, torch.float16)
    assert_close(w.grad, w2.grad, torch.float16)


@pytest.mark.parametrize("module", ["LayerNorm", "RMSNorm", "Linear", "Softmax"])
def test_modules_round_trip_and_dtype_casts(module):
    x = torch.randn(3, 2, 6)
    make = {"LayerNorm": lambda ns: ns.LayerNorm([2, 6]), "RMSNorm": lambda ns: ns.RMSNorm(6, eps=1e-3),
            "Linear": lambda ns: ns.Linear(6, 4), "Softmax": lambda ns: ns.Softmax(dim=-1)}[module]
    ours, theirs = make(fusedops.nn), make(torch.nn)
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_()
    theirs.load_state_dict(ours.state_dict())
    expected = copy.deepcopy(theirs).double()(x.double())
    for copy_ in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        assert type(copy_) is type(ours)
        assert_close(copy_(x), expected, torch.float32)
    half = copy.deepcopy(ours).half()
    out = half(x.half())
    assert out.dtype == torch.float16
    assert_close(out, expected, torch.float16)
