"""Review of session 23's changes (77dd1d0 autotuner, bb845fd DSL, 815d3c2 matmul/attention, d1cc488 norms), by
a fresh reviewer on the CPU (NumPy interpreter, PTX assembled by ptxas; no GPU), against Python / NumPy / torch
(float64) oracles.

Checked and fine:
- float `//` (semantics._float_floor_divide): scalar and block operands, int // float and float // int scalars,
  literals on 16-bit blocks (cast to the block's dtype first), signed zeros, inf / NaN, division by +-0,
  quotients past 2**24 (float32, against torch.floor_divide) and past 2**53 (float64, against Python), row
  broadcasting; PTX for float16/bfloat16/float32/float64 blocks, scalar // scalar and scalar // block assembles
  for sm_80 and sm_90a without spills.
- signed zeros in the interpreter's max/min reductions (axis 0, 1, None, keep_dims) for every float dtype.
- dtype annotations: equal-to-one specialization keeps the annotated type (int8 wrap, uint8 wrap), every
  `dsl.<dtype>` spelled as a string maps to that dtype, defaults and keyword arguments, do_not_specialize keeps
  an annotated 1 a runtime parameter of the annotated PTX type, float16 / bfloat16 annotations round a Python
  float once in the interpreter, tensors / floats / out-of-range ints refused, None kept a constexpr.
- autotune: reset_to_zero / restore_value with tensors passed as keyword arguments, when the search raises
  (any error) and when no config can run; `time_launches` (median of per-launch events, `before` untimed,
  warmup, the GPU sleep) with fake CUDA events; the on-disk record used by a new tuner without measuring.
- matmul: the torch reference's values against float64 for float16/bfloat16/float32 operands with bias,
  activations and out_dtype on both CPU routes; input/weight/bias gradients with out_dtype=float32 and a loss
  scale that overflows float16 dZ, eager, torch.compile(backend="aot_eager") and torch.func.vmap(grad).
- rms_norm with a float64 weight on float16/bfloat16/float32 input equals torch's op (values and gradients)
  on both routes; attention flags of the wrong type are refused after a cached call.

Confirmed defects (strict xfails asserting the correct behaviour; details above each test at the end):
1. int // float16/bfloat16 casts the int straight to float32 (semantics._float_floor_divide), not to the promoted
   16-bit dtype first: 2051 // fp16 2.0 = 1025 (torch 1026), 100001 // fp16 2.0 = 49984 (torch NaN).
2. A float-annotated parameter given a Python int >= 2**64 is refused by the interpreter (conversions.from_python).
3. GPU packing of an annotated bfloat16 scalar rounds twice (llvm_types.bfloat16_bits), the interpreter once.
4. autotune's search hashes Configs (77dd1d0): a list-valued constexpr raises "unhashable type: 'list'".
5. A runtime `reverse=` / `keep_dims=` is taken as True (adjacent to bb845fd's shown(); pre-existing).
6. trans / multiple_of / max_contiguous errors still print the IR `Value(n: int32)`.
"""

import os
import statistics
import struct

import numpy as np
import pytest
import torch

import fusedops
import fusedops.dsl as dsl
from fusedops.dsl.language import dtypes as _dtypes
from fusedops.dsl.language.numerics import conversions
from fusedops.dsl.runtime import autotune as at
from fusedops.dsl.runtime import kernel_parameters
from fusedops.dsl.target import assemble, ptxas_available

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


# =====================================================================================================
# float // (bb845fd, semantics._float_floor_divide)
# =====================================================================================================

