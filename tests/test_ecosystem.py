"""fusedops in the PyTorch ecosystem: custom ops (torch.library.opcheck), torch.compile without graph
breaks, fusedops.nn.patch on hand-written and transformers models, autocast.

CPU tier: opcheck through torch's ops (the CPU fallback) and through the interpreter
(FUSEDOPS_INTERPRET=1); compile with backend="aot_eager" (the custom ops run the interpreter); patch()
keeps outputs, parameters and state_dict; autocast logic with CPU autocast and a CUDA-policy mock.
GPU tier (-m cuda): patched models vs unpatched against a float64 reference, torch.compile of patched
models, opcheck and autocast on CUDA tensors. transformers tests skip when it is not installed.
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

import fusedops
import fusedops.nn as fnn
from fusedops import library
from fusedops.kernels import matmul as matmul_kernels
from fusedops.kernels import norms as norm_kernels
from fusedops.kernels import softmax as softmax_kernels
from helpers import assert_close

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
needs_transformers = pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed")
ops = torch.ops.fusedops


@pytest.fixture
def interpret(monkeypatch):
    """Run the fusedops kernels in the interpreter for this test (CPU tensors)."""
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    torch._dynamo.reset()       # compiled graphs froze the routing of the previous setting
    yield
    torch._dynamo.reset()


def _leaf(*shape, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape, dtype=dtype, device=device).requires_grad_()


# ------------------------------------------------------------------------------------------------
# opcheck
# ------------------------------------------------------------------------------------------------
def _opcheck_cases(device="cpu", dtype=torch.float32):
    t = lambda *shape: _leaf(*shape, dtype=dtype, device=device)  # noqa: E731
    return {
        "softmax": (ops.softmax, (t(3, 17), 1, None)),
        "softmax_transposed_dim0": (ops.softmax, (t(5, 3).transpose(0, 1), 0, None)),
        "softmax_upcast": (ops.softmax, (t(2, 9), -1, torch.float32 if dtype != torch.float32 else torch.float64)),
        "log_softmax": (ops.log_softmax, (t(2, 3, 7), -1, None)),
        "layer_norm": (ops.layer_norm, (t(3, 2, 5), [2, 5], t(2, 5), t(2, 5), 1e-5)),
        "layer_norm_no_affine": (ops.layer_norm, (t(4, 6), [6], None, None, 1e-5)),
        "rms_norm": (ops.rms_norm, (t(3, 7), [7], t(7), 1e-6)),
        "rms_norm_no_weight": (ops.rms_norm, (t(3, 7), [7], None, 1e-6)),
        "matmul_bias": (ops.matmul, (t(3, 4), t(4, 5), t(5), None, None)),
        "matmul_batched_gelu": (ops.matmul, (t(2, 3, 4), t(4, 5), t(5), "gelu", None)),
        "matmul_vector": (ops.matmul, (t(4), t(2, 4, 3), None, None, None)),
    }


@pytest.mark.parametrize("path", ["fallback", "interpreter"])
@pytest.mark.parametrize("case", sorted(_opcheck_cases()))
def test_opcheck(case, path, monkeypatch):
    if path == "interpreter":
        monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    op, args = _opcheck_cases()[case]
    torch.library.opcheck(op, args)


def test_operators_run_the_kernels_under_the_interpreter(interpret, monkeypatch):
    calls = []
    for module, name in ((softmax_kernels, "softmax_forward"), (softmax_kernels, "softmax_backward"),
                         (norm_kernels, "norm_forward"), (norm_kernels, "norm_backward"), (matmul_kernels, "matmul")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k))
    x = _leaf(3, 8)
    (ops.softmax(x, -1).sum() + ops.layer_norm(x, [8], None, None, 1e-5)[0].square().sum()
     + ops.matmul(x, x.t().detach()).sum()).backward()
    assert set(calls) == {"softmax_forward", "softmax_backward", "norm_forward", "norm_backward", "matmul"}


def test_operator_outputs_match_torch_on_the_fallback():
    x, w, b = torch.randn(4, 6, dtype=torch.float64), torch.randn(6, dtype=torch.float64), torch.randn(6)
    torch.testing.assert_close(ops.softmax(x, 0, None), torch.softmax(x, 0))
    torch.testing.assert_close(ops.log_softmax(x.float(), 1, torch.float64), torch.log_softmax(x.float(), 1,
                                                                                           dtype=torch.float64))
    y, mean, rstd = ops.layer_norm(x, [6], w, b.double(), 1e-5)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (6,), w, b.double(), 1e-5))
    torch.testing.assert_close(mean, x.mean(1))
    torch.testing.assert_close(rstd, torch.rsqrt(x.var(1, unbiased=False) + 1e-5))
    torch.testing.assert_close(ops.matmul(x.t().float(), x.float(), b, "relu", torch.float64),
                               torch.relu(x.t().float() @ x.float() + b).double())


# ------------------------------------------------------------------------------------------------
# torch.compile
# ------------------------------------------------------------------------------------------------
class Block(torch.nn.Module):
    """A pre-norm transformer block of torch.nn modules: LayerNorm, Linear, Softmax, RMSNorm, LogSoftmax."""

    def __init__(self, width: int = 16, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.norm = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.attend = torch.nn.Softmax(dim=-1)
        self.out = torch.nn.Linear(width, width, bias=False)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.GELU(),
                                       torch.nn.Linear(2 * width, width))
        self.final_norm = torch.nn.RMSNorm(width)
        self.log_probs = torch.nn.LogSoftmax(dim=-1)

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm(x)).view(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attention = self.attend(q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5))
        h = x + self.out((attention @ v).transpose(1, 2).reshape(batch, length, width))
        h = h + self.mlp(h)
        return self.log_probs(self.final_norm(h))


class FunctionalBlock(torch.nn.Module):
    """fusedops modules and functions directly, every op and a fused-activation Linear."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.norm = fnn.LayerNorm(width)
        self.qkv = fnn.Linear(width, 3 * width)
        self.mlp = fnn.Linear(width, width, activation="gelu")
        self.final_norm = fnn.RMSNorm(width)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, -1)
        attention = fusedops.softmax(fusedops.matmul(q, k.transpose(-1, -2)) * 0.3, -1)
        h = x + self.mlp(fusedops.matmul(attention, v))
        return fusedops.log_softmax(self.final_norm(h), -1)


