"""fusedops: fused GPU kernels for PyTorch, written in the `fusedops.dsl` block language.

Importing this package is cheap: it imports neither torch nor the compiler. Public ops are
re-exported lazily through `_LAZY_EXPORTS` (name -> "module:attribute"), so
`fusedops.softmax` imports its kernel module on first access only.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# name -> "module:attribute". A constant table; add one line per public op as it lands, e.g.
# "softmax": "fusedops.kernels.softmax:softmax".
_LAZY_EXPORTS: dict[str, str] = {
    "matmul": "fusedops.functional:matmul",
    "softmax": "fusedops.functional:softmax",
    "log_softmax": "fusedops.functional:log_softmax",
    "layer_norm": "fusedops.functional:layer_norm",
    "rms_norm": "fusedops.functional:rms_norm",
    "scaled_dot_product_attention": "fusedops.functional:scaled_dot_product_attention",
}

# `from fusedops import *`: the public ops (imported on first access through __getattr__).
__all__ = sorted(_LAZY_EXPORTS)


def __getattr__(name: str):
    """Import a lazily re-exported public op on first access (PEP 562)."""
    target = _LAZY_EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"module 'fusedops' has no attribute {name!r}")
    module_name, _, attribute = target.partition(":")
    value = getattr(importlib.import_module(module_name), attribute)
    globals()[name] = value   # later lookups are plain attribute reads (ops are called per step)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_EXPORTS))
