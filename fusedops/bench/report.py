"""Output of the benchmarks: the printed table (tabulate), CSV and JSON rows stamped with the
environment, one PNG plot per op (matplotlib), and the progress bar (tqdm); for the per-op scripts
of bench/ also fixed-width and key=value rows and a grid of plots whose panels each script draws.

tabulate, tqdm and matplotlib are the `bench` extra (`pip install -e '.[bench]'`). Without them the
table falls back to plain aligned columns, the progress bar to nothing, and the plots are skipped
with a message: a run never fails for want of its reporting libraries.
"""

from __future__ import annotations

import csv
import datetime
import importlib.util
import json
import math
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

TABLE_COLUMNS = ("op", "shape", "dtype", "provider", "check", "ms", "GB/s", "TFLOP/s", "% of ceiling", "vs torch")


def missing_reporting_libraries() -> List[str]:
    """Which of tabulate, tqdm and matplotlib are not installed."""
    return [name for name in ("tabulate", "tqdm", "matplotlib") if importlib.util.find_spec(name) is None]


# -- environment ------------------------------------------------------------------------------------
def driver_version() -> str:
    """The NVIDIA driver's version ("580.159.03"): from NVML, else nvidia-smi, else the CUDA driver
    API's version ("CUDA 13.0"); "" when there is no driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
            return version.decode() if isinstance(version, bytes) else str(version)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # not installed, or no driver: try the next source
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            completed = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True, timeout=30)
            if completed.returncode == 0 and completed.stdout.strip():
                return completed.stdout.strip().splitlines()[0]
        except (OSError, subprocess.TimeoutExpired):
            pass
    try:
        from cuda.bindings import driver

        error, version = driver.cuDriverGetVersion()
        if int(error) == 0:
            return f"CUDA {version // 1000}.{version % 1000 // 10}"
    except Exception:  # cuda-bindings missing or no driver
        pass
    return ""


def environment() -> dict:
    """GPU name, driver, CUDA, torch, fusedops and Python versions, and the time (UTC), for stamping rows."""
    import torch

    import fusedops

    cuda = torch.cuda.is_available()
    return {
        "gpu": torch.cuda.get_device_name() if cuda else "cpu",
        "driver": driver_version() if cuda else "",
        "cuda": torch.version.cuda or "",
        "torch": torch.__version__,
        "fusedops": fusedops.__version__,
        "python": platform.python_version(),
        "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def write_rows(rows: Sequence[dict], out_dir: str, name: str, env: Optional[dict] = None) -> List[Path]:
    """Write result rows as `name`.csv and `name`.json in `out_dir`, each row stamped with `env`
    (default: `environment()`). Rows may have different keys: the CSV has their union (first-seen
    order). Returns the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    env = environment() if env is None else env
    stamped = [dict(row, **env) for row in rows]
    json_path = Path(out_dir) / f"{name}.json"
    json_path.write_text(json.dumps([_finite(row) for row in stamped], indent=1, allow_nan=False) + "\n")
    csv_path = Path(out_dir) / f"{name}.csv"
    fields = list(dict.fromkeys(key for row in stamped for key in row))
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(stamped)
    return [csv_path, json_path]


# -- table ----------------------------------------------------------------------------------------
def _finite(row: dict) -> dict:
    """`row` with NaN / infinite floats as None: JSON has no such numbers (strict parsers reject them)."""
    return {key: None if isinstance(value, float) and not math.isfinite(value) else value
            for key, value in row.items()}


def _cell(column: str, value) -> str:
    """A table cell: empty for a missing or non-finite number; ratios and values below 10 (fractions such
    as layernorm's fraction_of_copy, judged against 0.90) to two decimals, ms to 4 significant digits."""
    if value is None or value == "" or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    if isinstance(value, float):
        if column == "vs torch":
            return f"{value:.2f}x"
        if column == "ms":
            return f"{value:.4g}"
        return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def format_table(rows: Sequence[dict], columns: Sequence[str] = TABLE_COLUMNS, *, markdown: bool = False) -> str:
    """The rows as a text table (a GitHub markdown table with `markdown=True`)."""
    body = [[_cell(c, row.get(c)) for c in columns] for row in rows]
    if importlib.util.find_spec("tabulate") is not None:
        from tabulate import tabulate

        return tabulate(body, headers=list(columns), tablefmt="github" if markdown else "simple",
                        disable_numparse=True)
    widths = [max([len(c)] + [len(r[i]) for r in body]) for i, c in enumerate(columns)]

    def line(cells) -> str:
        padded = [cell.ljust(width) for cell, width in zip(cells, widths)]
        return f"| {' | '.join(padded)} |" if markdown else "  ".join(padded).rstrip()

    return "\n".join([line(columns), line(["-" * w for w in widths])] + [line(r) for r in body])


