"""Review (session 37, nn modules): a fresh reviewer tried to break the drop-in modules of fusedops.nn (LayerNorm,
RMSNorm, Linear, Softmax, LogSoftmax, MultiheadAttention) and fusedops.nn.patch the way a demanding PyTorch /
Hugging Face user would, on both CPU routes (`route`: the kernels in the NumPy interpreter, FUSEDOPS_INTERPRET=1,
what CUDA tensors take; and torch's fallback), with torch 2.13's own modules (same parameters through
load_state_dict) and float64 references as the oracle.

Peer reports the cases come from:
- pytorch/pytorch#167308, #188955 (nn.RMSNorm with bf16 activations and fp32 weights; rms_norm's autocast policy):
  mixed input / parameter dtypes of the norm modules, outputs' dtypes and values against torch's modules.
- pytorch/pytorch#189581 (nn.RMSNorm on small-variance bf16 inputs, eps=None): eps=None with every input /
  parameter dtype pair.
- pytorch/pytorch#135969, NVIDIA/apex#1635, intel-extension-for-pytorch#731 (LayerNorm with float32 parameters and
  half inputs, "expected scalar type"): the same matrix, errors of the same type where torch raises.
- NVIDIA/apex#403 (FusedLayerNorm with elementwise_affine=False), pytorch/pytorch#97128 (MHA with bias=False):
  state_dict / load_state_dict(strict=True) round trips with torch's modules both ways, for affine / bias off,
  kdim / vdim, add_bias_kv.
- ELS-RD/kernl#193, torch-spyre#1781 (layer norm / RMSNorm wrong on non-contiguous [B, H, S, D] views): permuted
  4-D inputs, values and gradients against float64.
- linkedin/Liger-Kernel#370 / PR #376 (in-place RMSNorm backward clobbering a tensor still needed): outputs changed
  in place after the forward, inputs changed in place (torch's version-counter errors where torch raises them).
- pytorch/pytorch#97409, #97605, #107084 (MHA masks: batched 3-D masks, float vs bool masks, mask dtypes): a matrix
  of attn_mask / key_padding_mask dtypes and shapes, causal hint, train / eval, both batch layouts.
- pytorch/pytorch#190486 and the MHA empty-batch reports: L = 0, S = 0, N = 0.
- torchao-style quantized / scaled weights (tensor subclasses implementing F.linear in __torch_function__) and
  torch function modes: a module must call what torch's module calls.

DEFECTS found (fixed in this session in fusedops/nn; their tests below failed before):
1. fusedops.nn.RMSNorm.forward named its argument `input`; torch.nn.RMSNorm.forward names it `x`. So
   `norm(x=h)` (and a forward pre-hook registered with_kwargs=True that rewrites kwargs["x"]) works with torch's
   module and raises TypeError "RMSNorm.forward() got an unexpected keyword argument 'x'" with ours, and
   fusedops.nn.patch turned a working torch model into a failing one. Fix: fusedops/nn/normalization.py, the
   parameter is `x`; test_forward_parameter_names_match_the_originals covers every module and patch mixin.
2. fusedops.nn.Linear (and every torch.nn.Linear that fusedops.nn.patch replaces) never called
   torch.nn.functional.linear: it reshaped and called fusedops.matmul, whose fallback runs torch.matmul. A weight
   that is a tensor subclass implementing F.linear in __torch_function__ (a scaled / quantized weight, as torchao's
   subclasses do) was multiplied as its raw data: with a weight meaning `data * 10`, the output was off by 22.6
   (repro: test_defect2_linear_with_a_subclass_weight_calls_F_linear); and a TorchFunctionMode that intercepts
   F.linear (tracing / counting tools) never saw the call. Fix: fusedops/nn/linear.py runs F.linear (then the
   activation) outside torch.compile for a tensor subclass among its arguments or an active torch function /
   dispatch mode (nn.linear.subclass_or_mode); the patched transformers Conv1D / LlamaRMSNorm forwards in fusedops/nn/patch.py run
   the original forward in the same cases.
3. torch.jit.script of any fusedops.nn module (and so of any model fusedops.nn.patch touched) failed with
   TorchScript compiler errors ("Lambda aren't supported", "try blocks aren't supported", "'MultiheadAttention'
   object has no attribute or method '_attention_forward'") where torch scripts its own modules (pytorch's
   MultiheadAttention / LayerNorm scripting reports; the strict xfail of tests/test_review_session13_nn.py, open
   since session 13). Fix: each forward (fusedops/nn/normalization.py, softmax.py, linear.py, attention.py) runs
   torch's functional op under torch.jit.is_scripting() and keeps the kernel call in a @torch.jit.unused method;
   the scripted module computes what torch's module does (MultiheadAttention: F.multi_head_attention_forward, and
   it scripts even with bias=False and add_bias_kv, where torch 2.13's own module does not).

Checked and matching torch (plain tests below): constructor signatures, repr, deepcopy / pickle, .to(dtype) /
.half(), meta device with to_empty + reset_parameters, FakeTensorMode, LayerNorm / RMSNorm with every dtype pair,
eps=None, empty normalized_shape errors, softmax dims, Linear with transposed / offset weights and sliced / permuted
inputs and every activation (float64 values and gradients), MHA mask matrix, in-place changes after forward.
"""

