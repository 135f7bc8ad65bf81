"""LLVM IR text -> optimized LLVM IR + PTX, with llvmlite.binding and LLVM's NVPTX back end.

Pipeline of `compile_to_ptx` (TOOLCHAIN.md sections 1 and 5 give the measurements behind it):
parse -> set triple and data layout -> verify -> link libdevice if the module calls `__nv_*`
functions, internalizing everything libdevice brought in -> new-pass-manager O3 -> guard against
intrinsics that make LLVM kill the process -> emit PTX.

LLVM reports some problems by exiting the process instead of raising ("LLVM ERROR: ..."). This
module prevents the ones it can see: a PTX version below the arch's minimum (rejected by `Target`)
and math intrinsics NVPTX cannot lower (rejected by `_reject_unlowerable_intrinsics`). Arch-gated
nvvm intrinsics ("Cannot select") must be gated by the code generator.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import Optional

from llvmlite import binding as llvm

from fusedops.dsl.errors import BackendError
from fusedops.dsl.target import libdevice

TRIPLE = "nvptx64-nvidia-cuda"
SUPPORTED_ARCHS = ("sm_80", "sm_90", "sm_90a")
# The lowest PTX ISA version LLVM 22 accepts for each arch; a lower one aborts the process.
MIN_PTX_VERSION = {"sm_80": 70, "sm_90": 78, "sm_90a": 80}
# Every `+ptxNN` feature LLVM 22.1 knows (others print a warning and are ignored); ptxas 13.0 and
# the CUDA 13.0 driver accept up to 9.0.
KNOWN_PTX_VERSIONS = tuple(range(70, 79)) + tuple(range(80, 89)) + (90,)
# 8.4: enough for red.global.v4.f32 (8.1); JIT-loadable by drivers of CUDA 12.4 and later.
DEFAULT_PTX_VERSION = 84


@dataclasses.dataclass(frozen=True)
class Target:
    """A GPU architecture to compile for and the PTX ISA version to emit.

    arch: "sm_80" (A100, and forward-compatible PTX for sm_86/sm_89), "sm_90" (Hopper without the
        arch-specific instructions), or "sm_90a" (Hopper with wgmma, setmaxnreg; runs on CC 9.0
        only).
    ptx_version: major * 10 + minor (84 means PTX ISA 8.4); None picks
        max(DEFAULT_PTX_VERSION, the arch's minimum).

    Raises:
        ValueError: unknown arch (the message lists the supported ones), or a PTX version LLVM does
            not know or that is below the arch's minimum.
    """

    arch: str
    ptx_version: Optional[int] = None

    def __post_init__(self) -> None:
        if self.arch not in SUPPORTED_ARCHS:
            raise ValueError(f"unsupported GPU architecture {self.arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}")
        minimum = MIN_PTX_VERSION[self.arch]
        if self.ptx_version is None:
            object.__setattr__(self, "ptx_version", max(DEFAULT_PTX_VERSION, minimum))
        version = self.ptx_version
        if isinstance(version, bool) or not isinstance(version, int) or version not in KNOWN_PTX_VERSIONS:
            known = ", ".join(f"{v // 10}.{v % 10}" for v in KNOWN_PTX_VERSIONS)
            raise ValueError(f"unknown PTX version {version!r} (write 8.4 as 84); LLVM knows {known}")
        if version < minimum:
            raise ValueError(f"{self.arch} needs PTX >= {minimum // 10}.{minimum % 10}, got "
                             f"{version // 10}.{version % 10}")

    @classmethod
    def from_capability(cls, major: int, minor: int, ptx_version: Optional[int] = None) -> "Target":
        """The best supported target for a device of compute capability `major.minor`.

        9.0 -> sm_90a; other 9.x and newer -> sm_90 (its PTX is JIT-compiled forward by the
        driver; arch-specific sm_90a code would not load there); 8.x -> sm_80.

        Raises:
            ValueError: compute capability below 8.0.
        """
        if (major, minor) == (9, 0):
            return cls("sm_90a", ptx_version)
        if major >= 9:
            return cls("sm_90", ptx_version)
        if major == 8:
            return cls("sm_80", ptx_version)
        raise ValueError(f"compute capability {major}.{minor} is not supported; fusedops needs 8.0 or newer")

    @property
    def capability(self) -> tuple:
        """(major, minor) compute capability the arch names, e.g. (9, 0)."""
        digits = self.arch[3:].rstrip("a")
        return int(digits[:-1]), int(digits[-1])

    @property
    def features(self) -> str:
        """The LLVM target-feature string, e.g. "+ptx84"."""
        return f"+ptx{self.ptx_version}"

    def requiring_ptx(self, version: int) -> "Target":
        """This target, with its PTX version raised to at least `version` (for features that need it)."""
        return self if self.ptx_version >= version else Target(self.arch, version)


@dataclasses.dataclass(frozen=True)
class CompiledPTX:
    """Result of `compile_to_ptx`: the optimized LLVM IR, the PTX, and its `.entry` names."""

    llir: str
    ptx: str
    target: Target
    entry_names: tuple


@functools.cache
def _initialize_llvm() -> None:
    # One-time LLVM registration (llvm.initialize() itself is deprecated and raises in 0.50).
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()


def _hold_llvm_across_fork() -> None:
    """Make os.fork wait for the LLVM call another thread has in flight. llvmlite runs every call into LLVM under
    one process-wide lock, and every module is parsed into LLVM's one global context: a fork during a compile in
    another thread left the child that lock held by a thread it does not have (its first compile waited for ever)
    and LLVM's state half updated. The forking thread takes the lock before the fork and releases it in both
    processes (jit.py resets the kernels' own compile locks in the child)."""
    lock = getattr(getattr(getattr(getattr(llvm, "ffi", None), "lib", None), "_lock", None), "_lock", None)
    if lock is not None and hasattr(os, "register_at_fork"):      # llvmlite's _LLVMLock wraps an RLock
        os.register_at_fork(before=lock.acquire, after_in_parent=lock.release, after_in_child=lock.release)


_hold_llvm_across_fork()


def _target_machine(target: Target, opt_level: int) -> llvm.TargetMachine:
    # Created per compilation (0.35 ms): llvmlite releases the GIL inside LLVM, and a
    # TargetMachine shared between threads compiling at once would not be safe.
    _initialize_llvm()
    return llvm.Target.from_triple(TRIPLE).create_target_machine(cpu=target.arch, features=target.features,
                                                                opt=opt_level)


_LINE_COLUMN = re.compile(r"<string>:(\d+):(\d+)")
_EXCERPT_CONTEXT = 8
_HEAD_LINES = 40


def _numbered(lines: list, start: int, stop: int, mark: Optional[int] = None, column: int = 0) -> list:
    out = []
    for index in range(max(start, 0), min(stop, len(lines))):
        out.append(f"{index + 1:5d}{'>' if index == mark else ' '} {lines[index]}")
        if index == mark and column > 0:
            out.append(" " * (6 + column) + "^")
    return out


def ir_excerpt(ir_text: str, error_text: str) -> str:
    """The part of `ir_text` an LLVM error message points at, with line numbers.

    Uses the `<string>:LINE:COL` of parse errors, else the first instruction quoted by a verifier
    message, else the first lines of the module.
    """
    lines = ir_text.splitlines()
    match = _LINE_COLUMN.search(error_text)
    mark, column = None, 0
    if match:
        mark, column = int(match.group(1)) - 1, int(match.group(2))
    else:
        quoted = [line.strip() for line in error_text.splitlines()[1:] if line.startswith("  ") and line.strip()]
        for index, line in enumerate(lines):
            if quoted and line.strip() == quoted[0]:
                mark = index
                break
    if mark is not None:
        body = _numbered(lines, mark - _EXCERPT_CONTEXT, mark + _EXCERPT_CONTEXT + 1, mark, column)
    else:
        body = _numbered(lines, 0, _HEAD_LINES)
    if len(lines) > len(body):
        body.append(f"      ... ({len(lines)} lines in all; the full text is in the exception's .artifact)")
    return "\n".join(body)


def _backend_error(stage: str, target: Target, error: Exception, ir_text: str) -> BackendError:
    detail = str(error).strip()
    message = (f"LLVM {stage} failed for {target.arch} (PTX {target.ptx_version // 10}.{target.ptx_version % 10}):"
               f"\n{detail}\n--- LLVM IR ---\n{ir_excerpt(ir_text, detail)}")
    return BackendError(message, stage=stage, arch=target.arch, artifact=ir_text)


def _calls_libdevice(module: llvm.ModuleRef) -> bool:
    return any(f.is_declaration and f.name.startswith("__nv_") for f in module.functions)


def _link_libdevice(module: llvm.ModuleRef) -> None:
    """Link libdevice into `module` and give everything it brought internal linkage.

    Internal linkage lets O3 inline the functions used and delete the other ~570; without it
    the PTX holds all of libdevice (21 000 lines instead of ~40, TOOLCHAIN.md section 1).
    """
    defined_before = {f.name for f in module.functions if not f.is_declaration}
    globals_before = {g.name for g in module.global_variables}
    library = libdevice.load_libdevice()
    library.triple = module.triple
    library.data_layout = module.data_layout
    module.link_in(library)
    for function in module.functions:
        if not function.is_declaration and function.name not in defined_before:
            function.linkage = llvm.Linkage.internal
    for variable in module.global_variables:
        if variable.name not in globals_before and not variable.is_declaration:
            variable.linkage = llvm.Linkage.internal


_NO_LOWERING = re.compile(r"llvm\.(exp|exp10|log|log2|log10|tan|pow|powi|sinh|cosh|asin|acos|atan|atan2)\.")
_NEEDS_AFN = re.compile(r"llvm\.(sin|cos|tanh)\.")
# A call whose fast-math flags (between "call" and the type) include afn or fast.
_APPROX_CALL = re.compile(r"\bcall(?:\s+(?:nnan|ninf|nsz|arcp|contract|reassoc))*\s+(?:afn|fast)\b")


def _reject_unlowerable_intrinsics(module: llvm.ModuleRef, target: Target, ir_text: str) -> None:
    """Raise instead of letting NVPTX kill the process on math intrinsics it cannot lower.

    llvm.exp/log/... (any type) and llvm.exp2 on f64 have no NVPTX lowering ("no libcall
    available", exit code 1); llvm.sin/cos/tanh lower only with the `afn` flag and not for f64
    ("Cannot select"). Use ex2/lg2 with scaling or libdevice's __nv_* functions instead.
    """
    bad = []
    approx = []
    for function in module.functions:
        if not function.is_declaration:
            continue
        name = function.name
        if _NO_LOWERING.match(name) or (name.startswith("llvm.exp2.") and "f64" in name):
            bad.append(name)
        elif _NEEDS_AFN.match(name):
            if "f64" in name:
                bad.append(name)
            else:
                approx.append(name)
    if approx:
        for function in module.functions:
            for block in function.blocks:
                for instruction in block.instructions:
                    if instruction.opcode != "call":
                        continue
                    text = str(instruction)
                    if any(f"@{name}(" in text for name in approx) and not _APPROX_CALL.search(text):
                        bad.append(f"{text.strip()}  (needs the afn flag)")
    if bad:
        raise BackendError(f"LLVM cannot lower these for {target.arch} (it would abort the process): "
                           + "; ".join(sorted(set(bad))) + ". Use ex2/lg2-based math or libdevice __nv_* functions.",
                           stage="codegen", arch=target.arch, artifact=ir_text)


_ENTRY = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([\w$.]+)", re.MULTILINE)


def compile_to_ptx(llvm_ir_text: str, target: Target, *, opt_level: int = 3,
                   link_libdevice: bool = True) -> CompiledPTX:
    """Optimize LLVM IR for `target` and emit PTX.

    llvm_ir_text: a module as text (str(ir.Module)); kernels carry the `ptx_kernel` calling
        convention. Its triple and data layout are replaced by NVPTX's.
    opt_level: 0-3, for both the pass pipeline and the back end (0 also loses vectorized and .nc
        loads).
    link_libdevice: link libdevice when the module declares `__nv_*` functions.

    Raises:
        BackendError: the IR does not parse or verify (message: the LLVM error, the arch and the
            lines of IR around the error; `.artifact` is the whole IR), libdevice is missing, an
            intrinsic cannot be lowered, or emission fails.
        ValueError: opt_level outside 0-3.
    """
    if opt_level not in (0, 1, 2, 3):
        raise ValueError(f"opt_level must be 0, 1, 2 or 3, got {opt_level!r}")
    machine = _target_machine(target, opt_level)
    try:
        module = llvm.parse_assembly(llvm_ir_text)
    except RuntimeError as error:
        raise _backend_error("parse", target, error, llvm_ir_text) from None
    module.triple = TRIPLE
    module.data_layout = str(machine.target_data)
    try:
        module.verify()
    except RuntimeError as error:
        raise _backend_error("verify", target, error, llvm_ir_text) from None
    if link_libdevice and _calls_libdevice(module):
        _link_libdevice(module)
    tuning = llvm.create_pipeline_tuning_options(speed_level=opt_level)
    pass_builder = llvm.create_pass_builder(machine, tuning)
    pass_builder.getModulePassManager().run(module, pass_builder)
    optimized = str(module)
    _reject_unlowerable_intrinsics(module, target, optimized)
    try:
        ptx = machine.emit_assembly(module)
    except RuntimeError as error:
        raise _backend_error("codegen", target, error, optimized) from None
    return CompiledPTX(llir=optimized, ptx=ptx, target=target, entry_names=tuple(_ENTRY.findall(ptx)))
