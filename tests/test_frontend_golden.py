"""Golden IR: the frontend's printed IR for small kernels, exact text.

A change here is a change of the frontend's (or Semantics') output: check the new text by hand,
and that the kernels still compute the right thing (the last test runs them in the interpreter).
"""

from __future__ import annotations

import torch

import fusedops.dsl as dsl
from fusedops.dsl.ir import print_function, verify


@dsl.jit
def scale_kernel(x_ptr, out_ptr, n, scale, BLOCK: dsl.constexpr):
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    x = dsl.load(x_ptr + offsets, mask=mask, other=0.0)
    dsl.store(out_ptr + offsets, x * scale, mask=mask)


@dsl.jit
def row_sum_kernel(x_ptr, out_ptr, n_cols, BLOCK: dsl.constexpr):
    row = dsl.program_id(0)
    acc = dsl.zeros((BLOCK,), dsl.float32)
    count = 0
    for start in range(0, n_cols, BLOCK):
        cols = start + dsl.arange(0, BLOCK)
        acc += dsl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)
        count += 1
    dsl.store(out_ptr + row, dsl.sum(acc, axis=0) / count)


@dsl.jit
def _select(a, b, flag):
    if flag:
        return a
    else:
        return b


@dsl.jit
def branch_kernel(out_ptr, n, USE_MAX: dsl.constexpr):
    pid = dsl.program_id(0)
    if pid < n:
        value = pid * 2
    else:
        value = n
    if USE_MAX:
        value = dsl.maximum(value, 7)
    dsl.store(out_ptr + pid, _select(value, n, pid % 2 == 0))


@dsl.jit
def strided_copy_kernel(x_ptr, out_ptr, stride, n, BLOCK: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK)
    dsl.store(out_ptr + offsets, dsl.load(x_ptr + offsets * stride, mask=offsets < n), mask=offsets < n)


GOLDEN_SCALE = """\
kernel scale_kernel(%x_ptr: ptr<float16>, %out_ptr: ptr<float16>, %n: int32, %scale: float32) {
  %0 = program_id {axis=0} : int32
  %1 = constant {value=64} : int32
  %2 = mul %0, %1 : int32
  %3 = arange {end=64, start=0} : <64xint32>
  %4 = splat %2 : <64xint32>
  %5 = add %4, %3 : <64xint32>
  %6 = splat %n : <64xint32>
  %7 = lt %5, %6 : <64xint1>
  %8 = splat %x_ptr : <64xptr<float16>>
  %9 = addptr %8, %5 : <64xptr<float16>>
  %10 = constant {value=0.0} : float16
  %11 = constant {value=0.0} : <64xfloat16>
  %12 = load %9, %7, %11 {cache="", eviction="", has_other=True, masked=True} : <64xfloat16>
  %13 = splat %out_ptr : <64xptr<float16>>
  %14 = addptr %13, %5 : <64xptr<float16>>
  %15 = cast %12 : <64xfloat32>
  %16 = splat %scale : <64xfloat32>
  %17 = mul %15, %16 : <64xfloat32>
  %18 = cast %17 : <64xfloat16>
  store %14, %18, %7 {cache="", eviction="", masked=True}
}
"""

GOLDEN_ROW_SUM = """\
kernel row_sum_kernel(%x_ptr: ptr<float32>, %out_ptr: ptr<float32>, %n_cols: int32) {
  %0 = program_id {axis=0} : int32
  %1 = constant {value=0.0} : <32xfloat32>
  %2 = constant {value=0} : int32
  %3 = constant {value=32} : int32
  %4 = constant {value=0} : int32
  %5, %6 = for %2, %n_cols, %3, %1, %4 {
  ^(%start: int32, %acc: <32xfloat32>, %count: int32):
    %7 = arange {end=32, start=0} : <32xint32>
    %8 = splat %start : <32xint32>
    %9 = add %8, %7 : <32xint32>
    %10 = mul %0, %n_cols : int32
    %11 = addptr %x_ptr, %10 : ptr<float32>
    %12 = splat %11 : <32xptr<float32>>
    %13 = addptr %12, %9 : <32xptr<float32>>
    %14 = splat %n_cols : <32xint32>
    %15 = lt %9, %14 : <32xint1>
    %16 = constant {value=0.0} : float32
    %17 = constant {value=0.0} : <32xfloat32>
    %18 = load %13, %15, %17 {cache="", eviction="", has_other=True, masked=True} : <32xfloat32>
    %19 = add %acc, %18 : <32xfloat32>
    %20 = constant {value=1} : int32
    %21 = add %count, %20 : int32
    yield %19, %21
  } : <32xfloat32>, int32
  %22 = addptr %out_ptr, %0 : ptr<float32>
  %23 = reduce %5 {axis=0, kind="sum"} : float32
  %24 = cast %6 : float32
  %25 = div %23, %24 : float32
  store %22, %25 {cache="", eviction="", masked=False}
}
"""