from __future__ import annotations

import copy
import inspect
import io
import itertools
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import fusedops.nn as fnn
from fusedops.autograd.matmul_reference import apply_activation
from fusedops.nn.patch import patch as fused_patch
from hf_standins import Conv1D as _Conv1D, LlamaRMSNorm as _LlamaRMSNorm

D = torch.float64

MODULES = [
    (torch.nn.LayerNorm, fnn.LayerNorm, (8,)),
    (torch.nn.RMSNorm, fnn.RMSNorm, (8,)),
    (torch.nn.Linear, fnn.Linear, (8, 5)),
    (torch.nn.Softmax, fnn.Softmax, (-1,)),
    (torch.nn.LogSoftmax, fnn.LogSoftmax, (-1,)),
    (torch.nn.MultiheadAttention, fnn.MultiheadAttention, (8, 2)),
]
MODULE_IDS = [t.__name__ for t, _, _ in MODULES]


def _pair(torch_cls, fused_cls, args, **kwargs):
    """(torch module, fusedops module) with the same parameters."""
    t = torch_cls(*args, **kwargs)
    f = fused_cls(*args, **kwargs)
    f.load_state_dict(t.state_dict(), strict=True)
    return t, f


def _inputs(torch_cls, dtype=torch.float32, gen=None):
    if torch_cls is torch.nn.MultiheadAttention:
        x = torch.randn(3, 2, 8, dtype=dtype, generator=gen)
        return (x, x, x), {"need_weights": False}
    return (torch.randn(3, 2, 8, dtype=dtype, generator=gen),), {}


def _out(result):
    return result[0] if isinstance(result, tuple) else result


def _gen(seed):
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------------------------------------------
# Defect 1: forward parameter names
# --------------------------------------------------------------------------------------------------------------


def _parameter_names(fn):
    return list(inspect.signature(fn).parameters)


@pytest.mark.parametrize("torch_cls,fused_cls,args", MODULES, ids=MODULE_IDS)
def test_forward_parameter_names_match_the_originals(torch_cls, fused_cls, args):
    assert _parameter_names(fused_cls.forward) == _parameter_names(torch_cls.forward)
    assert _parameter_names(fused_cls.__init__)[:len(_parameter_names(torch_cls.__init__))] == \
        _parameter_names(torch_cls.__init__)
    for name, parameter in inspect.signature(torch_cls.__init__).parameters.items():
        assert inspect.signature(fused_cls.__init__).parameters[name].default == parameter.default


@pytest.mark.parametrize("original_cls,args", [(_LlamaRMSNorm, (8,)), (_Conv1D, (6, 8))])
def test_patched_transformers_forward_parameter_names(original_cls, args):
    model = torch.nn.Sequential(original_cls(*args))
    fused_patch(model)
    assert type(model[0]) is not original_cls
    assert _parameter_names(type(model[0]).forward) == _parameter_names(original_cls.forward)


def test_defect1_rmsnorm_forward_takes_torchs_keyword_x(route, seed):
    t, f = _pair(torch.nn.RMSNorm, fnn.RMSNorm, (8,), dtype=D)
    with torch.no_grad():
        t.weight.uniform_(0.5, 1.5, generator=_gen(seed))
        f.weight.copy_(t.weight)
    x = torch.randn(3, 8, dtype=D, generator=_gen(seed + 1))
    want = t(x=x)
    torch.testing.assert_close(f(x=x), want)          # TypeError: unexpected keyword argument 'x' before the fix


def test_defect1_patched_model_calling_rmsnorm_by_keyword(route, seed):
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8, dtype=D)
            self.norm = torch.nn.RMSNorm(8, eps=1e-6, dtype=D)

        def forward(self, h):
            return self.norm(x=self.proj(h))

    original = Block()
    patched = copy.deepcopy(original)
    report = fused_patch(patched)
    assert type(patched.norm) is fnn.RMSNorm and len(report.replaced) == 2
    h = torch.randn(2, 3, 8, dtype=D, generator=_gen(seed))
    torch.testing.assert_close(patched(h), original(h))


