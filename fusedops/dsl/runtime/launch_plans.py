"""The launches a launch key finds: generated plans, and prepared launches of fixed arguments.

- `make_plan(...)`: what a launch key (fast_path.py) finds: a function generated for the launch that
  checks the globals the kernel read, then packs the runtime values and calls cuLaunchKernel with the
  driver's statements inlined (kernel_launcher.inline_launch_statements: a call of the launcher's
  native stub, or struct.pack_into and cuda-python's cuLaunchKernel), so a cached launch is two Python
  calls (entry, plan) besides `kernel[grid]` itself.
- `make_prepared(...)`: a launch whose every argument but the tensors' addresses is fixed, for the
  library's launch wrappers, which cache one per (shapes, strides, dtypes, device, ...): the call
  reads the addresses, checks the 16-byte alignment the kernel was specialized on, that arguments
  given None then are None now and that the kernel's globals are still bound, and launches, packing
  only the addresses (its buffers hold the other values from the start).
  (The wrappers keep them in a `bounded_cache.BoundedCache`.)

Host cost (instructions per call counted by callgrind on the CPU, real cuda-python over a stand-in
libcuda whose cuLaunchKernel returns at once; .scratch/launch4_cpu.py): cuda-python's cuLaunchKernel
alone ~4.5k. Plans and prepared launches call the launcher's native stub (native_launch.py), which
converts, packs and launches in one builtin call (~1k), instead of struct.pack_into into a
thread-local buffer and cuda-python (~6.6k): a cached `kernel[(1,)](x, y, out, n, BLOCK=...)` ~16.2k
(21.6k through cuda-python, 28.7k before the plans and this entry), a prepared launch of it ~5.1k
(10.3k; 13.7k). The tensors' `data_ptr()`, `dtype` and `get_device()` cost ~1.9k each tensor; what
is left is Python bytecode and calls (`kernel[grid]`, the entry, the plan).
"""

from __future__ import annotations

import functools
import struct
from typing import Callable, Optional, Sequence

from .fast_path import MISSING, indented


def _globals_unpacking(count: int) -> str:
    # `(g0, n0, o0), ... = used_globals`: each (globals dict, name, object) a kernel read
    return f"{''.join(f'(g{i}, n{i}, o{i}), ' for i in range(count))}= used_globals"


def _globals_rebound(count: int) -> str:
    return " or ".join(f"g{i}.get(n{i}, M) is not o{i}" for i in range(count))


def _launch_statements(values: Sequence[str], grid: str, inline: Optional[tuple], native: bool = False) -> list:
    """Launch over `grid` (three comma-separated sizes) with `values` on the device's current stream:
    the driver's statements inlined (`inline`: the names they read; `native`: through the launcher's
    native stub, see native_launch.py), or a call of the launcher's `launch`."""
    lines = ["stream = stream_of(device_index)"]
    if inline:
        from .kernel_launcher import inline_launch_statements     # not at import: it loads llvmlite
        return lines + inline_launch_statements(values, grid, "stream", native)
    return lines + [f"launch(({grid}), stream, ({''.join(value + ', ' for value in values)}))"]


@functools.lru_cache(maxsize=256)
def _plan_factory(count: int, positions: tuple, globals_read: int, inline: Optional[tuple],
                  native: bool = False) -> Callable:
    """The factory of `make_plan`'s launches of `count` values of which those at `positions` are the
    kernel's runtime arguments, reading `globals_read` globals; `inline`: with the driver's
    statements inlined, the names they read (`parts` is the launcher's kernel_launcher.InlineLaunch);
    `native`: launching through its native stub."""
    names = [f"v{i}" for i in range(count)]
    body = []
    if globals_read:
        body += [f"if {_globals_rebound(globals_read)}:", "    return False"]
    body += _launch_statements([names[i] for i in positions], "grid_x, grid_y, grid_z", inline, native)
    body.append("return True")
    lines = ["def factory(launch, stream_of, device_index, used_globals, parts):"]
    if globals_read:
        lines.append("    " + _globals_unpacking(globals_read))
    if inline:
        lines.append(f"    {', '.join(inline)} = parts")
    lines += [f"    def plan({', '.join(['grid_x', 'grid_y', 'grid_z', *names])}):",
              *indented(body, 8),
              "    return plan"]
    namespace: dict = {"M": MISSING, "struct": struct}
    exec(compile("\n".join(lines), "<launch plan>", "exec"), namespace)
    return namespace["factory"]


def _inline_parts(launcher, values: Sequence, fixed: Optional[dict] = None):
    """The kernel_launcher.InlineLaunch of `launcher` (`fixed`: see KernelLauncher.inline), or None when its
    launch cannot be inlined."""
    from .kernel_launcher import KernelLauncher

    # Only a KernelLauncher's launch may be inlined: a wrapper (e.g. runtime.tensor_map's, which
    # appends arguments) forwards attribute reads to the launcher it wraps, so it is never asked.
    if not values or not isinstance(launcher, KernelLauncher):
        return None
    return launcher.inline(fixed)


