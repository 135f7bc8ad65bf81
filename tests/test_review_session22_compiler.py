"""Review (session 22, the compiler): a fresh reviewer played a demanding Triton user and tried to break the
compiler on the CPU: dots in K loops (num_stages 1-5, num_warps 1-8, sm_80 / sm_90a, fp16 / bf16, masked K,
zero trips, dots in branches, nested loops, transposed operands, chained dots, two accumulators, conditionally
advanced / swapped / variably stepped carried pointers, while loops, reversed ranges), descriptor matmuls
with ragged shapes, reductions / scans / argmin of 8-, 16- and 64-bit types, atomics of every dtype (masked,
scalar), scalar control flow run on the host (host_jit) against the interpreter. No internal error, no
ptxas rejection and no wgmma serialization warning (C7514/C7513) was found; the pipelined IR interpreted
like the frontend IR everywhere.

Defects (strict xfails):
- The FMA `dsl.dot` (float32 "ieee", float32 "tf32", float64, int8) gives every accumulator register its own
  copy of its A row and B column (codegen/dot.py: "A's register k + (r << log2 K) holds A[m(r), k] for
  accumulator register r", the layouts of passes/layout_assignment.fma_operand_layout), so a thread holds
  acc_regs * K values of each operand: a float32 64x64x32 dot with 4 warps needs 2048 operand registers
  per thread and ptxas spills (sm_90a: 255 registers + 180 bytes; 64x64x64: 7.7 KB; float64 64x64x16:
  8.6 KB; int8 64x64x64: 1.6 KB). Triton's FMA dot shares a row of A across the thread's columns.
  Fixed in session 23 (tests/test_fma_dot.py).
- `dsl.dot(..., input_precision="tf32")` was documented as "float32 inputs on tensor cores"
  (language/block_builtins.py `dot`), but it lowers through the same FMA path, rounding the inputs to tf32 with
  integer ops (codegen/dot.py `_round_to_tf32`): no mma.sync / wgmma .tf32 instruction in the PTX. The
  docstring now says so (session 22); the tensor-core lowering stays a strict xfail. Fixed in session 41:
  tf32 dots run on mma.sync m16n8k8 .tf32 (codegen/mma_tf32.py, tests/test_tf32_dot.py), and the interpreter
  rounds their operands to tf32 as the tensor cores' operands are.
- Fixed (session 22): a tuple of kernel values reassigned in a loop (`p = (p[0] + BK, p[1] + BK * N)`,
  which Triton carries) was refused with "`p` is the compile-time value (Value(?: <64x16xptr<float16>>),
  ...) before the loop", calling kernel values compile-time and printing internal IR reprs
  (frontend/loops.py `_compile_loop`); tuples are now carried item by item (tests/test_loop_carried_tuples.py).
"""

from __future__ import annotations

import itertools
import re

import pytest
import torch

import fusedops.dsl as dsl
from codegen_helpers import interpret_ir, pipelined_ir
from fusedops.dsl.target import assemble, ptxas_available
from host_jit import run_on_host
from kernel_source import jit_from_source

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
P16, P32 = dsl.pointer_type(dsl.float16), dsl.pointer_type(dsl.float32)


def _kernel(source: str, tag: str):
    return jit_from_source(source, f"<review22c {tag}>")


def _ptxas_warnings(log: str) -> list:
    return [line for line in log.splitlines() if "arning" in line]


# ================================================================================================
# Defect: the FMA dot replicates its operands per accumulator register and spills on small tiles
# ================================================================================================
_fma_dot = _kernel('''
def k(c_ptr, a_ptr, b_ptr, M: dsl.constexpr, N: dsl.constexpr, KK: dsl.constexpr, PREC: dsl.constexpr):
    rm = dsl.arange(0, M); rn = dsl.arange(0, N); rk = dsl.arange(0, KK)
    a = dsl.load(a_ptr + rm[:, None] * KK + rk[None, :])
    b = dsl.load(b_ptr + rk[:, None] * N + rn[None, :])
    dsl.store(c_ptr + rm[:, None] * N + rn[None, :], dsl.dot(a, b, input_precision=PREC))
''', "fma_dot")

