"""Block pointers (language/block_pointers.py): dsl.make_block_ptr / dsl.advance / p.advance, dsl.load with
boundary_check and padding_option, dsl.store with boundary_check, block pointers carried through loops, merged
after a runtime `if`, and passed to and returned from helpers.

CPU tier: interpreter values against float64 / exact references (fresh random inputs, NaN-poisoned outputs,
odd sizes and size 1), the errors, and the PTX of a block-pointer matmul (ptxas accepts it for sm_90a and
sm_80; on sm_90a it is pipelined with cp.async into wgmma as the same kernel written with plain pointers is,
and is no longer). GPU tier (cuda-marked): the same kernels compiled, against the same references.
"""

from __future__ import annotations

import re

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.target import assemble, ptxas_available
from helpers import assert_close, poison, random_tensor
from kernel_source import jit_from_source


# ------------------------------------------------------------------------------------------------
# kernels
# ------------------------------------------------------------------------------------------------
@dsl.jit
def _matmul(c_ptr, a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
            BM: dsl.constexpr, BN: dsl.constexpr, BK: dsl.constexpr):
    # the older Triton matmul tutorial's form: both operands advanced along K every trip
    pid_m = dsl.program_id(0)
    pid_n = dsl.program_id(1)
    a = dsl.make_block_ptr(base=a_ptr, shape=(M, K), strides=(stride_am, stride_ak), offsets=(pid_m * BM, 0),
                           block_shape=(BM, BK), order=(1, 0))
    b = dsl.make_block_ptr(b_ptr, (K, N), (stride_bk, stride_bn), (0, pid_n * BN), (BK, BN), (1, 0))
    acc = dsl.zeros((BM, BN), dsl.float32)
    for k in range(0, dsl.cdiv(K, BK)):
        x = dsl.load(a, boundary_check=(0, 1), padding_option="zero")
        y = dsl.load(b, boundary_check=(1, 0))
        acc += dsl.dot(x, y, input_precision="ieee")
        a = dsl.advance(a, (0, BK))
        b = b.advance((BK, 0))
    c = dsl.make_block_ptr(c_ptr, (M, N), (stride_cm, stride_cn), (pid_m * BM, pid_n * BN), (BM, BN), (1, 0))
    dsl.store(c, acc.to(c_ptr.dtype.element_ty), boundary_check=(0, 1))


@dsl.jit
def _matmul_plain(c_ptr, a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BM: dsl.constexpr, BN: dsl.constexpr, BK: dsl.constexpr):
    # the same kernel with pointer blocks (Triton's current tutorial), for the PTX comparison
    pid_m = dsl.program_id(0)
    pid_n = dsl.program_id(1)
    rm = pid_m * BM + dsl.arange(0, BM)
    rn = pid_n * BN + dsl.arange(0, BN)
    rk = dsl.arange(0, BK)
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = dsl.zeros((BM, BN), dsl.float32)
    for k in range(0, dsl.cdiv(K, BK)):
        x = dsl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < K - k * BK), other=0.0)
        y = dsl.load(b_ptrs, mask=(rk[:, None] < K - k * BK) & (rn[None, :] < N), other=0.0)
        acc += dsl.dot(x, y, input_precision="ieee")
        a_ptrs += BK * stride_ak
        b_ptrs += BK * stride_bk
    dsl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
              mask=(rm[:, None] < M) & (rn[None, :] < N))


@dsl.jit
def _copy_tile(y_ptr, x_ptr, M, N, stride_xm, stride_xn, r0, c0, BM: dsl.constexpr, BN: dsl.constexpr,
               CHECK: dsl.constexpr, PAD: dsl.constexpr):
    # the (BM, BN) tile of x at runtime offsets (r0, c0), which may be negative or past the end, into y
    x = dsl.make_block_ptr(x_ptr, (M, N), (stride_xm, stride_xn), (r0, c0), (BM, BN), (1, 0))
    y = dsl.make_block_ptr(y_ptr, (BM, BN), (BN, 1), (0, 0), (BM, BN), (1, 0))
    dsl.store(y, dsl.load(x, boundary_check=CHECK, padding_option=PAD))


