"""Review (session 27) of fusedops.nn.patch(model) on real torch.nn model structures.

What was tried (CPU, both routes: FUSEDOPS_INTERPRET=1 kernels in the interpreter, and torch's fallback),
always against an unpatched deep copy with the same weights:

* nn.TransformerEncoderLayer with norm_first True/False, batch_first True/False, activation as a string
  ("gelu", "relu") and as a callable (F.silu), causal src_mask + is_causal; non-power-of-two widths
  (d_model 12, 3 heads, seq 7); outputs and input/parameter gradients (float64 where numerics matter).
* nn.Transformer (encoder + decoder, tgt_is_causal, src/memory key padding masks): outputs and all
  parameter gradients.
* nn.TransformerEncoder in eval under no_grad with enable_nested_tensor and a src_key_padding_mask (the
  nested-tensor fast path; pytorch#97111, pytorch#86120 are the peer reports about this path's output).
* nn.MultiheadAttention: kdim/vdim, 3-D bool attn_mask, float key_padding_mask, unbatched, empty batch,
  transposed (non-contiguous) query, need_weights=True, a wrong key_padding_mask shape (clear error).
* Sequential / ModuleDict, tied (shared) modules and parameters, forward pre-/post-hooks with kwargs,
  state_dict hooks, torch.nn.utils.prune, the old weight_norm (hook based; its deepcopy limitation is
  torch's, pytorch#103001), parametrize / spectral_norm (class already swapped by torch: skipped and
  reported), parametrize after patch and remove_parametrizations, meta-device modules, patch twice,
  the report's contents, a non-Module argument, deepcopy / pickle / torch.save round trips,
  torch.fx.symbolic_trace and torch.compile(backend="eager").

DEFECTS found: none. Every case above matched torch (outputs and gradients within float rounding of the
dtype) or raised the documented/torch-equivalent error; see the passing tests below.
"""

import copy
import io
import pickle

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrizations, parametrize, prune

import fusedops.nn as fnn


def _grads(module):
    return [p.grad for p in module.parameters()]


def _max_diff(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a, b))


@pytest.mark.parametrize("norm_first,batch_first,activation", [
    (False, True, "gelu"), (True, False, F.silu), (True, True, "relu")])
def test_encoder_layer_matches_torch(route, norm_first, batch_first, activation):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(12, 3, 20, dropout=0.0, batch_first=batch_first, norm_first=norm_first,
                                       activation=activation).double()
    ref = copy.deepcopy(layer)
    report = fnn.patch(layer)
    assert [e.path for e in report.replaced] == ["self_attn", "linear1", "linear2", "norm1", "norm2"]
    assert [s.path for s in report.skipped] == ["self_attn.out_proj"]     # NonDynamicallyQuantizableLinear
    shape = (2, 7, 12) if batch_first else (7, 2, 12)
    x = torch.randn(*shape, dtype=torch.double, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    mask = nn.Transformer.generate_square_subsequent_mask(7, dtype=torch.double)
    y = layer(x, src_mask=mask, is_causal=True)
    y_ref = ref(x_ref, src_mask=mask, is_causal=True)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    y.square().sum().backward()
    y_ref.square().sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-9, atol=1e-9)
    assert _max_diff(_grads(layer), _grads(ref)) < 1e-9


def test_full_transformer_with_masks(route):
    torch.manual_seed(1)
    model = nn.Transformer(16, 2, 1, 1, 32, dropout=0.0, batch_first=True, norm_first=True).double()
    ref = copy.deepcopy(model)
    fnn.patch(model)
    src = torch.randn(2, 7, 16, dtype=torch.double)
    tgt = torch.randn(2, 5, 16, dtype=torch.double)
    tgt_mask = nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.double)
    kpm = torch.tensor([[False] * 7, [False] * 4 + [True] * 3])
    kwargs = dict(tgt_mask=tgt_mask, tgt_is_causal=True, src_key_padding_mask=kpm, memory_key_padding_mask=kpm)
    y, y_ref = model(src, tgt, **kwargs), ref(src, tgt, **kwargs)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    y.sum().backward()
    y_ref.sum().backward()
    assert _max_diff(_grads(model), _grads(ref)) < 1e-9


def test_encoder_nested_tensor_fast_path_eval(route):
    torch.manual_seed(2)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True), 2,
                                enable_nested_tensor=True).eval()
    ref = copy.deepcopy(enc)
    fnn.patch(enc)
    x = torch.randn(2, 5, 16)
    kpm = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad():
        y, y_ref = enc(x, src_key_padding_mask=kpm), ref(x, src_key_padding_mask=kpm)
    assert y.shape == y_ref.shape
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_mha_variants(route):
    torch.manual_seed(3)
    mha = nn.MultiheadAttention(16, 4, kdim=8, vdim=12, batch_first=True)
    ref = copy.deepcopy(mha)
    fnn.patch(mha)
    q, k, v = torch.randn(3, 5, 16), torch.randn(3, 6, 8), torch.randn(3, 6, 12)
    float_kpm = torch.zeros(3, 6)
    float_kpm[1, 3:] = float("-inf")
    cases = [dict(), dict(attn_mask=torch.rand(12, 5, 6) > 0.7), dict(key_padding_mask=float_kpm)]
    for kw in cases:   # fp32: tolerance a few ulps of the softmax/matmul sums
        torch.testing.assert_close(mha(q, k, v, need_weights=False, **kw)[0],
                                   ref(q, k, v, need_weights=False, **kw)[0], rtol=1e-5, atol=1e-5)
    qt = torch.randn(5, 3, 16).transpose(0, 1)            # non-contiguous query
    torch.testing.assert_close(mha(qt, k, v, need_weights=False)[0], ref(qt, k, v, need_weights=False)[0],
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mha(q[0], k[0], v[0], need_weights=False)[0],   # unbatched
                               ref(q[0], k[0], v[0], need_weights=False)[0], rtol=1e-5, atol=1e-5)
    out, weights = mha(q, k, v)
    out_ref, weights_ref = ref(q, k, v)
    torch.testing.assert_close(out, out_ref)
    torch.testing.assert_close(weights, weights_ref)
    empty = mha(q[:0], k[:0], v[:0], need_weights=False)[0]
    assert empty.shape == (0, 5, 16)
    with pytest.raises(AssertionError, match="key_padding_mask"):
        mha(q, k, v, need_weights=False, key_padding_mask=torch.zeros(3, 5, dtype=torch.bool))


