"""Review (session 22, the changes since af706cb), by a fresh reviewer acting as a new user.

1. The one-pass persistent backward's dx (norm_backward_kernels._input_gradient), forced at small sizes through
   norms.norm_backward(config=...) (one-pass whole rows, clusters, the aligned window for odd N, rows masked
   at the end) on hard rows, against float64 torch and against the two-pass form it replaced; the new
   backward_config choices and forward cache hints.
2. Loop-carried tuples (frontend/loops.py _TupleSlots), in the interpreter and run on the host.
3. nn.Linear / functional routing of sparse, complex and mixed-dtype-bias inputs to torch.
4. The block-size limit, pointer + float offsets, dsl.Config validation, interpret given as a string.

Defects found and fixed in session 22: the dx's per-row factor -rstd^2 c1 overflowed float32 where the old
form stayed finite (now xhat * (rstd c1)); a tuple carried by an outer loop and left partly unchanged by an
inner one was refused (the inner loop rebuilt it from the outer loop's slots); an item's type-change error
pointed at the loop, not the reassignment. The other tests check tricky cases that hold.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.dsl as dsl
from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels import norm_backward_config
from fusedops.kernels import norm_backward_kernels
from fusedops.kernels import norm_forward_config
from fusedops.kernels import norms
from fusedops.kernels.norm_backward_config import BackwardConfig
from fusedops.nn.linear import linear
from helpers import assert_close
from host_jit import run_on_host
from kernel_source import jit_from_source

# -- 1. the one-pass persistent backward ---------------------------------------------------------------

ONE_PASS = BackwardConfig(False, 2, 32, 1, 1, persistent=True, prefetch=True)
TWO_PASS = BackwardConfig(False, 2, 32, 1, 1, persistent=True, prefetch=True, two_pass=True, chunk=8)
CLUSTER = BackwardConfig(False, 1, 8, 1, 1, persistent=True, prefetch=True, cluster=True)
CLUSTER_WINDOW = BackwardConfig(False, 2, 8, 1, 1, persistent=True, cluster=True, aligned_window=True)
ONE_PASS_CONFIGS = {"one_pass": ONE_PASS, "cluster": CLUSTER, "cluster_window": CLUSTER_WINDOW}


def _norm_grads(x, w, b, dy, eps, subtract_mean, config):
    y, mean, rstd = norms.norm_forward(x, w, b, eps, subtract_mean=subtract_mean, interpret=True)
    return norms.norm_backward(dy, x, w, mean, rstd, subtract_mean=subtract_mean, input_grad=True,
                               weight_grad=w is not None, bias_grad=b is not None, bias_dtype=x.dtype,
                               config=config, interpret=True)


def _norm_reference(x, w, b, dy, eps, subtract_mean):
    leaves = [None if t is None else t.detach().double().requires_grad_() for t in (x, w, b)]
    xd, wd, bd = leaves
    n = x.shape[-1]
    y = F.layer_norm(xd, (n,), wd, bd, eps) if subtract_mean else F.rms_norm(xd, (n,), wd, eps)
    y.backward(dy.double())
    return tuple(None if t is None else t.grad for t in leaves)


def _hard_rows(case, dtype, n, rows=5):
    """(x, eps): rows that stress the dx formula; 5 rows, so 2-row tiles end with a masked row."""
    eps = 1e-5
    x = torch.randn(rows, n)
    if case == "large_mean":
        x = x + 1e4 if dtype == torch.float32 else x * 0.01 + 100
    elif case == "tiny_variance":
        x = 1 + x * 1e-3
    elif case == "zero_rows_tiny_eps":
        x[0] = 0
        x[3] = 0
        eps = 1e-12
    return x.to(dtype), eps


def _relative_error(actual, expected):
    return ((actual.double() - expected).abs().max() / expected.abs().max()).item()


@pytest.mark.parametrize("config", list(ONE_PASS_CONFIGS))
@pytest.mark.parametrize("subtract_mean", [True, False], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", ["large_mean", "tiny_variance", "zero_rows_tiny_eps", "mixed_signs"])
def test_one_pass_dx_on_hard_rows_matches_float64_and_the_two_pass_form(config, subtract_mean, dtype, case):
    n = 21            # odd: the window configs shift rows; clusters of 3 parts of 8 columns
    x, eps = _hard_rows(case, dtype, n)
    w = torch.randn(n).to(dtype)                   # mixed weight signs
    b = torch.randn(n).to(dtype) if subtract_mean else None
    dy = torch.randn(x.shape).to(dtype)
    if dtype == torch.float16 and case == "zero_rows_tiny_eps":
        eps = 1e-6        # rstd 1e6 would overflow fp16 dx (torch's too)
    expected = _norm_reference(x, w, b, dy, eps, subtract_mean)
    got = _norm_grads(x, w, b, dy, eps, subtract_mean, ONE_PASS_CONFIGS[config])
    old = _norm_grads(x, w, b, dy, eps, subtract_mean, TWO_PASS)
    if not (case == "large_mean" and dtype == torch.float32):
        # (at 1e4 offsets float32's mean and rstd carry ~1e-4 relative error in every path)
        assert_close(got[0], expected[0], dtype)
    # no worse than the two-pass form it replaced (plus a rounding of the output dtype)
    assert _relative_error(got[0], expected[0]) <= 2 * _relative_error(old[0], expected[0]) + torch.finfo(dtype).eps
    for a, o in zip(got[1:], old[1:]):      # dweight, dbias: untouched by the change, equal across paths
        if a is not None:
            torch.testing.assert_close(a, o, rtol=4 * torch.finfo(dtype).eps, atol=4 * torch.finfo(dtype).eps
                                       * o.abs().max().item())


@pytest.mark.parametrize("subtract_mean", [True, False], ids=["layer_norm", "rms_norm"])
def test_one_pass_zero_rows_of_an_odd_row_in_clusters_with_rows_masked_at_the_end(subtract_mean):
    # 7 rows in 2-row tiles (the last tile half masked), 37 columns through the aligned window in 5-6 parts
    n = 37
    x = (torch.randn(7, n) * 3 + 0.25).half()
    x[6] = 0
    w = torch.randn(n).half()
    b = torch.randn(n).half() if subtract_mean else None
    dy = torch.randn(7, n).half()
    expected = _norm_reference(x, w, b, dy, 1e-5, subtract_mean)
    got = _norm_grads(x, w, b, dy, 1e-5, subtract_mean, CLUSTER_WINDOW)
    for a, e in zip(got, expected):
        if e is not None:
            assert_close(a, e, torch.float16)


@pytest.mark.parametrize("config", list(ONE_PASS_CONFIGS))
@pytest.mark.parametrize("subtract_mean", [True, False], ids=["layer_norm", "rms_norm"])
def test_one_pass_dx_stays_finite_for_tiny_variance_rows(config, subtract_mean):
    n = 21
    x = torch.randn(3, n) * 1e-18            # var ~1e-36, eps 1e-37: rstd ~1e18 (float32 normal range)
    w = 1 + 0.5 * torch.randn(n)
    b = torch.zeros(n) if subtract_mean else None
    dy = x * 1e21                            # ~1e3, correlated with x: c1 ~1e3, rstd^2 * c1 ~1e39
    expected = _norm_reference(x, w, b, dy, 1e-37, subtract_mean)
    assert torch.isfinite(expected[0]).all() and expected[0].abs().max() < 1e22
    two_pass = _norm_grads(x, w, b, dy, 1e-37, subtract_mean, TWO_PASS)[0]
    assert_close(two_pass, expected[0], torch.float32)           # the form it replaced holds
    got = _norm_grads(x, w, b, dy, 1e-37, subtract_mean, ONE_PASS_CONFIGS[config])[0]
    assert_close(got, expected[0], torch.float32)


def test_default_bf16_8192_backward_dx_finite_with_large_gradients():
    n = 8192
    assert norm_backward_config.backward_config(n, torch.bfloat16).persistent
    x = (torch.randn(2, n) * 1e-3).bfloat16()
    w = (1 + 0.5 * torch.randn(n)).bfloat16()
    dy = (x.float() * 1e36).bfloat16()
    expected = _norm_reference(x, w, None, dy, 1e-12, False)
    assert torch.isfinite(expected[0].bfloat16()).all()
    got = _norm_grads(x, w, None, dy, 1e-12, False, None)[0]
    assert_close(got, expected[0], torch.bfloat16)


def test_new_backward_configs_for_long_16_bit_rows():
    for subtract_mean in (True, False):
        for dtype in (torch.float16, torch.bfloat16):
            c16 = norm_backward_config.backward_config(16384, dtype, subtract_mean=subtract_mean)
            assert (c16.block_n, c16.num_warps, c16.programs_per_sm, c16.min_blocks_per_sm) == (2048, 4, 4, 4)
            assert c16.cluster and c16.persistent and c16.prefetch and not c16.aligned_window
            c32 = norm_backward_config.backward_config(32768, dtype, subtract_mean=subtract_mean)
            assert (c32.block_n, c32.num_warps, c32.prefetch, c32.cluster) == (4096, 8, True, True)
            # 16392 pads to 32768 (4096-column parts, 5 of them), 16389 takes the aligned window
            assert norm_backward_config.backward_config(16392, dtype, subtract_mean=subtract_mean).block_n == 4096
            assert norm_backward_config.backward_config(16389, dtype, subtract_mean=subtract_mean).aligned_window
            # no clusters: not the cluster configs
            assert not norm_backward_config.backward_config(16384, dtype, subtract_mean=subtract_mean,
                                                            clusters=False).cluster
        assert not norm_backward_config.backward_config(16384, torch.float32, subtract_mean=subtract_mean).cluster


def test_forward_cache_hints_only_for_16_bit_rows_of_the_tables():
    for n, layer, rms in [(1024, True, True), (2048, True, True), (4096, True, False), (1000, True, True),
                          (600, True, True)]:
        for dtype in (torch.float16, torch.bfloat16):
            assert getattr(norm_forward_config.forward_config(n, dtype, subtract_mean=True), "cache_hints",
                           False) == layer, n
            assert getattr(norm_forward_config.forward_config(n, dtype, subtract_mean=False), "cache_hints",
                           False) == rms, n
        for dtype in (torch.float32, torch.float64):
            assert not norm_forward_config.forward_config(n, dtype, subtract_mean=False).cache_hints


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rms_norm_forward_with_cache_hints_matches_float64(interpret, dtype):
    x = (torch.randn(3, 1000) * 4 + 2).to(dtype)
    w = torch.randn(1000).to(dtype)
    assert norm_forward_config.forward_config(1000, dtype, subtract_mean=False).cache_hints
    y = fusedops.rms_norm(x, (1000,), w, 1e-6)
    assert_close(y, F.rms_norm(x.double(), (1000,), w.double(), 1e-6), dtype)


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
def test_rms_norm_16384_cluster_backward_assembles_without_spills(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    n = 16384
    config = norm_backward_config.backward_config(n, torch.bfloat16, subtract_mean=False)
    x, stats = torch.zeros(8, dtype=torch.bfloat16), torch.zeros(8)
    args = (x, stats, None, x, x, x, stats, stats, 8192, n, 132, n // config.block_n, n, 1, n, 1, n)
    compiled = norm_backward_kernels.backward_persistent_kernel.compile(
        *args, target="sm_90a", num_warps=config.num_warps, SUBTRACT_MEAN=False, BLOCK_ROWS=1,
        BLOCK_N=config.block_n, TWO_PASS=False, CHUNK=min(config.chunk, config.block_n), PREFETCH=True,
        CLUSTER=n // config.block_n, MIN_BLOCKS_PER_SM=config.min_blocks_per_sm)
    result = assemble(compiled.asm["ptx"], "sm_90a")
    assert result.spill_bytes == 0, result.log


# -- 2. loop-carried tuples -----------------------------------------------------------------------------

def _kernel(source, tag):
    return jit_from_source(source, f"<review22 tuples {tag}>")


_TUPLE_KERNELS = {
    "if_in_loop": ('''
def k(o_ptr, n, m):
    t = (0, 0)
    for i in range(n):
        if i % 2 == 0:
            t = (t[0] + 1, t[1])
        else:
            t = (t[0], t[1] + i)
    dsl.store(o_ptr, t[0])
    dsl.store(o_ptr + 1, t[1])
''', lambda n, m: [(n + 1) // 2, sum(i for i in range(n) if i % 2)]),
    "if_one_branch": ('''
def k(o_ptr, n, m):
    t = (0, 5)
    for i in range(n):
        if i < m:
            t = (t[0] + 1, t[1])
    dsl.store(o_ptr, t[0])
    dsl.store(o_ptr + 1, t[1])
''', lambda n, m: [min(n, m), 5]),
    "unpack_in_body": ('''
def k(o_ptr, n, m):
    t = (1, 0)
    for i in range(n):
        a, b = t
        t = (b, a + b)
    x, y = t
    dsl.store(o_ptr, x)
    dsl.store(o_ptr + 1, y)
''', lambda n, m: [[1, 0, 1, 1, 2, 3, 5, 8][n], [0, 1, 1, 2, 3, 5, 8, 13][n]]),
    "while_condition_reads_tuple": ('''
def k(o_ptr, n, m):
    t = (0, n)
    while t[0] < t[1]:
        t = (t[0] + 1, t[1] - 1)
    dsl.store(o_ptr, t[0])
    dsl.store(o_ptr + 1, t[1])
''', lambda n, m: [(n + 1) // 2, n - (n + 1) // 2]),
    "static_range_inside": ('''
def k(o_ptr, n, m):
    t = (0, 0)
    for i in range(n):
        for s in dsl.static_range(3):
            t = (t[0] + s, t[1] + 1)
    dsl.store(o_ptr, t[0])
    dsl.store(o_ptr + 1, t[1])
''', lambda n, m: [3 * n, 3 * n]),
    "name_shadowed_in_body": ('''
def k(o_ptr, n, m):
    t = (0, 1)
    for i in range(n):
        u = t
        t = 7
        t = (u[0] + t, u[1] * 2)
    dsl.store(o_ptr, t[0])
    dsl.store(o_ptr + 1, t[1])
''', lambda n, m: [7 * n, 2 ** n]),
    "one_value_in_both_items": ('''
def k(o_ptr, n, m):
    v = n + 0
    t = (v, v)
    for i in range(m):
        t = (t[0] + 1, t[1])
    dsl.store(o_ptr, t[0])
    dsl.store(o_ptr + 1, t[1])
''', lambda n, m: [n + m, n]),
    "int_and_float_numbers": ('''
def k(o_ptr, n, m):
    t = (0, 0.5)
    for i in range(n):
        t = (t[0] + i, t[1] * 2)
    dsl.store(o_ptr, t[0])
    dsl.store(o_ptr + 1, t[1].to(dsl.int32))
''', lambda n, m: [n * (n - 1) // 2, int(0.5 * 2 ** n)]),
    "two_tuples_swapped": ('''
def k(o_ptr, n, m):
    a = (1, 2)
    b = (3, 4)
    for i in range(n):
        a, b = b, a
    dsl.store(o_ptr, a[0])
    dsl.store(o_ptr + 1, b[1])
''', lambda n, m: [1, 4] if n % 2 == 0 else [3, 2]),
    "unchanged_tuple_read_after": ('''
def k(o_ptr, n, m):
    t = (n + 1, 3)
    s = 0
    for i in range(m):
        s += t[0] + t[1]
    dsl.store(o_ptr, s)
    dsl.store(o_ptr + 1, t[0])
''', lambda n, m: [m * (n + 4), n + 1]),
    "item_reassigned_to_its_number": ('''
def k(o_ptr, n, m):
    t = (0, 3)
    for i in range(n):
        t = (t[0] + t[1], 3)
    dsl.store(o_ptr, t[0])
    dsl.store(o_ptr + 1, t[1])
''', lambda n, m: [3 * n, 3]),
    "inner_loop_then_outer_update": ('''
def k(o_ptr, n, m):
    t = (0, 0)
    for i in range(n):
        for j in range(m):
            t = (t[0] + 1, t[1])
        t = (t[0], t[1] + t[0])
    dsl.store(o_ptr, t[0])
    dsl.store(o_ptr + 1, t[1])
''', lambda n, m: [n * m, sum((i + 1) * m for i in range(n))]),
    "loop_variable_in_tuple": ('''
def k(o_ptr, n, m):
    t = (0, 0)
    for i in range(n):
        t = (i, t[1] + i)
    dsl.store(o_ptr, t[0])
    dsl.store(o_ptr + 1, t[1])
''', lambda n, m: [max(n - 1, 0), n * (n - 1) // 2]),
}
_TUPLES = {name: (_kernel(source, name), expected) for name, (source, expected) in _TUPLE_KERNELS.items()}


@pytest.mark.parametrize("name", list(_TUPLES))
@pytest.mark.parametrize("n, m", [(3, 4), (0, 2), (5, 1)])
def test_loop_carried_tuples_in_the_interpreter_and_on_the_host(name, n, m):
    kernel, expected = _TUPLES[name]
    out = torch.full((2,), -99, dtype=torch.int32)
    kernel[(1,)](out, n, m, interpret=True)
    assert out.tolist() == expected(n, m)
    out.fill_(-99)
    run_on_host(kernel, out, n, m)
    assert out.tolist() == expected(n, m)


_STALE_SLOT_FOR = _kernel('''
def k(o_ptr, n, m):
    t = (0, 0)
    for i in range(n):
        t = (t[0], t[1] + 1)
        for j in range(m):
            t = (t[0] + 1, t[1])
    dsl.store(o_ptr, t[0])
    dsl.store(o_ptr + 1, t[1])
''', "stale_for")

_STALE_SLOT_WHILE = _kernel('''
def k(o_ptr, n, m):
    t = (0, 0)
    while t[1] < n:
        t = (t[0], t[1] + 1)
        j = 0
        while j < m:
            t = (t[0] + 1, t[1])
            j += 1
    dsl.store(o_ptr, t[0])
    dsl.store(o_ptr + 1, t[1])
''', "stale_while")


@pytest.mark.parametrize("kernel", [_STALE_SLOT_FOR, _STALE_SLOT_WHILE], ids=["for", "while"])
def test_outer_update_before_an_inner_loop_that_keeps_one_item(kernel):
    out = torch.full((2,), -99, dtype=torch.int32)
    kernel[(1,)](out, 3, 4, interpret=True)
    assert out.tolist() == [12, 3]


def test_a_tuple_made_longer_by_augmented_assignment_is_refused_at_that_line():
    kernel = _kernel('''
def k(o_ptr, n):
    pair = (n, 0)
    for t in range(n):
        y = 1
        pair += (1,)
    dsl.store(o_ptr, pair[0])
''', "aug")
    with pytest.raises(dsl.CompilationError, match=r":6:8: `pair` is a tuple of 2 items before the loop but a "
                                                   r"tuple of 3 items at the end of the loop body"):
        kernel[(1,)](torch.zeros(1, dtype=torch.int32), 3, interpret=True)


def test_a_while_tuple_made_shorter_is_refused():
    kernel = _kernel('''
def k(o_ptr, n):
    pair = (n, 0)
    while pair[0] > 0:
        pair = (pair[0] - 1,)
    dsl.store(o_ptr, pair[0])
''', "shorter")
    with pytest.raises(dsl.CompilationError, match=r"`pair` is a tuple of 2 items before the loop but a tuple of "
                                                   r"1 items"):
        kernel[(1,)](torch.zeros(1, dtype=torch.int32), 3, interpret=True)


@pytest.mark.parametrize("item, found", [("None", "None"), ("(1, 2)", r"\(1, 2\)")])
def test_an_item_that_stops_being_a_value_is_named(item, found):
    kernel = _kernel(f'''
def k(o_ptr, n):
    pair = (n, 0)
    for t in range(n):
        pair = (pair[0], {item})
    dsl.store(o_ptr, pair[0])
''', f"item {item}")
    with pytest.raises(dsl.CompilationError, match=rf"`pair\[1\]` has type int32 before the loop but becomes {found}"):
        kernel[(1,)](torch.zeros(1, dtype=torch.int32), 3, interpret=True)


_ITEM_TYPE_CHANGE = _kernel('''
def k(o_ptr, x_ptr, n):
    pair = (dsl.load(x_ptr), 0)
    for t in range(n):
        y = 1
        pair = (pair[0].to(dsl.float16), pair[1] + 1)
    dsl.store(o_ptr, pair[0])
''', "item_type")


def test_an_item_type_change_is_refused_naming_the_slot():
    with pytest.raises(dsl.CompilationError, match=r"`pair\[0\]` has type float32 before the loop \(line 4\) but "
                                                   r"is assigned a float16"):
        _ITEM_TYPE_CHANGE[(1,)](torch.zeros(1), torch.ones(1), 3, interpret=True)


def test_an_item_type_change_points_at_the_reassignment():
    with pytest.raises(dsl.CompilationError, match=r":6:8: loop-carried variable `pair\[0\]`"):
        _ITEM_TYPE_CHANGE[(1,)](torch.zeros(1), torch.ones(1), 3, interpret=True)


def test_a_literal_promotion_of_an_item_is_cast_back():
    kernel = _kernel('''
def k(o_ptr, x_ptr, n):
    pair = (dsl.load(x_ptr).to(dsl.int32), 0)
    for t in range(n):
        pair = (pair[0] + 1.5, pair[1] + 1)
    dsl.store(o_ptr, pair[0])
    dsl.store(o_ptr + 1, pair[1])
''', "promotion")
    out = torch.zeros(2, dtype=torch.int32)
    kernel[(1,)](out, torch.ones(1), 3, interpret=True)
    assert out.tolist() == [4, 3]           # 1 -> 2.5 -> 2 -> 3.5 -> 3 -> 4.5 -> 4, as C's `x += 1.5`


def test_a_tuple_of_blocks_accumulates():
    kernel = _kernel('''
def k(o_ptr, x_ptr, n, B: dsl.constexpr):
    i = dsl.arange(0, B)
    acc = (dsl.zeros((B,), dsl.float32), dsl.full((B,), 1.0, dsl.float32), 0)
    for t in range(n):
        v = dsl.load(x_ptr + t * B + i)
        acc = (acc[0] + v, acc[1] * v, acc[2] + 1)
    dsl.store(o_ptr + i, acc[0])
    dsl.store(o_ptr + B + i, acc[1])
    dsl.store(o_ptr + 2 * B + i, acc[2] + 0.0 * acc[0])
''', "blocks")
    x = torch.rand(3, 8) + 0.5
    out = torch.full((24,), float("nan"))
    kernel[(1,)](out, x, 3, B=8, interpret=True)
    torch.testing.assert_close(out[:8], x.sum(0))
    torch.testing.assert_close(out[8:16], x.prod(0))
    torch.testing.assert_close(out[16:], torch.full((8,), 3.0))


# -- 3. routing to torch -----------------------------------------------------------------------------------

def test_linear_routes_sparse_complex_and_mixed_bias_like_torch():
    x, w, b = torch.randn(4, 8), torch.randn(3, 8), torch.randn(3)
    torch.testing.assert_close(linear(x.to_sparse(), w, b), F.linear(x.to_sparse(), w, b))
    torch.testing.assert_close(linear(x.cfloat(), w.cfloat(), b.cfloat()),
                               F.linear(x.cfloat(), w.cfloat(), b.cfloat()))
    with pytest.raises(RuntimeError):
        F.linear(x, w, b.double())
    with pytest.raises(RuntimeError):
        linear(x, w, b.double())
    with pytest.raises(RuntimeError):           # a sparse weight: torch's own error, both ways
        linear(x, w.to_sparse(), b)
    module = fusedops.nn.Linear(8, 3)
    torch.testing.assert_close(module(x.to_sparse()), F.linear(x, module.weight, module.bias))


def test_functional_ops_run_torch_for_sparse_operands(interpret):
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    torch.testing.assert_close(fusedops.matmul(a.to_sparse(), b), a @ b)
    torch.testing.assert_close(fusedops.matmul(a, b.to_sparse()), a @ b)
    with pytest.raises(NotImplementedError):         # as torch.softmax on a sparse tensor
        fusedops.softmax(a.to_sparse(), -1)


# -- 4. the language and runtime checks ------------------------------------------------------------

_LIMITS = {
    "outer_broadcast": ("c = a[:, None] + b[None, :]", r"\(2048, 1024\) has 2097152 elements"),
    "where_broadcast": ("c = dsl.where(a[:, None] > 0, b[None, :], 0)", r"\(2048, 1024\) has 2097152 elements"),
    "arange": ("c = dsl.arange(0, 2097152)", r"arange block \(2097152,\) has 2097152 elements"),
    "dot": ("c = dsl.dot(dsl.zeros((2048, 16), dsl.float16), dsl.zeros((16, 1024), dsl.float16))",
            r"dot result \(2048, 1024\) has 2097152 elements"),
}


@pytest.mark.parametrize("name", list(_LIMITS))
def test_blocks_past_2_to_the_20_are_refused_where_written(name):
    line, message = _LIMITS[name]
    kernel = _kernel(f'''
def k(o_ptr):
    a = dsl.arange(0, 2048)
    b = dsl.arange(0, 1024)
    {line}
    dsl.store(o_ptr, dsl.sum(c))
''', f"limit {name}")
    with pytest.raises(dsl.CompilationError, match=rf":5:\d+: .*{message}; blocks hold at most 1048576"):
        kernel.compile(torch.zeros(1), target="sm_90a")


@pytest.mark.parametrize("expression", ["x_ptr + 1.5", "x_ptr - f", "f + x_ptr", "x_ptr + (f > 0)"])
def test_pointer_plus_a_non_integer_offset_is_refused(expression):
    kernel = _kernel(f'''
def k(o_ptr, x_ptr, f):
    dsl.store(o_ptr, dsl.load({expression}))
''', f"offset {expression}")
    with pytest.raises(dsl.CompilationError, match=r"pointer offsets must be integers, got (float32|int1)"):
        kernel.compile(torch.zeros(1), torch.zeros(1), 1.5, target="sm_90a")


@pytest.mark.parametrize("kwargs", [dict(num_warps=64), dict(num_warps=True), dict(num_warps=4.0),
                                    dict(num_stages=0), dict(num_stages=True), dict(num_warps=np.int64(4))])
def test_config_refuses_bad_warps_and_stages(kwargs):
    with pytest.raises(ValueError, match="Config: num_"):
        dsl.Config({}, **kwargs)
    assert dsl.Config({"B": 4}, num_warps=32, num_stages=1).num_warps == 32


_STORE_ONE = _kernel('''
def k(o_ptr):
    dsl.store(o_ptr, 1.0)
''', "store one")


@pytest.mark.parametrize("value", ["no", "", "1", b"1"])
def test_interpret_given_as_text_is_refused_by_run_and_prepare(value):
    out = torch.zeros(1)
    with pytest.raises(dsl.LaunchError, match="interpret of `k` must be True, False or None"):
        _STORE_ONE[(1,)](out, interpret=value)
    with pytest.raises(dsl.LaunchError, match="interpret of `k` must be True, False or None"):
        _STORE_ONE.prepare((1,), out, interpret=value)
    _STORE_ONE[(1,)](out, interpret=1)        # an int flag still works
    assert out.item() == 1.0
