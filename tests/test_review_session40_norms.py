"""Review (session 40, norms from the user's side): a fresh reviewer tried to break fusedops.layer_norm /
fusedops.rms_norm, their autograd Function, fusedops.nn.LayerNorm / RMSNorm, the custom operators
torch.ops.fusedops.layer_norm / rms_norm under torch.compile, torch.export and make_fx, and patch() of
transformers-style RMSNorms, against torch 2.13 (torch.nn.functional.layer_norm / rms_norm and torch.nn's modules),
on both CPU routes (`route`: the kernels in the NumPy interpreter, FUSEDOPS_INTERPRET=1, what CUDA tensors take;
and torch's fallback). Oracle: torch in float64 on the same (rounded) inputs. Sessions 23, 27, 29, 37, 38 and 39
already cover the numerics (long rows, outliers, overflow, eps edge cases), layouts, argument errors, partial
requires_grad, modules' state_dict / repr / reset_parameters, patch(); this file does not repeat them.

What was tried (peer report -> case), right unless listed under DEFECTS:
- pytorch#140011 / #134137 / #176349 (a dynamic dim "inferred to be a constant" by code that calls int() on a size,
  so torch.export refuses it and make_fx bakes it in): `fusedops.layer_norm(x, x.shape[-1:])` and
  `fusedops.rms_norm(x, x.shape[-2:])` under torch.export with every dim dynamic, make_fx(tracing_mode="symbolic")
  and torch.compile with mark_dynamic on the normalized dim, forward and backward.                   -> DEFECT 1
- torch.export of fusedops.nn.LayerNorm / RMSNorm (eps=None) with a dynamic batch, saved, loaded and run at new
  shapes with a backward; torch.compile(dynamic=True); inductor on a split / transposed graph (fla#871: the gradient
  of a split reaches the norm as a strided view).
- torch.library.opcheck of fusedops::layer_norm / rms_norm over 360 combinations of dtype pairs (CPU "mixed" fp16
  input with float32 parameters, bf16 weight of an fp16 input), layouts (transposed, stride-0 expanded rows, zero
  rows, a permuted 2-dim normalized shape), stride-0 expanded weights and requires_grad patterns (a few kept).
- torch.compile (aot_eager) with mixed dtypes (layer_norm's CPU mixed case, rms_norm's bf16 / float32 weights):
  output and gradient dtypes and values as eager's.
- Double backward through the custom operators called directly (an exported program run eagerly): torch's error
  naming fusedops.norm_backward, never silent zeros. torch.func.grad over them: torch's own limitation of custom
  ops ("must override the setup_context"; the public functions run torch's ops under torch.func).
- torch.inference_mode: inputs made under it with a weight that requires grad; modules built under it (torch's
  "Inference tensors cannot be saved for backward" where torch raises it too).
- apex / pytorch#81090 style: float32 rows base + arange(N) for base up to 1.6e7 (fusedops exact to 1e-7 where
  torch's CPU kernel is off by 0.06), float64 eps far outside float32's range (1e-300 with a variance of 1e-300,
  1e39): eps is applied in float64, not rounded to float32.
- Autocast: fusedops' policy table against torch 2.13's dispatcher (AutocastCPU has no layer_norm / rms_norm kernel,
  AutocastCUDA has both); the patched transformers RMSNorm under CPU autocast, eager and compiled.
- Liger-Kernel#74 / #1462 (Gemma's (1 + w) offset): patch() patches only Llama / Mistral / Qwen2 RMSNorms, whose
  forward it reproduces; deepcopy of a patched model keeps its classes and values.
- CUDA graphs (Liger-Kernel / apex users capture training steps): torch.cuda.make_graphed_callables over the modules,
  forward and backward replayed with new values (GPU tier, marked cuda).

DEFECTS

1. (fixed) A dynamic normalized dim could not be traced: torch.export of `fusedops.layer_norm(x, x.shape[-1:])` (or
   rms_norm, or any normalized_shape holding sizes of a dynamic dim) failed with "Constraints violated (h)! ... your
   code specialized it to be a constant (8)", where torch's F.layer_norm / rms_norm export; make_fx(tracing_mode=
   "symbolic") baked the traced sizes into the graph, which then raised "Given normalized_shape=[3, 8], expected
   input with shape [*, 3, 8], but got input of size[4, 5, 16]" at another shape.
   Cause: fusedops/autograd/norms.normalized_shape_tuple converted every entry with int(), which specializes a
   torch.SymInt, on the checked route (torch.compile / export: the custom ops, whose schema takes SymInt[] and
   whose fake kernels already take symbolic shapes) and on the torch route (make_fx: torch's op).
   Fix: normalized_shape_tuple keeps SymInt entries as they are (the kernels launch only outside tracing, with
   concrete sizes); the checks compare them symbolically.
"""

