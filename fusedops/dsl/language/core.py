"""The builtin machinery: `@builtin`, which makes a function a builtin kernels call (`dsl.load`, `dsl.exp`,
`dsl.dot`, ...), and the compile-time constructs `constexpr` and `static_range`.

Each builtin is a plain Python function marked with `@builtin`. Inside a `@dsl.jit` kernel the
frontend calls it with the keyword `_semantic`, the `Semantics` that builds typed IR; its arguments
are IR values (runtime scalars and blocks) or Python values (constexprs and literals). Called from
plain Python (no `_semantic`), a builtin raises `RuntimeError`.

Shapes are tuples of powers of two; "block" in the builtins' docstrings means a value of `BlockType`, "scalar" a value
of a `DType`/`PointerType`. Literal Python numbers are weakly typed (see `promotion.py`).

The builtins, by family: `elementwise_builtins.py`, `memory_builtins.py` (loads, stores, atomics),
`block_builtins.py` (block creation, shapes, reductions, scans, dot, block methods) and
`program_builtins.py` (grid position, launch directives, clusters, barrier, printing, assertions).
"""

from __future__ import annotations

import functools


def builtin(fn=None, *, host=False):
    """Mark `fn` as a kernel builtin: the frontend calls it with `_semantic=`; plain Python cannot
    (RuntimeError), unless `host`: then `fn` also runs on the host, with `_semantic=None`."""
    if fn is None:
        return lambda f: builtin(f, host=host)

    @functools.wraps(fn)
    def wrapper(*args, _semantic=None, **kwargs):
        if _semantic is None and not host:
            raise RuntimeError(f"dsl.{fn.__name__} can only be called inside a @dsl.jit kernel")
        return fn(*args, _semantic=_semantic, **kwargs)

    wrapper.__dsl_builtin__ = True
    return wrapper


def is_builtin(obj) -> bool:
    return getattr(obj, "__dsl_builtin__", False) is True


class constexpr:
    """A compile-time value.

    As a parameter annotation (`BLOCK: dsl.constexpr`) it makes the parameter a compile-time
    constant: the kernel is specialized on its value, which must be a Python int, float, bool,
    str, None, dsl dtype or a tuple of those (a namedtuple or a frozen dataclass of them too, read in
    the kernel as `CFG.field`: specialized on each field's type and value). Called, `dsl.constexpr(128)`
    wraps a value; a module global so wrapped can be read by kernels.
    """

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value.value if isinstance(value, constexpr) else value

    def __repr__(self) -> str:
        return f"constexpr({self.value!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, constexpr) and type(other.value) is type(self.value) and other.value == self.value

    def __hash__(self) -> int:
        return hash((constexpr, self.value))


class static_range:
    """`for i in dsl.static_range(start, stop=None, step=1)`: a loop unrolled at compile time.

    The bounds must be constexpr ints; inside the body `i` is a constexpr int, so it can index
    tuples and feed shapes. Use Python's `range` for a loop that stays a loop in the IR.
    """

    def __init__(self, start, stop=None, step=1):
        if stop is None:
            start, stop = 0, start
        self.start, self.stop, self.step = start, stop, step

    def __iter__(self):
        raise RuntimeError("dsl.static_range can only be iterated inside a @dsl.jit kernel")


__all__ = [
    "builtin", "is_builtin", "constexpr", "static_range",
]
