"""The host side of cached GPU launches: code generated per kernel, and prepared launches.

A launch that finds its plan (jit.py) should cost no more host time than a native torch op, so the
per-launch Python work is generated once per kernel (with `exec`, like Triton's binder) instead of
interpreted per argument:

- `make_entry(...)`: what `kernel[grid](...)` calls after the first GPU launch: a function with the
  kernel's own parameters (defaults included), so CPython binds positional and keyword arguments in
  C; it computes the launch key and the runtime values, finds the plan and launches, and hands
  anything else (binding errors, the interpreter, a new key) to the full path. The key holds per
  argument exactly what `signature.specialize` reads: a tensor's dtype, 16-byte alignment and device;
  an int's width and whether it is 1 or divisible by 16; the class of floats, bools and None; a
  constexpr's class and value; and the launch options. The values are the non-constexpr arguments,
  tensors as data pointers.
- `make_binder(...)`: the same key and values as `bind(num_warps, num_stages, *args, **kwargs)`
  (the first GPU launch uses it to file its plan).
- `make_prepared(...)`: a launch whose every argument but the tensors' addresses is fixed, for the
  library's launch wrappers, which cache one per (shapes, strides, dtypes, device, ...): the call
  reads the addresses, checks the 16-byte alignment the kernel was specialized on, that arguments
  given None then are None now and that the kernel's globals are still bound, and launches.
- `BoundedCache`: the dict those wrappers keep them in.

Measured on the CPU with the driver mocked (.scratch/bench_host_cpu.py): a cached `kernel[(1,)]` of a
3-tensor kernel ~3 us (5.8 us with the interpreted key); a prepared launch ~1.3 us.
"""

from __future__ import annotations

import functools
import keyword
import operator
import struct
from typing import Callable, Optional, Sequence

_PREFIX = "_jit_"     # the generated code's own names; kernel parameters may not start with it


class _Miss(TypeError):
    """An argument the binder leaves to the full path (a TypeError, like a binding error)."""


def _other_key(value, tensor_type) -> tuple:
    # (value, key slot a, key slot b) of an argument the generated code does not handle inline.
    if isinstance(value, tensor_type):      # a subclass, e.g. torch.nn.Parameter
        address = value.data_ptr()
        return address, value.dtype, (address & 15 == 0) + 2 * value.get_device()
    cls = type(value)
    if cls is int:
        if -0x8000000000000000 <= value <= 0xFFFFFFFFFFFFFFFF:    # int64 / uint64
            return value, _WIDE_INT, (value > 0x7FFFFFFFFFFFFFFF) + 2 * (value & 15 == 0)
        raise _Miss("an int wider than 64 bits")
    if cls is bool:
        return value, bool, 0
    raise _Miss(f"an argument of type {cls.__name__}")


_WIDE_INT = object()    # the key slot of ints that need 64 bits

# The 8 bytes of a float: what keys a float constexpr (see `signature.ArgSpec.value_key`).
float_bits = struct.Struct("<d").pack


def _argument_code(params: Sequence) -> tuple:
    """(lines computing the launch key's slots and the runtime values of `params`, the key's slot
    expressions, the values' names), shared by the generated binder and entry."""
    body, key, values = [], [], []
    for index, param in enumerate(params):
        name = param.name
        if param.is_constexpr:
            # A float by its bits: -0.0 == 0.0 (and -NaN == NaN in hex) but they are different
            # constants (1 / C differs), and a NaN, never equal to itself, would miss its plan.
            key += [f"{_PREFIX}type({name})",
                    f"({_PREFIX}float_bits({name}) if {_PREFIX}type({name}) is {_PREFIX}float else {name})"]
            continue
        a, k1, k2 = f"{_PREFIX}a{index}", f"{_PREFIX}k{index}", f"{_PREFIX}j{index}"
        body += [
            f"if {_PREFIX}type({name}) is {_PREFIX}T:",
            f"    {a} = {name}.data_ptr()",
            f"    {k1} = {name}.dtype",
            f"    {k2} = ({a} & 15 == 0) + 2 * {name}.get_device()",      # injective: devices are >= -1
            f"elif {_PREFIX}type({name}) is {_PREFIX}int and -0x80000000 <= {name} <= 0x7FFFFFFF:",
            f"    {a} = {name}",
            f"    {k1} = {_PREFIX}int",
            f"    {k2} = 1 if {name} == 1 else 16 if {name} & 15 == 0 else 0",
            f"elif {_PREFIX}type({name}) is {_PREFIX}float or {name} is None:",
            f"    {a} = {name}",
            f"    {k1} = {_PREFIX}type({name})",
            f"    {k2} = 0",
            "else:",
            f"    {a}, {k1}, {k2} = {_PREFIX}other({name}, {_PREFIX}T)",
        ]
        key += [k1, k2]
        values.append(a)
    return body, key, values


