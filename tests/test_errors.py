"""Errors users see, and the launch API: CompilationErrors point at the kernel source (file:line:col,
the line, a caret) with no compiler frames in the traceback; launch errors name the argument or grid
entry; ahead-of-time compilation; a light `import fusedops.dsl`."""

from __future__ import annotations

import subprocess
import sys
import traceback

import pytest
import torch

import fusedops.dsl as dsl

THIS_FILE = __file__
GLOBAL_TENSOR = torch.zeros(4)
GLOBAL_BLOCK = dsl.constexpr(8)


def _source_line(marker: str):
    """(line number, text) of the line of this file with the comment `# <marker>`."""
    with open(THIS_FILE) as f:
        for number, text in enumerate(f, start=1):
            if f"# {marker}" in text:
                return number, text.rstrip("\n")
    raise AssertionError(f"marker {marker} not found")


def _assert_points_at(error: dsl.CompilationError, marker: str, snippet: str) -> None:
    """The error's message starts with file:line:col of `snippet` on the marked line, then shows the
    line and a caret under the snippet's first character."""
    line, text = _source_line(marker)
    col = text.index(snippet)
    lines = str(error).split("\n")
    assert lines[0].startswith(f"{THIS_FILE}:{line}:{col}: "), lines[0]
    assert lines[1] == "    " + text
    assert lines[2] == "    " + " " * col + "^"
    frames = traceback.extract_tb(error.__traceback__)
    assert not any("fusedops/dsl/frontend" in frame.filename.replace("\\", "/") for frame in frames)


@dsl.jit
def block_if_kernel(x_ptr, BLOCK: dsl.constexpr):
    x = dsl.load(x_ptr + dsl.arange(0, BLOCK))
    if x > 0:  # BLOCK-IF
        dsl.store(x_ptr, 1.0)


def test_block_valued_if_says_to_use_where():
    with pytest.raises(dsl.CompilationError) as info:
        block_if_kernel[(1,)](torch.zeros(8), BLOCK=8, interpret=True)
    assert "dsl.where" in str(info.value)
    _assert_points_at(info.value, "BLOCK-IF", "x > 0")
    assert info.value.__cause__ is None and info.value.__suppress_context__


@dsl.jit
def undefined_name_kernel(x_ptr):
    dsl.store(x_ptr, 2 * missing_value)  # UNDEFINED  # noqa: F821


def test_undefined_name():
    with pytest.raises(dsl.CompilationError, match="`missing_value` is not defined") as info:
        undefined_name_kernel[(1,)](torch.zeros(1), interpret=True)
    _assert_points_at(info.value, "UNDEFINED", "missing_value")


def plain_python(x):
    return x


@dsl.jit
def calls_plain_python_kernel(x_ptr):
    dsl.store(x_ptr, plain_python(1.0))  # PLAIN-CALL


def test_calling_a_non_jit_function():
    with pytest.raises(dsl.CompilationError, match="`plain_python` is not a @dsl.jit function") as info:
        calls_plain_python_kernel[(1,)](torch.zeros(1), interpret=True)
    _assert_points_at(info.value, "PLAIN-CALL", "plain_python(")


@dsl.jit
def _bad_helper(x):
    return x + dsl.arange(0, 3)  # HELPER-ERROR


@dsl.jit
def calls_bad_helper_kernel(x_ptr):
    dsl.store(x_ptr, _bad_helper(1))


def test_error_in_a_helper_points_into_the_helper():
    with pytest.raises(dsl.CompilationError, match="power of two") as info:
        calls_bad_helper_kernel[(1,)](torch.zeros(4), interpret=True)
    _assert_points_at(info.value, "HELPER-ERROR", "dsl.arange(0, 3)")


@dsl.jit
def global_tensor_kernel(x_ptr):
    dsl.store(x_ptr, GLOBAL_TENSOR)  # GLOBAL-TENSOR


@dsl.jit
def global_constexpr_kernel(x_ptr):
    dsl.store(x_ptr + dsl.arange(0, GLOBAL_BLOCK), 1.0)


