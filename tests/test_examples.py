"""The example scripts in examples/: train_gpt2.py (patched vs unpatched GPT-2 on package docs) and
train_ddp.py (DDP / FSDP2 under torchrun against a single-process run).

CPU tier: a 3-step smoke run of train_gpt2.py in this process (the CPU runs torch's ops, so the two
loss curves are identical), the corpus reader, and `torchrun --nproc_per_node 2 examples/train_ddp.py
--device cpu --backend gloo --steps 3` in a subprocess. GPU tier (-m cuda): a short run of the
"small" preset on the GPU (the curves agree to bf16 noise), and the DDP run on two GPUs.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="transformers is not installed")
needs_torchrun = pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on the PATH")


@pytest.fixture(scope="module")
def train_gpt2():
    sys.path.insert(0, EXAMPLES)
    try:
        import train_gpt2
        yield train_gpt2
    finally:
        sys.path.remove(EXAMPLES)


def _environment() -> dict:
    environment = dict(os.environ)
    environment.pop("FUSEDOPS_INTERPRET", None)
    environment["PYTHONPATH"] = os.pathsep.join([ROOT, environment.get("PYTHONPATH", "")])
    return environment


def _torchrun(*args: str, timeout: float) -> subprocess.CompletedProcess:
    # --standalone: a rendezvous on a free local port (no clash with another torchrun on this host)
    command = ["torchrun", "--standalone", "--nproc_per_node", "2", os.path.join(EXAMPLES, "train_ddp.py"), *args]
    return subprocess.run(command, cwd=ROOT, env=_environment(), capture_output=True, text=True, timeout=timeout)


def _max_loss_difference(output: str) -> float:
    match = re.search(r"max \|loss difference\| over \d+ steps: (\S+)", output)
    assert match, output
    return float(match.group(1))


# ------------------------------------------------------------------------------------------------
# CPU tier
# ------------------------------------------------------------------------------------------------
def test_corpus_is_text_from_installed_packages(train_gpt2):
    tokens = train_gpt2.load_corpus(256 * 1024)
    assert tokens.dtype == torch.uint8 and len(tokens) == 256 * 1024
    text = bytes(tokens.tolist()).decode("utf-8", errors="replace").lower()
    assert "license" in text or "copyright" in text
    assert torch.equal(tokens, train_gpt2.load_corpus(256 * 1024))     # the same order on every call
    batches = train_gpt2.Batches(tokens, seq_len=16, batch_size=3, seed=0)
    again = train_gpt2.Batches(tokens, seq_len=16, batch_size=3, seed=0)
    first = batches.next()
    assert first.shape == (3, 16) and first.dtype == torch.int64 and torch.equal(first, again.next())


@needs_transformers
def test_train_gpt2_smoke_on_cpu(train_gpt2, tmp_path, capsys):
    start = time.perf_counter()
    runs = train_gpt2.main(["--device", "cpu", "--steps", "3", "--json", str(tmp_path / "runs.json")])
    assert time.perf_counter() - start < 20
    printed = capsys.readouterr().out
    assert "sdpa -> fusedops" in printed and "tokens/s" in printed
    assert [r.name for r in runs] == ["torch", "fusedops"]
    torch_run, fused_run = runs
    assert len(torch_run.losses) == len(fused_run.losses) == 3
    assert all(math.isfinite(x) for x in torch_run.losses) and torch_run.losses[0] > torch_run.losses[-1]
    assert fused_run.losses == torch_run.losses       # the CPU runs torch's ops either way
    assert fused_run.tokens_per_second > 0
    saved = json.loads((tmp_path / "runs.json").read_text())
    assert [r["losses"] for r in saved["runs"]] == [torch_run.losses, fused_run.losses]


@needs_transformers
@needs_torchrun
def test_train_ddp_with_torchrun_on_cpu():
    result = _torchrun("--device", "cpu", "--backend", "gloo", "--steps", "3", timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "DDP, gloo" in result.stdout and "sdpa -> fusedops" in result.stdout
    assert _max_loss_difference(result.stdout) < 1e-5      # float32: only the reduction order differs


# ------------------------------------------------------------------------------------------------
# GPU tier
# ------------------------------------------------------------------------------------------------
@pytest.mark.cuda
@needs_transformers
def test_train_gpt2_patched_tracks_unpatched_cuda(train_gpt2):
    runs = train_gpt2.main(["--steps", "40", "--warmup-steps", "5", "--print-every", "10"])
    torch_run, fused_run = runs
    assert all(math.isfinite(x) for r in runs for x in r.losses)
    assert fused_run.losses[-1] < fused_run.losses[0] - 1.0        # it learns
    # bf16 autocast: the curves drift apart by rounding only (expect ~0.01 nats)
    tail = slice(-10, None)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert abs(mean(fused_run.losses[tail]) - mean(torch_run.losses[tail])) < 0.1
    assert fused_run.tokens_per_second > 0


@pytest.mark.cuda
@needs_transformers
@needs_torchrun
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("fsdp", [False, True])
def test_train_ddp_two_gpus_matches_one_process_cuda(fsdp):
    result = _torchrun("--steps", "20", *(["--fsdp"] if fsdp else []), timeout=580)
    assert result.returncode == 0, result.stdout + result.stderr
    assert ("FSDP2" if fsdp else "DDP") + ", nccl" in result.stdout
    assert _max_loss_difference(result.stdout) < 0.05, result.stdout        # bf16 autocast