def format_fixed_width(rows: Sequence[dict], columns: Sequence[str], width: int, formats: Optional[dict] = None,
                       float_format: str = "{:.3f}") -> str:
    """The rows as right-aligned columns `width` characters wide, two spaces apart, under a header of
    the column names: a float is written with `formats[column]` (a str.format pattern such as
    "{:.2f}x") or `float_format`, a missing value or None as nothing, anything else as format() does."""
    formats = formats or {}
    lines = ["  ".join(f"{column:>{width}}" for column in columns)]
    for row in rows:
        cells = []
        for column in columns:
            value = row.get(column)
            if isinstance(value, float):
                value = formats.get(column, float_format).format(value)
            cells.append(f"{'' if value is None else value:>{width}}")
        lines.append("  ".join(cells))
    return "\n".join(lines)


def format_key_values(row: dict) -> str:
    """One row as `key=value` pairs (floats to 4 significant digits): for rows of differing keys."""
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())


# -- plots --------------------------------------------------------------------------------------------
def plot_op(op: str, rows: Sequence[dict], path: Path, ceiling: Optional[float] = None) -> Optional[Path]:
    """A PNG of `op`'s throughput per shape, one bar per provider, one panel per (direction, dtype).

    rows: result rows of this op (keys case, shape, dtype, provider, unit and the unit's value);
    rows without a time (failed or errored checks) are left out. Returns the path, or None when
    matplotlib is not installed or nothing was timed.
    """
    timed = [row for row in rows if isinstance(row.get(row.get("unit", "")), float)]
    if not timed or importlib.util.find_spec("matplotlib") is None:
        return None
    from matplotlib.figure import Figure   # no pyplot: no global figure state, no display needed

    panels = list(dict.fromkeys((row["op"], row["dtype"]) for row in timed))
    unit = timed[0]["unit"]
    figure = Figure(figsize=(max(6.0, 1.2 * _most_shapes(timed) + 3), 3.2 * len(panels)), layout="constrained")
    axes = figure.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, (case, dtype) in zip(axes, panels):
        panel = [row for row in timed if row["op"] == case and row["dtype"] == dtype]
        shapes = list(dict.fromkeys(row["shape"] for row in panel))
        providers = list(dict.fromkeys(row["provider"] for row in panel))
        width = 0.8 / len(providers)
        for p, provider in enumerate(providers):
            values = {row["shape"]: row[unit] for row in panel if row["provider"] == provider}
            xs = [i + (p - (len(providers) - 1) / 2) * width for i, s in enumerate(shapes) if s in values]
            ax.bar(xs, [values[s] for s in shapes if s in values], width, label=provider)
        if ceiling:
            ax.axhline(ceiling, color="black", linestyle="--", linewidth=1, label="measured ceiling")
        ax.set_xticks(range(len(shapes)), [s.replace(" ", "\n") for s in shapes], fontsize=7)
        ax.set_ylabel(unit)
        ax.set_title(f"{case} ({dtype})")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path


def plot_panels(path: Path, panels: Sequence, draw: Callable, *, columns: int, panel_size: Tuple[float, float],
                dpi: int = 110) -> Optional[Path]:
    """A PNG of a grid of plots, `columns` wide, filled row by row: `draw(axis, panel)` draws each of
    `panels` (an op's own choice of what a panel shows). Returns the path, or None when matplotlib
    is not installed."""
    if not panels or importlib.util.find_spec("matplotlib") is None:
        return None
    from matplotlib.figure import Figure   # no pyplot: no global figure state, no display needed

    grid_rows = -(-len(panels) // columns)
    figure = Figure(figsize=(panel_size[0] * columns, panel_size[1] * grid_rows))
    axes = figure.subplots(grid_rows, columns, squeeze=False)
    for index, panel in enumerate(panels):
        draw(axes[index // columns][index % columns], panel)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    return path


def plot_message(path: Optional[Path]) -> str:
    """What a script prints about its plot: where it is, or why there is none."""
    return f"plot: {path}" if path else "plot: skipped (matplotlib is not installed, or nothing was timed)"


def _most_shapes(rows: Sequence[dict]) -> int:
    counts = {}
    for row in rows:
        counts.setdefault((row["op"], row["dtype"]), set()).add(row["shape"])
    return max(len(shapes) for shapes in counts.values())


# -- progress -----------------------------------------------------------------------------------------
class Progress:
    """Iterates over `items` behind a tqdm bar on stderr (none when tqdm is not installed);
    `write(text)` prints a message to stdout without breaking the bar."""

    def __init__(self, items: Sequence, description: str):
        self._items = items
        self._bar = None
        if importlib.util.find_spec("tqdm") is not None:
            from tqdm import tqdm

            self._tqdm = tqdm
            self._bar = tqdm(total=len(items), desc=description, unit="point", file=sys.stderr,
                             dynamic_ncols=True)

    def __iter__(self):
        for item in self._items:
            yield item
            if self._bar is not None:
                self._bar.update(1)

    def set_postfix(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(text)

    def write(self, text: str) -> None:
        if self._bar is not None:
            self._tqdm.write(text, file=sys.stdout)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
