"""What the per-op scripts of bench/ share (`python bench/softmax.py`, ...), besides their timing
(fusedops.bench.timing) and their output (fusedops.bench.report: CSV/JSON rows, tables, plots): the
common part of their command line (--out, --quick, --dtypes) and the GPU check, the device-to-device
copy that memory-bound ops are compared with, the relative error of a result against torch's, and the
text that reports a provider's failure.
"""

from __future__ import annotations

import argparse
import os
from typing import Callable, List, Optional, Sequence, Union

import torch


# The dtypes the scripts' --dtypes option takes.
HALF_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
OUT_DEFAULT = "bench-results"


def argument_parser(doc: str, outputs: str = "CSV/JSON/PNG", quick: Optional[str] = None) -> argparse.ArgumentParser:
    """A script's parser: `doc` (its module docstring) as the description, printed as written, and
    `--out DIR` (default bench-results; an existing file there is a usage error), the folder of the result
    files named by `outputs`. With `quick` (what --quick runs, e.g. "N in [1024, 4096]"), also --quick and
    --dtypes fp16,bf16 (a list of names, checked), which run_dtypes() and run_repeats() read."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=OUT_DEFAULT, type=output_dir, help=f"directory for {outputs} results")
    if quick is not None:
        parser.add_argument("--quick", action="store_true", help=f"fp16 only, {quick}, fewer repeats")
        parser.add_argument("--dtypes", default="fp16,bf16", type=choice_list(HALF_DTYPES),
                            help="comma-separated: fp16, bf16")
    return parser


def run_dtypes(args: argparse.Namespace) -> List[str]:
    """The dtype names to run: fp16 alone under --quick (whatever --dtypes says), else --dtypes."""
    return ["fp16"] if args.quick else list(args.dtypes)


def run_repeats(args: argparse.Namespace) -> int:
    """How many timed runs a measurement takes the median of: fewer under --quick."""
    return 10 if args.quick else 30


def gpu_available() -> bool:
    """Whether there is a CUDA GPU to time; without one, says so on stdout first."""
    if torch.cuda.is_available():
        return True
    print("no CUDA GPU: nothing to benchmark")
    return False


def int_list(text: str) -> List[int]:
    """A comma-separated list of positive integers ("1024,2048") as a list, each once (in first-seen order);
    an argparse `type=`: anything else raises argparse.ArgumentTypeError (a usage error, exit 2)."""
    items = [item.strip() for item in text.split(",")]
    if not all(item.isdigit() and int(item) > 0 for item in items):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return list(dict.fromkeys(int(item) for item in items))


def shape_list(text: str) -> List[tuple]:
    """Comma-separated MxNxK shapes ("4096x4096x4096,8192x4096x4096") as (M, N, K) tuples of positive ints,
    each once; an argparse `type=` (ArgumentTypeError otherwise)."""
    shapes = []
    for item in text.split(","):
        dims = item.strip().split("x")
        if len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise argparse.ArgumentTypeError(f"expected comma-separated MxNxK shapes of positive integers, got "
                                             f"{item.strip()!r}")
        shapes.append(tuple(int(d) for d in dims))
    return list(dict.fromkeys(shapes))


def choice_list(valid: Sequence[str]) -> Callable[[str], List[str]]:
    """An argparse `type=` for a comma-separated list of names among `valid`, each once (ArgumentTypeError
    otherwise)."""
    def parse(text: str) -> List[str]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        unknown = [item for item in items if item not in valid]
        if not items or unknown:
            raise argparse.ArgumentTypeError(f"expected comma-separated names among {', '.join(valid)}, got "
                                             f"{text!r}")
        return list(dict.fromkeys(items))
    return parse


def file_stem(text: str) -> str:
    """An argparse `type=` for an output file's name stem (--name): non-empty, no path separator, not hidden
    (ArgumentTypeError otherwise)."""
    if not text or text.startswith(".") or "/" in text or os.sep in text or (os.altsep and os.altsep in text):
        raise argparse.ArgumentTypeError(f"expected a file name stem (no path separator, not empty or hidden), "
                                         f"got {text!r}")
    return text


def output_dir(text: str) -> str:
    """An argparse `type=` for --out: a directory, existing or not (ArgumentTypeError for an empty name, or
    where the path or its nearest existing parent is not a directory)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a directory name, got ''")
    existing = os.path.abspath(text)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise argparse.ArgumentTypeError(f"{text!r}: {existing!r} exists and is not a directory")
    return text


# The provider name of the copy of the same bytes, timed with the providers (`copy_call`).
COPY = "copy (same bytes)"


def copy_call(nbytes: int, device: str = "cuda") -> Callable[[], object]:
    """A device-to-device copy moving `nbytes` (nbytes / 2 read, nbytes / 2 written), as a function to
    time: the bandwidth a memory-bound op moving `nbytes` is compared with."""
    source = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    return lambda: target.copy_(source)


Tensors = Union[torch.Tensor, Sequence[torch.Tensor]]


def relative_error(actual: Tensors, expected: Tensors) -> float:
    """||actual - expected|| / ||expected|| in float32 (the largest over paired tensors when given
    sequences): how far a provider's result is from torch's, as the scripts report it."""
    if isinstance(actual, (tuple, list)):
        return max(relative_error(a, e) for a, e in zip(actual, expected))
    difference = torch.linalg.vector_norm(actual.float() - expected.float())
    return float(difference / torch.linalg.vector_norm(expected.float()).clamp_min(1e-30))


def failure_text(error: BaseException, limit: int = 200) -> str:
    """The type and message of `error` ("ValueError: ..."), the message cut at `limit` characters: what
    a failed provider's row and printed line say."""
    return f"{type(error).__name__}: {str(error)[:limit]}"
