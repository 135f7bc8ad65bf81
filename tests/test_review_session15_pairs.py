"""Review (session 15) of loop-carried 16-bit pairs (codegen/control.py `_pairing`, `_pack`, `_unpack`): a FOR's
neighbouring half / bfloat registers share one <2 x T> phi. CPU tier: the pairing plan over mixed types, the
pack / unpack lanes, compilation (LLVM parse + verify happen in compile_to_ptx) of FOR loops carrying mixes of
16-bit blocks, 16-bit scalars, fp32, ints, pointers and bools, nested in IF / WHILE / FOR, on sm_80 and
sm_90a at 1..8 warps, ptxas without spills, pipelined dots, and the interpreter's results (zero-iteration
loops give the inits)."""

from __future__ import annotations

import re

import pytest
import torch
from llvmlite import ir

import fusedops.dsl as dsl
from fusedops.dsl.codegen.control import _pack, _pairing, _unpack
from fusedops.dsl.target import assemble, ptxas_available
from fusedops.dsl.target import llvm_types as T

from helpers import assert_close, poison, random_tensor


# -- the plan and the lanes -----------------------------------------------------------------------------

def _constants(*types):
    """One carried block of registers of these types (the plan pairs within a block only)."""
    return [[ir.Constant(t, 0) for t in types]]


@pytest.mark.parametrize("types, plan", [
    ((T.f16, T.bf16), [(0, 1), (1, 1)]),                                  # different 16-bit floats never pair
    ((T.i1, T.f16, T.f16, T.f32, T.f16), [(0, 1), (1, 2), (3, 1), (4, 1)]),
    ((T.f16,), [(0, 1)]),                                                  # a lone register
    ((T.bf16,) * 5, [(0, 2), (2, 2), (4, 1)]),                             # odd count: the last alone
    ((T.f16, T.i16, T.f16), [(0, 1), (1, 1), (2, 1)]),                     # not across a non-float
    ((ir.VectorType(T.f16, 2), ir.VectorType(T.f16, 2)), [(0, 1), (1, 1)]),   # vectors stay as they are
    ((ir.PointerType(T.f16, 1), T.f64, T.i64), [(0, 1), (1, 1), (2, 1)]),
])
def test_pairing_plan_over_mixed_types(types, plan):
    assert _pairing(_constants(*types)) == plan


def _builder():
    module = ir.Module()
    fn = ir.Function(module, ir.FunctionType(T.void, [T.f16, T.f16, T.f32, T.bf16, T.bf16, T.bf16]), "f")
    return ir.IRBuilder(fn.append_basic_block("entry")), list(fn.args)


def test_pack_then_unpack_reads_each_value_from_its_own_lane():
    b, args = _builder()
    plan = _pairing([args])           # the arguments as one block's registers
    assert plan == [(0, 2), (2, 1), (3, 2), (5, 1)]
    packed = _pack(b, args, plan)
    assert [str(v.type) for v in packed] == ["<2 x half>", "float", "<2 x bfloat>", "bfloat"]
    unpacked = _unpack(b, packed, plan)
    assert len(unpacked) == len(args)
    for original, value in zip(args, unpacked):
        if value is original:                       # carried alone
            continue
        lane = value.operands[1].constant
        insert = value.operands[0]                  # the insertelement chain of the pair: find the lane's insert
        while insert.operands[2].constant != lane:
            insert = insert.operands[0]
        assert insert.operands[1] is original
    b.ret_void()
    from llvmlite import binding as llvm
    llvm.parse_assembly(str(b.module)).verify()


# -- kernels ------------------------------------------------------------------------------------------

