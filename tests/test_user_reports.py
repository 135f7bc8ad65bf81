"""Bugs found by trying to break the kernel language as a new user would (one test per report)."""

from __future__ import annotations

import copy

import torch

import fusedops.dsl as dsl
from fusedops.dsl.interpreter import launch
from fusedops.dsl.ir import print_function
from fusedops.dsl.passes.simplify import simplify


@dsl.jit
def _negate_nan_kernel(o_ptr, VALUE: dsl.constexpr):
    a = dsl.full((2,), VALUE, dsl.float32)
    dsl.store(o_ptr + dsl.arange(0, 2), -a)


def test_simplify_keeps_the_sign_of_a_negated_nan_constant():
    # -nan and nan were one CSE key (float.hex() is "nan" for both), so the folded -nan was replaced
    # by the +nan constant it was computed from: the compiled kernel stored +nan, the interpreter -nan.
    function = _negate_nan_kernel.ir(torch.zeros(2), VALUE=float("nan"))
    before, after = copy.deepcopy(function), copy.deepcopy(function)
    simplify(after)
    out_before, out_after = torch.zeros(2), torch.zeros(2)
    launch(before, (1,), [out_before])
    launch(after, (1,), [out_after])
    assert out_before.view(torch.int32).tolist() == out_after.view(torch.int32).tolist()
    assert torch.signbit(out_after).all()


def test_printed_ir_tells_nan_from_negative_nan():
    # The printed IR is the disk cache key: two kernels differing only in a NaN's sign must not share it.
    positive = print_function(_negate_nan_kernel.ir(torch.zeros(2), VALUE=float("nan")))
    negative = print_function(_negate_nan_kernel.ir(torch.zeros(2), VALUE=-float("nan")))
    assert positive != negative


@dsl.jit
def _reciprocal_of_constexpr(out_ptr, C: dsl.constexpr):
    dsl.store(out_ptr + dsl.arange(0, 2), dsl.full((2,), 1.0, dsl.float32) / C)


def test_constexpr_negative_zero_is_not_positive_zero():
    # -0.0 == 0.0 in Python, but 1 / C differs: the specialization and the launch plan key a float
    # constexpr by its bits, so a launch with C=-0.0 never reuses the kernel made for C=0.0.
    out = torch.empty(2)
    for value, expected in [(0.0, float("inf")), (-0.0, -float("inf")), (0.0, float("inf"))]:
        _reciprocal_of_constexpr[(1,)](out, C=value, interpret=True)
        assert out.tolist() == [expected, expected], value
        _reciprocal_of_constexpr[(1,)](out, value, interpret=True)     # positionally, too
        assert out.tolist() == [expected, expected], value


def test_nan_constexpr_finds_its_specialization_again(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    first = _reciprocal_of_constexpr.compile(torch.empty(2), C=float("nan"), target="sm_90a")
    assert _reciprocal_of_constexpr.compile(torch.empty(2), C=float("nan"), target="sm_90a") is first
    assert _reciprocal_of_constexpr.compile(torch.empty(2), C=-0.0, target="sm_90a") is not \
        _reciprocal_of_constexpr.compile(torch.empty(2), C=0.0, target="sm_90a")
