"""fusedops in the PyTorch ecosystem: custom ops (torch.library.opcheck), torch.compile without graph
breaks, fusedops.nn.patch on hand-written and transformers models (modules and attention), autocast.

CPU tier: opcheck through torch's ops (the CPU fallback) and through the interpreter
(FUSEDOPS_INTERPRET=1); compile with backend="aot_eager" (the custom ops run the interpreter); patch()
keeps outputs, parameters and state_dict, switches transformers models to the "fusedops" attention
function and replaces nn.MultiheadAttention; autocast logic with CPU autocast and a CUDA-policy mock.
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
from fusedops.kernels import attention as attention_kernels
from fusedops.kernels import matmul as matmul_launch
from fusedops.kernels import norms
from fusedops.kernels import softmax
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
    keep = torch.rand(3, 5, generator=torch.Generator().manual_seed(0)).to(device) > 0.3
    keep[1] = False     # a fully masked row
    return {
        "attention": (ops.scaled_dot_product_attention, (t(1, 2, 5, 8), t(1, 2, 6, 8), t(1, 2, 6, 4), None, False,
                                                         None, False)),
        "attention_blhe_query": (ops.scaled_dot_product_attention, (t(2, 5, 3, 8).transpose(1, 2), t(2, 3, 6, 8),
                                                                    t(2, 3, 6, 4), None, True, None, False)),
        "attention_causal_gqa_scale": (ops.scaled_dot_product_attention, (t(1, 4, 5, 8), t(1, 2, 5, 8),
                                                                          t(1, 2, 5, 8), None, True, 0.3, True)),
        "attention_bool_mask_broadcast": (ops.scaled_dot_product_attention, (t(2, 1, 3, 8), t(2, 5, 8), t(5, 8), keep,
                                                                             False, None, False)),
        "attention_additive_mask_3d": (ops.scaled_dot_product_attention,
                                       (t(2, 3, 8), t(2, 5, 8), t(2, 5, 8), torch.randn(1, 3, 5, device=device,
                                                                                        dtype=dtype), True, None,
                                        False)),
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
    for module, name in ((softmax, "softmax_forward"), (softmax, "softmax_backward"),
                         (norms, "norm_forward"), (norms, "norm_backward"),
                         (matmul_launch, "matmul_into")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k))
    x = _leaf(3, 8)
    (ops.softmax(x, -1).sum() + ops.layer_norm(x, [8], None, None, 1e-5)[0].square().sum()
     + ops.matmul(x, x.t().detach()).sum()).backward()
    assert set(calls) == {"softmax_forward", "softmax_backward", "norm_forward", "norm_backward", "matmul_into"}


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


def _attention_cases():
    """(query, key, value, attn_mask, is_causal, scale, enable_gqa) in float64: GQA, broadcast batch and
    heads, a boolean mask with a fully masked row, an additive mask, causal with L != S, rank 5."""
    t = lambda *shape: torch.randn(*shape, dtype=torch.float64)  # noqa: E731
    keep = torch.rand(5, 7) > 0.3
    keep[2] = False
    return {
        "gqa_causal": (t(2, 4, 5, 8), t(2, 2, 7, 8), t(2, 2, 7, 4), None, True, None, True),
        "broadcast_bool_mask": (t(2, 3, 5, 8), t(1, 7, 8), t(7, 8), keep, False, 0.5, False),
        "additive_mask_causal_rank5": (t(2, 1, 2, 5, 8), t(2, 2, 1, 3, 8), t(1, 2, 3, 8), t(1, 5, 3), True, None,
                                       False),
    }


@pytest.mark.parametrize("path", ["fallback", "interpreter"])
@pytest.mark.parametrize("case", sorted(_attention_cases()))
def test_attention_operator_matches_torch(case, path, monkeypatch):
    if path == "interpreter":
        monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    query, key, value, mask, causal, scale, gqa = _attention_cases()[case]
    inputs = [t.requires_grad_() for t in (query, key, value)]
    out, lse = ops.scaled_dot_product_attention(*inputs, mask, causal, scale, gqa)
    if causal and mask is not None:     # torch refuses both: fold the causal mask into the additive one
        length_q, length_k = query.size(-2), key.size(-2)
        below = torch.ones(length_q, length_k, dtype=torch.bool).tril()
        mask, causal = mask + torch.zeros(length_q, length_k).masked_fill(~below, -float("inf")), False
    expected = torch.nn.functional.scaled_dot_product_attention(*inputs, attn_mask=mask, is_causal=causal,
                                                                scale=scale, enable_gqa=gqa)
    assert out.shape == expected.shape and lse.shape == (*out.shape[:-2], 2, out.shape[-2]) and lse.dtype == torch.float64
    assert_close(out, expected, torch.float64)
    weights = torch.randn(out.shape)
    grads = torch.autograd.grad((out * weights).sum(), inputs)
    expected_grads = torch.autograd.grad((expected * weights).sum(), inputs)
    for grad, expected_grad, t in zip(grads, expected_grads, inputs):
        assert grad.shape == t.shape
        assert_close(grad, expected_grad, torch.float64)


def test_attention_operator_lse_is_the_base_2_log_sum_exp(monkeypatch):
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    keep = torch.ones(4, 6, dtype=torch.bool)
    keep[1] = False
    expected = torch.logsumexp((q @ k.transpose(-1, -2) / 8 ** 0.5).masked_fill(~keep, -float("inf")), -1)
    expected = (expected / torch.log(torch.tensor(2.0))).masked_fill(~keep.any(-1), float("inf"))
    _, lse = ops.scaled_dot_product_attention(q, k, v, keep, False, None, False)
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    _, lse_kernel = ops.scaled_dot_product_attention(q, k, v, keep, False, None, False)
    for pair in (lse, lse_kernel):      # (hi, lo): the log-sum-exp as an unevaluated sum (kernels/attention.py)
        assert pair.shape == (1, 2, 2, 4)
        actual = pair[..., 0, :] + pair[..., 1, :]
        assert torch.equal(actual.isinf(), expected.isinf())
        torch.testing.assert_close(actual.nan_to_num(posinf=0.0), expected.nan_to_num(posinf=0.0))


def test_eager_attention_does_not_go_through_the_operator(interpret, monkeypatch):
    monkeypatch.setattr(library, "scaled_dot_product_attention", lambda *a: pytest.fail("the custom op ran eagerly"))
    q = _leaf(1, 2, 3, 8)
    fusedops.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    assert q.grad is not None


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph_traces_the_attention_op(interpret, dynamic):
    def attend(q, k, v, mask):
        return fusedops.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True, enable_gqa=True)

    q, k, v, mask = _leaf(2, 4, 5, 8), _leaf(2, 2, 5, 8), _leaf(2, 2, 5, 8), torch.rand(5, 5) > 0.2
    explanation = torch._dynamo.explain(attend)(q, k, v, mask)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
    assert _fusedops_nodes(explanation.graphs[0]) == ["fusedops.scaled_dot_product_attention"]
    torch._dynamo.reset()
    eager = attend(q, k, v, mask)
    eager_grads = torch.autograd.grad(eager.square().sum(), [q, k, v])
    out = torch.compile(attend, fullgraph=True, backend="aot_eager", dynamic=dynamic)(q, k, v, mask)
    grads = torch.autograd.grad(out.square().sum(), [q, k, v])
    assert_close(out, eager.double(), torch.float32)
    for grad, eager_grad in zip(grads, eager_grads):
        assert_close(grad, eager_grad.double(), torch.float32)


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_keeps_the_attention_output_layout_for_nanogpts_head_merge(interpret, dynamic):
    # q, k, v split from one projection and viewed (B, T, H, E) -> (B, H, T, E): the merge of the heads is a
    # view, in eager mode and in the traced graph alike (the op's fake output has the eager output's strides)
    def attend(x):
        q, k, v = (t.view(2, 5, 2, 4).transpose(1, 2) for t in x.split(8, dim=2))
        return fusedops.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).view(2, 5, 8)

    x = _leaf(2, 5, 24)
    eager = attend(x)
    eager_grad = torch.autograd.grad(eager.square().sum(), x)[0]
    out = torch.compile(attend, fullgraph=True, backend="aot_eager", dynamic=dynamic)(x)
    grad = torch.autograd.grad(out.square().sum(), x)[0]
    assert_close(out, eager.double(), torch.float32)
    assert_close(grad, eager_grad.double(), torch.float32)


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
    assert skipped.keys() == {"0", "1", "2", "4", "4.out_proj"}
    assert "own forward" in skipped["0"] and "subclass" in skipped["1"] and skipped["2"] == "layer_norm=False"
    assert skipped["4"] == "attention=False"
    assert "subclass" in skipped["4.out_proj"]  # nn.MultiheadAttention's NonDynamicallyQuantizableLinear
    assert report.notes == [] and report.attention == []
    again = fnn.patch(model)
    assert {s.path: s.reason for s in again.skipped}["3"] == "already a fusedops module"
    assert {"2", "4"} <= {r.path for r in again.replaced}
    assert type(model[4]) is fnn.MultiheadAttention


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


def _padding_mask(batch: int, length: int, device="cpu") -> torch.Tensor:
    """A (batch, length) attention mask whose last row is right-padded by 2 (no query row is fully
    masked, so torch's fused SDPA kernels give no NaN either)."""
    mask = torch.ones(batch, length, dtype=torch.long, device=device)
    mask[-1, -2:] = 0
    return mask


def _configs(model) -> list:
    return [m.config for m in model.modules() if hasattr(m, "config") and hasattr(m.config, "_attn_implementation")]


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
    assert [(a.path, a.model_type.rpartition(".")[2], a.original, a.replacement) for a in report.attention] == [
        ("", type(model).__name__, "sdpa", "fusedops")]
    assert all(c._attn_implementation == "fusedops" for c in _configs(model))
    assert reference.config._attn_implementation == "sdpa"
    assert f"attention of <model> ({type(model).__module__}.{type(model).__name__}): sdpa -> fusedops" in str(report)
    assert model.state_dict().keys() == reference.state_dict().keys()
    assert_close(_first_output(model(ids)), _first_output(reference(ids)).double(), torch.float32)
    mask = _padding_mask(2, 7)
    assert_close(_first_output(model(ids, attention_mask=mask)),
                 _first_output(reference(ids, attention_mask=mask)).double(), torch.float32)
    again = fnn.patch(model)
    assert again.attention == [] and [s.reason for s in again.skipped if s.path == ""] == [
        "already on the fusedops attention"]


@needs_transformers
def test_patch_transformers_attention_runs_the_kernels_under_the_interpreter(interpret, monkeypatch):
    # LLaMA: grouped-query attention (2 query heads, 1 key/value head), causal, with a padding mask.
    calls = []
    for name in ("attention_forward", "attention_backward"):
        original = getattr(attention_kernels, name)
        monkeypatch.setattr(attention_kernels, name,
                            lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k))
    model, _ = _tiny_transformers_model("llama")
    model.eval()
    reference = copy.deepcopy(model)
    fnn.patch(model, linear=False, layer_norm=False)     # attention only: keeps the interpreter's work small
    ids, mask = torch.randint(0, 64, (2, 5)), _padding_mask(2, 5)
    out, expected = (m(ids, attention_mask=mask).logits for m in (model, reference))
    assert_close(out, expected.double(), torch.float32)
    out.square().mean().backward()
    expected.square().mean().backward()
    for (name, p), p_reference in zip(model.named_parameters(), reference.parameters()):
        assert_close(p.grad, p_reference.grad.double(), torch.float32)
    assert calls.count("attention_forward") == calls.count("attention_backward") == 2    # one per layer


