"""The pytest-benchmark suite of bench/: the cases of fusedops/bench/cases.py (the table that
`python -m fusedops.bench` runs), one test per (case, shape, dtype, provider).

    python -m pytest bench/ --benchmark-only                  # the --quick shapes, first dtype
    python -m pytest bench/ --benchmark-only --bench-full     # every shape and dtype
    python -m pytest bench/ --benchmark-only --bench-ops softmax,matmul --bench-compile

Every test checks its provider against the float64 reference before timing it. Without a CUDA GPU
every test is skipped; a case whose fusedops op does not exist yet is skipped with the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fusedops.bench import cases, providers, runner
from fusedops.bench.workload import Workload


def pytest_addoption(parser):
    group = parser.getgroup("fusedops-bench", "fusedops benchmark cases")
    group.addoption("--bench-full", action="store_true", help="every shape and dtype (default: the --quick ones)")
    group.addoption("--bench-ops", default=None, metavar="OP[,OP...]", help="comma-separated cases (default: all)")
    group.addoption("--bench-dtype", default=None, metavar="DTYPE[,DTYPE...]", help="among fp16, bf16, fp32")
    group.addoption("--bench-compile", action="store_true", help="also torch.compile")
    group.addoption("--bench-triton", action="store_true",
                    help="also the Triton references (bench/triton_reference.py)")


def _split(text):
    return [item.strip() for item in text.split(",") if item.strip()] if text else None


def bench_settings(config) -> runner.Settings:
    """The runner's Settings for these command-line options (the same as the CLI's flags)."""
    try:
        selected = cases.select(_split(config.getoption("--bench-ops")))
    except KeyError as error:
        raise pytest.UsageError(f"--bench-ops: {error.args[0]}") from None
    dtypes = _split(config.getoption("--bench-dtype"))
    unknown = [name for name in dtypes or () if name not in cases.DTYPE_NAMES]
    if unknown:
        raise pytest.UsageError(f"--bench-dtype: unknown dtype(s) {', '.join(unknown)}; valid dtypes: "
                                f"{', '.join(cases.DTYPE_NAMES)}")
    dtypes = tuple(cases.DTYPE_NAMES[name] for name in dtypes) if dtypes else None
    return runner.Settings(cases=selected, dtypes=dtypes, quick=not config.getoption("--bench-full"),
                           compile=config.getoption("--bench-compile"), triton=config.getoption("--bench-triton"))


def _shape_id(shape) -> str:
    return "x".join(("causal" if v else "full") if isinstance(v, bool) else str(v) for v in shape)


def pytest_generate_tests(metafunc):
    if "bench_point" not in metafunc.fixturenames:
        return
    settings = bench_settings(metafunc.config)
    params = []
    for case in settings.cases:
        for point in runner.points_of(case, settings):
            for provider in providers.names(case, compile=settings.compile, triton=settings.triton):
                params.append(pytest.param(
                    (point, provider),
                    id=f"{case.name}-{_shape_id(point.shape)}-{cases.dtype_name(point.dtype)}-{provider}"))
    metafunc.parametrize("bench_point", params)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    # The hook sees every item of the session: skip only this folder's benchmarks, not the tests of
    # tests/ collected in the same run.
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def run_settings(request) -> runner.Settings:
    return bench_settings(request.config)


@pytest.fixture(scope="session")
def workload_for():
    """workload_for(point) -> Workload, reusing the last one: a point's providers run one after another,
    so they share the inputs and the float64 reference."""
    last = {}

    def get(point: runner.Point) -> Workload:
        if last.get("point") != point:
            last.clear()
            torch.cuda.empty_cache()
            last.update(point=point, workload=Workload(point.case, point.shape, point.dtype, "cuda"))
        return last["workload"]

    return get
