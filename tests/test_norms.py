"""layer_norm and rms_norm: kernels (fusedops/kernels/norm_*.py), autograd Functions,
the public functions and the nn modules.

CPU tier: the kernels run in the interpreter (FUSEDOPS_INTERPRET=1) against torch in float64, forward
and every gradient, at odd shapes, every affine combination, multi-dim normalized_shape, strided and
expanded inputs, forced looped/split paths; gradcheck in float64; torch's argument and dtype rules;
modules against torch.nn; every shipped GPU configuration (as the launchers pick it) compiles for sm_90a
and ptxas accepts it without spills (but for a few known ones, bounded: KNOWN_SPILLS). GPU tier (`-m cuda`): many shapes, poisoned outputs and scratch buffers, > 2**31
elements, > 65535 programs, determinism.
"""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.dsl as dsl
import fusedops.nn
from fusedops.autograd import norms as autograd_norms
from fusedops.dsl.runtime.bounded_cache import BoundedCache
from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels import norm_backward_config
from fusedops.kernels import norm_backward_kernels
from fusedops.kernels import norm_backward_launcher
from fusedops.kernels import norm_forward_config
from fusedops.kernels import norm_forward_kernels
from fusedops.kernels import norm_forward_launcher
from fusedops.kernels import norm_row_sweeps
from fusedops.kernels import norm_rows
from fusedops.kernels import norm_split_window
from fusedops.kernels import norm_split_staged
from fusedops.kernels import norms
from fusedops.kernels import sizes
from fusedops.kernels.norm_backward_config import BackwardConfig
from fusedops.kernels.norm_forward_config import ForwardConfig
from helpers import assert_close, poison, random_tensor

LAYER_NORM, RMS_NORM = "layer_norm", "rms_norm"
# Affine combinations: (weight, bias); RMSNorm has no bias.
AFFINE = [(True, True), (True, False), (False, True), (False, False)]
# Tolerances of sums over rows/columns in 16-bit outputs: the default per-dtype ones.
HALF_DTYPES = [torch.float16, torch.bfloat16]


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")


def _inputs(shape, normalized_shape, dtype, seed, weight, bias, device="cpu"):
    x = random_tensor(shape, dtype, device, seed)
    w = random_tensor(normalized_shape, dtype, device, seed + 1, scale=0.5) + 1 if weight else None
    b = random_tensor(normalized_shape, dtype, device, seed + 2) if bias else None
    dy = random_tensor(shape, dtype, device, seed + 3)
    return x, w, b, dy


def _reference(op, x, normalized_shape, w, b, eps, dy):
    """(y, dx, dweight, dbias) computed by torch in float64 from the same (rounded) values."""
    leaves = [None if t is None else t.detach().double().requires_grad_() for t in (x, w, b)]
    xd, wd, bd = leaves
    if op == LAYER_NORM:
        y = F.layer_norm(xd, normalized_shape, wd, bd, eps)
    else:
        y = F.rms_norm(xd, normalized_shape, wd, eps)
    y.backward(dy.double())
    return (y.detach(),) + tuple(None if t is None else t.grad for t in leaves)


def _run(op, x, normalized_shape, w, b, eps, dy):
    """(y, dx, dweight, dbias) from fusedops' public function and autograd."""
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in (x, w, b)]
    xr, wr, br = leaves
    if op == LAYER_NORM:
        y = fusedops.layer_norm(xr, normalized_shape, wr, br, eps)
    else:
        y = fusedops.rms_norm(xr, normalized_shape, wr, eps)
    y.backward(dy)
    return (y.detach(),) + tuple(None if t is None else t.grad for t in leaves)


def _compare(op, normalized_shape, actual, expected, dtype):
    """assert_close of (y, dx, dweight, dbias) against the float64 (y, dx, dweight, dbias)."""
    n_cols = math.prod(normalized_shape)
    if op == LAYER_NORM and n_cols == 1:
        # One column: x - mean = 0 exactly, so dx = dweight = 0 (torch's float64 gives rounding noise,
        # which a norm-relative comparison cannot handle).
        expected = tuple(torch.zeros_like(e) if e is not None and i in (1, 2) else e for i, e in enumerate(expected))
    # RMSNorm of one column: dx = rstd * g * eps / (x^2 + eps) comes from 1 - xhat^2 with xhat^2 ~ 1,
    # ill-conditioned in any precision below the reference's; only its finiteness is checked.
    skip_dx = op == RMS_NORM and n_cols == 1
    for name, a, e in zip(("y", "dx", "dweight", "dbias"), actual, expected):
        assert (a is None) == (e is None), name
        if name == "dx" and skip_dx:
            assert torch.isfinite(a).all()
        elif a is not None:
            assert a.dtype == dtype and a.shape == e.shape, name
            assert_close(a, e, dtype)


def _check(op, shape, normalized_shape, dtype, seed, weight=True, bias=True, eps=1e-5):
    bias = bias and op == LAYER_NORM
    x, w, b, dy = _inputs(shape, normalized_shape, dtype, seed, weight, bias)
    actual = _run(op, x, normalized_shape, w, b, eps, dy)
    reference_eps = eps if eps is not None else autograd_norms.default_rms_norm_eps(dtype)
    _compare(op, normalized_shape, actual, _reference(op, x, normalized_shape, w, b, reference_eps, dy), dtype)


