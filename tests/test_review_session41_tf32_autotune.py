"""Session-41 review: float32 `dsl.dot(..., input_precision="tf32")` on mma.sync m16n8k8 .tf32 (commit 4a5cb92) and
the autotuner's Triton options (commit 9a9de56). Compiled code runs on the host through session 38's emulation of
mma.sync / cvt.rna.tf32 / cp.async (tests/test_review_session38_dsl_blocks.py); autotuning on the interpreter and on
the mocked driver of tests/mock_gpu.py (test_autotune_hooks.py's `gpu` fixture).

What was tried (peer report -> case), all right:
- triton #1937 (tf32 dot with tl.trans wrong on main), "tutorial-03 in fp32": an autotuned-style matmul with tf32,
  non-square tiles 16x128 / 128x16 / 32x64 / 16x16, BLOCK_K 8 to 64, 2-8 warps, 2-5 stages, B loaded or
  dsl.trans-ed, A column-major through its strides, a bias epilogue, masked ragged tails: emulated compiled and
  interpreted results against the float64 product of the tf32-rounded operands (in the review also 144 configs
  through ptxas for sm_80 and sm_90a: all have the tf32 mma; only 128x128 on 2 warps (256 accumulator registers
  a thread) and 64x64x64 on 2 warps with a transposed B spill, user-chosen oversubscriptions).
- attention-style chains: S = Q K^T (tf32, K loaded transposed or dsl.trans-ed), P = S - rowmax over a masked
  length (a float32 value in the mma accumulator layout), O = P V (tf32).
- a tf32 dot in a while loop carrying its accumulator, which starts as dsl.zeros or as a loaded block.
- tf32, fp16 (m16n8k16), int8 (exact, FMA path) and ieee float32 dots in one kernel.
- (review only) operands that are not plain loads: dsl.trans of a (K, M) load with a broadcast bias accumulator,
  fp16 loads upcast with .to(float32), a dsl.full constant B and a computed A; 16x8x8 on 8 warps.
- PTX ISA cvt.rna.tf32.f32 vs the interpreter's rounding: FLT_MAX and the tie 0x7F7FF000 round to inf (no
  .satfinite), 0x7F7FEFFF to the largest tf32, 3.4e38 stays finite, -FLT_MAX -> -inf, subnormals round in their
  bits (ties away, the largest to the smallest normal), inf kept and inf * 0 = NaN; compiled (mma and the
  small-block FMA path) and interpreted alike. (NaN operands: session 38's tests.)
- autotune: Triton's matmul pruning (early_config_prune dropping BLOCK_K > K, a perf_model, fractional top_k)
  with Config pre_hooks in the interpreter (named_args carry defaults and launch kwargs); the whole config list
  compiled for sm_90a under the mocked driver with a do_bench that never calls the kernel; the tuner used from
  four threads on one new key (one search); key arguments that are None; Config pickled / deep-copied /
  dataclasses.replace-d with list values and pre_hooks; num_ctas / maxnreg errors.

DEFECTS found: none.
"""

from __future__ import annotations

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.target import assemble, ptxas_available
from helpers import poison
from mock_gpu import private_cache
from test_review_session38_dsl_blocks import _run_emulated
from test_autotune_hooks import _launches, gpu  # noqa: F401 (the mocked driver's fixture)
from test_launch_fast_path import _cuda
from test_tf32_dot import _tf32

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
_MMA_TF32 = "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch, tmp_path):
    private_cache(monkeypatch, tmp_path)


# == tf32 dots ===================================================================================================

