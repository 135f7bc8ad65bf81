"""Descriptor stores: `desc.store(offsets, value)` (language/descriptors.py), the TMA store it becomes on
sm_90a (passes/descriptors.py, codegen/tma_store.py) and the masked store it is everywhere else.

CPU tier: the interpreter's semantics (only the box's elements inside the tensor are written, any
strides, negative and past-the-end offsets, a scalar fills the box, values converted to the element
type), the errors, which stores become `tma_store`, the chunking rule, and the PTX (one
`cp.async.bulk.tensor ... global.shared::cta` per 128-byte box, commit, wait for the read), which
ptxas must accept. GPU tier: the same boxes through the copy engine on a poisoned tensor (what lies
outside must stay poison), from a blocked layout and from a wgmma accumulator (fp16 / bf16 / fp32
outputs, row- and column-major C), and chunked next to a 4-stage ring.
"""

from __future__ import annotations

import re

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.codegen.tma_store import MAX_SHARED_BYTES, boxes_per_chunk, chunk_buffers
from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels import matmul_persistent as mp
from fusedops.kernels.matmul_configs import WGMMA_CONFIGS
from fusedops.kernels.matmul_kernels import tile_coordinates
from helpers import poison, random_tensor

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


@dsl.jit
def _box_store_kernel(y_ptr, x_ptr, rows, cols, stride_r, stride_c, offset_r, offset_c,
                      BLOCK_R: dsl.constexpr, BLOCK_C: dsl.constexpr):
    # y[offset_r:, offset_c:][:BLOCK_R, :BLOCK_C] = x[:BLOCK_R, :BLOCK_C] (x: row-major BLOCK_R x BLOCK_C),
    # clipped to y's (rows, cols)
    tile = dsl.load(x_ptr + dsl.arange(0, BLOCK_R)[:, None] * BLOCK_C + dsl.arange(0, BLOCK_C)[None, :])
    y = dsl.make_tensor_descriptor(y_ptr, (rows, cols), (stride_r, stride_c), (BLOCK_R, BLOCK_C))
    y.store((offset_r, offset_c), tile)


def _expected(y: torch.Tensor, x: torch.Tensor, r0: int, c0: int) -> torch.Tensor:
    out = y.clone()
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            if 0 <= r0 + i < y.shape[0] and 0 <= c0 + j < y.shape[1]:
                out[r0 + i, c0 + j] = x[i, j].to(y.dtype)
    return out


def _store_box(y, x, r0, c0, interpret):
    _box_store_kernel[(1,)](y, x, y.shape[0], y.shape[1], y.stride(0), y.stride(1), r0, c0,
                            BLOCK_R=x.shape[0], BLOCK_C=x.shape[1], interpret=interpret)


OFFSETS = [(0, 0), (3, -2), (-5, 4), (6, 6), (40, 0), (-8, -8)]


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("r0,c0", OFFSETS, ids=str)
def test_interpreter_store_writes_only_inside(r0, c0, transposed, seed):
    y = poison(torch.empty((7, 5) if transposed else (5, 7)))
    y = y.t() if transposed else y
    x = random_tensor((8, 8), torch.float64, seed=seed)
    expected = _expected(y, x, r0, c0)
    _store_box(y, x, r0, c0, interpret=True)
    assert torch.equal(y.isnan(), expected.isnan()) and torch.equal(y.nan_to_num(), expected.nan_to_num())


@dsl.jit
def _scalar_store_kernel(y_ptr, n, value, BLOCK: dsl.constexpr):
    dsl.make_tensor_descriptor(y_ptr, (n, n), (n, 1), (BLOCK, BLOCK)).store((1, 1), value)


def test_interpreter_scalar_fills_the_box_converted():
    y = torch.zeros(4, 4, dtype=torch.int32)
    _scalar_store_kernel[(1,)](y, 4, 2.75, BLOCK=2, interpret=True)
    expected = torch.zeros(4, 4, dtype=torch.int32)
    expected[1:3, 1:3] = 2
    assert torch.equal(y, expected)


