"""PTX -> cubin with NVIDIA's `ptxas`, resource usage from `ptxas -v`, and SASS listings.

`ptxas` is optional: the driver can JIT PTX itself. It is used to check generated PTX in CPU-only
CI, to report registers/spills/shared memory, and to build cubins that do not depend on the
driver's PTX JIT version.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

from fusedops.dsl.errors import BackendError

PTXAS_TIMEOUT_S = 120
_DISASSEMBLER_TIMEOUT_S = 60


def _find_tool(name: str) -> Optional[str]:
    found = shutil.which(name)
    if found:
        return found
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(variable, "").strip()
        if root and (Path(root) / "bin" / name).is_file():
            return str(Path(root) / "bin" / name)
    try:
        from cuda import pathfinder

        return pathfinder.find_nvidia_binary_utility(name)
    except Exception:  # not installed, or an older pathfinder without this call
        return None


@functools.cache
def find_ptxas() -> Optional[str]:
    """The path of `ptxas` (PATH, then $CUDA_HOME/$CUDA_PATH bin, then pip wheels), or None."""
    return _find_tool("ptxas")


def ptxas_available() -> bool:
    """True when a `ptxas` executable can be found."""
    return find_ptxas() is not None


@dataclasses.dataclass(frozen=True)
class AssembleResult:
    """A cubin and the resources ptxas reported for it.

    When the PTX holds several entry functions, registers / spill_bytes / shared_bytes are the
    maxima over them; `log` is ptxas's full `-v` output.

    cubin: the ELF image, loadable with cuModuleLoadData.
    registers: 32-bit registers per thread.
    spill_bytes: bytes of spill stores per thread (local-memory traffic caused by register
        pressure; 0 is the goal).
    shared_bytes: static shared memory per CTA (dynamic shared memory is not included).
    """

    cubin: bytes
    registers: int
    spill_bytes: int
    shared_bytes: int
    log: str


_REGISTERS = re.compile(r"Used (\d+) registers")
_SPILL_STORES = re.compile(r"(\d+) bytes spill stores")
_SHARED = re.compile(r"(\d+) bytes smem")


def _max_of(pattern: re.Pattern, log: str) -> int:
    return max((int(value) for value in pattern.findall(log)), default=0)


def assemble(ptx: str, arch: str, *, options: tuple = (), timeout_s: float = PTXAS_TIMEOUT_S) -> AssembleResult:
    """Run `ptxas -arch=<arch> -v` on `ptx` in a temporary directory.

    options: extra ptxas flags, e.g. ("-O0",) or ("--maxrregcount=128",).

    Raises:
        BackendError: ptxas is missing, fails (the message holds its log and the PTX lines it
            complains about), or runs longer than `timeout_s`.
    """
    executable = find_ptxas()
    if executable is None:
        raise BackendError("ptxas was not found on PATH, in $CUDA_HOME/bin or in pip wheels; install the CUDA "
                           "toolkit or nvidia-cuda-nvcc", stage="ptxas", arch=arch, artifact=ptx)
    with tempfile.TemporaryDirectory(prefix="fusedops-ptxas-") as directory:
        source = Path(directory) / "kernel.ptx"
        output = Path(directory) / "kernel.cubin"
        source.write_text(ptx)
        command = [executable, f"-arch={arch}", "-v", *options, str(source), "-o", str(output)]
        try:
            completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise BackendError(f"ptxas ran longer than {timeout_s} s for {arch}", stage="ptxas", arch=arch,
                               artifact=ptx) from None
        log = (completed.stdout + completed.stderr).replace(str(source), "kernel.ptx")
        if completed.returncode != 0 or not output.is_file():
            raise BackendError(f"ptxas failed for {arch} (exit code {completed.returncode}):\n{log.strip()}"
                               f"{_ptx_excerpt(ptx, log)}", stage="ptxas", arch=arch, artifact=ptx)
        cubin = output.read_bytes()
    return AssembleResult(cubin=cubin, registers=_max_of(_REGISTERS, log), spill_bytes=_max_of(_SPILL_STORES, log),
                          shared_bytes=_max_of(_SHARED, log), log=log)


_PTX_LINE = re.compile(r"kernel\.ptx, line (\d+)")


def _ptx_excerpt(ptx: str, log: str) -> str:
    # ptxas errors read "ptxas kernel.ptx, line 42; error : ...": show the lines around the first.
    match = _PTX_LINE.search(log)
    if not match:
        return ""
    lines = ptx.splitlines()
    mark = int(match.group(1)) - 1
    shown = [f"{i + 1:5d}{'>' if i == mark else ' '} {lines[i]}"
             for i in range(max(mark - 5, 0), min(mark + 6, len(lines)))]
    return "\n--- PTX ---\n" + "\n".join(shown)


def sass(cubin: bytes) -> Optional[str]:
    """The SASS (machine code) listing of `cubin`, via `cuobjdump -sass` or `nvdisasm`; None when
    neither tool is installed or both fail."""
    with tempfile.TemporaryDirectory(prefix="fusedops-sass-") as directory:
        path = Path(directory) / "kernel.cubin"
        path.write_bytes(cubin)
        for tool, flags in (("cuobjdump", ["-sass"]), ("nvdisasm", ["-c"])):
            executable = _find_tool(tool)
            if executable is None:
                continue
            try:
                completed = subprocess.run([executable, *flags, str(path)], capture_output=True, text=True,
                                           timeout=_DISASSEMBLER_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                continue
            if completed.returncode == 0 and completed.stdout.strip():
                return completed.stdout
    return None