def test_defect1_rmsnorm_kwargs_pre_hook_sees_x(route, seed):
    # a forward pre-hook with kwargs (as peft / accelerate style hooks register) rewriting torch's `x`
    def hook(module, args, kwargs):
        return args, {"x": kwargs["x"] * 2.0}

    x = torch.randn(2, 8, dtype=D, generator=_gen(seed))
    outs = []
    for cls in (torch.nn.RMSNorm, fnn.RMSNorm):
        m = cls(8, elementwise_affine=False, eps=0.5, dtype=D)
        m.register_forward_pre_hook(hook, with_kwargs=True)
        outs.append(m(x=x))
    torch.testing.assert_close(outs[1], outs[0])


# --------------------------------------------------------------------------------------------------------------
# Defect 2: Linear must go through F.linear where torch's ops run (tensor subclasses, modes)
# --------------------------------------------------------------------------------------------------------------
class _ScaledWeight(torch.Tensor):
    """A weight stored as raw data and a scale that only F.linear applies (as torchao-style quantized weights
    implement F.linear in __torch_function__): its meaning is data * scale."""

    @staticmethod
    def __new__(cls, data, scale):
        t = torch.Tensor._make_subclass(cls, data)
        t.scale = scale
        return t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, w = args[0], args[1]
            b = args[2] if len(args) > 2 else kwargs.get("bias")
            return F.linear(x, w.as_subclass(torch.Tensor) * w.scale, b)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