@dsl.jit
def _wrong_shape_kernel(y_ptr, n, BLOCK: dsl.constexpr):
    dsl.make_tensor_descriptor(y_ptr, (n, n), (n, 1), (BLOCK, BLOCK)).store((0, 0), dsl.zeros((BLOCK, 2 * BLOCK),
                                                                                            dsl.float32))


@dsl.jit
def _wrong_offset_kernel(y_ptr, n, BLOCK: dsl.constexpr):
    dsl.make_tensor_descriptor(y_ptr, (n, n), (n, 1), (BLOCK, BLOCK)).store((0, 0.5), 1.0)


@pytest.mark.parametrize("kernel, message", [(_wrong_shape_kernel, r"must be a \(4, 4\) block"),
                                             (_wrong_offset_kernel, "store offsets must be int32")])
def test_store_errors_name_what_was_expected(kernel, message):
    with pytest.raises(dsl.CompilationError, match=message):
        kernel[(1,)](torch.zeros(16), 4, BLOCK=4, interpret=True)


# -- which stores the copy engine does ----------------------------------------------------------------------

def _box_ir(y, x, arch="sm_90a"):
    compiled = dsl.jit(_box_store_kernel.fn).compile(y, x, y.shape[0], y.shape[1], y.stride(0), y.stride(1), 0, 0,
                                                     target=arch, BLOCK_R=x.shape[0], BLOCK_C=x.shape[1])
    return compiled


@needs_ptxas
def test_tma_store_has_an_element_store_path_for_unaligned_or_negative_starts(tma_ws0):
    # the H200 refuses ("illegal instruction") a TMA store box starting before the tensor or off 16 bytes
    # along the contiguous dim: the kernel branches on the offsets to element-wise masked st.global
    y, x = torch.empty(1024, 1024, dtype=torch.float16), torch.empty(64, 64, dtype=torch.float16)
    ptx = _box_ir(y, x).asm["ptx"]
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in ptx and "st.global.b16" in ptx
    assert assemble(ptx, "sm_90a").spill_bytes == 0


@pytest.mark.parametrize("dtype, block, tma", [
    (torch.float16, (64, 64), True), (torch.bfloat16, (128, 128), True), (torch.float32, (16, 32), True),
    (torch.float16, (64, 32), False),      # narrower than one 128-byte atom
    (torch.float16, (512, 64), False),     # 512 rows: over the copy engine's 256 per box dim
    (torch.float64, (16, 16), False),      # 8-byte elements
    (torch.int8, (16, 128), False),
])
def test_tma_store_only_where_the_box_qualifies(tma_ws0, dtype, block, tma):
    y, x = torch.empty(1024, 1024, dtype=dtype), torch.empty(block, dtype=dtype)
    ir_text = _box_ir(y, x).asm["ir"]
    assert ("tma_store" in ir_text) == tma and ("= store" not in ir_text and " store " not in ir_text) == tma


def test_no_tma_store_off_sm90a_with_the_knob_off_or_unaligned(tma_ws0):
    y, x = torch.empty(1024, 1024, dtype=torch.float16), torch.empty(64, 64, dtype=torch.float16)
    assert "tma_store" not in _box_ir(y, x, arch="sm_80").asm["ir"]
    assert "tma_store" not in _box_ir(y[:, 1:1001], x).asm["ir"]         # row stride 2048 B, base off 16 B
    tma_ws0.setenv("FUSEDOPS_TMA", "0")
    assert "tma_store" not in _box_ir(y, x).asm["ir"]


@pytest.mark.parametrize("offset, boxes, box_bytes, expected", [
    (0, 4, 16384, 4),                   # everything fits
    (196640, 4, 16384, 2),              # after a 4-stage 128x256x64 ring: 2 boxes at a time
    (MAX_SHARED_BYTES, 4, 16384, 1),    # no room: one at a time (the launch will say)
])
def test_boxes_per_chunk(offset, boxes, box_bytes, expected):
    assert boxes_per_chunk(offset, boxes, box_bytes) == expected


