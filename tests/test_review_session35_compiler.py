"""Review (session 35) of three compiler changes: the TMA store's proxy fence narrowed where the other generic loads
read other kernel arguments (7aa5dcc: passes/descriptors.py `_generic_global_access_may_precede` with
passes/pointer_roots.py), `dsl.sigmoid`'s approximate reciprocal (b5717a7: the DIV op's `approx` attr), and the
persistent matmul's DEFERRED_STORE (7aa5dcc: kernels/matmul_persistent.py).

CPU only: sm_90a PTX and post-pass IR of small kernels (the TMA stores' `fence_global` attr and the fences before
each bulk copy), ptxas where it is installed, and the interpreter against float64 torch.

Defects found (fixed the same session; their tests, under "-- defects --", now pass): a pointer offset computed
from the stored tensor's address escaped pointer_roots (now: unknown roots); the exemption for loads the stored
block is computed from trusted an IR dependency LLVM can erase (now: every load through the stored argument keeps
the full fence); the README did not state the no-overlap assumption for TMA stores (now it does).
"""

from __future__ import annotations

import pathlib
import re

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels import matmul as mm
from fusedops.kernels import matmul_configs
from fusedops.kernels.matmul_configs import WGMMA_CONFIGS
from fusedops.kernels import matmul_persistent as mp
from helpers import poison
from matmul_helpers import reference as _mm_reference

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")

_COPY = re.compile(r"cp\.(?:reduce\.)?async\.bulk\.tensor\.2d\.global\.shared::cta")
_FULL_FENCE = re.compile(r"fence\.proxy\.async\s*;")


# =====================================================================================================
# 1. The TMA store's proxy fence
# =====================================================================================================

def _fence_global(compiled) -> dict:
    """{stored pointer argument: [fence_global of each of its TMA stores]} from the post-pass IR."""
    found = {}
    for line in compiled.asm["ir"].splitlines():
        match = re.search(r"tma_store %\S+, %(\w+),.*fence_global=(True|False)", line)
        if match:
            found.setdefault(match.group(1), []).append(match.group(2) == "True")
    return found


def _full_fence_before_first_copy(ptx: str) -> bool:
    first = _COPY.search(ptx)
    assert first, "no TMA store in the PTX"
    return bool(_FULL_FENCE.search(ptx[:first.start()]))


_T = dict(target="sm_90a", BLOCK_R=32, BLOCK_C=32)


def _tensors(dtype=torch.float32):
    return tuple(torch.zeros(256, 256, dtype=dtype) for _ in range(3))


@dsl.jit
def _box(BLOCK_R: dsl.constexpr, BLOCK_C: dsl.constexpr, stride_r):
    return dsl.arange(0, BLOCK_R)[:, None] * stride_r + dsl.arange(0, BLOCK_C)[None, :]


@dsl.jit
def _store_both(y_ptr, z_ptr, tile, old, rows, cols, stride_r, BLOCK_R: dsl.constexpr, BLOCK_C: dsl.constexpr):
    # the TMA stores most kernels below end with: `tile` into y's box (0, 0), then `old` into z's
    dsl.make_tensor_descriptor(y_ptr, (rows, cols), (stride_r, 1), (BLOCK_R, BLOCK_C)).store((0, 0), tile)
    dsl.make_tensor_descriptor(z_ptr, (rows, cols), (stride_r, 1), (BLOCK_R, BLOCK_C)).store((0, 0), old)


# Every kernel below stores a tile of x into y's box (0, 0) with a TMA store (y's store comes first in the
# IR and the PTX), and `old` (a load that y's block is not computed from) into z. Where `old` may read y,
# y's store needs the fence of every state space.

@dsl.jit
def _where_scalar_pointer(y_ptr, x_ptr, z_ptr, sel, rows, cols, stride_r, BLOCK_R: dsl.constexpr,
                          BLOCK_C: dsl.constexpr):
    offs = _box(BLOCK_R, BLOCK_C, stride_r)
    old = dsl.load(dsl.where(sel > 0, y_ptr, x_ptr) + offs)
    tile = dsl.load(x_ptr + offs)
    _store_both(y_ptr, z_ptr, tile, old, rows, cols, stride_r, BLOCK_R, BLOCK_C)


@dsl.jit
def _where_block_pointer(y_ptr, x_ptr, z_ptr, sel, rows, cols, stride_r, BLOCK_R: dsl.constexpr,
                         BLOCK_C: dsl.constexpr):
    # a block of pointers, each element choosing y or x
    offs = _box(BLOCK_R, BLOCK_C, stride_r)
    pick = (dsl.arange(0, BLOCK_C)[None, :] + sel) % 2 == 0
    old = dsl.load(dsl.where(pick, y_ptr + offs, x_ptr + offs))
    tile = dsl.load(x_ptr + offs)
    _store_both(y_ptr, z_ptr, tile, old, rows, cols, stride_r, BLOCK_R, BLOCK_C)


@dsl.jit
def _if_pointer(y_ptr, x_ptr, z_ptr, sel, rows, cols, stride_r, BLOCK_R: dsl.constexpr, BLOCK_C: dsl.constexpr):
    offs = _box(BLOCK_R, BLOCK_C, stride_r)
    p = x_ptr
    if sel > 0:
        p = y_ptr
    old = dsl.load(p + offs)
    tile = dsl.load(x_ptr + offs)
    _store_both(y_ptr, z_ptr, tile, old, rows, cols, stride_r, BLOCK_R, BLOCK_C)


@dsl.jit
def _swapped_in_loop(y_ptr, x_ptr, z_ptr, n, rows, cols, stride_r, BLOCK_R: dsl.constexpr, BLOCK_C: dsl.constexpr):
    # p starts at x and becomes y on odd trips (carried through the loop, swapped with q)
    offs = _box(BLOCK_R, BLOCK_C, stride_r)
    p = x_ptr
    q = y_ptr
    old = dsl.zeros((BLOCK_R, BLOCK_C), dsl.float32)
    for i in range(0, n):
        old = old + dsl.load(p + offs)
        t = p
        p = q
        q = t
    tile = dsl.load(x_ptr + offs)
    _store_both(y_ptr, z_ptr, tile, old, rows, cols, stride_r, BLOCK_R, BLOCK_C)