class _CallLog(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def test_defect2_linear_with_a_subclass_weight_calls_F_linear(route, seed):
    gen = _gen(seed)
    data, bias = torch.randn(3, 4, generator=gen), torch.randn(3, generator=gen)
    x = torch.randn(2, 5, 4, generator=gen)
    want = F.linear(x, data * 10.0, bias)
    for module in (torch.nn.Linear(4, 3), fnn.Linear(4, 3)):
        del module.weight
        module.weight = _ScaledWeight(data, 10.0)
        module.bias = torch.nn.Parameter(bias.clone())
        torch.testing.assert_close(module(x), want)    # fusedops: off by ~20 before the fix (the scale ignored)


def test_defect2_patched_linear_with_a_subclass_weight(route, seed):
    gen = _gen(seed)
    data = torch.randn(3, 4, generator=gen)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    del model[0].weight
    model[0].weight = _ScaledWeight(data, 0.1)
    x = torch.randn(6, 4, generator=gen)
    want = model(x)
    fused_patch(model)
    assert type(model[0]) is fnn.Linear
    torch.testing.assert_close(model(x), want)


def test_defect2_linear_with_activation_and_a_subclass_weight(route, seed):
    gen = _gen(seed)
    data = torch.randn(3, 4, generator=gen)
    x = torch.randn(5, 4, generator=gen)
    m = fnn.Linear(4, 3, activation="silu")
    del m.weight
    m.weight = _ScaledWeight(data, 3.0)
    torch.testing.assert_close(m(x), F.silu(F.linear(x, data * 3.0, m.bias)))


@pytest.mark.parametrize("torch_cls,fused_cls,args", MODULES, ids=MODULE_IDS)
def test_function_mode_sees_the_functional_call_torchs_module_makes(route, torch_cls, fused_cls, args):
    t, f = _pair(torch_cls, fused_cls, args)
    inputs, kwargs = _inputs(torch_cls)
    logs = []
    for module in (t, f):
        with _CallLog() as log:
            module(*inputs, **kwargs)
        logs.append([n for n in log.names if n not in ("__get__", "dim", "size")])
    want = {"LayerNorm": "layer_norm", "RMSNorm": "rms_norm", "Linear": "linear", "Softmax": "softmax",
            "LogSoftmax": "log_softmax"}.get(torch_cls.__name__)
    if want is not None:
        assert logs[0] == [want]
        assert logs[1] == [want]      # fusedops.nn.Linear: no "linear" call before the fix


@pytest.mark.parametrize("original_cls,args,shape", [(_LlamaRMSNorm, (8,), (3, 8)), (_Conv1D, (6, 8), (2, 3, 8))])
def test_patched_transformers_modules_under_a_function_mode_run_the_original(route, seed, original_cls, args, shape):
    torch.manual_seed(seed)
    original = original_cls(*args)
    patched = copy.deepcopy(original)
    fused_patch(patched)
    x = torch.randn(*shape, generator=_gen(seed))
    with _CallLog() as want_log:
        want = original(x)
    with _CallLog() as got_log:
        got = patched(x)
    torch.testing.assert_close(got, want)
    assert "addmm" in want_log.names or "rsqrt" in want_log.names
    assert [n for n in got_log.names if n != "__get__"] == [n for n in want_log.names if n != "__get__"]


def test_patched_conv1d_with_a_subclass_weight_runs_the_original(route, seed):
    class Tagged(torch.Tensor):      # a plain-valued subclass: the original's addmm and ours must agree
        pass

    torch.manual_seed(seed)
    original = _Conv1D(6, 8)
    patched = copy.deepcopy(original)
    fused_patch(patched)
    for m in (original, patched):
        w = m.weight.detach().clone()
        del m.weight
        m.weight = w.as_subclass(Tagged)
    x = torch.randn(2, 3, 8, generator=_gen(seed))
    torch.testing.assert_close(patched(x).as_subclass(torch.Tensor), original(x).as_subclass(torch.Tensor))


# --------------------------------------------------------------------------------------------------------------
# Construction, state, copies
# --------------------------------------------------------------------------------------------------------------
STATE_CASES = [
    (torch.nn.LayerNorm, fnn.LayerNorm, (8,), {}),
    (torch.nn.LayerNorm, fnn.LayerNorm, ((2, 4),), {"bias": False}),
    (torch.nn.LayerNorm, fnn.LayerNorm, ([8],), {"elementwise_affine": False}),
    (torch.nn.RMSNorm, fnn.RMSNorm, (8,), {"eps": None}),
    (torch.nn.RMSNorm, fnn.RMSNorm, (torch.Size([2, 4]),), {"elementwise_affine": False, "eps": 1e-3}),
    (torch.nn.Linear, fnn.Linear, (8, 5), {}),
    (torch.nn.Linear, fnn.Linear, (8, 5), {"bias": False}),
    (torch.nn.Linear, fnn.Linear, (0, 5), {}),
    (torch.nn.MultiheadAttention, fnn.MultiheadAttention, (8, 2), {}),
    (torch.nn.MultiheadAttention, fnn.MultiheadAttention, (8, 2), {"bias": False, "batch_first": True}),
    (torch.nn.MultiheadAttention, fnn.MultiheadAttention, (8, 4), {"kdim": 6, "vdim": 3}),
    (torch.nn.MultiheadAttention, fnn.MultiheadAttention, (8, 2), {"add_bias_kv": True, "add_zero_attn": True}),
    (torch.nn.Softmax, fnn.Softmax, (1,), {}),
    (torch.nn.LogSoftmax, fnn.LogSoftmax, (), {}),
]
STATE_IDS = [f"{t.__name__}-{i}" for i, (t, _, _, _) in enumerate(STATE_CASES)]


@pytest.mark.parametrize("torch_cls,fused_cls,args,kwargs", STATE_CASES, ids=STATE_IDS)
def test_state_dict_round_trips_both_ways(torch_cls, fused_cls, args, kwargs):
    t = torch_cls(*args, **kwargs)
    f = fused_cls(*args, **kwargs)
    assert list(t.state_dict()) == list(f.state_dict())
    assert [(n, p.shape, p.dtype, p.requires_grad) for n, p in t.named_parameters()] == \
        [(n, p.shape, p.dtype, p.requires_grad) for n, p in f.named_parameters()]
    assert repr(t) == repr(f)
    f.load_state_dict(t.state_dict(), strict=True)
    back = torch_cls(*args, **kwargs)
    back.load_state_dict(f.state_dict(), strict=True)
    for (name, a), b in zip(t.state_dict().items(), back.state_dict().values()):
        assert torch.equal(a, b), name
    # an unexpected key is refused by both with strict=True, accepted and reported with strict=False
    extra = dict(t.state_dict(), unexpected=torch.zeros(1))
    for m in (t, f):
        with pytest.raises(RuntimeError, match="Unexpected key"):
            m.load_state_dict(extra, strict=True)
        assert m.load_state_dict(extra, strict=False).unexpected_keys == ["unexpected"]


@pytest.mark.parametrize("torch_cls,fused_cls,args,kwargs", STATE_CASES, ids=STATE_IDS)
def test_copies_dtypes_and_meta_init(torch_cls, fused_cls, args, kwargs):
    f = fused_cls(*args, **kwargs)
    for clone in (copy.deepcopy(f), pickle.loads(pickle.dumps(f))):
        assert type(clone) is fused_cls and repr(clone) == repr(f)
        for a, b in zip(f.state_dict().values(), clone.state_dict().values()):
            assert torch.equal(a, b)
    buffer = io.BytesIO()
    torch.save(f.state_dict(), buffer)
    buffer.seek(0)
    f.load_state_dict(torch.load(buffer), strict=True)
    for convert, dtype in ((lambda m: m.half(), torch.float16), (lambda m: m.to(D), D),
                           (lambda m: m.bfloat16(), torch.bfloat16)):
        assert all(p.dtype == dtype for p in convert(copy.deepcopy(f)).parameters())
    if torch_cls in (torch.nn.Softmax, torch.nn.LogSoftmax):
        return
    meta = fused_cls(*args, **kwargs, device="meta")
    assert all(p.is_meta for p in meta.parameters())
    real = meta.to_empty(device="cpu")
    for sub in real.modules():      # (MHA's _reset_parameters leaves out_proj to out_proj's own reset_parameters)
        reset = getattr(sub, "reset_parameters", None) or getattr(sub, "_reset_parameters", None)
        if reset is not None:
            reset()
    assert type(real) is fused_cls
    assert all(p.device.type == "cpu" and torch.isfinite(p).all() for p in real.parameters())


@pytest.mark.parametrize("torch_cls,fused_cls,args", MODULES, ids=MODULE_IDS)
def test_meta_and_fake_inputs_give_torchs_shapes(route, torch_cls, fused_cls, args):
    from torch._subclasses.fake_tensor import FakeTensorMode

    kwargs = {} if torch_cls in (torch.nn.Softmax, torch.nn.LogSoftmax) else {"device": "meta"}
    results = []
    for cls in (torch_cls, fused_cls):
        m = cls(*args, **kwargs)
        shape = (3, 2, 8)
        x = torch.empty(shape, device="meta")
        call_kwargs = {"need_weights": False} if torch_cls is torch.nn.MultiheadAttention else {}
        out = _out(m(*((x, x, x) if torch_cls is torch.nn.MultiheadAttention else (x,)), **call_kwargs))
        results.append((out.shape, out.dtype, out.device.type))
        with FakeTensorMode():
            m = cls(*args)
            x = torch.randn(shape)
            out = _out(m(*((x, x, x) if torch_cls is torch.nn.MultiheadAttention else (x,)), **call_kwargs))
            results.append((out.shape, out.dtype))
    assert results[0] == results[2] and results[1] == results[3]


# --------------------------------------------------------------------------------------------------------------
# Norms: dtype pairs, eps=None, permuted inputs
# --------------------------------------------------------------------------------------------------------------
DTYPES = [torch.float32, torch.float16, torch.bfloat16, D]


def _call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as error:    # noqa: BLE001 - compared by type below
        return error


@pytest.mark.parametrize("torch_cls,fused_cls", [(torch.nn.LayerNorm, fnn.LayerNorm),
                                                 (torch.nn.RMSNorm, fnn.RMSNorm)], ids=["LayerNorm", "RMSNorm"])
def test_norms_with_every_input_and_parameter_dtype(route, seed, torch_cls, fused_cls):
    gen = _gen(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")        # torch's "Mismatch dtype ... Cannot dispatch to fused" warning
        for module_dtype, input_dtype in itertools.product(DTYPES, DTYPES):
            t = torch_cls(8, dtype=module_dtype)
            with torch.no_grad():
                t.weight.copy_(torch.rand(8, generator=gen) + 0.5)
                if getattr(t, "bias", None) is not None:
                    t.bias.copy_(torch.randn(8, generator=gen))
            f = fused_cls(8, dtype=module_dtype)
            f.load_state_dict(t.state_dict())
            x = (torch.randn(4, 8, generator=gen) * 0.05).to(input_dtype)     # small variance: eps matters
            want, got = _call(t, x), _call(f, x)
            if isinstance(want, Exception):
                assert isinstance(got, type(want)), (module_dtype, input_dtype, got)
                continue
            assert not isinstance(got, Exception), (module_dtype, input_dtype, got)
            assert got.dtype == want.dtype
            low = max((module_dtype, input_dtype), key=lambda d: torch.finfo(d).eps)
            tol = {torch.float16: 2e-3, torch.bfloat16: 2e-2, torch.float32: 1e-5, D: 1e-5}[low]
            torch.testing.assert_close(got.double(), want.double(), atol=tol * 4, rtol=tol * 4)


@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
def test_norms_on_permuted_bhsd_views(route, seed, kind):
    gen = _gen(seed)
    x = torch.randn(2, 5, 4, 8, dtype=D, generator=gen).permute(0, 2, 1, 3)    # (B, H, S, D) from (B, S, H, D)
    assert not x.is_contiguous()
    x.requires_grad_(True)
    if kind == "layer_norm":
        m = fnn.LayerNorm(8, dtype=D)
    else:
        m = fnn.RMSNorm(8, eps=1e-6, dtype=D)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, dtype=D, generator=gen))
    ref = torch.nn.LayerNorm(8, dtype=D) if kind == "layer_norm" else torch.nn.RMSNorm(8, eps=1e-6, dtype=D)
    ref.load_state_dict(m.state_dict())
    g = torch.randn(x.shape, dtype=D, generator=gen)
    got = m(x)
    (gx, *gp) = torch.autograd.grad(got, [x, *m.parameters()], g)
    want = ref(x.detach().contiguous().requires_grad_(True))
    xr = x.detach().contiguous().requires_grad_(True)
    want = ref(xr)
    (wx, *wp) = torch.autograd.grad(want, [xr, *ref.parameters()], g)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(gx, wx)
    for a, b in zip(gp, wp):
        torch.testing.assert_close(a, b)


