"""Shared pieces of the library matmul tests (stream-K, persistent): the float64 reference and the GPU
operands and error check."""

from __future__ import annotations

import torch

ACTIVATIONS = {None: lambda x: x, "relu": torch.relu, "gelu": torch.nn.functional.gelu,
               "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
               "silu": torch.nn.functional.silu}


def reference(a, b, bias=None, activation=None):
    """activation(a @ b + bias) in float64 (every activation of kernels.matmul.ACTIVATIONS)."""
    out = a.double() @ b.double()
    if bias is not None:
        out = out + bias.double()
    return ACTIVATIONS[activation](out)


def gpu_operands(m, n, k, dtype, seed):
    """Random (m, k) and (k, n) CUDA operands, b scaled by k ** -0.5 (products of order 1)."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=generator)
    b = torch.randn(k, n, device="cuda", dtype=dtype, generator=generator) * k ** -0.5
    return a, b


def check_gpu(c, a, b, bias=None, activation=None):
    """c within 2% of the largest reference magnitude (at least 1) of the float64 result, everywhere."""
    expected = reference(a, b, bias, activation)
    error = (c.double() - expected).abs().max().item()
    assert error <= 2e-2 * max(1.0, expected.abs().max().item()), error
