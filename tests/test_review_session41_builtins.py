"""Review (session 41): Triton's small language names of commit 08100c1 (language/triton_compat.py, triton_math.py,
the prod / xor combines of codegen/reduce.py and numerics/reductions.py), ported as Triton users write them.

What was tried (peer report -> case), and found right:
- triton#5439 (tl.flip turned inf into NaN: it moved values with float arithmetic) -> flip / split / join /
  interleave of bfloat16, float16, float64 holding inf, -inf, -0.0 and NaN, 3-D blocks, any dim: the same bits.
- triton#4362 / #8412 (associative_scan wrong with reverse=True, axis off by one on 3-D) -> cumprod on 3-D blocks,
  negative axes, reverse, int8 / uint8 / int16 / int64 (wrapping), float16, bfloat16 (float32 result, as Triton),
  float64, and -0.0 / inf / NaN products (torch.cumprod's values).
- triton#2361 (cumsum in a loop under a mask gave wrong values) -> cumprod / xor_sum inside loops under masks, of
  broadcast blocks (replicated elements: x ^ x must not cancel) and of blocks smaller than the threads, compiled and
  run on the host emulation (tests/test_review_session35_dsl.py's _run_compiled), equal to the interpreter.
- xor_sum: axis None with keep_dims (shape (1, 1)), negative axes, int8 sign bits, int1 parities.
- div_rn / fdiv / sqrt_rn of float16 / bfloat16 / float32 / float64 with 0/0, x/0, inf/inf, -0.0, subnormal
  quotients: torch's float64 division / sqrt rounded once to the type.
- dsl.range with runtime negative steps, zero-trip loops carrying a (block, int) tuple, nested in `while`,
  triangular inner bounds, int8 / uint32 bounds near their type's end (compiled: no wrap-around), hint values from
  constexpr parameters; swizzle2d of runtime scalars, int64 sizes and keyword arguments.
- The kernels assemble with ptxas for sm_80 and sm_90a for float16 / bfloat16 / int8 / uint8 / int1 / float64.

DEFECTS found (fixed):
1. Triton's documented example `tl.static_print(f"BLOCK_SIZE={BLOCK_SIZE}")` (and `static_assert(c, f"...")`) was
   refused: "not supported in kernels: f-strings". Fix: frontend/expressions.py `visit_JoinedStr` formats an f-string
   of compile-time values at compile time (conversions and format specs as Python's); an f-string of a kernel value
   is still an UnsupportedError naming f-strings (tests/test_errors.py, test_review_session24_frontend.py).
2. `dsl.static_print((x, 3))` printed the compiler's internal `Value(...)` repr for kernel values inside a tuple
   (its docstring: kernel values print as `<runtime TYPE>`). Fix: triton_compat._printed recurses into tuples.
3. `from fusedops.dsl.math import div_rn` / `import fusedops.dsl.math` (as `triton.language.math`) raised
   ModuleNotFoundError: `dsl.math` was only an attribute. Fix: fusedops/dsl/__init__.py registers the module as
   `fusedops.dsl.math` in sys.modules.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl import CompilationError, UnsupportedError
from fusedops.dsl.target import assemble, ptxas_available
from helpers import poison
from kernel_source import jit_from_source
from test_review_session35_dsl import _run_compiled

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
NAN, INF = float("nan"), float("inf")


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "s41_builtins_cache"))


def _kernel(body: str, params: str, name: str):
    return jit_from_source(f"def k({params}):\n" + "".join(f"    {line}\n" for line in body.strip().splitlines()),
                           f"<s41 builtins {name}>")


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (NaN payloads and the sign of zero included)."""
    if a.dtype.is_floating_point:
        width = {8: torch.int64, 4: torch.int32, 2: torch.int16}[a.element_size()]
        return torch.equal(a.view(width), b.view(width))
    return torch.equal(a, b)


