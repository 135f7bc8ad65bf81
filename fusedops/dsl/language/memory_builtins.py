"""The memory builtins: `dsl.load`, `dsl.store` and the atomics (`dsl.atomic_add`, ..., `dsl.atomic_cas`) (the
builtin machinery: core.py).
"""

from __future__ import annotations

from ..errors import CompilationError
from . import block_pointers
from .core import builtin
from .shape_ops import compile_time_bool


@builtin
def load(pointer, mask=None, other=None, boundary_check=(), padding_option="", cache_modifier="", eviction_policy="",
         volatile=False, *, _semantic=None):
    """Read memory: `pointer` is a pointer scalar or block; the result has its shape and pointee dtype.
    `pointer` may also be a block pointer (dsl.make_block_ptr; language/block_pointers.py): then mask and other
    must be None, and boundary_check (constexpr dims) / padding_option ("", "zero", "nan") say which dims are
    masked and with what; for a plain pointer they must be empty (Triton's order of arguments).

    mask: int1 (or anything `!= 0`) scalar/block broadcast with `pointer`; masked-off lanes do not
    touch memory and read `other` (default 0). cache_modifier: the PTX cache operator, "", ".ca",
    ".cg", ".cs", ".lu", ".cv"; eviction_policy: "", "evict_first", "evict_last" (an L2 cache policy
    and the L1 eviction priority), "evict_normal" (PTX ISA "ld", "createpolicy"; codegen/cache_hints.py).
    volatile (a constexpr bool, Triton's): read memory afresh each time the load runs, also in a loop that
    writes nothing (a spin wait on a flag another program sets, which a plain load, read once before the
    loop, would never see change): the `.cv` cache operator, so cache_modifier must then be "" or ".cv".
    Raises CompilationError for other values.
    """
    if compile_time_bool(volatile, "load: volatile"):
        if cache_modifier not in ("", ".cv"):
            raise CompilationError(f"load: volatile=True reads with the .cv cache operator, so it cannot take "
                                   f"cache_modifier={cache_modifier!r}")
        cache_modifier = ".cv"
    if isinstance(pointer, block_pointers.BlockPointer):
        return block_pointers.load_block(_semantic, pointer, mask, other, boundary_check, padding_option,
                                         cache_modifier, eviction_policy)
    block_pointers.check_plain_pointer("load", boundary_check, padding_option)
    return _semantic.load(pointer, mask, other, cache_modifier, eviction_policy)


@builtin
def store(pointer, value, mask=None, boundary_check=(), cache_modifier="", eviction_policy="", *, _semantic=None):
    """Write `value` (converted to the pointee dtype, broadcast to `pointer`'s shape) where `mask`.

    cache_modifier: "", ".wb", ".cg", ".cs", ".wt"; eviction_policy as for `load`. A block pointer
    (dsl.make_block_ptr) takes boundary_check (constexpr dims whose out-of-range elements are not written)
    instead of mask, and a value of its block_shape (or a scalar); a plain pointer takes no boundary_check.
    """
    if isinstance(pointer, block_pointers.BlockPointer):
        return block_pointers.store_block(_semantic, pointer, value, mask, boundary_check, cache_modifier,
                                          eviction_policy)
    block_pointers.check_plain_pointer("store", boundary_check)
    return _semantic.store(pointer, value, mask, cache_modifier, eviction_policy)


# -- atomics ------------------------------------------------------------------------------------------
def _atomic(kind: str):
    def function(pointer, val, mask=None, sem="acq_rel", scope="gpu", *, _semantic=None):
        return _semantic.atomic_rmw(kind, pointer, val, mask, sem, scope)

    name = f"atomic_{kind}"
    function.__name__ = function.__qualname__ = name
    function.__doc__ = (f"Atomically apply `{kind}` of `val` to the memory `pointer` points to, where "
                        "`mask`; returns the old values (pointer's shape). sem: relaxed, acquire, "
                        "release, acq_rel (the default; None, Triton's default, is it too); scope: cta, gpu (the "
                        "default; None too), sys.")
    return builtin(function)


atomic_add = _atomic("add")
atomic_max = _atomic("max")
atomic_min = _atomic("min")
atomic_and = _atomic("and")
atomic_or = _atomic("or")
atomic_xor = _atomic("xor")
atomic_xchg = _atomic("xchg")


@builtin
def atomic_cas(pointer, cmp, val, sem="acq_rel", scope="gpu", *, _semantic=None):
    """Atomically write `val` where memory equals `cmp`; returns the old values. sem and scope as for atomic_add."""
    return _semantic.atomic_cas(pointer, cmp, val, sem, scope)


__all__ = [
    "load", "store", "atomic_add", "atomic_max", "atomic_min", "atomic_and", "atomic_or", "atomic_xor",
    "atomic_xchg", "atomic_cas",
]
