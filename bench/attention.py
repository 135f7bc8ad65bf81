"""Attention: fusedops.scaled_dot_product_attention (flash attention in the DSL) against torch's SDPA with
each backend it has (flash, cuDNN, memory-efficient, math), forward and backward, in the same run.

    python bench/attention.py [--out DIR] [--quick] [--dtypes fp16,bf16] [--seqlens 1024,2048,...]
                              [--head-dims 64,128] [--compile]

Shapes (issue 8): B * S = 16k tokens, H * E = 2048 (E in {64, 128}), L = S in {1k, 2k, 4k, 8k, 16k},
causal and not. TFLOP/s counts 4 * B * H * L * S * E for the forward (halved when causal) and 2.5x
that for the backward (dQ, dK, dV and the recomputed S = Q K^T). Times are CUDA-event medians with
the L2 flushed before each run; the backward times torch.autograd.grad on a saved graph. A backend
that refuses a shape is reported as such and skipped. --compile adds torch.compile of the math
attention as a provider. Results: a table on stdout, attention.csv / attention.json (rows stamped
with the GPU, torch and fusedops versions) and attention.png in --out.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from timing import gpu_time_ms, write_rows  # noqa: E402

import fusedops  # noqa: E402

TOKENS = 16 * 1024
MODEL_DIM = 2048
SEQLENS = [1024, 2048, 4096, 8192, 16384]
QUICK_SEQLENS = [4096]
HEAD_DIMS = [64, 128]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
MATH_MAX_SEQLEN = 4096          # the math backend materializes (B, H, L, S) scores


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


def _error(x, reference):
    return float(torch.linalg.vector_norm(x.float() - reference.float()) / torch.linalg.vector_norm(reference.float()))


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
            rows.append(dict(label, provider=provider, error=f"{type(error).__name__}: {str(error)[:160]}"))
            print(f"{provider} failed at {label}: {type(error).__name__}: {str(error)[:160]}")
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
            rows[-2]["rel_diff"] = _error(reference, out)
            rows[-1]["rel_diff"] = max(_error(a, b) for a, b in zip(reference_grads, grads))
    for row in rows:
        if "ms" in row and row["pass"] in torch_flash:
            row["vs flash"] = torch_flash[row["pass"]] / row["ms"]
    return rows


def print_table(rows):
    columns = ["dtype", "B", "H", "S", "E", "causal", "pass", "provider", "ms", "TFLOP/s", "vs flash", "rel_diff"]
    print("  ".join(f"{c:>15}" for c in columns))
    for row in rows:
        cells = []
        for c in columns:
            value = row.get(c, row.get("error", "")[:15] if c == "ms" else None)
            if isinstance(value, float):
                value = f"{value:.2f}x" if c == "vs flash" else (f"{value:.1e}" if c == "rel_diff" else f"{value:.3f}")
            cells.append(f"{'' if value is None else value:>15}")
        print("  ".join(cells))


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    rows = [r for r in rows if "TFLOP/s" in r]
    panels = sorted({(r["dtype"], r["E"], r["causal"], r["pass"]) for r in rows})
    figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for axis, (dtype, dim, causal, pass_name) in zip(axes[0], panels):
        for provider in dict.fromkeys(r["provider"] for r in rows):
            points = sorted((r["S"], r["TFLOP/s"]) for r in rows if (r["dtype"], r["E"], r["causal"], r["pass"],
                                                                      r["provider"]) == (dtype, dim, causal,
                                                                                         pass_name, provider))
            if points:
                axis.plot(*zip(*points), marker="o", label=provider)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("S")
        axis.set_ylabel("TFLOP/s")
        axis.set_title(f"{pass_name} {dtype} E={dim}{' causal' if causal else ''}", fontsize=9)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    print(f"plot: {path}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench-results", help="directory for CSV/JSON/PNG results")
    parser.add_argument("--quick", action="store_true", help=f"fp16 only, S in {QUICK_SEQLENS}, fewer repeats")
    parser.add_argument("--dtypes", default="fp16,bf16", help="comma-separated: fp16, bf16")
    parser.add_argument("--seqlens", default=None, help="comma-separated sequence lengths (default: the issue's)")
    parser.add_argument("--head-dims", default="64,128", help="comma-separated head dims")
    parser.add_argument("--compile", action="store_true", help="add torch.compile of the math attention")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench/attention.py needs a CUDA GPU")
    dtypes = ["fp16"] if args.quick else args.dtypes.split(",")
    seqlens = [int(s) for s in args.seqlens.split(",")] if args.seqlens else (QUICK_SEQLENS if args.quick else SEQLENS)
    head_dims = [int(e) for e in args.head_dims.split(",")]
    table = providers(args.compile)
    repeats = 10 if args.quick else 30
    rows = []
    for dtype_name in dtypes:
        for dim in head_dims:
            for length in seqlens:
                for causal in (False, True):
                    point = bench_point(dtype_name, length, dim, causal, table, repeats)
                    print_table(point)
                    rows.extend(point)
    print()
    print_table(rows)
    write_rows(rows, args.out, "attention")
    plot(rows, os.path.join(args.out, "attention.png"))


if __name__ == "__main__":
    main()
