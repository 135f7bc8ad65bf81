"""Vector add: bandwidth against torch's device-to-device copy of the same bytes, host launch
overhead of a cached tiny launch against torch.add, and cold / warm (disk cache) compile times.

    python bench/vector_add.py [--out DIR]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from timing import host_time_us, interleaved_gpu_times_ms, write_rows  # noqa: E402

import fusedops.dsl as dsl  # noqa: E402
from fusedops.bench import report, scripts  # noqa: E402


@dsl.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: dsl.constexpr):
    # x_ptr, y_ptr, out_ptr: (n,) tensors of one dtype; 64-bit offsets
    offsets = dsl.program_id(0).to(dsl.int64) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    x = dsl.load(x_ptr + offsets, mask=mask)
    y = dsl.load(y_ptr + offsets, mask=mask)
    dsl.store(out_ptr + offsets, x + y, mask=mask)


def add(x, y, out, block=2048, num_warps=4):
    n = x.numel()
    add_kernel[(dsl.cdiv(n, block),)](x, y, out, n, BLOCK=block, num_warps=num_warps)


def bandwidth_row(n, dtype, provider, ms, nbytes, copy_ms) -> dict:
    """One bandwidth row (and of vector_add.csv, whose columns are these keys, in this order)."""
    return {"op": "vector_add", "n": n, "dtype": str(dtype).replace("torch.", ""), "provider": provider, "ms": ms,
            "GB/s": nbytes / ms / 1e6, "copy_GB/s": nbytes / copy_ms / 1e6, "fraction_of_copy": copy_ms / ms}


def bandwidth_rows():
    rows = []
    for dtype in (torch.float16, torch.float32):
        for n in (1 << 20, 1 << 24, 1 << 27, (1 << 27) + 1000):
            x = torch.randn(n, device="cuda", dtype=dtype)
            y = torch.randn(n, device="cuda", dtype=dtype)
            out = torch.empty_like(x)
            nbytes = 3 * n * x.element_size()
            fns = {f"fusedops(block={block},warps={warps})": (lambda b=block, w=warps: add(x, y, out, b, w))
                   for block, warps in ((1024, 4), (2048, 4), (4096, 8))}
            for fn in fns.values():
                out.fill_(float("nan"))
                fn()
                assert torch.equal(out, x + y)
            fns["torch.add"] = lambda: torch.add(x, y, out=out)
            # the copy of the same bytes in interleaved rounds with the providers (`interleaved_gpu_times_ms`)
            times = interleaved_gpu_times_ms({scripts.COPY: scripts.copy_call(nbytes), **fns}, rounds=5, warmup=3,
                                             repeats=50)
            rows += [bandwidth_row(n, dtype, name, times[name], nbytes, times[scripts.COPY]) for name in fns]
    return rows


def overhead_rows():
    x = torch.randn(1024, device="cuda")
    out = torch.empty_like(x)
    add(x, x, out)
    ours = host_time_us(lambda: add_kernel[(1,)](x, x, out, 1024, BLOCK=1024))
    theirs = host_time_us(lambda: torch.add(x, x, out=out))
    return [{"op": "launch_overhead", "provider": "fusedops", "us_per_launch": ours},
            {"op": "launch_overhead", "provider": "torch.add", "us_per_launch": theirs}]


def compile_rows():
    x = torch.randn(4096, device="cuda")
    rows = []
    with tempfile.TemporaryDirectory() as cache_dir:
        os.environ["FUSEDOPS_CACHE_DIR"] = cache_dir
        for label in ("cold", "warm (disk cache)"):
            kernel = dsl.jit(add_kernel.fn)     # a fresh JITFunction: no in-memory cache
            t0 = time.perf_counter()
            kernel[(4,)](x, x, x, 4096, BLOCK=1024)
            torch.cuda.synchronize()
            rows.append({"op": "compile", "provider": label, "seconds": time.perf_counter() - t0})
    return rows


def main(argv=None):
    args = scripts.argument_parser(__doc__, outputs="CSV/JSON").parse_args(argv)
    if not scripts.gpu_available():
        return 0
    rows = compile_rows() + overhead_rows() + bandwidth_rows()
    for row in rows:
        print(report.format_key_values(row))
    write_rows(rows, args.out, "vector_add")
    return 0


if __name__ == "__main__":
    sys.exit(main())
