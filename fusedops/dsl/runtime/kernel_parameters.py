"""The parameters of a `@dsl.jit` function, read from its Python signature and annotations.

A parameter annotated `dsl.constexpr` (or a string naming it) is a compile-time value; one annotated
with a dsl scalar dtype (`n: dsl.int64`) is a scalar argument of that type; do_not_specialize names
the parameters whose int values are not specialized.
"""

from __future__ import annotations

import inspect
from typing import Optional

from ..language import core
from ..language.dtypes import ALL_DTYPES, DType
from .signature import NO_DEFAULT, Parameter

_RESERVED = ("num_warps", "num_stages", "interpret", "target", "grid")

_KINDS = {inspect.Parameter.POSITIONAL_ONLY: "positional_only", inspect.Parameter.POSITIONAL_OR_KEYWORD:
          "positional_or_keyword", inspect.Parameter.KEYWORD_ONLY: "keyword_only"}


def _annotation_text(annotation):
    """A string annotation without the quotes a quoted one keeps under `from __future__ import annotations`
    (`B: "dsl.constexpr"` arrives as "'dsl.constexpr'"); any other annotation unchanged."""
    if isinstance(annotation, str):
        text = annotation.strip()
        while len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
            text = text[1:-1].strip()
        return text
    return annotation


def _is_constexpr_annotation(annotation) -> bool:
    annotation = _annotation_text(annotation)
    if annotation is core.constexpr:
        return True
    return isinstance(annotation, str) and (annotation == "constexpr" or annotation.endswith(".constexpr"))


def _scalar_annotation(annotation) -> Optional[DType]:
    """The dsl dtype a parameter's annotation names (`n: dsl.int64`, or the string "dsl.int64" / "tl.int64"
    under `from __future__ import annotations`), or None: other annotations (`int`, `torch.Tensor`) are
    Python type hints the compiler does not read."""
    annotation = _annotation_text(annotation)
    if isinstance(annotation, DType):
        return annotation
    if isinstance(annotation, str):
        return _DTYPES_BY_NAME.get(annotation.rsplit(".", 1)[-1]) if "." in annotation else None
    return None


_DTYPES_BY_NAME = {dtype.name: dtype for dtype in ALL_DTYPES}


def parameters(fn, do_not_specialize) -> tuple:
    """The kernel parameters of `fn` (a tuple of Parameter, in signature order): constexpr or not (the
    annotation), default, scalar dtype annotation, and whether `do_not_specialize` (names or indices, or None)
    exempts it from specialization.

    Raises TypeError for a malformed or unknown do_not_specialize entry, *args / **kwargs, a parameter named
    like a launch option (num_warps, num_stages, interpret, target, grid), or a constexpr in do_not_specialize.
    """
    signature = inspect.signature(fn)
    names = list(signature.parameters)
    given = do_not_specialize
    if given is None:           # (Triton's default spelling of none)
        do_not_specialize = ()
    elif not isinstance(given, (str, bytes)):
        try:
            do_not_specialize = tuple(given)       # (read once: a generator would be used up by the checks)
        except TypeError:
            do_not_specialize = None
    if not isinstance(do_not_specialize, tuple) or not all(
            isinstance(i, (str, int)) and not isinstance(i, bool) for i in do_not_specialize):
        raise TypeError(f"do_not_specialize must be a list of parameter names or indices of `{fn.__name__}`, "
                        f"got {given!r}")
    bad = [i for i in do_not_specialize if isinstance(i, int) and not -len(names) <= i < len(names)]
    if bad:
        raise TypeError(f"do_not_specialize indices {bad} are out of range for the {len(names)} parameters of "
                        f"`{fn.__name__}`")
    skip = {names[i] if isinstance(i, int) else i for i in do_not_specialize}
    unknown = skip - set(names)
    if unknown:
        raise TypeError(f"do_not_specialize names {sorted(unknown)}, which are not parameters of `{fn.__name__}`")
    params = []
    for p in signature.parameters.values():
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            raise TypeError(f"`{fn.__name__}`: kernels cannot take *args or **kwargs (parameter `{p.name}`)")
        if p.name in _RESERVED:
            raise TypeError(f"`{fn.__name__}`: the parameter name `{p.name}` is reserved for launch options")
        default = p.default if p.default is not p.empty else NO_DEFAULT
        constexpr = _is_constexpr_annotation(p.annotation)
        if constexpr and p.name in skip:
            raise TypeError(f"do_not_specialize names `{p.name}`, a dsl.constexpr parameter of `{fn.__name__}` "
                            "(each of its values compiles a kernel of its own)")
        params.append(Parameter(p.name, constexpr, default, p.name in skip, _scalar_annotation(p.annotation),
                                _KINDS[p.kind]))
    return tuple(params)
