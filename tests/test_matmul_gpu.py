"""GPU tier of fusedops.matmul (run with `-m cuda`): the tensor-core kernel against float64 at many
shapes, strides and batches, every shipped config, the fused epilogue, poisoned outputs, autograd,
nn.Linear and the autotuner.

Error rule (FlashAttention's, STYLE.md): our norm-relative error against a float64 reference must be
at most twice that of torch.matmul computed in the same dtype on the same GPU, plus one unit
roundoff of the output dtype (for problems where torch happens to be exact).
"""

from __future__ import annotations

import pytest
import torch

import fusedops
import fusedops.dsl as dsl
import fusedops.nn
import kernels_for_tests as K
from fusedops.autograd.matmul_reference import reference
from fusedops.kernels import matmul as mm
from fusedops.kernels.matmul_configs import CONFIGS, SMALL_CONFIG
from fusedops.kernels.matmul_kernels import matmul_kernel
from helpers import poison, random_tensor

pytestmark = pytest.mark.cuda

_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24}


def _relative(x: torch.Tensor, ref: torch.Tensor) -> float:
    scale = float(torch.linalg.vector_norm(ref))
    return float(torch.linalg.vector_norm(x.double() - ref)) / (scale if scale > 0 else 1.0)


def _check(actual, a, b, bias=None, activation=None, out_dtype=None):
    ref = reference(a.double(), b.double(), None if bias is None else bias.double(), activation)
    theirs = reference(a, b, bias, activation, out_dtype)
    assert actual.shape == ref.shape and actual.dtype == (out_dtype or a.dtype)
    assert not torch.isnan(actual).any(), "NaN in the output (an element was not written?)"
    ours, torch_error = _relative(actual, ref), _relative(theirs, ref)
    bound = 2 * torch_error + _ROUNDOFF[out_dtype or a.dtype]
    assert ours <= bound, f"error {ours:.3e} > bound {bound:.3e} (torch.matmul: {torch_error:.3e})"


