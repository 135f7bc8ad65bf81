"""Review of three session-37 changes: NormFunction's unsaved weight and once_differentiable's error node taking
the incoming gradients (fa011b8), a literal-started loop carry adopting a type through an `if` (00b0242), and
fusedops.nn's tensor-subclass / torch-mode routing and torch.jit.script support (fb7613d).

Defect found and fixed (fusedops/dsl/frontend/carried_types.py):
- a literal-started carry whose `if` branch computes it from itself and another carried variable (`acc = acc + b`
  with `b` assigned in the loop too) and whose other branch gives it another type (`acc = x_f32`) was refused
  ("`acc` has type int32 in the `if` branch and float32 in the `else` branch"), although the same branches with
  `b` not carried, or the two statements one after the other, adopt float32: `carried_source` gave up on meeting
  any carried variable of another name instead of passing over it.

Defect found and fixed (fusedops/nn/patch.py): the README now says torch.jit.script of a patched model scripts
torch's ops, but a model with patched transformers modules (GPT-2's Conv1D, LlamaRMSNorm and the other T5-style
RMSNorms), which script as originals, failed to script ("Compiled functions can't take variable number of
arguments": the mixins' forward calls subclass_or_mode(*tensors), and TorchScript has no super()). The mixins
now run the original's forward under torch.jit.is_scripting(), kept on the patched class as `_original_forward`
(a renamed copy: TorchScript names a method by its function's name).

Defect found and fixed (fusedops/library/norm_ops.py): under torch.compile the rms_norm / layer_norm custom
operators' setup_context still saved the weight where no dx is wanted, so the false "modified by an inplace
operation" error fa011b8 removed from eager remained there (torch's own F.rms_norm compiles without it); it now
saves a copy of the weight then.
"""

from __future__ import annotations

import io
import math

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.nn as fnn
from fusedops.dsl import CompilationError
from fusedops.nn.linear import subclass_or_mode
from kernel_source import jit_from_source
from python_dsl import PythonDsl, PythonPointer

NAN = float("nan")


@pytest.fixture(autouse=True)
def _interpret(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "s37_changes_cache"))


# == frontend (00b0242) ============================================================================================
def _python_run(source, *args):
    scope = {"dsl": PythonDsl}
    exec(source, scope)
    stored = {}
    scope["k"](PythonPointer(stored), *args)
    return [stored.get(i, NAN) for i in range(2)]


_ADOPTING = {
    # defect: another carried variable in the branch that keeps `acc` (carried_source gave up on `b`)
    "two_carries": "    acc = 0\n    b = 0\n    for i in range(n):\n        b = b + 1\n        if i > a:\n"
                   "            acc = acc + b\n        else:\n            acc = x\n    dsl.store(o_ptr, acc)\n",
    "two_carries_retyped_too": "    acc = 0\n    b = 0\n    for i in range(n):\n        if i > a:\n"
                               "            acc = b + acc * 2\n        else:\n            acc = x\n        b = b + 0.5\n"
                               "    dsl.store(o_ptr, acc)\n    dsl.store(o_ptr + 1, b)\n",
    # the change's own kind, in shapes its tests do not write
    "nested_ifs": "    acc = 0\n    for i in range(n):\n        if i > a:\n            if i > a + 1:\n"
                  "                acc = x\n    dsl.store(o_ptr, acc)\n",
    "while_condition_on_carry": "    acc = 0\n    while acc < n:\n        if acc > a:\n            acc = acc + 0.5\n"
                                "        else:\n            acc = acc + 1\n    dsl.store(o_ptr, acc)\n",
    "tuple_carry": "    t = (0, 0)\n    for i in range(n):\n        if i > a:\n            t = (x, t[1] + 1)\n"
                   "    dsl.store(o_ptr, t[0])\n    dsl.store(o_ptr + 1, t[1])\n",
    "bool_literal_then_int": "    s = True\n    for i in range(n):\n        if i > a:\n            s = 3\n"
                             "    dsl.store(o_ptr, s)\n",
    "inner_loop_literals": "    s = 1\n    for i in range(n):\n        for j in range(2):\n            if i > a:\n"
                           "                s = 0.5\n            else:\n                s = s * 2\n    dsl.store(o_ptr, s)\n",
    "used_after_the_if": "    acc = 0\n    for i in range(n):\n        if i > a:\n            acc = x\n"
                         "        dsl.store(o_ptr + 1, acc / 2)\n    dsl.store(o_ptr, acc)\n",
}