# --------------------------------------------------------------------------------------------------------------
# In-place changes after the forward (Liger-Kernel#370): same gradients or the same error as torch
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mutate", ["output", "input"])
@pytest.mark.parametrize("torch_cls,fused_cls,args", MODULES, ids=MODULE_IDS)
def test_in_place_changes_after_forward(route, seed, torch_cls, fused_cls, args, mutate):
    t, f = _pair(torch_cls, fused_cls, args, dtype=D) if torch_cls not in (torch.nn.Softmax, torch.nn.LogSoftmax) \
        else _pair(torch_cls, fused_cls, args)

    def run(module):
        gen = _gen(seed)
        x = torch.randn(3, 2, 8, dtype=D, generator=gen).requires_grad_(True)
        g = torch.randn(3, 2, 8, dtype=D, generator=gen)
        try:
            y = _out(module(x, x, x, need_weights=False) if torch_cls is torch.nn.MultiheadAttention else module(x))
            if mutate == "output":
                y.mul_(2.0)
            else:
                with torch.no_grad():
                    x.mul_(2.0)
            (y * g[..., :y.shape[-1]]).sum().backward()
        except RuntimeError as error:
            return error
        return [x.grad] + [p.grad for p in module.parameters()]

    want, got = run(t), run(f)
    if isinstance(want, Exception):
        assert isinstance(got, RuntimeError) and "inplace" in str(got)
        return
    assert not isinstance(got, Exception), got
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