@dsl.jit
def _advanced_in_loop(y_ptr, x_ptr, z_ptr, n, rows, cols, stride_r, BLOCK_R: dsl.constexpr,
                      BLOCK_C: dsl.constexpr):
    # a pointer block advanced every trip from y's base (Triton's `ptrs += step`), read before and after the
    # stores of each trip
    offs = _box(BLOCK_R, BLOCK_C, stride_r)
    ptrs = y_ptr + offs
    old = dsl.zeros((BLOCK_R, BLOCK_C), dsl.float32)
    for i in range(0, n):
        tile = dsl.load(x_ptr + offs) + i
        dsl.make_tensor_descriptor(y_ptr, (rows, cols), (stride_r, 1), (BLOCK_R, BLOCK_C)).store((0, 0), tile)
        old = old + dsl.load(ptrs)
        ptrs += BLOCK_C
    dsl.make_tensor_descriptor(z_ptr, (rows, cols), (stride_r, 1), (BLOCK_R, BLOCK_C)).store((0, 0), old)


@dsl.jit
def _while_pointer(y_ptr, x_ptr, z_ptr, n, rows, cols, stride_r, BLOCK_R: dsl.constexpr, BLOCK_C: dsl.constexpr):
    offs = _box(BLOCK_R, BLOCK_C, stride_r)
    p = x_ptr
    j = 0
    while j < n:
        p = y_ptr
        j += 1
    old = dsl.load(p + offs)
    tile = dsl.load(x_ptr + offs)
    _store_both(y_ptr, z_ptr, tile, old, rows, cols, stride_r, BLOCK_R, BLOCK_C)


@dsl.jit
def _pointer_from_memory(y_ptr, x_ptr, z_ptr, table_ptr, rows, cols, stride_r, BLOCK_R: dsl.constexpr,
                         BLOCK_C: dsl.constexpr):
    offs = _box(BLOCK_R, BLOCK_C, stride_r)
    p = dsl.load(table_ptr).to(dsl.pointer_type(dsl.float32))        # an address read from memory (y's)
    old = dsl.load(p + offs)
    tile = dsl.load(x_ptr + offs)
    _store_both(y_ptr, z_ptr, tile, old, rows, cols, stride_r, BLOCK_R, BLOCK_C)


@dsl.jit
def _pointer_through_int64(y_ptr, x_ptr, z_ptr, rows, cols, stride_r, BLOCK_R: dsl.constexpr,
                           BLOCK_C: dsl.constexpr):
    offs = _box(BLOCK_R, BLOCK_C, stride_r)
    p = (y_ptr.to(dsl.int64) + 0).to(dsl.pointer_type(dsl.float32))     # y's address as an int64, and back
    old = dsl.load(p + offs)
    tile = dsl.load(x_ptr + offs)
    _store_both(y_ptr, z_ptr, tile, old, rows, cols, stride_r, BLOCK_R, BLOCK_C)


@dsl.jit
def _offset_from_pointers(y_ptr, x_ptr, z_ptr, rows, cols, stride_r, BLOCK_R: dsl.constexpr, BLOCK_C: dsl.constexpr):
    # x's base plus the distance from x to y in elements (int64 arithmetic on the two addresses): y's box
    offs = _box(BLOCK_R, BLOCK_C, stride_r)
    to_y = (y_ptr.to(dsl.int64) - x_ptr.to(dsl.int64)) // 4
    old = dsl.load(x_ptr + to_y + offs)
    tile = dsl.load(x_ptr + offs)
    _store_both(y_ptr, z_ptr, tile, old, rows, cols, stride_r, BLOCK_R, BLOCK_C)


@dsl.jit
def _second_descriptor(y_ptr, x_ptr, z_ptr, rows, cols, stride_r, BLOCK_R: dsl.constexpr, BLOCK_C: dsl.constexpr):
    # y's box (0, 0) read through a second descriptor of y, then overwritten
    offs = _box(BLOCK_R, BLOCK_C, stride_r)
    old = dsl.make_tensor_descriptor(y_ptr, (rows, cols), (stride_r, 1), (BLOCK_R, BLOCK_C)).load((0, 0))
    tile = dsl.load(x_ptr + offs)
    _store_both(y_ptr, z_ptr, tile, old, rows, cols, stride_r, BLOCK_R, BLOCK_C)


@dsl.jit
def _same_argument_other_offset(y_ptr, x_ptr, z_ptr, rows, cols, stride_r, BLOCK_R: dsl.constexpr,
                                BLOCK_C: dsl.constexpr):
    # a plain load of y four columns on: it overlaps the stored box
    offs = _box(BLOCK_R, BLOCK_C, stride_r)
    old = dsl.load(y_ptr + 4 + offs)
    tile = dsl.load(x_ptr + offs)
    _store_both(y_ptr, z_ptr, tile, old, rows, cols, stride_r, BLOCK_R, BLOCK_C)


@dsl.jit
def _load_in_if(y_ptr, x_ptr, z_ptr, sel, rows, cols, stride_r, BLOCK_R: dsl.constexpr, BLOCK_C: dsl.constexpr):
    offs = _box(BLOCK_R, BLOCK_C, stride_r)
    old = dsl.zeros((BLOCK_R, BLOCK_C), dsl.float32)
    if sel > 0:
        old = dsl.load(y_ptr + offs)
    tile = dsl.load(x_ptr + offs)
    _store_both(y_ptr, z_ptr, tile, old, rows, cols, stride_r, BLOCK_R, BLOCK_C)


