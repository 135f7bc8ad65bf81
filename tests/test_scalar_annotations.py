"""Scalar parameters annotated with a dsl dtype (`n: dsl.int64`, runtime/signature.py `_annotated_scalar`): the
argument takes that type whatever its value, out-of-range or wrong-kind values are refused naming the
argument, and the annotation also works as a string (`from __future__ import annotations`)."""

from __future__ import annotations

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.target import assemble, ptxas_available


@dsl.jit
def _typed(o_ptr, n: dsl.int64, f: dsl.float64, small: dsl.int8, flag: dsl.int1):
    # under this module's `from __future__ import annotations` every annotation is a string
    dsl.store(o_ptr, n * n)
    dsl.store(o_ptr + 1, (f * 3.0).to(dsl.int64))
    dsl.store(o_ptr + 2, (small * 100).to(dsl.int64))      # int8 arithmetic wraps
    dsl.store(o_ptr + 3, flag.to(dsl.int64))


@dsl.jit
def _half_scalar(o_ptr, h: dsl.float16, b: dsl.bfloat16, u: dsl.uint16):
    dsl.store(o_ptr, h.to(dsl.float32))
    dsl.store(o_ptr + 1, b.to(dsl.float32))
    dsl.store(o_ptr + 2, u.to(dsl.float32))


def _expected_typed(n, f, small, flag):
    return [n * n, int(f * 3.0), (small * 100 + 128) % 256 - 128, int(flag)]


@pytest.mark.parametrize("n, f, small, flag", [(100000, 2.0 ** 40 + 1, 3, True), (1, 0.1, -128, False),
                                               (-(2 ** 31) - 5, -7.0, 127, 1)])
def test_annotated_scalars_keep_their_type(n, f, small, flag):
    out = torch.full((4,), -999, dtype=torch.int64)
    _typed[(1,)](out, n, f, small, flag, interpret=True)
    assert out.tolist() == _expected_typed(n, f, small, flag)


def test_narrow_float_and_unsigned_annotations():
    out = torch.zeros(3)
    _half_scalar[(1,)](out, 0.1, 1.0 / 3.0, 65535, interpret=True)
    assert out.tolist() == [torch.tensor(0.1, dtype=torch.float16).item(),
                            torch.tensor(1.0 / 3.0, dtype=torch.bfloat16).item(), 65535.0]


@pytest.mark.parametrize("args, message", [
    ((2 ** 63, 1.0, 1, True), r"`n` of kernel `_typed` is annotated int64; got 9223372036854775808, outside"),
    ((1, 1.0, 128, True), r"`small` of kernel `_typed` is annotated int8; got 128, outside its range \[-128, 127\]"),
    ((1.5, 1.0, 1, True), r"`n` of kernel `_typed` is annotated int64; got 1.5, which is not an int"),
    ((1, 1.0, 1, 2), r"`flag` of kernel `_typed` is annotated int1; got 2, which is not a bool"),
    ((torch.zeros(1), 1.0, 1, True), r"`n` of kernel `_typed` is annotated int64 \(a scalar\); pass a Python number"),
    ((1, "x", 1, True), r"`f` of kernel `_typed` is annotated float64 \(a scalar\); pass a Python number"),
])
def test_values_the_annotation_cannot_hold_are_refused(args, message):
    with pytest.raises(TypeError, match=message):
        _typed[(1,)](torch.zeros(4, dtype=torch.int64), *args, interpret=True)


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
def test_annotated_parameters_are_typed_in_the_ptx():
    ptx = _typed.compile(torch.zeros(4, dtype=torch.int64), 5, 1.0, 3, True, target="sm_90a").asm["ptx"]
    assert ".param .u64 _typed_param_1" in ptx and ".param .f64 _typed_param_2" in ptx
    assert assemble(ptx, "sm_90a").spill_bytes == 0


# -- GPU ----------------------------------------------------------------------------------------------------------

@pytest.mark.cuda
def test_gpu_annotated_scalars_launch_with_their_types():
    out = torch.full((4,), -999, dtype=torch.int64, device="cuda")
    for args in [(100000, 2.0 ** 40 + 1, 3, True), (1, 0.1, -128, False), (-(2 ** 31) - 5, -7.0, 127, 1)]:
        _typed[(1,)](out, *args)          # the second and third launches take the cached plans
        assert out.tolist() == _expected_typed(*args), args
    # a cached plan packs the value and refuses it there (LaunchError naming the parameter), a new key in
    # specialization (TypeError)
    with pytest.raises((TypeError, dsl.LaunchError), match="small.*300|300.*small"):
        _typed[(1,)](out, 5, 1.0, 300, True)
    assert out.tolist() == _expected_typed(-(2 ** 31) - 5, -7.0, 127, 1)       # nothing launched
    half = torch.zeros(3, device="cuda")
    _half_scalar[(1,)](half, 0.1, 1.0 / 3.0, 65535)
    assert half.tolist() == [torch.tensor(0.1, dtype=torch.float16).item(),
                             torch.tensor(1.0 / 3.0, dtype=torch.bfloat16).item(), 65535.0]
