"""Session-39 review of what *compiled* DSL code computes (the sm_90a LLVM IR run on the host through
tests/host_jit.py, the PTX read and assembled by ptxas for sm_90a and sm_80) against the interpreter and exact
references, for kernels a Triton user writes. Earlier reviews (sessions 20-38: codegen, compiler, numerics, dsl)
already cover integer division / shifts / casts / promotion, float -> int saturation, min / max NaN and signed
zeros, fma, reductions / scans / argmin of every type, atomics of repeated addresses, loops near the int32 limit
and carried pointers; this file does not repeat them.

Peer reports -> cases tried (all right unless listed under DEFECTS):
- triton #6748 / #475, ROCm/triton #830 / #944, fla #1082, dion #103 (int32 offset overflow; `ptr + 2257846272`
  written as a literal) -> compiled loads at 64-bit offsets past 2**31 elements, on the host with a tensor whose
  data_ptr() is moved back by the offset (no 8 GiB allocation): a literal offset, an int64 stride argument
  times the program id, uint32 offsets >= 2**31 (zero-extended), an int64 `range` loop, and a pointer carried
  through a loop by an int32 step whose running sum passes 2**31 (passes/induction_variables.py recomputes it
  as `trip * step` in int64), forward and backward.
- triton #11153 (interpreter and GPU disagree) and #10658 style -> `other` of another dtype (int32 into int8 /
  uint8 wraps, float into int saturates, NaN -> 0, bool into float, float64 into float32), truth values of
  ints and floats (`where(x, ...)` of int32 / float32 blocks with 2, 256, -1, NaN, -0.0; `if n:` / `not n` /
  `x and f`; device_assert of int and float blocks), bool tensors whose bytes are 2 / 255: compiled = interpreted.
- PTX min.f32 drops NaN unless .NaN (triton #2776 / #9840) -> every float max / min the compiler emits for
  maximum, minimum, max / min reductions and argmax of float32 / float16 / bfloat16 on sm_80 and sm_90a is a
  `.NaN` form; float atomic max / min are CAS loops (LLVM's fmaximum expansion, checked by reading it).
- "fp16 arithmetic computed in float32 and rounded once" (numerics/__init__.py) -> no contraction of a * b + c
  into one fma in 16-bit (or 32 / 64-bit) PTX; fp16 / bf16 division is div.rn.f32 and one cvt.rn; float64 ->
  bfloat16 on sm_80 (no direct cvt) rounds to odd in float32 first (LLVM's expansion), int32 / int64 ->
  bfloat16 on sm_80 likewise (codegen's `_int_to_bfloat16`), float -> every int type saturates with NaN -> 0
  in the PTX too (read for sm_80).
- int8 dot accumulating into an int32 accumulator near INT32_MAX (the FMA path, compiled): wraps as the
  interpreter and an exact int64 reference do. Kernel int arguments of 2**63 .. 2**64 - 1 (uint64). int64
  `range` loops whose last `iv + step` leaves int64 (steps of +-2**62, -2**63): Python's trip counts.
- Constants of 16-bit types (0.1, 65520 -> inf, 1e-8 -> 0, 1 + 2**-8 + 2**-30) fold to the interpreter's values.

DEFECTS found:
1. (fixed) `dsl.device_print(..., hex=True)` printed something else than the interpreter's bit pattern in the
   compiled kernel: floats with `%a` after widening to double (float32 1.5 -> "0x1.8p+0", the interpreter
   "0x3fc00000"; float64 -2.0 -> "-0x1p+1" for 0xc000000000000000; float16 / bfloat16 the same), and int8 /
   int16 sign-extended to 32 bits (int8 -128 -> "0xffffff80", the interpreter "0x80"). codegen/debug.py now passes
   each element's own bits (floats bitcast, narrow ints zero-extended) to %x / %llx. Checked here with a vprintf
   stand-in on the host. No library kernel prints, so their PTX is unchanged (.scratch/s36/ptx_record.py over
   .scratch/s38/ptx_files.txt, before and after: the same (name, arch, warps, sha) set).
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import re
import struct

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.target import assemble, ptxas_available
from host_jit import run_threads_on_host
from test_review_session35_dsl import _run_compiled


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "s39_compiled_cache"))


def _assemble(ptx: str, arch: str) -> None:
    if ptxas_available():
        assert assemble(ptx, arch).spill_bytes == 0


# == defect 1: device_print(hex=True) prints the bit pattern, compiled as interpreted ==============================
_SPEC = re.compile(r"%(%|d|u|x|lld|llu|llx|f|a|p)")


class _Printf:
    """A host stand-in for CUDA's vprintf(format, argument buffer): C's formatting of the conversions codegen emits."""

    def __init__(self):
        self.lines = []

    def __call__(self, fmt, args):
        text, offset, out, position = ctypes.string_at(fmt).decode(), 0, [], 0
        for match in _SPEC.finditer(text):
            out.append(text[position:match.start()])
            position, spec = match.end(), match.group(1)
            if spec == "%":
                out.append("%")
                continue
            size = 4 if spec in ("d", "u", "x") else 8
            offset = (offset + size - 1) // size * size
            raw = ctypes.string_at(args + offset, size)
            offset += size
            code = {"d": "<i", "u": "<I", "x": "<I", "lld": "<q", "llu": "<Q", "llx": "<Q", "f": "<d", "a": "<d",
                    "p": "<Q"}[spec]
            value = struct.unpack(code, raw)[0]
            out.append(f"{value:x}" if spec in ("x", "llx") else f"{value:f}" if spec == "f"
                       else value.hex() if spec == "a" else str(value))
        out.append(text[position:])
        self.lines.append("".join(out).rstrip("\n"))
        return 0


def _printf_host_ir(text: str) -> str:
    """The string constants' address-space casts (gone with the address spaces on the host) as plain uses."""
    text = re.sub(r"addrspacecast \(?ptr (@\w+) to ptr\)?", r"\1", text).replace("addrspacecast", "bitcast")
    return re.sub(r"^attributes #\d+ = \{\s*\}$", "", text, flags=re.M)