def _fusedops_nodes(graph_module) -> list:
    return sorted(str(node.target) for node in graph_module.graph.nodes
                  if node.op == "call_function" and str(node.target).startswith("fusedops."))


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph_traces_the_custom_ops(interpret, dynamic):
    model = FunctionalBlock()
    x = _leaf(2, 5, 8)
    explanation = torch._dynamo.explain(model)(x)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
    assert _fusedops_nodes(explanation.graphs[0]) == sorted(
        ["fusedops.layer_norm", "fusedops.log_softmax", "fusedops.rms_norm", "fusedops.softmax"]
        + ["fusedops.matmul"] * 4)
    torch._dynamo.reset()

    eager = model(x)
    eager_grads = torch.autograd.grad(eager.square().sum(), [x, *model.parameters()])
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    out = compiled(x)
    grads = torch.autograd.grad(out.square().sum(), [x, *model.parameters()])
    assert_close(out, eager.double(), torch.float32)
    for grad, eager_grad in zip(grads, eager_grads):
        assert_close(grad, eager_grad.double(), torch.float32)


def test_compile_on_cpu_without_the_interpreter_traces_torch_ops():
    # CPU tensors run torch's ops (the compiler fuses those); the custom ops are for the kernels' devices.
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(FunctionalBlock())(torch.randn(2, 5, 8))
    assert explanation.graph_break_count == 0 and _fusedops_nodes(explanation.graphs[0]) == []