@needs_transformers
def test_patched_transformers_attention_with_dropout_runs_torch(interpret, monkeypatch):
    # The kernels have no attention dropout: while training with dropout, torch's SDPA runs instead.
    monkeypatch.setattr(attention_kernels, "attention_forward", lambda *a, **k: pytest.fail("kernel ran"))
    import transformers

    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=32, attn_pdrop=0.5,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).train()
    report = fnn.patch(model, linear=False, layer_norm=False)
    assert len(report.attention) == 1 and "attention dropout" in report.notes[0]
    assert torch.isfinite(model(torch.randint(0, 64, (1, 4))).logits).all()


def test_patch_replaces_multihead_attention():
    model = torch.nn.Sequential(torch.nn.MultiheadAttention(16, 2, batch_first=True))
    reference = copy.deepcopy(model)
    state = model.state_dict()
    report = fnn.patch(model)
    assert _report_paths(report)[0] == {"0": "MultiheadAttention"}
    assert type(model[0]) is fnn.MultiheadAttention and model.state_dict().keys() == state.keys()
    x = torch.randn(2, 5, 16)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(5)
    out, _ = model[0](x, x, x, need_weights=False, attn_mask=causal)
    expected, _ = reference[0](x, x, x, need_weights=False, attn_mask=causal)
    assert_close(out, expected.double(), torch.float32)