@dsl.jit
def _print_kernel(x_ptr, HEX: dsl.constexpr):
    dsl.device_print("v", dsl.load(x_ptr), hex=HEX)
    dsl.device_print("b", dsl.load(x_ptr + dsl.arange(0, 2)), hex=HEX)


def _bits(t: torch.Tensor) -> list:
    if t.dtype == torch.bool:
        return [int(v) for v in t.tolist()]
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    mask = (1 << (8 * t.element_size())) - 1
    return [v & mask for v in t.view(width).tolist()]


@pytest.mark.parametrize("dtype, values", [
    (torch.int8, [-128, 5]), (torch.int16, [-2, 3]), (torch.int64, [-1, 7]), (torch.uint8, [200, 1]),
    (torch.float32, [1.5, -0.0]), (torch.float64, [-2.0, float("nan")]), (torch.float16, [-1.0, 65504.0]),
    (torch.bfloat16, [3.0, -float("inf")]), (torch.bool, [True, False]),
], ids=lambda v: str(v).replace("torch.", "") if isinstance(v, torch.dtype) else "")
def test_defect_device_print_hex_prints_the_bit_pattern_as_the_interpreter(dtype, values):
    x = torch.tensor(values, dtype=dtype)
    expected = [f"0x{b:x}" for b in _bits(x)]
    seen = io.StringIO()
    with contextlib.redirect_stdout(seen):
        _print_kernel[(1,)](x, HEX=True, interpret=True)
    interpreted = re.findall(r"0x[0-9a-f]+", seen.getvalue())
    assert interpreted == [expected[0]] + expected, seen.getvalue()
    llir = _print_kernel.compile(x, HEX=True, target="sm_90a", num_warps=1).asm["llir"]
    assert "fpext" not in llir      # a 16-bit float widened to double is printed as a number, not its bits
    printf = _Printf()
    run_threads_on_host(_print_kernel, (x,), num_warps=1, rewrite=_printf_host_ir, allow_16bit_floats=True,
                        symbols=[("vprintf", ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p),
                                  printf)], HEX=True)
    scalar = {line for line in printf.lines if " v0x" in line}
    assert scalar == {f"pid (0, 0, 0) v{expected[0]}"}, printf.lines
    for i, value in enumerate(expected):       # each element of the block, printed by the threads holding it
        assert {line for line in printf.lines if f"idx ({i}) b" in line} == {f"pid (0, 0, 0) idx ({i}) b{value}"}


