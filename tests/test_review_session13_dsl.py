"""Review of the kernel language, session 13: a demanding Triton user trying to break the DSL's
semantics (cases modelled on bug reports against Triton and similar DSLs), each kernel run by the
interpreter against an exact or float64 reference and compiled to PTX for sm_90a (assembled by
`ptxas` when it is installed).

Confirmed defects are `xfail(strict=True, reason="BUG: ...")` and assert the correct behaviour: a fix
makes them XPASS (then drop the mark). The unmarked tests are regression tests of behaviour that was
found correct.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl


def _interpret(kernel, grid, *args, **constexprs):
    kernel[grid](*args, interpret=True, **constexprs)


def _assembles(kernel, *args, target="sm_90a", **constexprs):
    """Compile for `target` without a GPU and assemble the PTX with ptxas when it is installed."""
    from fusedops.dsl.target import assemble, ptxas_available
    compiled = kernel.compile(*args, target=target, **constexprs)
    if ptxas_available():
        assemble(compiled.asm["ptx"], target)
    return compiled


def _bits(t: torch.Tensor) -> list:
    return [v & 0xFFFF for v in t.view(torch.int16).tolist()]


# ================================================================================================
# Defects
# ================================================================================================

@dsl.jit
def _pointer_minus_offset_kernel(o_ptr, x_ptr, u_ptr, N: dsl.constexpr):
    i = dsl.arange(0, N)
    u = dsl.load(u_ptr + i)
    dsl.store(o_ptr + i, dsl.load((x_ptr + 8) - u))


@pytest.mark.parametrize("offset_dtype", [torch.uint8, torch.uint32])
def test_pointer_minus_unsigned_offset(offset_dtype):
    x = torch.arange(16, dtype=torch.float32)
    u = torch.tensor([1, 2, 3, 4], dtype=torch.int64).to(offset_dtype)
    out = torch.zeros(4)
    _interpret(_pointer_minus_offset_kernel, (1,), out, x, u, N=4)
    assert out.tolist() == [7.0, 6.0, 5.0, 4.0]


def test_pointer_minus_signed_offset_and_plus_negative_int8_offset():
    # the signed counterparts are right (sign extension), and compile
    x = torch.arange(16, dtype=torch.float32)
    out = torch.zeros(4)
    _interpret(_pointer_minus_offset_kernel, (1,), out, x, torch.tensor([1, 2, -3, 4], dtype=torch.int8), N=4)
    assert out.tolist() == [7.0, 6.0, 11.0, 4.0]
    _interpret(_pointer_minus_offset_kernel, (1,), out, x, torch.tensor([1, 2, 3, -4], dtype=torch.int64), N=4)
    assert out.tolist() == [7.0, 6.0, 5.0, 12.0]
    _assembles(_pointer_minus_offset_kernel, out, x, torch.tensor([1, 2, -3, 4], dtype=torch.int8), N=4)


@dsl.jit
def _copy_kernel(o_ptr, x_ptr, N: dsl.constexpr):
    i = dsl.arange(0, N)
    dsl.store(o_ptr + i, dsl.load(x_ptr + i))


@dsl.jit
def _bitcast_store_kernel(o_ptr, x_ptr, DT: dsl.constexpr, N: dsl.constexpr):
    i = dsl.arange(0, N)
    dsl.store(o_ptr + i, dsl.load(x_ptr + i).to(DT, bitcast=True))


# bfloat16 bit patterns: signalling NaNs (quiet bit clear) with payloads, a quiet NaN, a denormal, -0
_BF16_BITS = [0x7F81, 0xFF81, 0x7FA5, 0x7FC0, 0xFFC1, 0x0001, 0x8000, 0x3F80]


def _int16(bits):
    return torch.tensor(bits, dtype=torch.int32).to(torch.int16)


def test_bfloat16_copy_is_bit_exact():
    x = _int16(_BF16_BITS).view(torch.bfloat16)
    out = torch.zeros(8, dtype=torch.bfloat16)
    _interpret(_copy_kernel, (1,), out, x, N=8)
    assert _bits(out) == _BF16_BITS


def test_int16_to_bfloat16_bitcast_store_keeps_the_bits():
    out = torch.zeros(8, dtype=torch.bfloat16)
    _interpret(_bitcast_store_kernel, (1,), out, _int16(_BF16_BITS), DT=dsl.bfloat16, N=8)
    assert _bits(out) == _BF16_BITS


def test_float16_and_float32_copies_and_bitcasts_are_bit_exact():
    bits16 = [0x7C01, 0xFC01, 0x7D55, 0x7E00, 0x0001, 0x8000, 0x3C00, 0x7BFF]
    x = _int16(bits16)
    out = torch.zeros(8, dtype=torch.float16)
    _interpret(_copy_kernel, (1,), out, x.view(torch.float16), N=8)
    assert _bits(out) == bits16
    _interpret(_bitcast_store_kernel, (1,), out, x, DT=dsl.float16, N=8)
    assert _bits(out) == bits16
    bits32 = torch.tensor([0x7F800001, -0x7FFFFFFF, 0x7FA00005, 0x7FC00000, 1, -2**31, 0x7F7FFFFF, 0x7FBFFFFF],
                          dtype=torch.int64).to(torch.int32)
    out32 = torch.zeros(8)
    _interpret(_copy_kernel, (1,), out32, bits32.view(torch.float32), N=8)
    assert torch.equal(out32.view(torch.int32), bits32)
    # bfloat16 -> int16 bitcast reads the bits as they are
    out16 = torch.zeros(8, dtype=torch.int16)
    _interpret(_bitcast_store_kernel, (1,), out16, _int16(_BF16_BITS).view(torch.bfloat16), DT=dsl.int16, N=8)
    assert _bits(out16) == _BF16_BITS


@dsl.jit
def _dot_out_dtype_kernel(c_ptr, a_ptr, b_ptr, OUT: dsl.constexpr):
    r = dsl.arange(0, 16)
    a = dsl.load(a_ptr + r[:, None] * 16 + r[None, :])
    b = dsl.load(b_ptr + r[:, None] * 16 + r[None, :])
    dsl.store(c_ptr + r[:, None] * 16 + r[None, :], dsl.dot(a, b, out_dtype=OUT))


@pytest.mark.parametrize("out_dtype", ["float16", dsl.pointer_type(dsl.float32)], ids=["str", "pointer"])
def test_dot_out_dtype_that_is_not_a_dtype_is_a_compilation_error(out_dtype):
    a = torch.randn(16, 16).half()
    with pytest.raises(dsl.CompilationError, match="out_dtype"):
        _interpret(_dot_out_dtype_kernel, (1,), torch.zeros(16, 16), a, a, OUT=out_dtype)


def test_dot_out_dtype_integer_for_float_inputs_is_refused():
    a = torch.randn(16, 16).half()
    with pytest.raises(dsl.CompilationError):
        _interpret(_dot_out_dtype_kernel, (1,), torch.zeros(16, 16, dtype=torch.int32), a, a, OUT=dsl.int32)


@dsl.jit
def _broadcast_to_kernel(o_ptr, x_ptr, SHAPE: dsl.constexpr):
    i = dsl.arange(0, 4)
    dsl.store(o_ptr + i, dsl.broadcast_to(dsl.load(x_ptr + i), SHAPE))


@pytest.mark.parametrize("shape", [4, None])
def test_broadcast_to_with_a_non_tuple_shape(shape):
    x, out = torch.arange(4.0), torch.zeros(4)
    try:
        _interpret(_broadcast_to_kernel, (1,), out, x, SHAPE=shape)
    except dsl.CompilationError as error:
        assert "test_review_session13_dsl.py" in str(error)   # a located, clear error is fine
        return
    assert out.tolist() == [0.0, 1.0, 2.0, 3.0]


@dsl.jit
def _full_kernel(o_ptr, V: dsl.constexpr, DT: dsl.constexpr, MODE: dsl.constexpr):
    i = dsl.arange(0, 4)
    if MODE == "full":
        y = dsl.full((4,), V, DT)
    elif MODE == "runtime":                    # the same value as a runtime float32 scalar
        y = dsl.full((4,), dsl.full((), V, dsl.float32), DT)
    else:                                      # a literal stored into the integer tensor
        y = V + 0 * i.to(DT)
        y = dsl.where(i >= 0, V, y)
    dsl.store(o_ptr + i, y)


_FULL_CASES = [  # (float literal, dtype, the cast rule's value: truncate toward zero, saturate, NaN -> 0)
    (1e10, torch.int32, 2**31 - 1), (-2.5e9, torch.int32, -2**31), (-1.7, torch.uint8, 0), (1e10, torch.int8, 127),
    (float("inf"), torch.int32, 2**31 - 1), (float("-inf"), torch.int8, -128), (float("nan"), torch.int32, 0),
]
_DSL = {torch.int32: dsl.int32, torch.int8: dsl.int8, torch.uint8: dsl.uint8}


@pytest.mark.parametrize("value, dtype, expected", _FULL_CASES[:4])
def test_float_literal_into_integer_is_converted_by_the_cast_rule(value, dtype, expected):
    # a runtime scalar given to full(), and a literal stored through where(): the cast rule
    for mode in ("runtime", "where"):
        out = torch.zeros(4, dtype=dtype)
        _interpret(_full_kernel, (1,), out, V=value, DT=_DSL[dtype], MODE=mode)
        assert out.tolist() == [expected] * 4, mode


@pytest.mark.parametrize("value, dtype, expected", [_FULL_CASES[i] for i in (0, 2, 4, 6)])
def test_full_with_a_float_literal_and_an_integer_dtype(value, dtype, expected):
    out = torch.zeros(4, dtype=dtype)
    _interpret(_full_kernel, (1,), out, V=value, DT=_DSL[dtype], MODE="full")
    assert out.tolist() == [expected] * 4


# ================================================================================================
# Found correct (regression tests)
# ================================================================================================

@dsl.jit
def _carried_kernel(o_ptr, x_ptr, n, MODE: dsl.constexpr):
    i = dsl.arange(0, 8)
    if MODE == "scalar_to_block":          # a loop-carried int scalar becomes a float block
        acc = 0
        for j in range(n):
            acc += dsl.load(x_ptr + j * 8 + i)
    elif MODE == "int_to_float_while":     # an int scalar becomes float in a while loop
        acc = 0
        j = 0
        while j < n:
            acc = acc + 0.5
            j += 1
        acc = acc + 0.0 * i
    else:                                  # a data-dependent while condition
        j = 0
        while dsl.load(x_ptr + j * 8) <= 20.0:
            j += 1
        acc = j + 0.0 * i
    dsl.store(o_ptr + i, acc)


@pytest.mark.parametrize("mode, expected", [
    ("scalar_to_block", [48.0 + 4 * k for k in range(8)]), ("int_to_float_while", [2.0] * 8),
    ("data_while", [3.0] * 8)])
def test_loop_carried_values_that_change_type_or_shape(mode, expected):
    x, out = torch.arange(64, dtype=torch.float32), torch.zeros(8)
    _interpret(_carried_kernel, (1,), out, x, 4, MODE=mode)
    assert out.tolist() == expected
    _assembles(_carried_kernel, out, x, 4, MODE=mode)


@dsl.jit
def _count_down_kernel(o_ptr, n_ptr):
    n = dsl.load(n_ptr)
    digits = 0
    for i in range(n, 0, -1):             # a -1 step with an unsigned bound
        digits = digits * 10 + i
    dsl.store(o_ptr, digits)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.uint32, torch.int16])
def test_range_counting_down_from_an_unsigned_bound(dtype):
    out = torch.zeros(1, dtype=torch.int64)
    n = torch.tensor([4], dtype=torch.int64).to(dtype)
    _interpret(_count_down_kernel, (1,), out, n)
    assert out.tolist() == [4321]
    _assembles(_count_down_kernel, out, n)


@dsl.jit
def _duplicate_atomics_kernel(o_ptr, old_ptr, KIND: dsl.constexpr):
    i = dsl.arange(0, 8)
    p = o_ptr + i % 2
    if KIND == "add":
        old = dsl.atomic_add(p, 1)
    elif KIND == "cas":
        old = dsl.atomic_cas(p, 0, i + 10)
    else:
        old = dsl.atomic_or(p, 1 << i)
    dsl.store(old_ptr + i, old)


@pytest.mark.parametrize("kind, memory, olds", [
    ("add", [4, 4], [0, 0, 1, 1, 2, 2, 3, 3]), ("cas", [10, 11], [0, 0, 10, 11, 10, 11, 10, 11]),
    ("or", [85, 170], [0, 0, 1, 2, 5, 10, 21, 42])])
def test_atomics_on_repeated_addresses_within_one_block(kind, memory, olds):
    out, old = torch.zeros(2, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)
    _interpret(_duplicate_atomics_kernel, (1,), out, old, KIND=kind)
    assert out.tolist() == memory and old.tolist() == olds


@dsl.jit
def _cast_kernel(o_ptr, x_ptr, DT: dsl.constexpr, N: dsl.constexpr):
    i = dsl.arange(0, N)
    dsl.store(o_ptr + i, dsl.load(x_ptr + i).to(DT))


def test_float64_to_half_types_round_once():
    # x64 values just past a half-way point of the 16-bit type: a float32 step would round them to the tie
    x = torch.tensor([1 + 2**-11 + 2**-40, 1 + 2**-8 + 2**-40, -(1 + 2**-8 + 2**-40), 2**-25 + 2**-50],
                     dtype=torch.float64)
    half = torch.zeros(4, dtype=torch.float16)
    _interpret(_cast_kernel, (1,), half, x, DT=dsl.float16, N=4)
    assert half.tolist() == [1 + 2**-10, 1 + 2**-8, -(1 + 2**-8), 2**-24]
    brain = torch.zeros(4, dtype=torch.bfloat16)
    _interpret(_cast_kernel, (1,), brain, x, DT=dsl.bfloat16, N=4)
    assert brain.tolist() == [1.0, 1 + 2**-7, -(1 + 2**-7), 2**-25]
    for arch in ("sm_90a", "sm_80"):
        _assembles(_cast_kernel, brain, x, DT=dsl.bfloat16, N=4, target=arch)


@dsl.jit
def _descriptor_kernel(o_ptr, x_ptr, M, N, r0, c0, MODE: dsl.constexpr):
    d = dsl.make_tensor_descriptor(x_ptr, (M, N), (8, 1), (4, 8))
    rm, rn = dsl.arange(0, 4)[:, None], dsl.arange(0, 8)[None, :]
    if MODE == "load":
        dsl.store(o_ptr + rm * 8 + rn, d.load((r0, c0)))
    else:
        d.store((r0, c0), (rm * 8 + rn + 100).to(dsl.float32))


@pytest.mark.parametrize("r0, c0", [(-2, -3), (3, 5), (10, 0)])
def test_descriptor_boxes_partly_or_wholly_outside_the_tensor(r0, c0):
    M, N = 5, 7
    x = torch.arange(64, dtype=torch.float32)
    out = torch.zeros(4, 8)
    _interpret(_descriptor_kernel, (1,), out, x, M, N, r0, c0, MODE="load")
    stored = torch.zeros(64)
    _interpret(_descriptor_kernel, (1,), out, stored, M, N, r0, c0, MODE="store")
    expected_load, expected_store = torch.zeros(4, 8), torch.zeros(64)
    for i in range(4):
        for j in range(8):
            if 0 <= r0 + i < M and 0 <= c0 + j < N:
                expected_load[i, j] = x[(r0 + i) * 8 + c0 + j]
                expected_store[(r0 + i) * 8 + c0 + j] = i * 8 + j + 100
    assert torch.equal(out, expected_load) and torch.equal(stored, expected_store)


@dsl.jit
def _memory_order_kernel(o_ptr, x_ptr, q_ptr, MODE: dsl.constexpr):
    i = dsl.arange(0, 4)
    if MODE == "reload_after_store":
        dsl.store(x_ptr + i, dsl.load(x_ptr + i) + 1)
        dsl.store(q_ptr + i, dsl.load(x_ptr + i))
    elif MODE == "alias":                     # o and x are the same tensor
        a = dsl.load(x_ptr + i)
        dsl.store(o_ptr + i, a * 10)
        dsl.store(q_ptr + i, dsl.load(x_ptr + i))
    else:                                     # two identical atomics are two updates
        a = dsl.atomic_add(x_ptr + i, 1.0)
        b = dsl.atomic_add(x_ptr + i, 1.0)
        dsl.store(q_ptr + i, a + b)


@pytest.mark.parametrize("mode, x_after, q_after", [
    ("reload_after_store", [1, 2, 3, 4], [1, 2, 3, 4]), ("alias", [0, 10, 20, 30], [0, 10, 20, 30]),
    ("atomics", [2, 3, 4, 5], [1, 3, 5, 7])])
def test_passes_keep_loads_stores_and_atomics_in_order(mode, x_after, q_after):
    from codegen_helpers import interpret_ir, pipelined_ir
    for stage in ("frontend", "pipelined"):
        x, q = torch.arange(4, dtype=torch.float32), torch.zeros(4)
        args = (x if mode == "alias" else torch.zeros(4), x, q)
        if stage == "frontend":
            _interpret(_memory_order_kernel, (1,), *args, MODE=mode)
        else:   # the IR the GPU runs, after CSE/DCE/folding and the layout passes
            function, _ = pipelined_ir(_memory_order_kernel, args, dict(MODE=mode), 4)
            interpret_ir(_memory_order_kernel, function, (1, 1, 1), args, dict(MODE=mode))
        assert x.tolist() == x_after and q.tolist() == q_after, stage


@dsl.jit
def _float_identities_kernel(q_ptr, x_ptr, MODE: dsl.constexpr):
    i = dsl.arange(0, 4)
    x = dsl.load(x_ptr + i)
    if MODE == 0:
        y = x + 0.0
    elif MODE == 1:
        y = x * 0.0
    elif MODE == 2:
        y = x - x
    elif MODE == 3:
        y = (x != x).to(dsl.float32)
    else:
        y = (x + 1e30) - 1e30
    dsl.store(q_ptr + i, y)


def test_passes_do_not_apply_unsafe_float_identities():
    from codegen_helpers import interpret_ir, pipelined_ir
    x = torch.tensor([-0.0, float("nan"), float("inf"), -7.5])
    references = [x + 0.0, x * 0.0, x - x, (x != x).float(), (x + 1e30) - 1e30]
    for mode, reference in enumerate(references):
        for stage in ("frontend", "pipelined"):
            q = torch.zeros(4)
            if stage == "frontend":
                _interpret(_float_identities_kernel, (1,), q, x, MODE=mode)
            else:   # after fold / simplify: x + 0.0, x * 0.0, x - x must not be rewritten for -0.0, NaN, inf
                function, _ = pipelined_ir(_float_identities_kernel, (q, x), dict(MODE=mode), 4)
                interpret_ir(_float_identities_kernel, function, (1, 1, 1), (q, x), dict(MODE=mode))
            assert q.view(torch.int32).tolist() == reference.view(torch.int32).tolist(), (mode, stage)


@dsl.jit
def _add_one_kernel(o_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    i = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    dsl.store(o_ptr + i, dsl.load(x_ptr + i, mask=i < n) + 1, mask=i < n)


def test_bad_grids_and_launch_options_are_clear_errors():
    x, out = torch.ones(8), torch.zeros(8)
    for grid, match in [((-1,), "must be in"), ((2**31,), "must be in"), ((1, 2**16), "must be in"),
                        ((1, 1, 1, 1), "1 to 3 dimensions"), ((), "1 to 3 dimensions"), ((True,), "bool"),
                        ((1.0,), "must be an int"), (None, "tuple of 1 to 3 ints"), (lambda meta: None, "tuple")]:
        with pytest.raises(dsl.LaunchError, match=match):
            _interpret(_add_one_kernel, grid, out, x, 8, BLOCK=8)
    with pytest.raises(dsl.LaunchError, match="num_warps"):
        _add_one_kernel[(1,)](out, x, 8, BLOCK=8, interpret=True, num_warps=3)
    with pytest.raises(TypeError, match="BLOCK"):
        _interpret(_add_one_kernel, (1,), out, x, 8, BLOCK=torch.tensor(8))
    with pytest.raises(TypeError, match="multiple values for argument `n`"):
        _interpret(_add_one_kernel, (1,), out, x, 8, n=8, BLOCK=8)
    _interpret(_add_one_kernel, (0,), out, x, 8, BLOCK=8)          # an empty grid runs nothing
    assert out.tolist() == [0.0] * 8
    _interpret(_add_one_kernel, lambda meta: (dsl.cdiv(8, meta["BLOCK"]),), out, x, 8, BLOCK=4)
    assert out.tolist() == [2.0] * 8
