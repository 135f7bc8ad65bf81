"""`dsl.sort` / `dsl.topk` (fusedops/dsl/language/sorting.py), Triton's `tl.sort` / `tl.topk`: a bitonic network.

References: NumPy's sort of the values (integers as they are; floats through their IEEE total-order integer keys,
every NaN the positive canonical quiet NaN, so the expected result is exact bit for bit, -0.0 before +0.0),
cross-checked against torch.sort / torch.topk values (NaN positions and values equal). Inputs are fresh random
values with duplicates, +-0.0, +-inf, NaNs of both signs and with a payload, loaded under masks with a large
`other` fill (odd sizes, size-1 dims); outputs poisoned. The PTX is assembled by ptxas for sm_80 and sm_90a; the
cuda-marked tests run the compiled kernels against the same references and the interpreter.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl import CompilationError
from fusedops.dsl.target import assemble, ptxas_available
from kernel_source import jit_from_source

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")

_FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
_INTS = [torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32, torch.uint32, torch.int64, torch.uint64,
         torch.bool]
_SIGNED = {16: torch.int16, 32: torch.int32, 64: torch.int64}


# -- kernels ----------------------------------------------------------------------------------------------------
@dsl.jit
def _sort_kernel(o_ptr, x_ptr, nr, nc, R: dsl.constexpr, C: dsl.constexpr, DIM: dsl.constexpr,
                 FILL: dsl.constexpr):
    # two regions of R * C: ascending along DIM, descending along DIM (the method form)
    r = dsl.arange(0, R)[:, None]
    c = dsl.arange(0, C)[None, :]
    x = dsl.load(x_ptr + r * nc + c, mask=(r < nr) & (c < nc), other=FILL)
    dsl.store(o_ptr + r * C + c, dsl.sort(x, dim=DIM))
    dsl.store(o_ptr + R * C + r * C + c, x.sort(DIM, descending=True))


@dsl.jit
def _topk_kernel(o_ptr, x_ptr, nr, nc, R: dsl.constexpr, C: dsl.constexpr, K: dsl.constexpr, K0: dsl.constexpr,
                 FILL: dsl.constexpr):
    # (R, K): topk along the last dim; then (K0, C): topk along dim 0
    r = dsl.arange(0, R)[:, None]
    c = dsl.arange(0, C)[None, :]
    x = dsl.load(x_ptr + r * nc + c, mask=(r < nr) & (c < nc), other=FILL)
    dsl.store(o_ptr + r * K + dsl.arange(0, K)[None, :], dsl.topk(x, K))
    dsl.store(o_ptr + R * K + dsl.arange(0, K0)[:, None] * C + c, x.topk(K0, dim=0))


# -- inputs and references --------------------------------------------------------------------------------------
def _fill(torch_dtype):
    """The large `other` of the masked loads: +inf, or the dtype's largest integer (True for bool)."""
    if torch_dtype.is_floating_point:
        return float("inf")
    return True if torch_dtype == torch.bool else torch.iinfo(torch_dtype).max


def _float_specials(torch_dtype) -> list:
    """Bit patterns (signed ints of the width): -0.0, +0.0, +inf, -inf, +NaN, -NaN, a NaN with a payload."""
    width = torch.finfo(torch_dtype).bits
    values = torch.tensor([-0.0, 0.0, float("inf"), float("-inf"), float("nan")], dtype=torch_dtype)
    bits = values.view(_SIGNED[width]).tolist()
    sign = -(1 << (width - 1))
    return bits + [bits[4] | sign, bits[4] | 1]


def _random(shape, torch_dtype, rng: np.random.Generator) -> torch.Tensor:
    if torch_dtype == torch.bool:
        return torch.from_numpy(rng.integers(0, 2, shape).astype(bool))
    if not torch_dtype.is_floating_point:
        info = torch.iinfo(torch_dtype)
        wide = rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=np.uint64 if info.min == 0
                            else np.int64)
        x = torch.from_numpy(wide.astype(np.uint64).view(np.int64)).to(torch.int64)
        x = x.view(torch.uint64).to(torch_dtype) if torch_dtype == torch.uint64 else \
            torch.from_numpy(wide.astype(str(torch_dtype).split(".")[1]))
        flat = x.view(-1)
        if flat.numel() >= 4:                                      # duplicates
            flat[::4] = flat[1].clone()
        return x
    x = torch.from_numpy(rng.standard_normal(shape) * 8).to(torch_dtype)
    flat = x.view(-1)
    flat[::3] = flat[::3].round()                                  # duplicates
    specials = _float_specials(torch_dtype)
    if flat.numel() >= 2 * len(specials):
        where = torch.from_numpy(rng.permutation(flat.numel())[:len(specials)])
        flat.view(_SIGNED[torch.finfo(torch_dtype).bits])[where] = torch.tensor(
            specials, dtype=_SIGNED[torch.finfo(torch_dtype).bits])
    return x


