"""The block IR's op codes and the facts about them, recorded as op groups.

Operand conventions (checked by `verifier.py`):

| op | operands | attrs | result |
|---|---|---|---|
| CONSTANT | - | value (int/float/bool) | scalar or block (splat) |
| PROGRAM_ID, NUM_PROGRAMS | - | axis (0..2) | int32 |
| ARANGE | - | start, end | block<end-start x int32> |
| SPLAT | scalar | - | block of that scalar |
| BROADCAST | block | - | block of the same rank, size-1 dims expanded |
| EXPAND_DIMS | block or scalar | axis | rank + 1, new dim of size 1 |
| RESHAPE | block | - | same numel, the result type's shape |
| TRANS | block | perm | permuted dims |
| CAST | x | - | same shape, the result's element type (value conversion) |
| BITCAST | x | - | same shape and bit width, bits reinterpreted |
| binary elementwise | a, b of one type | approx (DIV in float32 only: the approximate quotient; absent otherwise) | that type (comparisons: int1) |
| UMULHI | a, b of one integer type (N bits) | - | that type: the high N bits of the unsigned 2N-bit product (`dsl.umulhi`) |
| unary elementwise | x | ftz (EXP, EXP2 in float32 only: subnormal results flushed; absent otherwise) | its type |
| FMA | a, b, c of one float type | - | that type |
| MATH | x (float32 / float64) | fn (a name of language/libdevice.py's FUNCTIONS) | its type: libdevice's `fn` (`dsl.math.log1p`, ...) |
| MATH2 | a (float32 / float64), b (a's type; int32 of a's shape for fn="powi") | fn (a two-argument name of FUNCTIONS, or "powi") | a's type: libdevice's `fn(a, b)` |
| WHERE | cond (int1), a, b (one type) | - | a's type |
| ADDPTR | ptr, integer offset (same shape) | - | ptr (offset counts elements) |
| LOAD | ptr [, mask [, other]] | masked, has_other, cache, eviction | element type of ptr |
| STORE | ptr, value [, mask] | masked, cache, eviction | - |
| REDUCE | block | kind (sum/max/min/xor), axis | block with axis removed, or scalar |
| ARGREDUCE | block | kind (argmax/argmin), axis | int32, axis removed |
| SCAN | block | kind (sum/prod), axis, reverse | same type |
| DOT | a (MxK), b (KxN), acc (MxN) | input_precision | acc's type |
| ATOMIC_RMW | ptr, value [, mask] | kind, masked, sem, scope | old values |
| ATOMIC_CAS | ptr, cmp, value | sem, scope | old values |
| MULTIPLE_OF, MAX_CONTIGUOUS | x | values (one per dim) | x's type (a compiler hint) |
| PRINT | values... | prefix, hex | - |
| ASSERT | cond | message | - |
| LAUNCH_BOUNDS | - | min_blocks_per_sm | - (a kernel-wide directive for ptxas) |
| CLUSTER_DIMS | - | size | - (a kernel-wide directive: programs launch in clusters of `size` along grid axis 0) |
| BARRIER | - | - | - (every thread of the program waits for the others; memory ordered across it) |
| FOR | lb, ub, step, inits... | - | final loop-carried values; region 0 args: iv, carried... |
| WHILE | inits... | - | final carried values; region 0 (before): args carried, ends in CONDITION; region 1 (after): args forwarded, ends in YIELD |
| IF | cond (scalar int1) | - | region 0 (then), region 1 (else), each ends in YIELD |
| YIELD | values... | - | terminator |
| CONDITION | cond, forwarded... | - | terminator of a WHILE's before-region |
| CONVERT_LAYOUT | x | - | x's type, a new layout (inserted by the layout pass; `dot_operand` 0/1 when it feeds a tensor-core dot) |
| LOCAL_ALLOC | - | contiguous_dim | `SharedBufferType`: num_buffers tiles in shared memory (inserted by pipelining) |
| LOCAL_DEALLOC | buffer | - | - (the buffer's last use: waits for its pending async copies) |
| ASYNC_COPY | buffer, index (int32), ptr [, mask] | masked, width | - (cp.async of tile `index` from global; masked-off elements are zero) |
| ASYNC_COMMIT | - | - | - (closes a group of async copies) |
| ASYNC_WAIT | - | pending | - (waits until at most `pending` groups are in flight, then a CTA barrier) |
| LOCAL_LOAD | buffer, index (int32) | - | block of the tile's shape and element (a dot operand) |
| WGMMA_WAIT | values... | pending | the values (wgmma.wait_group: at most `pending` groups of wgmmas in flight; results of earlier dots are ready) |
| DESCRIPTOR_LOAD | base ptr, shape0, shape1, stride0, stride1 (int scalars), offset0, offset1 (int32) | block_shape, descriptor (index) | block<block_shape x element>: the box at the offsets of a `dsl.make_tensor_descriptor`, zeros outside [0, shape) |
| DESCRIPTOR_STORE | base ptr, shape0, shape1, stride0, stride1 (int scalars), offset0, offset1 (int32), value (block<block_shape x element>) | block_shape, reduce | - (writes the box at the offsets, only its elements inside [0, shape); reduce="add": adds there atomically instead (`desc.atomic_add`)) |
| TMA_STORE | value, base ptr, shape0, shape1, stride0, stride1, offset0, offset1 | block_shape, contiguous_dim, drain, reduce, fence_global | - (a descriptor store the copy engine does, sm_90a: the block through a swizzled shared tile, then cp.async.bulk.tensor to global, or with reduce="add" cp.reduce.async.bulk.tensor .add; elements outside the tensor are not written) |
| TMA_COPY | buffer, index, barriers, base, shape0, shape1, stride0, stride1, coord0, coord1, predicate (int1) | multicast, multicast_rows | - (one thread: mbarrier expect_tx + cp.async.bulk.tensor of the tile at (coord0, coord1) into tile `index`, completing barrier `index`; multicast=n: each of the cluster's n CTAs copies 1/n of the boxes (multicast_rows: of every box's rows) into all n; inserted by pipelining) |
| MBARRIER_WAIT | barriers, index (int32), phase (int32) | cta_barrier, cluster_wait, issuer | - (waits for phase parity `phase` of barrier `index`, then a CTA barrier unless cta_barrier=False, or with cluster_wait=True the wait half of a cluster barrier; issuer=True: only the thread that issues the TMA copies waits) |
| CLUSTER_BARRIER | - | half | - (barrier.cluster: every thread of the cluster's CTAs arrives (relaxed) when half="arrive", waits (acquire) when half="wait", both (release / acquire) without half) |
| MBARRIER_ARRIVE | barriers, index (int32), predicate (int1) | - | - (where predicate: one arrival per warp on barrier `index`; the "empty" barriers of a TMA ring, FUSEDOPS_WS) |
| PRODUCER_WARP | - | - | - (region 0: what 4 extra warps of the CTA, the producer warpgroup, run instead of the rest of the kernel: a TMA ring's copies; the num_warps warps skip it, and their barriers from here on leave the producer out; inserted by pipelining, FUSEDOPS_WS=2) |
| CLUSTER_SUM | values... (blocks or scalars, float32/64 or int32/64) | - | one per value, its type: the sum over the programs of the cluster, in rank order (`dsl.cluster_sum`) |
"""

