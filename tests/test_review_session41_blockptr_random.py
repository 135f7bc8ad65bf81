"""Review (session 41) of block pointers (dsl.make_block_ptr / advance / load / store with boundary_check) and random
numbers (dsl.rand / randn / randint / philox / umulhi), added in 9ddc4c4, with Triton users' kernels.

What was tried (peer report or user pattern -> case here), right unless listed under DEFECTS:
- Triton's older flash-attention forward with block pointers (Q / V / O row-major, K as an order=(0, 1) transposed
  view, tl.advance in the KV loop, boundary_check on one dim): float64 softmax(QK^T)V reference; ptxas for sm_80 and
  sm_90a, no spills.
- 3-D block pointers over a permuted (non-contiguous) view, boundary_check on all dims (triton-ascend #599 / #740:
  partial and non-leading boundary_check dims): exact.
- nested loops that rewind with a negative advance, advance under if / elif / else in a loop with a rebinding to
  another block pointer, a helper that loops and returns (pointer, accumulator) with 0..4 trips, a helper returning
  two block pointers (triton #2474: reusing a pointer after a loop), tiles wholly outside the tensor, offsets
  and shapes past int32, a store whose lower bound is checked and a scalar store: exact, NaN-poisoned outputs.
- block pointer vs plain pointer loads in a loop (1-D and 2-D, 16-byte aligned tensors): same vector width on
  sm_90a (ld.global.v4).
- random: an independent Philox4x32-10 / 4x64-10 in Python ints from Salmon et al. (SC 2011), checked on Random123's
  known answers; per-row seeds loaded from int32 / int64 tensors with 2-D offsets; seeded dropout forward and
  backward with int64 offsets and the seed a scalar tensor (the backward regenerates the forward's mask); Gaussian
  noise with randn and a seed > 2**31; randint of uint32 offsets that wrap and a uint32 seed; literal seeds -1,
  0xDEADBEEF, 2**63, 2**64 - 1; triton #10597 (-x - 1 of INT_MIN in uint_to_uniform_float: wraps correctly, no
  nsw in the codegen); triton #601 (rand never 1.0: covered by test_dsl_random); constant-folded randint in the
  PTX equal to the reference; ptxas for sm_80 / sm_90a of those kernels.
- the errors of block pointers misused (ternary arm, `+`, atomics, loop-carried tuple, float offsets, `other=`).

DEFECTS found (fixed):
1. A block pointer whose offset is a same-width unsigned -> signed cast (`r.to(dsl.uint32).to(dsl.int32)`, negative)
   was taken as known non-negative, so `load(..., boundary_check=)` skipped the lower bound and read before the
   tensor (the interpreter's out-of-bounds error; undefined on the GPU). block_pointers._known_nonnegative now takes
   a cast from an unsigned type only when it widens.
2. `p == q` of block pointers was a silent compile-time identity comparison (the module docstring: they cannot be
   compared); now a CompilationError at the user's line (frontend/expressions.py). The ternary-arm error now
   describes the block pointer the way the other errors do.
Documented (README, random bullet): an int literal / constexpr offset in [2**31, 2**32) is int64 here (Triton:
uint32), so it draws Philox4x64's numbers.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl import CompilationError
from fusedops.dsl.target import assemble, ptxas_available
from helpers import assert_close, poison, random_tensor
from kernel_source import jit_from_source

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")

# -- an independent Philox (Python ints) ------------------------------------------------------------------
_M = {32: (0xD2511F53, 0xCD9E8D57), 64: (0xD2E7470EE14C6C93, 0xCA5A826395121157)}
_W = {32: (0x9E3779B9, 0xBB67AE85), 64: (0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B)}


def _philox(counter, key, bits=32, rounds=10):
    mask = (1 << bits) - 1
    x, k = [c & mask for c in counter], [v & mask for v in key]
    for _ in range(rounds):
        p0, p1 = _M[bits][0] * x[0], _M[bits][1] * x[2]
        x = [(p1 >> bits) ^ x[1] ^ k[0], p1 & mask, (p0 >> bits) ^ x[3] ^ k[1], p0 & mask]
        k = [(k[0] + _W[bits][0]) & mask, (k[1] + _W[bits][1]) & mask]
    return x


def _word(seed, offset, bits=32):
    s = seed % (1 << 64)
    key = (s & 0xFFFFFFFF, s >> 32) if bits == 32 else (s, 0)
    return _philox((offset, 0, 0, 0), key, bits)[0]


def _word2(seed, offset, bits=32):
    s = seed % (1 << 64)
    key = (s & 0xFFFFFFFF, s >> 32) if bits == 32 else (s, 0)
    return _philox((offset, 0, 0, 0), key, bits)[:2]


def _uniform(word, bits=32):
    x = word - (1 << bits) if word >> (bits - 1) else word
    x = -x - 1 if x < 0 else x
    scale = np.float32(4.6566127342e-10 if bits == 32 else 1.0842020432385337e-19)
    return np.float32(np.float32(x) * scale)


def _rand(seed, offsets, bits=32):
    return np.array([_uniform(_word(seed, int(o), bits), bits) for o in offsets], dtype=np.float32)


def _randn(seed, offsets, bits=32):
    out = []
    for o in offsets:
        w0, w1 = _word2(seed, int(o), bits)
        u1 = max(float(_uniform(w0, bits)), float(np.float32(1e-7)))
        theta = float(np.float32(6.283185307179586) * _uniform(w1, bits))
        out.append(np.sqrt(-2 * np.log(u1)) * np.cos(theta))
    return np.array(out)


def test_reference_philox_known_answers():
    assert _philox((0, 0, 0, 0), (0, 0)) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert _philox((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0)) == \
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]
    assert _philox((0, 0, 0, 0), (0, 0), 64) == [0x16554D9ECA36314C, 0xDB20FE9D672D0FDC, 0xD7E772CEE186176B,
                                                 0x7E68B68AEC7BA23B]


# -- block pointers: kernels --------------------------------------------------------------------------------
@dsl.jit
def _attn_fwd(Q, K, V, sm_scale, Out, sqz, sqm, sqk, skz, skn, skk, svz, svn, svk, soz, som, sok, N_CTX,
              BLOCK_M: dsl.constexpr, BLOCK_DMODEL: dsl.constexpr, BLOCK_N: dsl.constexpr):
    # Triton's flash-attention tutorial (2.1 era), block-pointer form
    start_m = dsl.program_id(0)
    off_hz = dsl.program_id(1)
    q_ptr = dsl.make_block_ptr(base=Q + off_hz * sqz, shape=(N_CTX, BLOCK_DMODEL), strides=(sqm, sqk),
                               offsets=(start_m * BLOCK_M, 0), block_shape=(BLOCK_M, BLOCK_DMODEL), order=(1, 0))
    k_ptr = dsl.make_block_ptr(base=K + off_hz * skz, shape=(BLOCK_DMODEL, N_CTX), strides=(skk, skn),
                               offsets=(0, 0), block_shape=(BLOCK_DMODEL, BLOCK_N), order=(0, 1))
    v_ptr = dsl.make_block_ptr(base=V + off_hz * svz, shape=(N_CTX, BLOCK_DMODEL), strides=(svn, svk),
                               offsets=(0, 0), block_shape=(BLOCK_N, BLOCK_DMODEL), order=(1, 0))
    offs_n = dsl.arange(0, BLOCK_N)
    m_i = dsl.zeros([BLOCK_M], dtype=dsl.float32) - float("inf")
    l_i = dsl.zeros([BLOCK_M], dtype=dsl.float32)
    acc = dsl.zeros([BLOCK_M, BLOCK_DMODEL], dtype=dsl.float32)
    q = dsl.load(q_ptr, boundary_check=(0,))
    q = (q * (sm_scale * 1.44269504)).to(dsl.float16)
    for start_n in range(0, N_CTX, BLOCK_N):
        k = dsl.load(k_ptr, boundary_check=(1,))
        v = dsl.load(v_ptr, boundary_check=(0,))
        qk = dsl.dot(q, k)
        qk = dsl.where((start_n + offs_n[None, :]) < N_CTX, qk, float("-inf"))
        m_new = dsl.maximum(m_i, dsl.max(qk, 1))
        alpha = dsl.exp2(m_i - m_new)
        p = dsl.exp2(qk - m_new[:, None])
        acc = acc * alpha[:, None] + dsl.dot(p.to(dsl.float16), v)
        l_i = l_i * alpha + dsl.sum(p, 1)
        m_i = m_new
        k_ptr = dsl.advance(k_ptr, (0, BLOCK_N))
        v_ptr = dsl.advance(v_ptr, (BLOCK_N, 0))
    o_ptr = dsl.make_block_ptr(base=Out + off_hz * soz, shape=(N_CTX, BLOCK_DMODEL), strides=(som, sok),
                               offsets=(start_m * BLOCK_M, 0), block_shape=(BLOCK_M, BLOCK_DMODEL), order=(1, 0))
    dsl.store(o_ptr, (acc / l_i[:, None]).to(dsl.float16), boundary_check=(0,))


def _attn_args(q, k, v, o, scale, n):
    return (q, k, v, scale, o, *q.stride(), *k.stride(), *v.stride(), *o.stride(), n)


def test_flash_attention_forward_with_block_pointers(seed):
    zh, n, d = 2, 37, 16
    q, k, v = (random_tensor((zh, n, d), torch.float16, "cpu", seed + i) for i in range(3))
    o = poison(torch.empty_like(q))
    _attn_fwd[(dsl.cdiv(n, 16), zh)](*_attn_args(q, k, v, o, 0.3, n), BLOCK_M=16, BLOCK_DMODEL=d, BLOCK_N=16,
                                     interpret=True)
    want = torch.softmax(q.double() @ k.double().transpose(-1, -2) * 0.3, -1) @ v.double()
    assert_close(o, want, torch.float16)


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_flash_attention_block_pointers_assemble(arch):
    q = torch.zeros(2, 256, 64, dtype=torch.float16)
    ptx = _attn_fwd.compile(*_attn_args(q, q, q, q, 0.1, 256), BLOCK_M=64, BLOCK_DMODEL=64, BLOCK_N=64,
                            target=arch, num_warps=4, num_stages=2).asm["ptx"]
    assert "cp.async" in ptx
    assert assemble(ptx, arch).spill_bytes == 0


@dsl.jit
def _scale_3d(y_ptr, x_ptr, B, M, N, sxb, sxm, sxn, syb, sym, syn, BB: dsl.constexpr, BM: dsl.constexpr,
              BN: dsl.constexpr):
    pb, pm, pn = dsl.program_id(0), dsl.program_id(1), dsl.program_id(2)
    x = dsl.make_block_ptr(x_ptr, (B, M, N), (sxb, sxm, sxn), (pb * BB, pm * BM, pn * BN), (BB, BM, BN), (1, 0, 2))
    y = dsl.make_block_ptr(y_ptr, (B, M, N), (syb, sym, syn), (pb * BB, pm * BM, pn * BN), (BB, BM, BN), (2, 1, 0))
    dsl.store(y, dsl.load(x, boundary_check=(0, 1, 2), padding_option="zero") * 2 + 1, boundary_check=(2, 0, 1))


def test_3d_block_pointer_over_a_permuted_view(seed):
    x = random_tensor((7, 3, 5), torch.float32, "cpu", seed).permute(1, 2, 0)      # (3, 5, 7), strides (5, 1, 15)
    y = poison(torch.empty(3, 5, 7))
    _scale_3d[(2, 2, 2)](y, x, 3, 5, 7, *x.stride(), *y.stride(), BB=2, BM=4, BN=4, interpret=True)
    assert torch.equal(y, x * 2 + 1)


@dsl.jit
def _nested(y_ptr, x_ptr, M, N, sm, BM: dsl.constexpr, BN: dsl.constexpr, TM: dsl.constexpr, TN: dsl.constexpr):
    # tiles walked row by row: each row of tiles rewinds the columns with a negative advance
    p = dsl.make_block_ptr(x_ptr, (M, N), (sm, 1), (0, 0), (BM, BN), (1, 0))
    acc = dsl.zeros((BM, BN), dsl.float32)
    for i in range(TM):
        for j in range(TN):
            acc += dsl.load(p, boundary_check=(0, 1)) * (i * TN + j + 1)
            p = p.advance((0, BN))
        p = p.advance((BM, -TN * BN))
    dsl.store(dsl.make_block_ptr(y_ptr, (BM, BN), (BN, 1), (0, 0), (BM, BN), (1, 0)), acc)


def test_nested_loops_rewinding_with_negative_advance(seed):
    m, n, bm, bn, tm, tn = 13, 21, 8, 8, 2, 3
    x = random_tensor((m, n), torch.float32, "cpu", seed)
    y = poison(torch.empty(bm, bn))
    _nested[(1,)](y, x, m, n, x.stride(0), BM=bm, BN=bn, TM=tm, TN=tn, interpret=True)
    padded = torch.zeros(tm * bm, tn * bn, dtype=torch.float64)
    padded[:m, :n] = x.double()
    want = sum(padded[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn] * (i * tn + j + 1) for i in range(tm) for j in range(tn))
    assert_close(y, want, torch.float32)


@dsl.jit
def _branchy(y_ptr, x_ptr, N, step, BN: dsl.constexpr, T: dsl.constexpr):
    # the pointer advanced by a runtime step, rebound to another block pointer, or moved back, by trip
    p = dsl.make_block_ptr(x_ptr, (N,), (1,), (0,), (BN,), (0,))
    home = dsl.make_block_ptr(x_ptr, (N,), (1,), (N - BN // 2,), (BN,), (0,))
    acc = dsl.zeros((BN,), dsl.float32)
    for t in range(T):
        acc = acc * 2 + dsl.load(p, boundary_check=(0,))
        if t % 3 == 0:
            p = p.advance((step,))
        elif t % 3 == 1:
            p = home
        else:
            p = dsl.advance(p, (-BN,))
    dsl.store(y_ptr + dsl.arange(0, BN), acc)


def test_advance_and_rebinding_under_if_elif_else_in_a_loop(seed):
    n, bn, trips, step = 29, 8, 7, 5
    x = random_tensor((n,), torch.float32, "cpu", seed)
    y = poison(torch.empty(bn))
    _branchy[(1,)](y, x, n, step, BN=bn, T=trips, interpret=True)
    offset, want = 0, torch.zeros(bn, dtype=torch.float64)
    for t in range(trips):
        index = torch.arange(bn) + offset
        inside = (index >= 0) & (index < n)
        want = want * 2 + torch.where(inside, x.double()[index.clamp(0, n - 1)], torch.zeros((), dtype=torch.float64))
        offset = offset + step if t % 3 == 0 else (n - bn // 2 if t % 3 == 1 else offset - bn)
    assert_close(y, want, torch.float32)


@dsl.jit
def _walk(p, n, BN: dsl.constexpr):
    acc = dsl.zeros((BN,), dsl.float32)
    for t in range(n):
        acc += dsl.load(p, boundary_check=(0,))
        p = p.advance((BN,))
    return p, acc


@dsl.jit
def _two_pointers(a_ptr, b_ptr, N, BN: dsl.constexpr):
    return (dsl.make_block_ptr(a_ptr, (N,), (1,), (0,), (BN,), (0,)),
            dsl.make_block_ptr(b_ptr, (N,), (1,), (0,), (BN,), (0,)))


@dsl.jit
def _helpers(y_ptr, x_ptr, c_ptr, N, trips, BN: dsl.constexpr):
    p = dsl.make_block_ptr(x_ptr, (N,), (1,), (3,), (BN,), (0,))
    p, acc = _walk(p, trips, BN)
    dsl.store(y_ptr + dsl.arange(0, BN), acc + dsl.load(p, boundary_check=(0,), padding_option="nan"))
    src, dst = _two_pointers(x_ptr, c_ptr, N, BN)
    for t in range(dsl.cdiv(N, BN)):
        dsl.store(dst, dsl.load(src, boundary_check=(0,)) + 1, boundary_check=(0,))
        src = src.advance((BN,))
        dst = dsl.advance(dst, (BN,))


@pytest.mark.parametrize("trips", [0, 2, 4])
def test_helpers_loop_and_return_block_pointers(trips, seed):
    n, bn = 30, 8
    x = random_tensor((n,), torch.float32, "cpu", seed)
    y, c = poison(torch.empty(bn)), poison(torch.empty(n))
    _helpers[(1,)](y, x, c, n, trips, BN=bn, interpret=True)
    padded = torch.cat([x.double(), torch.full((64,), float("nan"), dtype=torch.float64)])
    acc = sum((padded[3 + t * bn:3 + (t + 1) * bn] for t in range(trips)), torch.zeros(bn, dtype=torch.float64))
    start = 3 + trips * bn
    want = acc + padded[start:start + bn]
    assert torch.equal(y.double().isnan(), want.isnan())
    assert_close(y.double().nan_to_num(0.0), want.nan_to_num(0.0), torch.float32)
    assert torch.equal(c, x + 1)


@dsl.jit
def _tile(y_ptr, x_ptr, M, N, sm, r0, c0, BM: dsl.constexpr, BN: dsl.constexpr):
    x = dsl.make_block_ptr(x_ptr, (M, N), (sm, 1), (r0, c0), (BM, BN), (1, 0))
    y = dsl.make_block_ptr(y_ptr, (BM, BN), (BN, 1), (0, 0), (BM, BN), (1, 0))
    dsl.store(y, dsl.load(x, boundary_check=(0, 1), padding_option="nan"))


def _tile_reference(x, r0, c0, bm, bn):
    m, n = x.shape
    out = torch.full((bm, bn), float("nan"), dtype=torch.float64)
    rows = [i for i in range(bm) if 0 <= r0 + i < m]
    cols = [j for j in range(bn) if 0 <= c0 + j < n]
    for i in rows:
        for j in cols:
            out[i, j] = float(x[r0 + i, c0 + j])
    return out


@pytest.mark.parametrize("r0, c0, m_arg", [(-20, 0, 9), (2, 40, 9), (-3, -5, 9), (8, 10, 9), (2**31 + 5, 0, 9),
                                           (-(2**31) - 5, 3, 9), (0, -(2**40), 9), (0, 4, 2**33)])
def test_tiles_partly_or_wholly_outside_the_tensor(r0, c0, m_arg, seed):
    x = random_tensor((9, 11), torch.float32, "cpu", seed)
    y = torch.full((8, 8), 3.0)
    _tile[(1,)](y, x, m_arg, 11, x.stride(0), r0, c0, BM=8, BN=8, interpret=True)
    want = _tile_reference(x, r0, c0, 8, 8)
    assert torch.equal(y.double().isnan(), want.isnan()) and torch.equal(y.double().nan_to_num(), want.nan_to_num())


@dsl.jit
def _store_corner(y_ptr, M, N, sm, r0, c0, BM: dsl.constexpr, BN: dsl.constexpr):
    y = dsl.make_block_ptr(y_ptr, (M, N), (sm, 1), (r0, c0), (BM, BN), (1, 0))
    dsl.store(y, (dsl.arange(0, BM)[:, None] * 100 + dsl.arange(0, BN)[None, :]).to(dsl.float32), boundary_check=(0, 1))
    z = dsl.make_block_ptr(y_ptr, (M, N), (sm, 1), (M - 1, N - 1), (BM, BN), (1, 0))
    dsl.store(z, -1.0, boundary_check=(0, 1))


def test_store_checks_the_lower_bound_and_stores_scalars():
    big = torch.full((8, 12), 7.0)
    m, n = 5, 9
    view = big[1:1 + m, 2:2 + n]
    _store_corner[(1,)](view, m, n, view.stride(0), -2, -3, BM=4, BN=8, interpret=True)
    want = torch.full((8, 12), 7.0)
    for i in range(4):
        for j in range(8):
            if 0 <= i - 2 < m and 0 <= j - 3 < n:
                want[1 + i - 2, 2 + j - 3] = i * 100 + j
    want[m, 1 + n] = -1.0
    assert torch.equal(big, want)


@dsl.jit
def _cast_offset(y_ptr, x_ptr, N, r, BN: dsl.constexpr, HOW: dsl.constexpr):
    if HOW == 0:
        offset = r.to(dsl.uint32).to(dsl.int32)             # value casts: -3 -> 2**32 - 3 -> -3
    elif HOW == 1:
        offset = r.to(dsl.uint32, bitcast=True).to(dsl.int32, bitcast=True)
    else:
        offset = r.to(dsl.uint32).to(dsl.int64)              # a widening cast of an unsigned value: >= 0
    p = dsl.make_block_ptr(x_ptr, (N,), (1,), (offset,), (BN,), (0,))
    dsl.store(y_ptr + dsl.arange(0, BN), dsl.load(p, boundary_check=(0,)))


@pytest.mark.parametrize("how", [0, 1])
def test_defect_unsigned_to_signed_cast_offset_checks_the_lower_bound(how, seed):
    """DEFECT 1: uint32 -> int32 was taken as non-negative; the lower bound went unchecked."""
    x = random_tensor((45,), torch.float32, "cpu", seed)
    y = poison(torch.empty(16))
    _cast_offset[(1,)](y, x, 45, -3, BN=16, HOW=how, interpret=True)
    assert torch.equal(y, torch.cat([torch.zeros(3), x[:13]]))


def test_widening_unsigned_cast_offset_reads_far_but_inside(seed):
    x = random_tensor((45,), torch.float32, "cpu", seed)
    y = poison(torch.empty(16))
    _cast_offset[(1,)](y, x, 45, 40, BN=16, HOW=2, interpret=True)
    assert torch.equal(y, torch.cat([x[40:], torch.zeros(11)]))


def test_defect_comparing_block_pointers_is_an_error():
    """DEFECT 2: `p == q` was Python's identity comparison at compile time."""
    source = ("def k(x_ptr, n, B: dsl.constexpr):\n"
              "    p = dsl.make_block_ptr(x_ptr, (n,), (1,), (0,), (B,), (0,))\n"
              "    q = p.advance((0,))\n"
              "    if p != q:\n"
              "        dsl.store(x_ptr, 1.0)\n")
    kernel = jit_from_source(source, "<session41 compare>")
    with pytest.raises(CompilationError, match=r"<session41 compare>:4:.*a block pointer to \(16,\) blocks of "
                                               r"float32 \(order \(0,\)\) cannot be compared \(`!=`\)"):
        kernel[(1,)](torch.zeros(16), 16, B=16, interpret=True)


