"""Review (session 25): the kernel launcher / runtime of fusedops.dsl, attacked with the bug classes reported
against Triton's launcher and JIT: argument specialization (16-byte alignment of views with a storage offset,
ints divisible by 16 / by 8 / equal to 1, do_not_specialize), scalar argument types and ranges (int32 / int64 /
uint64 boundaries, float16-annotated scalars as in triton-lang/triton#6176 fixed by #7439, floats beyond
float32), bools, None and constexpr None, defaults and keywords, grids, devices and layouts, the cached-launch
fast path against the full path, and the tensor maps the specialization enables. CPU only: PTX is compiled
with llvmlite for sm_90a, GPU launches go through tests/test_launch_fast_path.py's mocked driver, and values
come from the NumPy interpreter.

Defects found (each fixed; its test below now passes):

1. The cached-launch fast path crashes on a sparse tensor: after one GPU launch of a kernel,
   `k[(1,)](torch.zeros(16).to_sparse(), y, 16, BLOCK=16)` raises the raw
   "RuntimeError: Cannot access data pointer of Tensor that doesn't have storage" from the generated entry
   (it calls `data_ptr()` before any check); the first launch (full path) raises
   "TypeError: argument `x_ptr` of kernel `copy` must be a dense (strided) tensor".
   Expected: that TypeError on every launch.
2. A lazily negated tensor is read without its negation: `z.conj().imag` (z complex) is a float32 view whose
   neg bit is set (`is_neg()`: torch negates on read). The launcher passes its storage as it is, so a copy
   kernel run in the interpreter returns [2., 4.] for z = [1+2j, 3+4j] where the tensor holds [-2., -4.]
   (silently wrong), and a GPU launch accepts it too. Expected: an error naming the argument (resolve_neg()
   it), as the launcher refuses other tensors whose memory does not hold their values (sparse layouts).
3. The interpreter turns a float scalar its parameter cannot hold into inf where a GPU launch raises:
   `k[(1,)](out, 1e40, interpret=True)` (an unannotated float parameter: float32) stores inf, and a
   `a: dsl.float16` parameter given 70000.0 stores inf, while the same launches on the GPU raise
   "LaunchError: argument 1 (a) of kind float32: expected a float within float32's range" (`prepare`'s
   docstring: "a float beyond float32's range, which `run` raises at the launch"). Expected: the interpreter
   raises an error naming the argument too.
4. An annotated narrow integer out of range raises a different exception once the kernel has a cached plan:
   `def k(o_ptr, a: dsl.uint32)`: `k[(1,)](o, -10)` raises TypeError ("annotated uint32; got -10, outside its
   range") on the first launch, but after `k[(1,)](o, 6)` made a plan the same call raises LaunchError
   (the launch key of an int32-range int does not tell -10 from 6, so the packer refuses it). Likewise
   `a: dsl.int8` with 300 after 5. Expected: TypeError whatever the cache holds (code catching the documented
   TypeError must not depend on what was launched before).
5. `@dsl.jit(do_not_specialize=[5])` on a kernel of two parameters raises a bare
   "IndexError: list index out of range"; a name that is not a parameter raises a TypeError naming it.
   Expected: TypeError naming the bad index.
6. A stride of 0 (a broadcast operand, `row.expand(M, K)`) is specialized as divisible by 16, so a
   `make_tensor_descriptor` load feeding a `dsl.dot` is compiled to a TMA copy on sm_90a, and every launch
   then fails: "LaunchError: cannot build a TMA tensor map ... strides of (0,) bytes: each must be a positive
   multiple of 16" (the encoder's message calls this "a bug"). The interpreter computes the product right, and
   sm_80 (or FUSEDOPS_TMA=0) launches it. Expected: the launch works (no TMA for a stride not known to be
   positive).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.errors import CompilationError, LaunchError
from test_launch_fast_path import _cuda, gpu  # noqa: F401  (the mocked driver: a fixture, fake CUDA tensors)


@pytest.fixture(autouse=True)
def _private_cache(monkeypatch, tmp_path):
    """Every compile of this file into a fresh disk cache (no hit from, nor write into, the user's)."""
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)


