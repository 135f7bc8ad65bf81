"""GPU timing for the benchmarks: CUDA events, warm-up, an L2 flush before every run, the median of
many runs; host-overhead timing of launch loops; and the two ceilings the results are compared with.

This is the one implementation: `bench/timing.py` (the per-op scripts' helper) re-exports it.

All GPU times are milliseconds between two CUDA events recorded on the current stream around one
call. Every timed call is preceded by a write of a buffer larger than the L2 cache (50 MB on the
H200), so that no run finds its inputs in L2 left there by the previous one.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable, Dict, List

import torch

L2_FLUSH_BYTES = 256 << 20    # several times the H200's 50 MB L2

# Sizes of the ceiling measurements: a 1 GiB device-to-device copy (2 GiB of traffic) and an
# 8192^3 fp16 matrix product, both far from launch-overhead and cache effects.
COPY_BYTES = 1 << 30
GEMM_SIZE = 8192


def l2_flusher(nbytes: int = L2_FLUSH_BYTES) -> Callable[[], None]:
    """A function that overwrites an `nbytes` buffer on the current CUDA device (evicting L2)."""
    scratch = torch.empty(nbytes // 4, dtype=torch.int32, device="cuda")
    return scratch.zero_


def gpu_times_ms(fn: Callable[[], object], *, warmup: int = 5, repeats: int = 30,
                 flush_l2: bool = True) -> List[float]:
    """The GPU time of each of `repeats` calls of `fn()` in ms, after `warmup` untimed calls.

    The events of all runs are recorded first and read after one synchronization, so reading a
    time never stalls the queue between runs. Raises what `fn` raises.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    flush = l2_flusher() if flush_l2 else None
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for start, end in zip(starts, ends):
        if flush is not None:
            flush()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in zip(starts, ends)]


def gpu_time_ms(fn: Callable[[], object], *, warmup: int = 5, repeats: int = 30, flush_l2: bool = True) -> float:
    """Median GPU time of `fn()` in ms, each run after overwriting a buffer larger than L2."""
    return statistics.median(gpu_times_ms(fn, warmup=warmup, repeats=repeats, flush_l2=flush_l2))


def interleaved_gpu_times_ms(fns: Dict[str, Callable[[], object]], *, rounds: int = 3, warmup: int = 3,
                             repeats: int = 30, flush_l2: bool = True) -> Dict[str, float]:
    """Median GPU time in ms of each of `fns` (name -> function), timed side by side: `rounds` rounds, each
    timing every function in turn for `repeats // rounds` runs (at least one), so that a change of clock or
    power state during the measurement (an autotuning that ran just before, a long product heating the
    GPU) falls on all of them alike rather than on whichever came last. Raises what a function raises."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    per_round = max(1, repeats // rounds)
    times: Dict[str, List[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].extend(gpu_times_ms(fn, warmup=warmup, repeats=per_round, flush_l2=flush_l2))
    return {name: statistics.median(values) for name, values in times.items()}


def times_or_failures_ms(fns: Dict[str, Callable[[], object]], *, rounds: int = 5, warmup: int = 3,
                         repeats: int = 50) -> Dict[str, object]:
    """name -> the median GPU time in ms of each of `fns`, timed in interleaved rounds
    (`interleaved_gpu_times_ms`); where a function raises, each is timed alone instead (`gpu_time_ms`) and
    the one that raised maps to its exception, so that one failing provider costs its own row, not the
    others' side-by-side timing."""
    try:
        return interleaved_gpu_times_ms(fns, rounds=rounds, warmup=warmup, repeats=repeats)
    except Exception:
        times: Dict[str, object] = {}
        for name, fn in fns.items():
            try:
                times[name] = gpu_time_ms(fn, warmup=warmup, repeats=repeats)
            except Exception as failure:
                times[name] = failure
        return times


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


@dataclasses.dataclass(frozen=True)
class Ceilings:
    """What the GPU measurably does at best, timed in the same run as the benchmarks.

    copy_gb_per_s: a device-to-device copy, counting the bytes read plus the bytes written (the
        ceiling of memory-bound ops, whose GB/s count their reads plus writes the same way).
    gemm_tflop_per_s: cuBLAS (torch.matmul) on fp16 GEMM_SIZE^3, 2*M*N*K FLOPs per product.
    """

    copy_gb_per_s: float
    gemm_tflop_per_s: float

    def for_unit(self, unit: str) -> float:
        """The ceiling in `unit` ("GB/s" or "TFLOP/s")."""
        if unit == "GB/s":
            return self.copy_gb_per_s
        if unit == "TFLOP/s":
            return self.gemm_tflop_per_s
        raise ValueError(f"no ceiling for the unit {unit!r}; expected 'GB/s' or 'TFLOP/s'")


def _copy_ms(warmup: int, repeats: int) -> float:
    source = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    return gpu_time_ms(lambda: target.copy_(source), warmup=warmup, repeats=repeats)


def _gemm_ms(warmup: int, repeats: int) -> float:
    a = torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda", dtype=torch.float16)
    b = torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda", dtype=torch.float16)
    return gpu_time_ms(lambda: torch.matmul(a, b), warmup=warmup, repeats=repeats)


def measure_ceilings(*, warmup: int = 5, repeats: int = 30) -> Ceilings:
    """Time a COPY_BYTES device-to-device copy and an fp16 GEMM_SIZE^3 torch.matmul on the current GPU."""
    copy_ms = _copy_ms(warmup, repeats)
    gemm_ms = _gemm_ms(warmup, repeats)
    return Ceilings(copy_gb_per_s=2 * COPY_BYTES / copy_ms / 1e6,
                    gemm_tflop_per_s=2 * GEMM_SIZE**3 / gemm_ms / 1e9)
