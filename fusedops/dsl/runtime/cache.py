"""The on-disk cache of compiled kernels (`$FUSEDOPS_CACHE_DIR`, default ~/.cache/fusedops).

An entry is one JSON file named by a SHA-256 of everything that changes the generated code: the
kernel's frontend IR (which covers its source, callees, constexprs and argument types; with comment
lines for what it does not show: device_assert locations, FUSEDOPS_LIBDEVICE_PATH and the sm_90a knobs), the
specialization hints of its arguments (divisibility by 16), the compile options (arch, num_warps, num_stages), the fusedops version, a hash of the
compiler's own source, and the llvmlite/LLVM version. Entries are written to a temporary file and renamed into place (atomic on
POSIX), so concurrent writers never leave a partial file; an entry that does not parse, or lacks a
field the compiler reads back (or holds one of another type), is treated as missing and rewritten.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import tempfile
from typing import Optional

from .knobs import current as current_knobs

_FORMAT = 1


@functools.cache
def compiler_fingerprint() -> str:
    """A hash of the compiler's own source (every file of fusedops/dsl): the compiler's version."""
    root = pathlib.Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_key(ir_text: str, arg_hints, options) -> str:
    import llvmlite

    from ... import __version__

    material = {
        "format": _FORMAT, "fusedops": __version__, "compiler": compiler_fingerprint(),
        "llvmlite": llvmlite.__version__,
        "arch": options.arch, "num_warps": options.num_warps, "num_stages": options.num_stages,
        "ir": ir_text, "arg_hints": [sorted((h or {}).items()) for h in arg_hints],
    }
    if getattr(options, "fp_fusion", False):    # (named only when on: the other kernels keep their keys)
        material["fp_fusion"] = True
    material = json.dumps(material, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()


def _directory() -> Optional[str]:
    knobs = current_knobs()
    if knobs.disable_cache:
        return None
    return os.path.expanduser(knobs.cache_dir)


def load(key: str) -> Optional[dict]:
    """The cached entry for `key`, or None (missing, disabled, or corrupt)."""
    directory = _directory()
    if directory is None:
        return None
    path = os.path.join(directory, key[:2], key + ".json")
    try:
        with open(path, encoding="utf-8") as f:
            entry = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError):     # RecursionError: JSON nested past the parser's depth
        return None
    return entry if _well_formed(entry) else None


def _well_formed(entry) -> bool:
    """An entry as `compiler.compile_function` stores it: the strings, integers and lists it reads back (an
    entry edited by hand or by another tool is treated as missing, not trusted): non-empty PTX, a cluster
    of at least one CTA, 0 to 32 producer warps, tensor map params that `TensorMapParam.from_json` reads back."""
    from .tensor_map import TensorMapParam

    def integer(value, least=0):
        return type(value) is int and value >= least

    def tensor_map(item):
        try:
            TensorMapParam.from_json(item)
        except ValueError:
            return False
        return True
    return (isinstance(entry, dict) and entry.get("format") == _FORMAT
            and all(isinstance(entry.get(field), str) for field in ("name", "ir", "llir", "ptx"))
            and bool(entry["ptx"]) and integer(entry.get("shared_bytes")) and integer(entry.get("cluster_size", 1), 1)
            and integer(entry.get("producer_warps", 0)) and entry.get("producer_warps", 0) <= 32
            and isinstance(entry.get("tensor_maps", []), list)
            and all(tensor_map(m) for m in entry.get("tensor_maps", [])))


def store(key: str, entry: dict) -> None:
    """Write `entry` atomically; failures (read-only disk, full disk) only lose the cache."""
    directory = _directory()
    if directory is None:
        return
    folder = os.path.join(directory, key[:2])
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(dict(entry, format=_FORMAT), f)
            os.replace(tmp, os.path.join(folder, key + ".json"))
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return