@dsl.jit
def _mm(c_ptr, a_ptr, b_ptr, bias_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, BM: dsl.constexpr, BN: dsl.constexpr,
        BK: dsl.constexpr, TRANS_B: dsl.constexpr):
    # tutorial 03 in float32 with tf32, B either loaded (BK, BN) by its strides or as its (BN, BK) transpose and
    # dsl.trans-ed, a bias epilogue, masked tails on M, N and K
    rm = dsl.program_id(0) * BM + dsl.arange(0, BM)
    rn = dsl.program_id(1) * BN + dsl.arange(0, BN)
    rk = dsl.arange(0, BK)
    acc = dsl.zeros((BM, BN), dtype=dsl.float32)
    for k0 in range(0, dsl.cdiv(K, BK)):
        kk = k0 * BK + rk
        a = dsl.load(a_ptr + rm[:, None] * s_am + kk[None, :] * s_ak, mask=(rm[:, None] < M) & (kk[None, :] < K),
                     other=0.0)
        if TRANS_B:
            b = dsl.trans(dsl.load(b_ptr + rn[:, None] * s_bn + kk[None, :] * s_bk,
                                   mask=(rn[:, None] < N) & (kk[None, :] < K), other=0.0))
        else:
            b = dsl.load(b_ptr + kk[:, None] * s_bk + rn[None, :] * s_bn, mask=(kk[:, None] < K) & (rn[None, :] < N),
                         other=0.0)
        acc += dsl.dot(a, b, input_precision="tf32")
    acc = acc + dsl.load(bias_ptr + rn, mask=rn < N, other=0.0)[None, :]
    dsl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def _bound(a, b, k):
    return 2.0 * k * 2.0 ** -24 * (_tf32(a).abs() @ _tf32(b).abs()) + 1e-30


_MM_CASES = [  # (BM, BN, BK, warps, stages, trans_b, a column-major, M, N, K)
    (16, 128, 8, 2, 3, False, False, 13, 100, 21),
    (128, 16, 8, 4, 2, True, False, 100, 11, 19),
    (32, 64, 8, 4, 5, False, True, 30, 60, 40),
    (16, 16, 8, 8, 3, False, False, 16, 16, 24),
]


@pytest.mark.parametrize("bm,bn,bk,warps,stages,trans_b,a_col,m,n,k", _MM_CASES, ids=str)
def test_emulated_tf32_matmul_configs_match_the_reference(bm, bn, bk, warps, stages, trans_b, a_col, m, n, k):
    g = torch.Generator().manual_seed(bm * 7 + bn * 3 + bk + warps)
    a = torch.randn(m, k, generator=g)
    if a_col:
        a = a.t().contiguous().t()
    b = torch.randn(k, n, generator=g)
    if trans_b:
        b = b.t().contiguous().t()
    bias = torch.randn(n, generator=g)
    args = (a, b, bias, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1))
    c = poison(torch.empty(m, n))
    compiled = _run_emulated(_mm, (c, *args), num_warps=warps, num_stages=stages, BM=bm, BN=bn, BK=bk,
                             TRANS_B=trans_b)
    assert _MMA_TF32 in compiled.asm["ptx"]
    reference = _tf32(a) @ _tf32(b) + bias.double()
    assert ((c.double() - reference).abs() <= _bound(a, b, k)).all()
    interpreted = poison(torch.empty(m, n))
    _mm[(1, 1)](interpreted, *args, BM=bm, BN=bn, BK=bk, TRANS_B=trans_b, interpret=True)
    assert ((interpreted.double() - reference).abs() <= _bound(a, b, k)).all()



@needs_ptxas
def test_non_square_tf32_tiles_assemble_without_spills():
    t = torch.empty(4)
    for (bm, bn, bk), warps, stages, arch in (((16, 128, 8), 2, 5, "sm_80"), ((128, 16, 64), 4, 3, "sm_90a")):
        ptx = _mm.compile(t, t, t, t, 100, 100, 100, 100, 1, 100, 1, target=arch, num_warps=warps, num_stages=stages,
                          BM=bm, BN=bn, BK=bk, TRANS_B=True).asm["ptx"]
        assert _MMA_TF32 in ptx and "cp.async" in ptx and "wgmma" not in ptx
        assert assemble(ptx, arch).spill_bytes == 0

@dsl.jit
def _attn(o_ptr, q_ptr, k_ptr, v_ptr, L, M: dsl.constexpr, N: dsl.constexpr, D: dsl.constexpr, KT: dsl.constexpr):
    # S = Q K^T (tf32), P = S - rowmax(S) on the L valid keys (a float32 value in the accumulator layout), O = P V (tf32)
    rm, rn, rd = dsl.arange(0, M), dsl.arange(0, N), dsl.arange(0, D)
    q = dsl.load(q_ptr + rm[:, None] * D + rd[None, :])
    if KT:
        k = dsl.trans(dsl.load(k_ptr + rn[:, None] * D + rd[None, :], mask=rn[:, None] < L, other=0.0))
    else:
        k = dsl.load(k_ptr + rd[:, None] + rn[None, :] * D, mask=rn[None, :] < L, other=0.0)
    s = dsl.dot(q, k, input_precision="tf32")
    s = dsl.where(rn[None, :] < L, s, -1e30)
    p = dsl.where(rn[None, :] < L, s - dsl.max(s, axis=1)[:, None], 0.0)
    v = dsl.load(v_ptr + rn[:, None] * D + rd[None, :], mask=rn[:, None] < L, other=0.0)
    dsl.store(o_ptr + rm[:, None] * D + rd[None, :], dsl.dot(p, v, input_precision="tf32"))