def test_block_pointer_as_a_ternary_arm_is_named():
    source = ("def k(x_ptr, n, B: dsl.constexpr):\n"
              "    p = dsl.make_block_ptr(x_ptr, (n,), (1,), (0,), (B,), (0,))\n"
              "    q = p if n > 3 else p.advance((1,))\n"
              "    dsl.store(q, 1.0)\n")
    kernel = jit_from_source(source, "<session41 ternary>")
    with pytest.raises(CompilationError, match=r"<session41 ternary>:3:.*a block pointer to \(16,\) blocks of "
                                               r"float32 \(order \(0,\)\) cannot be combined with a kernel value"):
        kernel[(1,)](torch.zeros(16), 16, B=16, interpret=True)


@dsl.jit
def _bp_row_sum(y_ptr, x_ptr, M, N, sm, BM: dsl.constexpr, BN: dsl.constexpr):
    x = dsl.make_block_ptr(x_ptr, (M, N), (sm, 1), (dsl.program_id(0) * BM, 0), (BM, BN), (1, 0))
    acc = dsl.zeros((BM, BN), dsl.float32)
    for s in range(0, N, BN):
        acc += dsl.load(x, boundary_check=(0, 1))
        x = x.advance((0, BN))
    dsl.store(y_ptr + dsl.program_id(0) * BM + dsl.arange(0, BM), dsl.sum(acc, axis=1))