_OUT = {torch.float32: torch.float32, torch.float64: torch.float64, torch.int8: torch.int32}


def _compile_fma_dot(dtype, prec, m, n, k, arch="sm_90a", num_warps=4):
    return _fma_dot.compile(torch.zeros(m * n, dtype=_OUT[dtype]), torch.zeros(m * k, dtype=dtype),
                            torch.zeros(k * n, dtype=dtype), target=arch, num_warps=num_warps,
                            M=m, N=n, KK=k, PREC=prec)


@needs_ptxas
# Fixed in session 23: codegen/dot.py stages A and B in shared memory and reads one k at a time.
@pytest.mark.parametrize("dtype,prec,shape", [
    (torch.float32, None, (64, 64, 32)),
    (torch.float32, "tf32", (64, 64, 32)),
    (torch.float64, None, (64, 64, 16)),
    (torch.int8, None, (64, 64, 64)),
], ids=str)
def test_fma_dot_of_a_small_tile_does_not_spill(dtype, prec, shape):
    result = assemble(_compile_fma_dot(dtype, prec, *shape).asm["ptx"], "sm_90a")
    assert result.spill_bytes == 0, result.log


@needs_ptxas
def test_fma_dot_of_a_tiny_tile_assembles_without_spills():
    # the same path at 32x32x32 (96 registers) and float32 64x64x16 (168) still fits
    for dtype, shape in [(torch.float32, (32, 32, 32)), (torch.float32, (64, 64, 16)), (torch.int8, (32, 32, 32))]:
        for arch in ("sm_80", "sm_90a"):
            result = assemble(_compile_fma_dot(dtype, None, *shape, arch=arch).asm["ptx"], arch)
            assert result.spill_bytes == 0 and not _ptxas_warnings(result.log), (dtype, shape, arch, result.log)


# ================================================================================================
# Defect: input_precision="tf32" does not use the tensor cores it is documented to use
# ================================================================================================
# Fixed in session 41: mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 (codegen/mma_tf32.py).
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_tf32_dot_runs_on_tensor_cores(arch):
    ptx = _compile_fma_dot(torch.float32, "tf32", 64, 64, 32, arch=arch).asm["ptx"]
    assert re.search(r"\b(wgmma\.mma_async|mma\.sync)\S*\.tf32", ptx)


def test_ieee_dots_in_the_interpreter_are_exact_float32_and_tf32_ones_round_the_operands():
    # (session 41: the interpreter rounds tf32 operands as the tensor cores' are; it computed exact float32)
    torch.manual_seed(1)
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    for prec in (None, "ieee", "tf32"):
        out = torch.zeros(256)
        _fma_dot[(1,)](out, a, b, M=16, N=16, KK=16, PREC=prec, interpret=True)
        x, y = (a.double(), b.double()) if prec != "tf32" else (_tf32(a), _tf32(b))
        torch.testing.assert_close(out.view(16, 16), (x @ y).float(), rtol=1e-5, atol=1e-5)


def _tf32(x):
    """float32 x rounded to tf32 (nearest, ties away: cvt.rna), as float64."""
    bits = x.view(torch.int32).long() & 0xFFFFFFFF
    return ((bits + 0x1000) & 0xFFFFE000).to(torch.int64).to(torch.int32).view(torch.float32).double()