@dsl.jit
def _load_after_store_in_loop(y_ptr, x_ptr, z_ptr, n, rows, cols, stride_r, BLOCK_R: dsl.constexpr,
                              BLOCK_C: dsl.constexpr):
    # the load of y comes after the store in the body, so before the next trip's store
    offs = _box(BLOCK_R, BLOCK_C, stride_r)
    old = dsl.zeros((BLOCK_R, BLOCK_C), dsl.float32)
    for i in range(0, n):
        tile = dsl.load(x_ptr + offs) + i
        dsl.make_tensor_descriptor(y_ptr, (rows, cols), (stride_r, 1), (BLOCK_R, BLOCK_C)).store((0, 0), tile)
        if i % 2 == 0:
            old = old + dsl.load(y_ptr + offs)
    dsl.make_tensor_descriptor(z_ptr, (rows, cols), (stride_r, 1), (BLOCK_R, BLOCK_C)).store((0, 0), old)


@dsl.jit
def _bulk_add_after_selected_load(y_ptr, x_ptr, z_ptr, sel, rows, cols, stride_r, BLOCK_R: dsl.constexpr,
                                  BLOCK_C: dsl.constexpr):
    # desc.atomic_add: a bulk reduction (cp.reduce.async.bulk.tensor) into y
    offs = _box(BLOCK_R, BLOCK_C, stride_r)
    p = x_ptr
    if sel > 0:
        p = y_ptr
    old = dsl.load(p + offs)
    tile = dsl.load(x_ptr + offs)
    dsl.make_tensor_descriptor(y_ptr, (rows, cols), (stride_r, 1), (BLOCK_R, BLOCK_C)).atomic_add((0, 0), tile)
    dsl.make_tensor_descriptor(z_ptr, (rows, cols), (stride_r, 1), (BLOCK_R, BLOCK_C)).store((0, 0), old)


@dsl.jit
def _reshaped_pointers(y_ptr, x_ptr, z_ptr, rows, cols, stride_r, BLOCK_R: dsl.constexpr, BLOCK_C: dsl.constexpr):
    # y's pointers through trans, reshape and broadcast before the load
    offs = _box(BLOCK_R, BLOCK_C, stride_r)
    ptrs = dsl.reshape(dsl.trans(y_ptr + offs), (BLOCK_C, BLOCK_R))
    old = dsl.trans(dsl.load(ptrs))
    tile = dsl.load(x_ptr + offs)
    _store_both(y_ptr, z_ptr, tile, old, rows, cols, stride_r, BLOCK_R, BLOCK_C)


_MAY_READ_Y = [
    ("where scalar pointer", _where_scalar_pointer, lambda y, x, z: (y, x, z, 3)),
    ("where block pointer", _where_block_pointer, lambda y, x, z: (y, x, z, 3)),
    ("if pointer", _if_pointer, lambda y, x, z: (y, x, z, 3)),
    ("swapped in loop", _swapped_in_loop, lambda y, x, z: (y, x, z, 5)),
    ("advanced in loop", _advanced_in_loop, lambda y, x, z: (y, x, z, 5)),
    ("while pointer", _while_pointer, lambda y, x, z: (y, x, z, 5)),
    ("pointer from memory", _pointer_from_memory, lambda y, x, z: (y, x, z, torch.zeros(1, dtype=torch.int64))),
    ("pointer through int64", _pointer_through_int64, lambda y, x, z: (y, x, z)),
    ("second descriptor", _second_descriptor, lambda y, x, z: (y, x, z)),
    ("same argument other offset", _same_argument_other_offset, lambda y, x, z: (y, x, z)),
    ("load in if", _load_in_if, lambda y, x, z: (y, x, z, 3)),
    ("load after store in loop", _load_after_store_in_loop, lambda y, x, z: (y, x, z, 5)),
    ("bulk add after selected load", _bulk_add_after_selected_load, lambda y, x, z: (y, x, z, 3)),
    ("reshaped pointers", _reshaped_pointers, lambda y, x, z: (y, x, z)),
]


@pytest.mark.parametrize("name, kernel, args", _MAY_READ_Y, ids=[case[0] for case in _MAY_READ_Y])
def test_a_load_that_may_read_the_stored_tensor_keeps_the_full_fence(tma_ws0, name, kernel, args):
    compiled = kernel.compile(*args(*_tensors()), 256, 256, 256, **_T)
    fences = _fence_global(compiled)
    assert fences["y_ptr"] == [True], fences
    assert _full_fence_before_first_copy(compiled.asm["ptx"]), name


@dsl.jit
def _other_arguments_only(y_ptr, x_ptr, w_ptr, z_ptr, n, rows, cols, stride_r, BLOCK_R: dsl.constexpr,
                          BLOCK_C: dsl.constexpr):
    # loads of x and w only (selected, carried through a loop, in an if), stored into y and z
    offs = _box(BLOCK_R, BLOCK_C, stride_r)
    p = x_ptr
    extra = dsl.zeros((BLOCK_R, BLOCK_C), dsl.float32)
    for i in range(0, n):
        if i % 2 == 1:
            extra = extra + dsl.load(dsl.where(i > 2, p, w_ptr) + offs)
        p = w_ptr
    tile = dsl.load(x_ptr + offs)
    dsl.make_tensor_descriptor(y_ptr, (rows, cols), (stride_r, 1), (BLOCK_R, BLOCK_C)).store((0, 0), tile)
    dsl.make_tensor_descriptor(z_ptr, (rows, cols), (stride_r, 1), (BLOCK_R, BLOCK_C)).atomic_add((0, 0), extra)


def test_loads_of_other_arguments_only_narrow_the_fence_of_store_and_bulk_add(tma_ws0):
    y, x, z = _tensors()
    compiled = _other_arguments_only.compile(y, x, torch.zeros_like(x), z, 5, 256, 256, 256, **_T)
    assert _fence_global(compiled) == {"y_ptr": [False], "z_ptr": [False]}
    ptx = compiled.asm["ptx"]
    assert len(_COPY.findall(ptx)) == 2 and not _FULL_FENCE.search(ptx)