# ------------------------------------------------------------------------------------------------
# Kernels (fresh JITFunctions per test, so that no specialization or plan leaks between tests)
# ------------------------------------------------------------------------------------------------
def _copy_kernel(**options):
    def copy(x_ptr, y_ptr, n, BLOCK: dsl.constexpr):
        offs = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
        m = offs < n
        dsl.store(y_ptr + offs, dsl.load(x_ptr + offs, mask=m), mask=m)
    return dsl.jit(copy, **options)


def _strided_copy_kernel():
    def strided_copy(x_ptr, y_ptr, stride, n, BLOCK: dsl.constexpr):
        offs = dsl.arange(0, BLOCK)
        m = offs < n
        dsl.store(y_ptr + offs, dsl.load(x_ptr + offs * stride, mask=m), mask=m)
    return dsl.jit(strided_copy)


def _rows_kernel():
    def rows(x_ptr, y_ptr, stride, BLOCK: dsl.constexpr):
        r = dsl.program_id(0)
        offs = dsl.arange(0, BLOCK)
        dsl.store(y_ptr + r * stride + offs, dsl.load(x_ptr + r * stride + offs))
    return dsl.jit(rows)


def _store_scalar_kernel():
    def store_scalar(o_ptr, a):
        dsl.store(o_ptr, a)
    return dsl.jit(store_scalar)


def _store_int64_kernel():
    def store_int64(o_ptr, n):
        dsl.store(o_ptr, n.to(dsl.int64))
    return dsl.jit(store_int64)


def _loads(compiled) -> set:
    return set(re.findall(r"ld\.global[\w.]*", compiled.asm["ptx"]))


def _launched_values(kernel, params: int) -> tuple:
    """The parameter values of a mocked launch's kernelParams array, read with the launcher of the
    kernel's compiled entry whose packer layout fits (the most recently compiled entry that launched)."""
    entries = [e for e in kernel._cache.values() if e.compiled is not None]
    return entries[-1].compiled.launcher(0).packer.read(params)


# ================================================================================================
# (a) the compiled specialization matches the argument
# ================================================================================================
@pytest.mark.parametrize("dtype,offset,aligned", [(torch.float32, 0, True), (torch.float32, 1, False),
                                                  (torch.float16, 1, False), (torch.float16, 8, True),
                                                  (torch.float64, 1, False)])
def test_a_view_with_a_storage_offset_is_compiled_without_the_16_byte_assumption(dtype, offset, aligned):
    """triton-lang/triton#1330's class: a vector access wider than the pointer's real alignment."""
    kernel = _copy_kernel()
    base = torch.zeros(2048, dtype=dtype)
    x, y = base[offset:offset + 1024], torch.zeros(1024, dtype=dtype)
    assert (x.data_ptr() % 16 == 0) == aligned
    loads = _loads(kernel.compile(x, y, 1024, BLOCK=1024, target="sm_90a"))
    if aligned:
        assert loads == {"ld.global.v4.b32"}
    else:
        widest = max(x.element_size(), x.data_ptr() & -x.data_ptr() & 15)    # the address's power-of-two alignment
        assert "ld.global.v4.b32" not in loads
        assert all(("v2" not in op or widest >= 8) for op in loads), loads


@pytest.mark.parametrize("stride,expected", [(16, "ld.global.v4.b32"), (8, "ld.global.v2.b32"), (4, "ld.global.b8")])
def test_an_int8_row_stride_divisible_by_8_is_not_taken_for_16_bytes(stride, expected):
    """The divisible-by-8 hint (there for rows of 8 16-bit elements) gives 8 bytes only for 1-byte elements."""
    kernel = _rows_kernel()
    x = torch.zeros(64, dtype=torch.int8)
    assert _loads(kernel.compile(x, x, stride, BLOCK=2048, target="sm_90a")) == {expected}


def test_do_not_specialize_a_pointer_compiles_one_kernel_without_the_alignment_hint():
    kernel = _copy_kernel(do_not_specialize=["x_ptr"])
    base = torch.zeros(1100)
    aligned = kernel.compile(base[:1024], base[:1024], 1024, BLOCK=1024, target="sm_90a")
    misaligned = kernel.compile(base[1:1025], base[:1024], 1024, BLOCK=1024, target="sm_90a")
    assert aligned is misaligned and len(kernel._cache) == 1
    assert "ld.global.v4.b32" not in _loads(aligned)