# Below AUTOTUNE_MIN_WORK (SMALL_CONFIG, one compile per divisibility pattern); the autotuned
# path is covered by test_large_autotuned_matmul and test_every_config.
_SHAPES = [(1, 1, 1), (7, 13, 17), (16, 16, 16), (64, 64, 64), (127, 129, 131), (128, 256, 64), (257, 511, 129),
           (397, 389, 383), (1, 4096, 4096), (4096, 1, 4096), (33, 8192, 256), (2048, 2048, 8), (3, 5, 0)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m,n,k", _SHAPES, ids=lambda s: str(s))
def test_matmul_matches_float64(m, n, k, dtype, seed):
    a = random_tensor((m, k), dtype, "cuda", seed)
    b = random_tensor((k, n), dtype, "cuda", seed + 1)
    _check(fusedops.matmul(a, b), a, b)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tma", ["1", "0"])
def test_large_autotuned_matmul(dtype, tma, seed, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_TMA", tma)     # on sm_90a: the TMA kernel (the default) or the cp.async one
    a = random_tensor((1536, 1024), dtype, "cuda", seed)
    b = random_tensor((1024, 2560), dtype, "cuda", seed + 1)
    c = poison(torch.empty(1, 1536, 2560, dtype=dtype, device="cuda"))
    mm.matmul_into(c, a[None], b[None])
    _check(c[0], a, b)
    tuner = mm.tuned_matmul_tma_kernel if mm._uses_tma(c, a[None], b[None]) else mm.tuned_matmul_kernel
    assert tuner.best, "the autotuner recorded no choice"


@pytest.mark.parametrize("config", CONFIGS + [SMALL_CONFIG], ids=str)
@pytest.mark.parametrize("m,n,k", [(512, 512, 512), (300, 496, 208)], ids=str)
def test_every_config(config, m, n, k, seed):
    a = random_tensor((1, m, k), torch.float16, "cuda", seed)
    b = random_tensor((1, k, n), torch.float16, "cuda", seed + 1)
    c = poison(torch.empty(1, m, n, dtype=torch.float16, device="cuda"))
    mm.matmul_into(c, a, b, config=config)
    _check(c, a, b)


@pytest.mark.parametrize("transpose_a,transpose_b", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("m,n,k", [(256, 384, 320), (131, 67, 93)], ids=str)
def test_transposed_views_are_read_in_place(transpose_a, transpose_b, m, n, k, seed):
    a = random_tensor((k, m) if transpose_a else (m, k), torch.float16, "cuda", seed)
    b = random_tensor((n, k) if transpose_b else (k, n), torch.float16, "cuda", seed + 1)
    a, b = (a.t() if transpose_a else a), (b.t() if transpose_b else b)
    _check(fusedops.matmul(a, b), a, b)


def test_strided_batched_and_broadcast(seed):
    base = random_tensor((4, 200, 300), torch.bfloat16, "cuda", seed)
    a = base[:, ::2, 10:250]                               # (4, 100, 240), row stride 600
    b = random_tensor((4, 240, 96), torch.bfloat16, "cuda", seed + 1)
    _check(fusedops.matmul(a, b), a, b)
    shared = random_tensor((240, 96), torch.bfloat16, "cuda", seed + 2)
    _check(fusedops.matmul(a, shared), a, shared)
    one = random_tensor((1, 100, 240), torch.bfloat16, "cuda", seed + 3)
    _check(fusedops.matmul(one, b), one, b)


@pytest.mark.parametrize("activation", mm.ACTIVATIONS)
@pytest.mark.parametrize("out_dtype", [None, torch.float32])
def test_fused_epilogue(activation, out_dtype, seed):
    a = random_tensor((300, 200), torch.float16, "cuda", seed)
    b = random_tensor((200, 130), torch.float16, "cuda", seed + 1)
    bias = random_tensor((130,), torch.float16, "cuda", seed + 2)
    _check(fusedops.matmul(a, b, bias, activation, out_dtype), a, b, bias, activation, out_dtype)


def test_output_tile_writes_stay_inside(seed):
    a = random_tensor((1, 129, 70), torch.float16, "cuda", seed)
    b = random_tensor((1, 70, 65), torch.float16, "cuda", seed + 1)
    big = poison(torch.empty(1, 140, 80, dtype=torch.float16, device="cuda"))
    mm.matmul_into(big[:, 3:132, 7:72], a, b)
    _check(big[:, 3:132, 7:72], a, b)
    inside = torch.zeros_like(big, dtype=torch.bool)
    inside[:, 3:132, 7:72] = True
    assert torch.isnan(big[~inside]).all()


def test_k_zero_and_empty():
    a, b = torch.empty(5, 0, dtype=torch.float16, device="cuda"), torch.empty(0, 7, dtype=torch.float16, device="cuda")
    bias = torch.arange(7, dtype=torch.float16, device="cuda") - 3
    assert torch.equal(fusedops.matmul(a, b), torch.zeros(5, 7, dtype=torch.float16, device="cuda"))
    assert torch.equal(fusedops.matmul(a, b, bias, "relu"), torch.relu(bias).expand(5, 7))
    assert fusedops.matmul(torch.empty(0, 4, dtype=torch.float16, device="cuda"),
                           torch.ones(4, 3, dtype=torch.float16, device="cuda")).shape == (0, 3)


def test_dsl_dot_in_a_user_kernel(seed):
    a = random_tensor((200, 96), torch.float16, "cuda", seed)
    b = random_tensor((96, 72), torch.float16, "cuda", seed + 1)
    c = K.matmul(a, b, block_m=64, block_n=64, block_k=32)
    _check(c, a, b)


@pytest.mark.parametrize("activation", [None, "gelu"])
def test_autograd_matches_torch(activation, seed):
    a = random_tensor((2, 70, 90), torch.bfloat16, "cuda", seed).requires_grad_()
    b = random_tensor((90, 50), torch.bfloat16, "cuda", seed + 1).requires_grad_()
    bias = random_tensor((50,), torch.bfloat16, "cuda", seed + 2).requires_grad_()
    grad = random_tensor((2, 70, 50), torch.bfloat16, "cuda", seed + 3)
    fusedops.matmul(a, b, bias, activation).backward(grad)
    a64, b64, bias64 = (t.detach().double().requires_grad_() for t in (a, b, bias))
    reference(a64, b64, bias64, activation).backward(grad.double())
    a32, b32, bias32 = (t.detach().requires_grad_() for t in (a, b, bias))
    reference(a32, b32, bias32, activation).backward(grad)           # torch in bf16: the error to beat
    for ours, ref, theirs in ((a.grad, a64.grad, a32.grad), (b.grad, b64.grad, b32.grad),
                              (bias.grad, bias64.grad, bias32.grad)):
        assert _relative(ours, ref) <= 2 * _relative(theirs, ref) + _ROUNDOFF[torch.bfloat16]


def test_linear_matches_torch(seed):
    torch.manual_seed(seed)
    ours = fusedops.nn.Linear(384, 256, activation="gelu_tanh", device="cuda", dtype=torch.float16)
    theirs = torch.nn.Linear(384, 256, device="cuda", dtype=torch.float16)
    theirs.load_state_dict(ours.state_dict())
    x = random_tensor((4, 33, 384), torch.float16, "cuda", seed)
    y = ours(x)
    expected = torch.nn.functional.gelu(torch.nn.functional.linear(x.double(), theirs.weight.double(),
                                                                   theirs.bias.double()), approximate="tanh")
    torch_y = torch.nn.functional.gelu(theirs(x), approximate="tanh")
    assert _relative(y, expected) <= 2 * _relative(torch_y, expected) + _ROUNDOFF[torch.float16]


def test_autotune_records_its_choice(tmp_path, monkeypatch, seed):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FUSEDOPS_TMA", "0")     # matmul_into takes tuned_matmul_kernel, replaced below
    tuner = dsl.autotune(CONFIGS[:3], key=["M", "N", "K"])(matmul_kernel)
    monkeypatch.setattr(mm, "tuned_matmul_kernel", tuner)
    a = random_tensor((1, 1024, 1024), torch.float16, "cuda", seed)
    b = random_tensor((1, 1024, 1024), torch.float16, "cuda", seed + 1)
    c = torch.empty(1, 1024, 1024, dtype=torch.float16, device="cuda")
    mm.matmul_into(c, a, b)
    _check(c, a, b)
    (measurements,) = tuner.measurements.values()
    assert all(m.ms is not None and m.ms > 0 for m in measurements)
    assert len(list((tmp_path / "autotune").glob("*.json"))) == 1
