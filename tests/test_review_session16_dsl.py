"""Review (session 16, the DSL): a demanding Triton user tried to break `fusedops.dsl` on the CPU with
kernels modelled on bug reports against Triton and similar DSLs: C vs Python `//` and `%` of negative
numbers (including constexprs), shifts by >= the bit width and by negative amounts, unsigned and 8/16-bit
wrap-around and promotion, float -> int casts of NaN / inf / out-of-range values, bitcasts, fp16/bf16
rounding, weakly typed literals, `where` with scalar arms, reductions / argmax / argmin / cumsum over bools,
ints, NaN, ties, size-1 axes, keep_dims, 3-D axes and reverse scans, reshape / trans / expand_dims /
broadcast_to up to rank 6, masked loads with `other` of another dtype, aliasing and empty tensors,
constexpr None / bool / str / tuple / dtype arguments and defaults, nested helpers returning tuples,
zero-trip / negative-step / int64-bound loops, `while` loops with block state, early `return`, block-valued
`if`, atomics of every dtype and kind, dots of every dtype and edge shape, tensor descriptors with boxes off
the tensor, pipelined dot loops with zero trips and negative steps (the IR after the pass pipeline run in
the interpreter against the unpipelined one), and ~100 unsupported-syntax kernels for their error messages.
Each kernel ran in the interpreter against NumPy / torch and was compiled for sm_80 and sm_90a and
assembled by ptxas.

Nearly everything held. The defects found are below, most severe first; each test asserts the correct
behaviour. All five were fixed the same session: codegen/debug.py escapes "%" in a device_print prefix;
the interpreter prints a prefix-only device_print; codegen/elementwise.py bitcasts pointers to and from
64-bit scalars with ptrtoint / inttoptr; argmax / argmin / cumsum of pointers are CompilationErrors
(language/block_ops.py).
"""

from __future__ import annotations

import re

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.target import assemble, ptxas_available


# ================================================================================================
# Defect 1 (wrong output / possible illegal memory access on the GPU): `dsl.device_print`'s prefix is pasted
# unescaped into the `vprintf` format string (codegen/debug.py `_print`). A prefix holding a `%` -- "100%",
# "loss %", a path with `%20` -- adds conversion specifications for which no argument was passed: "% d"
# consumes the value meant for the real one, and "%s" makes vprintf dereference whatever lies after the
# argument buffer as a char* (on the GPU: garbage or an illegal address that kills the context). Triton had
# the same bug. The interpreter prints the prefix literally. The prefix's `%` must be escaped as `%%`, so
# that the format has exactly one conversion per argument: 3 program ids and the value.
# ================================================================================================
@dsl.jit
def _print_percent_kernel(x_ptr, n):
    dsl.device_print("100% done %s ", n)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_device_print_prefix_with_percent_signs_is_escaped(arch):
    compiled = _print_percent_kernel.compile(torch.zeros(1), 3, target=arch)
    formats = [line for line in compiled.asm["llir"].splitlines() if "done" in line and "constant" in line]
    assert len(formats) == 1, formats
    text = formats[0].split('c"', 1)[1]
    conversions = re.findall(r"%[^%]", text.replace("%%", ""))
    assert len(conversions) == 4, (text, conversions)   # pid x, y, z and the value


# ================================================================================================
# Defect 2 (interpreter disagrees with the GPU): `dsl.device_print("prefix")` with no values (a "reached
# here" trace, as in Triton's `tl.device_print("enter loop")`) prints one `pid (x, y, z) prefix` line per
# thread on the GPU (codegen/debug.py handles `not op.operands`), but nothing at all in the interpreter
# (interpreter/rules_control.py `_print` loops over the operands only). The same goes for a bare
# `print("text")` in a kernel. The interpreter should print the prefix line once per program.
# ================================================================================================
@dsl.jit
def _print_prefix_only_kernel(x_ptr):
    dsl.device_print("reached the epilogue")


def test_device_print_with_only_a_prefix_prints_in_the_interpreter(capsys):
    _print_prefix_only_kernel[(2,)](torch.zeros(1), interpret=True)
    out = capsys.readouterr().out
    assert "reached the epilogue" in out
    assert "pid (0, 0, 0)" in out and "pid (1, 0, 0)" in out


