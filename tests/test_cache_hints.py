"""cache_modifier / eviction_policy on dsl.load and dsl.store: the PTX qualifiers they become
(codegen/cache_hints.py), ptxas accepting each form, clear errors for what PTX has no form for, and
values unchanged (interpreter on the CPU, compiled on the GPU)."""

from __future__ import annotations

import re

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.errors import CompilationError
from fusedops.dsl.target import ptxas
from helpers import assert_close, poison, random_tensor


@dsl.jit
def hinted_copy(y_ptr, x_ptr, n, BLOCK: dsl.constexpr, LOAD_CACHE: dsl.constexpr, LOAD_EVICTION: dsl.constexpr,
                STORE_CACHE: dsl.constexpr, STORE_EVICTION: dsl.constexpr, MASKED: dsl.constexpr):
    offsets = dsl.program_id(0).to(dsl.int64) * BLOCK + dsl.arange(0, BLOCK)
    if MASKED:
        x = dsl.load(x_ptr + offsets, mask=offsets < n, other=0.0, cache_modifier=LOAD_CACHE,
                     eviction_policy=LOAD_EVICTION)
        dsl.store(y_ptr + offsets, x * 2.0, mask=offsets < n, cache_modifier=STORE_CACHE,
                  eviction_policy=STORE_EVICTION)
    else:
        x = dsl.load(x_ptr + offsets, cache_modifier=LOAD_CACHE, eviction_policy=LOAD_EVICTION)
        dsl.store(y_ptr + offsets, x * 2.0, cache_modifier=STORE_CACHE, eviction_policy=STORE_EVICTION)


# (load cache, load eviction, store cache, store eviction, expected load qualifiers, expected store qualifiers)
HINTS = [
    ("", "evict_last", ".cs", "", ".L1::evict_last.L2::cache_hint", ".cs"),
    (".cg", "evict_first", "", "evict_last", ".cg.L2::cache_hint", ".L1::evict_last.L2::cache_hint"),
    ("", "evict_normal", "", "evict_first", ".L1::evict_normal", ".L1::evict_first.L2::cache_hint"),
    (".lu", "", ".wt", "", ".lu", ".wt"),
    (".cs", "evict_normal", ".wb", "evict_normal", ".cs", ".wb"),
    (".ca", "", "", "", ".ca", ""),
]


def _compile(hint, masked: bool, n: int = 4096):
    x = torch.empty(4096, dtype=torch.float16)
    return hinted_copy.compile(x, x, n, BLOCK=1024, LOAD_CACHE=hint[0], LOAD_EVICTION=hint[1],
                               STORE_CACHE=hint[2], STORE_EVICTION=hint[3], MASKED=masked,
                               target="sm_90a", num_warps=4).asm["ptx"]


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("hint", HINTS)
def test_qualifiers_reach_the_ptx_and_ptxas_accepts_them(hint, masked, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    ptx = _compile(hint, masked)
    load = re.findall(r"ld\.global([.:\w]*)\.v4\.b32", ptx)
    store = re.findall(r"st\.global([.:\w]*)\.v4\.b32", ptx)
    assert load == [hint[4]] * len(load) and load      # 16-byte vectors kept, each with the qualifiers
    assert store == [hint[5]] * len(store) and store
    for policy in ("evict_first", "evict_last"):
        # one L2 policy per kernel and kind, passed to every access that uses it
        uses = sum(1 for h, q in ((hint[1], hint[4]), (hint[3], hint[5])) if h == policy and "cache_hint" in q)
        assert ptx.count(f"createpolicy.fractional.L2::{policy}.b64") == (1 if uses else 0)
    if ptxas.ptxas_available():
        assert ptxas.assemble(ptx, "sm_90a").spill_bytes == 0


def test_no_hint_keeps_plain_vector_accesses(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    ptx = _compile(("", "", "", ""), masked=False)
    assert "ld.global.v4.b32" in ptx and "st.global.v4.b32" in ptx and "createpolicy" not in ptx


@pytest.mark.parametrize("hint, message", [
    ((".wb", "", "", ""), "load: cache_modifier"),
    (("", "", ".ca", ""), "store: cache_modifier"),
    (("", "", ".cv", ""), "store: cache_modifier"),
    (("", "evict_always", "", ""), "load: eviction_policy"),
    (("", "", "", "last"), "store: eviction_policy"),
])
def test_what_ptx_has_no_form_for_is_a_clear_error(hint, message, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    with pytest.raises(CompilationError, match=message):
        _compile(hint, masked=False)


@pytest.mark.parametrize("hint", HINTS[:3])
def test_interpreter_values_unchanged(hint, seed):
    n = 1500
    x = random_tensor((2048,), torch.float16, "cpu", seed)
    y = poison(torch.empty_like(x))
    hinted_copy[(2,)](y, x, n, BLOCK=1024, LOAD_CACHE=hint[0], LOAD_EVICTION=hint[1], STORE_CACHE=hint[2],
                      STORE_EVICTION=hint[3], MASKED=True, interpret=True)
    assert_close(y[:n], x[:n].double() * 2, torch.float16)
    assert torch.isnan(y[n:]).all()     # masked off: left as poisoned


@pytest.mark.cuda
@pytest.mark.parametrize("masked, n", [(True, 1), (True, 4099), (False, 8192)])
@pytest.mark.parametrize("hint", HINTS)
def test_gpu_values_unchanged(hint, masked, n, seed):
    x = random_tensor((8192,), torch.float16, "cuda", seed)
    y = poison(torch.empty_like(x))
    hinted_copy[(8,)](y, x, n, BLOCK=1024, LOAD_CACHE=hint[0], LOAD_EVICTION=hint[1], STORE_CACHE=hint[2],
                      STORE_EVICTION=hint[3], MASKED=masked)
    limit = n if masked else 8192
    assert_close(y[:limit], x[:limit].double() * 2, torch.float16)
    assert torch.isnan(y[limit:]).all()