@dsl.jit
def _fd_blocks(o_ptr, x_ptr, y_ptr, n, BLOCK: dsl.constexpr):
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    x = dsl.load(x_ptr + offsets, mask=mask, other=1)
    y = dsl.load(y_ptr + offsets, mask=mask, other=1)
    dsl.store(o_ptr + offsets, x // y, mask=mask)


@dsl.jit
def _fd_scalars(o_ptr, a, b):
    dsl.store(o_ptr, a // b)


@dsl.jit
def _fd_literals(o_ptr, x_ptr, BLOCK: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + offsets)
    dsl.store(o_ptr + offsets, x // 0.1)
    dsl.store(o_ptr + BLOCK + offsets, 7 // x)
    dsl.store(o_ptr + 2 * BLOCK + offsets, -x // 3)


@dsl.jit
def _fd_scalar_block(o_ptr, x_ptr, s, BLOCK: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + offsets)
    dsl.store(o_ptr + offsets, s // x)
    dsl.store(o_ptr + BLOCK + offsets, x // s)


@dsl.jit
def _fd_broadcast(o_ptr, x_ptr, y_ptr, R: dsl.constexpr, C: dsl.constexpr):
    rows = dsl.arange(0, R)[:, None]
    cols = dsl.arange(0, C)[None, :]
    x = dsl.load(x_ptr + rows * C + cols)
    y = dsl.load(y_ptr + cols)
    dsl.store(o_ptr + rows * C + cols, x // y)


def _py_floordiv(a, b):
    """Python's float //, with IEEE results where Python raises (b == 0: a / b)."""
    a, b = float(a), float(b)
    if b == 0:
        return float(np.float64(a) / np.float64(b)) if not (a == 0 or a != a) else float("nan")
    return a // b


_SCALAR_PAIRS = [(1.0, 0.1), (-1.0, 0.1), (7, -2.0), (-7.0, 2), (5, 0.5), (-0.0, 3.0), (0.0, -3.0), (1e-30, -1.0),
                 (float("inf"), 2.0), (3.0, float("inf")), (-3.0, float("inf")), (float("nan"), 1.0), (3.0, 0.0),
                 (-3.0, 0.0), (3.0, -0.0), (0.0, 0.0), (2 ** 40 + 1, 3.0)]


@pytest.mark.parametrize("a, b", _SCALAR_PAIRS)
def test_float_floor_divide_of_scalar_arguments_matches_torch_float32(a, b):
    out = torch.full((1,), 123.0)
    _fd_scalars[(1,)](out, a, b, interpret=True)
    # int arguments are int32 / int64 scalars promoted to float32 with the float one (as torch's float32 math)
    expected = torch.floor_divide(torch.tensor(float(a), dtype=torch.float32), torch.tensor(float(b), dtype=torch.float32))
    assert torch.equal(out[0].isnan(), expected.isnan())
    if not expected.isnan():
        assert out[0].item() == expected.item() and torch.signbit(out[0]) == torch.signbit(expected), (out, expected)


def test_float64_floor_divide_with_quotients_past_2_53_matches_python():
    rng = np.random.default_rng(5)
    y = rng.uniform(0.5, 2.0, 2048) * 2.0 ** rng.integers(-60, 60, 2048) * rng.choice([-1.0, 1.0], 2048)
    x = y * rng.uniform(2.0 ** 50, 2.0 ** 70, 2048) * rng.choice([-1.0, 1.0], 2048)
    out = torch.zeros(2048, dtype=torch.float64)
    _fd_blocks[(2,)](out, torch.from_numpy(x), torch.from_numpy(y), 2048, BLOCK=1024, interpret=True)
    assert out.tolist() == [a // b for a, b in zip(x.tolist(), y.tolist())]


def test_float32_floor_divide_with_quotients_past_2_24_matches_torch():
    g = torch.Generator().manual_seed(7)
    y = torch.rand(4096, generator=g) * 4 + 0.25
    x = torch.randint(1 << 24, 1 << 31, (4096,), generator=g).float() * y * torch.where(
        torch.rand(4096, generator=g) < 0.5, -1.0, 1.0)
    out = torch.zeros(4096)
    _fd_blocks[(4,)](out, x, y, 4096, BLOCK=1024, interpret=True)
    assert torch.equal(out, torch.floor_divide(x, y))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_float_floor_divide_by_literals_and_scalars_matches_the_block_dtype(dtype):
    x = torch.tensor([1.0, 2.0, 3.0, 0.3, -0.7, 7.0, 0.5, -3.0], dtype=dtype)
    out = torch.zeros(24, dtype=dtype)
    _fd_literals[(1,)](out, x, BLOCK=8, interpret=True)
    # the literal takes the block's dtype first (weak typing); the floor of the exact quotient, rounded once
    lit = torch.tensor(0.1, dtype=dtype).double()
    wide = x.double()
    assert torch.equal(out[:8], torch.floor_divide(wide, lit).to(dtype))
    assert torch.equal(out[8:16], torch.floor_divide(torch.tensor(7.0, dtype=torch.float64), wide).to(dtype))
    assert torch.equal(out[16:], torch.floor_divide(-wide, 3.0).to(dtype))


def test_float_floor_divide_of_a_scalar_and_a_block_and_broadcast_rows():
    x = torch.tensor([0.1, -0.1, 0.3, 3.0, -0.0, float("inf"), 2.5, -2.5])
    out = torch.zeros(16)
    _fd_scalar_block[(1,)](out, x, 1.0, BLOCK=8, interpret=True)
    torch.testing.assert_close(out[:8], torch.floor_divide(torch.tensor(1.0), x), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(out[8:], torch.floor_divide(x, torch.tensor(1.0)), rtol=0, atol=0, equal_nan=True)
    g = torch.Generator().manual_seed(3)
    xs = torch.randn(4, 8, generator=g, dtype=torch.float64) * 100
    ys = torch.randn(8, generator=g, dtype=torch.float64)
    out = torch.zeros(4, 8, dtype=torch.float64)
    _fd_broadcast[(1,)](out, xs, ys, R=4, C=8, interpret=True)
    assert torch.equal(out, torch.floor_divide(xs, ys))


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_compiled_float_floor_divide_of_other_dtypes_assembles(dtype, arch):
    x = torch.empty(16, dtype=dtype)
    result = assemble(_fd_blocks.compile(x, x, x, 16, BLOCK=128, target=arch).asm["ptx"], arch)
    assert result.spill_bytes == 0, result.log


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_compiled_float_floor_divide_of_scalars_assembles(arch):
    for args in [(torch.empty(1), 1.5, 2.5), (torch.empty(1), 3, 2.5), (torch.empty(1, dtype=torch.float64), np.float64(3.0), 2)]:
        assert assemble(_fd_scalars.compile(*args, target=arch).asm["ptx"], arch).spill_bytes == 0
    x = torch.empty(16, dtype=torch.float16)
    assert assemble(_fd_scalar_block.compile(x, x, 7, BLOCK=16, target=arch).asm["ptx"], arch).spill_bytes == 0


# =====================================================================================================
# signed zeros in max / min reductions (bb845fd, numerics/reductions.py _order_zeros)
# =====================================================================================================

@dsl.jit
def _reductions(o_ptr, x_ptr, R: dsl.constexpr, C: dsl.constexpr):
    r = dsl.arange(0, R)[:, None]
    c = dsl.arange(0, C)[None, :]
    x = dsl.load(x_ptr + r * C + c)
    dsl.store(o_ptr + dsl.arange(0, C), dsl.max(x, axis=0))
    dsl.store(o_ptr + C + dsl.arange(0, C), dsl.min(x, axis=0))
    dsl.store(o_ptr + 2 * C + dsl.arange(0, R), dsl.max(x, axis=1))
    dsl.store(o_ptr + 2 * C + R + dsl.arange(0, R), dsl.min(x, axis=1))
    dsl.store(o_ptr + 2 * C + 2 * R, dsl.max(x))
    dsl.store(o_ptr + 2 * C + 2 * R + 1, dsl.min(x))
    dsl.store(o_ptr + 2 * C + 2 * R + 2 + dsl.arange(0, R)[:, None], dsl.max(x, axis=1, keep_dims=True))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_max_min_reductions_order_signed_zeros_on_every_axis(dtype):
    x = torch.tensor([[-0.0, 0.0, -0.0, 0.0], [-0.0, -0.0, 0.0, float("nan")]], dtype=dtype)
    out = torch.full((4 * 2 + 3 * 2 + 2,), 5.0, dtype=dtype)
    _reductions[(1,)](out, x, R=2, C=4, interpret=True)
    values = out.tolist()
    signs = torch.signbit(out).tolist()
    # max axis 0: [-0, +0, +0, nan]; min axis 0: [-0, -0, -0, nan]
    assert signs[0:3] == [True, False, False] and np.isnan(values[3])
    assert signs[4:7] == [True, True, True] and np.isnan(values[7])
    # max axis 1: [+0, nan]; min axis 1: [-0, nan]; max/min of all: nan
    assert signs[8] is False and np.isnan(values[9]) and signs[10] is True and np.isnan(values[11])
    assert np.isnan(values[12]) and np.isnan(values[13])
    assert signs[14] is False and np.isnan(values[15])
    assert all(v == 0 for i, v in enumerate(values) if not np.isnan(v))


# =====================================================================================================
# dtype annotations of scalar parameters (bb845fd, signature._annotated_scalar, kernel_parameters._scalar_annotation)
# =====================================================================================================

@dsl.jit
def _one_typed(o_ptr, small: dsl.int8, u: dsl.uint8, big: dsl.int64):
    dsl.store(o_ptr, (small * 100 + small * 100).to(dsl.float64))     # int8: 200 wraps to -56
    dsl.store(o_ptr + 1, (u - 2).to(dsl.float64))                     # uint8: 1 - 2 wraps to 255
    dsl.store(o_ptr + 2, (big * 3000000000).to(dsl.float64))          # int64: no int32 wrap


@pytest.mark.parametrize("one", [1, True, np.int8(1)])
def test_equal_to_one_specialization_keeps_the_annotated_type(one):
    out = torch.zeros(3, dtype=torch.float64)
    _one_typed[(1,)](out, one, one, one, interpret=True)
    assert out.tolist() == [-56.0, 255.0, 3000000000.0]
    _one_typed[(1,)](out, 3, 3, 3, interpret=True)
    assert out.tolist() == [88.0, 1.0, 9000000000.0]


@pytest.mark.parametrize("name", [n for n in dir(dsl) if isinstance(getattr(dsl, n), dsl.DType)])
def test_every_dsl_dtype_spelled_as_a_string_annotation_is_read(name):
    assert kernel_parameters._scalar_annotation(f"dsl.{name}") is getattr(dsl, name)
    assert kernel_parameters._scalar_annotation(f"tl.{name}") is getattr(dsl, name)
    assert kernel_parameters._scalar_annotation(name) is None          # a bare name is a Python type hint, not read


@dsl.jit
def _string_typed(o_ptr, n: "dsl.int64", scale: "dsl.float64" = 0.5, *, flag: "dsl.int1" = False):
    dsl.store(o_ptr, (n * n).to(dsl.float64) * scale + flag.to(dsl.float64))


def test_string_annotations_with_defaults_and_keywords():
    out = torch.zeros(1, dtype=torch.float64)
    _string_typed[(1,)](out, 100000, interpret=True)
    assert out.item() == 100000.0 ** 2 * 0.5
    _string_typed[(1,)](out, n=100000, scale=2 ** -40 + 1, flag=1, interpret=True)
    assert out.item() == 1e10 * (2 ** -40 + 1) + 1
    with pytest.raises(TypeError, match="`flag` of kernel `_string_typed` is annotated int1"):
        _string_typed[(1,)](out, 3, flag=2, interpret=True)
    with pytest.raises(TypeError, match="`n` of kernel `_string_typed` is annotated int64"):
        _string_typed[(1,)](out, 3.0, interpret=True)


@dsl.jit(do_not_specialize=["n"])
def _not_specialized(o_ptr, n: dsl.int16, m: dsl.int16):
    dsl.store(o_ptr, (n + m).to(dsl.int64))


@needs_ptxas
def test_do_not_specialize_keeps_an_annotated_one_a_runtime_parameter_of_its_type():
    ptx = _not_specialized.compile(torch.zeros(1, dtype=torch.int64), 1, 1, target="sm_90a").asm["ptx"]
    params = [line for line in ptx.splitlines() if ".param" in line and "_not_specialized_param" in line
              and "ld.param" not in line]
    assert len(params) == 2 and ".u16" in params[1], params      # n a runtime int16; m = 1 folded
    out = torch.zeros(1, dtype=torch.int64)
    _not_specialized[(1,)](out, 1, 1, interpret=True)
    assert out.item() == 2
    _not_specialized[(1,)](out, 32767, 1, interpret=True)     # int16 wraps
    assert out.item() == -32768


@dsl.jit
def _half_typed(o_ptr, h: dsl.float16, b: dsl.bfloat16):
    dsl.store(o_ptr, h.to(dsl.float64))
    dsl.store(o_ptr + 1, b.to(dsl.float64))


def _bfloat16_round_once(value: float) -> float:
    """value rounded to bfloat16 in one step (nearest, ties to even), exactly."""
    from fractions import Fraction
    exact = Fraction(value)
    lo = torch.tensor(value, dtype=torch.float64).to(torch.bfloat16)
    candidates = set()
    for v in (lo, lo.view(torch.int16) + 1, lo.view(torch.int16) - 1):
        candidates.add((v if v.dtype == torch.bfloat16 else v.view(torch.bfloat16)).item())
    return min(candidates, key=lambda c: (abs(Fraction(c) - exact),
                                          int(torch.tensor(c, dtype=torch.bfloat16).view(torch.int16)) & 1))


@pytest.mark.parametrize("value", [1 + 2 ** -11 + 2 ** -40, 1 + 2 ** -8 + 2 ** -30, 0.1, 1.0 / 3.0, -2049.0001, 1e-8])
def test_half_annotations_round_a_python_float_once_in_the_interpreter(value):
    out = torch.zeros(2, dtype=torch.float64)
    _half_typed[(1,)](out, value, value, interpret=True)
    assert out[0].item() == float(np.float16(value))      # NumPy: double -> half in one rounding
    assert out[1].item() == _bfloat16_round_once(value)


def test_annotated_parameter_given_none_or_a_tensor():
    out = torch.zeros(2, dtype=torch.float64)
    with pytest.raises(TypeError, match="`h` of kernel `_half_typed` is annotated float16 \\(a scalar\\)"):
        _half_typed[(1,)](out, torch.tensor(1.0), 1.0, interpret=True)
    from fusedops.dsl.runtime.signature import specialize
    specs = specialize("_half_typed", _half_typed.params, [out, None, 2.0])
    assert specs[1].type is None and specs[1].value is None and specs[2].type is _dtypes.bfloat16


@pytest.mark.parametrize("value", [1 + 2 ** -11 + 2 ** -40, -(3 + 2 ** -9 + 2 ** -40), 0.1, 65504.0, 1e-7])
def test_gpu_packing_of_a_float16_scalar_matches_the_interpreter(value):
    from fusedops.dsl.runtime.launcher_args import ArgumentPacker, ParamKind
    (bits,) = struct.unpack("<H", ArgumentPacker([ParamKind.FLOAT16]).pack_values([value])[:2])
    assert bits == int(np.asarray(conversions.from_python(value, _dtypes.float16)).view(np.uint16))


# =====================================================================================================
# autotune (77dd1d0)
# =====================================================================================================

@dsl.jit
def _accumulate(out_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    dsl.atomic_add(out_ptr + offsets, dsl.load(x_ptr + offsets, mask=mask), mask=mask)


_CONFIGS = [dsl.Config({"BLOCK": block}, num_warps=4) for block in (64, 128, 256)]


def test_reset_and_restore_with_keyword_tensors_and_a_search_that_raises(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    tuner = dsl.autotune(_CONFIGS, key=["n"], reset_to_zero=["out_ptr"], restore_value=["x_ptr"])(_accumulate)
    out, x = torch.full((5,), 7.0), torch.arange(5.0)
    seen = []

    def fake_measure(grid, args, kwargs, config, reset, first):
        reset()
        seen.append((out.clone(), x.clone()))
        out.add_(x)
        x.mul_(3)
        if len(seen) == 4:
            raise RuntimeError("a driver error mid-search")
        return float(config.constexprs["BLOCK"]), False

    monkeypatch.setattr(tuner, "_measure", fake_measure)
    with pytest.raises(RuntimeError, match="mid-search"):
        tuner._tune("k", (1,), (), {"out_ptr": out, "x_ptr": x, "n": 5})
    assert all(torch.equal(o, torch.zeros(5)) and torch.equal(v, torch.arange(5.0)) for o, v in seen)
    assert torch.equal(out, torch.zeros(5)) and torch.equal(x, torch.arange(5.0))
    assert "k" not in tuner.best

    def failing(grid, args, kwargs, config, reset, first):
        reset()
        out.add_(1.0)
        x.add_(1.0)
        raise dsl.CompilationError("no resources")

    monkeypatch.setattr(tuner, "_measure", failing)
    with pytest.raises(dsl.LaunchError, match="no config could run"):
        tuner._tune("k2", (1,), (out,), {"x_ptr": x, "n": 5})
    assert torch.equal(out, torch.zeros(5)) and torch.equal(x, torch.arange(5.0))


def test_time_launches_times_each_launch_alone_and_takes_the_median(monkeypatch):
    clock = [0.0]
    durations = iter([5.0, 5.0, 3.0, 1.0, 9.0, 2.0, 4.0])      # 2 warmup launches, then 5 timed
    slept = []

    class FakeEvent:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.at = None

        def record(self):
            self.at = clock[0]

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return end.at - self.at

    def launch():
        clock[0] += next(durations)

    before_calls = []

    def before():
        before_calls.append(clock[0])
        clock[0] += 1000.0           # untimed work (a reset) must not be counted

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: slept.append(cycles))
    ms = at.time_launches(launch, before, warmup=2, reps=5)
    assert ms == statistics.median([3.0, 1.0, 9.0, 2.0, 4.0]) == 3.0
    assert len(before_calls) == 7 and slept == [at.HOST_LEAD_CYCLES * 5]


def test_the_on_disk_record_is_used_by_a_new_tuner_without_measuring(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    first = dsl.autotune(_CONFIGS, key=["n"])(_accumulate)
    times = {64: [3.0, 3.0, 0.1, 3.0], 128: [2.0, 2.0, 2.0, 2.0], 256: [9.0, 1.0, 1.5, 1.2]}
    rounds = {b: iter(t) for b, t in times.items()}
    assert first.select("k", lambda c: (next(rounds[c.constexprs["BLOCK"]]), False)) == _CONFIGS[2]
    second = dsl.autotune(_CONFIGS, key=["n"])(_accumulate)

    def never(config):
        raise AssertionError("measured again")

    assert second.select("k", never) == _CONFIGS[2]


# =====================================================================================================
# matmul reference numerics and gradients (815d3c2)
# =====================================================================================================

def _oracle(a, b, bias, activation, dc=None):
    from fusedops.autograd.matmul_reference import apply_activation
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    bias64 = None if bias is None else bias.detach().double().requires_grad_()
    z = a64 @ b64 + (0 if bias64 is None else bias64)
    c = apply_activation(z, activation)
    if dc is None:
        return c.detach()
    c.backward(dc.double())
    return c.detach(), a64.grad, b64.grad, None if bias64 is None else bias64.grad


_ULP = {torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7, torch.float32: 2 ** -20}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("activation, out_dtype", [(None, None), ("gelu", None), ("silu", torch.float32),
                                                   ("relu", torch.bfloat16), ("gelu_tanh", torch.float16)])
def test_matmul_values_against_float64(route, dtype, activation, out_dtype):
    g = torch.Generator().manual_seed(11)
    a = (torch.randn(5, 24, generator=g) * 30).to(dtype)
    b = (torch.randn(24, 7, generator=g) * 30).to(dtype)
    bias = (torch.randn(7, generator=g) * 100).to(dtype)
    c = fusedops.matmul(a, b, bias, activation, out_dtype)
    expected = _oracle(a, b, bias, activation)
    out = out_dtype or dtype
    assert c.dtype == out and c.shape == (5, 7)
    tol = max(_ULP[out], _ULP[dtype] if dtype == torch.float32 else 2 ** -20) * 2
    torch.testing.assert_close(c.double(), expected.to(out).double(), rtol=tol, atol=tol * float(expected.abs().max()) * 0.01)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "silu"])
def test_matmul_float32_output_gradients_with_a_scaled_loss(route, dtype, activation):
    g = torch.Generator().manual_seed(12)
    a = (torch.randn(6, 16, generator=g) * 1e-2).to(dtype).requires_grad_()
    b = (torch.randn(16, 8, generator=g) * 1e-3).to(dtype).requires_grad_()
    bias = torch.randn(8, generator=g).requires_grad_()     # a float32 bias: its gradient (~1e5 * rows) is float32
    dc = torch.randn(6, 8, generator=g) * 1e5          # past float16's range as a dZ
    c = fusedops.matmul(a, b, bias, activation, torch.float32)
    c.backward(dc)
    _, da, db, dbias = _oracle(a, b, bias, activation, dc)
    rtol = 4 * _ULP[dtype]
    for got, want, dt in ((a.grad, da, dtype), (b.grad, db, dtype), (bias.grad, dbias, torch.float32)):
        assert got.dtype == dt and torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), want.to(dt).double(), rtol=rtol, atol=rtol * float(want.abs().max()))


def test_matmul_float32_output_gradients_under_compile_and_vmap(route):
    g = torch.Generator().manual_seed(13)
    a = (torch.randn(4, 8, generator=g) * 1e-2).half().requires_grad_()
    b = (torch.randn(8, 4, generator=g) * 1e-3).half().requires_grad_()
    bias = torch.randn(4, generator=g).requires_grad_()
    dc = torch.randn(4, 4, generator=g) * 1e5
    compiled = torch.compile(lambda a, b, bias: fusedops.matmul(a, b, bias, "gelu", torch.float32), backend="aot_eager")
    compiled(a, b, bias).backward(dc)
    _, da, db, dbias = _oracle(a, b, bias, "gelu", dc)
    for got, want in ((a.grad, da.half()), (b.grad, db.half()), (bias.grad, dbias.float())):
        assert got.dtype == want.dtype and torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), want.double(), rtol=4e-3, atol=4e-3 * float(want.abs().max()))

    def loss(x):
        return (fusedops.matmul(x, b.detach(), bias.detach(), "silu", torch.float32) * 1e5).sum()

    grads = torch.func.vmap(torch.func.grad(loss))(a.detach().unsqueeze(0).repeat(2, 1, 1))
    x64 = a.detach().double().requires_grad_()
    (torch.nn.functional.silu(x64 @ b.detach().double() + bias.detach().double()) * 1e5).sum().backward()
    assert grads.dtype == torch.float16
    torch.testing.assert_close(grads[1].double(), x64.grad.half().double(), rtol=4e-3, atol=4e-3 * float(x64.grad.abs().max()))


# =====================================================================================================
# rms_norm with a float64 weight (d1cc488) and attention flags (815d3c2)
# =====================================================================================================

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_rms_norm_float64_weight_equals_torch(route, dtype):
    g = torch.Generator().manual_seed(14)
    x = torch.randn(6, 48, generator=g).to(dtype).requires_grad_()
    w = torch.randn(48, generator=g, dtype=torch.float64).requires_grad_()
    y = fusedops.rms_norm(x, (48,), w)
    expected = torch.nn.functional.rms_norm(x, (48,), w)
    dy = torch.randn(y.shape, generator=g).to(y.dtype)
    assert y.dtype == expected.dtype and torch.equal(y, expected)
    got, want = torch.autograd.grad(y, (x, w), dy), torch.autograd.grad(expected, (x, w), dy)
    assert all(torch.equal(p, q) for p, q in zip(got, want))
    compiled = torch.compile(lambda x, w: fusedops.rms_norm(x, (48,), w), backend="aot_eager")
    torch.testing.assert_close(compiled(x, w), expected, rtol=0, atol=0)


@pytest.mark.parametrize("flag", [dict(is_causal=1), dict(enable_gqa=0), dict(is_causal=np.bool_(True))])
def test_attention_flags_of_another_type_refused_after_cached_calls(route, flag):
    g = torch.Generator().manual_seed(15)
    q, k, v = (torch.randn(1, 2, 4, 16, generator=g) for _ in range(3))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    for _ in range(2):
        torch.testing.assert_close(fusedops.scaled_dot_product_attention(q, k, v, is_causal=True), expected)
        fusedops.scaled_dot_product_attention(q, k, v, enable_gqa=False)
    with pytest.raises(TypeError, match="must be bool"):
        fusedops.scaled_dot_product_attention(q, k, v, **flag)


# =====================================================================================================
# CONFIRMED DEFECTS
# =====================================================================================================

# 1. Float `//` of an integer operand and a float16 / bfloat16 one converts the integer straight to float32
#    (`_float_floor_divide` casts each operand to the float32 compute type), skipping the rounding to the
#    promoted 16-bit dtype that every other binary op (and torch / Triton promotion) applies first: 2051 // 2.0
#    (float16) is 1025 instead of 2052 // 2 = 1026; 100001 // 2.0 is finite (49984) where 100001 is inf in float16
#    and inf // 2 is NaN; 259 // 2.0 (bfloat16) is 129 instead of 260 // 2 = 130.

# Fixed in session 23 (was: int // float16/bfloat16 casts the int to float32, not to the 16-bit ...).
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_int_block_floor_divided_by_a_half_block_rounds_the_int_first(dtype):
    x = torch.tensor([2051, 259, 4097, 100001, -2051, 7], dtype=torch.int32)
    y = torch.tensor([2.0, 2.0, 2.0, 2.0, 2.0, 0.5], dtype=dtype)
    out = torch.zeros(6, dtype=dtype)
    _fd_blocks[(1,)](out, x, y, 6, BLOCK=8, interpret=True)
    expected = torch.floor_divide(x.to(dtype).double(), y.double()).to(dtype)      # torch's promotion
    assert torch.equal(torch.floor_divide(x, y).isnan(), expected.isnan())
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)


# 2. A float-annotated scalar parameter (`f: dsl.float64`) given a Python int beyond 64 bits: the annotation
#    accepts it (signature._annotated_scalar: "float types [take] ints and floats") and `.compile` does too, but the
#    interpreter refuses it (interpreter/arguments.py -> conversions.from_python: "does not fit in 64 bits").

@dsl.jit
def _float_typed(o_ptr, f: dsl.float64, g: dsl.float32):
    dsl.store(o_ptr, f)
    dsl.store(o_ptr + 1, g.to(dsl.float64))


# Fixed in session 23 (was: the interpreter refuses a Python int >= 2**64 for a float-annotated ...).
@pytest.mark.parametrize("value", [2 ** 70, 2 ** 64, -(2 ** 63) - 1])
def test_float_annotated_parameter_takes_a_python_int_beyond_64_bits(value):
    out = torch.zeros(2, dtype=torch.float64)
    _float_typed[(1,)](out, value, value, interpret=True)
    assert out.tolist() == [float(value), float(np.float32(float(value)))]


# 3. An annotated bfloat16 scalar (`b: dsl.bfloat16`) is packed for a GPU launch by llvm_types.bfloat16_bits,
#    which rounds double -> float32 -> bfloat16 (two roundings): 1 + 2**-8 + 2**-30 packs as 0x3F80 (1.0) where the
#    interpreter (conversions.round_to_type, round-to-odd: one rounding, as PTX cvt.rn.bf16.f64) gives 0x3F81
#    (1.0078125). float16 ("e", one rounding) agrees with the interpreter.

# Fixed in session 23 (was: GPU packing of a bfloat16 scalar rounds twice (llvm_types.bfloat16_bits); ...).
@pytest.mark.parametrize("value", [1 + 2 ** -8 + 2 ** -30, -(3 + 2 ** -7 + 2 ** -40), 2.0 ** 100 * (1 + 2 ** -8 + 2 ** -30)])
def test_gpu_packing_of_a_bfloat16_scalar_rounds_once_like_the_interpreter(value):
    from fusedops.dsl.runtime.launcher_args import ArgumentPacker, ParamKind
    (bf16_bits,) = struct.unpack("<H", ArgumentPacker([ParamKind.BFLOAT16]).pack_values([value])[:2])
    interpreted = np.asarray(conversions.from_python(value, _dtypes.bfloat16), dtype=np.float32)
    assert bf16_bits == int(interpreted.view(np.uint32)) >> 16


# 4. The autotuner's search keys dicts and sets by Config (`times = {config: []}` in `select`, `launched = set()` in
#    `_tune`) since 77dd1d0, so a Config whose constexpr is a list -- which kernels accept as a constexpr (made a
#    tuple) and which the search took before -- now fails with "TypeError: unhashable type: 'list'".

@dsl.jit
def _with_shape(o_ptr, n, BLOCK: dsl.constexpr, SHAPE: dsl.constexpr):
    dsl.store(o_ptr, n + SHAPE[0] * BLOCK)


# Fixed in session 23 (was: autotune select hashes Configs; a list-valued constexpr raises TypeError ...).
def test_autotune_search_over_configs_with_a_list_valued_constexpr(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    configs = [dsl.Config({"BLOCK": 64, "SHAPE": [1, 2]}), dsl.Config({"BLOCK": 128, "SHAPE": [2, 1]})]
    out = torch.zeros(1)
    _with_shape[(1,)](out, 3, BLOCK=64, SHAPE=[1, 2], interpret=True)       # the kernel takes the list
    assert out.item() == 67.0
    tuner = dsl.autotune(configs, key=["n"])(_with_shape)
    assert tuner.select("k", lambda c: (float(c.constexprs["BLOCK"]), False)) == configs[0]


# 5. A runtime value where a compile-time flag is needed is taken as True: `dsl.cumsum(x, 0, reverse=flag)` with a
#    bool argument flag=False scans from the end, and `dsl.sum(x, 0, keep_dims=flag)` keeps the dim (block_ops
#    `reduce` / `_keep_dims` and the scan test `if not keep_dims` / `if reverse` on an IR Value, which is truthy).
#    Adjacent to bb845fd's `shown()` (runtime values where constexprs are needed), not new in it.

@dsl.jit
def _runtime_reverse(o_ptr, flag):
    x = dsl.arange(0, 4).to(dsl.float32) + 1.0
    dsl.store(o_ptr + dsl.arange(0, 4), dsl.cumsum(x, 0, reverse=flag))


# Fixed in session 23 (was: a runtime `reverse` / `keep_dims` is taken as True instead of refused...).
@pytest.mark.parametrize("flag", [False, 0])
def test_runtime_cumsum_reverse_flag_is_refused_or_honoured(flag):
    out = torch.zeros(4)
    try:
        _runtime_reverse[(1,)](out, flag, interpret=True)
    except dsl.CompilationError as error:
        assert "runtime" in str(error) and "Value(" not in str(error)
        return
    assert out.tolist() == [1.0, 3.0, 6.0, 10.0]


# 6. `shown()` (bb845fd) is not used everywhere a compile-time value is needed: trans dims, multiple_of and
#    max_contiguous still print the compiler's internal "Value(n: int32)".

@dsl.jit
def _trans_runtime(o_ptr, n):
    dsl.trans(dsl.reshape(dsl.arange(0, 4), (2, 2)), n)


@dsl.jit
def _multiple_of_runtime(o_ptr, n):
    dsl.multiple_of(dsl.arange(0, 4), n)


@dsl.jit
def _max_contiguous_runtime(o_ptr, n):
    dsl.max_contiguous(dsl.arange(0, 4), n)


# Fixed in session 23 (was: trans / multiple_of / max_contiguous errors still print the IR Value...).
@pytest.mark.parametrize("kernel", [_trans_runtime, _multiple_of_runtime, _max_contiguous_runtime],
                         ids=["trans", "multiple_of", "max_contiguous"])
def test_runtime_value_errors_do_not_print_the_ir_value(kernel):
    with pytest.raises(dsl.CompilationError) as info:
        kernel[(1,)](torch.zeros(4, dtype=torch.int32), 3, interpret=True)
    assert "Value(" not in str(info.value) and "runtime int32 value" in str(info.value)