def test_hooks_tied_state_dict_hooks_and_prune(route):
    torch.manual_seed(4)
    x = torch.randn(3, 8)
    lin = nn.Linear(8, 8)
    calls = []
    lin.register_forward_pre_hook(lambda m, a, k: calls.append(("pre", sorted(k))), with_kwargs=True)
    lin.register_forward_hook(lambda m, a, k, o: o * 2, with_kwargs=True)
    lin._register_state_dict_hook(lambda m, sd, prefix, local: sd.__setitem__(prefix + "extra", torch.zeros(1)))
    ref = copy.deepcopy(lin)
    fnn.patch(lin)
    assert type(lin) is fnn.Linear and isinstance(lin, nn.Linear)
    torch.testing.assert_close(lin(input=x), ref(input=x))
    assert calls == [("pre", ["input"]), ("pre", ["input"])]
    assert list(lin.state_dict()) == ["weight", "bias", "extra"]

    emb = nn.Embedding(10, 8)
    head = nn.Linear(8, 10, bias=False)
    head.weight = emb.weight
    model = nn.ModuleDict({"e": emb, "h": head, "h2": head})
    report = fnn.patch(model)
    assert [e.path for e in report.replaced] == ["h"]      # the shared module once, at its first path
    assert model["h2"] is head and head.weight is emb.weight

    pruned = nn.Linear(8, 8)
    pruned_ref = copy.deepcopy(pruned)
    prune.l1_unstructured(pruned, "weight", 0.5)
    prune.l1_unstructured(pruned_ref, "weight", 0.5)
    fnn.patch(pruned)
    torch.testing.assert_close(pruned(x), pruned_ref(x))

    base = nn.Linear(8, 8)
    base_ref = copy.deepcopy(base)
    wn, wn_ref = nn.utils.weight_norm(base), nn.utils.weight_norm(base_ref)
    fnn.patch(wn)
    torch.testing.assert_close(wn(x), wn_ref(x))


class _Sym(nn.Module):
    def forward(self, w):
        return w.triu() + w.triu(1).T


def test_parametrized_modules_skipped_and_parametrize_after_patch(route):
    torch.manual_seed(5)
    lin = nn.Linear(8, 8)
    parametrize.register_parametrization(lin, "weight", _Sym())
    report = fnn.patch(nn.Sequential(lin, parametrizations.spectral_norm(nn.Linear(4, 4))))
    assert not report.replaced
    assert [s.module_type for s in report.skipped] == ["torch.nn.utils.parametrize.ParametrizedLinear"] * 2

    patched = nn.Linear(8, 8)
    fnn.patch(patched)
    ref = copy.deepcopy(patched)
    parametrize.register_parametrization(patched, "weight", _Sym())
    x = torch.randn(3, 8)
    torch.testing.assert_close(patched(x), x @ _Sym()(ref.weight).T + ref.bias)
    parametrize.remove_parametrizations(patched, "weight")
    assert type(patched) is fnn.Linear


def test_meta_twice_report_and_bad_argument():
    model = nn.Sequential(nn.Linear(4, 4, device="meta"), nn.LayerNorm(4, device="meta"), nn.Softmax(-1))
    report = fnn.patch(model)
    assert report.counts() == {"fusedops.nn.linear.Linear": 1, "fusedops.nn.normalization.LayerNorm": 1,
                               "fusedops.nn.softmax.Softmax": 1}
    assert model(torch.empty(3, 4, device="meta")).shape == (3, 4)
    again = fnn.patch(model)
    assert not again.replaced
    assert [s.reason for s in again.skipped] == ["already a fusedops module"] * 3
    assert "0 modules replaced, 3 skipped" in str(again)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        fnn.patch("not a model")


def test_round_trips_fx_and_compile(fallback):
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Softmax(-1))
    ref = copy.deepcopy(model)
    fnn.patch(model)
    x = torch.randn(3, 8)
    expected = ref(x)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model)), torch.load(buf, weights_only=False)):
        assert type(clone[0]) is fnn.Linear
        torch.testing.assert_close(clone(x), expected)
    fresh = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Softmax(-1))
    fresh.load_state_dict(model.state_dict())
    torch.testing.assert_close(fresh(x), expected)
    traced = torch.fx.symbolic_trace(model)
    torch.testing.assert_close(traced(x), expected)
    torch.testing.assert_close(torch.compile(model, backend="eager")(x), expected)