@pytest.mark.parametrize("case", sorted(_ADOPTING))
def test_a_literal_carry_adopting_a_type_in_an_if_follows_python(case):
    source = "def k(o_ptr, a, n, x):\n" + _ADOPTING[case]
    kernel = jit_from_source(source, f"<s37 changes {case}>")
    for a, n, x in ((1, 4, 2.5), (5, 3, -1.25), (0, 0, 1.0), (-1, 3, 0.75)):
        out = torch.full((2,), NAN)
        kernel[(1,)](out, a, n, x, interpret=True)
        expected = _python_run(source, a, n, x)
        assert [g == e or (math.isnan(g) and math.isnan(e)) for g, e in zip(out.tolist(), expected)] == [True] * 2, \
            (case, (a, n, x), out.tolist(), expected)


def test_defect_two_carries_compiled_on_the_host_matches_python():
    from host_jit import run_on_host

    source = "def k(o_ptr, a, n, x):\n" + _ADOPTING["two_carries"]
    kernel = jit_from_source(source, "<s37 changes two carries host>")
    out = torch.full((2,), NAN)
    run_on_host(kernel, out, 1, 4, 2.5)
    assert out.tolist()[0] == _python_run(source, 1, 4, 2.5)[0] == 9.5


_REFUSED = {
    "zeros_init": ("    acc = dsl.zeros((4,), dsl.float32)\n    for i in range(n):\n        if i > a:\n"
                   "            acc = dsl.load(i_ptr + dsl.arange(0, 4))\n    dsl.store(o_ptr + dsl.arange(0, 4), acc)\n",
                   r"`acc` has type <4xint32> in the `if` branch and <4xfloat32>"),
    "float_literal_to_int": ("    acc = 0.5\n    for i in range(n):\n        if i > a:\n            acc = dsl.load(i_ptr)\n"
                             "    dsl.store(o_ptr, acc)\n", r"`acc` has type int32 in the `if` branch and float32"),
    "pointer": ("    acc = 0\n    for i in range(n):\n        if i > a:\n            acc = i_ptr\n    dsl.store(o_ptr, acc)\n",
                r"`acc` has type ptr<int32> in the `if` branch"),
    "shapes": ("    acc = 0\n    for i in range(n):\n        if i > a:\n            acc = dsl.arange(0, 4) * x\n"
               "        else:\n            acc = acc + dsl.arange(0, 8)\n    dsl.store(o_ptr, dsl.sum(acc, axis=0))\n",
               r"`acc` has type <4xfloat32> in the `if` branch and <8xint32>"),
    "runtime_init": ("    acc = a * 2\n    for i in range(n):\n        if i > a:\n            acc = x\n    dsl.store(o_ptr, acc)\n",
                     r"`acc` has type float32 in the `if` branch and int32"),
    "another_variable": ("    acc = 0\n    for i in range(n):\n        if i > a:\n            y = acc\n        else:\n"
                         "            y = x\n        acc = acc + 1\n    dsl.store(o_ptr, acc)\n",
                         r"`y` has type int32 in the `if` branch and float32"),
    "other_carry_only": ("    acc = 0\n    b = 0\n    for i in range(n):\n        b = b + 1\n        if i > a:\n"
                         "            acc = b\n        else:\n            acc = x\n    dsl.store(o_ptr, acc)\n",
                         r"`acc` has type int32 in the `if` branch and float32"),
}


@pytest.mark.parametrize("case", sorted(_REFUSED))
def test_real_type_conflicts_in_a_loop_if_still_raise(case):
    body, message = _REFUSED[case]
    kernel = jit_from_source("def k(o_ptr, a, n, x, i_ptr):\n" + body, f"<s37 changes refused {case}>")
    with pytest.raises(CompilationError, match=message):
        kernel[(1,)](torch.zeros(8), 1, 4, 2.5, torch.zeros(8, dtype=torch.int32), interpret=True)


