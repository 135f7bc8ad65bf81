"""LayerNorm/RMSNorm of 16-bit rows off 16-byte boundaries through the split window
(fusedops/kernels/norm_split_window.py; ForwardConfig/BackwardConfig.split_window).

CPU tier: the defaults pick it for odd rows of 514..4097 columns only; the interpreter against torch in
float64 with poisoned outputs: rows whose N - 1 fills the main tile exactly (1025, 2049, 4097) and shorter
ones, rows starting at every offset modulo the vector (consecutive rows of odd N, sliced views), both ops,
every affine combination, float16/bfloat16, the one-program-per-row and persistent forwards (prefetch or
not, output chunks), fewer rows than programs, layouts it does not apply to (strided x, expanded dy: the
launchers' other choice runs), the shifted sums' far outlier; ptxas: the shipped kernels assemble with
16-byte accesses, one exchange for the statistics and no spills. GPU tier (`-m cuda`): the same with
poisoned outputs at many rows, sliced views, > 2**31 elements.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
import torch.nn.functional as F

from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels import norm_split_window as W
from fusedops.kernels import norm_backward_config
from fusedops.kernels import norm_forward_config
from fusedops.kernels import norms
from helpers import assert_close, poison, random_tensor

LAYER_NORM, RMS_NORM = True, False
OPS = pytest.mark.parametrize("subtract_mean", [LAYER_NORM, RMS_NORM], ids=["layer_norm", "rms_norm"])
HALF = pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
AFFINE = [(True, True), (True, False), (False, True), (False, False)]


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")


def _poisoned_empty(shape, dtype, device):
    return poison(torch.empty(shape, dtype=dtype, device=device))


def _check(x, subtract_mean, seed, weight=True, bias=True, dy=None, forward_config=None, backward_config=None):
    """norm_forward and norm_backward of x (poisoned outputs; default or given configs) against torch in
    float64: y, mean, rstd, dx, dweight, dbias."""
    n, dtype = x.shape[-1], x.dtype
    w = random_tensor((n,), dtype, x.device, seed + 1, scale=0.5) + 1 if weight else None
    b = random_tensor((n,), dtype, x.device, seed + 2) if bias and subtract_mean else None
    dy = random_tensor(x.shape, dtype, x.device, seed + 3) if dy is None else dy
    y, mean, rstd = norms.norm_forward(x, w, b, 1e-5, subtract_mean=subtract_mean, config=forward_config,
                                       allocate=_poisoned_empty)
    dx, dw, db = norms.norm_backward(dy, x, w, mean, rstd, subtract_mean=subtract_mean, input_grad=True,
                                     weight_grad=w is not None, bias_grad=b is not None, bias_dtype=dtype,
                                     config=backward_config, allocate=_poisoned_empty)
    leaves = [None if t is None else t.detach().double().requires_grad_() for t in (x, w, b)]
    x64, w64, b64 = leaves
    if subtract_mean:
        reference = F.layer_norm(x64, (n,), w64, b64, 1e-5)
        assert_close(mean, x64.detach().mean(-1), torch.float32)
        variance = x64.detach().var(-1, unbiased=False)
    else:
        reference = F.rms_norm(x64, (n,), w64, 1e-5)
        assert mean is None
        variance = x64.detach().pow(2).mean(-1)
    assert_close(rstd, torch.rsqrt(variance + 1e-5), torch.float32)
    reference.backward(dy.double())
    assert_close(y, reference.detach(), dtype)
    for actual, leaf in ((dx, x64), (dw, w64), (db, b64)):
        assert (actual is None) == (leaf is None)
        if actual is not None:
            assert actual.dtype == dtype
            assert_close(actual, leaf.grad, dtype)


# -- the defaults ---------------------------------------------------------------------------------------
@HALF
@OPS
def test_defaults_take_the_split_window_for_odd_rows_of_514_to_4097_columns(dtype, subtract_mean):
    for n in (514, 777, 1023, 1025, 1031, 1500, 2047, 2049, 3001, 4095, 4097):
        forward = norm_forward_config.forward_config(n, dtype, subtract_mean=subtract_mean)
        backward = norm_backward_config.backward_config(n, dtype, subtract_mean=subtract_mean)
        assert forward.split_window and backward.split_window, n
        assert forward.block_n == backward.block_n == 1 << (n - 2).bit_length() >= n - 1, n
    for n in (100, 513, 1000, 1024, 2048, 4096, 4104, 4105, 12289):
        forward = norm_forward_config.forward_config(n, dtype, subtract_mean=subtract_mean)
        # (odd rows of 4098..12289 columns take the staged window: tests/test_norm_split_staged.py)
        assert not forward.split_window or forward.staged_affine, n
        assert not norm_backward_config.backward_config(n, dtype, subtract_mean=subtract_mean).split_window, n
    assert not norm_forward_config.forward_config(4097, torch.float32, subtract_mean=subtract_mean).split_window
    assert not norm_backward_config.backward_config(4097, torch.float32, subtract_mean=subtract_mean).split_window


# -- CPU tier: the interpreter ------------------------------------------------------------------------
@HALF
@OPS
@pytest.mark.parametrize("shape", [(11, 1025), (9, 2049), (5, 3001), (9, 4097), (10, 1031)])
def test_default_launches_match_float64(interpret, dtype, subtract_mean, shape, seed):
    # Nine or more consecutive rows of odd N start at every offset modulo 8 (1031: N = 7 mod 8);
    # N - 1 = the main tile exactly at 1025, 2049, 4097; a mean away from 0 for the shifted sums.
    _check(random_tensor(shape, dtype, "cpu", seed) * 3 + 0.25, subtract_mean, seed)


@OPS
@pytest.mark.parametrize("weight, bias", AFFINE)
def test_every_affine_combination(interpret, subtract_mean, weight, bias, seed):
    _check(random_tensor((9, 1025), torch.float16, "cpu", seed), subtract_mean, seed, weight, bias)


# Forward variants forced at 1025 columns: one program per row (output chunks or not) and persistent grids
# (4 "SMs" in the interpreter: 8 programs at 2 per SM, 24 at 6) with and without the prefetch, over fewer
# rows than programs and more.
FORWARD_VARIANTS = {
    "per-row": dict(programs_per_sm=0, output_chunks=1),
    "per-row-chunks": dict(programs_per_sm=0, output_chunks=4),
    "persistent": dict(programs_per_sm=2, prefetch=False),
    "persistent-prefetch": dict(programs_per_sm=6, prefetch=True),
}


@pytest.mark.parametrize("variant", list(FORWARD_VARIANTS))
@OPS
@pytest.mark.parametrize("n_rows", [3, 37])
def test_forward_variants(interpret, variant, subtract_mean, n_rows, seed):
    base = norm_forward_config.forward_config(1025, torch.float16, subtract_mean=subtract_mean)
    config = dataclasses.replace(base, **FORWARD_VARIANTS[variant])
    _check(random_tensor((n_rows, 1025), torch.float16, "cpu", seed) - 2, subtract_mean, seed, forward_config=config)


@OPS
@pytest.mark.parametrize("programs_per_sm, prefetch", [(1, False), (6, True)])
@pytest.mark.parametrize("n_rows", [2, 29])
def test_backward_variants(interpret, subtract_mean, programs_per_sm, prefetch, n_rows, seed):
    # 8 or 24 programs (rounded up to a multiple of 8: each lane keeps one window offset) over fewer or more rows.
    base = norm_backward_config.backward_config(1031, torch.bfloat16, subtract_mean=subtract_mean)
    config = dataclasses.replace(base, programs_per_sm=programs_per_sm, prefetch=prefetch)
    _check(random_tensor((n_rows, 1031), torch.bfloat16, "cpu", seed), subtract_mean, seed, backward_config=config)


@OPS
def test_sliced_views_off_16_byte_boundaries(interpret, subtract_mean, seed):
    # The window is relative to the tensor's first element: views at odd element offsets of a larger buffer.
    flat = random_tensor((7 * 2049 + 8,), torch.float16, "cpu", seed)
    for offset in (1, 4, 7):
        _check(flat[offset:offset + 7 * 2049].view(7, 2049), subtract_mean, seed)


@OPS
def test_layouts_outside_the_window_take_the_other_kernels(interpret, subtract_mean, seed):
    # Rows of stride != N (a column slice) and an expanded dy: the window does not apply; the launchers fall
    # back to forward_config / backward_config without it (and must not read past the rows).
    wide = random_tensor((6, 1100), torch.float16, "cpu", seed)
    x = wide[:, :1025]
    _check(x, subtract_mean, seed)
    dy = random_tensor((1, 1025), torch.float16, "cpu", seed + 5).expand(6, 1025)
    _check(random_tensor((6, 1025), torch.float16, "cpu", seed), subtract_mean, seed, dy=dy)


def test_far_outlier_in_a_sampled_column(interpret, seed):
    # The shifted sums' shift is a median of three sampled columns (0, (N - 1) // 2, N - 1): one outlier
    # there is never the shift, and the statistics keep torch's accuracy.
    x = random_tensor((9, 2049), torch.float16, "cpu", seed) + 100
    x[:, 0] = 6e4
    x[3, 2048] = -6e4
    _check(x, LAYER_NORM, seed)


# -- CPU tier: ptxas --------------------------------------------------------------------------------
def _shipped_split_ptx(n, dtype, subtract_mean, parameter_dtype=None):
    """The PTX of the split-window kernels the defaults pick for (8192, n) rows of `dtype` (sm_90a), with weight
    (and for LayerNorm bias) of `parameter_dtype` (default: dtype), every gradient: {kernel name: ptx}."""
    x = torch.empty(64, dtype=dtype, device="meta")
    p = torch.empty(64, dtype=parameter_dtype or dtype, device="meta")
    stats = torch.empty(64, dtype=torch.float32, device="meta")
    mean, bias = (stats, p) if subtract_mean else (None, None)
    forward = norm_forward_config.forward_config(n, dtype, subtract_mean=subtract_mean)
    tiles = dict(SUBTRACT_MEAN=subtract_mean, BLOCK_ROWS=1, BLOCK_N=forward.block_n, SHIFT=8,
                 num_warps=forward.num_warps, target="sm_90a")
    args = (x, mean, stats, x, p, bias, 8192, n, n, 1e-5)
    if forward.programs_per_sm:
        fwd = W.forward_split_persistent_kernel.compile(*args, PREFETCH=forward.prefetch, **tiles)
    else:
        fwd = W.forward_split_kernel.compile(*args, CHUNKS=forward.output_chunks, **tiles)
    backward = norm_backward_config.backward_config(n, dtype, subtract_mean=subtract_mean)
    bwd = W.backward_split_kernel.compile(x, stats, stats if subtract_mean else None, x, x, p, mean, stats, 8192, n,
                                          n, SUBTRACT_MEAN=subtract_mean, BLOCK_ROWS=1, BLOCK_N=backward.block_n,
                                          SHIFT=8, PREFETCH=backward.prefetch, num_warps=backward.num_warps,
                                          target="sm_90a")
    return {"forward": fwd.asm["ptx"], "backward": bwd.asm["ptx"]}


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
@HALF
@OPS
@pytest.mark.parametrize("n", [1025, 2049, 4097])
def test_shipped_kernels_assemble_with_vectors_one_exchange_no_spills(dtype, subtract_mean, n, tmp_path,
                                                                        monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    for name, ptx in _shipped_split_ptx(n, dtype, subtract_mean).items():
        assert re.search(r"ld\.global[.\w:]*\.v4", ptx) and re.search(r"st\.global[.\w:]*\.v[24]", ptx), name
        # the row statistics in one exchange (LayerNorm's forward: and one in the loop of its rare second sums)
        assert ptx.count("bar.sync") == (4 if name == "forward" and subtract_mean else 2), name
        assert assemble(ptx, "sm_90a").spill_bytes == 0, name


# -- GPU tier ---------------------------------------------------------------------------------------------
@pytest.mark.cuda
@HALF
@OPS
@pytest.mark.parametrize("shape", [(1000, 1025), (517, 2049), (333, 3001), (1001, 4097), (64, 1031)])
def test_gpu_default_launches_poisoned_outputs(dtype, subtract_mean, shape, seed):
    x = random_tensor(shape, dtype, "cuda", seed) * 3 + 0.25
    _check(x, subtract_mean, seed)
    flat = random_tensor((shape[0] * shape[1] + 8,), dtype, "cuda", seed + 1)
    for offset in (1, 3, 6):                                            # sliced views off 16-byte boundaries
        _check(flat[offset:offset + shape[0] * shape[1]].view(shape), subtract_mean, seed)


@pytest.mark.cuda
@OPS
@pytest.mark.parametrize("variant", list(FORWARD_VARIANTS))
def test_gpu_forward_variants(variant, subtract_mean, seed):
    config = dataclasses.replace(norm_forward_config.forward_config(4097, torch.float16, subtract_mean=subtract_mean),
                                 **FORWARD_VARIANTS[variant])
    _check(random_tensor((700, 4097), torch.float16, "cuda", seed), subtract_mean, seed, forward_config=config)


@pytest.mark.large_memory
@pytest.mark.cuda
@OPS
def test_gpu_more_than_2_31_elements(subtract_mean, seed):
    n_cols = 4097
    n_rows = 2**31 // n_cols + 3                    # int64 row offsets needed past row 2**31 // n_cols
    x = torch.randn((n_rows, n_cols), dtype=torch.float16, device="cuda")
    w = random_tensor((n_cols,), torch.float16, "cuda", seed, scale=0.5) + 1
    b = random_tensor((n_cols,), torch.float16, "cuda", seed + 1) if subtract_mean else None
    assert norm_forward_config.forward_config(n_cols, x.dtype, subtract_mean=subtract_mean).split_window
    y, mean, rstd = norms.norm_forward(x, w, b, 1e-5, subtract_mean=subtract_mean)
    dy = torch.randn_like(x)
    dx, dw, _ = norms.norm_backward(dy, x, w, mean, rstd, subtract_mean=subtract_mean, input_grad=True,
                                    weight_grad=True, bias_grad=False)
    boundary = 2**31 // n_cols
    rows = torch.tensor([0, 1, n_rows // 2, boundary - 1, boundary, n_rows - 1], device="cuda")
    leaves = [t.double().requires_grad_() for t in (x[rows], w)]
    reference = (F.layer_norm(leaves[0], (n_cols,), leaves[1], None if b is None else b.double(), 1e-5)
                 if subtract_mean else F.rms_norm(leaves[0], (n_cols,), leaves[1], 1e-5))
    reference.backward(dy[rows].double())
    assert_close(y[rows], reference.detach(), torch.float16)
    assert_close(dx[rows], leaves[0].grad, torch.float16)
    reference_dw = torch.zeros(n_cols, dtype=torch.float64, device="cuda")
    for start in range(0, n_rows, 4096):
        xs = x[start:start + 4096].double()
        if subtract_mean:
            xs = xs - xs.mean(-1, keepdim=True)
        reference_dw += (dy[start:start + 4096].double() * xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + 1e-5)
                         ).sum(0)
    assert_close(dw, reference_dw, torch.float16)
