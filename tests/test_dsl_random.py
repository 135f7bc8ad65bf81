"""Random numbers in kernels (fusedops/dsl/language/random.py): `dsl.randint4x` / `randint` / `rand` / `randn` /
`rand4x` / `randn4x` / `philox` / `philox_impl` / `uint_to_uniform_float` and `dsl.umulhi`.

The reference is a pure-Python Philox4x32-10 / Philox4x64-10 written from Salmon, Moraes, Dror and Shaw,
"Parallel random numbers: as easy as 1, 2, 3" (SC 2011), with Triton's key / counter layout (key = the seed's
low and high 32-bit words, or (seed, 0) for 64-bit counters; counter = (offset, 0, 0, 0)) and float conversion;
it is itself checked on Random123's known-answer vectors and on NumPy's Philox bit generator (Philox4x64-10).
Interpreter values must equal it bit for bit (the normals: within float32 rounding of a float64 Box-Muller);
the statistics of 10^5 draws are sane; values depend only on (seed, offset); the PTX holds `mul.hi` and ptxas
takes it for sm_80 and sm_90a. The cuda-marked tests compare the compiled kernels with the same reference (and
the interpreter) on the GPU.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl import CompilationError
from fusedops.dsl.target import assemble, ptxas_available
from helpers import poison
from kernel_source import jit_from_source

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")

# -- the reference ------------------------------------------------------------------------------------------
_CONSTANTS = {   # (M0, M1, W0, W1), Salmon et al. (2011)
    32: (0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85),
    64: (0xD2E7470EE14C6C93, 0xCA5A826395121157, 0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B),
}
_SCALE = {32: np.float32(4.6566127342e-10), 64: np.float32(1.0842020432385337e-19)}


def _philox(counters, key, bits, rounds=10):
    """Philox4xN of four counter arrays (object arrays of Python ints) under key (k0, k1): four arrays."""
    m0, m1, w0, w1 = _CONSTANTS[bits]
    mask = (1 << bits) - 1
    c0, c1, c2, c3 = (np.asarray(c, dtype=object) for c in counters)
    k0, k1 = key
    for _ in range(rounds):
        p0, p1 = c0 * m0, c2 * m1
        c0, c1, c2, c3 = (p1 >> bits) ^ c1 ^ k0, p1 & mask, (p0 >> bits) ^ c3 ^ k1, p0 & mask
        k0, k1 = (k0 + w0) & mask, (k1 + w1) & mask
    return c0, c1, c2, c3


def _words(seed: int, offsets, bits=32, rounds=10):
    """Triton's randint4x(seed, offsets): the four words as uint32 / uint64 arrays."""
    seed %= 1 << 64
    key = (seed & 0xFFFFFFFF, seed >> 32) if bits == 32 else (seed, 0)
    offsets = np.asarray(offsets, dtype=object) % (1 << bits)
    zeros = offsets * 0
    unsigned = np.uint32 if bits == 32 else np.uint64
    words = _philox((offsets, zeros, zeros, zeros), key, bits, rounds)
    return [np.array(w.astype(object), dtype=unsigned) for w in words]


def _uniform(word: np.ndarray) -> np.ndarray:
    """Triton's uint_to_uniform_float: the word as signed, -x - 1 for x < 0, float32(x) * float32(scale)."""
    bits = word.dtype.itemsize * 8
    signed = word.view(np.int32 if bits == 32 else np.int64).astype(np.int64)
    signed = np.where(signed < 0, -(signed + 1), signed)
    return (signed.astype(np.float32) * _SCALE[bits]).astype(np.float32)


def _normal_pair(u1: np.ndarray, u2: np.ndarray):
    """pair_uniform_to_normal of float32 uniforms: the angle rounded to float32 as the kernel rounds it (one
    float32 multiply), the rest in float64."""
    u1 = np.maximum(u1, np.float32(1e-7)).astype(np.float64)
    theta = (np.float32(6.283185307179586) * u2.astype(np.float32)).astype(np.float64)
    r = np.sqrt(-2.0 * np.log(u1))
    return r * np.cos(theta), r * np.sin(theta)