@dsl.jit
def _plain_row_sum(y_ptr, x_ptr, M, N, sm, BM: dsl.constexpr, BN: dsl.constexpr):
    rm = dsl.program_id(0) * BM + dsl.arange(0, BM)
    acc = dsl.zeros((BM, BN), dsl.float32)
    for s in range(0, N, BN):
        rn = s + dsl.arange(0, BN)
        acc += dsl.load(x_ptr + rm[:, None] * sm + rn[None, :], mask=(rm[:, None] < M) & (rn[None, :] < N), other=0.0)
    dsl.store(y_ptr + rm, dsl.sum(acc, axis=1))


def test_row_sums_with_block_pointers(seed):
    x = random_tensor((19, 45), torch.float32, "cpu", seed)
    y = poison(torch.empty(32))
    _bp_row_sum[(2,)](y, x, 19, 45, x.stride(0), BM=16, BN=16, interpret=True)
    assert_close(y[:19], x.double().sum(1), torch.float32)


@needs_ptxas
def test_block_pointer_loop_loads_are_as_wide_as_plain_ones():
    x = torch.zeros(512 * 512)
    widths = []
    for kernel in (_bp_row_sum, _plain_row_sum):
        ptx = kernel.compile(x, x, 512, 512, 512, BM=16, BN=128, target="sm_90a").asm["ptx"]
        widths.append(sorted(set(re.findall(r"ld\.global[\.\w]*", ptx))))
    assert widths[0] == widths[1] and any(".v4" in w for w in widths[0]), widths


