"""Deferred wgmma waits (passes/wgmma_waits.py): a wgmma dot stays in flight until its result is first read.

The kernel computes two independent products per K step of a loop (both B tiles, and A, through the
cp.async ring) and reads them in an order set by constexprs: X_FIRST reads x while y may still be in
flight (`wgmma_wait {pending = 1}`, then `{pending = 0}` for y); otherwise y is read first, which retires
both (`pending = 0`). CHAIN accumulates the second product onto the first (the second dot reads the
first's result: retired before it is issued). BRANCH puts an `if` between the dots and their reads (the
in-flight dots are retired before it).

CPU tier: the IR's waits and pending counts on sm_90a (none on sm_80), a dot reading a tile staged into
scratch shared memory is not deferred, ptxas assembles the PTX without spills or serialized wgmmas (C7513 /
C7514; also the attention kernels, whose dots the pass defers), and the interpreter against float64 (ragged
shapes).
GPU tier (`-m cuda`): the compiled kernels against float64 with a poisoned output.
"""

from __future__ import annotations

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.ir import OpCode
from fusedops.dsl.passes.manager import run_pipeline
from fusedops.dsl.passes.pipeline import default_pipeline
from fusedops.dsl.passes import wgmma_waits as ww
from fusedops.dsl.target import assemble, ptxas_available
from helpers import assert_close, poison


@dsl.jit
def two_products_kernel(o_ptr, a_ptr, b_ptr, c_ptr, d_ptr, M, N, K, BLOCK_M: dsl.constexpr,
                        BLOCK_N: dsl.constexpr, BLOCK_K: dsl.constexpr, X_FIRST: dsl.constexpr,
                        CHAIN: dsl.constexpr, BRANCH: dsl.constexpr):
    # o_ptr: (M, N) float32; a_ptr, c_ptr: (M, K); b_ptr, d_ptr: (K, N); all row-major. Grid: cdiv(M, BLOCK_M).
    # o = sum over K steps of f(A_k B_k, C_k D_k) (see the module docstring).
    rm = dsl.program_id(0) * BLOCK_M + dsl.arange(0, BLOCK_M)
    rn = dsl.arange(0, BLOCK_N)
    rk = dsl.arange(0, BLOCK_K)
    acc = dsl.zeros((BLOCK_M, BLOCK_N), dsl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        rows = (rm[:, None] < M) & (kk[None, :] < K)
        cols = (kk[:, None] < K) & (rn[None, :] < N)
        a = dsl.load(a_ptr + rm[:, None] * K + kk[None, :], mask=rows, other=0.0)
        b = dsl.load(b_ptr + kk[:, None] * N + rn[None, :], mask=cols, other=0.0)
        x = dsl.dot(a, b, dsl.zeros((BLOCK_M, BLOCK_N), dsl.float32))
        c = dsl.load(c_ptr + rm[:, None] * K + kk[None, :], mask=rows, other=0.0)
        d = dsl.load(d_ptr + kk[:, None] * N + rn[None, :], mask=cols, other=0.0)
        if CHAIN:
            acc = acc + dsl.dot(c, d, x)
        else:
            y = dsl.dot(c, d, dsl.zeros((BLOCK_M, BLOCK_N), dsl.float32))
            if BRANCH:
                if k0 == 0:
                    acc = acc + 1.0
            if X_FIRST:
                acc = acc + dsl.exp2(x * 0.125) - y
            else:
                acc = acc + y * 2.0 - dsl.exp2(x * 0.125)
    dsl.store(o_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@dsl.jit
def staged_product_kernel(o_ptr, a_ptr, b_ptr, N, BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr,
                          BLOCK_K: dsl.constexpr):
    # o = exp2(A B / 8) + 1 of one (BLOCK_M, BLOCK_K) x (BLOCK_K, BLOCK_N) product, no loop: B is staged
    # into scratch shared memory, not a ring slot.
    rm = dsl.arange(0, BLOCK_M)
    rn = dsl.arange(0, BLOCK_N)
    rk = dsl.arange(0, BLOCK_K)
    a = dsl.load(a_ptr + rm[:, None] * BLOCK_K + rk[None, :])
    b = dsl.load(b_ptr + rk[:, None] * N + rn[None, :])
    x = dsl.dot(a, b, dsl.zeros((BLOCK_M, BLOCK_N), dsl.float32))
    bias = dsl.load(o_ptr + rm[:, None] * N + rn[None, :]) * 0.0 + 1.0
    dsl.store(o_ptr + rm[:, None] * N + rn[None, :], dsl.exp2(x * 0.125) + bias)


TILE = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32)
VARIANTS = {"x_first": dict(X_FIRST=True, CHAIN=False, BRANCH=False),
            "y_first": dict(X_FIRST=False, CHAIN=False, BRANCH=False),
            "chain": dict(X_FIRST=False, CHAIN=True, BRANCH=False),
            "branch": dict(X_FIRST=True, CHAIN=False, BRANCH=True)}
# The waits of the loop body, in order: (pending, number of dots retired)
EXPECTED_WAITS = {"x_first": [(1, 1), (0, 1)], "y_first": [(0, 2)], "chain": [(0, 1)], "branch": [(0, 2)]}


def _arguments(m, n, k, device="cpu", dtype=torch.float16):
    generator = torch.Generator().manual_seed(m * 1000 + n * 10 + k)
    a, c = (torch.randn(m, k, generator=generator).to(device=device, dtype=dtype) for _ in range(2))
    b, d = (torch.randn(k, n, generator=generator).to(device=device, dtype=dtype) for _ in range(2))
    o = poison(torch.empty(m, n, device=device, dtype=torch.float32))
    return o, a, b, c, d


def _reference(a, b, c, d, variant, block_k):
    a, b, c, d = (t.double() for t in (a, b, c, d))
    o = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64)
    for k0 in range(0, a.shape[1], block_k):
        x = a[:, k0:k0 + block_k] @ b[k0:k0 + block_k]
        y = c[:, k0:k0 + block_k] @ d[k0:k0 + block_k]
        if variant["CHAIN"]:
            o += x + y
            continue
        if variant["BRANCH"] and k0 == 0:
            o += 1.0
        o += torch.exp2(x * 0.125) - y if variant["X_FIRST"] else y * 2.0 - torch.exp2(x * 0.125)
    return o


