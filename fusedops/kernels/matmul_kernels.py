"""The matmul DSL kernels: C = activation(A @ B + bias) tile by tile, the epilogue fused (launched by
fusedops/kernels/matmul.py).

    matmul_kernel:      A: (batch, M, K)    B: (batch, K, N)    bias: (N,)    C: (batch, M, N)
    matmul_tma_kernel:  A: (M, K)           B: (K, N)           bias: (N,)    C: (M, N)

Kernel. One program computes a BLOCK_M x BLOCK_N tile of C for one batch index (grid axis 1),
walking K in BLOCK_K steps and accumulating in float32 with `dsl.dot`. On sm_80+ the compiler puts
the fp16/bf16 dot on tensor cores (mma.sync m16n8k16; on sm_90a wgmma.mma_async m64nNk16, reading
A and B from shared memory through descriptors), stages A and B through swizzled shared memory
(read with ldmatrix for mma.sync), and software-pipelines the loads of the K loop `num_stages`
deep with cp.async (passes/pipelining.py): the kernel itself is plain tile code.
  - Grouped program order (GROUP_M): consecutive programs sweep GROUP_M rows of tiles column by
    column, so the A rows and B columns they read stay in L2 (the ordering of Triton's matmul
    tutorial, itself from CUTLASS's threadblock swizzle).
  - Ragged edges are masked (rows >= M, columns >= N, k >= K read as 0), so any M, N, K works,
    including K = 0 (C = activation(bias), or 0).
  - Strides are arguments: transposed and strided views are read in place. Row and batch offsets
    are int64 (tensors over 2**31 elements); the compiler reads along whichever dim is contiguous.
  - Epilogue in float32: + bias, then relu / gelu (erf) / gelu_tanh / silu, then the cast to C's dtype.
    (The interpreter also runs float32 and float64 inputs, accumulating in float64 for the latter:
    that is how gradcheck tests the autograd Function on the CPU.)

matmul_tma_kernel (the TMA path, sm_90a): the same kernel reading A and B through
`dsl.make_tensor_descriptor`, so that on sm_90a the bulk tensor copy engine fills the wgmma operand ring
(passes/pipelining.py) and zero-fills the ragged edges. tile_coordinates and epilogue are its pieces that
matmul_persistent's and matmul_stream_k's kernels share.
Clusters (CLUSTER_M / CLUSTER_N, `matmul_configs.TMA_CLUSTER_CONFIGS`, only by `config=`): programs in
clusters of 2 or 4 tiles of a column (row) of tiles, which copy the shared B (A) tile once from L2 for the
cluster (TMA multicast): measured no faster on the H200, so not tuned over.
FUSEDOPS_WS=1 (read at compile time, runtime/knobs.py) replaces the K loop's CTA barrier by per-stage
"empty" mbarriers (passes/pipelining.py); the default stays 0: on the H200 (session 29, bench/matmul.py, the
persistent kernel, x cuBLAS in the same run) 1 was slower, fp16 4096^3 0.99 -> 0.92, bf16 1.00 -> 0.93, 8192^3
fp16 1.02 -> 0.90, bf16 0.97 -> 0.93.
FUSEDOPS_WS=2 (a producer warpgroup issues the ring's copies, the 8 consumer warps never wait for a release): correct
(tests/test_producer_warp.py, GPU tier) but slower too; session 32 (H200, persistent kernel x cuBLAS timed
interleaved in one process, two runs): 128x256x64 s4 fp16 4096^3 0.997-1.000 -> 0.90-0.94, 8192^3 1.005-1.013 -> 0.92, bf16 0.998-1.000
-> 0.92-0.93, 1.010-1.016 -> 0.90-0.93; 256x128x64 alike. A CTA barrier added back to its K loop changed nothing (the
lockstep is not what 0 gains), nor did 3 stages (0.92: the producer warp hides the ring's depth, where 3 stages under 0
give 0.72), nor BLOCK_K = 32 with 6-8 stages (0.70 under 0 and 2, and under 0 with 2-5 wgmma groups left in flight
instead of 1: neither the barrier nor the wgmma queue bounds those; a 32-column A tile takes the 64-byte swizzle). Those runs had one producer warp (168 registers per thread for 9 warps); the producer warpgroup that
gives the consumers 240 registers (setmaxnreg) measured the same: 4096^3 0.905-0.927, 8192^3 0.90-0.94 (both dtypes,
both tiles). Nsight Compute (fp16 4096^3, one launch each): 183 us under 0, 196 us under 2; the consumers' samples
sit at WARPGROUP.DEPBAR.LE 1 (the previous step's wgmma: 36% under 2, 1.5% under 0, whose warps wait at the CTA
barrier instead, 28%) and in the full barrier's try_wait retries (12% against 9%: tiles land later), the tensor
pipe is full less often (gmma stall 0.55 warps per issue against 1.35) and the MIO queue throttles 4x more (1.22
against 0.28). Where the lateness comes from is open.
"""

