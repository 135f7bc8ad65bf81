"""The cache qualifiers of global loads and stores (`cache_modifier`, `eviction_policy`).

PTX ISA, "ld" / "st" / "createpolicy":
- cache_modifier is the cache operator `.cop` (loads: .ca .cg .cs .lu .cv; stores: .wb .cg .cs .wt);
- eviction_policy "evict_first" / "evict_last" is an L2 cache policy (`createpolicy.fractional.L2::
  evict_first|evict_last.b64 policy, 1.0`, made once per kernel in the entry block) passed to the
  access with `.L2::cache_hint`, plus the same L1 eviction priority (`.L1::evict_first|evict_last`)
  where no cache operator is given (PTX takes either a `.cop` or an L1 priority, not both);
  "evict_normal" is `.L1::evict_normal` (nothing with a cache operator).

Loads and stores with a qualifier always go through inline PTX (predicated.py), predicated on true
when unmasked. The interpreter ignores the qualifiers: they change where data is cached, not values.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from llvmlite import ir

from ..target import llvm_types as T

_L2_POLICIES = ("evict_first", "evict_last")


@dataclasses.dataclass(frozen=True)
class CacheHint:
    qualifiers: str                     # after `ld.global` / `st.global`, e.g. ".cs" or ".L1::evict_last.L2::cache_hint"
    policy: Optional[ir.Value] = None   # the i64 L2 cache policy operand when qualifiers hold .L2::cache_hint


def cache_hint(ctx, op) -> Optional[CacheHint]:
    """The qualifiers of LOAD/STORE `op` (None when it has none)."""
    cache = op.attrs.get("cache", "")
    eviction = op.attrs.get("eviction", "")
    if not cache and not eviction:
        return None
    qualifiers = cache
    if not cache and eviction:
        qualifiers = f".L1::{eviction}"
    if eviction not in _L2_POLICIES:
        return CacheHint(qualifiers) if qualifiers else None
    return CacheHint(qualifiers + ".L2::cache_hint", _policy(ctx, eviction))


def _policy(ctx, eviction: str) -> ir.Value:
    """The kernel's L2 cache policy for `eviction`, created once in the entry block."""
    policy = ctx.cache_policies.get(eviction)
    if policy is None:
        asm = f"createpolicy.fractional.L2::{eviction}.b64 $0, 1.0;"
        policy = T.inline_asm(ctx.prologue, asm, "=l", [], T.i64, side_effect=False)
        ctx.cache_policies[eviction] = policy
    return policy