def _loop_body(arch, variant):
    o, a, b, c, d = _arguments(100, 64, 96)
    function = dsl.jit(two_products_kernel.fn).ir(o, a, b, c, d, 100, 64, 96, **TILE, **VARIANTS[variant])
    run_pipeline(function, default_pipeline(4, arch, num_stages=3))
    return next(op for op in function.body.ops if op.opcode == OpCode.FOR).regions[0]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_sm90a_waits_move_to_the_first_read(variant):
    body = _loop_body("sm_90a", variant)
    dots = [op for op in body.walk() if op.opcode == OpCode.DOT]
    assert len(dots) == 2 and all(op.attrs.get("engine") == "wgmma" for op in dots)
    waits = [(op.attrs["pending"], len(op.operands)) for op in body.ops if op.opcode == OpCode.WGMMA_WAIT]
    assert waits == EXPECTED_WAITS[variant]
    if variant == "chain":       # the second dot reads the first: retired before it; the second's result
        assert [bool(op.attrs.get("deferred")) for op in dots] == [True, False]     # is read right away
        wait = next(op for op in body.ops if op.opcode == OpCode.WGMMA_WAIT)
        assert body.ops.index(wait) + 1 == body.ops.index(dots[1]) and dots[1].operands[2] is wait.results[0]
        return
    assert all(op.attrs.get("deferred") for op in dots)
    first_wait = next(i for i, op in enumerate(body.ops) if op.opcode == OpCode.WGMMA_WAIT)
    assert all(body.ops.index(op) < first_wait for op in dots), "both dots are issued before the first wait"
    if variant == "branch":
        branch = next(i for i, op in enumerate(body.ops) if op.opcode == OpCode.IF)
        assert first_wait == branch - 1, "the in-flight dots are retired right before the `if`"