def test_stride_equal_to_one_is_a_constant_and_other_strides_stay_runtime(gpu):
    kernel = _strided_copy_kernel()
    x, y = _cuda(torch.zeros(64)), _cuda(torch.zeros(64))
    kernel[(1,)](x, y, 1, 16, BLOCK=16)
    kernel[(1,)](x, y, 17, 16, BLOCK=16)     # 17 & 15 == 1, but 17 != 1: a new specialization
    names = sorted(e.compiled.parameter_names for e in kernel._cache.values())
    assert names == [("x_ptr", "y_ptr", "n"), ("x_ptr", "y_ptr", "stride", "n")]
    assert _launched_values(kernel, gpu[-1][1])[2:] == (17, 16)


# ================================================================================================
# (b) the interpreter's values
# ================================================================================================
@pytest.mark.parametrize("stride", [1, 2, 3, 16])
def test_interpreter_strided_reads_for_every_specialization_of_the_stride(stride):
    kernel = _strided_copy_kernel()
    x = torch.arange(16 * 16, dtype=torch.float32)
    y = torch.zeros(16)
    kernel[(1,)](x, y, stride, 16, BLOCK=16, interpret=True)
    assert torch.equal(y, x[::stride][:16])


def test_interpreter_views_with_offsets_spans_and_aliases():
    kernel = _copy_kernel()
    base = torch.arange(40, dtype=torch.float16)
    y = torch.zeros(16, dtype=torch.float16)
    kernel[(1,)](base[3:19], y, 16, BLOCK=16, interpret=True)      # misaligned view
    assert torch.equal(y, base[3:19])
    # a column of a matrix: 4 elements whose span (3 * 8 + 1 elements) is past its numel
    rows = _rows_kernel()
    m = torch.arange(32, dtype=torch.float32).reshape(4, 8)
    out = torch.zeros(4, 8)
    rows[(4,)](m[:, 1:], out[:, 1:], 8, BLOCK=4, interpret=True)
    assert torch.equal(out[:, 1:5], m[:, 1:5])
    # in place on a bfloat16 tensor: x and y are one storage (the interpreter writes it once)
    def add_one(x_ptr, y_ptr, BLOCK: dsl.constexpr):
        offs = dsl.arange(0, BLOCK)
        dsl.store(y_ptr + offs, dsl.load(x_ptr + offs) + 1.0)
    t = torch.arange(8, dtype=torch.bfloat16)
    expected = t + 1
    dsl.jit(add_one)[(1,)](t, t, BLOCK=8, interpret=True)
    assert torch.equal(t, expected)


def test_interpreter_empty_tensors_and_empty_grids():
    kernel = _copy_kernel()
    kernel[(1,)](torch.empty(0), torch.empty(0), 0, BLOCK=8, interpret=True)
    y = torch.full((8,), 7.0)
    kernel[(0,)](torch.ones(8), y, 8, BLOCK=8, interpret=True)
    kernel[(4, 0)](torch.ones(8), y, 8, BLOCK=8, interpret=True)
    assert torch.equal(y, torch.full((8,), 7.0))


_INT_BOUNDARIES = [(2**31 - 1, dsl.int32), (2**31, dsl.int64), (-2**31, dsl.int32), (-2**31 - 1, dsl.int64),
                   (2**63 - 1, dsl.int64), (-2**63, dsl.int64), (2**63, dsl.uint64), (2**64 - 1, dsl.uint64)]


@pytest.mark.parametrize("value,dtype", _INT_BOUNDARIES, ids=str)
def test_int_arguments_at_the_width_boundaries(value, dtype, gpu):
    """An int argument takes the narrowest of int32 / int64 / uint64 that holds it; the interpreter and a
    (mocked) GPU launch see the same value."""
    kernel = _store_int64_kernel()
    out = torch.zeros(1, dtype=torch.int64)
    kernel[(1,)](out, value, interpret=True)
    bits = value - 2**64 if value >= 2**63 else value
    assert out.item() == bits
    kernel[(1,)](_cuda(torch.zeros(1, dtype=torch.int64)), value)
    ((key, entry),) = [(k, e) for k, e in kernel._cache.items() if k.arch is not None]
    assert key.args[1].type == dtype
    assert _launched_values(kernel, gpu[-1][1])[1] == value


