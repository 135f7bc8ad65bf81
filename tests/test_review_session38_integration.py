"""Review (session 38, integration): a fresh reviewer tried to break fusedops.matmul, fusedops.nn.Linear, the norm
modules and fusedops.nn.patch where they meet the rest of PyTorch (autocast, torch.compile, torch.export, torch.func,
checkpointing, hooks, saved-tensor features, module utilities), on both CPU routes (`route`: the kernels in the NumPy
interpreter, FUSEDOPS_INTERPRET=1, what CUDA tensors take; and torch's fallback). The oracle is torch in float64 (or
torch's own module / op where a dtype or an error is the question).

What was tried (peer report -> case):
- pytorch#137033 / PR #145588 (autocast rules for custom ops; custom_fwd casting): fusedops.matmul / nn.Linear and
  torch.ops.fusedops.matmul under CPU autocast, nested autocast (disabled inside, another dtype inside), out_dtype,
  eager and compiled: see DEFECT 1.
- pytorch#188955 (torch 2.12 put rms_norm on CUDA autocast's float32 list) with a patched transformers RMSNorm, whose
  original forward calls no autocast op: see DEFECT 2.
- pytorch#172822 (dynamic=True recompiles on a LayerNorm backward): frames of Linear + LayerNorm + RMSNorm with
  backward over changing batch shapes, against torch's modules: the same count.
- FlagGems#2338 (an expanded dy in the mm backward): `sum().backward()` through every module, values and gradients.
- Liger-Kernel#370 (in-place backward clobbering): torch.autograd.graph.allow_mutation_on_saved_tensors with inputs
  and weights changed in place after the forward: the gradients of the original values, as torch.
- torch.utils.checkpoint with use_reentrant True and False (eager, and non-reentrant inside torch.compile).
- torch.func: model ensembles (stack_module_state + functional_call under vmap), per-sample gradients, vmap with
  in_dims=1 and chunk_size, jacrev / jacfwd / hessian: right values (torch's ops run under the transforms).
- torch.export under an autocast region in the model's forward (strict and non-strict, run_decompositions; the
  non-strict one kept).
- Module utilities: skip_init, fuse_linear_bn_eval, full backward (pre-)hooks, fx.symbolic_trace,
  parametrizations (weight_norm, orthogonal) and the old spectral_norm on fusedops.nn.Linear.
- opcheck of fusedops::matmul on 1-D @ 1-D with a (1,) bias and an activation, K = 0, 16-bit operands with a float32
  out_dtype; Linear with in_features / out_features 0 and bias False (values and gradients);
  broadcasting batched operands and 1-D operands (gradients); integer / bool inputs (clear errors naming the dtype).
- torch.compile(mode="reduce-overhead") on the CPU (inductor, CUDA graphs skipped): right, not kept (13 s cold).

DEFECTS found (fixed this session; their tests below failed before):
1. fusedops.matmul's torch route (CPU tensors without FUSEDOPS_INTERPRET, other dtypes, transforms, jit.trace; also
   nn.Linear and patched Conv1D through it, and the backward of an out_dtype product) ignored autocast inside its own
   reference: fusedops.matmul casts the operands to the autocast dtype, then `reference` multiplies them in float32,
   but torch.matmul under autocast ran that float32 product in bfloat16 again. So
   `with torch.autocast("cpu", dtype=torch.bfloat16): fusedops.matmul(a32, b32, out_dtype=torch.float32)` returned
   a product rounded to bfloat16 (error 0.054 on a (16, 64) @ (64, 8) product, 2e-6 on the kernel route), and every
   result was rounded twice (product, then with the bias). Fix: autograd/matmul_reference.reference runs its product
   with autocast off (function_host.autocast_off).
2. fusedops.nn.patch's transformers RMSNorms (LlamaRMSNorm, ...) ran fusedops.rms_norm under autocast's rms_norm
   policy (float32 on CUDA with torch >= 2.12), though the original forward calls no autocast op: a bfloat16 model
   under bfloat16 CUDA autocast got float32 outputs from its patched norms (the original gives bfloat16). Checked on
   the CPU by giving the policy a CPU entry (what torch does on CUDA). Fix: nn/patch._T5RMSNormForward runs the
   norm with autocast off.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import fusedops
import fusedops.library
import fusedops.nn as fnn
from hf_standins import LlamaRMSNorm

D = torch.float64
BF16 = torch.bfloat16


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed: int, dtype=D, grad: bool = False) -> torch.Tensor:
    return torch.randn(shape, generator=_gen(seed), dtype=D).to(dtype).requires_grad_(grad)


def _close(actual, expected, tol=1e-9):
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol)


# ================================================================================================
# DEFECT 1: fusedops.matmul's torch route under autocast
# ================================================================================================
def test_defect1_matmul_out_dtype_float32_under_cpu_autocast(route, seed):
    a, b, bias = _randn(16, 64, seed=seed, dtype=torch.float32), _randn(64, 8, seed=seed + 1, dtype=torch.float32), \
        _randn(8, seed=seed + 2, dtype=torch.float32)
    # autocast casts the operands to bfloat16; the product is then summed in float32 and not rounded again
    exact = a.to(BF16).double() @ b.to(BF16).double() + bias.to(BF16).double()
    with torch.autocast("cpu", dtype=BF16):
        y = fusedops.matmul(a, b, bias, out_dtype=torch.float32)
        y_gelu = fusedops.matmul(a, b, bias, "gelu", out_dtype=torch.float32)
        y_op = torch.ops.fusedops.matmul(a, b, bias, None, torch.float32)
    for got, want in ((y, exact), (y_gelu, F.gelu(exact)), (y_op, exact)):
        assert got.dtype == torch.float32
        assert (got.double() - want).abs().max().item() < 1e-4      # bfloat16 rounding would be ~5e-2


def test_defect1_linear_under_cpu_autocast_rounds_once(route, seed):
    linear = fnn.Linear(64, 8)
    with torch.no_grad():
        for p in linear.parameters():
            p.copy_(_randn(*p.shape, seed=seed + p.dim(), dtype=torch.float32))
    x = _randn(4, 6, 64, seed=seed + 7, dtype=torch.float32)
    exact = F.linear(x.to(BF16).double(), linear.weight.to(BF16).double(), linear.bias.to(BF16).double())
    with torch.autocast("cpu", dtype=BF16):
        y = linear(x)
        with torch.autocast("cpu", enabled=False):     # nested: off inside
            y_off = linear(x)
        with torch.autocast("cpu", dtype=torch.float16):    # nested: another dtype inside
            y_16 = linear(x)
    assert y.dtype == BF16 and y_off.dtype == torch.float32 and y_16.dtype == torch.float16
    # one rounding of a float32 sum: within half a bfloat16 ulp of the exact value (2^-8 relative, and the sum's)
    assert ((y.double() - exact).abs() <= exact.abs() * 2.0 ** -8 * 1.001 + 1e-5).all()
    _close(y_off.double(), F.linear(x.double(), linear.weight.double(), linear.bias.double()), 1e-4)
    exact16 = F.linear(x.half().double(), linear.weight.half().double(), linear.bias.half().double())
    assert ((y_16.double() - exact16).abs() <= exact16.abs() * 2.0 ** -11 * 1.001 + 1e-5).all()


@pytest.mark.usefixtures("reset_dynamo")
def test_defect1_compiled_and_backward_under_cpu_autocast(route, seed):
    a, b, bias = (_randn(*s, seed=seed + i, dtype=torch.float32, grad=True) for i, s in enumerate([(8, 32), (32, 4), (4,)]))
    g = _randn(8, 4, seed=seed + 9, dtype=torch.float32)
    ad, bd, biasd = (t.detach().to(BF16).double().requires_grad_() for t in (a, b, bias))
    expected = F.silu(ad @ bd + biasd)
    expected_grads = torch.autograd.grad(expected, (ad, bd, biasd), g.double())

    def f(a, b, bias):
        return fusedops.matmul(a, b, bias, "silu", out_dtype=torch.float32)

    for fn in (f, torch.compile(f, backend="aot_eager", fullgraph=True)):
        with torch.autocast("cpu", dtype=BF16):
            y = fn(a, b, bias)
            grads = torch.autograd.grad(y, (a, b, bias), g)
        assert y.dtype == torch.float32
        assert (y.double() - expected).abs().max().item() < 1e-4
        for got, want in zip(grads, expected_grads):     # a and b reach the product as bfloat16: their gradients too
            assert got.dtype == torch.float32
            assert (got.double() - want).abs().max().item() <= 2.0 ** -7 * want.abs().max().item()


# ================================================================================================
# DEFECT 2: a patched transformers RMSNorm under autocast keeps the original's dtype
# ================================================================================================
@pytest.fixture
def rms_norm_cast_on_cpu(monkeypatch):
    """CUDA autocast's rms_norm policy of torch >= 2.12 (float32), given to the CPU as well, so that CPU autocast
    does to fusedops.rms_norm what CUDA autocast does on a GPU."""
    monkeypatch.setitem(fusedops.library.AUTOCAST_POLICY, "rms_norm", {"cuda": "float32", "cpu": "float32"})


@pytest.mark.usefixtures("rms_norm_cast_on_cpu", "reset_dynamo")
@pytest.mark.parametrize("weight_dtype", [BF16, torch.float32])
def test_defect2_patched_llama_rms_norm_keeps_its_dtype_under_autocast(route, seed, weight_dtype):
    original = LlamaRMSNorm(8).to(weight_dtype)
    with torch.no_grad():
        original.weight.copy_(_randn(8, seed=seed, dtype=weight_dtype))
    patched = copy.deepcopy(original)
    assert len(fnn.patch(patched).replaced) == 1
    x = _randn(3, 8, seed=seed + 1, dtype=BF16)
    with torch.autocast("cpu", dtype=BF16):
        assert fusedops.rms_norm(x, (8,), None).dtype == torch.float32      # the simulated policy is in force
        want = original(x)
        for module in (patched, torch.compile(patched, backend="aot_eager", fullgraph=True)):
            got = module(x)
            assert got.dtype == want.dtype == torch.promote_types(BF16, weight_dtype)
            _close(got.double(), want.double(), 2.0 ** -6)      # the original rounds x / rms(x) to bfloat16 first


# ================================================================================================
# What was right: checkpointing, torch.compile, torch.export, torch.func, hooks, saved tensors, utilities
# ================================================================================================
def _stack(seed: int, activation="gelu"):
    """fusedops Linear(activation) -> LayerNorm -> RMSNorm in float64 with random parameters, and the same in torch
    ops (a function of the same parameters)."""
    lin, ln, rn = fnn.Linear(6, 5, dtype=D, activation=activation), fnn.LayerNorm(5, dtype=D), fnn.RMSNorm(5, dtype=D)
    with torch.no_grad():
        for i, p in enumerate([*lin.parameters(), *ln.parameters(), *rn.parameters()]):
            p.copy_(_randn(*p.shape, seed=seed + i))
    model = torch.nn.Sequential(lin, ln, rn)

    def reference(x):
        h = F.gelu(F.linear(x, lin.weight, lin.bias))
        return F.rms_norm(F.layer_norm(h, (5,), ln.weight, ln.bias), (5,), rn.weight)

    return model, reference


def _values_and_grads(fn, x, params):
    x = x.detach().clone().requires_grad_()
    for p in params:
        p.grad = None
    y = fn(x)
    y.square().sum().backward()     # (a reentrant checkpoint refuses torch.autograd.grad)
    grads = [x.grad, *(p.grad for p in params)]
    for p in params:
        p.grad = None
    return y.detach(), grads


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpoint_matches_torch(route, seed, use_reentrant):
    model, reference = _stack(seed)
    x = _randn(2, 3, 6, seed=seed + 20)
    params = list(model.parameters())
    got = _values_and_grads(lambda t: checkpoint(model, t, use_reentrant=use_reentrant), x, params)
    want = _values_and_grads(reference, x, params)
    _close(got[0], want[0])
    for p, q in zip(got[1], want[1]):
        _close(p, q)


@pytest.mark.usefixtures("reset_dynamo")
def test_compiled_checkpoint_and_in_place_outputs(interpret, seed):
    model, reference = _stack(seed)
    params = list(model.parameters())
    x = _randn(4, 6, seed=seed + 30)

    def in_place(fn):
        def run(t):
            y = fn(t)
            y.add_(1.0).relu_()     # in-place ops on the ops' outputs
            return y * 2
        return run

    compiled = torch.compile(in_place(lambda t: checkpoint(model, t, use_reentrant=False)), backend="aot_eager",
                             fullgraph=True)
    got = _values_and_grads(compiled, x, params)
    want = _values_and_grads(in_place(reference), x, params)
    _close(got[0], want[0])
    for p, q in zip(got[1], want[1]):
        _close(p, q)


@pytest.mark.usefixtures("reset_dynamo")
def test_dynamic_compile_frames_with_backward_match_torch(interpret, seed):
    from torch._dynamo.testing import CompileCounterWithBackend

    model, _ = _stack(seed)
    torch_model = torch.nn.Sequential(torch.nn.Linear(6, 5, dtype=D), torch.nn.GELU(), torch.nn.LayerNorm(5, dtype=D),
                                      torch.nn.RMSNorm(5, dtype=D))
    frames = []
    for module in (model, torch_model):
        torch._dynamo.reset()
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(module, backend=counter, dynamic=True)
        for i, shape in enumerate([(2, 6), (3, 6), (2, 3, 6), (4, 5, 6)]):
            x = _randn(*shape, seed=seed + i, grad=True)
            compiled(x).sum().backward()
        frames.append(counter.frame_count)
    assert frames[0] == frames[1]


def test_export_with_an_autocast_region_in_forward(route, seed):
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.norm = fnn.Linear(8, 6), fnn.LayerNorm(6)

        def forward(self, x):
            with torch.autocast("cpu", dtype=BF16):
                y = self.lin(x)
                z = fusedops.matmul(x, self.lin.weight.t(), out_dtype=torch.float32)
            return self.norm(y.float()), z

    model = Model()
    x = _randn(4, 8, seed=seed, dtype=torch.float32)
    want = model(x)
    exact = x.to(BF16).double() @ model.lin.weight.to(BF16).double().t()
    assert want[0].dtype == want[1].dtype == torch.float32
    assert (want[1].double() - exact).abs().max().item() < 1e-4
    program = torch.export.export(model, (x,))     # non-strict, torch 2.13's default (strict: the same, slower)
    for got_program in (program, program.run_decompositions()):
        for got, expected in zip(got_program.module()(x), want):
            assert got.dtype == expected.dtype
            _close(got, expected, 1e-6)


def test_vmap_ensembles_and_per_sample_gradients(route, seed):
    x = _randn(5, 4, seed=seed)
    linears = [fnn.Linear(4, 3, dtype=D, activation="relu") for _ in range(3)]
    norms = [fnn.LayerNorm(4, dtype=D) for _ in range(3)]
    with torch.no_grad():
        for i, p in enumerate(p for m in linears + norms for p in m.parameters()):
            p.copy_(_randn(*p.shape, seed=seed + 1 + i))
    for models, ref in ((linears, lambda m: torch.relu(F.linear(x, m.weight, m.bias))),
                        (norms, lambda m: F.layer_norm(x, (4,), m.weight, m.bias))):
        params, buffers = torch.func.stack_module_state(models)
        base = copy.deepcopy(models[0]).to("meta")
        out = torch.func.vmap(lambda p, b, t: torch.func.functional_call(base, (p, b), (t,)), in_dims=(0, 0, None))(
            params, buffers, x)
        for i, model in enumerate(models):
            _close(out[i], ref(model))
    lin = linears[0]
    params = dict(lin.named_parameters())
    per_sample = torch.func.vmap(torch.func.grad(
        lambda p, t: torch.func.functional_call(lin, p, (t[None],)).square().sum()), in_dims=(None, 0))(params, x)
    for i in range(x.shape[0]):
        want = torch.autograd.grad(torch.relu(F.linear(x[i:i + 1], lin.weight, lin.bias)).square().sum(),
                                   [lin.weight, lin.bias])
        _close(per_sample["weight"][i], want[0])
        _close(per_sample["bias"][i], want[1])


def test_func_transforms_of_linear_and_norms(route, seed):
    lin = fnn.Linear(4, 3, dtype=D, activation="gelu_tanh")
    ref = lambda v: F.gelu(F.linear(v, lin.weight, lin.bias), approximate="tanh")   # noqa: E731
    x = _randn(2, 5, 4, seed=seed)
    _close(torch.func.vmap(lin, in_dims=1, out_dims=1)(x), ref(x))
    _close(torch.func.vmap(lin, in_dims=1, chunk_size=2)(x), ref(x).transpose(0, 1))
    v = x[0, 0]
    _close(torch.func.jacrev(lin)(v), torch.func.jacrev(ref)(v))
    _close(torch.func.jacfwd(lin)(v), torch.func.jacfwd(ref)(v))
    _close(torch.func.hessian(lambda t: lin(t).sum())(v), torch.func.hessian(lambda t: ref(t).sum())(v))
    w = _randn(4, seed=seed + 1)
    _close(torch.func.hessian(lambda t: fusedops.layer_norm(t, (4,), w).square().sum())(v),
           torch.func.hessian(lambda t: F.layer_norm(t, (4,), w).square().sum())(v))
    _close(torch.func.vmap(torch.func.grad(lambda t, u: fusedops.rms_norm(t, (4,), u).square().sum(), argnums=1),
                           in_dims=(0, None))(x, w),
           torch.func.vmap(torch.func.grad(lambda t, u: F.rms_norm(t, (4,), u).square().sum(), argnums=1),
                           in_dims=(0, None))(x, w))


def test_full_backward_hooks_match_torch(route, seed):
    pairs = [(fnn.Linear(4, 3, dtype=D), torch.nn.Linear(4, 3, dtype=D)),
             (fnn.LayerNorm(4, dtype=D), torch.nn.LayerNorm(4, dtype=D)),
             (fnn.RMSNorm(4, dtype=D), torch.nn.RMSNorm(4, dtype=D))]
    for ours, theirs in pairs:
        theirs.load_state_dict(ours.state_dict())
        seen = {}
        for name, module in (("ours", ours), ("theirs", theirs)):
            module.register_full_backward_hook(lambda m, gi, go, name=name: seen.__setitem__(name, (gi, go)))
            module.register_full_backward_pre_hook(lambda m, go, name=name: seen.__setitem__(name + "_pre", go))
        x = _randn(2, 5, 4, seed=seed, grad=True)
        ours(x).sum().backward()       # an expanded gradient of ones (FlagGems#2338)
        theirs(x).sum().backward()
        (gi, go), (gi_t, go_t) = seen["ours"], seen["theirs"]
        _close(gi[0], gi_t[0])
        _close(go[0], go_t[0])
        _close(seen["ours_pre"][0], seen["theirs_pre"][0])
        for p, q in zip(ours.parameters(), theirs.parameters()):
            _close(p.grad, q.grad)


def test_allow_mutation_on_saved_tensors(route, seed):
    ops = [
        (lambda x, w, b: fusedops.layer_norm(x, (4,), w, b), lambda x, w, b: F.layer_norm(x, (4,), w, b)),
        (lambda x, w, b: fusedops.rms_norm(x, (4,), w) + b, lambda x, w, b: F.rms_norm(x, (4,), w) + b),
        (lambda x, w, b: fusedops.matmul(x, w[:, None].expand(4, 3), b[:3], "silu"),
         lambda x, w, b: F.silu(x @ w[:, None].expand(4, 3) + b[:3])),
    ]
    for ours, theirs in ops:
        results = []
        for fn in (ours, theirs):
            leaves = [_randn(3, 4, seed=seed, grad=True), _randn(4, seed=seed + 1, grad=True),
                      _randn(4, seed=seed + 2, grad=True)]
            x, w = leaves[0].clone(), leaves[1].clone()
            with torch.autograd.graph.allow_mutation_on_saved_tensors():
                y = fn(x, w, leaves[2])
                x.mul_(2.0)      # changed in place after the forward: the backward sees the saved values
                w.add_(5.0)
                results.append(torch.autograd.grad(y.square().sum(), leaves))
        for p, q in zip(*results):
            _close(p, q)


def test_module_utilities(route, seed):
    lin = torch.nn.utils.skip_init(fnn.Linear, 4, 3, dtype=D, activation="relu")
    assert type(lin) is fnn.Linear and lin.activation == "relu" and lin.weight.device.type == "cpu"
    x = _randn(5, 4, seed=seed)
    lin = fnn.Linear(4, 3, dtype=D).eval()
    bn = torch.nn.BatchNorm1d(3, dtype=D).eval()
    with torch.no_grad():
        bn.running_mean.copy_(_randn(3, seed=seed + 1))
        bn.running_var.copy_(_randn(3, seed=seed + 2).abs() + 0.5)
    fused = torch.nn.utils.fusion.fuse_linear_bn_eval(lin, bn)
    assert type(fused) is fnn.Linear
    _close(fused(x), bn(lin(x)))
    # parametrizations and the old spectral_norm hook on fusedops.nn.Linear, against torch.nn.Linear
    for apply in (torch.nn.utils.parametrizations.weight_norm, torch.nn.utils.spectral_norm):
        ours, theirs = fnn.Linear(4, 3, dtype=D), torch.nn.Linear(4, 3, dtype=D)
        theirs.load_state_dict(ours.state_dict())
        ours, theirs = apply(ours), apply(theirs)
        if hasattr(theirs, "weight_u"):
            theirs.weight_u.copy_(ours.weight_u)
        _close(ours(x), theirs(x))
    ortho = torch.nn.utils.parametrizations.orthogonal(fnn.Linear(4, 4, dtype=D))
    _close(ortho(x), x @ ortho.weight.t() + ortho.bias)
    traced = torch.fx.symbolic_trace(_stack(seed)[0])
    assert sum(1 for n in traced.graph.nodes if n.op == "call_function") == 3    # one leaf per op
    _close(traced(_randn(2, 6, seed=seed + 3)), _stack(seed)[1](_randn(2, 6, seed=seed + 3)))


def test_opcheck_matmul_edge_cases(route, seed):
    def t(*shape, dtype=D, grad=True):
        return _randn(*shape, seed=seed + len(shape), dtype=dtype, grad=grad)

    cases = [
        (t(5), t(5), t(1), "gelu", None),        # 1-D @ 1-D: 0-d product, (1,) with its bias
        (t(3, 0), t(0, 4), t(4), "silu", None),     # K = 0: activation(bias)
        (t(2, 3, 4, dtype=BF16), t(4, 5, dtype=BF16), t(5), "gelu_tanh", torch.float32),
    ]
    for args in cases:
        torch.library.opcheck(torch.ops.fusedops.matmul.default, args)


def test_matmul_broadcast_and_vector_gradients(route, seed):
    shapes = [((2, 1, 3, 4), (5, 4, 6)), ((4,), (2, 3, 4, 5)), ((2, 3, 4, 5), (5,)), ((5,), (5,))]
    for i, (sa, sb) in enumerate(shapes):
        a, b = _randn(*sa, seed=seed + i, grad=True), _randn(*sb, seed=seed + 10 + i, grad=True)
        want = a @ b
        got = fusedops.matmul(a, b)
        assert got.shape == want.shape
        _close(got, want)
        g = _randn(*want.shape, seed=seed + 20 + i)
        for p, q in zip(torch.autograd.grad(got, (a, b), g), torch.autograd.grad(want, (a, b), g)):
            _close(p, q)


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors is a no-op")
@pytest.mark.parametrize("in_features,out_features,bias", [(0, 3, True), (3, 0, True), (0, 0, False), (3, 4, False)])
def test_linear_degenerate_features(route, seed, in_features, out_features, bias):
    ours = fnn.Linear(in_features, out_features, bias=bias, dtype=D, activation="gelu")
    theirs = torch.nn.Linear(in_features, out_features, bias=bias, dtype=D)
    theirs.load_state_dict(ours.state_dict())
    x = _randn(2, 5, in_features, seed=seed, grad=True)
    got, want = ours(x), F.gelu(theirs(x))
    _close(got, want)
    g = _randn(*want.shape, seed=seed + 1)
    for p, q in zip(torch.autograd.grad(got, [x, *ours.parameters()], g),
                    torch.autograd.grad(want, [x, *theirs.parameters()], g)):
        _close(p, q)


def test_integer_and_bool_inputs_raise_clear_errors(route):
    for module in (fnn.Linear(4, 3), fnn.LayerNorm(4), fnn.RMSNorm(4)):
        for dtype in (torch.int64, torch.bool):
            with pytest.raises(RuntimeError, match=str(dtype)):
                module(torch.ones(2, 4, dtype=dtype))
    with pytest.raises(TypeError, match="torch.bool"):
        fusedops.matmul(torch.ones(2, 3, dtype=torch.bool), torch.ones(3, 2, dtype=torch.bool))
    with pytest.raises(TypeError, match="out_dtype"):
        fusedops.matmul(torch.ones(2, 3), torch.ones(3, 2), out_dtype=torch.int32)
    with pytest.raises(TypeError, match="same dtype"):
        fusedops.matmul(torch.ones(2, 3, dtype=torch.float16), torch.ones(3, 2))
    # integer operands take torch.matmul's product in their own dtype
    a = torch.arange(6, dtype=torch.int32).view(2, 3)
    assert torch.equal(fusedops.matmul(a, a.t()), a @ a.t())
