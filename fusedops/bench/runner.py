"""The benchmark run on a CUDA GPU: for every case, shape and dtype, check each provider against the
float64 reference, then time it with CUDA events, and report.

    settings = Settings(cases.select(["softmax"]), quick=True, out="bench-results")
    status = run(settings)     # 0: every fusedops check passed (and at least one op ran)

Order of a run: measure the ceilings (device-to-device copy, cuBLAS fp16 GEMM); plan the points
(a case whose fusedops op does not exist yet is skipped with its reason); per point, the providers
in `providers.names` order (torch first: the others' allowed error is relative to it): check, and
time only what passed; print the table; write results.csv, results.json, results.md and one
<op>.png per op into `out`.

The exit status counts fusedops only: a failed or crashed fusedops check makes it 1, and so does a
run that benchmarked no fusedops op at all (the main job must not pass without running kernels).
A failing baseline (torch.compile, triton, ...) is reported in the table, not in the status.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import traceback
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from . import providers, report, timing
from .cases import BenchCase, Shape, dtype_name, no_dtype_line
from .workload import Workload

Timer = Callable[[Callable[[], object]], List[float]]   # fn -> times of several runs, in ms


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one run does; `dtypes` None means each case's own dtypes (with `quick`: its first)."""

    cases: Tuple[BenchCase, ...]
    dtypes: Optional[Tuple[torch.dtype, ...]] = None
    quick: bool = False
    compile: bool = False
    triton: bool = False
    out: Optional[str] = None

    @property
    def warmup(self) -> int:
        return 3 if self.quick else 10

    @property
    def repeats(self) -> int:
        return 15 if self.quick else 50


@dataclasses.dataclass(frozen=True)
class Point:
    case: BenchCase
    shape: Shape
    dtype: torch.dtype


def points_of(case: BenchCase, settings: Settings) -> List[Point]:
    """The (shape, dtype) points of `case` that `settings` ask for (none when no dtype matches)."""
    if settings.dtypes is not None:
        dtypes = [d for d in case.dtypes if d in settings.dtypes]
    else:
        dtypes = case.dtypes[:1] if settings.quick else case.dtypes
    shapes = case.quick_shapes if settings.quick else case.shapes
    return [Point(case, shape, dtype) for dtype in dtypes for shape in shapes]


def plan(settings: Settings) -> Tuple[List[Point], List[str]]:
    """The points to run, and one line per reason for leaving cases out (op not in this build, no
    such dtype)."""
    points = []
    kept, skipped = providers.available(settings.cases)
    for case in kept:
        case_points = points_of(case, settings)
        if not case_points:
            skipped.append(no_dtype_line(case, settings.dtypes))
        points += case_points
    return points, skipped


def _row(point: Point, provider: str) -> dict:
    case = point.case
    return {"op": case.name, "shape": case.label(point.shape), "dtype": dtype_name(point.dtype),
            "provider": provider, "check": "", "ms": None, "GB/s": None, "TFLOP/s": None,
            "% of ceiling": None, "vs torch": None, "ms_min": None, "ms_max": None, "error": None,
            "allowed_error": None, "element_error": None, "allowed_element_error": None,
            "unit": case.unit, "work": None, "ceiling": None, "note": ""}


def _one_line(error: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(error), error)).strip().splitlines()
    return text[-1] if text else type(error).__name__


def measure_point(point: Point, names: Sequence[str], timer: Timer, *, ceiling: Optional[float] = None,
                  device="cuda", say: Callable[[str], None] = print) -> List[dict]:
    """Check and time `point` for each provider in `names` (torch first); one row per provider.

    A provider that cannot run here (providers.Unavailable) gives no row, only a message through
    `say`; one that raises gives a row with check "error" and the exception in `note`; one whose
    result is wrong is not timed. When the inputs or the reference cannot be made (out of memory,
    a GPU left in an error state by an earlier crash), the point is one fusedops "error" row.
    """
    try:
        workload = Workload(point.case, point.shape, point.dtype, device)
    except Exception as exc:  # nothing can be checked at this point: that is a failure, not a crash
        row = _row(point, providers.FUSEDOPS)
        row.update(check="error", note=f"inputs or reference: {_one_line(exc)}")
        say(f"{point.case.name} [{row['shape']}, {row['dtype']}]: error: {row['note']}")
        if isinstance(exc, torch.cuda.OutOfMemoryError):
            torch.cuda.empty_cache()
        return [row]
    rows = []
    for name in names:
        row = _row(point, name)
        try:
            fn = providers.resolve(point.case, name)
            run = workload.bind(fn)
            result = workload.check(run)
            error, allowed = result.worst
            row.update(error=error.relative, allowed_error=allowed.relative, element_error=error.element,
                       allowed_element_error=allowed.element, check="ok" if result.passed else "FAIL")
            if result.passed:
                times = timer(run)
                row.update(ms=statistics.median(times), ms_min=min(times), ms_max=max(times))
            else:
                say(f"{point.case.name} [{row['shape']}, {row['dtype']}] {name}: {result.describe()}")
            del run
        except providers.Unavailable as reason:
            say(f"no {name} provider: {reason}")
            continue
        except Exception as exc:  # a provider's crash is a result: report it and go on
            row.update(check="error", note=_one_line(exc))
            say(f"{point.case.name} [{row['shape']}, {row['dtype']}] {name}: error: {row['note']}")
            if isinstance(exc, torch.cuda.OutOfMemoryError):
                torch.cuda.empty_cache()
        rows.append(row)
    _fill_rates(rows, workload.work, ceiling)
    return rows


