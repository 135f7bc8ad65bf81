"""The entry of cached GPU launches: generated code that binds a launch's arguments to a launch key.

A launch that finds its plan (jit.py) should cost no more host time than a native torch op, so the
per-launch Python work is generated once per kernel (with `exec`, like Triton's binder) instead of
interpreted per argument:

- `make_entry(...)`: what `kernel[grid](...)` calls after the first GPU launch: a function with the
  kernel's own parameters (defaults included), so CPython binds positional and keyword arguments in
  C; it computes the launch key and the runtime values, finds the plan (launch_plans.make_plan) and
  launches, and hands anything else (binding errors, the interpreter, a new key) to the full path. The key
  holds per argument exactly what `signature.specialize` reads: a tensor's dtype, 16-byte alignment and
  device; an int's width and whether it is 1 or divisible by 16 (or else by 8); the class of floats, bools
  and None; a constexpr's class and key (signature.ArgSpec.value_key: a float's bytes; a tuple's, a
  namedtuple's or a dataclass's items by class and key); and the launch options. The values are the
  non-constexpr arguments, tensors as data pointers.
- `make_binder(...)`: the same key and values as `bind(num_warps, num_stages, *args, **kwargs)`
  (the first GPU launch uses it to file its plan).

What a launch costs on the host: launch_plans.py.
"""

from __future__ import annotations

import keyword
import os
import struct
from typing import Callable, Optional, Sequence

from ..language import core
from ..language.dtypes import DType, PointerType
from .signature import _constexpr_key as value_key, integer_range

_PREFIX = "_jit_"     # the generated code's own names; kernel parameters may not start with it


class _Miss(TypeError):
    """An argument the binder leaves to the full path (a TypeError, like a binding error)."""


def _other_key(value, tensor_type, low: Optional[int] = None, high: Optional[int] = None) -> tuple:
    # (value, key slot a, key slot b) of an argument the generated code does not handle inline; an int outside
    # [low, high] (an annotated parameter's range) is left to the full path, which raises naming it.
    if isinstance(value, tensor_type):      # a subclass, e.g. torch.nn.Parameter
        if value.is_neg():
            raise _Miss("a negated view")
        address = value.data_ptr()
        if not address and value.numel():
            raise _Miss("a tensor without data (a wrapper subclass)")
        device = value.get_device()
        return address, value.dtype, device if address & 15 else -3 - device
    cls = type(value)
    if low is not None and (cls is int or cls is bool) and not low <= value <= high:
        raise _Miss("an int outside its annotated type")
    if cls is int:
        if -0x8000000000000000 <= value <= 0xFFFFFFFFFFFFFFFF:    # int64 / uint64
            return value, _WIDE_INT, ((value > 0x7FFFFFFFFFFFFFFF) + 2 * (value & 15 == 0) + 4 * (value & 15 == 8)
                                      + 8 * (value > 0 and value & 7 == 0))
        raise _Miss("an int wider than 64 bits")
    if cls is bool:     # one runtime kernel for True and False, except where an integer annotation
        return value, bool, 0 if low is None else int(value)    # specializes True as the int 1
    raise _Miss(f"an argument of type {cls.__name__}")


_WIDE_INT = object()    # the key slot of ints that need 64 bits

# The 8 bytes of a float: what keys a float constexpr (see `signature.ArgSpec.value_key`).
float_bits = struct.Struct("<d").pack

# Classes of constexpr values keyed as themselves (with their class): equal values of one of them are the same
# constant. Any other value is keyed as the full path keys it (`signature._constexpr_key`, here `value_key`): a
# tuple, a namedtuple or a dataclass instance by its items' or fields' classes and keys (NT(0.0) == NT(-0.0),
# Cfg(1) == Cfg(1.0), but a kernel reading them compiles other code).
_PLAIN = frozenset((bool, str, type(None), DType, PointerType))