# --------------------------------------------------------------------------------------------------------------
# Linear layouts and activations (float64 values and gradients)
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("layout", ["transposed_weight", "offset_weight", "sliced_input", "permuted_input",
                                    "no_bias", "1d_input"])
def test_linear_layouts_against_float64(route, seed, activation, layout):
    gen = _gen(seed)
    m = fnn.Linear(6, 5, bias=layout != "no_bias", activation=activation, dtype=D)
    if layout == "transposed_weight":      # e.g. tied to a (in, out) parameter
        m.weight = torch.nn.Parameter(torch.randn(6, 5, dtype=D, generator=gen).t())
    elif layout == "offset_weight":
        m.weight = torch.nn.Parameter(torch.randn(31, dtype=D, generator=gen)[1:].view(5, 6))
    x = {"sliced_input": lambda: torch.randn(3, 4, 7, dtype=D, generator=gen)[..., 1:],
         "permuted_input": lambda: torch.randn(6, 4, 3, dtype=D, generator=gen).permute(2, 1, 0),
         "1d_input": lambda: torch.randn(6, dtype=D, generator=gen)}.get(
        layout, lambda: torch.randn(3, 4, 6, dtype=D, generator=gen))()
    x.requires_grad_(True)
    y = m(x)
    g = torch.randn(y.shape, dtype=D, generator=gen)
    params = [x] + list(m.parameters())
    grads = torch.autograd.grad(y, params, g)
    ref_params = [p.detach().clone().requires_grad_(True) for p in params]
    ref = apply_activation(F.linear(ref_params[0], ref_params[1], ref_params[2] if len(ref_params) > 2 else None),
                           activation)
    ref_grads = torch.autograd.grad(ref, ref_params, g)
    assert y.shape == ref.shape
    torch.testing.assert_close(y, ref)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b)


# --------------------------------------------------------------------------------------------------------------
# MultiheadAttention: masks of every dtype and shape, empty dims
# --------------------------------------------------------------------------------------------------------------
def _mha_result(module, *args, **kwargs):
    try:
        return module(*args, **kwargs)[0]
    except Exception as error:    # noqa: BLE001
        return error


