"""LayerNorm and RMSNorm: forward and backward bandwidth of fusedops against torch eager and
torch.compile, next to a device-to-device copy of the same number of bytes timed side by side with them.

    python bench/layernorm.py [--out DIR] [--name NAME] [--quick] [--ops layer_norm,rms_norm]
                              [--dtypes fp16,bf16] [--no-compile] [--sweep]

Shapes: M = 8192 rows x N in {1024, 2048, 4096, 8192, 16384, 32768} and the N in {1000, 2049, 4097, 12289}
(--quick: N in {1024, 8192, 32768}, float16 only). Inputs: x ~ N(0, 1), weight ~ 1 + N(0, 0.1^2), bias ~
N(0, 0.1^2), dy ~ N(0, 1).

GB/s counts the bytes one call must read plus write, as fusedops/bench/cases.py does:
    forward:  x and y (M*N elements each), weight and bias (N each);
    backward: x, dy and dx (M*N each), weight, dweight and dbias (N each), mean and rstd (float32,
              8 bytes a row);
RMSNorm has no bias and 4 bytes of statistics a row. "copy" is torch's copy_ of a buffer of half that
many bytes (so the same bytes read plus written); fraction_of_copy = copy time / provider time. The copy
and the providers of a shape are timed in interleaved rounds (interleaved_gpu_times_ms: a clock or power
change falls on all of them alike; a copy timed apart moved a fraction by up to 0.15 between runs).
The backward is timed as torch.autograd.grad of the op's output (graph built once, retained), twice per
provider: called from Python as a training step calls it ("fusedops", "torch": at small N the host side,
autograd's engine and the op's Python, takes longer than the kernels, for torch too), and captured once in
a CUDA graph and replayed ("fusedops (graph)", "torch (graph)": the same kernels, the GPU time alone, as
triton.testing.do_bench_cudagraph measures it). The backward's acceptance compares the graph rows; the
table shows both.

--sweep also times other fusedops kernel configurations (warps, fused or split backward, programs per
SM; ForwardConfig in fusedops/kernels/norm_forward_config.py, BackwardConfig in norm_backward_config.py), to
tune the heuristics there.
Acceptance (issue 5), printed at the end for LayerNorm: forward >= 90% of the copy and >= torch, and
backward >= 2x torch, at every N from 1024 to 32768.
Outputs: a table on stdout; OUT/NAME.csv, OUT/NAME.json and OUT/NAME.png (--name, default layernorm).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from timing import times_or_failures_ms, write_rows  # noqa: E402

import fusedops  # noqa: E402
from fusedops.bench import scripts  # noqa: E402
from fusedops.bench.report import format_table, plot_message, plot_op  # noqa: E402
from fusedops.kernels.norm_backward_config import BackwardConfig  # noqa: E402
from fusedops.kernels.norm_forward_config import ForwardConfig  # noqa: E402
from fusedops.kernels.norms import norm_backward, norm_forward  # noqa: E402

M = 8192
COLUMNS = (1000, 1024, 2048, 2049, 4096, 4097, 8192, 12289, 16384, 32768)
QUICK_COLUMNS = (1024, 8192, 32768)
DTYPES = scripts.HALF_DTYPES
TABLE = ("op", "shape", "dtype", "provider", "ms", "GB/s", "fraction_of_copy", "vs torch", "error")


@dataclasses.dataclass(frozen=True)
class Op:
    name: str
    has_bias: bool
    stat_bytes: int            # per row, read by the backward

    def torch_fn(self, n):
        if self.has_bias:
            return lambda x, w, b: F.layer_norm(x, (n,), w, b)
        return lambda x, w: F.rms_norm(x, (n,), w)

    def fusedops_fn(self, n):
        if self.has_bias:
            return lambda x, w, b: fusedops.layer_norm(x, (n,), w, b)
        return lambda x, w: fusedops.rms_norm(x, (n,), w)

    def bytes(self, n, size, backward):
        vectors = (2 if self.has_bias else 1) + (1 if backward else 0)     # weight (and bias), their grads
        if backward:
            return (3 * M * n + vectors * n) * size + self.stat_bytes * M
        return (2 * M * n + vectors * n) * size


OPS = {"layer_norm": Op("layer_norm", True, 8), "rms_norm": Op("rms_norm", False, 4)}


def _inputs(op, n, dtype):
    generator = torch.Generator(device="cuda").manual_seed(n)
    x = torch.randn((M, n), dtype=dtype, device="cuda", generator=generator)
    w = 1 + 0.1 * torch.randn(n, dtype=dtype, device="cuda", generator=generator)
    params = (w, 0.1 * torch.randn(n, dtype=dtype, device="cuda", generator=generator)) if op.has_bias else (w,)
    dy = torch.randn((M, n), dtype=dtype, device="cuda", generator=generator)
    return (x,) + params, dy


def _timed_call(fn, inputs, dy, backward):
    """(a no-argument callable running one forward or backward, its result for checking)."""
    if not backward:
        return (lambda: fn(*inputs)), fn(*inputs)
    leaves = tuple(t.detach().requires_grad_() for t in inputs)
    out = fn(*leaves)

    def run():
        return torch.autograd.grad(out, leaves, dy, retain_graph=True)
    return run, run()


def _graph_call(fn, inputs, dy):
    """(the backward of _timed_call captured in a CUDA graph: its replay, its result), or None where the
    capture fails. The forward runs on the capture stream too, so that autograd runs the backward there."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    for attempt in range(2):       # a first capture in a process can fail on lazy initialization
        try:
            with torch.cuda.stream(stream):
                run, result = _timed_call(fn, inputs, dy, True)
                for _ in range(3):
                    run()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=stream):
                    captured = run()
            torch.cuda.current_stream().wait_stream(stream)
            return graph.replay, captured
        except RuntimeError:
            torch.cuda.synchronize()
    return None