def _constexpr_key(wrapped: core.constexpr):
    """The launch-key slot of a constexpr argument given as `dsl.constexpr(value)`: that of `value`
    (see `_argument_code`)."""
    value = wrapped.value
    cls = type(value)
    if cls is int:
        return value
    # a tuple (a namedtuple, a dataclass instance) by its items' classes and keys ((0.0,) and (-0.0,), (1,) and
    # (1.0,) compare equal but are different constants), as the full path specializes it
    return cls, float_bits(value) if cls is float else value if cls in _PLAIN else value_key(value)


def _branches(name: str, a: str, k: str, j: str, int_range: tuple = (-0x80000000, 0x7FFFFFFF)) -> dict:
    """Per kind of runtime argument: (the test that an argument `name` is of it, the statements that
    set its value `a` and its key slots `k` and `j`). The slots hold what `signature.specialize`
    reads: a tensor's dtype, and its device d and 16-byte alignment as d, or -3 - d when aligned
    (devices are >= -1, so the two ranges do not meet); an int32's class and whether it is 1, divisible
    by 16 or else by 8 (each positive, 16 / 8, or not, 17 / 9); the class of a float or None. A tensor
    with the negative bit (a lazily negated view) is left to the full path, which refuses it; `int_range`:
    the ints taken inline (an annotated parameter's narrower range: others go to the full path's check)."""
    p = _PREFIX
    low, high = int_range
    return {
        "tensor": (f"{p}type({name}) is {p}T",
                   [f"if {name}.is_neg():", f"    raise {p}Miss('a negated view')",
                    f"{a} = {name}.data_ptr()", f"{k} = {name}.dtype",
                    f"{j} = {name}.get_device() if {a} & 15 else -3 - {name}.get_device()"]),
        "int": (f"{p}type({name}) is {p}int and {low} <= {name} <= {high}",
                [f"{a} = {name}", f"{k} = {p}int",
                 f"{j} = (16 if {name} > 0 else 17) if not {name} & 15 else (8 if {name} > 0 else 9) "
                 f"if not {name} & 7 else 1 if {name} == 1 else 0"]),
        "float": (f"{p}type({name}) is {p}float", [f"{a} = {name}", f"{k} = {p}float", f"{j} = 0"]),
        "None": (f"{name} is None", [f"{a} = None", f"{k} = None", f"{j} = 0"]),
    }


def _likely_kind(value) -> str:
    """The kind of `value` among `_branches`' ("tensor" for any other value)."""
    if value is None:
        return "None"
    return {int: "int", float: "float"}.get(type(value), "tensor")


def _argument_code(params: Sequence, likely: Optional[Sequence[str]] = None) -> tuple:
    """(lines computing the launch key's slots and the runtime values of `params`, the key's slot
    expressions, the values' names), shared by the generated binder and entry.

    likely: per parameter, the kind of argument (see `_branches`) to test first, e.g. the first
    launch's; the tests of the others follow, then `_other_key` for any other argument. The order
    changes the cost, not the key."""
    body, key, values = [], [], []
    for index, param in enumerate(params):
        name = param.name
        if param.is_constexpr:
            # One slot: an int as itself, any other value as (its class, the value), which keeps
            # True, 1 and 1.0 apart (an int never equals a tuple), or, outside _PLAIN's classes, (its
            # class, signature._constexpr_key's key: a tuple's, a namedtuple's or a dataclass's items by
            # their classes and keys); a float as (float, its 8 bytes):
            # -0.0 == 0.0 (and -NaN == NaN in hex) but they are different constants (1 / C
            # differs), and a NaN, never equal to itself, would miss its plan. A value wrapped in
            # dsl.constexpr, which compares by value (constexpr(-0.0) == constexpr(0.0)), is keyed
            # as the value it wraps, as the full path specializes it.
            cls = f"{_PREFIX}c{index}"
            key.append(f"({name} if ({cls} := {_PREFIX}type({name})) is {_PREFIX}int else "
                       f"({cls}, {_PREFIX}float_bits({name}) if {cls} is {_PREFIX}float else "
                       f"{name} if {cls} in {_PREFIX}plain else {_PREFIX}value_key({name})) "
                       f"if {cls} is not {_PREFIX}constexpr else {_PREFIX}constexpr_key({name}))")
            continue
        a, k, j = f"{_PREFIX}a{index}", f"{_PREFIX}k{index}", f"{_PREFIX}j{index}"
        branches = _branches(name, a, k, j, _int_range(param))
        first = likely[index] if likely is not None else "tensor"
        for number, kind in enumerate([first, *(kind for kind in branches if kind != first)]):
            test, statements = branches[kind]
            body += [f"{'if' if number == 0 else 'elif'} {test}:", *indented(statements, 4)]
        annotated = _annotated_range(param)
        bounds = "" if annotated is None else f", {annotated[0]}, {annotated[1]}"
        body += ["else:", f"    {a}, {k}, {j} = {_PREFIX}other({name}, {_PREFIX}T{bounds})"]
        key += [k, j]
        values.append(a)
    return body, key, values