# -- random numbers -------------------------------------------------------------------------------------------
@dsl.jit
def _row_seeds(o_ptr, seeds_ptr, M, N, BM: dsl.constexpr, BN: dsl.constexpr):
    r = dsl.program_id(0) * BM + dsl.arange(0, BM)
    c = dsl.arange(0, BN)
    s = dsl.load(seeds_ptr + r, mask=r < M, other=0)
    offsets = r[:, None] * N + c[None, :]
    dsl.store(o_ptr + offsets, dsl.rand(s[:, None], offsets), mask=(r[:, None] < M) & (c[None, :] < N))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_per_row_seeds_loaded_from_a_tensor(dtype):
    m, n = 5, 7
    values = [3, -7, 2**31 - 1, -2**31, 99] if dtype == torch.int32 else [3, -7, 2**40 + 5, -2**62, 2**63 - 1]
    seeds = torch.tensor(values, dtype=dtype)
    out = poison(torch.empty(m, n))
    _row_seeds[(2,)](out, seeds, m, n, BM=4, BN=8, interpret=True)
    want = np.stack([_rand(values[i], range(i * n, (i + 1) * n)) for i in range(m)])
    np.testing.assert_array_equal(out.numpy(), want)


@dsl.jit
def _dropout(x_ptr, o_ptr, seed_ptr, n, p, BLOCK: dsl.constexpr):
    # the forward and the backward alike: the mask is regenerated from the seed (a scalar tensor) and the
    # int64 offsets (Philox4x64)
    seed = dsl.load(seed_ptr)
    offsets = dsl.program_id(0).to(dsl.int64) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    x = dsl.load(x_ptr + offsets, mask=mask)
    keep = dsl.rand(seed, offsets) > p
    dsl.store(o_ptr + offsets, dsl.where(keep, x / (1 - p), 0.0), mask=mask)