def _providers(op, n, compile_torch):
    providers = {"fusedops": op.fusedops_fn(n), "torch": op.torch_fn(n)}
    if compile_torch:
        # Every shape's lambda shares one code object: without a reset, dynamo's recompile limit would
        # send later shapes back to eager without a word.
        torch._dynamo.reset()
        providers["torch.compile"] = torch.compile(op.torch_fn(n), dynamic=False)
    return providers


def _label(config) -> str:
    """A short provider name for a kernel configuration."""
    if isinstance(config, ForwardConfig):
        kind = "looped" if config.looped else f"rows={config.block_rows}"
        return f"fusedops fwd({kind},n={config.block_n},w={config.num_warps})"
    if config.split:
        return (f"fusedops bwd(split,rows={config.block_rows},w={config.num_warps},per_sm={config.programs_per_sm},"
                f"prefetch={int(config.prefetch)};dx n={config.input_block_n},w={config.input_num_warps})")
    return (f"fusedops bwd(fused,rows={config.block_rows},n={config.block_n},w={config.num_warps},"
            f"per_sm={config.programs_per_sm},prefetch={int(config.prefetch)})")


def _sweep_calls(op, n, dtype, inputs, dy, backward):
    """(label, callable) of fusedops kernel configurations other than the default, run through the
    launchers (no autograd): for tuning the heuristics."""
    x, w = inputs[0], inputs[1]
    b = inputs[2] if op.has_bias else None
    block_n = 1 << (n - 1).bit_length()
    calls = []
    if not backward:
        configs = [ForwardConfig(False, rows, block_n, warps) for rows in (1, 2, 4, 8) for warps in (4, 8, 16, 32)
                   if block_n * dtype.itemsize <= 64 * 1024 and 4 <= rows * block_n // (32 * warps) <= 64]
        configs += [ForwardConfig(True, 1, chunk, warps) for chunk, warps in ((4096, 8), (8192, 16))]
        for config in configs:
            calls.append((_label(config), lambda c=config: norm_forward(
                x, w, b, 1e-5, subtract_mean=op.has_bias, config=c)))
        return calls
    _, mean, rstd = norm_forward(x, w, b, 1e-5, subtract_mean=op.has_bias)
    configs = [BackwardConfig(split=False, block_rows=max(1, 1024 // block_n), block_n=block_n,
                              num_warps=warps, programs_per_sm=per_sm, prefetch=prefetch)
               for warps in (4, 8, 16) for per_sm in (1, 2, 4, 8) for prefetch in (False, True)
               if block_n * dtype.itemsize <= 16 * 1024 and block_n // (32 * warps) <= 16
               and not (prefetch and warps > 8)]
    configs += [BackwardConfig(split=True, block_rows=rows, block_n=1024, num_warps=warps,
                               programs_per_sm=per_sm, prefetch=prefetch, input_block_rows=1,
                               input_block_n=input_n, input_num_warps=input_warps)
                for rows, warps in ((2, 4), (4, 8)) for per_sm in (2, 4) for prefetch in (False, True)
                for input_n, input_warps in ((2048, 4), (4096, 8))]
    for config in configs:
        calls.append((_label(config), lambda c=config: norm_backward(
            dy, x, w, mean, rstd, subtract_mean=op.has_bias, input_grad=True, weight_grad=True,
            bias_grad=op.has_bias, bias_dtype=dtype, config=c)))
    return calls


def measure(op, n, dtype_name, backward, compile_torch, sweep):
    dtype = DTYPES[dtype_name]
    inputs, dy = _inputs(op, n, dtype)
    nbytes = op.bytes(n, dtype.itemsize, backward)
    name = op.name + ("_backward" if backward else "")
    base = {"op": name, "shape": f"{M}x{n}", "M": M, "N": n, "dtype": dtype_name, "unit": "GB/s", "bytes": nbytes}
    calls, expected, failed = {}, None, {}
    for provider, fn in _providers(op, n, compile_torch).items():
        try:
            run, result = _timed_call(fn, inputs, dy, backward)
        except Exception as error:      # a provider that fails (torch.compile) is a row, not the end of the run
            failed[provider] = scripts.failure_text(error, 120)
            continue
        calls[provider] = (run, result)
        if provider == "torch":
            expected = result
    if backward:
        for provider in ("fusedops", "torch"):
            graph = _graph_call(_providers(op, n, False)[provider], inputs, dy)
            if graph is not None:
                calls[f"{provider} (graph)"] = graph
    if sweep:
        for label, run in _sweep_calls(op, n, dtype, inputs, dy, backward):
            result = run()
            result = result[0] if not backward else tuple(r for r in result if r is not None)
            calls[label] = (run, result)
    times = times_or_failures_ms({scripts.COPY: scripts.copy_call(nbytes),
                                  **{provider: run for provider, (run, _) in calls.items()}})
    copy_ms = times[scripts.COPY]
    if isinstance(copy_ms, Exception):
        raise copy_ms
    base.update({"copy_ms": copy_ms, "copy_GB/s": nbytes / copy_ms / 1e6})
    rows = [dict(base, provider=provider, ms=None, error=text) for provider, text in failed.items()]
    for provider, (run, result) in calls.items():
        ms = times[provider]
        if isinstance(ms, Exception):
            rows.append(dict(base, provider=provider, ms=None, error=scripts.failure_text(ms, 120)))
            continue
        if provider.startswith("fusedops ") and not backward and expected is not None:   # a launcher's (M, N)
            result = result.view(expected.shape)
        error = scripts.relative_error(result, expected) if expected is not None else float("nan")
        rows.append(dict(base, provider=provider, ms=ms, **{"GB/s": nbytes / ms / 1e6},
                         fraction_of_copy=copy_ms / ms, max_error=error, error=f"{error:.1e}"))
    torch_ms = {row["provider"]: row["ms"] for row in rows if row["provider"] in ("torch", "torch (graph)")}
    for row in rows:
        graph = row["provider"].endswith("(graph)")
        reference = torch_ms.get("torch (graph)" if graph else "torch")
        row["vs torch"] = reference / row["ms"] if reference and row["ms"] else None
    return rows


def plot(rows, path):
    """GB/s per shape of the providers (the backward's graph replays included) and, as another bar, of the
    copy of the same bytes (the sweep's configurations left out)."""
    plotted = [row for row in rows if not row["provider"].startswith(("fusedops fwd(", "fusedops bwd("))]
    plotted += [dict(row, provider=scripts.COPY, **{"GB/s": row["copy_GB/s"]})
                for row in rows if row["provider"] == "torch"]
    return plot_op("layernorm", plotted, path)


def acceptance(rows):
    """Lines saying whether issue 5's LayerNorm targets hold at each N in [1024, 32768]."""
    lines = []
    eager = {(row["op"], row["shape"], row["dtype"]): row["vs torch"] for row in rows if row["provider"] == "fusedops"}
    for row in rows:
        if not row["op"].startswith("layer_norm") or not 1024 <= row["N"] <= 32768:
            continue
        if row["provider"] in ("fusedops", "fusedops (graph)") and (row.get("ms") is None or row["vs torch"] is None):
            lines.append(f"FAIL {row['op']} {row['shape']} {row['dtype']} {row['provider']}: not measured "
                         f"({row.get('error') or 'no torch time to compare with'})")
            continue
        if row["op"] == "layer_norm" and row["provider"] == "fusedops":
            ok = row["fraction_of_copy"] >= 0.9 and row["vs torch"] >= 1.0
            need = f"copy fraction {row['fraction_of_copy']:.2f} (>= 0.90), vs torch {row['vs torch']:.2f}x (>= 1)"
        elif row["op"] != "layer_norm" and row["provider"] == "fusedops (graph)":
            ok = row["vs torch"] >= 2.0
            host = eager.get((row['op'], row['shape'], row['dtype']))
            need = (f"GPU time vs torch {row['vs torch']:.2f}x (>= 2); called from Python (host included) "
                    + (f"{host:.2f}x" if host is not None else "not measured"))
        else:
            continue
        lines.append(f"{'PASS' if ok else 'FAIL'} {row['op']} {row['shape']} {row['dtype']}: {need}")
    return lines


def main(argv=None):
    parser = scripts.argument_parser(__doc__)
    parser.add_argument("--name", default="layernorm", type=scripts.file_stem,
                        help="file name stem of the outputs (default: layernorm)")
    parser.add_argument("--quick", action="store_true", help=f"N in {QUICK_COLUMNS}, fp16 only")
    parser.add_argument("--ops", default="layer_norm,rms_norm", type=scripts.choice_list(list(OPS)),
                        help="comma-separated: layer_norm, rms_norm")
    parser.add_argument("--dtypes", default=None, type=scripts.choice_list(list(DTYPES)),
                        help="comma-separated: fp16, bf16 (default both; --quick: fp16)")
    parser.add_argument("--no-compile", action="store_true", help="leave out torch.compile")
    parser.add_argument("--sweep", action="store_true", help="also time other fusedops kernel configurations")
    args = parser.parse_args(argv)
    if not scripts.gpu_available():
        return 0
    ops = [OPS[name] for name in args.ops]
    dtypes = args.dtypes if args.dtypes else (["fp16"] if args.quick else list(DTYPES))
    columns = QUICK_COLUMNS if args.quick else COLUMNS
    rows = []
    for op in ops:
        for dtype_name in dtypes:
            for backward in (False, True):
                for n in columns:
                    measured = measure(op, n, dtype_name, backward, not args.no_compile, args.sweep)
                    rows += measured
                    print(format_table(measured, TABLE), flush=True)
                    torch.cuda.empty_cache()
    print("\n" + format_table(rows, TABLE))
    write_rows(rows, args.out, args.name)
    print(plot_message(plot(rows, Path(args.out) / f"{args.name}.png")))
    for line in acceptance(rows):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