# -- CPU tier: the kernels in the interpreter ---------------------------------------------------------
@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("weight, bias", AFFINE)
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (7, 37), (2, 3, 100)])
def test_matches_float64_every_affine_combination(interpret, op, weight, bias, shape, seed):
    if op == RMS_NORM and bias:
        pytest.skip("RMSNorm has no bias")
    _check(op, shape, shape[-1:], torch.float32, seed, weight, bias)


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
@pytest.mark.parametrize("subtract_mean", [True, False], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("n_cols", [1000, 1032, 1544])
def test_forward_reads_16_byte_vectors_when_row_strides_allow(n_cols, subtract_mean, tmp_path, monkeypatch):
    # Row strides divisible by 8 fp16 elements (not 16, so not specialized): ALIGN keeps vectors, with the
    # shipped whole-row config's options (LayerNorm: the shifted sums up to 4096 columns; both ops: the cache
    # hints up to 2048; rows past 4096 columns take the row sweeps, tests/test_norm_row_sweeps.py).
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    x = torch.empty(8, n_cols, dtype=torch.float16)
    config = norm_forward_config.forward_config(n_cols, x.dtype, subtract_mean=subtract_mean)
    assert config.shifted_sums == subtract_mean and not config.reload and config.cache_hints
    align = norm_rows.stride_alignment(x.stride(0), x.stride(0), x.element_size())
    assert align == 8
    stats = torch.empty(8)
    compiled = norm_forward_kernels.forward_kernel.compile(
        x, stats if subtract_mean else None, stats, x, x[0], x[0], 8, n_cols, n_cols, 1, n_cols, 1e-5,
        target="sm_90a", num_warps=config.num_warps, SUBTRACT_MEAN=subtract_mean, BLOCK_ROWS=config.block_rows,
        BLOCK_N=config.block_n, ALIGN=align, SHIFTED_SUMS=config.shifted_sums, CACHE_HINTS=config.cache_hints)
    ptx = compiled.asm["ptx"]
    assert re.search(r"ld\.global[.\w:]*\.v4", ptx) and re.search(r"st\.global[.\w:]*\.v4", ptx)
    # the shifted sums: one exchange of the statistics (one barrier pair) where the two reductions took two;
    # LayerNorm's second pair is the exchange of its second sums, a loop that rows rarely enter
    assert ptx.count("bar.sync") == (4 if subtract_mean else 2)
    assert assemble(ptx, "sm_90a").spill_bytes == 0


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("dtype", HALF_DTYPES + [torch.float64])
@pytest.mark.parametrize("shape", [(5, 129), (33, 8)])
def test_matches_float64_other_dtypes(interpret, op, dtype, shape, seed):
    _check(op, shape, shape[-1:], dtype, seed)


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
def test_multi_dim_normalized_shape_and_int_shape(interpret, op, seed):
    _check(op, (3, 5, 7), (5, 7), torch.float32, seed)
    x = random_tensor((4, 9), torch.float32, "cpu", seed)
    function = fusedops.layer_norm if op == LAYER_NORM else fusedops.rms_norm
    assert torch.equal(function(x, 9), function(x, (9,)))


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("dtype, prefetch", [(torch.float32, False), (torch.bfloat16, True)])
def test_looped_forward_and_split_backward(interpret, monkeypatch, op, dtype, prefetch, seed):
    # Force the long-row paths at a small size: 16-column chunks (so 57 columns end in a partial
    # chunk), 2-row tiles, 8-column dx tiles.
    _fresh_launch_caches(monkeypatch)
    monkeypatch.setattr(norm_forward_launcher, "forward_config", lambda n, d, **_: ForwardConfig(True, 1, 16, 4))
    monkeypatch.setattr(norm_backward_launcher, "backward_config", lambda n, d, **_: BackwardConfig(
        True, 2, 16, 4, programs_per_sm=1, prefetch=prefetch, input_block_rows=2, input_block_n=8,
        input_num_warps=4))
    _check(op, (9, 57), (57,), dtype, seed)
    _check(op, (5, 16), (16,), dtype, seed + 7, weight=False)


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
def test_fused_backward_without_prefetch(interpret, monkeypatch, op, seed):
    # The shipped configurations prefetch up to 8 warps and not at 16: both loops are tested.
    _fresh_launch_caches(monkeypatch)
    monkeypatch.setattr(norm_backward_launcher, "backward_config", lambda n, d, **_: BackwardConfig(
        False, 2, 64, 4, programs_per_sm=1, prefetch=False))
    _check(op, (7, 50), (50,), torch.float32, seed)


def test_split_backward_sums_more_chunks_than_one_block(interpret, monkeypatch, seed):
    # 70 chunks of 1 column > BLOCK_CHUNKS = 64: backward_input_kernel loops over the c1/c2 partials.
    _fresh_launch_caches(monkeypatch)
    monkeypatch.setattr(norm_backward_launcher, "backward_config", lambda n, d, **_: BackwardConfig(
        True, 1, 1, 1, programs_per_sm=1, input_block_rows=1, input_block_n=32, input_num_warps=1))
    _check(LAYER_NORM, (3, 70), (70,), torch.float32, seed)


# Issue-5 variants forced at small sizes: (ForwardConfig, BackwardConfig). Block sizes are chosen so
# that 16-bit rows of 21 columns take the aligned window (block >= 21 + 7) and the two-pass backward
# splits a row into several parts and chunks.
VARIANTS = {
    "affine_first+window / persistent one-pass+prefetch+window": (
        ForwardConfig(False, 2, 32, 1, affine_first=True, aligned_window=True),
        BackwardConfig(False, 2, 32, 1, 1, prefetch=True, persistent=True, aligned_window=True)),
    "persistent+prefetch+window / persistent two-pass parts+window": (
        ForwardConfig(False, 2, 32, 1, aligned_window=True, programs_per_sm=1, prefetch=True),
        BackwardConfig(False, 1, 8, 1, 1, persistent=True, aligned_window=True, chunk=4)),
    "persistent looped / persistent two-pass whole rows+prefetch": (
        ForwardConfig(True, 1, 8, 1, programs_per_sm=1),
        BackwardConfig(False, 2, 32, 1, 1, persistent=True, prefetch=True, two_pass=True, chunk=8)),
    # the parts of a row in one cluster (dsl.cluster_sum): 21 columns in clusters of 3, 16 in clusters of 2,
    # one column in "clusters" of one
    "plain / persistent cluster parts+prefetch": (
        ForwardConfig(False, 1, 32, 1),
        BackwardConfig(False, 1, 8, 1, 1, persistent=True, prefetch=True, cluster=True)),
    "plain / persistent cluster parts, 2-row tiles+window": (
        ForwardConfig(False, 1, 32, 1),
        BackwardConfig(False, 2, 8, 1, 1, persistent=True, cluster=True, aligned_window=True)),
}


def _check_with_configs(op, shape, dtype, seed, forward_config, backward_config, weight=True, bias=True,
                        transpose_x=False, expand_dy=False):
    """The kernels' forward and backward under forced configs (launchers, interpreter) vs float64."""
    subtract_mean = op == LAYER_NORM
    x, w, b, dy = _inputs(shape, shape[-1:], dtype, seed, weight, bias and subtract_mean)
    if transpose_x:
        x = x.t().contiguous().t()
    if expand_dy:
        dy = dy[:1].expand(shape)
    y, mean, rstd = norms.norm_forward(x, w, b, 1e-5, subtract_mean=subtract_mean, config=forward_config,
                                       interpret=True, allocate=_poisoned_cpu_empty)
    dx, dw, db = norms.norm_backward(dy, x, w, mean, rstd, subtract_mean=subtract_mean, input_grad=True,
                                     weight_grad=w is not None, bias_grad=b is not None, bias_dtype=dtype,
                                     config=backward_config, interpret=True, allocate=_poisoned_cpu_empty)
    _compare(op, shape[-1:], (y.view(shape), dx, dw, db), _reference(op, x, shape[-1:], w, b, 1e-5, dy), dtype)


def _poisoned_cpu_empty(shape, dtype, device):
    return poison(torch.empty(shape, dtype=dtype, device=device))


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("dtype, shape", [(torch.float16, (13, 21)), (torch.float32, (9, 16)),
                                          (torch.bfloat16, (6, 1))])
def test_issue5_variants_match_float64(variant, op, dtype, shape, seed):
    _check_with_configs(op, shape, dtype, seed, *VARIANTS[variant])


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("weight, bias", AFFINE[1:])
def test_issue5_variants_affine_combinations(variant, weight, bias, seed):
    _check_with_configs(LAYER_NORM, (7, 21), torch.float16, seed, *VARIANTS[variant], weight=weight, bias=bias)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_issue5_variants_strided_x_and_expanded_dy(variant, seed):
    # Neither layout takes the aligned window (column stride != 1, row stride 0): the plain addressing.
    _check_with_configs(LAYER_NORM, (7, 21), torch.float16, seed, *VARIANTS[variant], transpose_x=True,
                        expand_dy=True)


def test_aligned_window_applies_only_to_rows_of_stride_n():
    assert norm_rows.window_shift(True, 32, 21, 1, 2, (21, 1), (21, 1)) == 8
    assert norm_rows.window_shift(True, None, 21, 1, 2, (21, 1), (0, 1)) == 0      # expanded dy
    assert norm_rows.window_shift(True, 32, 21, 1, 2, (1, 21)) == 0                 # transposed x
    assert norm_rows.window_shift(True, 16, 21, 1, 2, (21, 1)) == 0                 # window past the block
    assert norm_rows.window_shift(True, 32, 24, 8, 2, (24, 1)) == 0                 # rows already aligned
    assert norm_rows.window_shift(False, 32, 21, 1, 2, (21, 1)) == 0


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("weight, bias", AFFINE)
def test_gradcheck_float64(interpret, op, weight, bias, seed):
    if op == RMS_NORM and bias:
        pytest.skip("RMSNorm has no bias")
    x, w, b, _ = _inputs((3, 2, 5), (2, 5), torch.float64, seed, weight, bias)
    leaves = [t.requires_grad_() for t in (x, w, b) if t is not None]

    def function(*args):
        values = iter(args)
        xx = next(values)
        ww = next(values) if weight else None
        if op == LAYER_NORM:
            return fusedops.layer_norm(xx, (2, 5), ww, next(values) if bias else None)
        return fusedops.rms_norm(xx, (2, 5), ww)

    assert torch.autograd.gradcheck(function, tuple(leaves))


def test_gradcheck_float64_split_path(interpret, monkeypatch, seed):
    _fresh_launch_caches(monkeypatch)
    monkeypatch.setattr(norm_forward_launcher, "forward_config", lambda n, d, **_: ForwardConfig(True, 1, 4, 1))
    monkeypatch.setattr(norm_backward_launcher, "backward_config", lambda n, d, **_: BackwardConfig(
        True, 2, 4, 1, programs_per_sm=1, prefetch=True, input_block_rows=1, input_block_n=4, input_num_warps=1))
    x, w, b, _ = _inputs((3, 11), (11,), torch.float64, seed, True, True)
    assert torch.autograd.gradcheck(lambda *a: fusedops.layer_norm(a[0], (11,), a[1], a[2]),
                                    (x.requires_grad_(), w.requires_grad_(), b.requires_grad_()))


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
def test_row_of_zeros_with_tiny_eps_in_float16_gives_no_nan(interpret, op, seed):
    # The variance (0) + eps (1e-12, below float16's range) is formed in float32: rstd = 1e6, y = bias.
    # dx of that row is rstd * (g - mean(g)), about 1e6: it overflows float16 to inf (as torch's does),
    # but nothing is NaN, and the other rows are unaffected.
    x, w, b, dy = _inputs((4, 40), (40,), torch.float16, seed, True, op == LAYER_NORM)
    x[1] = 0
    y, dx, dw, db = _run(op, x, (40,), w, b, 1e-12, dy)
    for t in (y, dx, dw, db):
        assert t is None or not torch.isnan(t).any()
    assert torch.isfinite(y).all() and torch.isfinite(dw).all() and (db is None or torch.isfinite(db).all())
    assert torch.equal(y[1], b if b is not None else torch.zeros_like(y[1]))
    expected = _reference(op, x, (40,), w, b, 1e-12, dy)
    assert_close(dx[[0, 2, 3]], expected[1][[0, 2, 3]], torch.float16)


def _persistent_backward_config(n_cols, dtype, **_):
    """A persistent backward config for any row size (the default has it at 8192 columns only): whole rows,
    1024 // block_n rows a tile, 2 programs per SM (8 programs in the interpreter's 4 "SMs"), prefetch."""
    block_n = sizes.next_power_of_2(n_cols)
    return BackwardConfig(split=False, block_rows=max(1, 1024 // block_n), block_n=block_n, num_warps=4,
                          programs_per_sm=2, prefetch=True, persistent=True)


def _fresh_launch_caches(monkeypatch):
    """Empty launch caches for this test: the launches prepared for a layout are remembered across calls
    (and tests), so a config forced by monkeypatching applies only to layouts not seen before."""
    monkeypatch.setattr(norms, "_FORWARD_LAUNCHES", BoundedCache(1024))
    monkeypatch.setattr(norms, "_BACKWARD_LAUNCHES", BoundedCache(1024))
    monkeypatch.setattr(autograd_norms, "_KNOWN_LAUNCHES", BoundedCache(1024))


def _force_backward(monkeypatch, persistent):
    if persistent:
        _fresh_launch_caches(monkeypatch)
        monkeypatch.setattr(norm_backward_launcher, "backward_config", _persistent_backward_config)


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("dtype, n_cols, persistent", [(torch.float32, 4, False), (torch.float16, 8, True)])
def test_more_than_65535_rows(interpret, monkeypatch, op, dtype, n_cols, persistent, seed):
    # Several rows per program keep the interpreter cheap; the GPU tier launches > 65535 programs.
    _force_backward(monkeypatch, persistent)
    _check(op, (65537, n_cols), (n_cols,), dtype, seed)


@pytest.mark.parametrize("dtype", HALF_DTYPES + [torch.float32])
def test_default_backward_by_row_size(dtype):
    # 16-bit rows: the fused backward up to 4096 columns, the persistent one for 4097..32768 columns of a
    # multiple of 8 (both ops; past 8192 in clusters), the split window for odd rows of 514..4097 columns
    # (N - 1 padded to 1024..4096), the fused one for other odd rows up to 8192, the split one beyond.
    for n_cols in (64, 1000, 1024, 1025, 2048, 2049, 3001, 4096, 4097, 4098, 6144, 8191, 8192, 8200, 12289, 16384,
                   20001, 32761, 32762, 32768, 32776):
        config = norm_backward_config.backward_config(n_cols, dtype)
        odd_clusters = dtype.itemsize == 2 and 8192 < n_cols <= 32761 and n_cols % 8 != 0
        persistent = dtype.itemsize == 2 and 4096 < n_cols <= 32768 and n_cols % 8 == 0 or odd_clusters
        window = dtype.itemsize == 2 and 514 <= n_cols <= 4097 and n_cols % 8 != 0
        split = n_cols > 16384 // dtype.itemsize and not persistent
        assert config.cluster == (persistent and n_cols > 8192), n_cols
        assert config.aligned_window == odd_clusters, n_cols
        assert norm_backward_config.backward_config(n_cols, dtype, clusters=False).cluster is False
        assert (config.persistent, config.split and not config.persistent) == (persistent, split), n_cols
        assert config.split_window == window, n_cols
        if window:
            assert config.block_n == sizes.next_power_of_2(n_cols - 1)
        elif not persistent and not split:
            warps = min(16, max(4, config.block_n * 4 // 2048))
            rows = max(1, 1024 // config.block_n)
            if dtype.itemsize == 2 and config.block_n in (1024, 2048):     # norm_backward_config._HALF_BACKWARD_TILES
                rows, warps = 2, 4 if config.block_n == 1024 else 8
            assert config == BackwardConfig(split=False, block_rows=rows,
                                            block_n=config.block_n, num_warps=warps,
                                            programs_per_sm=max(1, 16 // warps), prefetch=warps <= 8)


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
def test_default_half_backward_of_8192_columns_is_persistent(interpret, op, seed):
    assert norm_backward_config.backward_config(8192, torch.float16).persistent
    _check(op, (3, 8192), (8192,), torch.float16, seed)


# The persistent backward, forced at small sizes: 8 programs in the interpreter (4 "SMs", 2 programs per SM)
# walk the row tiles g, g + 8, ...
@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("weight, bias", AFFINE)
@pytest.mark.parametrize("shape", [(3, 1024),      # fewer rows than programs
                                   (11, 1024),     # rows not a multiple of the programs
                                   (150, 64)])     # 16-row tiles, the last one partial, 10 tiles over 8 programs
def test_persistent_half_backward(interpret, monkeypatch, op, weight, bias, shape, seed):
    if op == RMS_NORM and bias:
        pytest.skip("RMSNorm has no bias")
    _force_backward(monkeypatch, True)
    _check(op, shape, shape[-1:], torch.float16, seed, weight, bias)


# 16-bit LayerNorm's default forward options by padded row size (forward_config), run at a few rows: the
# cache hints (1000 and 4000 columns: one row per program with the shifted sums, rows shorter than the
# block; RMSNorm's 1000: 2-row tiles with the hints, the last partial),
# the row sweeps (16000 and 4104: aligned rows of the 16384 and 8192 blocks), the row sweeps through the
# aligned window (20001: unaligned rows), and an RMSNorm row of the same size, which keeps the plain tiles
# but where the row sweeps run (8192 block, odd rows). (Odd rows of up to 4097 columns take the split window:
# test_split_window_norms.py.)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("n_cols, rows, hints, sweeps, window", [
    (1000, 1, True, False, False), (4000, 1, True, False, False), (16000, 1, True, True, False),
    (4104, 1, True, True, False), (20001, 1, True, True, True)])
def test_default_half_layer_norm_forward_options(dtype, n_cols, rows, hints, sweeps, window, seed):
    config = norm_forward_config.forward_config(n_cols, dtype, subtract_mean=True)
    assert (config.block_rows, config.cache_hints, config.row_sweeps, config.aligned_window) == (rows, hints, sweeps,
                                                                                                window)
    assert not config.reload and config.shifted_sums == (not sweeps or norm_forward_config.ROW_SWEEP_SHIFTED_SUMS)
    plain = norm_forward_config.forward_config(n_cols, dtype)         # RMSNorm (subtract_mean=False)
    assert not plain.reload and plain.row_sweeps == (n_cols in (4104, 20001))
    assert plain.cache_hints == (n_cols in (1000, 4104, 20001))
    assert plain.aligned_window == window
    for op in (LAYER_NORM, RMS_NORM):
        subtract_mean = op == LAYER_NORM
        x, w, b, dy = _inputs((3, n_cols), (n_cols,), dtype, seed, True, subtract_mean)
        x = x * 3 + 0.25                    # a mean away from 0
        y, mean, rstd = norms.norm_forward(x, w, b, 1e-5, subtract_mean=subtract_mean, interpret=True,
                                           allocate=_poisoned_cpu_empty)
        assert_close(y, _reference(op, x, (n_cols,), w, b, 1e-5, dy)[0], dtype)
        x64 = x.double()
        if subtract_mean:
            assert_close(mean, x64.mean(-1), torch.float32)
            x64 = x64 - x64.mean(-1, keepdim=True)
        assert_close(rstd, torch.rsqrt(x64.pow(2).mean(-1) + 1e-5), torch.float32)


def _hard_rows(n_cols: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Rows that stress the statistics of the shifted sums (norm_statistics' comment on the shifted sums):
    an outlier in column 0 carrying the row's variance, a large mean, one nonzero element (in column 0,
    then elsewhere), zeros, a tiny spread around a large mean, a pair of opposite outliers, and (last, row
    7) outliers in two of the three columns the shift is the median of."""
    x = random_tensor((8, n_cols), torch.float32, seed=seed)
    x[0, 0] = 60000.0 if dtype == torch.float16 else 1e6
    x[1] += 1000.0
    x[2] = 0.0
    x[2, 0] = 1.0
    x[3] = 0.0
    x[3, n_cols // 2] = -7.0
    x[4] = 0.0
    x[5] = x[5] * 1e-3 + 5.0
    x[6, 0], x[6, -1] = -300.0, 300.0
    x[7, 0] = x[7, -1] = 200.0          # two of the three sampled columns: the shift is an outlier
    return x.to(dtype)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("n_cols", [1000, 2047, 2048, 4096, 8192, 12289, 32768])
def test_shifted_sums_within_twice_torchs_error_on_hard_rows(dtype, n_cols, seed, monkeypatch):
    # The default 16-bit LayerNorm forward of these rows takes the shifted sums (2047: in the split window;
    # 8192 and up: in the row sweeps with norm_forward_config.ROW_SWEEP_SHIFTED_SUMS; 12289 in the staged split
    # window); its outputs stay within twice the error of torch's own (float32 statistics, one
    # rounding) against float64, and its statistics within the documented bounds.
    monkeypatch.setattr(norm_forward_config, "ROW_SWEEP_SHIFTED_SUMS", True)
    config = norm_forward_config.forward_config(n_cols, dtype, subtract_mean=True)
    assert config.shifted_sums or config.split_window
    x = _hard_rows(n_cols, dtype, seed)
    w, b = (random_tensor((n_cols,), torch.float32, seed=seed + i).to(dtype) for i in (1, 2))
    y, mean, rstd = norms.norm_forward(x, w, b, 1e-5, subtract_mean=True, interpret=True,
                                       allocate=_poisoned_cpu_empty)
    _check_hard_rows(x, w, b, y, mean, rstd, config)


# Fixed (session 31; found in session 30): the whole-row tiles' shifted sums (forward_kernel's SHIFTED_SUMS) and
# the split window's (norm_split_window) lacked the row sweeps' second sums about the mean: bfloat16 rows of spread
# ~1e-18 with eps = 0 gave inf / NaN ((x - K) * 2^-16 squared underflows float32, where torch's float32 variance,
# ~1e-36, does not), spread 1e-17 with eps = 1e-37 an rstd 1.3-2.1% off (subnormal squares).
@pytest.mark.parametrize("n_cols", [1000, 2048, 4096, 777, 2049, 4097, 8192])
@pytest.mark.parametrize("scale, eps", [(1e-18, 0.0), (1e-17, 1e-37)], ids=["1e-18-eps0", "1e-17-eps1e-37"])
def test_whole_row_sums_of_tiny_spread_bf16_rows(n_cols, scale, eps, seed):
    config = norm_forward_config.forward_config(n_cols, torch.bfloat16, subtract_mean=True)
    assert (config.shifted_sums or config.split_window) and not config.row_sweeps
    x = random_tensor((2, n_cols), torch.bfloat16, "cpu", seed, scale=scale)
    y, mean, rstd = norms.norm_forward(x, None, None, eps, subtract_mean=True, interpret=True)
    assert torch.isfinite(y).all()
    x64 = x.double()
    exact = torch.rsqrt(x64.var(1, unbiased=False) + eps)
    assert ((rstd.double() / exact - 1).abs() <= 1e-5).all()


# Found (session 31): a row whose scaled squares underflow but whose shifted sum is exactly 0 (zeros and +-a
# around a shift of 0: the median of -a, 0, a) skipped the second sums (the test was "squares underflowed and the
# sum is not 0", meant to spare rows of one repeated value), leaving rstd = 1 / sqrt(0 + eps): inf with eps = 0.
@pytest.mark.parametrize("n_cols", [1000, 2049, 8192, 12289, 16384])
def test_shifted_sums_of_balanced_tiny_rows(n_cols, seed):
    config = norm_forward_config.forward_config(n_cols, torch.bfloat16, subtract_mean=True)
    assert config.shifted_sums or config.split_window
    x = torch.zeros(3, n_cols)
    a = torch.rand(3, generator=torch.Generator().manual_seed(seed)) * 1e-15 + 1e-15
    x[:, 0], x[:, -1], x[:, 1], x[:, 2] = -a, a, a, -a        # columns 0, (N - 1) // 2, N - 1: -a, 0, a
    x = x.to(torch.bfloat16)
    y, mean, rstd = norms.norm_forward(x, None, None, 0.0, subtract_mean=True, interpret=True,
                                       allocate=_poisoned_cpu_empty)
    x64 = x.double()
    assert_close(rstd, torch.rsqrt(x64.var(1, unbiased=False)), torch.float32)
    assert_close(y, torch.nn.functional.layer_norm(x64, (n_cols,), eps=0.0), torch.bfloat16)


def _check_hard_rows(x, w, b, y, mean, rstd, config):
    """y within twice torch's error (+ one ulp of the row's largest output) against float64, row by row; mean
    and rstd within the bounds of norm_statistics' comment on the shifted sums (`config`: the forward's; the row
    sweeps' threads add up runs of N / threads elements each)."""
    n_cols, dtype = x.shape[-1], x.dtype
    reference = torch.nn.functional.layer_norm(x.double(), (n_cols,), w.double(), b.double(), 1e-5)
    ours_error = (y.double() - reference).abs().amax(1)
    torch_error = (torch.nn.functional.layer_norm(x, (n_cols,), w, b, 1e-5).double() - reference).abs().amax(1)
    ulp = torch.finfo(dtype).eps * reference.abs().amax(1)
    assert (ours_error <= 2 * torch_error + ulp).all(), (ours_error, torch_error)
    x64 = x.double()
    assert (mean.double() - x64.mean(1)).abs().max() <= 1e-6 * x64.abs().amax(1).max()
    exact = torch.rsqrt(x64.var(1, unbiased=False) + 1e-5)
    error = (rstd.double() / exact - 1).abs()
    outlying_shift = torch.arange(len(error), device=error.device) == 7      # _hard_rows' last row
    # the shift near the row: float32's rounding over each thread's run plus the exchange (N / threads in
    # the row sweeps, block_rows * block_n / threads in whole rows), at least 2^-21
    run = (n_cols if config.row_sweeps else config.block_rows * config.block_n) / (32 * config.num_warps)
    bound = 2.0 ** -24 * max(8.0, run + math.log2(n_cols))
    assert (error[~outlying_shift] <= bound).all(), error[~outlying_shift].max()
    assert error[7] <= n_cols * math.log2(n_cols) * 2.0 ** -24      # the documented worst case
    assert torch.isfinite(y).all()


def test_default_forward_options_apply_to_16_bit_layer_norm_only():
    for n_cols in (1000, 4096, 16384, 32768):
        for dtype in (torch.float32, torch.float64):
            config = norm_forward_config.forward_config(n_cols, dtype, subtract_mean=True)
            assert config == norm_forward_config.forward_config(n_cols, dtype)
            assert not (config.reload or config.cache_hints)
    for n_cols in (512, 65536):      # below the measured sizes, the looped kernel
        assert (norm_forward_config.forward_config(n_cols, torch.float16, subtract_mean=True)
                == norm_forward_config.forward_config(n_cols, torch.float16))
    # the aligned-window row sweeps: the same but for LayerNorm's shifted sums
    # (norm_forward_config.ROW_SWEEP_SHIFTED_SUMS)
    layer_norm = norm_forward_config.forward_config(20001, torch.float16, subtract_mean=True)
    assert layer_norm.shifted_sums == norm_forward_config.ROW_SWEEP_SHIFTED_SUMS
    assert dataclasses.replace(layer_norm, shifted_sums=False) == norm_forward_config.forward_config(20001,
                                                                                                     torch.float16)


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
def test_default_forward_of_long_odd_half_rows_reads_an_aligned_window(op, seed):
    # 20001 columns: rows start off 16-byte boundaries; the shipped forward reads them through the window.
    # (12289 columns take the staged split window: tests/test_norm_split_staged.py.)
    config = norm_forward_config.forward_config(20001, torch.float16)
    assert config.row_sweeps and norm_rows.window_shift(config.aligned_window, None, 20001, 1, 2, (20001, 1)) == 8
    subtract_mean = op == LAYER_NORM
    x, w, b, dy = _inputs((3, 20001), (20001,), torch.float16, seed, True, subtract_mean)
    y, mean, rstd = norms.norm_forward(x, w, b, 1e-5, subtract_mean=subtract_mean, interpret=True,
                                       allocate=_poisoned_cpu_empty)
    assert_close(y, _reference(op, x, (20001,), w, b, 1e-5, dy)[0], torch.float16)


def test_strided_inputs_are_read_in_place(seed):
    base = random_tensor((6, 40), torch.float32, "cpu", seed)
    sliced = base[:, ::2]                                   # column stride 2
    assert norm_rows.as_rows(sliced, 6, 20).data_ptr() == sliced.data_ptr()
    transposed = base.t()                                   # (40, 6): row stride 1, column stride 40
    assert norm_rows.as_rows(transposed, 40, 6).stride() == (1, 40)
    broadcast = base[:1].expand(5, 40)                      # stride-0 rows (an expanded gradient)
    assert norm_rows.as_rows(broadcast, 5, 40).stride() == (0, 1)
    batch = random_tensor((3, 4, 8), torch.float32, "cpu", seed).transpose(0, 1)   # rows not one stride
    rows = norm_rows.as_rows(batch, 12, 8)
    assert rows.is_contiguous() and torch.equal(rows, batch.reshape(12, 8))


def _check_views(op, x, w, b, dtype):
    """Forward and gradients on strided/expanded views of x, with dy = the stride-0 gradient of sum()."""
    n_rows, n_cols = x.shape
    views = (x[:, ::2],                                                    # column stride 2
             x.t().contiguous().t(),                                       # row stride 1, column stride M
             x.view(2, n_rows // 2, n_cols).transpose(0, 1),               # rows without one stride: copied
             x[:1].expand(4, n_cols))                                      # row stride 0
    function = fusedops.layer_norm if op == LAYER_NORM else fusedops.rms_norm
    for view in views:
        n = view.shape[-1]
        leaf = view.detach().requires_grad_()
        weight = w[:n].detach().requires_grad_()
        bias = None if b is None else b[:n]
        y = function(leaf, (n,), weight, *(() if bias is None else (bias,)))
        y.sum().backward()                              # dy: ones expanded with stride 0
        eps = 1e-5 if op == LAYER_NORM else autograd_norms.default_rms_norm_eps(dtype)
        expected = _reference(op, view, (n,), weight, bias, eps, torch.ones_like(view))
        assert_close(y, expected[0], dtype)
        assert_close(leaf.grad, expected[1], dtype)
        assert_close(weight.grad, expected[2], dtype)


# The backward: the default (fused) one, and the persistent one (forced: the default at 8192 columns only).
BACKWARDS = [(torch.float32, False), (torch.float16, False), (torch.float16, True)]


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("dtype, persistent", BACKWARDS)
def test_non_contiguous_inputs_and_expanded_grad_output(interpret, monkeypatch, op, dtype, persistent, seed):
    _force_backward(monkeypatch, persistent)
    x, w, b, _ = _inputs((6, 80), (80,), dtype, seed, True, op == LAYER_NORM)
    _check_views(op, x, w, b, dtype)


@pytest.mark.parametrize("dtype, n_cols, persistent", [(torch.float32, 33, False), (torch.float16, 64, True)])
def test_dweight_and_dbias_only(interpret, monkeypatch, dtype, n_cols, persistent, seed):
    # x without requires_grad: no dx kernel output; the partial sums alone.
    _force_backward(monkeypatch, persistent)
    x, w, b, dy = _inputs((9, n_cols), (n_cols,), dtype, seed, True, True)
    w.requires_grad_(), b.requires_grad_()
    fusedops.layer_norm(x, (n_cols,), w, b).backward(dy)
    _, _, dw, db = _reference(LAYER_NORM, x, (n_cols,), w, b, 1e-5, dy)
    assert_close(w.grad, dw, dtype)
    assert_close(b.grad, db, dtype)


def test_empty_inputs(interpret):
    for op in (fusedops.layer_norm, fusedops.rms_norm):
        x = torch.zeros((0, 5), requires_grad=True)
        w = torch.ones(5, requires_grad=True)
        y = op(x, (5,), w)
        assert y.shape == (0, 5)
        y.sum().backward()
        assert torch.equal(w.grad, torch.zeros(5))


def test_rms_norm_default_eps_is_torchs(interpret):
    # torch uses the epsilon of the accumulation dtype (float32 for float16 input), not finfo(float16).
    x = torch.full((2, 4), 1e-2, dtype=torch.float16)
    assert autograd_norms.default_rms_norm_eps(torch.float16) == torch.finfo(torch.float32).eps
    assert_close(fusedops.rms_norm(x, (4,)), F.rms_norm(x.double(), (4,), eps=torch.finfo(torch.float32).eps),
                 torch.float16)
    assert torch.equal(fusedops.rms_norm(x, (4,)), F.rms_norm(x, (4,)).to(torch.float16))


def test_rms_norm_accepts_a_weight_of_another_dtype(interpret, seed):
    x = random_tensor((3, 24), torch.bfloat16, "cpu", seed)
    w = random_tensor((24,), torch.float32, "cpu", seed + 1).requires_grad_()
    y = fusedops.rms_norm(x, (24,), w)
    assert y.dtype == torch.bfloat16
    y.backward(torch.ones_like(y))
    assert w.grad.dtype == torch.float32
    wd = w.detach().double().requires_grad_()
    F.rms_norm(x.double(), (24,), wd, torch.finfo(torch.float32).eps).sum().backward()
    assert_close(w.grad, wd.grad, torch.bfloat16)


# -- the kernel path's remembered arguments and launches (fusedops.autograd.norms.known_launches) -----
def test_arguments_laid_out_like_known_ones_are_still_checked(interpret, monkeypatch, seed):
    # A call that took the kernel path is remembered per argument layout; arguments that differ in
    # anything the checks read must still be checked (and routed) in full.
    x, w, b, _ = _inputs((6, 40), (40,), torch.float32, seed, True, True)
    expected = fusedops.layer_norm(x, (40,), w, b)
    assert torch.equal(fusedops.layer_norm(x, (40,), w, b), expected)      # the remembered launches
    assert torch.equal(fusedops.layer_norm(x, [40], w, b), expected)        # the same shape as a list
    with pytest.raises(TypeError, match=r"torch.float64.*torch.float32"):
        fusedops.layer_norm(x, (40,), w, b.double())
    with pytest.raises(ValueError, match="same shape as normalized_shape"):
        fusedops.layer_norm(x, (40,), w.view(1, 40), b)
    with pytest.raises(TypeError, match="normalized_shape"):
        fusedops.layer_norm(x, (40.0,), w, b)
    with pytest.raises(ValueError, match="is on meta"):
        fusedops.layer_norm(x, (40,), w.to("meta"), b)
    assert_close(fusedops.layer_norm(x, (40,), w, b, 0.5), _reference(LAYER_NORM, x, (40,), w, b, 0.5, x)[0],
                 torch.float32)
    fusedops.rms_norm(x, (40,), w)
    with pytest.raises(TypeError, match="torch.complex64"):
        fusedops.rms_norm(x, (40,), w.to(torch.complex64))
    assert_close(fusedops.rms_norm(x, (40,), w.int()), F.rms_norm(x.double(), (40,), w.int().double()),
                 torch.float32)                              # an integer weight, as torch takes it
    monkeypatch.delenv("FUSEDOPS_INTERPRET")                # CPU tensors: torch's op again
    monkeypatch.setattr(norms, "norm_launches", None)
    assert torch.equal(fusedops.layer_norm(x, (40,), w, b), F.layer_norm(x, (40,), w, b))
    assert torch.equal(fusedops.rms_norm(x, (40,), w), F.rms_norm(x, (40,), w))


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("dtype, persistent", BACKWARDS)
def test_backward_of_one_forward_layout_for_every_dy_layout(interpret, monkeypatch, op, dtype, persistent, seed):
    # The backward launches are kept per layout of dy (and x) with the forward's: contiguous, expanded
    # (the gradient of sum()) and transposed gradients of the same forward layout.
    _force_backward(monkeypatch, persistent)
    x, w, b, dy = _inputs((6, 24), (24,), dtype, seed, True, op == LAYER_NORM)
    for grad in (dy, dy[:1].expand(6, 24), dy.t().contiguous().t()):
        _compare(op, (24,), _run(op, x, (24,), w, b, 1e-5, grad), _reference(op, x, (24,), w, b, 1e-5, grad),
                 dtype)


def test_saved_tensor_hooks_that_lay_x_out_anew(interpret, seed):
    # save_on_cpu gives the saved x back contiguous: the backward must not read it with the forward's
    # (transposed) strides.
    x, w, b, dy = _inputs((6, 24), (24,), torch.float32, seed, True, True)
    x = x.t().contiguous().t()                                  # column stride 6
    expected = _reference(LAYER_NORM, x, (24,), w, b, 1e-5, dy)
    for hooks in (torch.autograd.graph.save_on_cpu(), torch.autograd.graph.saved_tensors_hooks(
            lambda t: t.contiguous(), lambda t: t)):
        with hooks:
            actual = _run(LAYER_NORM, x, (24,), w, b, 1e-5, dy)
        _compare(LAYER_NORM, (24,), actual, expected, torch.float32)


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
def test_double_backward_raises(interpret, op, seed):
    x, w, _, _ = _inputs((3, 8), (8,), torch.float32, seed, True, False)
    x.requires_grad_()
    y = fusedops.layer_norm(x, (8,), w) if op == LAYER_NORM else fusedops.rms_norm(x, (8,), w)
    (dx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        dx.sum().backward()


# -- argument checking (no kernel runs) ---------------------------------------------------------------
@pytest.mark.parametrize("weight_dtype, bias_dtype", [(torch.float32, None), (None, torch.float32),
                                                      (torch.float16, torch.bfloat16)])
def test_layer_norm_rejects_mixed_dtypes_naming_both(weight_dtype, bias_dtype):
    # Off the CPU (the rule of torch's CUDA kernel; meta tensors here: the checks run before any kernel).
    x = torch.zeros(2, 3, dtype=torch.float16, device="meta")
    w = None if weight_dtype is None else torch.ones(3, dtype=weight_dtype, device="meta")
    b = None if bias_dtype is None else torch.ones(3, dtype=bias_dtype, device="meta")
    offending = w if weight_dtype not in (None, torch.float16) else b
    with pytest.raises(TypeError, match=rf"{offending.dtype}.*torch.float16"):
        fusedops.layer_norm(x, (3,), w, b)


@pytest.mark.parametrize("weight_dtype, bias_dtype, accepted", [
    (torch.float32, None, True), (None, torch.float32, True), (torch.float32, torch.float32, True),
    (torch.float16, torch.float32, False), (torch.bfloat16, None, False)])
def test_layer_norm_cpu_mixed_dtypes_as_torch(weight_dtype, bias_dtype, accepted):
    # torch's CPU kernel takes a 16-bit input with float32 weight and bias (all of them float32).
    torch.manual_seed(3)
    x = torch.randn(2, 3, dtype=torch.float16)
    w = None if weight_dtype is None else torch.randn(3, dtype=weight_dtype)
    b = None if bias_dtype is None else torch.randn(3, dtype=bias_dtype)
    if not accepted:
        with pytest.raises(Exception):
            torch.nn.functional.layer_norm(x, (3,), w, b)
        with pytest.raises(TypeError):
            fusedops.layer_norm(x, (3,), w, b)
        return
    expected = torch.nn.functional.layer_norm(x, (3,), w, b)
    actual = fusedops.layer_norm(x, (3,), w, b)
    assert actual.dtype == expected.dtype == torch.float16
    torch.testing.assert_close(actual, expected)


def test_argument_errors():
    x = torch.zeros(2, 3)
    with pytest.raises(TypeError, match="torch.int32"):
        fusedops.layer_norm(x.int(), (3,))
    with pytest.raises(TypeError, match="torch.complex64"):
        fusedops.rms_norm(x, (3,), torch.ones(3, dtype=torch.complex64))
    with pytest.raises(ValueError, match=r"expected input with shape \[\*, 4\]"):
        fusedops.layer_norm(x, (4,))
    with pytest.raises(ValueError, match="at least 1-dimensional"):
        fusedops.rms_norm(x, ())
    with pytest.raises(ValueError, match="same shape as normalized_shape"):
        fusedops.layer_norm(x, (3,), torch.ones(4))
    with pytest.raises(TypeError, match="normalized_shape"):
        fusedops.layer_norm(x, 3.0)


def test_cpu_tensors_run_torch_without_the_interpreter(monkeypatch, seed):
    monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)
    monkeypatch.setattr(norms, "norm_forward", None)     # any kernel launch would fail
    monkeypatch.setattr(norms, "norm_launches", None)
    x, w, b, _ = _inputs((3, 10), (10,), torch.float32, seed, True, True)
    assert torch.equal(fusedops.layer_norm(x, (10,), w, b), F.layer_norm(x, (10,), w, b))
    assert torch.equal(fusedops.rms_norm(x, (10,), w), F.rms_norm(x, (10,), w))


# -- modules ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{}, {"bias": False}, {"elementwise_affine": False}, {"eps": 1e-3}])
def test_layer_norm_module_matches_torch(interpret, kwargs, seed):
    ours, theirs = fusedops.nn.LayerNorm((3, 8), **kwargs), torch.nn.LayerNorm((3, 8), **kwargs)
    assert repr(ours) == repr(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    if ours.weight is not None:
        with torch.no_grad():
            theirs.weight.copy_(random_tensor((3, 8), torch.float32, "cpu", seed))
    ours.load_state_dict(theirs.state_dict())
    x = random_tensor((5, 3, 8), torch.float32, "cpu", seed + 1)
    params = [None if p is None else p.detach().double() for p in (theirs.weight, theirs.bias)]
    assert_close(ours(x), F.layer_norm(x.double(), (3, 8), *params, theirs.eps), torch.float32)
    theirs.load_state_dict(ours.state_dict())
    ours.reset_parameters()
    assert all(torch.equal(p, q) for p, q in zip(ours.state_dict().values(),
                                                  torch.nn.LayerNorm((3, 8), **kwargs).state_dict().values()))


@pytest.mark.parametrize("kwargs", [{}, {"elementwise_affine": False}, {"eps": 1e-3}])
def test_rms_norm_module_matches_torch(interpret, kwargs, seed):
    ours, theirs = fusedops.nn.RMSNorm(8, **kwargs), torch.nn.RMSNorm(8, **kwargs)
    assert repr(ours) == repr(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    x = random_tensor((5, 8), torch.float32, "cpu", seed).requires_grad_()
    y = ours(x)
    y.sum().backward()
    xd = x.detach().double().requires_grad_()
    eps = kwargs.get("eps", torch.finfo(torch.float32).eps)
    reference = F.rms_norm(xd, (8,), None if theirs.weight is None else theirs.weight.double(), eps)
    reference.sum().backward()
    assert_close(y, reference, torch.float32)
    assert_close(x.grad, xd.grad, torch.float32)
    assert isinstance(ours, torch.nn.RMSNorm)


def test_modules_accept_device_and_dtype():
    m = fusedops.nn.LayerNorm(4, device="cpu", dtype=torch.float64)
    assert m.weight.dtype == torch.float64 and m.bias.dtype == torch.float64
    assert fusedops.nn.RMSNorm([2, 3], dtype=torch.float16).weight.shape == (2, 3)


# -- the shipped GPU configurations compile without spills --------------------------------------------
def _shipped_launches(dtype, subtract_mean, sizes, monkeypatch):
    """(name, kernel, args, constexprs, num_warps) of the kernel launches the launchers prepare with their
    default configurations on a 132-SM GPU for (1024, n) rows of each of `sizes` columns in `dtype`: the
    forward and the backward of every gradient (LayerNorm with weight and bias, or RMSNorm with weight).
    Recorded from the launchers' `prepare` calls (nothing compiles or runs), so the kernels and
    constexprs are those the launchers pick; one per (kernel, constexprs, num_warps)."""
    launches = {}

    def recorder(kernel):
        def prepare(grid, *args, num_warps=4, interpret=None, **constexprs):
            key = (kernel.__name__, tuple(sorted(constexprs.items())), num_warps)
            launches.setdefault(key, (kernel.__name__, kernel, args, constexprs, num_warps))
            return lambda *tensors: None
        return prepare

    for module in (norm_forward_kernels, norm_row_sweeps, norm_backward_kernels, norm_split_window, norm_split_staged):
        for name, kernel in vars(module).items():
            if isinstance(kernel, dsl.JITFunction) and not name.startswith("_"):
                monkeypatch.setattr(kernel, "prepare", recorder(kernel))
    monkeypatch.setattr(norm_forward_launcher, "_sm_count", lambda device: 132)
    monkeypatch.setattr(norm_backward_launcher, "_sm_count", lambda device: 132)
    acc = norm_rows.accumulation_dtype(dtype)
    for n in sizes:
        x = torch.empty(1024, n, dtype=dtype)       # never written: its pages are not touched
        weight = torch.empty(n, dtype=dtype)
        bias = torch.empty(n, dtype=dtype) if subtract_mean else None
        mean = torch.empty(1024, dtype=acc) if subtract_mean else None
        rstd = torch.empty(1024, dtype=acc)
        norm_forward_launcher.forward_launcher(x, weight, bias, 1e-5, subtract_mean, None, None, True, torch.empty)
        norm_backward_launcher.backward_launcher(x, x, weight, mean, rstd, subtract_mean, True, True, subtract_mean,
                                                 dtype, None, None, True, torch.empty)
    return list(launches.values())


# Every power of two up to the looped forward for float16 LayerNorm (every configuration the heuristics
# have: each row size class picks its own tiles, warps and options), and the largest rows that are not a
# multiple of 8 of each warp count (the fused backward; unaligned forward rows; 12289: the aligned-window
# forward; 20001: unaligned rows of the 32768 block, whose forward re-reads x); for the others, the sizes
# where register pressure peaks (RMSNorm and bfloat16 keep fewer values live than LayerNorm and float16
# do) and, for bfloat16 LayerNorm, the sizes of its forward options.
ALL_SIZES = tuple(1 << k for k in range(17)) + (2049, 4097, 12289, 20001)
LARGE_SIZES = (1024, 4096, 8192, 16384, 32768, 65536)
# Shipped launches that ptxas spills, (dtype, kernel, BLOCK_N, SUBTRACT_MEAN[, ALIGN]) -> at most these bytes
# of spill stores (ptxas of CUDA 13.0): kept for their H200 times, bounded so that no new spill passes. A key
# with ALIGN applies to launches of that ALIGN only (and comes first).
KNOWN_SPILLS = {
    # N=8192 LayerNorm, the persistent backward with the next row prefetched (H200, fp16: 0.140 ms, against
    # 0.162 without the prefetch (12 bytes) and the fused 0.189, spills included; TWO_PASS: no spill, 0.229;
    # session 22's dx from x and dy, norm_backward_kernels._input_gradient: 0.126 ms, 16-24 bytes)
    (torch.float16, "backward_persistent_kernel", 8192, True): 24,
    (torch.bfloat16, "backward_persistent_kernel", 8192, True): 24,
    # N=16384 and 32768 LayerNorm in clusters of 2048- and 4096-column parts with the next row prefetched
    # (session 22, H200, fp16, x torch's backward: 16384 1.78x against 1.60x for 8192-column halves and 1.73x
    # for 4096-column parts; 32768 1.71x against 1.64x without the prefetch, no spill)
    (torch.float16, "backward_persistent_kernel", 2048, True, 8): 20,
    (torch.bfloat16, "backward_persistent_kernel", 2048, True, 8): 20,
    (torch.float16, "backward_persistent_kernel", 4096, True, 8): 20,
    (torch.bfloat16, "backward_persistent_kernel", 4096, True, 8): 20,
    # 8193..32761 columns, not a multiple of 8: the backward in clusters through the aligned window with the
    # next row prefetched (H200, fp16, 12289: LayerNorm 1.17x torch's against 0.87x without the prefetch,
    # no spill, and the split backward's 0.76x; RMSNorm 1.41x). Session 29: the window's masks computed once
    # per program (148 -> 68-76 bytes; RMSNorm 52 -> 0)
    # those of up to 8 * 2048 - 7 columns in 2048-column parts, 4 warps, 4 CTAs per SM (128 registers; H200,
    # fp16, 12289, session 25: LayerNorm 1.35x torch's against the 4096-column parts' 1.25x; session 29:
    # 1.42x, 120 -> 68-76 bytes, RMSNorm 12 -> 0). Session 42: the split window's whole-vector parts and edges
    # (EDGES) instead, 128-140 bytes (RMSNorm 0) but faster (H100, fp16, 12289: LayerNorm 1.67x -> 2.11x torch's)
    (torch.float16, "backward_persistent_kernel", 4096, True, 1): 144,
    (torch.bfloat16, "backward_persistent_kernel", 4096, True, 1): 144,
    (torch.float16, "backward_persistent_kernel", 2048, True, 1): 144,
    (torch.bfloat16, "backward_persistent_kernel", 2048, True, 1): 144,
    # 4097..8191 columns, not a multiple of 8 (unvectorized rows): the fused backward (0.66x torch's at 4097)
    (torch.float16, "backward_fused_kernel", 8192, True): 192,
    (torch.bfloat16, "backward_fused_kernel", 8192, False): 80,
    # 16385..32767 columns, not a multiple of 8 (ALIGN 1: unvectorized rows; no aligned window for this
    # block): the forward, reload in 8 chunks (unmeasured; the whole-row tiles before it spilled 306 bytes)
    (torch.float16, "forward_kernel", 32768, True, 1): 244,
    (torch.bfloat16, "forward_kernel", 32768, True, 1): 244,
}
HALF_LAYER_NORM_SIZES = (1024, 2048, 4096, 8192, 16384, 32768)


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
@pytest.mark.parametrize("dtype, subtract_mean, sizes", [(torch.float16, True, ALL_SIZES),
                                                         (torch.float32, True, LARGE_SIZES),
                                                         (torch.bfloat16, True, HALF_LAYER_NORM_SIZES + (20001,)),
                                                         (torch.bfloat16, False, LARGE_SIZES + (4097, 12289, 20001))])
def test_shipped_configs_assemble_for_sm90a_without_spills(dtype, subtract_mean, sizes, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    launches = _shipped_launches(dtype, subtract_mean, sizes, monkeypatch)
    names = {name for name, *_ in launches}
    if dtype.itemsize == 2:     # the persistent backward and (odd rows) the aligned-window row sweeps are shipped
        assert "backward_persistent_kernel" in names
        odd = [n for n in sizes if n % 8 and n > 12289]
        if any(n % 8 and 4097 < n <= 12289 for n in sizes):         # and the staged split window
            assert "forward_split_staged_kernel" in names
        assert not odd or any(name == "forward_row_sweeps_kernel" and constexprs.get("SHIFT")
                              for name, _, _, constexprs, _ in launches)
        if any(n % 8 and 514 <= n <= 4097 for n in sizes):         # and the split window
            assert "backward_split_kernel" in names
            assert {"forward_split_kernel", "forward_split_persistent_kernel"} & names
    if dtype.itemsize == 2 and subtract_mean:       # and LayerNorm's forward options (forward_config)
        options = {(constexprs.get("BLOCK_ROWS"), constexprs.get("SHIFTED_SUMS"))
                   for name, _, _, constexprs, _ in launches if name == "forward_kernel"}
        assert {(1, True)} <= options
    monkeypatch.undo()          # compile with the kernels' own prepare
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    for name, kernel, args, constexprs, num_warps in launches:
        compiled = kernel.compile(*args, target="sm_90a", num_warps=num_warps, **constexprs)
        result = assemble(compiled.asm["ptx"], "sm_90a")
        key = (dtype, name, constexprs.get("BLOCK_N", constexprs.get("CHUNK")), constexprs.get("SUBTRACT_MEAN"))
        known = KNOWN_SPILLS.get(key + (constexprs.get("ALIGN"),), KNOWN_SPILLS.get(key, 0))
        assert result.spill_bytes <= known, (name, constexprs, num_warps, result.log)


# -- GPU tier -----------------------------------------------------------------------------------------
def _poisoned_empty(shape, dtype, device):
    return poison(torch.empty(shape, dtype=dtype, device=device))


# Each row-size class (one-pass forward / looped, fused / split backward) with odd and aligned sizes.
GPU_SHAPES = [(1, 1), (3, 17), (127, 1000), (33, 4097), (16, 8192), (9, 12289), (5, 32768), (3, 40000)]


@pytest.mark.cuda
@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", GPU_SHAPES)
def test_gpu_kernels_poisoned_outputs(op, dtype, shape, seed):
    subtract_mean = op == LAYER_NORM
    x, w, b, dy = _inputs(shape, shape[-1:], dtype, seed, True, subtract_mean, device="cuda")
    y, mean, rstd = norms.norm_forward(x, w, b, 1e-5, subtract_mean=subtract_mean, allocate=_poisoned_empty)
    dx, dw, db = norms.norm_backward(dy, x, w, mean, rstd, subtract_mean=subtract_mean, input_grad=True,
                                     weight_grad=True, bias_grad=subtract_mean, bias_dtype=dtype,
                                     allocate=_poisoned_empty)
    _compare(op, shape[-1:], (y.view(shape), dx, dw, db), _reference(op, x, shape[-1:], w, b, 1e-5, dy), dtype)


# 16-bit LayerNorm's forward options (forward_config) beyond GPU_SHAPES' (1000: hints; 8192 and 32768: the
# row sweeps): 2-row tiles with hints at the 4096 block (full and shorter rows), the row sweeps of the 16384
# block (full and shorter rows), the row sweeps through the aligned window for unaligned rows of the 32768
# block; the backward of the same rows (fused, split).
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("shape, option", [((257, 4096), "shifted_sums"), ((129, 4000), "shifted_sums"),
                                           ((65, 16384), "row_sweeps"), ((33, 16000), "row_sweeps"),
                                           ((17, 20001), "aligned_window")])
def test_gpu_layer_norm_forward_options_poisoned_outputs(dtype, shape, option, seed):
    assert getattr(norm_forward_config.forward_config(shape[1], dtype, subtract_mean=True), option)
    x, w, b, dy = _inputs(shape, shape[-1:], dtype, seed, True, True, device="cuda")
    x = x * 3 + 0.25                            # a mean away from 0
    y, mean, rstd = norms.norm_forward(x, w, b, 1e-5, subtract_mean=True, allocate=_poisoned_empty)
    x64 = x.double()
    assert_close(mean, x64.mean(-1), torch.float32)
    assert_close(rstd, torch.rsqrt((x64 - x64.mean(-1, keepdim=True)).pow(2).mean(-1) + 1e-5), torch.float32)
    dx, dw, db = norms.norm_backward(dy, x, w, mean, rstd, subtract_mean=True, input_grad=True, weight_grad=True,
                                     bias_grad=True, bias_dtype=dtype, allocate=_poisoned_empty)
    _compare(LAYER_NORM, shape[-1:], (y, dx, dw, db), _reference(LAYER_NORM, x, shape[-1:], w, b, 1e-5, dy), dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("n_cols", [1000, 2047, 2048, 4096, 8192, 12289, 32768])
def test_gpu_shifted_sums_within_twice_torchs_error_on_hard_rows(dtype, n_cols, seed, monkeypatch):
    # test_shifted_sums_within_twice_torchs_error_on_hard_rows on the GPU, against torch's CUDA kernel, with
    # the hard rows among 300 ordinary ones and poisoned outputs (2047: the split window's shifted sums; 8192
    # and up: the row sweeps', norm_forward_config.ROW_SWEEP_SHIFTED_SUMS).
    monkeypatch.setattr(norm_forward_config, "ROW_SWEEP_SHIFTED_SUMS", True)
    monkeypatch.setattr(norms, "_FORWARD_LAUNCHES", BoundedCache(1024))
    config = norm_forward_config.forward_config(n_cols, dtype, subtract_mean=True)
    assert config.shifted_sums or config.split_window
    x = torch.cat([_hard_rows(n_cols, dtype, seed), random_tensor((300, n_cols), dtype, seed=seed + 3) * 3 + 0.25])
    x = x.cuda()
    w, b = (random_tensor((n_cols,), dtype, "cuda", seed + i) for i in (1, 2))
    y, mean, rstd = norms.norm_forward(x, w, b, 1e-5, subtract_mean=True, allocate=_poisoned_empty)
    _check_hard_rows(x, w, b, y, mean, rstd, config)


@pytest.mark.cuda
@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_gpu_default_odd_rows_read_shifted_affine_copies(op, dtype, seed):
    # Odd rows of the default window row sweeps, enough elements for the shifted weight/bias copies (20001:
    # 12289 takes the staged split window, tests/test_norm_split_staged.py).
    shape = (401, 20001)
    config = norm_forward_config.forward_config(shape[1], dtype, subtract_mean=op == LAYER_NORM)
    assert config.shifted_affine and shape[0] * shape[1] >= norm_forward_launcher.SHIFTED_AFFINE_MIN_ELEMENTS
    x, w, b, dy = _inputs(shape, shape[-1:], dtype, seed, True, op == LAYER_NORM, device="cuda")
    actual = _run(op, x, shape[-1:], w, b, 1e-5, dy)
    _compare(op, shape[-1:], actual, _reference(op, x, shape[-1:], w, b, 1e-5, dy), dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("weight, bias", AFFINE)
def test_gpu_public_functions_every_affine_combination(op, weight, bias, seed):
    if op == RMS_NORM and bias:
        pytest.skip("RMSNorm has no bias")
    x, w, b, dy = _inputs((4, 7, 777), (7, 777), torch.bfloat16, seed, weight, bias, device="cuda")
    actual = _run(op, x, (7, 777), w, b, 1e-5, dy)
    _compare(op, (7, 777), actual, _reference(op, x, (7, 777), w, b, 1e-5, dy), torch.bfloat16)


@pytest.mark.cuda
@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("n_cols", [2048, 16384])       # 16384: the backward in clusters
def test_gpu_strided_and_expanded(op, n_cols, seed):
    x, w, b, _ = _inputs((64, n_cols), (n_cols,), torch.float16, seed, True, op == LAYER_NORM, device="cuda")
    _check_views(op, x, w, b, torch.float16)


@pytest.mark.large_memory
@pytest.mark.cuda
@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
def test_gpu_more_than_65535_programs_and_deterministic(op, seed):
    subtract_mean = op == LAYER_NORM
    rows_per_program = norm_forward_config.forward_config(2048, torch.float16, subtract_mean=subtract_mean).block_rows
    shape = (70001 * rows_per_program, 2048)        # the forward launches 70001 programs
    x, w, b, dy = _inputs(shape, shape[-1:], torch.float16, seed, True, subtract_mean, device="cuda")
    first = _run(op, x, shape[-1:], w, b, 1e-5, dy)
    second = _run(op, x, shape[-1:], w, b, 1e-5, dy)
    for a, c, e in zip(first, second, _reference(op, x, shape[-1:], w, b, 1e-5, dy)):
        if e is not None:
            assert_close(a, e, torch.float16)
            assert torch.equal(a, c)        # bitwise: no atomics in the dweight/dbias reduction


@pytest.mark.cuda
@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
# the persistent backward; in clusters; the split backward and the looped forward
@pytest.mark.large_memory
@pytest.mark.parametrize("n_cols", [8192, 16384, 65536])
def test_gpu_more_than_2_31_elements(op, n_cols, seed):
    n_rows = 2**31 // n_cols + 3                    # 2**31 + 3 * n_cols elements: int64 row offsets needed
    subtract_mean = op == LAYER_NORM
    x = torch.randn((n_rows, n_cols), dtype=torch.float16, device="cuda")
    w = random_tensor((n_cols,), torch.float16, "cuda", seed, scale=0.5) + 1
    b = random_tensor((n_cols,), torch.float16, "cuda", seed + 1) if subtract_mean else None
    y, mean, rstd = norms.norm_forward(x, w, b, 1e-5, subtract_mean=subtract_mean)
    dy = torch.randn_like(x)
    dx, dw, _ = norms.norm_backward(dy, x, w, mean, rstd, subtract_mean=subtract_mean, input_grad=True,
                                    weight_grad=True, bias_grad=False)
    boundary = 2**31 // n_cols                      # the first row past element 2**31
    rows = torch.tensor([0, 1, n_rows // 2, boundary - 1, boundary, n_rows - 1], device="cuda")
    expected = _reference(op, x[rows], (n_cols,), w, b, 1e-5, dy[rows])
    assert_close(y[rows], expected[0], torch.float16)
    assert_close(dx[rows], expected[1], torch.float16)
    # dweight sums every row: the reference in float64, 4096 rows at a time to bound its memory
    reference_dw = torch.zeros(n_cols, dtype=torch.float64, device="cuda")
    for start in range(0, n_rows, 4096):
        xs = x[start:start + 4096].double()
        if subtract_mean:
            xs = xs - xs.mean(-1, keepdim=True)
        xhat = xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + 1e-5)
        reference_dw += (dy[start:start + 4096].double() * xhat).sum(0)
    assert_close(dw, reference_dw, torch.float16)
    assert x.numel() > 2**31


@pytest.mark.cuda
def test_gpu_modules_match_torch(seed):
    for ours, theirs in ((fusedops.nn.LayerNorm(3000), torch.nn.LayerNorm(3000)),
                         (fusedops.nn.RMSNorm(3000), torch.nn.RMSNorm(3000))):
        theirs.load_state_dict({k: random_tensor(v.shape, torch.float32, "cpu", seed) + 1
                                for k, v in theirs.state_dict().items()})
        ours.load_state_dict(theirs.state_dict())
        ours, theirs = ours.cuda().half(), theirs.cuda().double()
        x = random_tensor((7, 11, 3000), torch.float16, "cuda", seed + 1)
        dy = random_tensor((7, 11, 3000), torch.float16, "cuda", seed + 2)
        leaf, reference_leaf = x.clone().requires_grad_(), x.double().requires_grad_()
        ours(leaf).backward(dy)
        theirs(reference_leaf).backward(dy.double())
        assert_close(leaf.grad, reference_leaf.grad, torch.float16)
        for p, q in zip(ours.parameters(), theirs.parameters()):
            assert_close(p.grad, q.grad, torch.float16)


@pytest.mark.cuda
def test_gpu_layer_norm_under_autocast_runs_in_float32(seed):
    ours, theirs = fusedops.nn.LayerNorm(1000).cuda(), torch.nn.LayerNorm(1000).cuda()
    x = random_tensor((64, 1000), torch.float16, "cuda", seed)
    with torch.autocast("cuda", dtype=torch.float16):
        y, reference = ours(x), theirs(x)
    assert y.dtype == reference.dtype == torch.float32
    assert_close(y, F.layer_norm(x.double(), (1000,)), torch.float32)


# -- issue-5 candidate configurations (bench/layernorm.py --sweep, .scratch/ln_sweep.py) compile --------
def _candidate_launches():
    """(name, kernel, args, constexprs, num_warps, spill_free) of the GPU candidates at fp16 LayerNorm."""
    x = torch.empty(64, dtype=torch.float16)
    stats = torch.empty(64)
    launches = []
    for n, warps in ((1024, 4), (2048, 4), (4096, 8), (8192, 16), (16384, 16)):
        forward_args = (x, stats, stats, x, x, x, 8192, n, n, 1, n, 1e-5)
        launches.append(("forward affine_first", norm_forward_kernels.forward_kernel, forward_args,
                         dict(SUBTRACT_MEAN=True, BLOCK_ROWS=1, BLOCK_N=n, AFFINE_FIRST=True), warps, True))
        if n <= 8192:
            launches.append(("forward persistent", norm_forward_kernels.forward_persistent_kernel, forward_args,
                             dict(SUBTRACT_MEAN=True, BLOCK_ROWS=1, BLOCK_N=n, PREFETCH=True), warps, True))
    launches.append(("forward looped persistent", norm_forward_kernels.forward_looped_kernel,
                     (x, stats, stats, x, x, x, 8192, 32768, 32768, 1, 32768, 1e-5),
                     dict(SUBTRACT_MEAN=True, BLOCK_N=8192), 16, True))
    for n, block_n, warps, prefetch, two_pass in ((1024, 1024, 4, True, False), (2048, 2048, 8, True, False),
                                                  (4096, 4096, 8, True, False), (16384, 8192, 16, False, True)):
        launches.append(("backward persistent", norm_backward_kernels.backward_persistent_kernel,
                         (x, stats, stats, x, x, x, stats, stats, 8192, n, 132, n // block_n, n, 1, n, 1, n),
                         dict(SUBTRACT_MEAN=True, BLOCK_ROWS=1, BLOCK_N=block_n, TWO_PASS=two_pass, CHUNK=4096,
                              PREFETCH=prefetch), warps, True))
    # The aligned window (odd N) costs registers: assembled, spills allowed (the GPU sweep decides).
    launches.append(("forward window", norm_forward_kernels.forward_kernel,
                     (x, stats, stats, x, x, x, 8192, 12289, 12289, 1, 12289, 1e-5),
                     dict(SUBTRACT_MEAN=True, BLOCK_ROWS=1, BLOCK_N=16384, SHIFT=8), 8, True))
    launches.append(("backward window", norm_backward_kernels.backward_persistent_kernel,
                     (x, stats, stats, x, x, x, stats, stats, 8192, 4097, 136, 1, 4097, 1, 4097, 1, 4097),
                     dict(SUBTRACT_MEAN=True, BLOCK_ROWS=1, BLOCK_N=8192, TWO_PASS=False, CHUNK=4096, PREFETCH=False,
                          SHIFT=8), 16, False))
    return launches


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
def test_issue5_candidate_configs_assemble_for_sm90a(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    for name, kernel, args, constexprs, num_warps, spill_free in _candidate_launches():
        compiled = kernel.compile(*args, target="sm_90a", num_warps=num_warps, **constexprs)
        result = assemble(compiled.asm["ptx"], "sm_90a")
        assert not spill_free or result.spill_bytes == 0, (name, constexprs, num_warps, result.log)
