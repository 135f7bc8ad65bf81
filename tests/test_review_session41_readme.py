"""Review (session 41): the README's "Coming from Triton" claims that session 41 added or changed (`git diff d52e830
-- README.md`), written as a Triton user writes them (the README's snippet, then variations), in the interpreter.

What was tried, and found as the README says:
- "Not in the language": tl.sort / topk / gather / cat / softmax / histogram / associative_scan / reduce /
  inline_asm_elementwise / dot_scaled / float8e4nv / float8e5 / tl.extra.cuda.libdevice, tl.math.pow / log1p /
  isnan, `x ** 2`: each a CompilationError (UnsupportedError for `**`) naming the name and what to use instead; the
  same names on the host (AttributeError with the hint), @triton.heuristics' hint. (Since then libdevice's
  functions and `**` are in the language, tests/test_dsl_libdevice.py; these tests use names still missing.)
- Triton's small names with Triton's signatures and result dtypes: dsl.range(0, n, step=, num_stages=,
  loop_unroll_factor=, flatten=) (a bad hint / unknown keyword / use outside `for` are errors naming it);
  zeros_like / full_like (input's dtype, dtype= as torch's, int input truncates 2.5 as torch.full_like); view /
  ravel keep the order; permute with a tuple or separate dims (function and method); broadcast returns the pair;
  div_rn / fdiv(ieee_rounding=True) / sqrt_rn equal the float64 result rounded once (dsl.div_rn of ints refused);
  cumprod's dtypes (bfloat16 -> float32, float16 kept, int8 kept); xor_sum's value; flip's default last dim and
  dim=0; join / split / interleave / x.join / x.split of values and join / interleave of pointers (flip / split of
  pointers refused, as the README says); swizzle2d against Triton's own formula (triton/language/standard.py);
  assume / debug_barrier; static_print / device_print / device_assert with f-strings of constexprs.
- random: result dtypes (rand / randn float32, randint uint32 / uint64 for int64 offsets, randint4x four words),
  n_rounds as keyword or positional, int8 / int16 / float offsets and a float seed refused naming the argument.
- block pointers: padding_option "" fills zeros as "zero", "nan" fills NaN, an unknown padding and an
  out-of-range boundary_check dim refused; advance with negative offsets and p.advance.
- tf32 dots: input_precision="tf32" gives the float64 product of the rna-rounded operands (the acc positional as
  Triton's), "tf32x3" / "bf16x3" refused naming the value; a 3-D dot refused.
- launches with num_warps=None / num_stages=None take 4 / 3 (the grid's META shows them).
- autotune: prune_configs_by with an unknown key (TypeError listing the keys), use_cuda_graph=True refused,
  Config(num_ctas=2) / maxnreg refused naming cluster_dims / launch_bounds; the interpreter runs only the kept
  config's pre_hook.

DEFECTS found (fixed):
1. `dsl.Config(kwargs, num_warps=None)` (or num_stages=None / num_ctas=None) was a ValueError "num_warps must be a
   power of two", while launches take None as the default since this session and Triton's Config takes None as
   "the default" (its all_kwargs leaves None out). runtime/autotune_config.py: None becomes 4 / 3 / 1; README.
2. `dsl.dot(a, b, allow_tf32=True)` (Triton's older flag, in many published kernels) and
   `max_num_imprecise_acc=` were "unexpected keyword argument", and out_dtype was the 5th positional argument
   (Triton's 7th). language/block_builtins.py: dot takes Triton's arguments in Triton's order; allow_tf32 maps to
   input_precision ("not both" is an error, as Triton's), max_num_imprecise_acc is checked and ignored (fp8 only in
   Triton). The IR of every other call is unchanged. README's tf32 bullet says so.
3. `dsl.math.log1p(x)` in a kernel said "module `fusedops.dsl.language.triton_math` has no attribute" (the user
   wrote dsl.math): frontend/expressions.py names it `fusedops.dsl.math`, as the host's AttributeError does.
"""

from __future__ import annotations

import functools

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl import CompilationError
from helpers import poison
from kernel_source import jit_from_source

_count = [0]


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "s41_readme_cache"))


def _kernel(body: str, params: str = "o_ptr, x_ptr"):
    _count[0] += 1
    source = f"def k({params}):\n" + "".join(f"    {line}\n" for line in body.strip().splitlines())
    return jit_from_source(source, f"<s41 readme {_count[0]}>")