# == NormFunction's unsaved weight, once_differentiable's incoming gradients (fa011b8) =============================
def _data(requires_x):
    torch.manual_seed(0)
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=requires_x)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    b = torch.randn(8, dtype=torch.float64, requires_grad=True)
    return x, w, b


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_weight_changed_in_place_after_the_forward(op):
    x, w, b = _data(False)
    args = (w,) if op == "rms_norm" else (w, b)
    y = getattr(fusedops, op)(x, (8,), *args)
    expected = torch.autograd.grad(getattr(F, op)(x, (8,), *args).sum(), w)[0]
    with torch.no_grad():
        w.mul_(2)       # dweight does not read the weight's values
    assert torch.allclose(torch.autograd.grad(y.sum(), w)[0], expected)
    x.requires_grad_()
    y = getattr(fusedops, op)(x, (8,), *args)
    with torch.no_grad():
        w.mul_(2)       # dx does: the version check stays
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_weight_changed_in_place_after_a_compiled_forward(op):
    # the custom operators' setup_context (library/norm_ops) saves a copy of the weight where no dx is wanted
    x, w, b = _data(False)
    args = (w,) if op == "rms_norm" else (w, b)
    expected = torch.autograd.grad(getattr(F, op)(x, (8,), *args).sum(), w)[0]
    compiled = torch.compile(lambda x, *args: getattr(fusedops, op)(x, (8,), *args), backend="aot_eager",
                             fullgraph=True)
    y = compiled(x, *args)
    with torch.no_grad():
        w.mul_(2)       # dweight does not read the weight's values
    assert torch.allclose(torch.autograd.grad(y.sum(), w)[0], expected)
    x.requires_grad_()
    y = compiled(x, *args)
    with torch.no_grad():
        w.mul_(2)       # dx does: the version check stays
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("requires_x", [False, True])
def test_unsaved_weight_under_saved_tensor_hooks_and_checkpoint(requires_x):
    from torch.utils.checkpoint import checkpoint

    x, w, _ = _data(requires_x)
    inputs = (x, w) if requires_x else (w,)
    expected = torch.autograd.grad((F.rms_norm(x, (8,), w) * 3).sum(), inputs)
    with torch.autograd.graph.save_on_cpu():
        got = torch.autograd.grad((fusedops.rms_norm(x, (8,), w) * 3).sum(), inputs)
    assert all(torch.allclose(g, e) for g, e in zip(got, expected))
    out = checkpoint(lambda x: fusedops.rms_norm(x, (8,), w) * 3, x, use_reentrant=False)
    got = torch.autograd.grad(out.sum(), inputs)
    assert all(torch.allclose(g, e) for g, e in zip(got, expected))
    if requires_x:      # (a reentrant checkpoint needs an input that requires grad, and .backward())
        checkpoint(lambda x: fusedops.rms_norm(x, (8,), w) * 3, x, use_reentrant=True).sum().backward()
        assert all(torch.allclose(t.grad, e) for t, e in zip(inputs, expected))