def _annotated_range(param) -> Optional[tuple]:
    """(low, high) of the ints an integer-annotated `param` holds (int1: 0 and 1), or None."""
    dtype = getattr(param, "annotation", None)
    return integer_range(dtype) if isinstance(dtype, DType) and dtype.is_integer else None


def _int_range(param) -> tuple:
    """The ints the generated code takes inline for `param`: int32's, within an integer annotation's."""
    annotated = _annotated_range(param) or (-0x80000000, 0x7FFFFFFF)
    return max(annotated[0], -0x80000000), min(annotated[1], 0x7FFFFFFF)


def _namespace(params: Sequence, tensor_type) -> Optional[dict]:
    if any(p.name.startswith(_PREFIX) or keyword.iskeyword(p.name) for p in params):
        return None
    namespace = {f"{_PREFIX}T": tensor_type, f"{_PREFIX}other": _other_key, f"{_PREFIX}Miss": _Miss,
                 f"{_PREFIX}M": MISSING}
    # the builtins the generated code calls, under names no parameter can shadow
    namespace.update({f"{_PREFIX}{f.__name__}": f for f in (type, int, float, tuple, len, callable)})
    namespace[f"{_PREFIX}float_bits"] = float_bits
    namespace[f"{_PREFIX}value_key"] = value_key
    namespace[f"{_PREFIX}plain"] = _PLAIN
    namespace.update({f"{_PREFIX}constexpr": core.constexpr, f"{_PREFIX}constexpr_key": _constexpr_key})
    for index, param in enumerate(params):
        if param.has_default:
            namespace[f"{_PREFIX}default{index}"] = param.default
    return namespace


def indented(lines: Sequence[str], depth: int) -> list:
    return [" " * depth + line for line in lines]


def _parameter_lists(params: Sequence, texts: Sequence[str]) -> tuple:
    """(positional, keyword_only): the generated functions' parameter texts (one per kernel parameter) split as
    the kernel's signature splits them, positional ones closed by "/" after its positional-only ones: Python's
    binding rules, as the full path's (signature.bind_parameters)."""
    positional = [text for p, text in zip(params, texts) if p.kind != "keyword_only"]
    keyword_only = [text for p, text in zip(params, texts) if p.kind == "keyword_only"]
    positional_only = sum(p.kind == "positional_only" for p in params)
    if positional_only:
        positional.insert(positional_only, "/")
    return positional, keyword_only


