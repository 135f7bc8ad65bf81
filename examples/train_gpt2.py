"""Train a small GPT-2 (Hugging Face transformers, built from a config: no download) on real text, once
with torch's kernels and once patched with `fusedops.nn.patch`, from the same seed on the same batches;
print the two loss curves side by side and the tokens/s of each.

    python examples/train_gpt2.py                       # CUDA: 6 layers, 384 wide, seq 256, 300 steps, bf16
    python examples/train_gpt2.py --steps 500 --plot loss.png --json results.json
    python examples/train_gpt2.py --device cpu --steps 3    # a quick smoke run (the "tiny" preset)

The corpus is text that ships inside installed Python packages (licenses, READMEs and reStructuredText
docs under site-packages), read in a fixed order and tokenized as bytes (a 256-token vocabulary), so
the run needs no network. Attention dropout is 0 by default: the fusedops attention kernels have no
dropout (with --dropout > 0 the patched model's attention runs torch's SDPA while training).

On CUDA both runs use bf16 autocast; the patched model runs the fusedops kernels for its LayerNorms,
Conv1D/Linear layers and attention. tokens/s is measured after --warmup-steps (kernel compilation and
allocator warm-up are excluded). On the CPU both runs execute torch's ops (the fusedops fallback).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional

import torch

# The repository root on the path, so that the examples run from a checkout without installing.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fusedops.nn  # noqa: E402

# Model and batch sizes per preset; "auto" picks "small" on CUDA and "tiny" elsewhere.
PRESETS: Dict[str, Dict[str, int]] = {
    "tiny": dict(layers=2, width=64, heads=2, seq_len=64, batch_size=4),
    "small": dict(layers=6, width=384, heads=6, seq_len=256, batch_size=16),
}
VOCAB_SIZE = 256     # byte-level tokens

_DOC_SUFFIXES = (".rst", ".md")
_DOC_PREFIXES = ("LICENSE", "LICENCE", "COPYING", "NOTICE", "README")
_SKIPPED_DIRS = {"tests", "test", "testing", "data", "__pycache__"}


# ------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------
def corpus_files(root: Optional[str] = None):
    """Documentation and license files under site-packages (`root`), in a fixed (sorted) order:
    names starting with LICENSE/COPYING/NOTICE/README, and *.rst / *.md files; test and data
    directories are skipped (they hold numeric tables)."""
    root = root or sysconfig.get_paths()["purelib"]
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = sorted(d for d in subdirectories if d not in _SKIPPED_DIRS)
        for name in sorted(files):
            if name.startswith(_DOC_PREFIXES) or name.endswith(_DOC_SUFFIXES):
                yield os.path.join(directory, name)


def load_corpus(max_bytes: int, root: Optional[str] = None) -> torch.Tensor:
    """Up to `max_bytes` of text from `corpus_files`, concatenated (files separated by a blank line),
    as a uint8 tensor of byte tokens. Files with NUL bytes (binary) are skipped.

    Raises RuntimeError when less than 64 KiB of text is found."""
    chunks, total = [], 0
    for path in corpus_files(root):
        try:
            with open(path, "rb") as f:
                data = f.read(max_bytes - total)
        except OSError:
            continue
        if b"\0" in data:
            continue
        chunks.append(data + b"\n\n")
        total += len(chunks[-1])
        if total >= max_bytes:
            break
    if total < 64 * 1024:
        raise RuntimeError(f"found only {total} bytes of text under site-packages; need at least 64 KiB")
    return torch.frombuffer(bytearray(b"".join(chunks)[:max_bytes]), dtype=torch.uint8)


class Batches:
    """Random windows of the corpus: batch i is the same for every run with the same seed.
    Each sequence is seq_len + 1 tokens (inputs and next-token labels overlap by seq_len)."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, batch_size: int, seed: int):
        self.tokens, self.seq_len, self.batch_size = tokens, seq_len, batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def next(self) -> torch.Tensor:
        """(batch_size, seq_len) int64 token ids (the model shifts the labels itself)."""
        starts = torch.randint(0, len(self.tokens) - self.seq_len, (self.batch_size,), generator=self.generator)
        return torch.stack([self.tokens[s:s + self.seq_len] for s in starts.tolist()]).long()