def _poisoned(numel: int, torch_dtype, device="cpu") -> torch.Tensor:
    """An output of all-ones bytes: for floats a negative NaN, which no sort result holds (its NaNs are the positive canonical NaN)."""
    if torch_dtype == torch.bool:
        return torch.ones(numel, dtype=torch.bool, device=device)
    size = torch.empty((), dtype=torch_dtype).element_size()
    return torch.full((numel * size,), -1, dtype=torch.int8, device=device).view(torch_dtype)


def _padded(x: torch.Tensor, R: int, C: int) -> torch.Tensor:
    out = torch.full((R, C), _fill(x.dtype), dtype=x.dtype)
    out[:x.shape[0], :x.shape[1]] = x
    return out


def _bits(x: torch.Tensor) -> np.ndarray:
    """Values to compare exactly: floats as their bits."""
    x = x.cpu()
    if x.dtype.is_floating_point:
        x = x.view(_SIGNED[torch.finfo(x.dtype).bits])
    return x.view(torch.int64).numpy() if x.dtype == torch.uint64 else x.numpy()


def _reference_sort(x: torch.Tensor, dim: int, descending: bool) -> torch.Tensor:
    """x sorted along dim in sort's documented order, exactly (every NaN the positive canonical quiet NaN)."""
    if not x.dtype.is_floating_point:
        values = x.view(torch.int64).numpy().view(np.uint64) if x.dtype == torch.uint64 else x.numpy()
        done = np.sort(values, axis=dim)
        done = np.flip(done, dim) if descending else done
        done = torch.from_numpy(done.copy())
        return done.view(torch.int64).view(torch.uint64) if x.dtype == torch.uint64 else done
    width = torch.finfo(x.dtype).bits
    bits = x.view(_SIGNED[width]).numpy().copy()
    magnitude = bits.dtype.type((1 << (width - 1)) - 1)
    nan = torch.isnan(x).numpy()
    mantissa = {torch.float64: 52, torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}[x.dtype]
    bits[nan] = bits.dtype.type((1 << (width - 1)) - (1 << mantissa) + (1 << (mantissa - 1)))   # +canonical NaN
    keys = np.sort(bits ^ ((bits >> (width - 1)) & magnitude), axis=dim)
    keys = (np.flip(keys, dim) if descending else keys).copy()
    return torch.from_numpy(keys ^ ((keys >> (width - 1)) & magnitude)).view(x.dtype)


def _against_torch(got: torch.Tensor, x: torch.Tensor, dim: int, descending: bool, k=None) -> None:
    """An independent check: the same values as torch.sort / torch.topk (NaNs where torch puts them)."""
    if x.dtype in (torch.uint16, torch.uint32, torch.uint64):
        return                                                      # (torch's CPU sort lacks them)
    if k is None:
        want = torch.sort(x, dim=dim, descending=descending).values
    else:
        want = torch.topk(x.to(torch.float64) if x.dtype == torch.bool else x, k, dim=dim).values.to(x.dtype)
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)


def _sort_case(torch_dtype, R, C, nr, nc, dim, seed, device="cpu"):
    x = _random((nr, nc), torch_dtype, np.random.default_rng(seed))
    out = _poisoned(2 * R * C, torch_dtype, device)
    _sort_kernel[(1,)](out, x.to(device), nr, nc, R=R, C=C, DIM=dim, FILL=_fill(torch_dtype),
                       interpret=device == "cpu")
    return out.cpu().view(2, R, C), _padded(x, R, C)


def _check_sort(got, padded, dim):
    for index, descending in enumerate((False, True)):
        want = _reference_sort(padded, dim, descending)
        np.testing.assert_array_equal(_bits(got[index]), _bits(want), err_msg=f"descending={descending}")
        _against_torch(got[index], padded, dim, descending)


# -- the interpreter's values -------------------------------------------------------------------------------------
@pytest.mark.parametrize("torch_dtype", _FLOATS + _INTS)
def test_sort_rows_every_dtype_exactly(torch_dtype):
    got, padded = _sort_case(torch_dtype, 4, 16, 3, 13, 1, seed=(_FLOATS + _INTS).index(torch_dtype))
    _check_sort(got, padded, 1)


@pytest.mark.parametrize("R, C, nr, nc, dim", [(8, 1, 5, 1, 1), (1, 32, 1, 32, 1), (16, 4, 11, 3, 0),
                                               (1, 2, 1, 2, -1), (32, 2, 32, 2, 0)])
