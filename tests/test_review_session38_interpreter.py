"""Session-38 review of the DSL interpreter as a user's debugging tool (`interpret=True` / FUSEDOPS_INTERPRET=1),
the way Triton users rely on TRITON_INTERPRET=1. Cases from triton-lang/triton and triton-viz reports:

- triton #10336 (masked load through a strided view reads past the storage) -> an unmasked / masked-on load
  past a strided view's storage, and a negative offset: InterpreterError naming the kernel, the op (load /
  store), the program id, the block index and the byte offset from the pointer argument. Right.
- triton-ascend #2332 (masked-off lanes with unmapped addresses fault) -> masked-off lanes at wild addresses
  (far below / past every storage) neither fault nor write. Right. `other` omitted reads 0 / False (documented
  in `dsl.load`) for float32, int16, uint8, bool, bfloat16. Right.
- device_print (blocks on one line per program, hex=True gives the bit pattern, bfloat16's 16 bits),
  device_assert (message, program id, first failing index), static_assert (CompilationError with the message).
  Right.
- 3-D grids and num_programs on each axis, the grid as a lambda of META. Right.
- atomics across programs: atomic_add totals and the old values (a sequential order), atomic_cas returning
  each program's old value, tutorial 05's lock (`while atomic_cas(lock, 0, 1) != 0: pass`) around a
  load/add/store. Right.
- triton-viz #165 / triton #1452 (spin locks in the interpreter) -> a program that waits on a flag that a LATER
  program sets (a handshake that works on a GPU whose programs are co-resident).
- int64 offsets (an offset argument past 2**31 is an int64 and faults with its true byte offset), a view with
  a storage offset past 2**31 bytes (an untouched 2 GiB torch.empty: no pages written), stores from several
  programs to one address (the last program's last lane, a valid sequential order), bool / uint8 / int16 /
  bfloat16 in and out (bool bytes other than 0/1 load as True), 0-d tensors (one element; a second faults),
  a scalar for a pointer parameter (CompilationError at the load), non-contiguous and expanded (stride 0)
  tensors with the user's strides. Right.

DEFECTS found (and fixed):
- a `while` loop spinning on a flag that only a later program sets (triton-viz #165, the handshake above) hung
  the interpreter for ever: it runs one program at a time. Now an iteration that changes neither its loop
  variables nor memory raises InterpreterError naming the kernel, the loop's line and the program id and saying
  why (interpreter/rules_control.py `_while`; interpreter/memory.py: `Memory.version` counts stores and the
  atomics that change a value's bits, so an `atomic_add(p, 0)` poll or a failed `atomic_cas` is no change).
  Spins that also count their tries (a changing carried value) are not detected.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl import CompilationError
from fusedops.dsl.errors import InterpreterError
from helpers import poison


# -- out-of-bounds accesses: a clear error, never neighbouring memory -------------------------------------------
@dsl.jit
def _strided_gather(out_ptr, x_ptr, stride, n, BLOCK: dsl.constexpr):
    offs = dsl.arange(0, BLOCK)
    v = dsl.load(x_ptr + offs * stride, mask=offs < n, other=-1)
    dsl.store(out_ptr + offs, v, mask=offs < n)


def test_strided_view_past_storage_raises_with_offset():
    # triton #10336: bins = base[0::2] of 5 ints, n = 4 reads base[6]; the GPU reads whatever lies there
    base = torch.tensor([10, 99, 11, 99, 12], dtype=torch.int32)
    bins = base[0::2]
    out = poison(torch.empty(4, dtype=torch.int32))
    with pytest.raises(InterpreterError) as info:
        _strided_gather[(1,)](out, bins, bins.stride(0), 4, BLOCK=8, interpret=True)
    text = str(info.value)
    assert "'_strided_gather'" in text and "out-of-bounds load of int32" in text
    assert "1 of 4 accessed lanes" in text and "block index (3,)" in text
    assert "byte offset 24 from pointer argument 'x_ptr'" in text and "[0, 20)" in text
    assert "program_id=(0, 0, 0)" in text
    # within the storage the user's strides are honoured
    out = poison(torch.empty(3, dtype=torch.int32))
    _strided_gather[(1,)](out, bins, bins.stride(0), 3, BLOCK=8, interpret=True)
    assert out.tolist() == [10, 11, 12]


@dsl.jit
def _shifted_copy(y_ptr, x_ptr, shift, BLOCK: dsl.constexpr):
    pid = dsl.program_id(0)
    offs = pid * BLOCK + dsl.arange(0, BLOCK)
    dsl.store(y_ptr + offs, dsl.load(x_ptr + offs - shift))


def test_negative_offset_load_and_oob_store_name_program():
    x, y = torch.randn(8), torch.zeros(8)
    with pytest.raises(InterpreterError, match=r"out-of-bounds load of float32: 2 of 4 .*block index \(0,\) "
                                               r"is byte offset -8 from pointer argument 'x_ptr'"):
        _shifted_copy[(2,)](y, x, 2, BLOCK=4, interpret=True)
    y = poison(torch.empty(6))
    with pytest.raises(InterpreterError, match=r"out-of-bounds store of float32: 2 of 4 .*block index \(2,\) "
                                               r"is byte offset 24 from pointer argument 'y_ptr'.*"
                                               r"program_id=\(1, 0, 0\)"):
        _shifted_copy[(2,)](y, x, 0, BLOCK=4, interpret=True)
    assert torch.equal(y[:4], x[:4])     # program 0 ran, program 1 faulted before writing anything


@dsl.jit
def _masked_wild(y_ptr, x_ptr, n, FAR: dsl.constexpr):
    offs = dsl.arange(0, 8)
    m = offs < n
    wild = dsl.where(m, offs.to(dsl.int64), offs.to(dsl.int64) * FAR - FAR * 4)
    v = dsl.load(x_ptr + wild, mask=m)
    dsl.store(y_ptr + wild, v * 2, mask=m)


@pytest.mark.parametrize("far", [1 << 20, 1 << 40])
def test_masked_off_wild_addresses_do_not_fault(far):
    x = torch.randn(8)
    y = torch.full((8,), 7.0)
    _masked_wild[(1,)](y, x, 3, FAR=far, interpret=True)
    assert torch.equal(y[:3], x[:3] * 2) and (y[3:] == 7.0).all()


@dsl.jit
def _masked_no_other(y_ptr, x_ptr, n):
    offs = dsl.arange(0, 8)
    dsl.store(y_ptr + offs, dsl.load(x_ptr + offs, mask=offs < n))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.uint8, torch.bool, torch.bfloat16])
def test_masked_load_without_other_reads_zero(dtype):
    x = (torch.randn(8) * 50).to(dtype) if dtype != torch.bool else torch.ones(8, dtype=torch.bool)
    y = poison(torch.empty(8, dtype=dtype))
    _masked_no_other[(1,)](y, x, 5, interpret=True)
    assert torch.equal(y[:5], x[:5]) and torch.equal(y[5:], torch.zeros(3, dtype=dtype))


# -- printing and assertions --------------------------------------------------------------------------------
@dsl.jit
def _print_kernel(x_ptr):
    v = dsl.load(x_ptr + dsl.arange(0, 4))
    dsl.device_print("v=", v)
    dsl.device_print("h=", v, hex=True)


def test_device_print_values_and_hex(capsys):
    xi = torch.tensor([-1, 0, 1, 300], dtype=torch.int32)
    _print_kernel[(2, 1, 1)](xi, interpret=True)
    lines = capsys.readouterr().out.splitlines()
    assert [" ".join(line.replace("[ ", "[").split()) for line in lines] == [
        "pid (0, 0, 0) v= [-1, 0, 1, 300]", "pid (0, 0, 0) h= [0xffffffff, 0x0, 0x1, 0x12c]",
        "pid (1, 0, 0) v= [-1, 0, 1, 300]", "pid (1, 0, 0) h= [0xffffffff, 0x0, 0x1, 0x12c]"]
    xb = torch.tensor([1.0, -2.0, 0.5, float("nan")], dtype=torch.bfloat16)
    _print_kernel[(1,)](xb, interpret=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "pid (0, 0, 0) h= [0x3f80, 0xc000, 0x3f00, 0x7fc0]"
    assert re.fullmatch(r"pid \(0, 0, 0\) v= \[ ?1\. ?, -2\. ?, 0\.5, nan\]", lines[0])


@dsl.jit
def _assert_kernel(x_ptr):
    v = dsl.load(x_ptr + dsl.program_id(0) * 4 + dsl.arange(0, 4))
    dsl.device_assert(v > 0, "v must be positive")


@dsl.jit
def _static_assert_kernel(x_ptr, B: dsl.constexpr):
    dsl.static_assert(B > 4, "B too small")
    dsl.store(x_ptr, 1)


def test_device_assert_and_static_assert_messages():
    x = torch.tensor([1, 2, 3, 4, 5, 6, -7, 0], dtype=torch.int32)
    with pytest.raises(InterpreterError, match=r"'_assert_kernel': device assertion failed: v must be positive "
                                               r"\(2 of 4 elements false, first at index \(2,\)\).*"
                                               r"program_id=\(1, 0, 0\)"):
        _assert_kernel[(2,)](x, interpret=True)
    with pytest.raises(CompilationError, match="static_assert failed: B too small"):
        _static_assert_kernel[(1,)](x, 2, interpret=True)


# -- grids ---------------------------------------------------------------------------------------------------
@dsl.jit
def _grid3(out_ptr, BLOCK: dsl.constexpr):
    p0, p1, p2 = dsl.program_id(0), dsl.program_id(1), dsl.program_id(2)
    n0, n1, n2 = dsl.num_programs(0), dsl.num_programs(1), dsl.num_programs(2)
    idx = (p2 * n1 + p1) * n0 + p0
    lane = dsl.arange(0, BLOCK)
    code = ((n0 * 10 + n1) * 10 + n2) * 1000 + (p0 * 10 + p1) * 10 + p2
    dsl.store(out_ptr + idx * BLOCK + lane, code + lane * 0)


@pytest.mark.parametrize("as_lambda", [False, True])
def test_3d_grid_and_num_programs(as_lambda):
    dims = (2, 3, 4)
    out = poison(torch.empty(24 * 2, dtype=torch.int32))
    grid = (lambda meta: (2, 3, meta["BLOCK"] * 2)) if as_lambda else dims
    _grid3[grid](out, BLOCK=2, interpret=True)
    want = [234000 + (x * 10 + y) * 10 + z for z in range(4) for y in range(3) for x in range(2) for _ in range(2)]
    assert out.tolist() == want


# -- atomics and races across programs ---------------------------------------------------------------------
@dsl.jit
def _histogram(count_ptr, old_ptr, x_ptr, BLOCK: dsl.constexpr):
    pid = dsl.program_id(0)
    offs = pid * BLOCK + dsl.arange(0, BLOCK)
    bins = dsl.load(x_ptr + offs)
    old = dsl.atomic_add(count_ptr + bins, 1)
    dsl.store(old_ptr + offs, old)


def test_atomic_add_totals_and_old_values_are_a_sequential_order():
    x = torch.randint(0, 3, (32,), dtype=torch.int32)
    counts = torch.zeros(3, dtype=torch.int32)
    old = poison(torch.empty(32, dtype=torch.int32))
    _histogram[(4,)](counts, old, x, BLOCK=8, interpret=True)
    assert torch.equal(counts, torch.bincount(x.long(), minlength=3).int())
    for b in range(3):       # each bin's old values are 0, 1, ..., count - 1: one per increment
        assert sorted(old[x == b].tolist()) == list(range(int(counts[b])))


@dsl.jit
def _locked_increment(lock_ptr, counter_ptr, seen_ptr):
    while dsl.atomic_cas(lock_ptr, 0, 1) != 0:
        pass
    v = dsl.load(counter_ptr)
    dsl.store(seen_ptr + dsl.program_id(0), v)
    dsl.store(counter_ptr, v + 1.5)
    dsl.atomic_xchg(lock_ptr, 0)


def test_spin_lock_serialises_programs():
    lock, counter = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.float64)
    seen = poison(torch.empty(6, dtype=torch.float64))
    _locked_increment[(6,)](lock, counter, seen, interpret=True)
    assert counter.item() == 9.0 and lock.item() == 0
    assert sorted(seen.tolist()) == [1.5 * i for i in range(6)]


@dsl.jit
def _handshake(flag_ptr, out_ptr, WAIT_ON_LATER: dsl.constexpr):
    pid = dsl.program_id(0)
    if WAIT_ON_LATER:
        target = pid + 1
    else:
        target = pid - 1
    if (target >= 0) & (target < dsl.num_programs(0)):
        while dsl.atomic_add(flag_ptr + target, 0) == 0:     # poll another program's flag
            pass
    dsl.store(out_ptr + pid, pid * 10)
    dsl.atomic_xchg(flag_ptr + pid, 1)


@dsl.jit
def _wait_on_plain_load(flag_ptr, out_ptr):
    pid = dsl.program_id(0)
    if pid == 0:
        while dsl.load(flag_ptr + 1) == 0:
            pass
    dsl.store(flag_ptr + pid, 1)
    dsl.store(out_ptr + pid, pid)


def test_wait_on_earlier_program_runs():
    flags = torch.zeros(4, dtype=torch.int32)
    out = poison(torch.empty(4, dtype=torch.int32))
    _handshake[(4,)](flags, out, False, interpret=True)
    assert out.tolist() == [0, 10, 20, 30] and flags.tolist() == [1, 1, 1, 1]


def test_spin_wait_on_later_program_raises_instead_of_hanging():
    # DEFECT (fixed): this hung for ever; programs run one at a time, so program 0 never sees program 1's flag
    flags = torch.zeros(4, dtype=torch.int32)
    out = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(InterpreterError, match=r"'_handshake': while loop cannot end.*one program at a time.*"
                                               r"program_id=\(0, 0, 0\)"):
        _handshake[(4,)](flags, out, True, interpret=True)
    flags = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(InterpreterError, match=r"'_wait_on_plain_load': while loop cannot end"):
        _wait_on_plain_load[(2,)](flags, torch.zeros(2, dtype=torch.int32), interpret=True)


@dsl.jit
def _same_address(p):
    lanes = dsl.arange(0, 4)
    dsl.store(p + lanes * 0, dsl.program_id(0) * 4 + lanes)


def test_stores_to_one_address_from_several_programs():
    p = poison(torch.empty(1, dtype=torch.int32))
    _same_address[(3,)](p, interpret=True)
    assert p.item() == 11      # the last program's last lane: one sequential order of the GPU's


# -- int64 offsets, dtypes, odd tensor arguments ------------------------------------------------------------
@dsl.jit
def _offset_copy(y_ptr, x_ptr, off, BLOCK: dsl.constexpr):
    i = dsl.arange(0, BLOCK)
    dsl.store(y_ptr + i, dsl.load(x_ptr + off + i))


def test_int64_offset_beyond_2_31():
    x, y = torch.arange(16.0), torch.zeros(4)
    with pytest.raises(InterpreterError, match=r"byte offset 8589934592 from pointer argument 'x_ptr'"):
        _offset_copy[(1,)](y, x, 2**31, BLOCK=4, interpret=True)
    _offset_copy[(1,)](y, x, 12, BLOCK=4, interpret=True)
    assert torch.equal(y, x[12:])


def test_view_with_storage_offset_past_2_31_bytes():
    big = torch.empty(2**31 + 64, dtype=torch.uint8)     # untouched pages: no memory is written but ours
    try:
        view = big[2**31 + 8: 2**31 + 40].view(torch.float32)
        src = torch.randn(8)
        view.copy_(src)
        y = poison(torch.empty(4))
        _offset_copy[(1,)](y, view, 4, BLOCK=4, interpret=True)
        assert torch.equal(y, src[4:])
        with pytest.raises(InterpreterError, match=r"byte offset 56 from pointer argument 'x_ptr'"):
            _offset_copy[(1,)](y, view, 14, BLOCK=4, interpret=True)   # 2**31 + 8 + 56 + 4 > the storage
    finally:
        del big


@dsl.jit
def _convert(y_ptr, x_ptr):
    i = dsl.arange(0, 4)
    dsl.store(y_ptr + i, dsl.load(x_ptr + i))


@pytest.mark.parametrize("src,dst", [(torch.int32, torch.bool), (torch.float32, torch.bfloat16),
                                     (torch.bfloat16, torch.int16), (torch.uint8, torch.float32),
                                     (torch.int16, torch.uint8)])
def test_dtype_conversions_in_and_out(src, dst):
    x = (torch.tensor([0.0, 2.75, -3.0, 100.5]) * (1 if src != torch.uint8 else -1)).to(src)
    if src == torch.int16:
        x = torch.tensor([0, 3, 200, 255], dtype=torch.int16)
    y = poison(torch.empty(4, dtype=dst))
    _convert[(1,)](y, x, interpret=True)
    assert torch.equal(y, x.to(dst))


def test_bool_bytes_other_than_one_load_as_true():
    raw = torch.tensor([0, 2, 255, 1], dtype=torch.uint8)
    y = poison(torch.empty(4, dtype=torch.int32))
    _convert[(1,)](y, raw.view(torch.bool), interpret=True)
    assert y.tolist() == [0, 1, 1, 1]


@dsl.jit
def _two(x_ptr):
    i = dsl.arange(0, 2)
    dsl.store(x_ptr + i, dsl.load(x_ptr + i) + 1)


@dsl.jit
def _one(x_ptr):
    dsl.store(x_ptr, dsl.load(x_ptr) * 2)


def test_zero_dim_tensor_and_scalar_as_pointer():
    s = torch.tensor(3.0)
    _one[(1,)](s, interpret=True)
    assert s.item() == 6.0
    with pytest.raises(InterpreterError, match=r"out-of-bounds load.*block index \(1,\) is byte offset 4"):
        _two[(1,)](s, interpret=True)
    with pytest.raises(CompilationError, match="load expects a pointer"):
        _two[(1,)](3.0, interpret=True)
    with pytest.raises(TypeError, match="x_ptr"):
        _two[(1,)](np.zeros(2, np.float32), interpret=True)


def test_non_contiguous_and_expanded_arguments_use_user_strides():
    m = torch.randn(4, 5)
    out = poison(torch.empty(4))
    _strided_gather[(1,)](out, m[:, 2], m.stride(0), 4, BLOCK=8, interpret=True)
    assert torch.equal(out, m[:, 2])
    e = torch.randn(1).expand(4)
    out = poison(torch.empty(4))
    _strided_gather[(1,)](out, e, e.stride(0), 4, BLOCK=8, interpret=True)
    assert torch.equal(out, e)