def _namespace(params: Sequence, tensor_type) -> Optional[dict]:
    if any(p.name.startswith(_PREFIX) or keyword.iskeyword(p.name) for p in params):
        return None
    namespace = {f"{_PREFIX}T": tensor_type, f"{_PREFIX}other": _other_key, f"{_PREFIX}Miss": _Miss,
                 f"{_PREFIX}M": MISSING}
    # the builtins the generated code calls, under names no parameter can shadow
    namespace.update({f"{_PREFIX}{f.__name__}": f for f in (type, int, float, tuple, len, callable)})
    namespace[f"{_PREFIX}float_bits"] = float_bits
    for index, param in enumerate(params):
        if param.has_default:
            namespace[f"{_PREFIX}default{index}"] = param.default
    return namespace


def _indented(lines: Sequence[str], depth: int) -> list:
    return [" " * depth + line for line in lines]


def make_binder(params: Sequence, tensor_type) -> Optional[Callable]:
    """The generated `bind(num_warps, num_stages, *args, **kwargs) -> (key, values)` of a kernel with
    `params` (signature.Parameter), or None when its parameter names do not allow one."""
    namespace = _namespace(params, tensor_type)
    if namespace is None:
        return None
    signature = [f"{_PREFIX}num_warps", f"{_PREFIX}num_stages"]
    signature += [f"{p.name}={_PREFIX}default{i}" if p.has_default else p.name for i, p in enumerate(params)]
    body, key, values = _argument_code(params)
    source = "\n".join([
        f"def {_PREFIX}bind({', '.join(signature)}):",
        # num_warps=4.0 equals 4: only ints may find a plan (the full path rejects the others)
        f"    if {_PREFIX}type({_PREFIX}num_warps) is not {_PREFIX}int \\",
        f"            or {_PREFIX}type({_PREFIX}num_stages) is not {_PREFIX}int:",
        f"        raise {_PREFIX}Miss('launch options')",
        *_indented(body, 4),
        f"    return ({', '.join([f'{_PREFIX}num_warps', f'{_PREFIX}num_stages', *key])},), "
        f"({''.join(v + ', ' for v in values)})",
    ])
    exec(compile(source, "<binder>", "exec"), namespace)
    return namespace[f"{_PREFIX}bind"]


MISSING = object()      # what the generated entry's parameters hold when a call does not give them