def test_compile_patched_torch_model(interpret):
    model = Block()
    fnn.patch(model)
    x = torch.randn(2, 3, 16)
    explanation = torch._dynamo.explain(model)(x)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
    assert "fusedops.matmul" in _fusedops_nodes(explanation.graphs[0])
    torch._dynamo.reset()
    assert_close(torch.compile(model, fullgraph=True, backend="aot_eager")(x), model(x).double(), torch.float32)


# ------------------------------------------------------------------------------------------------
# patch()
# ------------------------------------------------------------------------------------------------
class Subclassed(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x) * 2


def _report_paths(report):
    return ({r.path: r.replacement.rpartition(".")[2] for r in report.replaced},
            {s.path: s.reason for s in report.skipped})


def test_patch_replaces_modules_in_place_and_keeps_outputs():
    model = Block()
    reference = copy.deepcopy(model)
    parameters = dict(model.named_parameters())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    calls = []
    model.norm.register_forward_hook(lambda module, args, out: calls.append(type(module).__name__))
    x = torch.randn(2, 5, 16)

    report = fnn.patch(model)

    replaced, skipped = _report_paths(report)
    assert replaced == {"norm": "LayerNorm", "qkv": "Linear", "attend": "Softmax", "out": "Linear",
                        "mlp.0": "Linear", "mlp.2": "Linear", "final_norm": "RMSNorm", "log_probs": "LogSoftmax"}
    assert skipped == {}
    assert all(type(m).__module__.startswith("fusedops.nn") for _, m in model.named_modules()
               if isinstance(m, (torch.nn.Linear, torch.nn.LayerNorm, torch.nn.Softmax)))
    assert all(p is parameters[name] for name, p in model.named_parameters())
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    out = model(x)
    assert calls == ["LayerNorm"]       # the hook survived and saw the fusedops class
    assert_close(out, reference(x).double(), torch.float32)
    assert "8 modules replaced, 0 skipped" in str(report)


def test_patch_skips_with_reasons_and_honours_flags():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Subclassed(4, 4), torch.nn.LayerNorm(4), torch.nn.Softmax(-1),
                                torch.nn.MultiheadAttention(4, 1))
    model[0].forward = lambda x: x      # an accelerate-style instance forward
    report = fnn.patch(model, layer_norm=False, attention=False)
    replaced, skipped = _report_paths(report)
    assert replaced == {"3": "Softmax"}
    assert skipped.keys() == {"0", "1", "2", "4.out_proj"}
    assert "own forward" in skipped["0"] and "subclass" in skipped["1"] and skipped["2"] == "layer_norm=False"
    assert "subclass" in skipped["4.out_proj"]  # nn.MultiheadAttention's NonDynamicallyQuantizableLinear
    assert report.notes == []
    again = fnn.patch(model)
    assert {s.path: s.reason for s in again.skipped}["3"] == "already a fusedops module"
    assert "2" in {r.path for r in again.replaced}


def test_patch_keeps_shared_modules_and_tied_weights_shared():
    shared = torch.nn.Linear(4, 4)
    model = torch.nn.Sequential(shared, torch.nn.ReLU(), shared, torch.nn.Linear(4, 4))
    model[3].weight = shared.weight
    report = fnn.patch(model)
    assert model[0] is model[2] is shared and isinstance(shared, fnn.Linear)
    assert model[3].weight is shared.weight
    assert [r.path for r in report.replaced] == ["0", "3"]
    with pytest.raises(TypeError, match="torch.nn.Module"):
        fnn.patch(lambda x: x)


def test_patched_model_runs_the_kernels_under_the_interpreter(interpret):
    model = Block(width=8)
    reference = copy.deepcopy(model)
    fnn.patch(model)
    x = _leaf(1, 3, 8)
    x_reference = x.detach().clone().requires_grad_()
    out, expected = model(x), reference(x_reference)
    assert_close(out, expected.double(), torch.float32)
    weights = torch.randn(out.shape)    # not a plain sum: the rows of exp(log_softmax) sum to 1
    (out * weights).sum().backward()
    (expected * weights).sum().backward()
    assert_close(x.grad, x_reference.grad.double(), torch.float32)
    for p, p_reference in zip(model.parameters(), reference.parameters()):
        assert_close(p.grad, p_reference.grad.double(), torch.float32)


