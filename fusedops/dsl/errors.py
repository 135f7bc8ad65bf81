"""Exception types of fusedops.dsl, one per kind of failure."""

from __future__ import annotations

from typing import Optional


class FusedOpsError(Exception):
    """Base class of every error fusedops raises on purpose."""


class CompilationError(FusedOpsError):
    """A kernel's source is not valid kernel-language code.

    The message names the file, line and column, shows the source line with a caret under the
    offending column, and says what to do instead.
    """

    def __init__(self, message: str, loc=None):
        self.message = message
        self.loc = loc
        super().__init__(self._render())

    def _render(self) -> str:
        loc = self.loc
        if loc is None or not getattr(loc, "file", None) or loc.line <= 0:
            return self.message
        text = f"{loc.file}:{loc.line}:{loc.col}: {self.message}"
        if loc.source:
            stripped = loc.source.rstrip("\n")
            text += f"\n    {stripped}\n    {' ' * loc.col}^"
        return text


class UnsupportedError(CompilationError):
    """Valid Python that the kernel language (or a target) does not support."""


class LaunchError(FusedOpsError):
    """A launch was asked for with arguments or a grid that cannot work, or the driver refused it."""


class InterpreterError(FusedOpsError):
    """The interpreter found a fault while running a kernel (e.g. an out-of-bounds access)."""

    def __init__(self, message: str, loc=None, program_id: Optional[tuple] = None):
        self.loc = loc
        self.program_id = program_id
        where = f"{loc}: " if loc is not None and getattr(loc, "line", 0) > 0 else ""
        pid = f" (program_id={program_id})" if program_id is not None else ""
        source = f"\n    {loc.source.strip()}" if loc is not None and getattr(loc, "source", "") else ""
        super().__init__(f"{where}{message}{pid}{source}")


class BackendError(FusedOpsError):
    """A back-end tool (LLVM, ptxas, the driver's JIT) rejected or could not handle generated code.

    This is almost always a compiler bug or a feature the target lacks, not a mistake in the
    kernel's source. `stage` names the step that failed ("parse", "verify", "codegen", "ptxas",
    ...), `arch` the target (e.g. "sm_90a"), and `artifact` holds the complete text that step was
    given (LLVM IR or PTX); the message itself shows only the relevant part of it.
    """

    def __init__(self, message: str, *, stage: str = "", arch: str = "", artifact: str = ""):
        self.stage = stage
        self.arch = arch
        self.artifact = artifact
        super().__init__(message)