def test_an_int_wider_than_64_bits_is_refused_naming_it():
    kernel = _store_int64_kernel()
    with pytest.raises(TypeError, match="argument `n` .* does not fit in 64 bits"):
        kernel[(1,)](torch.zeros(1, dtype=torch.int64), 2**64, interpret=True)
    with pytest.raises(TypeError, match="argument `n`"):
        kernel[(1,)](torch.zeros(1, dtype=torch.int64), -2**63 - 1, interpret=True)


def test_float16_annotated_scalars_are_packed_as_float16(gpu):
    """triton-lang/triton#6176 (fixed by #7439): a float passed to a `tl.float16` parameter arrived as 0."""
    def half_arg(o_ptr, a: dsl.float16):
        dsl.store(o_ptr, a.to(dsl.float32))
    kernel = dsl.jit(half_arg)
    for value, expected in [(42.0, 42.0), (65500.0, 65504.0), (-65500.0, -65504.0), (1e-8, 0.0)]:
        out = torch.zeros(1)
        kernel[(1,)](out, value, interpret=True)
        assert out.item() == expected
        kernel[(1,)](_cuda(torch.zeros(1)), value)
        assert _launched_values(kernel, gpu[-1][1])[1] == expected


def test_python_floats_are_float32_and_numpy_float64_keeps_its_bits():
    kernel = _store_scalar_kernel()
    out = torch.zeros(1, dtype=torch.float64)
    kernel[(1,)](out, 0.1, interpret=True)
    assert out.item() == float(np.float32(0.1))
    kernel[(1,)](out, np.float64(0.1), interpret=True)
    assert out.item() == 0.1
    assert {k.args[1].type for k in kernel._cache} == {dsl.float32, dsl.float64}


def test_bool_arguments_are_one_runtime_kernel_for_true_and_false(gpu):
    def flagged(o_ptr, flag):
        if flag:
            dsl.store(o_ptr, 1.0)
        else:
            dsl.store(o_ptr, 2.0)
    kernel = dsl.jit(flagged)
    out = torch.zeros(1)
    kernel[(1,)](out, True, interpret=True)
    assert out.item() == 1.0
    kernel[(1,)](out, False, interpret=True)
    assert out.item() == 2.0
    o = _cuda(torch.zeros(1))
    sent = []
    for flag in (True, False, True):
        kernel[(1,)](o, flag)
        sent.append(_launched_values(kernel, gpu[-1][1])[1])     # (the packed buffer is reused per launch)
    compiled = [e.compiled for e in kernel._cache.values() if e.compiled is not None]
    assert len(compiled) == 1 and compiled[0].parameter_names == ("o_ptr", "flag")
    assert sent == [1, 0, 1] and len(kernel._plans) == 1      # a bool keys its class, not its value
    kernel[(1,)](o, 1)          # an int 1 is not the bool True: the IR constant 1, another kernel
    assert len([e for e in kernel._cache.values() if e.compiled is not None]) == 2


def _optional_bias_kernel():
    def biased(x_ptr, b_ptr, y_ptr, SCALE: dsl.constexpr = None, BLOCK: dsl.constexpr = 8):
        offs = dsl.arange(0, BLOCK)
        v = dsl.load(x_ptr + offs)
        if b_ptr is not None:
            v = v + dsl.load(b_ptr + offs)
        if SCALE is not None:
            v = v * SCALE
        dsl.store(y_ptr + offs, v)
    return dsl.jit(biased)


def test_none_arguments_and_constexpr_none_defaults(gpu):
    kernel = _optional_bias_kernel()
    x, b = torch.arange(8.0), torch.ones(8)
    y = torch.zeros(8)
    kernel[(1,)](x, None, y, interpret=True)
    assert torch.equal(y, x)
    kernel[(1,)](x, b, y, SCALE=2.0, interpret=True)
    assert torch.equal(y, (x + 1) * 2)
    kernel[(1,)](x, b, y, None, interpret=True)         # an explicit None, by position
    assert torch.equal(y, x + 1)
    # On the GPU a None and a tensor (either way round) are separate kernels, the None one without the parameter.
    xc, bc, yc = _cuda(x), _cuda(b), _cuda(y)
    for args in [(xc, None, yc), (xc, bc, yc), (xc, None, yc), (xc, bc, yc)]:
        kernel[(1,)](*args)
    names = sorted(e.compiled.parameter_names for e in kernel._cache.values() if e.compiled is not None)
    assert names == [("x_ptr", "b_ptr", "y_ptr"), ("x_ptr", "y_ptr")]
    assert len(kernel._plans) == 2
    assert _launched_values(kernel, gpu[-1][1]) == (xc.data_ptr(), bc.data_ptr(), yc.data_ptr())