from __future__ import annotations

import copy
import io
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.library  # noqa: F401  (registers torch.ops.fusedops.*)
import fusedops.nn as fnn
from fusedops.library import autocast as fused_autocast

sys.path.insert(0, str(Path(__file__).parent))
from helpers import assert_close, random_tensor  # noqa: E402
from hf_standins import LlamaRMSNorm  # noqa: E402


def _double(*tensors):
    return [None if t is None else t.detach().double().requires_grad_(t.requires_grad) for t in tensors]


# ------------------------------------------------------------------------------------------------
# DEFECT 1: a dynamic normalized dim under torch.export / make_fx / torch.compile
# ------------------------------------------------------------------------------------------------
class _DynamicNorms(torch.nn.Module):
    def __init__(self, layer_norm, rms_norm):
        super().__init__()
        self.layer_norm, self.rms_norm = layer_norm, rms_norm

    def forward(self, x):
        # (a torch.Size of sizes, and a list of them)
        return self.layer_norm(x, x.shape[-1:]) * 2 + self.rms_norm(x, [x.size(-2), x.size(-1)], None, None)


def test_defect1_export_with_a_dynamic_normalized_dim(route, seed):
    from torch.export import Dim, export

    ours, reference = _DynamicNorms(fusedops.layer_norm, fusedops.rms_norm), _DynamicNorms(F.layer_norm, F.rms_norm)
    sample = random_tensor((3, 4, 8), torch.float32, "cpu", seed)
    program = export(ours, (sample,), dynamic_shapes={"x": {0: Dim("b"), 1: Dim("s"), 2: Dim("h")}})
    if route == "interpret":    # the kernels' operators, with the symbolic sizes as their normalized_shape
        targets = {str(node.target) for node in program.graph.nodes}
        assert {"fusedops.layer_norm.default", "fusedops.rms_norm.default"} <= targets, targets
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer).module()
    x = random_tensor((2, 5, 16), torch.float32, "cpu", seed + 1).requires_grad_()
    y = loaded(x)
    (x64,) = _double(x)
    y64 = reference(x64)
    assert_close(y, y64.detach(), torch.float32)
    dy = random_tensor(y.shape, torch.float32, "cpu", seed + 2)
    assert_close(torch.autograd.grad(y, x, dy)[0], torch.autograd.grad(y64, x64, dy.double())[0], torch.float32)


def test_defect1_make_fx_symbolic_keeps_the_normalized_dims_symbolic(route, seed):
    from torch.fx.experimental.proxy_tensor import make_fx

    ours, reference = _DynamicNorms(fusedops.layer_norm, fusedops.rms_norm), _DynamicNorms(F.layer_norm, F.rms_norm)
    graph = make_fx(ours, tracing_mode="symbolic")(random_tensor((2, 3, 8), torch.float32, "cpu", seed))
    x = random_tensor((4, 5, 16), torch.float32, "cpu", seed + 1)     # other sizes in every dim
    assert_close(graph(x), reference(x.double()), torch.float32)


def test_compile_with_a_dynamic_normalized_dim(route, seed, reset_dynamo):
    # (right before the fix too: dynamo's int() of a size stays symbolic; export and make_fx are what failed)
    ours, reference = _DynamicNorms(fusedops.layer_norm, fusedops.rms_norm), _DynamicNorms(F.layer_norm, F.rms_norm)
    compiled = torch.compile(ours, backend="aot_eager", fullgraph=True)
    for n in (8, 24):
        x = random_tensor((2, 3, n), torch.float32, "cpu", seed + n).requires_grad_()
        torch._dynamo.mark_dynamic(x, 2)
        y = compiled(x)
        (x64,) = _double(x)
        y64 = reference(x64)
        assert_close(y, y64.detach(), torch.float32)
        dy = random_tensor(y.shape, torch.float32, "cpu", seed + 2 * n)
        assert_close(torch.autograd.grad(y, x, dy)[0], torch.autograd.grad(y64, x64, dy.double())[0], torch.float32)


