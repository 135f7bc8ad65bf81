"""`dsl.gather`, `dsl.histogram` and `dsl.cat` (fusedops/dsl/language/gather_ops.py), Triton's `tl.gather`,
`tl.histogram` and `tl.cat`.

References are exact: torch.gather on the values' bits (an out-of-range index gives 0, as gather_ops.py pins
down), torch.bincount of the in-range values checked against torch.histc with unit bins (values outside
[0, num_bins) and masked-off elements are not counted), torch.cat on the bits. Inputs are fresh random values
loaded under masks (odd sizes, size-1 dims), with -0.0 and NaN payloads that must survive, indices and values
that fall outside the range; outputs are poisoned. The PTX is assembled by ptxas for sm_80 and sm_90a; the
cuda-marked tests run the compiled kernels against the same references and the interpreter.
"""

from __future__ import annotations

import re

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl import CompilationError
from fusedops.dsl.target import assemble, ptxas_available
from helpers import poison
from kernel_source import jit_from_source

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


# -- kernels ----------------------------------------------------------------------------------------------------
@dsl.jit
def _gather_kernel(o_ptr, x_ptr, i_ptr, nr, nc, R: dsl.constexpr, C: dsl.constexpr, IR: dsl.constexpr,
                   IC: dsl.constexpr, AXIS: dsl.constexpr):
    # three regions of IR * IC: gather(x, i, AXIS), the member form with the axis negative, and the gathered
    # booleans x != 0 (int1 values) as x's dtype
    r = dsl.arange(0, R)[:, None]
    c = dsl.arange(0, C)[None, :]
    x = dsl.load(x_ptr + r * nc + c, mask=(r < nr) & (c < nc), other=0)
    ir = dsl.arange(0, IR)[:, None]
    ic = dsl.arange(0, IC)[None, :]
    i = dsl.load(i_ptr + ir * IC + ic)
    out = o_ptr + ir * IC + ic
    dsl.store(out, dsl.gather(x, i, AXIS))
    dsl.store(out + IR * IC, x.gather(i, AXIS - 2))
    dsl.store(out + 2 * IR * IC, dsl.gather(x != 0, i, axis=AXIS).to(x.dtype))


@dsl.jit
def _gather_1d_kernel(o_ptr, x_ptr, i_ptr, n, N: dsl.constexpr, M: dsl.constexpr):
    offs = dsl.arange(0, N)
    x = dsl.load(x_ptr + offs, mask=offs < n, other=0)
    j = dsl.arange(0, M)
    dsl.store(o_ptr + j, dsl.gather(x, dsl.load(i_ptr + j), 0))


@dsl.jit
def _histogram_kernel(h_ptr, x_ptr, n, nr, nc, N: dsl.constexpr, R: dsl.constexpr, C: dsl.constexpr,
                      BINS: dsl.constexpr):
    # five histograms of BINS: the n values (masked), all N loaded (the masked-off 0s count), the nr x nc values
    # as a 2-D block (masked-off: -1, never counted), its even values, its first nr - 1 rows (a (R, 1) mask)
    offs = dsl.arange(0, N)
    x = dsl.load(x_ptr + offs, mask=offs < n, other=0)
    b = dsl.arange(0, BINS)
    dsl.store(h_ptr + b, dsl.histogram(x, BINS, mask=offs < n))
    dsl.store(h_ptr + BINS + b, dsl.histogram(x, BINS))
    r = dsl.arange(0, R)[:, None]
    c = dsl.arange(0, C)[None, :]
    y = dsl.load(x_ptr + r * nc + c, mask=(r < nr) & (c < nc), other=-1)
    dsl.store(h_ptr + 2 * BINS + b, y.histogram(BINS))
    dsl.store(h_ptr + 3 * BINS + b, dsl.histogram(y, num_bins=BINS, mask=y % 2 == 0))
    dsl.store(h_ptr + 4 * BINS + b, dsl.histogram(y, BINS, r < nr - 1))