# ------------------------------------------------------------------------------------------------
# Model and training
# ------------------------------------------------------------------------------------------------
def build_model(args: argparse.Namespace, patched: bool, seed: int):
    """A GPT2LMHeadModel from config, initialized from `seed` (identical for both runs), optionally
    patched with fusedops.nn.patch; returns (model, patch report or None)."""
    import transformers

    config = transformers.GPT2Config(
        vocab_size=VOCAB_SIZE, n_positions=args.seq_len, n_embd=args.width, n_layer=args.layers, n_head=args.heads,
        resid_pdrop=args.dropout, embd_pdrop=args.dropout, attn_pdrop=args.dropout, bos_token_id=0,
        eos_token_id=0)
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(config)
    report = fusedops.nn.patch(model) if patched else None
    return model, report


def autocast(device: torch.device, enabled: bool):
    """bf16 autocast on CUDA (when enabled); nothing elsewhere."""
    if enabled and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def make_optimizer(model: torch.nn.Module, args: argparse.Namespace):
    """AdamW with a linear warm-up of the learning rate over the first 10% of the steps."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    warmup = max(1, args.steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    return optimizer, schedule


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class RunResult:
    name: str
    losses: List[float]
    tokens_per_second: float
    timed_steps: int
    patch_report: str = ""


def train(name: str, patched: bool, tokens: torch.Tensor, args: argparse.Namespace,
          device: torch.device) -> RunResult:
    """Train one model for args.steps steps; the loss of every step and the tokens/s after warm-up."""
    model, report = build_model(args, patched, args.seed)
    model.to(device).train()
    if args.compile:
        model = torch.compile(model)
    optimizer, schedule = make_optimizer(model, args)
    batches = Batches(tokens, args.seq_len, args.batch_size, args.seed + 1)
    losses, start = [], None
    warmup = min(args.warmup_steps, args.steps - 1)
    for step in range(args.steps):
        if step == warmup:
            synchronize(device)
            start = time.perf_counter()
        ids = batches.next().to(device, non_blocking=True)
        with autocast(device, args.autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    synchronize(device)
    elapsed = time.perf_counter() - start
    timed = args.steps - warmup
    return RunResult(name, [float(x) for x in losses], timed * args.batch_size * args.seq_len / elapsed, timed,
                     str(report) if report is not None else "")


# ------------------------------------------------------------------------------------------------
# Output
# ------------------------------------------------------------------------------------------------
def loss_table(runs: List[RunResult], every: int) -> str:
    """The loss curves side by side, every `every` steps and the last step, with their difference."""
    header = f"{'step':>6}" + "".join(f"{'loss ' + r.name:>16}" for r in runs) + f"{'|diff|':>12}"
    lines = [header, "-" * len(header)]
    steps = len(runs[0].losses)
    for step in sorted(set(range(0, steps, every)) | {steps - 1}):
        values = [r.losses[step] for r in runs]
        lines.append(f"{step:>6}" + "".join(f"{v:>16.4f}" for v in values) + f"{abs(values[0] - values[-1]):>12.2e}")
    return "\n".join(lines)


def summary(runs: List[RunResult]) -> str:
    base = runs[0].tokens_per_second
    tail = max(1, len(runs[0].losses) // 10)
    lines = [f"{'run':<10}{'tokens/s':>14}{'speed-up':>10}{'mean loss, last ' + str(tail) + ' steps':>30}"]
    for r in runs:
        lines.append(f"{r.name:<10}{r.tokens_per_second:>14,.0f}{r.tokens_per_second / base:>9.2f}x"
                     f"{sum(r.losses[-tail:]) / tail:>30.4f}")
    diffs = [abs(a - b) for a, b in zip(runs[0].losses, runs[-1].losses)]
    lines.append(f"max |loss difference| over {len(diffs)} steps: {max(diffs):.3e}")
    return "\n".join(lines)


def plot(runs: List[RunResult], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for r in runs:
        axis.plot(r.losses, label=f"{r.name} ({r.tokens_per_second:,.0f} tokens/s)", linewidth=1)
    axis.set_xlabel("step")
    axis.set_ylabel("training loss (nats/byte)")
    axis.set_title(title)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------
def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model/data arguments shared with train_ddp.py."""
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cuda or cpu (the default is cuda when torch sees a GPU)")
    parser.add_argument("--preset", choices=["auto", *PRESETS], default="auto",
                        help="model and batch sizes: " + "; ".join(f"{k}: {v}" for k, v in PRESETS.items())
                        + " (auto: small on CUDA, tiny otherwise); the options below override it")
    for name in ("layers", "width", "heads", "seq_len", "batch_size"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=None)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--dropout", type=float, default=0.0, help="residual, embedding and attention dropout")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus-mb", type=float, default=None,
                        help="how much text to read (default: 16 on CUDA, 1 otherwise)")
    parser.add_argument("--no-autocast", dest="autocast", action="store_false",
                        help="train in float32 on CUDA (the fusedops attention then runs torch's op)")