@dsl.jit
def _generic_write_elsewhere(y_ptr, x_ptr, z_ptr, w_ptr, rows, cols, stride_r, KIND: dsl.constexpr,
                             BLOCK_R: dsl.constexpr, BLOCK_C: dsl.constexpr):
    offs = _box(BLOCK_R, BLOCK_C, stride_r)
    tile = dsl.load(x_ptr + offs)
    if KIND == "store":
        dsl.store(z_ptr + offs, tile)
    elif KIND == "atomic":
        dsl.atomic_add(z_ptr + offs, tile)
    else:       # a descriptor store the copy engine cannot take (8-byte elements): masked st.global
        dsl.make_tensor_descriptor(w_ptr, (rows, cols), (stride_r, 1), (BLOCK_R, BLOCK_C)).store((0, 0), tile)
    dsl.make_tensor_descriptor(y_ptr, (rows, cols), (stride_r, 1), (BLOCK_R, BLOCK_C)).store((0, 0), tile)


@pytest.mark.parametrize("kind", ["store", "atomic", "descriptor fallback"])
def test_a_generic_write_of_any_argument_keeps_the_full_fence(tma_ws0, kind):
    y, x, z = _tensors()
    compiled = _generic_write_elsewhere.compile(y, x, z, torch.zeros(256, 256, dtype=torch.float64), 256, 256, 256,
                                                KIND=kind, **_T)
    assert _fence_global(compiled) == {"y_ptr": [True]}
    assert _full_fence_before_first_copy(compiled.asm["ptx"])


@pytest.mark.parametrize("name, kernel, args", [case for case in _MAY_READ_Y if case[0] in (
    "where scalar pointer", "where block pointer", "swapped in loop", "second descriptor", "load in if")],
    ids=lambda v: v if isinstance(v, str) else "")
def test_interpreter_values_of_the_fence_kernels(name, kernel, args, seed):
    # the interpreter has no proxies; its values say what the kernels mean: z gets what `old` read of y before
    # y's box was overwritten with x's
    generator = torch.Generator().manual_seed(seed)
    y, x = torch.randn(64, 64, generator=generator), torch.randn(64, 64, generator=generator)
    z = poison(torch.empty(64, 64))
    y0 = y.clone()
    kernel[(1,)](*args(y, x, z), 64, 64, 64, BLOCK_R=32, BLOCK_C=32, interpret=True)
    box = (slice(0, 32), slice(0, 32))
    assert torch.equal(y[box], x[box]) and torch.equal(y[32:], y0[32:]) and torch.equal(y[:, 32:], y0[:, 32:])
    if name == "where scalar pointer" or name == "second descriptor" or name == "load in if":
        expected = y0[box]
    elif name == "where block pointer":        # from y where (col + sel) % 2 == 0, sel = 3
        expected = torch.where((torch.arange(32)[None, :] + 3) % 2 == 0, y0[box], x[box])
    else:                                      # swapped in loop, 5 trips: x, y, x, y, x
        expected = 3 * x[box] + 2 * y0[box]
    torch.testing.assert_close(z[box], expected, rtol=1e-6, atol=1e-6)
    assert z[32:].isnan().all() and z[:, 32:].isnan().all()


# -- defects (fixed) --

def test_a_pointer_offset_computed_from_the_stored_argument_keeps_the_full_fence(tma_ws0):
    compiled = _offset_from_pointers.compile(*_tensors(), 256, 256, 256, **_T)
    assert _fence_global(compiled)["y_ptr"] == [True]
    assert _full_fence_before_first_copy(compiled.asm["ptx"])


@dsl.jit
def _while_offset(y_ptr, x_ptr, z_ptr, n, rows, cols, stride_r, BLOCK_R: dsl.constexpr, BLOCK_C: dsl.constexpr,
                  FROM_ADDRESS: dsl.constexpr):
    # `old` reads x at an offset a while loop carries: made from integers alone (x's roots: the narrow fences, as
    # the stream-K kernel's offsets need, whose pipelining changed when a while loop's value counted as an
    # address: the session's fresh-clone CI) or from y's address (unknown roots: both stores fence everything)
    offs = _box(BLOCK_R, BLOCK_C, stride_r)
    shift = (y_ptr.to(dsl.int64) - x_ptr.to(dsl.int64)) // 4 if FROM_ADDRESS else (n * 0).to(dsl.int64)
    steps = 0
    while steps < n:
        steps += 1
        shift = shift + steps * 0       # carried through the loop
    old = dsl.load(x_ptr + shift + (steps - n) + offs)
    tile = dsl.load(x_ptr + offs)
    _store_both(y_ptr, z_ptr, tile, old, rows, cols, stride_r, BLOCK_R, BLOCK_C)


@pytest.mark.parametrize("from_address", [False, True])
def test_an_offset_carried_by_a_while_loop_is_an_address_only_when_made_from_one(tma_ws0, from_address):
    compiled = _while_offset.compile(*_tensors(), 3, 256, 256, 256, FROM_ADDRESS=from_address, **_T)
    assert _fence_global(compiled) == {"y_ptr": [from_address], "z_ptr": [from_address]}


def test_interpreter_reads_the_stored_tensor_through_the_int64_offset(seed):
    # the kernel above does read y (what makes its narrow fence wrong): z gets y's old box
    generator = torch.Generator().manual_seed(seed)
    y, x = torch.randn(64, 64, generator=generator), torch.randn(64, 64, generator=generator)
    z, y0 = poison(torch.empty(64, 64)), y.clone()
    _offset_from_pointers[(1,)](y, x, z, 64, 64, 64, BLOCK_R=32, BLOCK_C=32, interpret=True)
    assert torch.equal(z[:32, :32], y0[:32, :32]) and torch.equal(y[:32, :32], x[:32, :32])