@dsl.jit
def _cat_kernel(o_ptr, x_ptr, y_ptr, nr, nc, R: dsl.constexpr, C: dsl.constexpr):
    # four regions of 2 * R * C: cat along 0, along 1 (can_reorder=True), cat(y, x) along -1, of the raveled blocks
    r = dsl.arange(0, R)[:, None]
    c = dsl.arange(0, C)[None, :]
    mask = (r < nr) & (c < nc)
    x = dsl.load(x_ptr + r * nc + c, mask=mask, other=0)
    y = dsl.load(y_ptr + r * nc + c, mask=mask, other=0)
    RC: dsl.constexpr = R * C
    r2 = dsl.arange(0, 2 * R)[:, None]
    c2 = dsl.arange(0, 2 * C)[None, :]
    dsl.store(o_ptr + r2 * C + c, dsl.cat(x, y))
    dsl.store(o_ptr + 2 * RC + r * (2 * C) + c2, dsl.cat(x, y, can_reorder=True, dim=1))
    dsl.store(o_ptr + 4 * RC + r * (2 * C) + c2, dsl.cat(y, x, dim=-1))
    dsl.store(o_ptr + 6 * RC + dsl.arange(0, 2 * RC), dsl.cat(dsl.ravel(x), dsl.ravel(y), False))


# -- references -------------------------------------------------------------------------------------------------
_NAN_BITS = {torch.float32: 0x7FC01234, torch.float16: 0x7E12, torch.bfloat16: 0x7FC1}
_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(_BITS[t.element_size()]) if t.dtype.is_floating_point else t


def _random(shape, torch_dtype, g):
    if torch_dtype.is_floating_point:
        x = torch.randn(shape, generator=g).to(torch_dtype)
        flat = x.view(-1)
        if flat.numel() >= 3:      # -0.0, a NaN with a payload and an infinity must move unchanged
            flat[0] = -0.0
            _bits(flat)[1] = _NAN_BITS[torch_dtype]
            flat[2] = float("-inf")
        return x
    info = torch.iinfo(torch_dtype)
    return torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64).to(torch_dtype)


def _padded(x: torch.Tensor, R: int, C: int) -> torch.Tensor:
    out = torch.zeros((R, C), dtype=x.dtype)
    out[:x.shape[0], :x.shape[1]] = x
    return out


def _device_run(kernel, device, *args, **constexprs):
    moved = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    kernel[(1,)](*moved, interpret=device == "cpu", **constexprs)
    return moved[0].cpu()


def _gather_reference(src: torch.Tensor, index: torch.Tensor, axis: int) -> torch.Tensor:
    """torch.gather on src's bits, 0 where the index is outside [0, src.shape[axis])."""
    valid = (index >= 0) & (index < src.shape[axis])
    picked = torch.gather(_bits(src), axis, torch.where(valid, index.long(), 0))
    return torch.where(valid, picked, torch.zeros((), dtype=picked.dtype))


# (R, C, rows, cols loaded, index rows, index cols, axis)
_GATHER_SHAPES = [(4, 8, 3, 7, 4, 16, 1), (8, 2, 5, 2, 16, 2, 0), (1, 16, 1, 13, 1, 4, 1), (1, 8, 1, 5, 4, 8, 0),
                  (4, 1, 3, 1, 2, 1, 0)]


def _gather_case(torch_dtype, index_dtype, shape, seed, device="cpu"):
    R, C, nr, nc, IR, IC, axis = shape
    g = torch.Generator().manual_seed(seed)
    x = _random((nr, nc), torch_dtype, g)
    size = (R, C)[axis]
    index = torch.randint(-2, size + 2, (IR, IC), generator=g).to(index_dtype)   # out of range at both ends
    if index_dtype == torch.int64:
        index.view(-1)[-1] = 2**32 + 1           # in range if truncated to 32 bits: must give 0
    out = poison(torch.empty(3 * IR * IC, dtype=torch_dtype))
    got = _device_run(_gather_kernel, device, out, x, index, nr, nc, R=R, C=C, IR=IR, IC=IC, AXIS=axis)
    src = _padded(x, R, C)
    flags = (src != 0).to(torch_dtype)
    want = torch.cat([_gather_reference(src, index, axis).reshape(-1)] * 2 +
                     [_bits(_gather_reference(flags, index, axis)).reshape(-1)])
    return _bits(got), want