def _tiny_transformers_model(name: str):
    import transformers

    if name == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=64, n_positions=32,
                                         bos_token_id=0, eos_token_id=0)
        return transformers.GPT2LMHeadModel(config), {"Linear": 1, "LayerNorm": 5, "FusedConv1D": 8}
    if name == "bert":
        config = transformers.BertConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=16,
                                         intermediate_size=32, vocab_size=64, max_position_embeddings=32)
        return transformers.BertModel(config), {"Linear": 13, "LayerNorm": 5}
    config = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                      hidden_size=16, intermediate_size=32, vocab_size=64, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(config), {"Linear": 15, "FusedLlamaRMSNorm": 5}


def _first_output(output):
    return output.logits if hasattr(output, "logits") else output.last_hidden_state


@needs_transformers
@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_patch_transformers_model_on_cpu(name):
    model, expected_counts = _tiny_transformers_model(name)
    model.eval()
    reference = copy.deepcopy(model)
    ids = torch.randint(0, 64, (2, 7))
    report = fnn.patch(model)
    assert {k.rpartition(".")[2]: v for k, v in report.counts().items()} == expected_counts
    assert report.skipped == []
    assert model.state_dict().keys() == reference.state_dict().keys()
    assert_close(_first_output(model(ids)), _first_output(reference(ids)).double(), torch.float32)


# ------------------------------------------------------------------------------------------------
# autocast
# ------------------------------------------------------------------------------------------------
def test_autocast_policy_is_torchs(monkeypatch):
    assert library.autocast_dtype("softmax", "cuda") is None       # autocast off
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda device_type=None: True)
    monkeypatch.setattr(torch, "get_autocast_dtype", lambda device_type: torch.float16)
    # OPS: softmax, log_softmax, layer_norm, rms_norm (not cast: seen on the H200), matmul
    assert [library.autocast_dtype(op, "cuda") for op in library.OPS] == [torch.float32] * 3 + [None, torch.float16]
    assert [library.autocast_dtype(op, "cpu") for op in library.OPS] == [None] * 4 + [torch.float16]
    x = torch.ones(2, dtype=torch.float64)
    assert library.autocast_cast(x, torch.float16) is x     # float64 is not eligible, as in torch
    assert library.autocast_cast(x.float(), torch.float16).dtype == torch.float16