def _assert_normals_close(got, want):
    # float32 log (1 ulp in libdevice), sqrt, cos / sin (2 ulps) and a product, with r <= 5.7: under 1.6e-6
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=2e-6, atol=2e-6)


def test_reference_matches_random123_known_answers_and_numpy():
    kat32 = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
             ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
             ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
              (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    kat64 = [((0, 0, 0, 0), (0, 0), (0x16554D9ECA36314C, 0xDB20FE9D672D0FDC, 0xD7E772CEE186176B, 0x7E68B68AEC7BA23B)),
             ((0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0, 0x082EFA98EC4E6C89),
              (0x452821E638D01377, 0xBE5466CF34E90C6C),
              (0xA528F45403E61D95, 0x38C72DBD566E9788, 0xA5A1610E72FD18B5, 0x57BD43B5E52B7FE6))]
    for bits, vectors in ((32, kat32), (64, kat64)):
        for counter, key, expected in vectors:
            assert tuple(int(w[0]) for w in _philox([[c] for c in counter], key, bits)) == expected
    # NumPy's Philox is Philox4x64-10 and increments its counter before the first block
    generator = np.random.Philox(key=np.array([7, 2**63 + 9], dtype=np.uint64), counter=np.array([41, 0, 0, 0],
                                                                                              dtype=np.uint64))
    expected = [int(v) for v in generator.random_raw(4)]
    assert [int(w[0]) for w in _philox([[42], [0], [0], [0]], (7, 2**63 + 9), 64)] == expected


# -- kernels ------------------------------------------------------------------------------------------------
@dsl.jit
def _words_kernel(o_ptr, seed, base, n, BLOCK: dsl.constexpr, WIDE: dsl.constexpr, ROUNDS: dsl.constexpr):
    # the four words of randint4x at offsets base + i (int64 offsets when WIDE: Philox4x64), rows of n;
    # row 4: randint (the first word again, through its own entry point)
    i = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = i < n
    if WIDE:
        offsets = base + i.to(dsl.int64)
        out = dsl.int64
    else:
        offsets = base + i
        out = dsl.int32
    w0, w1, w2, w3 = dsl.randint4x(seed, offsets, ROUNDS)
    dsl.store(o_ptr + i, w0.to(out, bitcast=True), mask=mask)
    dsl.store(o_ptr + n + i, w1.to(out, bitcast=True), mask=mask)
    dsl.store(o_ptr + 2 * n + i, w2.to(out, bitcast=True), mask=mask)
    dsl.store(o_ptr + 3 * n + i, w3.to(out, bitcast=True), mask=mask)
    dsl.store(o_ptr + 4 * n + i, dsl.randint(seed, offsets, n_rounds=ROUNDS).to(out, bitcast=True), mask=mask)


@dsl.jit
def _floats_kernel(o_ptr, seed, base, n, BLOCK: dsl.constexpr, WIDE: dsl.constexpr):
    # rows: rand, randn, rand4x (4), randn4x (4)
    i = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = i < n
    offsets = base + i.to(dsl.int64) if WIDE else base + i
    dsl.store(o_ptr + i, dsl.rand(seed, offsets), mask=mask)
    dsl.store(o_ptr + n + i, dsl.randn(seed, offsets), mask=mask)
    u0, u1, u2, u3 = dsl.rand4x(seed, offsets)
    z0, z1, z2, z3 = dsl.randn4x(seed, offsets)
    dsl.store(o_ptr + 2 * n + i, u0, mask=mask)
    dsl.store(o_ptr + 3 * n + i, u1, mask=mask)
    dsl.store(o_ptr + 4 * n + i, u2, mask=mask)
    dsl.store(o_ptr + 5 * n + i, u3, mask=mask)
    dsl.store(o_ptr + 6 * n + i, z0, mask=mask)
    dsl.store(o_ptr + 7 * n + i, z1, mask=mask)
    dsl.store(o_ptr + 8 * n + i, z2, mask=mask)
    dsl.store(o_ptr + 9 * n + i, z3, mask=mask)


@dsl.jit
def _umulhi_kernel(o_ptr, x_ptr, y_ptr, n, BLOCK: dsl.constexpr, DTYPE: dsl.constexpr, LITERAL: dsl.constexpr):
    # x, y: signed int tensors read as DTYPE (same width); row 0 umulhi(x, y), row 1 umulhi(LITERAL, x)
    i = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = i < n
    x = dsl.load(x_ptr + i, mask=mask, other=0)
    y = dsl.load(y_ptr + i, mask=mask, other=0)
    signed = x.dtype
    x, y = x.to(DTYPE, bitcast=True), y.to(DTYPE, bitcast=True)
    dsl.store(o_ptr + i, dsl.umulhi(x, y).to(signed, bitcast=True), mask=mask)
    dsl.store(o_ptr + n + i, dsl.umulhi(LITERAL, x).to(signed, bitcast=True), mask=mask)


@dsl.jit
def _dropout_kernel(x_ptr, o_ptr, n, p, seed, BLOCK: dsl.constexpr):
    # Triton's tutorial 04 (low-memory dropout): the mask is regenerated from (seed, offset), never stored
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    x = dsl.load(x_ptr + offsets, mask=mask)
    keep = dsl.rand(seed, offsets) > p
    dsl.store(o_ptr + offsets, dsl.where(keep, x / (1 - p), 0.0), mask=mask)


@dsl.jit
def _tile_kernel(o_ptr, seed, ROWS: dsl.constexpr, COLS: dsl.constexpr):
    # one program draws a ROWS x COLS tile at offsets row * COLS + col (2-D offsets), plus scalar draws
    # at the literal offset 5 (a literal seed and a runtime one) and for a seed block
    r = dsl.arange(0, ROWS)[:, None]
    c = dsl.arange(0, COLS)[None, :]
    dsl.store(o_ptr + r * COLS + c, dsl.rand(seed, r * COLS + c))
    dsl.store(o_ptr + ROWS * COLS, dsl.rand(12345, 5))
    dsl.store(o_ptr + ROWS * COLS + 1, dsl.rand(seed, 5))
    i = dsl.arange(0, COLS)
    dsl.store(o_ptr + ROWS * COLS + 2 + i, dsl.rand(seed + i, 7))


@dsl.jit
def _philox_kernel(o_ptr, c_ptr, k0, k1, ROUNDS: dsl.constexpr):
    # dsl.philox_impl on explicit counters (4 int32 words at c_ptr) and key words; dsl.philox with the seed
    # (k1 << 32) | k0 and the same counters as signed int32; 8 words out
    c0 = dsl.load(c_ptr).to(dsl.uint32, bitcast=True)
    c1 = dsl.load(c_ptr + 1).to(dsl.uint32, bitcast=True)
    c2 = dsl.load(c_ptr + 2).to(dsl.uint32, bitcast=True)
    c3 = dsl.load(c_ptr + 3).to(dsl.uint32, bitcast=True)
    a0, a1, a2, a3 = dsl.philox_impl(c0, c1, c2, c3, k0.to(dsl.uint32), k1.to(dsl.uint32), ROUNDS)
    seed = (k1.to(dsl.uint64) << 32) | k0.to(dsl.uint64)
    b0, b1, b2, b3 = dsl.philox(seed, c0.to(dsl.int32, bitcast=True), c1.to(dsl.int32, bitcast=True),
                                c2.to(dsl.int32, bitcast=True), c3.to(dsl.int32, bitcast=True), n_rounds=ROUNDS)
    dsl.store(o_ptr + 0, a0.to(dsl.int32, bitcast=True))
    dsl.store(o_ptr + 1, a1.to(dsl.int32, bitcast=True))
    dsl.store(o_ptr + 2, a2.to(dsl.int32, bitcast=True))
    dsl.store(o_ptr + 3, a3.to(dsl.int32, bitcast=True))
    dsl.store(o_ptr + 4, b0.to(dsl.int32, bitcast=True))
    dsl.store(o_ptr + 5, b1.to(dsl.int32, bitcast=True))
    dsl.store(o_ptr + 6, b2.to(dsl.int32, bitcast=True))
    dsl.store(o_ptr + 7, b3.to(dsl.int32, bitcast=True))


@dsl.jit
def _uniform_kernel(o_ptr, x_ptr, n, BLOCK: dsl.constexpr, DTYPE: dsl.constexpr):
    i = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + i, mask=i < n, other=0).to(DTYPE, bitcast=True)
    dsl.store(o_ptr + i, dsl.uint_to_uniform_float(x), mask=i < n)