# == defects ======================================================================================================
def test_defect_static_print_and_static_assert_take_fstrings_of_constexprs(capsys):
    kernel = _kernel("dsl.static_print(f'BLOCK_SIZE={BLOCK_SIZE}', f'{BLOCK_SIZE * 2:#x}|{D}|{S!r}|{BLOCK_SIZE:>3}')\n"
                     "dsl.static_assert(BLOCK_SIZE % 4 == 0, f'BLOCK_SIZE={BLOCK_SIZE} is not a multiple of 4')\n"
                     "dsl.store(o_ptr + dsl.arange(0, BLOCK_SIZE), dsl.arange(0, BLOCK_SIZE))",
                     "o_ptr, BLOCK_SIZE: dsl.constexpr, D: dsl.constexpr, S: dsl.constexpr", "fstring")
    out = poison(torch.empty(8, dtype=torch.int32))
    kernel[(1,)](out, BLOCK_SIZE=8, D=dsl.bfloat16, S="ab", interpret=True)
    assert capsys.readouterr().out == "BLOCK_SIZE=8 0x10|bfloat16|'ab'|  8\n"
    assert out.tolist() == list(range(8))
    with pytest.raises(CompilationError, match="static_assert failed: BLOCK_SIZE=2 is not a multiple of 4"):
        kernel[(1,)](torch.empty(2, dtype=torch.int32), BLOCK_SIZE=2, D=dsl.float16, S="", interpret=True)


def test_defect_fstring_of_a_kernel_value_is_still_a_clear_error():
    kernel = _kernel("dsl.static_print(f'n={n}')\ndsl.store(o_ptr, n)", "o_ptr, n", "fstring runtime")
    with pytest.raises(UnsupportedError, match=r"f-strings can format only compile-time values, got a int32 value.*"
                                               r"dsl.device_print"):
        kernel[(1,)](torch.empty(1, dtype=torch.int32), 5, interpret=True)
    bad = _kernel("dsl.static_print(f'{S:d}')\ndsl.store(o_ptr, 1)", "o_ptr, S: dsl.constexpr", "fstring spec")
    with pytest.raises(CompilationError, match="f-string format 'd' of 'x' failed"):
        bad[(1,)](torch.empty(1, dtype=torch.int32), S="x", interpret=True)


def test_defect_static_print_of_a_tuple_shows_kernel_values_by_type(capsys):
    kernel = _kernel("t = (x, 3, (x * 2.0,))\ndsl.static_print(t, dsl.arange(0, 4))\ndsl.store(o_ptr, x)",
                     "o_ptr, x", "static print tuple")
    out = poison(torch.empty(1))
    kernel[(1,)](out, 1.5, interpret=True)
    assert capsys.readouterr().out == "(<runtime float32>, 3, (<runtime float32>,)) <runtime <4xint32>>\n"
    assert out.item() == 1.5


def test_defect_dsl_math_imports_as_a_module():
    from fusedops.dsl.math import div_rn, exp2
    import fusedops.dsl.math as tlm

    assert tlm is dsl.math and exp2 is dsl.exp2 and div_rn is dsl.div_rn
    namespace: dict = {}
    exec("from fusedops.dsl import *", namespace)
    assert "math" not in namespace and "_sys" not in namespace and "sys" not in namespace


# == scans and reductions ==========================================================================================
_CUMPROD3 = _kernel("a = dsl.arange(0, A)[:, None, None]\nb = dsl.arange(0, B)[None, :, None]\n"
                    "c = dsl.arange(0, C)[None, None, :]\noff = a * B * C + b * C + c\nx = dsl.load(x_ptr + off)\n"
                    "dsl.store(o_ptr + off, dsl.cumprod(x, AX, reverse=REV))\n"
                    "dsl.store(o_ptr + A * B * C + off, x.cumprod(axis=AX))",
                    "o_ptr, x_ptr, A: dsl.constexpr, B: dsl.constexpr, C: dsl.constexpr, AX: dsl.constexpr, "
                    "REV: dsl.constexpr", "cumprod3")


