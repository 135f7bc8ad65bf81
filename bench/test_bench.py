"""One pytest-benchmark test per (case, shape, dtype, provider) of the case table; see conftest.py.

pytest-benchmark times the host wall clock of one synchronized call (after an L2 flush, untimed);
the CUDA-event median of the same call, as `python -m fusedops.bench` measures it, is stored in
the benchmark's extra_info (ms, and GB/s or TFLOP/s).
"""

from __future__ import annotations

import statistics

import pytest
import torch

from fusedops.bench import providers, timing


def test_bench(benchmark, bench_point, run_settings, workload_for):
    point, provider = bench_point
    try:
        providers.resolve(point.case, providers.FUSEDOPS)    # as the CLI: no fusedops op, no case
        fn = providers.resolve(point.case, provider)
    except providers.Unavailable as reason:
        pytest.skip(str(reason))
    workload = workload_for(point)
    run = workload.bind(fn)
    result = workload.check(run)
    assert result.passed, f"{point.case.name} {point.case.label(point.shape)} {provider}: {result.describe()}"

    flush = timing.l2_flusher()

    def setup():
        flush()
        torch.cuda.synchronize()

    def call():
        run()
        torch.cuda.synchronize()

    benchmark.pedantic(call, setup=setup, rounds=run_settings.repeats, warmup_rounds=run_settings.warmup)
    ms = statistics.median(timing.gpu_times_ms(run, warmup=0, repeats=run_settings.repeats))
    unit = point.case.unit
    benchmark.extra_info.update({"case": point.case.name, "shape": point.case.label(point.shape),
                                 "provider": provider, "cuda_event_ms": ms,
                                 unit: workload.work / ms / (1e6 if unit == "GB/s" else 1e9)})