from __future__ import annotations

import enum


class OpCode(enum.Enum):
    CONSTANT = "constant"
    PROGRAM_ID = "program_id"
    NUM_PROGRAMS = "num_programs"
    ARANGE = "arange"
    SPLAT = "splat"
    BROADCAST = "broadcast"
    EXPAND_DIMS = "expand_dims"
    RESHAPE = "reshape"
    TRANS = "trans"
    CAST = "cast"
    BITCAST = "bitcast"
    # binary elementwise
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"          # floating-point true division
    IDIV = "idiv"        # integer division, truncating toward zero (C)
    MOD = "mod"          # remainder with the sign of the dividend (C `%`, `fmod` for floats)
    AND = "and"
    OR = "or"
    XOR = "xor"
    SHL = "shl"
    SHR = "shr"          # arithmetic for signed, logical for unsigned
    MINIMUM = "minimum"
    MAXIMUM = "maximum"
    UMULHI = "umulhi"    # high half of the unsigned double-width product (dsl.umulhi)
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    # unary elementwise
    NEG = "neg"
    INVERT = "invert"    # bitwise not (logical not for int1)
    EXP = "exp"
    EXP2 = "exp2"
    LOG = "log"
    LOG2 = "log2"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    ABS = "abs"
    SIN = "sin"
    COS = "cos"
    ERF = "erf"
    TANH = "tanh"
    FLOOR = "floor"
    CEIL = "ceil"
    MATH = "math"        # libdevice's function attrs["fn"] of one float (dsl.math.log1p, ...: language/libdevice.py)
    MATH2 = "math2"      # libdevice's function attrs["fn"] of two operands (pow, atan2, ..., powi)
    # ternary elementwise
    FMA = "fma"
    WHERE = "where"
    # memory and pointers
    ADDPTR = "addptr"
    LOAD = "load"
    STORE = "store"
    ATOMIC_RMW = "atomic_rmw"
    ATOMIC_CAS = "atomic_cas"
    # block-wide
    REDUCE = "reduce"
    ARGREDUCE = "argreduce"
    SCAN = "scan"
    DOT = "dot"
    # hints and debugging
    MULTIPLE_OF = "multiple_of"
    MAX_CONTIGUOUS = "max_contiguous"
    PRINT = "print"
    ASSERT = "assert"
    LAUNCH_BOUNDS = "launch_bounds"
    CLUSTER_DIMS = "cluster_dims"
    BARRIER = "barrier"
    # structured control flow
    FOR = "for"
    WHILE = "while"
    IF = "if"
    YIELD = "yield"
    CONDITION = "condition"
    # inserted by passes
    CONVERT_LAYOUT = "convert_layout"
    LOCAL_ALLOC = "local_alloc"
    LOCAL_DEALLOC = "local_dealloc"
    ASYNC_COPY = "async_copy"
    ASYNC_COMMIT = "async_commit"
    ASYNC_WAIT = "async_wait"
    LOCAL_LOAD = "local_load"
    WGMMA_WAIT = "wgmma_wait"
    # tensor descriptors (dsl.make_tensor_descriptor) and the bulk tensor copy engine
    DESCRIPTOR_LOAD = "descriptor_load"
    DESCRIPTOR_STORE = "descriptor_store"
    TMA_STORE = "tma_store"
    TMA_COPY = "tma_copy"
    MBARRIER_WAIT = "mbarrier_wait"
    MBARRIER_ARRIVE = "mbarrier_arrive"
    CLUSTER_BARRIER = "cluster_barrier"
    CLUSTER_SUM = "cluster_sum"
    PRODUCER_WARP = "producer_warp"