# ------------------------------------------------------------------------------------------------
# Right: export / compile of the modules, the operators' contracts
# ------------------------------------------------------------------------------------------------
def test_exported_modules_with_a_dynamic_batch_run_at_new_shapes_with_gradients(route, seed):
    from torch.export import Dim, export

    torch.manual_seed(seed)
    ours = torch.nn.Sequential(fnn.LayerNorm(8), fnn.RMSNorm(8))          # RMSNorm's eps=None
    theirs = torch.nn.Sequential(torch.nn.LayerNorm(8), torch.nn.RMSNorm(8))
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_()
    ours.load_state_dict(theirs.state_dict())
    program = export(ours, (torch.randn(2, 3, 8),), dynamic_shapes=({0: Dim("b"), 1: Dim("s")},))
    module = program.module()
    x = random_tensor((5, 7, 8), torch.float32, "cpu", seed).requires_grad_()
    y = module(x)
    wide = copy.deepcopy(theirs).double()
    (x64,) = _double(x)
    y64 = wide(x64)
    assert_close(y, y64.detach(), torch.float32)
    dy = random_tensor(y.shape, torch.float32, "cpu", seed + 1)
    got = torch.autograd.grad(y, [x] + [p for _, p in sorted(module.named_parameters())], dy)
    want = torch.autograd.grad(y64, [x64] + [p for _, p in sorted(wide.named_parameters())], dy.double())
    assert len(got) == len(want) == 4
    for g, w in zip(got, want):
        assert_close(g, w, torch.float32)


@pytest.mark.parametrize("case", ["layer_norm_cpu_mixed", "layer_norm_bias_only_mixed", "rms_bf16_weight",
                                  "rms_float32_weight_of_bf16"])
def test_compiled_mixed_dtypes_match_eager(interpret, seed, case, reset_dynamo):
    x_dtype, p_dtype, affine = {"layer_norm_cpu_mixed": (torch.float16, torch.float32, "wb"),
                                "layer_norm_bias_only_mixed": (torch.bfloat16, torch.float32, "b"),
                                "rms_bf16_weight": (torch.float32, torch.bfloat16, "w"),
                                "rms_float32_weight_of_bf16": (torch.bfloat16, torch.float32, "w")}[case]
    n = 16
    x = random_tensor((4, 3, n), x_dtype, "cpu", seed)
    weight = random_tensor((n,), p_dtype, "cpu", seed + 1) if "w" in affine else None
    bias = random_tensor((n,), p_dtype, "cpu", seed + 2) if "b" in affine else None
    if case.startswith("layer_norm"):
        def op(x, w, b, functional=fusedops):
            return functional.layer_norm(x, (n,), w, b)
    else:
        def op(x, w, b, functional=fusedops):
            return functional.rms_norm(x, (n,), w)
    compiled = torch.compile(op, backend="aot_eager", fullgraph=True)
    dy = random_tensor(x.shape, x_dtype, "cpu", seed + 3)
    results = []
    for fn in (op, compiled):
        inputs = [t if t is None else t.clone().requires_grad_() for t in (x, weight, bias)]
        y = fn(*inputs)
        grads = torch.autograd.grad(y, [t for t in inputs if t is not None], dy)
        results.append((y, grads))
    (eager_y, eager_grads), (compiled_y, compiled_grads) = results
    assert compiled_y.dtype == eager_y.dtype == x_dtype
    assert torch.equal(compiled_y, eager_y)
    for e, c, t in zip(eager_grads, compiled_grads, [t for t in (x, weight, bias) if t is not None]):
        assert c.dtype == e.dtype == t.dtype
        assert torch.equal(c, e)
    # and the values are torch's in float64
    wide = _double(x, weight, bias)
    y64 = op(*wide, functional=F)
    assert_close(eager_y, y64.detach(), x_dtype)