@dsl.jit
def _merge_kept_columns(y_ptr, x_ptr, z_ptr, rows, cols, stride_r, WIDTH: dsl.constexpr, BLOCK_R: dsl.constexpr,
                        BLOCK_C: dsl.constexpr):
    # y's box: x's columns below WIDTH, y's own beyond (read-modify-write); y's old box is also saved to z.
    # With WIDTH == BLOCK_C the `where` always takes x: LLVM drops the dependency of y's tile on `old`.
    c = dsl.arange(0, BLOCK_C)[None, :]
    offs = dsl.arange(0, BLOCK_R)[:, None] * stride_r + c
    old = dsl.load(y_ptr + offs)
    tile = dsl.load(x_ptr + offs)
    dsl.make_tensor_descriptor(y_ptr, (rows, cols), (stride_r, 1), (BLOCK_R, BLOCK_C)).store(
        (0, 0), dsl.where(c < WIDTH, tile, old))
    dsl.make_tensor_descriptor(z_ptr, (rows, cols), (stride_r, 1), (BLOCK_R, BLOCK_C)).store((0, 0), old)


@dsl.jit
def _masked_out_dependency(y_ptr, x_ptr, z_ptr, rows, cols, stride_r, BLOCK_R: dsl.constexpr,
                           BLOCK_C: dsl.constexpr):
    # int32: y's tile is x's + (old & 0), which LLVM folds to x's (the IR's fold has no `x & 0` rule)
    offs = _box(BLOCK_R, BLOCK_C, stride_r)
    old = dsl.load(y_ptr + offs)
    tile = dsl.load(x_ptr + offs)
    dsl.make_tensor_descriptor(y_ptr, (rows, cols), (stride_r, 1), (BLOCK_R, BLOCK_C)).store((0, 0), tile + (old & 0))
    dsl.make_tensor_descriptor(z_ptr, (rows, cols), (stride_r, 1), (BLOCK_R, BLOCK_C)).store((0, 0), old)


def test_a_load_of_the_stored_argument_keeps_the_full_fence_even_when_the_block_comes_from_it(tma_ws0):
    # fixed (see below): the exemption for loads the stored block is computed from is gone; WIDTH < BLOCK_C
    # keeps `old` in y's tile, and y's store still fences global memory (z's reads only other arguments)
    compiled = _merge_kept_columns.compile(*_tensors(), 256, 256, 256, WIDTH=16, **_T)
    assert _fence_global(compiled) == {"y_ptr": [True], "z_ptr": [False]}


@pytest.mark.parametrize("case", ["where always x", "and zero"])
def test_a_dependency_the_backend_erases_keeps_the_full_fence(tma_ws0, case):
    if case == "where always x":
        compiled = _merge_kept_columns.compile(*_tensors(), 256, 256, 256, WIDTH=32, **_T)
    else:
        compiled = _masked_out_dependency.compile(*_tensors(torch.int32), 256, 256, 256, **_T)
    ptx = compiled.asm["ptx"]
    assert _full_fence_before_first_copy(ptx), _fence_global(compiled)


def test_the_erased_dependency_leaves_the_load_of_y_unconsumed_at_the_copy(tma_ws0):
    # what made the case above a hazard, in the PTX: the registers of y's ld.global are first read after y's
    # copy (by z's st.shared); the full fence now precedes that copy
    ptx = _merge_kept_columns.compile(*_tensors(), 256, 256, 256, WIDTH=32, **_T).asm["ptx"]
    first = _COPY.search(ptx).start()
    before = ptx[:first]
    loads = re.findall(r"ld\.global\.v4\.b32\s+\{([^}]*)\}", before)
    assert len(loads) == 4
    stored_before = {r.strip() for regs in re.findall(r"st\.shared\.v4\.b32\s+\[[^\]]*\],\s*\{([^}]*)\}", before)
                     for r in regs.split(",")}
    unconsumed = [regs for regs in loads if not {r.strip() for r in regs.split(",")} & stored_before]
    assert len(unconsumed) == 2, loads        # old's two vectors: in flight as far as the copy is concerned
    assert _FULL_FENCE.search(before)      # (which covers the shared tile too)


def test_readme_states_the_no_overlap_assumption_for_tma_stores():
    readme = (pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
    paragraphs = readme.split("\n\n")
    assert any("overlap" in p and ("desc.store" in p or "TMA store" in p or "descriptor store" in p)
               for p in paragraphs)


@dsl.jit
def _swap_boxes(y_ptr, x_ptr, rows, cols, stride_r, BLOCK_R: dsl.constexpr, BLOCK_C: dsl.constexpr):
    # swap x's boxes (0, 0) and (0, BLOCK_C) into y; in place when y is x
    offs = _box(BLOCK_R, BLOCK_C, stride_r)
    left = dsl.load(x_ptr + offs)
    right = dsl.load(x_ptr + BLOCK_C + offs)
    desc = dsl.make_tensor_descriptor(y_ptr, (rows, cols), (stride_r, 1), (BLOCK_R, BLOCK_C))
    desc.store((0, 0), right)
    desc.store((0, BLOCK_C), left)


def test_in_place_swap_through_two_arguments_gets_the_narrow_fence_and_right_values(tma_ws0, seed):
    # the current behaviour the docs defect above is about: y is x at the launch, the compiler cannot tell,
    # and both stores fence only their shared tiles (`left`, which the first store's block does not come from,
    # reads the box that store overwrites). In the interpreter the in-place swap is right.
    y = torch.zeros(256, 256)
    compiled = _swap_boxes.compile(y, y, 256, 256, 256, **_T)
    assert _fence_global(compiled) == {"y_ptr": [False, False]}
    generator = torch.Generator().manual_seed(seed)
    t = torch.randn(64, 64, generator=generator)
    t0 = t.clone()
    _swap_boxes[(1,)](t, t, 64, 64, 64, BLOCK_R=32, BLOCK_C=32, interpret=True)
    assert torch.equal(t[:32, :32], t0[:32, 32:]) and torch.equal(t[:32, 32:], t0[:32, :32])


# =====================================================================================================
# 2. dsl.sigmoid's approximate reciprocal
# =====================================================================================================

def _divisions(ptx: str) -> set:
    return set(re.findall(r"\b((?:rcp|div)\.[a-z0-9.]+)", ptx))


def _ir_divisions(compiled) -> list:
    """The post-pass IR's DIV ops: True for an approximate one."""
    return sorted("approx=True" in line for line in compiled.asm["ir"].splitlines() if re.search(r"= div ", line))


@dsl.jit
def _sigmoid_then_same_expression(o_ptr, x_ptr, n, SIGMOID_FIRST: dsl.constexpr, BLOCK: dsl.constexpr):
    # sigmoid(x) and the user's 1 / (1 + exp(-x)): the same expression, in either order
    i = dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + i)
    if SIGMOID_FIRST:
        dsl.store(o_ptr + i, dsl.sigmoid(x))
        dsl.store(o_ptr + n + i, 1.0 / (1.0 + dsl.exp(-x)))
    else:
        dsl.store(o_ptr + n + i, 1.0 / (1.0 + dsl.exp(-x)))
        dsl.store(o_ptr + i, dsl.sigmoid(x))