@dsl.jit
def _transpose(y_ptr, x_ptr, M, N, stride_xm, stride_xn, stride_ym, stride_yn, BM: dsl.constexpr,
               BN: dsl.constexpr):
    # x is an (M, N) view whose first dim is the contiguous one (order (0, 1)); y = x, row-major
    pid_m = dsl.program_id(0)
    pid_n = dsl.program_id(1)
    x = dsl.make_block_ptr(x_ptr, (M, N), (stride_xm, stride_xn), (pid_m * BM, pid_n * BN), (BM, BN), (0, 1))
    y = dsl.make_block_ptr(y_ptr, (M, N), (stride_ym, stride_yn), (pid_m * BM, pid_n * BN), (BM, BN), (1, 0))
    dsl.store(y, dsl.load(x, boundary_check=(0, 1)), boundary_check=(0, 1))


@dsl.jit
def _tile_load(p):
    return dsl.load(p, boundary_check=(0, 1))


@dsl.jit
def _moved(p, rows, cols):
    if rows > 0:                          # a runtime `if` that returns: the two block pointers are merged
        return dsl.advance(p, (rows, cols))
    return p.advance((0, cols))


@dsl.jit
def _row_sums(y_ptr, x_ptr, M, N, stride_m, step, BM: dsl.constexpr, BN: dsl.constexpr, MODE: dsl.constexpr):
    # sums over column tiles of rows [pid * BM, pid * BM + BM) of x, the block pointer carried by the loop:
    # MODE 0: forward by BN (a helper loads); 1: backward by a constexpr -BN // 2 from (row, BN // 2), into
    # negative columns (the lower bound is checked); 2: a `while` loop stepping by the runtime `step`;
    # 3: a helper that returns the pointer moved one way or another (merged in the helper)
    pid = dsl.program_id(0)
    p = dsl.make_block_ptr(x_ptr, (M, N), (stride_m, 1), (pid * BM, 0 if MODE != 1 else BN // 2), (BM, BN), (1, 0))
    acc = dsl.zeros((BM, BN), dsl.float32)
    if MODE == 0:
        for t in range(dsl.cdiv(N, BN)):
            acc += _tile_load(p)
            p = p.advance((0, BN))
    elif MODE == 1:
        for t in range(3):
            acc += dsl.load(p, boundary_check=(0, 1))
            p = dsl.advance(p, (0, -(BN // 2)))
    elif MODE == 2:
        col = 0
        while col < N:
            acc += dsl.load(p, boundary_check=(0, 1))
            p = dsl.advance(p, (0, step))
            col += step
    else:
        for t in range(dsl.cdiv(N, BN)):
            acc += _tile_load(p)
            p = _moved(p, t - t, BN)       # rows == 0 at run time: the `else` path
    out = dsl.make_block_ptr(y_ptr, (M,), (1,), (pid * BM,), (BM,), (0,))
    dsl.store(out, dsl.sum(acc, axis=1), boundary_check=(0,))


@dsl.jit
def _far_offsets(y_ptr, x_ptr, n, big, BLOCK: dsl.constexpr):
    # x viewed from 2**32 elements before it: offsets and shape past int32, exact in int64
    p = dsl.make_block_ptr(x_ptr - big, (big + n,), (1,), (big + dsl.program_id(0) * BLOCK,), (BLOCK,), (0,))
    q = dsl.make_block_ptr(y_ptr, (n,), (1,), (dsl.program_id(0) * BLOCK,), (BLOCK,), (0,))
    dsl.store(q, dsl.load(p, boundary_check=(0,), padding_option="nan") * 2, boundary_check=(0,))


def _launch_matmul(kernel, a, b, c, blocks, **options):
    (m, k), n = a.shape, b.shape[1]
    bm, bn, bk = blocks
    kernel[(dsl.cdiv(m, bm), dsl.cdiv(n, bn))](c, a, b, m, n, k, *a.stride(), *b.stride(), *c.stride(),
                                               BM=bm, BN=bn, BK=bk, **options)


def _padded_output(m, n, dtype, device):
    """A NaN-poisoned (m + 3, n + 5) buffer and its (m, n) corner: a store that leaves the range shows."""
    big = poison(torch.empty(m + 3, n + 5, dtype=dtype, device=device))
    return big, big[:m, :n]


def _tile_reference(x, r0, c0, bm, bn, pad):
    """The (bm, bn) tile of x at (r0, c0) in float64, the elements outside x the padding's fill."""
    m, n = x.shape
    out = torch.full((bm, bn), float("nan") if pad == "nan" else 0.0, dtype=torch.float64)
    rows, cols = slice(max(r0, 0), min(r0 + bm, m)), slice(max(c0, 0), min(c0 + bn, n))
    out[rows.start - r0:rows.stop - r0, cols.start - c0:cols.stop - c0] = x[rows, cols].double()
    return out


# ------------------------------------------------------------------------------------------------
# interpreter values
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, shape, blocks", [
    (torch.float16, (37, 29, 45), (16, 16, 16)),
    (torch.float32, (19, 33, 7), (16, 32, 8)),
    (torch.float32, (1, 1, 1), (16, 16, 16)),
], ids=["fp16-odd", "fp32-odd", "size1"])
def test_matmul_with_block_pointers_matches_float64(dtype, shape, blocks, seed):
    m, n, k = shape
    a = random_tensor((m, k), dtype, "cpu", seed)
    b = random_tensor((k, n), dtype, "cpu", seed + 1)
    big, c = _padded_output(m, n, dtype, "cpu")
    _launch_matmul(_matmul, a, b, c, blocks, interpret=True)
    assert_close(c, a.double() @ b.double(), dtype)
    outside = big.clone()
    outside[:m, :n] = 0
    assert torch.isnan(outside).sum() == big.numel() - m * n       # nothing written outside the range


@pytest.mark.parametrize("pad", ["zero", "nan", ""])
def test_copy_pads_checked_dims_with_the_padding_option(pad, seed):
    x = random_tensor((13, 21), torch.float32, "cpu", seed)
    # both dims checked (rows before the tensor, columns past it), reversed order, none (all inside), dim 0 only
    for r0, c0, check in [(-3, 10, (0, 1)), (9, -7, (1, 0)), (5, 2, ()), (6, 3, (0,))]:
        y = poison(torch.empty(8, 16))
        _copy_tile[(1,)](y, x, 13, 21, *x.stride(), r0, c0, BM=8, BN=16, CHECK=check, PAD=pad, interpret=True)
        expected = _tile_reference(x, r0, c0, 8, 16, pad)
        torch.testing.assert_close(y.double(), expected, equal_nan=True, rtol=0, atol=0)


def test_copy_checks_only_the_listed_dim():
    x = torch.arange(10 * 16, dtype=torch.float32).reshape(10, 16)
    y = poison(torch.empty(8, 16))
    # rows 6..13 of 10: dim 0 checked, dim 1 (columns 0..15, all inside) not
    _copy_tile[(1,)](y, x, 10, 16, *x.stride(), 6, 0, BM=8, BN=16, CHECK=(0,), PAD="nan", interpret=True)
    expected = torch.full((8, 16), float("nan"))
    expected[:4] = x[6:]
    torch.testing.assert_close(y, expected, equal_nan=True, rtol=0, atol=0)
    # an unchecked dim that leaves the tensor is the user's error: the interpreter says so
    with pytest.raises(dsl.InterpreterError, match="out of bounds|outside"):
        _copy_tile[(1,)](y, x, 10, 16, *x.stride(), 6, 0, BM=8, BN=16, CHECK=(1,), PAD="", interpret=True)


def test_transposed_view_with_order_0_1(seed):
    base = random_tensor((45, 37), torch.float16, "cpu", seed)
    x = base.t()                                   # (37, 45), strides (1, 37)
    big, y = _padded_output(37, 45, torch.float16, "cpu")
    _transpose[(dsl.cdiv(37, 16), dsl.cdiv(45, 32))](y, x, 37, 45, *x.stride(), *y.stride(), BM=16, BN=32,
                                                     interpret=True)
    assert torch.equal(y, x)
    assert torch.isnan(big[37:]).all() and torch.isnan(big[:, 45:]).all()


def _row_sums_reference(x, mode, bn, step):
    m, n = x.shape
    xd = x.double()
    if mode in (0, 3):
        return xd.sum(1)
    cols = []
    if mode == 2:
        for start in range(0, n, step):            # the while loop's tiles (they may overlap)
            cols += [c for c in range(start, start + bn) if c < n]
        return xd[:, cols].sum(1)
    for t in range(3):                             # starts bn/2, 0, -bn/2
        start = bn // 2 - t * (bn // 2)
        cols += [c for c in range(start, start + bn) if 0 <= c < n]
    return xd[:, cols].sum(1)


@pytest.mark.parametrize("mode, n, step", [(0, 45, 0), (1, 20, 0), (2, 45, 16), (2, 45, 24), (3, 45, 0)])
def test_block_pointers_carried_through_loops(mode, n, step, seed):
    m = 21
    x = random_tensor((m, n), torch.float32, "cpu", seed)
    y = poison(torch.empty(m))
    _row_sums[(dsl.cdiv(m, 8),)](y, x, m, n, x.stride(0), step, BM=8, BN=16, MODE=mode, interpret=True)
    assert_close(y, _row_sums_reference(x, mode, 16, step), torch.float32)


def test_offsets_past_int32_are_exact(seed):
    x = random_tensor((70,), torch.float32, "cpu", seed)
    y = poison(torch.empty(70))
    _far_offsets[(dsl.cdiv(70, 32),)](y, x, 70, 2**32, BLOCK=32, interpret=True)
    assert torch.equal(y, x * 2)


# ------------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------------
_ERRORS = {
    "shape length": ("p = dsl.make_block_ptr(x_ptr, (n,), (n, 1), (0, 0), (B, B), (1, 0))",
                     r"make_block_ptr: shape must be a tuple of 2 entries \(one per dim of block_shape\), got 1"),
    "strides length": ("p = dsl.make_block_ptr(x_ptr, (n, n), (1,), (0, 0), (B, B), (1, 0))",
                       r"make_block_ptr: strides must be a tuple of 2 entries"),
    "offsets length": ("p = dsl.make_block_ptr(x_ptr, (n, n), (n, 1), (0, 0, 0), (B, B), (1, 0))",
                       r"make_block_ptr: offsets must be a tuple of 2 entries .*got 3"),
    "order length": ("p = dsl.make_block_ptr(x_ptr, (n, n), (n, 1), (0, 0), (B, B), (0,))",
                     r"make_block_ptr: order must be a tuple of 2 entries"),
    "order permutation": ("p = dsl.make_block_ptr(x_ptr, (n, n), (n, 1), (0, 0), (B, B), (1, 1))",
                          r"make_block_ptr: order must be a permutation of the dims \(0, 1\)"),
    "block power of two": ("p = dsl.make_block_ptr(x_ptr, (n, n), (n, 1), (0, 0), (B, 12), (1, 0))",
                           r"make_block_ptr: block_shape must be constexpr powers of two, got \(16, 12\)"),
    "float stride": ("p = dsl.make_block_ptr(x_ptr, (n, n), (n, 1.5), (0, 0), (B, B), (1, 0))",
                     r"make_block_ptr: strides\[1\] must be an integer scalar"),
    "block stride": ("p = dsl.make_block_ptr(x_ptr, (n, n), (n, dsl.arange(0, B)), (0, 0), (B, B), (1, 0))",
                     r"make_block_ptr: strides\[1\] must be an integer scalar .*got a <16xint32> value"),
    "base": ("p = dsl.make_block_ptr(n, (n, n), (n, 1), (0, 0), (B, B), (1, 0))",
             r"make_block_ptr: base must be a pointer scalar"),
    "boundary dim": ("p = dsl.make_block_ptr(x_ptr, (n, n), (n, 1), (0, 0), (B, B), (1, 0))\n"
                     "    v = dsl.load(p, boundary_check=(0, 2))",
                     r"load: boundary_check must hold dims of the block pointer \(constexpr ints in \[0, 2\)\), "
                     r"got \(0, 2\)"),
    "boundary twice": ("p = dsl.make_block_ptr(x_ptr, (n, n), (n, 1), (0, 0), (B, B), (1, 0))\n"
                       "    dsl.store(p, 1.0, boundary_check=(1, 1))",
                       r"store: boundary_check names a dim twice"),
    "nan for ints": ("p = dsl.make_block_ptr(i_ptr, (n, n), (n, 1), (0, 0), (B, B), (1, 0))\n"
                     "    v = dsl.load(p, boundary_check=(0,), padding_option='nan')",
                     r"load: padding_option='nan' needs a floating-point tensor, not int32"),
    "padding value": ("p = dsl.make_block_ptr(x_ptr, (n, n), (n, 1), (0, 0), (B, B), (1, 0))\n"
                      "    v = dsl.load(p, boundary_check=(0,), padding_option='inf')",
                      r"load: padding_option must be one of \('', 'zero', 'nan'\), got 'inf'"),
    "mask": ("p = dsl.make_block_ptr(x_ptr, (n, n), (n, 1), (0, 0), (B, B), (1, 0))\n"
             "    v = dsl.load(p, mask=n > 0)",
             r"load: mask and other cannot be given with a block pointer; use boundary_check"),
    "store shape": ("p = dsl.make_block_ptr(x_ptr, (n, n), (n, 1), (0, 0), (B, B), (1, 0))\n"
                    "    dsl.store(p, dsl.zeros((B, 1), dsl.float32))",
                    r"store: the value must be a \(16, 16\) block \(the block pointer's block_shape\) or a scalar, "
                    r"got a block of shape \(16, 1\)"),
    "plain boundary": ("v = dsl.load(x_ptr + dsl.arange(0, B), boundary_check=(0,))",
                       r"load: boundary_check is for block pointers \(dsl.make_block_ptr\)"),
    "plain padding": ("v = dsl.load(x_ptr + dsl.arange(0, B), padding_option='zero')",
                      r"load: padding_option is for block pointers"),
    "advance plain": ("p = dsl.advance(x_ptr, (1,))",
                      r"advance expects a block pointer \(made by dsl.make_block_ptr\), got a ptr<float32> value"),
    "advance length": ("p = dsl.make_block_ptr(x_ptr, (n, n), (n, 1), (0, 0), (B, B), (1, 0))\n"
                       "    p = p.advance((1,))",
                       r"advance: offsets must be a tuple of 2 entries"),
    "attribute": ("p = dsl.make_block_ptr(x_ptr, (n, n), (n, 1), (0, 0), (B, B), (1, 0))\n"
                  "    p = p.load()",
                  r"block pointers have no attribute `load`; they have .advance\(offsets\)"),
    "loop block shape": ("p = dsl.make_block_ptr(x_ptr, (n, n), (n, 1), (0, 0), (B, B), (1, 0))\n"
                         "    for t in range(n):\n"
                         "        p = dsl.make_block_ptr(x_ptr, (n, n), (n, 1), (0, t), (B, 8), (1, 0))\n"
                         "    dsl.store(p, 0.0)",
                         r"`p` is a block pointer to \(16, 16\) blocks of float32 \(order \(1, 0\)\) before the "
                         r"loop but a block pointer to \(16, 8\) blocks .* must keep its block_shape and order"),
    "if block shape": ("p = dsl.make_block_ptr(x_ptr, (n, n), (n, 1), (0, 0), (B, B), (1, 0))\n"
                       "    if n > 3:\n"
                       "        p = dsl.make_block_ptr(x_ptr, (n, n), (n, 1), (0, 0), (B, B), (0, 1))\n"
                       "    dsl.store(p, 0.0)",
                       r"`p` is a block pointer .* in the `if` branch but .* before the `if`.*block pointers of "
                       r"one block_shape and order"),
}


@pytest.mark.parametrize("case", sorted(_ERRORS))
def test_bad_block_pointer_arguments_are_named(case):
    statement, message = _ERRORS[case]
    kernel = jit_from_source(f"def k(x_ptr, i_ptr, n, B: dsl.constexpr):\n    {statement}\n",
                             f"<block pointers {case}>")
    with pytest.raises(dsl.CompilationError) as info:
        kernel[(1,)](torch.zeros(256), torch.zeros(256, dtype=torch.int32), 16, B=16, interpret=True)
    assert re.search(message, str(info.value)), str(info.value)
    assert f"<block pointers {case}>" in str(info.value)           # points at the kernel's line


# ------------------------------------------------------------------------------------------------
# PTX
# ------------------------------------------------------------------------------------------------
def _instructions(ptx: str) -> list:
    return [line.strip() for line in ptx.splitlines()
            if line.strip() and not line.strip().startswith(("//", ".", "{", "}", "$"))]


def _compile_matmul(kernel, arch):
    a = torch.zeros(256, 256, dtype=torch.float16)
    c = torch.zeros(256, 256, dtype=torch.float16)
    return kernel.compile(c, a, a, 256, 256, 256, *a.stride(), *a.stride(), *c.stride(), target=arch,
                          num_warps=4, num_stages=3, BM=64, BN=64, BK=32).asm["ptx"]


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
def test_block_pointer_matmul_pipelines_as_plain_pointers_do_on_sm90a():
    ours, plain = _compile_matmul(_matmul, "sm_90a"), _compile_matmul(_matmul_plain, "sm_90a")
    assert "wgmma.mma_async" in ours and "cp.async.cg.shared.global" in ours
    for needle in ("cp.async.cg.shared.global", "wgmma.mma_async", "st.global.v4"):
        assert ours.count(needle) == plain.count(needle), needle        # 16-byte copies and stores, as plain
    assert len(_instructions(ours)) <= len(_instructions(plain)) * 1.02
    result = assemble(ours, "sm_90a")
    assert result.spill_bytes == 0


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
def test_block_pointer_matmul_assembles_for_sm80():
    ptx = _compile_matmul(_matmul, "sm_80")
    assert "cp.async.cg.shared.global" in ptx and "mma.sync.aligned.m16n8k16" in ptx and "ldmatrix" in ptx
    assert assemble(ptx, "sm_80").spill_bytes == 0


# ------------------------------------------------------------------------------------------------
# GPU
# ------------------------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("dtype, shape, blocks, warps", [
    (torch.float16, (1000, 520, 333), (128, 128, 32), 4),
    (torch.float16, (37, 29, 45), (64, 64, 32), 4),
    (torch.float32, (300, 257, 129), (64, 64, 16), 4),
    (torch.float32, (1, 1, 1), (16, 16, 16), 1),
], ids=["fp16-large", "fp16-odd", "fp32-odd", "size1"])
def test_gpu_matmul_with_block_pointers(dtype, shape, blocks, warps, seed):
    m, n, k = shape
    a = random_tensor((m, k), dtype, "cuda", seed)
    b = random_tensor((k, n), dtype, "cuda", seed + 1)
    big, c = _padded_output(m, n, dtype, "cuda")
    _launch_matmul(_matmul, a, b, c, blocks, num_warps=warps, num_stages=3)
    assert_close(c, a.double() @ b.double(), dtype)
    outside = big.clone()
    outside[:m, :n] = 0
    assert torch.isnan(outside).sum().item() == big.numel() - m * n


@pytest.mark.cuda
@pytest.mark.parametrize("pad", ["zero", "nan", ""])
def test_gpu_copy_pads_checked_dims(pad, seed):
    x = random_tensor((13, 21), torch.float32, "cpu", seed)
    for r0, c0, check in [(-3, 10, (0, 1)), (9, -7, (1, 0)), (5, 2, ()), (6, 3, (0,))]:
        y = poison(torch.empty(8, 16, device="cuda"))
        _copy_tile[(1,)](y, x.cuda(), 13, 21, *x.stride(), r0, c0, BM=8, BN=16, CHECK=check, PAD=pad)
        expected = _tile_reference(x, r0, c0, 8, 16, pad)
        torch.testing.assert_close(y.cpu().double(), expected, equal_nan=True, rtol=0, atol=0)


@pytest.mark.cuda
def test_gpu_transposed_view(seed):
    base = random_tensor((450, 370), torch.float16, "cuda", seed)
    x = base.t()
    big, y = _padded_output(370, 450, torch.float16, "cuda")
    _transpose[(dsl.cdiv(370, 64), dsl.cdiv(450, 64))](y, x, 370, 450, *x.stride(), *y.stride(), BM=64, BN=64)
    assert torch.equal(y, x)
    assert torch.isnan(big[370:]).all() and torch.isnan(big[:, 450:]).all()


@pytest.mark.cuda
@pytest.mark.parametrize("mode, n, step", [(0, 45, 0), (1, 20, 0), (2, 45, 24), (3, 45, 0)])
def test_gpu_block_pointers_carried_through_loops(mode, n, step, seed):
    m = 21
    x = random_tensor((m, n), torch.float32, "cuda", seed)
    y = poison(torch.empty(m, device="cuda"))
    _row_sums[(dsl.cdiv(m, 8),)](y, x, m, n, x.stride(0), step, BM=8, BN=16, MODE=mode)
    assert_close(y, _row_sums_reference(x.cpu(), mode, 16, step), torch.float32)


@pytest.mark.cuda
def test_gpu_offsets_past_int32_are_exact(seed):
    x = random_tensor((1000,), torch.float32, "cuda", seed)
    y = poison(torch.empty(1000, device="cuda"))
    _far_offsets[(dsl.cdiv(1000, 128),)](y, x, 1000, 2**32, BLOCK=128)
    assert torch.equal(y, x * 2)
