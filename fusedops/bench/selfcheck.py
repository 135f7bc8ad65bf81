"""The CPU self-check of `python -m fusedops.bench` (no GPU needed): every library kernel that exists
runs through the interpreter on small inputs against float64 PyTorch, then each kernel
specialization it launched is compiled to PTX for sm_90a and, when `ptxas` is installed,
assembled by it.

    status = run(["softmax"])     # 0 when every check passes, 1 otherwise (with the reasons)

The library ops are those of the bench case table (cases.py) whose fusedops function exists: each
runs at the case's `selfcheck_shapes` in float32 and float16 (or the dtypes asked for), forward or
backward as the case says, with FUSEDOPS_INTERPRET=1 so that the ops take their interpreter path
on CPU tensors. An op (its forward and backward cases together) during which no new kernel
specialization was launched fails: an op that silently fell back to PyTorch must not pass for a
checked kernel. (There is no launch counter to ask, so a backward that also fell back while its
forward ran kernels is not caught by this check.)

Until the first library op lands, the self-check runs two kernels of its own instead (a vector
add and a row softmax), so that the command checks the compiler from the first day.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import pkgutil
import sys
import time
from typing import Iterator, List, Optional, Sequence, Set, Tuple

import torch

import fusedops.dsl as dsl
from fusedops.kernels.sizes import next_power_of_2

from . import checks, providers
from .cases import BenchCase, dtype_name, no_dtype_line, select
from .workload import Workload

TARGET = "sm_90a"
DEFAULT_DTYPES = (torch.float32, torch.float16)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One check: what was checked, whether it passed, and the numbers or the error."""

    stage: str      # "interpreter" or "ptx"
    what: str
    passed: bool
    detail: str

    def line(self) -> str:
        return f"  {'ok  ' if self.passed else 'FAIL'}  {self.stage:<11}  {self.what}: {self.detail}"


# -- the built-in kernels (used until the library has kernels) ---------------------------------
@dsl.jit
def vector_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: dsl.constexpr):
    # x_ptr, y_ptr, out_ptr: (n,) tensors of one dtype
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    dsl.store(out_ptr + offsets, dsl.load(x_ptr + offsets, mask=mask) + dsl.load(y_ptr + offsets, mask=mask),
              mask=mask)


@dsl.jit
def row_softmax_kernel(y_ptr, x_ptr, x_row_stride, y_row_stride, n_cols, BLOCK: dsl.constexpr):
    # x_ptr, y_ptr: (n_rows, n_cols), unit column stride; one program per row; BLOCK >= n_cols
    row = dsl.program_id(0)
    cols = dsl.arange(0, BLOCK)
    mask = cols < n_cols
    x = dsl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf")).to(dsl.float32)
    numerator = dsl.exp(x - dsl.max(x, axis=0))
    dsl.store(y_ptr + row * y_row_stride + cols, numerator / dsl.sum(numerator, axis=0), mask=mask)


def _builtin_checks(dtypes: Sequence[torch.dtype]) -> List[Outcome]:
    outcomes = []
    generator = torch.Generator().manual_seed(0)
    for dtype in dtypes:
        for n in (1, 1000):
            x, y = (torch.randn(n, generator=generator).to(dtype) for _ in range(2))
            out = torch.full_like(x, float("nan"))
            vector_add_kernel[(dsl.cdiv(n, 256),)](x, y, out, n, BLOCK=256, interpret=True)
            outcomes.append(_compare(f"vector_add n={n} {dtype_name(dtype)}", out, x.double() + y.double(), dtype))
        for rows, cols in ((3, 17), (5, 100)):
            x = torch.randn(rows, cols, generator=generator).to(dtype)
            out = torch.full_like(x, float("nan"))
            row_softmax_kernel[(rows,)](out, x, x.stride(0), out.stride(0), cols, BLOCK=next_power_of_2(cols),
                                        interpret=True)
            outcomes.append(_compare(f"row_softmax M={rows} N={cols} {dtype_name(dtype)}", out,
                                     torch.softmax(x.double(), dim=-1), dtype))
    return outcomes