@needs_transformers
def test_compile_patched_transformers_model_traces_the_attention_op(interpret):
    model, _ = _tiny_transformers_model("llama")
    model.eval()
    fnn.patch(model, linear=False, layer_norm=False)
    ids = torch.randint(0, 64, (1, 5))
    explanation = torch._dynamo.explain(model)(ids)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
    assert _fusedops_nodes(explanation.graphs[0]) == ["fusedops.scaled_dot_product_attention"] * 2


# ------------------------------------------------------------------------------------------------
# autocast
# ------------------------------------------------------------------------------------------------
def test_autocast_policy_is_torchs(monkeypatch):
    assert library.autocast_dtype("softmax", "cuda") is None       # autocast off
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda device_type=None: True)
    monkeypatch.setattr(torch, "get_autocast_dtype", lambda device_type: torch.float16)
    # OPS: softmax, log_softmax, layer_norm, rms_norm (float32 from torch 2.12, not cast before: seen on the H200
    # with torch 2.11), matmul, attention
    rms_norm = torch.float32 if torch._C._dispatch_has_kernel_for_dispatch_key("aten::rms_norm", "AutocastCUDA") else None
    cuda = [torch.float32] * 3 + [rms_norm] + [torch.float16] * 2
    assert [library.autocast_dtype(op, "cuda") for op in library.OPS] == cuda
    assert [library.autocast_dtype(op, "cpu") for op in library.OPS] == [None] * 4 + [torch.float16] * 2
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
        q, mask = torch.randn(1, 2, 5, 8), torch.randn(5, 5)
        sdpa = fusedops.scaled_dot_product_attention(q, q.bfloat16(), q, attn_mask=mask)    # mixed dtypes: cast
        expected = torch.nn.functional.scaled_dot_product_attention(q, q.bfloat16(), q, attn_mask=mask)
        assert sdpa.dtype == expected.dtype == torch.bfloat16
        assert ops.scaled_dot_product_attention(q, q, q, mask, False, None, False)[0].dtype == torch.bfloat16
        assert_close(sdpa, expected.double(), torch.bfloat16)


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