def resolve_arguments(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the preset's sizes into the arguments left unset; checks the device."""
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA GPU (use --device cpu)")
    preset = args.preset if args.preset != "auto" else ("small" if device.type == "cuda" else "tiny")
    for name, value in PRESETS[preset].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.corpus_mb is None:
        args.corpus_mb = 16.0 if device.type == "cuda" else 1.0
    if args.width % args.heads:
        raise SystemExit(f"--width {args.width} is not a multiple of --heads {args.heads}")
    if args.steps < 1:
        raise SystemExit("--steps must be at least 1")
    args.preset = preset
    return args


def main(argv: Optional[List[str]] = None) -> List[RunResult]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--warmup-steps", type=int, default=10, help="steps not counted in tokens/s")
    parser.add_argument("--compile", action="store_true", help="torch.compile both models")
    parser.add_argument("--print-every", type=int, default=None, help="table row interval (default: steps/20)")
    parser.add_argument("--plot", metavar="PNG", help="write the loss curves to this PNG (needs matplotlib)")
    parser.add_argument("--json", metavar="PATH", help="write the losses and tokens/s as JSON")
    args = resolve_arguments(parser.parse_args(argv))
    device = torch.device(args.device)

    tokens = load_corpus(int(args.corpus_mb * 2**20))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"corpus: {len(tokens):,} bytes of package docs and licenses; device: {name}; preset {args.preset}: "
          f"{args.layers} layers, width {args.width}, {args.heads} heads, seq {args.seq_len}, batch "
          f"{args.batch_size}; {args.steps} steps; "
          f"{'bf16 autocast' if args.autocast and device.type == 'cuda' else 'float32'}", flush=True)
    runs = []
    for run_name, patched in (("torch", False), ("fusedops", True)):
        runs.append(train(run_name, patched, tokens, args, device))
        print(f"{run_name}: done, {runs[-1].tokens_per_second:,.0f} tokens/s", flush=True)
        if runs[-1].patch_report:
            print(runs[-1].patch_report, flush=True)
    print(loss_table(runs, args.print_every or max(1, args.steps // 20)))
    print(summary(runs))
    if args.plot:
        plot(runs, args.plot, f"GPT-2 {args.layers}x{args.width} on {name}")
        print(f"wrote {args.plot}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "arguments": vars(args), "runs": [asdict(r) for r in runs]}, f, indent=1)
        print(f"wrote {args.json}")
    return runs


if __name__ == "__main__":
    main()