@dsl.jit
def _scalar_then_block(y_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    # carried [s, a...]: a 16-bit scalar before a block (pairs stay within the block)
    cols = dsl.arange(0, BLOCK)
    s = dsl.load(x_ptr)
    a = dsl.load(x_ptr + cols)
    for i in range(0, n):
        s = s + dsl.load(x_ptr + i)
        a = a * 2.0 + s
    dsl.store(y_ptr + cols, a)
    dsl.store(y_ptr + BLOCK, s)


@dsl.jit
def _everything(y_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    # fp32, int, pointer, 16-bit scalar, bool and 16-bit block carried together
    cols = dsl.arange(0, BLOCK)
    a = dsl.load(x_ptr + cols)
    s = dsl.load(x_ptr)
    f = 0.0
    k = 0
    p = x_ptr
    flag = n > 3
    for i in range(0, n):
        f = f + dsl.sum(dsl.cast(a, dsl.float32), 0)
        k = k + i
        p = p + 1
        s = s + dsl.load(p)
        flag = flag ^ (i > 1)
        a = a * 2.0
    dsl.store(y_ptr + cols, a)
    dsl.store(y_ptr + BLOCK, s)
    dsl.store(y_ptr + BLOCK + 1, f)
    dsl.store(y_ptr + BLOCK + 2, k)
    dsl.store(y_ptr + BLOCK + 3, flag)
    dsl.store(y_ptr + BLOCK + 4, dsl.load(p))


@dsl.jit
def _nested(y_ptr, x_ptr, n, m, BLOCK: dsl.constexpr):
    cols = dsl.arange(0, BLOCK)
    a = dsl.load(x_ptr + cols)
    c = dsl.load(x_ptr + BLOCK + cols)
    t = dsl.load(x_ptr)
    for i in range(0, n):
        b = a
        for j in range(0, m):
            b = b + c
            t = t + 1.0
        a = b - a
    dsl.store(y_ptr + cols, a)
    dsl.store(y_ptr + BLOCK + cols, c)
    dsl.store(y_ptr + 2 * BLOCK, t)


@dsl.jit
def _for_in_if_with_if_inside(y_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    cols = dsl.arange(0, BLOCK)
    a = dsl.load(x_ptr + cols)
    h = dsl.load(x_ptr + 1)
    if n > 2:
        for i in range(0, n):
            if i % 2 == 0:
                a = a + h
            else:
                h = h * 2.0
    dsl.store(y_ptr + cols, a)
    dsl.store(y_ptr + BLOCK, h)


@dsl.jit
def _for_in_while(y_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    cols = dsl.arange(0, BLOCK)
    a = dsl.load(x_ptr + cols)
    k = 0
    while k < n:
        for i in range(0, k):
            a = a + 1.0
        k = k + 1
    dsl.store(y_ptr + cols, a)


@dsl.jit
def _while_in_for(y_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    cols = dsl.arange(0, BLOCK)
    a = dsl.load(x_ptr + cols)
    h = dsl.load(x_ptr)
    for i in range(0, n):
        k = 0
        while k < i:
            a = a + h
            k = k + 1
        h = h + 1.0
    dsl.store(y_ptr + cols, a)
    dsl.store(y_ptr + BLOCK, h)


@dsl.jit
def _unchanged(y_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    cols = dsl.arange(0, BLOCK)
    a = dsl.load(x_ptr + cols)
    b = dsl.load(x_ptr + BLOCK + cols)
    for i in range(0, n):
        keep = a
        a = keep                # yielded as is
        b = b + 1.0
    dsl.store(y_ptr + cols, a)
    dsl.store(y_ptr + BLOCK + cols, b)


@dsl.jit
def _two_dtypes(y16_ptr, ybf_ptr, x16_ptr, xbf_ptr, n, BLOCK: dsl.constexpr):
    # half block, bfloat scalar, bfloat block, half scalar: neighbours of different types never pair
    cols = dsl.arange(0, BLOCK)
    a = dsl.load(x16_ptr + cols)
    s = dsl.load(xbf_ptr)
    b = dsl.load(xbf_ptr + cols)
    t = dsl.load(x16_ptr)
    for i in range(0, n):
        a = a + t
        s = s + 1.0
        b = b + s
        t = t + 1.0
    dsl.store(y16_ptr + cols, a)
    dsl.store(ybf_ptr + cols, b)
    dsl.store(ybf_ptr + BLOCK, s)
    dsl.store(y16_ptr + BLOCK, t)


@dsl.jit
def _two_d(y_ptr, x_ptr, n, R: dsl.constexpr, C: dsl.constexpr):
    rows = dsl.arange(0, R)[:, None]
    cols = dsl.arange(0, C)[None, :]
    a = dsl.load(x_ptr + rows * C + cols)
    z = dsl.zeros((R, C), dsl.float16)          # constant init
    for i in range(0, n):
        z = z + a
        a = a * 0.5
    dsl.store(y_ptr + rows * C + cols, z + a)


def _f16(n=8192):
    return torch.empty(n, dtype=torch.float16)


def _bf16(n=8192):
    return torch.empty(n, dtype=torch.bfloat16)


_CASES = {
    "scalar_then_block": (_scalar_then_block, lambda: (_f16(), _f16(), 5), {"BLOCK": 64}),
    "scalar_then_block_bf16": (_scalar_then_block, lambda: (_bf16(), _bf16(), 5), {"BLOCK": 128}),
    "everything": (_everything, lambda: (_f16(), _f16(), 5), {"BLOCK": 64}),
    "nested": (_nested, lambda: (_f16(), _f16(), 3, 4), {"BLOCK": 128}),
    "for_in_if": (_for_in_if_with_if_inside, lambda: (_bf16(), _bf16(), 5), {"BLOCK": 64}),
    "for_in_while": (_for_in_while, lambda: (_f16(), _f16(), 5), {"BLOCK": 64}),
    "while_in_for": (_while_in_for, lambda: (_f16(), _f16(), 5), {"BLOCK": 64}),
    "unchanged": (_unchanged, lambda: (_f16(), _f16(), 5), {"BLOCK": 128}),
    "two_dtypes": (_two_dtypes, lambda: (_f16(), _bf16(), _f16(), _bf16(), 5), {"BLOCK": 64}),
    "two_d": (_two_d, lambda: (_f16(), _f16(), 5), {"R": 8, "C": 16}),
}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("num_warps", [1, 8])
@pytest.mark.parametrize("case", sorted(_CASES))
def test_carried_mixes_compile_verify_and_assemble_without_spills(case, num_warps, arch):
    kernel, args, constexprs = _CASES[case]
    compiled = kernel.compile(*args(), target=arch, num_warps=num_warps, **constexprs)   # parses + verifies
    assert ".entry" in compiled.asm["ptx"]
    if ptxas_available():
        assert assemble(compiled.asm["ptx"], arch).spill_bytes == 0


@pytest.mark.parametrize("num_warps", [1, 2, 4])
def test_pairs_appear_where_registers_neighbour(num_warps):
    # 128 fp16 elements: 4, 2, 1 registers a thread -> pairs at 1 and 2 warps; at 4 warps none (the scalar s
    # and the single register of `a` are different values: pairs never span two)
    compiled = _scalar_then_block.compile(_f16(), _f16(), 5, BLOCK=128, target="sm_90a", num_warps=num_warps)
    assert ("<2 x half>" in compiled.asm["llir"]) == (num_warps < 4)


# -- the interpreter ----------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, 4])
def test_scalar_then_block_interpreted_matches_float64(n, seed):
    block = 32
    x = random_tensor((2 * block,), torch.float16, seed=seed)
    y = poison(torch.empty(block + 1, dtype=torch.float16))
    _scalar_then_block[(1,)](y, x, n, block, interpret=True)
    s, a = x[0].double(), x[:block].double()
    for i in range(n):
        s = s + x[i].double()
        a = a * 2 + s
    assert_close(y[:block], a, torch.float16)
    assert_close(y[block:], s.reshape(1), torch.float16)


def test_zero_iterations_give_the_inits_of_every_carried_kind(seed):
    block = 32
    x16 = random_tensor((2 * block,), torch.float16, seed=seed)
    xbf = random_tensor((2 * block,), torch.bfloat16, seed=seed + 1)
    y16 = poison(torch.empty(block + 1, dtype=torch.float16))
    ybf = poison(torch.empty(block + 1, dtype=torch.bfloat16))
    _two_dtypes[(1,)](y16, ybf, x16, xbf, 0, block, interpret=True)
    assert torch.equal(y16[:block], x16[:block]) and torch.equal(y16[block], x16[0])
    assert torch.equal(ybf[:block], xbf[:block]) and torch.equal(ybf[block], xbf[0])
    y = poison(torch.empty(block + 5, dtype=torch.float16))
    _everything[(1,)](y, x16, 0, block, interpret=True)
    assert torch.equal(y[:block], x16[:block]) and torch.equal(y[block], x16[0])              # a, s
    assert y[block + 1].item() == 0 and y[block + 2].item() == 0 and y[block + 3].item() == 0   # f, k, flag
    assert torch.equal(y[block + 4], x16[0])                                                    # *p, p = x


def test_unchanged_and_nested_interpreted(seed):
    block = 32
    x = random_tensor((2 * block,), torch.float16, seed=seed)
    y = poison(torch.empty(2 * block, dtype=torch.float16))
    _unchanged[(1,)](y, x, 3, block, interpret=True)
    assert torch.equal(y[:block], x[:block])
    assert_close(y[block:], x[block:].double() + 3, torch.float16)
    y = poison(torch.empty(2 * block + 1, dtype=torch.float16))
    _nested[(1,)](y, x, 2, 3, block, interpret=True)
    a, c, t = x[:block].double(), x[block:].double(), x[0].double()
    for _ in range(2):
        b = a
        for _ in range(3):
            b, t = b + c, t + 1
        a = b - a
    assert_close(y[:block], a, torch.float16)
    assert_close(y[2 * block:], t.reshape(1), torch.float16)


# -- pipelined dots ----------------------------------------------------------------------------------

@dsl.jit
def _dot_with_carried_half(c_ptr, a_ptr, b_ptr, K, BM: dsl.constexpr, BN: dsl.constexpr, BK: dsl.constexpr):
    rm = dsl.arange(0, BM)[:, None]
    rn = dsl.arange(0, BN)[None, :]
    rk = dsl.arange(0, BK)
    acc = dsl.zeros((BM, BN), dsl.float32)
    run = dsl.load(a_ptr + rm * BN + rn)           # a 16-bit block carried beside the accumulator
    h = dsl.load(a_ptr)                             # and a 16-bit scalar
    for k0 in range(0, K, BK):
        a = dsl.load(a_ptr + rm * K + (k0 + rk)[None, :])
        b = dsl.load(b_ptr + (k0 + rk)[:, None] * BN + rn)
        acc = dsl.dot(a, b, acc)
        run = run * 0.5
        h = h + 1.0
    dsl.store(c_ptr + rm * BN + rn, acc.to(dsl.float16) + run + h)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("num_stages", [2, 3])
@pytest.mark.parametrize("num_warps", [4, 8])
def test_pipelined_dot_with_carried_16_bit_values_assembles_without_spills(arch, num_stages, num_warps):
    x = _f16(16)
    compiled = _dot_with_carried_half.compile(x, x, x, 256, BM=64, BN=64, BK=32, target=arch,
                                              num_warps=num_warps, num_stages=num_stages)
    ptx = compiled.asm["ptx"]
    assert "cp.async" in ptx and ("wgmma" in ptx if arch == "sm_90a" else "mma.sync" in ptx)
    if ptxas_available():
        assert assemble(ptx, arch).spill_bytes == 0


# -- defect: the pairing ignores value boundaries ----------------------------------------------------

@dsl.jit
def _prefetch_scale_first(y_ptr, x_ptr, n_rows, BLOCK: dsl.constexpr):
    # carried [scale, current...]: the fp16 scalar is assigned first in the body
    cols = dsl.arange(0, BLOCK)
    current = dsl.load(x_ptr + cols)
    scale = dsl.load(x_ptr)
    for row in range(0, n_rows):
        scale = scale + 1.0
        following = dsl.load(x_ptr + (row + 1) * BLOCK + cols, mask=row + 1 < n_rows, other=0.0)
        dsl.store(y_ptr + row * BLOCK + cols, current * scale + following)
        current = following
    dsl.store(y_ptr, scale)


@dsl.jit
def _prefetch_scale_last(y_ptr, x_ptr, n_rows, BLOCK: dsl.constexpr):
    # the same computation, carried [current..., scale]
    cols = dsl.arange(0, BLOCK)
    current = dsl.load(x_ptr + cols)
    scale = dsl.load(x_ptr)
    for row in range(0, n_rows):
        following = dsl.load(x_ptr + (row + 1) * BLOCK + cols, mask=row + 1 < n_rows, other=0.0)
        dsl.store(y_ptr + row * BLOCK + cols, current * (scale + 1.0) + following)
        current = following
        scale = scale + 1.0
    dsl.store(y_ptr, scale)


_PACK = re.compile(r"mov\.b32\s+%r\d+, \{")


def test_a_16_bit_scalar_before_a_block_does_not_misalign_the_pairs():
    """A 16-bit scalar carried before an 8-register fp16 block: the block keeps the pairs it was loaded in
    (review fix: the plan paired over the flattened list, (scale, c0), (c1, c2), ..., and repacked the
    prefetched row every iteration: 12 packs against 4)."""
    x = _f16(64 * 256)
    counts = [len(_PACK.findall(kernel.compile(x, x, 64, BLOCK=256, target="sm_90a", num_warps=1).asm["ptx"]))
              for kernel in (_prefetch_scale_first, _prefetch_scale_last)]
    assert counts[1] == 4                      # the store's packs only: the loaded pairs are carried as loaded
    assert counts[0] == counts[1]