def _compare(what: str, actual: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> Outcome:
    error, allowed = checks.measure_error(actual, reference), checks.allowed_error(dtype, None)
    return Outcome("interpreter", what, checks.within(error, allowed),
                   f"relative error {error.relative:.2e} (allowed {allowed.relative:.2e})")


# -- the library's kernels ----------------------------------------------------------------------------
def library_kernels() -> Tuple[List[dsl.JITFunction], List[Outcome]]:
    """Every @dsl.jit function defined in a module of fusedops.kernels, and a failed outcome per
    module that does not import."""
    import fusedops.kernels as package

    kernels, failures = [], []
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        try:
            module = importlib.import_module(info.name)
        except Exception as error:  # a broken kernel module is a failed check, not a crash
            failures.append(Outcome("import", info.name, False, f"{type(error).__name__}: {error}"))
            continue
        kernels += [value for value in vars(module).values()
                    if isinstance(value, dsl.JITFunction) and value.fn.__module__ == module.__name__]
    return kernels, failures


def _interpreter_specializations(kernel: dsl.JITFunction) -> Set:
    # The specializations a kernel was launched with in the interpreter (SpecializationKeys with no
    # target). Read from the JITFunction's cache: the runtime has no public accessor for it yet.
    return {key for key in kernel._cache if key.arch is None}


@contextlib.contextmanager
def _interpreting() -> Iterator[None]:
    """FUSEDOPS_INTERPRET=1 for the duration: the public ops run their kernels in the interpreter."""
    saved = os.environ.get("FUSEDOPS_INTERPRET")
    os.environ["FUSEDOPS_INTERPRET"] = "1"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["FUSEDOPS_INTERPRET"]
        else:
            os.environ["FUSEDOPS_INTERPRET"] = saved


def _case_checks(case: BenchCase, dtypes: Sequence[torch.dtype]) -> List[Outcome]:
    fn = providers.resolve(case, providers.FUSEDOPS)
    outcomes = []
    for dtype in dtypes:
        for shape in case.selfcheck_shapes:
            what = f"{case.name} {case.label(shape)} {dtype_name(dtype)}"
            try:
                workload = Workload(case, shape, dtype, "cpu")
                result = workload.check(workload.bind(fn))
                error, allowed = result.worst
                outcomes.append(Outcome("interpreter", what, result.passed,
                                        f"relative error {error.relative:.2e} (allowed {allowed.relative:.2e})"))
            except Exception as error:  # report and go on to the next check
                outcomes.append(Outcome("interpreter", what, False, f"{type(error).__name__}: {error}"))
    return outcomes


# -- PTX ------------------------------------------------------------------------------------------------
def _example_argument(param, spec):
    """A value from which `kernel.compile` derives the same ArgSpec as `spec` (signature.py)."""
    from fusedops.dsl.language.dtypes import PointerType, to_torch

    if spec.type is None:
        if param.is_constexpr:
            return spec.value
        return None if spec.value_class is type(None) else dsl.constexpr(spec.value)
    if isinstance(spec.type, PointerType):
        tensor = torch.empty(64, dtype=to_torch(spec.type.element))
        return tensor if spec.divisible_by_16 else tensor[1:]    # one element off: not 16-byte aligned
    if spec.type == dsl.float32:
        return 0.5
    if spec.type == dsl.int1:
        return True
    if spec.equal_to_one:
        return 1
    base = {dsl.int32: 16, dsl.int64: 2**32, dsl.uint64: 2**63}[spec.type]
    if spec.divisible_by_16:
        return base if spec.positive else 0
    if spec.divisible_by_8:
        return base + 8 if spec.positive else -8
    return base + 1


def _describe(key) -> str:
    constants = [f"{s.name}={s.value}" for s in key.args if s.type is None and s.value is not None]
    runtime = [str(s.type) for s in key.args if s.type is not None and not s.equal_to_one]
    return f"({', '.join(runtime)}; {', '.join(constants)}; num_warps={key.num_warps})"


def _ptx_checks(kernel: dsl.JITFunction, keys) -> List[Outcome]:
    from fusedops.dsl.target import assemble, ptxas_available

    outcomes = []
    for key in sorted(keys, key=repr):
        what = f"{kernel.__name__} {_describe(key)}"
        try:
            args = [_example_argument(p, s) for p, s in zip(kernel.params, key.args)]
            compiled = kernel.compile(*args, target=TARGET, num_warps=key.num_warps, num_stages=key.num_stages)
            ptx = compiled.asm["ptx"]
            detail = f"{len(ptx.splitlines())} lines of PTX"
            if ptxas_available():
                assembled = assemble(ptx, TARGET)
                detail += (f"; ptxas: {assembled.registers} registers, {assembled.spill_bytes} spill bytes, "
                           f"{assembled.shared_bytes} bytes static shared memory")
            outcomes.append(Outcome("ptx", what, True, detail))
        except Exception as error:  # report and go on to the next kernel
            if "libdevice" in str(error) and _libdevice_missing():
                # an optional part of a CPU-only install (README, "CPU-only install"): not a failure here
                outcomes.append(Outcome("ptx", what, True, "not compiled: it calls math builtins, which need "
                                        "libdevice (a CUDA installation, FUSEDOPS_LIBDEVICE_PATH or the "
                                        "nvidia-cuda-nvcc wheel), not found here"))
                continue
            outcomes.append(Outcome("ptx", what, False, f"{type(error).__name__}: {str(error)[:2000]}"))
    return outcomes


def _libdevice_missing() -> bool:
    """Whether no libdevice can be found (fusedops.dsl.target.libdevice.find_libdevice raises)."""
    from fusedops.dsl.errors import BackendError
    from fusedops.dsl.target.libdevice import find_libdevice
    try:
        find_libdevice()
    except BackendError:
        return True
    return False


# -- the command ----------------------------------------------------------------------------------------
def run(ops: Optional[Sequence[str]] = None, dtypes: Optional[Sequence[torch.dtype]] = None) -> int:
    """Run the self-check for the cases named `ops` (default: all) in `dtypes` (default: float32 and
    float16); print one line per check; return 0 when all pass, else 1."""
    return check_cases(select(ops), dtypes)


def check_cases(cases: Sequence[BenchCase], dtypes: Optional[Sequence[torch.dtype]] = None) -> int:
    """`run` for explicit cases.

    Meant for a fresh process: a kernel specialization that was launched in the interpreter before
    the call (by other code in the same process) is not new, so it neither counts as launched by a
    case nor gets a PTX check.
    """
    from fusedops.dsl.target import ptxas_available

    started = time.perf_counter()
    wanted = tuple(dtypes) if dtypes else DEFAULT_DTYPES
    available, skipped = providers.available(cases)
    for line in skipped:
        print(line)
    assembler = "ptxas assembles it" if ptxas_available() else "ptxas not found: PTX is not assembled"
    print(f"self-check: kernels in the interpreter against float64 PyTorch, then PTX for {TARGET} ({assembler})",
          flush=True)

    if available:
        kernels, outcomes = library_kernels()
        _print(outcomes)
        before = {kernel: _interpreter_specializations(kernel) for kernel in kernels}
        with _interpreting():
            for op in dict.fromkeys(case.op for case in available):
                launched_before = sum(len(_interpreter_specializations(k)) for k in kernels)
                op_outcomes = []
                for case in (case for case in available if case.op == op):
                    case_dtypes = [d for d in case.dtypes if d in wanted]
                    if not case_dtypes:
                        print(no_dtype_line(case, wanted))
                    case_outcomes = _case_checks(case, case_dtypes)
                    _print(case_outcomes)
                    op_outcomes += case_outcomes
                launched = sum(len(_interpreter_specializations(k)) for k in kernels) - launched_before
                if op_outcomes and not launched and all(o.passed for o in op_outcomes):
                    # Counted per op (forward and backward together): a backward may rightly reuse
                    # the specializations that its forward, or an earlier op, launched already.
                    missing = Outcome("interpreter", op, False, "no new kernel of fusedops.kernels was launched: "
                                      "the op did not run its kernels under FUSEDOPS_INTERPRET=1")
                    _print([missing])
                    op_outcomes.append(missing)
                outcomes += op_outcomes
    else:
        print("no op of the library exists in this build yet: checking the self-check's own kernels "
              "(vector add, row softmax)", flush=True)
        kernels = [vector_add_kernel, row_softmax_kernel]
        before = {kernel: set() for kernel in kernels}
        outcomes = _builtin_checks([d for d in wanted if d in (torch.float32, torch.float16, torch.bfloat16)])
        _print(outcomes)

    unlaunched = []
    for kernel in kernels:
        keys = _interpreter_specializations(kernel) - before[kernel]
        if not keys:
            unlaunched.append(kernel.__name__)
            continue
        ptx = _ptx_checks(kernel, keys)
        _print(ptx)
        outcomes += ptx
    if unlaunched and available:
        print(f"no PTX check for @dsl.jit functions these checks did not launch (helpers, or kernels of ops "
              f"not selected): {', '.join(unlaunched)}")
    return _verdict(outcomes, time.perf_counter() - started)


def _verdict(outcomes: Sequence[Outcome], seconds: float) -> int:
    failed = [o for o in outcomes if not o.passed]
    if not outcomes:
        print("self-check FAILED: nothing was checked", file=sys.stderr)
        return 1
    if failed:
        sys.stdout.flush()
        print(f"self-check FAILED: {len(failed)} of {len(outcomes)} checks failed ({seconds:.1f} s):",
              file=sys.stderr)
        for outcome in failed:
            print(outcome.line(), file=sys.stderr)
        return 1
    print(f"self-check passed: {len(outcomes)} checks ({seconds:.1f} s)", flush=True)
    return 0


def _print(outcomes: Sequence[Outcome]) -> None:
    for outcome in outcomes:
        print(outcome.line(), flush=True)
