"""Flash attention (FlashAttention-2, Dao 2023, arXiv:2307.08691): the launches of the forward and backward
kernels, with the layout of their outputs; this docstring describes the whole op.

The kernels: attention_forward_kernels.py and attention_backward_kernels.py (the logits and masks they share:
attention_logits.py; their programs' places on the grid: attention_grid.py); their configs: attention_configs.py.

    q: (B, H, L, E)    k: (B, H_kv, S, E)    v: (B, H_kv, S, Ev)    o: (B, H, L, Ev)
    lse: (B, H, 2, L) float32     mask (optional): broadcastable to (B, H, L, S)

Every tensor is read with its own strides (int64 offsets), so transposed, sliced and expanded
(stride 0) views are read in place. H is a multiple of H_kv: query head h reads key/value head
h // (H // H_kv) (grouped-query attention; H_kv = H is plain multi-head attention).

Numerics. Logits are computed in the base-2 domain: s2 = (q . k) * qk_scale with
qk_scale = scale * log2(e), so that softmax(scale * q k^T) = exp2(s2 - max) / sum(...) uses the
`ex2` instruction directly (an additive float mask is multiplied by log2(e) too), flushing subnormal
results (`dsl.exp2(..., ftz=True)`: `ex2.approx.ftz.f32`, as FlashAttention's fast-math exp2f): a weight
below 2^-126 beside the row maximum's weight of 1 becomes 0, 2^-126 of the row sum at most, and ptxas
drops ex2's subnormal fix-up (a compare and two multiplies per element: 13% of the dK/dV kernel's and 19% of
the dQ kernel's instructions at E = 128; session 34, H200, x torch's flash, fp16, S = 2k / 16k, forward
1.01-1.35 -> 1.12-1.49, backward 0.99-1.10 -> 1.07-1.24). The running
maximum m_i and sum l_i are kept in float32 (float64 for float64 inputs in the interpreter); P is
cast to the input dtype before the P @ V tensor-core dot, as FlashAttention does. The backward
recomputes P from logits it rounds afresh (the dK/dV kernel in the transposed dot K Q^T): with float32
inputs (the interpreter's; CUDA runs torch's op) and logits in the thousands, the recomputed rows of P
are off from summing to 1 by ~ulp(|s2|) (3e-4 at |logits| ~ 1.5e3) and dV inherits it (8-16x torch's
error there; tests/test_review_session16_numerics.py, a strict xfail). 16-bit inputs round P to 16
bits first, which hides it.
The scales are passed as float32 pairs (hi, lo) summed in the kernel's accumulation dtype: float
kernel arguments are float32, and the float64 interpreter runs (gradcheck) need more precision.

Saved statistics. `lse[b, h, 0, i] + lse[b, h, 1, i] = m_i + log2(l_i)` is the log-sum-exp of row i
*in base 2* (log2(sum_j exp2(s2_ij))), as an unevaluated sum: lse[.., 0, i] is m_i + log2(l_i) rounded
to float32 and lse[.., 1, i] its rounding error (Knuth's TwoSum), so that a row of huge logits (m_i =
-3.4e38 under a finfo.min mask) keeps its log2(l_i). The natural-log LSE is lse[.., 0, :] * ln(2). The
backward pass recomputes P = exp2((s2 - lse[.., 0, i]) - lse[.., 1, i]) from it; without an additive
mask the logits stay far from float32's range, lo is below hi's last bit's weight in P, and the backward
reads hi alone, P = exp2(s2 - lse[.., 0, i]).

Masks.
  - causal: top-left aligned, as torch's `is_causal` (torch.ones(L, S).tril()): query i sees keys
    j <= i, also when L != S. Key blocks entirely past the diagonal are skipped.
  - attn_mask: boolean (True = keep) or additive float, loaded block by block with its broadcast
    strides (0 for broadcast dims). Causal and attn_mask may be combined (logical and).
    Additive masks of huge finite values (torch.finfo(dtype).min, Hugging Face's convention) work as in
    torch: a logit whose base-2 value overflows is held at the accumulation dtype's minimum (a -inf mask
    value keeps its key out; likewise a finfo.max mask or, with float32 / float64 inputs, a q . k past
    finfo.max / log2(e) is held at the maximum: that key takes the row's weight, as in torch, where two
    such keys share it here), so a row masked everywhere by finfo.min attends to all its keys equally,
    as torch's finfo.min + q.k (which rounds to finfo.min) does; the lse pair below keeps that row's
    log2(l). (So finite logits below finfo(float32).min / log2(e) = -2.36e38 all weigh the same, where
    torch still orders them: a row of -2.5e38 and finfo.min attends to the -2.5e38 keys alone in torch,
    to all of them here.)
  - ragged edges: keys >= S get -inf; rows >= L and head-dim columns >= E are masked loads/stores,
    so any L, S, E <= 256 work (E is padded to the next power of two, BLOCK_E).
  - fully masked rows (every key masked by attn_mask): the output row is 0 (torch's behaviour) and
    lse = (+inf, 0), which makes the recomputed P of that row 0, so its gradients are 0 and finite.

Backward. Three kernels:
  1. `attention_backward_preprocess_kernel`: delta_i = rowsum(dO * O) (float32).
  2. `attention_backward_dkdv_kernel`: one program per (key block, batch, kv head); loops over the
     query heads of its group and over the query blocks, recomputing P^T from K, Q and lse:
     dV += P^T dO, dP^T = V dO^T, dS^T = P^T * (dP^T - delta), dK += dS^T Q.
  3. `attention_backward_dq_kernel`: one program per (query block, batch, head); loops over the key
     blocks: dQ += dS K.
  (dK and dQ are multiplied by `scale` at the end; ds is the gradient of the natural-log logits.)
  Deterministic: dK/dV of a key/value head are summed over the query heads of its group inside one
  program, and dQ over the key blocks inside one program. Where ATOMIC_DKDV_CONFIGS has an entry (head
  dims <= 64), without an attn_mask and unless torch.use_deterministic_algorithms(True) is in force,
  kernel 2 also adds each step's dQ[rows] += dS K into a zeroed float32 buffer with atomic reductions
  (FlashAttention-2's default), whose order differs run to run (the result by float32 rounding, ~1e-7
  relative), and `attention_backward_dq_convert_kernel` scales it into dQ instead of kernel 3.

Grids put batch * heads on axis 0 (up to 2**31 - 1 programs) and the query (or key) blocks on axis
1 (at most 65535, i.e. sequences up to 65535 * BLOCK_M). The E = 64 dK/dV kernel maps its programs head by
head in launch order instead (`attention_grid.head_major_program`), so that the programs running at once share one
head's Q / dO in L2, and so does the dQ kernel of a batch of many heads, sharing K / V (`backward_configs`).
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import torch

import fusedops.dsl as dsl
from fusedops.dsl.language.dtypes import to_torch
from fusedops.dsl.runtime.bounded_cache import BoundedCache
from fusedops.dsl.runtime.knobs import interpret_enabled as _interpret_enabled
from fusedops.kernels.allocation import contiguous_allocator, ordered_allocator, stride_order
from fusedops.kernels.attention_backward_kernels import attention_backward_dkdv_kernel, \
    attention_backward_dq_convert_kernel, attention_backward_dq_kernel, attention_backward_preprocess_kernel
from fusedops.kernels.attention_configs import INTERPRETER_CONFIG, AttentionConfig, reads_vector_rows, backward_configs, \
    forward_config, head_block
from fusedops.kernels.attention_forward_kernels import attention_forward_kernel
from fusedops.kernels.attention_logits import ADDITIVE_MASK, BOOL_MASK, NO_MASK
from fusedops.kernels.device_info import max_shared_memory, sm_count, wgmma_target

LOG2E = 1.4426950408889634
MAX_HEAD_DIM = 256
MAX_GRID_Y = 65535


def _interpret(interpret: Optional[bool]) -> bool:
    return _interpret_enabled() if interpret is None else interpret


def _acc_dtype(q: torch.Tensor):
    return dsl.float64 if q.dtype == torch.float64 else dsl.float32


def _mask_arguments(mask: Optional[torch.Tensor], like: torch.Tensor) -> tuple:
    """(tensor, 4 strides, MASK_KIND) for a mask already expanded to (B, H, L, S), or no mask."""
    if mask is None:
        return like, (0, 0, 0, 0), NO_MASK
    if mask.dtype == torch.bool:       # read as bytes (0 = masked): one byte per element either way
        return mask.view(torch.uint8), _strides(mask), BOOL_MASK
    return mask, _strides(mask), ADDITIVE_MASK


def _mask_argument(mask: Optional[torch.Tensor]):
    """`argument(q, mask)`: the tensor a launch passes for `mask` (as `_mask_arguments`), for masks like this."""
    if mask is None:
        return lambda q, mask: q
    if mask.dtype == torch.bool:
        return lambda q, mask: mask.view(torch.uint8)
    return lambda q, mask: mask


def _strides(t: torch.Tensor) -> tuple:
    # a dim of size 1 is never stepped over; 0 keeps int arguments small and specializable
    return tuple(st if n > 1 else 0 for st, n in zip(t.stride(), t.shape))


@functools.lru_cache(maxsize=256)
def _float_pair(x: float) -> tuple:
    """(hi, lo) float32 values with hi + lo = x to ~48 bits: float kernel arguments are float32, and
    the float64 interpreter runs (gradcheck) need the scale to more than float32 precision."""
    import numpy as np
    with np.errstate(over="ignore", invalid="ignore"):     # past float32's range: hi + lo is NaN, as torch's
        hi = float(np.float32(x))                           # scaled scores give (inf - inf)
        return hi, float(np.float32(x - hi))


def _check_grid(blocks: int, what: str) -> None:
    if blocks > MAX_GRID_Y:
        raise ValueError(f"{what} needs {blocks} blocks, over CUDA's grid limit of {MAX_GRID_Y}")


def _layout_key(t: Optional[torch.Tensor]):
    return None if t is None else (t.shape, t.stride(), t.dtype, t.get_device())


# AttentionLaunches per everything attention_forward derives from its tensors but the addresses (shapes,
# strides, dtypes, devices, causal, scale, the interpreter flag), made by attention_launches; the launches
# of attention_backward with the default options per the same of its tensors: closures over prepared
# kernels (JITFunction.prepare).
_FORWARD_LAUNCHES = BoundedCache(1024)
_BACKWARD_LAUNCHES = BoundedCache(1024)


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                      causal: bool, scale: float, *, interpret: Optional[bool] = None,
                      config: Optional[AttentionConfig] = None,
                      launches: Optional["AttentionLaunches"] = None) -> tuple:
    """Flash attention forward: returns (o, lse).

    q: (B, H, L, E); k: (B, H_kv, S, E); v: (B, H_kv, S, Ev), one dtype (float16/bfloat16 on the GPU;
    the interpreter also runs float32/float64), H a multiple of H_kv, any strides. mask: None or a
    bool / float tensor *expanded* to (B, H, L, S) (stride 0 on broadcast dims). scale multiplies
    q . k. Returns o: (B, H, L, Ev) in q's dtype, laid out as torch's attention lays out its output
    (`output_order`: (B, L, H, Ev) in memory for a q transposed from (B, L, H, E)), and lse: (B, H, 2, L)
    float32 (float64 for
    float64 inputs), the base-2 log-sum-exp of each row's logits as the unevaluated sum lse[:, :, 0] +
    lse[:, :, 1] (+inf and 0 for fully masked rows; the module docstring's "Saved statistics").
    With the default interpret the launch is prepared once per layouts and config (`attention_launches`:
    timing a forced config times the kernel, not its preparation); `launches`: that AttentionLaunches
    (attention_launches(q, k, v, mask, causal, scale)) when the caller has it, which saves finding it.
    """
    if launches is not None:
        return launches.forward(q, k, v, mask)
    if interpret is None:
        return attention_launches(q, k, v, mask, causal, scale, config=config).forward(q, k, v, mask)
    return _forward_launcher(q, k, v, mask, causal, scale, interpret, config)(q, k, v, mask)


def attention_launches(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                       causal: bool, scale: float, *, config: Optional[AttentionConfig] = None) -> "AttentionLaunches":
    """The AttentionLaunches of tensors like these (arguments as for attention_forward; `config`: the
    forward's, None for the table's), made once per layout and config."""
    key = (_layout_key(q), _layout_key(k), _layout_key(v), _layout_key(mask), causal, scale, _interpret_enabled(),
           config)
    launches = _FORWARD_LAUNCHES.get(key)
    if launches is None:
        launches = _FORWARD_LAUNCHES.put(key, AttentionLaunches(
            _forward_launcher(q, k, v, mask, causal, scale, None, config), causal, scale))
    return launches


class AttentionLaunches:
    """The prepared launches of attention_forward for one layout of q, k, v and mask (with causal,
    scale and the interpreter flag), and of the backward of its results: what the autograd Function
    keeps from its forward to its backward, which then finds its launches by the strides of its tensors
    alone (attention_backward's key covers seven tensors' shapes, strides, dtypes and devices).

    forward(q, k, v, mask) -> (o, lse), as attention_forward, for tensors of this layout.
    backward(do, q, k, v, o, lse, mask) -> (dq, dk, dv), as attention_backward, for q, k, v and mask of
    this layout and the o and lse of their forward, prepared in that forward's mode (GPU or
    interpreter: FUSEDOPS_INTERPRET then).
    """

    __slots__ = ("forward", "_causal", "_scale", "_backward")

    def __init__(self, forward: Callable, causal: bool, scale: float):
        self.forward, self._causal, self._scale = forward, causal, scale
        self._backward = BoundedCache(16)   # per layouts of do and the saved tensors

    def backward(self, do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                 lse: torch.Tensor, mask: Optional[torch.Tensor], needs: tuple = (True, True, True)) -> tuple:
        # the saved tensors' strides too: a saved-tensor hook (torch.autograd.graph.save_on_cpu) may lay
        # them out anew (it makes an expanded mask contiguous)
        key = (do.stride(), do.dtype, q.stride(), k.stride(), v.stride(), o.stride(), lse.stride(),
               None if mask is None else mask.stride(), torch.are_deterministic_algorithms_enabled(), needs)
        launch = self._backward.get(key)
        if launch is None:
            launch = self._backward.put(key, _backward_launcher(do, q, k, v, o, lse, mask, self._causal, self._scale,
                                                                None, None, needs))
        return launch(do, q, k, v, o, lse, mask)


def _wanted(needs: tuple, *gradients) -> tuple:
    """The gradients with those `needs` does not want replaced by None."""
    return tuple(g if need else None for need, g in zip(needs, gradients))


def output_order(q: torch.Tensor) -> tuple:
    """The memory order of the output's dims (B, H, L, Ev), outermost first: q's (allocation.stride_order) where
    q's last dim is its innermost with unit stride, else contiguous; torch's attention does the same, so
    nanoGPT's `sdpa(q, k, v).transpose(1, 2).view(B, T, C)` of q, k, v viewed from (B, T, H, E) works."""
    order = stride_order(q)
    return order if order[-1] == 3 and bool(q.stride(3) == 1) else (0, 1, 2, 3)