# ================================================================================================
# Holds: pipelined IR of odd dot loops interprets like the frontend IR (zero trips included)
# ================================================================================================
_HEAD = '''
def k(c_ptr, a_ptr, b_ptr, K, flag, BM: dsl.constexpr, BN: dsl.constexpr, BK: dsl.constexpr):
    rm = dsl.arange(0, BM); rn = dsl.arange(0, BN); rk = dsl.arange(0, BK)
    acc = dsl.zeros((BM, BN), dsl.float32)
'''
_TAIL = '''
    dsl.store(c_ptr + rm[:, None] * BN + rn[None, :], acc)
'''
_LOOPS = {
    "conditional_advance": '''
    a_ptrs = a_ptr + rm[:, None] * K + rk[None, :]
    b_ptrs = b_ptr + rk[:, None] * BN + rn[None, :]
    for k in range(0, K // BK):
        acc += dsl.dot(dsl.load(a_ptrs), dsl.load(b_ptrs))
        if k % 2 == flag:
            a_ptrs += BK
        b_ptrs += BK * BN''',
    "alternating_step": '''
    a_ptrs = a_ptr + rm[:, None] * K + rk[None, :]
    b_ptrs = b_ptr + rk[:, None] * BN + rn[None, :]
    step = 0
    for k in range(0, K // BK):
        acc += dsl.dot(dsl.load(a_ptrs), dsl.load(b_ptrs))
        a_ptrs += step * BK
        step = 1 - step
        b_ptrs += BK * BN''',
    "swapped_pointers": '''
    a_ptrs = a_ptr + rm[:, None] * K + rk[None, :]
    a2 = a_ptrs + BK
    b_ptrs = b_ptr + rk[:, None] * BN + rn[None, :]
    for k in range(0, K // BK):
        acc += dsl.dot(dsl.load(a_ptrs), dsl.load(b_ptrs))
        a_ptrs, a2 = a2, a_ptrs
        b_ptrs += BK * BN''',
    "masked_ragged_k": '''
    for k in range(0, K, BK):
        a = dsl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :], mask=(k + rk)[None, :] < K, other=0.0)
        b = dsl.load(b_ptr + (k + rk)[:, None] * BN + rn[None, :], mask=(k + rk)[:, None] < K, other=0.0)
        acc += dsl.dot(a, b)''',
    "while_loop": '''
    k = 0
    while k + BK <= K:
        a = dsl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = dsl.load(b_ptr + (k + rk)[:, None] * BN + rn[None, :])
        acc += dsl.dot(a, b)
        k += BK''',
    "reversed_range": '''
    for k in range(K - BK, -1, -BK):
        a = dsl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = dsl.load(b_ptr + (k + rk)[:, None] * BN + rn[None, :])
        acc = acc * 0.5 + dsl.dot(a, b)''',
    "runtime_start": '''
    b_ptrs = b_ptr + rk[:, None] * BN + rn[None, :]
    for k in range(flag, K // BK):
        acc += dsl.dot(dsl.load(a_ptr + rm[:, None] * K + rk[None, :] + k * BK), dsl.load(b_ptrs))
        b_ptrs += BK * BN''',
    "where_on_dot": '''
    for k in range(0, K // BK):
        a = dsl.load(a_ptr + rm[:, None] * K + (k * BK + rk)[None, :])
        b = dsl.load(b_ptr + (k * BK + rk)[:, None] * BN + rn[None, :])
        acc = dsl.where(rm[:, None] > rn[None, :] + k, acc + dsl.dot(a, b), acc)''',
    "dot_in_branch": '''
    for k in range(0, K, BK):
        a = dsl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = dsl.load(b_ptr + (k + rk)[:, None] * BN + rn[None, :])
        if k > flag * BK:
            acc = dsl.dot(a, b, acc)
        else:
            acc = acc - dsl.dot(a, b)''',
}
_LOOP_KERNELS = {name: _kernel(_HEAD + body + _TAIL, name) for name, body in _LOOPS.items()}