@pytest.mark.parametrize("sigmoid_first", [True, False])
def test_cse_keeps_the_approximate_and_ieee_divisions_apart_and_llvm_keeps_the_users_ieee(sigmoid_first):
    # the IR keeps both (CSE keys on attrs); LLVM merges them into one IEEE division: the user's never becomes
    # approximate (sigmoid loses its rcp.approx here, which costs only speed)
    x = torch.zeros(256)
    compiled = _sigmoid_then_same_expression.compile(x, x, 256, target="sm_90a", SIGMOID_FIRST=sigmoid_first,
                                                      BLOCK=256)
    assert _ir_divisions(compiled) == [False, True]
    assert _divisions(compiled.asm["ptx"]) == {"rcp.rn.f32"}


@dsl.jit
def _users_divisions(o_ptr, x_ptr, a, BLOCK: dsl.constexpr):
    # 0-d and block sigmoids beside the user's divisions of and by them
    i = dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + i)
    s = dsl.sigmoid(x)
    dsl.store(o_ptr + i, s)
    dsl.store(o_ptr + BLOCK + i, x / s)
    dsl.store(o_ptr + 2 * BLOCK + i, 1.0 / s)
    dsl.store(o_ptr + 3 * BLOCK, dsl.sigmoid(a) + 1.0 / a)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_users_divisions_of_and_by_sigmoids_stay_ieee(dtype):
    x, o = torch.zeros(128, dtype=dtype), torch.zeros(4 * 128 + 1, dtype=dtype)
    compiled = _users_divisions.compile(o, x, 0.3, target="sm_90a", BLOCK=128)
    ptx = compiled.asm["ptx"]
    # the sigmoids: rcp.approx; x / s, 1.0 / s (16-bit ones divide in float32) and 1.0 / a: div.rn / rcp.rn
    assert _divisions(ptx) == {"rcp.approx.f32", "div.rn.f32", "rcp.rn.f32"}, _divisions(ptx)
    # the IR: exactly the two sigmoids approximate
    assert _ir_divisions(compiled) == [False, False, False, True, True]


@dsl.jit
def _sigmoid_of_other_types(o_ptr, x_ptr, BLOCK: dsl.constexpr):
    i = dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + i)
    dsl.store(o_ptr + i, dsl.sigmoid(x))
    dsl.store(o_ptr + BLOCK + i, x / 3)


@pytest.mark.parametrize("dtype, expected", [
    (torch.int32, {"rcp.approx.f32", "div.rn.f32"}), (torch.int8, {"rcp.approx.f32", "div.rn.f32"}),
    (torch.float64, {"rcp.rn.f64", "div.rn.f64"})])
def test_integer_sigmoid_is_approximate_and_float64_exact(dtype, expected):
    out = torch.zeros(256, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    ptx = _sigmoid_of_other_types.compile(out, torch.zeros(128, dtype=dtype), target="sm_90a", BLOCK=128).asm["ptx"]
    assert _divisions(ptx) == expected


@dsl.jit
def _sigmoid_in_control_flow(o_ptr, x_ptr, n, ELSE: dsl.constexpr, BLOCK: dsl.constexpr):
    i = dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + i)
    acc = dsl.zeros((BLOCK,), dsl.float32)
    for k in range(0, n):
        if k % 2 == 0:
            acc = acc + dsl.sigmoid(x + k)
        elif ELSE:
            acc = acc + 1.0 / (1.0 + x * k)
    dsl.store(o_ptr + i, acc)


def test_sigmoid_in_loops_and_ifs():
    x = torch.zeros(256)
    ptx = _sigmoid_in_control_flow.compile(x, x, 5, target="sm_90a", ELSE=False, BLOCK=256).asm["ptx"]
    assert _divisions(ptx) == {"rcp.approx.f32"}
    # with a user's division in the else branch LLVM sinks both into one IEEE division (sigmoid loses its
    # approximation there, a speed matter); what counts: no approximate division serves the user's
    ptx = _sigmoid_in_control_flow.compile(x, x, 5, target="sm_90a", ELSE=True, BLOCK=256).asm["ptx"]
    assert "rcp.rn.f32" in _divisions(ptx) and not any("approx" in d for d in _divisions(ptx))


def _twin(use_sigmoid: bool):
    """A kernel named `_twin_kernel`: sigmoid, or the user's own 1 / (1 + exp(-x)). Their frontend IR differs only
    in the DIV's attr."""
    if use_sigmoid:
        @dsl.jit
        def _twin_kernel(o_ptr, x_ptr, BLOCK: dsl.constexpr):
            i = dsl.arange(0, BLOCK)
            dsl.store(o_ptr + i, dsl.sigmoid(dsl.load(x_ptr + i)))
    else:
        @dsl.jit
        def _twin_kernel(o_ptr, x_ptr, BLOCK: dsl.constexpr):
            i = dsl.arange(0, BLOCK)
            x = dsl.load(x_ptr + i)
            dsl.store(o_ptr + i, 1.0 / (1.0 + dsl.exp(-x)))
    return _twin_kernel


