"""Review (session 24): the PyTorch-integration layer — the custom operators torch.ops.fusedops.* (opcheck,
fake kernels, autograd), the public ops under torch.compile / torch.export, and fusedops.nn.patch — on the
CPU, on both routes: the kernels in the interpreter (`interpret`, FUSEDOPS_INTERPRET=1, what CUDA tensors
take) and torch's fallback (`fallback`). torch itself, in float64, is the oracle.

Defects (fixed in the same session: every operator checks its arguments as its public function does, so a
direct call refuses what fusedops.* refuses; a bias is (N,), as fusedops.matmul documents):
- torch.ops.fusedops.matmul with a bias that is not (N,) (its fake kernel broadcasts the bias with the
  product, so (M, N) / (1, N) biases are in the op's contract): on the kernel path the forward reads the
  bias out of bounds (InterpreterError here; an out-of-bounds read on CUDA); on the fallback the forward is
  right but the backward returns a (N,) bias gradient, and autograd raises (opcheck's
  test_aot_dispatch_dynamic fails).
- torch.ops.fusedops.softmax / log_softmax with an out-of-range dim wrap it modulo the rank (dim=2 of a 2-D
  tensor normalizes over dim 0) instead of raising IndexError like torch.softmax.
- torch.ops.fusedops.matmul with an unknown activation ("tanh") returns a result (the plain product on
  the kernel path) instead of raising.
- torch.ops.fusedops.matmul with operands whose inner dims differ ((3, 4) @ (5, 2)) returns a (3, 2) result
  of garbage on the kernel path instead of raising like torch.matmul (the fallback raises).
- torch.ops.fusedops.layer_norm with a weight not shaped normalized_shape: the kernel path reads the
  weight out of bounds (InterpreterError) instead of raising torch's clear RuntimeError (the fallback does).

Everything else tried here works and is pinned by passing tests: opcheck on strided / 0-size / float64 /
mixed-dtype / partial-requires_grad inputs, fullgraph compiles with dynamic shapes, recompiles, backward,
no_grad and CPU autocast, torch._dynamo.explain without breaks, torch.export (static and dynamic), and
patch() on nested, tied, hooked, parametrized, weight-normed, already-patched and subclassed modules,
state_dict round trips and dtype moves.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo.testing
import torch.nn.functional as F
import torch.nn.utils.parametrize as parametrize

import fusedops
import fusedops.library  # noqa: F401  (registers torch.ops.fusedops.*)
import fusedops.nn as fnn
from fusedops.dsl.errors import FusedOpsError

ops = torch.ops.fusedops
D = torch.float64


pytestmark = pytest.mark.usefixtures("reset_dynamo")


def _t(*shape, dtype=D, grad=True):
    return torch.randn(shape, dtype=dtype).requires_grad_(grad)


def _close(a, b, tol=1e-12):
    torch.testing.assert_close(a.double(), b.double(), rtol=tol, atol=tol, equal_nan=True)


# ------------------------------------------------------------------------------------------------
# opcheck with varied inputs (both routes)
# ------------------------------------------------------------------------------------------------
def _cases():
    f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32
    return {
        "softmax_f64_0d": (ops.softmax, (_t(), 0, None)),
        "softmax_0size_dim0": (ops.softmax, (_t(3, 0), 0, None)),
        "softmax_strided_nograd": (ops.softmax, (_t(4, 6, grad=False)[:, ::2], -1, None)),
        "log_softmax_f16_to_f32": (ops.log_softmax, (_t(3, 4, dtype=f16), -1, f32)),
        "softmax_f32_to_f16": (ops.softmax, (_t(3, 4, dtype=f32), -1, f16)),
        "layer_norm_weight_only_transposed": (ops.layer_norm, (_t(5, 3).t(), [5], _t(5), None, 1e-5)),
        "layer_norm_bias_only_0rows": (ops.layer_norm, (_t(0, 5), [5], None, _t(5), 1e-5)),
        "layer_norm_frozen_weight": (ops.layer_norm, (_t(2, 3, 4), [3, 4], _t(3, 4, grad=False), _t(3, 4), 1e-5)),
        "layer_norm_f16_f32_params": (ops.layer_norm, (_t(3, 5, dtype=f16), [5], _t(5, dtype=f32),
                                                       _t(5, dtype=f32), 1e-5)),
        "rms_norm_transposed": (ops.rms_norm, (_t(5, 3).t(), [5], _t(5), 1e-6)),
        "rms_norm_frozen_input": (ops.rms_norm, (_t(3, 5, grad=False), [5], _t(5), 1e-6)),
        "matmul_transposed_0K_bias": (ops.matmul, (_t(0, 3).t(), _t(5, 0).t(), _t(5), None, None)),
        "matmul_relu_frozen_b": (ops.matmul, (_t(3, 4), _t(4, 5, grad=False), _t(5), "relu", None)),
        "matmul_bf16_out_f32_gelu": (ops.matmul, (_t(3, 4, dtype=bf16), _t(4, 5, dtype=bf16), _t(5, dtype=bf16),
                                                  "gelu", f32)),
        "matmul_broadcast_batch_silu": (ops.matmul, (_t(2, 1, 3, 4), _t(5, 4, 2), None, "silu", None)),
        "attention_transposed_causal_LneS": (ops.scaled_dot_product_attention,
                                             (_t(1, 5, 2, 4).transpose(1, 2), _t(1, 3, 2, 4).transpose(1, 2),
                                              _t(1, 3, 2, 4).transpose(1, 2), None, True, 0.5, False)),
        "attention_S0": (ops.scaled_dot_product_attention, (_t(1, 2, 3, 4), _t(1, 2, 0, 4), _t(1, 2, 0, 4), None,
                                                            False, None, False)),
        "attention_gqa_ev_frozen_key": (ops.scaled_dot_product_attention,
                                        (_t(2, 4, 3, 4), _t(2, 1, 5, 4, grad=False), _t(2, 1, 5, 6), None, False,
                                         None, True)),
        "attention_float_mask_requires_grad": (ops.scaled_dot_product_attention,
                                               (_t(1, 2, 3, 4), _t(1, 2, 5, 4), _t(1, 2, 5, 4), _t(3, 5), False,
                                                None, False)),
    }


@pytest.mark.parametrize("case", sorted(_cases()))
def test_opcheck_varied_inputs(case, route):
    op, args = _cases()[case]
    torch.library.opcheck(op, args)


# ------------------------------------------------------------------------------------------------
# Defect: matmul's bias of a shape other than (N,)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bias_shape", [(3, 5), (1, 5)])
def test_matmul_op_2d_bias_is_refused_like_fusedops_matmul(bias_shape, route):
    """fusedops.matmul takes a (N,) bias (documented); its operator, called directly, refuses the others the same
    way (the kernel read a 2-D bias out of bounds, the fallback's backward returned a (N,) gradient for it)."""
    a, b, bias = _t(3, 4, grad=False), _t(4, 5, grad=False), _t(*bias_shape, grad=False)
    for call in (lambda: ops.matmul(a, b, bias, None, None), lambda: fusedops.matmul(a, b, bias)):
        with pytest.raises(ValueError, match="bias must be a 1-D tensor of 5 elements"):
            call()


# ------------------------------------------------------------------------------------------------
# Defects: direct calls of the operators skip argument checks
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_op_out_of_range_dim_raises(op, route):
    x = _t(3, 4, grad=False)
    with pytest.raises(IndexError):
        getattr(ops, op)(x, 2, None)


def test_matmul_op_unknown_activation_raises(route):
    x = _t(3, 4, grad=False)
    with pytest.raises((ValueError, RuntimeError)):
        ops.matmul(x, x.t(), None, "tanh", None)


def test_matmul_op_mismatched_inner_dims_raise_kernel_path(interpret):
    with pytest.raises((RuntimeError, ValueError)):
        ops.matmul(_t(3, 4, grad=False), _t(5, 2, grad=False), None, None, None)


def test_matmul_op_mismatched_inner_dims_raise_fallback(fallback):
    with pytest.raises((RuntimeError, ValueError)):
        ops.matmul(_t(3, 4, grad=False), _t(5, 2, grad=False), None, None, None)


def _layer_norm_bad_weight():
    try:
        ops.layer_norm(_t(3, 4, grad=False), [4], _t(3, grad=False), None, 1e-5)
    except FusedOpsError as error:      # the interpreter's out-of-bounds report: not an argument error
        return error
    except (RuntimeError, ValueError) as error:      # ValueError: fusedops.layer_norm's check, as the op's
        return error
    return None


def test_layer_norm_op_misshaped_weight_raises_kernel_path(interpret):
    error = _layer_norm_bad_weight()
    assert isinstance(error, (RuntimeError, ValueError)) and "weight" in str(error), repr(error)


def test_layer_norm_op_misshaped_weight_raises_fallback(fallback):
    error = _layer_norm_bad_weight()
    assert isinstance(error, (RuntimeError, ValueError)) and "weight" in str(error), repr(error)


# ------------------------------------------------------------------------------------------------
# torch.compile / export of the public ops (working)
# ------------------------------------------------------------------------------------------------
def _all_ops(x, w, b, a, q):
    h = fusedops.layer_norm(x, (8,), w, b)
    h = fusedops.rms_norm(h, (8,), w)
    h = fusedops.matmul(h, a, b, "gelu")
    s = fusedops.scaled_dot_product_attention(q, q, q, is_causal=True)
    return fusedops.softmax(h, -1).sum() + fusedops.log_softmax(h, 0).mean() + s.square().sum()


def _torch_all_ops(x, w, b, a, q):
    h = F.layer_norm(x, (8,), w, b)
    h = F.rms_norm(h, (8,), w)
    h = F.gelu(h @ a + b)
    s = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    return torch.softmax(h, -1).sum() + torch.log_softmax(h, 0).mean() + s.square().sum()


def test_compile_fullgraph_dynamic_every_op_with_backward(route):
    args = [_t(3, 8), _t(8), _t(8), _t(8, 8), _t(1, 2, 3, 4)]
    ref = [t.detach().clone().requires_grad_() for t in args]
    compiled = torch.compile(_all_ops, backend="aot_eager", fullgraph=True, dynamic=True)
    out = compiled(*args)
    expected = _torch_all_ops(*ref)
    _close(out, expected)
    out.backward()
    expected.backward()
    for t, r in zip(args, ref):
        _close(t.grad, r.grad)


def test_compile_graph_holds_the_custom_ops(interpret):
    targets = []

    def backend(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch.compile(_all_ops, backend=backend, fullgraph=True)(_t(3, 8), _t(8), _t(8), _t(8, 8), _t(1, 2, 3, 4))
    for name in ("layer_norm", "rms_norm", "matmul", "scaled_dot_product_attention", "softmax", "log_softmax"):
        assert f"fusedops.{name}" in targets, (name, targets)


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.fc, self.rms = fnn.LayerNorm(8), fnn.Linear(8, 8, activation="silu"), fnn.RMSNorm(8)
        self.sm = fnn.Softmax(-1)

    def forward(self, x):
        h = self.rms(self.fc(self.ln(x)))
        q = h.reshape(h.shape[0], -1, 2, 4).transpose(1, 2)
        a = fusedops.scaled_dot_product_attention(q, q, q, is_causal=True)
        return self.sm(a.transpose(1, 2).reshape(h.shape))


def test_compile_changing_shapes_recompiles_once_and_matches(interpret):
    model = _Block().double()
    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    for n in (3, 5, 7):
        x = _t(2, n, 8)
        y = compiled(x)
        _close(y, model(x.detach()))
        y.sum().backward()
    assert counter.frame_count == 2       # static, then automatic dynamic


def test_compile_no_grad_and_explain_and_export(interpret):
    model = _Block().double()
    x = _t(2, 3, 8, grad=False)
    with torch.no_grad():
        _close(torch.compile(model, backend="aot_eager", fullgraph=True)(x), model(x))
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    batch, seq = torch.export.Dim("batch", min=1, max=16), torch.export.Dim("seq", min=2, max=16)
    exported = torch.export.export(model, (x,), dynamic_shapes=({0: batch, 1: seq},))
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert {"fusedops.layer_norm.default", "fusedops.matmul.default", "fusedops.softmax.default"} <= targets
    x2 = _t(3, 6, 8, grad=False)
    _close(exported.module()(x2), model(x2))


def test_compile_cpu_autocast_matches_eager_and_torch(route):
    def f(a, b, q):
        return (fusedops.matmul(a, b), fusedops.scaled_dot_product_attention(q, q, q), fusedops.softmax(a, -1),
                fusedops.layer_norm(a, (8,)))

    a, b, q = torch.randn(4, 8), torch.randn(8, 8), torch.randn(1, 2, 3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = f(a, b, q)
        compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(a, b, q)
        direct = ops.matmul(a, b, None, None, None)
    assert [t.dtype for t in eager] == [t.dtype for t in compiled] == [torch.bfloat16, torch.bfloat16,
                                                                       torch.float32, torch.float32]
    assert direct.dtype == torch.bfloat16
    for e, c in zip(eager, compiled):
        torch.testing.assert_close(c, e)


# ------------------------------------------------------------------------------------------------
# fusedops.nn.patch (working)
# ------------------------------------------------------------------------------------------------
class _TorchBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.fc, self.sm, self.rms = torch.nn.LayerNorm(8), torch.nn.Linear(8, 8), torch.nn.Softmax(-1), \
            torch.nn.RMSNorm(8)
        self.att = torch.nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        h = self.ln(x)
        h = h + self.att(h, h, h, need_weights=False)[0]
        return self.sm(self.rms(self.fc(h)))


def test_patch_nested_model_matches_unpatched_with_gradients(route):
    model = torch.nn.Sequential(_TorchBlock(), torch.nn.Sequential(_TorchBlock())).double()
    ref = copy.deepcopy(model)
    report = fnn.patch(model)
    assert len(report.replaced) == 10
    x = _t(2, 3, 8)
    y, yr = model(x), ref(x)
    _close(y, yr)
    (y * torch.arange(8, dtype=D)).sum().backward()
    (yr * torch.arange(8, dtype=D)).sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        _close(p.grad, q.grad, 1e-10)


def test_patch_tied_module_twice_and_subclass(fallback):
    lin = torch.nn.Linear(8, 8)

    class MyLN(torch.nn.LayerNorm):
        def forward(self, x):
            return super().forward(x) * 2

    model = torch.nn.Sequential(lin, torch.nn.ReLU(), lin, MyLN(8)).double()
    ref = copy.deepcopy(model)
    report = fnn.patch(model)
    assert [p.path for p in report.replaced] == ["0"] and model[0] is model[2]
    assert type(model[3]) is MyLN and "subclass" in report.skipped[0].reason
    again = fnn.patch(model)
    assert again.replaced == [] and any(s.reason == "already a fusedops module" for s in again.skipped)
    x = _t(3, 8, grad=False)
    _close(model(x), ref(x))


def test_patch_keeps_hooks(interpret):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)).double()
    model[0].register_forward_hook(lambda mod, inputs, out: out * 3)
    model[1].register_forward_pre_hook(lambda mod, inputs: (inputs[0] + 1,))
    ref = copy.deepcopy(model)
    fnn.patch(model)
    x = _t(3, 8, grad=False)
    _close(model(x), ref(x))


def test_patch_parametrized_and_weight_norm(interpret):
    class Sym(torch.nn.Module):
        def forward(self, w):
            return w.triu() + w.triu(1).T

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)).double()
    parametrize.register_parametrization(model[0], "weight", Sym())
    ref = copy.deepcopy(model)
    report = fnn.patch(model)       # ParametrizedLinear is a subclass: left alone, still correct
    assert [p.path for p in report.replaced] == ["1"] and len(report.skipped) == 1
    x = _t(3, 8)
    _close(model(x), ref(x))
    # parametrizing a patched module keeps the fusedops forward and the parametrization
    patched = torch.nn.Sequential(torch.nn.Linear(8, 8)).double()
    fnn.patch(patched)
    parametrize.register_parametrization(patched[0], "weight", Sym())
    assert isinstance(patched[0], fnn.Linear) and parametrize.is_parametrized(patched[0])
    _close(patched(x), F.linear(x, Sym()(patched[0].parametrizations.weight.original), patched[0].bias))
    # the hook-based weight_norm: the pre-hook recomputes weight before the patched forward
    torch.manual_seed(1)
    a = torch.nn.utils.weight_norm(torch.nn.Linear(8, 8)).double()
    torch.manual_seed(1)
    b = torch.nn.utils.weight_norm(torch.nn.Linear(8, 8)).double()
    assert len(fnn.patch(a).replaced) == 1
    with torch.no_grad():
        a.weight_g.mul_(2)
        b.weight_g.mul_(2)
    _close(a(x), b(x))


