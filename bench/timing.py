"""The timing helpers of the bench/ scripts: a re-export of fusedops.bench.timing and of the result
writer of fusedops.bench.report, so that the scripts and `python -m fusedops.bench` share one
implementation (CUDA events, warm-up, L2 flush before every run, median of many runs).

    from timing import gpu_time_ms, host_time_us, write_rows
"""

from fusedops.bench.report import environment, write_rows
from fusedops.bench.timing import (Ceilings, gpu_time_ms, gpu_times_ms, host_time_us, interleaved_gpu_times_ms,
                                   l2_flusher, measure_ceilings, times_or_failures_ms)

__all__ = ["gpu_time_ms", "gpu_times_ms", "host_time_us", "interleaved_gpu_times_ms", "l2_flusher", "Ceilings",
           "measure_ceilings", "environment", "write_rows", "times_or_failures_ms"]