@pytest.mark.parametrize("m,n,d,length,warps,kt", [(16, 16, 8, 11, 1, True), (32, 64, 16, 50, 4, False),
                                                    (16, 64, 16, 60, 2, True)], ids=str)
def test_emulated_chained_tf32_dots_p_at_v(m, n, d, length, warps, kt):
    g = torch.Generator().manual_seed(m + n + d)
    q, k, v = (torch.randn(x, d, generator=g) for x in (m, n, n))
    s = (_tf32(q) @ _tf32(k[:length]).t()).float()         # (within float32 accumulation of the products)
    p = s - s.max(1, keepdim=True).values
    reference = _tf32(p) @ _tf32(v[:length])
    bound = 4.0 * n * 2.0 ** -24 * (_tf32(p).abs() @ _tf32(v[:length]).abs()) + 1e-3 * (_tf32(v).abs().sum(0))
    for interpret in (False, True):
        o = poison(torch.empty(m, d))
        if interpret:
            _attn[(1,)](o, q, k, v, length, M=m, N=n, D=d, KT=kt, interpret=True)
        else:
            compiled = _run_emulated(_attn, (o, q, k, v, length), num_warps=warps, M=m, N=n, D=d, KT=kt)
            assert compiled.asm["ptx"].count(_MMA_TF32) >= 2
        assert ((o.double() - reference).abs() <= bound).all(), ((o.double() - reference).abs() - bound).max()


@dsl.jit
def _loop(c_ptr, a_ptr, b_ptr, acc_ptr, K, M: dsl.constexpr, N: dsl.constexpr, BK: dsl.constexpr,
          LOAD_ACC: dsl.constexpr):
    # a while loop carrying a tf32 dot's accumulator that starts as dsl.zeros or as a loaded block
    rm, rn, rk = dsl.arange(0, M), dsl.arange(0, N), dsl.arange(0, BK)
    if LOAD_ACC:
        acc = dsl.load(acc_ptr + rm[:, None] * N + rn[None, :])
    else:
        acc = dsl.zeros((M, N), dsl.float32)
    k0 = 0
    while k0 < K:
        kk = k0 + rk
        a = dsl.load(a_ptr + rm[:, None] * K + kk[None, :], mask=kk[None, :] < K, other=0.0)
        b = dsl.load(b_ptr + kk[:, None] * N + rn[None, :], mask=kk[:, None] < K, other=0.0)
        acc = dsl.dot(a, b, acc, input_precision="tf32")
        k0 += BK
    dsl.store(c_ptr + rm[:, None] * N + rn[None, :], acc)


@pytest.mark.parametrize("m,n,bk,k,warps,load_acc", [(16, 8, 8, 20, 1, True), (64, 16, 8, 17, 2, False)], ids=str)
def test_emulated_tf32_dot_in_a_while_loop(m, n, bk, k, warps, load_acc):
    g = torch.Generator().manual_seed(m + n + k)
    a, b, acc = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g), torch.randn(m, n, generator=g)
    reference = _tf32(a) @ _tf32(b) + (acc.double() if load_acc else 0)
    for interpret in (False, True):
        c = poison(torch.empty(m, n))
        if interpret:
            _loop[(1,)](c, a, b, acc, k, M=m, N=n, BK=bk, LOAD_ACC=load_acc, interpret=True)
        else:
            _run_emulated(_loop, (c, a, b, acc, k), num_warps=warps, M=m, N=n, BK=bk, LOAD_ACC=load_acc)
        assert ((c.double() - reference).abs() <= _bound(a, b, k) + 4e-7 * acc.abs().double()).all()


