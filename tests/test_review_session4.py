"""Review of session 4 (attention backward rewrite): what a reviewer found, kept as tests.

The dQ kernel's rewrite (K loaded in both orientations, lse/delta loaded per key block, the 128 class
on 128x64 register-A wgmma) spills under ptxas for sm_90a where the kernels at e1c6319 did not: with
an additive float attn_mask (12 / 56 bytes at E = 128, up to 356 at E = 100) and for head dims below
their block (68-80 bytes at E = 72 / 120; 40-44 at E = 200). The shipped 128x64 dQ tile is the one
the H200 ran (its GPU tests pass with these spills); the 128x32 alternative (DQ_ALTERNATIVES) is
spill-free in all of these cases and waits for a GPU run before it replaces it. These tests bound the
spills as they are, so that they do not grow unnoticed, and keep the alternative spill-free.
"""

from __future__ import annotations

import pytest

from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels.attention_configs import DQ_ALTERNATIVES, AttentionConfig
from fusedops.kernels.attention_logits import ADDITIVE_MASK, BOOL_MASK, NO_MASK
from test_attention import compile_backward

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")

# (E, causal, mask kind, spill bytes of the shipped dQ tile under ptxas 13.0; with an additive mask the
# kernel also loads lse's lo half (kernels/attention.py, "Saved statistics"): 8-20 bytes more)
_CASES = [(128, False, ADDITIVE_MASK, 20), (128, True, ADDITIVE_MASK, 76), (72, False, NO_MASK, 68),
          (120, True, NO_MASK, 80), (80, True, BOOL_MASK, 0), (96, False, ADDITIVE_MASK, 20),
          (100, True, ADDITIVE_MASK, 356), (200, False, NO_MASK, 40), (200, True, NO_MASK, 44)]


@needs_ptxas
@pytest.mark.parametrize("dim,causal,mask_kind,spills", _CASES, ids=str)
def test_dq_spills_stay_bounded(dim, causal, mask_kind, spills, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    result = assemble(compile_backward("dq", dim, causal, mask_kind).asm["ptx"], "sm_90a")
    assert result.spill_bytes <= spills, result.log


@needs_ptxas
@pytest.mark.parametrize("dim,causal,mask_kind,spills", [c for c in _CASES if c[0] <= 128], ids=str)
def test_dq_lean_alternative_assembles_without_spills(dim, causal, mask_kind, spills, tmp_path, monkeypatch):
    lean = AttentionConfig(128, 32, 8, 2)
    assert lean in DQ_ALTERNATIVES[128]
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    result = assemble(compile_backward("dq", dim, causal, mask_kind, config=lean).asm["ptx"], "sm_90a")
    assert result.spill_bytes == 0, result.log