from __future__ import annotations

import fusedops.dsl as dsl

_SQRT_HALF = 0.7071067811865476
_SQRT_2_OVER_PI = 0.7978845608028654


@dsl.jit
def activation(x, ACTIVATION: dsl.constexpr):
    # x: float32 (or float64) block; ACTIVATION one of matmul.ACTIVATIONS
    if ACTIVATION == "relu":
        x = dsl.maximum(x, 0.0)
    elif ACTIVATION == "gelu":
        x = 0.5 * x * (1.0 + dsl.erf(x * _SQRT_HALF))
    elif ACTIVATION == "gelu_tanh":
        # 0.5 x (1 + tanh(u)) = x sigmoid(2 u), u = sqrt(2 / pi) (x + 0.044715 x^3): one exp and one
        # approximate reciprocal, where libdevice's tanhf made the persistent kernel's epilogue spill 448 bytes
        # (128 x 256 on 8 warps, no bias; ptxas, sm_90a)
        x = x * dsl.sigmoid(2.0 * _SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))
    elif ACTIVATION == "silu":
        x = x * dsl.sigmoid(x)
    return x


@dsl.jit
def matmul_kernel(c_ptr, a_ptr, b_ptr, bias_ptr, M, N, K,
                  stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,
                  stride_cb, stride_cm, stride_cn, stride_bias,
                  BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, BLOCK_K: dsl.constexpr, GROUP_M: dsl.constexpr,
                  HAS_BIAS: dsl.constexpr, ACTIVATION: dsl.constexpr, ACC: dsl.constexpr):
    # c_ptr: (batch, M, N); a_ptr: (batch, M, K); b_ptr: (batch, K, N); bias_ptr: (N,) or unused.
    # Grid: (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), batch). ACC: float32 (float64 for float64 inputs).
    pid = dsl.program_id(0)
    batch = dsl.program_id(1).to(dsl.int64)
    tiles_m = dsl.cdiv(M, BLOCK_M)
    tiles_n = dsl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * tiles_n)
    group_rows = dsl.minimum(tiles_m - group * GROUP_M, GROUP_M)
    pid_m = group * GROUP_M + (pid % (GROUP_M * tiles_n)) % group_rows
    pid_n = (pid % (GROUP_M * tiles_n)) // group_rows

    rm = pid_m * BLOCK_M + dsl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + dsl.arange(0, BLOCK_N)
    rk = dsl.arange(0, BLOCK_K)
    a_rows = a_ptr + batch * stride_ab + rm.to(dsl.int64)[:, None] * stride_am
    b_cols = b_ptr + batch * stride_bb + rn.to(dsl.int64)[None, :] * stride_bn
    acc = dsl.zeros((BLOCK_M, BLOCK_N), ACC)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        k64 = kk.to(dsl.int64)      # int64 offsets: a K stride times K may pass 2**31
        a = dsl.load(a_rows + k64[None, :] * stride_ak, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = dsl.load(b_cols + k64[:, None] * stride_bk, mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = dsl.dot(a, b, acc)

    if HAS_BIAS:
        bias = dsl.load(bias_ptr + rn.to(dsl.int64) * stride_bias, mask=rn < N, other=0.0)
        acc = acc + bias.to(ACC)[None, :]
    acc = activation(acc, ACTIVATION)
    c = c_ptr + batch * stride_cb + rm.to(dsl.int64)[:, None] * stride_cm + rn.to(dsl.int64)[None, :] * stride_cn
    dsl.store(c, acc.to(c_ptr.dtype.element), mask=(rm[:, None] < M) & (rn[None, :] < N))


@dsl.jit
def tile_coordinates(tile, M, N, BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, GROUP_M: dsl.constexpr):
    # (pid_m, pid_n) of `tile` in grouped order (GROUP_M rows of tiles swept column by column).
    tiles_n = dsl.cdiv(N, BLOCK_N)
    group = tile // (GROUP_M * tiles_n)
    group_rows = dsl.minimum(dsl.cdiv(M, BLOCK_M) - group * GROUP_M, GROUP_M)
    pid_m = group * GROUP_M + (tile % (GROUP_M * tiles_n)) % group_rows
    pid_n = (tile % (GROUP_M * tiles_n)) // group_rows
    return pid_m, pid_n


@dsl.jit
def epilogue(c_ptr, bias_ptr, acc, first_row, first_col, M, N, stride_cm, stride_cn, stride_bias,
              ROWS: dsl.constexpr, COLS: dsl.constexpr, HAS_BIAS: dsl.constexpr, ACTIVATION: dsl.constexpr,
              ACC: dsl.constexpr):
    # c[first_row:, first_col:][:ROWS, :COLS] = activation(acc + bias), masked to (M, N).
    rm = first_row + dsl.arange(0, ROWS)
    rn = first_col + dsl.arange(0, COLS)
    if HAS_BIAS:
        bias = dsl.load(bias_ptr + rn.to(dsl.int64) * stride_bias, mask=rn < N, other=0.0)
        acc = acc + bias.to(ACC)[None, :]
    acc = activation(acc, ACTIVATION)
    c = c_ptr + rm.to(dsl.int64)[:, None] * stride_cm + rn.to(dsl.int64)[None, :] * stride_cn
    dsl.store(c, acc.to(c_ptr.dtype.element), mask=(rm[:, None] < M) & (rn[None, :] < N))


@dsl.jit
def matmul_tma_kernel(c_ptr, a_ptr, b_ptr, bias_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                      stride_cm, stride_cn, stride_bias,
                      BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, BLOCK_K: dsl.constexpr, GROUP_M: dsl.constexpr,
                      HAS_BIAS: dsl.constexpr, ACTIVATION: dsl.constexpr, ACC: dsl.constexpr,
                      CLUSTER_M: dsl.constexpr = 1, CLUSTER_N: dsl.constexpr = 1):
    # matmul_kernel for one (M, K) @ (K, N) product (the TMA path), reading A and B through tensor
    # descriptors: on sm_90a the compiler fills the wgmma operand ring with TMA copies, whose ragged
    # edges the copy engine zero-fills. c_ptr: (M, N); a_ptr: (M, K); b_ptr: (K, N);
    # grid: (`_programs`,): one program per tile, the tiles rounded up to whole clusters.
    # CLUSTER_M > 1: clusters of CLUSTER_M programs computing CLUSTER_M consecutive tiles of one column
    # of tiles, which all read the same B tiles: each copies 1 / CLUSTER_M of them from L2 for all
    # (TMA multicast); past the last row of tiles a program still loads its share (and stores nothing).
    # CLUSTER_N > 1 (CLUSTER_M 1): the same along a row of tiles, sharing the A tiles.
    if CLUSTER_M * CLUSTER_N == 1:
        pid_m, pid_n = tile_coordinates(dsl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    elif CLUSTER_N == 1:
        dsl.cluster_dims(CLUSTER_M)
        pid = dsl.program_id(0)
        GROUP_CLUSTERS: dsl.constexpr = GROUP_M // CLUSTER_M if GROUP_M >= CLUSTER_M else 1
        cluster_m, pid_n = tile_coordinates(pid // CLUSTER_M, M, N, BLOCK_M * CLUSTER_M, BLOCK_N, GROUP_CLUSTERS)
        pid_m = cluster_m * CLUSTER_M + pid % CLUSTER_M
    else:
        dsl.cluster_dims(CLUSTER_N)
        pid = dsl.program_id(0)
        pid_m, cluster_n = tile_coordinates(pid // CLUSTER_N, M, N, BLOCK_M, BLOCK_N * CLUSTER_N, GROUP_M)
        pid_n = cluster_n * CLUSTER_N + pid % CLUSTER_N
    a_desc = dsl.make_tensor_descriptor(a_ptr, (M, K), (stride_am, stride_ak), (BLOCK_M, BLOCK_K))
    b_desc = dsl.make_tensor_descriptor(b_ptr, (K, N), (stride_bk, stride_bn), (BLOCK_K, BLOCK_N))
    acc = dsl.zeros((BLOCK_M, BLOCK_N), ACC)
    for k0 in range(0, K, BLOCK_K):
        acc = dsl.dot(a_desc.load((pid_m * BLOCK_M, k0), multicast=CLUSTER_N > 1),
                      b_desc.load((k0, pid_n * BLOCK_N), multicast=CLUSTER_M > 1 and CLUSTER_N == 1), acc)
    epilogue(c_ptr, bias_ptr, acc, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N, stride_cm, stride_cn, stride_bias,
              BLOCK_M, BLOCK_N, HAS_BIAS, ACTIVATION, ACC)