def _run(body: str, x: torch.Tensor, size: int = 16, dtype=torch.float32) -> torch.Tensor:
    out = poison(torch.empty(size, dtype=dtype))
    _kernel(body)[(1,)](out, x, interpret=True)
    return out


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 -> tf32, to nearest with ties away (cvt.rna.tf32.f32), for finite values."""
    bits = t.view(torch.int32).to(torch.int64)
    return ((bits + 0x1000) & ~0x1FFF).to(torch.int32).view(torch.float32)


# == defects ======================================================================================================
def test_defect_config_takes_none_as_the_default_warps_stages_and_ctas():
    config = dsl.Config({"B": 16}, num_warps=None, num_stages=None, num_ctas=None)
    assert (config.num_warps, config.num_stages, config.num_ctas) == (4, 3, 1)
    assert config == dsl.Config({"B": 16}) and hash(config) == hash(dsl.Config({"B": 16}))
    assert config.all_kwargs() == {"B": 16, "num_warps": 4, "num_ctas": 1, "num_stages": 3}
    with pytest.raises(ValueError, match="num_warps must be a power of two from 1 to 32, got 3"):
        dsl.Config({"B": 16}, num_warps=3)
    with pytest.raises(ValueError, match="num_ctas=2: only 1.*cluster_dims"):
        dsl.Config({"B": 16}, num_ctas=2)

    seen = []

    def body(o_ptr, x_ptr, n, B: dsl.constexpr):
        offs = dsl.program_id(0) * B + dsl.arange(0, B)
        dsl.store(o_ptr + offs, dsl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)

    tuned = dsl.autotune([dsl.Config({"B": 32}, num_warps=None, num_stages=None,
                                     pre_hook=lambda args: seen.append((args["num_warps"], args["num_stages"])))],
                         key=["n"])(dsl.jit(body))
    x = torch.randn(100)
    out = poison(torch.empty(100))
    tuned[lambda meta: (dsl.cdiv(100, meta["B"]),)](out, x, 100, interpret=True)
    assert torch.equal(out, 2 * x) and seen == [(4, 3)]


_MM = ("r = dsl.arange(0, 16)\nA = dsl.load(a_ptr + r[:, None] * 16 + r[None, :])\n"
       "B = dsl.load(b_ptr + r[:, None] * 16 + r[None, :])\n")


def _dot(expression: str, a, b):
    out = poison(torch.empty(16, 16))
    _kernel(_MM + f"dsl.store(o_ptr + r[:, None] * 16 + r[None, :], {expression})", "o_ptr, a_ptr, b_ptr")[(1,)](
        out, a, b, interpret=True)
    return out.double()


def test_defect_dot_takes_tritons_allow_tf32_and_max_num_imprecise_acc():
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    ieee, tf32 = a.double() @ b.double(), _tf32(a).double() @ _tf32(b).double()
    assert (ieee - tf32).abs().max() > 1e-3          # the two are told apart
    close = functools.partial(torch.testing.assert_close, atol=2e-5, rtol=1e-5)
    close(_dot("dsl.dot(A, B, allow_tf32=True)", a, b), tf32)
    close(_dot("dsl.dot(A, B, allow_tf32=False)", a, b), ieee)
    close(_dot("dsl.dot(A, B, input_precision='tf32')", a, b), tf32)
    close(_dot("dsl.dot(A, B, max_num_imprecise_acc=32)", a, b), ieee)
    # Triton's positional order: (input, other, acc, input_precision, allow_tf32, max_num_imprecise_acc, out_dtype)
    close(_dot("dsl.dot(A, B, dsl.full((16, 16), 1.0, dsl.float32), None, True, None, dsl.float32)", a, b), tf32 + 1)
    with pytest.raises(CompilationError, match="give input_precision or allow_tf32, not both"):
        _dot("dsl.dot(A, B, input_precision='ieee', allow_tf32=True)", a, b)
    with pytest.raises(CompilationError, match="allow_tf32 must be a constexpr bool, got 'yes'"):
        _dot("dsl.dot(A, B, allow_tf32='yes')", a, b)
    with pytest.raises(CompilationError, match="max_num_imprecise_acc must be None or a constexpr int >= 0, got -1"):
        _dot("dsl.dot(A, B, max_num_imprecise_acc=-1)", a, b)


def test_defect_missing_dsl_math_name_in_a_kernel_names_dsl_math():
    # (log1p is in dsl.math since the libdevice functions came: tests/test_dsl_libdevice.py; erfinv is not)
    with pytest.raises(CompilationError, match=r"module `fusedops.dsl.math` has no attribute `erfinv` "
                                               r"\(Triton's tl.math.erfinv: dsl.math has abs, cdiv"):
        _run("dsl.store(o_ptr, dsl.math.erfinv(dsl.load(x_ptr)))", torch.randn(1), 1)


# == "Not in the language" ========================================================================================
@pytest.mark.parametrize("expression, hint", [
    ("dsl.map_elementwise(v)", "tl.map_elementwise: it is not in the language"),   # (sort: tests/test_dsl_sort.py)
    # (cat, histogram and gather: in the language, tests/test_dsl_gather.py)
    ("dsl.softmax(v)", r"tl.softmax: write it out: dsl.exp\(x - dsl.max"),
    # (associative_scan and reduce: in the language, tests/test_dsl_reduce_combine.py)
    ("dsl.inline_asm_elementwise('', '', [v], dtype=dsl.int32, is_pure=True, pack=1)", "not in the language"),
    ("dsl.dot_scaled(v, None, 'e4m3', v, None, 'e4m3')", "fp8 and scaled dots are not in the language"),
    ("v.to(dsl.float8e4nv)", "fp8 types are not in the language"),
    # (libdevice's pow, log1p, ... and `**`: in the language, tests/test_dsl_libdevice.py)
    ("dsl.extra.cuda.libdevice.lgamma(v)", r"libdevice.lgamma is not in the language: dsl.extra.cuda.libdevice has"),
])
def test_not_in_the_language_names_what_to_use(expression, hint):
    with pytest.raises(CompilationError, match=hint):
        _run(f"v = dsl.load(x_ptr + dsl.arange(0, 8))\ndsl.store(o_ptr + dsl.arange(0, 8), {expression})",
             torch.randn(8), 8)


def test_pow_operator_and_host_names():
    # (`**` is in the language since the libdevice functions came: tests/test_dsl_libdevice.py)
    with pytest.raises(CompilationError, match=r"`\*\*` of an integer base needs a compile-time int exponent"):
        _run("dsl.store(o_ptr, (dsl.load(x_ptr) > 0).to(dsl.int32) ** -1)", torch.randn(1), 1)
    with pytest.raises(AttributeError, match="tl.map_elementwise: it is not in the language"):
        dsl.map_elementwise                                          # noqa: B018
    with pytest.raises(AttributeError, match="triton.heuristics: compute the value on the host"):
        dsl.heuristics                                    # noqa: B018


# == Triton's small names =========================================================================================
def test_range_hints_like_tl_range_and_its_errors():
    x = torch.randn(16)
    got = _run("acc = 0.0\nfor i in dsl.range(1, 16, step=3, num_stages=2, loop_unroll_factor=4, flatten=True):\n"
               "    acc += dsl.load(x_ptr + i)\ndsl.store(o_ptr, acc)", x, 1)
    torch.testing.assert_close(got.double(), x[1::3].double().sum().reshape(1), atol=1e-6, rtol=1e-6)
    for body, message in [("for i in dsl.range(0, 8, num_stages=0):\n    pass", "num_stages must be None or a "
                           "constexpr int >= 1, got 0"),
                          ("for i in dsl.range(0, 8, foo=1):\n    pass", "unexpected keyword argument 'foo'"),
                          ("r = dsl.range(0, 8)", r"dsl.range\(\) can only be used as the iterable of a `for`")]:
        with pytest.raises(CompilationError, match=message):
            _run(body + "\ndsl.store(o_ptr, 1.0)", x, 1)


def test_like_view_permute_broadcast(capsys):
    x = torch.randn(16)
    got = _run("a = dsl.load(x_ptr + dsl.arange(0, 16))\ni = dsl.arange(0, 16)\n"
               "dsl.static_print(dsl.zeros_like(a), dsl.zeros_like(a, dtype=dsl.float16), dsl.full_like(i, 2.5),"
               " dsl.zeros_like(dsl.load(x_ptr)))\n"
               "dsl.store(o_ptr + i, dsl.full_like(i, 2.5) + dsl.zeros_like(a))", x)
    assert capsys.readouterr().out == ("<runtime <16xfloat32>> <runtime <16xfloat16>> <runtime <16xint32>> "
                                       "<runtime float32>\n")
    assert torch.equal(got, torch.full((16,), 2.0))          # torch.full_like(int tensor, 2.5) is 2 too
    got = _run("a = dsl.load(x_ptr + dsl.arange(0, 16))\nb = dsl.view(a, (4, 4))\n"
               "dsl.store(o_ptr + dsl.arange(0, 16), dsl.ravel(b.trans()) + a.view(2, 8).ravel() * 0)", x)
    assert torch.equal(got, x.view(4, 4).T.reshape(-1))
    got = _run("a = dsl.load(x_ptr + dsl.arange(0, 16)).reshape(2, 2, 4)\n"
               "dsl.store(o_ptr + dsl.arange(0, 16), dsl.ravel(dsl.permute(a, 2, 0, 1)))\n"
               "dsl.store(o_ptr + 16 + dsl.arange(0, 16), a.permute((1, 2, 0)).ravel())", x, 32)
    assert torch.equal(got[:16], x.view(2, 2, 4).permute(2, 0, 1).reshape(-1))
    assert torch.equal(got[16:], x.view(2, 2, 4).permute(1, 2, 0).reshape(-1))
    got = _run("a = dsl.load(x_ptr + dsl.arange(0, 4))[:, None]\nb = dsl.arange(0, 4)[None, :]\n"
               "a2, b2 = dsl.broadcast(a, b)\ndsl.static_print(a2, b2)\n"
               "dsl.store(o_ptr + dsl.arange(0, 16), dsl.ravel(a2 * 10.0 + b2))", x)
    assert capsys.readouterr().out == "<runtime <4x4xfloat32>> <runtime <4x4xint32>>\n"
    assert torch.equal(got, (x[:4, None] * 10 + torch.arange(4)[None, :]).reshape(-1))


def test_rounding_explicit_math_is_the_float64_result_rounded_once():
    x = torch.randn(16) * 100
    got = _run("a = dsl.load(x_ptr + dsl.arange(0, 16))\nr = dsl.arange(0, 16)\n"
               "dsl.store(o_ptr + r, dsl.div_rn(a, 3.0))\ndsl.store(o_ptr + 16 + r, dsl.fdiv(a, 7.0, "
               "ieee_rounding=True))\ndsl.store(o_ptr + 32 + r, dsl.math.fdiv(a, 7.0))\n"
               "dsl.store(o_ptr + 48 + r, dsl.sqrt_rn(dsl.abs(a)))", x, 64)
    assert torch.equal(got[:16], (x.double() / 3).float())
    assert torch.equal(got[16:32], (x.double() / 7).float()) and torch.equal(got[32:48], got[16:32])
    assert torch.equal(got[48:], x.double().abs().sqrt().float())
    with pytest.raises(CompilationError, match=r"div_rn: x must be a floating-point .*got int32"):
        _run("dsl.store(o_ptr, dsl.div_rn(dsl.arange(0, 16), 3))", x)


def test_scans_reductions_and_exact_moves(capsys):
    x = torch.randn(16)
    got = _run("a = dsl.load(x_ptr + dsl.arange(0, 16)).to(dsl.bfloat16)\n"
               "dsl.static_print(dsl.cumprod(a), a.cumprod(0), dsl.cumprod(a.to(dsl.float16)), "
               "dsl.cumprod(a.to(dsl.int8)), dsl.xor_sum(dsl.arange(0, 16)), a.flip())\n"
               "dsl.store(o_ptr + dsl.arange(0, 16), dsl.cumprod(a, 0, reverse=True))", x)
    assert capsys.readouterr().out == ("<runtime <16xfloat32>> <runtime <16xfloat32>> <runtime <16xfloat16>> "
                                       "<runtime <16xint8>> <runtime int32> <runtime <16xbfloat16>>\n")
    ref = x.bfloat16().double().flip(0).cumprod(0).flip(0)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-30)
    got = _run("dsl.store(o_ptr, dsl.xor_sum(dsl.arange(0, 16) * 7))", x, 1, torch.int32)
    assert got.item() == functools.reduce(lambda p, q: p ^ q, [7 * i for i in range(16)])
    got = _run("a = dsl.load(x_ptr + dsl.arange(0, 16)).reshape(4, 4)\n"
               "dsl.store(o_ptr + dsl.arange(0, 16), dsl.ravel(dsl.flip(a)))\n"
               "dsl.store(o_ptr + 16 + dsl.arange(0, 16), dsl.ravel(a.flip(0)))", x, 32)
    assert torch.equal(got[:16], x.view(4, 4).flip(1).reshape(-1))
    assert torch.equal(got[16:], x.view(4, 4).flip(0).reshape(-1))
    got = _run("a = dsl.load(x_ptr + dsl.arange(0, 8))\nb = dsl.load(x_ptr + 8 + dsl.arange(0, 8))\n"
               "p, q = dsl.split(dsl.join(a, b))\np2, q2 = a.join(b).split()\n"
               "dsl.store(o_ptr + dsl.arange(0, 16), dsl.interleave(p, q2))\n"
               "dsl.store(o_ptr + 16 + dsl.arange(0, 2), dsl.join(dsl.load(x_ptr), dsl.load(x_ptr + 1)))\n"
               "ptrs = dsl.interleave(x_ptr + dsl.arange(0, 8), x_ptr + 8 + dsl.arange(0, 8))\n"
               "dsl.store(o_ptr + 18 + dsl.arange(0, 16), dsl.load(ptrs) + dsl.interleave(p2, q) * 0)", x, 34)
    inter = torch.stack([x[:8], x[8:]], -1).reshape(-1)
    assert torch.equal(got[:16], inter) and torch.equal(got[16:18], x[:2]) and torch.equal(got[18:], inter)
    for body, name in [("dsl.flip(x_ptr + dsl.arange(0, 8))", "flip"),
                       ("dsl.split(dsl.join(x_ptr + dsl.arange(0, 8), x_ptr))", "split")]:
        with pytest.raises(CompilationError, match=f"{name}: blocks of pointers are not supported"):
            _run(body, x)


def _triton_swizzle2d(i, j, size_i, size_j, size_g):
    # triton/language/standard.py's swizzle2d, in Python ints
    ij = i * size_j + j
    size_gj = size_g * size_j
    off_i = (ij // size_gj) * size_g
    size_g = min(size_i - off_i, size_g)
    ij = ij % size_gj
    return off_i + ij % size_g, ij // size_g


def test_swizzle2d_is_tritons_and_assume_barrier_fstrings(capsys):
    got = _run("i = dsl.arange(0, 8)[:, None]\nj = dsl.arange(0, 4)[None, :]\n"
               "a, b = dsl.swizzle2d(i, j, 7, 4, 3)\ndsl.assume(i >= 0)\ndsl.debug_barrier()\n"
               "dsl.store(o_ptr + dsl.ravel(i * 4 + j), dsl.ravel(a * 4 + b), mask=dsl.ravel(i < 7 + j * 0))",
               torch.zeros(1), 32, torch.int32)
    ref = [a * 4 + b for a, b in (_triton_swizzle2d(i, j, 7, 4, 3) for i in range(7) for j in range(4))]
    assert got[:28].tolist() == ref and sorted(ref) == list(range(28))
    kernel = _kernel("dsl.static_print(f'B={B}')\ndsl.device_print(f'B={B} ', dsl.load(x_ptr))\n"
                     "dsl.device_assert(dsl.load(x_ptr) < 100.0, f'B={B} too big')\ndsl.store(o_ptr, B)",
                     "o_ptr, x_ptr, B: dsl.constexpr")
    out = poison(torch.empty(1, dtype=torch.int32))
    kernel[(1,)](out, torch.tensor([1.5]), B=8, interpret=True)
    printed = capsys.readouterr().out
    assert printed.startswith("B=8\n") and "B=8  1.5" in printed and out.item() == 8
    with pytest.raises(Exception, match="device assertion failed: B=4 too big"):
        kernel[(1,)](out, torch.tensor([200.0]), B=4, interpret=True)


# == random numbers, block pointers, tf32, launches ===============================================================
def test_random_result_dtypes_and_refused_offsets(capsys):
    got = _run("off = dsl.arange(0, 16)\n"
               "dsl.static_print(dsl.rand(7, off), dsl.randn(7, off), dsl.randint(7, off), "
               "dsl.randint(7, off.to(dsl.int64)), dsl.randint4x(7, off)[3], dsl.rand(7, off.to(dsl.int64)))\n"
               "dsl.store(o_ptr + off, dsl.rand(7, off, n_rounds=7) - dsl.rand(7, off, 7) + dsl.rand(7, off))",
               torch.zeros(1))
    assert capsys.readouterr().out == ("<runtime <16xfloat32>> <runtime <16xfloat32>> <runtime <16xuint32>> "
                                       "<runtime <16xuint64>> <runtime <16xuint32>> <runtime <16xfloat32>>\n")
    assert ((got >= 0) & (got < 1)).all() and got.unique().numel() == 16
    for offset, message in [("off.to(dsl.int8)", "must be a 32- or 64-bit integer, got int8"),
                            ("off.to(dsl.int16)", "must be a 32- or 64-bit integer, got int16"),
                            ("off.to(dsl.float32)", r"offset \(counter c0\) must be an integer")]:
        with pytest.raises(CompilationError, match=message):
            _run(f"off = dsl.arange(0, 16)\ndsl.store(o_ptr + off, dsl.rand(7, {offset}))", torch.zeros(1))
    with pytest.raises(CompilationError, match="seed must be an integer"):
        _run("off = dsl.arange(0, 16)\ndsl.store(o_ptr + off, dsl.rand(7.0, off))", torch.zeros(1))


def test_block_pointer_padding_options():
    x = torch.randn(16, 16)
    expected = torch.full((8, 8), float("nan"))
    expected[:6, :4] = x[4:10, 8:12]
    make = ("p = dsl.make_block_ptr(base=x_ptr, shape=(10, 12), strides=(16, 1), offsets=(4, 8), "
            "block_shape=(8, 8), order=(1, 0))\no = dsl.arange(0, 8)[:, None] * 8 + dsl.arange(0, 8)[None, :]\n")
    for padding, fill in [("''", 0.0), ("'zero'", 0.0), ("'nan'", float("nan"))]:
        got = _run(make + f"dsl.store(o_ptr + o, dsl.load(p, boundary_check=(0, 1), padding_option={padding}))",
                   x, 64).view(8, 8)
        assert torch.equal(got.nan_to_num(99.0), expected.nan_to_num(fill if fill == 0.0 else 99.0))
    got = _run(make + "p = p.advance((-4, -8))\np = dsl.advance(p, (1, 1))\n"
                      "dsl.store(o_ptr + o, dsl.load(p, boundary_check=(0, 1)))", x, 64)
    assert torch.equal(got.view(8, 8), x[1:9, 1:9])
    with pytest.raises(CompilationError, match=r"padding_option must be one of \('', 'zero', 'nan'\), got 'inf'"):
        _run(make + "v = dsl.load(p, boundary_check=(0, 1), padding_option='inf')", x, 64)
    with pytest.raises(CompilationError, match=r"boundary_check must hold dims of the block pointer"):
        _run(make + "v = dsl.load(p, boundary_check=(2,))", x, 64)


def test_tf32_dot_values_and_refused_precisions():
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    got = _dot("dsl.dot(A, B, dsl.full((16, 16), 0.5, dsl.float32), input_precision='tf32')", a, b)
    torch.testing.assert_close(got, _tf32(a).double() @ _tf32(b).double() + 0.5, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(_dot("dsl.dot(A, B)", a, b), a.double() @ b.double(), atol=2e-5, rtol=1e-5)
    for precision in ("tf32x3", "bf16x3"):
        with pytest.raises(CompilationError, match=f"input_precision must be one of .*got '{precision}'"):
            _dot(f"dsl.dot(A, B, input_precision='{precision}')", a, b)
    with pytest.raises(CompilationError, match="dot needs 2-D blocks"):
        _dot("dsl.dot(A.reshape(2, 8, 16), B.reshape(2, 16, 8))", a, b)


def test_launch_none_defaults_and_autotune_option_errors():
    metas = []
    kernel = _kernel("dsl.store(o_ptr + dsl.arange(0, 8), dsl.load(x_ptr + dsl.arange(0, 8)))")
    x, out = torch.randn(8), poison(torch.empty(8))
    kernel[lambda meta: (metas.append((meta["num_warps"], meta["num_stages"])) or 1,)](
        out, x, num_warps=None, num_stages=None, interpret=True)
    assert metas == [(4, 3)] and torch.equal(out, x)
    configs = [dsl.Config({"B": 8})]
    with pytest.raises(TypeError, match=r"has the key 'topk'; its keys are \['early_config_prune', 'perf_model', "
                                        r"'top_k'\]"):
        dsl.autotune(configs, key=[], prune_configs_by={"topk": 1})(kernel)
    with pytest.raises(ValueError, match="use_cuda_graph=True is not offered.*do_bench"):
        dsl.autotune(configs, key=[], use_cuda_graph=True)(kernel)
    with pytest.raises(ValueError, match=r"maxnreg=128: .*dsl.launch_bounds"):
        dsl.Config({"B": 8}, maxnreg=128)
