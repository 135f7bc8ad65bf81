"""Entry point of the main job: `python -m fusedops.bench` (also installed as `fusedops-bench`).

With a CUDA GPU it runs the benchmark suite, `fusedops.bench.suite.run(args)`. Without one it
prints one line and runs the CPU self-check, `fusedops.bench.selfcheck.run()`, which executes
the library's kernels through the interpreter. Either entry returns an exit status (0 = success;
None counts as 0). A module that is not part of this build yet is reported, with exit status 1,
rather than skipped: the main job must never pass without having run kernels.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from typing import Callable, Optional, Sequence


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="fusedops-bench",
        description="Benchmark fusedops against native PyTorch on a CUDA GPU, "
        "or run the CPU self-check through the interpreter when there is no GPU.",
    )
    parser.add_argument(
        "--selfcheck",
        action="store_true",
        help="run the CPU self-check (interpreter) even when a CUDA GPU is present",
    )
    parser.add_argument(
        "--out",
        default="bench-results",
        help="directory for benchmark results (CSV/JSON and plots); default: %(default)s",
    )
    return parser.parse_args(argv)


def _find_entry(module_name: str) -> Optional[Callable]:
    """Return `module_name.run`, or None when the module is not in this build.

    An ImportError raised *inside* an existing module propagates: only absence is tolerated.
    """
    if importlib.util.find_spec(module_name) is None:
        return None
    return importlib.import_module(module_name).run


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the benchmarks (GPU) or the self-check (no GPU); return the process exit status."""
    args = _parse_args(argv)
    import torch  # after argument parsing, so `--help` stays fast

    if args.selfcheck or not torch.cuda.is_available():
        if not args.selfcheck:
            print("no CUDA GPU: running the CPU self-check", flush=True)
        run = _find_entry("fusedops.bench.selfcheck")
        if run is None:
            print("error: fusedops.bench.selfcheck is not part of this build", file=sys.stderr)
            return 1
        return int(run() or 0)

    run = _find_entry("fusedops.bench.suite")
    if run is None:
        print("error: fusedops.bench.suite is not part of this build", file=sys.stderr)
        return 1
    return int(run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