def test_seeded_dropout_forward_and_backward_with_int64_offsets(seed):
    n, p = 300, 0.4
    seed_tensor = torch.tensor([2**45 + 17], dtype=torch.int64)
    x, g = random_tensor((n,), torch.float32, "cpu", seed), random_tensor((n,), torch.float32, "cpu", seed + 1)
    out, dx = poison(torch.empty(n)), poison(torch.empty(n))
    _dropout[(dsl.cdiv(n, 128),)](x, out, seed_tensor, n, p, BLOCK=128, interpret=True)
    _dropout[(dsl.cdiv(n, 64),)](g, dx, seed_tensor, n, p, BLOCK=64, interpret=True)
    keep = _rand(2**45 + 17, range(n), bits=64) > np.float32(p)
    assert 0.45 < keep.mean() < 0.75
    want = np.where(keep, x.numpy() / (np.float32(1) - np.float32(p)), np.float32(0)).astype(np.float32)
    np.testing.assert_allclose(out.numpy(), want, rtol=2e-7, atol=0)
    np.testing.assert_array_equal(dx.numpy() != 0, keep & (g.numpy() != 0))


@dsl.jit
def _noise(x_ptr, o_ptr, n, sigma, seed, BLOCK: dsl.constexpr):
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    dsl.store(o_ptr + offsets, dsl.load(x_ptr + offsets, mask=mask) + sigma * dsl.randn(seed, offsets), mask=mask)


