"""Review (session 30): a demanding user tried to break fusedops.rms_norm / fusedops.nn.RMSNorm (forward and
backward) on the rows whose forward changed in commit e1690e1: 16-bit (fp16 / bf16) rows of 514..4097 columns that
are not a multiple of 8 (rows starting off 16-byte boundaries) now take the *persistent* split-window forward
(norm_split_window.forward_split_persistent_kernel: programs_per_sm > 0, prefetch=True; weight gathered once per
program, which walks the rows p, p + G, ... with G rounded up to a multiple of 8 by the launcher), where the 1024
and 4096 blocks took one program per row before. LayerNorm runs on the same rows for comparison.

Everything runs in the CPU interpreter (FUSEDOPS_INTERPRET=1, or interpret=True at the launchers) against torch in
float64 computed from the same 16-bit inputs, with the tolerances of tests/test_norms.py and
tests/test_split_window_norms.py (helpers.assert_close). The launchers' `_sm_count` is monkeypatched to 1-5 "SMs"
(the launch caches emptied first) so that small grids walk many rows per program on the CPU; a spy on the persistent
kernel's `prepare` checks that the defaults really take it (and the grid it gets). Outputs of the direct launchers
are poisoned (NaN) through their `allocate=` hook so that an element no program writes is caught.

Covered: N in {514, 515, 777, 1023, 1025, 1031, 2047, 2049, 3001, 4095, 4097} x rows {1, 2, 7, 8, 9, 15, 17, 33}
(public function with autograd, weight or not, fp16 / bf16); more rows than programs (1 and 2 SMs, 65-133 rows,
prefetch or not); explicit ForwardConfigs with programs_per_sm 1..8 on 1, 3 and 5 SMs and 1-, 2- and 4-row tiles
(the grid, every output, and bitwise independence of the grid); non-contiguous x (row-strided, transposed,
expanded, column slices), storage offsets (x = big[1:], odd element offsets), 3-D inputs and size-1 dims of odd
stride; a launch cache hit at another storage offset; multi-dim normalized_shape with a transposed weight, float32
weight of fp16 rows; eps tiny / huge (rounded to float32 as documented), all-zero rows, huge and tiny bf16 rows,
NaN / +-inf in one row (nothing leaks into other rows, including the row the same program walks next); empty
inputs; the nn modules; a backward with a dy laid out outside the window.

Result: no defect found in the changed path. Two accumulation-range limits are pinned as torch's own behaviour
(not defects; torch's CPU kernels accumulate 16-bit rows in float32 the same way): an RMSNorm bf16 row whose squares
overflow float32 (|x| ~ 1e20) normalizes to zeros, as torch.nn.functional.rms_norm on the same bf16 tensor does;
eps past float32's range becomes inf (y = 0), as documented in norm_forward_launcher.forward_launcher.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.nn
from fusedops.autograd import norms as autograd_norms
from fusedops.dsl.runtime.bounded_cache import BoundedCache
from fusedops.kernels import norm_split_window as W
from fusedops.kernels import norm_backward_launcher
from fusedops.kernels import norm_forward_config
from fusedops.kernels import norm_forward_launcher
from fusedops.kernels import norms
from helpers import assert_close, poison, random_tensor

HALF = [torch.float16, torch.bfloat16]
ALL_N = [514, 515, 777, 1023, 1025, 1031, 2047, 2049, 3001, 4095, 4097]
ROWS = [1, 2, 7, 8, 9, 15, 17, 33]


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")


def _poisoned(shape, dtype, device):
    return poison(torch.empty(shape, dtype=dtype, device=device))


def _fresh_caches(monkeypatch):
    monkeypatch.setattr(norms, "_FORWARD_LAUNCHES", BoundedCache(1024))
    monkeypatch.setattr(norms, "_BACKWARD_LAUNCHES", BoundedCache(1024))
    monkeypatch.setattr(autograd_norms, "_KNOWN_LAUNCHES", BoundedCache(1024))


@pytest.fixture
def sms(monkeypatch):
    """set(count): the interpreter plans persistent grids for `count` SMs (fresh launch caches)."""
    def set_count(count):
        _fresh_caches(monkeypatch)
        monkeypatch.setattr(norm_forward_launcher, "_sm_count", lambda device: count)
        monkeypatch.setattr(norm_backward_launcher, "_sm_count", lambda device: count)
    return set_count


@pytest.fixture
def grids(monkeypatch):
    """The grids (and PREFETCH) forward_split_persistent_kernel was prepared with, in order."""
    seen = []
    original = W.forward_split_persistent_kernel.prepare

    def spy(grid, *args, **kwargs):
        seen.append((grid, kwargs.get("PREFETCH"), kwargs.get("BLOCK_ROWS")))
        return original(grid, *args, **kwargs)

    monkeypatch.setattr(W.forward_split_persistent_kernel, "prepare", spy)
    return seen


def _reference(x, w, b, eps, dy, subtract_mean):
    """(y, dx, dweight, dbias) of torch in float64 from the same values."""
    leaves = [None if t is None else t.detach().double().requires_grad_() for t in (x, w, b)]
    n = x.shape[-1]
    if subtract_mean:
        y = F.layer_norm(leaves[0], (n,), leaves[1], leaves[2], eps)
    else:
        y = F.rms_norm(leaves[0], (n,), leaves[1], eps)
    y.backward(dy.double())
    return (y.detach(),) + tuple(None if t is None else t.grad for t in leaves)


def _public(x, w, b, eps, dy, subtract_mean):
    """(y, dx, dweight, dbias) of the public functions with autograd."""
    xr = x.detach().requires_grad_()
    wr = None if w is None else w.detach().clone().requires_grad_()
    br = None if b is None else b.detach().clone().requires_grad_()
    n = x.shape[-1]
    y = fusedops.layer_norm(xr, (n,), wr, br, eps) if subtract_mean else fusedops.rms_norm(xr, (n,), wr, eps)
    y.backward(dy)
    return y.detach(), xr.grad, None if wr is None else wr.grad, None if br is None else br.grad


def _compare(actual, expected, dtype, rows=None):
    for name, a, e in zip(("y", "dx", "dweight", "dbias"), actual, expected):
        assert (a is None) == (e is None), name
        if a is None:
            continue
        assert a.dtype == dtype and a.shape == e.shape, name
        if rows is not None and name in ("y", "dx"):
            a, e = a[rows], e[rows]
        assert_close(a, e, dtype)


def _inputs(shape, dtype, seed, weight=True, bias=False, offset=0.0):
    n = shape[-1]
    x = random_tensor(shape, dtype, "cpu", seed) * 2 + offset
    w = random_tensor((n,), dtype, "cpu", seed + 1, scale=0.5) + 1 if weight else None
    b = random_tensor((n,), dtype, "cpu", seed + 2) if bias else None
    dy = random_tensor(shape, dtype, "cpu", seed + 3)
    return x, w, b, dy


def _launchers(x, w, b, eps, dy, subtract_mean, forward_config=None):
    """(y, dx, dweight, dbias, rstd) of norm_forward / norm_backward with every output poisoned."""
    y, mean, rstd = norms.norm_forward(x, w, b, eps, subtract_mean=subtract_mean, config=forward_config,
                                       interpret=True, allocate=_poisoned)
    dx, dw, db = norms.norm_backward(dy, x, w, mean, rstd, subtract_mean=subtract_mean, input_grad=True,
                                     weight_grad=w is not None, bias_grad=b is not None, bias_dtype=x.dtype,
                                     interpret=True, allocate=_poisoned)
    return y, dx, dw, db, rstd


# -- the defaults ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
def test_defaults_take_the_persistent_split_forward_for_rms_norm(dtype):
    for n in ALL_N:
        config = norm_forward_config.forward_config(n, dtype, subtract_mean=False)
        assert config.split_window and config.programs_per_sm > 0 and config.prefetch, n
        assert config.block_n == 1 << (n - 2).bit_length() >= n - 1, n
        assert config.block_rows == 1 and config.output_chunks == 1, n
        assert norm_forward_config.forward_config(n, dtype, subtract_mean=True).split_window, n
    for n in (513, 1024, 2048, 4096, 4098, 4105):       # aligned rows, or past the 4096 main tile
        config = norm_forward_config.forward_config(n, dtype, subtract_mean=False)
        # (odd rows past 4097 columns: the staged window's tiles, tests/test_norm_split_staged.py)
        assert not config.split_window or config.staged_affine, n


# -- every N x every row count through the public function (1 SM: 8 programs walk the rows) ----------------
@pytest.mark.parametrize("n", ALL_N)
def test_rms_norm_every_row_count(interpret, sms, grids, n, seed):
    sms(1)
    for i, m in enumerate(ROWS):
        dtype = HALF[(i + n) % 2]
        weight = (i + n) % 3 != 0
        x, w, _, dy = _inputs((m, n), dtype, seed + 10 * i, weight)
        grids.clear()
        actual = _public(x, w, None, 1e-5, dy, False)
        # the persistent kernel ran, on min(rows, 1 SM * programs_per_sm) programs rounded up to 8
        per_sm = norm_forward_config.forward_config(n, dtype, subtract_mean=False).programs_per_sm
        assert [g[0] for g in grids] == [(-(-min(m, per_sm) // 8) * 8,)], (m, grids)
        _compare(actual, _reference(x, w, None, 1e-5, dy, False), dtype)


@pytest.mark.parametrize("n", ALL_N)
def test_layer_norm_same_rows_for_comparison(interpret, sms, n, seed):
    sms(1)
    for i, m in enumerate((1, 9, 17)):
        dtype = HALF[(i + n + 1) % 2]
        x, w, b, dy = _inputs((m, n), dtype, seed + 10 * i, True, i != 1, offset=0.75)
        _compare(_public(x, w, b, 1e-5, dy, True), _reference(x, w, b, 1e-5, dy, True), dtype)


# -- more rows than programs, poisoned outputs, both ops ---------------------------------------------------
@pytest.mark.parametrize("subtract_mean", [False, True], ids=["rms_norm", "layer_norm"])
@pytest.mark.parametrize("count, n, m", [(1, 515, 133), (2, 1031, 65), (1, 2047, 41), (2, 4097, 37)])
@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "no-prefetch"])
def test_many_rows_per_program_poisoned(sms, grids, subtract_mean, count, n, m, prefetch, seed):
    sms(count)
    dtype = HALF[n % 2]
    config = dataclasses.replace(norm_forward_config.forward_config(n, dtype, subtract_mean=subtract_mean),
                                 prefetch=prefetch)
    x, w, b, dy = _inputs((m, n), dtype, seed, True, subtract_mean, offset=0.5 if subtract_mean else 0.0)
    *actual, rstd = _launchers(x, w, b, 1e-5, dy, subtract_mean, config)
    assert grids[0][0][0] == -(-min(m, count * config.programs_per_sm) // 8) * 8 < m
    _compare(actual, _reference(x, w, b, 1e-5, dy, subtract_mean), dtype)
    x64 = x.double()
    variance = x64.var(-1, unbiased=False) if subtract_mean else x64.pow(2).mean(-1)
    assert_close(rstd, torch.rsqrt(variance + 1e-5), torch.float32)


# -- explicit programs_per_sm ----------------------------------------------------------------------------------
@pytest.mark.parametrize("count", [1, 3, 5])
def test_explicit_programs_per_sm(sms, grids, count, seed):
    sms(count)
    n, m = 1031, 29
    for dtype in HALF:
        x, w, _, _ = _inputs((m, n), dtype, seed + (dtype == torch.bfloat16))
        base = norm_forward_config.forward_config(n, dtype, subtract_mean=False)
        reference = F.rms_norm(x.double(), (n,), w.double(), 1e-5)
        first = None
        for per_sm in range(1, 9):
            for block_rows in (1, 2, 4):
                config = dataclasses.replace(base, programs_per_sm=per_sm, block_rows=block_rows,
                                             prefetch=per_sm % 2 == 1)
                grids.clear()
                y, mean, rstd = norms.norm_forward(x, w, None, 1e-5, subtract_mean=False, config=config,
                                                   interpret=True, allocate=_poisoned)
                tiles = -(-m // block_rows)
                assert grids == [((-(-min(tiles, count * per_sm) // 8) * 8,), per_sm % 2 == 1, block_rows)]
                assert mean is None
                assert_close(y, reference, dtype)
                if block_rows == 1:     # the same kernel on any grid: every row's arithmetic is the same
                    if first is None:
                        first = (y, rstd)
                    assert torch.equal(y, first[0]) and torch.equal(rstd, first[1]), (per_sm, count)


def test_persistent_matches_one_program_per_row(seed):
    # the persistent programs (weight gathered once) against the per-row kernel (weight gathered per row)
    for n, dtype in ((777, torch.float16), (3001, torch.bfloat16)):
        x, w, _, _ = _inputs((19, n), dtype, seed + n)
        base = norm_forward_config.forward_config(n, dtype, subtract_mean=False)
        persistent = norms.norm_forward(x, w, None, 1e-5, subtract_mean=False, config=base, interpret=True)
        for chunks in (1, 4):
            per_row = norms.norm_forward(
                x, w, None, 1e-5, subtract_mean=False, interpret=True,
                config=dataclasses.replace(base, programs_per_sm=0, output_chunks=chunks))
            assert_close(persistent[0], per_row[0].double(), dtype)
            assert_close(persistent[2], per_row[2].double(), torch.float32)


# -- layouts -------------------------------------------------------------------------------------------------
def _layouts(n, dtype, seed):
    """(name, x, whether the split window applies in place or after as_rows' copy)."""
    big = random_tensor((10, n), dtype, "cpu", seed)
    flat = random_tensor((9 * n + 8,), dtype, "cpu", seed + 1)
    wide = random_tensor((9, n + 3), dtype, "cpu", seed + 2)
    tall = random_tensor((n, 9), dtype, "cpu", seed + 3)
    base = random_tensor((9 * n,), dtype, "cpu", seed + 4)
    cube = random_tensor((3, 6, n), dtype, "cpu", seed + 5)
    one = random_tensor((1, n + 5), dtype, "cpu", seed + 6)
    yield "big[1:]", big[1:], True
    for offset in (1, 3, 7):
        yield f"offset {offset}", flat[offset:offset + 9 * n].view(9, n), True
    yield "column slice", wide[:, :n], False
    yield "column slice at 3", wide[:, 3:], False
    yield "transposed", tall.t(), False
    yield "expanded", random_tensor((1, n), dtype, "cpu", seed + 7).expand(9, n), False
    yield "every other row", random_tensor((18, n), dtype, "cpu", seed + 8)[::2], False
    yield "3-D", cube[:, :5], True               # rows not of one stride: copied, then the window
    yield "3-D permuted", cube.transpose(0, 1), True
    yield "size-1 dim of odd stride", base.as_strided((9, 1, n), (n, 7, 1)), True
    yield "size-1 leading dim of odd stride", base.as_strided((1, 9, n), (5, n, 1)), True
    yield "one row at offset 2", one[:, 2:2 + n], True


@pytest.mark.parametrize("n, dtype", [(515, torch.bfloat16), (2049, torch.float16), (4095, torch.bfloat16)])
def test_layouts(interpret, sms, grids, n, dtype, seed):
    w = random_tensor((n,), dtype, "cpu", seed + 20, scale=0.5) + 1
    for name, x, window in _layouts(n, dtype, seed):
        sms(2)
        grids.clear()
        dy = random_tensor(x.shape, dtype, "cpu", seed + 21)
        actual = _public(x, w, None, 1e-5, dy, False)
        assert bool(grids) == window, name
        assert actual[0].is_contiguous() and actual[1].shape == x.shape, name
        _compare(actual, _reference(x, w, None, 1e-5, dy, False), dtype)


def test_cached_launch_at_another_storage_offset(interpret, sms, seed):
    # one layout (shape, strides), three storage offsets: the second and third calls reuse the first's launch
    sms(1)
    n, dtype = 1023, torch.float16
    flat = random_tensor((11 * n + 8,), dtype, "cpu", seed)
    w = random_tensor((n,), dtype, "cpu", seed + 1) + 1
    for offset in (0, 5, 2):
        x = flat[offset:offset + 11 * n].view(11, n)
        dy = random_tensor(x.shape, dtype, "cpu", seed + offset)
        _compare(_public(x, w, None, 1e-5, dy, False), _reference(x, w, None, 1e-5, dy, False), dtype)


def test_backward_with_dy_outside_the_window(interpret, sms, seed):
    sms(1)
    n, dtype = 2047, torch.bfloat16
    x, w, _, _ = _inputs((9, n), dtype, seed)
    for dy in (random_tensor((n, 9), dtype, "cpu", seed + 5).t(),
               random_tensor((1, n), dtype, "cpu", seed + 6).expand(9, n)):
        _compare(_public(x, w, None, 1e-5, dy, False), _reference(x, w, None, 1e-5, dy, False), dtype)


def test_multi_dim_shape_transposed_weight_and_float32_weight(interpret, sms, seed):
    sms(1)
    x = random_tensor((2, 5, 3, 343), torch.bfloat16, "cpu", seed).requires_grad_()    # 1029 columns
    w = (random_tensor((343, 3), torch.bfloat16, "cpu", seed + 1) + 1).t().requires_grad_()
    dy = random_tensor(x.shape, torch.bfloat16, "cpu", seed + 2)
    fusedops.rms_norm(x, (3, 343), w, 1e-5).backward(dy)
    xd, wd = (t.detach().double().requires_grad_() for t in (x, w))
    reference = F.rms_norm(xd, (3, 343), wd, 1e-5)
    reference.backward(dy.double())
    assert_close(x.grad, xd.grad, torch.bfloat16)
    assert_close(w.grad, wd.grad, torch.bfloat16)
    # a float32 weight of fp16 rows: y in fp16, dweight in float32
    x, _, _, dy = _inputs((9, 1031), torch.float16, seed + 3)
    w = random_tensor((1031,), torch.float32, "cpu", seed + 4) + 1
    actual = _public(x, w, None, None, dy, False)
    expected = _reference(x, w, None, torch.finfo(torch.float32).eps, dy, False)
    assert actual[0].dtype == torch.float16 and actual[2].dtype == torch.float32
    for a, e in zip(actual[:3], expected[:3]):
        assert_close(a, e, torch.float16)


def test_empty_inputs(interpret):
    for shape in ((0, 1025), (3, 0, 2049)):
        x = torch.empty(shape, dtype=torch.float16).requires_grad_()
        w = torch.ones(shape[-1], dtype=torch.float16, requires_grad=True)
        y = fusedops.rms_norm(x, (shape[-1],), w)
        assert y.shape == x.shape
        y.sum().backward()
        assert x.grad.shape == x.shape and torch.equal(w.grad, torch.zeros_like(w))


# -- values ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("eps", [1e-45, 1e-12, 1e-5, 1e3, 1e30, 1e39])
def test_eps_tiny_and_huge_with_zero_rows(interpret, sms, eps, seed):
    # eps is rounded to float32 (documented): 1e-45 is float32's smallest subnormal, 1e39 becomes inf (y = 0).
    sms(1)
    n, dtype = 3001, torch.bfloat16
    x, w, _, dy = _inputs((17, n), dtype, seed)
    x[4] = 0
    x[12] = 0                       # 4 and 12: rows of one program (8 programs)
    with np.errstate(over="ignore", under="ignore"):
        eps32 = float(np.float32(eps))
    y, dx, dw, _, rstd = _launchers(x, w, None, eps, dy, False)
    assert torch.equal(y[[4, 12]], torch.zeros_like(y[[4, 12]]))
    if eps32 == float("inf"):
        assert torch.equal(rstd, torch.zeros_like(rstd)) and torch.equal(y, torch.zeros_like(y))
        assert not torch.isnan(dx).any()
        return
    assert_close(rstd, torch.rsqrt(x.double().pow(2).mean(-1) + eps32), torch.float32)
    _compare((y, dx, dw, None), _reference(x, w, None, eps32, dy, False), dtype)


def test_all_zero_input_default_eps(interpret, sms, seed):
    sms(2)
    for n, dtype in ((1025, torch.float16), (4097, torch.bfloat16)):
        x = torch.zeros((9, n), dtype=dtype)
        w = random_tensor((n,), dtype, "cpu", seed, scale=0.5) + 1
        dy = random_tensor((9, n), dtype, "cpu", seed + 1)
        actual = _public(x, w, None, None, dy, False)
        assert torch.equal(actual[0], torch.zeros_like(x))
        _compare(actual, _reference(x, w, None, torch.finfo(torch.float32).eps, dy, False), dtype)


def test_huge_and_tiny_bf16_rows(interpret, sms, seed):
    sms(1)
    n, dtype = 4097, torch.bfloat16
    x, w, _, dy = _inputs((17, n), dtype, seed)
    x[1] = x[1] * 3e16          # squares (and their row sum) still within float32
    x[9] = x[9] * 1e-17         # (1 and 9: one program's rows)
    actual = _public(x, w, None, 1e-30, dy, False)
    _compare(actual, _reference(x, w, None, 1e-30, dy, False), dtype)
    # squares past float32's range: rstd = 0 and the row normalizes to zeros, as torch's own float32 accumulation
    # gives (F.rms_norm of the bf16 tensor); a limit of the accumulation dtype, not of this kernel
    x[3] = x[3] * 1e20
    y = fusedops.rms_norm(x, (n,), w, 1e-5)
    assert torch.equal(y[3], F.rms_norm(x, (n,), w, 1e-5)[3]) and torch.equal(y[3], torch.zeros_like(y[3]))
    others = [i for i in range(17) if i != 3]
    assert_close(y[others], F.rms_norm(x.double(), (n,), w.double(), 1e-5)[others], dtype)


def test_fp16_rows_near_the_top_of_the_range(interpret, sms, seed):
    sms(1)
    n, dtype = 2049, torch.float16
    x, w, _, dy = _inputs((9, n), dtype, seed)
    x[0] = (x[0] * 2e4).clamp(-6e4, 6e4)
    x[8] = x[8] * 1e-5          # mostly subnormal fp16 values (eps 1e-6 keeps its dx = rstd * ... within fp16)
    assert (x[8].abs() < torch.finfo(dtype).tiny).sum() > n // 2
    _compare(_public(x, w, None, 1e-6, dy, False), _reference(x, w, None, 1e-6, dy, False), dtype)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("subtract_mean", [False, True], ids=["rms_norm", "layer_norm"])
def test_non_finite_value_in_one_row_does_not_leak(sms, bad, subtract_mean, seed):
    # 1 SM: 8 programs; row 5 is walked by program 5, whose next rows are 13 and 21 (prefetched while 5 is reduced)
    sms(1)
    n, m = 1025 if subtract_mean else 2049, 23
    dtype = torch.bfloat16 if bad != bad else torch.float16
    x, w, b, dy = _inputs((m, n), dtype, seed, True, subtract_mean)
    x[5, 100] = bad
    y, dx, dw, db, rstd = _launchers(x, w, b, 1e-6, dy, subtract_mean)
    expected = _reference(x, w, b, 1e-6, dy, subtract_mean)
    good = [i for i in range(m) if i != 5]
    _compare((y, dx, None, None), (expected[0], expected[1], None, None), dtype, rows=good)
    assert torch.isfinite(rstd[good]).all()
    # the bad row and the column sums: NaN exactly where torch's float64 has NaN, the rest close
    assert torch.equal(torch.isnan(y[5]), torch.isnan(expected[0][5]))
    assert_close(y[5], expected[0][5], dtype)
    for actual, reference in ((dw, expected[2]), (db, expected[3])):
        if actual is not None:
            assert torch.equal(torch.isnan(actual), torch.isnan(reference))
            assert_close(actual, reference, dtype)


# -- modules -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{}, {"elementwise_affine": False}, {"eps": 1e-3}])
def test_rms_norm_module(interpret, sms, kwargs, seed):
    sms(2)
    for n, dtype in ((777, torch.float16), (4097, torch.bfloat16)):
        ours = fusedops.nn.RMSNorm(n, dtype=dtype, **kwargs)
        theirs = torch.nn.RMSNorm(n, dtype=torch.float64, **kwargs)
        if ours.weight is not None:
            with torch.no_grad():
                ours.weight.copy_(random_tensor((n,), dtype, "cpu", seed, scale=0.3) + 1)
                theirs.weight.copy_(ours.weight.double())
        x = random_tensor((2, 9, n), dtype, "cpu", seed + 1).requires_grad_()
        dy = random_tensor(x.shape, dtype, "cpu", seed + 2)
        ours(x).backward(dy)
        xd = x.detach().double().requires_grad_()
        expected = theirs(xd) if "eps" in kwargs else F.rms_norm(
            xd, (n,), theirs.weight, torch.finfo(torch.float32).eps)
        expected.backward(dy.double())
        assert_close(ours(x), expected.detach(), dtype)
        assert_close(x.grad, xd.grad, dtype)
        if ours.weight is not None:
            assert_close(ours.weight.grad, theirs.weight.grad, dtype)


def test_layer_norm_module_same_rows(interpret, sms, seed):
    sms(2)
    n, dtype = 1023, torch.bfloat16
    ours = fusedops.nn.LayerNorm(n, dtype=dtype)
    with torch.no_grad():
        ours.weight.copy_(random_tensor((n,), dtype, "cpu", seed, scale=0.3) + 1)
        ours.bias.copy_(random_tensor((n,), dtype, "cpu", seed + 1))
    x = random_tensor((3, 7, n), dtype, "cpu", seed + 2) + 1
    dy = random_tensor(x.shape, dtype, "cpu", seed + 3)
    xr = x.clone().requires_grad_()
    ours(xr).backward(dy)
    expected = _reference(x.view(-1, n), ours.weight, ours.bias, 1e-5, dy.view(-1, n), True)
    _compare((ours(x).detach().view(-1, n), xr.grad.view(-1, n), ours.weight.grad, ours.bias.grad), expected, dtype)