def test_device_print_decimal_is_unchanged_and_hex_assembles():
    x = torch.tensor([-128, 5], dtype=torch.int8)
    printf = _Printf()
    run_threads_on_host(_print_kernel, (x,), num_warps=1, rewrite=_printf_host_ir,
                        symbols=[("vprintf", ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p),
                                  printf)], HEX=False)
    assert {line for line in printf.lines if " v" in line} == {"pid (0, 0, 0) v-128"}
    for dtype in (torch.float16, torch.bfloat16, torch.int8, torch.float64):
        for arch in ("sm_90a", "sm_80"):
            ptx = _print_kernel.compile(torch.zeros(2, dtype=dtype), HEX=True, target=arch, num_warps=1).asm["ptx"]
            assert "%a" not in ptx
            _assemble(ptx, arch)


# == offsets past 2**31 elements (triton #6748 / #475, fla #1082): 64-bit addresses in the compiled code ==========
class _Shifted(torch.Tensor):
    """A tensor whose data_ptr() lies `shift` elements before its storage: a kernel that adds `shift` back
    reads the storage, one whose offsets wrapped in 32 bits reads elsewhere."""

    @staticmethod
    def __new__(cls, base, shift):
        shifted = torch.Tensor._make_subclass(cls, base)
        shifted._shift = shift
        return shifted

    def data_ptr(self):
        return super().data_ptr() - self._shift * self.element_size()


@dsl.jit
def _literal_offset_kernel(o_ptr, x_ptr, B: dsl.constexpr):
    i = dsl.arange(0, B)
    dsl.store(o_ptr + i, dsl.load(x_ptr + 2257846272 + i))


@dsl.jit
def _stride_kernel(o_ptr, x_ptr, stride, B: dsl.constexpr):
    i = dsl.arange(0, B)
    dsl.store(o_ptr + i, dsl.load(x_ptr + (dsl.program_id(0) + 3) * stride + i))


@dsl.jit
def _uint32_offset_kernel(o_ptr, x_ptr, base, B: dsl.constexpr):
    i = dsl.arange(0, B)
    dsl.store(o_ptr + i, dsl.load(x_ptr + (base + i.to(dsl.uint32))))


@dsl.jit
def _int64_loop_kernel(o_ptr, x_ptr, start, n, B: dsl.constexpr):
    acc = dsl.zeros((B,), dsl.float32)
    for s in range(start, n, B):
        i = s + dsl.arange(0, B)
        acc += dsl.load(x_ptr + i, mask=i < n, other=0.0)
    dsl.store(o_ptr + dsl.arange(0, B), acc)


@dsl.jit
def _carried_pointer_kernel(o_ptr, x_ptr, step, T: dsl.constexpr, B: dsl.constexpr):
    p = x_ptr + dsl.arange(0, B)
    acc = dsl.zeros((B,), dsl.float32)
    for t in range(T):       # only the last trip reads: its address is x_ptr + (T - 1) * step
        acc += dsl.load(p, mask=dsl.full((B,), t, dsl.int32) == T - 1, other=0.0)
        p += step
    dsl.store(o_ptr + dsl.arange(0, B), acc)


def test_compiled_offsets_past_2_31_elements_are_64_bit():
    B = 16
    x = torch.randn(4 * B)
    big = 3 * 2 ** 31 + 16
    step = 2 ** 30 + 16
    cases = [
        (_literal_offset_kernel, (_Shifted(x, 2257846272),), {}, x[:B]),
        (_stride_kernel, (_Shifted(x, 3 * big), big), {}, x[:B]),
        (_uint32_offset_kernel, (_Shifted(x, 3 * 2 ** 30), 3 * 2 ** 30), {}, x[:B]),
        (_int64_loop_kernel, (_Shifted(x, 2 ** 33), 2 ** 33, 2 ** 33 + 2 * B + 3),
         {}, x[:B] + x[B:2 * B] + torch.cat([x[2 * B:2 * B + 3], torch.zeros(B - 3)])),
        (_carried_pointer_kernel, (_Shifted(x, 3 * step), step), {"T": 4}, x[:B]),
        (_carried_pointer_kernel, (_Shifted(x, -3 * step), -step), {"T": 4}, x[:B]),
    ]
    for kernel, args, constexprs, expected in cases:
        out = torch.full((B,), float("nan"))
        _run_compiled(kernel, (out,) + args, num_warps=1, B=B, **constexprs)
        assert torch.equal(out, expected), (kernel.__name__, out, expected)