def _fill_rates(rows: List[dict], work: float, ceiling: Optional[float]) -> None:
    torch_ms = next((r["ms"] for r in rows if r["provider"] == providers.TORCH and r["ms"]), None)
    for row in rows:
        row["work"] = work
        row["ceiling"] = ceiling
        if not row["ms"]:
            continue
        rate = work / row["ms"] / (1e6 if row["unit"] == "GB/s" else 1e9)
        row[row["unit"]] = rate
        if ceiling:
            row["% of ceiling"] = 100.0 * rate / ceiling
        if torch_ms:
            row["vs torch"] = torch_ms / row["ms"]


def _status(rows: Sequence[dict], points: Sequence[Point]) -> Tuple[int, str]:
    ours = [r for r in rows if r["provider"] == providers.FUSEDOPS]
    bad = [r for r in ours if r["check"] != "ok"]
    if not points:
        return 1, "error: no fusedops op was benchmarked (none of the selected ops exists in this build yet)"
    if bad:
        listed = "; ".join(f"{r['op']} [{r['shape']}, {r['dtype']}]: {r['check']} {r['note']}".rstrip()
                           for r in bad)
        return 1, f"error: {len(bad)} of {len(ours)} fusedops checks failed: {listed}"
    return 0, f"all {len(ours)} fusedops checks passed"


def write_outputs(rows: Sequence[dict], settings: Settings, ceilings: timing.Ceilings, env: dict,
                  say: Callable[[str], None] = print) -> List[Path]:
    """results.csv/json (every row, stamped with `env` and the ceilings), results.md (the table) and
    one PNG per op into settings.out. Returns the paths written."""
    out = Path(settings.out)
    stamp = dict(env, copy_GB_per_s=ceilings.copy_gb_per_s, gemm_fp16_TFLOP_per_s=ceilings.gemm_tflop_per_s)
    paths = report.write_rows(rows, str(out), "results", stamp)
    markdown = out / "results.md"
    heading = (f"{env['gpu']}, driver {env['driver']}, torch {env['torch']}, fusedops {env['fusedops']}; "
               f"ceilings: device-to-device copy {ceilings.copy_gb_per_s:.0f} GB/s, "
               f"cuBLAS fp16 GEMM {ceilings.gemm_tflop_per_s:.0f} TFLOP/s")
    markdown.write_text(f"{heading}\n\n{report.format_table(rows, markdown=True)}\n")
    paths.append(markdown)
    op_of = {case.name: case.op for case in settings.cases}
    for op in dict.fromkeys(op_of.values()):
        op_rows = [r for r in rows if op_of.get(r["op"]) == op]
        if not op_rows:
            continue
        png = report.plot_op(op, op_rows, out / f"{op}.png", ceilings.for_unit(op_rows[0]["unit"]))
        if png is not None:
            paths.append(png)
    if "matplotlib" in report.missing_reporting_libraries():
        say("note: matplotlib is not installed: no plots (pip install -e '.[bench]')")
    return paths


def run(settings: Settings) -> int:
    """The whole benchmark on the current CUDA device; returns the exit status (see module docstring)."""
    for name in report.missing_reporting_libraries():
        print(f"note: {name} is not installed (pip install -e '.[bench]'); continuing without it", flush=True)
    env = report.environment()
    print(f"{env['gpu']} | driver {env['driver']} | CUDA {env['cuda']} | torch {env['torch']} | "
          f"fusedops {env['fusedops']}", flush=True)
    points, skipped = plan(settings)
    for line in skipped:
        print(line, flush=True)
    ceilings = timing.measure_ceilings(warmup=settings.warmup, repeats=settings.repeats)
    print(f"ceilings: device-to-device copy {ceilings.copy_gb_per_s:.0f} GB/s (read + write), "
          f"cuBLAS fp16 GEMM {ceilings.gemm_tflop_per_s:.0f} TFLOP/s at {timing.GEMM_SIZE}^3", flush=True)
    timer = functools.partial(timing.gpu_times_ms, warmup=settings.warmup, repeats=settings.repeats)
    rows: List[dict] = []
    said = set()
    bar = report.Progress(points, "fusedops-bench")

    def say(text: str) -> None:
        if text not in said:
            said.add(text)
            bar.write(text)

    for point in bar:
        bar.set_postfix(f"{point.case.name} {point.case.label(point.shape)} {dtype_name(point.dtype)}")
        names = providers.names(point.case, compile=settings.compile, triton=settings.triton)
        rows += measure_point(point, names, timer, ceiling=ceilings.for_unit(point.case.unit), say=say)
        torch.cuda.empty_cache()
    bar.close()
    if rows:
        print(report.format_table(rows), flush=True)
    if settings.out:
        paths = write_outputs(rows, settings, ceilings, env, say=print)
        print(f"wrote {', '.join(str(p) for p in paths)}", flush=True)
    status, message = _status(rows, points)
    print(message, flush=True)
    return status