def _named_grads(model):
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


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
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_patched_transformers_models_match_unpatched_cuda(name, dtype, padded):
    torch.manual_seed(0)
    unpatched, _ = _tiny_transformers_model(name)
    unpatched = unpatched.cuda().to(dtype).eval()     # eval: no dropout, so the three runs see the same model
    reference = copy.deepcopy(unpatched).double()
    patched = copy.deepcopy(unpatched)
    report = fnn.patch(patched)
    assert report.replaced and not report.skipped and [a.replacement for a in report.attention] == ["fusedops"]
    inputs = {"input_ids": torch.randint(0, 64, (2, 31), device="cuda")}
    if padded:
        inputs["attention_mask"] = _padding_mask(2, 31, "cuda")
    _assert_no_worse_than_torch(patched, unpatched, reference, inputs, lambda out: out.float().square().mean(), dtype)


@pytest.mark.cuda
@needs_transformers
def test_patched_transformers_attention_runs_the_kernels_cuda(monkeypatch):
    calls = []
    original = attention_kernels.attention_forward
    monkeypatch.setattr(attention_kernels, "attention_forward", lambda *a, **k: calls.append(1) or original(*a, **k))
    model, _ = _tiny_transformers_model("llama")
    model = model.cuda().to(torch.bfloat16).eval()
    fnn.patch(model)
    model(torch.randint(0, 64, (2, 31), device="cuda"))
    assert len(calls) == 2


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
    reference = copy.deepcopy(model).double()
    fnn.patch(model)
    ids = torch.randint(0, 64, (2, 31), device="cuda")
    explanation = torch._dynamo.explain(model)(ids)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
    nodes = _fusedops_nodes(explanation.graphs[0])
    assert nodes.count("fusedops.scaled_dot_product_attention") == 2 and "fusedops.matmul" in nodes
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    loss = lambda out: out.float().square().mean()  # noqa: E731
    runs = []
    for module, owner in ((reference, reference), (model, model), (compiled, model)):
        out, _ = _run(module, {"input_ids": ids}, loss)
        runs.append((out, _named_grads(owner)))     # the compiled module shares the model's parameters
        owner.zero_grad()
    (exact, exact_grads), (eager, eager_grads), (ours, grads) = runs
    # A parameter outside the loss (BERT's pooler) has no grad in eager mode; the compiled backward
    # may give it zeros instead (AOTAutograd materializes the unused output's tangent).
    assert set(exact_grads) == set(eager_grads) and set(grads) >= set(eager_grads)
    # Compiled within 2x eager's error against float64 (+ bf16's tolerance), the output and the
    # gradient as one vector: some grads are rounding noise around an exact zero (BERT's key biases:
    # softmax is invariant to a per-row shift), which no per-parameter relative bound can hold.
    names = sorted(grads)

    def flat(named):
        return torch.cat([named[n].double().flatten() if n in named else torch.zeros_like(grads[n]).double().flatten()
                          for n in names])

    for actual, eager_value, exact_value in ((ours, eager, exact), (flat(grads), flat(eager_grads), flat(exact_grads))):
        error, eager_error = _relative_error(actual, exact_value), _relative_error(eager_value, exact_value)
        assert error <= 2 * eager_error + 1e-2, (error, eager_error)


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
    # (8, 64) viewed as 2 sequences of 4 tokens, 1 head of 64; a float32 additive mask is cast too
    "scaled_dot_product_attention": (
        lambda x, p: fusedops.scaled_dot_product_attention(*(x.view(2, 1, 4, 64),) * 3, attn_mask=p["mask"]),
        lambda x, p: torch.nn.functional.scaled_dot_product_attention(*(x.view(2, 1, 4, 64),) * 3,
                                                                      attn_mask=p["mask"])),
}


@pytest.mark.cuda
@pytest.mark.parametrize("input_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op", sorted(_AUTOCAST_PAIRS))
def test_cuda_autocast_matches_torch(op, dtype, input_dtype):
    ours, theirs = _AUTOCAST_PAIRS[op]
    params = {"w": _leaf(64, device="cuda"), "b": _leaf(64, device="cuda"), "m": _leaf(64, 64, device="cuda"),
              "linear": fnn.Linear(64, 64).cuda(), "mask": torch.randn(4, 4, device="cuda")}
    x = _leaf(8, 64, device="cuda", dtype=input_dtype)
    with torch.autocast("cuda", dtype=dtype):
        out, expected = ours(x, params), theirs(x, params)
    assert out.dtype == expected.dtype
    assert_close(out, expected.double(), expected.dtype)
    (gx,) = torch.autograd.grad(out.float().square().sum(), [x])
    (expected_gx,) = torch.autograd.grad(expected.float().square().sum(), [x])
    assert gx.dtype == expected_gx.dtype == input_dtype
    assert_close(gx, expected_gx.double(), dtype)