def _launch(kernel, grid, *args, device="cpu", **constexprs):
    kernel[grid](*args, interpret=device == "cpu", **constexprs)


def _draw_words(seed, base, n, block, wide, rounds=10, device="cpu"):
    out = poison(torch.empty(5 * n, dtype=torch.int64 if wide else torch.int32, device=device))
    _launch(_words_kernel, (-(-n // block),), out, seed, base, n, device=device, BLOCK=block, WIDE=wide, ROUNDS=rounds)
    return out.cpu().numpy().view(np.uint64 if wide else np.uint32).reshape(5, n)


def _draw_floats(seed, base, n, block, wide, device="cpu"):
    out = poison(torch.empty(10 * n, device=device))
    _launch(_floats_kernel, (-(-n // block),), out, seed, base, n, device=device, BLOCK=block, WIDE=wide)
    return out.cpu().numpy().reshape(10, n)


def _check_words(got, seed, base, n, wide, rounds=10):
    want = _words(seed, [base + i for i in range(n)], 64 if wide else 32, rounds)
    for row in range(4):
        np.testing.assert_array_equal(got[row], want[row])
    np.testing.assert_array_equal(got[4], want[0])


def _check_floats(got, seed, base, n, wide):
    words = _words(seed, [base + i for i in range(n)], 64 if wide else 32)
    uniforms = [_uniform(w) for w in words]
    np.testing.assert_array_equal(got[0], uniforms[0])
    for row in range(4):
        np.testing.assert_array_equal(got[2 + row], uniforms[row])
    normals = [*_normal_pair(uniforms[0], uniforms[1]), *_normal_pair(uniforms[2], uniforms[3])]
    _assert_normals_close(got[1], normals[0])
    for row in range(4):
        _assert_normals_close(got[6 + row], normals[row])


# (seed, base, n, BLOCK, WIDE): odd sizes, size 1, masked tails, int32 offsets that wrap past 2**31, a negative
# seed (sign-extended to 64 bits), a seed past 2**63 (a uint64 argument), int64 offsets (Philox4x64)
_WORD_CASES = [(0, 0, 37, 16, False), (2**40 + 7, 1000, 1, 16, False), (-1, 2**31 - 20, 50, 32, False),
               (2**64 - 3, 5, 33, 16, False), (123, 2**40, 21, 16, True), (-5, 3, 17, 8, True)]


@pytest.mark.parametrize("seed, base, n, block, wide", _WORD_CASES)
def test_randint4x_and_randint_match_the_reference(seed, base, n, block, wide):
    _check_words(_draw_words(seed, base, n, block, wide), seed, base, n, wide)


@pytest.mark.parametrize("rounds", [0, 1, 7])
def test_n_rounds(rounds):
    got = _draw_words(99, 10, 19, 16, False, rounds)
    _check_words(got, 99, 10, 19, False, rounds)
    if rounds == 0:     # no round: the counter itself, (offset, 0, 0, 0)
        np.testing.assert_array_equal(got[0], np.arange(10, 29, dtype=np.uint32))
        assert not got[1:4].any()


@pytest.mark.parametrize("wide", [False, True])
def test_rand_randn_and_the_4x_forms_match_the_reference(wide):
    seed, base, n = (2024, 7, 45) if not wide else (3, 2**33 + 1, 23)
    _check_floats(_draw_floats(seed, base, n, 16, wide), seed, base, n, wide)


def test_philox_and_philox_impl_give_the_known_answers():
    out = poison(torch.empty(8, dtype=torch.int32))
    counter = torch.tensor([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], dtype=torch.int64).to(torch.int32)
    _philox_kernel[(1,)](out, counter, 0xA4093822, 0x299F31D0, ROUNDS=10, interpret=True)
    expected = [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1] * 2      # Random123's philox4x32_10 vector
    assert out.numpy().view(np.uint32).tolist() == expected
    _philox_kernel[(1,)](poison(out), counter, 5, 0xFFFFFFFF, ROUNDS=3, interpret=True)
    want = _philox([[int(c) % 2**32] for c in counter], (5, 0xFFFFFFFF), 32, rounds=3)
    assert out.numpy().view(np.uint32).tolist() == [int(w[0]) for w in want] * 2


def test_values_depend_only_on_seed_and_offset():
    """The same offsets drawn by programs of other sizes, as a 2-D tile and as scalars give the same values."""
    seed, rows, cols = 77, 4, 8
    small = _draw_floats(seed, 0, rows * cols, 8, False)[0]
    large = _draw_floats(seed, 0, rows * cols, 64, False)[0]
    tile = poison(torch.empty(rows * cols + 2 + cols))
    _tile_kernel[(1,)](tile, seed, ROWS=rows, COLS=cols, interpret=True)
    tile = tile.numpy()
    want = _uniform(_words(seed, range(rows * cols))[0])
    for got in (small, large, tile[:rows * cols]):
        np.testing.assert_array_equal(got, want)
    assert tile[rows * cols] == _uniform(_words(12345, [5])[0])[0]
    assert tile[rows * cols + 1] == _uniform(_words(seed, [5])[0])[0]
    np.testing.assert_array_equal(tile[rows * cols + 2:], [_uniform(_words(seed + i, [7])[0])[0] for i in range(cols)])


def test_statistics_of_a_hundred_thousand_draws():
    n = 100_000
    got = _draw_floats(1234, 0, n, 8192, False)
    uniform, normal = got[0].astype(np.float64), got[1].astype(np.float64)
    assert uniform.min() >= 0.0 and uniform.max() < 1.0
    assert abs(uniform.mean() - 0.5) < 0.004 and abs(uniform.var() - 1 / 12) < 0.002    # ~4.5 standard errors
    assert np.isfinite(normal).all() and np.abs(normal).max() <= 5.7
    assert abs(normal.mean()) < 0.015 and abs(normal.var() - 1.0) < 0.025
    assert len(np.unique(got[0])) > 0.99 * n                                              # no short cycles
    assert abs(np.corrcoef(got[2], got[3])[0, 1]) < 0.015                                 # the words of 4x
    counts = np.histogram(uniform, bins=10, range=(0, 1))[0]
    assert np.all(np.abs(counts - n / 10) < 5 * np.sqrt(n / 10))


@pytest.mark.parametrize("dtype, words, want", [
    (dsl.uint32, [0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFE], [0, 2**-31 * (1 - 2**-24), 1 - 2**-24,
                                                                           1 - 2**-24, 0, 2**-31 * (1 - 2**-24)]),
    (dsl.int32, [0, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF], [0, 1 - 2**-24, 1 - 2**-24, 0]),
    (dsl.uint64, [0, 2**63 - 1, 2**63, 2**64 - 1, 2**62], [0, 1 - 2**-23, 1 - 2**-23, 0, 0.5 * (1 - 2**-23)]),
    (dsl.int64, [2**63 - 1, 2**64 - 1], [1 - 2**-23, 0]),
])
def test_uint_to_uniform_float_stays_below_one(dtype, words, want):
    """The largest word maps to 1 - 2**-24 (64-bit: 1 - 2**-23), never 1.0; negative words fold onto [0, 2**31)."""
    signed = torch.int32 if dtype.bits == 32 else torch.int64
    x = torch.tensor([w - (1 << dtype.bits) if w >= 1 << (dtype.bits - 1) else w for w in words], dtype=signed)
    out = poison(torch.empty(len(words)))
    _uniform_kernel[(1,)](out, x, len(words), BLOCK=8, DTYPE=dtype, interpret=True)
    assert out.tolist() == want
    np.testing.assert_array_equal(out.numpy(), _uniform(x.numpy().view(np.uint32 if dtype.bits == 32 else np.uint64)))


def _dropout_reference(x, p, seed):
    keep = _uniform(_words(seed, range(x.numel()))[0]) > np.float32(p)
    scaled = x.numpy() / (np.float32(1) - np.float32(p))
    return torch.from_numpy(np.where(keep, scaled, np.float32(0)).astype(np.float32)), keep


def test_seeded_dropout_matches_the_reference():
    n, p, seed = 1000, 0.3, 0xDEADBEEF
    x = torch.randn(n, generator=torch.Generator().manual_seed(5))
    out = poison(torch.empty(n))
    _dropout_kernel[(-(-n // 256),)](x, out, n, p, seed, BLOCK=256, interpret=True)
    want, keep = _dropout_reference(x, p, seed)
    assert torch.equal(out, want)
    assert 0.62 < keep.mean() < 0.78         # p = 0.3 (0.75 for this seed: 3.4 standard errors)
    again = poison(torch.empty(n))
    _dropout_kernel[(-(-n // 64),)](x, again, n, p, seed, BLOCK=64, interpret=True)    # the mask is not stored:
    assert torch.equal(again, out)                                                      # regenerated identically


def _umulhi_inputs(torch_dtype, n, seed):
    bits = torch.iinfo(torch_dtype).bits
    g = torch.Generator().manual_seed(seed)
    low, high = torch.iinfo(torch_dtype).min, torch.iinfo(torch_dtype).max
    edges = torch.tensor([0, 1, -1, low, high, 2, low + 1], dtype=torch_dtype)
    x = torch.cat([edges, torch.randint(low, high, (n,), generator=g, dtype=torch.int64).to(torch_dtype)])
    y = torch.cat([torch.tensor([-1, -1, -1, -1, -1, low, high], dtype=torch_dtype),
                   torch.randint(low, high, (n,), generator=g, dtype=torch.int64).to(torch_dtype)])
    return x, y, bits


def _umulhi_expected(x, y, bits, literal):
    mask = (1 << bits) - 1
    def signed(v):
        return v - (1 << bits) if v >> (bits - 1) else v
    xs, ys = [int(v) & mask for v in x.tolist()], [int(v) & mask for v in y.tolist()]
    return [signed((a * b) >> bits) for a, b in zip(xs, ys)] + [signed((literal * a) >> bits) for a in xs]


_UMULHI_CASES = [(torch.int32, dsl.uint32, 0xCD9E8D57), (torch.int32, dsl.int32, 0x6D2B79F5),
                 (torch.int64, dsl.uint64, 0xCA5A826395121157), (torch.int64, dsl.int64, 0x5851F42D4C957F2D),
                 (torch.int16, dsl.uint16, 0xBEEF), (torch.int8, dsl.int8, 0x35)]


@pytest.mark.parametrize("torch_dtype, dtype, literal", _UMULHI_CASES)
def test_umulhi_is_the_high_half_of_the_unsigned_product(torch_dtype, dtype, literal):
    x, y, bits = _umulhi_inputs(torch_dtype, 40, 11)
    out = poison(torch.empty(2 * x.numel(), dtype=torch_dtype))
    _umulhi_kernel[(-(-x.numel() // 32),)](out, x, y, x.numel(), BLOCK=32, DTYPE=dtype, LITERAL=literal, interpret=True)
    assert out.tolist() == _umulhi_expected(x, y, bits, literal)


@pytest.mark.parametrize("statement, message", [
    ("v = dsl.rand(1.5, o)", r"dsl\.rand: seed must be an integer \(a scalar or a block\), got 1\.5"),
    ("v = dsl.rand(x_ptr, o)", r"dsl\.rand: seed must be an integer .*got ptr<float32>"),
    ("v = dsl.randn(1, o.to(dsl.float32))", r"dsl\.randn: offset \(counter c0\) must be an integer .*got float32"),
    ("v = dsl.randint(1, o.to(dsl.int16))", r"dsl\.randint: offset \(counter c0\) must be a 32- or 64-bit integer, "
                                            r"got int16"),
    ("v = dsl.rand(1, o, -1)", r"dsl\.rand: n_rounds must be a constexpr int >= 0, got -1"),
    ("v = dsl.rand(1, o, n)", r"argument `n_rounds` of `rand` is a dsl.constexpr parameter"),
    ("v = dsl.umulhi(o, 1.5)", r"umulhi: y must be an integer scalar or block, got 1\.5"),
    ("v = dsl.umulhi(o > 1, o)", r"umulhi: x must be an integer scalar or block, got int1"),
    ("v = dsl.philox_impl(o, o, o, o, 1, 2)[0]", r"dsl\.philox_impl: c0 must be uint32 or uint64, got int32"),
    ("v = dsl.philox_impl(o.to(dsl.uint32), o.to(dsl.uint64), o, o, 1, 2)[0]",
     r"dsl\.philox_impl: c1 must have the type of the others \(uint32\), got uint64"),
    ("v = dsl.philox(1, o, o.to(dsl.int64), 0, 0)[0]", r"dsl\.philox: c1 must have c0's width \(32 bits\), got int64"),
    ("v = dsl.philox(dsl.arange(0, 8), o, 0, 0, 0)[0]", r"dsl\.philox: the counters and the seed do not broadcast"),
    ("v = dsl.uint_to_uniform_float(o.to(dsl.int8))", r"dsl\.uint_to_uniform_float: x must be a 32- or 64-bit"),
])
def test_bad_arguments_are_named_at_the_callers_line(statement, message):
    source = (f"def k(y_ptr, x_ptr, n):\n    o = dsl.arange(0, 16)\n    {statement}\n"
              "    dsl.store(y_ptr + o, v.to(dsl.float32))\n")
    filename = f"<random errors {abs(hash(statement))}>"
    kernel = jit_from_source(source, filename)
    with pytest.raises(CompilationError, match=message) as info:
        kernel[(1,)](torch.empty(16), torch.empty(16), 3, interpret=True)
    assert f"{filename}:3:" in str(info.value)          # the user's line, not one of fusedops/dsl/language/random.py


# -- the compiled code (no GPU needed) ---------------------------------------------------------------------
@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_ptx_uses_mul_hi_and_assembles_without_spills(arch):
    i32, f32 = dsl.pointer_type(dsl.int32), dsl.pointer_type(dsl.float32)
    narrow = _words_kernel.compile(i32, 5, 3, 4096, BLOCK=256, WIDE=False, ROUNDS=10, target=arch).asm["ptx"]
    wide = _words_kernel.compile(dsl.pointer_type(dsl.int64), 5, 2**40, 4096, BLOCK=256, WIDE=True, ROUNDS=10,
                                 target=arch).asm["ptx"]
    dropout = _dropout_kernel.compile(f32, f32, 4096, 0.5, 7, BLOCK=1024, target=arch).asm["ptx"]
    # 10 rounds x 2 high products per element (2 per thread at BLOCK=256 and 4 warps), less those of round 1
    # on the zero counter words, which fold
    assert 30 <= len(re.findall(r"mul\.hi\.u32", narrow)) <= 40 and "mul.hi.u64" not in narrow
    assert 30 <= len(re.findall(r"mul\.hi\.u64", wide)) <= 40
    assert "mul.hi.u32" in dropout
    for ptx in (narrow, wide, dropout):
        assert assemble(ptx, arch).spill_bytes == 0
    halves = _umulhi_kernel.compile(dsl.pointer_type(dsl.int16), dsl.pointer_type(dsl.int16),
                                    dsl.pointer_type(dsl.int16), 64, BLOCK=64, DTYPE=dsl.uint16, LITERAL=0xBEEF,
                                    target=arch).asm["ptx"]
    assemble(halves, arch)


# -- on the GPU: the same references, and the interpreter's bits ------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("seed, base, n, block, wide", _WORD_CASES + [(31337, 0, 5000, 256, False)])
def test_gpu_words_match_the_reference_and_the_interpreter(seed, base, n, block, wide):
    got = _draw_words(seed, base, n, block, wide, device="cuda")
    _check_words(got, seed, base, n, wide)
    np.testing.assert_array_equal(got, _draw_words(seed, base, n, 64, wide))


@pytest.mark.cuda
@pytest.mark.parametrize("rounds", [0, 7])
def test_gpu_n_rounds(rounds):
    _check_words(_draw_words(99, 10, 19, 16, False, rounds, device="cuda"), 99, 10, 19, False, rounds)


@pytest.mark.cuda
@pytest.mark.parametrize("wide", [False, True])
def test_gpu_rand_and_randn_match_the_reference_and_the_interpreter(wide):
    seed, base, n = (2024, 7, 3001) if not wide else (3, 2**33 + 1, 1001)
    got = _draw_floats(seed, base, n, 128, wide, device="cuda")
    _check_floats(got, seed, base, n, wide)
    interpreted = _draw_floats(seed, base, n, 128, wide)
    for row in (0, 2, 3, 4, 5):                      # uniforms: bit for bit
        np.testing.assert_array_equal(got[row], interpreted[row])
    assert np.isfinite(got).all() and got[[0, 2, 3, 4, 5]].max() < 1.0 and got[[0, 2, 3, 4, 5]].min() >= 0.0


@pytest.mark.cuda
def test_gpu_philox_known_answers_and_tile():
    out = poison(torch.empty(8, dtype=torch.int32, device="cuda"))
    counter = torch.tensor([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], dtype=torch.int64).to(torch.int32)
    _philox_kernel[(1,)](out, counter.cuda(), 0xA4093822, 0x299F31D0, ROUNDS=10)
    assert out.cpu().numpy().view(np.uint32).tolist() == [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1] * 2
    seed, rows, cols = 77, 4, 8
    tile = poison(torch.empty(rows * cols + 2 + cols, device="cuda"))
    _tile_kernel[(1,)](tile, seed, ROWS=rows, COLS=cols)
    reference = poison(torch.empty(rows * cols + 2 + cols))
    _tile_kernel[(1,)](reference, seed, ROWS=rows, COLS=cols, interpret=True)
    assert torch.equal(tile.cpu(), reference)
    np.testing.assert_array_equal(tile.cpu().numpy()[:rows * cols], _uniform(_words(seed, range(rows * cols))[0]))


@pytest.mark.cuda
@pytest.mark.parametrize("torch_dtype, dtype, literal", _UMULHI_CASES)
def test_gpu_umulhi(torch_dtype, dtype, literal):
    x, y, bits = _umulhi_inputs(torch_dtype, 1000, 12)
    out = poison(torch.empty(2 * x.numel(), dtype=torch_dtype, device="cuda"))
    _umulhi_kernel[(-(-x.numel() // 128),)](out, x.cuda(), y.cuda(), x.numel(), BLOCK=128, DTYPE=dtype,
                                            LITERAL=literal)
    assert out.cpu().tolist() == _umulhi_expected(x, y, bits, literal)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [dsl.uint32, dsl.int64])
def test_gpu_uint_to_uniform_float_edges(dtype):
    signed = torch.int32 if dtype.bits == 32 else torch.int64
    info = torch.iinfo(signed)
    x = torch.cat([torch.tensor([0, 1, -1, info.max, info.min, info.min + 1], dtype=signed),
                   torch.randint(info.min, info.max, (500,), generator=torch.Generator().manual_seed(3),
                                 dtype=torch.int64).to(signed)])
    out = poison(torch.empty(x.numel(), device="cuda"))
    _uniform_kernel[(-(-x.numel() // 128),)](out, x.cuda(), x.numel(), BLOCK=128, DTYPE=dtype)
    want = _uniform(x.numpy().view(np.uint32 if dtype.bits == 32 else np.uint64))
    np.testing.assert_array_equal(out.cpu().numpy(), want)
    assert out.max().item() < 1.0


@pytest.mark.cuda
def test_gpu_seeded_dropout():
    n, p, seed = 100_003, 0.3, 0xDEADBEEF
    x = torch.randn(n, generator=torch.Generator().manual_seed(6))
    out = poison(torch.empty(n, device="cuda"))
    _dropout_kernel[(-(-n // 1024),)](x.cuda(), out, n, p, seed, BLOCK=1024)
    want, keep = _dropout_reference(x, p, seed)
    assert torch.equal(out.cpu(), want)
    assert 0.69 < keep.mean() < 0.71
    again = poison(torch.empty(n, device="cuda"))
    _dropout_kernel[(-(-n // 128),)](x.cuda(), again, n, p, seed, BLOCK=128)
    assert torch.equal(again, out)
