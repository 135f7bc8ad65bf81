"""Softmax: fusedops against torch.softmax, the naive composed eager version and torch.compile.

    python bench/softmax.py [--out DIR] [--quick] [--dtypes fp16,bf16] [--ns 1024,...] [--log]
                            [--no-compile] [--sweep] [--details]

For M = 8192 rows and N in {1024, ..., 32768, 1000, 50257}, fp16 and bf16, it times
  forward   y = softmax(x)                      bytes: x read + y written      = 2 M N s
  backward  dx from (dy, y) alone               bytes: dy, y read + dx written = 3 M N s
  fwd+bwd   y = softmax(x); y.backward(dy)      bytes: 5 M N s
(s = element size: the least traffic each pass needs) and reports GB/s. A device-to-device copy of as
many bytes (copy_ms) is timed with the providers, in interleaved rounds (`times_or_failures_ms`), and each
provider's fraction of its bandwidth (copy_ms / ms) and speedup over torch are reported. Results: a table on stdout, softmax.csv /
softmax.json (rows stamped with GPU, torch and fusedops versions) and softmax.png under --out.

--sweep also times the forward and backward over alternative fusedops configs (tile, block,
num_warps, one pass or online) at each N: the data to retune kernels/softmax_configs.py's table.
--details prints, per N, the config the dispatcher picks, its registers and spills (ptxas), the
theoretical occupancy and the 128-bit global loads/stores in its SASS (cuobjdump).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from timing import gpu_time_ms, times_or_failures_ms, write_rows  # noqa: E402

import fusedops  # noqa: E402
from fusedops.bench import report, scripts  # noqa: E402
from fusedops.kernels import softmax as K  # noqa: E402
from fusedops.kernels.sizes import next_power_of_2  # noqa: E402
from fusedops.kernels.softmax_configs import Config  # noqa: E402
from fusedops.kernels.softmax_kernels import _backward_kernel, _forward_kernel  # noqa: E402

M = 8192
DEVICE = "cuda"
NS = [1024, 2048, 4096, 8192, 16384, 32768, 1000, 50257]
QUICK_NS = [1024, 4096, 32768, 50257]
DTYPES = scripts.HALF_DTYPES
PASS_BYTES = {"forward": 2, "backward": 3, "fwd+bwd": 5}     # tensors of M x N moved per pass


# ------------------------------------------------------------------------------------------------
# Providers: each returns {pass: fn() -> None} for one (x, dy) pair
# ------------------------------------------------------------------------------------------------
def _naive_forward(x, log):
    shifted = x - x.amax(dim=-1, keepdim=True)
    if log:
        return shifted - shifted.exp().sum(dim=-1, keepdim=True).log()
    numerator = shifted.exp()
    return numerator / numerator.sum(dim=-1, keepdim=True)


def _naive_backward(dy, y, log):
    if log:
        return dy - y.exp() * dy.sum(dim=-1, keepdim=True)
    return y * (dy - (dy * y).sum(dim=-1, keepdim=True))


def _fwd_bwd(forward, x, dy):
    def run():
        x.grad = None
        forward(x).backward(dy)
    return run


def providers(x, dy, log, use_compile):
    """{provider: {pass: fn}} for input x (requires_grad) and output gradient dy."""
    torch_forward = (lambda t: torch.log_softmax(t, -1)) if log else (lambda t: torch.softmax(t, -1))
    ours_forward = (lambda t: fusedops.log_softmax(t, -1)) if log else (lambda t: fusedops.softmax(t, -1))
    with torch.no_grad():
        y = torch_forward(x)
    backward_op = torch.ops.aten._log_softmax_backward_data if log else torch.ops.aten._softmax_backward_data
    result = {
        "fusedops": {
            "forward": lambda: ours_forward(x.detach()),
            "backward": lambda: K.softmax_backward(dy, y, x.dim() - 1, log=log),
            "fwd+bwd": _fwd_bwd(ours_forward, x, dy),
        },
        "torch": {
            "forward": lambda: torch_forward(x.detach()),
            "backward": lambda: backward_op(dy, y, -1, x.dtype),
            "fwd+bwd": _fwd_bwd(torch_forward, x, dy),
        },
        "naive eager": {
            "forward": lambda: _naive_forward(x.detach(), log),
            "backward": lambda: _naive_backward(dy, y, log),
            "fwd+bwd": _fwd_bwd(lambda t: _naive_forward(t, log), x, dy),
        },
    }
    if use_compile:
        compiled_forward = torch.compile(lambda t: _naive_forward(t, log), dynamic=False)
        compiled_backward = torch.compile(lambda g, out: _naive_backward(g, out, log), dynamic=False)
        compiled_training = torch.compile(lambda t: _naive_forward(t, log), dynamic=False)
        result["torch.compile"] = {
            "forward": lambda: compiled_forward(x.detach()),
            "backward": lambda: compiled_backward(dy, y),
            "fwd+bwd": _fwd_bwd(compiled_training, x, dy),
        }
    return result, y


def check(x, dy, y_reference, log):
    """fusedops against torch (loosely: a sanity check, the test suite is the real one)."""
    ours = (fusedops.log_softmax if log else fusedops.softmax)(x.detach(), -1)
    error = (ours.float() - y_reference.float()).abs().max().item()
    scale = y_reference.float().abs().max().item()
    if not error <= 2e-2 * scale:
        raise AssertionError(f"fusedops differs from torch by {error:.3e} (max |y| {scale:.3e})")


# ------------------------------------------------------------------------------------------------
# Measurements
# ------------------------------------------------------------------------------------------------
def bench_shape(dtype_name, n, log, use_compile, repeats):
    dtype = DTYPES[dtype_name]
    x = torch.randn(M, n, device=DEVICE, dtype=dtype).mul_(3).requires_grad_()
    dy = torch.randn(M, n, device=DEVICE, dtype=dtype)
    table, y = providers(x, dy, log, use_compile)
    check(x, dy, y, log)
    op = "log_softmax" if log else "softmax"
    rows = []
    element = x.element_size()
    for pass_name, tensors in PASS_BYTES.items():
        nbytes = tensors * M * n * element
        # the copy of the same bytes timed in interleaved rounds with the providers: a copy timed apart moved
        # the fractions by up to 0.15 between runs (session 31, bench/layernorm.py)
        times = times_or_failures_ms({scripts.COPY: scripts.copy_call(nbytes, DEVICE),
                                      **{name: fns[pass_name] for name, fns in table.items()}}, repeats=repeats)
        reference_ms = times[scripts.COPY]
        if isinstance(reference_ms, Exception):
            raise reference_ms
        torch_ms = times.get("torch")
        torch_ms = None if isinstance(torch_ms, Exception) else torch_ms
        for name in table:
            if not isinstance(times[name], Exception):
                rows.append(result_row(op, pass_name, n, dtype_name, name, times[name], nbytes, reference_ms,
                                       torch_ms))
            else:       # a provider that fails (torch.compile refusing a shape) is a row
                rows.append({"op": op, "pass": pass_name, "M": M, "N": n, "dtype": dtype_name, "provider": name,
                             "ms": None, "error": scripts.failure_text(times[name], 120)})
    return rows


def result_row(op, pass_name, n, dtype_name, provider, ms, nbytes, copy_ms, torch_ms) -> dict:
    """One row of the results (and of softmax.csv, whose columns are these keys, in this order)."""
    return {"op": op, "pass": pass_name, "M": M, "N": n, "dtype": dtype_name, "provider": provider,
            "ms": ms, "GB/s": nbytes / ms / 1e6, "copy_GB/s": nbytes / copy_ms / 1e6,
            "fraction_of_copy": copy_ms / ms, "speedup_vs_torch": None if torch_ms is None else torch_ms / ms}


def sweep_rows(dtype_name, n, log, repeats):
    """fusedops forward and backward over alternative configs at one N (row tiles)."""
    dtype = DTYPES[dtype_name]
    x = torch.randn(M, n, device=DEVICE, dtype=dtype).mul_(3)
    dy = torch.randn_like(x)
    y = K.softmax_forward(x, 1, log=log)
    block = next_power_of_2(n)
    per_thread = range(4, 65)       # elements per thread worth trying
    candidates = [Config("rows", 1, block, True, w) for w in (4, 8, 16, 32)
                  if block <= 32768 and block // (32 * w) in per_thread]
    candidates += [Config("rows", 1, b, False, w) for b in (2048, 4096, 8192, 16384) if b < block
                   for w in (4, 8, 16) if b // (32 * w) in per_thread]
    if block < 2048:
        candidates += [Config("rows", r, block, True, w) for r in (2, 4) for w in (4, 8)]
    rows = []
    for config in candidates:
        for pass_name, fn in (("forward", lambda: K.softmax_forward(x, 1, log=log, config=config)),
                              ("backward", lambda: K.softmax_backward(dy, y, 1, log=log, config=config))):
            row = {"op": "sweep", "pass": pass_name, "N": n, "dtype": dtype_name, "config": str(config)}
            try:
                ms = gpu_time_ms(fn, repeats=repeats)
            except Exception as error:      # a config that does not compile or launch: report, go on
                rows.append(dict(row, error=f"{type(error).__name__}: {error}"[:200]))
                continue
            tensors = PASS_BYTES[pass_name]
            rows.append(dict(row, ms=ms, **{"GB/s": tensors * M * n * x.element_size() / ms / 1e6}))
    return rows


def details(dtype_name, n):
    """The config picked at (M, n), registers, spills, occupancy and SASS vector widths."""
    from fusedops.dsl.target import assemble

    dtype = DTYPES[dtype_name]
    x = torch.empty(M, n, device="cuda", dtype=dtype)
    lines = []
    for direction, kernel, tensors in (("forward", _forward_kernel, (x, x)), ("backward", _backward_kernel,
                                                                             (x, x, x))):
        strides = tuple(t.stride() for t in tensors)
        dtypes = tuple(t.dtype for t in tensors)
        launch = K._plan_launch(x.shape, 1, strides, dtypes, direction == "backward", False, None, None)
        arch = "sm_%d%d" % torch.cuda.get_device_capability()
        arch = arch + "a" if arch == "sm_90" else arch
        compiled = kernel.compile(*tensors, *launch.arguments, target=arch, **launch.constexprs)
        resources = assemble(compiled.asm["ptx"], arch)
        threads = 32 * launch.config.num_warps
        by_registers = 65536 // max(1, resources.registers * threads)
        blocks = max(0, min(by_registers, 2048 // threads, 32))
        try:
            sass = compiled.asm["sass"]
            widths = f"LDG.128 {sass.count('LDG.E.128')}, STG.128 {sass.count('STG.E.128')}, " \
                     f"LDG.64 {sass.count('LDG.E.64')}, LDG.32 {sass.count('LDG.E ')}"
        except KeyError as error:
            widths = f"(no SASS: {error})"
        lines.append(f"{dtype_name} N={n} {direction}: {launch.config}, {resources.registers} registers, "
                     f"{resources.spill_bytes} B spilled, {blocks} blocks/SM = {blocks * threads / 2048:.0%} "
                     f"occupancy (by registers and threads), {widths}")
    return lines


# ------------------------------------------------------------------------------------------------
# Output
# ------------------------------------------------------------------------------------------------
def format_table(rows) -> str:
    """The rows of bench_shape as the table the script prints."""
    header = f"{'pass':8} {'dtype':5} {'N':>6} {'provider':14} {'ms':>9} {'GB/s':>8} {'of copy':>8} {'vs torch':>8}"
    lines = [header, "-" * len(header)]
    for r in rows:
        start = f"{r['pass']:8} {r['dtype']:5} {r['N']:>6} {r['provider']:14} "
        if r.get("ms") is None:
            lines.append(start + f"error: {r.get('error')}")
            continue
        ratio = "" if r["speedup_vs_torch"] is None else f"{r['speedup_vs_torch']:7.2f}x"
        lines.append(start + f"{r['ms']:9.4f} {r['GB/s']:8.0f} {r['fraction_of_copy']:8.1%} {ratio}")
    return "\n".join(lines)


def _draw(axis, rows, panel):
    dtype, pass_name = panel
    subset = [r for r in rows if r["dtype"] == dtype and r["pass"] == pass_name]
    ns = sorted({r["N"] for r in subset})
    for provider in dict.fromkeys(r["provider"] for r in subset):
        points = {r["N"]: r.get("GB/s") for r in subset if r["provider"] == provider}
        axis.plot(range(len(ns)), [points.get(n) for n in ns], marker="o", label=provider)
    copy = {r["N"]: r["copy_GB/s"] for r in subset if "copy_GB/s" in r}      # (not in a failed provider's row)
    axis.plot(range(len(ns)), [copy.get(n) for n in ns], linestyle="--", color="gray", label="d2d copy")
    axis.set_xticks(range(len(ns)), [str(n) for n in ns], rotation=45)
    axis.set_title(f"{rows[0]['op']} {pass_name}, {dtype}, M={M}")
    axis.set_xlabel("N")
    axis.set_ylabel("GB/s")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)


def plot(rows, path):
    """GB/s against N, one line per provider and the copy of as many bytes, a panel per (dtype, pass)."""
    panels = [(dtype, pass_name) for dtype in sorted({r["dtype"] for r in rows}) for pass_name in PASS_BYTES]
    return report.plot_panels(path, panels, lambda axis, panel: _draw(axis, rows, panel), columns=len(PASS_BYTES),
                              panel_size=(6, 4), dpi=120)


def main(argv=None):
    parser = scripts.argument_parser(__doc__, quick=f"N in {QUICK_NS}")
    parser.add_argument("--ns", default=None, type=scripts.int_list,
                        help="comma-separated N values (default: the issue's list)")
    parser.add_argument("--log", action="store_true", help="benchmark log_softmax instead of softmax")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out (it compiles per shape)")
    parser.add_argument("--sweep", action="store_true", help="also time alternative fusedops configs")
    parser.add_argument("--details", action="store_true", help="print config, registers, occupancy, SASS widths")
    args = parser.parse_args(argv)
    if not scripts.gpu_available():
        return 0
    dtypes = scripts.run_dtypes(args)
    ns = args.ns if args.ns else (QUICK_NS if args.quick else NS)
    repeats = scripts.run_repeats(args)
    name = "log_softmax" if args.log else "softmax"
    print(f"{name}: M={M}, N={ns}, {dtypes}, on {torch.cuda.get_device_name()}", flush=True)
    rows = []
    for dtype_name in dtypes:
        for n in ns:
            rows += bench_shape(dtype_name, n, args.log, not args.no_compile, repeats)
            print(f"  {dtype_name} N={n} done", flush=True)
    print(format_table(rows))
    write_rows(rows, args.out, name)
    print(report.plot_message(plot(rows, Path(args.out) / f"{name}.png")))
    if args.details:
        for dtype_name in dtypes:
            for n in ns:
                print("\n".join(details(dtype_name, n)))
    if args.sweep:
        sweep = []
        for dtype_name in dtypes:
            for n in ns:
                sweep += sweep_rows(dtype_name, n, args.log, repeats)
        for r in sweep:
            print(report.format_key_values(r))
        write_rows(sweep, args.out, name + "_sweep")
    return 0


if __name__ == "__main__":
    sys.exit(main())