@pytest.mark.parametrize("batch_first", [False, True])
def test_mha_mask_matrix_matches_torch(route, seed, batch_first):
    gen = _gen(seed)
    torch.manual_seed(seed)
    t, f = _pair(torch.nn.MultiheadAttention, fnn.MultiheadAttention, (8, 2), batch_first=batch_first, dtype=D)
    length_q, length_k, batch = 3, 5, 2
    q = torch.randn((batch, length_q, 8) if batch_first else (length_q, batch, 8), dtype=D, generator=gen)
    kv = torch.randn((batch, length_k, 8) if batch_first else (length_k, batch, 8), dtype=D, generator=gen)
    masks = {
        "none": None,
        "float32": torch.randn(length_q, length_k, generator=gen),
        "float64": torch.randn(length_q, length_k, dtype=D, generator=gen),
        "int64": torch.zeros(length_q, length_k, dtype=torch.int64),
        "bool": torch.rand(length_q, length_k, generator=gen) > 0.7,
        "bool3d": torch.rand(batch * 2, length_q, length_k, generator=gen) > 0.7,
        "float3d": torch.randn(batch * 2, length_q, length_k, dtype=D, generator=gen),
        "transposed": torch.randn(length_k, length_q, dtype=D, generator=gen),
        "4d": torch.randn(batch, 2, length_q, length_k, dtype=D, generator=gen),
    }
    padding = {
        "none": None,
        "bool": torch.rand(batch, length_k, generator=gen) > 0.7,
        "float": torch.randn(batch, length_k, dtype=D, generator=gen),
        "int32": torch.zeros(batch, length_k, dtype=torch.int32),
        "transposed": torch.rand(length_k, batch, generator=gen) > 0.5,
    }
    checked = 0
    for (mask_name, mask), (pad_name, pad), causal, training in itertools.product(
            masks.items(), padding.items(), (False, True), (False, True)):
        t.train(training)
        f.train(training)
        kwargs = dict(key_padding_mask=pad, attn_mask=mask, need_weights=False, is_causal=causal)
        want, got = _mha_result(t, q, kv, kv, **kwargs), _mha_result(f, q, kv, kv, **kwargs)
        case = (mask_name, pad_name, causal, training)
        if isinstance(want, Exception):
            assert isinstance(got, type(want)), (case, want, got)
            continue
        assert not isinstance(got, Exception), (case, got)
        torch.testing.assert_close(got, want, equal_nan=True, msg=lambda m: f"{case}: {m}")
        checked += 1
    assert checked > 60


@pytest.mark.parametrize("length_q,length_k,batch", [(3, 3, 0), (0, 3, 2), (1, 1, 1), (3, 0, 2)])
def test_mha_empty_dims(route, seed, length_q, length_k, batch):
    t, f = _pair(torch.nn.MultiheadAttention, fnn.MultiheadAttention, (8, 2), dtype=D)
    gen = _gen(seed)
    q = torch.randn(length_q, batch, 8, dtype=D, generator=gen)
    kv = torch.randn(length_k, batch, 8, dtype=D, generator=gen)
    got = f(q, kv, kv, need_weights=False)[0]
    assert got.shape == (length_q, batch, 8)
    want = _mha_result(t, q, kv, kv, need_weights=False)
    if not isinstance(want, Exception):
        torch.testing.assert_close(got, want, equal_nan=True)
    # torch raises for some empty shapes with a key_padding_mask ("cannot reshape tensor of 0 elements"); ours
    # gives the empty (or the no-key) result
    pad = torch.zeros(batch, length_k, dtype=torch.bool)
    assert f(q, kv, kv, key_padding_mask=pad, need_weights=False)[0].shape == (length_q, batch, 8)


# --------------------------------------------------------------------------------------------------------------
# Errors for bad inputs
# --------------------------------------------------------------------------------------------------------------
BAD_INPUTS = {
    "int64": lambda: torch.ones(3, 8, dtype=torch.int64),
    "bool": lambda: torch.ones(3, 8, dtype=torch.bool),
    "complex": lambda: torch.randn(3, 8, dtype=torch.complex64),
    "0d": lambda: torch.tensor(1.0),
    "wrong_width": lambda: torch.randn(3, 7),
    "list": lambda: [[1.0] * 8],
}


@pytest.mark.parametrize("bad", list(BAD_INPUTS))
@pytest.mark.parametrize("torch_cls,fused_cls,args", MODULES[:5], ids=MODULE_IDS[:5])
def test_bad_inputs_raise_where_torch_raises(route, torch_cls, fused_cls, args, bad):
    t, f = _pair(torch_cls, fused_cls, args)
    x = BAD_INPUTS[bad]()
    want, got = _call(t, x), _call(f, x)
    if isinstance(want, Exception):
        assert isinstance(got, Exception), (bad, got)
        # a clear Python error: torch's type, or TypeError / RuntimeError naming the problem
        assert isinstance(got, (type(want), TypeError, RuntimeError)), (bad, want, got)
        return
    assert not isinstance(got, Exception), (bad, got)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------------------------
