"""Review of session 9's thread block clusters and TMA multicast (commit 26c6ead): failing cases.

Each test but the last fails at 26c6ead because of a bug (the report lists input, expected, actual,
fault, fix). The last one passes: it covers what tests/test_clusters.py's
test_interpreter_cluster_matmul_matches_float64 means to cover, but does not (its float32 operands
fail `_uses_tma`, so the cluster config is dropped and matmul_kernel runs).
CPU only, a few seconds.
"""

from __future__ import annotations

import re

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.ir import ops as ir_ops
from fusedops.kernels import matmul as mm
from fusedops.kernels.matmul_kernels import matmul_tma_kernel

from helpers import assert_close, poison, random_tensor


def _operands(m, n, k, seed):
    a = random_tensor((1, m, k), torch.float16, "cpu", seed)
    b = random_tensor((1, k, n), torch.float16, "cpu", seed + 1)
    c = poison(torch.empty(1, m, n, dtype=torch.float16))
    assert mm._uses_tma(c, a, b)        # the TMA path: matmul_tma_kernel with the cluster constexprs
    return a, b, c


def _config(**cluster):
    return dsl.Config(dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=4, **cluster), num_warps=4, num_stages=1)


# -- the library matmul's cluster constexprs -----------------------------------------------------------------------

def test_matmul_cluster_m_and_cluster_n_together_is_rejected_or_correct(seed):
    """CLUSTER_M=2 and CLUSTER_N=2 (also `matmul_configs._config(..., cluster_m=2, cluster_n=2)`): matmul_tma_kernel
    takes its CLUSTER_N branch (clusters of 2 along a row of tiles, different B tiles) but still passes
    multicast=CLUSTER_M > 1 to B's load, so on the GPU each CTA gets half of its own B tile and half of
    its neighbour's (wrong c, no error); the interpreter stops inside the library kernel. Expected: an
    error naming both constexprs (or a correct product)."""
    a, b, c = _operands(40, 48, 32, seed)
    try:
        mm.matmul_into(c, a, b, interpret=True, config=_config(CLUSTER_M=2, CLUSTER_N=2))
    except (ValueError, TypeError, dsl.LaunchError, dsl.CompilationError) as error:
        first = str(error).splitlines()[0]
        assert "CLUSTER_M" in first and "CLUSTER_N" in first, first
    else:
        assert_close(c[0], a[0].double() @ b[0].double(), torch.float16)


@pytest.mark.parametrize("cluster,name", [
    ({"CLUSTER_M": 0}, "CLUSTER_M"),          # now: CompilationError "cdiv by zero" (host grid, _programs)
    ({"CLUSTER_N": 0}, "CLUSTER_N"),          # now: the same
    ({"CLUSTER_M": 16}, "CLUSTER_M"),         # now: "cluster_dims: size must be ..." at matmul_kernels.py's directive
    ({"CLUSTER_N": 2.0}, "CLUSTER_N"),        # now: LaunchError "grid entry 0 ... got float 12.0"
], ids=str)
def test_matmul_bad_cluster_constexpr_is_named(cluster, name, seed):
    a, b, c = _operands(48, 48, 32, seed)
    with pytest.raises(Exception) as caught:
        mm.matmul_into(c, a, b, interpret=True, config=_config(**cluster))
    first = str(caught.value).splitlines()[0]
    assert name in first, first


# -- dsl.cluster_dims ----------------------------------------------------------------------------------------------

@dsl.jit
def _copy(x_ptr, y_ptr, n, SIZE: dsl.constexpr):
    dsl.cluster_dims(SIZE)
    offsets = dsl.program_id(0) * 16 + dsl.arange(0, 16)
    dsl.store(y_ptr + offsets, dsl.load(x_ptr + offsets, mask=offsets < n), mask=offsets < n)


def test_prepare_checks_the_cluster_grid():
    """JITFunction.prepare promises to raise what `run` raises for these arguments; a grid that is not
    made of whole clusters raises only at every later call of the prepared launch (interpreter and GPU
    alike: make_prepared never looks at the cluster size)."""
    x = torch.zeros(48)
    with pytest.raises(dsl.LaunchError, match="multiple of 2, got 3"):
        _copy.prepare((3,), x, x.clone(), 48, SIZE=2, interpret=True)


@dsl.jit
def _two_sizes_helper(SIZE: dsl.constexpr):
    dsl.cluster_dims(SIZE)


@dsl.jit
def _two_sizes(x_ptr, n):
    dsl.cluster_dims(2)
    _two_sizes_helper(4)
    offsets = dsl.program_id(0) * 16 + dsl.arange(0, 16)
    dsl.store(x_ptr + offsets, dsl.zeros((16,), dsl.float32), mask=offsets < n)


@pytest.mark.parametrize("how", ["interpreter", "compile"])
def test_conflicting_cluster_sizes_error_points_at_a_call(how):
    """Every other CompilationError of the DSL starts with file:line:col of the offending call;
    `ir.ops.cluster_size` raises without a location (and without the kernel's name), so a size set in
    a helper several calls deep cannot be found from the message."""
    x = torch.zeros(64)
    with pytest.raises(dsl.CompilationError) as caught:
        if how == "interpreter":
            _two_sizes[(4,)](x, 64, interpret=True)
        else:
            _two_sizes.compile(x, 64, target="sm_90a")
    assert re.search(r"test_review_session9\.py:\d+:\d+", str(caught.value)), str(caught.value)


# -- the IR's op table ---------------------------------------------------------------------------------------------

def _row(opcode: str) -> str:
    (row,) = [line for line in ir_ops.__doc__.splitlines() if line.startswith(f"| {opcode} |")]
    return row


def test_op_table_documents_the_cluster_attrs():
    """ir/ops.py's table (the IR's reference) names attrs the passes never set and misses those they do:
    MBARRIER_WAIT lists `cluster_barrier` (pipelining sets `cluster_wait`), CLUSTER_BARRIER lists none
    (pipelining sets `half` = arrive / wait, lowered to one half only), TMA_COPY omits `multicast_rows`."""
    assert "cluster_wait" in _row("MBARRIER_WAIT")
    assert "half" in _row("CLUSTER_BARRIER")
    assert "multicast_rows" in _row("TMA_COPY")


# -- coverage (passes) ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cluster", [{"CLUSTER_M": 2}, {"CLUSTER_N": 2}, {"CLUSTER_M": 3}], ids=str)
def test_interpreter_cluster_matmul_fp16_runs_the_cluster_kernel(cluster, seed, monkeypatch):
    """What test_clusters.test_interpreter_cluster_matmul_matches_float64 means to test: 16-bit operands
    take matmul_tma_kernel with the cluster constexprs (float32 ones never do), ragged edges."""
    launched = []
    original = matmul_tma_kernel

    class _Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched.append((grid, {k: kwargs.get(k, 1) for k in ("CLUSTER_M", "CLUSTER_N")}))
                return original[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(mm, "matmul_tma_kernel", _Spy())
    a, b, c = _operands(40, 48, 32, seed)
    mm.matmul_into(c, a, b, interpret=True, config=_config(**cluster))
    assert_close(c[0], a[0].double() @ b[0].double(), torch.float16)
    ((grid, constexprs),) = launched
    assert constexprs == {"CLUSTER_M": 1, "CLUSTER_N": 1, **cluster}
    assert grid[0] % max(constexprs.values()) == 0