@needs_ptxas
@pytest.mark.parametrize("dtype, block", [(torch.float16, (64, 128)), (torch.float32, (32, 64)),
                                          (torch.bfloat16, (256, 64))])
def test_tma_store_ptx(tma_ws0, dtype, block):
    y, x = torch.empty(1024, 1024, dtype=dtype), torch.empty(block, dtype=dtype)
    compiled = _box_ir(y, x)
    ptx = compiled.asm["ptx"]
    atom = 128 // x.element_size()
    assert ptx.count("cp.async.bulk.tensor.2d.global.shared::cta") == block[1] // atom
    assert ptx.index("fence.proxy.async") < ptx.index("cp.async.bulk.tensor.2d.global.shared::cta") \
        < ptx.index("cp.async.bulk.commit_group") < ptx.index("cp.async.bulk.wait_group.read")
    (param,) = compiled.tensor_maps
    assert param.box == (block[0], atom) and param.swizzle_bytes == 128 and param.contiguous_dim == 1
    assert assemble(ptx, "sm_90a").spill_bytes == 0


# -- a matmul whose epilogue is a descriptor store ------------------------------------------------------------

@dsl.jit
def store_matmul_kernel(c_ptr, a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                        BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, BLOCK_K: dsl.constexpr,
                        GROUP_M: dsl.constexpr, PERSISTENT: dsl.constexpr):
    # c = a @ b through descriptors. PERSISTENT: programs take tiles pid, pid + programs, ... in one loop
    # over (tile, k), the store in the loop (next to the live operand ring: chunked); else one tile each.
    a_desc = dsl.make_tensor_descriptor(a_ptr, (M, K), (stride_am, stride_ak), (BLOCK_M, BLOCK_K))
    b_desc = dsl.make_tensor_descriptor(b_ptr, (K, N), (stride_bk, stride_bn), (BLOCK_K, BLOCK_N))
    c_desc = dsl.make_tensor_descriptor(c_ptr, (M, N), (stride_cm, stride_cn), (BLOCK_M, BLOCK_N))
    k_iters = dsl.cdiv(K, BLOCK_K)
    if PERSISTENT:
        pid = dsl.program_id(0)
        programs = dsl.num_programs(0)
        my_tiles = (dsl.cdiv(M, BLOCK_M) * dsl.cdiv(N, BLOCK_N) - pid + programs - 1) // programs
        acc = dsl.zeros((BLOCK_M, BLOCK_N), dsl.float32)
        for it in range(0, my_tiles * k_iters):
            local = it // k_iters
            k = it - local * k_iters
            pid_m, pid_n = tile_coordinates(pid + local * programs, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            acc = dsl.dot(a_desc.load((pid_m * BLOCK_M, k * BLOCK_K)), b_desc.load((k * BLOCK_K, pid_n * BLOCK_N)),
                          acc)
            if k == k_iters - 1:
                c_desc.store((pid_m * BLOCK_M, pid_n * BLOCK_N), acc)
                acc = dsl.zeros((BLOCK_M, BLOCK_N), dsl.float32)
    else:
        pid_m, pid_n = tile_coordinates(dsl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = dsl.zeros((BLOCK_M, BLOCK_N), dsl.float32)
        for k in range(0, k_iters):
            acc = dsl.dot(a_desc.load((pid_m * BLOCK_M, k * BLOCK_K)), b_desc.load((k * BLOCK_K, pid_n * BLOCK_N)),
                          acc)
        c_desc.store((pid_m * BLOCK_M, pid_n * BLOCK_N), acc)


def _matmul_args(c, a, b):
    return (c, a, b, c.shape[0], c.shape[1], a.shape[1], a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            c.stride(0), c.stride(1))


@needs_ptxas
def test_persistent_store_next_to_a_4_stage_ring_goes_through_two_buffers(tma_ws0):
    config = WGMMA_CONFIGS[0]
    a, b, c = (torch.empty(4096, 4096, dtype=torch.float16) for _ in range(3))
    compiled = dsl.jit(store_matmul_kernel.fn).compile(*_matmul_args(c, a, b), target="sm_90a", num_warps=8,
                                                       num_stages=4, PERSISTENT=True, **config.constexprs)
    ptx = compiled.asm["ptx"]
    # 4 boxes of 16 KB in the 35 KB left by the ring: one box per chunk through two buffers; chunks 2 and 3
    # wait for the read of the chunk two before (the one since may still be read); the last, in a loop
    # (memory follows), for the writes
    assert ptx.count("global.shared::cta") == 4 and ptx.count("cp.async.bulk.commit_group") == 4
    assert len(re.findall(r"cp\.async\.bulk\.wait_group\.read\s+1;", ptx)) == 2
    assert "wait_group.read 0" not in ptx.replace("\t", " ")
    assert len(re.findall(r"cp\.async\.bulk\.wait_group\s+0;", ptx)) == 1 and "fence.proxy.async.global" in ptx
    sources = re.findall(r"global\.shared::cta\.tile\.bulk_group \[[^]]*\], \[fusedops_shared\+(\d+)\]", ptx)
    assert len(set(sources)) == 2 and sources[0] == sources[2] and sources[1] == sources[3]
    assert compiled.shared_bytes <= MAX_SHARED_BYTES
    assert assemble(ptx, "sm_90a").spill_bytes == 0


@pytest.mark.parametrize("offset, boxes, box_bytes, expected", [
    (0, 4, 16384, (4, 1)),                          # everything fits: one buffer
    (196640, 4, 16384, (1, 2)),                     # room for 2 boxes: one box at a time, two buffers
    (131072, 8, 16384, (3, 2)),                     # room for 6 of 8: three boxes at a time, two buffers
    (MAX_SHARED_BYTES - 20000, 4, 16384, (1, 1)),   # room for one box: one buffer
])
def test_chunk_buffers(offset, boxes, box_bytes, expected):
    assert chunk_buffers(offset, boxes, box_bytes) == expected


@dsl.jit
def _two_box_stores_kernel(y_ptr, z_ptr, x_ptr, w_ptr, rows, cols, stride_r, BLOCK_R: dsl.constexpr,
                           BLOCK_C: dsl.constexpr):
    # y's box = x's, z's box = w's: for each store the other load is one its block does not come from, of
    # another kernel argument (taken not to overlap, as pipelining takes them: passes/pointer_roots.py)
    offsets = dsl.arange(0, BLOCK_R)[:, None] * BLOCK_C + dsl.arange(0, BLOCK_C)[None, :]
    tile, other = dsl.load(x_ptr + offsets), dsl.load(w_ptr + offsets)
    dsl.make_tensor_descriptor(y_ptr, (rows, cols), (stride_r, 1), (BLOCK_R, BLOCK_C)).store((0, 0), tile)
    dsl.make_tensor_descriptor(z_ptr, (rows, cols), (stride_r, 1), (BLOCK_R, BLOCK_C)).store((0, 0), other)


@dsl.jit
def _stored_tensor_read_kernel(y_ptr, z_ptr, x_ptr, rows, cols, stride_r, BLOCK_R: dsl.constexpr,
                               BLOCK_C: dsl.constexpr):
    # y's old box goes to z, x's box to y: y's store follows a load of y's own argument that its block does
    # not come from (the load may still read what the engine writes); z's follows a load of x only
    offsets = dsl.arange(0, BLOCK_R)[:, None] * stride_r + dsl.arange(0, BLOCK_C)[None, :]
    tile, old = dsl.load(x_ptr + offsets), dsl.load(y_ptr + offsets)
    dsl.make_tensor_descriptor(y_ptr, (rows, cols), (stride_r, 1), (BLOCK_R, BLOCK_C)).store((0, 0), tile)
    dsl.make_tensor_descriptor(z_ptr, (rows, cols), (stride_r, 1), (BLOCK_R, BLOCK_C)).store((0, 0), old)


def _fences(ptx):
    return len(re.findall(r"fence\.proxy\.async\s*;", ptx)), ptx.count("fence.proxy.async.shared::cta")


@needs_ptxas
def test_the_proxy_fence_covers_global_memory_only_where_generic_accesses_may_precede(tma_ws0):
    # The persistent matmul reads only through the copy engine, and a bias the stored block is computed from:
    # its TMA store fences the shared tile alone (a full fence.proxy.async cost 1-2% on the H200, session 11).
    for bias, activation in ((None, None), (torch.empty(4096, dtype=torch.float16), "gelu")):
        a = torch.empty(4096, 4096, dtype=torch.float16)
        args, options = mp._arguments(a, a, a, bias, activation, WGMMA_CONFIGS[0], 132)
        ptx = mp.matmul_persistent_kernel.compile(*args, target="sm_90a", **options).asm["ptx"]
        assert _fences(ptx)[0] == 0 and _fences(ptx)[1] >= 4, bias
    # The box kernel stores what it loaded: shared only. So do stores whose other loads read other arguments.
    # A load of the stored argument that the block does not come from (or any generic write in the kernel,
    # tests/test_review_session10_b.py): every state space.
    y, x = torch.empty(1024, 1024, dtype=torch.float16), torch.empty(64, 64, dtype=torch.float16)
    assert _fences(_box_ir(y, x).asm["ptx"])[0] == 0
    z, w = torch.empty_like(y), torch.empty_like(x)
    ptx = _two_box_stores_kernel.compile(y, z, x, w, 1024, 1024, 1024, target="sm_90a", BLOCK_R=64,
                                         BLOCK_C=64).asm["ptx"]
    assert ptx.count("global.shared::cta") == 2 and _fences(ptx)[0] == 0
    ptx = _stored_tensor_read_kernel.compile(y, z, x, 1024, 1024, 1024, target="sm_90a", BLOCK_R=64,
                                             BLOCK_C=64).asm["ptx"]
    assert ptx.count("global.shared::cta") == 2 and _fences(ptx)[0] == 1
    first_store = ptx.index("global.shared::cta")
    assert re.search(r"fence\.proxy\.async\s*;", ptx[:first_store])      # y's: the full fence


def test_interpreter_store_matmul(seed):
    a, b = random_tensor((40, 70), torch.float32, seed=seed), random_tensor((70, 50), torch.float32, seed=seed + 1)
    for persistent in (False, True):
        c = poison(torch.empty(40, 50))
        store_matmul_kernel[(3 if persistent else 12,)](*_matmul_args(c, a, b), BLOCK_M=16, BLOCK_N=16, BLOCK_K=16,
                                                         GROUP_M=2, PERSISTENT=persistent, interpret=True)
        torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-5, atol=1e-5)


# -- GPU tier --------------------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("dtype, block", [(torch.float16, (64, 128)), (torch.float32, (32, 64)),
                                          (torch.bfloat16, (128, 64))])