def test_sort_shapes_dims_and_size_one(R, C, nr, nc, dim):
    got, padded = _sort_case(torch.float32, R, C, nr, nc, dim, seed=R * 100 + C + dim)
    _check_sort(got, padded, dim % 2)


def test_sort_random_permutations_come_out_in_order():
    rng = np.random.default_rng(41)
    x = torch.from_numpy(np.stack([rng.permutation(64) for _ in range(4)]).astype(np.int32) - 20)
    out = _poisoned(2 * 4 * 64, torch.int32)
    _sort_kernel[(1,)](out, x, 4, 64, R=4, C=64, DIM=1, FILL=0, interpret=True)
    ramp = torch.arange(64, dtype=torch.int32) - 20
    assert torch.equal(out.view(2, 4, 64)[0], ramp.expand(4, 64))
    assert torch.equal(out.view(2, 4, 64)[1], ramp.flip(0).expand(4, 64))


def _topk_case(torch_dtype, R, C, nr, nc, K, K0, seed, device="cpu"):
    x = _random((nr, nc), torch_dtype, np.random.default_rng(seed))
    out = _poisoned(R * K + K0 * C, torch_dtype, device)
    _topk_kernel[(1,)](out, x.to(device), nr, nc, R=R, C=C, K=K, K0=K0, FILL=_fill(torch_dtype),
                       interpret=device == "cpu")
    return out.cpu(), _padded(x, R, C)


def _check_topk(out, padded, R, C, K, K0):
    rows, columns = out[:R * K].view(R, K), out[R * K:].view(K0, C)
    np.testing.assert_array_equal(_bits(rows), _bits(_reference_sort(padded, 1, True)[:, :K]))
    np.testing.assert_array_equal(_bits(columns), _bits(_reference_sort(padded, 0, True)[:K0]))
    _against_torch(rows, padded, 1, True, K)
    _against_torch(columns, padded, 0, True, K0)


@pytest.mark.parametrize("torch_dtype, R, C, nr, nc, K, K0", [
    (torch.float32, 4, 16, 3, 11, 4, 2), (torch.float16, 8, 8, 8, 5, 8, 1), (torch.int32, 2, 32, 2, 29, 1, 2),
    (torch.uint8, 4, 16, 4, 16, 16, 4), (torch.bool, 4, 8, 3, 8, 2, 4), (torch.float64, 2, 64, 2, 61, 2, 2),
    (torch.bfloat16, 4, 32, 4, 30, 8, 1),
])
def test_topk_largest_first(torch_dtype, R, C, nr, nc, K, K0):
    out, padded = _topk_case(torch_dtype, R, C, nr, nc, K, K0, seed=R * C + K)
    _check_topk(out, padded, R, C, K, K0)


def test_three_dimensional_blocks_sort_any_dim():
    kernel = jit_from_source(
        "def k(o_ptr, x_ptr):\n"
        "    i = dsl.arange(0, 2)[:, None, None]\n    j = dsl.arange(0, 4)[None, :, None]\n"
        "    m = dsl.arange(0, 8)[None, None, :]\n"
        "    x = dsl.load(x_ptr + i * 32 + j * 8 + m)\n"
        "    dsl.store(o_ptr + i * 32 + j * 8 + m, dsl.sort(x, 1))\n"
        "    dsl.store(o_ptr + 64 + i * 32 + j * 8 + m, x.sort(0, descending=True))\n"
        "    dsl.store(o_ptr + 128 + i * 8 + j * 2 + dsl.arange(0, 2)[None, None, :], dsl.topk(x, 2))\n",
        "<sort 3-D>")
    x = _random((2, 4, 8), torch.float32, np.random.default_rng(3))
    out = _poisoned(144, torch.float32)
    kernel[(1,)](out, x, interpret=True)
    np.testing.assert_array_equal(_bits(out[:64].view(2, 4, 8)), _bits(_reference_sort(x, 1, False)))
    np.testing.assert_array_equal(_bits(out[64:128].view(2, 4, 8)), _bits(_reference_sort(x, 0, True)))
    np.testing.assert_array_equal(_bits(out[128:].view(2, 4, 2)), _bits(_reference_sort(x, 2, True)[..., :2]))