def make_binder(params: Sequence, tensor_type) -> Optional[Callable]:
    """The generated `bind(num_warps, num_stages, *args, **kwargs) -> (key, values)` of a kernel with
    `params` (signature.Parameter), or None when its parameter names do not allow one."""
    namespace = _namespace(params, tensor_type)
    if namespace is None:
        return None
    positional, keyword_only = _parameter_lists(params, [f"{p.name}={_PREFIX}default{i}" if p.has_default
                                                         else p.name for i, p in enumerate(params)])
    signature = [f"{_PREFIX}num_warps", f"{_PREFIX}num_stages", *positional]
    signature += ["*", *keyword_only] if keyword_only else []
    body, key, values = _argument_code(params)
    source = "\n".join([
        f"def {_PREFIX}bind({', '.join(signature)}):",
        # num_warps=4.0 equals 4: only ints may find a plan (the full path rejects the others)
        f"    if {_PREFIX}type({_PREFIX}num_warps) is not {_PREFIX}int \\",
        f"            or {_PREFIX}type({_PREFIX}num_stages) is not {_PREFIX}int:",
        f"        raise {_PREFIX}Miss('launch options')",
        *indented(body, 4),
        f"    return ({', '.join([f'{_PREFIX}num_warps', f'{_PREFIX}num_stages', *key])},), "
        f"({''.join(v + ', ' for v in values)})",
    ])
    exec(compile(source, "<binder>", "exec"), namespace)
    return namespace[f"{_PREFIX}bind"]


MISSING = object()      # what the generated entry's parameters hold when a call does not give them


def _interpret_unset_test() -> Optional[dict]:
    """Names for the entry's test that FUSEDOPS_INTERPRET is unset, or None when os.environ is not
    CPython's `_Environ`.

    `knobs.interpret_enabled()` costs a call (~0.12 us); the entry asks it only when the variable is
    set or os.environ has been replaced. CPython's os.environ keeps its encoded items in the dict
    `_data`, which every change made through os.environ updates, so while `os.environ is environ`,
    `key not in data` exactly when the variable is unset (a `in` test, not a call of `data.get`).
    """
    environ = os.environ
    data = getattr(environ, "_data", None)
    if type(data) is not dict or not hasattr(environ, "encodekey"):
        return None
    return {f"{_PREFIX}os": os, f"{_PREFIX}environ": environ, f"{_PREFIX}environ_data": data,
            f"{_PREFIX}interpret_key": environ.encodekey("FUSEDOPS_INTERPRET")}