def _histogram_values(torch_dtype, n, bins, g):
    """Values in [-3, bins + 3) (unsigned: [0, bins + 3)), with the dtype's extremes and values that wrap into
    range when truncated to a narrower integer."""
    low = 0 if torch_dtype == torch.uint8 else -3
    x = torch.randint(low, bins + 3, (n,), generator=g, dtype=torch.int64)
    info = torch.iinfo(torch_dtype)
    extremes = [info.min, info.max]
    if info.bits >= 16:
        extremes.append(256 + 1)                  # 1 if truncated to 8 bits
    if info.bits >= 32:
        extremes.append(2**16 + 2)                # 2 if truncated to 16 bits
    if info.bits == 64:
        extremes += [2**33 + 1, -2**32]           # 1 and 0 if truncated to 32 bits
    for k, value in enumerate(extremes[:max(n - 1, 0)]):
        x[(k * 7 + 1) % n] = value
    return x.to(torch_dtype)


def _counts(values: torch.Tensor, bins: int) -> torch.Tensor:
    v = values.reshape(-1).long()
    want = torch.bincount(v[(v >= 0) & (v < bins)], minlength=bins).to(torch.int32)
    unit_bins = torch.histc(v.double(), bins=bins, min=-0.5, max=bins - 0.5).to(torch.int32)   # a second opinion
    assert torch.equal(want, unit_bins)
    return want


# (N, n, R, C, rows, cols, bins)
_HISTOGRAM_SHAPES = [(32, 29, 4, 8, 3, 7, 8), (16, 1, 1, 16, 1, 1, 4), (8, 8, 2, 4, 2, 4, 1), (64, 50, 8, 8, 5, 8, 32)]


def _histogram_case(torch_dtype, shape, seed, device="cpu"):
    N, n, R, C, nr, nc, bins = shape
    g = torch.Generator().manual_seed(seed)
    x = _histogram_values(torch_dtype, n, bins, g)
    out = poison(torch.empty(5 * bins, dtype=torch.int32))
    got = _device_run(_histogram_kernel, device, out, x, n, nr, nc, N=N, R=R, C=C, BINS=bins)
    block = x[:nr * nc].reshape(nr, nc)
    want = torch.cat([_counts(x, bins), _counts(torch.cat([x, torch.zeros(N - n, dtype=x.dtype)]), bins),
                      _counts(block, bins), _counts(block[block % 2 == 0], bins), _counts(block[:nr - 1], bins)])
    return got, want


_CAT_SHAPES = [(4, 8, 3, 7), (1, 16, 1, 13), (8, 1, 5, 1), (2, 2, 2, 2)]     # (R, C, rows, cols loaded)


def _cat_case(torch_dtype, shape, seed, device="cpu"):
    R, C, nr, nc = shape
    g = torch.Generator().manual_seed(seed)
    x, y = _random((nr, nc), torch_dtype, g), _random((nr, nc), torch_dtype, g)
    out = poison(torch.empty(8 * R * C, dtype=torch_dtype))
    got = _device_run(_cat_kernel, device, out, x, y, nr, nc, R=R, C=C)
    a, b = _bits(_padded(x, R, C)), _bits(_padded(y, R, C))
    want = torch.cat([torch.cat([a, b]).reshape(-1), torch.cat([a, b], 1).reshape(-1),
                      torch.cat([b, a], -1).reshape(-1), torch.cat([a.reshape(-1), b.reshape(-1)])])
    return _bits(got), want


# -- the interpreter against the references ----------------------------------------------------------------------
_ALL_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16, torch.int32,
               torch.int64]


@pytest.mark.parametrize("torch_dtype", _ALL_DTYPES)
def test_gather_moves_every_bit_of_every_dtype(torch_dtype):
    got, want = _gather_case(torch_dtype, torch.int32, _GATHER_SHAPES[0], seed=11)
    assert torch.equal(got, want)


@pytest.mark.parametrize("shape", _GATHER_SHAPES[1:])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int8])
def test_gather_along_either_axis_with_size_one_dims(shape, index_dtype):
    got, want = _gather_case(torch.float16, index_dtype, shape, seed=sum(shape))
    assert torch.equal(got, want)


