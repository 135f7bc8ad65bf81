"""fusedops.softmax / log_softmax: kernels, autograd, API, modules.

CPU tier: the kernels run in the interpreter (FUSEDOPS_INTERPRET=1) against float64 torch at odd
shapes, every tile kind and the online path (forced with a small one-pass limit), non-contiguous
inputs, -inf rows, large shifts, empty and 0-d tensors; gradcheck in float64; the modules against
torch.nn; the row geometry and config table; the PTX of every shipped config through ptxas.
GPU tier (`-m cuda`): the compiled kernels at many shapes (1, primes, 2^k +- 1, > one block,
> 2^17 columns, > 2^31 elements) with poisoned outputs, forward and backward.
"""

from __future__ import annotations

import io
import re
import warnings

import pytest
import torch

import fusedops
import fusedops.dsl as dsl
import fusedops.nn
from fusedops.autograd import softmax as softmax_autograd
from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels import softmax as K
from fusedops.kernels.sizes import next_power_of_2
from fusedops.kernels.softmax_configs import (L2_HINTS, MAX_ONE_PASS_BLOCK, MAX_ONE_PASS_TILE, MIN_ROW_BLOCK,
                                              ROW_TILE_ELEMENTS, Config, choose_config, shipped_configs,
                                              uses_column_tiles)
from fusedops.kernels.softmax_kernels import _backward_kernel, _forward_kernel
from fusedops.kernels.softmax_rows import empty_in_order_of, plan_rows
from helpers import assert_close, poison, random_tensor

DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def reference(x: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    return (torch.log_softmax if log else torch.softmax)(x.double(), dim)


def ours(log: bool):
    return fusedops.log_softmax if log else fusedops.softmax


def reference_grad(x: torch.Tensor, dy: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    """The exact gradient at x (float64 autograd)."""
    x64 = x.detach().double().requires_grad_()
    reference(x64, dim, log).backward(dy.double())
    return x64.grad


def reference_backward(y: torch.Tensor, dy: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    """The gradient from the saved output y, in float64: what the backward kernel computes. For
    fp16/bf16, y's rounding alone moves the exact gradient by more than the dtype's tolerance
    when dy and sum(dy * y) nearly cancel (torch's backward, which also uses y, does the same)."""
    y, dy = y.detach().double(), dy.double()
    if log:
        return dy - torch.exp(y) * dy.sum(dim, keepdim=True)
    return y * (dy - (dy * y).sum(dim, keepdim=True))


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Every output the kernels allocate starts as NaN, so an element they miss cannot pass. The launches
    made before (and during) the test hold their allocators: they are forgotten before and after it."""
    allocate, allocator = empty_in_order_of, K._dense_allocator
    monkeypatch.setattr(K, "empty_in_order_of", lambda x, dtype: poison(allocate(x, dtype)))
    monkeypatch.setattr(K, "_dense_allocator", lambda x, dtype: (lambda new: lambda t: poison(new(t)))(
        allocator(x, dtype)))
    caches = (K._FORWARD_LAUNCHES, K._BACKWARD_LAUNCHES, softmax_autograd._KNOWN_LAUNCHES)
    for cache in caches:
        cache.clear()
    yield
    for cache in caches:
        cache.clear()


# ------------------------------------------------------------------------------------------------
# CPU tier: the kernels in the interpreter
# ------------------------------------------------------------------------------------------------
# (shape, dim, max_one_pass_block): several rows per program (n < 1024), one row per program,
# online rows (n > limit), "columns" tiles (dim not last), online "columns". The limit (None:
# the defaults) applies to the forward and the backward.
FORWARD_CASES = [
    ((3, 1), -1, None), ((4, 7), 1, None), ((2, 1000), 1, None), ((2, 1025), -1, None),
    ((2, 1000), 1, 256), ((3, 7, 5), 1, None), ((5, 13), 0, None), ((3, 100, 9), 1, 64),
]


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, dim, limit", FORWARD_CASES, ids=str)
def test_kernels_forward_and_backward(shape, dim, limit, dtype, log, seed, interpret, poisoned_outputs):
    x = random_tensor(shape, dtype, seed=seed, scale=2.0)
    y = K.softmax_forward(x, dim % len(shape), log=log, max_one_pass_block=limit)
    assert y.dtype == dtype
    assert_close(y, reference(x, dim, log), dtype)
    dy = random_tensor(shape, dtype, seed=seed + 1)
    dx = K.softmax_backward(dy, y, dim % len(shape), log=log, max_one_pass_block=limit)
    assert_close(dx, reference_backward(y, dy, dim, log), dtype)
    if dtype == torch.float32:
        assert_close(dx, reference_grad(x, dy, dim, log), dtype)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("view", ["permuted", "sliced", "transposed"])
def test_non_contiguous_3d_inputs(view, dim, log, seed, interpret, poisoned_outputs):
    base = random_tensor((6, 10, 8), torch.float32, seed=seed, scale=2.0)
    x = {"permuted": base.permute(2, 0, 1), "sliced": base[1:5, ::3, 2:7], "transposed": base.transpose(0, 2)}[view]
    assert not x.is_contiguous()
    x.requires_grad_()
    y = ours(log)(x, dim)
    assert_close(y, reference(x.detach(), dim, log), torch.float32)
    dy = random_tensor(x.shape, torch.float32, seed=seed + 1)
    y.backward(dy)
    assert_close(x.grad, reference_grad(x, dy, dim, log), torch.float32)


def test_inputs_that_do_not_collapse_to_two_row_groups_are_copied(seed, interpret):
    x = random_tensor((4, 6, 5, 7), torch.float32, seed=seed)[:, :3, 1:4, :]
    assert plan_rows(x.shape, 3, (x.stride(),)) is None
    assert_close(fusedops.softmax(x, -1), reference(x, -1, False), torch.float32)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("limit", [None, 16], ids=["one_pass", "online"])
def test_minus_inf_rows(limit, log, interpret):
    x = torch.randn(4, 40)
    x[0] = -float("inf")                   # all -inf: NaN, like torch
    x[1, :20] = -float("inf")              # the online path's first chunks see only -inf
    x[2, ::2] = -float("inf")
    y = K.softmax_forward(x, 1, log=log, max_one_pass_block=limit)
    expected = reference(x, 1, log)
    assert torch.isnan(expected[0]).all()
    assert_close(y, expected, torch.float32)


@pytest.mark.parametrize("dtype, shift", [(torch.float32, 1e4), (torch.float32, -3e4), (torch.float16, 2000.0),
                                          (torch.bfloat16, -5e4)], ids=str)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_large_constant_shifts_stay_exact(dtype, shift, log, seed, interpret):
    x = (random_tensor((3, 300), torch.float32, seed=seed, scale=2.0) + shift).to(dtype)
    for limit in (None, 64):
        assert_close(K.softmax_forward(x, 1, log=log, max_one_pass_block=limit), reference(x, 1, log), dtype)


@pytest.mark.parametrize("shape, dim", [((0, 5), 1), ((5, 0), 1), ((5, 0), 0), ((2, 0, 3), -1)], ids=str)
def test_empty_tensors(shape, dim, interpret):
    x = torch.empty(shape, requires_grad=True)
    y = fusedops.softmax(x, dim)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("value", [3.0, -float("inf")])
@pytest.mark.parametrize("dim", [0, -1])
def test_zero_dim_tensor_is_one_element(value, dim, interpret):
    x = torch.tensor(value)
    for log in (False, True):
        y = ours(log)(x, dim)
        expected = reference(x, dim, log)
        assert y.shape == () and torch.equal(torch.isnan(y), torch.isnan(expected))
        assert torch.isnan(y) or y.item() == expected.item()


class _OnlineSoftmax(torch.autograd.Function):
    """The kernels with a one-pass limit of 4 elements: every row takes the online path."""

    @staticmethod
    def forward(ctx, x, dim, log):
        y = K.softmax_forward(x, dim, log=log, max_one_pass_block=4)
        ctx.save_for_backward(y)
        ctx.dim, ctx.log = dim, log
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return K.softmax_backward(dy, y, ctx.dim, log=ctx.log, max_one_pass_block=4), None, None


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape, dim", [((3, 5), 1), ((4, 3, 2), 1), ((2, 11), 0)], ids=str)
def test_gradcheck_float64(shape, dim, log, interpret):
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: ours(log)(t, dim), (x,))


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape, dim", [((2, 11), 1), ((9, 4), 0)], ids=str)
def test_gradcheck_float64_online_path(shape, dim, log, interpret):
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: _OnlineSoftmax.apply(t, dim, log), (x,))


def test_expanded_gradient(interpret):
    x = torch.randn(3, 9, requires_grad=True)
    fusedops.log_softmax(x, 1).sum().backward()       # dy is a stride-0 expanded tensor
    assert_close(x.grad, reference_grad(x, torch.ones(3, 9), 1, True), torch.float32)


@pytest.mark.parametrize("source, dtype", [(torch.float16, torch.float32), (torch.bfloat16, torch.float32),
                                           (torch.float32, torch.float16), (torch.int64, torch.float32),
                                           (torch.float32, torch.float64)], ids=str)
def test_dtype_argument_casts_first(source, dtype, seed, interpret):
    x = random_tensor((3, 17), source, seed=seed)
    y = fusedops.softmax(x, 1, dtype=dtype)
    expected = torch.softmax(x, 1, dtype=dtype)
    assert y.dtype == dtype
    assert_close(y, expected.double(), dtype)
    if source.is_floating_point:
        x.requires_grad_()
        fusedops.log_softmax(x, 1, dtype=dtype).backward(torch.ones(3, 17, dtype=dtype))
        assert x.grad.dtype == source


def test_arguments_laid_out_like_known_ones_are_still_checked(monkeypatch, seed, interpret):
    # A call that took the kernel path is remembered per argument layout; arguments that differ in
    # anything the checks and the routing read must still be checked and routed in full.
    x = random_tensor((4, 20), torch.float16, seed=seed)
    expected = fusedops.softmax(x, 1)
    assert torch.equal(fusedops.softmax(x, 1), expected)           # the remembered launches
    assert torch.equal(fusedops.softmax(x, -1), expected)
    with pytest.raises(TypeError, match="'dim' must be int"):
        fusedops.softmax(x, 1.0)
    with pytest.raises(TypeError, match="'dtype'"):
        fusedops.softmax(x, 1, dtype=torch.int32)
    with torch.autocast("cpu", dtype=torch.bfloat16):       # the autocast rules apply again
        assert fusedops.softmax(x, 1).dtype == torch.softmax(x, 1).dtype
    assert fusedops.softmax(x, 1, dtype=torch.float32).dtype == torch.float32
    monkeypatch.delenv("FUSEDOPS_INTERPRET")                # CPU tensors: torch's op again
    assert torch.equal(fusedops.softmax(x, 1), torch.softmax(x, 1))


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_backward_of_one_forward_layout_for_every_dy_layout(log, seed, interpret):
    # The backward launches are kept per layout of dy (and y) with the forward's: contiguous, expanded
    # (the gradient of sum()) and transposed gradients of the same forward layout, twice each.
    x = random_tensor((5, 12), torch.float32, seed=seed).requires_grad_()
    dy = random_tensor((5, 12), torch.float32, seed=seed + 1)
    for grad in (dy, dy[:1].expand(5, 12), dy.t().contiguous().t()) * 2:
        x.grad = None
        ours(log)(x, 1).backward(grad)
        assert_close(x.grad, reference_grad(x, grad, 1, log), torch.float32)


def test_saved_tensor_hooks_that_lay_y_out_anew(seed, interpret):
    # y is contiguous; hooks that give it back transposed (or on the CPU and back): the backward must
    # not read it with the forward's strides.
    x = random_tensor((12, 5), torch.float32, seed=seed).t().requires_grad_()     # (5, 12), strides (1, 5)
    dy = random_tensor((5, 12), torch.float32, seed=seed + 1)
    for hooks in (torch.autograd.graph.save_on_cpu(), torch.autograd.graph.saved_tensors_hooks(
            lambda t: t.t().contiguous().t(), lambda t: t)):
        x.grad = None
        with hooks:
            y = fusedops.softmax(x, 1)
        assert y.is_contiguous()
        y.backward(dy)
        assert_close(x.grad, reference_grad(x, dy, 1, False), torch.float32)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("view", ["transposed", "permuted", "sliced", "expanded"])
def test_results_are_contiguous_like_torchs(view, log, seed, interpret):
    # torch's softmax returns a contiguous tensor for any input layout (so `.view(-1)` of it works); the
    # kernels write in the input's dim order, which for a permuted input is not contiguous.
    base = random_tensor((6, 5, 7), torch.float32, seed=seed)
    x = {"transposed": base.transpose(0, 2), "permuted": base.permute(1, 2, 0),
         "sliced": base[:, ::2].transpose(1, 2), "expanded": base[:1].expand(4, 5, 7)}[view]
    for dim in range(x.dim()):
        y = ours(log)(x, dim)
        assert y.is_contiguous() and y.shape == x.shape
        assert_close(y, reference(x, dim, log), torch.float32)
        assert y.view(-1).numel() == x.numel()


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_double_backward_raises(log, interpret):
    x = torch.randn(3, 7, requires_grad=True)
    (dx,) = torch.autograd.grad(ours(log)(x, 1).square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        dx.sum().backward()


def test_cpu_tensors_run_torch_without_the_interpreter(monkeypatch, seed):
    monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)
    x = random_tensor((4, 33), torch.float32, seed=seed)
    assert torch.equal(fusedops.softmax(x, 1), torch.softmax(x, 1))
    assert torch.equal(fusedops.log_softmax(x, 0), torch.log_softmax(x, 0))


def test_errors_name_the_argument():
    with pytest.raises(TypeError, match="'input'.*floating-point"):
        fusedops.softmax(torch.arange(4), 0)
    with pytest.raises(TypeError, match="'dtype'"):
        fusedops.log_softmax(torch.randn(4), 0, dtype=torch.int32)
    with pytest.raises(TypeError, match="'input'"):
        fusedops.softmax([1.0, 2.0], 0)
    with pytest.raises(TypeError, match="'dim'"):
        fusedops.softmax(torch.randn(4), 0.5)
    for shape, dim in (((2, 3), 2), ((2, 3), -3), ((), 1)):
        with pytest.raises(IndexError) as theirs:
            torch.softmax(torch.randn(shape), dim)
        with pytest.raises(IndexError) as mine:
            fusedops.softmax(torch.randn(shape), dim)
        assert str(mine.value) == str(theirs.value)


# ------------------------------------------------------------------------------------------------
# Persistent configs (Config.programs_per_sm): the row sweeps and the persistent tile loop
# ------------------------------------------------------------------------------------------------
def _sweeps(block: int, num_warps: int = 1, programs_per_sm: int = 2) -> Config:
    return Config("rows", 1, block, False, num_warps, programs_per_sm)


def _sliced_rows(seed):
    # (6, 300) rows of stride 320 starting 3 elements into their storage: rows off 16-byte boundaries
    return random_tensor((6, 320), torch.bfloat16, seed=seed, scale=2.0)[:, 3:303]


# (input, dim, config, dtype). The interpreter plans persistent grids for device_info.INTERPRETER_SMS
# (4) SMs. Chunks of 16 to 512 elements: rows of several chunks, pieces and edges; rows fewer than
# the programs (5 < 8), not a multiple of them (13, 9), odd lengths (the SHIFT window), a strided
# reduced dim with an inner index (SPLIT, col stride 7), sliced rows, one and two vectors per thread.
ROW_SWEEP_CASES = {
    "5x37_fewer_rows_than_programs": ((5, 37), 1, _sweeps(16), torch.float16),
    "13x300_special_values": ((13, 300), 1, _sweeps(64), torch.float32),
    "9x1001_two_vectors_per_thread": ((9, 1001), 1, _sweeps(512, 1, 1), torch.float16),
    "3x50x7_strided_dim": ((3, 50, 7), 1, _sweeps(16, 1, 1), torch.float32),
    "6x300_sliced_rows": (_sliced_rows, 1, _sweeps(64, 2, 1), torch.bfloat16),
    "9x1001_l2_hints": ((9, 1001), 1, Config("rows", 1, 128, False, 2, 1, ("evict_last", "evict_first", ".cs")),
                        torch.float16),
    "7x999_reversed_second_sweep": (_sliced_rows, 1, Config("rows", 1, 64, False, 2, 1, reverse=True), torch.bfloat16),
    # rows 16-byte aligned (SHIFT 0: no head edge) with a 3-element tail past the last whole vector
    "4x1003_aligned_rows_odd_length": (lambda seed: random_tensor((4, 1008), torch.float16, seed=seed, scale=2.0)[:, :1003],
                                       1, _sweeps(128, 2, 1), torch.float16),
}


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("case", ROW_SWEEP_CASES, ids=str)
def test_row_sweeps_match_float64(case, log, seed, interpret, poisoned_outputs):
    shape, dim, config, dtype = ROW_SWEEP_CASES[case]
    x = shape(seed) if callable(shape) else random_tensor(shape, dtype, seed=seed, scale=2.0)
    if case == "13x300_special_values":
        x[1] = -float("inf")                    # NaN, like torch
        x[2, :200] = -float("inf")              # the edges and first chunks see only -inf
        x[3, 1::2] = -float("inf")
        x[4] += 1e4
        x[5] -= 3e4
    launch = K._plan_launch(x.shape, dim, (x.stride(), x.stride()), (dtype, dtype), False, log, config, None)
    assert launch.constexprs["PERSISTENT"] and launch.grid == (min(launch.layout.n_rows, 4 * config.programs_per_sm),)
    y = K.softmax_forward(x, dim, log=log, config=config)
    assert_close(y, reference(x, dim, log), dtype)
    dy = random_tensor(x.shape, dtype, seed=seed + 1)
    dx = K.softmax_backward(dy, y, dim, log=log, config=config)
    assert_close(dx, reference_backward(y, dy, dim, log), dtype)


def test_row_sweeps_windows_of_every_shift(seed, interpret):
    # Rows of 61 fp16 elements start at every offset mod 8 (SHIFT = 8); chunks of 16, 2 threads of 8.
    x = random_tensor((8, 61), torch.float16, seed=seed, scale=2.0)
    config = _sweeps(16, 1, 1)
    assert K._plan_launch(x.shape, 1, (x.stride(),) * 2, (x.dtype,) * 2, False, False, config, None
                          ).constexprs["SHIFT"] == 8
    for log in (False, True):
        assert_close(K.softmax_forward(x, 1, log=log, config=config), reference(x, 1, log), torch.float16)


class _RowSweepsSoftmax(torch.autograd.Function):
    """The kernels with a persistent row-sweeps config of 4-column chunks."""

    CONFIG = Config("rows", 1, 4, False, 1, 1)

    @staticmethod
    def forward(ctx, x, log):
        y = K.softmax_forward(x, 1, log=log, config=_RowSweepsSoftmax.CONFIG)
        ctx.save_for_backward(y)
        ctx.log = log
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return K.softmax_backward(dy, y, 1, log=ctx.log, config=_RowSweepsSoftmax.CONFIG), None


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_gradcheck_float64_row_sweeps(log, interpret):
    x = torch.randn((3, 11), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: _RowSweepsSoftmax.apply(t, log), (x,))


@pytest.mark.parametrize("shape, dim, config", [
    ((7, 50), 1, Config("rows", 2, 64, True, 1, 1)),                # one-pass tiles of two rows
    ((3, 16, 20), 1, Config("columns", 8, 16, True, 1, 1)),          # one-pass column tiles
    ((3, 40, 20), 1, Config("columns", 8, 4, False, 1, 2)),          # online column tiles
    ((9, 40), 1, Config("rows", 2, 8, False, 1, 1)),                 # online tiles of two rows
], ids=str)
def test_persistent_tile_loop(shape, dim, config, seed, interpret, poisoned_outputs):
    # Persistent configs that are not one-row online "rows" tiles loop over the usual tiles.
    x = random_tensor(shape, torch.float32, seed=seed, scale=2.0)
    dy = random_tensor(shape, torch.float32, seed=seed + 1)
    for log in (False, True):
        y = K.softmax_forward(x, dim, log=log, config=config)
        assert_close(y, reference(x, dim, log), torch.float32)
        dx = K.softmax_backward(dy, y, dim, log=log, config=config)
        assert_close(dx, reference_backward(y, dy, dim, log), torch.float32)


def test_persistent_launch_plans():
    strides, dtypes = ((50257, 1), (50257, 1)), (torch.float16, torch.float16)
    config = _sweeps(8192, 16, 2)
    launch = K._plan_launch((8192, 50257), 1, strides, dtypes, False, False, config, None, sm_count=132)
    assert launch.grid == (264,)
    assert {k: launch.constexprs[k] for k in ("PERSISTENT", "THREADS", "VECTOR", "SHIFT")} == dict(
        PERSISTENT=True, THREADS=512, VECTOR=8, SHIFT=8)
    assert K._plan_launch((100, 50257), 1, strides, dtypes, False, False, config, None, sm_count=132).grid == (100,)
    # the dispatcher's choice for such rows (ROW_SWEEPS): 16384-column chunks at 16 warps, 2 programs per SM,
    # L2 hints, registers held to 2 CTAs per SM
    chosen = K._plan_launch((8192, 50257), 1, strides, dtypes, False, False, None, None, sm_count=132)
    assert chosen.grid == (264,) and chosen.config == Config("rows", 1, 16384, False, 16, 2, L2_HINTS, False, 2)
    backward = K._plan_launch((8192, 50257), 1, strides + ((50257, 1),), dtypes + (torch.float16,), True, False,
                              None, None, sm_count=132)
    assert backward.grid == (132,) and backward.config == Config("rows", 1, 16384, False, 32, 1, L2_HINTS)
    # 32768 columns: past the one-pass limit, one program per row (64 per SM caps the grid above 8192 rows)
    assert K._plan_launch((8192, 32768), 1, ((32768, 1),) * 2, dtypes, False, False, None, None,
                          sm_count=132).config == Config("rows", 1, 16384, False, 16, 64, L2_HINTS, False, 2)
    # fp32 rows keep the online path
    online = K._plan_launch((8, 50257), 1, strides, (torch.float32,) * 2, False, False, None, None, sm_count=132)
    assert online.grid == (8,) and "PERSISTENT" not in online.constexprs
    # fp16 in, fp32 out: vectors of the narrowest type
    fused = K._plan_launch((64, 4096), 1, ((4096, 1),) * 2, (torch.float16, torch.float32), False, False,
                           _sweeps(2048, 8, 4), None, sm_count=132)
    assert (fused.constexprs["THREADS"], fused.constexprs["VECTOR"]) == (256, 8)


# Persistent candidates of the H200 sweep (.scratch/sm_long_sweep.py): (direction, config).
PERSISTENT_PTX_CONFIGS = [
    ("forward", _sweeps(8192, 16, 2)), ("forward", _sweeps(16384, 32, 1)), ("forward", _sweeps(4096, 8, 4)),
    ("backward", _sweeps(8192, 32, 1)), ("backward", _sweeps(4096, 16, 2)), ("backward", _sweeps(16384, 32, 1)),
    ("forward", Config("rows", 1, 8192, False, 16, 64, L2_HINTS)),
    ("backward", Config("rows", 1, 16384, False, 32, 1, L2_HINTS, True)),
    ("forward", Config("rows", 1, 16384, False, 16, 2, L2_HINTS, True)),
    ("forward", Config("rows", 1, 16384, False, 16, 64, L2_HINTS, False, 2)),
]


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not installed")
@pytest.mark.parametrize("n_cols", [50257, 32768])
def test_row_sweeps_assemble_with_16_byte_vectors_and_no_barrier_per_chunk(n_cols):
    """The persistent row sweeps for sm_90a: 16-byte loads and stores, bar.sync only in the row-end
    reductions (forward: max and sum, two each; backward: one sum), and at most one spilled register.
    (ptxas 13 trades a loop-invariant shared-memory address, stored and reloaded once per row, for one
    more resident CTA in a few variants: 4 bytes.)"""
    problems = []
    for i, (direction, config) in enumerate(PERSISTENT_PTX_CONFIGS):
        backward = direction == "backward"
        # a register cap (min_blocks_per_sm) is for the 2-byte rows the dispatcher gives row sweeps
        dtypes = ((torch.float16, bool(i % 2)), (torch.bfloat16, not i % 2), (torch.float32, False))
        for dtype, log in dtypes[:2] if config.min_blocks_per_sm else dtypes:
            tensors = 3 if backward else 2
            launch = K._plan_launch((8192, n_cols), 1, ((n_cols, 1),) * tensors, (dtype,) * tensors, backward, log,
                                    config, None, sm_count=132)
            pointer = torch.empty(16, dtype=dtype, device="meta")
            kernel = (_backward_kernel if backward else _forward_kernel).compile(
                *[pointer] * tensors, *launch.arguments, target="sm_90a", **launch.constexprs)
            ptx = kernel.asm["ptx"]
            result = assemble(ptx, "sm_90a")
            name = f"{direction} {config} {dtype} log={log}"
            if result.spill_bytes > 8:
                problems.append(f"{name}: {result.spill_bytes} bytes spilled")
            if not _has_global_vectors(ptx, ".v4.b32"):
                problems.append(f"{name}: no 16-byte accesses")
            if ptx.count("bar.sync") > (2 if backward else 4):
                problems.append(f"{name}: {ptx.count('bar.sync')} bar.sync")
            hinted = ("ld.global.L1::evict_last.L2::cache_hint.v4", "ld.global.L1::evict_first.L2::cache_hint.v4",
                      "st.global.cs.v4")
            if config.sweep_hints and not all(text in ptx for text in hinted):
                problems.append(f"{name}: the sweeps' cache hints are missing")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------------
# Modules
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["Softmax", "LogSoftmax"])
def test_modules_are_drop_ins(name, seed, interpret):
    ours_cls, theirs_cls = getattr(fusedops.nn, name), getattr(torch.nn, name)
    module, native = ours_cls(dim=1), theirs_cls(dim=1)
    assert isinstance(module, theirs_cls)
    assert repr(module) == repr(native) == f"{name}(dim=1)"
    assert module.state_dict() == native.state_dict() == {}
    module.load_state_dict(native.state_dict())
    x = random_tensor((3, 5, 4), torch.float32, seed=seed)
    assert_close(module(x), native(x.double()), torch.float32)
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=False).dim == 1


@pytest.mark.parametrize("name", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("rank", [1, 2, 3, 4])
def test_modules_keep_torchs_legacy_implicit_dim(name, rank, seed, interpret):
    x = random_tensor((2,) * rank, torch.float32, seed=seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = getattr(fusedops.nn, name)()(x)
        expected = getattr(torch.nn, name)()(x.double())
    assert any("Implicit dimension choice" in str(w.message) for w in caught)
    assert_close(y, expected, torch.float32)


# ------------------------------------------------------------------------------------------------
# Geometry and configs (pure Python)
# ------------------------------------------------------------------------------------------------
def test_plan_rows_groups_dims_by_memory_order():
    contiguous = torch.empty(2, 3, 4, 5)
    layout = plan_rows(contiguous.shape, 3, (contiguous.stride(),))
    assert (layout.outer, layout.n_cols, layout.inner, layout.strides) == (24, 5, 1, ((5, 0, 1),))
    layout = plan_rows(contiguous.shape, 1, (contiguous.stride(),))
    assert (layout.outer, layout.n_cols, layout.inner, layout.strides) == (2, 3, 20, ((60, 1, 20),))
    assert uses_column_tiles(layout)
    transposed = torch.empty(7, 9).t()                        # reduce over dim 1: rows contiguous
    layout = plan_rows(transposed.shape, 0, (transposed.stride(),))
    assert (layout.outer, layout.inner, layout.strides) == (7, 1, ((9, 0, 1),))
    expanded = torch.empty(3, 1).expand(3, 8)                 # stride-0 gradients
    layout = plan_rows((3, 8), 1, (torch.empty(3, 8).stride(), expanded.stride()))
    assert layout.strides == ((8, 0, 1), (1, 0, 0))


def test_outputs_keep_the_inputs_dim_order():
    x = torch.empty(4, 5, 6).permute(2, 0, 1)
    y = empty_in_order_of(x, torch.float16)
    assert y.shape == x.shape and y.stride() == x.stride() and y.dtype == torch.float16
    sliced = torch.empty(6, 80)[:, :50]
    assert empty_in_order_of(sliced, torch.float32).is_contiguous()


@pytest.mark.parametrize("n_cols", [1, 7, 512, 1000, 1025, 16384, 16385, 32768, 50257, 1 << 20])
def test_config_table(n_cols):
    layout = plan_rows((64, n_cols), 1, ((n_cols, 1),))
    shipped = {(direction, config): sizes for direction, config, sizes in shipped_configs()}
    for backward, element_bytes, limit in ((False, 2, MAX_ONE_PASS_BLOCK), (False, 4, MAX_ONE_PASS_TILE),
                                           (True, 2, MAX_ONE_PASS_TILE)):
        config = choose_config(layout, backward=backward, element_bytes=element_bytes)
        assert config.one_pass == (n_cols <= limit)
        assert config.block >= n_cols if config.one_pass else config.block <= limit
        assert config.tile == "rows"
        short = next_power_of_2(n_cols) < MIN_ROW_BLOCK
        assert config.rows == (ROW_TILE_ELEMENTS // config.block if short else 1)
        assert element_bytes in shipped["backward" if backward else "forward", config]


def test_wide_column_offsets_switch_to_int64():
    def wide(shape):     # softmax over dim 0 of a contiguous (n, inner) tensor: col stride = inner
        strides = ((shape[1], 1), (shape[1], 1))
        dtypes = (torch.float16, torch.float16)
        return K._plan_launch(shape, 0, strides, dtypes, False, False, None, None).constexprs["WIDE"]

    assert wide((40000, 60000))         # 60000 * (40000 + block) > 2^31
    assert not wide((1000, 60000))


# ------------------------------------------------------------------------------------------------
# PTX of every shipped config
# ------------------------------------------------------------------------------------------------
def _compile(config: Config, dtype: torch.dtype, log: bool, backward: bool, wide: bool = False,
             n_cols: int = 100000, align: int = 16, shift: int = 0):
    pointer = torch.empty(16, dtype=dtype, device="meta")      # data_ptr 0: 16-byte aligned
    constexprs = dict(LOG=log, TILE=config.tile, ROWS=config.rows, BLOCK=config.block, ONE_PASS=config.one_pass,
                      SPLIT=config.tile == "columns", WIDE=wide, ALIGN=min(align, config.rows) if config.tile ==
                      "columns" else align, ACC=dsl.float32, SHIFT=shift, num_warps=config.num_warps,
                      target="sm_90a", **K._persistent_constexprs(config, (dtype,)))
    # Strides as a contiguous (4096, n, 64) tensor has them (unit where unit).
    strides = (64 * n_cols, 1, 64) if config.tile == "columns" else (n_cols, 0, 1)
    sizes = (4096 * 64, n_cols, 64 if config.tile == "columns" else 1, 16)
    if backward:
        return _backward_kernel.compile(pointer, pointer, pointer, *sizes, *strides * 3, **constexprs)
    return _forward_kernel.compile(pointer, pointer, *sizes, *strides * 2, **constexprs)


def _has_global_vectors(ptx: str, width: str) -> bool:
    """Whether the PTX loads and stores global memory with vectors of `width` (".v4.b32")."""
    return all(re.search(rf"{kind}\.global\S*{re.escape(width)}", ptx) for kind in ("ld", "st"))


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not installed")
@pytest.mark.parametrize("n_cols, backward", [(50257, False), (50257, True), (4001, False), (2001, True)])
def test_rows_off_vector_boundaries_read_16_byte_vectors(n_cols, backward):
    # Odd row lengths go through the shifted window (see softmax_tiles._tile): interior groups stay 16-byte
    # vectors, one pass or online, without spills.
    layout = plan_rows((4, n_cols), 1, ((n_cols, 1),) * (3 if backward else 2))
    dtypes = (torch.float16,) * (3 if backward else 2)
    config = choose_config(layout, backward=backward, element_bytes=2)
    shift = K._row_shift(layout, config, dtypes, K._run_alignment(layout, config))
    assert shift == 8
    kernel = _compile(config, torch.float16, False, backward, n_cols=n_cols, align=1, shift=shift)
    assert _has_global_vectors(kernel.asm["ptx"], ".v4.b32")
    assert assemble(kernel.asm["ptx"], "sm_90a").spill_bytes == 0


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("n_cols, limit", [(1001, None), (1001, 256), (333, 64)])
def test_shifted_window_matches_float64(n_cols, limit, log, seed, interpret, poisoned_outputs):
    x = random_tensor((3, n_cols), torch.float16, seed=seed, scale=2.0)
    x[1, :300] = -float("inf")                     # the first chunks of a row see only -inf
    y = K.softmax_forward(x, 1, log=log, max_one_pass_block=limit)
    assert_close(y, reference(x, 1, log), torch.float16)
    dy = random_tensor((3, n_cols), torch.float16, seed=seed + 1)
    dx = K.softmax_backward(dy, y, 1, log=log, max_one_pass_block=limit)
    assert_close(dx, reference_backward(y, dy, 1, log), torch.float16)


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not installed")
def test_shipped_configs_assemble_without_spills():
    """Every config the dispatcher can pick, in the direction it picks it for, through ptxas for
    sm_90a. The dtype and LOG rotate over the configs (the cross product is ~450 compiles); the
    largest one-pass tiles, where registers are tightest, get every dtype."""
    shipped = shipped_configs()
    assert len(shipped) < 100, "the config table grew: keep it small"
    cases = []
    for i, (direction, config, sizes) in enumerate(shipped):
        dtypes = [d for d in DTYPES if d.itemsize in sizes]
        cases.append((direction, config, dtypes[i % len(dtypes)], bool(i % 2)))
        if config.one_pass and config.tile == "rows" and config.block >= MAX_ONE_PASS_TILE:
            cases += [(direction, config, dtype, log) for dtype in dtypes for log in (False, True)]
    problems = []
    for direction, config, dtype, log in cases:
        backward = direction == "backward"
        kernel = _compile(config, dtype, log, backward, wide=config.tile == "columns" and not config.one_pass)
        result = assemble(kernel.asm["ptx"], "sm_90a")
        if result.spill_bytes:
            problems.append(f"{direction} {config} {dtype} log={log}: {result.spill_bytes} bytes spilled")
        # A thread's vector: up to 16 bytes, within one contiguous run, within its share of the tile.
        run = config.rows if config.tile == "columns" else config.block
        share = config.rows * config.block // (32 * config.num_warps)
        vector_bytes = min(16, run * dtype.itemsize, share * dtype.itemsize)
        vector = ".v4.b32" if vector_bytes >= 16 else ".v2.b32" if vector_bytes >= 8 else None
        if vector is not None:
            assert _has_global_vectors(kernel.asm["ptx"], vector), f"{direction} {config} {dtype}: no {vector} access"
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rows_of_1000_elements_get_16_byte_vectors(dtype):
    """ALIGN = 8 says rows of stride 1000 start on 8-element boundaries: 16 bytes for 2-byte types, 32
    for fp32. The launch specializes 1000 as a multiple of 8 too (ints divisible by 8 but not 16), so
    its rows get 16-byte vectors without ALIGN as well; a row stride of 1004 (a multiple of 4 only)
    does not."""
    layout = plan_rows((8192, 1000), 1, ((1000, 1), (1000, 1)))
    launch = K._plan_launch((8192, 1000), 1, ((1000, 1), (1000, 1)), (dtype, dtype), False, False, None, None)
    assert launch.constexprs["ALIGN"] == 8
    kernel = _compile(choose_config(layout), dtype, False, False, n_cols=1000, align=8)
    assert _has_global_vectors(kernel.asm["ptx"], ".v4.b32")
    specialized = _compile(choose_config(layout), dtype, False, False, n_cols=1000, align=1)
    assert _has_global_vectors(specialized.asm["ptx"], ".v4.b32")
    unhinted = _compile(choose_config(layout), dtype, False, False, n_cols=1004, align=1)
    assert not _has_global_vectors(unhinted.asm["ptx"], ".v4.b32")


# ------------------------------------------------------------------------------------------------
# GPU tier
# ------------------------------------------------------------------------------------------------
GPU_COLUMNS = [1, 2, 3, 7, 17, 127, 128, 129, 1000, 1023, 1024, 1025, 2047, 4097, 8191, 16384, 16385, 32768,
               50257, 65537, (1 << 17) + 1, 1 << 18]


@pytest.fixture
def compiled(monkeypatch):
    monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)


@pytest.mark.cuda
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n_cols", GPU_COLUMNS)
def test_gpu_rows(n_cols, dtype, log, seed, compiled, poisoned_outputs):
    n_rows = max(1, min(67, (1 << 21) // n_cols))
    # scale 2: softmax rows neither flat nor one-hot. (Nearly one-hot rows make dy - sum(dy * y)
    # cancel, and the fp32 gradient's norm-relative error then exceeds 1e-5 in any implementation.)
    x = random_tensor((n_rows, n_cols), dtype, "cuda", seed, scale=2.0).requires_grad_()
    y = ours(log)(x, -1)
    assert_close(y, reference(x.detach(), -1, log), dtype)
    dy = random_tensor((n_rows, n_cols), dtype, "cuda", seed + 1)
    y.backward(dy)
    assert_close(x.grad, reference_backward(y, dy, -1, log), dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, dim", [((3, 1000, 5), 1), ((2, 77, 4096), 1), ((4097, 3), 0), ((2, 20000, 70), 1),
                                        ((8, 16, 31, 31), 1), ((5, 7, 9), 0)], ids=str)
def test_gpu_columns(shape, dim, dtype, log, seed, compiled, poisoned_outputs):
    x = random_tensor(shape, dtype, "cuda", seed, scale=2.0).requires_grad_()
    y = ours(log)(x, dim)
    assert_close(y, reference(x.detach(), dim, log), dtype)
    dy = random_tensor(shape, dtype, "cuda", seed + 1)
    y.backward(dy)
    assert_close(x.grad, reference_backward(y, dy, dim, log), dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("view", ["permuted", "sliced", "transposed", "expanded"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gpu_non_contiguous(view, dim, seed, compiled, poisoned_outputs):
    base = random_tensor((24, 130, 40), torch.float16, "cuda", seed, scale=3.0)
    x = {"permuted": base.permute(2, 0, 1), "sliced": base[3:20, ::3, 1:39], "transposed": base.transpose(0, 2),
         "expanded": base[:, :1, :].expand(24, 50, 40)}[view]
    for log in (False, True):
        y = ours(log)(x, dim)
        assert y.is_contiguous()        # as torch's, whatever x's layout
        assert_close(y, reference(x, dim, log), torch.float16)


@pytest.mark.cuda
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_gpu_special_values(log, compiled, poisoned_outputs):
    x = torch.randn(6, 70000, device="cuda")
    x[0] = -float("inf")
    x[1, :40000] = -float("inf")
    x[2, ::2] = -float("inf")
    x[3] += 3e4
    x[4] -= 1e4
    for limit in (None, 1024):
        assert_close(K.softmax_forward(x, 1, log=log, max_one_pass_block=limit), reference(x, 1, log), torch.float32)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gpu_fused_upcast(dtype, seed, compiled):
    x = random_tensor((33, 3000), dtype, "cuda", seed).requires_grad_()
    y = fusedops.softmax(x, 1, dtype=torch.float32)
    assert y.dtype == torch.float32
    assert_close(y, reference(x.detach(), 1, False), torch.float32)
    y.backward(torch.ones_like(y))
    assert x.grad.dtype == dtype


@pytest.mark.cuda
def test_gpu_matches_interpreter(seed, compiled):
    x = random_tensor((5, 3000), torch.float32, "cuda", seed)
    gpu = K.softmax_forward(x, 1, log=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FUSEDOPS_INTERPRET", "1")
        cpu = K.softmax_forward(x.cpu(), 1, log=False)
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-5, atol=1e-9)


@pytest.mark.cuda
@pytest.mark.parametrize("dim", [1, 0], ids=["rows", "columns"])
def test_gpu_more_than_2_to_the_31_elements(dim, compiled):
    """A 4 GB fp16 tensor of 2^31 + 2^16 elements: int64 offsets in both tile kinds (dim 0 also
    takes the WIDE int64 column offsets). Checked on row blocks at the start, middle and end."""
    shape = ((1 << 15) + 1, 1 << 16)
    x = torch.empty(shape, dtype=torch.float16, device="cuda").normal_(0, 3)
    x.requires_grad_()
    y = fusedops.softmax(x, dim)
    dy = torch.empty_like(y).normal_()
    y.backward(dy)
    for start in (0, shape[0] // 2, shape[0] - 64) if dim == 1 else ():
        rows = slice(start, start + 64)
        assert_close(y[rows], reference(x[rows].detach(), 1, False), torch.float16)
        assert_close(x.grad[rows], reference_backward(y[rows], dy[rows], 1, False), torch.float16)
    for start in (0, shape[1] // 2, shape[1] - 64) if dim == 0 else ():
        cols = slice(start, start + 64)
        assert_close(y[:, cols], reference(x[:, cols].detach(), 0, False), torch.float16)
        assert_close(x.grad[:, cols], reference_backward(y[:, cols], dy[:, cols], 0, False), torch.float16)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["Softmax", "LogSoftmax"])
def test_gpu_modules(name, seed, compiled):
    x = random_tensor((4, 12, 33, 33), torch.bfloat16, "cuda", seed)
    for dim in (-1, 1):
        assert_close(getattr(fusedops.nn, name)(dim)(x), getattr(torch.nn, name)(dim)(x.double()), torch.bfloat16)


@pytest.mark.cuda
@pytest.mark.parametrize("config", [Config("rows", 1, 8192, False, 16, 2), Config("rows", 1, 16384, False, 32, 1)],
                         ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n_rows, n_cols", [(67, 1), (67, 7), (300, 1000), (67, 50257), (300, 65536),
                                            (5, (1 << 17) + 1)])
def test_gpu_row_sweeps(n_rows, n_cols, dtype, config, seed, compiled, poisoned_outputs):
    """The persistent row sweeps compiled: fewer and more rows than programs, odd lengths, one chunk or many."""
    x = random_tensor((n_rows, n_cols), dtype, "cuda", seed, scale=2.0)
    dy = random_tensor((n_rows, n_cols), dtype, "cuda", seed + 1)
    for log in (False, True):
        y = K.softmax_forward(x, 1, log=log, config=config)
        assert_close(y, reference(x, 1, log), dtype)
        assert_close(K.softmax_backward(dy, y, 1, log=log, config=config), reference_backward(y, dy, 1, log), dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("view", ["sliced_unaligned", "strided_dim", "special_values"])
def test_gpu_row_sweeps_layouts(view, seed, compiled, poisoned_outputs):
    config = Config("rows", 1, 8192, False, 16, 2)
    base = random_tensor((40, 20003), torch.float16, "cuda", seed, scale=2.0)
    dim = 1
    if view == "sliced_unaligned":          # rows 3 elements into the storage, odd row stride
        x = base[:, 3:20000]
    elif view == "strided_dim":             # the reduced dim strided (2): rows with an inner index
        x = base[:, :800].reshape(40, 400, 2)
    else:
        x = base.clone()
        x[0] = -float("inf")
        x[1, :15000] = -float("inf")
        x[2, 1::2] = -float("inf")
        x[3] += 2000.0
    for log in (False, True):
        y = K.softmax_forward(x, dim, log=log, config=config)
        assert_close(y, reference(x, dim, log), torch.float16)
        dy = random_tensor(x.shape, torch.float16, "cuda", seed + 1)
        assert_close(K.softmax_backward(dy, y, dim, log=log, config=config), reference_backward(y, dy, dim, log),
                     torch.float16)


@pytest.mark.cuda
def test_gpu_row_sweeps_more_than_2_to_the_31_elements(compiled):
    """int64 row offsets in the persistent row sweeps: a 4 GB fp16 tensor, checked at the start, middle and end."""
    config = Config("rows", 1, 8192, False, 16, 2)
    shape = ((1 << 15) + 1, 1 << 16)
    x = torch.empty(shape, dtype=torch.float16, device="cuda").normal_(0, 3)
    y = K.softmax_forward(x, 1, log=False, config=config)
    dy = torch.empty_like(y).normal_()
    dx = K.softmax_backward(dy, y, 1, log=False, config=config)
    for start in (0, shape[0] // 2, shape[0] - 64):
        rows = slice(start, start + 64)
        assert_close(y[rows], reference(x[rows], 1, False), torch.float16)
        assert_close(dx[rows], reference_backward(y[rows], dy[rows], 1, False), torch.float16)