def make_entry(name: str, params: Sequence, tensor_type, plans: dict, interpret_enabled: Callable,
               normalize_grid: Callable, meta: Callable, slow: Callable,
               sample: Optional[Sequence] = None) -> Optional[Callable]:
    """The generated `entry(grid, *args, num_warps=4, num_stages=3, interpret=None, **kwargs)` that
    `kernel[grid]` calls: the binder's work and the cached launch in one function, named `name`.

    Its parameters are the kernel's, with MISSING standing for a required argument not given, plus
    `*extra` and `**unknown`; anything but a cached GPU launch (a binding error, the interpreter, a
    new launch key, an argument kind the key does not cover, a rebound global) calls
    `slow(grid, values, extra, unknown, num_warps, num_stages, interpret, key)`, the full path.
    `plans` maps launch keys to `launch_plans.make_plan`'s launches; `meta(values, num_warps, num_stages)` gives
    a grid callable its meta-parameters. `sample`: arguments like those of the launches to come
    (e.g. the first launch's, one per parameter); the entry tests their kinds first.

    A missing argument needs no test of its own: MISSING is of no kind the key covers (the full
    path is called), and as a constexpr it keys no plan (plans are made for bound launches only).
    """
    namespace = _namespace(params, tensor_type)
    if namespace is None or not name.isidentifier() or keyword.iskeyword(name):
        return None
    namespace.update({f"{_PREFIX}plans": plans, f"{_PREFIX}interpret": interpret_enabled,
                      f"{_PREFIX}normalize": normalize_grid, f"{_PREFIX}meta": meta, f"{_PREFIX}slow": slow,
                      f"{_PREFIX}num_warps": 4, f"{_PREFIX}num_stages": 3})
    unset_test = _interpret_unset_test()
    if unset_test is None:
        interpreting = f"{_PREFIX}interpret()"
    else:
        namespace.update(unset_test)
        interpreting = (f"({_PREFIX}os.environ is not {_PREFIX}environ "
                        f"or {_PREFIX}interpret_key in {_PREFIX}environ_data) and {_PREFIX}interpret()")
    # The kernel's keyword-only parameters after `*extra` (a call the parameters do not fit leaves the values
    # MISSING or in extra / unknown: the full path, whose binder raises Python's error).
    positional, keyword_only = _parameter_lists(params, [f"{p.name}={_PREFIX}default{i}" if p.has_default
                                                         else f"{p.name}={_PREFIX}M" for i, p in enumerate(params)])
    signature = [f"{_PREFIX}grid", *positional, f"*{_PREFIX}extra", *keyword_only, f"num_warps={_PREFIX}num_warps",
                 f"num_stages={_PREFIX}num_stages", "interpret=None", f"**{_PREFIX}unknown"]
    all_values = f"({''.join(p.name + ', ' for p in params)})"
    slow = (f"return {_PREFIX}slow({_PREFIX}grid, {all_values}, {_PREFIX}extra, {_PREFIX}unknown, num_warps, "
            f"num_stages, interpret, {{key}})")
    likely = None if sample is None else [_likely_kind(value) for value in sample]
    body, key, values = _argument_code(params, likely)
    values = "".join(f", {value}" for value in values)
    grid = f"{_PREFIX}grid"
    source = "\n".join([
        f"def {name}({', '.join(signature)}):",
        # num_warps=4.0 equals 4: only ints may find a plan (the full path rejects the others); the
        # defaults need no test
        f"    if {_PREFIX}extra or {_PREFIX}unknown \\",
        f"            or num_warps is not {_PREFIX}num_warps and {_PREFIX}type(num_warps) is not {_PREFIX}int \\",
        f"            or num_stages is not {_PREFIX}num_stages and {_PREFIX}type(num_stages) is not {_PREFIX}int \\",
        f"            or (interpret if interpret is not None else {interpreting}):",
        "        " + slow.format(key="None"),
        "    try:",
        *indented(body, 8),
        f"        {_PREFIX}key = ({', '.join(['num_warps', 'num_stages', *key])},)",
        f"        {_PREFIX}plan = {_PREFIX}plans[{_PREFIX}key]",
        "    except KeyError:   # a new launch key",
        "        " + slow.format(key=f"{_PREFIX}key"),
        f"    except TypeError:   # {_PREFIX}Miss, or an unhashable constexpr",
        "        " + slow.format(key="None"),
        "    except RuntimeError:   # a tensor without storage (sparse, ...): the full path says why",
        "        " + slow.format(key="None"),
        # the common grid, one int, tested inline; a plan returns False, launching nothing, when a
        # global the kernel read has been rebound since (the full path regenerates the kernel)
        f"    if {_PREFIX}type({grid}) is {_PREFIX}tuple and {_PREFIX}len({grid}) == 1 \\",
        f"            and {_PREFIX}type({_PREFIX}x := {grid}[0]) is {_PREFIX}int and 0 < {_PREFIX}x <= 0x7FFFFFFF:",
        f"        if {_PREFIX}plan({_PREFIX}x, 1, 1{values}):",
        "            return",
        "    else:",
        f"        if {_PREFIX}callable({grid}):",
        f"            {grid} = {grid}({_PREFIX}meta({all_values}, num_warps, num_stages))",
        f"        {grid} = {_PREFIX}normalize({grid})",
        f"        if not ({grid}[0] and {grid}[1] and {grid}[2]) \\",
        f"                or {_PREFIX}plan({grid}[0], {grid}[1], {grid}[2]{values}):",
        "            return",
        "    " + slow.format(key=f"{_PREFIX}key"),
    ])
    exec(compile(source, f"<launch entry of {name}>", "exec"), namespace)
    return namespace[name]
