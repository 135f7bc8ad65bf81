"""Tests of fusedops.dsl.layouts: linear layouts, blocked/slice/mma/shared layouts, conversions.

Most checks simulate what the GPU would do: every thread's registers hold the coordinates of the
elements its layout says it owns; conversions, reductions and shared-memory round trips move those
values around exactly as codegen will, and the result is compared with what the target layout says.
References (blocked layouts, mma fragments, swizzles) are written here independently, as the
arithmetic formulas of their definitions rather than as GF(2) bases.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusedops.dsl.errors import UnsupportedError
from fusedops.dsl.layouts import (
    LinearLayout, bank_conflicts, blocked, broadcast, broadcast_to, choose_swizzle, default_blocked,
    default_blocked_params, distributed, distributed_table, expand_dims, lane_shuffle_plan,
    mma_accumulator, mma_operand_a, mma_operand_b, mma_warps_per_cta, needs_shared_memory, nvmma_shared,
    reduction_plan, register_permutation, reshape, scalar_layout, shared_access_cost, shared_offsets,
    shared_vector_width, slice_layout, swizzled_shared, transpose, vector_width, wgmma_accumulator)


def _prod(values) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def _all_coords(shape):
    return set(itertools.product(*(range(s) for s in shape)))


def _owner_counts(layout) -> dict:
    counts: dict = {}
    for coords in distributed_table(layout).values():
        counts[coords] = counts.get(coords, 0) + 1
    return counts


def _assert_owns_every_element_evenly(layout):
    counts = _owner_counts(layout)
    assert set(counts) == _all_coords(layout.shape)
    assert len(set(counts.values())) == 1, "some elements are duplicated more than others"
    assert layout.is_surjective() and layout.is_injective_up_to_broadcast()


# -- LinearLayout algebra ---------------------------------------------------------------------------------

def _random_layout(rng, in_bits: dict, shape: tuple) -> LinearLayout:
    return LinearLayout({name: [tuple(rng.randrange(s) for s in shape) for _ in range(bits)]
                         for name, bits in in_bits.items()}, shape)


def _inputs(layout):
    names = layout.in_dims
    for values in itertools.product(*(range(layout.in_dim_size(n)) for n in names)):
        yield dict(zip(names, values))


@settings(max_examples=60)
@given(seed=st.integers(0, 10**6), bits=st.sampled_from([(1, 2), (2, 2), (3, 1), (0, 3)]))
def test_invert_compose_and_pseudo_invert(seed, bits):
    rng = random.Random(seed)
    shape = (1 << bits[0], 1 << bits[1])
    layout = _random_layout(rng, {"register": 1, "lane": sum(bits) - 1}, shape)
    if layout.is_bijective():
        inverse = layout.invert()
        for x in _inputs(layout):
            coords = layout.apply(**x)
            back = inverse.apply(dim0=coords[0], dim1=coords[1])
            assert back == (x["register"], x["lane"])
        assert layout.compose(inverse) == LinearLayout.identity(2, "register", "register") * \
            LinearLayout.identity(layout.num_lanes, "lane", "lane")
    else:
        with pytest.raises(ValueError):
            layout.invert()
    wide = _random_layout(rng, {"register": 2, "lane": sum(bits) + 1}, shape)
    if wide.is_surjective():
        right = wide.pseudo_invert()
        for coords in _all_coords(shape):
            image = right.apply(dim0=coords[0], dim1=coords[1])
            assert wide.apply(register=image[0], lane=image[1]) == coords
    else:
        with pytest.raises(ValueError):
            wide.pseudo_invert()


@settings(max_examples=40)
@given(seed=st.integers(0, 10**6))
def test_compose_is_function_composition(seed):
    rng = random.Random(seed)
    inner = _random_layout(rng, {"register": 2, "lane": 3}, (4, 8))
    outer = LinearLayout({"dim0": [(rng.randrange(16),) for _ in range(2)],
                          "dim1": [(rng.randrange(16),) for _ in range(3)]}, {"offset": 16})
    both = inner.compose(outer)
    for x in _inputs(inner):
        c = inner.apply(**x)
        assert both.apply(**x) == outer.apply(dim0=c[0], dim1=c[1])


def test_product_apply_equality_and_repr():
    layout = LinearLayout.identity(4, "register", "dim0") * LinearLayout.identity(32, "lane", "dim0")
    assert layout.shape == (128,)
    assert all(layout.apply(register=r, lane=l) == (r + 4 * l,) for r in range(4) for l in range(32))
    zeros = LinearLayout.zeros(4, "warp", "dim0")
    both = layout * zeros
    assert both.num_warps == 4 and both.broadcast_mask("warp") == 0b11 and both.shape == (128,)
    assert both.is_surjective() and not both.is_injective() and both.is_injective_up_to_broadcast()
    assert hash(layout) == hash(LinearLayout({"register": [(1,), (2,)], "lane": layout.bases_of("lane"),
                                              "warp": []}, (128,)))
    assert layout == LinearLayout({"register": [(1,), (2,)], "lane": layout.bases_of("lane")}, (128,))
    assert layout != LinearLayout({"register": [(2,), (1,)], "lane": layout.bases_of("lane")}, (128,))
    assert "register=[(1), (2)]" in repr(layout) and "dim0=128" in repr(layout)
    duplicated = LinearLayout({"register": [(1,)], "lane": [(1,)]}, (2,))
    assert not duplicated.is_injective_up_to_broadcast()


@pytest.mark.parametrize("bad", [
    lambda: LinearLayout({"register": [(4,)]}, (4,)),         # coordinate outside the block
    lambda: LinearLayout({"register": [(1, 0)]}, (4,)),       # wrong basis length
    lambda: LinearLayout({"register": []}, (3,)),             # not a power of two
    lambda: blocked((16,), (1,), (16,), (1,), (0,)),          # 16 threads per warp
    lambda: swizzled_shared((8, 8), vec=4, max_phase=4),      # swizzle wider than the row
    lambda: nvmma_shared((64, 32), 16, 128),                  # row narrower than a 128B atom
    lambda: mma_accumulator((8, 8), (1, 1)),                  # fewer rows than one mma tile
])
def test_invalid_layouts_raise(bad):
    with pytest.raises(ValueError):
        bad()


# -- blocked layouts ----------------------------------------------------------------------------------------

def _reference_blocked(shape, spt, tpw, wpc, order, register, lane, warp):
    """Blocked semantics by arithmetic: per-dim indices from mixed-radix digits (fastest dim first),
    coordinates wrapped modulo the block (which makes the surplus threads hold duplicates)."""
    spt = [min(s, n) for s, n in zip(spt, shape)]
    reps = [max(1, n // (s * t * w)) for n, s, t, w in zip(shape, spt, tpw, wpc)]

    def digits(index, radices):
        out = [0] * len(shape)
        for d in order:
            out[d] = index % radices[d]
            index //= radices[d]
        return out

    elem = digits(register % _prod(spt), spt)
    rep = digits(register // _prod(spt), reps)
    ln, wp = digits(lane, tpw), digits(warp, wpc)
    return tuple((((rep[d] * wpc[d] + wp[d]) * tpw[d] + ln[d]) * spt[d] + elem[d]) % shape[d]
                 for d in range(len(shape)))


@pytest.mark.parametrize("shape,spt,tpw,wpc,order", [
    ((64, 64), (1, 4), (4, 8), (4, 1), (1, 0)),
    ((64, 64), (2, 2), (8, 4), (1, 2), (0, 1)),
    ((16, 8), (1, 4), (2, 16), (4, 2), (1, 0)),      # block smaller than the CTA tile
    ((256,), (8,), (32,), (8,), (0,)),
    ((2, 8, 32), (1, 1, 4), (1, 4, 8), (2, 1, 2), (2, 1, 0)),
    ((4, 4), (8, 1), (4, 8), (1, 1), (0, 1)),        # size_per_thread larger than the block
])
def test_blocked_matches_arithmetic_definition(shape, spt, tpw, wpc, order):
    layout = blocked(shape, spt, tpw, wpc, order)
    for (r, l, w), coords in distributed_table(layout).items():
        assert coords == _reference_blocked(shape, spt, tpw, wpc, order, r, l, w)
    _assert_owns_every_element_evenly(layout)


_shapes = st.lists(st.integers(0, 7), min_size=1, max_size=3).map(
    lambda exps: tuple(1 << e for e in exps)).filter(lambda s: _prod(s) <= 4096)


@settings(max_examples=80)
@given(shape=_shapes, num_warps=st.sampled_from([1, 2, 4, 8]), bits=st.sampled_from([1, 8, 16, 32, 64]))
def test_default_blocked_owns_every_element(shape, num_warps, bits):
    layout = default_blocked(shape, num_warps, bits)
    assert layout.num_lanes == 32 and layout.num_warps == num_warps
    _assert_owns_every_element_evenly(layout)
    assert layout.num_registers == max(1, _prod(shape) // (32 * num_warps))   # no thread idles needlessly
    width = vector_width(layout, len(shape) - 1, bits)
    assert width * max(bits, 8) <= 128 and width == default_blocked_params(shape, num_warps, bits).size_per_thread[-1]


def test_default_blocked_vectors_and_small_blocks():
    assert vector_width(default_blocked((128, 64), 4, 16), 1, 16) == 8
    assert vector_width(default_blocked((128, 64), 4, 32), 1, 32) == 4
    assert vector_width(default_blocked((128, 64), 4, 16), 0, 16) == 1
    tiny = default_blocked((8,), 4, 32)              # 8 elements, 128 threads: 16 copies each
    assert tiny.num_registers == 1 and tiny.broadcast_mask("lane") == 0b11000 and tiny.broadcast_mask("warp") == 0b11
    assert _owner_counts(tiny) == {(i,): 16 for i in range(8)}
    scalar = scalar_layout(4)
    assert default_blocked((), 4, 32) == scalar
    assert scalar.shape == () and scalar.num_registers == 1 and scalar.apply(lane=31, warp=3) == ()


# -- slices and reductions ----------------------------------------------------------------------------------

_reduce_cases = [
    (default_blocked((128, 64), 4, 16), 1), (default_blocked((128, 64), 4, 16), 0),
    (default_blocked((4, 8), 4, 32), 1), (default_blocked((2, 1024), 8, 32), 1),
    (default_blocked((8, 4, 16), 2, 16), 1), (mma_accumulator((64, 32), (2, 2)), 1),
    (mma_accumulator((16, 64), (4, 1)), 0), (wgmma_accumulator((64, 64), 4), 1),
    (default_blocked((256,), 4, 32), 0),
]


def _simulate_reduction(layout, axis, values):
    """Run a ReductionPlan like codegen: registers, then lane butterflies, then across warps."""
    plan = reduction_plan(layout, axis)
    result = plan.result_layout
    threads = [(l, w) for w in range(layout.num_warps) for l in range(layout.num_lanes)]
    partial = {}
    for l, w in threads:
        regs = [values[layout.apply(register=r, lane=l, warp=w)] for r in range(layout.num_registers)]
        partial[l, w] = [sum(regs[p] for p in plan.parent_registers(j)) for j in range(result.num_registers)]
    for offset in plan.lane_xor_offsets:
        partial = {(l, w): [a + b for a, b in zip(v, partial[l ^ offset, w])] for (l, w), v in partial.items()}
    for bit in plan.warp_bits:
        partial = {(l, w): [a + b for a, b in zip(v, partial[l, w ^ (1 << bit)])] for (l, w), v in partial.items()}
    return plan, partial


@pytest.mark.parametrize("layout,axis", _reduce_cases)
def test_reduction_plan_sums_each_element_once(layout, axis, seed):
    rng = random.Random(seed)
    values = {c: rng.randrange(1000) for c in _all_coords(layout.shape)}
    expected: dict = {}
    for c, v in values.items():
        key = c[:axis] + c[axis + 1:]
        expected[key] = expected.get(key, 0) + v
    plan, partial = _simulate_reduction(layout, axis, values)
    result = plan.result_layout
    assert result == slice_layout(layout, axis)
    _assert_owns_every_element_evenly(result)
    for (l, w), regs in partial.items():
        for j, v in enumerate(regs):
            assert v == expected[result.apply(register=j, lane=l, warp=w)]
    for j in range(result.num_registers):
        assert all(plan.result_register(p) == j for p in plan.parent_registers(j))


def test_reduction_plan_bits_of_default_blocked():
    plan = reduction_plan(default_blocked((128, 64), 4, 16), 1)
    assert plan.register_bits == (0, 1, 2) and plan.lane_bits == (0, 1, 2) and plan.warp_bits == ()
    assert plan.lane_xor_offsets == (1, 2, 4) and plan.kept_register_bits == (3, 4, 5)
    plan0 = reduction_plan(default_blocked((128, 64), 4, 16), 0)
    assert plan0.lane_bits == (3, 4) and plan0.warp_bits == (0, 1) and plan0.register_bits == (3, 4, 5)


def test_reduction_rejects_mixed_bases():
    mixed = distributed((2, 2), [(0, 1)], [(1, 1), (0, 0), (0, 0), (0, 0), (0, 0)], [])
    with pytest.raises(UnsupportedError):
        reduction_plan(mixed, 0)


# -- shape ops: relabelings, checked by moving registers --------------------------------------------------

def _check_relabel(src, dst, perm):
    """dst register i of every thread must be src register perm[i] (dims of size 1 in src broadcast)."""
    assert perm is not None
    keep = [s != 1 for s in src.shape]
    for (r, l, w), coords in distributed_table(dst).items():
        projected = tuple(c if k else 0 for c, k in zip(coords, keep))
        assert src.apply(register=perm[r], lane=l, warp=w) == projected


@pytest.mark.parametrize("layout", [default_blocked((32, 64), 4, 16), mma_accumulator((32, 32), (2, 2)),
                                    default_blocked((4, 8, 16), 2, 32)])
def test_transpose_reshape_expand_are_register_relabelings(layout):
    rank = layout.rank
    order = tuple(reversed(range(rank)))
    t = transpose(layout, order)
    for (r, l, w), coords in distributed_table(layout).items():
        assert t.apply(register=r, lane=l, warp=w) == tuple(coords[d] for d in order)
    flat = reshape(layout, (layout.numel,))
    strides = [_prod(layout.shape[d + 1:]) for d in range(rank)]
    for (r, l, w), coords in distributed_table(layout).items():
        assert flat.apply(register=r, lane=l, warp=w) == (sum(c * s for c, s in zip(coords, strides)),)
    assert reshape(flat, layout.shape) == layout
    e = expand_dims(layout, 1)
    assert e.shape == layout.shape[:1] + (1,) + layout.shape[1:]
    assert slice_layout(e, 1) == layout


@pytest.mark.parametrize("parent", [default_blocked((64, 32), 4, 32), mma_accumulator((64, 64), (2, 2)),
                                    default_blocked((4, 16), 4, 16)])
def test_broadcast_after_reduction_is_register_gather(parent):
    for axis in (0, 1):
        operand = expand_dims(slice_layout(parent, axis), axis)
        _check_relabel(operand, parent, register_permutation(operand, parent))
        grown = broadcast(operand, axis, parent.shape[axis])
        assert grown.shape == parent.shape and grown.is_surjective() and grown.is_injective_up_to_broadcast()
        _check_relabel(operand, grown, register_permutation(operand, grown))
    assert broadcast_to(expand_dims(slice_layout(parent, 1), 1), parent.shape).shape == parent.shape


# -- tensor-core layouts against the PTX ISA -------------------------------------------------------------

def _ptx_c(lane, i):        # PTX ISA 9.7.14.5.8, accumulator C/D of m16n8k16
    return (lane >> 2) + 8 * (i >> 1), 2 * (lane % 4) + (i & 1)


def _ptx_a(lane, i):        # multiplicand A, .f16/.bf16
    return (lane >> 2) + 8 * ((i >> 1) & 1), 2 * (lane % 4) + (i & 1) + 8 * (i >> 2)


def _ptx_b(lane, i):        # multiplicand B, .f16/.bf16
    return 2 * (lane % 4) + (i & 1) + 8 * (i >> 1), lane >> 2


def test_mma_fragments_hand_checked_threads():
    acc, a, b = mma_accumulator((16, 8), (1, 1)), mma_operand_a((16, 16), (1, 1)), mma_operand_b((16, 8), (1, 1))
    assert [acc.apply(register=i, lane=0) for i in range(4)] == [(0, 0), (0, 1), (8, 0), (8, 1)]
    assert [acc.apply(register=i, lane=5) for i in range(4)] == [(1, 2), (1, 3), (9, 2), (9, 3)]
    assert [a.apply(register=i, lane=5) for i in range(8)] == [(1, 2), (1, 3), (9, 2), (9, 3),
                                                              (1, 10), (1, 11), (9, 10), (9, 11)]
    assert [b.apply(register=i, lane=5) for i in range(4)] == [(2, 1), (3, 1), (10, 1), (11, 1)]
    for layout, formula, count in ((acc, _ptx_c, 4), (a, _ptx_a, 8), (b, _ptx_b, 4)):
        assert layout.num_registers == count and layout.is_bijective()
        for lane in range(32):
            assert [layout.apply(register=i, lane=lane) for i in range(count)] == \
                [formula(lane, i) for i in range(count)]


@pytest.mark.parametrize("m,n,k,wm,wn", [(64, 64, 32, 2, 2), (128, 32, 16, 4, 1), (16, 64, 64, 1, 4),
                                         (16, 16, 16, 4, 1)])
def test_mma_tiles_warps_and_repetitions(m, n, k, wm, wn):
    acc, a, b = mma_accumulator((m, n), (wm, wn)), mma_operand_a((m, k), (wm, wn)), mma_operand_b((k, n), (wm, wn))
    rep_m, rep_n, rep_k = max(1, m // (16 * wm)), max(1, n // (8 * wn)), k // 16
    for w in range(wm * wn):
        wi, wj = w % wm, w // wm
        for lane in range(32):
            for i, j, c in itertools.product(range(rep_m), range(rep_n), range(4)):
                row, col = _ptx_c(lane, c)
                expect = ((row + 16 * (wi + wm * i)) % m, (col + 8 * (wj + wn * j)) % n)
                assert acc.apply(register=c + 4 * (j + rep_n * i), lane=lane, warp=w) == expect
            for i, kk, e in itertools.product(range(rep_m), range(rep_k), range(8)):
                row, col = _ptx_a(lane, e)
                expect = ((row + 16 * (wi + wm * i)) % m, col + 16 * kk)
                assert a.apply(register=e + 8 * (kk + rep_k * i), lane=lane, warp=w) == expect
            for kk, j, e in itertools.product(range(rep_k), range(rep_n), range(4)):
                row, col = _ptx_b(lane, e)
                expect = (row + 16 * kk, (col + 8 * (wj + wn * j)) % n)
                assert b.apply(register=e + 4 * (kk + rep_k * j), lane=lane, warp=w) == expect
    for layout in (acc, a, b):
        _assert_owns_every_element_evenly(layout)
    assert mma_warps_per_cta((m, n), wm * wn)[0] * mma_warps_per_cta((m, n), wm * wn)[1] == wm * wn


def test_wgmma_accumulator_matches_ptx():
    layout = wgmma_accumulator((64, 16), 4)       # PTX ISA 9.7.15.5.1.1.1, m64n16k16, f32 accumulator
    assert layout.num_registers == 8
    assert [layout.apply(register=i, lane=5, warp=2) for i in range(8)] == [
        (33, 2), (33, 3), (41, 2), (41, 3), (33, 10), (33, 11), (41, 10), (41, 11)]
    for w, lane, i in itertools.product(range(4), range(32), range(8)):
        expect = (16 * w + (lane >> 2) + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * (lane % 4) + (i & 1))
        assert layout.apply(register=i, lane=lane, warp=w) == expect
    big = wgmma_accumulator((256, 512), 8)       # 2 warpgroups along M, instr_n 256, repeats on both dims
    assert big.is_bijective() and big.num_registers == 512
    assert big.apply(warp=4) == (64, 0) and big.apply(register=128) == (0, 256) and big.apply(register=256) == (128, 0)
    _assert_owns_every_element_evenly(wgmma_accumulator((64, 32), 8))       # the second warpgroup duplicates


# -- shared memory: swizzles and bank conflicts ------------------------------------------------------------

@pytest.mark.parametrize("shape,vec,per_phase,max_phase,order", [
    ((32, 64), 8, 1, 8, (1, 0)), ((64, 32), 4, 2, 4, (1, 0)), ((16, 16), 1, 1, 16, (0, 1)),
    ((4, 16, 32), 2, 4, 8, (2, 1, 0)), ((128,), 1, 1, 1, (0,)), ((8, 8), 8, 1, 1, (1, 0)),
])
def test_swizzled_shared_is_the_xor_formula_and_a_bijection(shape, vec, per_phase, max_phase, order):
    layout = swizzled_shared(shape, vec, per_phase, max_phase, order)
    assert layout.is_bijective()
    inverse = layout.invert()
    cols = shape[order[0]]
    for coords in _all_coords(shape):
        col = coords[order[0]]
        row = coords[order[1]] if len(shape) > 1 else 0
        phase = (row // per_phase) % max_phase
        swizzled = ((col // vec) ^ phase) * vec + col % vec
        outer = coords[order[2]] if len(shape) > 2 else 0
        rows = shape[order[1]] if len(shape) > 1 else 1
        expect = (outer * rows + row) * cols + swizzled
        assert inverse.apply(**{f"dim{d}": c for d, c in enumerate(coords)}) == (expect,)


@pytest.mark.parametrize("swizzle_bytes,element_bits", [(128, 16), (64, 16), (32, 16), (128, 32), (128, 8)])
def test_nvmma_shared_matches_byte_swizzle(swizzle_bytes, element_bits):
    """TMA/wgmma swizzle on byte addresses: chunk bits [4, 4+b) ^= bits [7, 7+b), b = log2(bytes/16)."""
    size = element_bits // 8
    atom = swizzle_bytes // size
    shape = (16, 2 * atom)
    inverse = nvmma_shared(shape, element_bits, swizzle_bytes).invert()
    mask = swizzle_bytes // 16 - 1
    for r, c in _all_coords(shape):
        plain = (c // atom) * shape[0] * swizzle_bytes + r * swizzle_bytes + (c % atom) * size
        expect = plain ^ (((plain >> 7) & mask) << 4)
        assert inverse.apply(dim0=r, dim1=c)[0] * size == expect


def _reference_wavefronts(layout, shared, element_bits, width):
    """Independent bank model over every warp and every register group: wavefronts, phases."""
    size = max(element_bits, 8) // 8
    inverse = shared.invert()
    lanes_per_phase = 32 if width * size <= 4 else 128 // (width * size)
    total = phases = 0
    for w in range(layout.num_warps):
        for g in range(layout.num_registers // width):
            addresses = []
            for lane in range(32):
                coords = layout.apply(register=g * width, lane=lane, warp=w)
                addresses.append(inverse.apply(**{f"dim{d}": c for d, c in enumerate(coords)})[0] * size)
            for p in range(0, 32, lanes_per_phase):
                banks: dict = {}
                for a in addresses[p:p + lanes_per_phase]:
                    for byte in range(a, a + width * size, 4):
                        banks.setdefault((byte // 4) % 32, set()).add(byte // 4)
                total += max(len(s) for s in banks.values())
                phases += 1
    return total // layout.num_warps, phases // layout.num_warps


def test_bank_conflicts_hand_cases():
    rows = blocked((32, 32), (1, 1), (32, 1), (1, 1), (1, 0))   # lane l holds row l: a column per access
    cols = blocked((32, 32), (1, 1), (1, 32), (1, 1), (1, 0))   # lane l holds column l: a row per access
    plain = swizzled_shared((32, 32))
    assert bank_conflicts(cols, plain, 32) == 0
    assert bank_conflicts(rows, plain, 32, vector_width=1) == 31 * 32   # 32-way conflict, 32 accesses
    assert bank_conflicts(rows, plain, 32) == 7 * 4 * 8          # 16 B vectors: 8-way in each quarter warp
    assert bank_conflicts(rows, swizzled_shared((32, 32), 1, 1, 32), 32) == 0
    assert bank_conflicts(rows, plain, 16, vector_width=1) == 15 * 32   # fp16: 2 rows share a bank line
    with pytest.raises(ValueError):
        bank_conflicts(rows, swizzled_shared((32, 32), 1, 1, 32), 32, vector_width=2)
    cost = shared_access_cost(default_blocked((128, 64), 4, 16), swizzled_shared((128, 64)), 16)
    assert cost.vector_width == 8 and cost.accesses == 8 and cost.conflicts == 0


_conversion_pairs = [
    ("blocked->mmaA", default_blocked((128, 64), 4, 16), mma_operand_a((128, 64), (4, 1)), 16),
    ("blocked->mmaB", default_blocked((64, 128), 4, 16), mma_operand_b((64, 128), (2, 2)), 16),
    ("mma->blocked", mma_accumulator((64, 128), (2, 2)), default_blocked((64, 128), 4, 32), 32),
    ("wgmma->blocked", wgmma_accumulator((64, 128), 4), default_blocked((64, 128), 4, 16), 16),
    ("blocked->transposed", default_blocked((64, 64), 4, 16),
     transpose(default_blocked((64, 64), 4, 16), (1, 0)), 16),
    ("rows->cols", blocked((32, 32), (1, 1), (32, 1), (1, 1), (1, 0)),
     blocked((32, 32), (1, 1), (1, 32), (1, 1), (1, 0)), 32),
]


@pytest.mark.parametrize("name,src,dst,bits", _conversion_pairs, ids=[p[0] for p in _conversion_pairs])
def test_conversion_through_shared_memory(name, src, dst, bits):
    choice = choose_swizzle(src, dst, bits)
    shared = choice.layout
    assert shared.is_bijective()
    memory = {}
    offsets_src, offsets_dst = shared_offsets(src, shared), shared_offsets(dst, shared)
    for (r, l, w), coords in distributed_table(src).items():
        offset = offsets_src.apply(register=r, lane=l, warp=w)[0]
        assert memory.setdefault(offset, coords) == coords
        assert shared.apply(offset=offset) == coords
    for (r, l, w), coords in distributed_table(dst).items():
        assert memory[offsets_dst.apply(register=r, lane=l, warp=w)[0]] == coords
    for layout, cost in ((src, choice.store), (dst, choice.load)):
        assert cost.vector_width == shared_vector_width(layout, shared, bits)
        assert (cost.wavefronts, cost.ideal_wavefronts) == \
            _reference_wavefronts(layout, shared, bits, cost.vector_width)
        assert cost.conflicts == 0, f"{name}: bank conflicts {cost}"
    if name in ("blocked->mmaA", "mma->blocked"):
        assert choice.store.vector_width * bits == 128 or choice.load.vector_width * bits == 128


# -- conversions that stay in registers or in a warp --------------------------------------------------------

def _simulate_shuffle(src, dst, plan):
    for (r, l, w), coords in distributed_table(dst).items():
        assert src.apply(register=plan.src_registers[r], lane=plan.source_lane(l, r), warp=w) == coords


def test_register_permutation_and_shuffles():
    acc = mma_accumulator((32, 32), (2, 2))
    shuffled = acc.with_bases(register=list(reversed(acc.bases_of("register"))))
    perm = register_permutation(acc, shuffled)
    _check_relabel(acc, shuffled, perm)
    assert sorted(perm) == list(range(acc.num_registers)) and not needs_shared_memory(acc, shuffled)
    assert register_permutation(acc, acc) == tuple(range(acc.num_registers))

    src = blocked((32, 32), (1, 4), (4, 8), (1, 1), (1, 0))                    # one warp
    dst = src.with_bases(lane=list(reversed(src.bases_of("lane"))))           # lanes permuted
    assert register_permutation(src, dst) is None
    plan = lane_shuffle_plan(src, dst)
    assert plan is not None and not plan.lane_matrix_is_identity and not needs_shared_memory(src, dst)
    _simulate_shuffle(src, dst, plan)

    # dst register 1 of lane l is src register 1 of lane l ^ 1: a shuffle with a per-register lane xor
    registers = list(src.bases_of("register"))
    registers[0] = tuple(a ^ b for a, b in zip(registers[0], src.bases_of("lane")[0]))
    neighbour = src.with_bases(register=registers)
    plan = lane_shuffle_plan(src, neighbour)
    assert plan is not None and plan.lane_matrix_is_identity and plan.lane_xor[1] == 1
    _simulate_shuffle(src, neighbour, plan)

    rows = blocked((32, 32), (1, 1), (32, 1), (1, 1), (1, 0))
    cols = blocked((32, 32), (1, 1), (1, 32), (1, 1), (1, 0))
    assert lane_shuffle_plan(rows, cols) is None and needs_shared_memory(rows, cols)  # register depends on lane

    a = default_blocked((64, 64), 4, 16)
    b = transpose(default_blocked((64, 64), 4, 16), (1, 0))
    assert lane_shuffle_plan(a, b) is None and needs_shared_memory(a, b)       # crosses warps


@settings(max_examples=40)
@given(shape=_shapes.filter(lambda s: len(s) >= 2), num_warps=st.sampled_from([1, 2, 4]),
       bits=st.sampled_from([16, 32]), seed=st.integers(0, 10**6))
def test_any_conversion_plan_preserves_values(shape, num_warps, bits, seed):
    rng = random.Random(seed)
    src = default_blocked(shape, num_warps, bits)
    warp_bases = list(src.bases_of("warp"))
    lane_bases = list(src.bases_of("lane"))
    rng.shuffle(lane_bases)
    register_bases = list(src.bases_of("register"))
    rng.shuffle(register_bases)
    dst = src.with_bases(register=register_bases, lane=lane_bases, warp=warp_bases)
    perm = register_permutation(src, dst)
    plan = lane_shuffle_plan(src, dst)
    if perm is not None:
        _check_relabel(src, dst, perm)
    else:
        assert plan is not None            # only registers and lanes moved, within each warp
        _simulate_shuffle(src, dst, plan)
    assert not needs_shared_memory(src, dst)