def make_entry(name: str, params: Sequence, tensor_type, plans: dict, interpret_enabled: Callable,
               normalize_grid: Callable, meta: Callable, slow: Callable) -> Optional[Callable]:
    """The generated `entry(grid, *args, num_warps=4, num_stages=3, interpret=None, **kwargs)` that
    `kernel[grid]` calls: the binder's work and the cached launch in one function, named `name`.

    Its parameters are the kernel's, with MISSING standing for a required argument not given, plus
    `*extra` and `**unknown`; anything but a cached GPU launch (a binding error, the interpreter, a
    new launch key, an argument kind the key does not cover, a rebound global) calls
    `slow(grid, values, extra, unknown, num_warps, num_stages, interpret, key)`, the full path.
    `meta(values, num_warps, num_stages)` gives a grid callable its meta-parameters.
    """
    namespace = _namespace(params, tensor_type)
    if namespace is None or not name.isidentifier() or keyword.iskeyword(name):
        return None
    namespace.update({f"{_PREFIX}plans": plans, f"{_PREFIX}interpret": interpret_enabled,
                      f"{_PREFIX}normalize": normalize_grid, f"{_PREFIX}meta": meta, f"{_PREFIX}slow": slow})
    signature = [f"{_PREFIX}grid"]
    signature += [f"{p.name}={_PREFIX}default{i}" if p.has_default else f"{p.name}={_PREFIX}M"
                  for i, p in enumerate(params)]
    signature += [f"*{_PREFIX}extra", "num_warps=4", "num_stages=3", "interpret=None", f"**{_PREFIX}unknown"]
    all_values = f"({''.join(p.name + ', ' for p in params)})"
    slow = (f"return {_PREFIX}slow({_PREFIX}grid, {all_values}, {_PREFIX}extra, {_PREFIX}unknown, num_warps, "
            f"num_stages, interpret, {{key}})")
    missing = [f"{p.name} is {_PREFIX}M" for p in params if not p.has_default]
    body, key, values = _argument_code(params)
    source = "\n".join([
        f"def {name}({', '.join(signature)}):",
        f"    if {' or '.join([f'{_PREFIX}extra', f'{_PREFIX}unknown', *missing])} or (",
        f"            {_PREFIX}interpret() if interpret is None else interpret) \\",
        f"            or {_PREFIX}type(num_warps) is not {_PREFIX}int \\",
        f"            or {_PREFIX}type(num_stages) is not {_PREFIX}int:",
        "        " + slow.format(key="None"),
        "    try:",
        *_indented(body, 8),
        f"        {_PREFIX}key = ({', '.join(['num_warps', 'num_stages', *key])},)",
        f"        {_PREFIX}plan = {_PREFIX}plans.get({_PREFIX}key)",
        f"    except TypeError:   # {_PREFIX}Miss, or an unhashable constexpr",
        "        " + slow.format(key="None"),
        f"    if {_PREFIX}plan is None:",
        "        " + slow.format(key=f"{_PREFIX}key"),
        f"    {_PREFIX}guard, {_PREFIX}select, {_PREFIX}launch, {_PREFIX}stream_of, {_PREFIX}device = {_PREFIX}plan",
        f"    if {_PREFIX}guard is not None and not {_PREFIX}guard():",
        "        " + slow.format(key=f"{_PREFIX}key"),
        f"    {_PREFIX}values = ({''.join(v + ', ' for v in values)})",
        f"    if {_PREFIX}select is not None:",
        f"        {_PREFIX}values = {_PREFIX}select({_PREFIX}values)",
        f"    if {_PREFIX}type({_PREFIX}grid) is {_PREFIX}tuple and {_PREFIX}len({_PREFIX}grid) == 1 \\",
        f"            and {_PREFIX}type({_PREFIX}grid[0]) is {_PREFIX}int \\",
        f"            and 0 < {_PREFIX}grid[0] <= 0x7FFFFFFF:",
        f"        {_PREFIX}launch(({_PREFIX}grid[0], 1, 1), {_PREFIX}stream_of({_PREFIX}device), {_PREFIX}values)",
        "        return",
        f"    if {_PREFIX}callable({_PREFIX}grid):",
        f"        {_PREFIX}grid = {_PREFIX}grid({_PREFIX}meta({all_values}, num_warps, num_stages))",
        f"    {_PREFIX}grid = {_PREFIX}normalize({_PREFIX}grid)",
        f"    if {_PREFIX}grid[0] and {_PREFIX}grid[1] and {_PREFIX}grid[2]:",
        f"        {_PREFIX}launch({_PREFIX}grid, {_PREFIX}stream_of({_PREFIX}device), {_PREFIX}values)",
    ])
    exec(compile(source, f"<launch entry of {name}>", "exec"), namespace)
    return namespace[name]


def picker(indices: tuple, count: int) -> Optional[Callable]:
    """A function that returns the items at `indices` of a sequence of `count` items as a tuple
    (None when that is every item, in order)."""
    if indices == tuple(range(count)):
        return None
    if len(indices) == 1:
        (index,) = indices
        return lambda values: (values[index],)
    if not indices:
        return lambda values: ()
    return operator.itemgetter(*indices)