# == `other` of another dtype, truth values, bool bytes: compiled = interpreted ====================================
@dsl.jit
def _other_kernel(o_ptr, f_ptr, x_ptr, y_ptr, B: dsl.constexpr):
    i = dsl.arange(0, B)
    m = i < 2
    y = dsl.load(y_ptr + i)          # int32: 3, -3, 300, -1
    dsl.store(o_ptr + i, dsl.load(x_ptr + i, mask=m, other=y))                            # wraps into x's type
    dsl.store(o_ptr + B + i, dsl.load(x_ptr + i, mask=m, other=y.to(dsl.float32) * 1e10))  # saturates
    dsl.store(o_ptr + 2 * B + i, dsl.load(x_ptr + i, mask=m, other=float("nan")))          # NaN -> 0
    dsl.store(o_ptr + 3 * B + i, dsl.load(x_ptr + i, mask=m, other=-1))
    dsl.store(f_ptr + i, dsl.load(f_ptr + B + i, mask=m, other=y > 0))
    dsl.store(f_ptr + 2 * B + i, dsl.load(f_ptr + B + i, mask=m, other=y.to(dsl.float64) + 0.1))


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
def test_masked_load_other_of_another_dtype_compiled_as_interpreted(dtype):
    B = 4
    x = torch.tensor([7, 9, 11, 13], dtype=dtype)
    y = torch.tensor([3, -3, 300, -1], dtype=torch.int32)
    outs = []
    for run in ("interpreted", "compiled"):
        o = torch.full((4 * B,), 99, dtype=dtype)
        f = torch.cat([torch.full((B,), float("nan")), torch.tensor([1.5, 2.5, 3.5, 4.5]),
                       torch.full((B,), float("nan"))])
        if run == "interpreted":
            _other_kernel[(1,)](o, f, x, y, B=B, interpret=True)
        else:
            _run_compiled(_other_kernel, (o, f, x, y), num_warps=1, B=B)
        outs.append((o, f))
    (o, f), (o2, f2) = outs
    assert torch.equal(o, o2) and torch.equal(f, f2)
    wrapped = [v - 256 if dtype == torch.int8 and v > 127 else v for v in (300 % 256, 255)]
    top, bottom = (127, -128) if dtype == torch.int8 else (255, 0)
    assert o.view(4, B)[:, 2:].tolist() == [[wrapped[0], -1 if dtype == torch.int8 else 255], [top, bottom], [0, 0],
                                            [-1 if dtype == torch.int8 else 255] * 2]
    assert f[:B].tolist() == [1.5, 2.5, 1.0, 0.0]
    assert f[2 * B:].tolist() == [1.5, 2.5, torch.tensor(300.1).item(), torch.tensor(-0.9).item()]


@dsl.jit
def _truth_kernel(o_ptr, x_ptr, f_ptr, n, fl, B: dsl.constexpr):
    i = dsl.arange(0, B)
    x = dsl.load(x_ptr + i)
    f = dsl.load(f_ptr + i)
    dsl.store(o_ptr + i, dsl.where(x, 1, 0))
    dsl.store(o_ptr + B + i, dsl.where(f, 1, 0))
    r = 0
    if n:
        r = 1
    s = 0
    if fl:
        s = 1
    dsl.store(o_ptr + 2 * B + i, r + 2 * s + 4 * (not n) + i * 0)
    dsl.store(o_ptr + 3 * B + i, dsl.where(x and f, 1, 0) + 2 * dsl.where(x or f, 1, 0))


def test_truth_values_of_ints_and_floats_compiled_as_interpreted():
    B = 4
    x = torch.tensor([2, 0, -1, 256], dtype=torch.int32)
    f = torch.tensor([0.5, float("nan"), 0.0, -0.0])
    for n, fl in ((256, float("nan")), (0, -0.0), (-1, 1e-45)):
        outs = []
        for run in ("interpreted", "compiled"):
            o = torch.full((4 * B,), -9, dtype=torch.int32)
            if run == "interpreted":
                _truth_kernel[(1,)](o, x, f, n, fl, B=B, interpret=True)
            else:
                _run_compiled(_truth_kernel, (o, x, f, n, fl), num_warps=1, B=B)
            outs.append(o.view(4, B).tolist())
        assert outs[0] == outs[1]
        truth = [bool(v) for v in x.tolist()], [bool(v) for v in f.tolist()]     # Python's: NaN is true
        assert outs[0][0] == [int(t) for t in truth[0]] and outs[0][1] == [int(t) for t in truth[1]]
        assert outs[0][2] == [int(bool(n)) + 2 * int(bool(fl)) + 4 * int(not n)] * B
        assert outs[0][3] == [int(a and b) + 2 * int(a or b) for a, b in zip(*truth)]