def test_disk_cache_keys_tell_the_approximate_division_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    x = torch.zeros(128)
    order = [True, False, True, False]       # the last two: fresh JIT objects, served from the disk cache
    found = [_divisions(_twin(s).compile(x, x, target="sm_90a", BLOCK=128).asm["ptx"]) for s in order]
    assert found == [{"rcp.approx.f32"}, {"rcp.rn.f32"}] * 2
    assert len(list(tmp_path.rglob("*.json"))) == 2


_EDGES = [0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-40, 1e-30, -1e-30, 0.5, -0.5, 3.0, -3.0, 15.0, -15.0, 16.5, 17.0,
          20.0, -20.0, 87.3, -87.3, 88.0, -88.0, 88.7, -88.7, 100.0, -100.0, 104.0, -104.0, 1e30, -1e30,
          float("inf"), float("-inf"), float("nan")]


@dsl.jit
def _sigmoid_kernel(o_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    i = dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + i, mask=i < n, other=0)
    dsl.store(o_ptr + i, dsl.sigmoid(x), mask=i < n)


@dsl.jit
def _sigmoid_scalars(o_ptr, x_ptr, n):
    for j in range(0, n):
        dsl.store(o_ptr + j, dsl.sigmoid(dsl.load(x_ptr + j)))


def _check_sigmoid(out: torch.Tensor, x: torch.Tensor):
    expected = torch.sigmoid(x.double()).to(out.dtype)
    # 1 / (1 + exp(-x)) is 0 where exp(-x) overflows (x < -88.7 in float32): below the smallest normal
    atol = torch.finfo(out.dtype).smallest_normal
    rtol = {torch.float64: 1e-15, torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[out.dtype]
    torch.testing.assert_close(out.double(), expected.double(), rtol=rtol, atol=atol, equal_nan=True)
    # signs: sigmoid is never negative (-inf and huge negative x give +0.0)
    finite = ~out.isnan()
    assert (out[finite] >= 0).all() and not torch.signbit(out[finite]).any()
    assert out[x.double() == 0].eq(0.5).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kernel", ["block", "scalar"])
def test_interpreter_sigmoid_extremes_float(dtype, kernel):
    x = torch.tensor(_EDGES, dtype=torch.float64).to(dtype)
    out = poison(torch.empty_like(x))
    if kernel == "block":
        _sigmoid_kernel[(1,)](out, x, x.numel(), BLOCK=64, interpret=True)
    else:
        _sigmoid_scalars[(1,)](out, x, x.numel(), interpret=True)
    _check_sigmoid(out, x)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool])
def test_interpreter_sigmoid_of_integers_is_float32(dtype):
    info = torch.iinfo(dtype) if dtype != torch.bool else None
    values = [0, 1] if dtype == torch.bool else sorted({0, 1, 3, 20, 100, info.max} | (
        {-1, -3, -20, -100, info.min} if info.min < 0 else set()))
    x = torch.tensor(values, dtype=dtype)
    out = poison(torch.empty(x.numel(), dtype=torch.float32))
    _sigmoid_kernel[(1,)](out, x, x.numel(), BLOCK=16, interpret=True)
    _check_sigmoid(out, x)


@dsl.jit
def _sigmoid_of_a_constant(o_ptr, C: dsl.constexpr, BLOCK: dsl.constexpr):
    i = dsl.arange(0, BLOCK)
    dsl.store(o_ptr + i, dsl.sigmoid(C) + i * 0.0)


@pytest.mark.parametrize("c", [-104.0, -88.0, -0.0, 2.0, 88.0, float("inf"), float("-inf")])
def test_sigmoid_of_a_constant(c):
    out = poison(torch.empty(8))
    _sigmoid_of_a_constant[(1,)](out, C=c, BLOCK=8, interpret=True)
    _check_sigmoid(out, torch.full((8,), c))
    ptx = _sigmoid_of_a_constant.compile(out, target="sm_90a", C=c, BLOCK=8).asm["ptx"]
    assert _divisions(ptx) <= {"rcp.approx.f32"}, _divisions(ptx)       # folded, or the approximate reciprocal


# =====================================================================================================
# 3. The persistent matmul's deferred store
# =====================================================================================================

def _config(block_m=16, block_n=16, block_k=16, group_m=4, num_warps=8):
    return matmul_configs._config(block_m, block_n, block_k, num_warps, 1, group_m=group_m)


_TOL = {torch.float32: 1e-4, torch.float64: 1e-10, torch.float16: 3e-3, torch.bfloat16: 1.5e-2}

# (m, n, k, programs, activation, bias, A dtype, C dtype, layout, config kwargs)
_DEFERRED_CASES = [
    (16, 16, 16, 1, None, False, torch.float32, torch.float32, "", {}),          # one tile, one K step
    (16, 16, 5, 1, "relu", True, torch.float32, torch.float32, "", {}),          # K < BLOCK_K
    (40, 40, 16, 9, None, True, torch.float32, torch.float32, "", {}),           # one tile per program, one step
    (40, 40, 50, 9, "gelu", False, torch.float32, torch.float32, "", {}),        # one tile per program
    (40, 40, 50, 1, "silu", True, torch.float32, torch.float32, "", {}),         # one program, every tile
    (33, 47, 17, 2, "gelu_tanh", True, torch.float16, torch.float16, "", {}),
    (33, 47, 17, 4, "silu", True, torch.float16, torch.float32, "", {}),         # C wider than A
    (33, 47, 17, 3, "relu", False, torch.bfloat16, torch.bfloat16, "", {}),
    (50, 30, 20, 5, "gelu", True, torch.float16, torch.float32, "ta tb tc", {}),  # column-major A, B and C
    (50, 30, 20, 7, "gelu_tanh", True, torch.float32, torch.float16, "tc", {}),  # C narrower than A
    (1, 1, 1, 1, "silu", True, torch.float32, torch.float32, "", {}),
    (17, 1, 33, 2, None, False, torch.float32, torch.float32, "", {}),
    (64, 64, 64, 3, "gelu", True, torch.float64, torch.float64, "", {}),
    (70, 45, 40, 4, "relu", True, torch.float16, torch.float16, "view", dict(block_m=32, block_n=16, block_k=8,
                                                                             group_m=8)),
    (45, 70, 9, 6, None, True, torch.bfloat16, torch.float32, "tb", dict(block_m=16, block_n=32, block_k=8,
                                                                         group_m=1)),
]


