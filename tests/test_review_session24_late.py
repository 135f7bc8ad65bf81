"""Review (session 24, late): a fresh reviewer tried to break the session's changes as a PyTorch / Triton user
would: the one parameter binder with positional-only / keyword-only kinds (launches, the cached-launch entry,
`prepare`, nested jit calls), the short-circuiting scalar `and` / `or` and the tuple-comparison refusal, the
torch-mode routing of fusedops.functional, layer_norm's corrected mean, the argument checks of the custom
operators (and their fake kernels), and nested-tensor inputs of fusedops.nn.MultiheadAttention.

Defects found (all fixed in the same session; a backward under an active torch mode now runs torch's ops,
function_host.backward_runs_torch;
the generated launch entry keeps the kernel's `/` and keyword-only parameters, and the full path and prepare's
fallback pass keyword-only values by keyword; a chained comparison short-circuits like `and`; the attention
operator checks its arguments and the softmax fake kernel raises for non-float dtypes; the norm fake kernels
check only concrete normalized shapes, not SymInts):

1. Keyword-only kernel parameters after the first GPU launch (the generated entry, fast_path.make_entry, has
   no `*` of its own and `JITFunction._slow` re-passes every value given by keyword as positional):
   `k[(1,)](o, a=7.0)` with `def k(o_ptr, *, a, B: dsl.constexpr = 4)` (a new launch key) raises
   "TypeError: kernel `k` takes 1 positional arguments (o_ptr) but 3 were given"; expected: it launches, as
   the first launch with the same call did.
2. The same entry accepts what Python's rules (and the full path) refuse: `k[(1,)](o, 3)` for that kernel
   launches through the cached plan (a=3 bound by position); `k[(1,)](o, a=3)` with
   `def k(o_ptr, a, /, B: dsl.constexpr = 4)` launches (plan hit and miss). Expected: TypeError.
3. `JITFunction.prepare` of a kernel with keyword-only parameters: the prepared launch's fallback (every
   interpreter launch) calls `run(grid, *values)` with all values by position, so `prepared(o2)` raises
   "TypeError: kernel `k` takes 1 positional arguments (o_ptr) but 3 were given"; expected: it launches.
4. A chained comparison does not short-circuit like Python (and like the `and` it stands for, which now
   does): `0 <= i < dsl.load(x_ptr + i)` with i = -1 loads x_ptr - 1 (InterpreterError: out-of-bounds load),
   while `0 <= i and i < dsl.load(x_ptr + i)` gives 0. Expected: 0, the load skipped.
5. A dispatch mode active during backward only: `with FlopCounterMode(): y.sum().backward()` for
   y = fusedops.matmul(a, b) (forward on the kernel route) counts 0 FLOPs; torch.matmul's backward counts
   2 * 2*M*N*K. The backward's kernels never show torch ops to the mode. Expected: torch's count.
6. torch.ops.fusedops.scaled_dot_product_attention (called directly) checks nothing, unlike the other custom
   ops now: with FUSEDOPS_INTERPRET=1, a key of head dim 16 for a query of head dim 8 returns an output
   (fusedops.scaled_dot_product_attention raises RuntimeError), int64 operands return an int64 output, and
   float32 / float64 operands raise an internal CompilationError of the kernel. Expected: the public
   function's errors (RuntimeError), on every route.
7. fusedops::softmax / log_softmax's fake kernel does not raise what the real one raises: an int64, bool or
   complex input (or dtype=torch.int32) makes the real op raise NotImplementedError, the fake one returns an
   empty tensor (so torch.compile traces a graph that fails only when run). Expected: the fake raises too.
8. Regression of the new fake-kernel checks: `torch.compile(lambda x: fusedops.layer_norm(x, x.shape[-1:]))`
   called with hidden sizes 8 then 16 (automatic dynamic shapes; dynamic=True likewise), and the same with
   fusedops.rms_norm, fails with "TypeError: normalized_shape must be an int or a sequence of ints, got
   [s27]": the fake kernels' normalized_shape_tuple refuses SymInts. It compiled before (144e319).
   Expected: it compiles and matches eager.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.dsl as dsl
import fusedops.library  # noqa: F401  (registers torch.ops.fusedops.*)
import fusedops.nn as fnn
from fusedops.dsl.errors import CompilationError, InterpreterError
from fusedops.dsl.runtime.fast_path import make_binder
from fusedops.dsl.runtime.signature import bind_parameters
from host_jit import run_on_host
from kernel_source import jit_from_source

_COUNT = [0]


def _kernel(source: str, namespace=None, name: str = "k"):
    _COUNT[0] += 1
    return jit_from_source(source, f"<review24 late {_COUNT[0]}>", name=name, namespace=namespace)


def _i32(*values):
    return torch.tensor(list(values), dtype=torch.int32)


# ------------------------------------------------------------------------------------------------
# The mocked driver of tests/test_launch_fast_path.py (a CPU tensor claiming a CUDA device)
# ------------------------------------------------------------------------------------------------
from test_launch_fast_path import _cuda, gpu  # noqa: E402,F401  (the mocked driver: a fixture, fake CUDA tensors)


_KW_ONLY = "def k(o_ptr, *, a, B: dsl.constexpr = 4):\n    dsl.store(o_ptr + dsl.arange(0, B), a)\n"
_POS_ONLY = "def k(o_ptr, a, /, B: dsl.constexpr = 4):\n    dsl.store(o_ptr + dsl.arange(0, B), a)\n"


# ================================================================================================
# DEFECTS 1-3: positional-only / keyword-only parameters in the cached-launch entry and `prepare`
# ================================================================================================
def test_keyword_only_launch_with_a_new_key_after_the_first_gpu_launch(gpu):
    kernel = _kernel(_KW_ONLY)
    out = _cuda(torch.zeros(4, dtype=torch.int32))
    kernel[(1,)](out, a=3)
    kernel[(1,)](out, a=7.0)        # a float: a new specialization
    assert len(gpu) == 2


def test_keyword_only_launches_by_keyword_take_the_cached_plan(gpu):
    kernel = _kernel(_KW_ONLY)
    out = _cuda(torch.zeros(4, dtype=torch.int32))
    kernel[(1,)](out, a=3)
    kernel[(1,)](out, a=5)
    kernel[(1,)](out, B=4, a=6)
    assert len(gpu) == 3 and len(kernel._plans) == 1


def test_keyword_only_parameter_refuses_a_positional_argument_on_the_fast_path(gpu):
    kernel = _kernel(_KW_ONLY)
    out = _cuda(torch.zeros(4, dtype=torch.int32))
    kernel[(1,)](out, a=3)
    kernel[(1,)](out, a=3)
    with pytest.raises(TypeError):
        kernel[(1,)](out, 3)


def test_positional_only_parameter_refuses_a_keyword_on_the_fast_path(gpu):
    kernel = _kernel(_POS_ONLY)
    out = _cuda(torch.zeros(4, dtype=torch.int32))
    kernel[(1,)](out, 3)
    kernel[(1,)](out, 3)
    count = len(gpu)
    for value in (3, 4.0):          # the cached plan's key, then a new one
        with pytest.raises(TypeError):
            kernel[(1,)](out, a=value)
    assert len(gpu) == count


def test_positional_only_parameter_refuses_a_keyword_before_the_first_gpu_launch(gpu):
    kernel = _kernel(_POS_ONLY)
    out = _cuda(torch.zeros(4, dtype=torch.int32))
    with pytest.raises(TypeError, match="positional-only argument `a`"):
        kernel[(1,)](out, a=3)
    kernel[(1,)](out, 3, 4)
    assert len(gpu) == 1


def test_prepare_of_a_kernel_with_keyword_only_parameters():
    kernel = _kernel(_KW_ONLY)
    prepared = kernel.prepare((1,), torch.zeros(4, dtype=torch.int32), a=3, interpret=True)
    out = torch.zeros(4, dtype=torch.int32)
    prepared(out)
    assert out.tolist() == [3] * 4


def test_prepare_and_grid_callables_with_positional_only_parameters():
    kernel = _kernel(_POS_ONLY)
    prepared = kernel.prepare((1,), torch.zeros(4, dtype=torch.int32), 3, interpret=True)
    out = torch.zeros(4, dtype=torch.int32)
    prepared(out)
    assert out.tolist() == [3] * 4
    kernel = _kernel(_KW_ONLY)
    seen = {}
    kernel[lambda meta: seen.update(meta) or (1,)](out, a=9, interpret=True)
    assert out.tolist() == [9] * 4 and seen["a"] == 9 and seen["B"] == 4


# ------------------------------------------------------------------------------------------------
# The generated binder (make_binder) and bind_parameters agree with Python's binding
# ------------------------------------------------------------------------------------------------
def _python_reference(a, b=20, /, c=30, *, d, e=50):
    return [a, b, c, d, e]


_CALLS = [((1,), {"d": 4}), ((1, 2), {"d": 4}), ((1, 2, 3), {"d": 4, "e": 5}), ((1,), {"c": 3, "d": 4}),
          ((1,), {"e": 5, "d": 4, "c": 3}), ((1, 2, 3, 4), {}), ((1,), {}), ((), {"a": 1, "d": 4}),
          ((1,), {"b": 2, "d": 4}), ((1, 2, 3), {"c": 3, "d": 4}), ((1,), {"d": 4, "f": 6}), ((), {"d": 4})]


@pytest.mark.parametrize("args, kwargs", _CALLS)
def test_binders_follow_pythons_rules_for_a_mixed_signature(args, kwargs):
    kernel = _kernel("def k(a, b=20, /, c=30, *, d, e=50):\n    pass\n")
    assert [p.kind for p in kernel.params] == ["positional_only"] * 2 + ["positional_or_keyword"] + \
        ["keyword_only"] * 2
    binder = make_binder(kernel.params, torch.Tensor)
    try:
        expected = _python_reference(*args, **kwargs)
    except TypeError:
        with pytest.raises(TypeError):
            bind_parameters(kernel.params, args, kwargs, "k", TypeError)
        with pytest.raises(TypeError):
            binder(4, 3, *args, **kwargs)
        return
    assert bind_parameters(kernel.params, args, kwargs, "k", TypeError) == expected
    key, values = binder(4, 3, *args, **kwargs)
    assert list(values) == expected


def test_nested_helper_with_slash_star_defaults_and_a_keyword_only_constexpr():
    helper = _kernel("def h(x, /, y=2, *, z=3, W: dsl.constexpr = 10):\n    return x * 1000 + y * 100 + z * W\n",
                     name="h")
    for call, expected in [("h(1)", 1230), ("h(1, 5)", 1530), ("h(1, y=5, z=1)", 1510), ("h(1, z=4, W=1)", 1204)]:
        kernel = _kernel(f"def k(o_ptr):\n    dsl.store(o_ptr, {call})\n", {"h": helper})
        out = _i32(0)
        kernel[(1,)](out, interpret=True)
        assert out.tolist() == [expected], call
    for call, words in [("h(x=1)", "positional-only argument `x`"), ("h(1, 2, 3)", "takes 2 positional"),
                        ("h(1, 2, z=1, y=3)", "multiple values for argument `y`"), ("h(1, Q=2)", "unexpected")]:
        kernel = _kernel(f"def k(o_ptr):\n    dsl.store(o_ptr, {call})\n", {"h": helper})
        with pytest.raises(CompilationError, match=words):
            kernel[(1,)](_i32(0), interpret=True)
        with pytest.raises(CompilationError, match=words):
            kernel.compile(_i32(0), target="sm_80")


# ================================================================================================
# DEFECT 4: chained comparisons do not short-circuit a load
# ================================================================================================
def test_chained_comparison_guards_a_load_like_python():
    kernel = _kernel("def k(o_ptr, x_ptr, i):\n    dsl.store(o_ptr, (0 <= i < dsl.load(x_ptr + i)).to(dsl.int32))\n")
    out = _i32(7)
    kernel[(1,)](out, _i32(5, 5), -1, interpret=True)
    assert out.tolist() == [0]


def test_spelled_out_and_guards_the_same_load():
    kernel = _kernel("def k(o_ptr, x_ptr, i):\n    dsl.store(o_ptr, (0 <= i and i < dsl.load(x_ptr + i)).to(dsl.int32))\n")
    for i, expected in [(-1, 0), (0, 1), (1, 1)]:
        out = _i32(7)
        kernel[(1,)](out, _i32(5, 5), i, interpret=True)
        assert out.tolist() == [expected]


# ================================================================================================
# Tricky cases that hold: short-circuit `and` / `or` (interpreter, sm_90a, sm_80, compiled on the host)
# ================================================================================================
def _everywhere(kernel, make_args, expected, host=True, **constexprs):
    args = make_args()
    kernel[(1,)](*args, interpret=True, **constexprs)
    assert args[0].tolist() == expected
    for target in ("sm_90a", "sm_80"):
        kernel.compile(*make_args(), target=target, **constexprs)
    if host:
        args = make_args()
        run_on_host(kernel, *args, **constexprs)
        assert args[0].tolist() == expected


_DATA = (1, 1, 0, 5)


@pytest.mark.parametrize("i", [0, 1, 2, 5])
def test_and_chains_and_or_mixed_with_and(i):
    kernel = _kernel("def k(o_ptr, x_ptr, i, n):\n"
                     "    dsl.store(o_ptr, (i < n and dsl.load(x_ptr + i) > 0 and dsl.load(x_ptr + i + 1) > 0).to(dsl.int32))\n"
                     "    dsl.store(o_ptr + 1, (i >= n or dsl.load(x_ptr + i) > 0 and dsl.load(x_ptr + i + 1) > 0).to(dsl.int32))\n")
    x = list(_DATA)
    first = int(i < 3 and x[i] > 0 and x[i + 1] > 0)
    second = int(i >= 3 or (x[i] > 0 and x[i + 1] > 0))
    _everywhere(kernel, lambda: [_i32(9, 9), _i32(*_DATA), i, 3], [first, second])


@pytest.mark.parametrize("i, expected", [(2, [1, 2]), (5, [0, -1])])
def test_right_side_storing_through_a_nested_jit_function_is_skipped(i, expected):
    helper = _kernel("def h(p, v):\n    dsl.store(p, v)\n    return v > 0\n", name="h")
    kernel = _kernel("def k(o_ptr, i, n):\n    r = i < n and h(o_ptr + 1, i)\n    dsl.store(o_ptr, r.to(dsl.int32))\n",
                     {"h": helper})
    _everywhere(kernel, lambda: [_i32(-1, -1), i, 3], expected)


@pytest.mark.parametrize("i, expected", [(0, [2, 5]), (1, [2, 4]), (4, [1, 0])])
def test_int1_result_in_arithmetic(i, expected):
    kernel = _kernel("def k(o_ptr, x_ptr, i, n):\n    dsl.store(o_ptr, (i < n and dsl.load(x_ptr + i) > 0) + 1)\n"
                     "    dsl.store(o_ptr + 1, (i < n and dsl.load(x_ptr + i) > 0) * 5 - (i < n and i > 0))\n")
    _everywhere(kernel, lambda: [_i32(0, 0), _i32(3, 3), i, 2], expected)


def test_short_circuit_results_as_loop_conditions():
    kernel = _kernel("def k(o_ptr, x_ptr, n):\n    i = 0\n    while not (i >= n or dsl.load(x_ptr + i) == 0):\n        i += 1\n"
                     "    count = 0\n    for j in range(n + 3):\n        if j < n and dsl.load(x_ptr + j) > 1:\n            count += 1\n"
                     "    dsl.store(o_ptr, i)\n    dsl.store(o_ptr + 1, count)\n")
    _everywhere(kernel, lambda: [_i32(0, 0), _i32(1, 2, 3, 4), 4], [4, 3])
    _everywhere(kernel, lambda: [_i32(0, 0), _i32(1, 2, 0, 4), 4], [2, 2])


def test_truthiness_of_loaded_floats_and_of_int_and_bool_left_sides():
    kernel = _kernel("def k(o_ptr, x_ptr, i, n):\n    dsl.store(o_ptr, (i < n and dsl.load(x_ptr + i)).to(dsl.int32))\n"
                     "    dsl.store(o_ptr + 1, (i >= n or dsl.load(x_ptr + i)).to(dsl.int32))\n"
                     "    dsl.store(o_ptr + 2, (n and dsl.load(x_ptr + 1) == 0.0).to(dsl.int32))\n")
    for data, i, n, expected in [((math.nan, 0.0), 0, 2, [1, 1, 1]), ((-0.0, 0.0), 0, 2, [0, 0, 1]),
                                 ((1.0, 2.0), 3, 0, [0, 1, 0])]:
        _everywhere(kernel, lambda: [_i32(7, 7, 7), torch.tensor(data), i, n], expected)
    kernel = _kernel("def k(o_ptr, x_ptr, flag: dsl.int1, C: dsl.constexpr):\n"
                     "    dsl.store(o_ptr, (flag and C and dsl.load(x_ptr) > 0).to(dsl.int32))\n")
    for flag, c, expected in [(True, True, [1]), (True, False, [0]), (False, True, [0])]:
        _everywhere(kernel, lambda: [_i32(7), _i32(5), flag], expected, C=c)


def test_skipped_atomic_and_block_right_sides():
    kernel = _kernel("def k(o_ptr, x_ptr, i, n):\n    r = i < n and dsl.atomic_add(x_ptr, 1) >= 0\n"
                     "    dsl.store(o_ptr, r.to(dsl.int32))\n    dsl.store(o_ptr + 1, dsl.load(x_ptr))\n")
    for i, expected in [(5, [0, 5]), (0, [1, 6])]:
        _everywhere(kernel, lambda: [_i32(0, 0), _i32(5), i, 1], expected, host=False)
    # a block right side is elementwise (both sides run); its result is a block
    kernel = _kernel("def k(o_ptr, x_ptr, i):\n    r = dsl.arange(0, 4)\n"
                     "    dsl.store(o_ptr + r, (i > 0 and dsl.load(x_ptr + r) > 1).to(dsl.int32))\n")
    _everywhere(kernel, lambda: [_i32(0, 0, 0, 0), _i32(1, 2, 3, 0), 1], [0, 1, 1, 0], host=False)
    _everywhere(kernel, lambda: [_i32(9, 9, 9, 9), _i32(1, 2, 3, 0), 0], [0, 0, 0, 0], host=False)


def test_tuple_comparisons_runtime_refused_compile_time_kept():
    kernel = _kernel("def k(o_ptr, a):\n    dsl.store(o_ptr, [a] == [a])\n")
    with pytest.raises(CompilationError, match="=="):
        kernel[(1,)](_i32(0), 3, interpret=True)
    kernel = _kernel("def k(o_ptr, a, S: dsl.constexpr):\n    dsl.store(o_ptr, ((a,), 1) != S)\n")
    with pytest.raises(CompilationError, match="!="):
        kernel[(1,)](_i32(0), 3, S=((3,), 1), interpret=True)
    kernel = _kernel("def k(o_ptr, a, S: dsl.constexpr):\n    x = dsl.zeros((4,), dsl.int32)\n"
                     "    dsl.store(o_ptr, (x.shape == (4,)) + (S == (1, 2)) + (S < (1, 3)) + (a is None))\n")
    _everywhere(kernel, lambda: [_i32(0), 3], [3], host=True, S=(1, 2))


# ================================================================================================
# DEFECT 5 and tricky cases: torch modes
# ================================================================================================
class _PassThrough(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.fixture
def launches(monkeypatch):
    """Counts the interpreter's kernel launches (FUSEDOPS_INTERPRET=1)."""
    from fusedops.dsl.interpreter.executor import Interpreter

    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    count = [0]
    original = Interpreter.launch

    def launch(self, *args, **kwargs):
        count[0] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Interpreter, "launch", launch)
    return count