def globals_guard(used_globals: tuple) -> Callable[[], bool]:
    """`GeneratedKernel.globals_unchanged` as a closure over its (table, name, object) triples; a
    plain loop is the cheapest form for the few globals a kernel reads."""
    def unchanged() -> bool:
        for table, name, obj in used_globals:
            if table.get(name, MISSING) is not obj:
                return False
        return True

    return unchanged


# ------------------------------------------------------------------------------------------------
# Prepared launches
# ------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def _prepared_factory(count: int, slots: tuple, checked: tuple, globals_read: int) -> Callable:
    """The factory of prepared launches of `count` runtime values. The launch takes one argument per
    entry of `slots`: the index of the runtime value it supplies (its data pointer), or None for an
    argument that must be None. `checked`: the arguments whose address must stay 16-byte aligned;
    `globals_read`: how many (globals dict, name, object) triples to check are still bound."""
    names = [f"t{i}" for i in range(len(slots))]
    items = [f"c{i}" for i in range(count)]
    for i, slot in enumerate(slots):
        if slot is not None:
            items[slot] = f"a{i}"
    constants = [f"c{i}" for i in range(count) if i not in slots]
    tests = [f"t{i} is not None" for i, slot in enumerate(slots) if slot is None]
    if checked:
        tests.append(f"({' | '.join(f'a{i}' for i in checked)}) & 15")
    tests += [f"g{i}.get(n{i}, M) is not o{i}" for i in range(globals_read)]
    lines = ["def factory(launch, stream_of, device_index, grid, constants, used_globals, fallback):"]
    if constants:
        lines.append(f"    {''.join(c + ', ' for c in constants)}= constants")
    if globals_read:
        lines.append(f"    {''.join(f'(g{i}, n{i}, o{i}), ' for i in range(globals_read))}= used_globals")
    lines += [
        f"    def prepared({', '.join(names)}):",
        *[f"        a{i} = t{i}.data_ptr()" for i, slot in enumerate(slots) if slot is not None],
    ]
    if tests:
        lines += [f"        if {' or '.join(tests)}:",
                  f"            return fallback({', '.join(names)})"]
    lines += [f"        launch(grid, stream_of(device_index), ({''.join(item + ', ' for item in items)}))",
              "    return prepared"]
    namespace: dict = {"M": MISSING}
    exec(compile("\n".join(lines), "<prepared launch>", "exec"), namespace)
    return namespace["factory"]


def make_prepared(launch: Callable, stream_of: Callable, device_index: int, grid: tuple, values: Sequence,
                  slots: Sequence[Optional[int]], checked: Sequence[int], used_globals: Sequence[tuple],
                  fallback: Callable) -> Callable:
    """`prepared(*tensors)`: `launch(grid, stream_of(device_index), values)` with `values[slots[i]]` the
    data pointer of `tensors[i]` (`tensors[i]` must be None where `slots[i]` is None); `fallback(*tensors)`
    instead when that does not hold, when a tensor in `checked` is not 16-byte aligned, or when a
    (globals dict, name, object) of `used_globals` (the globals the kernel read) is bound to another
    object now."""
    constants = tuple(value for i, value in enumerate(values) if i not in slots)
    factory = _prepared_factory(len(values), tuple(slots), tuple(checked), len(used_globals))
    return factory(launch, stream_of, device_index, grid, constants, tuple(used_globals), fallback)


class BoundedCache(dict):
    """A dict of at most `maxsize` entries: `put` evicts the oldest entry when full. Reads are plain
    dict reads (thread-safe under the GIL; a racing `put` at worst evicts one entry too many)."""

    def __init__(self, maxsize: int = 1024):
        super().__init__()
        self.maxsize = maxsize

    def put(self, key, value):
        if len(self) >= self.maxsize:
            try:
                del self[next(iter(self))]
            except (KeyError, StopIteration, RuntimeError):   # another thread changed it meanwhile
                pass
        self[key] = value
        return value
