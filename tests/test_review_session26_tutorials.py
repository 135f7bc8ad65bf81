"""Review (session 26): the official Triton tutorials ported to `fusedops.dsl` by a Triton user.

A fresh reviewer wrote the kernels of Triton's tutorials from memory, as a Triton user would, with
`tl.` replaced by `dsl.`, then ran each in the interpreter on small odd shapes against a float64 torch
reference and compiled it for sm_90a (assembled by ptxas when it is on PATH).

Ported and working (plain tests below):
- 01 vector add (grid as a function of the meta-parameters, `dsl.cdiv` on the host).
- 02 fused softmax, the persistent form (`for row in range(pid, n_rows, num_programs)`).
- 03 matmul: `@dsl.autotune` over `dsl.Config`s keyed on M/N/K, grouped ("super-grouping") program
  order, pointers advanced every K step (`a_ptrs += BLOCK_SIZE_K * stride_ak`), a `@dsl.jit`
  `leaky_relu` helper selected by a string constexpr, fp16 and bf16, row- and column-major B.
- 04 low-memory dropout: the mask-tensor version. The seeded version needs `tl.rand`, which fusedops has
  no equivalent of; ported with a hand-written integer hash (uint32 xor/shift/multiply) instead.
- 05 layer norm: the forward (three sweeps over the row), the backward's dx kernel with the tutorial's
  spin lock (`atomic_cas` / `atomic_xchg`, a count word, `dsl.barrier()` for `tl.debug_barrier()`)
  accumulating dW/db partials per lock group, the second-stage dW/db column reduction, and a lock-free
  variant (`dsl.atomic_add` of the partials); fp32 and fp16.
- 06 fused attention forward (pointer version with a `_attn_fwd_inner` helper returning a tuple, STAGE
  1/2/3 for causal, `exp2` with a log2(e)-folded scale, `Out.dtype.element_ty`).
- 07 "libdevice": there is no extern / libdevice call (`libdevice.asin` has no equivalent); the
  tutorial's elementwise pattern is ported with the builtin math functions instead. (Since then
  `from fusedops.dsl.extra import libdevice; libdevice.asin(x)` ports as written: tests/test_dsl_libdevice.py.)
- 08 grouped GEMM (int64 addresses loaded from a tensor and cast with `.to(pointer type)`, a
  `while a and b:` tile loop) -- with two workarounds, see below.
- 09 persistent matmul: the nested tile/K loop with a `_compute_pid` helper, the older flattened
  form (`ki = dsl.where(ki == k_tiles - 1, 0, ki + 1)`, epilogue under `if ki == k_tiles - 1`), and the
  tensor-descriptor form (`dsl.make_tensor_descriptor`, `desc.load`, `desc.store`).
- 10 block-scaled matmul: not supported (no `dot_scaled`, no fp8 / fp4 / e8m0 dtypes); noted only.

Undocumented differences a Triton user trips on (none of them was in README.md or DESIGN.md; each gives a
clear error, asserted by `test_triton_idioms_give_clear_errors`). Since: README.md has a "Coming from
Triton" section, and dsl.static_assert, dsl.clamp, Python's min/max of kernel values and `x.T` work
(tests/test_triton_idioms.py), and since session 41 so do dsl.rand / randint / randn and dsl.umulhi
(tests/test_dsl_random.py) and dsl.make_block_ptr / advance (tests/test_block_pointers.py):
- No `dsl.static_assert` (tutorial 06), no `dsl.range` (02: `tl.range(..., num_stages=)`, 09:
  `flatten=True`; plain `range` works), no `dsl.rand`/`randint`/`randn` (04), no libdevice / extern
  elementwise namespace (07; fusedops links libdevice itself for some builtins), no `dsl.math`
  namespace (`tl.math.exp2`), no `dsl.make_block_ptr` / `advance` (older 06), no `dot_scaled` and
  no fp8 dtypes (03's fp8 path, 06, 10), no `dsl.umulhi`, `dsl.clamp`, `dsl.join`/`split`, `permute`,
  `dsl.debug_barrier` (it is `dsl.barrier`), `dsl.associative_scan`, `dsl.pow`.
- Python's `min`/`max` on kernel values is refused (Triton maps them to minimum/maximum; tutorial 03's
  `group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)`); the error says to use dsl.minimum.
- `num_stages` may not be a kernel parameter (tutorial 02 declares `num_stages: tl.constexpr`): "reserved
  for launch options".
- `num_ctas=1` (tutorial 05's launches) and `maxnreg=` are not launch options; `dsl.Config` took no
  `pre_hook`/`num_ctas`, `dsl.autotune` no `prune_configs_by` (tutorial 06) until session 41, which added them
  (`num_ctas=1` only).
- Block values have no `.T` (tutorial 09: `b.T`; use `dsl.trans`) and no `.type`
  (`ptr.type.element_ty`; `.dtype.element_ty` works); `x.to(..., fp_downcast_rounding=)` and
  `reshape(..., can_reorder=)` are not accepted; `dsl.dot(out_dtype=float16)` of fp16 inputs is refused.
- `dsl.pointer_type(dsl.float16)` cannot be called inside a kernel (tutorial 08 casts loaded addresses
  with `.to(tl.pointer_type(tl.float16))`); it works when hoisted to a module-level constant. The error
  says to decorate `dsl.pointer_type` with @dsl.jit (see the DEFECT test).
- The interpreter only allows accesses inside the storage of a tensor *argument*: tutorial 08's pointer
  arrays (addresses of tensors that are not arguments) fail with an out-of-bounds InterpreterError. Triton's
  interpreter runs it. Workaround used here: carve every matrix out of one pool tensor passed as an extra
  argument. README says the interpreter checks bounds, not that memory is limited to argument storages.
- `make_tensor_descriptor` needs `base`, `shape` and `strides` to be kernel arguments or literal ints
  (documented in language/descriptors.py, not in README): tutorial 06's in-kernel `y_dim = Z * H * N_CTX`
  is refused.
- fp32 `dsl.dot` defaults to "ieee" (Triton: tf32) -- documented in `dsl.dot`'s docstring only.
- The autotuner in the interpreter takes the first config that compiles; `.best`, not `.best_config`;
  an autotuned kernel has no `.compile` (use `.fn.compile`); a compiled kernel has `shared_bytes` but no
  `n_regs` (tutorial 02 sizes its persistent grid from `kernel.n_regs` / `kernel.metadata.shared`).

Defects (both fixed in session 26; their tests, strict xfails until then, now pass):
- `dsl.atomic_cas(ptr, cmp, val, sem=..., scope=...)` validates `sem` and `scope` and then ignores them:
  every compare-and-swap is emitted as `atom.acq_rel.sys.global.cas` (system scope, acq_rel) whatever is
  asked (scope="gpu", the default, or sem="relaxed", scope="cta"); codegen/atomics.py `_atomic_cas` calls
  `b.cmpxchg(..., "acq_rel", "monotonic")` with no syncscope and never reads op.attrs["sem"/"scope"]
  (the rmw atomics do honour them, with fences). The values are right; the ordering/scope is not what the
  docstring promises, and a spin lock at gpu scope (tutorial 05) pays for system scope.
- `dsl.pointer_type(dsl.float16)` inside a kernel: CompilationError "`dsl.pointer_type` is not a @dsl.jit
  function; ... (decorate it with @dsl.jit to call it from a kernel)": the hint is wrong (it is the
  language's own type constructor, which Triton allows in kernels). It now works (compile-time arguments).

Observation (not a defect by itself): tutorial 03's two largest autotune configs spill on sm_90a
(128x256x64, 8 warps, 3 stages: 108 bytes; 64x256x32, 4 warps: 120 bytes), row-major B; with a
column-major B the first one assembles without spills (184 registers).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.errors import CompilationError, InterpreterError, UnsupportedError
from fusedops.dsl.target import assemble, ptxas_available
from kernel_source import jit_from_source

ARCH = "sm_90a"


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))


def _ptx(kernel, *args, num_warps=4, num_stages=3, **constexprs):
    """Compile for sm_90a (no GPU needed) and assemble with ptxas when it is installed; the compiled kernel."""
    compiled = kernel.compile(*args, target=ARCH, num_warps=num_warps, num_stages=num_stages, **constexprs)
    assert f".target {ARCH}" in compiled.asm["ptx"]
    if ptxas_available():
        assemble(compiled.asm["ptx"], ARCH)
    return compiled


def _err(actual, reference) -> float:
    """max |actual - reference| / max(|reference|, 1)."""
    reference = reference.double()
    return ((actual.double() - reference).abs().max() / reference.abs().max().clamp_min(1.0)).item()


# ================================================================================================
# 01 vector add
# ================================================================================================
@dsl.jit
def add_kernel(x_ptr, y_ptr, output_ptr, n_elements, BLOCK_SIZE: dsl.constexpr):
    pid = dsl.program_id(axis=0)
    block_start = pid * BLOCK_SIZE
    offsets = block_start + dsl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = dsl.load(x_ptr + offsets, mask=mask)
    y = dsl.load(y_ptr + offsets, mask=mask)
    dsl.store(output_ptr + offsets, x + y, mask=mask)


def test_01_vector_add():
    x, y = torch.rand(203), torch.rand(203)
    out = torch.full_like(x, float("nan"))
    n = out.numel()
    grid = lambda meta: (dsl.cdiv(n, meta["BLOCK_SIZE"]),)  # noqa: E731
    add_kernel[grid](x, y, out, n, BLOCK_SIZE=64, interpret=True)
    assert _err(out, x.double() + y.double()) < 1e-6
    _ptx(add_kernel, x, y, out, n, BLOCK_SIZE=1024)


# ================================================================================================
# 02 fused softmax (persistent rows)
# ================================================================================================
@dsl.jit
def softmax_kernel(output_ptr, input_ptr, input_row_stride, output_row_stride, n_rows, n_cols,
                   BLOCK_SIZE: dsl.constexpr):
    row_start = dsl.program_id(0)
    row_step = dsl.num_programs(0)
    for row_idx in range(row_start, n_rows, row_step):
        row_start_ptr = input_ptr + row_idx * input_row_stride
        col_offsets = dsl.arange(0, BLOCK_SIZE)
        mask = col_offsets < n_cols
        row = dsl.load(row_start_ptr + col_offsets, mask=mask, other=-float("inf")).to(dsl.float32)
        row_minus_max = row - dsl.max(row, axis=0)
        numerator = dsl.exp(row_minus_max)
        denominator = dsl.sum(numerator, axis=0)
        softmax_output = numerator / denominator
        output_row_start_ptr = output_ptr + row_idx * output_row_stride
        dsl.store(output_row_start_ptr + col_offsets, softmax_output, mask=mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_02_fused_softmax(dtype):
    x = torch.randn(37, 93).to(dtype)
    y = torch.full_like(x, float("nan"))
    softmax_kernel[(5,)](y, x, x.stride(0), y.stride(0), 37, 93, BLOCK_SIZE=128, num_warps=8, interpret=True)
    assert _err(y, torch.softmax(x.double(), 1)) < (1e-6 if dtype == torch.float32 else 2e-3)
    _ptx(softmax_kernel, y, x, x.stride(0), y.stride(0), 37, 93, BLOCK_SIZE=1024, num_warps=8)


# ================================================================================================
# 03 matrix multiplication: autotune, grouped ordering, leaky_relu helper
# ================================================================================================
MATMUL_CONFIGS = [
    dsl.Config({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 2}, num_stages=3, num_warps=4),
    dsl.Config({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}, num_stages=4, num_warps=4),
    dsl.Config({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}, num_stages=5, num_warps=2),
]


@dsl.jit
def leaky_relu(x):
    return dsl.where(x >= 0, x, 0.01 * x)


@dsl.autotune(configs=MATMUL_CONFIGS, key=["M", "N", "K"])
@dsl.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_SIZE_M: dsl.constexpr, BLOCK_SIZE_N: dsl.constexpr, BLOCK_SIZE_K: dsl.constexpr,
                  GROUP_SIZE_M: dsl.constexpr, ACTIVATION: dsl.constexpr):
    pid = dsl.program_id(axis=0)
    num_pid_m = dsl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = dsl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = dsl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)   # Triton: min(...)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    offs_am = (pid_m * BLOCK_SIZE_M + dsl.arange(0, BLOCK_SIZE_M)) % M
    offs_bn = (pid_n * BLOCK_SIZE_N + dsl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = dsl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    accumulator = dsl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=dsl.float32)
    for k in range(0, dsl.cdiv(K, BLOCK_SIZE_K)):
        a = dsl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_SIZE_K, other=0.0)
        b = dsl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_SIZE_K, other=0.0)
        accumulator = dsl.dot(a, b, accumulator)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    if ACTIVATION == "leaky_relu":
        accumulator = leaky_relu(accumulator)
    c = accumulator.to(c_ptr.dtype.element_ty)
    offs_cm = pid_m * BLOCK_SIZE_M + dsl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + dsl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    dsl.store(c_ptrs, c, mask=c_mask)


def matmul(a, b, activation=""):
    assert a.shape[1] == b.shape[0], "Incompatible dimensions"
    M, K = a.shape
    K, N = b.shape
    c = torch.full((M, N), float("nan"), dtype=a.dtype)
    grid = lambda META: (dsl.cdiv(M, META["BLOCK_SIZE_M"]) * dsl.cdiv(N, META["BLOCK_SIZE_N"]),)  # noqa: E731
    matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                        c.stride(1), ACTIVATION=activation, interpret=True)
    return c


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 33, 7), (37, 45, 53), (65, 3, 17)])
@pytest.mark.parametrize("b_major", ["row", "col"])
@pytest.mark.parametrize("activation", ["", "leaky_relu"])
def test_03_matmul_interpreted(dtype, shape, b_major, activation):
    M, N, K = shape
    a = torch.randn(M, K).to(dtype)
    b = torch.randn(K, N).to(dtype) if b_major == "row" else torch.randn(N, K).to(dtype).t()
    ref = a.double() @ b.double()
    if activation:
        ref = torch.nn.functional.leaky_relu(ref, 0.01)
    assert _err(matmul(a, b, activation), ref) < (2e-3 if dtype == torch.float16 else 1e-2)


@pytest.mark.parametrize("config", MATMUL_CONFIGS, ids=str)
def test_03_matmul_configs_assemble(config):
    a = torch.empty(64, 64, dtype=torch.float16)
    compiled = _ptx(matmul_kernel.fn, a, a, a, 4096, 4096, 4096, 4096, 1, 4096, 1, 4096, 1, ACTIVATION="leaky_relu",
                    num_warps=config.num_warps, num_stages=config.num_stages, **config.constexprs)
    ptx = compiled.asm["ptx"]
    assert "wgmma" in ptx or "mma.sync" in ptx                      # tensor cores either way


# ================================================================================================
# 04 low-memory dropout
# ================================================================================================
@dsl.jit
def _dropout(x_ptr, x_keep_ptr, output_ptr, n_elements, p, BLOCK_SIZE: dsl.constexpr):
    pid = dsl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + dsl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = dsl.load(x_ptr + offsets, mask=mask)
    x_keep = dsl.load(x_keep_ptr + offsets, mask=mask)
    output = dsl.where(x_keep, x / (1 - p), 0.0)
    dsl.store(output_ptr + offsets, output, mask=mask)


@dsl.jit
def _hash_uniform(seed, offsets):
    """A stand-in for tl.rand(seed, offsets) (fusedops has no random-number op): lowbias32 of the offset
    mixed with the seed, top 24 bits as a uniform in [0, 1)."""
    h = offsets.to(dsl.uint32) ^ (seed.to(dsl.uint32) * 0x9E3779B9)
    h ^= h >> 16
    h *= 0x7FEB352D
    h ^= h >> 15
    h *= 0x846CA68B
    h ^= h >> 16
    return (h >> 8).to(dsl.float32) * (1.0 / 16777216.0)


@dsl.jit
def _seeded_dropout(x_ptr, output_ptr, n_elements, p, seed, BLOCK_SIZE: dsl.constexpr):
    pid = dsl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + dsl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = dsl.load(x_ptr + offsets, mask=mask)
    random = _hash_uniform(seed, offsets)
    x_keep = random > p
    output = dsl.where(x_keep, x / (1 - p), 0.0)
    dsl.store(output_ptr + offsets, output, mask=mask)


def _np_hash_uniform(seed: int, n: int) -> torch.Tensor:
    o = np.arange(n, dtype=np.uint64)
    h = (o ^ ((seed * 0x9E3779B9) & 0xFFFFFFFF)) & 0xFFFFFFFF
    h ^= h >> 16
    h = (h * 0x7FEB352D) & 0xFFFFFFFF
    h ^= h >> 15
    h = (h * 0x846CA68B) & 0xFFFFFFFF
    h ^= h >> 16
    return torch.from_numpy((h >> 8).astype(np.float64) / 16777216.0)


def test_04_dropout_with_keep_mask():
    n, p = 101, 0.4
    x, keep = torch.randn(n), torch.rand(n) > 0.4
    out = torch.full_like(x, float("nan"))
    _dropout[(dsl.cdiv(n, 32),)](x, keep, out, n, p, BLOCK_SIZE=32, interpret=True)
    assert _err(out, torch.where(keep, x.double() / (1 - p), 0.0)) < 1e-6
    _ptx(_dropout, x, keep, out, n, p, BLOCK_SIZE=1024)


@pytest.mark.parametrize("seed", [123, 1, 0, -5])
def test_04_seeded_dropout_with_a_hash(seed):
    n, p = 101, 0.5
    x = torch.randn(n)
    out = torch.full_like(x, float("nan"))
    _seeded_dropout[(dsl.cdiv(n, 32),)](x, out, n, p, seed, BLOCK_SIZE=32, interpret=True)
    keep = _np_hash_uniform(seed & 0xFFFFFFFF, n) > p
    assert _err(out, torch.where(keep, x.double() / (1 - p), 0.0)) < 1e-6
    assert 0.2 < keep.double().mean().item() < 0.8
    if seed == 123:
        _ptx(_seeded_dropout, x, out, n, p, seed, BLOCK_SIZE=1024)


# ================================================================================================
# 05 layer norm: forward, backward (spin-lock partials + column reduction), lock-free variant
# ================================================================================================
@dsl.jit
def _layer_norm_fwd_fused(X, Y, W, B, Mean, Rstd, stride, N, eps, BLOCK_SIZE: dsl.constexpr):
    row = dsl.program_id(0)
    Y += row * stride
    X += row * stride
    mean = 0
    _mean = dsl.zeros([BLOCK_SIZE], dtype=dsl.float32)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + dsl.arange(0, BLOCK_SIZE)
        a = dsl.load(X + cols, mask=cols < N, other=0.).to(dsl.float32)
        _mean += a
    mean = dsl.sum(_mean, axis=0) / N
    _var = dsl.zeros([BLOCK_SIZE], dtype=dsl.float32)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + dsl.arange(0, BLOCK_SIZE)
        x = dsl.load(X + cols, mask=cols < N, other=0.).to(dsl.float32)
        x = dsl.where(cols < N, x - mean, 0.)
        _var += x * x
    var = dsl.sum(_var, axis=0) / N
    rstd = 1 / dsl.sqrt(var + eps)
    dsl.store(Mean + row, mean)
    dsl.store(Rstd + row, rstd)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + dsl.arange(0, BLOCK_SIZE)
        mask = cols < N
        w = dsl.load(W + cols, mask=mask)
        b = dsl.load(B + cols, mask=mask)
        x = dsl.load(X + cols, mask=mask, other=0.).to(dsl.float32)
        x_hat = (x - mean) * rstd
        y = x_hat * w + b
        dsl.store(Y + cols, y, mask=mask)


@dsl.jit
def _layer_norm_bwd_dx_fused(DX, DY, DW, DB, X, W, Mean, Rstd, Lock, stride, N,
                             GROUP_SIZE_M: dsl.constexpr, BLOCK_SIZE_N: dsl.constexpr):
    row = dsl.program_id(0)
    cols = dsl.arange(0, BLOCK_SIZE_N)
    mask = cols < N
    X += row * stride
    DY += row * stride
    DX += row * stride
    lock_id = row % GROUP_SIZE_M
    Lock += lock_id
    Count = Lock + GROUP_SIZE_M
    DW = DW + lock_id * N + cols
    DB = DB + lock_id * N + cols
    x = dsl.load(X + cols, mask=mask, other=0).to(dsl.float32)
    dy = dsl.load(DY + cols, mask=mask, other=0).to(dsl.float32)
    w = dsl.load(W + cols, mask=mask).to(dsl.float32)
    mean = dsl.load(Mean + row)
    rstd = dsl.load(Rstd + row)
    xhat = (x - mean) * rstd
    wdy = w * dy
    xhat = dsl.where(mask, xhat, 0.)
    wdy = dsl.where(mask, wdy, 0.)
    c1 = dsl.sum(xhat * wdy, axis=0) / N
    c2 = dsl.sum(wdy, axis=0) / N
    dx = (wdy - (xhat * c1 + c2)) * rstd
    dsl.store(DX + cols, dx, mask=mask)
    partial_dw = (dy * xhat).to(DW.dtype.element_ty)
    partial_db = dy.to(DW.dtype.element_ty)
    while dsl.atomic_cas(Lock, 0, 1) == 1:
        pass
    count = dsl.load(Count)
    if count == 0:
        dsl.atomic_xchg(Count, 1)
    else:
        partial_dw += dsl.load(DW, mask=mask)
        partial_db += dsl.load(DB, mask=mask)
    dsl.store(DW, partial_dw, mask=mask)
    dsl.store(DB, partial_db, mask=mask)
    dsl.barrier()                                  # Triton: tl.debug_barrier()
    dsl.atomic_xchg(Lock, 0)


@dsl.jit
def _layer_norm_bwd_dx_lockfree(DX, DY, DW, DB, X, W, Mean, Rstd, stride, N,
                                GROUP_SIZE_M: dsl.constexpr, BLOCK_SIZE_N: dsl.constexpr):
    row = dsl.program_id(0)
    cols = dsl.arange(0, BLOCK_SIZE_N)
    mask = cols < N
    X += row * stride
    DY += row * stride
    DX += row * stride
    group = row % GROUP_SIZE_M
    x = dsl.load(X + cols, mask=mask, other=0).to(dsl.float32)
    dy = dsl.load(DY + cols, mask=mask, other=0).to(dsl.float32)
    w = dsl.load(W + cols, mask=mask).to(dsl.float32)
    mean = dsl.load(Mean + row)
    rstd = dsl.load(Rstd + row)
    xhat = dsl.where(mask, (x - mean) * rstd, 0.)
    wdy = dsl.where(mask, w * dy, 0.)
    c1 = dsl.sum(xhat * wdy, axis=0) / N
    c2 = dsl.sum(wdy, axis=0) / N
    dsl.store(DX + cols, (wdy - (xhat * c1 + c2)) * rstd, mask=mask)
    dsl.atomic_add(DW + group * N + cols, dy * xhat, mask=mask)
    dsl.atomic_add(DB + group * N + cols, dy, mask=mask)


@dsl.jit
def _layer_norm_bwd_dwdb(DW, DB, FINAL_DW, FINAL_DB, M, N, BLOCK_SIZE_M: dsl.constexpr, BLOCK_SIZE_N: dsl.constexpr):
    pid = dsl.program_id(0)
    cols = pid * BLOCK_SIZE_N + dsl.arange(0, BLOCK_SIZE_N)
    dw = dsl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=dsl.float32)
    db = dsl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=dsl.float32)
    for i in range(0, M, BLOCK_SIZE_M):
        rows = i + dsl.arange(0, BLOCK_SIZE_M)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        offs = rows[:, None] * N + cols[None, :]
        dw += dsl.load(DW + offs, mask=mask, other=0.)
        db += dsl.load(DB + offs, mask=mask, other=0.)
    sum_dw = dsl.sum(dw, axis=0)
    sum_db = dsl.sum(db, axis=0)
    dsl.store(FINAL_DW + cols, sum_dw, mask=cols < N)
    dsl.store(FINAL_DB + cols, sum_db, mask=cols < N)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("variant", ["lock", "lockfree"])
def test_05_layer_norm_forward_and_backward(dtype, variant):
    M, N, eps, group = 13, 75, 1e-5, 4
    tol = 1e-5 if dtype == torch.float32 else 5e-3
    x, dy = torch.randn(M, N).to(dtype), torch.randn(M, N).to(dtype)
    w, b = torch.rand(N).to(dtype), torch.rand(N).to(dtype)
    y = torch.full_like(x, float("nan"))
    mean, rstd = torch.empty(M), torch.empty(M)
    _layer_norm_fwd_fused[(M,)](x, y, w, b, mean, rstd, x.stride(0), N, eps, BLOCK_SIZE=32, interpret=True)
    xd, wd, bd = (t.double().requires_grad_() for t in (x, w, b))
    yd = torch.nn.functional.layer_norm(xd, (N,), wd, bd, eps)
    yd.backward(dy.double())
    assert _err(y, yd.detach()) < tol
    assert _err(mean, x.double().mean(1)) < 1e-6

    dx = torch.full_like(x, float("nan"))
    if variant == "lock":
        locks = torch.zeros(2 * group, dtype=torch.int32)
        partial_dw, partial_db = torch.zeros(group, N, dtype=dtype), torch.zeros(group, N, dtype=dtype)
        _layer_norm_bwd_dx_fused[(M,)](dx, dy, partial_dw, partial_db, x, w, mean, rstd, locks, x.stride(0), N,
                                       GROUP_SIZE_M=group, BLOCK_SIZE_N=128, interpret=True)
        assert locks.tolist() == [0] * group + [1] * group     # every lock released, every count set
    else:
        partial_dw, partial_db = torch.zeros(group, N), torch.zeros(group, N)
        _layer_norm_bwd_dx_lockfree[(M,)](dx, dy, partial_dw, partial_db, x, w, mean, rstd, x.stride(0), N,
                                          GROUP_SIZE_M=group, BLOCK_SIZE_N=128, interpret=True)
    dw, db = torch.full((N,), float("nan"), dtype=dtype), torch.full((N,), float("nan"), dtype=dtype)
    grid = lambda meta: (dsl.cdiv(N, meta["BLOCK_SIZE_N"]),)  # noqa: E731
    _layer_norm_bwd_dwdb[grid](partial_dw, partial_db, dw, db, min(group, M), N, BLOCK_SIZE_M=4, BLOCK_SIZE_N=16,
                               interpret=True)
    assert _err(dx, xd.grad) < tol
    assert _err(dw, wd.grad) < tol
    assert _err(db, bd.grad) < tol


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
def test_05_layer_norm_kernels_assemble():
    dtype = torch.float16
    x, w, stats = torch.empty(8, 1024, dtype=dtype), torch.empty(1024, dtype=dtype), torch.empty(8)
    locks, partial = torch.zeros(64, dtype=torch.int32), torch.empty(32, 1024, dtype=dtype)
    partial32 = torch.empty(32, 1024)
    _ptx(_layer_norm_fwd_fused, x, x, w, w, stats, stats, 1024, 1024, 1e-5, BLOCK_SIZE=1024, num_warps=4)
    lock = _ptx(_layer_norm_bwd_dx_fused, x, x, partial, partial, x, w, stats, stats, locks, 1024, 1024,
                GROUP_SIZE_M=32, BLOCK_SIZE_N=1024, num_warps=4)
    assert "atom" in lock.asm["ptx"] and "cas" in lock.asm["ptx"]
    _ptx(_layer_norm_bwd_dx_lockfree, x, x, partial32, partial32, x, w, stats, stats, 1024, 1024,
         GROUP_SIZE_M=32, BLOCK_SIZE_N=1024, num_warps=4)
    _ptx(_layer_norm_bwd_dwdb, partial, partial, w, w, 32, 1024, BLOCK_SIZE_M=32, BLOCK_SIZE_N=128, num_warps=4)


# ================================================================================================
# 06 fused attention forward
# ================================================================================================
@dsl.jit
def _attn_fwd_inner(acc, l_i, m_i, q, K_ptrs, V_ptrs, stride_kn, stride_vn, start_m, qk_scale,
                    BLOCK_M: dsl.constexpr, HEAD_DIM: dsl.constexpr, BLOCK_N: dsl.constexpr, STAGE: dsl.constexpr,
                    offs_m, offs_n, N_CTX):
    if STAGE == 1:
        lo, hi = 0, start_m * BLOCK_M
    elif STAGE == 2:
        lo, hi = start_m * BLOCK_M, (start_m + 1) * BLOCK_M
        lo = dsl.multiple_of(lo, BLOCK_M)
    else:
        lo, hi = 0, N_CTX
    K_ptrs += lo * stride_kn
    V_ptrs += lo * stride_vn
    for start_n in range(lo, hi, BLOCK_N):
        start_n = dsl.multiple_of(start_n, BLOCK_N)
        kmask = (start_n + offs_n) < N_CTX
        k = dsl.load(K_ptrs, mask=kmask[None, :], other=0.0)
        qk = dsl.dot(q, k)
        if STAGE == 2:
            mask = offs_m[:, None] >= (start_n + offs_n[None, :])
            qk = qk * qk_scale + dsl.where(mask, 0, -1.0e6)
        else:
            qk = qk * qk_scale + dsl.where(kmask[None, :], 0, -1.0e6)
        m_ij = dsl.maximum(m_i, dsl.max(qk, 1))
        qk -= m_ij[:, None]
        p = dsl.exp2(qk)
        l_ij = dsl.sum(p, 1)
        alpha = dsl.exp2(m_i - m_ij)
        l_i = l_i * alpha + l_ij
        acc = acc * alpha[:, None]
        v = dsl.load(V_ptrs, mask=kmask[:, None], other=0.0)
        acc = dsl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
        V_ptrs += BLOCK_N * stride_vn
        K_ptrs += BLOCK_N * stride_kn
    return acc, l_i, m_i


@dsl.jit
def _attn_fwd(Q, K, V, sm_scale, M, Out,
              stride_qz, stride_qh, stride_qm, stride_qk, stride_kz, stride_kh, stride_kn, stride_kk,
              stride_vz, stride_vh, stride_vk, stride_vn, stride_oz, stride_oh, stride_om, stride_on,
              Z, H, N_CTX, HEAD_DIM: dsl.constexpr, BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr,
              STAGE: dsl.constexpr):
    start_m = dsl.program_id(0)
    off_hz = dsl.program_id(1)
    off_z = off_hz // H
    off_h = off_hz % H
    q_offset = off_z.to(dsl.int64) * stride_qz + off_h.to(dsl.int64) * stride_qh
    kv_offset = off_z.to(dsl.int64) * stride_kz + off_h.to(dsl.int64) * stride_kh
    offs_m = start_m * BLOCK_M + dsl.arange(0, BLOCK_M)
    offs_n = dsl.arange(0, BLOCK_N)
    offs_d = dsl.arange(0, HEAD_DIM)
    Q_ptrs = Q + q_offset + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk
    K_ptrs = K + kv_offset + offs_d[:, None] * stride_kk + offs_n[None, :] * stride_kn
    V_ptrs = V + kv_offset + offs_n[:, None] * stride_vk + offs_d[None, :] * stride_vn
    O_ptrs = Out + q_offset + offs_m[:, None] * stride_om + offs_d[None, :] * stride_on
    m_i = dsl.zeros([BLOCK_M], dtype=dsl.float32) - float("inf")
    l_i = dsl.zeros([BLOCK_M], dtype=dsl.float32) + 1.0
    acc = dsl.zeros([BLOCK_M, HEAD_DIM], dtype=dsl.float32)
    qk_scale = sm_scale
    qk_scale *= 1.44269504
    q = dsl.load(Q_ptrs, mask=offs_m[:, None] < N_CTX, other=0.0)
    if STAGE & 1:
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K_ptrs, V_ptrs, stride_kn, stride_vk, start_m, qk_scale,
                                        BLOCK_M, HEAD_DIM, BLOCK_N, 4 - STAGE, offs_m, offs_n, N_CTX)
    if STAGE & 2:
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K_ptrs, V_ptrs, stride_kn, stride_vk, start_m, qk_scale,
                                        BLOCK_M, HEAD_DIM, BLOCK_N, 2, offs_m, offs_n, N_CTX)
    m_i += dsl.log2(l_i)
    acc = acc / l_i[:, None]
    dsl.store(M + off_hz * N_CTX + offs_m, m_i, mask=offs_m < N_CTX)
    dsl.store(O_ptrs, acc.to(Out.dtype.element_ty), mask=offs_m[:, None] < N_CTX)


def _attention(q, k, v, causal, sm_scale, BLOCK_M, BLOCK_N):
    Z, H, N_CTX, HEAD_DIM = q.shape
    o = torch.full_like(q, float("nan"))
    M = torch.full((Z, H, N_CTX), float("nan"))
    grid = lambda args: (dsl.cdiv(N_CTX, args["BLOCK_M"]), Z * H, 1)  # noqa: E731
    _attn_fwd[grid](q, k, v, sm_scale, M, o, *q.stride(), *k.stride(), *v.stride(), *o.stride(), Z, H, N_CTX,
                    HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, STAGE=3 if causal else 1, interpret=True)
    return o, M


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("blocks", [(16, 16), (32, 16)])
def test_06_fused_attention_forward(causal, blocks):
    Z, H, N_CTX, D, sm_scale = 2, 3, 37, 16, 0.5
    q, k, v = (torch.randn(Z, H, N_CTX, D).half() for _ in range(3))
    o, M = _attention(q, k, v, causal, sm_scale, *blocks)
    s = (q.double() @ k.double().transpose(-1, -2)) * sm_scale
    if causal:
        s = s.masked_fill(torch.ones(N_CTX, N_CTX, dtype=torch.bool).triu(1), float("-inf"))
    assert _err(o, torch.softmax(s, -1) @ v.double()) < 2e-3
    assert _err(M, torch.logsumexp(s, -1) / math.log(2)) < 1e-5


@pytest.mark.parametrize("stage", [1, 3])
def test_06_fused_attention_assembles(stage):
    qq, m = torch.empty(1, 1, 128, 64, dtype=torch.float16), torch.empty(128)
    compiled = _ptx(_attn_fwd, qq, qq, qq, 0.125, m, qq, *qq.stride(), *qq.stride(), *qq.stride(), *qq.stride(), 2, 4,
                    1024, HEAD_DIM=64, BLOCK_M=128, BLOCK_N=64, STAGE=stage, num_warps=8, num_stages=3)
    assert "wgmma" in compiled.asm["ptx"]


# ================================================================================================
# 07 libdevice (extern math): no extern call; the builtins instead
# ================================================================================================
@dsl.jit
def _math_kernel(x_ptr, y_ptr, n, FN: dsl.constexpr, BLOCK: dsl.constexpr):
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    x = dsl.load(x_ptr + offsets, mask=mask)
    if FN == "erf":
        y = dsl.erf(x)
    elif FN == "tanh":
        y = dsl.tanh(x)
    elif FN == "sin":
        y = dsl.sin(x)
    else:
        y = dsl.rsqrt(x)
    dsl.store(y_ptr + offsets, y, mask=mask)


@pytest.mark.parametrize("fn", ["erf", "tanh", "sin", "rsqrt"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_07_math_builtins_instead_of_libdevice(fn, dtype):
    x = (torch.rand(77, dtype=torch.float64) * 3 + 0.1).to(dtype)
    y = torch.full_like(x, float("nan"))
    _math_kernel[(3,)](x, y, 77, FN=fn, BLOCK=32, interpret=True)
    assert _err(y, getattr(torch, fn)(x.double())) < (1e-6 if dtype == torch.float32 else 1e-14)
    _ptx(_math_kernel, x, y, 77, FN=fn, BLOCK=1024)


def test_07_libdevice_asin_ports_as_written():
    """Triton's `from triton.language.extra import libdevice; libdevice.asin(x)`: `dsl.extra.libdevice` since the
    libdevice functions came (tests/test_dsl_libdevice.py); still no `dsl.libdevice`, extern_elementwise nor a
    top-level asin, as in Triton."""
    from fusedops.dsl.extra import libdevice
    from kernel_source import jit_from_source
    assert not any(hasattr(dsl, name) for name in ("libdevice", "extern_elementwise", "asin"))
    assert dsl.math.asin is libdevice.asin
    kernel = jit_from_source("def asin_kernel(x_ptr, y_ptr, n_elements, BLOCK_SIZE: dsl.constexpr):\n"
                             "    offsets = dsl.program_id(0) * BLOCK_SIZE + dsl.arange(0, BLOCK_SIZE)\n"
                             "    mask = offsets < n_elements\n"
                             "    x = dsl.load(x_ptr + offsets, mask=mask)\n"
                             "    dsl.store(y_ptr + offsets, libdevice.asin(x), mask=mask)\n", "<07 asin>",
                             name="asin_kernel", namespace={"libdevice": libdevice})
    for dtype in (torch.float32, torch.float64):
        x = (torch.rand(77, dtype=torch.float64) * 2 - 1).to(dtype)
        y = torch.full_like(x, float("nan"))
        kernel[(3,)](x, y, 77, BLOCK_SIZE=32, interpret=True)
        assert _err(y, torch.asin(x.double())) < (1e-6 if dtype == torch.float32 else 1e-14)


# ================================================================================================
# 08 grouped GEMM
# ================================================================================================
F16_PTR = dsl.pointer_type(dsl.float16)     # Triton builds this in the kernel (see the DEFECT below)


@dsl.jit
def grouped_matmul_kernel(group_a_ptrs, group_b_ptrs, group_c_ptrs, group_gemm_sizes, g_lds, group_size, pool,
                          NUM_SM: dsl.constexpr, BLOCK_SIZE_M: dsl.constexpr, BLOCK_SIZE_N: dsl.constexpr,
                          BLOCK_SIZE_K: dsl.constexpr):
    tile_idx = dsl.program_id(0)
    last_problem_end = 0
    for g in range(group_size):
        gm = dsl.load(group_gemm_sizes + g * 3)
        gn = dsl.load(group_gemm_sizes + g * 3 + 1)
        gk = dsl.load(group_gemm_sizes + g * 3 + 2)
        num_m_tiles = dsl.cdiv(gm, BLOCK_SIZE_M)
        num_n_tiles = dsl.cdiv(gn, BLOCK_SIZE_N)
        num_tiles = num_m_tiles * num_n_tiles
        while tile_idx >= last_problem_end and tile_idx < last_problem_end + num_tiles:
            lda = dsl.load(g_lds + g * 3)
            ldb = dsl.load(g_lds + g * 3 + 1)
            ldc = dsl.load(g_lds + g * 3 + 2)
            a_ptr = dsl.load(group_a_ptrs + g).to(F16_PTR)
            b_ptr = dsl.load(group_b_ptrs + g).to(F16_PTR)
            c_ptr = dsl.load(group_c_ptrs + g).to(F16_PTR)
            tile_idx_in_gemm = tile_idx - last_problem_end
            tile_m_idx = tile_idx_in_gemm // num_n_tiles
            tile_n_idx = tile_idx_in_gemm % num_n_tiles
            offs_am = tile_m_idx * BLOCK_SIZE_M + dsl.arange(0, BLOCK_SIZE_M)
            offs_bn = tile_n_idx * BLOCK_SIZE_N + dsl.arange(0, BLOCK_SIZE_N)
            offs_k = dsl.arange(0, BLOCK_SIZE_K)
            a_ptrs = a_ptr + offs_am[:, None] * lda + offs_k[None, :]
            b_ptrs = b_ptr + offs_k[:, None] * ldb + offs_bn[None, :]
            accumulator = dsl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=dsl.float32)
            for kk in range(0, dsl.cdiv(gk, BLOCK_SIZE_K)):
                a = dsl.load(a_ptrs, mask=(offs_am[:, None] < gm) & (offs_k[None, :] < gk - kk * BLOCK_SIZE_K), other=0.0)
                b = dsl.load(b_ptrs, mask=(offs_k[:, None] < gk - kk * BLOCK_SIZE_K) & (offs_bn[None, :] < gn), other=0.0)
                accumulator += dsl.dot(a, b)
                a_ptrs += BLOCK_SIZE_K
                b_ptrs += BLOCK_SIZE_K * ldb
            c = accumulator.to(dsl.float16)
            offs_cm = tile_m_idx * BLOCK_SIZE_M + dsl.arange(0, BLOCK_SIZE_M)
            offs_cn = tile_n_idx * BLOCK_SIZE_N + dsl.arange(0, BLOCK_SIZE_N)
            c_ptrs = c_ptr + ldc * offs_cm[:, None] + offs_cn[None, :]
            dsl.store(c_ptrs, c, mask=(offs_cm[:, None] < gm) & (offs_cn[None, :] < gn))
            tile_idx += NUM_SM
        last_problem_end = last_problem_end + num_tiles


def _group_gemm(group_A, group_B, pool, take, num_sm, pass_pool=True):
    a_addrs, b_addrs, c_addrs, sizes, lds, group_C = [], [], [], [], [], []
    for A, B in zip(group_A, group_B):
        (M, K), N = A.shape, B.shape[1]
        C = take(M * N).view(M, N).fill_(float("nan"))
        group_C.append(C)
        a_addrs.append(A.data_ptr())
        b_addrs.append(B.data_ptr())
        c_addrs.append(C.data_ptr())
        sizes += [M, N, K]
        lds += [A.stride(0), B.stride(0), C.stride(0)]
    grid = lambda META: (META["NUM_SM"],)  # noqa: E731
    grouped_matmul_kernel[grid](torch.tensor(a_addrs), torch.tensor(b_addrs), torch.tensor(c_addrs),
                                torch.tensor(sizes, dtype=torch.int32), torch.tensor(lds, dtype=torch.int32),
                                len(group_A), pool if pass_pool else torch.empty(1, dtype=torch.float16),
                                NUM_SM=num_sm, BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, BLOCK_SIZE_K=16, interpret=True)
    return group_C


def _pool_allocator(pool):
    used = [0]

    def take(n):
        view = pool[used[0]:used[0] + n]
        used[0] += n
        return view
    return take


@pytest.mark.parametrize("num_sm", [1, 3])
def test_08_grouped_gemm(num_sm):
    shapes = [(17, 23, 19), (33, 9, 40), (5, 31, 7)]
    pool = torch.zeros(20000, dtype=torch.float16)
    take = _pool_allocator(pool)
    group_A = [take(m * k).view(m, k).copy_(torch.randn(m, k)) for m, n, k in shapes]
    group_B = [take(k * n).view(k, n).copy_(torch.randn(k, n)) for m, n, k in shapes]
    for A, B, C in zip(group_A, group_B, _group_gemm(group_A, group_B, pool, take, num_sm)):
        assert _err(C, A.double() @ B.double()) < 2e-3


def test_08_grouped_gemm_interpreter_needs_argument_storage():
    """Undocumented interpreter limit: memory reached through loaded addresses must lie in a tensor
    argument's storage (Triton's interpreter runs tutorial 08 as written)."""
    group_A, group_B = [torch.randn(17, 19).half()], [torch.randn(19, 23).half()]
    take = _pool_allocator(torch.zeros(1000, dtype=torch.float16))
    with pytest.raises(InterpreterError, match="outside every tensor argument's storage"):
        _group_gemm(group_A, group_B, None, take, 2, pass_pool=False)


def test_08_grouped_gemm_assembles():
    p64, p32 = dsl.pointer_type(dsl.int64), dsl.pointer_type(dsl.int32)
    compiled = _ptx(grouped_matmul_kernel, p64, p64, p64, p32, p32, dsl.int32, F16_PTR, NUM_SM=132, BLOCK_SIZE_M=128,
                    BLOCK_SIZE_N=128, BLOCK_SIZE_K=32, num_warps=4, num_stages=3)
    assert "wgmma" in compiled.asm["ptx"]


# ================================================================================================
# 09 persistent matmul (nested loops, flattened loop, tensor descriptors)
# ================================================================================================
@dsl.jit
def _compute_pid(tile_id, num_pid_in_group, num_pid_m, GROUP_SIZE_M: dsl.constexpr):
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = dsl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + (tile_id % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@dsl.jit
def matmul_kernel_persistent(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                             stride_cn, BLOCK_SIZE_M: dsl.constexpr, BLOCK_SIZE_N: dsl.constexpr,
                             BLOCK_SIZE_K: dsl.constexpr, GROUP_SIZE_M: dsl.constexpr, NUM_SMS: dsl.constexpr):
    start_pid = dsl.program_id(axis=0)
    num_pid_m = dsl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = dsl.cdiv(N, BLOCK_SIZE_N)
    k_tiles = dsl.cdiv(K, BLOCK_SIZE_K)
    num_tiles = num_pid_m * num_pid_n
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    offs_k_for_mask = dsl.arange(0, BLOCK_SIZE_K)
    for tile_id in range(start_pid, num_tiles, NUM_SMS):          # Triton: tl.range(..., flatten=True)
        pid_m, pid_n = _compute_pid(tile_id, num_pid_in_group, num_pid_m, GROUP_SIZE_M)
        offs_am = pid_m * BLOCK_SIZE_M + dsl.arange(0, BLOCK_SIZE_M)
        offs_bn = pid_n * BLOCK_SIZE_N + dsl.arange(0, BLOCK_SIZE_N)
        offs_am = dsl.where(offs_am < M, offs_am, 0)
        offs_bn = dsl.where(offs_bn < N, offs_bn, 0)
        offs_am = dsl.max_contiguous(dsl.multiple_of(offs_am, BLOCK_SIZE_M), BLOCK_SIZE_M)
        offs_bn = dsl.max_contiguous(dsl.multiple_of(offs_bn, BLOCK_SIZE_N), BLOCK_SIZE_N)
        accumulator = dsl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=dsl.float32)
        for ki in range(k_tiles):
            offs_k = ki * BLOCK_SIZE_K + dsl.arange(0, BLOCK_SIZE_K)
            a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
            b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
            a = dsl.load(a_ptrs, mask=offs_k_for_mask[None, :] < K - ki * BLOCK_SIZE_K, other=0.0)
            b = dsl.load(b_ptrs, mask=offs_k_for_mask[:, None] < K - ki * BLOCK_SIZE_K, other=0.0)
            accumulator = dsl.dot(a, b, accumulator)
        offs_cm = pid_m * BLOCK_SIZE_M + dsl.arange(0, BLOCK_SIZE_M)
        offs_cn = pid_n * BLOCK_SIZE_N + dsl.arange(0, BLOCK_SIZE_N)
        c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
        c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
        dsl.store(c_ptrs, accumulator.to(dsl.float16), mask=c_mask)


@dsl.jit
def matmul_kernel_persistent_flat(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                                  stride_cn, BLOCK_SIZE_M: dsl.constexpr, BLOCK_SIZE_N: dsl.constexpr,
                                  BLOCK_SIZE_K: dsl.constexpr, GROUP_SIZE_M: dsl.constexpr, NUM_SMS: dsl.constexpr):
    start_pid = dsl.program_id(axis=0)
    num_pid_m = dsl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = dsl.cdiv(N, BLOCK_SIZE_N)
    k_tiles = dsl.cdiv(K, BLOCK_SIZE_K)
    num_tiles = num_pid_m * num_pid_n
    tiles_per_SM = num_tiles // NUM_SMS
    if start_pid < num_tiles % NUM_SMS:
        tiles_per_SM += 1
    tile_id = start_pid - NUM_SMS
    ki = -1
    offs_k_for_mask = dsl.arange(0, BLOCK_SIZE_K)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    pid_m = 0
    pid_n = 0
    offs_am = dsl.arange(0, BLOCK_SIZE_M)
    offs_bn = dsl.arange(0, BLOCK_SIZE_N)
    accumulator = dsl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=dsl.float32)
    for _ in range(0, k_tiles * tiles_per_SM):
        ki = dsl.where(ki == k_tiles - 1, 0, ki + 1)
        if ki == 0:
            tile_id += NUM_SMS
            pid_m, pid_n = _compute_pid(tile_id, num_pid_in_group, num_pid_m, GROUP_SIZE_M)
            offs_am = pid_m * BLOCK_SIZE_M + dsl.arange(0, BLOCK_SIZE_M)
            offs_bn = pid_n * BLOCK_SIZE_N + dsl.arange(0, BLOCK_SIZE_N)
            offs_am = dsl.where(offs_am < M, offs_am, 0)
            offs_bn = dsl.where(offs_bn < N, offs_bn, 0)
        offs_k = ki * BLOCK_SIZE_K + dsl.arange(0, BLOCK_SIZE_K)
        a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
        b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
        a = dsl.load(a_ptrs, mask=offs_k_for_mask[None, :] < K - ki * BLOCK_SIZE_K, other=0.0)
        b = dsl.load(b_ptrs, mask=offs_k_for_mask[:, None] < K - ki * BLOCK_SIZE_K, other=0.0)
        accumulator = dsl.dot(a, b, accumulator)
        if ki == k_tiles - 1:
            offs_cm = pid_m * BLOCK_SIZE_M + dsl.arange(0, BLOCK_SIZE_M)
            offs_cn = pid_n * BLOCK_SIZE_N + dsl.arange(0, BLOCK_SIZE_N)
            c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
            c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
            dsl.store(c_ptrs, accumulator.to(dsl.float16), mask=c_mask)
            accumulator = dsl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=dsl.float32)


@dsl.jit
def matmul_kernel_descriptor_persistent(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_SIZE_M: dsl.constexpr,
                                        BLOCK_SIZE_N: dsl.constexpr, BLOCK_SIZE_K: dsl.constexpr,
                                        GROUP_SIZE_M: dsl.constexpr, NUM_SMS: dsl.constexpr):
    start_pid = dsl.program_id(axis=0)
    num_pid_m = dsl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = dsl.cdiv(N, BLOCK_SIZE_N)
    k_tiles = dsl.cdiv(K, BLOCK_SIZE_K)
    num_tiles = num_pid_m * num_pid_n
    a_desc = dsl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_SIZE_M, BLOCK_SIZE_K])
    b_desc = dsl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_SIZE_N, BLOCK_SIZE_K])
    c_desc = dsl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_SIZE_M, BLOCK_SIZE_N])
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    for tile_id in range(start_pid, num_tiles, NUM_SMS):
        pid_m, pid_n = _compute_pid(tile_id, num_pid_in_group, num_pid_m, GROUP_SIZE_M)
        offs_am = pid_m * BLOCK_SIZE_M
        offs_bn = pid_n * BLOCK_SIZE_N
        accumulator = dsl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=dsl.float32)
        for ki in range(k_tiles):
            offs_k = ki * BLOCK_SIZE_K
            a = a_desc.load([offs_am, offs_k])
            b = b_desc.load([offs_bn, offs_k])
            accumulator = dsl.dot(a, dsl.trans(b), accumulator)         # Triton: b.T
        c_desc.store([offs_am, offs_bn], accumulator.to(dsl.float16))


def _strided_args(a, b, c):
    M, K = a.shape
    N = b.shape[1]
    return (a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))


@pytest.mark.parametrize("kernel", [matmul_kernel_persistent, matmul_kernel_persistent_flat], ids=["nested", "flat"])
@pytest.mark.parametrize("num_sms", [1, 4])
def test_09_persistent_matmul(kernel, num_sms):
    M, N, K = 45, 37, 51
    a, b = torch.randn(M, K).half(), torch.randn(K, N).half()
    c = torch.full((M, N), float("nan"), dtype=torch.float16)
    kernel[(num_sms,)](*_strided_args(a, b, c), BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, BLOCK_SIZE_K=16, GROUP_SIZE_M=2,
                       NUM_SMS=num_sms, interpret=True)
    assert _err(c, a.double() @ b.double()) < 2e-3


@pytest.mark.parametrize("shape", [(48, 40, 56), (45, 37, 51)])
def test_09_persistent_matmul_descriptors(shape):
    M, N, K = shape
    a, bt = torch.randn(M, K).half(), torch.randn(N, K).half()
    c = torch.full((M, N), float("nan"), dtype=torch.float16)
    matmul_kernel_descriptor_persistent[(3,)](a, bt, c, M, N, K, BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, BLOCK_SIZE_K=16,
                                              GROUP_SIZE_M=2, NUM_SMS=3, interpret=True)
    assert _err(c, a.double() @ bt.double().T) < 2e-3


def test_09_persistent_matmuls_assemble():
    a = torch.empty(64, 64, dtype=torch.float16)
    tiles = dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64, GROUP_SIZE_M=8, NUM_SMS=132)
    args = (a, a, a, 4096, 4096, 4096, 4096, 1, 4096, 1, 4096, 1)
    for kernel in (matmul_kernel_persistent, matmul_kernel_persistent_flat):
        assert "wgmma" in _ptx(kernel, *args, num_warps=8, **tiles).asm["ptx"]
    desc = _ptx(matmul_kernel_descriptor_persistent, a, a, a, 4096, 4096, 4096, num_warps=8, **tiles)
    assert "cp.async.bulk.tensor" in desc.asm["ptx"]


# ================================================================================================
# 10 block-scaled matmul: not supported
# ================================================================================================
def test_10_block_scaled_matmul_is_not_available():
    assert not any(hasattr(dsl, name) for name in ("dot_scaled", "float8e4nv", "float8e5", "float8e4b15"))


# ================================================================================================
# Triton idioms that fusedops refuses, with clear errors (undocumented differences, see the docstring)
# ================================================================================================
_IDIOMS = {
    # (dsl.range, dsl.math and dsl.debug_barrier: in the language since session 41, tests/test_dsl_triton_builtins.py;
    # dsl.math.pow and libdevice's functions since then, tests/test_dsl_libdevice.py: lgamma is not)
    "math_lgamma": ("    dsl.store(o_ptr + dsl.arange(0, B), dsl.math.lgamma(dsl.load(x_ptr + dsl.arange(0, B))))\n",
                    "lgamma"),
    "fp8": ("    x = dsl.load(x_ptr).to(dsl.float8e5)\n", "float8e5"),
    "ptr_type_attr": ("    dsl.store(o_ptr, dsl.load(x_ptr).to(o_ptr.type.element_ty))\n", "`type`"),
    "fp_downcast_rounding": ("    dsl.store(o_ptr, dsl.load(x_ptr).to(dsl.float16, fp_downcast_rounding='rtne'))\n",
                             "fp_downcast_rounding"),
    "computed_descriptor_shape": ("    d = dsl.make_tensor_descriptor(x_ptr, shape=[n * 2, 16], strides=[16, 1], "
                                  "block_shape=[16, 16])\n    dsl.store(o_ptr, dsl.sum(dsl.sum(d.load([0, 0]), 1), 0))\n",
                                  "kernel argument"),
}


@pytest.mark.parametrize("idiom", sorted(_IDIOMS))
def test_triton_idioms_give_clear_errors(idiom):
    body, needle = _IDIOMS[idiom]
    kernel = jit_from_source("def k(o_ptr, x_ptr, n, B: dsl.constexpr):\n" + body, f"<review26 {idiom}>")
    x, o = torch.zeros(256), torch.zeros(256)
    with pytest.raises((CompilationError, UnsupportedError)) as info:
        kernel[(1,)](o, x, 4, B=16, interpret=True)
    assert needle in str(info.value)
    assert f"<review26 {idiom}>" in str(info.value)          # points at the kernel's source line


def test_triton_host_side_options_are_refused_clearly():
    x = torch.zeros(64)
    with pytest.raises(TypeError, match="num_stages"):
        @dsl.jit
        def softmax_with_num_stages(x_ptr, BLOCK: dsl.constexpr, num_stages: dsl.constexpr):  # tutorial 02
            pass
    with pytest.raises(TypeError, match="num_ctas"):                                        # tutorial 05
        add_kernel[(1,)](x, x, x, 64, BLOCK_SIZE=64, num_ctas=1, interpret=True)
    # tutorial 06's Config(pre_hook=None) and autotune(prune_configs_by=...) are accepted since session 41
    assert dsl.Config({"BLOCK_M": 64}, num_warps=4, pre_hook=None) == dsl.Config({"BLOCK_M": 64}, num_warps=4)
    dsl.autotune(configs=MATMUL_CONFIGS, key=["M"], prune_configs_by={})
    with pytest.raises(ValueError, match="num_ctas=2"):
        dsl.Config({"BLOCK_M": 64}, num_warps=4, num_ctas=2)


# ================================================================================================
# DEFECTS
# ================================================================================================
@dsl.jit
def _cas_kernel(lock_ptr, out_ptr, SEM: dsl.constexpr, SCOPE: dsl.constexpr):
    dsl.store(out_ptr, dsl.atomic_cas(lock_ptr, 0, 1, sem=SEM, scope=SCOPE))


@pytest.mark.parametrize("sem,scope", [("acq_rel", "gpu"), ("relaxed", "cta")])
def test_defect_atomic_cas_honours_sem_and_scope(sem, scope):
    lock = torch.zeros(2, dtype=torch.int32)
    _cas_kernel[(1,)](lock, lock[1:], SEM=sem, SCOPE=scope, interpret=True)
    assert lock.tolist() == [1, 0]                      # the value is right in the interpreter
    ptx = _cas_kernel.compile(lock, lock, SEM=sem, SCOPE=scope, target=ARCH).asm["ptx"]
    cas = [line.strip() for line in ptx.splitlines() if ".cas." in line]
    assert cas and all(".sys" not in line for line in cas), cas          # gpu / cta scope was asked for
    if sem == "relaxed":
        assert all(".acq_rel" not in line for line in cas), cas


@dsl.jit
def _pointer_array_kernel(addresses, out_ptr, data, BLOCK: dsl.constexpr):
    src = dsl.load(addresses).to(dsl.pointer_type(dsl.float32))      # tutorial 08's idiom
    offsets = dsl.arange(0, BLOCK)
    dsl.store(out_ptr + offsets, dsl.load(src + offsets))


def test_defect_pointer_type_inside_a_kernel():
    """Fixed: dsl.pointer_type(...) is evaluated at compile time inside a kernel (tutorial 08's pointer arrays)."""
    data, out = torch.arange(16, dtype=torch.float32), torch.zeros(16)
    addresses = torch.tensor([data.data_ptr()], dtype=torch.int64)
    _pointer_array_kernel[(1,)](addresses, out, data, BLOCK=16, interpret=True)
    assert torch.equal(out, data)
    ptx = _pointer_array_kernel.compile(addresses, out, data, BLOCK=16, target=ARCH).asm["ptx"]
    assert "ld.global" in ptx


@dsl.jit
def _pointer_type_of_a_runtime_value(o_ptr, n):
    dsl.store(o_ptr, dsl.load(o_ptr.to(dsl.int64).to(dsl.pointer_type(n))))


def test_pointer_type_needs_compile_time_arguments():
    with pytest.raises(CompilationError, match="compile-time arguments"):
        _pointer_type_of_a_runtime_value[(1,)](torch.zeros(1), 3, interpret=True)
