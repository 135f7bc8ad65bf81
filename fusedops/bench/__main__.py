"""Entry point of the main job: `python -m fusedops.bench` (also installed as `fusedops-bench`).

With a CUDA GPU it benchmarks every op of the case table (cases.py) against native PyTorch,
`runner.run`. Without one it prints one line and runs the CPU self-check, `selfcheck.run`, which
executes the library's kernels through the interpreter and compiles them to PTX. The exit status is
0 on success, 1 when a check failed (or nothing ran), 2 for a usage error.

    python -m fusedops.bench --quick --out bench-results     # on a GPU; meant to take < 1 minute on an H200
    python -m fusedops.bench --ops softmax,layer_norm --dtype fp16,bf16
    python -m fusedops.bench --selfcheck                     # the CPU self-check, GPU or not
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def _comma_list(parser: argparse.ArgumentParser, option: str, text: str, valid: Sequence[str], noun: str) -> tuple:
    items = tuple(dict.fromkeys(item.strip() for item in text.split(",") if item.strip()))
    unknown = [item for item in items if item not in valid]
    if not items or unknown:
        what = f"unknown value(s) {', '.join(unknown)}" if unknown else "an empty list"
        parser.error(f"argument {option}: {what}; valid {noun}: {', '.join(valid)}")
    return items


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fusedops-bench",
        description="Benchmark fusedops against native PyTorch on a CUDA GPU (correctness against a "
                    "float64 reference first, then CUDA-event timing), or run the CPU self-check "
                    "through the interpreter when there is no GPU.",
    )
    parser.add_argument("--ops", metavar="OP[,OP...]",
                        help="comma-separated cases to run, e.g. softmax,matmul_backward (default: all; an "
                             "unknown name lists the valid ones)")
    parser.add_argument("--dtype", metavar="DTYPE[,DTYPE...]",
                        help="comma-separated dtypes among fp16, bf16, fp32 (default: each op's own; "
                             "with --quick its first)")
    parser.add_argument("--quick", action="store_true",
                        help="one or two shapes per op, one dtype, fewer timed runs "
                             "(meant to take under a minute on an H200)")
    parser.add_argument("--out", metavar="DIR", default="bench-results",
                        help="directory for results.csv/json/md and one PNG per op (default: %(default)s)")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile of the PyTorch version")
    parser.add_argument("--triton", action="store_true",
                        help="also time the Triton reference kernels of bench/triton_reference.py, "
                             "where triton is installed")
    parser.add_argument("--selfcheck", action="store_true",
                        help="run the CPU self-check (interpreter, PTX) even when a CUDA GPU is present")
    return parser


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The parsed command line, with `ops` and `dtypes` validated (usage error, exit 2, otherwise)."""
    from .cases import CASES_BY_NAME, DTYPE_NAMES   # imports torch: after --help has had its chance
    from .scripts import output_dir

    parser = _parser()
    args = parser.parse_args(argv)
    if args.ops is not None:
        args.ops = _comma_list(parser, "--ops", args.ops, list(CASES_BY_NAME), "ops")
    args.dtypes = None
    if args.dtype is not None:
        names = _comma_list(parser, "--dtype", args.dtype, list(DTYPE_NAMES), "dtypes")
        args.dtypes = tuple(DTYPE_NAMES[name] for name in names)
    try:
        output_dir(args.out)
    except argparse.ArgumentTypeError as error:
        parser.error(f"argument --out: {error}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the benchmarks (GPU) or the self-check (no GPU); return the process exit status."""
    if argv is None:
        argv = sys.argv[1:]
    if any(arg in ("-h", "--help") for arg in argv):
        _parser().parse_args(argv)      # prints the help and exits without importing torch
    args = parse_args(argv)
    import torch

    if args.selfcheck or not torch.cuda.is_available():
        if not args.selfcheck:
            print("no CUDA GPU: running the CPU self-check", flush=True)
        timing = [option for option, given in (("--quick", args.quick), ("--compile", args.compile),
                                               ("--triton", args.triton), ("--out", args.out != "bench-results"))
                  if given]
        if timing:
            print(f"note: {', '.join(timing)} apply to the GPU benchmark; the self-check writes no files and "
                  "ignores them", flush=True)
        from . import selfcheck

        return selfcheck.run(args.ops, args.dtypes)

    from . import cases, runner

    settings = runner.Settings(cases=cases.select(args.ops), dtypes=args.dtypes, quick=args.quick,
                               compile=args.compile, triton=args.triton, out=args.out)
    return runner.run(settings)


if __name__ == "__main__":
    sys.exit(main())
