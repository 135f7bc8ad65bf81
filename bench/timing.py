"""Shared timing helpers for bench/: CUDA-event timing with warm-up, an L2 flush before every run,
and the median of many runs; host-overhead timing of launch loops; result rows.

All times are milliseconds of GPU time between two CUDA events on the current stream.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import statistics
import time
from typing import Callable, Sequence

import torch

_L2_FLUSH_BYTES = 256 << 20   # larger than the H200's 50 MB L2


def gpu_time_ms(fn: Callable[[], object], *, warmup: int = 5, repeats: int = 30, flush_l2: bool = True) -> float:
    """Median GPU time of `fn()` in ms, each run after overwriting a buffer larger than L2."""
    scratch = torch.empty(_L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda") if flush_l2 else None
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        if scratch is not None:
            scratch.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def host_time_us(fn: Callable[[], object], *, calls: int = 2000, rounds: int = 7) -> float:
    """Median host time per call of `fn()` in microseconds (the launch loop, synchronized after)."""
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per_call)


def environment() -> dict:
    import fusedops

    return {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "fusedops": fusedops.__version__, "python": platform.python_version()}


def write_rows(rows: Sequence[dict], out_dir: str, name: str) -> None:
    """Write result rows (dicts with one key set) as CSV and JSON, stamped with the environment."""
    os.makedirs(out_dir, exist_ok=True)
    env = environment()
    stamped = [dict(row, **env) for row in rows]
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump(stamped, f, indent=1)
    if stamped:
        with open(os.path.join(out_dir, name + ".csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(stamped[0]))
            writer.writeheader()
            writer.writerows(stamped)
