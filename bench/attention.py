"""Attention: fusedops.scaled_dot_product_attention (flash attention in the DSL) against torch's SDPA with
each backend it has (flash, cuDNN, memory-efficient, math), forward and backward, in the same run.

    python bench/attention.py [--out DIR] [--quick] [--dtypes fp16,bf16] [--seqlens 1024,2048,...]
                              [--head-dims 64,128] [--compile] [--sweep]

Shapes (issue 8): B * S = 16k tokens, H * E = 2048 (E in {64, 128}), L = S in {1k, 2k, 4k, 8k, 16k},
causal and not. TFLOP/s counts 4 * B * H * L * S * E for the forward (halved when causal) and 2.5x
that for the backward (dQ, dK, dV and the recomputed S = Q K^T). Times are CUDA-event medians with
the L2 flushed before each run; the backward times torch.autograd.grad on a saved graph. A backend
that refuses a shape is reported as such and skipped. --compile adds torch.compile of the math
attention as a provider. Results: a table on stdout, attention.csv / attention.json (rows stamped
with the GPU, torch and fusedops versions) and attention.png in --out.

--sweep instead times the kernels' launch configs (fusedops.kernels.attention_configs.sweep_configs: the
FORWARD_CONFIGS / BACKWARD_CONFIGS table entry, marked *, and its alternatives), fp16, forward and
backward, at S in {1024, 4096} (or --seqlens), E in --head-dims, causal and not, with torch's flash
backend as the reference column; a compact table (TFLOP/s per config and shape, the best per shape)
and attention_sweep.csv / .json: the rows to pick the table from. About two minutes on an H200,
most of it compiling.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from timing import gpu_time_ms, write_rows  # noqa: E402

import fusedops  # noqa: E402
from fusedops.bench import report, scripts  # noqa: E402
from fusedops.kernels import attention as kernels  # noqa: E402
from fusedops.kernels.attention_configs import head_block, sweep_configs  # noqa: E402

TOKENS = 16 * 1024
MODEL_DIM = 2048
SEQLENS = [1024, 2048, 4096, 8192, 16384]
QUICK_SEQLENS = [4096]
HEAD_DIMS = [64, 128]
DTYPES = scripts.HALF_DTYPES
MATH_MAX_SEQLEN = 4096          # the math backend materializes (B, H, L, S) scores
SWEEP_SEQLENS = [1024, 4096]


def _backend_sdpa(backend):
    from torch.nn.attention import sdpa_kernel

    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def _math_attention(q, k, v, causal):
    s = (q @ k.transpose(-1, -2)) * (q.size(-1) ** -0.5)
    if causal:
        length_q, length_k = s.shape[-2:]
        s = s.masked_fill(~torch.ones(length_q, length_k, dtype=torch.bool, device=s.device).tril(), -math.inf)
    return torch.softmax(s.float(), -1).to(q.dtype) @ v


def providers(compile_math: bool) -> dict:
    from torch.nn.attention import SDPBackend
    table = {"fusedops": lambda q, k, v, causal: fusedops.scaled_dot_product_attention(q, k, v, is_causal=causal)}
    for name, backend in (("torch-flash", "FLASH_ATTENTION"), ("torch-cudnn", "CUDNN_ATTENTION"),
                          ("torch-efficient", "EFFICIENT_ATTENTION"), ("torch-math", "MATH")):
        if hasattr(SDPBackend, backend):
            table[name] = _backend_sdpa(getattr(SDPBackend, backend))
    if compile_math:
        table["torch.compile"] = torch.compile(_math_attention)
    return table


def _inputs(batch, heads, length, dim, dtype):
    generator = torch.Generator(device="cuda").manual_seed(0)
    shape = (batch, heads, length, dim)
    q, k, v, grad_out = (torch.randn(shape, device="cuda", dtype=dtype, generator=generator) for _ in range(4))
    return [t.requires_grad_() for t in (q, k, v)], grad_out


def bench_point(dtype_name, length, dim, causal, table, repeats):
    dtype = DTYPES[dtype_name]
    batch, heads = TOKENS // length, MODEL_DIM // dim
    (q, k, v), grad_out = _inputs(batch, heads, length, dim, dtype)
    forward_flops = 4.0 * batch * heads * length * length * dim * (0.5 if causal else 1.0)
    label = {"dtype": dtype_name, "B": batch, "H": heads, "S": length, "E": dim, "causal": causal}
    reference = reference_grads = None
    rows, torch_flash = [], {}
    for provider, fn in table.items():
        if provider in ("torch-math", "torch.compile") and length > MATH_MAX_SEQLEN:
            continue
        try:
            out = fn(q, k, v, causal)            # compiles outside the timed region
            grads = torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)
        except Exception as error:              # a backend refusing a shape must not lose the others
            rows.append(dict(label, provider=provider, error=scripts.failure_text(error, 160)))
            print(f"{provider} failed at {label}: {rows[-1]['error']}")
            continue
        if reference is None:                   # fusedops runs first; torch-flash checks it below
            reference, reference_grads = out.detach(), grads
        forward_ms = gpu_time_ms(lambda: fn(q, k, v, causal), warmup=3, repeats=repeats)
        backward_ms = gpu_time_ms(lambda: torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True),
                                  warmup=3, repeats=repeats)
        for pass_name, ms, flops in (("forward", forward_ms, forward_flops), ("backward", backward_ms,
                                                                              2.5 * forward_flops)):
            row = dict(label, provider=provider, **{"pass": pass_name}, ms=ms, **{"TFLOP/s": flops / ms / 1e9})
            if provider == "torch-flash":
                torch_flash[pass_name] = ms
            rows.append(row)
        if provider != "fusedops":              # agreement with fusedops (relative, vs this backend)
            rows[-2]["rel_diff"] = scripts.relative_error(reference, out)
            rows[-1]["rel_diff"] = scripts.relative_error(reference_grads, grads)
    for row in rows:
        if "ms" in row and row["pass"] in torch_flash:
            row["vs flash"] = torch_flash[row["pass"]] / row["ms"]
    return rows


COLUMNS = ["dtype", "B", "H", "S", "E", "causal", "pass", "provider", "ms", "TFLOP/s", "vs flash", "rel_diff"]


def format_table(rows) -> str:
    """The rows as a table; a provider that failed shows the start of its error where its time would be."""
    shown = [row if "ms" in row else dict(row, ms=row.get("error", "")[:15]) for row in rows]
    return report.format_fixed_width(shown, COLUMNS, 15, {"vs flash": "{:.2f}x", "rel_diff": "{:.1e}"})


def _draw(axis, rows, panel):
    dtype, dim, causal, pass_name = panel
    for provider in dict.fromkeys(r["provider"] for r in rows):
        points = sorted((r["S"], r["TFLOP/s"]) for r in rows
                        if (r["dtype"], r["E"], r["causal"], r["pass"], r["provider"]) == (*panel, provider))
        if points:
            axis.plot(*zip(*points), marker="o", label=provider)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("S")
    axis.set_ylabel("TFLOP/s")
    axis.set_title(f"{pass_name} {dtype} E={dim}{' causal' if causal else ''}", fontsize=9)
    axis.legend(fontsize=7)


def plot(rows, path):
    """TFLOP/s against S, one line per provider, a panel per (dtype, E, causal, pass)."""
    rows = [r for r in rows if "TFLOP/s" in r]
    panels = sorted({(r["dtype"], r["E"], r["causal"], r["pass"]) for r in rows})
    return report.plot_panels(path, panels, lambda axis, panel: _draw(axis, rows, panel), columns=len(panels),
                              panel_size=(5, 4))


# -- --sweep: the kernels' launch configs -----------------------------------------------------------------

def _config_name(config) -> str:
    name = f"{config.block_m}x{config.block_n}w{config.num_warps}s{config.num_stages}"
    return (name + ("kvring" if config.kv_ring else "") + ("dqa" if config.dq_atomic else "")
            + ("hm" if config.head_major else ""))


def _sweep_timings(run, reference, repeats):
    """(ms, relative difference to `reference`) of `run()`, or (None, error text) when it fails."""
    try:
        result = run()                           # compiles outside the timed region
        diff = scripts.relative_error(result, reference)
        return gpu_time_ms(run, warmup=3, repeats=repeats), diff
    except Exception as error:                   # a config that fails must not lose the others
        return None, scripts.failure_text(error, 120)


def sweep_point(length, dim, causal, repeats):
    """Rows timing every forward config and backward config pair of sweep_configs at one shape (fp16)."""
    batch, heads = TOKENS // length, MODEL_DIM // dim
    (q, k, v), grad_out = _inputs(batch, heads, length, dim, torch.float16)
    q, k, v = (t.detach() for t in (q, k, v))
    scale = dim ** -0.5
    forward_flops = 4.0 * batch * heads * length * length * dim * (0.5 if causal else 1.0)
    label = {"S": length, "E": dim, "causal": causal}
    block = head_block(dim)
    forward_configs, backward_pairs = sweep_configs(block, block)
    from torch.nn.attention import SDPBackend
    flash = _backend_sdpa(SDPBackend.FLASH_ATTENTION)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    flash_out = flash(qg, kg, vg, causal)
    flash_ms = {"forward": gpu_time_ms(lambda: flash(qg, kg, vg, causal), warmup=3, repeats=repeats),
                "backward": gpu_time_ms(lambda: torch.autograd.grad(flash_out, (qg, kg, vg), grad_out,
                                                                    retain_graph=True), warmup=3, repeats=repeats)}
    flash_grads = torch.autograd.grad(flash_out, (qg, kg, vg), grad_out)
    rows = []
    o, lse = kernels.attention_forward(q, k, v, None, causal, scale, config=forward_configs[0])
    for index, config in enumerate(forward_configs):
        ms, diff = _sweep_timings(lambda: kernels.attention_forward(q, k, v, None, causal, scale, config=config)[0],
                                  flash_out.detach(), repeats)
        rows.append(dict(label, **{"pass": "forward"}, config=("*" if index == 0 else "") + _config_name(config),
                         ms=ms, flops=forward_flops, flash_ms=flash_ms["forward"], rel_diff=diff))
    for index, (kv_config, q_config) in enumerate(backward_pairs):
        ms, diff = _sweep_timings(
            lambda: kernels.attention_backward(grad_out, q, k, v, o, lse, None, causal, scale,
                                               configs=(kv_config, q_config)), flash_grads, repeats)
        name = f"kv{_config_name(kv_config)}/q{_config_name(q_config)}"
        rows.append(dict(label, **{"pass": "backward"}, config=("*" if index == 0 else "") + name, ms=ms,
                         flops=2.5 * forward_flops, flash_ms=flash_ms["backward"], rel_diff=diff))
    for row in rows:
        if row["ms"] is not None:
            row["TFLOP/s"] = row["flops"] / row["ms"] / 1e9
            row["vs flash"] = row["flash_ms"] / row["ms"]
        else:
            row["error"] = row.pop("rel_diff")
    return rows


def format_sweep(rows) -> str:
    """One line per (pass, E, config), numbered: TFLOP/s at each (S, causal) and the ratio to torch's
    flash backend; a line per (pass, E) with the fastest config of each shape (its number) and its
    speedup over the table's entry (config #0, marked *)."""
    shapes = sorted({(r["S"], r["causal"]) for r in rows})
    heads = [f"S{s}{'c' if c else ''}" for s, c in shapes]
    lines = [f"{'pass':8s} {'E':>3s}  {'#':>2s} {'config':30s}" + "".join(f"{h:>16s}" for h in heads)]
    for pass_name in ("forward", "backward"):
        for dim in sorted({r["E"] for r in rows}):
            group = [r for r in rows if r["pass"] == pass_name and r["E"] == dim]
            configs = list(dict.fromkeys(r["config"] for r in group))
            for number, config in enumerate(configs):
                cells = []
                for s, c in shapes:
                    row = next((r for r in group if r["config"] == config and (r["S"], r["causal"]) == (s, c)), None)
                    if row is None or "TFLOP/s" not in row:
                        cells.append(f"{'failed' if row else '':>16s}")
                    else:
                        cells.append(f"{row['TFLOP/s']:8.1f} ({row['vs flash']:.2f}x)")
                lines.append(f"{pass_name:8s} {dim:3d}  {number:2d} {config:30s}" + "".join(f"{cell:>16s}" for cell in cells))
            best = []
            for s, c in shapes:
                timed = {r["config"]: r for r in group if (r["S"], r["causal"]) == (s, c) and "TFLOP/s" in r}
                if not timed:
                    best.append("")
                    continue
                fastest = max(timed.values(), key=lambda r: r["TFLOP/s"])
                entry = timed.get(configs[0])
                gain = f" {fastest['TFLOP/s'] / entry['TFLOP/s']:.2f}x" if entry else ""
                best.append(f"#{configs.index(fastest['config'])}{gain}")
            lines.append(f"{pass_name:8s} {dim:3d}  {'':2s} {'best (vs #0)':30s}" + "".join(f"{b:>16s}" for b in best))
    failures = [r for r in rows if "error" in r]
    lines += [f"failed: {r['pass']} {r['config']} S={r['S']} E={r['E']} causal={r['causal']}: {r['error']}"
              for r in failures]
    return "\n".join(lines)