def test_globals():
    with pytest.raises(dsl.CompilationError, match="global `GLOBAL_TENSOR` is a torch.Tensor") as info:
        global_tensor_kernel[(1,)](torch.zeros(4), interpret=True)
    _assert_points_at(info.value, "GLOBAL-TENSOR", "GLOBAL_TENSOR")
    x = torch.zeros(8)
    global_constexpr_kernel[(1,)](x, interpret=True)
    assert x.tolist() == [1.0] * 8


@dsl.jit
def break_kernel(x_ptr, n):
    for i in range(n):
        break  # BREAK


@dsl.jit
def fstring_kernel(x_ptr, n):
    dsl.device_print(f"n={n}")  # FSTRING


@dsl.jit
def subscript_store_kernel(x_ptr, BLOCK: dsl.constexpr):
    x = dsl.arange(0, BLOCK)
    x[0] = 1  # ITEM-ASSIGN


@pytest.mark.parametrize("kernel, marker, snippet, pattern", [
    (break_kernel, "BREAK", "break", "`break` is not supported"),
    (fstring_kernel, "FSTRING", 'f"n={n}"', "f-strings"),
    (subscript_store_kernel, "ITEM-ASSIGN", "x[0]", "dsl.store"),
])
def test_unsupported_constructs_say_what_to_do(kernel, marker, snippet, pattern):
    args = (torch.zeros(4), 4) if kernel is not subscript_store_kernel else (torch.zeros(4),)
    kwargs = {"BLOCK": 4} if kernel is subscript_store_kernel else {}
    with pytest.raises(dsl.UnsupportedError, match=pattern) as info:
        kernel[(1,)](*args, **kwargs, interpret=True)
    _assert_points_at(info.value, marker, snippet)


@dsl.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK)
    dsl.store(y_ptr + offsets, dsl.load(x_ptr + offsets, mask=offsets < n), mask=offsets < n)


def test_wrong_arguments_at_launch_name_the_parameter():
    x, y = torch.zeros(4), torch.zeros(4)
    with pytest.raises(TypeError, match="missing argument `n`"):
        copy_kernel[(1,)](x, y, BLOCK=4, interpret=True)
    with pytest.raises(TypeError, match="takes 4 arguments"):
        copy_kernel[(1,)](x, y, 4, 4, 5, interpret=True)
    with pytest.raises(TypeError, match="unexpected keyword argument `BLOK`"):
        copy_kernel[(1,)](x, y, 4, BLOK=4, interpret=True)
    with pytest.raises(TypeError, match="argument `y_ptr`.*numpy"):
        copy_kernel[(1,)](x, y.numpy(), 4, BLOCK=4, interpret=True)
    with pytest.raises(TypeError, match="`BLOCK` of kernel `copy_kernel` is a dsl.constexpr"):
        copy_kernel[(1,)](x, y, 4, BLOCK=torch.tensor(4), interpret=True)


def test_cpu_tensor_without_the_interpreter():
    x, y = torch.zeros(4), torch.zeros(4)
    with pytest.raises(ValueError, match="argument `x_ptr`.*cpu tensor.*FUSEDOPS_INTERPRET=1"):
        copy_kernel[(1,)](x, y, 4, BLOCK=4, interpret=False)


@pytest.mark.parametrize("grid, pattern", [
    ((-1,), r"grid entry 0 .* is -1"), ((1, 65536), "grid entry 1"), ((2**31,), "grid entry 0"),
    ((1, 1, 1, 1), "1 to 3 dimensions"), ((1.5,), "must be an int"), ("x", "tuple of 1 to 3 ints"),
])
def test_bad_grids(grid, pattern):
    x = torch.zeros(4)
    with pytest.raises(dsl.LaunchError, match=pattern):
        copy_kernel[grid](x, x, 4, BLOCK=4, interpret=True)


def test_bad_num_warps():
    x = torch.zeros(4)
    with pytest.raises(dsl.LaunchError, match="num_warps"):
        copy_kernel[(1,)](x, x, 4, BLOCK=4, num_warps=3, interpret=True)


