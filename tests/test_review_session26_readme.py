"""Review (session 26): README.md read top to bottom by a new user on a CPU-only machine, and done.

What was tried: `python -m fusedops.bench` (the CPU self-check, 139 checks, ~25 s) and `fusedops-bench`
with every option: --ops with valid, unknown, empty and mis-cased names, --dtype (fp16, bf16, fp32, fp64,
FP16, empty, duplicates), --quick, --out to a fresh directory, to a file and below a file, --selfcheck,
--compile, --triton, unknown flags; the pytest-benchmark form (`python -m pytest bench/ --benchmark-only`,
--bench-full, --bench-ops/--bench-dtype with bad values); the README's kernel on CPU tensors under
FUSEDOPS_INTERPRET=1 (and without it); an out-of-bounds access in the interpreter; every variable of the
Settings table (bad values, cache dir, disabled cache, IR dumps to stderr and to a folder, default arch,
libdevice path, wgmma switch); the "Writing a kernel" claims (arguments, globals, Python semantics, fma);
the "Coming from Triton" section item by item (what ports, what is refused and whether the error names it,
NaN propagation, dot precision, launch options, autotune); the Hopper cluster rules in the interpreter; the
public ops and fusedops.nn modules with the argument mistakes users make (non-tensors, int/complex dtypes,
bad dim, bad normalized_shape, wrong weight/bias shapes, dtypes and devices, bad eps, activation, out_dtype,
dropout_p > 0, mismatched heads, masks), under the interpreter and on torch's CPU path; the transforms
section (grad, vmap, jvp, jacrev, functional_call, forward AD, jit.trace, export, FlopCounterMode,
torch.compile, double backward); `fusedops.__version__`, the docstrings, and what `import fusedops` /
`import fusedops.dsl` load.

DEFECTS (all fixed in session 26, 2 and 8 in the README, 2 also by the self-check reporting the PTX of
kernels that need libdevice as not compiled where it is missing; their tests, strict xfails until then,
now pass):
1. Double backward "raises and names the op" (README, transforms section): the error names no op.
   Repro (FUSEDOPS_INTERPRET=1): x = randn(3, 8, requires_grad=True); y = fusedops.softmax(x, -1);
   g, = autograd.grad((y * w).sum(), x, create_graph=True); autograd.grad(g.sum(), x) -> RuntimeError
   "trying to differentiate twice a fusedops op: ..." for softmax, layer_norm, matmul and attention alike.
   Cause: one constant message, function_host._DOUBLE_BACKWARD, with no op name.
2. "the compiler down to PTX (kernel.compile(..., target="sm_90a")) needs no GPU and no CUDA installation"
   (CPU-only install): kernels using libdevice math (dsl.erf, tanh, sin, log, ...; the library's
   attention_forward_kernel) raise BackendError "cannot find libdevice.10.bc" when there is no CUDA toolkit
   and no nvidia-cuda-nvcc wheel, which the README's CPU-only install (`pip install -e '.[test,bench]'`)
   does not bring. So on such a machine `python -m fusedops.bench --ops attention` exits 1 ("2 of 14 checks
   failed"). Repro: a subprocess that empties libdevice._candidates / _from_pip_wheels (standing in for a
   machine without /usr/local/cuda). Cause: libdevice is not part of llvmlite; the README promises too much.
3. FUSEDOPS_DEFAULT_ARCH ("compile for this target instead of the current GPU's") is ignored by
   `kernel.compile(...)` without target=: FUSEDOPS_DEFAULT_ARCH=sm_80 still gives `.target sm_90a` PTX.
   Cause: JITFunction.compile has a hard default target="sm_90a"; only launches read the knob.
4. A head-count mismatch on the kernel path (FUSEDOPS_INTERPRET=1, query H=3, key/value H=2, no
   enable_gqa) raises torch.broadcast_shapes' "Attempting to broadcast a dimension of length 2 at -1!
   Mismatching argument at index 1 had (2,); but expected shape should be broadcastable to [3]", which names
   neither key nor heads (torch's own op says "size of tensor a (3) must match ... at non-singleton
   dimension 1"). Cause: attention._broadcast_shapes falls back to torch.broadcast_shapes of the batch+head
   dims for its error.
5. fusedops.matmul with an integer bias: ValueError "bias must be a floating tensor on cpu" for a bias that
   *is* on the CPU: it does not say the dtype is the problem nor what it got (and the docstring lists
   non-floating dtypes under TypeError). A list bias is likewise a ValueError ("got list"), where a list
   a/b or layer_norm weight is a TypeError. Cause: autograd/matmul_reference.check_arguments folds dtype and device
   into one message.
6. On a machine without a GPU, `python -m fusedops.bench --out DIR` (and --quick, --compile, --triton) is
   accepted and silently ignored: no DIR, no file, no word that the self-check writes nothing. Cause:
   __main__.main passes only ops and dtypes to selfcheck.run.
7. `python -m pytest bench/ --benchmark-only --bench-dtype fp64` ends in a collection error with a traceback
   whose message is "--bench-ops/--bench-dtype: 'fp64'; dtypes: fp16, bf16, fp32" (which option? "unknown"
   is not said); an unknown --bench-ops name gets "; dtypes: ..." appended. Cause: bench/conftest.py turns
   a KeyError of either lookup into one UsageError.
8. README documents no call of the public ops: fusedops.softmax / layer_norm / matmul /
   scaled_dot_product_attention and fusedops.nn appear nowhere in it (a new user learns of them only from
   the source).

Documentation remarks (not tested): `input_precision="tf32"` only rounds the operands (float32 dots run on
CUDA cores with or without it: fma.rn.f32 in the PTX), which the README's "pass input_precision='tf32'" does
not say; the self-check "compiles each of them to PTX" covers only the specializations it launched (the
persistent and stream-K matmuls, split-window norms are listed under "no PTX check"); "All environment
variables are read in one place" leaves out CUDA_HOME / CUDA_PATH (ptxas, libdevice) and
CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM; FUSEDOPS_DUMP_IR prints before and after each pass, and nothing
under FUSEDOPS_INTERPRET=1; the Triton names that are refused give "module `fusedops.dsl` has no attribute
`debug_barrier`" (named, as promised) but not the replacement the README gives (dsl.barrier, range,
dsl.trans, tensor descriptors, cluster_dims for num_ctas, launch_bounds for maxnreg); only `**` does;
FUSEDOPS_DISABLE_WGMMA / TMA / DEFAULT_ARCH set inside a running process do not reach specializations
compiled before (said in knobs.py, not in the README's Settings table).

What held: version 0.1.0 (= package metadata); cheap imports; --help without torch; every CLI usage error
(exit 2, names the option and lists the valid values); the self-check line and exit codes (0 passed; 1 when
nothing was checked); bench/ under pytest-benchmark skipped with a reason without a GPU; the README kernel
on the CPU; the CPU-tensor and out-of-bounds errors; the Settings table = knobs.variables(), typo'd values
named; cache dir / disable / dump dir / libdevice path / wgmma switch; arguments refused naming them
(sparse, negative bit, non-tensors, floats past float32); globals and rebinding; short-circuit semantics,
tuple comparison error, positional-only binding, fma rounding once; the Triton idioms that port and the
refusals; NaN-propagating min/max; cluster rules; public-op argument errors naming the argument; dropout_p
> 0 refused on the kernel path only; the transforms (grad, vmap, jvp, jacrev, functional_call, forward AD,
jit.trace, export, FlopCounterMode; torch.compile checked by hand); docstrings with Args/Returns/Raises.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import fusedops
import fusedops.dsl as dsl
from fusedops.dsl.runtime import knobs
from test_review_session24_docs import softmax_kernel     # the README's softmax example

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour on a machine without CUDA")


def _env(**extra) -> dict:
    # (and not the xdist worker's PYTEST_* variables: pytest-benchmark would take the child for an xdist run)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FUSEDOPS_", "PYTEST_"))}
    env.update(extra)
    return env


def _bench(*args, cwd=None, timeout=240, command=None):
    command = command or [sys.executable, "-m", "fusedops.bench"]
    return subprocess.run([*command, *args], capture_output=True, text=True, cwd=cwd or ROOT, timeout=timeout,
                          env=_env(FUSEDOPS_DISABLE_CACHE="1"))


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")


def _load_kernel_module(tmp_path: Path, name: str, source: str):
    """A module written to a file (kernels must live in files) and imported."""
    path = tmp_path / f"{name}.py"
    path.write_text("import fusedops.dsl as dsl\n" + textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- kernels of the README ------------------------------------------------------------------------------
@dsl.jit
def unmasked_copy_kernel(y_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    offs = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    dsl.store(y_ptr + offs, dsl.load(x_ptr + offs), mask=offs < n)


@dsl.jit
def math_kernel(y_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    o = dsl.arange(0, BLOCK)
    m = o < n
    x = dsl.load(x_ptr + o, mask=m)
    dsl.store(y_ptr + o, dsl.erf(x) + dsl.tanh(x) + dsl.sin(x) + dsl.log(x), mask=m)


@dsl.jit
def half_dot_kernel(c_ptr, a_ptr, b_ptr, K, BM: dsl.constexpr, BN: dsl.constexpr, BK: dsl.constexpr):
    rm = dsl.arange(0, BM)
    rn = dsl.arange(0, BN)
    rk = dsl.arange(0, BK)
    acc = dsl.zeros((BM, BN), dsl.float32)
    for k in range(0, K, BK):
        a = dsl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = dsl.load(b_ptr + (k + rk)[:, None] * BN + rn[None, :])
        acc += dsl.dot(a, b)
    dsl.store(c_ptr + rm[:, None] * BN + rn[None, :], acc)


@dsl.jit
def fma_kernel(y_ptr, a, b, c):
    dsl.store(y_ptr, dsl.fma(a, b, c))


@dsl.jit
def short_circuit_kernel(y_ptr, p_ptr, n):
    i = dsl.program_id(0)
    if i < n and dsl.load(p_ptr + i) > 0:
        dsl.store(y_ptr + i, 1.0)


@dsl.jit
def chained_kernel(y_ptr, p_ptr, n):
    i = dsl.program_id(0)
    if 0 <= i < n:
        dsl.store(y_ptr + i, dsl.load(p_ptr + i) * 2)


@dsl.jit
def tuple_compare_kernel(y_ptr, n):
    i = dsl.program_id(0)
    if (i, n) == (0, 1):
        dsl.store(y_ptr, 1.0)


@dsl.jit
def scaled_helper(x, /, scale=2.0, *, shift):
    return x * scale + shift


@dsl.jit
def binding_kernel(y_ptr, x_ptr, BLOCK: dsl.constexpr):
    o = dsl.arange(0, BLOCK)
    dsl.store(y_ptr + o, scaled_helper(dsl.load(x_ptr + o), shift=1.0))


@dsl.jit
def bad_binding_kernel(y_ptr, x_ptr, BLOCK: dsl.constexpr):
    o = dsl.arange(0, BLOCK)
    dsl.store(y_ptr + o, scaled_helper(x=dsl.load(x_ptr + o), shift=1.0))


@dsl.jit
def triton_idioms_kernel(y_ptr, x_ptr, BLOCK: dsl.constexpr):
    dsl.static_assert(BLOCK == 16)
    o = dsl.arange(0, BLOCK)
    p = x_ptr.to(dsl.pointer_type(dsl.float32))
    v = dsl.load(p + o)
    dsl.static_assert(v.dtype == dsl.float32)
    dsl.static_assert(x_ptr.dtype.element_ty == dsl.float32)
    t = dsl.reshape(dsl.reshape(v, (4, 4)).T, (16,))
    dsl.store(y_ptr + o, dsl.clamp(t, min=-0.5, max=0.5) + min(v, 0.25) + max(v, -0.25))


@dsl.jit
def nan_kernel(y_ptr, x_ptr, BLOCK: dsl.constexpr):
    o = dsl.arange(0, BLOCK)
    v = dsl.load(x_ptr + o)
    nan = float("nan")
    dsl.store(y_ptr + o * 4 + 0, dsl.minimum(v, nan))
    dsl.store(y_ptr + o * 4 + 1, dsl.maximum(v, nan))
    dsl.store(y_ptr + o * 4 + 2, min(v, nan))
    dsl.store(y_ptr + o * 4 + 3, dsl.clamp(v * nan, -1.0, 1.0))


@dsl.jit
def cluster_kernel(y_ptr):
    dsl.cluster_dims(2)
    pid = dsl.program_id(0)
    dsl.store(y_ptr + pid, dsl.cluster_sum(pid.to(dsl.float32)))


@dsl.jit
def uneven_cluster_kernel(y_ptr):
    dsl.cluster_dims(2)
    pid = dsl.program_id(0)
    if pid % 2 == 0:
        dsl.store(y_ptr + pid, dsl.cluster_sum(pid.to(dsl.float32)))


# -- version and imports ---------------------------------------------------------------------------------
def test_version_matches_package_metadata():
    from importlib.metadata import version

    assert fusedops.__version__ == "0.1.0"
    assert version("fusedops") == fusedops.__version__
    assert f"fusedops {fusedops.__version__}" in README


def test_import_fusedops_and_dsl_load_nothing_heavy():
    code = ("import sys\nimport fusedops\nassert 'torch' not in sys.modules, 'fusedops'\n"
            "assert fusedops.__all__\nimport fusedops.dsl\n"
            "heavy = [m for m in ('torch', 'llvmlite', 'cuda', 'cuda.bindings') if m in sys.modules]\n"
            "assert not heavy, heavy\nprint('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env())
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


# -- the benchmark command ---------------------------------------------------------------------------------
def test_bench_help_lists_every_option_of_the_readme_table():
    result = _bench("--help")
    assert result.returncode == 0
    for option in re.findall(r"^\| `(--[a-z]+)", README, flags=re.M):
        assert option in result.stdout, option


@pytest.mark.parametrize("args, wanted", [
    (["--ops", "bogus"], ["--ops", "bogus", "valid ops:", "softmax", "matmul_backward", "attention_backward"]),
    (["--ops", "softmax,Softmax"], ["--ops", "Softmax", "valid ops:"]),
    (["--ops", ","], ["--ops", "empty"]),
    (["--dtype", "fp64"], ["--dtype", "fp64", "fp16, bf16, fp32"]),
    (["--dtype", ""], ["--dtype", "empty"]),
    (["--out", ""], ["--out"]),
    (["--out", "README.md"], ["--out", "not a directory"]),
    (["--out", "README.md/sub"], ["--out", "not a directory"]),
    (["--quick", "--bogus"], ["--bogus"]),
])
def test_bench_usage_errors_name_the_option(args, wanted, capsys, monkeypatch):
    # in process: `python -m fusedops.bench` is `sys.exit(main())` (its subprocess runs are the tests above and
    # below); a usage error is main's SystemExit(2) with the message on stderr, any other exception (what a
    # subprocess would show as a Traceback) propagates out of pytest.raises and fails the test
    from fusedops.bench.__main__ import main as bench_main
    monkeypatch.chdir(ROOT)         # --out README.md: relative to the repository, as the command's cwd was
    with pytest.raises(SystemExit) as exit_info:
        bench_main(list(args))
    captured = capsys.readouterr()
    assert exit_info.value.code == 2, captured.out + captured.err
    for text in wanted:
        assert text in captured.err, (text, captured.err)
    assert "Traceback" not in captured.err


@NO_CUDA
def test_bench_without_gpu_runs_the_self_check():
    result = _bench("--ops", "softmax", "--dtype", "fp32,fp32")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "no CUDA GPU: running the CPU self-check"
    assert "PTX for sm_90a" in lines[1]
    assert re.search(r"ok +interpreter +softmax M=\d+ N=\d+ fp32", result.stdout)
    assert re.search(r"ok +ptx +_forward_kernel", result.stdout)
    assert re.search(r"self-check passed: \d+ checks", result.stdout)
    assert "fp16" not in result.stdout.replace("ptr<float16>", "")


@NO_CUDA
def test_fusedops_bench_console_script_and_selfcheck_flag():
    script = shutil.which("fusedops-bench")
    if script is None:
        pytest.skip("fusedops-bench is not installed (pip install -e .)")
    result = _bench("--ops", "log_softmax", "--dtype", "bf16", "--selfcheck", command=[script])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no CUDA GPU" not in result.stdout            # --selfcheck: asked for, nothing to explain
    assert re.search(r"ok +interpreter +log_softmax .* bf16", result.stdout)


@NO_CUDA
def test_bench_self_check_with_nothing_to_check_exits_1():
    result = _bench("--ops", "matmul", "--dtype", "fp32")
    assert result.returncode == 1
    assert "skipped matmul: no fp32 case" in result.stdout
    assert "nothing was checked" in result.stderr


@NO_CUDA
def test_bench_out_on_a_machine_without_gpu_is_not_silently_ignored(tmp_path):
    out = tmp_path / "fresh" / "results"
    result = _bench("--ops", "softmax", "--dtype", "fp32", "--out", str(out), "--compile", "--triton")
    assert result.returncode == 0
    assert out.exists() or "--out" in result.stdout + result.stderr


@NO_CUDA
def test_pytest_benchmark_form_skips_with_a_reason_without_gpu():
    result = subprocess.run([sys.executable, "-m", "pytest", "bench/", "--benchmark-only", "-q", "-p", "no:xdist",
                             "-p", "no:cacheprovider", "-rs"], capture_output=True, text=True, cwd=ROOT, timeout=180,
                            env=_env())
    assert result.returncode == 0, result.stdout[-2000:]
    assert re.search(r"\d+ skipped", result.stdout)
    assert "needs a CUDA GPU" in result.stdout


def test_pytest_benchmark_bad_dtype_names_the_option():
    result = subprocess.run([sys.executable, "-m", "pytest", "bench/", "--benchmark-only", "-q", "-p", "no:xdist",
                             "-p", "no:cacheprovider", "--bench-dtype", "fp64"], capture_output=True, text=True,
                            cwd=ROOT, timeout=180, env=_env())
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "--bench-ops/--bench-dtype" not in output
    assert re.search(r"--bench-dtype\W.*unknown.*fp64|unknown.*fp64.*--bench-dtype", output)


# -- Writing a kernel ---------------------------------------------------------------------------------
def test_readme_kernel_runs_on_cpu_tensors_under_fusedops_interpret(interpret):
    x = torch.randn(1000, 781, dtype=torch.float16)[:40]
    y = torch.empty_like(x)
    n_rows, n_cols = x.shape
    softmax_kernel[(n_rows,)](y, x, x.stride(0), y.stride(0), n_cols, BLOCK=1024, num_warps=4)
    torch.testing.assert_close(y.float(), torch.softmax(x.float(), -1), atol=2e-3, rtol=2e-3)
    z = torch.empty_like(x)
    softmax_kernel[lambda meta: (n_rows,)](z, x, x.stride(0), z.stride(0), n_cols, BLOCK=1024)
    assert torch.equal(y, z)


@NO_CUDA
def test_compiled_launch_of_cpu_tensors_says_how_to_interpret(monkeypatch):
    monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)
    x = torch.randn(4, 16)
    with pytest.raises(ValueError, match=r"argument `y_ptr` of kernel `softmax_kernel` is a cpu tensor.*"
                                         r"FUSEDOPS_INTERPRET=1"):
        softmax_kernel[(4,)](torch.empty_like(x), x, 16, 16, 16, BLOCK=16)


def test_out_of_bounds_error_names_kernel_line_program_and_offset():
    x = torch.randn(100)
    with pytest.raises(dsl.InterpreterError) as info:
        unmasked_copy_kernel[(2,)](torch.empty_like(x), x, 100, BLOCK=64, interpret=True)
    message = str(info.value)
    assert "unmasked_copy_kernel" in message and "test_review_session26_readme.py:" in message
    assert "program_id=(1, 0, 0)" in message and "byte offset 400" in message and "x_ptr" in message


def test_arguments_refused_naming_them():
    x = torch.randn(4, 16)
    y = torch.empty_like(x)
    negated = torch.randn(4, 16, dtype=torch.complex64).conj().imag
    with pytest.raises(TypeError, match=r"`x_ptr`.*negative bit.*resolve_neg"):
        softmax_kernel[(4,)](y, negated, 16, 16, 16, BLOCK=16, interpret=True)
    with pytest.raises(TypeError, match=r"`x_ptr`.*dense"):
        softmax_kernel[(4,)](y, x.to_sparse(), 16, 16, 16, BLOCK=16, interpret=True)
    with pytest.raises(TypeError, match=r"`x_ptr`.*numpy.ndarray"):
        softmax_kernel[(4,)](y, x.numpy(), 16, 16, 16, BLOCK=16, interpret=True)
    with pytest.raises(dsl.LaunchError, match=r"`n_cols`.*float32's range"):
        softmax_kernel[(4,)](y, x, 16, 16, 1e40, BLOCK=16, interpret=True)
    with pytest.raises(TypeError, match=r"do_not_specialize.*nope"):
        dsl.jit(do_not_specialize=["nope"])(fma_kernel.fn)


def test_globals_are_read_and_rebinding_recompiles(tmp_path):
    module = _load_kernel_module(tmp_path, "readme_globals", """
        import torch
        SCALE = 2.0
        DATA = torch.ones(4)

        class Cfg:
            BLOCK = 16

        @dsl.jit
        def scale_kernel(y_ptr, x_ptr):
            o = dsl.arange(0, Cfg.BLOCK)
            dsl.store(y_ptr + o, dsl.load(x_ptr + o) * SCALE)

        @dsl.jit
        def tensor_global_kernel(y_ptr):
            dsl.store(y_ptr, DATA)
    """)
    x = torch.arange(16.0)
    y = torch.zeros(16)
    module.scale_kernel[(1,)](y, x, interpret=True)
    assert y[3].item() == 6.0
    module.SCALE = 3.0
    module.scale_kernel[(1,)](y, x, interpret=True)
    assert y[3].item() == 9.0
    module.Cfg.BLOCK = 8
    y.zero_()
    module.scale_kernel[(1,)](y, x, interpret=True)
    assert y[7].item() == 21.0 and y[8].item() == 0.0
    with pytest.raises(dsl.CompilationError, match=r"global `DATA` is a torch.Tensor"):
        module.tensor_global_kernel[(1,)](y, interpret=True)


def test_python_semantics_in_kernels():
    p = torch.ones(4)
    out = torch.zeros(6)
    short_circuit_kernel[(6,)](out, p, 4, interpret=True)       # no load for i >= 4: no out-of-bounds error
    assert out.tolist() == [1.0] * 4 + [0.0] * 2
    out.zero_()
    chained_kernel[(6,)](out, p, 4, interpret=True)
    assert out.tolist() == [2.0] * 4 + [0.0] * 2
    with pytest.raises(dsl.CompilationError, match=r"tuples holding runtime values"):
        tuple_compare_kernel[(1,)](out, 1, interpret=True)
    x = torch.randn(16)
    y = torch.empty(16)
    binding_kernel[(1,)](y, x, BLOCK=16, interpret=True)
    torch.testing.assert_close(y, x * 2 + 1)
    with pytest.raises(dsl.CompilationError, match=r"positional-only argument `x`"):
        bad_binding_kernel[(1,)](y, x, BLOCK=16, interpret=True)


def test_interpreter_fma_rounds_once():
    y = torch.zeros(1)
    a = 1 + 2 ** -12                       # a * a = 1 + 2^-11 + 2^-24: float32 drops the 2^-24
    fma_kernel[(1,)](y, a, a, -(1 + 2 ** -11), interpret=True)
    assert y.item() == 2 ** -24


def test_both_accumulation_forms_of_dot():
    a = torch.randn(16, 64, dtype=torch.float16)
    b = torch.randn(64, 16, dtype=torch.float16)
    c = torch.empty(16, 16)
    half_dot_kernel[(1,)](c, a, b, 64, BM=16, BN=16, BK=16, interpret=True)
    torch.testing.assert_close(c, a.float() @ b.float(), atol=1e-3, rtol=1e-3)


# -- Coming from Triton ------------------------------------------------------------------------------------
def test_triton_idioms_that_port():
    x = torch.randn(16)
    y = torch.empty(16)
    triton_idioms_kernel[(1,)](y, x, BLOCK=16, interpret=True)
    expected = x.reshape(4, 4).T.reshape(16).clamp(-0.5, 0.5) + x.clamp(max=0.25) + x.clamp(min=-0.25)
    torch.testing.assert_close(y, expected)


def test_min_max_clamp_propagate_nan():
    y = torch.zeros(64)
    nan_kernel[(1,)](y, torch.randn(16), BLOCK=16, interpret=True)
    assert torch.isnan(y).all()


@pytest.mark.parametrize("name, statement", [
    # (dsl.range, dsl.math, join, split, permute and debug_barrier: in the language since session 41)
    ("libdevice", "v = dsl.libdevice.exp(v)"),
    ("dot_scaled", "r = dsl.dot_scaled(v, None, 'e4m3', v, None, 'e4m3')"),
    ("float8e4nv", "r = v.to(dsl.float8e4nv)"),
    # (associative_scan: in the language, tests/test_dsl_reduce_combine.py)
    ("pow", "v = pow(v, 2.0)"),
    # (`**`: in the language since the libdevice functions came, tests/test_dsl_libdevice.py)
    ("fp_downcast_rounding", "v = v.to(dsl.float16, fp_downcast_rounding='rtz').to(dsl.float32)"),
    ("can_reorder", "v = dsl.reshape(v, (16,), can_reorder=True)"),
    ("out_dtype", "r = dsl.dot(dsl.reshape(v, (4, 4)).to(dsl.float16), dsl.reshape(v, (4, 4)).to(dsl.float16), "
                  "out_dtype=dsl.float16)"),
    ("propagate_nan", "v = dsl.maximum(v, 0.0, propagate_nan=True)"),
    ("base", "d = dsl.make_tensor_descriptor(x_ptr + 4, [n], [1], [BLOCK])"),
])
def test_triton_features_not_in_the_language_are_refused_naming_them(tmp_path, name, statement):
    module = _load_kernel_module(tmp_path, f"refused_{abs(hash(name))}", f"""
        @dsl.jit
        def refused_kernel(y_ptr, x_ptr, n, BLOCK: dsl.constexpr):
            o = dsl.arange(0, BLOCK)
            v = dsl.load(x_ptr + o)
            {statement}
            dsl.store(y_ptr + o, v)
    """)
    x = torch.randn(16)
    with pytest.raises(dsl.FusedOpsError) as info:
        module.refused_kernel[(1,)](torch.empty(16), x, 16, BLOCK=16, interpret=True)
    assert name in str(info.value)


@pytest.mark.parametrize("option", ["num_ctas", "maxnreg"])
def test_triton_launch_options_that_do_not_exist_are_refused_naming_them(option):
    x = torch.randn(4, 16)
    with pytest.raises(TypeError, match=option):
        softmax_kernel[(4,)](torch.empty_like(x), x, 16, 16, 16, BLOCK=16, interpret=True, **{option: 2})


def test_config_pre_hook_and_prune_configs_by_are_accepted():
    # refused until session 41, which added Triton's autotuner options (tests/test_autotune_hooks.py runs them)
    config = dsl.Config({"BLOCK": 16}, pre_hook=lambda args: None)
    assert callable(config.pre_hook) and config.num_ctas == 1 and config.maxnreg is None
    dsl.autotune(configs=[config], key=["n"], prune_configs_by={})
    with pytest.raises(TypeError, match="prune_configs_by has the key 'prune_num_stages_by'"):
        dsl.autotune(configs=[config], key=["n"], prune_configs_by={"prune_num_stages_by": None})
    with pytest.raises(ValueError, match="num_ctas=2.*dsl.cluster_dims"):
        dsl.Config({"BLOCK": 16}, num_ctas=2)


def test_cluster_rules_checked_by_the_interpreter():
    y = torch.zeros(4)
    cluster_kernel[(4,)](y, interpret=True)
    assert y.tolist() == [1.0, 1.0, 5.0, 5.0]
    with pytest.raises(dsl.LaunchError, match=r"multiple of 2, got 3"):
        cluster_kernel[(3,)](y, interpret=True)
    with pytest.raises(dsl.InterpreterError, match=r"same cluster_sum calls"):
        uneven_cluster_kernel[(4,)](y, interpret=True)


# -- Settings ---------------------------------------------------------------------------------------------
def test_settings_table_lists_exactly_the_knobs():
    section = README.split("### Settings", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `(FUSEDOPS_[A-Z_]+)`", section, flags=re.M)
    assert documented == list(knobs.variables())


@pytest.mark.parametrize("variable, value", [("FUSEDOPS_INTERPRET", "maybe"), ("FUSEDOPS_DISABLE_CACHE", "2"),
                                             ("FUSEDOPS_WS", "3"), ("FUSEDOPS_TMA", "nope"),
                                             ("FUSEDOPS_DEFAULT_ARCH", "bogus")])
def test_bad_setting_is_an_error_naming_the_variable(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=variable):
        knobs.current()


def test_cache_dir_disable_cache_and_dump_dir(monkeypatch, tmp_path):
    x = torch.empty(8, 781, dtype=torch.float16)
    args = (torch.empty_like(x), x, 781, 781, 781)
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FUSEDOPS_DISABLE_CACHE", "1")
    monkeypatch.setenv("FUSEDOPS_DUMP_IR", "1")
    monkeypatch.setenv("FUSEDOPS_DUMP_DIR", str(tmp_path / "dumps"))
    softmax_kernel.compile(*args, BLOCK=1024, num_warps=2)
    assert not (tmp_path / "cache").exists()
    dumps = sorted(p.name for p in (tmp_path / "dumps" / "softmax_kernel").iterdir())
    assert any(name.endswith(".after.ir") for name in dumps)
    monkeypatch.delenv("FUSEDOPS_DISABLE_CACHE")
    monkeypatch.delenv("FUSEDOPS_DUMP_IR")
    softmax_kernel.compile(*args, BLOCK=1024, num_warps=8)
    assert list((tmp_path / "cache").rglob("*.json"))


def test_libdevice_path_pointing_nowhere_is_named(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_DISABLE_CACHE", "1")
    monkeypatch.setenv("FUSEDOPS_LIBDEVICE_PATH", "/nonexistent/libdevice")
    x = torch.rand(100)
    with pytest.raises(dsl.BackendError, match="FUSEDOPS_LIBDEVICE_PATH"):
        math_kernel.compile(torch.empty_like(x), x, 100, BLOCK=128, target="sm_90a")


def test_disable_wgmma_switches_to_mma_sync(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_DISABLE_CACHE", "1")
    a = torch.empty(64, 256, dtype=torch.float16)
    b = torch.empty(256, 64, dtype=torch.float16)
    c = torch.empty(64, 64)
    kwargs = dict(BM=64, BN=64, BK=32, target="sm_90a", num_warps=4, num_stages=3)
    ptx = half_dot_kernel.compile(c, a, b, 256, **kwargs).asm["ptx"]
    assert "wgmma" in ptx and "mma.sync" not in ptx
    monkeypatch.setenv("FUSEDOPS_DISABLE_WGMMA", "1")
    # (a JIT function keeps what it compiled before the change: knobs.py says so; a new specialization)
    ptx = half_dot_kernel.compile(c, a, b, 256, **{**kwargs, "num_stages": 2}).asm["ptx"]
    assert "wgmma" not in ptx and "mma.sync" in ptx


def test_compile_to_ptx_without_gpu():
    x = torch.empty(8, 781, dtype=torch.float16)
    compiled = softmax_kernel.compile(torch.empty_like(x), x, 781, 781, 781, BLOCK=1024, target="sm_90a")
    assert {"ir", "llir", "ptx"} <= set(compiled.asm)
    assert ".target sm_90a" in compiled.asm["ptx"]
    with pytest.raises(ValueError, match="sm_75"):
        softmax_kernel.compile(torch.empty_like(x), x, 781, 781, 781, BLOCK=1024, target="sm_75")


def test_default_arch_applies_to_compile(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_DISABLE_CACHE", "1")
    monkeypatch.setenv("FUSEDOPS_DEFAULT_ARCH", "sm_80")
    x = torch.empty(8, 781, dtype=torch.float16)
    compiled = softmax_kernel.compile(torch.empty_like(x), x, 781, 781, 781, BLOCK=1024, num_warps=4)
    assert ".target sm_80" in compiled.asm["ptx"]


_NO_LIBDEVICE = """
import sys
import fusedops.dsl.target.libdevice as libdevice
libdevice._candidates = lambda environ: []          # as on a machine without a CUDA toolkit
libdevice._from_pip_wheels = lambda: (None, "no nvidia-cuda-nvcc wheel (simulated)")
sys.path.insert(0, {tests!r})
import torch
import test_review_session26_readme as review
x = torch.rand(100)
review.math_kernel.compile(torch.empty_like(x), x, 100, BLOCK=128, target="sm_90a")
print("compiled")
"""


def test_compile_to_ptx_of_math_builtins_without_libdevice_names_it(tmp_path):
    # (fixed as documentation: the README's CPU-only install now says math builtins need libdevice and where
    # it comes from; the error names it)
    script = tmp_path / "no_libdevice.py"
    script.write_text(_NO_LIBDEVICE.format(tests=str(ROOT / "tests")))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT, timeout=120,
                            env=_env(FUSEDOPS_DISABLE_CACHE="1"))
    assert result.returncode != 0 and "libdevice" in result.stderr, result.stderr[-1500:]
    assert "libdevice" in README and "math builtins" in README


_SELFCHECK_NO_LIBDEVICE = """
import sys
import fusedops.dsl.target.libdevice as libdevice
libdevice._candidates = lambda environ: []
libdevice._from_pip_wheels = lambda: (None, "no nvidia-cuda-nvcc wheel (simulated)")
import torch
from fusedops.bench import selfcheck
sys.exit(selfcheck.run(["attention"], [torch.float16]))
"""


def test_self_check_passes_without_a_cuda_installation(tmp_path):
    script = tmp_path / "selfcheck_no_libdevice.py"
    script.write_text(_SELFCHECK_NO_LIBDEVICE)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT, timeout=180,
                            env=_env(FUSEDOPS_DISABLE_CACHE="1"))
    assert result.returncode == 0, (result.stdout + result.stderr)[-1500:]


# -- the public ops -----------------------------------------------------------------------------------------
X = torch.randn(4, 8)
A16 = torch.randn(4, 8, dtype=torch.float16)
B16 = torch.randn(8, 3, dtype=torch.float16)
Q = torch.randn(1, 2, 5, 16, dtype=torch.float16)
K = torch.randn(1, 2, 6, 16, dtype=torch.float16)

_MISTAKES = [
    ("softmax list", lambda: fusedops.softmax([1.0, 2.0]), TypeError, r"'input' must be a torch.Tensor, not list"),
    ("softmax int", lambda: fusedops.softmax(torch.arange(4)), TypeError, r"'input'.*floating.*int64"),
    ("softmax dim", lambda: fusedops.softmax(X, 2), IndexError, r"range of \[-2, 1\], but got 2"),
    ("softmax dim type", lambda: fusedops.softmax(X, 1.0), TypeError, r"'dim' must be int, not float"),
    ("softmax dtype", lambda: fusedops.softmax(X, -1, torch.int32), TypeError, r"'dtype'.*torch.int32"),
    ("log_softmax list", lambda: fusedops.log_softmax([1.0]), TypeError, r"log_softmax.*'input'"),
    ("ln list", lambda: fusedops.layer_norm([1.0], (1,)), TypeError, r"'input' must be a torch.Tensor"),
    ("ln empty shape", lambda: fusedops.layer_norm(X, ()), ValueError, r"normalized_shape.*at least 1-dim"),
    ("ln shape", lambda: fusedops.layer_norm(X, 7), ValueError, r"normalized_shape=\[7\].*\[4, 8\]"),
    ("ln shape type", lambda: fusedops.layer_norm(X, "8"), TypeError, r"normalized_shape.*'8'"),
    ("ln weight shape", lambda: fusedops.layer_norm(X, (8,), torch.ones(7)), ValueError, r"weight of shape \[7\]"),
    ("ln bias list", lambda: fusedops.layer_norm(X, (8,), None, [0.0] * 8), TypeError, r"'bias'.*not list"),
    ("ln weight dtype", lambda: fusedops.layer_norm(X, (8,), torch.ones(8, dtype=torch.float64)), TypeError,
     r"weight has dtype torch.float64"),
    ("ln weight device", lambda: fusedops.layer_norm(X, (8,), torch.ones(8, device="meta")), ValueError,
     r"weight is on meta"),
    ("ln eps", lambda: fusedops.layer_norm(X, (8,), eps="a"), TypeError, r"'eps' must be a number, not str"),
    ("ln int", lambda: fusedops.layer_norm(torch.ones(2, 8, dtype=torch.int64), (8,)), TypeError, r"int64"),
    ("rms complex weight", lambda: fusedops.rms_norm(X, (8,), torch.ones(8, dtype=torch.complex64)), TypeError,
     r"weight has dtype torch.complex64"),
    ("mm list", lambda: fusedops.matmul([1.0], B16), TypeError, r"'input' must be a torch.Tensor, not list"),
    ("mm shapes", lambda: fusedops.matmul(A16, torch.randn(7, 3).half()), ValueError, r"\(4, 8\) and \(7, 3\)"),
    ("mm dtypes", lambda: fusedops.matmul(A16, B16.float()), TypeError, r"torch.float16 and torch.float32"),
    ("mm 0-d", lambda: fusedops.matmul(torch.tensor(1.0).half(), B16), ValueError, r"'input' is 0-d"),
    ("mm bias shape", lambda: fusedops.matmul(A16, B16, torch.randn(4).half()), ValueError, r"bias.*3 elements"),
    ("mm activation", lambda: fusedops.matmul(A16, B16, None, "tanh"), ValueError, r"activation.*'tanh'"),
    ("mm out_dtype", lambda: fusedops.matmul(A16, B16, out_dtype="float16"), TypeError, r"out_dtype.*'float16'"),
    ("sdpa list", lambda: fusedops.scaled_dot_product_attention([1.0], K, K), TypeError, r"'query' must be Tensor"),
    ("sdpa dtypes", lambda: fusedops.scaled_dot_product_attention(Q, K.float(), K), RuntimeError,
     r"key.dtype: torch.float32"),
    ("sdpa head dim", lambda: fusedops.scaled_dot_product_attention(Q, K[..., :8], K), RuntimeError,
     r"same head dim.*16 and 8"),
    ("sdpa mask dtype", lambda: fusedops.scaled_dot_product_attention(Q, K, K, torch.ones(5, 6, dtype=torch.int32)),
     RuntimeError, r"attn_mask.dtype: torch.int32"),
    ("sdpa is_causal", lambda: fusedops.scaled_dot_product_attention(Q, K, K, is_causal="yes"), TypeError,
     r"'is_causal' must be bool"),
    ("sdpa scale", lambda: fusedops.scaled_dot_product_attention(Q, K, K, scale="a"), TypeError, r"'scale'"),
    ("sdpa dropout range", lambda: fusedops.scaled_dot_product_attention(Q, K, K, dropout_p=1.5), RuntimeError,
     r"between 0 and 1, but got 1.5"),
    ("sdpa gqa", lambda: fusedops.scaled_dot_product_attention(torch.randn(1, 3, 5, 16).half(), K, K,
                                                               enable_gqa=True), RuntimeError, r"divide"),
]


@pytest.mark.parametrize("label, call, error, pattern", _MISTAKES, ids=[m[0] for m in _MISTAKES])
def test_public_op_mistakes_name_the_argument(interpret, label, call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


def test_dropout_refused_on_the_kernel_path_only(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    with pytest.raises(NotImplementedError, match=r"dropout_p=0.1.*torch.nn.functional.scaled_dot_product_attention"):
        fusedops.scaled_dot_product_attention(Q, K, K, dropout_p=0.1)
    monkeypatch.delenv("FUSEDOPS_INTERPRET")
    assert fusedops.scaled_dot_product_attention(Q, K, K, dropout_p=0.1).shape == (1, 2, 5, 16)


def test_head_mismatch_error_names_the_heads(interpret):
    with pytest.raises(RuntimeError) as info:
        fusedops.scaled_dot_product_attention(torch.randn(1, 3, 5, 16).half(), K, K)
    message = str(info.value)
    assert "head" in message.lower() or "key" in message or "dimension 1" in message


def test_matmul_integer_bias_error_says_what_it_got(interpret):
    with pytest.raises(TypeError, match=r"bias.*torch.int32"):
        fusedops.matmul(A16, B16, torch.ones(3, dtype=torch.int32))


def test_nn_modules_errors_and_state_dicts(interpret):
    import fusedops.nn as fnn

    with pytest.raises(RuntimeError, match=r"normalized_shape=\[7\]"):
        fnn.LayerNorm(7)(X)
    with pytest.raises(RuntimeError, match=r"'input' of shape \(\.\.\., 7\)"):
        fnn.Linear(7, 3)(X)
    with pytest.raises(RuntimeError, match=r"'input' of the weight's dtype torch.float16, got torch.float32"):
        fnn.Linear(8, 3, dtype=torch.float16)(X)
    for ours, theirs in ((fnn.LayerNorm(8), torch.nn.LayerNorm(8)), (fnn.RMSNorm(8), torch.nn.RMSNorm(8)),
                         (fnn.Linear(8, 3), torch.nn.Linear(8, 3)),
                         (fnn.MultiheadAttention(16, 2), torch.nn.MultiheadAttention(16, 2))):
        ours.load_state_dict(theirs.state_dict())
    torch.testing.assert_close(fnn.Softmax(dim=1)(X), torch.softmax(X, 1))


def test_public_op_docstrings_document_shapes_dtypes_and_errors():
    for name in fusedops.__all__:
        doc = getattr(fusedops, name).__doc__
        if name == "log_softmax":
            assert "as for `softmax`" in doc
            continue
        assert "Args:" in doc and "Returns:" in doc and "Raises:" in doc, name


def test_readme_shows_the_public_ops():
    assert "fusedops.softmax(" in README or "fusedops.layer_norm(" in README
    assert "fusedops.nn." in README


# -- PyTorch's transforms ------------------------------------------------------------------------------------
def test_ops_under_torch_func_and_tracing(interpret):
    from torch.func import grad, jacrev, jvp, vmap
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.randn(3, 8)
    assert grad(lambda t: fusedops.softmax(t, -1)[:, 0].sum())(x).shape == x.shape
    torch.testing.assert_close(vmap(lambda t: fusedops.layer_norm(t, (8,)))(x),
                               torch.nn.functional.layer_norm(x, (8,)))
    tangent = jvp(lambda t: fusedops.rms_norm(t, (8,)), (x,), (torch.ones_like(x),))[1]
    assert tangent.shape == x.shape
    assert jacrev(lambda t: fusedops.log_softmax(t, -1))(x[0]).shape == (8, 8)
    traced = torch.jit.trace(lambda t: fusedops.softmax(t, -1), (x,))
    torch.testing.assert_close(traced(x), torch.softmax(x, -1))
    with FlopCounterMode(display=False) as counter:
        fusedops.matmul(x, torch.randn(8, 4))
    assert counter.get_total_flops() == 2 * 3 * 8 * 4


def _double_backward(op):
    x = torch.randn(3, 8, requires_grad=True)
    y = op(x)
    g, = torch.autograd.grad((y * torch.randn_like(y)).sum(), x, create_graph=True)
    torch.autograd.grad(g.sum(), x)


_OPS = {"softmax": lambda t: fusedops.softmax(t, -1), "layer_norm": lambda t: fusedops.layer_norm(t, (8,)),
        "matmul": lambda t: fusedops.matmul(t, torch.randn(8, 4))}


@pytest.mark.parametrize("name", list(_OPS))
def test_double_backward_raises(interpret, name):
    with pytest.raises(RuntimeError, match="differentiate twice"):
        _double_backward(_OPS[name])


@pytest.mark.parametrize("name", ["softmax", "layer_norm"])
def test_double_backward_error_names_the_op(interpret, name):
    with pytest.raises(RuntimeError) as info:
        _double_backward(_OPS[name])
    assert name in str(info.value)
