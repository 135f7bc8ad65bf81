"""Finding and loading libdevice, NVIDIA's LLVM bitcode library of math functions (`__nv_expf`, ...).

Search order (the first hit wins):
1. `FUSEDOPS_LIBDEVICE_PATH` (through `fusedops.dsl.runtime.knobs`): a file, or a directory holding
   libdevice.10.bc. When set it must exist: a wrong setting is an error, not a silent fallback.
2. `$CUDA_HOME`, then `$CUDA_PATH`: `<root>/nvvm/libdevice/libdevice.10.bc`.
3. `/usr/local/cuda/nvvm/libdevice`, then `/usr/local/cuda-*/nvvm/libdevice` (newest version first).
4. pip wheels, through `cuda.pathfinder.locate_bitcode_lib("device")` when cuda-pathfinder is
   installed (it looks in nvidia/cu13/nvvm/libdevice and nvidia/cuda_nvcc/nvvm/libdevice in
   site-packages, then $CONDA_PREFIX).
"""

from __future__ import annotations

import functools
import glob
import os
import re
from pathlib import Path
from typing import Optional

from llvmlite import binding as llvm

from fusedops.dsl.errors import BackendError

LIBDEVICE_FILENAME = "libdevice.10.bc"
_RELATIVE_DIR = Path("nvvm") / "libdevice"


def _toolkit_version_key(path: str) -> tuple:
    # "/usr/local/cuda-12.10" sorts after "/usr/local/cuda-12.9".
    return tuple(int(part) for part in re.findall(r"\d+", Path(path).name))


def _candidates(environ) -> list[tuple[str, Path]]:
    candidates = []
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        root = environ.get(variable, "").strip()
        if root:
            candidates.append((f"${variable}", Path(root) / _RELATIVE_DIR / LIBDEVICE_FILENAME))
    candidates.append(("/usr/local/cuda", Path("/usr/local/cuda") / _RELATIVE_DIR / LIBDEVICE_FILENAME))
    for root in sorted(glob.glob("/usr/local/cuda-*"), key=_toolkit_version_key, reverse=True):
        candidates.append((root, Path(root) / _RELATIVE_DIR / LIBDEVICE_FILENAME))
    return candidates


def _from_pip_wheels() -> tuple[Optional[Path], str]:
    try:
        from cuda import pathfinder
    except ImportError:
        return None, "cuda-pathfinder is not installed"
    try:
        return Path(pathfinder.locate_bitcode_lib("device").abs_path), ""
    except Exception as error:  # BitcodeLibNotFoundError, or an older pathfinder without the call
        return None, f"cuda.pathfinder: {str(error).splitlines()[0]}"


def find_libdevice(environ=None) -> Path:
    """The path of libdevice.10.bc, searched in the order of the module docstring.

    Raises:
        BackendError: FUSEDOPS_LIBDEVICE_PATH names a missing file, or no libdevice was found
            anywhere; the message lists every place that was tried.
    """
    from fusedops.dsl.runtime import knobs

    environ = os.environ if environ is None else environ
    configured = knobs.current(environ).libdevice_path
    if configured is not None:
        path = configured / LIBDEVICE_FILENAME if configured.is_dir() else configured
        if not path.is_file():
            raise BackendError(f"FUSEDOPS_LIBDEVICE_PATH={configured} but {path} is not a file; point it at "
                               f"{LIBDEVICE_FILENAME} or unset it to search the CUDA installation",
                               stage="libdevice")
        return path
    tried = []
    for origin, path in _candidates(environ):
        if path.is_file():
            return path
        tried.append(f"{path} ({origin})")
    path, reason = _from_pip_wheels()
    if path is not None and path.is_file():
        return path
    tried.append(reason or "pip wheels")
    raise BackendError(f"cannot find {LIBDEVICE_FILENAME} (needed for math functions such as exp and log). "
                       "Install the CUDA toolkit or the pip package nvidia-cuda-nvcc (cuda-toolkit[nvcc]), "
                       "or set FUSEDOPS_LIBDEVICE_PATH. Tried:\n  " + "\n  ".join(tried),
                       stage="libdevice")


@functools.cache
def libdevice_bitcode(path: Path) -> bytes:
    """The bytes of the libdevice file at `path`, read once per process and path."""
    return Path(path).read_bytes()


def load_libdevice(path: Optional[Path] = None) -> llvm.ModuleRef:
    """A freshly parsed libdevice module (from `find_libdevice()` when `path` is None).

    Each call parses again (about 70 ms): linking consumes the module, and `ModuleRef.clone()`
    of a cached parse measured as slow as parsing. Only the file's bytes are cached. The caller
    sets the triple and data layout to match the module it links into.

    Raises:
        BackendError: libdevice is missing, or the file is not valid LLVM bitcode.
    """
    path = find_libdevice() if path is None else Path(path)
    try:
        return llvm.parse_bitcode(libdevice_bitcode(path))
    except (OSError, RuntimeError) as error:
        raise BackendError(f"cannot load libdevice from {path}: {error}", stage="libdevice") from error
