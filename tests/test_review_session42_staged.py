"""Review (session 42): a demanding user tried to break the staged-affine split window, the LayerNorm / RMSNorm
forward of 16-bit rows of 4098..12289 columns off 16-byte boundaries (N % 8 != 0): whole rows in registers in
1-3 main tiles plus 2 * SHIFT edge lanes, a persistent grid (a multiple of 8 programs), weight and bias staged
by each program into shifted copies of a scratch buffer (fusedops/kernels/norm_split_staged.py,
ForwardConfig.staged_affine / main_tiles, norm_forward_launcher's staged branch).

Everything runs in the CPU interpreter (FUSEDOPS_INTERPRET=1) against torch in float64 from the same 16-bit values
(helpers.assert_close), outputs AND the staged copies poisoned (NaN) through `allocate=` wherever the launcher is
called directly (a position a program read before staging it would be NaN). The launcher's `_sm_count` is
patched to 1-5 "SMs" (fresh launch caches) so that 8-16 programs walk many rows each; a spy on
forward_split_staged_kernel.prepare checks that each case really ran the new kernel (TILES, BLOCK_N, grid).

Tried (peer report -> case here), all right unless listed under DEFECTS:
- Liger-Kernel #518/#519 (masked lanes entering the mean/variance of non-power-of-two rows), ROCm aiter #5290
  (an unaligned row's vector store spilling into the next row) -> every N mod 8 at the config boundaries
  (4098..4103, 6145/6146, 8193/8194, 10241, 12287/12289), nine rows (every `first` of odd N), the
  default configs' TILES x BLOCK_N, and the rows just outside the staged range not taking it.
- flashinfer #634 / cuTAGI #92 (misaligned-address faults of odd hidden sizes) -> sliced views at offsets 0, 2,
  5, 7, 3-D inputs, a launch cache hit at another storage offset; layouts the window does not apply to
  (transposed, expanded, row-strided) fall back to another kernel with correct values.
- vllm-xpu #316 / sparkinfer #705 (shared scratch reused across rows / programs racing) -> fewer rows than
  programs, 0 / 1 rows, rows per program 1..3 with prefetch and without (values bitwise the same on 8 and on
  16-24 programs), the scratch poisoned; weight and bias
  updated in place between two calls of one cached launch (the copies are staged anew, never cached).
- weight / bias of other dtypes than x (float32, float64, bfloat16 with float16 x), weight-only, bias-only,
  neither; the scratch copies are made by `allocate`, one per present tensor, in its own dtype.
- eps 0 / 1e-30 / 1e-5 / 1e39 with zero and constant rows (constant rows give exactly the bias; NaN where
  torch's own same-dtype result has it); fp16 rows near 65504, bf16 rows of 1e20 / 1e30 (no worse than torch's
  own float32 statistics), median-of-three outliers (the second sums); NaN / +-inf in one row stays there
  (including the row the same program prefetches next); a NaN weight column stays in that column.
- the public API with autograd (3-D x, a (3, 1367) normalized_shape with a transposed weight), fusedops.nn
  modules, forward and backward against float64 (the unchanged backward reads this forward's mean / rstd).
- explicit staged configs: tiny rows (1..31 columns, middle == SHIFT), extra all-masked main tiles, float32 /
  float64 rows (SHIFT 4 / 2).
- GPU tier (`-m cuda`): CUDA-graph replay with the weight changed in place between replays, torch.compile,
  a side stream.

DEFECTS
1. A ForwardConfig with split_window=True, staged_affine=False and main_tiles > 1 (block_n < N - 1) passed the
   launcher's check `block_n * main_tiles >= N - 1` and ran norm_split_window's kernels, which hold ONE main
   tile of block_n: wrong values / NaN (uninitialized outputs) where before session 42 it raised ValueError.
   Fixed in norm_forward_launcher.forward_launcher: main_tiles counts only with staged_affine (the message says
   so).
2. (docs) forward_config's docstring and norms.py's module docstring still sent odd rows past 4097 columns to the
   row sweeps / named only norm_split_window, and README claimed all odd rows of 4098-12289 (LayerNorm's of
   8194-10240 keep the row sweeps): updated.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.nn
from fusedops.autograd import norms as autograd_norms
from fusedops.dsl.runtime.bounded_cache import BoundedCache
from fusedops.kernels import norm_backward_launcher, norm_forward_config, norm_forward_launcher, norms
from fusedops.kernels import norm_split_staged
from helpers import assert_close, poison, random_tensor

HALF = (torch.float16, torch.bfloat16)
OPS = pytest.mark.parametrize("subtract_mean", [True, False], ids=["layer_norm", "rms_norm"])


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")


@pytest.fixture
def sms(monkeypatch, interpret):
    """set(count): persistent grids are planned for `count` SMs (fresh launch caches)."""
    def set_count(count):
        monkeypatch.setattr(norms, "_FORWARD_LAUNCHES", BoundedCache(1024))
        monkeypatch.setattr(norms, "_BACKWARD_LAUNCHES", BoundedCache(1024))
        monkeypatch.setattr(autograd_norms, "_KNOWN_LAUNCHES", BoundedCache(1024))
        monkeypatch.setattr(norm_forward_launcher, "_sm_count", lambda device: count)
        monkeypatch.setattr(norm_backward_launcher, "_sm_count", lambda device: count)
    set_count(1)
    return set_count


@pytest.fixture
def staged(monkeypatch):
    """The (grid, TILES, BLOCK_N, SHIFT, PREFETCH) forward_split_staged_kernel was prepared with, in order."""
    seen = []
    original = norm_split_staged.forward_split_staged_kernel.prepare

    def spy(grid, *args, **kwargs):
        seen.append((grid, kwargs["TILES"], kwargs["BLOCK_N"], kwargs["SHIFT"], kwargs.get("PREFETCH")))
        return original(grid, *args, **kwargs)

    monkeypatch.setattr(norm_split_staged.forward_split_staged_kernel, "prepare", spy)
    return seen


def _poisoned(shape, dtype, device):
    return poison(torch.empty(shape, dtype=dtype, device=device))


def _reference(x, w, b, eps, subtract_mean):
    n = x.shape[-1]
    x64, w64, b64 = (None if t is None else t.double() for t in (x, w, b))
    if subtract_mean:
        return F.layer_norm(x64, (n,), w64, b64, eps)
    y = F.rms_norm(x64, (n,), w64, eps)
    return y if b64 is None else y + b64


def _check(x, w, b, subtract_mean, eps=1e-5, config=None, rows=None, allocate=_poisoned):
    """norm_forward (poisoned outputs and scratch) against float64: y, mean, rstd (of `rows`, default all)."""
    y, mean, rstd = norms.norm_forward(x, w, b, eps, subtract_mean=subtract_mean, config=config, allocate=allocate)
    rows = slice(None) if rows is None else rows
    x64 = x.double().reshape(-1, x.shape[-1])
    assert y.dtype == x.dtype and y.shape == x.shape
    assert_close(y[rows], _reference(x, w, b, eps, subtract_mean)[rows], x.dtype)
    if subtract_mean:
        assert_close(mean[rows], x64.mean(-1)[rows], torch.float32)
        variance = x64.var(-1, unbiased=False)
    else:
        assert mean is None
        variance = x64.pow(2).mean(-1)
    assert_close(rstd[rows], torch.rsqrt(variance + eps)[rows], torch.float32)
    return y


def _params(n, dtype, seed, weight=True, bias=True, bias_dtype=None):
    w = random_tensor((n,), dtype, "cpu", seed + 1, scale=0.5) + 1 if weight else None
    b = random_tensor((n,), bias_dtype or dtype, "cpu", seed + 2) if bias else None
    return w, b


# -- every N mod 8 at the config boundaries ------------------------------------------------------------------
# (N, TILES, BLOCK_N) of the defaults, both dtypes alternately; nine rows: every `first` of odd N
BOUNDARIES = {True: [(4098, 3, 2048), (6145, 3, 2048), (6146, 2, 4096), (8193, 2, 4096), (10241, 3, 4096),
                     (12289, 3, 4096)],
              False: [(4100, 3, 2048), (4103, 3, 2048), (6151, 2, 4096), (8194, 3, 4096), (12287, 3, 4096)]}


@OPS
def test_every_n_mod_8_at_the_config_boundaries(sms, staged, subtract_mean, seed):
    for i, (n, tiles, block_n) in enumerate(BOUNDARIES[subtract_mean]):
        dtype = HALF[i % 2]
        m = 9 if n % 2 else 3 + n % 4              # rows enough for every `first` (8, 4 or 2 of them), plus one
        x = random_tensor((m, n), dtype, "cpu", seed + i) * 2 + 0.5
        w, b = _params(n, dtype, seed + i, bias=subtract_mean)
        staged.clear()
        _check(x, w, b, subtract_mean)
        assert staged == [((8,), tiles, block_n, 8, n <= 8193)], n      # (prefetch up to 8193 columns)


def test_rows_just_outside_the_staged_range_do_not_take_it():
    for dtype in HALF:
        for n in (4097, 4104, 8192, 12288, 12290, 12295, 16385):
            for subtract_mean in (True, False):
                assert not norm_forward_config.forward_config(n, dtype, subtract_mean=subtract_mean).staged_affine
        for n in (8194, 9001, 10239):                # LayerNorm keeps the row sweeps there, RMSNorm takes it
            assert not norm_forward_config.forward_config(n, dtype, subtract_mean=True).staged_affine
            assert norm_forward_config.forward_config(n, dtype, subtract_mean=False).staged_affine
        assert norm_forward_config.forward_config(10241, dtype, subtract_mean=True).staged_affine


# -- grids: fewer rows than programs, one row, no rows ---------------------------------------------------------
@OPS
def test_row_counts_against_the_grid(sms, staged, subtract_mean, seed):
    n, dtype = 4099, torch.bfloat16
    w, b = _params(n, dtype, seed, bias=subtract_mean)
    per_sm = norm_forward_config.forward_config(n, dtype, subtract_mean=subtract_mean).programs_per_sm
    results = []
    for count, m in ((1, 1), (1, 17), (5, 17)):
        sms(count)
        grid = -(-min(m, count * per_sm) // 8) * 8      # (LayerNorm 8, 8, 16; RMSNorm 8, 8, 24 programs)
        staged.clear()
        results.append(_check(random_tensor((m, n), dtype, "cpu", seed + m) - 1, w, b, subtract_mean))
        assert [s[0] for s in staged] == [(grid,)], (count, m)
    assert torch.equal(results[1], results[2])      # a row's values do not depend on the grid
    y, mean, rstd = norms.norm_forward(torch.empty(0, n, dtype=dtype), w, b, 1e-5, subtract_mean=subtract_mean,
                                       allocate=_poisoned)
    assert y.shape == (0, n) and rstd.shape == (0,)


# -- weight and bias: dtypes, presence, the scratch ------------------------------------------------------------
@OPS
def test_parameter_dtypes_presence_and_the_scratch_allocations(sms, staged, subtract_mean, seed):
    n = 4101
    stride = norm_forward_launcher.affine_copy_stride(n, 8)
    cases = [(torch.float32, torch.bfloat16), (torch.float64, torch.float16), (None, torch.float32),
             (torch.bfloat16, None), (None, None)]
    for i, (w_dtype, b_dtype) in enumerate(cases):
        x = random_tensor((8 if i == 0 else 3, n), torch.float16, "cpu", seed + i) + 0.25
        w = None if w_dtype is None else random_tensor((n,), w_dtype, "cpu", seed + 10 + i) + 1
        b = None if b_dtype is None else random_tensor((n,), b_dtype, "cpu", seed + 20 + i)
        made = []

        def allocate(shape, dtype, device):
            made.append((tuple(shape), dtype))
            return _poisoned(shape, dtype, device)

        staged.clear()
        _check(x, w, b, subtract_mean, allocate=allocate)
        assert staged, (w_dtype, b_dtype)
        copies = [dtype for shape, dtype in made if shape == (8 * stride,)]
        # (made at the prepare, for its specialization, and at the launch)
        assert copies == 2 * [t.dtype for t in (w, b) if t is not None], made


@OPS
def test_weight_and_bias_changed_in_place_between_calls_of_one_launch(sms, staged, subtract_mean, seed):
    # the public (cached) launch: the second call must stage the new values, not reuse copies of the first
    n, dtype = 5001, torch.float16
    x = random_tensor((9, n), dtype, "cpu", seed)
    w, b = _params(n, dtype, seed)
    for step in range(2):
        with torch.no_grad():
            w.copy_(random_tensor((n,), dtype, "cpu", seed + 5 + step) + 1)
            b.copy_(random_tensor((n,), dtype, "cpu", seed + 7 + step))
        y = fusedops.layer_norm(x, (n,), w, b) if subtract_mean else fusedops.rms_norm(x, (n,), w)
        assert_close(y, _reference(x, w, b if subtract_mean else None, 1e-5 if subtract_mean else
                                   torch.finfo(torch.float16).eps, subtract_mean), dtype)
    assert len(staged) == 1


@OPS
def test_nan_weight_column_stays_in_its_column(sms, staged, subtract_mean, seed):
    n, dtype = 8191, torch.bfloat16
    x = random_tensor((9, n), dtype, "cpu", seed)
    w, b = _params(n, dtype, seed, bias=subtract_mean)
    for column in (0, 3, 4000, n - 2):          # edge lanes and main tiles, for every `first`
        w[column] = float("nan")
    y, _, _ = norms.norm_forward(x, w, b, 1e-5, subtract_mean=subtract_mean, allocate=_poisoned)
    assert staged
    assert torch.equal(torch.isnan(y), torch.isnan(_reference(x, w, b, 1e-5, subtract_mean)))
    assert torch.isnan(y).sum() == 4 * 9


# -- values ----------------------------------------------------------------------------------------------------
def test_eps_extremes_zero_and_constant_rows(sms, staged, seed):
    n, dtype = 6151, torch.bfloat16
    x = random_tensor((10, n), dtype, "cpu", seed)
    x[1] = 0
    x[2] = 3.0
    x[9] = -7.5                                  # 1, 9: rows of one program (8 programs)
    w, b = _params(n, dtype, seed)
    for eps in (0.0, 1e-30, 1e-5, 1e39):
        y = fusedops.layer_norm(x, (n,), w, b, eps)
        same = F.layer_norm(x, (n,), w, b, eps)
        assert torch.equal(torch.isnan(y), torch.isnan(same)), eps
        if eps > 0:
            for row in (1, 2, 9):
                assert torch.equal(y[row], b), (eps, row)
        if 0 < eps < 1e30:
            rows = [0, 3, 4, 5, 6, 7, 8]
            assert_close(y[rows], _reference(x, w, b, eps, True)[rows], dtype)
        r = fusedops.rms_norm(x, (n,), w, eps)
        assert torch.equal(torch.isnan(r), torch.isnan(F.rms_norm(x, (n,), w, eps))), eps
        if 0 < eps < 1e30:
            assert_close(r, _reference(x, w, None, eps, False), dtype)
        if eps == 1e39:                          # rounded to float32: inf (documented), y = 0 (+ bias)
            assert torch.equal(r, torch.zeros_like(r)) and torch.equal(y, b.expand_as(y))
    assert staged


@OPS
def test_huge_rows_and_sampled_outliers_no_worse_than_torch(sms, staged, subtract_mean, seed):
    n = 5001
    for dtype in HALF:
        w, b = _params(n, dtype, seed, bias=subtract_mean)
        scales = (6e4,) if dtype == torch.float16 else (1e20, 1e30)
        rows = [random_tensor((3, n), dtype, "cpu", seed, scale=scale / 8).clamp(-6e4, 6e4)
                if dtype == torch.float16 else random_tensor((3, n), dtype, "cpu", seed, scale=scale)
                for scale in scales]
        outliers = random_tensor((4, n), dtype, "cpu", seed + 5) + 3
        big = 6e4 if dtype == torch.float16 else 1e8
        outliers[0, 0] = outliers[1, (n - 1) // 2] = outliers[2, n - 1] = big
        outliers[3, 0] = outliers[3, n - 1] = -big
        for x in rows + [outliers]:
            y, _, _ = norms.norm_forward(x, w, b, 1e-5, subtract_mean=subtract_mean, allocate=_poisoned)
            same = F.layer_norm(x, (n,), w, b, 1e-5) if subtract_mean else F.rms_norm(x, (n,), w, 1e-5)
            reference = _reference(x, w, b, 1e-5, subtract_mean)
            assert torch.equal(torch.isfinite(y), torch.isfinite(same))
            ulp = torch.finfo(dtype).eps * reference.abs().max()
            assert (y.double() - reference).abs().max() <= 2 * (same.double() - reference).abs().max() + ulp
    assert staged


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("subtract_mean, n", [(True, 5001), (False, 10241)], ids=["layer_norm", "rms_norm"])
def test_non_finite_value_stays_in_its_row(sms, staged, bad, subtract_mean, n, seed):
    # 8 programs: program 5 walks rows 5, 13, 21 (LayerNorm 5001 prefetches the next row, RMSNorm 10241 not)
    dtype = torch.float16
    x = random_tensor((22, n), dtype, "cpu", seed)
    x[5, 100] = bad
    x[13, n - 1] = bad                           # the last column: an upper edge lane
    x[21, 0] = bad                               # the first: a lower edge lane
    w, b = _params(n, dtype, seed, bias=subtract_mean)
    y, _, _ = norms.norm_forward(x, w, b, 1e-5, subtract_mean=subtract_mean, allocate=_poisoned)
    assert staged and staged[0][4] == subtract_mean
    reference = _reference(x, w, b, 1e-5, subtract_mean)
    assert torch.equal(torch.isnan(y), torch.isnan(reference)) and torch.equal(torch.isinf(y), torch.isinf(reference))
    good = [i for i in range(22) if i not in (5, 13, 21)]
    assert_close(y[good], reference[good], dtype)


# -- layouts ---------------------------------------------------------------------------------------------------
@OPS
def test_sliced_views_at_every_offset_and_3d_inputs(sms, staged, subtract_mean, seed):
    n, dtype = 4101, torch.float16
    w, b = _params(n, dtype, seed, bias=subtract_mean)
    flat = random_tensor((3 * n + 8,), dtype, "cpu", seed)
    for offset in (0, 2, 5, 7):
        staged.clear()
        _check(flat[offset:offset + 3 * n].view(3, n), w, b, subtract_mean)
        assert staged, offset
    staged.clear()
    _check(random_tensor((2, 3, n), dtype, "cpu", seed + 1).view(2, 3, n), w, b, subtract_mean)
    odd = random_tensor((1, 9, n), dtype, "cpu", seed + 2).as_strided((9, 1, n), (n, 5, 1))   # size-1 dim, stride 5
    _check(odd, w, b, subtract_mean)
    assert len(staged) == 2


@OPS
def test_launch_cache_hit_at_another_storage_offset(sms, staged, subtract_mean, seed):
    n, dtype = 6145, torch.bfloat16
    w, b = _params(n, dtype, seed, bias=subtract_mean)
    flat = random_tensor((5 * n + 8,), dtype, "cpu", seed)
    for offset in (0, 3, 6):         # one key (shape, strides, dtypes): the same cached launch
        x = flat[offset:offset + 5 * n].view(5, n)
        y = fusedops.layer_norm(x, (n,), w, b, 1e-5) if subtract_mean else fusedops.rms_norm(x, (n,), w, 1e-5)
        assert_close(y, _reference(x, w, b, 1e-5, subtract_mean), dtype)
    assert len(staged) == 1


@OPS
def test_layouts_outside_the_window_fall_back(sms, staged, subtract_mean, seed):
    n, dtype = 4099, torch.float16
    w, b = _params(n, dtype, seed, bias=subtract_mean)
    base = random_tensor((6, n), dtype, "cpu", seed)
    for x in (random_tensor((n, 3), dtype, "cpu", seed).t(),         # column stride 3
              base[:1].expand(4, n),                                  # row stride 0
              base[::2],                                              # row stride 2 N
              random_tensor((3, n + 5), dtype, "cpu", seed)[:, :n]):  # row stride N + 5
        _check(x, w, b, subtract_mean)
    assert staged == []


# -- the public API, autograd, modules ---------------------------------------------------------------------------
@OPS
def test_public_api_autograd_multi_dim_shape_and_modules(sms, staged, subtract_mean, seed):
    dtype = torch.float16
    shape = (3, 1367)                                    # 4101 columns
    n = 3 * 1367
    x = random_tensor((2, 2, *shape), dtype, "cpu", seed).requires_grad_()
    w = (random_tensor((1367, 3), dtype, "cpu", seed + 1, scale=0.5) + 1).t().requires_grad_()   # transposed
    b = random_tensor(shape, dtype, "cpu", seed + 2).requires_grad_() if subtract_mean else None
    dy = random_tensor(x.shape, dtype, "cpu", seed + 3)
    y = fusedops.layer_norm(x, shape, w, b, 1e-5) if subtract_mean else fusedops.rms_norm(x, shape, w, 1e-5)
    leaves = [t for t in (x, w, b) if t is not None]
    grads = torch.autograd.grad(y, leaves, dy)
    wide = [t.detach().double().requires_grad_() for t in leaves]
    want = (F.layer_norm(wide[0], shape, wide[1], wide[2], 1e-5) if subtract_mean
            else F.rms_norm(wide[0], shape, wide[1], 1e-5))
    assert_close(y, want.detach(), dtype)
    for got, expected in zip(grads, torch.autograd.grad(want, wide, dy.double())):
        assert_close(got, expected, dtype)
    assert staged and staged[0][0] == (8,)
    # the nn modules
    module = (fusedops.nn.LayerNorm(n) if subtract_mean else fusedops.nn.RMSNorm(n, eps=1e-6)).to(dtype)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(random_tensor(p.shape, dtype, "cpu", seed + 4) + 1)
    x = random_tensor((9, n), dtype, "cpu", seed + 5).requires_grad_()
    y = module(x)
    y.backward(random_tensor((9, n), dtype, "cpu", seed + 6))
    x64 = x.detach().double().requires_grad_()
    params64 = [p.detach().double().requires_grad_() for p in module.parameters()]
    want = (F.layer_norm(x64, (n,), params64[0], params64[1], module.eps) if subtract_mean
            else F.rms_norm(x64, (n,), params64[0], 1e-6))
    want.backward(random_tensor((9, n), dtype, "cpu", seed + 6).double())
    assert_close(y, want.detach(), dtype)
    assert_close(x.grad, x64.grad, dtype)
    for p, p64 in zip(module.parameters(), params64):
        assert_close(p.grad, p64.grad, dtype)
    assert len(staged) == 2


# -- explicit staged configs -------------------------------------------------------------------------------------
def _staged_config(subtract_mean, **changes):
    base = norm_forward_config.forward_config(5001, torch.float16, subtract_mean=subtract_mean)
    return dataclasses.replace(base, **changes)


@OPS
def test_explicit_configs_tiny_rows_extra_tiles_and_wide_dtypes(sms, staged, subtract_mean, seed):
    # rows of 1..31 columns (the whole row in the edge lanes: middle == SHIFT), main tiles that are all masked
    # off, and float32 / float64 rows (SHIFT 4 / 2)
    cases = [(1, 16, 1, torch.bfloat16), (3, 16, 1, torch.bfloat16), (9, 16, 3, torch.float16),
             (25, 8, 3, torch.bfloat16), (4099, 4096, 3, torch.float16), (1027, 512, 3, torch.float32),
             (1026, 1024, 2, torch.float32), (1027, 512, 3, torch.float64)]
    for i, (n, block_n, tiles, dtype) in enumerate(cases):
        config = _staged_config(subtract_mean, block_n=block_n, main_tiles=tiles, num_warps=2)
        x = random_tensor((11, n), dtype, "cpu", seed + i) + 2
        w, b = _params(n, dtype, seed + i, bias=subtract_mean)
        staged.clear()
        _check(x, w, b, subtract_mean, config=config)
        assert staged and staged[0][1:4] == (tiles, block_n, 16 // dtype.itemsize), (n, staged)


# DEFECT 1: main_tiles without staged_affine ran the one-tile split kernels on rows longer than their tile
@OPS
@pytest.mark.parametrize("programs_per_sm", [0, 4])
def test_main_tiles_without_staged_affine_is_refused(interpret, subtract_mean, programs_per_sm):
    n = 1031
    config = dataclasses.replace(norm_forward_config.forward_config(n, torch.float16, subtract_mean=subtract_mean),
                                 block_n=512, main_tiles=3, staged_affine=False, programs_per_sm=programs_per_sm)
    assert config.split_window
    x = torch.ones(9, n, dtype=torch.float16)
    with pytest.raises(ValueError, match="main_tiles.*staged_affine"):
        norms.norm_forward(x, None, None, 1e-5, subtract_mean=subtract_mean, config=config)


# -- GPU tier ------------------------------------------------------------------------------------------------------
@pytest.mark.cuda
@OPS
@pytest.mark.parametrize("n", [5001, 12289])
def test_gpu_cuda_graph_replay_sees_weights_changed_in_place(subtract_mean, n, seed):
    dtype = torch.bfloat16
    assert norm_forward_config.forward_config(n, dtype, subtract_mean=subtract_mean).staged_affine
    x = random_tensor((1000, n), dtype, "cuda", seed)
    w = random_tensor((n,), dtype, "cuda", seed + 1) + 1
    b = random_tensor((n,), dtype, "cuda", seed + 2) if subtract_mean else None

    def step():
        return fusedops.layer_norm(x, (n,), w, b, 1e-5) if subtract_mean else fusedops.rms_norm(x, (n,), w, 1e-5)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):            # warm-up on a side stream (prepares and compiles)
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = step()
    for i in range(2):                       # new x, weight and bias values in the same buffers
        x.copy_(random_tensor((1000, n), dtype, "cuda", seed + 10 + i) * 3 + 0.5)
        w.copy_(random_tensor((n,), dtype, "cuda", seed + 20 + i) + 1)
        if b is not None:
            b.copy_(random_tensor((n,), dtype, "cuda", seed + 30 + i))
        graph.replay()
        torch.cuda.synchronize()
        assert_close(y, _reference(x, w, b, 1e-5, subtract_mean), dtype)


@pytest.mark.cuda
@OPS
def test_gpu_torch_compile_forward_and_backward(subtract_mean, seed):
    n, dtype = 8191, torch.float16
    x = random_tensor((257, n), dtype, "cuda", seed).requires_grad_()
    w = (random_tensor((n,), dtype, "cuda", seed + 1) + 1).requires_grad_()
    b = random_tensor((n,), dtype, "cuda", seed + 2).requires_grad_() if subtract_mean else None

    def fn(x, w, b):
        return fusedops.layer_norm(x, (n,), w, b, 1e-5) if subtract_mean else fusedops.rms_norm(x, (n,), w, 1e-5)

    y = torch.compile(fn, fullgraph=True)(x, w, b)
    dy = random_tensor(y.shape, dtype, "cuda", seed + 3)
    leaves = [t for t in (x, w, b) if t is not None]
    grads = torch.autograd.grad(y, leaves, dy)
    wide = [t.detach().double().requires_grad_() for t in leaves]
    want = (F.layer_norm(wide[0], (n,), wide[1], wide[2], 1e-5) if subtract_mean
            else F.rms_norm(wide[0], (n,), wide[1], 1e-5))
    assert_close(y, want.detach(), dtype)
    for got, expected in zip(grads, torch.autograd.grad(want, wide, dy.double())):
        assert_close(got, expected, dtype)