def test_gaussian_noise_with_a_seed_past_int32(seed):
    n, s = 70, 3_000_000_000
    x = random_tensor((n,), torch.float32, "cpu", seed)
    out = poison(torch.empty(n))
    _noise[(3,)](x, out, n, 0.5, s, BLOCK=32, interpret=True)
    np.testing.assert_allclose(out.numpy(), x.double().numpy() + 0.5 * _randn(s, range(n)), rtol=1e-5, atol=2e-6)


@dsl.jit
def _uint_words(o_ptr, seed, BLOCK: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK)
    words = dsl.randint(seed.to(dsl.uint32), offsets.to(dsl.uint32) + 0xFFFFFFF0)    # wraps past 2**32
    dsl.store(o_ptr + offsets, words.to(dsl.int32, bitcast=True))


def test_randint_of_uint32_offsets_and_seed():
    out = poison(torch.empty(32, dtype=torch.int32))
    _uint_words[(1,)](out, -2, BLOCK=32, interpret=True)
    want = [_word(0xFFFFFFFE, (0xFFFFFFF0 + i) % 2**32) for i in range(32)]
    assert out.numpy().view(np.uint32).tolist() == want


@dsl.jit
def _literal_seed(o_ptr, BLOCK: dsl.constexpr, SEED: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK)
    dsl.store(o_ptr + offsets, dsl.rand(SEED, offsets))


