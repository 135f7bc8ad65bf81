"""fusedops.library, the package of custom operators: its public names, and one registration of every
operator and of the autocast policy however the package is first imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from fusedops import library
from fusedops.library import autocast

ROOT = Path(__file__).resolve().parents[1]
INTERNAL_OPS = ("softmax_backward", "norm_backward", "scaled_dot_product_attention_backward")


def test_public_names():
    for name in ("NAMESPACE", "OPS", "autocast_dtype", "autocast_cast", "interpret_enabled", "softmax",
                 "layer_norm", "rms_norm", "matmul", "scaled_dot_product_attention", "attention_runs_kernels"):
        assert hasattr(library, name), name
    assert library.NAMESPACE == "fusedops"
    assert library._AUTOCAST_POLICY is library.AUTOCAST_POLICY        # patching one patches the other


def test_every_operator_is_registered_once():
    for op in library.OPS + INTERNAL_OPS:
        assert hasattr(torch.ops.fusedops, op), op
    lower = [(op, device) for op, devices in library.AUTOCAST_POLICY.items()
             for device, policy in devices.items() if policy == "lower"]
    if hasattr(torch.library, "register_autocast"):
        assert len(autocast._LIBRARIES) == len(lower)


def test_importing_an_operator_module_first_registers_everything():
    # A fresh process that imports one operator module first: the package's __init__ runs first and
    # registers every operator and the autocast policy once (a second registration would raise).
    code = ("import torch, fusedops.library.norm_ops, fusedops.library; "
            "from fusedops.library import autocast; "
            "x = torch.randn(2, 3); "
            "assert torch.ops.fusedops.matmul(x, x.t()).shape == (2, 2); "
            "print(len(autocast._LIBRARIES))")
    completed = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                               env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == str(len(autocast._LIBRARIES))