def test_defaults_and_keywords_in_any_order_bind_like_python(gpu):
    """triton-lang/triton#1943's class: defaults of the kernel's signature in the launcher."""
    def scaled(x_ptr, y_ptr, n, factor=3.0, BLOCK: dsl.constexpr = 8, bias=0.5):
        offs = dsl.arange(0, BLOCK)
        m = offs < n
        dsl.store(y_ptr + offs, dsl.load(x_ptr + offs, mask=m) * factor + bias, mask=m)
    kernel = dsl.jit(scaled)
    x = torch.arange(8.0)
    for call in [lambda y: kernel[(1,)](x, y, 8, interpret=True),
                 lambda y: kernel[(1,)](bias=0.5, n=8, y_ptr=y, x_ptr=x, interpret=True),
                 lambda y: kernel[(1,)](x, y, 8, 3.0, 8, 0.5, interpret=True)]:
        y = torch.zeros(8)
        call(y)
        assert torch.equal(y, x * 3 + 0.5)
    xc, yc = _cuda(x), _cuda(torch.zeros(8))
    sent = []
    for call in [lambda: kernel[(1,)](xc, yc, 8),
                 lambda: kernel[(1,)](bias=0.5, BLOCK=8, n=8, y_ptr=yc, x_ptr=xc),   # the same key: the plan
                 lambda: kernel[(1,)](xc, yc, 8, bias=-1.0)]:
        call()
        sent.append(_launched_values(kernel, gpu[-1][1]))    # (the packed buffer is reused per launch)
    assert len(kernel._plans) == 1
    assert sent == [(xc.data_ptr(), yc.data_ptr(), 8, 3.0, 0.5)] * 2 + [(xc.data_ptr(), yc.data_ptr(), 8, 3.0, -1.0)]


# ================================================================================================
# (c) bad input: a clear error naming the argument (or the grid entry)
# ================================================================================================
@pytest.mark.parametrize("make,error,pattern", [
    (lambda x, y: ((x, y, "8"), {}), TypeError, r"argument `n` of kernel `copy` must be"),
    (lambda x, y: ((x, y, np.int32(8)), {}), TypeError, r"argument `n` of kernel `copy` must be"),
    (lambda x, y: ((x.to(torch.complex64), y, 8), {}), TypeError, r"argument `x_ptr` of kernel `copy`.*complex64"),
    (lambda x, y: ((torch.zeros(8, device="meta"), y, 8), {}), ValueError, r"argument `x_ptr`.*meta tensor"),
    (lambda x, y: ((x, y, 8), {"BLOCK": torch.tensor(8)}), TypeError, r"argument `BLOCK` .*constexpr"),
    (lambda x, y: ((x, y, 8), {"BLOCK": np.int64(8)}), TypeError, r"argument `BLOCK` .*constexpr"),
    (lambda x, y: ((x, y, torch.tensor(8)), {}), CompilationError, r"a 0-d one included, is a pointer"),
    (lambda x, y: ((x.to_sparse(), y, 8), {}), TypeError, r"argument `x_ptr` .*dense \(strided\)"),
])
def test_bad_arguments_raise_naming_them(make, error, pattern):
    args, kwargs = make(torch.arange(8.0), torch.zeros(8))
    kwargs.setdefault("BLOCK", 8)
    with pytest.raises(error, match=pattern):
        _copy_kernel()[(1,)](*args, **kwargs, interpret=True)


@pytest.mark.parametrize("grid,pattern", [((2.0,), "grid entry 0 .* must be an int"), ((1, 65536), "grid entry 1"),
                                          ((2**31,), "grid entry 0"), ((), "1 to 3 dimensions"),
                                          ((True,), "grid entry 0 .* bool"), (lambda meta: None, "NoneType"),
                                          (lambda meta: (meta["n"] / meta["BLOCK"],), "grid entry 0")])