@pytest.mark.parametrize("literal", [0xDEADBEEF, -1, 2**63, 2**64 - 1])
def test_literal_seeds(literal):
    out = poison(torch.empty(16))
    _literal_seed[(1,)](out, BLOCK=16, SEED=literal, interpret=True)
    np.testing.assert_array_equal(out.numpy(), _rand(literal, range(16)))


@dsl.jit
def _literal_offset(o_ptr, seed, OFF: dsl.constexpr):
    dsl.store(o_ptr, dsl.randint(seed, OFF).to(dsl.int64, bitcast=True))
    dsl.store(o_ptr + 1, dsl.randint(seed, dsl.full((), OFF, dsl.uint32)).to(dsl.int64))


def test_literal_offset_past_int32_is_int64_as_documented():
    """README: an int literal offset in [2**31, 2**32) is int64 (Philox4x64); uint32 gives Triton's 32-bit draw."""
    out = poison(torch.empty(2, dtype=torch.int64))
    _literal_offset[(1,)](out, 7, OFF=3_000_000_000, interpret=True)
    assert out.tolist() == [_word(7, 3_000_000_000, 64) - 2**64 * (_word(7, 3_000_000_000, 64) >= 2**63),
                            _word(7, 3_000_000_000, 32)]


@dsl.jit
def _constant_word(o_ptr, SEED: dsl.constexpr, OFF: dsl.constexpr):
    dsl.store(o_ptr, dsl.randint(SEED, OFF).to(dsl.int32, bitcast=True))


@pytest.mark.parametrize("literal_seed, offset", [(12345, 5), (-1, 2**31 - 1), (2**63 + 3, 77)])
def test_constant_folded_randint_in_the_ptx(literal_seed, offset):
    ptx = _constant_word.compile(dsl.pointer_type(dsl.int32), SEED=literal_seed, OFF=offset,
                                 target="sm_90a").asm["ptx"]
    word = _word(literal_seed, offset)
    assert re.search(rf"st\.global\.b32\s+\[%rd\d+\], {word - 2**32 if word >= 2**31 else word};", ptx), ptx


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_random_kernels_assemble(arch):
    f32, i64 = dsl.pointer_type(dsl.float32), dsl.pointer_type(dsl.int64)
    for compiled in (_row_seeds.compile(f32, i64, 100, 100, BM=16, BN=128, target=arch),
                     _dropout.compile(f32, f32, i64, 10**6, 0.3, BLOCK=1024, target=arch),
                     _noise.compile(f32, f32, 10**6, 0.5, 3_000_000_000, BLOCK=1024, target=arch)):
        ptx = compiled.asm["ptx"]
        assert "mul.hi" in ptx
        assert assemble(ptx, arch).spill_bytes == 0