def test_none_launch_options_take_the_defaults():
    # Triton takes num_warps=None / num_stages=None as its defaults (4 and 3); so do launches, prepare, compile, ir
    x, y = torch.randn(5), torch.full((5,), float("nan"))
    copy_kernel[(1,)](x, y, 5, BLOCK=8, num_warps=None, num_stages=None, interpret=True)
    assert torch.equal(y, x)
    y.fill_(float("nan"))
    copy_kernel.prepare((1,), x, y, 5, BLOCK=8, num_warps=None, interpret=True)(x, y)
    assert torch.equal(y, x)
    default = copy_kernel.compile(x, y, 5, BLOCK=8, target="sm_80").asm["ptx"]
    assert copy_kernel.compile(x, y, 5, BLOCK=8, target="sm_80", num_warps=None, num_stages=None).asm["ptx"] == default
    assert copy_kernel.ir(x, y, 5, BLOCK=8, num_warps=None) is copy_kernel.ir(x, y, 5, BLOCK=8)


@dsl.jit
def assert_kernel(x_ptr, n, LIMIT: dsl.constexpr):
    assert LIMIT > 0, "LIMIT must be positive"  # STATIC-ASSERT
    assert n < LIMIT, "n is too large"
    dsl.store(x_ptr, n)


def test_assert_statements():
    x = torch.zeros(1, dtype=torch.int32)
    assert_kernel[(1,)](x, 3, LIMIT=5, interpret=True)
    assert x.item() == 3
    with pytest.raises(dsl.InterpreterError, match="n is too large"):
        assert_kernel[(1,)](x, 9, LIMIT=5, interpret=True)
    with pytest.raises(dsl.CompilationError, match="compile-time assertion failed: LIMIT must be positive") as info:
        assert_kernel[(1,)](x, 9, LIMIT=0, interpret=True)
    _assert_points_at(info.value, "STATIC-ASSERT", "assert LIMIT")


def test_builtins_outside_kernels_raise():
    with pytest.raises(RuntimeError, match="dsl.load can only be called inside a @dsl.jit kernel"):
        dsl.load(None)
    with pytest.raises(RuntimeError, match="launch it with copy_kernel\\[grid\\]"):
        copy_kernel(torch.zeros(1), torch.zeros(1), 1, 1)
    assert dsl.cdiv(10, 4) == 3       # cdiv also works on the host, for grids


def test_grid_callable_sees_the_meta_parameters():
    x, y = torch.arange(10.0), torch.zeros(10)
    seen = {}

    def grid(meta):
        seen.update(meta)
        return (dsl.cdiv(meta["n"], meta["BLOCK"]),)

    copy_kernel[grid](x, y, 10, BLOCK=16, num_warps=2, interpret=True)
    assert seen["BLOCK"] == 16 and seen["n"] == 10 and seen["num_warps"] == 2 and seen["num_stages"] == 3
    assert torch.equal(x, y)


def test_compile_ahead_of_time_without_a_gpu():
    P = dsl.pointer_type
    compiled = copy_kernel.compile(P(dsl.float32), P(dsl.float32), dsl.int32, BLOCK=64, target="sm_90a")
    assert "kernel copy_kernel(" in compiled.asm["ir"]
    # tensors on any device and Python scalars work too; the IR is the frontend's
    function = copy_kernel.ir(torch.zeros(4, dtype=torch.float16), torch.zeros(4, dtype=torch.float16), 7, BLOCK=8)
    assert [str(arg.type) for arg in function.args] == ["ptr<float16>", "ptr<float16>", "int32"]
    with pytest.raises(ValueError, match="sm_90a"):
        copy_kernel.compile(P(dsl.float32), P(dsl.float32), dsl.int32, BLOCK=64, target="gfx90a")


def test_missing_gpu_compiler(monkeypatch):
    monkeypatch.setitem(sys.modules, "fusedops.dsl.compiler", None)
    P = dsl.pointer_type
    compiled = copy_kernel.compile(P(dsl.int8), P(dsl.int8), dsl.int32, BLOCK=64, target="sm_80")
    assert list(compiled.asm) == ["ir"]            # the frontend's IR only
    with pytest.raises(dsl.UnsupportedError, match="GPU compiler"):
        compiled.launch((1,), [], None)


def test_import_loads_neither_torch_nor_llvm_nor_cuda():
    code = ("import sys, fusedops.dsl as dsl; "
            "print(sorted(m for m in ('torch', 'llvmlite', 'cuda') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