@pytest.mark.parametrize("r0, c0", [(0, 0), (100, 896), (-20, -40), (250, 1000), (1, 3), (7, 900)], ids=str)
def test_gpu_box_store_clips_to_the_tensor(dtype, block, r0, c0, seed):
    # (100, 896), (250, 1000), (0, 0): the copy engine (the first two clipped); the rest element stores
    y = poison(torch.empty(300, 1000, dtype=dtype, device="cuda"))     # rows of 2000 / 4000 bytes
    x = random_tensor(block, dtype, seed=seed).cuda()
    expected = _expected(y.cpu(), x.cpu(), r0, c0)
    _store_box(y, x, r0, c0, interpret=False)
    y = y.cpu()
    assert torch.equal(y.isnan(), expected.isnan()) and torch.equal(y.nan_to_num(), expected.nan_to_num())


@pytest.mark.cuda
@pytest.mark.parametrize("m, n, k, programs", [(1000, 1536, 704, 132), (384, 512, 64, 5), (4096, 4096, 512, 132),
                                               (136, 272, 1008, 7)])
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("persistent", [False, True])
def test_gpu_store_matmul(m, n, k, programs, out_dtype, persistent, seed):
    # rows of a multiple of 16 bytes: TMA everywhere (else the persistent kernel's operand ring and the
    # store's exchange tile, both cp.async / plain, need more shared memory than a CTA has: a LaunchError)
    generator = torch.Generator(device="cuda").manual_seed(seed)
    in_dtype = torch.bfloat16 if out_dtype == torch.bfloat16 else torch.float16
    a = torch.randn(m, k, device="cuda", generator=generator).to(in_dtype)
    b = torch.randn(k, n, device="cuda", generator=generator).to(in_dtype)
    c = poison(torch.empty(m, n, device="cuda", dtype=out_dtype))
    config = WGMMA_CONFIGS[0]
    grid = (programs,) if persistent else (dsl.cdiv(m, 128) * dsl.cdiv(n, 256),)
    store_matmul_kernel[grid](*_matmul_args(c, a, b), num_warps=8, num_stages=4, PERSISTENT=persistent,
                              **config.constexprs)
    tolerance = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-4}[out_dtype]
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=tolerance, atol=tolerance * k ** 0.5)