def _forward_launcher(q, k, v, mask, causal, scale, interpret, config):
    """`launch(q, k, v, mask) -> (o, lse)` for tensors like these (see attention_forward)."""
    batch, heads, length_q, dim = q.shape
    heads_kv, length_k, dim_v = k.shape[1], k.shape[2], v.shape[3]
    interpret = _interpret(interpret)
    acc = _acc_dtype(q)
    new_o = ordered_allocator((batch, heads, length_q, dim_v), output_order(q), q.dtype, q.device)
    new_lse = contiguous_allocator((batch, heads, 2, length_q), to_torch(acc), q.device)
    if batch * heads * length_q == 0:     # no rows (then no outputs either)
        return lambda q, k, v, mask: (new_o(), new_lse())
    block_e, block_ev = head_block(dim), head_block(dim_v)
    config = config or (INTERPRETER_CONFIG if interpret else forward_config(
        block_e, block_ev, mask is not None, length_k, wgmma_target(q.device), all(map(reads_vector_rows, (q, k, v)))))
    blocks = -(-length_q // config.block_m)
    _check_grid(blocks, f"a query length of {length_q}")
    o, lse = new_o(), new_lse()
    mask_arg, mask_strides, mask_kind = _mask_arguments(mask, q)
    prepared = attention_forward_kernel.prepare(
        (batch * heads, blocks), o, lse, q, k, v, mask_arg, *_strides(q), *_strides(k), *_strides(v), *_strides(o),
        *mask_strides, heads, heads // heads_kv, length_q, length_k, dim, dim_v, *_float_pair(float(scale) * LOG2E),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_E=block_e, BLOCK_EV=block_ev,
        CAUSAL=bool(causal), MASK_KIND=mask_kind, ACC=acc, HEAD_MAJOR=config.head_major,
        MIN_BLOCKS=config.min_blocks_per_sm, num_warps=config.num_warps, num_stages=config.num_stages,
        interpret=interpret)
    mask_argument = _mask_argument(mask)

    def launch(q, k, v, mask):
        o, lse = new_o(), new_lse()
        prepared(o, lse, q, k, v, mask_argument(q, mask))
        return o, lse

    return launch


def attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                       lse: torch.Tensor, mask: Optional[torch.Tensor], causal: bool, scale: float, *,
                       interpret: Optional[bool] = None, configs: Optional[tuple] = None,
                       launches: Optional[AttentionLaunches] = None, needs: tuple = (True, True, True)) -> tuple:
    """Flash attention backward: returns (dq, dk, dv), contiguous, shaped and typed like q, k, v.

    do: (B, H, L, Ev), any strides; q, k, v, mask, causal, scale as given to `attention_forward`;
    o and lse are its results. dK and dV are deterministic; so is dQ where the backward runs the dQ kernel
    (see the module docstring: head dims > 64, an attn_mask, torch.use_deterministic_algorithms(True) or
    a forced config without dq_atomic), else its float32 sums take atomic reductions in a varying order.
    `configs`: (dK/dV config, dQ config) to force. `needs`: which of (dq, dk, dv) are wanted (autograd's
    needs_input_grad); those not wanted are None and cost nothing: without dq the dK/dV kernel takes no
    dQ sums and the dQ kernel does not run; without dk and dv only the dQ kernel runs.
    With the default interpret the launches are prepared once per layouts and configs; `launches`: the
    AttentionLaunches of the forward that gave o and lse, whose backward launches are found by the
    tensors' strides alone (see there).
    """
    needs = tuple(bool(n) for n in needs)
    if launches is not None:
        return launches.backward(do, q, k, v, o, lse, mask, needs)
    cached = interpret is None
    if cached:
        key = (_layout_key(do), _layout_key(q), _layout_key(k), _layout_key(v), _layout_key(o), _layout_key(lse),
               _layout_key(mask), causal, scale, _interpret_enabled(), configs,
               torch.are_deterministic_algorithms_enabled(), needs)
        launch = _BACKWARD_LAUNCHES.get(key)
        if launch is not None:
            return launch(do, q, k, v, o, lse, mask)
    launch = _backward_launcher(do, q, k, v, o, lse, mask, causal, scale, interpret, configs, needs)
    if cached:
        _BACKWARD_LAUNCHES.put(key, launch)
    return launch(do, q, k, v, o, lse, mask)


