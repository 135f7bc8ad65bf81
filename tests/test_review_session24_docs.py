"""Review (session 24): the documentation read as a new user, tried on the CPU.

README.md's kernel example and settings table, the docstrings of fusedops/__init__.py, fusedops/dsl,
the benchmark command lines (`python -m fusedops.bench`, bench/*.py), the packaging metadata, and the
errors a Triton user meets first (a launch without a grid, a numpy array as a pointer, a CPU tensor for a
compiled launch, bad grids, argument counts, num_warps). The defects it found, fixed in the same session:
IR dumps of one kernel overwritten by the next (now a folder per kernel) and a FUSEDOPS_DUMP_DIR that is a
file failing without naming it; a compiled launch without tensor arguments on a machine without CUDA
ending in torch's AssertionError; BackendError / FusedOpsError missing from fusedops.dsl; no __all__ in
fusedops; --out and the bench scripts' value lists unchecked by argparse; the self-check not saying why a
--dtype selection left an op out. The other tests pin behaviour that works and is easy to break.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fusedops
import fusedops.dsl as dsl
from fusedops.dsl.runtime import knobs

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour on a machine without CUDA")


# -- kernels of the README and of a Triton tutorial -------------------------------------------------
@dsl.jit
def softmax_kernel(y_ptr, x_ptr, x_row_stride, y_row_stride, n_cols, BLOCK: dsl.constexpr):
    row = dsl.program_id(0)                      # one program instance per row
    cols = dsl.arange(0, BLOCK)                  # a block of BLOCK column indices
    x = dsl.load(x_ptr + row * x_row_stride + cols, mask=cols < n_cols, other=-float("inf"))
    x = x.to(dsl.float32)
    num = dsl.exp(x - dsl.max(x, axis=0))
    dsl.store(y_ptr + row * y_row_stride + cols, num / dsl.sum(num, axis=0), mask=cols < n_cols)


@dsl.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: dsl.constexpr):
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    dsl.store(out_ptr + offsets, dsl.load(x_ptr + offsets, mask=mask) + dsl.load(y_ptr + offsets, mask=mask),
              mask=mask)


@dsl.jit
def scalars_only_kernel(n, BLOCK: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK) + n
    dsl.device_assert(offsets >= 0)


@dsl.jit
def dump_alpha_kernel(x_ptr, n, BLOCK: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK)
    dsl.store(x_ptr + offsets, dsl.load(x_ptr + offsets, mask=offsets < n) + 1.0, mask=offsets < n)


@dsl.jit
def dump_beta_kernel(x_ptr, n, BLOCK: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK)
    dsl.store(x_ptr + offsets, dsl.load(x_ptr + offsets, mask=offsets < n) * 2.0, mask=offsets < n)


@dsl.jit
def dump_gamma_kernel(x_ptr, n, BLOCK: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK)
    dsl.store(x_ptr + offsets, dsl.load(x_ptr + offsets, mask=offsets < n) - 1.0, mask=offsets < n)


@dsl.jit
def cache_kernel(x_ptr, n, BLOCK: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK)
    dsl.store(x_ptr + offsets, dsl.load(x_ptr + offsets, mask=offsets < n) + 5.0, mask=offsets < n)


def _vectors(n=100):
    x, y = torch.randn(n), torch.randn(n)
    return x, y, torch.empty(n)


# ================================================================================================
# 1. README examples and settings
# ================================================================================================
def test_readme_softmax_example_runs_on_cpu_under_fusedops_interpret(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    x = torch.randn(1000, 781, dtype=torch.float16)           # README: device="cuda"
    y = torch.empty_like(x)
    n_rows, n_cols = x.shape
    softmax_kernel[(n_rows,)](y, x, x.stride(0), y.stride(0), n_cols, BLOCK=1024, num_warps=4)
    torch.testing.assert_close(y.float(), torch.softmax(x.float(), -1), atol=1e-3, rtol=1e-2)


def test_readme_grid_callable_of_the_meta_parameters():
    n = 1000
    x, y, out = _vectors(n)
    add_kernel[lambda meta: ((n + meta["BLOCK"] - 1) // meta["BLOCK"],)](x, y, out, n, BLOCK=128, interpret=True)
    torch.testing.assert_close(out, x + y)


def test_readme_interpreter_out_of_bounds_error_names_kernel_line_program_and_offset():
    x, y, out = _vectors()
    with pytest.raises(dsl.InterpreterError) as info:
        add_kernel[(1,)](x, y, out, 200, BLOCK=256, interpret=True)
    text = str(info.value)
    assert "add_kernel" in text and "program_id" in text and "byte offset 400" in text
    assert "dsl.store(out_ptr + offsets" in text            # the source line


def test_readme_settings_table_names_exactly_the_variables_knobs_reads():
    table = set(re.findall(r"^\| `(FUSEDOPS_[A-Z_]+)` \|", README, flags=re.M))
    assert table == set(knobs.variables())


@pytest.mark.parametrize("variable, value", [
    ("FUSEDOPS_INTERPRET", "maybe"), ("FUSEDOPS_DISABLE_CACHE", "2"), ("FUSEDOPS_TMA", "enabled"),
    ("FUSEDOPS_WS", "3"), ("FUSEDOPS_DEFAULT_ARCH", "hopper"), ("FUSEDOPS_PERSISTENT", "y"),
])
def test_invalid_setting_raises_value_error_naming_the_variable(variable, value):
    with pytest.raises(ValueError, match=variable):
        knobs.current({variable: value})


def test_invalid_fusedops_interpret_is_loud_on_the_ops_and_on_launches(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "maybe")
    with pytest.raises(ValueError, match="FUSEDOPS_INTERPRET='maybe' is not a boolean"):
        fusedops.softmax(torch.randn(3, 4))
    x, y, out = _vectors()
    with pytest.raises(ValueError, match="FUSEDOPS_INTERPRET"):
        add_kernel[(1,)](x, y, out, 100, BLOCK=128)


def test_compile_for_sm_90a_needs_no_gpu():
    x = torch.randn(4, 781, dtype=torch.float16)
    kernel = softmax_kernel.compile(x, x, x.stride(0), x.stride(0), 781, BLOCK=1024, target="sm_90a")
    assert ".target sm_90a" in kernel.asm["ptx"]


def test_disable_cache_writes_nothing_into_the_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FUSEDOPS_DISABLE_CACHE", "1")
    cache_kernel.compile(torch.zeros(16), 16, BLOCK=16, target="sm_80")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*"))


def test_dump_dir_keeps_the_dumps_of_every_kernel(monkeypatch, tmp_path):
    monkeypatch.setenv("FUSEDOPS_DISABLE_CACHE", "1")
    monkeypatch.setenv("FUSEDOPS_DUMP_IR", "1")
    monkeypatch.setenv("FUSEDOPS_DUMP_DIR", str(tmp_path / "dumps"))
    x = torch.zeros(16)
    dump_alpha_kernel.compile(x, 16, BLOCK=16, target="sm_80")
    dump_beta_kernel.compile(x, 16, BLOCK=16, target="sm_80")
    text = "".join(path.read_text() for path in (tmp_path / "dumps").rglob("*") if path.is_file())
    assert "dump_beta_kernel" in text
    assert "dump_alpha_kernel" in text


def test_dump_dir_that_is_a_file_gives_an_error_naming_the_variable(monkeypatch, tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    monkeypatch.setenv("FUSEDOPS_DISABLE_CACHE", "1")
    monkeypatch.setenv("FUSEDOPS_DUMP_IR", "1")
    monkeypatch.setenv("FUSEDOPS_DUMP_DIR", str(not_a_dir))
    with pytest.raises(Exception, match="FUSEDOPS_DUMP_DIR"):
        dump_gamma_kernel.compile(torch.zeros(16), 16, BLOCK=16, target="sm_80")


# ================================================================================================
# 2. The DSL's errors for a Triton user's usual mistakes
# ================================================================================================
def test_calling_a_kernel_without_a_grid_says_how_to_launch_it():
    x, y, out = _vectors()
    with pytest.raises(RuntimeError, match=r"add_kernel\[grid\]\(\.\.\.\)"):
        add_kernel(x, y, out, 100, BLOCK=128)


@pytest.mark.parametrize("pointer", [np.zeros(100, dtype=np.float32), [0.0] * 100, "x"],
                         ids=["numpy", "list", "str"])
def test_non_tensor_pointer_argument_is_a_type_error_naming_the_parameter(pointer):
    _, y, out = _vectors()
    with pytest.raises(TypeError, match=r"argument `x_ptr` of kernel `add_kernel` must be a torch\.Tensor"):
        add_kernel[(1,)](pointer, y, out, 100, BLOCK=128, interpret=True)


@NO_CUDA
def test_cpu_tensor_in_a_compiled_launch_points_at_the_interpreter():
    x, y, out = _vectors()
    with pytest.raises(ValueError, match=r"`x_ptr` of kernel `add_kernel` is a cpu tensor.*FUSEDOPS_INTERPRET=1"):
        add_kernel[(1,)](x, y, out, 100, BLOCK=128, interpret=False)


@NO_CUDA
def test_compiled_launch_without_tensor_arguments_and_without_cuda_is_a_clear_error():
    with pytest.raises(Exception) as info:
        scalars_only_kernel[(1,)](3, BLOCK=4, interpret=False)
    assert not isinstance(info.value, AssertionError)
    assert re.search(r"(?i)interpret", str(info.value)), str(info.value)


@pytest.mark.parametrize("grid, message", [
    ((-1,), r"grid entry 0 of `add_kernel` is -1"),
    ((1, -3), r"grid entry 1 of `add_kernel` is -3"),
    ((), r"1 to 3 dimensions, got 0"),
    ((1, 1, 1, 1), r"1 to 3 dimensions, got 4"),
    ((1.0,), r"must be an int, got float"),
    (None, r"must be a tuple of 1 to 3 ints"),
    (lambda meta: (-2,), r"is -2"),
])
def test_bad_grids_are_launch_errors(grid, message):
    x, y, out = _vectors()
    with pytest.raises(dsl.LaunchError, match=message):
        add_kernel[grid](x, y, out, 100, BLOCK=128, interpret=True)


def test_empty_grid_launches_nothing():
    x, y, out = _vectors()
    out.fill_(7.0)
    add_kernel[(0,)](x, y, out, 100, BLOCK=128, interpret=True)
    assert bool((out == 7.0).all())


@pytest.mark.parametrize("args, kwargs, message", [
    ((1, 2, 3), {"BLOCK": 128}, r"missing argument `n`"),
    ((1, 2, 3, 4, 5, 6), {}, r"takes 5 arguments .* but 6 were given"),
    ((1, 2, 3, 4), {"BLOK": 128}, r"unexpected keyword argument `BLOK`"),
    ((1, 2, 3, 4), {"BLOCK": 128, "x_ptr": 1}, r"multiple values for argument `x_ptr`"),
    ((1, 2, 3, 4), {}, r"missing argument `BLOCK`"),
])
def test_argument_count_and_keyword_errors(args, kwargs, message):
    x, y, out = _vectors()
    values = [x, y, out, 100, 128, 5][:len(args)]
    with pytest.raises(TypeError, match=message):
        add_kernel[(1,)](*values, **kwargs, interpret=True)


def test_constexpr_positional_or_keyword_gives_the_same_result_and_tensor_constexpr_is_refused():
    x, y, out = _vectors()
    add_kernel[(1,)](x, y, out, 100, 128, interpret=True)
    torch.testing.assert_close(out, x + y)
    out.zero_()
    add_kernel[(1,)](x, y, out, 100, BLOCK=128, interpret=True)
    torch.testing.assert_close(out, x + y)
    with pytest.raises(TypeError, match=r"`BLOCK` of kernel `add_kernel` is a dsl.constexpr"):
        add_kernel[(1,)](x, y, out, 100, torch.tensor(128), interpret=True)


@pytest.mark.parametrize("options, message", [
    ({"num_warps": 3}, r"num_warps of `add_kernel` must be a power of two from 1 to 32, got 3"),
    ({"num_warps": 0}, r"got 0"), ({"num_warps": 64}, r"got 64"), ({"num_warps": 4.0}, r"got 4\.0"),
    ({"num_warps": True}, r"got True"), ({"num_stages": 0}, r"num_stages of `add_kernel` must be a positive int"),
    ({"interpret": "no"}, r"interpret of `add_kernel` must be True, False or None"),
])
def test_bad_launch_options_are_launch_errors(options, message):
    x, y, out = _vectors()
    options = {"interpret": True, **options}
    with pytest.raises(dsl.LaunchError, match=message):
        add_kernel[(1,)](x, y, out, 100, BLOCK=128, **options)


def test_non_power_of_two_block_is_a_compilation_error_at_the_source_line():
    x, y, out = _vectors()
    with pytest.raises(dsl.CompilationError, match=r"(?s)power of two, got 100.*dsl\.arange\(0, BLOCK\)"):
        add_kernel[(1,)](x, y, out, 100, BLOCK=100, interpret=True)


def test_dsl_exports_every_error_class_its_api_raises():
    from fusedops.dsl import errors
    assert dsl.BackendError is errors.BackendError
    assert dsl.FusedOpsError is errors.FusedOpsError
    assert {"BackendError", "FusedOpsError"} <= set(dsl.__all__)


# ================================================================================================
# 3. Packaging and imports
# ================================================================================================
def test_import_fusedops_and_fusedops_dsl_load_neither_torch_nor_llvm():
    code = ("import sys, fusedops, fusedops.dsl; "
            "print(sorted(m for m in ('torch', 'llvmlite', 'cuda') if m in sys.modules))")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_public_names_of_dir_resolve_and_nn_and_dsl_import_without_cuda():
    import fusedops.nn as nn
    for name in ("softmax", "log_softmax", "layer_norm", "rms_norm", "matmul", "scaled_dot_product_attention"):
        assert name in dir(fusedops) and callable(getattr(fusedops, name))
    for name in dsl.__all__:
        getattr(dsl, name)
    for name in ("Softmax", "LogSoftmax", "LayerNorm", "RMSNorm", "Linear", "MultiheadAttention", "patch"):
        assert callable(getattr(nn, name))
    with pytest.raises(AttributeError, match="no attribute 'not_an_op'"):
        fusedops.not_an_op


def test_star_import_of_fusedops_gives_the_public_ops():
    namespace: dict = {}
    exec("from fusedops import *", namespace)
    public = {name for name in namespace if not name.startswith("_")}
    assert {"softmax", "log_softmax", "layer_norm", "rms_norm", "matmul", "scaled_dot_product_attention"} <= public
    assert not public & {"annotations", "importlib"}


def test_pyproject_metadata_extras_entry_point_and_markers():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    meta = project["project"]
    assert meta["requires-python"] == ">=3.10"
    assert {"pytest>=7", "pytest-xdist>=3"} <= set(meta["optional-dependencies"]["test"])
    assert {"matplotlib", "tqdm", "tabulate"} <= set(meta["optional-dependencies"]["bench"])
    module, _, attribute = meta["scripts"]["fusedops-bench"].partition(":")
    assert callable(getattr(importlib.import_module(module), attribute))
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "fusedops.__version__"}
    pytest_options = project["tool"]["pytest"]["ini_options"]
    assert "--strict-markers" in pytest_options["addopts"]
    assert any(marker.startswith("cuda:") for marker in pytest_options["markers"])
    # the README's test commands use the test extra's plugins (pytest-xdist: -n, --maxprocesses)
    assert "python -m pytest -q -n auto --maxprocesses 8 tests" in README
    assert importlib.util.find_spec("xdist") is not None


# ================================================================================================
# 4. The benchmark command lines
# ================================================================================================
from fusedops.bench import __main__ as bench_main  # noqa: E402


def test_bench_help_exits_0_without_importing_torch():
    code = ("import sys\nfrom fusedops.bench.__main__ import main\ntry:\n    main(['--help'])\n"
            "except SystemExit as e:\n    print('exit', e.code, 'torch' in sys.modules)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert "usage: fusedops-bench" in result.stdout
    assert result.stdout.strip().endswith("exit 0 False")


@pytest.mark.parametrize("argv, message", [
    (["--ops", "softmx"], r"unknown value\(s\) softmx; valid ops: softmax,"),
    (["--ops", ","], r"an empty list"),
    (["--dtype", "fp64"], r"unknown value\(s\) fp64; valid dtypes: fp16, bf16, fp32"),
    (["--dtype", "float16"], r"unknown value\(s\) float16"),
    (["--quick", "extra"], r"unrecognized arguments: extra"),
    (["--ops"], r"expected one argument"),
])
def test_bench_bad_arguments_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        bench_main.parse_args(argv)
    assert info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_bench_comma_lists_are_stripped_and_deduplicated():
    args = bench_main.parse_args(["--ops", " softmax , matmul,softmax", "--dtype", "bf16,fp16"])
    assert args.ops == ("softmax", "matmul")
    assert args.dtypes == (torch.bfloat16, torch.float16)


def test_bench_out_that_is_a_file_is_a_usage_error(tmp_path, capsys):
    not_a_dir = tmp_path / "results"
    not_a_dir.write_text("")
    with pytest.raises(SystemExit) as info:
        bench_main.parse_args(["--out", str(not_a_dir)])
    assert info.value.code == 2
    assert "--out" in capsys.readouterr().err


@pytest.fixture(scope="module")
def selfcheck_module():
    from fusedops.bench import selfcheck
    with contextlib.redirect_stdout(io.StringIO()):
        selfcheck.library_kernels()         # imports every kernel module once (outside the timed test)
    return selfcheck


def test_selfcheck_says_why_a_dtype_selection_left_an_op_out(selfcheck_module):
    output = io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        status = selfcheck_module.run(["matmul"], [torch.float32])
    assert status == 1
    assert re.search(r"matmul.*fp32|fp32.*matmul", output.getvalue()), output.getvalue()[-500:]


def _load_script(name):
    """bench/<name>.py as the module bench_<name> (bench/ is not a package), as tests/test_bench_scripts.py."""
    module_name = f"bench_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, ROOT / "bench" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


@NO_CUDA
@pytest.mark.parametrize("name, argv", [
    ("softmax", ["--dtypes", "fp64"]),
    ("softmax", ["--ns", "abc"]),
    ("softmax", ["--ns=-5"]),
    ("matmul", ["--shapes", "4096x4096"]),
    ("layernorm", ["--ops", "group_norm"]),
    ("attention", ["--head-dims", "0"]),
])
def test_bench_scripts_reject_bad_values_as_usage_errors(name, argv, capsys):
    with pytest.raises(SystemExit) as info:
        _load_script(name).main(argv)
    assert info.value.code == 2