@dsl.jit
def _mixed(o1, o2, o3, a16, b16, a8, b8, a32, b32, M: dsl.constexpr, N: dsl.constexpr, K: dsl.constexpr):
    # tf32, fp16, int8 and ieee float32 dots in one kernel
    rm, rn, rk = dsl.arange(0, M), dsl.arange(0, N), dsl.arange(0, K)
    ia, ib, io = rm[:, None] * K + rk[None, :], rk[:, None] * N + rn[None, :], rm[:, None] * N + rn[None, :]
    c3 = dsl.dot(dsl.load(a32 + ia), dsl.load(b32 + ib), input_precision="tf32")
    c1 = dsl.dot(dsl.load(a16 + ia), dsl.load(b16 + ib))
    c2 = dsl.dot(dsl.load(a8 + ia), dsl.load(b8 + ib))
    c4 = dsl.dot(dsl.load(a32 + ia), dsl.load(b32 + ib))
    dsl.store(o1 + io, c1 + c3)
    dsl.store(o2 + io, c2)
    dsl.store(o3 + io, c4 - c3)


@pytest.mark.parametrize("m,n,k,warps", [(32, 32, 16, 2)], ids=str)
def test_emulated_tf32_int8_fp16_and_ieee_dots_in_one_kernel(m, n, k, warps):
    g = torch.Generator().manual_seed(m + n + k)
    a16, b16 = torch.randn(m, k, generator=g).half(), torch.randn(k, n, generator=g).half()
    a8 = torch.randint(-128, 128, (m, k), generator=g).to(torch.int8)
    b8 = torch.randint(-128, 128, (k, n), generator=g).to(torch.int8)
    a32, b32 = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    outs = (poison(torch.empty(m, n)), torch.full((m, n), -777, dtype=torch.int32), poison(torch.empty(m, n)))
    compiled = _run_emulated(_mixed, (*outs, a16, b16, a8, b8, a32, b32), num_warps=warps, M=m, N=n, K=k)
    assert _MMA_TF32 in compiled.asm["ptx"] and "m16n8k16" in compiled.asm["ptx"]
    tf32 = _tf32(a32) @ _tf32(b32)
    bound = _bound(a32, b32, k) + 2.0 * k * 2.0 ** -24 * (a16.double().abs() @ b16.double().abs())
    assert ((outs[0].double() - (a16.double() @ b16.double() + tf32)).abs() <= bound).all()
    assert torch.equal(outs[1].long(), a8.long() @ b8.long())
    exact = a32.double() @ b32.double()
    assert ((outs[2].double() - (exact - tf32)).abs() <= 2 * _bound(a32, b32, k)).all()
    assert (outs[2] != 0).any()


@dsl.jit
def _dot1(c_ptr, a_ptr, b_ptr, M: dsl.constexpr, N: dsl.constexpr, K: dsl.constexpr):
    rm, rn, rk = dsl.arange(0, M), dsl.arange(0, N), dsl.arange(0, K)
    a = dsl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = dsl.load(b_ptr + rk[:, None] * N + rn[None, :])
    dsl.store(c_ptr + rm[:, None] * N + rn[None, :], dsl.dot(a, b, input_precision="tf32"))


# float32 bits -> their cvt.rna.tf32.f32 (PTX ISA: to nearest, ties away from zero; past the largest finite tf32,
# 0x7F7FE000, the round-up is infinity, as IEEE rounding to nearest overflows)
_EDGES = [
    (0x7F7FFFFF, 0x7F800000),   # FLT_MAX -> inf
    (0x7F7FF000, 0x7F800000),   # the tie between the largest tf32 and 2**128 -> away: inf
    (0x7F7FEFFF, 0x7F7FE000),   # below it: the largest tf32
    (0x7F7FC99E, 0x7F7FC000),   # 3.4e38
    (0xFF7FFFFF, 0xFF800000),   # -FLT_MAX -> -inf
    (0x00000FFF, 0x00000000),   # subnormals round in their bits as well
    (0x00001000, 0x00002000),   # a subnormal tie -> away
    (0x80001000, 0x80002000),
    (0x007FF000, 0x00800000),   # the largest subnormals round up to the smallest normal
    (0x7F800000, 0x7F800000),   # inf
    (0x3F800FFF, 0x3F800000),
    (0x3F801000, 0x3F802000),
]


def _from_bits(values):
    return torch.tensor([v - (1 << 32) if v >> 31 else v for v in values], dtype=torch.int32).view(torch.float32)