# -- errors ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("expression, message", [
    ("dsl.sort(x, dim=2)", r"sort: dim must be None or a constexpr int in range for a block of shape \(4, 8\)"),
    ("dsl.sort(x, dim=n)", "sort: dim must be None or a constexpr int"),
    ("dsl.sort(x, dim=True)", "sort: dim must be"),
    ("dsl.sort(x, descending=n > 0)", "sort: descending"),
    ("dsl.sort(x_ptr + r * 8 + c)", "sort: blocks of pointers cannot be sorted"),
    ("dsl.sort(n)", "sort: x must be a block"),
    ("dsl.topk(x, 3)", r"topk: k must be a constexpr power of two from 1 to the size of dim 1 \(8\)"),
    ("dsl.topk(x, 16)", "topk: k must be a constexpr power of two"),
    ("dsl.topk(x, 8, dim=0)", r"size of dim 0 \(4\).*got 8"),
    ("dsl.topk(x, 0)", "topk: k must be"),
    ("dsl.topk(x, n)", "topk: k must be"),
    ("dsl.topk(x, 2, dim=-3)", "topk: dim must be"),
])
def test_bad_arguments_are_clear_errors(expression, message):
    kernel = jit_from_source(
        "def k(o_ptr, x_ptr, n):\n"
        "    r = dsl.arange(0, 4)[:, None]\n    c = dsl.arange(0, 8)[None, :]\n"
        "    x = dsl.load(x_ptr + r * 8 + c)\n"
        f"    y = {expression}\n"
        "    dsl.store(o_ptr + r * 8 + c, x)\n", f"<sort error {abs(hash(expression))}>")
    with pytest.raises(CompilationError, match=message):
        kernel[(1,)](torch.empty(32), torch.randn(32), 3, interpret=True)


def test_sort_and_topk_are_exported_and_no_longer_refused():
    assert "sort" in dsl.__all__ and "topk" in dsl.__all__
    from fusedops.dsl.language.triton_names import missing_name_hint
    assert missing_name_hint("sort") == missing_name_hint("topk") == ""


# -- the compiled code (no GPU needed) ---------------------------------------------------------------------------
@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_ptx_assembles_without_spills(arch):
    def ptx(kernel, element, *args, **constexprs):
        pointer = dsl.pointer_type(element)
        return kernel.compile(pointer, pointer, *args, target=arch, **constexprs).asm["ptx"]

    rows = ptx(_sort_kernel, dsl.float32, 3, 13, R=4, C=16, DIM=1, FILL=float("inf"))
    columns = ptx(_sort_kernel, dsl.float16, 11, 3, R=16, C=4, DIM=0, FILL=float("inf"))
    wide = ptx(_sort_kernel, dsl.uint64, 2, 61, R=2, C=64, DIM=1, FILL=2 ** 64 - 1)
    top = ptx(_topk_kernel, dsl.int32, 3, 11, R=4, C=16, K=4, K0=2, FILL=2 ** 31 - 1)
    assert "min.s32" in rows and "max.s32" in rows                        # float32 keys compare as int32
    assert "min.s64" in wide and "max.s64" in wide and "xor.b64" in wide  # uint64: the sign bit flipped
    for code in (rows, columns, wide, top):
        assert assemble(code, arch).spill_bytes == 0


# -- on the GPU: the same references, and the interpreter's values ---------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("torch_dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8,
                                         torch.uint16, torch.int64, torch.uint64, torch.bool])
@pytest.mark.parametrize("R, C, nr, nc, dim", [(4, 16, 3, 13, 1), (16, 4, 11, 3, 0), (8, 1, 5, 1, 1),
                                               (2, 256, 2, 250, 1)])
def test_gpu_sort(torch_dtype, R, C, nr, nc, dim):
    seed = R * 1000 + C + dim
    got, padded = _sort_case(torch_dtype, R, C, nr, nc, dim, seed=seed, device="cuda")
    _check_sort(got, padded, dim)
    interpreted, _ = _sort_case(torch_dtype, R, C, nr, nc, dim, seed=seed)
    np.testing.assert_array_equal(_bits(got), _bits(interpreted))


@pytest.mark.cuda
@pytest.mark.parametrize("torch_dtype, R, C, nr, nc, K, K0", [
    (torch.float32, 4, 16, 3, 11, 4, 2), (torch.float16, 8, 8, 8, 5, 8, 1), (torch.int32, 2, 32, 2, 29, 1, 2),
    (torch.uint8, 4, 16, 4, 16, 16, 4), (torch.float32, 4, 1024, 4, 1000, 8, 4),
])
def test_gpu_topk(torch_dtype, R, C, nr, nc, K, K0):
    out, padded = _topk_case(torch_dtype, R, C, nr, nc, K, K0, seed=R * C + K, device="cuda")
    _check_topk(out, padded, R, C, K, K0)
    interpreted, _ = _topk_case(torch_dtype, R, C, nr, nc, K, K0, seed=R * C + K)
    np.testing.assert_array_equal(_bits(out), _bits(interpreted))