# ================================================================================================
# Defect 3 (compiler crash with an internal error): `ptr.to(dsl.int64, bitcast=True)` (or uint64, float64)
# and `int64_value.to(pointer_type, bitcast=True)` pass the language's checks (semantics.py `cast`: equal
# widths, pointers are 64 bits) and run in the interpreter, but the lowering (codegen/elementwise.py
# `_bitcast`) emits an LLVM `bitcast` between a pointer and an integer/double, which LLVM rejects: the
# compile fails with a BackendError "LLVM parse failed ... invalid cast opcode for cast from 'ptr
# addrspace(1)' to 'i64'", and the int64 -> pointer direction with a TypeError from llvmlite ("cannot load
# from value of type i64 ... not a pointer"). It should compile (ptrtoint / inttoptr, as the value cast
# does), or else be refused as a CompilationError by the language for both the interpreter and the compiler.
# ================================================================================================
@dsl.jit
def _pointer_bitcast_kernel(o_ptr, x_ptr, CASE: dsl.constexpr, PT: dsl.constexpr = None):
    i = dsl.arange(0, 4)
    if CASE == "ptr_to_int64":
        address = (x_ptr + i).to(dsl.int64, bitcast=True)
        dsl.store(o_ptr + i, (address % 4).to(dsl.float32))
    elif CASE == "ptr_to_float64":
        bits = x_ptr.to(dsl.float64, bitcast=True)
        dsl.store(o_ptr + i, (bits * 0).to(dsl.float32))
    else:
        pointer = x_ptr.to(dsl.int64).to(PT, bitcast=True)
        dsl.store(o_ptr + i, dsl.load(pointer + i))


@pytest.mark.parametrize("case", ["ptr_to_int64", "ptr_to_float64", "int64_to_ptr"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_pointer_bitcast_compiles_or_is_a_compilation_error(case, arch):
    x, o = torch.arange(4, dtype=torch.float32), torch.zeros(4)
    pt = dsl.pointer_type(dsl.float32) if case == "int64_to_ptr" else None
    _pointer_bitcast_kernel[(1,)](o.clone(), x, CASE=case, PT=pt, interpret=True)   # the interpreter runs it
    compiled = _pointer_bitcast_kernel.compile(o, x, CASE=case, PT=pt, target=arch)
    if ptxas_available():
        assemble(compiled.asm["ptx"], arch)


@pytest.mark.cuda
def test_gpu_pointer_round_trip_through_int64_loads_the_data():
    x = torch.randn(4, device="cuda")
    o = torch.full((4,), float("nan"), device="cuda")
    _pointer_bitcast_kernel[(1,)](o, x, CASE="int64_to_ptr", PT=dsl.pointer_type(dsl.float32))
    torch.cuda.synchronize()
    assert torch.equal(o, x)
    _pointer_bitcast_kernel[(1,)](o, x, CASE="ptr_to_int64")
    torch.cuda.synchronize()
    assert torch.equal(o, torch.tensor([0.0, 0.0, 0.0, 0.0], device="cuda"))   # 4-byte aligned addresses % 4


# ================================================================================================
# Defect 4 (compiler crash with an internal error): `dsl.argmax` / `dsl.argmin` of a block of pointers
# (e.g. of `ptr + offsets`, a slip for `dsl.load(ptr + offsets)`) are accepted by the language
# (block_ops.py `argreduce` has no pointer check, unlike `reduce`: "cannot max-reduce pointers") and run in
# the interpreter (comparing addresses), but the compiler fails with `KeyError: 'ptr addrspace(1)'` from
# codegen/reduce.py. `dsl.max(ptrs)` gives a CompilationError; argmax/argmin should too (or compile).
# ================================================================================================
@dsl.jit
def _argreduce_pointers_kernel(o_ptr, x_ptr, KIND: dsl.constexpr):
    i = dsl.arange(0, 8)
    if KIND == "argmax":
        index = dsl.argmax(x_ptr + i, axis=0)
    else:
        index = dsl.argmin(x_ptr + i, axis=0)
    dsl.store(o_ptr + i, index)


@pytest.mark.parametrize("kind", ["argmax", "argmin"])
def test_argreduce_of_pointers_is_a_compilation_error(kind):
    o, x = torch.zeros(8, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)
    try:
        _argreduce_pointers_kernel.compile(o, x, KIND=kind, target="sm_90a")
    except dsl.CompilationError:
        pass


# ================================================================================================
# Defect 5 (internal error in the interpreter and the compiler): `dsl.cumsum` of a block of pointers raises
# `AttributeError: 'PointerType' object has no attribute 'bits'` from block_ops.py `_accumulation_type`
# -- a Python traceback into the compiler, where DESIGN.md promises a CompilationError with the kernel's
# file, line and a caret (as `dsl.sum` / `dsl.max` of pointers give: "cannot sum-reduce pointers").
# ================================================================================================
@dsl.jit
def _cumsum_pointers_kernel(o_ptr, x_ptr):
    i = dsl.arange(0, 8)
    dsl.store(o_ptr + i, dsl.load(dsl.cumsum(x_ptr + i, axis=0)))


def test_cumsum_of_pointers_is_a_compilation_error():
    o, x = torch.zeros(8, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)
    with pytest.raises(dsl.CompilationError, match="cumsum"):
        _cumsum_pointers_kernel[(1,)](o, x, interpret=True)
    with pytest.raises(dsl.CompilationError, match="cumsum"):
        _cumsum_pointers_kernel.compile(o, x, target="sm_90a")