def test_device_context_keeps_the_kernel_route_and_other_function_modes_do_not(launches):
    x = torch.randn(3, 8)
    expected = torch.softmax(x.double(), -1)

    def launched(fn):
        launches[0] = 0
        torch.testing.assert_close(fn().double(), expected)
        return launches[0]

    assert launched(lambda: fusedops.softmax(x, -1)) == 1
    with torch.device("cpu"):
        assert launched(lambda: fusedops.softmax(x, -1)) == 1
        with _PassThrough():
            assert launched(lambda: fusedops.softmax(x, -1)) == 0
    with _PassThrough(), torch.device("cpu"):
        assert launched(lambda: fusedops.softmax(x, -1)) == 0


def test_fake_tensor_mode_with_fake_cuda_tensors_gives_torchs_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 4, 16, 32, device="cuda", dtype=torch.float16)
        out = fusedops.scaled_dot_product_attention(q, q, q, is_causal=True)
        assert out.shape == q.shape and out.device.type == "cuda" and out.dtype == torch.float16
        assert fusedops.layer_norm(q, (32,)).shape == q.shape
        assert fusedops.matmul(q, q.transpose(-1, -2), activation="gelu").shape == (2, 4, 16, 16)
        assert fusedops.log_softmax(q, 1, dtype=torch.float32).dtype == torch.float32
        assert torch.ops.fusedops.layer_norm(q, [32], None, None, 1e-5)[1].dtype == torch.float32