def _deferred_inputs(m, n, k, activation, bias, a_dtype, c_dtype, layout, generator):
    a = torch.randn(k, m, generator=generator).t() if "ta" in layout else torch.randn(m, k, generator=generator)
    b = torch.randn(n, k, generator=generator).t() if "tb" in layout else torch.randn(k, n, generator=generator)
    a, b = a.to(a_dtype), (b * k ** -0.5).to(a_dtype)
    bias_t = torch.randn(2 * n, generator=generator).to(a_dtype)[::2] if bias else None      # strided bias
    if "tc" in layout:
        buffer = poison(torch.empty(n, m, dtype=c_dtype))
        c = buffer.t()
    elif "view" in layout:       # C inside a larger poisoned buffer: nothing outside may be written
        buffer = poison(torch.empty(m + 3, n + 5, dtype=c_dtype))
        c = buffer[1:m + 1, 2:n + 2]
    else:
        buffer = poison(torch.empty(m, n, dtype=c_dtype))
        c = buffer
    return a, b, bias_t, c, buffer


@pytest.mark.parametrize("case", _DEFERRED_CASES, ids=[f"{c[0]}x{c[1]}x{c[2]}-p{c[3]}-{c[4]}-{c[6]}-{c[7]}-{c[8]}"
                                                       for c in _DEFERRED_CASES])
def test_interpreted_deferred_store_edge_cases(case, seed):
    m, n, k, programs, activation, bias, a_dtype, c_dtype, layout, config = case
    generator = torch.Generator().manual_seed(seed)
    a, b, bias_t, c, buffer = _deferred_inputs(m, n, k, activation, bias, a_dtype, c_dtype, layout, generator)
    mp.launch(c, a, b, bias_t, activation, _config(**config), programs, interpret=True, deferred_store=True)
    expected = _mm_reference(a, b, bias_t, activation)
    tol = max(_TOL[a_dtype], _TOL[c_dtype])
    torch.testing.assert_close(c.double(), expected, rtol=tol, atol=tol)
    if "view" in layout:
        outside = torch.ones_like(buffer, dtype=torch.bool)
        outside[1:m + 1, 2:n + 2] = False
        assert buffer[outside].isnan().all()
    # the same values as the inline store, bit for bit
    inline = poison(torch.empty_like(c))
    mp.launch(inline, a, b, bias_t, activation, _config(**config), programs, interpret=True, deferred_store=False)
    assert torch.equal(inline, c)


def test_interpreted_deferred_store_every_program_count(seed):
    generator = torch.Generator().manual_seed(seed)
    m, n, k = 48, 64, 40                # 12 tiles, 3 K steps
    a, b = torch.randn(m, k, generator=generator), torch.randn(k, n, generator=generator)
    expected = _mm_reference(a, b)
    for programs in range(1, 13):
        c = poison(torch.empty(m, n))
        mp.launch(c, a, b, None, None, _config(), programs, interpret=True, deferred_store=True)
        torch.testing.assert_close(c.double(), expected, rtol=1e-4, atol=1e-4, msg=f"{programs} programs")


@pytest.mark.parametrize("c_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("activation", mm.ACTIVATIONS)
def test_interpreted_deferred_store_every_activation_and_bias(activation, bias, c_dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    m, n, k = 37, 29, 23                # 3 x 2 tiles over 4 programs, 2 K steps, ragged everywhere
    a, b, bias_t, c, _ = _deferred_inputs(m, n, k, activation, bias, torch.float16, c_dtype, "", generator)
    mp.launch(c, a, b, bias_t, activation, _config(), 4, interpret=True, deferred_store=True)
    torch.testing.assert_close(c.double(), _mm_reference(a, b, bias_t, activation), rtol=3e-3, atol=3e-3)


_EIGHT_WARP_CONFIGS = [config for config in WGMMA_CONFIGS if config.num_warps == 8]


@needs_ptxas
@pytest.mark.parametrize("index, dtype, c_dtype, bias, activation, column_major_c", [
    (0, torch.float16, torch.float16, True, "relu", True),
    (1, torch.bfloat16, torch.bfloat16, True, "gelu_tanh", False),
    (0, torch.float16, torch.float32, False, "silu", False),
    (1, torch.float16, torch.float16, False, None, True),
])
def test_sm90a_deferred_store_under_an_inflight_wgmma(index, dtype, c_dtype, bias, activation, column_major_c,
                                                      tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    config = _EIGHT_WARP_CONFIGS[index]
    a = torch.empty(4096, 4096, dtype=dtype)
    c = torch.empty(4096, 4096, dtype=c_dtype)
    c = c.t() if column_major_c else c
    args, options = mp._arguments(c, a, a, torch.empty(4096, dtype=dtype) if bias else None, activation, config,
                                  132, True)
    ptx = mp.matmul_persistent_kernel.compile(*args, target="sm_90a", **options).asm["ptx"]
    first_store = ptx.index("cp.async.bulk.tensor.2d.global.shared::cta")
    waits = re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+);", ptx[:first_store])
    assert waits and "0" not in waits, waits
    assert not _FULL_FENCE.search(ptx)       # a, b (and the bias) are other arguments than C
    stores = len(re.findall(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta", ptx))
    assert stores >= 2                       # in the loop and after it
    result = assemble(ptx, "sm_90a")         # raises where ptxas refuses it
    assert result.registers <= 255 and "C7514" not in result.log, result.log