BINARY_ARITH = frozenset({
    OpCode.ADD, OpCode.SUB, OpCode.MUL, OpCode.DIV, OpCode.IDIV, OpCode.MOD, OpCode.AND, OpCode.OR,
    OpCode.XOR, OpCode.SHL, OpCode.SHR, OpCode.MINIMUM, OpCode.MAXIMUM, OpCode.UMULHI,
})
COMPARISON = frozenset({OpCode.EQ, OpCode.NE, OpCode.LT, OpCode.LE, OpCode.GT, OpCode.GE})
BINARY = BINARY_ARITH | COMPARISON
UNARY_MATH = frozenset({
    OpCode.EXP, OpCode.EXP2, OpCode.LOG, OpCode.LOG2, OpCode.SQRT, OpCode.RSQRT, OpCode.SIN,
    OpCode.COS, OpCode.ERF, OpCode.TANH, OpCode.FLOOR, OpCode.CEIL,
})
# The libdevice calls (one op code each for one and two operands; attrs["fn"] names the function).
LIBDEVICE_MATH = frozenset({OpCode.MATH, OpCode.MATH2})
UNARY = UNARY_MATH | frozenset({OpCode.NEG, OpCode.INVERT, OpCode.ABS, OpCode.MATH})
ELEMENTWISE = BINARY | UNARY | frozenset({
    OpCode.MATH2, OpCode.FMA, OpCode.WHERE, OpCode.CAST, OpCode.BITCAST, OpCode.ADDPTR,
    OpCode.MULTIPLE_OF, OpCode.MAX_CONTIGUOUS,
})
COMMUTATIVE = frozenset({
    OpCode.ADD, OpCode.MUL, OpCode.AND, OpCode.OR, OpCode.XOR, OpCode.MINIMUM, OpCode.MAXIMUM,
    OpCode.EQ, OpCode.NE, OpCode.UMULHI,
})
FLOAT_ONLY = UNARY_MATH | LIBDEVICE_MATH | frozenset({OpCode.DIV, OpCode.FMA})
INTEGER_ONLY = frozenset({OpCode.IDIV, OpCode.AND, OpCode.OR, OpCode.XOR, OpCode.SHL, OpCode.SHR, OpCode.UMULHI})
# Ops whose removal changes what the program does even when their results are unused.
SIDE_EFFECTS = frozenset({
    OpCode.STORE, OpCode.ATOMIC_RMW, OpCode.ATOMIC_CAS, OpCode.PRINT, OpCode.ASSERT, OpCode.LAUNCH_BOUNDS,
    OpCode.CLUSTER_DIMS, OpCode.BARRIER, OpCode.CLUSTER_BARRIER, OpCode.YIELD, OpCode.CONDITION,
    OpCode.LOCAL_DEALLOC, OpCode.ASYNC_COPY, OpCode.ASYNC_COMMIT, OpCode.ASYNC_WAIT, OpCode.WGMMA_WAIT,
    OpCode.TMA_COPY, OpCode.MBARRIER_WAIT, OpCode.MBARRIER_ARRIVE, OpCode.DESCRIPTOR_STORE, OpCode.TMA_STORE,
    OpCode.CLUSTER_SUM, OpCode.PRODUCER_WARP,
})
# The largest cluster (CTAs) that every sm_90 GPU can launch (CUDA's "portable cluster size").
MAX_CLUSTER_SIZE = 8


def cluster_size(function) -> int:
    """The cluster size a kernel asked for with `dsl.cluster_dims` (1 when it did not).

    Raises:
        CompilationError: calls with different sizes.
    """
    directives = [op for op in function.walk() if op.opcode == OpCode.CLUSTER_DIMS]
    for op in directives[1:]:
        if op.attrs["size"] != directives[0].attrs["size"]:
            from ..errors import CompilationError
            raise CompilationError(f"cluster_dims: kernel `{function.name}` asks for different cluster sizes "
                                   f"{directives[0].attrs['size']} (at {directives[0].loc}) and {op.attrs['size']}",
                                   op.loc)
    return directives[0].attrs["size"] if directives else 1


CONTROL_FLOW = frozenset({OpCode.FOR, OpCode.WHILE, OpCode.IF})
TERMINATORS = frozenset({OpCode.YIELD, OpCode.CONDITION})