def test_flop_counter_counts_a_backward_run_under_the_mode(interpret):
    from torch.utils.flop_counter import FlopCounterMode

    a, b = torch.randn(16, 32, requires_grad=True), torch.randn(32, 8, requires_grad=True)
    y = fusedops.matmul(a, b)
    with FlopCounterMode(display=False) as counter:
        y.sum().backward()
    assert counter.get_total_flops() == 2 * (2 * 16 * 32 * 8)


def test_flop_counter_over_forward_and_backward(interpret):
    from torch.utils.flop_counter import FlopCounterMode

    a, b = torch.randn(16, 32, requires_grad=True), torch.randn(32, 8, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        fusedops.matmul(a, b).sum().backward()
    assert counter.get_total_flops() == 3 * (2 * 16 * 32 * 8)
    torch.testing.assert_close(a.grad, torch.ones(16, 8) @ b.detach().t())


# ================================================================================================
# layer_norm's corrected mean (float32 / float64 rows, interpreter route) against float64 torch
# ================================================================================================
@pytest.mark.parametrize("shape", [(3, 10), (16, 33), (5, 7), (2, 3, 13), (4, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_layer_norm_values_and_gradients_against_float64(interpret, shape, dtype):
    x = (torch.randn(shape, dtype=dtype) * 3 + 1000).requires_grad_()
    w = torch.randn(shape[-1], dtype=dtype, requires_grad=True)
    b = torch.randn(shape[-1], dtype=dtype, requires_grad=True)
    g = torch.randn(shape, dtype=dtype)
    y = fusedops.layer_norm(x, shape[-1:], w, b)
    grads = torch.autograd.grad(y, (x, w, b), g)
    leaves = [t.detach().double().requires_grad_() for t in (x, w, b)]
    ref = F.layer_norm(leaves[0], shape[-1:], leaves[1], leaves[2])
    ref_grads = torch.autograd.grad(ref, leaves, g.double())
    tol = dict(atol=2e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(y.double(), ref.detach(), **tol)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got.double(), want, atol=tol["atol"] * 20, rtol=tol["rtol"] * 20)


def test_layer_norm_repeated_nan_and_inf_rows(interpret):
    for dtype in (torch.float32, torch.float64):
        x = torch.full((3, 5), 10000.3, dtype=dtype)
        assert fusedops.layer_norm(x, (5,)).abs().max().item() == 0.0
        out, mean, rstd = torch.ops.fusedops.layer_norm(x, [5], None, None, 1e-5)
        assert torch.equal(mean, x[:, 0].to(mean.dtype))
    inf, nan = math.inf, math.nan
    x = torch.tensor([[1., inf, 2., 3., 4.], [1., nan, 2., 3., 4.], [1., -inf, 2., 3., 4.], [1., 2., 3., 4., 5.],
                      [inf] * 5, [3.] * 5])
    torch.testing.assert_close(fusedops.layer_norm(x, (5,)), F.layer_norm(x, (5,)), equal_nan=True)
    ours, theirs = torch.ops.fusedops.layer_norm(x, [5], None, None, 1e-5), torch.native_layer_norm(x, [5], None, None, 1e-5)
    torch.testing.assert_close(ours[1], theirs[1].view(-1), equal_nan=True)
    torch.testing.assert_close(ours[2], theirs[2].view(-1), equal_nan=True)


# ================================================================================================
# DEFECTS 6-8 and tricky cases: the custom operators' argument checks
# ================================================================================================
_Q = (1, 2, 4, 8)


@pytest.mark.parametrize("make", [
    lambda: (torch.randn(_Q), torch.randn(1, 2, 4, 16), torch.randn(_Q)),
    lambda: (torch.randn(_Q).double().long(), torch.ones(_Q, dtype=torch.long), torch.ones(_Q, dtype=torch.long)),
    lambda: (torch.randn(_Q), torch.randn(_Q, dtype=torch.float64), torch.randn(_Q)),
], ids=["head_dims", "int64", "mixed_dtypes"])
def test_attention_op_checks_its_arguments_like_the_public_function(interpret, make):
    q, k, v = make()
    with pytest.raises(RuntimeError):
        fusedops.scaled_dot_product_attention(q, k, v)
    try:
        torch.ops.fusedops.scaled_dot_product_attention(q, k, v, None, False, None, False)
    except CompilationError as error:
        pytest.fail(f"an internal kernel error instead of the argument check: {error}")
    except (RuntimeError, ValueError, TypeError):
        return
    pytest.fail("no error")


def _errors_alike(fn, *tensors):
    """(real error type or None, fake error type or None) of `fn` on `tensors` and on their fakes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def outcome(ts):
        try:
            fn(*ts)
        except Exception as error:      # noqa: BLE001
            return type(error)
        return None

    real = outcome(tensors)
    with FakeTensorMode() as mode:
        fake = outcome([mode.from_tensor(t) for t in tensors])
    return real, fake


@pytest.mark.parametrize("case", ["int_input", "bool_input", "complex_input", "int_dtype"])
def test_softmax_fake_kernel_raises_what_the_real_op_raises(interpret, case):
    x = {"int_input": torch.randint(0, 5, (3, 8)), "bool_input": torch.rand(3, 8) > 0.5,
         "complex_input": torch.randn(3, 8, dtype=torch.complex64), "int_dtype": torch.randn(3, 8)}[case]
    dtype = torch.int32 if case == "int_dtype" else None
    real, fake = _errors_alike(lambda t: torch.ops.fusedops.log_softmax(t, -1, dtype), x)
    assert real is not None
    assert fake is not None


@pytest.mark.parametrize("name, fn, make", [
    ("softmax dim", lambda t: torch.ops.fusedops.softmax(t, 2, None), lambda: [torch.randn(3, 8)]),
    ("softmax 0-d", lambda t: torch.ops.fusedops.softmax(t, 1, None), lambda: [torch.tensor(2.0)]),
    ("layer_norm weight", lambda t, w: torch.ops.fusedops.layer_norm(t, [8], w, None, 1e-5),
     lambda: [torch.randn(3, 8), torch.randn(7)]),
    ("layer_norm dtype", lambda t, w: torch.ops.fusedops.layer_norm(t, [8], w, None, 1e-5),
     lambda: [torch.randn(3, 8), torch.randn(8).double()]),
    ("rms_norm shape", lambda t: torch.ops.fusedops.rms_norm(t, [3, 9], None, 1e-5), lambda: [torch.randn(3, 8)]),
    ("rms_norm int weight", lambda t, w: torch.ops.fusedops.rms_norm(t, [8], w, 1e-5),
     lambda: [torch.randn(3, 8), torch.ones(8, dtype=torch.long)]),
    ("matmul k", lambda a, b: torch.ops.fusedops.matmul(a, b), lambda: [torch.randn(3, 8), torch.randn(7, 2)]),
    ("matmul 2-D bias", lambda a, b, c: torch.ops.fusedops.matmul(a, b, c),
     lambda: [torch.randn(3, 8), torch.randn(8, 2), torch.randn(1, 2)]),
    ("matmul activation", lambda a, b: torch.ops.fusedops.matmul(a, b, None, "tanh"),
     lambda: [torch.randn(3, 8), torch.randn(8, 2)]),
])
def test_fake_and_real_kernels_raise_alike(route, name, fn, make):
    real, fake = _errors_alike(fn, *make())
    assert real is not None and real is fake, (name, real, fake)


def test_opcheck_of_valid_calls(interpret):
    x, w, b = torch.randn(3, 8), torch.randn(8), torch.randn(8)
    torch.library.opcheck(torch.ops.fusedops.layer_norm, (x, [8], w, b, 1e-5))
    torch.library.opcheck(torch.ops.fusedops.rms_norm, (x, [8], w, 1e-5))
    torch.library.opcheck(torch.ops.fusedops.log_softmax, (x, 0, torch.float64))
    torch.library.opcheck(torch.ops.fusedops.matmul, (x, torch.randn(8, 4), torch.randn(4), "relu", None))


def _pipeline(x, w, b, m):
    return fusedops.matmul(fusedops.softmax(fusedops.layer_norm(x, (8,), w, b), -1), m, activation="silu")


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_of_the_public_ops_matches_eager(interpret, dynamic):
    torch._dynamo.reset()
    x, w, b, m = torch.randn(3, 8), torch.randn(8), torch.randn(8), torch.randn(8, 4)
    compiled = torch.compile(_pipeline, backend="aot_eager", fullgraph=True, dynamic=dynamic)
    torch.testing.assert_close(compiled(x, w, b, m), _pipeline(x, w, b, m))
    x5 = torch.randn(5, 8)
    torch.testing.assert_close(compiled(x5, w, b, m), _pipeline(x5, w, b, m))


@pytest.mark.parametrize("op, reference", [(fusedops.layer_norm, F.layer_norm), (fusedops.rms_norm, F.rms_norm)],
                         ids=["layer_norm", "rms_norm"])
def test_torch_compile_with_normalized_shape_from_a_dynamic_input(interpret, op, reference):
    torch._dynamo.reset()

    def normalize(x):
        return op(x, x.shape[-1:])

    # a second hidden size recompiles with automatic dynamic shapes: normalized_shape is then [s1]
    compiled = torch.compile(normalize, backend="eager", fullgraph=True)
    for n in (8, 16):
        x = torch.randn(3, n)
        torch.testing.assert_close(compiled(x), reference(x, (n,)))


# ================================================================================================
# fusedops.nn.MultiheadAttention: nested-tensor inputs take torch's forward
# ================================================================================================
@pytest.mark.parametrize("need_weights", [False, True])
def test_nested_inputs_match_torchs_fast_path_and_errors(interpret, need_weights):
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(16, 2, batch_first=True).eval()
    ours = fnn.MultiheadAttention(16, 2, batch_first=True).eval()
    ours.load_state_dict(theirs.state_dict())
    x = torch.nested.nested_tensor([torch.randn(3, 16), torch.randn(5, 16)])
    with torch.inference_mode():
        want = theirs(x, x, x, need_weights=need_weights)[0]
        got = ours(x, x, x, need_weights=need_weights)[0]
    assert got.is_nested
    for a, b in zip(got.unbind(), want.unbind()):
        torch.testing.assert_close(a, b)
    dense = torch.randn(2, 5, 16)
    for module in (theirs, ours):
        with torch.no_grad(), pytest.raises(AssertionError, match="NestedTensor"):
            module(x, dense, dense, need_weights=need_weights)
        with pytest.raises(AssertionError, match="NestedTensor"):
            module(x, x, x, need_weights=need_weights)