def _backward_launcher(do, q, k, v, o, lse, mask, causal, scale, interpret, configs, needs=(True, True, True)):
    """`launch(do, q, k, v, o, lse, mask) -> (dq, dk, dv)` for tensors like these (see
    attention_backward; None for a gradient `needs` does not want)."""
    need_q, need_kv = needs[0], needs[1] or needs[2]
    batch, heads, length_q, dim = q.shape
    heads_kv, length_k, dim_v = k.shape[1], k.shape[2], v.shape[3]
    interpret = _interpret(interpret)
    acc = _acc_dtype(q)
    new_dq, new_dk, new_dv = (contiguous_allocator(tuple(t.shape), t.dtype, t.device) for t in (q, k, v))
    if batch * heads * length_q == 0 or length_k == 0:   # nothing attends: every gradient is 0
        return lambda do, q, k, v, o, lse, mask: _wanted(needs, new_dq().zero_(), new_dk().zero_(), new_dv().zero_())
    block_e, block_ev = head_block(dim), head_block(dim_v)
    if configs is None:
        configs = (INTERPRETER_CONFIG,) * 2 if interpret else backward_configs(
            block_e, block_ev, mask is not None, batch * heads, sm_count(q.device),
            torch.are_deterministic_algorithms_enabled() or not (need_q and need_kv), max_shared_memory(q.device))
    kv_config, q_config = configs
    blocks_m, blocks_n = -(-length_q // q_config.block_m), -(-length_k // kv_config.block_n)
    _check_grid(max(blocks_m, blocks_n), f"sequence lengths ({length_q}, {length_k})")
    new_delta = contiguous_allocator((batch, heads, length_q), to_torch(acc), q.device)
    # the kernels read lse as contiguous (B * H, 2, L) rows
    lse_contiguous = lse.is_contiguous()
    lse = lse if lse_contiguous else lse.contiguous()
    dq, dk, dv, delta = new_dq(), new_dk(), new_dv(), new_delta()
    mask_arg, mask_strides, mask_kind = _mask_arguments(mask, q)
    common = dict(BLOCK_E=block_e, BLOCK_EV=block_ev, CAUSAL=bool(causal), MASK_KIND=mask_kind, ACC=acc,
                  interpret=interpret)
    preprocess = attention_backward_preprocess_kernel.prepare(
        (batch * heads, blocks_m), delta, o, do, *_strides(o), *_strides(do), heads, length_q, dim_v,
        BLOCK_M=q_config.block_m, BLOCK_EV=block_ev, ACC=acc, num_warps=4, interpret=interpret)
    scales = (*_float_pair(float(scale) * LOG2E), *_float_pair(float(scale)))
    dq_rows = -(-length_q // kv_config.block_m) * kv_config.block_m
    dq_atomic = kv_config.dq_atomic and mask_kind == NO_MASK and need_q and need_kv
    new_dq_acc = contiguous_allocator((batch * heads, dq_rows, block_e), to_torch(acc), q.device)
    dq_acc = new_dq_acc() if dq_atomic else None
    dkdv = None if not need_kv else attention_backward_dkdv_kernel.prepare(
        (batch * heads_kv, blocks_n), dk, dv, q, k, v, do, lse, delta, mask_arg,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dk), *_strides(dv), *mask_strides,
        heads_kv, heads // heads_kv, length_q, length_k, dim, dim_v, *scales,
        BLOCK_M=kv_config.block_m, BLOCK_N=kv_config.block_n, num_warps=kv_config.num_warps,
        num_stages=kv_config.num_stages, KV_RING=kv_config.kv_ring, EARLY_DP=kv_config.early_dp,
        HEAD_MAJOR=kv_config.head_major, DQ_ATOMIC=dq_atomic, dq_ptr=dq_acc, **common)
    dq_kernel = None
    if dq_atomic:
        dq_kernel = attention_backward_dq_convert_kernel.prepare(
            (batch * heads, blocks_m), dq, dq_acc, *_strides(dq), heads, length_q, dim, dq_rows, *scales[2:],
            BLOCK_M=q_config.block_m, BLOCK_E=block_e, ACC=acc, num_warps=4, interpret=interpret)
    elif need_q:
        dq_kernel = attention_backward_dq_kernel.prepare(
            (batch * heads, blocks_m), dq, q, k, v, do, lse, delta, mask_arg,
            *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dq), *mask_strides,
            heads, heads // heads_kv, length_q, length_k, dim, dim_v, *scales,
            BLOCK_M=q_config.block_m, BLOCK_N=q_config.block_n, num_warps=q_config.num_warps,
            num_stages=q_config.num_stages, HEAD_MAJOR=q_config.head_major, **common)
    mask_argument = _mask_argument(mask)

    def launch(do, q, k, v, o, lse, mask):
        delta = new_delta()
        if not lse_contiguous:      # (a saved-tensor hook may lay the saved lse out anew)
            lse = lse.contiguous()
        mask_arg = mask_argument(q, mask)
        preprocess(delta, o, do)
        dq = new_dq() if need_q else None
        dk, dv = (new_dk(), new_dv()) if need_kv else (None, None)
        if dq_atomic:
            dq_acc = new_dq_acc().zero_()
            dkdv(dk, dv, q, k, v, do, lse, delta, mask_arg, dq_acc)
            dq_kernel(dq, dq_acc)
            return _wanted(needs, dq, dk, dv)
        if need_kv:
            dkdv(dk, dv, q, k, v, do, lse, delta, mask_arg, None)
        if need_q:
            dq_kernel(dq, q, k, v, do, lse, delta, mask_arg)
        return _wanted(needs, dq, dk, dv)

    return launch
