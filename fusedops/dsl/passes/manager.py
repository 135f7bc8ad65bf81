"""The pass manager: runs a list of passes over a function, timing each and checking the IR after it.

A pass is a callable taking an `ir.Function` and returning one of:
- a bool: whether it changed the function in place;
- a `Function`: the new function (changed when it is not the one passed in);
- None, or the same `Function`: the pass did not say; the manager records a change unless it
  dumped the IR and the printed form is the same (return a bool instead);
- anything else: the result of an *analysis* (such as `analyze_pointers`'s `AnalysisResult`), kept
  in `PipelineReport.analyses` under the pass's name; an analysis does not change the IR.

Dumps (numba-cuda's pass manager does the same): `dump=True` prints the IR before and after every
pass to stderr, or writes `<kernel>/NN_<pass>.before.ir` / `.after.ir` files into `dump_dir` (one folder per
kernel name: another kernel's dumps do not overwrite these; a kernel compiled again, e.g. for another
specialization, does);
`dump` may also be a collection of pass names, to dump only those.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Callable, Collection, Optional, Sequence, Union

from ..ir.core import Function
from ..ir.printer import print_function
from ..ir.verifier import VerificationError, verify as verify_function

Pass = Callable[[Function], object]


def pass_name(pass_: Pass) -> str:
    """A pass's name for reports and dumps: its function name (through functools.partial)."""
    target = getattr(pass_, "func", pass_)
    return getattr(target, "__name__", type(target).__name__)


@dataclasses.dataclass(frozen=True)
class PassRecord:
    """What one pass did: its name, wall time in seconds, and whether it changed the IR."""

    name: str
    seconds: float
    changed: bool


@dataclasses.dataclass
class PipelineReport:
    """The result of a pipeline run: the final function, one record per pass, analysis results."""

    function: Function
    records: list = dataclasses.field(default_factory=list)
    analyses: dict = dataclasses.field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return any(record.changed for record in self.records)

    @property
    def total_seconds(self) -> float:
        return sum(record.seconds for record in self.records)

    def __str__(self) -> str:
        width = max([len(r.name) for r in self.records] + [4])
        lines = [f"{'pass':<{width}}  {'ms':>8}  changed"]
        for r in self.records:
            lines.append(f"{r.name:<{width}}  {r.seconds * 1e3:8.3f}  {'yes' if r.changed else 'no'}")
        lines.append(f"{'total':<{width}}  {self.total_seconds * 1e3:8.3f}")
        return "\n".join(lines)


class PassManager:
    """Runs `passes` in order. See the module docstring for what a pass may return.

    Args:
        passes: the passes, in order (e.g. `pipeline.default_pipeline()`).
        dump: True to dump the IR around every pass, or a collection of pass names.
        dump_dir: write dumps as files there (created if missing) instead of printing to stderr.
        verify: run `ir.verify` on the input and after every pass; a failure raises
            `VerificationError` naming the pass that broke the IR.
    """

    def __init__(self, passes: Sequence[Pass], *, dump: Union[bool, Collection[str]] = False,
                 dump_dir: Optional[str] = None, verify: bool = True):
        self.passes = list(passes)
        self.dump = dump
        self.dump_dir = dump_dir
        self.verify = verify

    def run(self, function: Function) -> PipelineReport:
        if self.verify:
            self._verify(function, "the pipeline's input")
        report = PipelineReport(function)
        for index, pass_ in enumerate(self.passes):
            name = pass_name(pass_)
            dumping = self._dumps(name)
            before_text = print_function(function) if dumping else None
            start = time.perf_counter()
            result = pass_(function)
            seconds = time.perf_counter() - start
            function, changed = self._interpret(result, function, name, report, before_text)
            report.records.append(PassRecord(name, seconds, changed))
            if dumping:
                self._write_dump(function.name, index, name, "before", before_text)
                self._write_dump(function.name, index, name, "after", print_function(function))
            if self.verify:
                self._verify(function, f"pass {name!r}")
        report.function = function
        return report

    def _interpret(self, result, function, name, report, before_text):
        """(the function after the pass, whether it changed) from what the pass returned."""
        if isinstance(result, bool):
            return function, result
        if isinstance(result, Function) and result is not function:
            return result, True
        if result is None or isinstance(result, Function):
            # The pass did not say; compare the printed IR when a dump kept it, else assume a change.
            return function, before_text is None or print_function(function) != before_text
        report.analyses[name] = result
        return function, False

    def _dumps(self, name: str) -> bool:
        if isinstance(self.dump, bool):
            return self.dump
        return name in self.dump

    def _write_dump(self, kernel: str, index: int, name: str, when: str, text: str) -> None:
        """Raises OSError naming dump_dir (FUSEDOPS_DUMP_DIR) where the dump cannot be written."""
        if self.dump_dir is None:
            sys.stderr.write(f"// ----- IR {when} pass {index:02d} {name} ({kernel}) -----\n{text}")
            return
        folder = os.path.join(self.dump_dir, kernel)
        try:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{index:02d}_{name}.{when}.ir"), "w", encoding="utf-8") as file:
                file.write(text)
        except OSError as error:
            raise OSError(f"cannot write IR dumps into dump_dir {self.dump_dir!r} (FUSEDOPS_DUMP_DIR): "
                          f"{error}") from error

    @staticmethod
    def _verify(function: Function, after: str) -> None:
        try:
            verify_function(function)
        except VerificationError as error:
            raise VerificationError(f"invalid IR after {after}: {error}") from error


def run_pipeline(function: Function, passes: Sequence[Pass], *, dump: Union[bool, Collection[str]] = False,
                 dump_dir: Optional[str] = None, verify: bool = True) -> PipelineReport:
    """Run `passes` over `function` with a `PassManager`; returns the `PipelineReport`."""
    return PassManager(passes, dump=dump, dump_dir=dump_dir, verify=verify).run(function)