# Defect 3: torch.jit.script
# --------------------------------------------------------------------------------------------------------------
SCRIPT_CASES = [
    (torch.nn.LayerNorm, fnn.LayerNorm, (8,), {}),
    (torch.nn.LayerNorm, fnn.LayerNorm, ((2, 8),), {"bias": False}),
    (torch.nn.RMSNorm, fnn.RMSNorm, (8,), {}),
    (torch.nn.RMSNorm, fnn.RMSNorm, ([2, 8],), {"elementwise_affine": False, "eps": 1e-3}),
    (torch.nn.Linear, fnn.Linear, (8, 5), {}),
    (torch.nn.Linear, fnn.Linear, (8, 5), {"bias": False}),
    (torch.nn.Softmax, fnn.Softmax, (1,), {}),
    (torch.nn.LogSoftmax, fnn.LogSoftmax, (-1,), {}),
]


@pytest.mark.parametrize("torch_cls,fused_cls,args,kwargs", SCRIPT_CASES,
                         ids=[f"{t.__name__}-{i}" for i, (t, _, _, _) in enumerate(SCRIPT_CASES)])
def test_defect3_jit_script_of_the_modules(route, seed, torch_cls, fused_cls, args, kwargs):
    t, f = _pair(torch_cls, fused_cls, args, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(f)        # a TorchScript compiler error before the fix
        buffer = io.BytesIO()
        torch.jit.save(scripted, buffer)
        buffer.seek(0)
        loaded = torch.jit.load(buffer)
    x = torch.randn(3, 2, 8, generator=_gen(seed))
    for m in (scripted, loaded):
        torch.testing.assert_close(m(x), t(x))
    torch.testing.assert_close(f(x), t(x))
    assert type(f) is fused_cls


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu"])
def test_defect3_jit_script_of_linear_with_activation(route, seed, activation):
    m = fnn.Linear(8, 5, activation=activation)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(m)
    x = torch.randn(4, 8, generator=_gen(seed))
    want = apply_activation(F.linear(x, m.weight, m.bias), activation)
    torch.testing.assert_close(scripted(x), want)
    torch.testing.assert_close(m(x), want)


@pytest.mark.parametrize("kwargs", [{}, {"batch_first": True}, {"kdim": 6, "vdim": 3},
                                    {"bias": False, "add_bias_kv": True, "add_zero_attn": True}],
                         ids=["plain", "batch_first", "kdim_vdim", "bias_kv"])
def test_defect3_jit_script_of_multihead_attention(route, seed, kwargs):
    t, f = _pair(torch.nn.MultiheadAttention, fnn.MultiheadAttention, (8, 2), dtype=D, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(f)
    gen = _gen(seed)
    batch_first = kwargs.get("batch_first", False)
    q = torch.randn(2, 3, 8, dtype=D, generator=gen)
    k = torch.randn(2, 5, kwargs.get("kdim", 8), dtype=D, generator=gen)
    v = torch.randn(2, 5, kwargs.get("vdim", 8), dtype=D, generator=gen)
    if not batch_first:
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    pad = torch.rand(2, 5, generator=gen) > 0.7
    pad[:, 0] = False
    for need_weights, padding, average in itertools.product((True, False), (None, pad), (True, False)):
        call = dict(key_padding_mask=padding, need_weights=need_weights, average_attn_weights=average)
        got, want, eager = scripted(q, k, v, **call), t(q, k, v, **call), f(q, k, v, **call)
        torch.testing.assert_close(got[0], want[0])
        torch.testing.assert_close(eager[0], want[0])
        if need_weights:
            torch.testing.assert_close(got[1], want[1])
        else:
            assert got[1] is None
    # unbatched inputs
    q1, k1, v1 = (x[0] if batch_first else x[:, 0] for x in (q, k, v))
    torch.testing.assert_close(scripted(q1, k1, v1)[0], t(q1, k1, v1)[0])


@pytest.mark.parametrize("norm_first", [False, True])
def test_defect3_jit_script_of_a_patched_encoder_layer(route, seed, norm_first):
    torch.manual_seed(seed)
    original = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=norm_first,
                                                dtype=D)
    patched = copy.deepcopy(original)
    assert fused_patch(patched).counts() == {"fusedops.nn.attention.MultiheadAttention": 1,
                                             "fusedops.nn.linear.Linear": 2,
                                             "fusedops.nn.normalization.LayerNorm": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(patched)
    x = torch.randn(2, 5, 8, dtype=D, generator=_gen(seed))
    mask = torch.nn.Transformer.generate_square_subsequent_mask(5, dtype=D)
    want = original(x, src_mask=mask)
    torch.testing.assert_close(scripted(x, src_mask=mask), want)
    torch.testing.assert_close(patched(x, src_mask=mask), want)
    assert type(patched.self_attn) is fnn.MultiheadAttention      # scripting leaves the eager model as it was