def make_plan(launcher, device_index: int, count: int, positions: Sequence[int],
              used_globals: Sequence[tuple]) -> Callable:
    """The cached launch of one launch key: `plan(grid_x, grid_y, grid_z, *values) -> bool` launches
    the values at `positions` of the `count` values the generated entry computes (every non-constexpr
    argument, tensors as data pointers) with `launcher` on the current stream of device
    `device_index`, and returns True; or launches nothing and returns False when a (globals dict,
    name, object) of `used_globals` (the globals the kernel read) is bound to another object now.

    Raises:
        LaunchError: what `launcher.launch` raises.
    """
    positions = tuple(positions)
    parts = _inline_parts(launcher, positions)
    factory = _plan_factory(count, positions, len(used_globals), parts and parts._fields,
                            parts is not None and parts.native is not None)
    return factory(launcher.launch, launcher.stream_of, device_index, tuple(used_globals), parts)


@functools.lru_cache(maxsize=256)
def _prepared_factory(count: int, slots: tuple, checked: tuple, globals_read: int,
                      inline: Optional[tuple], native: bool = False) -> Callable:
    """The factory of prepared launches of `count` runtime values. The launch takes one argument per
    entry of `slots`: the index of the runtime value it supplies (its data pointer), or None for an
    argument that must be None. `checked`: the arguments whose address must stay 16-byte aligned;
    `globals_read`: how many (globals dict, name, object) triples to check are still bound;
    `inline`: with the driver's launch statements inlined, the names they read (`parts` is the
    launcher's kernel_launcher.InlineLaunch, whose buffers hold the constants: only the data pointers are
    packed); `native`: through its native stub, which takes every value (the constants too)."""
    names = [f"t{i}" for i in range(len(slots))]
    items = [f"c{i}" for i in range(count)]
    for i, slot in enumerate(slots):
        if slot is not None:
            items[slot] = f"a{i}"
    constants = [f"c{i}" for i in range(count) if i not in slots]
    tests = [f"t{i} is not None" for i, slot in enumerate(slots) if slot is None]
    if checked:
        tests.append(f"({' | '.join(f'a{i}' for i in checked)}) & 15")
    if globals_read:
        tests.append(_globals_rebound(globals_read))
    lines = ["def factory(launch, stream_of, device_index, grid, constants, used_globals, fallback, parts):",
             "    grid_x, grid_y, grid_z = grid"]
    if constants and (not inline or native):
        lines.append(f"    {''.join(c + ', ' for c in constants)}= constants")
    if globals_read:
        lines.append("    " + _globals_unpacking(globals_read))
    if inline:
        lines.append(f"    {', '.join(inline)} = parts")
    # a tensor slot given None or another object (no data_ptr), or a tensor without storage, takes the full
    # path, which binds it or raises naming its parameter
    fetches = [f"    a{i} = t{i}.data_ptr()" for i, slot in enumerate(slots) if slot is not None]
    body = ["try:", *fetches, "except (AttributeError, RuntimeError):", f"    return fallback({', '.join(names)})"] \
        if fetches else []
    if tests:
        body += [f"if {' or '.join(tests)}:", f"    return fallback({', '.join(names)})"]
    pointers = [items[slot] for slot in sorted(slot for slot in slots if slot is not None)]
    body += _launch_statements(pointers if inline and not native else items, "grid_x, grid_y, grid_z", inline,
                               native)
    lines += [f"    def prepared({', '.join(names)}):", *indented(body, 8), "    return prepared"]
    namespace: dict = {"M": MISSING, "struct": struct}
    exec(compile("\n".join(lines), "<prepared launch>", "exec"), namespace)
    return namespace["factory"]


def make_prepared(launcher, device_index: int, grid: tuple, values: Sequence, slots: Sequence[Optional[int]],
                  checked: Sequence[int], used_globals: Sequence[tuple], fallback: Callable) -> Callable:
    """`prepared(*tensors)`: `launcher.launch(grid, stream, values)` on the current stream of device
    `device_index`, with `values[slots[i]]` the data pointer of `tensors[i]` (`tensors[i]` must be
    None where `slots[i]` is None); `fallback(*tensors)` instead when that does not hold, when a
    tensor in `checked` is not 16-byte aligned, or when a (globals dict, name, object) of
    `used_globals` (the globals the kernel read) is bound to another object now.

    Raises:
        LaunchError: a value the kernel's parameter cannot take (naming it).
    """
    constants = tuple(value for i, value in enumerate(values) if i not in slots)
    pointers = [slot for slot in slots if slot is not None]
    parts = None
    if pointers:    # the constants are packed once, into each thread's buffer
        parts = _inline_parts(launcher, values, {i: value for i, value in enumerate(values) if i not in slots})
    factory = _prepared_factory(len(values), tuple(slots), tuple(checked), len(used_globals),
                                parts and parts._fields, parts is not None and parts.native is not None)
    return factory(launcher.launch, launcher.stream_of, device_index, grid, constants, tuple(used_globals),
                   fallback, parts)
