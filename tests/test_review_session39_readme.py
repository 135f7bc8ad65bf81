"""Review (session 39): README.md read as a contract by a new user, section by section, on a CPU-only machine
(torch's CPU route and the FUSEDOPS_INTERPRET=1 route, the one CUDA tensors take), and the docstrings of the public
ops and fusedops.nn against what they do. Sessions 24 and 26 (test_review_session24_docs.py,
test_review_session26_readme.py) already pin the bench CLI, the settings table, the README kernel, the early
"Coming from Triton" refusals, argument errors and the transforms; session 39's DSL review pins the reduction
keywords and volatile loads. This file adds what the README has said since, and the claims nobody had tried.

What was tried, and held (kept as tests where marked *):
- "Using the library": the snippet at small sizes on both routes (*, values against float64 torch), the ops'
  argument names against torch's, fusedops.nn.patch of a TransformerEncoderLayer (train / eval, *), the modules'
  constructor signatures against torch's (*: Linear adds a keyword-only activation), torch.jit.script of every
  module and of a patched layer (right values).
- "Writing a kernel": `n or 7` is True, `(x > 0) << 1` is 2, accumulators started from literals in nested loops /
  under an `if` / assigned 0.5, a `dsl.int64`-annotated helper parameter, a `dsl.float16` kernel parameter's
  range (LaunchError past 65504's rounding range), globals (enum members, modules, constexpr, dtypes, helpers;
  rebinding a helper or an enum global recompiles; a functools.wraps-wrapped kernel) (*); the interpreter's
  program order, axis 0 fastest (*), its spin-wait error naming the loop (*), and its refusal of addresses outside
  the tensor arguments, with Triton's grouped-GEMM pointer table working once the tensors are passed (*).
- "Coming from Triton": every listed Block method against float64 (*), every newly listed refused name (*, and
  the error gives the README's replacement), a 3-D dot, `num_warps` as a parameter name, Config(num_ctas=...).
- Docstrings: softmax / log_softmax (0-d, int input with dtype=, dtype=float, -inf rows, contiguous result of a
  transposed input), layer_norm / rms_norm (mixed CPU weight dtypes, integer / bool / complex weights, complex
  input, eps=None, devices), matmul (1-D operands, K = 0 with bias and relu, bias shapes, bool / int / complex
  operands with bias / activation / out_dtype, activations, devices), scaled_dot_product_attention (GQA with
  Ev != E, S = 0, L = 0, float32 mask of a float16 query, causal with L != S, fully masked rows, errors): right,
  save matmul's out_dtype (below).
- Every file, plot and constant the README names exists (*); REGISTER_A_HEADROOM's 160 / 33 registers (*).

DEFECTS (fixed this session; their tests pass):
1. "`swizzle2d` (write the grouped ordering out: ...) ... The error for `dsl.<name>` says what to use instead":
   the error for dsl.swizzle2d said only "it is not in the language". Fixed in
   fusedops/dsl/language/triton_names.py (the grouped ordering in the hint).
2. Same for `@triton.heuristics`: `dsl.heuristics` in a kernel had no hint at all, and on the host, where a
   Triton user writes `@dsl.heuristics(...)`, the plain AttributeError "module 'fusedops.dsl' has no attribute
   'heuristics'" (no Triton name on the host had a hint). Fixed: a hint in triton_names.py, and a module
   __getattr__ in fusedops/dsl/__init__.py that adds the same hints to the host's AttributeError.
3. A misspelt descriptor method's error listed ".load(offsets) and .store(offsets, value)", leaving out the
   README's desc.atomic_add. Fixed in fusedops/dsl/frontend/expressions.py.
4. The README's `fusedops.nn.patch(model)` of a TransformerEncoderLayer "swaps the supported submodules": true, but
   in eval mode under torch.no_grad (inference) torch's encoder layer takes its native fast path, which reads the
   parameters and never calls the patched modules: no fusedops kernel runs there (values are torch's). Fixed as
   documentation (README, "Using the library", with torch.backends.mha.set_fastpath_enabled(False)).
5. fusedops.matmul's docstring lists out_dtype as "float16, bfloat16 or float32"; float64 is taken on every route
   (torch's ops on CUDA: the float32 sum converted). Docstring fixed. The README's module list left out
   LogSoftmax and Linear's extra activation= (README fixed).
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import re
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.dsl as dsl
import fusedops.functional as functional
import fusedops.nn as fnn

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
D = torch.float64


def _module(tmp_path: Path, name: str, source: str):
    """Kernels written to a file (their source is read from it) and imported."""
    path = tmp_path / f"{name}.py"
    path.write_text("import fusedops.dsl as dsl\n" + textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- kernels -------------------------------------------------------------------------------------------------
@dsl.jit
def methods_kernel(y_ptr, x_ptr, i_ptr, BLOCK: dsl.constexpr):
    o = dsl.arange(0, BLOCK)
    v = dsl.load(x_ptr + o)
    iv = dsl.load(i_ptr + o)
    m = v.reshape(4, 4)
    dsl.store(y_ptr + o, m.trans().reshape((16,)))
    dsl.store(y_ptr + 16 + o, v.expand_dims((0, 2)).broadcast_to(2, 16, 4).sum(axis=0).sum(axis=1))
    dsl.store(y_ptr + 32 + o, m.sum(axis=1).expand_dims(1).broadcast_to((4, 4)).reshape(16))
    dsl.store(y_ptr + 48 + o, m.max(axis=1).expand_dims(1).broadcast_to(4, 4).reshape(16))
    dsl.store(y_ptr + 64 + o, m.min(axis=1).expand_dims(1).broadcast_to(4, 4).reshape(16))
    dsl.store(y_ptr + 80 + o, m.argmax(axis=1).expand_dims(1).broadcast_to(4, 4).reshape(16).to(dsl.float32))
    dsl.store(y_ptr + 96 + o, m.argmin(axis=1).expand_dims(1).broadcast_to(4, 4).reshape(16).cast(dsl.float32))
    dsl.store(y_ptr + 112 + o, v.cumsum(axis=0))
    dsl.store(y_ptr + 128 + o, v.exp() + v.exp2() + v.log() + v.log2() + v.sqrt() + v.rsqrt() + v.sin() + v.cos()
              + v.erf() + (v * 3).floor() + (v * 3).ceil() + (v - 1).abs() + v.sigmoid())
    dsl.store(y_ptr + 144 + o, iv.cdiv(3).to(dsl.float32))


@dsl.jit
def order_kernel(y_ptr, counter_ptr):
    slot = dsl.atomic_add(counter_ptr, 1)
    dsl.store(y_ptr + slot, dsl.program_id(0) + 10 * dsl.program_id(1) + 100 * dsl.program_id(2))


@dsl.jit
def spin_kernel(flag_ptr, y_ptr):
    pid = dsl.program_id(0)
    if pid == 0:
        while dsl.load(flag_ptr, volatile=True) == 0:     # waits for program 1, which runs after it
            pass
    else:
        dsl.store(flag_ptr, 1)
    dsl.store(y_ptr + pid, 1)


@dsl.jit
def grouped_kernel(y_ptr, ptrs_ptr, BLOCK: dsl.constexpr):
    g = dsl.program_id(0)
    p = dsl.load(ptrs_ptr + g).to(dsl.pointer_type(dsl.float32))
    o = dsl.arange(0, BLOCK)
    dsl.store(y_ptr + g * BLOCK + o, dsl.load(p + o))


@dsl.jit
def grouped_with_tensors_kernel(y_ptr, ptrs_ptr, a_ptr, b_ptr, BLOCK: dsl.constexpr):
    g = dsl.program_id(0)
    p = dsl.load(ptrs_ptr + g).to(dsl.pointer_type(dsl.float32))
    o = dsl.arange(0, BLOCK)
    dsl.store(y_ptr + g * BLOCK + o, dsl.load(p + o))


@dsl.jit
def or_shift_kernel(y_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    o = dsl.arange(0, BLOCK)
    dsl.store(y_ptr, n or 7)
    dsl.store(y_ptr + 1 + o, (dsl.load(x_ptr + o) > 0) << 1)


@dsl.jit
def accumulator_kernel(y_ptr, x_ptr, n, m):
    acc = 0
    for i in range(n):
        for j in range(m):
            acc += dsl.load(x_ptr + i * m + j)
    last_positive = 0
    for i in range(n):
        v = dsl.load(x_ptr + i)
        if v > 0:
            last_positive = v
    half = 0
    for i in range(n):
        half = 0.5
    dsl.store(y_ptr, acc)
    dsl.store(y_ptr + 1, last_positive)
    dsl.store(y_ptr + 2, half)


@dsl.jit
def square64(n: dsl.int64):
    return n * n


@dsl.jit
def square64_kernel(y_ptr, n):
    dsl.store(y_ptr, square64(n))


@dsl.jit
def half_parameter_kernel(y_ptr, a: dsl.float16):
    dsl.store(y_ptr, a)


# -- Coming from Triton: refusals and their replacements --------------------------------------------------------
_REFUSED = {
    # name: (statement, text of the README's replacement that the error must give)
    # (swizzle2d, zeros_like, ravel, broadcast, fdiv, sqrt_rn, cumprod, static_print and flip are in the language
    # since session 41: tests/test_dsl_triton_builtins.py)
    "heuristics": ("r = dsl.heuristics", "on the host"),                                 # DEFECT 2
    # (histogram: in the language, tests/test_dsl_gather.py)
    # (associative_scan: in the language, tests/test_dsl_reduce_combine.py)
    "softmax": ("r = dsl.softmax(v)", "dsl.exp(x - dsl.max(x, axis))"),
    # (sort: in the language, tests/test_dsl_sort.py)
    "map_elementwise": ("r = dsl.map_elementwise(v)", "not in the language"),
}


def test_triton_names_refused_with_the_readme_replacement(tmp_path):
    kernels = "".join(f"""
        @dsl.jit
        def refused_{name}(y_ptr, x_ptr, BLOCK: dsl.constexpr):
            o = dsl.arange(0, BLOCK)
            v = dsl.load(x_ptr + o)
            {statement}
            dsl.store(y_ptr + o, v)
    """ for name, (statement, _) in _REFUSED.items())
    module = _module(tmp_path, "readme39_refused", kernels)
    x = torch.randn(16)
    for name, (_, replacement) in _REFUSED.items():
        with pytest.raises(dsl.CompilationError) as info:
            getattr(module, f"refused_{name}")[(1,)](torch.empty(16), x, BLOCK=16, interpret=True)
        message = str(info.value)
        assert f"has no attribute `{name}`" in message and replacement in message, (name, message)


def test_triton_names_on_the_host_say_what_to_use_instead():
    with pytest.raises(AttributeError, match=r"'heuristics'.*triton.heuristics.*dsl.constexpr"):
        dsl.heuristics                                                                     # DEFECT 2
    with pytest.raises(AttributeError, match=r"'softmax'.*dsl.exp\(x - dsl.max"):      # (histogram: in the language)
        dsl.softmax
    assert not hasattr(dsl, "heuristics") and hasattr(dsl, "range")        # (dsl.range: session 41)
    with pytest.raises(AttributeError, match=r"^module 'fusedops.dsl' has no attribute 'no_such_name'$"):
        dsl.no_such_name


def test_descriptor_method_error_lists_atomic_add(tmp_path):
    module = _module(tmp_path, "readme39_descriptor", """
        @dsl.jit
        def prefetch_kernel(x_ptr, M, N, BM: dsl.constexpr, BN: dsl.constexpr):
            desc = dsl.make_tensor_descriptor(x_ptr, [M, N], [N, 1], [BM, BN])
            desc.prefetch([0, 0])
    """)
    with pytest.raises(dsl.CompilationError, match=r"no attribute `prefetch`.*\.atomic_add\(offsets, value\)"):
        module.prefetch_kernel[(1,)](torch.zeros(16, 16), 16, 16, BM=16, BN=16, interpret=True)   # DEFECT 3


def test_block_methods_of_the_readme():
    x = torch.rand(16) + 0.5
    i = torch.randint(-20, 20, (16,), dtype=torch.int32)
    y = torch.full((160,), float("nan"))
    methods_kernel[(1,)](y, x, i, BLOCK=16, interpret=True)
    xd = x.to(D)
    m = xd.reshape(4, 4)
    rows = lambda t: t.repeat_interleave(4)
    expected = torch.cat([
        m.T.reshape(16), 8 * xd, rows(m.sum(1)), rows(m.amax(1)), rows(m.amin(1)), rows(m.argmax(1).to(D)),
        rows(m.argmin(1).to(D)), xd.cumsum(0),
        xd.exp() + xd.exp2() + xd.log() + xd.log2() + xd.sqrt() + xd.rsqrt() + xd.sin() + xd.cos() + torch.erf(xd)
        + (xd * 3).floor() + (xd * 3).ceil() + (xd - 1).abs() + xd.sigmoid(),
        torch.tensor([-(-v // 3) for v in i.tolist()], dtype=D)])
    torch.testing.assert_close(y.to(D), expected, atol=2e-5, rtol=1e-6)


# -- Writing a kernel: the interpreter ----------------------------------------------------------------------------
def test_interpreter_runs_programs_in_order_axis_0_fastest():
    y = torch.full((12,), -1, dtype=torch.int32)
    counter = torch.zeros(1, dtype=torch.int32)
    order_kernel[(2, 3, 2)](y, counter, interpret=True)
    assert y.tolist() == [a + 10 * b + 100 * c for c in range(2) for b in range(3) for a in range(2)]


def test_spin_wait_on_a_later_program_raises_naming_the_loop():
    with pytest.raises(dsl.InterpreterError, match=r"spin_kernel.*while loop cannot end"):
        spin_kernel[(2,)](torch.zeros(1, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), interpret=True)


def test_interpreter_reads_only_inside_the_tensor_arguments():
    a, b = torch.randn(16), torch.randn(16)
    ptrs = torch.tensor([a.data_ptr(), b.data_ptr()], dtype=torch.int64)
    y = torch.full((32,), float("nan"))
    with pytest.raises(dsl.InterpreterError, match=r"grouped_kernel.*outside every tensor argument's storage"):
        grouped_kernel[(2,)](y, ptrs, BLOCK=16, interpret=True)
    grouped_with_tensors_kernel[(2,)](y, ptrs, a, b, BLOCK=16, interpret=True)
    assert torch.equal(y, torch.cat([a, b]))


# -- Writing a kernel: Python semantics, arguments, globals ---------------------------------------------------------
def test_or_is_a_bool_and_booleans_shift_as_int32():
    x = torch.randn(8)
    y = torch.full((9,), -5, dtype=torch.int32)
    or_shift_kernel[(1,)](y, x, 3, BLOCK=8, interpret=True)
    assert y[0].item() == 1                                        # `n or 7` is True, not 3
    assert y[1:].tolist() == [2 * int(v > 0) for v in x.tolist()]


def test_accumulators_from_literals_take_the_loop_body_type():
    x = torch.randn(12)
    y = torch.full((3,), float("nan"))
    accumulator_kernel[(1,)](y, x, 3, 4, interpret=True)
    positives = [v for v in x[:3].tolist() if v > 0]
    expected = [x.to(D).sum().item(), positives[-1] if positives else 0.0, 0.5]
    torch.testing.assert_close(y.to(D), torch.tensor(expected, dtype=D), atol=1e-5, rtol=1e-6)


def test_annotated_parameters_convert():
    y = torch.zeros(1, dtype=torch.int64)
    square64_kernel[(1,)](y, 100_000, interpret=True)
    assert y.item() == 10 ** 10                                    # the helper's n is int64: no int32 wrap
    h = torch.zeros(1, dtype=torch.float16)
    half_parameter_kernel[(1,)](h, 1.5, interpret=True)
    assert h.item() == 1.5
    with pytest.raises(dsl.LaunchError, match=r"`a` of kernel half_parameter_kernel.*float16's range"):
        half_parameter_kernel[(1,)](h, 65520.0, interpret=True)


def test_globals_enum_module_helper_and_wrapped_source(tmp_path):
    module = _module(tmp_path, "readme39_globals", """
        import enum
        import functools
        import math

        class Mode(enum.IntEnum):
            A = 1
            B = 2

        MODE = Mode.B
        C = dsl.constexpr(3)
        DT = dsl.float32

        @dsl.jit
        def helper(x):
            return x + 1

        def deco(f):
            @functools.wraps(f)
            def inner(*args, **kwargs):
                return f(*args, **kwargs)
            return inner

        @dsl.jit
        def globals_kernel(y_ptr, x):
            v = x.to(DT)
            if MODE == Mode.B:
                v = v * C
            dsl.store(y_ptr, helper(v) + math.pi)

        @dsl.jit
        @deco
        def wrapped_kernel(y_ptr, x):
            dsl.store(y_ptr, x * 2)
    """)
    y = torch.zeros(1)
    module.globals_kernel[(1,)](y, 2.0, interpret=True)
    assert y.item() == pytest.approx(2 * 3 + 1 + 3.14159265, rel=1e-6)

    @dsl.jit
    def helper(x):
        return x + 10

    module.helper = helper                                        # rebinding a helper recompiles
    module.globals_kernel[(1,)](y, 2.0, interpret=True)
    assert y.item() == pytest.approx(2 * 3 + 10 + 3.14159265, rel=1e-6)
    module.MODE = module.Mode.A
    module.globals_kernel[(1,)](y, 2.0, interpret=True)
    assert y.item() == pytest.approx(2 + 10 + 3.14159265, rel=1e-6)
    module.wrapped_kernel[(1,)](y, 2.0, interpret=True)
    assert y.item() == 4.0
    path = tmp_path / "readme39_globals.py"
    path.write_text(path.read_text().replace("x * 2)", "x * 5)"))  # read at decoration: no change
    module.wrapped_kernel[(1,)](y, 3.0, interpret=True)
    assert y.item() == 6.0


# -- Using the library ------------------------------------------------------------------------------------------------
def test_readme_library_snippet_runs_on_cpu(route):
    x = torch.randn(16, 64, dtype=torch.float16, requires_grad=True)
    y = fusedops.softmax(x, dim=-1)
    z = fusedops.layer_norm(x, (64,), weight=None, bias=None, eps=1e-5)
    w = torch.randn(64, 32, dtype=torch.float16)
    c = fusedops.matmul(x, w, activation="gelu")
    q, k, v = (torch.randn(2, 2, 16, 16, dtype=torch.float16) for _ in range(3))
    o = fusedops.scaled_dot_product_attention(q, k, v, is_causal=True)
    (y.sum() + z.sum() + c.float().sum() + o.float().sum()).backward()

    xd = x.detach().to(D).requires_grad_()
    yd, zd = torch.softmax(xd, -1), F.layer_norm(xd, (64,), eps=1e-5)
    cd = F.gelu(xd @ w.to(D))
    od = F.scaled_dot_product_attention(q.to(D), k.to(D), v.to(D), is_causal=True)
    (yd.sum() + zd.sum() + cd.sum() + od.sum()).backward()
    for ours, ref in ((y, yd), (z, zd), (c, cd), (o, od), (x.grad, xd.grad)):
        assert ours.dtype == torch.float16
        torch.testing.assert_close(ours.to(D), ref.detach(), atol=3e-2, rtol=1e-2)
    torch.testing.assert_close(fusedops.log_softmax(x, -1, None).to(D), torch.log_softmax(xd, -1).detach(),
                               atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(fusedops.rms_norm(x, (64,), None, None).to(D),
                               F.rms_norm(xd, (64,)).detach(), atol=1e-2, rtol=1e-2)


def test_nn_modules_take_torch_arguments():
    for name in ("Softmax", "LogSoftmax", "LayerNorm", "RMSNorm", "MultiheadAttention"):
        assert inspect.signature(getattr(fnn, name).__init__) == inspect.signature(getattr(torch.nn, name).__init__)
    ours = inspect.signature(fnn.Linear.__init__).parameters
    theirs = inspect.signature(torch.nn.Linear.__init__).parameters
    assert list(ours)[:len(theirs)] == list(theirs) and ours["activation"].kind is inspect.Parameter.KEYWORD_ONLY
    assert "LogSoftmax" in README and "activation=" in README


def test_patched_encoder_layer_and_its_inference_fast_path(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    calls = []
    for name in ("layer_norm", "matmul", "scaled_dot_product_attention"):
        op = getattr(functional, name)
        monkeypatch.setattr(functional, name, lambda *a, _op=op, _name=name, **k: calls.append(_name) or _op(*a, **k))
    layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, batch_first=True, dropout=0.0).eval()
    reference = copy.deepcopy(layer)
    report = fnn.patch(layer)
    assert "5 modules replaced" in str(report)
    x = torch.randn(2, 5, 16)
    expected = reference(x).detach()
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)
    assert {"layer_norm", "matmul", "scaled_dot_product_attention"} <= set(calls)
    calls.clear()
    with torch.no_grad():                       # torch's native fast path: the patched modules are not called
        torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)
    assert calls == []
    assert "set_fastpath_enabled(False)" in README and "_transformer_encoder_layer_fwd" in README  # DEFECT 4
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad():
            torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)
    assert {"layer_norm", "matmul", "scaled_dot_product_attention"} <= set(calls)


# -- docstrings -------------------------------------------------------------------------------------------------------
def test_matmul_out_dtype_float64_as_documented(route):
    a = torch.randn(4, 8, dtype=torch.float16)
    b = torch.randn(8, 3, dtype=torch.float16)
    c = fusedops.matmul(a, b, torch.randn(3), "silu", out_dtype=torch.float64)
    assert c.dtype == torch.float64 and c.shape == (4, 3)
    assert "float64 out_dtype" in fusedops.matmul.__doc__                                  # DEFECT 5
    with pytest.raises(TypeError, match=r"out_dtype must be a floating-point torch.dtype, got torch.int32"):
        fusedops.matmul(a, b, out_dtype=torch.int32)


def test_norm_results_take_the_input_dtype_whatever_the_weight(route):
    x = torch.randn(4, 8, dtype=torch.float16)
    w, bias = torch.randn(8), torch.randn(8)
    ln = fusedops.layer_norm(x, (8,), w, bias)                     # float32 parameters of a half input, on the CPU
    assert ln.dtype == torch.float16
    torch.testing.assert_close(ln.to(D), F.layer_norm(x.to(D), (8,), w.to(D), bias.to(D)), atol=1e-2, rtol=1e-2)
    rms = fusedops.rms_norm(x, (8,), w)
    assert rms.dtype == torch.float16
    torch.testing.assert_close(rms.to(D), F.rms_norm(x.to(D), (8,), w.to(D)), atol=1e-2, rtol=1e-2)
    integer = fusedops.rms_norm(x.float(), (8,), torch.arange(8))  # converted to float32 first
    torch.testing.assert_close(integer.to(D), F.rms_norm(x.to(D), (8,), torch.arange(8).to(D)), atol=1e-5, rtol=1e-5)
    with pytest.raises(TypeError, match=r"weight has dtype torch.complex64"):
        fusedops.rms_norm(x.float(), (8,), torch.ones(8, dtype=torch.complex64))


# -- what the README names exists -------------------------------------------------------------------------------------
def test_files_and_constants_the_readme_names_exist():
    names = set(re.findall(r"[A-Za-z_./]+\.(?:py|png)\b", README))
    for name in names:
        if name == "my_kernel.py":
            continue
        assert (ROOT / name).exists() or (ROOT / "fusedops" / name).exists(), name
    from fusedops.dsl.passes import dot_layouts
    from fusedops.kernels import norm_forward_config

    assert 255 - dot_layouts.REGISTER_A_HEADROOM == 160 and 128 - dot_layouts.REGISTER_A_HEADROOM == 33
    assert isinstance(norm_forward_config.ROW_SWEEP_SHIFTED_SUMS, bool)
    assert "python -m pytest -q -n auto --maxprocesses 8 tests" in (ROOT / ".ci" / "run").read_text()