def test_patch_state_dict_round_trip_and_dtype_moves(fallback):
    model = _TorchBlock()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fnn.patch(model)
    after = model.state_dict()
    assert list(before) == list(after) and all(torch.equal(before[k], after[k]) for k in before)
    plain = _TorchBlock()
    plain.load_state_dict(after)
    model.double()
    plain.double()
    x = _t(2, 3, 8, grad=False)
    _close(model(x), plain(x))
    model.to(torch.float32)
    assert model(x.float()).dtype == torch.float32
    assert type(copy.deepcopy(model).fc) is fnn.Linear


def test_patch_multihead_attention_kdim_vdim_masks(interpret):
    model = torch.nn.MultiheadAttention(8, 2, kdim=6, vdim=5).double()
    ref = copy.deepcopy(model)
    fnn.patch(model)
    q, k, v = _t(3, 2, 8, grad=False), _t(4, 2, 6, grad=False), _t(4, 2, 5, grad=False)
    padding = torch.zeros(2, 4, dtype=torch.bool)
    padding[1, 3] = True
    causal = torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=D)[:3]
    for kwargs in (dict(key_padding_mask=padding), dict(attn_mask=causal), dict(average_attn_weights=False)):
        out, weights = model(q, k, v, **kwargs)
        out_ref, weights_ref = ref(q, k, v, **kwargs)
        _close(out, out_ref)
        _close(weights, weights_ref)
