"""Stream-K matmul for the TMA path: a persistent grid that splits the last, partial wave of tiles along K.

    C = activation(A @ B + bias)    A: (M, K)    B: (K, N)    C: (M, N)    (one product, as matmul_tma_kernel)

With T tiles of BLOCK_M x BLOCK_N and P programs (one per SM), a grid of one program per tile runs
ceil(T / P) waves, the last one only (T mod P) / P full: at 4096^3 with 128 x 256 tiles, 512 tiles on 132
SMs are 3.88 waves of work in 4 waves of time. Here the P programs first share the multiply-adds of
the last SK_TILES tiles evenly ("stream-K", Osama et al., "Stream-K: Work-centric Parallel Decomposition
for Dense Matrix-Matrix Multiplication on the GPU", PPoPP 2023): the K iterations of those tiles, laid
end to end, are cut into P equal ranges, one per program; then each program computes whole tiles of the
rest (tile p, p + P, ...), as the data-parallel kernel would.

Fix-up. A range usually starts or ends inside a tile. The program whose range holds a tile's last
K iteration owns the tile; the programs before it that cover the tile's earlier iterations (each range
holds at least one iteration: the launcher checks) hand theirs over: a program whose range ends inside
a tile writes its float32 partial tile to its slot of a workspace and then sets its flag to the
launch's `epoch` (release). The owner writes its own partial to a second slot of its own (adding the
others' in registers would double the accumulator's registers), waits for each flag (acquire), and its
epilogue sums the slots 32 rows at a time in a fixed order (the same bits run to run), then resets the
flags to 0, so a CUDA graph replaying the launch (same epoch, same workspace) waits again. Every program
does its range's segments from the last to the first: what it hands over is the first thing it
computes, and an owner waits only for programs with smaller indices (also in the interpreter, which
runs the programs in order). The programs must all be resident at once: the launcher runs one per SM
of the device (under MPS or a green context that leaves a process fewer SMs than the device has, set
FUSEDOPS_STREAM_K=0). Where it pays (`plan`: long problems only) is measured, see MIN_WAVES.

The flags need no zeroing per launch: a flag means "published" when it holds the launch's epoch, a
random odd int64 (`new_epoch`). The workspace comes from torch's caching allocator (`workspace`, per
call and stream-ordered, so concurrent launches on other streams never share one): its memory may
hold anything but, in practice, not this 64-bit value; and since every flag set in a launch is reset
by its owner in that launch, not even a workspace reused from an earlier launch with the same epoch
(a prepared launch, a CUDA graph replay) shows a stale one.
"""

from __future__ import annotations

import secrets
from typing import Callable, Optional

import torch

import fusedops.dsl as dsl
from fusedops.kernels.device_info import sm_count
from fusedops.kernels.matmul_kernels import epilogue, tile_coordinates