def _reverse_cumprod(x: torch.Tensor, axis: int) -> torch.Tensor:
    return torch.flip(torch.cumprod(torch.flip(x, [axis]), axis), [axis])


@pytest.mark.parametrize("torch_dtype, shape, axis, reverse", [
    (torch.float32, (2, 4, 8), -1, True), (torch.float16, (2, 4, 8), 1, False), (torch.bfloat16, (4, 1, 8), -3, True),
    (torch.float64, (1, 8, 4), 1, True), (torch.int8, (2, 4, 8), -1, True), (torch.uint8, (2, 8, 2), 0, False),
    (torch.int64, (2, 2, 16), 2, True),
])
def test_cumprod_3d_negative_axes_reverse_and_dtypes(torch_dtype, shape, axis, reverse):
    g = torch.Generator().manual_seed(len(shape) * 7 + axis)
    if torch_dtype.is_floating_point:
        x = ((torch.rand(shape, generator=g) + 0.5) * torch.where(torch.rand(shape, generator=g) < 0.3, -1, 1))
        x = x.to(torch_dtype)
    else:
        x = torch.randint(-60, 60, shape, generator=g).to(torch_dtype)
    result_dtype = torch.float32 if torch_dtype == torch.bfloat16 else torch_dtype     # Triton promotes bfloat16
    out = poison(torch.empty(2 * x.numel(), dtype=result_dtype))
    _CUMPROD3[(1,)](out, x, A=shape[0], B=shape[1], C=shape[2], AX=axis, REV=reverse, interpret=True)
    got, forward = out[:x.numel()].view(shape), out[x.numel():].view(shape)
    axis %= 3
    if torch_dtype.is_floating_point:
        wide = x.double()
        want = _reverse_cumprod(wide, axis) if reverse else torch.cumprod(wide, axis)
        rtol = {torch.float16: 1e-3, torch.float64: 1e-14}.get(torch_dtype, 1e-6)
        torch.testing.assert_close(got.double(), want, rtol=rtol, atol=0)
        torch.testing.assert_close(forward.double(), torch.cumprod(wide, axis), rtol=rtol, atol=0)
    else:       # int64 products wrap mod 2**64, so mod 2**bits too
        wide = x.long()
        want = _reverse_cumprod(wide, axis) if reverse else torch.cumprod(wide, axis)
        assert torch.equal(got, want.to(torch_dtype))
        assert torch.equal(forward, torch.cumprod(wide, axis).to(torch_dtype))


def test_cumprod_of_signed_zeros_infinities_and_nan_as_torch():
    kernel = _kernel("x = dsl.load(x_ptr + dsl.arange(0, 8))\ndsl.store(o_ptr + dsl.arange(0, 8), dsl.cumprod(x))\n"
                     "dsl.store(o_ptr + 8 + dsl.arange(0, 8), dsl.cumprod(x, reverse=True))", "o_ptr, x_ptr", "cp special")
    for values in ([2.0, -0.0, 3.0, INF, 0.5, NAN, 1.0, 4.0], [1.0, -0.0, -2.0, 3.0, -INF, 2.0, -1.0, 0.5]):
        x = torch.tensor(values)
        out = poison(torch.empty(16))
        kernel[(1,)](out, x, interpret=True)
        want = torch.cat([torch.cumprod(x.double(), 0), _reverse_cumprod(x.double(), 0)]).float()
        assert _same_bits(torch.where(out.isnan(), NAN, out), torch.where(want.isnan(), NAN, want)), (out, want)