@dsl.jit
def _bool_bytes_kernel(o_ptr, b_ptr, B: dsl.constexpr):
    i = dsl.arange(0, B)
    b = dsl.load(b_ptr + i)
    dsl.store(o_ptr + i, b.to(dsl.int32) + 2 * (~b).to(dsl.int32) + 4 * (b == True).to(dsl.int32))  # noqa: E712
    dsl.store(o_ptr + B + i, dsl.where(b, 10, 20) + dsl.sum(b.to(dsl.int32), 0))
    dsl.store(b_ptr + B + i, b)


def test_bool_bytes_other_than_one_load_as_true_compiled():
    B = 8
    raw = torch.tensor([0, 1, 2, 255, 128, 0, 4, 1] + [7] * B, dtype=torch.uint8)
    out = torch.full((2 * B,), -1, dtype=torch.int32)
    flags = raw.clone().view(torch.bool)
    _run_compiled(_bool_bytes_kernel, (out, flags), num_warps=1, B=B)
    truth = [v != 0 for v in raw[:B].tolist()]
    assert out[:B].tolist() == [1 + 4 if t else 2 for t in truth]
    assert out[B:].tolist() == [(10 if t else 20) + sum(truth) for t in truth]
    assert flags.view(torch.uint8)[B:].tolist() == [int(t) for t in truth]      # stored as 0 / 1 bytes
    interpreted = torch.full_like(out, -1)
    _bool_bytes_kernel[(1,)](interpreted, raw.clone().view(torch.bool), B=B, interpret=True)
    assert torch.equal(interpreted, out)


# == the PTX: NaN-propagating min / max, 16-bit arithmetic rounded once per op =====================================
@dsl.jit
def _min_max_kernel(o_ptr, x_ptr, y_ptr, i_ptr, B: dsl.constexpr):
    r = dsl.arange(0, B)
    x = dsl.load(x_ptr + r)
    y = dsl.load(y_ptr + r)
    dsl.store(o_ptr + r, dsl.maximum(x, y))
    dsl.store(o_ptr + B + r, dsl.minimum(x, y))
    dsl.store(o_ptr + 2 * B + r, dsl.max(x, 0) + dsl.min(y, 0) + 0 * x)
    dsl.store(i_ptr + r, dsl.argmax(x, 0) + dsl.argmin(y, 0) + 0 * r)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_float_min_max_instructions_propagate_nan(arch):
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        args = (torch.zeros(3 * 128, dtype=dtype), torch.zeros(128, dtype=dtype), torch.zeros(128, dtype=dtype),
                torch.zeros(128, dtype=torch.int32))
        ptx = _min_max_kernel.compile(*args, B=128, target=arch, num_warps=4).asm["ptx"]
        float_min_max = re.findall(r"\b(?:max|min)\.[\w.]*(?:f32|f16|bf16)\b", ptx)
        assert float_min_max and all(".NaN." in op for op in float_min_max), sorted(set(float_min_max))
        _assemble(ptx, arch)


@dsl.jit
def _round_once_kernel(o_ptr, a_ptr, b_ptr, c_ptr, B: dsl.constexpr):
    i = dsl.arange(0, B)
    a = dsl.load(a_ptr + i)
    b = dsl.load(b_ptr + i)
    c = dsl.load(c_ptr + i)
    dsl.store(o_ptr + i, a * b + c)
    dsl.store(o_ptr + B + i, a / b)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_multiply_add_is_not_contracted_and_16_bit_division_rounds_once(arch):
    for dtype, kind in ((torch.float16, "f16"), (torch.bfloat16, "bf16"), (torch.float32, "f32"),
                        (torch.float64, "f64")):
        args = [torch.zeros(2 * 32, dtype=dtype)] + [torch.zeros(32, dtype=dtype)] * 3
        ptx = _round_once_kernel.compile(*args, B=32, target=arch, num_warps=1).asm["ptx"]
        fmas = re.findall(rf"fma\.rn\.{kind}\s+%\w+, %\w+, %\w+, (%\w+|0[dfx][0-9A-F]+);", ptx)
        if kind == "bf16" and arch == "sm_80":
            # no add.bf16 / mul.bf16 before sm_90: each op is one fma with -0.0 or 1.0 (one rounding each)
            assert len(fmas) == 2 and re.search(r"mov\.b16\s+%rs\d+, 0x8000;", ptx) \
                and re.search(r"mov\.b16\s+%rs\d+, 0x3F80;", ptx), ptx
        else:
            assert not fmas and f"mul.rn.{kind}" in ptx and f"add.rn.{kind}" in ptx
        if kind in ("f16", "bf16"):
            assert "div.rn.f32" in ptx and f"cvt.rn.{kind}.f32" in ptx and "div.approx" not in ptx
        _assemble(ptx, arch)