@pytest.mark.parametrize("N, n, M", [(8, 5, 16), (16, 16, 4), (1, 1, 2)])
def test_gather_of_1d_blocks(N, n, M):
    g = torch.Generator().manual_seed(N * M)
    x = _random((n,), torch.float32, g)
    index = torch.randint(-1, N + 1, (M,), generator=g, dtype=torch.int32)
    out = poison(torch.empty(M))
    got = _device_run(_gather_1d_kernel, "cpu", out, x, index, n, N=N, M=M)
    src = torch.cat([x, torch.zeros(N - n)])
    assert torch.equal(_bits(got), _gather_reference(src, index, 0))


@pytest.mark.parametrize("torch_dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64])
def test_histogram_counts_in_range_values_of_every_integer_dtype(torch_dtype):
    got, want = _histogram_case(torch_dtype, _HISTOGRAM_SHAPES[0], seed=torch_dtype.itemsize)
    assert torch.equal(got, want)


@pytest.mark.parametrize("shape", _HISTOGRAM_SHAPES[1:])
def test_histogram_shapes_masks_and_one_bin(shape):
    got, want = _histogram_case(torch.int32, shape, seed=shape[0] + shape[-1])
    assert torch.equal(got, want)


@pytest.mark.parametrize("torch_dtype, shape", [(torch.float16, _CAT_SHAPES[0]), (torch.int8, _CAT_SHAPES[1]),
                                                (torch.bfloat16, _CAT_SHAPES[2]), (torch.int64, _CAT_SHAPES[3]),
                                                (torch.float32, _CAT_SHAPES[0])])
def test_cat_keeps_the_order_and_every_bit(torch_dtype, shape):
    got, want = _cat_case(torch_dtype, shape, seed=shape[0] * 10 + shape[1])
    assert torch.equal(got, want)


def test_cat_of_pointers_and_booleans():
    kernel = jit_from_source(
        "def k(o_ptr, x_ptr, y_ptr, n):\n"
        "    a = dsl.arange(0, 4)\n"
        "    p = dsl.cat(x_ptr + a, y_ptr + a)\n"                   # blocks of pointers, then loaded
        "    dsl.store(o_ptr + dsl.arange(0, 8), dsl.load(p))\n"
        "    dsl.store(o_ptr + 8 + dsl.arange(0, 8), dsl.cat(a < n, a > n).to(dsl.float32))\n",
        "<cat pointers>")
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(4, generator=g), torch.randn(4, generator=g)
    out = poison(torch.empty(16))
    kernel[(1,)](out, x, y, 1, interpret=True)
    a = torch.arange(4)
    assert torch.equal(out, torch.cat([x, y, (a < 1).float(), (a > 1).float()]))


def test_names_are_exported_and_no_longer_refused():
    from fusedops.dsl.language.triton_names import missing_name_hint

    for name in ("gather", "histogram", "cat"):
        assert name in dsl.__all__ and missing_name_hint(name) == ""
        with pytest.raises(RuntimeError, match=f"dsl.{name} can only be called inside a @dsl.jit kernel"):
            getattr(dsl, name)(None, None)


_ERROR_KERNEL = """
def k(o_ptr, x_ptr, n):
    r = dsl.arange(0, 8)[:, None]
    c = dsl.arange(0, 4)[None, :]
    x = dsl.load(x_ptr + r * 4 + c)
    i = x.to(dsl.int32)
    v = {expression}
    dsl.store(o_ptr + r * 4 + c, x)
"""


@pytest.mark.parametrize("expression, message", [
    ("dsl.gather(x, x, 0)", "gather: index must be a block of integers, got float32"),
    ("dsl.gather(x, i, 2)", r"gather: axis must be a constexpr int in \[-2, 2\) for a block of rank 2, got 2"),
    ("dsl.gather(x, i, n)", "gather: axis must be a constexpr int .* got a runtime int32 value"),
    ("dsl.gather(x, dsl.reshape(i, (4, 8)), 0)", r"src's sizes in every dim but axis 0; got src \(8, 4\) and index "
                                                 r"\(4, 8\)"),
    ("dsl.gather(x, dsl.ravel(i), 0)", "index must have src's rank"),
    ("dsl.gather(n, i, 0)", "gather: src must be a block, got a scalar of type int32"),
    ("dsl.gather(x_ptr + i, i, 0)", "gather: src: blocks of pointers are not supported"),
    ("dsl.gather(x, i > 0, 0)", "gather: index must be a block of integers, got int1"),
    ("dsl.histogram(x, 8)", "histogram: input must be a block of integers, got float32"),
    ("dsl.histogram(i, 6)", "histogram: num_bins must be a constexpr power-of-two int, got 6"),
    ("dsl.histogram(i, n)", "histogram: num_bins must be a constexpr power-of-two int, got a runtime"),
    ("dsl.histogram(i, 8, mask=dsl.arange(0, 4)[:, None] > 0)", r"histogram: mask of shape \(4, 1\) does not "
                                                                r"broadcast to input's shape \(8, 4\)"),
    ("dsl.histogram(n, 8)", "histogram: input must be a block"),
    ("dsl.cat(x, dsl.ravel(x))", r"cat: input and other must have the same shape, got \(8, 4\) and \(32,\)"),
    ("dsl.cat(x, x, can_reorder='yes')", "cat: can_reorder must be a constexpr bool, got 'yes'"),
    ("dsl.cat(x, x, dim=2)", r"cat: dim must be a constexpr int in \[-2, 2\)"),
    ("dsl.cat(n, n)", "cat: input must be a block"),
])
def test_bad_arguments_are_clear_errors(expression, message):
    kernel = jit_from_source(_ERROR_KERNEL.format(expression=expression), f"<gather error {expression}>")
    with pytest.raises(CompilationError, match=message):
        kernel.compile(dsl.pointer_type(dsl.float32), dsl.pointer_type(dsl.float32), 4, target="sm_90a")


# -- the compiled code (no GPU needed) ---------------------------------------------------------------------------
@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_ptx_assembles_without_spills(arch):
    def ptx(kernel, *elements, args, **constexprs):
        return kernel.compile(*[dsl.pointer_type(e) for e in elements], *args, target=arch, **constexprs).asm["ptx"]

    gather = ptx(_gather_kernel, dsl.float32, dsl.float32, dsl.int32, args=(3, 7), R=4, C=8, IR=4, IC=16, AXIS=1)
    gather16 = ptx(_gather_kernel, dsl.bfloat16, dsl.bfloat16, dsl.int64, args=(5, 2), R=8, C=2, IR=16, IC=2,
                   AXIS=0)
    histogram = ptx(_histogram_kernel, dsl.int32, dsl.int8, args=(29, 3, 7), N=32, R=4, C=8, BINS=8)
    cat = ptx(_cat_kernel, dsl.float16, dsl.float16, dsl.float16, args=(3, 7), R=4, C=8)
    for code in (gather, gather16, histogram):
        assert re.search(r"setp\.(eq|ne)\.[bsu](16|32|64)", code)       # the one-hot compares
    for code in (gather, gather16, histogram, cat):
        assert "st.global" in code
        assert assemble(code, arch).spill_bytes == 0


# -- on the GPU: the same references, and the interpreter's values ---------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("torch_dtype", [torch.float32, torch.bfloat16, torch.int8, torch.int64])
@pytest.mark.parametrize("shape", _GATHER_SHAPES[:2] + _GATHER_SHAPES[3:4])
def test_gpu_gather(torch_dtype, shape):
    got, want = _gather_case(torch_dtype, torch.int32, shape, seed=7, device="cuda")
    assert torch.equal(got, want)
    interpreted, _ = _gather_case(torch_dtype, torch.int32, shape, seed=7)
    assert torch.equal(got, interpreted)


@pytest.mark.cuda
@pytest.mark.parametrize("torch_dtype", [torch.int8, torch.int32, torch.int64])
@pytest.mark.parametrize("shape", _HISTOGRAM_SHAPES)
def test_gpu_histogram(torch_dtype, shape):
    got, want = _histogram_case(torch_dtype, shape, seed=5, device="cuda")
    assert torch.equal(got, want)
    assert torch.equal(got, _histogram_case(torch_dtype, shape, seed=5)[0])


@pytest.mark.cuda
@pytest.mark.parametrize("torch_dtype", [torch.float16, torch.int8, torch.float32])
@pytest.mark.parametrize("shape", _CAT_SHAPES)
def test_gpu_cat(torch_dtype, shape):
    got, want = _cat_case(torch_dtype, shape, seed=3, device="cuda")
    assert torch.equal(got, want)
    assert torch.equal(got, _cat_case(torch_dtype, shape, seed=3)[0])
