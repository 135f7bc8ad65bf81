"""Matmul: fusedops.matmul (tensor cores: wgmma fed by TMA on sm_90a, mma.sync elsewhere; autotuned)
against torch.matmul (cuBLAS) and a Triton 3.6 tutorial-style kernel (bench/triton_reference.py), in the same run.

    python bench/matmul.py [--out DIR] [--quick] [--dtypes fp16,bf16] [--shapes 4096x4096x4096,...]
                           [--epilogue] [--no-triton] [--store-variants]

Shapes (M x N x K): 4096^3, 8192^3 and LLM projections at M = 8192 tokens with N, K in
{4096, 11008, 14336} (up: N = 11008 / 14336, K = 4096; down: N = 4096, K = 11008 / 14336).
For each shape and dtype it reports ms (median of CUDA-event timings, L2 flushed before each run, the
providers timed side by side in rounds: `interleaved_gpu_times_ms`),
TFLOP/s (2 M N K / time) and the ratio to torch.matmul. --epilogue also times
activation(a @ b + bias) fused (fusedops.matmul(a, b, bias, "gelu")) against torch's unfused ops.
--store-variants also times, where the product runs the persistent kernel, that kernel with the config the
autotuner chose and each tile's store inline or deferred into the next tile's first K step
(kernels/matmul_persistent.py DEFERRED_STORE): providers "persistent inline" and "persistent deferred".
The first fusedops call per shape autotunes (compiles every config once, then times them); that is
outside the timed region. Results: a table on stdout, matmul.csv / matmul.json (rows stamped with
the GPU, torch and fusedops versions, and the config the autotuner chose) and matmul.png in --out.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from timing import interleaved_gpu_times_ms, write_rows  # noqa: E402

import fusedops  # noqa: E402
from fusedops.bench import report, scripts  # noqa: E402
from fusedops.kernels import matmul as K  # noqa: E402
from fusedops.kernels.matmul_configs import SMALL_CONFIG  # noqa: E402
from fusedops.kernels import matmul_persistent  # noqa: E402

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 4096, 4096), (8192, 11008, 4096), (8192, 4096, 11008),
          (8192, 14336, 4096), (8192, 4096, 14336)]
QUICK_SHAPES = [(4096, 4096, 4096), (8192, 11008, 4096)]
DTYPES = scripts.HALF_DTYPES


def _triton():
    try:
        import triton_reference
        return triton_reference
    except ImportError:     # triton not installed
        return None


def _inputs(shape, dtype):
    m, n, k = shape
    generator = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=generator)
    b = torch.randn(k, n, device="cuda", dtype=dtype, generator=generator) * k ** -0.5
    bias = torch.randn(n, device="cuda", dtype=dtype, generator=generator)
    return a, b, bias


def _chosen_config(a, b, out):
    """(kernel name, the config fusedops.matmul's autotuner chose for a @ b, or SMALL_CONFIG)."""
    m, n, k = out.shape[0], out.shape[1], a.shape[1]
    # the launch's key: (c, a, b, bias or c, M, N, K); c and bias have a's dtype here
    # (the TMA kernel, when the product took it, has the same leading parameters)
    tuned = K.tuned_matmul_tma_kernel if K._uses_tma(out[None], a[None], b[None]) else K.tuned_matmul_kernel
    chosen = tuned.best.get(tuned.key_of((a, a, b, a, m, n, k), {}))
    return ("tma" if tuned is K.tuned_matmul_tma_kernel else "cp.async"), (chosen or SMALL_CONFIG)


def _store_variants(a, b, out) -> dict:
    """{provider: call}: the persistent kernel with the chosen config, its store inline and deferred; {} where
    the product does not run it."""
    kernel, config = _chosen_config(a, b, out)
    programs = K._persistent_plan(out[None], a.shape[1], config) if kernel == "tma" else None
    if programs is None:
        return {}
    variants = {}
    for name, deferred in (("persistent inline", False), ("persistent deferred", True)):
        c = torch.empty_like(out)
        launch = matmul_persistent.prepare(c, a, b, None, None, config, programs, deferred_store=deferred)
        variants[name] = functools.partial(_launched, launch, c, a, b)
    return variants


def _launched(launch, c, a, b):
    launch(c, a, b, None)
    return c


def bench_shape(shape, dtype_name, triton, epilogue, repeats, store_variants=False):
    dtype = DTYPES[dtype_name]
    a, b, bias = _inputs(shape, dtype)
    m, n, k = shape
    flops = 2.0 * m * n * k
    providers = {"torch": lambda: torch.matmul(a, b), "fusedops": lambda: fusedops.matmul(a, b)}
    if triton is not None:
        providers["triton"] = lambda: triton.matmul(a, b)
    if epilogue:
        providers["torch+gelu"] = lambda: torch.nn.functional.gelu(torch.addmm(bias, a, b))
        providers["fusedops+gelu"] = lambda: fusedops.matmul(a, b, bias, "gelu")
    reference = torch.matmul(a.float(), b.float())
    rows, outputs = [], {}
    if store_variants:
        try:
            providers.update(_store_variants(a, b, providers["fusedops"]()))
        except Exception as error:     # the fusedops row below reports a failing product
            print(f"store variants failed at {m}x{n}x{k} {dtype_name}: {type(error).__name__}: {error}")
    for provider, fn in providers.items():
        try:
            outputs[provider] = fn()      # compiles / autotunes outside the timed region
        except Exception as error:     # one failing provider must not lose the others' numbers
            print(f"{provider} failed at {m}x{n}x{k} {dtype_name}: {type(error).__name__}: {error}")
            rows.append({"op": "matmul", "M": m, "N": n, "K": k, "dtype": dtype_name, "provider": provider,
                         "error": scripts.failure_text(error, 200)})
    # side by side, in rounds: the autotuning above and a long product's heat fall on every provider alike
    times = interleaved_gpu_times_ms({p: providers[p] for p in outputs}, warmup=3, repeats=repeats)
    torch_ms = {"gelu" if p.endswith("gelu") else "plain": times[p] for p in times if p.startswith("torch")}
    for provider, out in outputs.items():
        ms = times[provider]
        ref = torch.nn.functional.gelu(reference + bias.float()) if provider.endswith("gelu") else reference
        family = "gelu" if provider.endswith("gelu") else "plain"
        row = {"op": "matmul", "M": m, "N": n, "K": k, "dtype": dtype_name, "provider": provider, "ms": ms,
               "TFLOP/s": flops / ms / 1e9, "rel_error": scripts.relative_error(out, ref)}
        row["vs torch"] = torch_ms[family] / ms if family in torch_ms else None
        if provider.startswith(("fusedops", "persistent")):
            kernel, config = _chosen_config(a, b, out)
            row["kernel"] = "persistent" if provider.startswith("persistent") else kernel
            row["config"] = str(config)
        rows.append(row)
    return rows


COLUMNS = ["dtype", "M", "N", "K", "provider", "ms", "TFLOP/s", "vs torch", "rel_error"]


def format_table(rows) -> str:
    """The rows as a table, then the config the autotuner chose for each fusedops row."""
    lines = [report.format_fixed_width(rows, COLUMNS, 10, {"vs torch": "{:.2f}x", "rel_error": "{:.2e}"})]
    lines += [f"{row['dtype']} {row['M']}x{row['N']}x{row['K']} {row['provider']} ({row['kernel']} kernel): "
              f"{row['config']}"
              for row in rows if row.get("config")]
    return "\n".join(lines)


def plot(rows, path):
    """TFLOP/s per shape, one bar per provider, a panel per dtype (fusedops.bench.report.plot_op)."""
    shaped = [dict(row, shape=f"{row['M']}x{row['N']}x{row['K']}", unit="TFLOP/s") for row in rows]
    return report.plot_op("matmul", shaped, path)


def main(argv=None):
    parser = scripts.argument_parser(__doc__, quick=f"shapes {QUICK_SHAPES}")
    parser.add_argument("--shapes", default=None, type=scripts.shape_list,
                        help="comma-separated MxNxK (default: the issue's list)")
    parser.add_argument("--epilogue", action="store_true", help="also time bias + gelu fused vs torch")
    parser.add_argument("--no-triton", action="store_true", help="leave the Triton peer out")
    parser.add_argument("--store-variants", action="store_true",
                        help="also time the persistent kernel with its store inline and deferred")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench/matmul.py needs a CUDA GPU")
    dtypes = scripts.run_dtypes(args)
    if args.shapes:
        shapes = args.shapes
    else:
        shapes = QUICK_SHAPES if args.quick else SHAPES
    triton = None if args.no_triton else _triton()
    repeats = scripts.run_repeats(args)
    rows = []
    for dtype_name in dtypes:
        for shape in shapes:
            rows.extend(bench_shape(shape, dtype_name, triton, args.epilogue, repeats, args.store_variants))
            print(format_table([r for r in rows if (r["M"], r["N"], r["K"], r["dtype"]) == (*shape, dtype_name)]))
    print()
    print(format_table(rows))
    write_rows(rows, args.out, "matmul")
    print(report.plot_message(plot(rows, Path(args.out) / "matmul.png")))


if __name__ == "__main__":
    main()