def test_first_order_gradients_with_create_graph_and_grad_outputs_that_require_grad():
    x, w, _ = _data(True)
    v = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    got = torch.autograd.grad(fusedops.rms_norm(x, (8,), w), (x, w), v, create_graph=True)
    expected = torch.autograd.grad(F.rms_norm(x, (8,), w), (x, w), v, create_graph=True)
    assert all(torch.allclose(g, e) and g.requires_grad for g, e in zip(got, expected))
    # ... whose derivative in v (what jvp's double-vjp trick takes) raises rather than giving zeros
    with pytest.raises(RuntimeError, match="differentiate twice a fusedops op"):
        torch.autograd.grad(got[0].sum(), v)
    x, w, _ = _data(False)      # the weight unsaved: dweight's derivative in v raises too
    dw, = torch.autograd.grad(fusedops.rms_norm(x, (8,), w), w, v, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice a fusedops op"):
        torch.autograd.grad(dw.sum(), v)


# == fusedops.nn (fb7613d) ==========================================================================================
def _linear(**kwargs):
    torch.manual_seed(0)
    return fnn.Linear(8, 4, dtype=torch.float64, **kwargs)


_X = torch.randn(3, 8, dtype=torch.float64)


@pytest.mark.parametrize("how", ["parametrize", "weight_norm", "spectral_norm"])
def test_linear_with_a_computed_weight_keeps_the_fused_path(how, monkeypatch):
    m = _linear(activation="relu")
    if how == "parametrize":
        class Double(torch.nn.Module):
            def forward(self, w):
                return w * 2
        torch.nn.utils.parametrize.register_parametrization(m, "weight", Double())
    elif how == "weight_norm":
        m = torch.nn.utils.parametrizations.weight_norm(m)
    else:
        m = torch.nn.utils.spectral_norm(m).eval()
    assert not subclass_or_mode(_X, m.weight, m.bias)
    calls = []
    matmul = fusedops.functional.matmul
    monkeypatch.setattr(fusedops.functional, "matmul", lambda *a, **k: calls.append(1) or matmul(*a, **k))
    assert torch.allclose(m(_X), F.relu(F.linear(_X, m.weight, m.bias)))
    assert calls == [1]


def test_linear_parameter_subclass_sees_the_linear_call():
    seen = []

    class Tracked(torch.nn.Parameter):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", str(func)))
            return super().__torch_function__(func, types, args, kwargs or {})

    m = _linear(activation="gelu")
    m.weight = Tracked(m.weight.detach().clone())
    out = m(_X)
    assert "linear" in seen
    assert torch.allclose(out, F.gelu(F.linear(_X, m.weight.detach(), m.bias)))


def test_linear_under_torch_device_autocast_and_a_dispatch_mode():
    from torch.utils.flop_counter import FlopCounterMode

    m = _linear()
    with torch.device("cpu"):
        assert not subclass_or_mode(_X, m.weight)
        assert torch.allclose(m(_X), F.linear(_X, m.weight, m.bias))
    with FlopCounterMode(display=False) as counter:
        m(_X)
    assert counter.get_total_flops() == 2 * 3 * 8 * 4
    f32 = _linear().float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert f32(_X.float()).dtype == torch.bfloat16


def test_scripted_sequential_and_patched_model_save_and_load():
    from fusedops.nn.patch import patch

    x = torch.randn(2, 3, 8)
    seq = torch.nn.Sequential(fnn.Linear(8, 8, activation="silu"), fnn.LayerNorm(8), fnn.RMSNorm(8, eps=None),
                              fnn.Softmax(-1), fnn.LogSoftmax(dim=-1))
    scripted = torch.jit.script(seq)
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    assert torch.allclose(scripted(x), seq(x), atol=1e-6) and torch.allclose(loaded(x), seq(x), atol=1e-6)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.norm = torch.nn.Linear(8, 8), torch.nn.RMSNorm(8)
            self.mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x):
            h = self.norm(self.lin(x))
            return self.mha(h, h, h)[0]

    block = Block().eval()
    reference = block(x)
    patch(block)
    assert isinstance(block.lin, fnn.Linear) and isinstance(block.mha, fnn.MultiheadAttention)
    frozen = torch.jit.freeze(torch.jit.script(block))
    assert torch.allclose(frozen(x), reference, atol=1e-6)


def test_rms_norm_keyword_x_reaches_kwargs_hooks():
    norm, seen = fnn.RMSNorm(8), []
    norm.register_forward_pre_hook(lambda module, args, kwargs: seen.append(sorted(kwargs)), with_kwargs=True)
    x = torch.randn(2, 8)
    assert torch.allclose(norm(x=x), torch.nn.RMSNorm(8)(x=x))
    assert seen == [["x"]]


@pytest.mark.parametrize("kind", ["LlamaRMSNorm", "Conv1D"])
def test_defect_scripting_a_model_with_patched_transformers_modules(kind):
    import hf_standins
    from fusedops.nn.patch import patch

    torch.manual_seed(0)
    module = hf_standins.LlamaRMSNorm(8) if kind == "LlamaRMSNorm" else hf_standins.Conv1D(4, 8)
    model = torch.nn.Sequential(module, torch.nn.Linear(8 if kind == "LlamaRMSNorm" else 4, 4))
    x = torch.randn(2, 3, 8)
    reference = model(x)
    patch(model)
    assert type(model[0]).__name__ == f"Fused{kind}" and isinstance(model[1], fnn.Linear)
    scripted = torch.jit.script(model)        # a TorchScript NotSupportedError before the fix
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    for m in (scripted, torch.jit.load(buffer), model):
        assert torch.allclose(m(x), reference, atol=1e-6)
    assert type(model[0]).__name__ == f"Fused{kind}"      # the eager model stays patched


def test_a_patched_class_of_a_wrapped_forward_still_patches():
    import functools

    import hf_standins
    from fusedops.nn.patch import _fused_subclass, _T5RMSNormForward

    class Wrapped(hf_standins.LlamaRMSNorm):
        forward = functools.partial(hf_standins.LlamaRMSNorm.forward)     # not a plain function

    fused = _fused_subclass(Wrapped, _T5RMSNormForward)
    assert fused._original_forward is Wrapped.__dict__["forward"]
    module = hf_standins.LlamaRMSNorm(8)
    module.__class__ = _fused_subclass(hf_standins.LlamaRMSNorm, _T5RMSNormForward)
    x = torch.randn(2, 8)
    assert torch.allclose(module(x), hf_standins.LlamaRMSNorm(8)(x), atol=1e-6)
