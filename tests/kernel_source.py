"""Kernels written as source text in tests (bodies spliced into a template, generated variants).

Usage:
    from kernel_source import jit_from_source

    kernel = jit_from_source("def k(o_ptr):\n    dsl.store(o_ptr, 1.0)\n", "<my test k>")

The source is registered with linecache under `filename`, so that the DSL frontend (which reads a
kernel's source through inspect) finds it and errors point at its lines.
"""

from __future__ import annotations

import linecache
from typing import Optional

import fusedops.dsl as dsl


def jit_from_source(source: str, filename: str, name: str = "k", namespace: Optional[dict] = None):
    """dsl.jit of the function `name` defined by `source` (executed with `dsl` and `namespace` in scope)."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    scope = {"dsl": dsl, **(namespace or {})}
    exec(compile(source, filename, "exec"), scope)
    return dsl.jit(scope[name])