def test_opcheck_of_expanded_weights_and_mixed_dtypes(interpret, seed):
    from torch.library import opcheck

    x = random_tensor((3, 8), torch.float16, "cpu", seed).requires_grad_()
    expanded = random_tensor((1,), torch.float32, "cpu", seed + 1).expand(8).requires_grad_()
    permuted = random_tensor((4, 2, 3), torch.bfloat16, "cpu", seed + 2).permute(0, 2, 1).contiguous().transpose(1, 2)
    opcheck(torch.ops.fusedops.layer_norm.default, (x, [8], expanded, None, 1e-5))
    opcheck(torch.ops.fusedops.rms_norm.default, (x, [8], expanded, 1e-5))
    opcheck(torch.ops.fusedops.rms_norm.default, (permuted.detach().requires_grad_(), [2, 3],
                                                   random_tensor((2, 3), torch.float16, "cpu", seed + 3), 1e-6))


def test_double_backward_through_the_operators_raises_naming_the_backward(route, seed):
    x = random_tensor((3, 8), torch.float64, "cpu", seed).requires_grad_()
    weight = random_tensor((8,), torch.float64, "cpu", seed + 1).requires_grad_()
    bias = random_tensor((8,), torch.float64, "cpu", seed + 2).requires_grad_()
    for y in (torch.ops.fusedops.layer_norm(x, [8], weight, bias, 1e-5)[0],
              torch.ops.fusedops.rms_norm(x, [8], weight, 1e-5)[0]):
        (g,) = torch.autograd.grad(y.pow(3).sum(), x, create_graph=True)
        with pytest.raises(RuntimeError, match="fusedops.norm_backward"):
            torch.autograd.grad(g.pow(2).sum(), [x, weight])


# ------------------------------------------------------------------------------------------------
# Right: inference mode, numerics, autocast policy, patch
# ------------------------------------------------------------------------------------------------
def test_inference_mode_inputs_and_modules(route, seed):
    with torch.inference_mode():
        x_inference = random_tensor((3, 8), torch.float32, "cpu", seed)
    for ours_cls, torch_cls in ((fnn.LayerNorm, torch.nn.LayerNorm), (fnn.RMSNorm, torch.nn.RMSNorm)):
        ours, theirs = ours_cls(8), torch_cls(8)
        with torch.no_grad():
            theirs.weight.normal_()
            ours.weight.copy_(theirs.weight)
        # an input made under inference_mode, the weight requiring grad: torch's RMSNorm and both fusedops
        # modules on the kernels give the weight's gradient (torch's LayerNorm cannot save the input: its error
        # on the fallback route, which runs it)
        if ours_cls is fnn.LayerNorm and route == "fallback":
            with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
                ours(x_inference)
            continue
        y = ours(x_inference)
        (x64,) = _double(x_inference)
        w64 = theirs.weight.detach().double().requires_grad_()
        y64 = (F.layer_norm(x64, (8,), w64, torch.zeros(8, dtype=torch.float64)) if ours_cls is fnn.LayerNorm
               else F.rms_norm(x64, (8,), w64))
        assert_close(y, y64.detach(), torch.float32)
        dy = random_tensor((3, 8), torch.float32, "cpu", seed + 1)
        (dw,) = torch.autograd.grad(y, ours.weight, dy)
        assert_close(dw, torch.autograd.grad(y64, w64, dy.double())[0], torch.float32)
    # modules built under inference_mode, an input that requires grad: torch's error, as torch's modules
    with torch.inference_mode():
        frozen = [fnn.LayerNorm(8), fnn.RMSNorm(8), torch.nn.LayerNorm(8), torch.nn.RMSNorm(8)]
    x = random_tensor((3, 8), torch.float32, "cpu", seed + 2).requires_grad_()
    for module in frozen:
        with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
            module(x)


def test_arange_rows_far_from_zero(route):
    # pytorch#81090: consecutive integers far from zero; exact float32 inputs, the float64 answer is known
    n = 1000
    x = (1.6e7 + torch.arange(n, dtype=torch.float64)).float().reshape(1, n).repeat(2, 1)
    y = fusedops.layer_norm(x, (n,))
    reference = F.layer_norm(x.double(), (n,))
    if route == "interpret":    # the kernels' shifted sums keep it exact (torch's CPU kernel is 0.0017 off)
        assert (y.double() - reference).abs().max() < 1e-6
    assert_close(fusedops.rms_norm(x, (n,)), F.rms_norm(x.double(), (n,)), torch.float32)