@pytest.mark.cuda
@pytest.mark.parametrize("persistent", [False, True])
def test_gpu_store_matmul_column_major_c(persistent, seed):
    # persistent: the exchange tile's boxes span rows that warps share, next to the live ring: each thread
    # tests which chunk a register is in
    m, n, k = 520, 768, 256
    generator = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=generator).half()
    b = torch.randn(k, n, device="cuda", generator=generator).half()
    c = poison(torch.empty(n, m, device="cuda", dtype=torch.float16)).t()        # stride (1, m)
    grid = (5,) if persistent else (dsl.cdiv(m, 128) * dsl.cdiv(n, 256),)
    store_matmul_kernel[grid](*_matmul_args(c, a, b), num_warps=8, num_stages=4, PERSISTENT=persistent,
                              **WGMMA_CONFIGS[0].constexprs)
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=2e-3, atol=2e-3 * k ** 0.5)


@dsl.jit
def _store_then_load_kernel(out_ptr, y_ptr, x_ptr, rows, cols, BLOCK_R: dsl.constexpr, BLOCK_C: dsl.constexpr):
    # y[:BR, :BC] = x + 1; out = y[:BR, :BC] * 3, read back through the descriptor right after the store
    tiles = dsl.arange(0, BLOCK_R)[:, None] * BLOCK_C + dsl.arange(0, BLOCK_C)[None, :]
    y = dsl.make_tensor_descriptor(y_ptr, (rows, cols), (cols, 1), (BLOCK_R, BLOCK_C))
    y.store((0, 0), dsl.load(x_ptr + tiles) + 1.0)
    dsl.store(out_ptr + tiles, y.load((0, 0)) * 3.0)


@pytest.mark.cuda
def test_gpu_load_after_tma_store_sees_the_write(seed):
    x = random_tensor((64, 64), torch.float16, seed=seed).cuda()
    y = poison(torch.empty(64, 128, dtype=torch.float16, device="cuda"))
    out = poison(torch.empty(64, 64, dtype=torch.float16, device="cuda"))
    _store_then_load_kernel[(1,)](out, y, x, 64, 128, BLOCK_R=64, BLOCK_C=64)
    torch.testing.assert_close(out, ((x + 1) * 3), rtol=1e-3, atol=1e-3)