@pytest.mark.parametrize("name", list(_LOOPS))
def test_pipelined_dot_loops_interpret_like_the_frontend_ir(name):
    kernel = _LOOP_KERNELS[name]
    gen = torch.Generator().manual_seed(len(name))
    bm, bn, bk = 32, 16, 16
    for k_len, flag in [(0, 0), (bk, 1), (3 * bk + (bk // 2 if name == "masked_ragged_k" else 0), 0)]:
        a = torch.randn(bm, k_len + 2 * bk, generator=gen).half()
        b = torch.randn(k_len + 2 * bk, bn, generator=gen).half()
        kw = dict(BM=bm, BN=bn, BK=bk)
        reference = torch.full((bm, bn), float("nan"))
        kernel[(1,)](reference, a, b, k_len, flag, **kw, interpret=True)
        assert not reference.isnan().any()
        for arch, stages in [("sm_80", 3), ("sm_90a", 1), ("sm_90a", 4)]:
            out = torch.full((bm, bn), float("nan"))
            function, _ = pipelined_ir(kernel, (out, a, b, k_len, flag), kw, 4, arch=arch, num_stages=stages)
            interpret_ir(kernel, function, (1,), (out, a, b, k_len, flag), kw)
            torch.testing.assert_close(out, reference, rtol=1e-3, atol=1e-3, msg=f"{name} K={k_len} {arch} {stages}")


# ================================================================================================
# Holds: descriptor matmul with ragged M/N/K (and K = 0) through the pipeline, against float64
# ================================================================================================
_desc_mm = _kernel('''
def k(c_ptr, a_ptr, b_ptr, M, N, K, BM: dsl.constexpr, BN: dsl.constexpr, BK: dsl.constexpr):
    ad = dsl.make_tensor_descriptor(a_ptr, (M, K), (K, 1), (BM, BK))
    bd = dsl.make_tensor_descriptor(b_ptr, (K, N), (N, 1), (BK, BN))
    pm = dsl.program_id(0) * BM
    acc = dsl.zeros((BM, BN), dsl.float32)
    for k in range(0, K, BK):
        acc += dsl.dot(ad.load((pm, k)), bd.load((k, 0)))
    cd = dsl.make_tensor_descriptor(c_ptr, (M, N), (N, 1), (BM, BN))
    cd.store((pm, 0), acc)
''', "desc_mm")


@pytest.mark.parametrize("tile,sizes", [((64, 16, 16), (67, 13, 37)), ((16, 16, 32), (19, 16, 0)),
                                        ((64, 8, 16), (1, 5, 16)), ((16, 16, 128), (33, 11, 261))], ids=str)
def test_descriptor_matmul_with_ragged_edges_through_the_pipeline(tile, sizes):
    (bm, bn, bk), (m, n, k_len) = tile, sizes
    gen = torch.Generator().manual_seed(m + n + k_len)
    a = torch.randn(m, k_len, generator=gen).to(torch.bfloat16)
    b = torch.randn(k_len, n, generator=gen).to(torch.bfloat16)
    expected = (a.double() @ b.double()).float()
    grid, kw = ((m + bm - 1) // bm,), dict(BM=bm, BN=bn, BK=bk)
    for arch, stages in [("sm_80", 2), ("sm_90a", 3)]:
        out = torch.full((m, n), float("nan"))
        function, _ = pipelined_ir(_desc_mm, (out, a, b, m, n, k_len), kw, 4, arch=arch, num_stages=stages)
        interpret_ir(_desc_mm, function, grid, (out, a, b, m, n, k_len), kw)
        torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)


# ================================================================================================
# Holds: wgmma loops with dots in branches, two accumulators, a transposed result assemble cleanly
# ================================================================================================
_WGMMA = {
    "result_in_branch": '''
    m = dsl.full((BM,), -1e30, dsl.float32)
    for k in range(0, K, BK):
        s = dsl.dot(dsl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :]),
                    dsl.load(b_ptr + (k + rk)[:, None] * BN + rn[None, :]))
        if k > flag:
            m = dsl.maximum(m, dsl.max(s, axis=1))
            acc += s
        else:
            acc -= s
    acc += m[:, None]''',
    "two_accumulators": '''
    acc2 = dsl.zeros((BM, BN), dsl.float32)
    for k in range(0, K, BK):
        a = dsl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = dsl.load(b_ptr + (k + rk)[:, None] * BN + rn[None, :])
        acc = dsl.dot(a, b, acc)
        acc2 = dsl.dot(a, b, acc2 * 0.5)
    acc -= acc2''',
    "nested_tiles": '''
    for t in range(flag):
        inner = dsl.zeros((BM, BN), dsl.float32)
        for k in range(0, K, BK):
            a = dsl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
            b = dsl.load(b_ptr + t * K * BN + (k + rk)[:, None] * BN + rn[None, :])
            inner += dsl.dot(a, b)
        acc += inner * t''',
}
_WGMMA_KERNELS = {name: _kernel(_HEAD + body + _TAIL, "wgmma_" + name) for name, body in _WGMMA.items()}


@needs_ptxas
@pytest.mark.parametrize("name", list(_WGMMA))
def test_wgmma_loops_with_branches_and_two_accumulators_assemble_without_serialization(name):
    kernel = _WGMMA_KERNELS[name]
    for num_warps, stages, tile in [(4, 1, (64, 64, 32)), (4, 4, (64, 64, 32)), (8, 3, (128, 128, 64))]:
        bm, bn, bk = tile
        compiled = kernel.compile(P32, P16, P16, 1, 1, target="sm_90a", num_warps=num_warps, num_stages=stages,
                                  BM=bm, BN=bn, BK=bk)
        assert "wgmma.mma_async" in compiled.asm["ptx"]
        result = assemble(compiled.asm["ptx"], "sm_90a")
        assert not _ptxas_warnings(result.log) and result.spill_bytes == 0, (name, num_warps, stages, result.log)


# ================================================================================================
# Holds: 8/16-bit reductions and scans of aligned tensors vectorize and do not spill
# ================================================================================================
_reduce = _kernel('''
def k(o_ptr, x_ptr, M: dsl.constexpr, N: dsl.constexpr, OP: dsl.constexpr):
    rm = dsl.arange(0, M); rn = dsl.arange(0, N)
    x = dsl.load(x_ptr + rm[:, None] * N + rn[None, :])
    if OP == "max":
        dsl.store(o_ptr + rm, dsl.max(x, axis=1))
    elif OP == "argmin":
        dsl.store(o_ptr + rm, dsl.argmin(x, axis=1).to(o_ptr.dtype.element_ty))
    else:
        dsl.store(o_ptr + rm[:, None] * N + rn[None, :], dsl.cumsum(x, axis=1))
''', "reduce")


@needs_ptxas
@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int64], ids=str)
@pytest.mark.parametrize("op", ["max", "cumsum"])
def test_narrow_and_wide_integer_reductions_vectorize_and_fit(dtype, op):
    for arch in ("sm_80", "sm_90a"):
        compiled = _reduce.compile(torch.zeros(4096, dtype=dtype), torch.zeros(4096, dtype=dtype), target=arch,
                                   num_warps=4, M=64, N=64, OP=op)
        ptx = compiled.asm["ptx"]
        assert re.search(r"ld\.global(\.nc)?\.v[24]\.b(32|64)", ptx), (dtype, op, arch)
        result = assemble(ptx, arch)
        assert result.spill_bytes == 0 and not _ptxas_warnings(result.log), (dtype, op, arch, result.log)


def test_integer_cumsum_and_max_in_the_interpreter_follow_torch():
    gen = torch.Generator().manual_seed(3)
    for dtype in (torch.int8, torch.int16, torch.int64):
        x = torch.randint(-100, 100, (8, 16), dtype=dtype, generator=gen)
        out = torch.zeros(8, 16, dtype=dtype)
        _reduce[(1,)](out, x, M=8, N=16, OP="cumsum", interpret=True)
        assert torch.equal(out, torch.cumsum(x, dim=1).to(dtype)), dtype   # wraps in the element type
        mx = torch.zeros(8, dtype=dtype)
        _reduce[(1,)](mx, x, M=8, N=16, OP="max", interpret=True)
        assert torch.equal(mx, x.max(dim=1).values)


# ================================================================================================
# Holds: scalar control flow compiled and run on the host agrees with the interpreter
# ================================================================================================
_SCALAR = {
    "while": "i = 0\n    acc = 0\n    while i < n:\n        acc += i * m\n        i += 1",
    "negative_step": "acc = 0\n    for i in range(n, m, -3):\n        acc = acc * 3 + i",
    "runtime_step": "acc = 0\n    for i in range(m, n, m + 1):\n        acc = acc * 7 + i",
    "int64_induction": ("acc = 0\n    big = n.to(dsl.int64) * 1000000000\n    for i in range(big, big + m):\n"
                        "        acc += i\n    acc = (acc % 1000003).to(dsl.int32)"),
    "triangular": "acc = 0\n    for i in range(n):\n        for j in range(i, m):\n            acc += i * j + 1",
    "fibonacci_swap": "acc = 0\n    b = 1\n    for i in range(n):\n        acc, b = b, (acc + b) % (m * m + 1)",
    "static_range_inside": ("acc = 0\n    for i in range(n):\n        for s in dsl.static_range(3):\n"
                            "            if s == 1:\n                acc += i\n            else:\n                acc -= m"),
    "int8_carry": "acc = n.to(dsl.int8)\n    for i in range(m):\n        acc = acc * 3 + 1\n    acc = acc.to(dsl.int32)",
    "uint32_hash": ("acc = n.to(dsl.uint32)\n    for i in range(m):\n        acc = acc * 2654435761 + i\n"
                    "    acc = acc.to(dsl.int32)"),
    "collatz": ("i = n\n    acc = m\n    while (i > 1) & (acc < 500):\n        if i % 2 == 0:\n            i = i // 2\n"
                "        else:\n            i = 3 * i + 1\n        acc += 1"),
    "float_carry_cast": "acc = 1.0\n    for i in range(n):\n        acc = acc / 3.0 + m\n    acc = (acc * 1000).to(dsl.int32)",
}
_SCALAR_KERNELS = {name: _kernel(f"def k(o_ptr, n, m):\n    {body}\n    dsl.store(o_ptr, acc)\n", "scalar_" + name)
                   for name, body in _SCALAR.items()}


@pytest.mark.parametrize("name", list(_SCALAR))
def test_scalar_loops_on_the_host_match_the_interpreter(name):
    kernel = _SCALAR_KERNELS[name]
    for n, m in [(0, 0), (0, 5), (5, 0), (1, 1), (7, 3), (3, 7), (20, 10), (-3, 4), (4, -3), (27, 1)]:
        interpreted, compiled = torch.full((1,), -99, dtype=torch.int32), torch.full((1,), -77, dtype=torch.int32)
        kernel[(1,)](interpreted, n, m, interpret=True)
        run_on_host(kernel, compiled, n, m)
        assert interpreted.item() == compiled.item(), (name, n, m)


# ================================================================================================
# Holds: atomics of every dtype, masked and scalar, compile and assemble or are refused clearly
# ================================================================================================
_atomic = _kernel('''
def k(o_ptr, x_ptr, B: dsl.constexpr, OP: dsl.constexpr):
    i = dsl.arange(0, B)
    v = dsl.load(x_ptr + i)
    m = i < 5
    if OP == "add":
        old = dsl.atomic_add(o_ptr + i % 4, v, mask=m)
    elif OP == "min":
        old = dsl.atomic_min(o_ptr + i % 4, v, mask=m)
    elif OP == "xchg":
        old = dsl.atomic_xchg(o_ptr + i % 4, v, mask=m)
    else:
        old = dsl.atomic_cas(o_ptr + i % 4, v, v + 1)
    dsl.store(x_ptr + i, old)
''', "atomic")


@pytest.mark.parametrize("dtype", [dsl.uint8, dsl.uint16, dsl.int64, dsl.uint32, dsl.float16, dsl.bfloat16,
                                   dsl.float64], ids=str)
def test_masked_atomics_of_every_dtype_assemble_or_are_refused(dtype):
    for op, block, arch in itertools.product(["add", "min", "xchg", "cas"], [2, 256], ["sm_80", "sm_90a"]):
        try:
            compiled = _atomic.compile(dsl.pointer_type(dtype), dsl.pointer_type(dtype), target=arch, num_warps=4,
                                       B=block, OP=op)
        except dsl.CompilationError as error:
            assert "support" in str(error) and str(dtype) in str(error), str(error)
            continue
        if ptxas_available():
            result = assemble(compiled.asm["ptx"], arch)
            assert result.spill_bytes == 0 and not _ptxas_warnings(result.log), (dtype, op, block, arch)