@pytest.mark.parametrize("scale,eps", [(1e-150, 1e-300), (1e10, 1e39), (1e-30, 1e-60)])
def test_float64_eps_outside_float32s_range(interpret, seed, scale, eps):
    x = random_tensor((3, 16), torch.float64, "cpu", seed, scale=scale)
    weight, bias = random_tensor((16,), torch.float64, "cpu", seed + 1), random_tensor((16,), torch.float64, "cpu",
                                                                                       seed + 2)
    assert_close(fusedops.layer_norm(x, (16,), weight, bias, eps), F.layer_norm(x, (16,), weight, bias, eps),
                 torch.float64)
    assert_close(fusedops.rms_norm(x, (16,), weight, eps), F.rms_norm(x, (16,), weight, eps), torch.float64)


def test_autocast_policy_matches_torchs_dispatcher():
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for op, aten in (("layer_norm", "aten::layer_norm"), ("rms_norm", "aten::rms_norm")):
        for device_type, key in (("cpu", "AutocastCPU"), ("cuda", "AutocastCUDA")):
            assert (device_type in fused_autocast.AUTOCAST_POLICY.get(op, {})) == has(aten, key), (op, device_type)
    # CPU autocast leaves both ops alone, as torch: a bfloat16 input stays bfloat16, a float32 one float32
    x = random_tensor((3, 8), torch.bfloat16, "cpu", 0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fusedops.layer_norm(x, (8,)).dtype == F.layer_norm(x, (8,)).dtype == torch.bfloat16
        assert fusedops.rms_norm(x.float(), (8,)).dtype == F.rms_norm(x.float(), (8,)).dtype == torch.float32


def test_deepcopy_of_a_patched_model(route, seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(LlamaRMSNorm(8), torch.nn.LayerNorm(8), torch.nn.RMSNorm(8, eps=None))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    original = copy.deepcopy(model)
    report = fnn.patch(model)
    assert len(report.replaced) == 3
    twin = copy.deepcopy(model)
    assert [type(m) for m in twin] == [type(m) for m in model]
    assert all(a is not b for a, b in zip(twin.parameters(), model.parameters()))
    x = random_tensor((4, 8), torch.float32, "cpu", seed + 1)
    wide = copy.deepcopy(original).double()
    assert_close(twin(x), wide(x.double()), torch.float32)
    with torch.no_grad():
        twin[0].weight.mul_(2)          # the copy's parameters are its own
    assert_close(model(x), wide(x.double()), torch.float32)


# ------------------------------------------------------------------------------------------------
# GPU tier: CUDA graph capture and replay of the modules
# ------------------------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_gpu_cuda_graph_replay_of_forward_and_backward(seed, kind, dtype):
    n, rows = 1000, 64
    torch.manual_seed(seed)
    cls = fnn.LayerNorm if kind == "layer_norm" else fnn.RMSNorm
    module = cls(n, device="cuda", dtype=dtype)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_()
    sample = torch.randn(rows, n, device="cuda", dtype=dtype, requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(module, (sample,))
    params = list(module.parameters())
    for step in range(2):   # replays with new values in the same static buffers
        x = random_tensor((rows, n), dtype, "cuda", seed + 10 * step).requires_grad_()
        dy = random_tensor((rows, n), dtype, "cuda", seed + 10 * step + 1)
        for p in params:
            p.grad = None
        y = graphed(x)
        y.backward(dy)
        torch.cuda.synchronize()
        wide = [t.detach().double().requires_grad_() for t in [x] + params]
        if kind == "layer_norm":
            y64 = F.layer_norm(wide[0], (n,), wide[1], wide[2], module.eps)
        else:
            y64 = F.rms_norm(wide[0], (n,), wide[1], module.eps)
        assert_close(y, y64.detach(), dtype)
        want = torch.autograd.grad(y64, wide, dy.double())
        for got, expected in zip([x.grad] + [p.grad for p in params], want):
            assert got is not None
            assert_close(got, expected, dtype)