@pytest.mark.parametrize("shape,compiled", [((16, 8, 16), True), ((16, 8, 16), False), ((8, 4, 16), True)], ids=str)
def test_tf32_operand_rounding_edges_huge_subnormal_ties(shape, compiled):
    """Each A row holds one edge value at its k = row; B is the identity on those rows: C[row, 0..] = tf32(a) * 1."""
    m, n, k = shape
    a = torch.zeros(m, k)
    edges = _EDGES[:m]
    for row, (bits, _) in enumerate(edges):
        a[row, row % k] = _from_bits([bits])[0]
    b = torch.zeros(k, n)
    b[:, 0] = 1.0
    c = poison(torch.empty(m, n))
    if compiled:
        ptx = _run_emulated(_dot1, (c, a, b), num_warps=1, M=m, N=n, K=k).asm["ptx"]
        assert (_MMA_TF32 in ptx) == (m >= 16)
    else:
        _dot1[(1,)](c, a, b, M=m, N=n, K=k, interpret=True)
    got = [int(x) & 0xFFFFFFFF for x in c[:len(edges), 0].contiguous().view(torch.int32).tolist()]
    assert got == [expected for _, expected in edges], [hex(x) for x in got]
    infinite = torch.tensor([expected in (0x7F800000, 0xFF800000) for _, expected in edges])
    rest = c[:len(edges), 1:]
    assert rest[infinite].isnan().all() and rest[~infinite].eq(0).all()      # inf * 0 is NaN, as in torch


# == autotune options ============================================================================================

_MM_CONFIGS = [  # tutorial 03's kind of list in float32: 2-8 warps, 2-5 stages, BLOCK_K 8 to 64, non-square tiles
    dsl.Config({"BM": 16, "BN": 128, "BK": 8}, num_warps=2, num_stages=5),
    dsl.Config({"BM": 128, "BN": 16, "BK": 32}, num_warps=4, num_stages=2),      # (the mock: under 48 KB)
    dsl.Config({"BM": 32, "BN": 64, "BK": 32}, num_warps=8, num_stages=3),
    dsl.Config({"BM": 64, "BN": 64, "BK": 16}, num_warps=4, num_stages=4),
]


def _mm_grid(meta):
    return (dsl.cdiv(meta["M"], meta["BM"]), dsl.cdiv(meta["N"], meta["BN"]))


def _mm_tuner(**options):
    return dsl.autotune(_MM_CONFIGS, key=["M", "N", "K"], **options)(_mm)


def test_interpreted_autotuned_tf32_matmul_with_pruning_and_hooks(seed):
    """early_config_prune drops BK > K (Triton's matmul prune), perf_model ranks by tile area, a fractional top_k
    keeps the best half; the interpreter takes the first config left and runs its pre_hook only."""
    m, n, k = 37, 45, 24
    g = torch.Generator().manual_seed(seed)
    a, b, bias = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g), torch.randn(n, generator=g)
    seen, hooked = [], []

    def early_config_prune(configs, named_args, **kwargs):
        seen.append((named_args["K"], named_args["TRANS_B"], kwargs))
        return [config for config in configs if config.constexprs["BK"] <= named_args["K"]]

    def perf_model(BM, BN, num_warps, **args):
        return -BM * BN + num_warps            # larger tiles first

    configs = [dsl.Config(c.constexprs, c.num_warps, c.num_stages, pre_hook=lambda args: hooked.append(args["BM"]))
               for c in _MM_CONFIGS]
    tuner = dsl.autotune(configs, key=["M", "N", "K"], prune_configs_by={
        "early_config_prune": early_config_prune, "perf_model": perf_model, "top_k": 0.5})(_mm)
    c = poison(torch.empty(m, n))
    tuner[_mm_grid](c, a, b, bias, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), TRANS_B=False,
                    interpret=True)
    # left after early pruning: BK 8 and 16 (2 configs); top_k 0.5 -> 1: the larger tile, 64 x 64
    assert tuner.best_config is configs[3] and hooked == [64]
    assert seen == [(24, False, {"TRANS_B": False})]
    assert ((c.double() - (_tf32(a) @ _tf32(b) + bias.double())).abs() <= _bound(a, b, k)).all()