def test_xor_sum_keep_dims_axis_none_negative_axes_and_parity():
    kernel = _kernel("r = dsl.arange(0, 4)[:, None]\nc = dsl.arange(0, 8)[None, :]\nx = dsl.load(x_ptr + r * 8 + c)\n"
                     "one = dsl.arange(0, 1)\n"
                     "dsl.store(o_ptr + one[:, None] + one[None, :], dsl.xor_sum(x, None, keep_dims=True))\n"
                     "dsl.store(o_ptr + 1 + r, x.xor_sum(axis=-1, keep_dims=True))\n"
                     "dsl.store(o_ptr + 5 + dsl.arange(0, 8), dsl.xor_sum(x, -2))\n"
                     "dsl.store(o_ptr + 13 + dsl.arange(0, 8), dsl.xor_sum(x < 0, 0).to(dsl.int8))",
                     "o_ptr, x_ptr", "xor")
    x = torch.randint(-128, 128, (4, 8), dtype=torch.int8, generator=torch.Generator().manual_seed(3))
    out = poison(torch.empty(21, dtype=torch.int8))
    kernel[(1,)](out, x, interpret=True)
    v = x.numpy()
    want = np.concatenate([[np.bitwise_xor.reduce(v, None)], np.bitwise_xor.reduce(v, 1), np.bitwise_xor.reduce(v, 0),
                           (v < 0).sum(0) % 2]).astype(np.int8)
    np.testing.assert_array_equal(out.numpy(), want)


