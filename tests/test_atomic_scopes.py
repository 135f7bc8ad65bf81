"""Atomic read-modify-writes at system scope (`scope="sys"`): PTX `atom.relaxed.sys.global.<op>` where PTX has
the op, else a loop of system-scope compare-and-swaps (codegen/atomics.py), never the GPU-scoped `atom` that
LLVM's `atomicrmw` gives. CPU tier: every atom of the PTX is `.sys`, ptxas accepts it, for every kind and
dtype the language takes, masked, on sm_90a and sm_80. GPU tier: colliding atomics of every kind and dtype
at both scopes against exact expectations (the old values, the final counters)."""

from __future__ import annotations

import re

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.target import assemble, ptxas_available

KINDS = ("add", "max", "min", "xchg", "and", "or", "xor")
DTYPES = (torch.int16, torch.int32, torch.uint32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
          torch.float64)
COUNTERS = 4


@dsl.jit
def _colliding(counters_ptr, x_ptr, old_ptr, n, KIND: dsl.constexpr, SCOPE: dsl.constexpr, BLOCK: dsl.constexpr):
    # element i updates counter i % COUNTERS; its old value goes to old[i]
    i = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = i < n
    x = dsl.load(x_ptr + i, mask=mask)
    target = counters_ptr + i % 4
    if KIND == "add":
        old = dsl.atomic_add(target, x, mask=mask, scope=SCOPE)
    elif KIND == "max":
        old = dsl.atomic_max(target, x, mask=mask, scope=SCOPE)
    elif KIND == "min":
        old = dsl.atomic_min(target, x, mask=mask, scope=SCOPE)
    elif KIND == "xchg":
        old = dsl.atomic_xchg(target, x, mask=mask, scope=SCOPE)
    elif KIND == "and":
        old = dsl.atomic_and(target, x, mask=mask, scope=SCOPE)
    elif KIND == "or":
        old = dsl.atomic_or(target, x, mask=mask, scope=SCOPE)
    else:
        old = dsl.atomic_xor(target, x, mask=mask, scope=SCOPE)
    dsl.store(old_ptr + i, old, mask=mask)


def _supported(kind, dtype) -> bool:
    if kind in ("and", "or", "xor"):
        return not dtype.is_floating_point and dtype != torch.int16
    if kind in ("max", "min"):
        return dtype not in (torch.int16, torch.float16, torch.bfloat16)
    return True


_CASES = [(kind, dtype) for kind in KINDS for dtype in DTYPES if _supported(kind, dtype)]


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("kind, dtype", _CASES, ids=str)
def test_system_scope_atomics_are_system_scoped_in_the_ptx(kind, dtype, arch):
    t = torch.zeros(8, dtype=dtype)
    ptx = _colliding.compile(t, t, t, 8, KIND=kind, SCOPE="sys", BLOCK=128, target=arch).asm["ptx"]
    atoms = re.findall(r"\batom\.[\w.:]+", ptx)
    assert atoms and all(".sys." in atom for atom in atoms), atoms
    assert assemble(ptx, arch).spill_bytes == 0


def test_gpu_scope_keeps_the_plain_atomic():
    t = torch.zeros(8, dtype=torch.int32)
    ptx = _colliding.compile(t, t, t, 8, KIND="add", SCOPE="gpu", BLOCK=128, target="sm_90a").asm["ptx"]
    assert re.findall(r"\batom\.[\w.:]+", ptx) == ["atom.global.add.u32"]


def test_language_refuses_what_the_table_leaves_out():
    t = torch.zeros(8, dtype=torch.float16)
    with pytest.raises(dsl.CompilationError, match="atomic_max"):
        _colliding.compile(t, t, t, 8, KIND="max", SCOPE="sys", BLOCK=128, target="sm_90a")


def _inputs(kind, dtype, n, generator):
    if dtype.is_floating_point:        # small integers: every order of float additions is exact
        return torch.randint(-3, 4, (n,), generator=generator).to(dtype)
    if kind == "add":
        return torch.randint(0, 4, (n,), generator=generator).to(dtype)
    info = torch.iinfo(dtype)
    low, high = max(info.min, -2**40), min(info.max, 2**40)
    return torch.randint(low, high, (n,), generator=generator, dtype=torch.int64).to(dtype)


_UPDATE = {"add": lambda a, b: a + b, "max": max, "min": min, "xchg": lambda a, b: b, "and": lambda a, b: a & b,
           "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b}


@pytest.mark.parametrize("kind, dtype", _CASES, ids=str)
def test_interpreted_colliding_atomics(kind, dtype, seed):
    _check_colliding(kind, dtype, "sys", seed, "cpu", 300)


@pytest.mark.cuda
@pytest.mark.parametrize("scope", ["sys", "gpu"])
@pytest.mark.parametrize("kind, dtype", _CASES, ids=str)
def test_gpu_colliding_atomics(kind, dtype, scope, seed):
    _check_colliding(kind, dtype, scope, seed, "cuda", 1000)


def _check_colliding(kind, dtype, scope, seed, device, n):
    generator = torch.Generator().manual_seed(seed)
    x = _inputs(kind, dtype, n, generator)
    start = _inputs(kind, dtype, COUNTERS, generator)
    counters = start.clone().to(device)
    old = torch.zeros(n, dtype=dtype, device=device)
    _colliding[(dsl.cdiv(n, 128),)](counters, x.to(device), old, n, KIND=kind, SCOPE=scope, BLOCK=128,
                                    interpret=device == "cpu")
    counters, old = counters.cpu(), old.cpu()
    update = _UPDATE[kind]
    for c in range(COUNTERS):
        updates, olds, final = x[c::COUNTERS].tolist(), old[c::COUNTERS].tolist(), counters[c].item()
        # one chain of updates: each saw the value the previous one left, so the values left (the start and
        # each update's result) are the values seen (each old value and the final one)
        assert sorted([start[c].item()] + [update(o, v) for o, v in zip(olds, updates)]) == sorted(olds + [final])
        if kind != "xchg":      # the order does not matter to the final value
            expected = start[c].item()
            for v in updates:
                expected = update(expected, v)
            assert final == expected