# == int8 dot into an int32 accumulator near INT32_MAX; uint64 kernel arguments =====================================
@dsl.jit
def _int8_dot_kernel(o_ptr, a_ptr, b_ptr, c_ptr, M: dsl.constexpr):
    r = dsl.arange(0, M)
    idx = r[:, None] * M + r[None, :]
    dsl.store(o_ptr + idx, dsl.dot(dsl.load(a_ptr + idx), dsl.load(b_ptr + idx), dsl.load(c_ptr + idx)))


def test_int8_dot_wraps_its_int32_accumulator_compiled_as_interpreted():
    M = 16
    g = torch.Generator().manual_seed(39)
    a = torch.randint(-128, 128, (M, M), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 128, (M, M), dtype=torch.int8, generator=g)
    c = torch.randint(2 ** 31 - 100000, 2 ** 31 - 1, (M, M), dtype=torch.int32, generator=g)
    exact = a.long() @ b.long() + c.long()
    expected = ((exact + 2 ** 31) % 2 ** 32 - 2 ** 31).int()
    assert (exact > 2 ** 31 - 1).any()
    interpreted = torch.zeros(M, M, dtype=torch.int32)
    _int8_dot_kernel[(1,)](interpreted, a, b, c, M=M, interpret=True)
    compiled = torch.zeros(M, M, dtype=torch.int32)
    _run_compiled(_int8_dot_kernel, (compiled, a, b, c), num_warps=1, M=M)
    assert torch.equal(interpreted, expected) and torch.equal(compiled, expected)


@dsl.jit
def _wide_argument_kernel(o_ptr, n, B: dsl.constexpr):
    i = dsl.arange(0, B)
    dsl.store(o_ptr + i, (n // 3 + i * 0).to(dsl.int64))
    dsl.store(o_ptr + B + i, ((n > 5) + i * 0).to(dsl.int64))
    dsl.store(o_ptr + 2 * B + i, ((n >> 60) + i * 0).to(dsl.int64))


def test_int_arguments_past_int64_are_uint64_compiled_as_interpreted():
    for n in (2 ** 63 + 5, 2 ** 64 - 1, -2 ** 63):
        expected = [(n % 2 ** 64 // 3 if n >= 0 else -(-n // 3)), int(n > 5), n % 2 ** 64 >> 60 if n >= 0 else n >> 60]
        expected = [v - 2 ** 64 if v >= 2 ** 63 else v for v in expected]
        interpreted = torch.zeros(6, dtype=torch.int64)
        _wide_argument_kernel[(1,)](interpreted, n, B=2, interpret=True)
        compiled = torch.zeros(6, dtype=torch.int64)
        _run_compiled(_wide_argument_kernel, (compiled, n), num_warps=1, B=2)
        assert interpreted.view(3, 2)[:, 0].tolist() == expected and torch.equal(interpreted, compiled)


@dsl.jit
def _int64_range_kernel(o_ptr, lo, hi, st, B: dsl.constexpr):
    i = dsl.arange(0, B)
    count = 0
    last = lo - lo
    for j in range(lo, hi, st):
        count += 1
        last = j
    dsl.store(o_ptr + i, count + i * 0)
    dsl.store(o_ptr + B + i, last + i * 0)


def test_int64_ranges_at_the_type_bounds_compiled_as_interpreted():
    top = 2 ** 63
    for lo, hi, st in ((top - 10, top - 1, 4), (-top + 10, -top, -3), (top - 2 ** 62, -top, -2 ** 62 - 7),
                       (2 ** 40, 2 ** 40 + 9, 2 ** 32 + 1), (top - 1, -top, -top)):
        expected = list(range(lo, hi, st))
        for run in ("interpreted", "compiled"):
            out = torch.zeros(4, dtype=torch.int64)
            if run == "interpreted":
                _int64_range_kernel[(1,)](out, lo, hi, st, B=2, interpret=True)
            else:
                _run_compiled(_int64_range_kernel, (out, lo, hi, st), num_warps=1, B=2)
            assert out.tolist() == [len(expected)] * 2 + [expected[-1]] * 2, (run, lo, hi, st)
