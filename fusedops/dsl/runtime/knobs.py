"""Every environment setting of fusedops, in one typed place.

`current()` reads the environment each time it is called and returns a frozen `Knobs`; nothing is
read at import, so a test (or a user) that changes a variable sees the change on the next call.
The settings that change generated code (FUSEDOPS_TMA, FUSEDOPS_DISABLE_WGMMA, FUSEDOPS_DEFAULT_ARCH)
apply to the kernels compiled after the change: a JIT function keeps the specializations it already
compiled in memory (the disk cache keys them apart). The library matmul reads FUSEDOPS_TMA per call.
Code that needs a setting takes it from `current()` (or from a `Knobs` passed down to it), never
from `os.environ` directly.

| variable                | field           | type / default                                          |
|-------------------------|-----------------|---------------------------------------------------------|
| FUSEDOPS_INTERPRET      | interpret       | bool, False: run kernels in the NumPy interpreter       |
| FUSEDOPS_CACHE_DIR      | cache_dir       | Path, ~/.cache/fusedops: on-disk kernel cache (*)       |
| FUSEDOPS_DISABLE_CACHE  | disable_cache   | bool, False: neither read nor write the disk cache      |
| FUSEDOPS_DUMP_IR        | dump_ir         | bool, False: print the IR after each pass               |
| FUSEDOPS_DUMP_DIR       | dump_dir        | Path or None: write the dumps there instead of stderr   |
| FUSEDOPS_DEFAULT_ARCH   | default_arch    | "sm_<N>[a]" or None (= detect from the current device)  |
| FUSEDOPS_LIBDEVICE_PATH | libdevice_path  | Path or None (= search the CUDA installation)           |
| FUSEDOPS_DISABLE_WGMMA  | disable_wgmma   | bool, False: dots on sm_90a use mma.sync, not wgmma     |
| FUSEDOPS_TMA            | tma             | bool, True: tensor-descriptor loads feeding wgmma use TMA  |
| FUSEDOPS_WS             | ws              | int 0/1/2, 0: how a TMA ring's K loop synchronizes      |
| FUSEDOPS_NATIVE_LAUNCH  | native_launch   | bool, True: cached launches go through native stubs     |
| FUSEDOPS_STREAM_K       | stream_k        | bool, True: the TMA matmul splits a partial last wave   |
| FUSEDOPS_PERSISTENT     | persistent      | bool, True: TMA matmuls of several waves run persistent |

FUSEDOPS_WS (sm_90a TMA rings, passes/pipelining.py): 0 = one CTA barrier per K step before thread 0
refills the slot (the shipped schedule); 1 = per-stage "empty" mbarriers that every warp arrives on
once its wgmma reading the stage retired, thread 0 waiting on them before it refills (no CTA barrier
in the loop, one more stage in flight; rings filled by multicast copies keep 0's schedule, with a
cluster barrier); 2 = 1's barriers with a producer warpgroup: 4 more warps in the CTA, whose first lane
issues every copy of
the ring, waiting on the empty barriers itself, and the num_warps consumer warps only wait for full
slots and release them (where the loop qualifies: passes/_pipelining_warp_specialized.py
`producer_warp_fits`; else as 1). Part of the compile cache key.

(*) Where no home directory is known (HOME unset or empty and the user id without an entry in the password
database, as in a container run under an arbitrary uid) and FUSEDOPS_CACHE_DIR is unset, cache_dir is None and
disable_cache True: kernels compile in every process, nothing is written (rather than to a "~" under the working
directory). A path variable starting with ~ then raises the ValueError below.

Booleans accept 1/true/yes/on and 0/false/no/off (any case; empty means False, unset the default above). Any
other value raises `ValueError` naming the variable, so a typo is loud instead of ignored.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from pathlib import Path
from typing import Callable, Mapping, Optional

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
_ARCH = re.compile(r"sm_[0-9]{2,3}a?")


def _parse_bool(variable: str, text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{variable}={text!r} is not a boolean; use 1/0, true/false, yes/no or on/off")


def _parse_path(variable: str, text: str) -> Optional[Path]:
    text = text.strip()
    if not text:
        return None
    try:
        return Path(text).expanduser()
    except RuntimeError:    # "~/..." where no home directory is known (pathlib: "Could not determine home directory")
        raise ValueError(f"{variable}={text!r} starts with ~, whose home directory is not known (HOME unset, no "
                         "entry in the password database); give an absolute path") from None


def _parse_arch(variable: str, text: str) -> Optional[str]:
    value = text.strip().lower()
    if not value:
        return None
    if not _ARCH.fullmatch(value):
        raise ValueError(f"{variable}={text!r} is not a GPU architecture; use a name like sm_80, sm_90 or sm_90a")
    return value


def _parse_ws(variable: str, text: str) -> int:
    value = text.strip()
    if value in ("", "0", "1", "2"):
        return int(value or 0)
    raise ValueError(f"{variable}={text!r} is not a K-loop synchronization mode; use 0 (a CTA barrier per "
                     "step), 1 (per-stage empty mbarriers) or 2 (a producer warpgroup)")


def _knob(variable: str, parse: Callable[[str, str], object], default):
    """A dataclass field read from `variable` with `parse(variable, text)`; `default` when unset."""
    return dataclasses.field(default=default, metadata={"variable": variable, "parse": parse})


def _default_cache_dir(home: Optional[str]) -> Optional[Path]:
    """~/.cache/fusedops under `home` (the HOME variable), else under the user's home directory in the password
    database; None where neither is an absolute path (HOME unset or empty and a user id without an entry, as in a
    container run under an arbitrary uid): there is no default cache directory then."""
    if home:
        return Path(home) / ".cache" / "fusedops"
    try:
        import pwd

        home = pwd.getpwuid(os.getuid()).pw_dir
    except (ImportError, KeyError, AttributeError):     # (no pwd on Windows: USERPROFILE)
        home = os.path.expanduser("~")
    return Path(home) / ".cache" / "fusedops" if home and os.path.isabs(home) else None


@dataclasses.dataclass(frozen=True)
class Knobs:
    """The settings in force; see the module docstring for the variables behind each field."""

    interpret: bool = _knob("FUSEDOPS_INTERPRET", _parse_bool, False)
    cache_dir: Optional[Path] = _knob("FUSEDOPS_CACHE_DIR", _parse_path, None)  # None -> _default_cache_dir(HOME)
    disable_cache: bool = _knob("FUSEDOPS_DISABLE_CACHE", _parse_bool, False)
    dump_ir: bool = _knob("FUSEDOPS_DUMP_IR", _parse_bool, False)
    dump_dir: Optional[Path] = _knob("FUSEDOPS_DUMP_DIR", _parse_path, None)
    default_arch: Optional[str] = _knob("FUSEDOPS_DEFAULT_ARCH", _parse_arch, None)
    libdevice_path: Optional[Path] = _knob("FUSEDOPS_LIBDEVICE_PATH", _parse_path, None)
    disable_wgmma: bool = _knob("FUSEDOPS_DISABLE_WGMMA", _parse_bool, False)
    tma: bool = _knob("FUSEDOPS_TMA", _parse_bool, True)
    ws: int = _knob("FUSEDOPS_WS", _parse_ws, 0)
    native_launch: bool = _knob("FUSEDOPS_NATIVE_LAUNCH", _parse_bool, True)
    stream_k: bool = _knob("FUSEDOPS_STREAM_K", _parse_bool, True)
    persistent: bool = _knob("FUSEDOPS_PERSISTENT", _parse_bool, True)

    def __post_init__(self) -> None:
        # The home directory is looked up when the settings are built, not at import; without one (and without
        # FUSEDOPS_CACHE_DIR) there is no disk cache: cache_dir stays None and disable_cache is True.
        if self.cache_dir is None:
            object.__setattr__(self, "cache_dir", _default_cache_dir(os.environ.get("HOME")))
            if self.cache_dir is None:
                object.__setattr__(self, "disable_cache", True)


def current(environ: Optional[Mapping[str, str]] = None) -> Knobs:
    """Read the settings from `environ` (default: `os.environ`) now.

    Reading is cheap (launches read it): the raw values are looked up every call and their parse is
    memoized by value, so a changed variable is seen on the next call.

    Raises:
        ValueError: a variable is set to a value its type does not accept (the message names it).
    """
    environ = os.environ if environ is None else environ
    raw = tuple(environ.get(variable) for _, variable, _ in _FIELDS)
    return _parse(raw, environ.get("HOME"))


def interpret_enabled() -> bool:
    """`current().interpret`, reading only FUSEDOPS_INTERPRET (the launch path asks this every call)."""
    return _read_bool("FUSEDOPS_INTERPRET", False)


def tma_enabled() -> bool:
    """`current().tma`, reading only FUSEDOPS_TMA (the matmul wrappers ask this every call)."""
    return _read_bool("FUSEDOPS_TMA", True)


def native_launch_enabled() -> bool:
    """`current().native_launch`, reading only FUSEDOPS_NATIVE_LAUNCH (asked once per kernel launcher,
    runtime/native_launch.py)."""
    return _read_bool("FUSEDOPS_NATIVE_LAUNCH", True)


def stream_k_enabled() -> bool:
    """`current().stream_k`, reading only FUSEDOPS_STREAM_K (the library matmul asks this every call:
    kernels/matmul_stream_k.py)."""
    return _read_bool("FUSEDOPS_STREAM_K", True)


def persistent_enabled() -> bool:
    """`current().persistent`, reading only FUSEDOPS_PERSISTENT (the library matmul asks this every call:
    kernels/matmul_persistent.py)."""
    return _read_bool("FUSEDOPS_PERSISTENT", True)


def _read_bool(variable: str, default: bool) -> bool:
    """The boolean `variable` of os.environ (`default` when unset), for the per-call readers above.

    `os.environ.get` of an unset variable costs about 1 us (it raises and catches KeyError twice).
    CPython's `os.environ` keeps its encoded values in a dict, `_data`, which every change made
    through `os.environ` updates: reading that dict costs under 0.1 us. Any other `os.environ`
    (one replaced by a plain mapping) is read through `.get`.
    """
    environ = os.environ
    data = getattr(environ, "_data", None)
    if type(data) is not dict:
        text = environ.get(variable)
    else:
        raw = data.get(_encoded_key(variable))
        text = None if raw is None else environ.decodevalue(raw)
    return default if text is None else _parse_bool_memo(variable, text)


@functools.lru_cache(maxsize=16)
def _encoded_key(variable: str):
    # The variable as a key of os.environ._data (bytes on POSIX, upper-case str on Windows).
    return os.environ.encodekey(variable)


@functools.lru_cache(maxsize=32)
def _parse_bool_memo(variable: str, text: str) -> bool:
    return _parse_bool(variable, text)


@functools.lru_cache(maxsize=64)
def _parse(raw: tuple, home: Optional[str]) -> Knobs:
    # `home` is part of the memo key because the default cache directory is under it.
    values = {}
    for (name, variable, parse), text in zip(_FIELDS, raw):
        if text is not None:
            values[name] = parse(variable, text)
    if values.get("cache_dir") is None:     # the default, under `home` (what the memo is keyed by)
        values["cache_dir"] = _default_cache_dir(home)
        if values["cache_dir"] is None:
            values["disable_cache"] = True
    return Knobs(**values)


_FIELDS = tuple((field.name, field.metadata["variable"], field.metadata["parse"])
                for field in dataclasses.fields(Knobs))


def variables() -> tuple[str, ...]:
    """The names of all environment variables fusedops reads, in field order."""
    return tuple(field.metadata["variable"] for field in dataclasses.fields(Knobs))
