"""`dsl.reduce` / `dsl.associative_scan` with a user `@dsl.jit` combine function
(fusedops/dsl/language/combine_reductions.py; Triton's `tl.reduce` / `tl.associative_scan`).

References are exact NumPy / Python computations on the same (masked, padded) block: integer sums, max, min,
xor equal the builtins bit for bit; non-commutative associative combines (2x2 integer matrix products with
int32 wrapping, "keep the first non-zero") check that operands are combined in index order; an argmax-style
(value, index) tuple with many ties checks the tie rule of its combine (the lowest index, as Triton's
`tl.argmax(tie_break_left=True)`). Outputs are poisoned before each launch. The PTX is assembled by ptxas for
sm_90a and sm_80 (no spills); the cuda-marked tests run the compiled kernels against the same references.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl import CompilationError
from fusedops.dsl.target import assemble, ptxas_available
from helpers import poison

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


# -- combine functions -----------------------------------------------------------------------------------------
@dsl.jit
def _add(a, b):
    return a + b


@dsl.jit
def _maximum(a, b):
    return dsl.maximum(a, b)


@dsl.jit
def _minimum(a, b):
    return dsl.minimum(a, b)


@dsl.jit
def _xor(a, b):
    return a ^ b


@dsl.jit
def _first_nonzero(a, b):
    return dsl.where(a != 0, a, b)


@dsl.jit
def _matmul2(a00, a01, a10, a11, b00, b01, b10, b11):
    return a00 * b00 + a01 * b10, a00 * b01 + a01 * b11, a10 * b00 + a11 * b10, a10 * b01 + a11 * b11


@dsl.jit
def _argmax_pair(v1, i1, v2, i2):
    take = (v2 > v1) | ((v2 == v1) & (i2 < i1))
    return dsl.where(take, v2, v1), dsl.where(take, i2, i1)


COMBINES = {"sum": _add, "max": _maximum, "min": _minimum, "xor": _xor, "first_nonzero": _first_nonzero}


# -- kernels ---------------------------------------------------------------------------------------------------
@dsl.jit
def _reduce_kernel(x_ptr, out_ptr, M, N, ROWS: dsl.constexpr, COLS: dsl.constexpr, AXIS: dsl.constexpr,
                   KEEP: dsl.constexpr, OTHER: dsl.constexpr, FN: dsl.constexpr):
    rows = dsl.arange(0, ROWS)[:, None]
    cols = dsl.arange(0, COLS)[None, :]
    x = dsl.load(x_ptr + rows * N + cols, mask=(rows < M) & (cols < N), other=OTHER)
    r = dsl.reduce(x, AXIS, FN, keep_dims=KEEP)
    if AXIS is None:
        dsl.store(out_ptr + dsl.arange(0, 1), dsl.reshape(r, 1) if KEEP else dsl.full((1,), 0, x.dtype) + r)
    elif AXIS == 0 or AXIS == -2:
        dsl.store(out_ptr + dsl.arange(0, COLS)[None, :] if KEEP else out_ptr + dsl.arange(0, COLS), r)
    else:
        dsl.store(out_ptr + dsl.arange(0, ROWS)[:, None] if KEEP else out_ptr + dsl.arange(0, ROWS), r)


@dsl.jit
def _reduce_1d_kernel(x_ptr, out_ptr, N, BLOCK: dsl.constexpr, KEEP: dsl.constexpr, FN: dsl.constexpr):
    offs = dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + offs, mask=offs < N, other=0)
    r = dsl.reduce(x, 0, FN, keep_dims=KEEP)
    if KEEP:
        dsl.store(out_ptr + dsl.arange(0, 1), r)
    else:
        dsl.store(out_ptr, r)


@dsl.jit
def _matrix_kernel(x_ptr, out_ptr, N, BLOCK: dsl.constexpr, SCAN: dsl.constexpr, REVERSE: dsl.constexpr):
    offs = dsl.arange(0, BLOCK)
    mask = offs < N
    a00 = dsl.load(x_ptr + 4 * offs, mask=mask, other=1)    # the identity matrix pads the tail
    a01 = dsl.load(x_ptr + 4 * offs + 1, mask=mask, other=0)
    a10 = dsl.load(x_ptr + 4 * offs + 2, mask=mask, other=0)
    a11 = dsl.load(x_ptr + 4 * offs + 3, mask=mask, other=1)
    if SCAN:
        c00, c01, c10, c11 = dsl.associative_scan((a00, a01, a10, a11), 0, _matmul2, reverse=REVERSE)
        dsl.store(out_ptr + 4 * offs, c00, mask=mask)
        dsl.store(out_ptr + 4 * offs + 1, c01, mask=mask)
        dsl.store(out_ptr + 4 * offs + 2, c10, mask=mask)
        dsl.store(out_ptr + 4 * offs + 3, c11, mask=mask)
    else:
        c00, c01, c10, c11 = dsl.reduce((a00, a01, a10, a11), 0, _matmul2)
        dsl.store(out_ptr, c00)
        dsl.store(out_ptr + 1, c01)
        dsl.store(out_ptr + 2, c10)
        dsl.store(out_ptr + 3, c11)


@dsl.jit
def _argmax_kernel(x_ptr, value_ptr, index_ptr, builtin_ptr, M, N, ROWS: dsl.constexpr, COLS: dsl.constexpr):
    rows = dsl.arange(0, ROWS)[:, None]
    cols = dsl.arange(0, COLS)[None, :]
    x = dsl.load(x_ptr + rows * N + cols, mask=(rows < M) & (cols < N), other=-100)
    idx = dsl.broadcast_to(cols, (ROWS, COLS))
    v, i = dsl.reduce((x, idx), 1, _argmax_pair)
    out = dsl.arange(0, ROWS)
    dsl.store(value_ptr + out, v)
    dsl.store(index_ptr + out, i)
    dsl.store(builtin_ptr + out, dsl.argmax(x, 1))


@dsl.jit
def _scan_kernel(x_ptr, out_ptr, M, N, ROWS: dsl.constexpr, COLS: dsl.constexpr, AXIS: dsl.constexpr,
                 REVERSE: dsl.constexpr, FN: dsl.constexpr):
    rows = dsl.arange(0, ROWS)[:, None]
    cols = dsl.arange(0, COLS)[None, :]
    x = dsl.load(x_ptr + rows * N + cols, mask=(rows < M) & (cols < N), other=0)
    dsl.store(out_ptr + rows * COLS + cols, dsl.associative_scan(x, AXIS, FN, reverse=REVERSE))


@dsl.jit
def _scan_argmax_kernel(x_ptr, value_ptr, index_ptr, N, BLOCK: dsl.constexpr):
    offs = dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + offs, mask=offs < N, other=-100)
    v, i = dsl.associative_scan((x, offs), 0, _argmax_pair)
    dsl.store(value_ptr + offs, v)
    dsl.store(index_ptr + offs, i)


@dsl.jit
def _float_kernel(x_ptr, out_ptr, scan_ptr, N, BLOCK: dsl.constexpr):
    offs = dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + offs, mask=offs < N, other=0.0)
    dsl.store(out_ptr, dsl.reduce(x, 0, _add))
    dsl.store(scan_ptr + offs, dsl.associative_scan(x, 0, _add))


@dsl.jit
def _half_kernel(x_ptr, max_ptr, scan_ptr, pair_ptr, N, BLOCK: dsl.constexpr):
    offs = dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + offs, mask=offs < N, other=float("-inf"))
    dsl.store(max_ptr, dsl.reduce(x, 0, _maximum))
    dsl.store(scan_ptr + offs, dsl.associative_scan(x, 0, _maximum, reverse=True))
    v, i = dsl.reduce((x, offs), 0, _argmax_pair)
    dsl.store(pair_ptr, i)
    dsl.store(max_ptr + 1, x.reduce(0, _maximum))                    # Triton's member-function forms
    dsl.store(scan_ptr + BLOCK + offs, x.associative_scan(axis=0, combine_fn=_maximum, reverse=True))


@dsl.jit
def _or(a, b):
    return a | b


@dsl.jit
def _wide_kernel(x_ptr, xor_ptr, any_ptr, N, BLOCK: dsl.constexpr):
    offs = dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + offs, mask=offs < N, other=0)          # int64
    dsl.store(xor_ptr, dsl.reduce(x, 0, _xor))
    seen = dsl.associative_scan(x > 0, 0, _or)                   # int1
    dsl.store(any_ptr + offs, seen.to(dsl.int8))


# -- references ------------------------------------------------------------------------------------------------
def _padded(x: np.ndarray, rows: int, cols: int, other) -> np.ndarray:
    out = np.full((rows, cols), other, dtype=x.dtype)
    out[:x.shape[0], :x.shape[1]] = x
    return out


def _fold(op: str, values):
    """Left fold of `values` (a sequence of int32 arrays or scalars) with the combine `op`, in index order."""
    result = values[0]
    for v in values[1:]:
        if op == "sum":
            result = (np.asarray(result, np.int64) + v).astype(np.int32)     # int32 wrapping
        elif op == "max":
            result = np.maximum(result, v)
        elif op == "min":
            result = np.minimum(result, v)
        elif op == "xor":
            result = result ^ v
        else:
            result = np.where(result != 0, result, v)
    return result


def _reduce_reference(block: np.ndarray, axis, op: str, keep: bool) -> np.ndarray:
    if axis is None:
        r = np.asarray(_fold(op, list(block.reshape(-1))))
        return r.reshape((1, 1) if keep else ())
    moved = np.moveaxis(block, axis, 0)
    r = _fold(op, list(moved))
    return np.expand_dims(r, axis) if keep else r


def _scan_reference(block: np.ndarray, axis: int, op: str, reverse: bool) -> np.ndarray:
    moved = np.moveaxis(block, axis, 0)
    if reverse:
        moved = moved[::-1]
    out, acc = [], None
    for v in moved:
        acc = v if acc is None else _fold(op, [acc, v])
        out.append(acc)
    out = np.stack(out)
    if reverse:
        out = out[::-1]
    return np.moveaxis(out, 0, axis)


def _wrap32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def _matmul_ref(a, b):
    return tuple(_wrap32(x) for x in (a[0] * b[0] + a[1] * b[2], a[0] * b[1] + a[1] * b[3],
                                      a[2] * b[0] + a[3] * b[2], a[2] * b[1] + a[3] * b[3]))


def _ints(shape, low, high, seed):
    return np.random.default_rng(seed).integers(low, high, size=shape).astype(np.int32)


def _launch(kernel, *args, device="cpu", **constexprs):
    kernel[(1,)](*args, interpret=device == "cpu", **constexprs)


# -- reduce ----------------------------------------------------------------------------------------------------
def _run_reduce(op, m, n, rows, cols, axis, keep, seed, device="cpu"):
    low, high = (-3, 4) if op == "first_nonzero" else (-2**31, 2**31 - 1)
    x = _ints((m, n), low, high, seed)
    other = {"max": -2**31, "min": 2**31 - 1}.get(op, 0)
    block = _padded(x, rows, cols, other)
    expected = _reduce_reference(block, axis, op, keep)
    size = 1 if axis is None else (cols if axis in (0, -2) else rows)
    out = poison(torch.empty(size, dtype=torch.int32, device=device))
    _launch(_reduce_kernel, torch.from_numpy(x).to(device), out, m, n, ROWS=rows, COLS=cols, AXIS=axis, KEEP=keep,
            OTHER=other, FN=COMBINES[op], device=device)
    return out.cpu().numpy(), expected.reshape(-1), block


@pytest.mark.parametrize("op", ["sum", "max", "min", "xor", "first_nonzero"])
@pytest.mark.parametrize("axis, keep", [(0, False), (1, True), (-1, False), (None, False), (None, True)])
def test_reduce_2d_matches_the_exact_reference(op, axis, keep):
    got, expected, block = _run_reduce(op, 5, 7, 8, 8, axis, keep, seed=zlib.crc32(repr((op, axis, keep)).encode()))
    np.testing.assert_array_equal(got, expected)
    builtin = {"sum": lambda b, a: b.sum(axis=a, dtype=np.int64).astype(np.int32), "max": np.max, "min": np.min,
               "xor": lambda b, a: np.bitwise_xor.reduce(b, axis=a)}.get(op)
    if builtin is not None:   # the same bits as dsl.sum / max / min / xor_sum compute (wrapping int32)
        np.testing.assert_array_equal(got, np.asarray(builtin(block, axis)).reshape(-1))


@pytest.mark.parametrize("rows, cols, axis", [(1, 8, 0), (8, 1, 1), (1, 1, None), (2, 4, 0)])
def test_reduce_size_one_and_small_dims(rows, cols, axis):
    got, expected, _ = _run_reduce("first_nonzero", rows, cols, rows, cols, axis, False, seed=rows * 10 + cols)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("n, block, keep", [(13, 16, False), (1, 1, True), (3, 4, False), (16, 16, True)])
def test_reduce_1d_to_a_scalar_or_keep_dims(n, block, keep):
    x = _ints(n, -3, 4, n)
    out = poison(torch.empty(1, dtype=torch.int32))
    _launch(_reduce_1d_kernel, torch.from_numpy(x), out, n, BLOCK=block, KEEP=keep, FN=_first_nonzero)
    nonzero = x[x != 0]
    assert out.item() == (nonzero[0] if nonzero.size else 0)


@pytest.mark.parametrize("n, block", [(11, 16), (16, 16), (1, 2)])
def test_reduce_tuple_of_matrices_keeps_the_order(n, block):
    x = _ints((n, 4), 0, 4, n)
    out = poison(torch.empty(4, dtype=torch.int32))
    _launch(_matrix_kernel, torch.from_numpy(x.reshape(-1)), out, n, BLOCK=block, SCAN=False, REVERSE=False)
    expected = (1, 0, 0, 1)
    for row in x.tolist():
        expected = _matmul_ref(expected, row)
    assert out.tolist() == list(expected)


def test_reduce_argmax_pairs_take_the_lowest_index_on_ties():
    m, n, rows, cols = 6, 13, 8, 16
    x = _ints((m, n), 0, 3, 7)          # many ties
    value, index, builtin = (poison(torch.empty(rows, dtype=torch.int32)) for _ in range(3))
    _launch(_argmax_kernel, torch.from_numpy(x), value, index, builtin, m, n, ROWS=rows, COLS=cols)
    block = _padded(x, rows, cols, -100)
    np.testing.assert_array_equal(value.numpy(), block.max(axis=1))
    np.testing.assert_array_equal(index.numpy(), block.argmax(axis=1))     # NumPy: the first maximum
    np.testing.assert_array_equal(index.numpy(), builtin.numpy())


def test_reduce_float_sum_is_pairwise_and_close():
    n, block = 100, 128
    x = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    out, scan = poison(torch.empty(1)), poison(torch.empty(block))
    _launch(_float_kernel, torch.from_numpy(x), out, scan, n, BLOCK=block)
    padded = np.zeros(block, np.float32)
    padded[:n] = x
    pairwise = padded.copy()
    while pairwise.size > 1:                      # the documented tree: neighbours first
        pairwise = pairwise[0::2] + pairwise[1::2]
    assert out.item() == pairwise[0]
    np.testing.assert_allclose(scan.numpy(), np.cumsum(padded.astype(np.float64)), rtol=0, atol=1e-4)


def test_float16_values_move_bit_exactly():
    n, block = 27, 32
    x = torch.from_numpy(np.random.default_rng(8).standard_normal(n).astype(np.float16))
    top, scan, index = poison(torch.empty(2, dtype=torch.float16)), \
        poison(torch.empty(2 * block, dtype=torch.float16)), poison(torch.empty(1, dtype=torch.int32))
    _launch(_half_kernel, x, top, scan, index, n, BLOCK=block)
    padded = np.full(block, -np.inf, np.float16)
    padded[:n] = x.numpy()
    assert top.tolist() == [padded.max()] * 2 and index.item() == int(padded.argmax())
    np.testing.assert_array_equal(scan.numpy(), np.tile(np.maximum.accumulate(padded[::-1])[::-1], 2))


def test_int64_and_bool_blocks():
    n, block = 21, 32
    x = np.random.default_rng(6).integers(-2**63, 2**63 - 1, size=n, dtype=np.int64)
    x[:9] = -np.abs(x[:9]) - 1                                   # the first positive value comes late
    xor, seen = poison(torch.empty(1, dtype=torch.int64)), poison(torch.empty(block, dtype=torch.int8))
    _launch(_wide_kernel, torch.from_numpy(x), xor, seen, n, BLOCK=block)
    assert xor.item() == int(np.bitwise_xor.reduce(x))
    padded = np.zeros(block, np.int64)
    padded[:n] = x
    np.testing.assert_array_equal(seen.numpy(), np.logical_or.accumulate(padded > 0).astype(np.int8))


# -- scan ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["sum", "max", "xor", "first_nonzero"])
@pytest.mark.parametrize("axis, reverse", [(0, False), (1, False), (1, True), (-2, True)])
def test_scan_2d_matches_the_exact_reference(op, axis, reverse):
    m, n, rows, cols = 3, 7, 4, 8
    low, high = (-2, 3) if op == "first_nonzero" else (-2**31, 2**31 - 1)
    x = _ints((m, n), low, high, 11)
    out = poison(torch.empty(rows * cols, dtype=torch.int32))
    _launch(_scan_kernel, torch.from_numpy(x), out, m, n, ROWS=rows, COLS=cols, AXIS=axis, REVERSE=reverse,
            FN=COMBINES[op])
    expected = _scan_reference(_padded(x, rows, cols, 0), axis, op, reverse)
    np.testing.assert_array_equal(out.numpy().reshape(rows, cols), expected)


@pytest.mark.parametrize("rows, cols, axis", [(1, 8, 0), (8, 1, 1), (1, 1, 0), (2, 1, 0)])
def test_scan_size_one_dims(rows, cols, axis):
    x = _ints((rows, cols), -2, 3, rows + cols)
    out = poison(torch.empty(rows * cols, dtype=torch.int32))
    _launch(_scan_kernel, torch.from_numpy(x), out, rows, cols, ROWS=rows, COLS=cols, AXIS=axis, REVERSE=False,
            FN=_first_nonzero)
    np.testing.assert_array_equal(out.numpy().reshape(rows, cols), _scan_reference(x, axis, "first_nonzero", False))


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_of_matrices_keeps_the_order(reverse):
    n, block = 13, 16
    x = _ints((n, 4), 0, 4, 5)
    out = poison(torch.empty(4 * n, dtype=torch.int32))
    _launch(_matrix_kernel, torch.from_numpy(x.reshape(-1)), out, n, BLOCK=block, SCAN=True, REVERSE=reverse)
    rows = x.tolist()
    expected = []
    for i in range(n):
        acc = (1, 0, 0, 1)
        part = rows[i:][::-1] if reverse else rows[:i + 1]   # reverse: x[N-1] (+) ... (+) x[i], identity-padded
        for row in part:
            acc = _matmul_ref(acc, row)
        expected.append(acc)
    np.testing.assert_array_equal(out.numpy().reshape(n, 4), np.array(expected, dtype=np.int32))


def test_scan_running_argmax_pairs():
    n, block = 29, 32
    x = _ints(n, 0, 4, 9)
    value, index = poison(torch.empty(block, dtype=torch.int32)), poison(torch.empty(block, dtype=torch.int32))
    _launch(_scan_argmax_kernel, torch.from_numpy(x), value, index, n, BLOCK=block)
    padded = np.full(block, -100, np.int32)
    padded[:n] = x
    np.testing.assert_array_equal(value.numpy(), np.maximum.accumulate(padded))
    np.testing.assert_array_equal(index.numpy(), [int(np.argmax(padded[:i + 1])) for i in range(block)])


# -- errors ----------------------------------------------------------------------------------------------------
def _plain_python(a, b):
    return a + b


@dsl.jit
def _two_results(a, b):
    return a + b, a - b


@dsl.jit
def _average(a, b):
    return (a + b) * 0.5


@dsl.jit
def _error_kernel(x_ptr, CASE: dsl.constexpr):
    x = dsl.load(x_ptr + dsl.arange(0, 8))
    if CASE == "not_jit":
        dsl.reduce(x, 0, _plain_python)
    elif CASE == "results":
        dsl.reduce(x, 0, _two_results)
    elif CASE == "tuple_args":
        dsl.associative_scan((x, x), 0, _add)
    elif CASE == "axis":
        dsl.reduce(x, 1, _add)
    elif CASE == "scan_axis_none":
        dsl.associative_scan(x, None, _add)
    elif CASE == "dtype":
        dsl.associative_scan(x.to(dsl.int32), 0, _average)
    elif CASE == "scalar":
        dsl.reduce(dsl.sum(x), 0, _add)
    else:
        dsl.reduce((x, dsl.reshape(x, 2, 4)), 0, _add)


@pytest.mark.parametrize("case, message", [
    ("not_jit", "combine_fn must be a @dsl.jit function"),
    ("results", "combine_fn must return 1 value (one per input block), got 2"),
    ("tuple_args", "combine_fn `_add` must take 4 arguments (the 2 left operands, then the 2 right ones)"),
    ("axis", "axis 1 is out of range for a block of shape (8,)"),
    ("scan_axis_none", "axis must be a constexpr int, got None"),
    ("dtype", "combine_fn must keep each block's dtype (int32), got float32"),
    ("scalar", "input must be a block, got a scalar"),
    ("shapes", "the input blocks must have one shape"),
])
def test_bad_arguments_are_clear_errors(case, message):
    with pytest.raises(CompilationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _error_kernel[(1,)](torch.zeros(8), CASE=case, interpret=True)


# -- PTX -------------------------------------------------------------------------------------------------------
@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_ptx_assembles_without_spills(arch):
    i32 = dsl.pointer_type(dsl.int32)
    kernels = [
        _reduce_kernel.compile(i32, i32, 5, 7, ROWS=8, COLS=16, AXIS=1, KEEP=False, OTHER=0, FN=_first_nonzero,
                               target=arch),
        _argmax_kernel.compile(i32, i32, i32, i32, 6, 13, ROWS=8, COLS=16, target=arch),
        _matrix_kernel.compile(i32, i32, 13, BLOCK=16, SCAN=True, REVERSE=False, target=arch),
        _scan_kernel.compile(i32, i32, 3, 7, ROWS=4, COLS=8, AXIS=1, REVERSE=True, FN=_add, target=arch),
        _wide_kernel.compile(dsl.pointer_type(dsl.int64), dsl.pointer_type(dsl.int64), dsl.pointer_type(dsl.int8),
                             21, BLOCK=32, target=arch),
        _half_kernel.compile(dsl.pointer_type(dsl.float16), dsl.pointer_type(dsl.float16),
                             dsl.pointer_type(dsl.float16), i32, 27, BLOCK=32, target=arch),
    ]
    for kernel in kernels:
        ptx = kernel.asm["ptx"]
        assert assemble(ptx, arch).spill_bytes == 0


# -- on the GPU: the same references ---------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("op, axis, keep", [("sum", 0, False), ("first_nonzero", 1, True), ("xor", None, False)])
def test_gpu_reduce_matches_the_reference(op, axis, keep):
    got, expected, _ = _run_reduce(op, 5, 7, 8, 16, axis, keep, seed=5, device="cuda")
    np.testing.assert_array_equal(got, expected)


@pytest.mark.cuda
@pytest.mark.parametrize("reverse", [False, True])
def test_gpu_scan_and_tuples_match_the_interpreter(reverse):
    n, block = 13, 16
    x = torch.from_numpy(_ints((n, 4), 0, 4, 5).reshape(-1))
    results = []
    for device in ("cpu", "cuda"):
        out = poison(torch.empty(4 * n, dtype=torch.int32, device=device))
        _launch(_matrix_kernel, x.to(device), out, n, BLOCK=block, SCAN=True, REVERSE=reverse, device=device)
        results.append(out.cpu())
    assert torch.equal(results[0], results[1])
    m, cols = 3, 8
    y = torch.from_numpy(_ints((m, 7), -2**31, 2**31 - 1, 2))
    out = poison(torch.empty(4 * cols, dtype=torch.int32, device="cuda"))
    _launch(_scan_kernel, y.cuda(), out, m, 7, ROWS=4, COLS=cols, AXIS=1, REVERSE=reverse, FN=_add, device="cuda")
    expected = _scan_reference(_padded(y.numpy(), 4, cols, 0), 1, "sum", reverse)
    np.testing.assert_array_equal(out.cpu().numpy().reshape(4, cols), expected)


@pytest.mark.cuda
def test_gpu_argmax_pairs_match_the_reference():
    m, n, rows, cols = 6, 13, 8, 16
    x = _ints((m, n), 0, 3, 7)
    value, index, builtin = (poison(torch.empty(rows, dtype=torch.int32, device="cuda")) for _ in range(3))
    _launch(_argmax_kernel, torch.from_numpy(x).cuda(), value, index, builtin, m, n, ROWS=rows, COLS=cols,
            device="cuda")
    block = _padded(x, rows, cols, -100)
    np.testing.assert_array_equal(value.cpu().numpy(), block.max(axis=1))
    np.testing.assert_array_equal(index.cpu().numpy(), block.argmax(axis=1))


@pytest.mark.cuda
def test_gpu_float16_values_match_the_interpreter_bit_for_bit():
    n, block = 27, 32
    x = torch.from_numpy(np.random.default_rng(4).standard_normal(n).astype(np.float16))
    results = []
    for device in ("cpu", "cuda"):
        outs = (poison(torch.empty(2, dtype=torch.float16, device=device)),
                poison(torch.empty(2 * block, dtype=torch.float16, device=device)),
                poison(torch.empty(1, dtype=torch.int32, device=device)))
        _launch(_half_kernel, x.to(device), *outs, n, BLOCK=block, device=device)
        results.append([o.cpu() for o in outs])
    for interpreted, compiled in zip(*results):
        assert torch.equal(interpreted, compiled)
    assert results[0][0].tolist() == [x.max().item()] * 2