def test_bad_grids_raise_launch_errors_on_both_paths(grid, pattern, gpu):
    kernel = _copy_kernel()
    x, y = torch.arange(8.0), torch.zeros(8)
    with pytest.raises(LaunchError, match=pattern):
        kernel[grid](x, y, 8, BLOCK=8, interpret=True)
    xc, yc = _cuda(x), _cuda(y)
    kernel[(1,)](xc, yc, 8, BLOCK=8)
    kernel[(1,)](xc, yc, 8, BLOCK=8)     # a plan: the next launches go through the generated entry
    with pytest.raises(LaunchError, match=pattern):
        kernel[grid](xc, yc, 8, BLOCK=8)
    assert len(gpu) == 2


def test_grid_callables_get_defaults_and_numpy_sizes_are_accepted(gpu):
    kernel = _copy_kernel()
    x, y = torch.arange(16.0), torch.zeros(16)
    seen = []
    kernel[lambda meta: seen.append(dict(meta)) or (np.int64(meta["n"] // meta["BLOCK"]),)](x, y, 16, BLOCK=8,
                                                                                          interpret=True)
    assert torch.equal(y, x) and seen[0]["BLOCK"] == 8 and seen[0]["num_warps"] == 4
    xc, yc = _cuda(x), _cuda(y)
    for _ in range(2):
        kernel[lambda meta: (np.int32(meta["n"] // meta["BLOCK"]), np.int64(1))](xc, yc, 16, BLOCK=8)
    assert [grid for grid, _ in gpu] == [(2, 1, 1), (2, 1, 1)]


# ================================================================================================
# (d) launches differing in a specialization-relevant property never share a kernel
# ================================================================================================
def test_aligned_and_misaligned_views_of_one_storage_take_their_own_kernels(gpu):
    kernel = _copy_kernel()
    base = torch.zeros(2048)
    y = _cuda(torch.zeros(1024))
    aligned, misaligned = _cuda(base[:1024]), _cuda(base[1:1025])
    order = [aligned, misaligned, aligned, misaligned]
    for x in order:
        kernel[(1,)](x, y, 1024, BLOCK=1024)
    hinted = {k.args[0].divisible_by_16: e.compiled for k, e in kernel._cache.items()}
    assert set(hinted) == {True, False}
    assert "ld.global.v4.b32" in _loads(hinted[True]) and "ld.global.v4.b32" not in _loads(hinted[False])
    assert len(kernel._plans) == 2 and len(gpu) == 4     # one plan per alignment, every launch launched


def test_two_kernels_with_one_body_and_two_names_keep_their_names(tmp_path, monkeypatch):
    """The on-disk cache is keyed by the IR, which holds the kernel's name: no cross-kernel hit."""
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    def first(o_ptr, B: dsl.constexpr):
        dsl.store(o_ptr + dsl.arange(0, B), 1.0)
    def second(o_ptr, B: dsl.constexpr):
        dsl.store(o_ptr + dsl.arange(0, B), 1.0)
    o = torch.zeros(4)
    a = dsl.jit(first).compile(o, B=4, target="sm_90a")
    b = dsl.jit(second).compile(o, B=4, target="sm_90a")
    assert (a.name, b.name) == ("first", "second")
    assert ".entry first" in a.asm["ptx"] and ".entry second" in b.asm["ptx"]


# ================================================================================================
# DEFECTS
# ================================================================================================
def test_sparse_tensor_after_a_cached_launch_raises_the_full_paths_type_error(gpu):
    kernel = _copy_kernel()
    x, y = _cuda(torch.zeros(16)), _cuda(torch.zeros(16))
    kernel[(1,)](x, y, 16, BLOCK=16)
    with pytest.raises(TypeError, match=r"argument `x_ptr` .*dense \(strided\)"):
        kernel[(1,)](torch.zeros(16).to_sparse(), y, 16, BLOCK=16)


def test_a_lazily_negated_view_is_refused_or_read_with_its_sign():
    z = torch.tensor([1 + 2j, 3 + 4j], dtype=torch.complex64)
    imag = z.conj().imag
    assert imag.is_neg() and torch.equal(imag, torch.tensor([-2.0, -4.0]))
    y = torch.zeros(2)
    try:
        _strided_copy_kernel()[(1,)](imag, y, imag.stride(0), 2, BLOCK=2, interpret=True)
    except (TypeError, ValueError) as error:
        assert "x_ptr" in str(error)
        return
    assert torch.equal(y, imag), f"read {y.tolist()}, the tensor holds {imag.tolist()}"


@pytest.mark.parametrize("annotated,value", [(False, 1e40), (False, 3.5e38), (True, 70000.0)])
def test_interpreter_refuses_floats_beyond_the_parameters_range_like_the_gpu(annotated, value, gpu):
    def plain(o_ptr, a):
        dsl.store(o_ptr, a)

    def half(o_ptr, a: dsl.float16):
        dsl.store(o_ptr, a.to(dsl.float32))
    with pytest.raises(LaunchError, match=r"\(a\)"):     # the GPU path (mocked driver)
        dsl.jit(half if annotated else plain)[(1,)](_cuda(torch.zeros(1)), value)
    out = torch.zeros(1)
    with pytest.raises((LaunchError, ValueError, TypeError), match="`?a`?"):
        dsl.jit(half if annotated else plain)[(1,)](out, value, interpret=True)


@pytest.mark.parametrize("annotation,good,bad", [("uint32", 6, -10), ("int8", 5, 300)])
def test_an_annotated_int_out_of_range_raises_type_error_whatever_the_cache(annotation, good, bad, gpu):
    def narrow(o_ptr, a: dsl.int64):
        dsl.store(o_ptr, a.to(dsl.int64))
    narrow.__annotations__["a"] = getattr(dsl, annotation)
    kernel = dsl.jit(narrow)
    o = _cuda(torch.zeros(1, dtype=torch.int64))
    with pytest.raises(TypeError, match=f"annotated {annotation}"):
        kernel[(1,)](o, bad)             # the full path
    kernel[(1,)](o, good)
    kernel[(1,)](o, good)
    assert len(kernel._plans) == 1
    with pytest.raises(TypeError, match=f"annotated {annotation}"):
        kernel[(1,)](o, bad)             # the cached plan's launch key does not tell bad from good


def test_do_not_specialize_index_out_of_range_is_a_type_error():
    def two(a, b):
        pass
    with pytest.raises(TypeError, match="5"):
        dsl.jit(do_not_specialize=[5])(two)


def _descriptor_matmul():
    def desc_mm(c_ptr, a_ptr, b_ptr, M, N, K, s_am, s_bk, s_cm,
                BM: dsl.constexpr, BN: dsl.constexpr, BK: dsl.constexpr):
        pm = dsl.program_id(0)
        pn = dsl.program_id(1)
        da = dsl.make_tensor_descriptor(a_ptr, (M, K), (s_am, 1), (BM, BK))
        db = dsl.make_tensor_descriptor(b_ptr, (K, N), (s_bk, 1), (BK, BN))
        acc = dsl.zeros((BM, BN), dsl.float32)
        for k in range(0, K, BK):
            acc = dsl.dot(da.load((pm * BM, k)), db.load((k, pn * BN)), acc)
        rm = pm * BM + dsl.arange(0, BM)
        rn = pn * BN + dsl.arange(0, BN)
        dsl.store(c_ptr + rm[:, None] * s_cm + rn[None, :], acc.to(dsl.float16),
                  mask=(rm[:, None] < M) & (rn[None, :] < N))
    return dsl.jit(desc_mm)


def _broadcast_operands(seed=0):
    g = torch.Generator().manual_seed(seed)
    row = torch.randn(1, 64, generator=g).half()
    return row.expand(64, 64), torch.randn(64, 64, generator=g).half()      # A: stride (0, 1)


def test_interpreter_descriptor_matmul_with_a_broadcast_operand(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_TMA", "1")
    a, b = _broadcast_operands()
    c = torch.zeros(64, 64, dtype=torch.float16)
    _descriptor_matmul()[(1, 1)](c, a, b, 64, 64, 64, a.stride(0), b.stride(0), c.stride(0), BM=64, BN=64, BK=32,
                                 interpret=True)
    torch.testing.assert_close(c.float(), (a.double() @ b.double()).float(), atol=2e-2, rtol=2e-2)


def test_a_broadcast_operand_launches_on_sm90a(gpu, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_TMA", "1")
    a, b = _broadcast_operands()
    c = torch.zeros(64, 64, dtype=torch.float16)
    kernel = _descriptor_matmul()
    kernel[(1, 1)](_cuda(c), _cuda(a), _cuda(b), 64, 64, 64, 0, b.stride(0), c.stride(0), BM=64, BN=64, BK=32)
    assert len(gpu) == 1