def test_sm80_dots_are_not_deferred_and_a_staging_dot_retires_the_dots_before_it():
    """A dot whose operand is staged from registers (st.shared into scratch) may stay in flight, but only
    across ops that write no shared memory, and it retires every in-flight dot before it (ptxas
    serializes wgmmas beside st.shared; a later staging would overwrite its tile): session 28."""
    body = _loop_body("sm_80", "x_first")
    assert not any(op.opcode == OpCode.WGMMA_WAIT or op.attrs.get("deferred") for op in body.walk())
    o, a, b = torch.empty(64, 64), torch.empty(64, 32, dtype=torch.float16), torch.empty(32, 64, dtype=torch.float16)
    function = dsl.jit(staged_product_kernel.fn).ir(o, a, b, 64, **TILE)
    run_pipeline(function, default_pipeline(4, "sm_90a"))
    dot = next(op for op in function.body.walk() if op.opcode == OpCode.DOT)
    assert dot.attrs.get("engine") == "wgmma"
    block = dot.parent
    ops = block.ops[block.ops.index(dot) + 1:]
    wait = next((op for op in ops if op.opcode == OpCode.WGMMA_WAIT), None)
    between = ops[:ops.index(wait)] if wait is not None else []
    assert dot.attrs.get("deferred") == (wait is not None)
    assert all(ww._passable(op) for op in between)


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
@pytest.mark.parametrize("variant", ["x_first", "branch"])
def test_ptx_keeps_both_wgmmas_in_flight(variant, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    o, a, b, c, d = _arguments(100, 64, 96)
    compiled = dsl.jit(two_products_kernel.fn).compile(o, a, b, c, d, 100, 64, 96, target="sm_90a", num_warps=4,
                                                       num_stages=3, **TILE, **VARIANTS[variant])
    ptx = compiled.asm["ptx"]
    assert ("wgmma.wait_group.sync.aligned 1;" in ptx) == (variant == "x_first")
    result = assemble(ptx, "sm_90a")
    assert "serialized" not in result.log, result.log      # C7513 / C7514: ptxas serialized the wgmmas
    assert result.spill_bytes == 0, f"{result.registers} registers, {result.spill_bytes} bytes spilled"


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
@pytest.mark.parametrize("kernel", ["forward", "dkdv", "dq"])
@pytest.mark.parametrize("dim", [64, 128])
def test_attention_kernels_keep_their_wgmmas_in_flight(kernel, dim, tmp_path, monkeypatch):
    # the library kernels whose dots the pass defers: ptxas must not serialize their wgmmas
    from test_attention import compile_backward, compile_forward
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    compiled = compile_forward(dim) if kernel == "forward" else compile_backward(kernel, dim)
    assert "wgmma.wait_group.sync.aligned 1;" in compiled.asm["ptx"]
    result = assemble(compiled.asm["ptx"], "sm_90a")
    assert "serialized" not in result.log, result.log


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (100, 50, 96), (64, 64, 33)])
def test_interpreter_against_float64(variant, m, n, k):
    o, a, b, c, d = _arguments(m, n, k)
    two_products_kernel[(dsl.cdiv(m, 64),)](o, a, b, c, d, m, n, k, interpret=True, **TILE, **VARIANTS[variant])
    assert_close(o, _reference(a, b, c, d, VARIANTS[variant], TILE["BLOCK_K"]), dtype=torch.float32)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (300, 50, 200), (1000, 64, 257)])
def test_gpu_against_float64(m, n, k, variant, dtype):
    o, a, b, c, d = _arguments(m, n, k, "cuda", dtype)
    two_products_kernel[(dsl.cdiv(m, 64),)](o, a, b, c, d, m, n, k, num_warps=4, num_stages=3, **TILE,
                                            **VARIANTS[variant])
    torch.cuda.synchronize()
    reference = _reference(*(t.cpu() for t in (a, b, c, d)), VARIANTS[variant], TILE["BLOCK_K"])
    assert_close(o, reference, dtype=torch.float32)


@pytest.mark.cuda
def test_gpu_staged_product_against_float64():
    generator = torch.Generator().manual_seed(7)
    a = torch.randn(64, 32, generator=generator).to("cuda", torch.float16)
    b = torch.randn(32, 64, generator=generator).to("cuda", torch.float16)
    o = torch.zeros(64, 64, device="cuda")
    staged_product_kernel[(1,)](o, a, b, 64, num_warps=4, **TILE)
    torch.cuda.synchronize()
    reference = torch.exp2((a.double() @ b.double()) * 0.125) + 1.0
    assert_close(o, reference.cpu(), dtype=torch.float32)