@dsl.jit
def _range_start(total, program, programs):
    # The first of `program`'s K iterations among `total` (int64) cut into `programs` ranges (none empty:
    # total >= programs, checked by the launcher; an owner waits for every program before it in its tile).
    return (total * program // programs).to(dsl.int32)


@dsl.jit
def matmul_stream_k_kernel(c_ptr, a_ptr, b_ptr, bias_ptr, partial_ptr, flag_ptr, M, N, K,
                           stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, stride_bias,
                           sk_tiles, epoch,
                           BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, BLOCK_K: dsl.constexpr,
                           GROUP_M: dsl.constexpr, HAS_BIAS: dsl.constexpr, ACTIVATION: dsl.constexpr,
                           ACC: dsl.constexpr):
    # c_ptr: (M, N); a_ptr: (M, K); b_ptr: (K, N); partial_ptr: (2 * programs, BLOCK_M, BLOCK_N) float32;
    # flag_ptr: (programs,) int64; sk_tiles: how many tiles (the last ones) are split along K; epoch: odd int64.
    # Grid: (programs,), every program resident at once.
    pid = dsl.program_id(0)
    programs = dsl.num_programs(0)
    tiles = dsl.cdiv(M, BLOCK_M) * dsl.cdiv(N, BLOCK_N)
    k_iters = dsl.cdiv(K, BLOCK_K)
    dp_tiles = tiles - sk_tiles
    a_desc = dsl.make_tensor_descriptor(a_ptr, (M, K), (stride_am, stride_ak), (BLOCK_M, BLOCK_K))
    b_desc = dsl.make_tensor_descriptor(b_ptr, (K, N), (stride_bk, stride_bn), (BLOCK_K, BLOCK_N))
    slot = dsl.arange(0, BLOCK_M)[:, None] * BLOCK_N + dsl.arange(0, BLOCK_N)[None, :]
    CHUNK_M: dsl.constexpr = 32 if BLOCK_M > 32 else BLOCK_M

    # Stream-K: this program's range [first, last) of the split tiles' K iterations, last segment first.
    total = sk_tiles.to(dsl.int64) * k_iters
    first = _range_start(total, pid, programs)
    end = _range_start(total, pid + 1, programs)
    while end > first:
        local = (end - 1) // k_iters            # the tile of iteration end - 1, among the split tiles
        tile_start = local * k_iters
        start = dsl.maximum(first, tile_start)
        pid_m, pid_n = tile_coordinates(dp_tiles + local, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = dsl.zeros((BLOCK_M, BLOCK_N), ACC)
        for k in range(start - tile_start, end - tile_start):
            acc = dsl.dot(a_desc.load((pid_m * BLOCK_M, k * BLOCK_K)), b_desc.load((k * BLOCK_K, pid_n * BLOCK_N)),
                          acc)
        hand_over = end - tile_start < k_iters
        own = dsl.where(hand_over, pid, programs + pid).to(dsl.int64) * (BLOCK_M * BLOCK_N)
        if hand_over or start > tile_start:
            # A program hands its partial over in slot pid; the owner of a split tile stores its own too (adding
            # the others' in registers would double the accumulator's), in slot programs + pid (slot pid may hold
            # what it handed over, not read yet), and its epilogue sums the slots by rows. One store for both.
            dsl.store(partial_ptr + own + slot, acc)
        if hand_over:
            dsl.atomic_xchg(flag_ptr + pid, epoch, sem="release")
        elif start > tile_start:
            lowest = pid
            while _range_start(total, lowest, programs) > tile_start:
                lowest -= 1
                seen = dsl.atomic_add(flag_ptr + lowest, 0, sem="acquire")
                while seen != epoch:
                    seen = dsl.atomic_add(flag_ptr + lowest, 0, sem="acquire")
            dsl.barrier()
            for part in dsl.static_range(BLOCK_M // CHUNK_M):
                rows = part * CHUNK_M + dsl.arange(0, CHUNK_M)
                chunk = rows[:, None] * BLOCK_N + dsl.arange(0, BLOCK_N)[None, :]
                sums = dsl.load(partial_ptr + own + chunk)
                for source in range(pid - 1, lowest - 1, -1):
                    sums += dsl.load(partial_ptr + source.to(dsl.int64) * (BLOCK_M * BLOCK_N) + chunk)
                epilogue(c_ptr, bias_ptr, sums, pid_m * BLOCK_M + part * CHUNK_M, pid_n * BLOCK_N, M, N, stride_cm,
                          stride_cn, stride_bias, CHUNK_M, BLOCK_N, HAS_BIAS, ACTIVATION, ACC)
            for source in range(lowest, pid):
                dsl.atomic_xchg(flag_ptr + source, 0, sem="relaxed")
        else:
            epilogue(c_ptr, bias_ptr, acc, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N, stride_cm, stride_cn,
                      stride_bias, BLOCK_M, BLOCK_N, HAS_BIAS, ACTIVATION, ACC)
        end = start

    # Data-parallel: whole tiles p, p + P, ... of the others.
    for tile in range(pid, dp_tiles, programs):
        pid_m, pid_n = tile_coordinates(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = dsl.zeros((BLOCK_M, BLOCK_N), ACC)
        for k0 in range(0, K, BLOCK_K):
            acc = dsl.dot(a_desc.load((pid_m * BLOCK_M, k0)), b_desc.load((k0, pid_n * BLOCK_N)), acc)
        epilogue(c_ptr, bias_ptr, acc, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N, stride_cm, stride_cn,
                  stride_bias, BLOCK_M, BLOCK_N, HAS_BIAS, ACTIVATION, ACC)


# At least this many K iterations per tile: shorter K leaves too little work to split for the fix-up to pay.
MIN_K_ITERATIONS = 8
# At least this many waves of tiles. Measured on the H200 (session 7, fp16/bf16, 128 x 256 tiles, 132 programs;
# stream-K / one program per tile): 4096^3 (3.9 waves) 0.88x, 8192 x 4096 x 4096 (7.8 waves) 0.96x,
# 8192 x 4096 x 14336 (7.8) 0.99x, 8192 x 11008 x 4096 (20.8 waves of 256 x 128) 1.00x, 8192^3 (15.5 waves)
# 1.03x (fp16) and 1.03x (bf16): the persistent kernel's tiles run slower than the grid's, which only the
# tail saved on long problems makes up for.
MIN_WAVES = 12


def plan(m: int, n: int, k: int, config: dsl.Config, device: torch.device) -> Optional[tuple]:
    """(programs, sk_tiles) of a stream-K launch of `config` over an (m, n, k) product, or None where the
    data-parallel grid does as well or better: whole waves, fewer than MIN_WAVES waves, short K, or a last
    wave too small to give each program MIN_K_ITERATIONS.

    programs: one per SM (every program must be resident at once; one per SM always is, whatever the
    config's registers and shared memory); sk_tiles: the tiles of the partial last wave (tiles mod
    programs), split along K over all programs."""
    tiles = dsl.cdiv(m, config.constexprs["BLOCK_M"]) * dsl.cdiv(n, config.constexprs["BLOCK_N"])
    programs = sm_count(device)
    k_iterations = dsl.cdiv(k, config.constexprs["BLOCK_K"])
    if tiles < MIN_WAVES * programs or tiles % programs == 0 or k_iterations < MIN_K_ITERATIONS:
        return None
    if (tiles % programs) * k_iterations < MIN_K_ITERATIONS * programs:     # ranges too short for the fix-up
        return None
    return programs, tiles % programs


def _arguments(c, a, b, bias, activation, config, programs, sk_tiles, epoch) -> tuple:
    m, n, k = c.shape[0], c.shape[1], a.shape[1]
    tiles = dsl.cdiv(m, config.constexprs["BLOCK_M"]) * dsl.cdiv(n, config.constexprs["BLOCK_N"])
    k_iterations = dsl.cdiv(k, config.constexprs["BLOCK_K"])
    if not 0 <= sk_tiles <= tiles or (sk_tiles > 0 and sk_tiles * k_iterations < programs):
        raise ValueError(f"sk_tiles={sk_tiles}: expected 0, or at most the {tiles} tiles and with at least one K "
                         f"iteration for each of the {programs} programs (an owner waits for every program "
                         f"before it in its tile: an empty range would never hand over; K={k})")
    partial, flags = workspace(c.device, config, programs)
    has_bias = bias is not None
    args = (c, a, b, bias if has_bias else c, partial, flags, m, n, k, a.stride(0), a.stride(1), b.stride(0),
            b.stride(1), c.stride(0), c.stride(1), bias.stride(0) if has_bias else 0, sk_tiles, epoch)
    acc = dsl.float64 if a.dtype == torch.float64 else dsl.float32
    options = dict(HAS_BIAS=has_bias, ACTIVATION=activation, ACC=acc, num_warps=config.num_warps,
                   num_stages=config.num_stages, **config.constexprs)
    return args, options


def workspace(device: torch.device, config: dsl.Config, programs: int) -> tuple:
    """(partial, flags): 2 x programs slots of BLOCK_M x BLOCK_N float32 (the partial tile each program
    hands over, then each owner's own) and programs int64 flags, from
    torch's caching allocator on the current stream, uninitialized (module docstring: the epoch)."""
    block = config.constexprs["BLOCK_M"] * config.constexprs["BLOCK_N"]
    return (torch.empty((2 * programs, block), dtype=torch.float32, device=device),
            torch.empty((programs,), dtype=torch.int64, device=device))


def new_epoch() -> int:
    """A random odd int64 above 2**62 (never 1 nor divisible by 8: one specialization class)."""
    return 2 * secrets.randbits(61) + (1 << 62) + 1


def launch(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor],
           activation: Optional[str], config: dsl.Config, programs: int, sk_tiles: int,
           interpret: bool = False) -> torch.Tensor:
    """c = activation(a @ b + bias) by matmul_stream_k_kernel with `config` over `programs` programs,
    the last `sk_tiles` tiles split along K (see `plan`). c: (M, N), a: (M, K), b: (K, N) as
    matmul_tma_kernel takes them (16-bit, TMA-describable; the interpreter also takes float32); bias:
    (N,) or None. A new workspace (`workspace`) and epoch per call. Returns c."""
    args, options = _arguments(c, a, b, bias, activation, config, programs, sk_tiles, new_epoch())
    matmul_stream_k_kernel[(programs,)](*args, interpret=interpret, **options)
    return c


def prepare(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor],
            activation: Optional[str], config: dsl.Config, programs: int, sk_tiles: int) -> Callable:
    """`launch(c, a, b, bias)`: `launch` prepared for tensors like these (JITFunction.prepare), with one
    epoch for all its calls and a new workspace per call. Flags hold the epoch only between a
    contributor's release and its owner's reset within one launch, so a workspace whose memory a
    previous call used (or a CUDA graph replaying the launch) never shows a stale epoch."""
    args, options = _arguments(c, a, b, bias, activation, config, programs, sk_tiles, new_epoch())
    prepared = matmul_stream_k_kernel.prepare((programs,), *args, interpret=False, **options)
    device = c.device

    def run(c, a, b, bias):
        partial, flags = workspace(device, config, programs)
        prepared(c, a, b, c if bias is None else bias, partial, flags)
        return c
    return run