# == exact data movement ============================================================================================
@pytest.mark.parametrize("torch_dtype", [torch.bfloat16, torch.float64, torch.uint8])
def test_flip_split_join_interleave_3d_keep_every_bit(torch_dtype):
    kernel = _kernel("i = dsl.arange(0, 2)[:, None, None] * 16 + dsl.arange(0, 4)[None, :, None] * 4 + "
                     "dsl.arange(0, 4)[None, None, :]\nx = dsl.load(x_ptr + i)\n"
                     "dsl.store(o_ptr + i, dsl.flip(x, 1))\ndsl.store(o_ptr + 32 + i, x.flip(dim=0))\n"
                     "a, b = dsl.split(dsl.reshape(x, (2, 4, 2, 2)))\n"
                     "j = dsl.arange(0, 2)[:, None, None] * 8 + dsl.arange(0, 4)[None, :, None] * 2 + "
                     "dsl.arange(0, 2)[None, None, :]\n"
                     "dsl.store(o_ptr + 64 + j, a)\ndsl.store(o_ptr + 80 + j, b)\n"
                     "dsl.store(o_ptr + 96 + dsl.arange(0, 64), dsl.ravel(dsl.interleave(x, dsl.flip(x))))\n"
                     "dsl.store(o_ptr + 160 + dsl.arange(0, 64), dsl.join(x, x.permute(0, 2, 1)).ravel())",
                     "o_ptr, x_ptr", f"movement {torch_dtype}")
    if torch_dtype.is_floating_point:
        x = torch.randn(32, generator=torch.Generator().manual_seed(5)).to(torch_dtype)
        x[:6] = torch.tensor([INF, -INF, -0.0, NAN, 1e-40, -NAN]).to(torch_dtype)
    else:
        x = torch.randint(0, 256, (32,), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    out = poison(torch.empty(224, dtype=torch_dtype))
    kernel[(1,)](out, x, interpret=True)
    v = x.view(2, 4, 4)
    pairs = v.reshape(2, 4, 2, 2)
    want = torch.cat([v.flip(1).reshape(-1), v.flip(0).reshape(-1), pairs[..., 0].reshape(-1),
                      pairs[..., 1].reshape(-1), torch.stack([v, v.flip(2)], -1).reshape(-1),
                      torch.stack([v, v.permute(0, 2, 1)], -1).reshape(-1)])
    assert _same_bits(out, want)


# == rounding-explicit math =========================================================================================
@pytest.mark.parametrize("torch_dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_div_rn_fdiv_sqrt_rn_are_correctly_rounded_with_special_values(torch_dtype):
    kernel = _kernel("x = dsl.load(x_ptr + dsl.arange(0, 16))\ny = dsl.load(y_ptr + dsl.arange(0, 16))\n"
                     "dsl.store(o_ptr + dsl.arange(0, 16), dsl.div_rn(x, y))\n"
                     "dsl.store(o_ptr + 16 + dsl.arange(0, 16), dsl.math.fdiv(x, y))\n"
                     "dsl.store(o_ptr + 32 + dsl.arange(0, 16), dsl.math.sqrt_rn(x))", "o_ptr, x_ptr, y_ptr",
                     f"rn {torch_dtype}")
    g = torch.Generator().manual_seed(11)
    x = torch.cat([torch.tensor([1.0, -0.0, 0.0, INF, -INF, NAN, 1e-30, 3.0]), torch.randn(8, generator=g)])
    y = torch.cat([torch.tensor([3.0, 2.0, 0.0, INF, 0.0, 1.0, 1e10, -0.0]), torch.randn(8, generator=g)])
    x, y = x.to(torch_dtype), y.to(torch_dtype)
    out = poison(torch.empty(48, dtype=torch_dtype))
    kernel[(1,)](out, x, y, interpret=True)
    quotient = (x.double() / y.double()).to(torch_dtype)
    root = x.double().sqrt().to(torch_dtype)
    want = torch.cat([quotient, quotient, root])
    canonical = lambda t: torch.where(t.isnan(), torch.tensor(NAN, dtype=t.dtype), t)     # any NaN is NaN
    assert _same_bits(canonical(out), canonical(want)), (out, want)


# == dsl.range ======================================================================================================
def test_dsl_range_runtime_negative_steps_zero_trips_tuples_and_while():
    kernel = _kernel("t = 0\nk = n\nwhile k > 0:\n"
                     "    for i in dsl.range(k, step=2, loop_unroll_factor=2):\n        t += i\n    k -= 3\n"
                     "acc = (dsl.zeros((4,), dsl.float32), 5)\n"
                     "for i in dsl.range(lo, hi, step, num_stages=NS, disable_licm=True):\n"
                     "    acc = (acc[0] * 2.0 + dsl.load(x_ptr + i * 4 + dsl.arange(0, 4)), acc[1] + 1)\n"
                     "tri = 0\nfor i in dsl.range(0, n):\n    for j in dsl.range(i, -1, -1):\n        tri += j\n"
                     "dsl.store(o_ptr + dsl.arange(0, 4), acc[0] + acc[1])\ndsl.store(o_ptr + 4, t + 0.0)\n"
                     "dsl.store(o_ptr + 5, tri + 0.0)",
                     "o_ptr, x_ptr, n, lo, hi, step, NS: dsl.constexpr", "range")
    x = torch.randn(64, generator=torch.Generator().manual_seed(2))
    for n, lo, hi, step in [(10, 7, -1, -3), (4, 3, 3, 1), (5, 0, 16, 5), (1, 1, 9, 4)]:
        out = poison(torch.empty(6))
        args = (out, x, n, lo, hi, step)
        kernel[(1,)](*args, NS=3, interpret=True)
        acc, count = torch.zeros(4, dtype=torch.float64), 5
        for i in range(lo, hi, step):
            acc, count = acc * 2 + x[i * 4:i * 4 + 4].double(), count + 1
        t = sum(sum(range(0, k, 2)) for k in range(n, 0, -3))
        tri = sum(j for i in range(n) for j in range(i, -1, -1))
        torch.testing.assert_close(out[:4].double(), acc + count, rtol=1e-6, atol=1e-5)
        assert out[4:].tolist() == [t, tri]
        compiled = poison(torch.empty(6))
        _run_compiled(kernel, (compiled, x, n, lo, hi, step), num_warps=1, NS=3)
        assert torch.equal(compiled, out)


# == the compiled code, run on the host ===========================================================================
_COMPILED = _kernel(
    "for r in range(0, n, 8):\n    i = r + dsl.arange(0, 8)\n    m = i < n\n"
    "    x = dsl.load(x_ptr + i, mask=m, other=1)\n"
    "    dsl.store(o_ptr + i, dsl.cumprod(dsl.where(m, x % 5 + 6, 1)), mask=m)\n"
    "b = dsl.broadcast_to(dsl.load(x_ptr + dsl.arange(0, 4))[None, :], (4, 4))\n"
    "dsl.store(o_ptr + 16 + dsl.arange(0, 4), dsl.xor_sum(b, 0))\n"
    "dsl.store(o_ptr + 20 + dsl.arange(0, 4), dsl.xor_sum(b, 1))\n"
    "dsl.store(o_ptr + 24 + dsl.arange(0, 4)[:, None] * 4 + dsl.arange(0, 4)[None, :], dsl.cumprod(b % 3, 0))\n"
    "p, q = dsl.split(dsl.load(x_ptr + dsl.arange(0, 2)))\ndsl.store(o_ptr + 40, q)\ndsl.store(o_ptr + 41, p)\n"
    "dsl.store(o_ptr + 42 + dsl.arange(0, 4), dsl.flip(dsl.load(x_ptr + dsl.arange(0, 4))))",
    "o_ptr, x_ptr, n", "compiled")


def test_scans_reductions_and_movement_compiled_match_the_interpreter_and_numpy():
    x = torch.randint(-1000, 1000, (16,), dtype=torch.int32, generator=torch.Generator().manual_seed(9))
    interpreted, compiled = poison(torch.empty(46, dtype=torch.int32)), poison(torch.empty(46, dtype=torch.int32))
    _COMPILED[(1,)](interpreted, x, 13, interpret=True)
    _run_compiled(_COMPILED, (compiled, x, 13), num_warps=4)
    assert torch.equal(interpreted, compiled)
    v = x.numpy().astype(np.int64)        # the kernel's % truncates, as C's (np.fmod)
    head = v[:4]
    want = np.concatenate([np.cumprod(np.fmod(v[:8], 5) + 6), np.cumprod(np.fmod(v[8:13], 5) + 6), [0, 0, 0, 0],
                           [np.bitwise_xor.reduce(head)] * 4, np.cumprod(np.tile(np.fmod(head, 3), (4, 1)), 0).ravel(),
                           [v[1], v[0]], head[::-1]])
    np.testing.assert_array_equal(compiled.numpy()[:13], want[:13].astype(np.int32))
    np.testing.assert_array_equal(compiled.numpy()[16:], want[13:].astype(np.int32))


@needs_ptxas
@pytest.mark.parametrize("element, boolean", [(dsl.bfloat16, False), (dsl.int8, True), (dsl.float64, False)])
def test_the_new_names_assemble_for_sm80_and_sm90a(element, boolean):
    kernel = _kernel("r = dsl.arange(0, 8)[:, None]\nc = dsl.arange(0, 16)[None, :]\nx = dsl.load(x_ptr + r * 16 + c)\n"
                     "if BOOL:\n    x = x > 0\n"
                     "a, b = dsl.split(dsl.reshape(x, (8, 8, 2)))\n"
                     "y = dsl.interleave(b, a).flip(0).permute(1, 0).view(16, 8)\n"
                     "z = dsl.cumprod(y.to(dsl.float32), 1, reverse=True) + dsl.sqrt_rn(dsl.fdiv(y.to(dsl.float32), 3.0))\n"
                     "i, j = dsl.swizzle2d(r, c, 8, 16, 3)\n"
                     "dsl.store(o_ptr + dsl.arange(0, 16)[:, None] * 8 + dsl.arange(0, 8)[None, :], z)\n"
                     "dsl.store(o_ptr + 128 + r * 16 + c, (i * 16 + j).to(dsl.float32))\n"
                     "for t in dsl.range(0, n, num_stages=2):\n    dsl.debug_barrier()",
                     "o_ptr, x_ptr, n, BOOL: dsl.constexpr", f"assemble {element}")
    for arch in ("sm_80", "sm_90a"):
        ptx = kernel.compile(dsl.pointer_type(dsl.float32), dsl.pointer_type(element), 4, BOOL=boolean, target=arch,
                             num_warps=4).asm["ptx"]
        assert "div.rn.f32" in ptx and "sqrt.rn.f32" in ptx and "bar.sync" in ptx
        assert assemble(ptx, arch).spill_bytes == 0