def test_mock_gpu_autotuned_tf32_matmul_compiles_every_config(gpu):
    """Every config of the list compiles to the tf32 mma for sm_90a (none skipped, mocked driver), the fastest by
    do_bench is taken, though that do_bench never calls the kernel (the spill check compiles it)."""
    m = n = k = 33
    t = _cuda(torch.zeros(m, n))
    args = (t, t, t, t, m, n, k, n, 1, n, 1)
    times = [4.0, 1.0, 3.0, 2.0]
    tuner = _mm_tuner(do_bench=lambda call, quantiles: [times.pop(0), 0.0, 9.0])
    tuner[_mm_grid](*args, TRANS_B=True)
    (key,) = tuner.best
    assert [measured.skipped for measured in tuner.measurements[key]] == [None] * 4
    assert tuner.best[key] is _MM_CONFIGS[1] and tuner.best_config is _MM_CONFIGS[1]
    assert _launches(gpu.log) == [1]                 # the real launch only: grid (33 / 128, 33 / 16) -> (1, 3)
    for config in _MM_CONFIGS:
        ptx = _mm.compile(*args, target="sm_90a", num_warps=config.num_warps, num_stages=config.num_stages,
                          TRANS_B=True, **config.constexprs).asm["ptx"]
        assert _MMA_TF32 in ptx and "wgmma" not in ptx


_BLOCK_CONFIGS = [dsl.Config({"BLOCK": block}, num_warps=4) for block in (8, 16, 32, 64)]


def test_mock_gpu_threads_tuning_one_key_search_once_and_keys_with_none(gpu):
    """Four threads launching one new key at once: one search (each config timed TUNING_ROUNDS times), the same
    choice for all; a key argument that is None is a key of its own."""
    import threading

    from fusedops.dsl.runtime import autotune as autotune_module

    @dsl.jit
    def _acc(out_ptr, x_ptr, n, opt, BLOCK: dsl.constexpr):
        offs = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
        dsl.atomic_add(out_ptr + offs, dsl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

    gpu.times.update({2: 1.0})            # BLOCK 32 (grid 2) is the fastest
    tuner = dsl.autotune(_BLOCK_CONFIGS, key=["n", "opt"], reset_to_zero=["out_ptr"])(_acc)
    errors = []

    def launch():
        try:
            tuner[lambda meta: (dsl.cdiv(meta["n"], meta["BLOCK"]),)](_cuda(torch.zeros(64)), _cuda(torch.ones(64)),
                                                                       64, None)
        except Exception as error:        # (reported below)
            errors.append(error)

    threads = [threading.Thread(target=launch) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(gpu.timed) == len(_BLOCK_CONFIGS) * autotune_module.TUNING_ROUNDS
    assert list(tuner.best.values()) == [_BLOCK_CONFIGS[2]] and "opt=None" in next(iter(tuner.best))
    tuner[lambda meta: (dsl.cdiv(meta["n"], meta["BLOCK"]),)](_cuda(torch.zeros(64)), _cuda(torch.ones(64)), 64, 3)
    assert len(tuner.best) == 2


def test_configs_pickle_deepcopy_and_replace_with_hooks_and_list_values():
    import copy
    import dataclasses
    import pickle

    config = dsl.Config({"BLOCK": 64, "SIZES": [1, 2]}, num_warps=8, num_stages=2, num_ctas=1, maxnreg=None)
    for copied in (pickle.loads(pickle.dumps(config)), copy.deepcopy(config)):
        assert copied == config and copied.constexprs == {"BLOCK": 64, "SIZES": [1, 2]}
        assert copied.all_kwargs() == {"BLOCK": 64, "SIZES": [1, 2], "num_warps": 8, "num_ctas": 1, "num_stages": 2}
    changed = dataclasses.replace(config, num_warps=4)
    assert changed.constexprs == config.constexprs and changed.num_warps == 4 and changed != config
    hooked = dsl.Config({"BLOCK": 64}, pre_hook=print)
    assert copy.deepcopy(hooked) == hooked and hooked != dsl.Config({"BLOCK": 64})
    with pytest.raises(ValueError, match="maxnreg=128.*launch_bounds"):
        dsl.Config({"BLOCK": 64}, maxnreg=128)
    with pytest.raises(ValueError, match="num_ctas=2.*cluster_dims"):
        dsl.Config({"BLOCK": 64}, num_ctas=2)