GOLDEN_BRANCH = """\
kernel branch_kernel(%out_ptr: ptr<int32>, %n: int32) {
  %0 = program_id {axis=0} : int32
  %1 = lt %0, %n : int1
  %2 = if %1 {
  ^():
    %3 = constant {value=2} : int32
    %4 = mul %0, %3 : int32
    yield %4
  } {
  ^():
    yield %n
  } : int32
  %5 = constant {value=7} : int32
  %6 = maximum %2, %5 : int32
  %7 = addptr %out_ptr, %0 : ptr<int32>
  %8 = constant {value=2} : int32
  %9 = mod %0, %8 : int32
  %10 = constant {value=0} : int32
  %11 = eq %9, %10 : int1
  %12 = if %11 {
  ^():
    yield %6
  } {
  ^():
    yield %n
  } : int32
  store %7, %12 {cache="", eviction="", masked=False}
}
"""

GOLDEN_STRIDED_COPY = """\
kernel strided_copy_kernel(%x_ptr: ptr<float32>, %out_ptr: ptr<float32>, %n: int32) {
  %0 = constant {value=1} : int32
  %1 = arange {end=16, start=0} : <16xint32>
  %2 = splat %out_ptr : <16xptr<float32>>
  %3 = addptr %2, %1 : <16xptr<float32>>
  %4 = constant {value=1} : <16xint32>
  %5 = mul %1, %4 : <16xint32>
  %6 = splat %x_ptr : <16xptr<float32>>
  %7 = addptr %6, %5 : <16xptr<float32>>
  %8 = splat %n : <16xint32>
  %9 = lt %1, %8 : <16xint1>
  %10 = load %7, %9 {cache="", eviction="", has_other=False, masked=True} : <16xfloat32>
  %11 = splat %n : <16xint32>
  %12 = lt %1, %11 : <16xint1>
  store %3, %10, %12 {cache="", eviction="", masked=True}
}
"""

P = dsl.pointer_type


def test_elementwise_with_mask_and_mixed_precision():
    function = scale_kernel.ir(P(dsl.float16), P(dsl.float16), dsl.int32, dsl.float32, BLOCK=64)
    verify(function)
    assert print_function(function) == GOLDEN_SCALE


def test_for_loop_with_carried_block_and_scalar():
    function = row_sum_kernel.ir(P(dsl.float32), P(dsl.float32), dsl.int32, BLOCK=32)
    verify(function)
    assert print_function(function) == GOLDEN_ROW_SUM


def test_runtime_if_constexpr_if_and_inlined_helper():
    function = branch_kernel.ir(P(dsl.int32), dsl.int32, USE_MAX=True)
    verify(function)
    assert print_function(function) == GOLDEN_BRANCH


def test_int_equal_to_one_becomes_a_constant_and_divisibility_hints():
    x = torch.empty(64)
    function = strided_copy_kernel.ir(x, x, 1, 32, BLOCK=16)
    assert print_function(function) == GOLDEN_STRIDED_COPY
    assert function.arg_names == ["x_ptr", "out_ptr", "n"]
    # torch allocations are 16-byte aligned; n = 32 is divisible by 16 and positive (0 or -32 would not be)
    assert function.arg_hints == [{"divisibility": 16}] * 2 + [{"divisibility": 16, "positive": True}]
    assert strided_copy_kernel.ir(x, x, 1, 0, BLOCK=16).arg_hints[2] == {"divisibility": 16}
    assert strided_copy_kernel.ir(x, x, 1, -8, BLOCK=16).arg_hints[2] == {"divisibility": 8}
    assert strided_copy_kernel.ir(x, x, 1, 24, BLOCK=16).arg_hints[2] == {"divisibility": 8, "positive": True}
    odd = strided_copy_kernel.ir(x[1:], x, 2, 33, BLOCK=16)
    assert odd.arg_names == ["x_ptr", "out_ptr", "stride", "n"]
    assert odd.arg_hints == [{}, {"divisibility": 16}, {}, {}]
    unspecialized = dsl.jit(strided_copy_kernel.fn, do_not_specialize=["stride", "n"]).ir(x, x, 1, 32, BLOCK=16)
    assert unspecialized.arg_names == ["x_ptr", "out_ptr", "stride", "n"]
    assert unspecialized.arg_hints == [{"divisibility": 16}, {"divisibility": 16}, {}, {}]


def test_golden_kernels_compute_what_they_say():
    x = torch.arange(100, dtype=torch.float16)
    out = torch.full_like(x, float("nan"))
    scale_kernel[(2,)](x, out, 100, 0.5, BLOCK=64, interpret=True)
    torch.testing.assert_close(out, x * 0.5)

    rows = torch.arange(3 * 70, dtype=torch.float32).reshape(3, 70)
    means = torch.full((3,), float("nan"))
    row_sum_kernel[(3,)](rows, means, 70, BLOCK=32, interpret=True)
    torch.testing.assert_close(means, rows.sum(1) / 3)   # 70 columns: 3 iterations of 32

    values = torch.full((6,), -1, dtype=torch.int32)
    branch_kernel[(6,)](values, 4, USE_MAX=True, interpret=True)
    # even pids store max(2 * pid if pid < n else n, 7), odd pids store n = 4
    assert values.tolist() == [7, 4, 7, 4, 7, 4]
    values = torch.full((6,), -1, dtype=torch.int32)
    branch_kernel[(6,)](values, 4, USE_MAX=False, interpret=True)
    assert values.tolist() == [0, 4, 4, 4, 4, 4]