@pytest.mark.parametrize("route", ["fallback", "interpreter"])
def test_cpu_autocast_matches_torch(route, monkeypatch):
    if route == "interpreter":
        monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    a, b, bias = torch.randn(3, 8), torch.randn(8, 4), torch.randn(4)
    linear = fnn.Linear(8, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fusedops.matmul(a, b, bias).dtype == torch.nn.functional.linear(a, b.t(), bias).dtype == torch.bfloat16
        assert linear(a).dtype == torch.nn.functional.linear(a, linear.weight, linear.bias).dtype
        assert ops.matmul(a, b).dtype == torch.bfloat16                  # the operator's own registration
        assert fusedops.softmax(a, -1).dtype == torch.softmax(a, -1).dtype == torch.float32
        assert fusedops.layer_norm(a, (8,)).dtype == torch.float32
        assert_close(fusedops.matmul(a, b, bias), (a.double() @ b.double() + bias.double()), torch.bfloat16)


def test_cuda_autocast_policy_through_functional_with_a_mock(monkeypatch, interpret):
    # The CUDA policy (float32 for softmax and the norms) exercised on CPU tensors: CPU autocast on,
    # with the CUDA rules installed for the "cpu" device type.
    for op in ("softmax", "log_softmax", "layer_norm", "rms_norm"):
        monkeypatch.setitem(library._AUTOCAST_POLICY, op, {"cpu": "float32"})
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    weight = torch.ones(8, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fusedops.softmax(x, -1).dtype == torch.float32
        assert fusedops.log_softmax(x, -1, dtype=torch.bfloat16).dtype == torch.bfloat16   # explicit dtype wins
        assert fusedops.layer_norm(x, (8,), weight, weight).dtype == torch.float32
        assert fusedops.rms_norm(x, (8,), weight).dtype == torch.float32
        assert fusedops.softmax(x.double(), -1).dtype == torch.float64                     # not eligible
    assert_close(fusedops.softmax(x.float(), -1), torch.softmax(x.double(), -1), torch.float32)


def test_compile_under_autocast(interpret):
    linear = fnn.Linear(8, 4)
    x = torch.randn(3, 8)

    def step(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fusedops.softmax(linear(x), -1)

    explanation = torch._dynamo.explain(step)(x)
    assert explanation.graph_break_count == 0
    torch._dynamo.reset()
    out = torch.compile(step, fullgraph=True, backend="aot_eager")(x)
    assert out.dtype == torch.bfloat16
    assert_close(out, step(x).double(), torch.bfloat16)


# ------------------------------------------------------------------------------------------------
# GPU tier
# ------------------------------------------------------------------------------------------------
def _weighted_sum(out: torch.Tensor) -> torch.Tensor:
    """A loss whose gradient is not degenerate (exp(log_softmax) rows sum to 1; fixed weights per shape)."""
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(out.device)
    return (out.float() * weights).sum()


def _relative_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    return ((actual.double() - reference.double()).norm() / reference.double().norm().clamp_min(1e-30)).item()


def _run(model, inputs, loss):
    if isinstance(inputs, torch.Tensor) and inputs.is_floating_point():
        inputs = inputs.to(next(model.parameters()).dtype)     # the float64 reference gets float64 inputs
    out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    out = _first_output(out) if not isinstance(out, torch.Tensor) else out
    loss(out).backward()
    return out.detach(), [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def _assert_no_worse_than_torch(patched, unpatched, reference, inputs, loss, dtype):
    """The patched model's error against a float64 copy is at most 2x the unpatched model's error in
    the same dtype (plus the dtype's tolerance), for the output and every parameter gradient."""
    results = [_run(m, inputs, loss) for m in (patched, unpatched, reference)]
    floor = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    pairs = [(results[0][0], results[1][0], results[2][0])]
    pairs += list(zip(results[0][1], results[1][1], results[2][1]))
    assert len(results[0][1]) == len(results[2][1])
    for index, (ours, torchs, exact) in enumerate(pairs):
        ours_error, torch_error = _relative_error(ours, exact), _relative_error(torchs, exact)
        assert ours_error <= 2 * torch_error + floor, (index, ours_error, torch_error)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_patched_block_matches_unpatched_cuda(dtype):
    torch.manual_seed(0)
    unpatched = Block(width=128, heads=2).cuda().to(dtype)
    reference = copy.deepcopy(unpatched).double()
    patched = copy.deepcopy(unpatched)
    assert len(fnn.patch(patched).replaced) == 8
    x = torch.randn(4, 64, 128, device="cuda", dtype=dtype)
    _assert_no_worse_than_torch(patched, unpatched, reference, x, _weighted_sum, dtype)


@pytest.mark.cuda
@needs_transformers
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_patched_transformers_models_match_unpatched_cuda(name, dtype):
    torch.manual_seed(0)
    unpatched, _ = _tiny_transformers_model(name)
    unpatched = unpatched.cuda().to(dtype).eval()     # eval: no dropout, so the three runs see the same model
    reference = copy.deepcopy(unpatched).double()
    patched = copy.deepcopy(unpatched)
    report = fnn.patch(patched)
    assert report.replaced and not report.skipped
    ids = {"input_ids": torch.randint(0, 64, (2, 31), device="cuda")}
    _assert_no_worse_than_torch(patched, unpatched, reference, ids, lambda out: out.float().square().mean(), dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_compile_patched_block_cuda(dtype):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Block(width=128).cuda().to(dtype)
    fnn.patch(model)
    x = torch.randn(4, 64, 128, device="cuda", dtype=dtype)
    explanation = torch._dynamo.explain(model)(x)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
    assert {"fusedops.layer_norm", "fusedops.matmul", "fusedops.softmax", "fusedops.rms_norm",
            "fusedops.log_softmax"} <= set(_fusedops_nodes(explanation.graphs[0]))
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    eager_out, eager_grads = _run(model, x, _weighted_sum)
    model.zero_grad()
    out, grads = _run(compiled, x, _weighted_sum)
    assert_close(out, eager_out.double(), dtype)
    for grad, eager_grad in zip(grads, eager_grads):
        assert_close(grad, eager_grad.double(), dtype)


@pytest.mark.cuda
@needs_transformers
@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_compile_patched_transformers_model_cuda(name):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, _ = _tiny_transformers_model(name)
    model = model.cuda().to(torch.bfloat16).eval()
    fnn.patch(model)
    ids = torch.randint(0, 64, (2, 31), device="cuda")
    compiled = torch.compile(model, fullgraph=True)
    eager_out, _ = _run(model, {"input_ids": ids}, lambda out: out.float().square().mean())
    model.zero_grad()
    out, _ = _run(compiled, {"input_ids": ids}, lambda out: out.float().square().mean())
    assert_close(out, eager_out.double(), torch.bfloat16)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", sorted(_opcheck_cases()))
def test_opcheck_cuda(case, dtype):
    op, args = _opcheck_cases("cuda", dtype)[case]
    torch.library.opcheck(op, args)


_AUTOCAST_PAIRS = {
    "softmax": (lambda x, p: fusedops.softmax(x, -1), lambda x, p: torch.softmax(x, -1)),
    "log_softmax": (lambda x, p: fusedops.log_softmax(x, -1), lambda x, p: torch.log_softmax(x, -1)),
    "layer_norm": (lambda x, p: fusedops.layer_norm(x, (64,), p["w"], p["b"]),
                   lambda x, p: torch.nn.functional.layer_norm(x, (64,), p["w"], p["b"])),
    "rms_norm": (lambda x, p: fusedops.rms_norm(x, (64,), p["w"]),
                 lambda x, p: torch.nn.functional.rms_norm(x, (64,), p["w"])),
    # F.linear casts the bias too (torch.matmul(x, m) + b would promote back to float32).
    "matmul": (lambda x, p: fusedops.matmul(x, p["m"], p["b"]),
               lambda x, p: torch.nn.functional.linear(x, p["m"].t(), p["b"])),
    "linear": (lambda x, p: p["linear"](x), lambda x, p: torch.nn.functional.linear(x, p["linear"].weight,
                                                                                       p["linear"].bias)),
}


@pytest.mark.cuda
@pytest.mark.parametrize("input_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op", sorted(_AUTOCAST_PAIRS))
def test_cuda_autocast_matches_torch(op, dtype, input_dtype):
    ours, theirs = _AUTOCAST_PAIRS[op]
    params = {"w": _leaf(64, device="cuda"), "b": _leaf(64, device="cuda"), "m": _leaf(64, 64, device="cuda"),
              "linear": fnn.Linear(64, 64).cuda()}
    x = _leaf(8, 64, device="cuda", dtype=input_dtype)
    with torch.autocast("cuda", dtype=dtype):
        out, expected = ours(x, params), theirs(x, params)
    assert out.dtype == expected.dtype
    assert_close(out, expected.double(), expected.dtype)
    (gx,) = torch.autograd.grad(out.float().square().sum(), [x])
    (expected_gx,) = torch.autograd.grad(expected.float().square().sum(), [x])
    assert gx.dtype == expected_gx.dtype == input_dtype
    assert_close(gx, expected_gx.double(), dtype)