def run_sweep(args, repeats):
    seqlens = args.seqlens or SWEEP_SEQLENS
    rows = []
    for dim in args.head_dims:
        for length in seqlens:
            for causal in (False, True):
                rows.extend(sweep_point(length, dim, causal, repeats))
                print(f"swept S={length} E={dim} causal={causal}", flush=True)
    print(format_sweep(rows))
    write_rows([{k: v for k, v in row.items() if k != "flops"} for row in rows], args.out, "attention_sweep")


def main(argv=None):
    parser = scripts.argument_parser(__doc__, quick=f"S in {QUICK_SEQLENS}")
    parser.add_argument("--seqlens", default=None, type=scripts.int_list,
                        help="comma-separated sequence lengths (default: the issue's)")
    parser.add_argument("--head-dims", default="64,128", type=scripts.int_list, help="comma-separated head dims")
    parser.add_argument("--compile", action="store_true", help="add torch.compile of the math attention")
    parser.add_argument("--sweep", action="store_true", help="time the kernels' launch configs instead (fp16)")
    args = parser.parse_args(argv)
    for option, values, total in (("--seqlens", args.seqlens or (), TOKENS),
                                  ("--head-dims", args.head_dims, MODEL_DIM)):
        bad = [value for value in values if total % value]
        if bad:     # B = TOKENS // S and H = MODEL_DIM // E keep the 16k tokens and model width
            parser.error(f"argument {option}: {', '.join(map(str, bad))} does not divide {total}")
    if not torch.cuda.is_available():
        sys.exit("bench/attention.py needs a CUDA GPU")
    if args.sweep:
        return run_sweep(args, scripts.run_repeats(args))
    dtypes = scripts.run_dtypes(args)
    seqlens = args.seqlens if args.seqlens else (QUICK_SEQLENS if args.quick else SEQLENS)
    head_dims = args.head_dims
    table = providers(args.compile)
    repeats = scripts.run_repeats(args)
    rows = []
    for dtype_name in dtypes:
        for dim in head_dims:
            for length in seqlens:
                for causal in (False, True):
                    point = bench_point(dtype_name, length, dim, causal, table, repeats)
                    print(format_table(point))
                    rows.extend(point)
    print()
    print(format_table(rows))
    write_rows(rows, args.out, "attention")
    print(report.plot_message(plot(rows, Path(args.out) / "attention.png")))


if __name__ == "__main__":
    main()
