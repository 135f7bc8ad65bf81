"""The builtins kernels call: `dsl.load`, `dsl.exp`, `dsl.dot`, ... and `constexpr`, `static_range`.

Each builtin is a plain Python function marked with `@builtin`. Inside a `@dsl.jit` kernel the
frontend calls it with the keyword `_semantic`, the `Semantics` that builds typed IR; its arguments
are IR values (runtime scalars and blocks) or Python values (constexprs and literals). Called from
plain Python (no `_semantic`), a builtin raises `RuntimeError`.

Shapes are tuples of powers of two; "block" below means a value of `BlockType`, "scalar" a value
of a `DType`/`PointerType`. Literal Python numbers are weakly typed (see `promotion.py`).
"""

from __future__ import annotations

import functools

from ..errors import CompilationError


def builtin(fn=None, *, host=False):
    """Mark `fn` as a kernel builtin: the frontend calls it with `_semantic=`; plain Python cannot
    (RuntimeError), unless `host`: then `fn` also runs on the host, with `_semantic=None`."""
    if fn is None:
        return lambda f: builtin(f, host=host)

    @functools.wraps(fn)
    def wrapper(*args, _semantic=None, **kwargs):
        if _semantic is None and not host:
            raise RuntimeError(f"dsl.{fn.__name__} can only be called inside a @dsl.jit kernel")
        return fn(*args, _semantic=_semantic, **kwargs)

    wrapper.__dsl_builtin__ = True
    return wrapper


def is_builtin(obj) -> bool:
    return getattr(obj, "__dsl_builtin__", False) is True


class constexpr:
    """A compile-time value.

    As a parameter annotation (`BLOCK: dsl.constexpr`) it makes the parameter a compile-time
    constant: the kernel is specialized on its value, which must be a Python int, float, bool,
    str, None, dsl dtype or a tuple of those. Called, `dsl.constexpr(128)` wraps a value; a module
    global so wrapped can be read by kernels.
    """

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value.value if isinstance(value, constexpr) else value

    def __repr__(self) -> str:
        return f"constexpr({self.value!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, constexpr) and type(other.value) is type(self.value) and other.value == self.value

    def __hash__(self) -> int:
        return hash((constexpr, self.value))


class static_range:
    """`for i in dsl.static_range(start, stop=None, step=1)`: a loop unrolled at compile time.

    The bounds must be constexpr ints; inside the body `i` is a constexpr int, so it can index
    tuples and feed shapes. Use Python's `range` for a loop that stays a loop in the IR.
    """

    def __init__(self, start, stop=None, step=1):
        if stop is None:
            start, stop = 0, start
        self.start, self.stop, self.step = start, stop, step

    def __iter__(self):
        raise RuntimeError("dsl.static_range can only be iterated inside a @dsl.jit kernel")


# -- program and block creation ---------------------------------------------------------------------
@builtin
def program_id(axis, *, _semantic=None):
    """The index of this program instance along grid `axis` (0, 1 or 2): an int32 scalar."""
    return _semantic.program_id(axis)


@builtin
def num_programs(axis, *, _semantic=None):
    """The number of program instances along grid `axis` (0, 1 or 2): an int32 scalar."""
    return _semantic.num_programs(axis)


@builtin
def arange(start, end, *, _semantic=None):
    """The int32 block [start, ..., end - 1]; constexpr bounds, end - start a power of two."""
    return _semantic.arange(start, end)


@builtin
def zeros(shape, dtype, *, _semantic=None):
    """A block of `shape` (a tuple of constexpr powers of two) filled with 0 of `dtype`."""
    return _semantic.full(shape, 0, dtype)


@builtin
def full(shape, value, dtype, *, _semantic=None):
    """A block of `shape` filled with the scalar `value` (literal or runtime), converted to `dtype`."""
    return _semantic.full(shape, value, dtype)


# -- memory -------------------------------------------------------------------------------------------
@builtin
def load(pointer, mask=None, other=None, cache_modifier="", eviction_policy="", *, _semantic=None):
    """Read memory: `pointer` is a pointer scalar or block; the result has its shape and pointee dtype.

    mask: int1 (or anything `!= 0`) scalar/block broadcast with `pointer`; masked-off lanes do not
    touch memory and read `other` (default 0). cache_modifier: the PTX cache operator, "", ".ca",
    ".cg", ".cs", ".lu", ".cv"; eviction_policy: "", "evict_first", "evict_last" (an L2 cache policy
    and the L1 eviction priority), "evict_normal" (PTX ISA "ld", "createpolicy"; codegen/cache_hints.py).
    Raises CompilationError for other values.
    """
    return _semantic.load(pointer, mask, other, cache_modifier, eviction_policy)


@builtin
def store(pointer, value, mask=None, cache_modifier="", eviction_policy="", *, _semantic=None):
    """Write `value` (converted to the pointee dtype, broadcast to `pointer`'s shape) where `mask`.

    cache_modifier: "", ".wb", ".cg", ".cs", ".wt"; eviction_policy as for `load`.
    """
    return _semantic.store(pointer, value, mask, cache_modifier, eviction_policy)


# -- elementwise --------------------------------------------------------------------------------------
@builtin
def where(condition, x, y, *, _semantic=None):
    """Elementwise `x if condition else y`; the three broadcast together, x and y promote."""
    return _semantic.where(condition, x, y)


@builtin
def minimum(x, y, *, _semantic=None):
    """Elementwise minimum of `x` and `y` (promoted, broadcast)."""
    return _semantic.binary("minimum", x, y)


@builtin
def maximum(x, y, *, _semantic=None):
    """Elementwise maximum of `x` and `y` (promoted, broadcast)."""
    return _semantic.binary("maximum", x, y)


@builtin
def clamp(x, min, max, *, _semantic=None):
    """Elementwise `minimum(maximum(x, min), max)` (promoted, broadcast; a NaN propagates, as in
    dsl.minimum / maximum and torch.clamp), Triton's `tl.clamp(x, min, max)`; min <= max is the caller's
    to ensure."""
    return _semantic.binary("minimum", _semantic.binary("maximum", x, min), max)


def _math(name: str, doc: str):
    def function(x, *, _semantic=None):
        return _semantic.unary(name, x)

    function.__name__ = function.__qualname__ = name
    function.__doc__ = (f"Elementwise {doc}. Integer inputs are computed in float32; float16 and "
                        "bfloat16 in float32, rounded back to the input dtype.")
    return builtin(function)


def _exponential(name: str, doc: str):
    def function(x, *, ftz=False, _semantic=None):
        return _semantic.unary(name, x, ftz=ftz)

    function.__name__ = function.__qualname__ = name
    function.__doc__ = (
        f"Elementwise {doc}, in float32 with `ex2.approx.f32` (PTX ISA: max relative error 2^-22 over the full "
        "range, plus the rounding of x * log2(e) for exp) and in float64 with libdevice. Integer inputs are "
        "computed in float32; float16 and bfloat16 in float32, rounded back to the input dtype.\n\n"
        "ftz (constexpr bool, default False): in float32, flush subnormal results (below 2^-126, float32's "
        "smallest normal) to +0, as `ex2.approx.ftz.f32` does (CUDA's `exp2f` under -ftz=true): one MUFU.EX2 "
        "instead of the subnormal-range fix-up around it (a compare and two multiplies per element in SASS). "
        "Where results that small cannot matter (softmax weights beside a row maximum of 1) this saves about "
        "10% of a flash attention kernel on the H200. float64 ignores it. Raises CompilationError if ftz is "
        "not a bool known at compile time.")
    return builtin(function)


exp = _exponential("exp", "e**x")
exp2 = _exponential("exp2", "2**x")
log = _math("log", "natural logarithm")
log2 = _math("log2", "base-2 logarithm")
sqrt = _math("sqrt", "square root (correctly rounded)")
rsqrt = _math("rsqrt", "1 / sqrt(x)")
sin = _math("sin", "sine")
cos = _math("cos", "cosine")
erf = _math("erf", "error function")
tanh = _math("tanh", "hyperbolic tangent")
floor = _math("floor", "round toward -inf")
ceil = _math("ceil", "round toward +inf")


@builtin
def abs(x, *, _semantic=None):
    """Elementwise absolute value, in x's dtype (unsigned and int1 values are returned as is)."""
    return _semantic.unary("abs", x)


@builtin
def sigmoid(x, *, _semantic=None):
    """Elementwise 1 / (1 + exp(-x)); integer and 16-bit float inputs are computed in float32."""
    return _semantic.sigmoid(x)


@builtin
def fma(x, y, z, *, _semantic=None):
    """Elementwise x * y + z with a single rounding, in the promoted floating dtype."""
    return _semantic.fma(x, y, z)


@builtin(host=True)
def cdiv(x, div, *, _semantic=None):
    """Ceiling division ceil(x / div) for positive div (and non-negative x for floats).

    In a kernel it is `x // div`, plus 1 where the remainder is positive: exact up to the type's maximum
    (the textbook `(x + div - 1) // div` wraps for x near it). Evaluated in Python when both are ints:
    constexprs in a kernel (the result is then a constexpr), or on the host, where `dsl.cdiv(n, BLOCK)`
    computes a grid size."""
    if _semantic is None or (isinstance(x, int) and isinstance(div, int)):
        if div == 0:
            raise CompilationError("cdiv by zero")
        return -(-x // div)
    quotient = _semantic.binary("floordiv", x, div)
    remainder = _semantic.binary("mod", x, div)
    return _semantic.where(_semantic.binary("gt", remainder, 0), _semantic.binary("add", quotient, 1), quotient)


@builtin
def cast(input, dtype, bitcast=False, *, _semantic=None):
    """`input` converted to element dtype `dtype` (value conversion; `bitcast=True` reinterprets
    the bits, which needs equal widths). Float to int truncates toward zero."""
    return _semantic.cast(input, dtype, bitcast)


# -- reductions and scans ----------------------------------------------------------------------------
@builtin
def sum(input, axis=None, keep_dims=False, *, _semantic=None):
    """Sum of a block along `axis` (all axes when None). int1/8/16 accumulate in int32, float16 and
    bfloat16 in float32; the result has that accumulation dtype."""
    return _semantic.reduce(input, axis, "sum", keep_dims)


@builtin
def max(input, axis=None, keep_dims=False, *, _semantic=None):
    """Maximum of a block along `axis` (all axes when None), in the input dtype."""
    return _semantic.reduce(input, axis, "max", keep_dims)


@builtin
def min(input, axis=None, keep_dims=False, *, _semantic=None):
    """Minimum of a block along `axis` (all axes when None), in the input dtype."""
    return _semantic.reduce(input, axis, "min", keep_dims)


@builtin
def argmax(input, axis, keep_dims=False, *, _semantic=None):
    """int32 index of the maximum along `axis` (the first one on ties)."""
    return _semantic.argreduce(input, axis, "argmax", keep_dims)


@builtin
def argmin(input, axis, keep_dims=False, *, _semantic=None):
    """int32 index of the minimum along `axis` (the first one on ties)."""
    return _semantic.argreduce(input, axis, "argmin", keep_dims)


@builtin
def cumsum(input, axis=0, reverse=False, *, _semantic=None):
    """Inclusive prefix sum along `axis` (from the end when `reverse`), accumulated as `sum` does."""
    return _semantic.cumsum(input, axis, reverse)


@builtin
def dot(a, b, acc=None, input_precision=None, out_dtype=None, *, _semantic=None):
    """Matrix product a (M x K) @ b (K x N) + acc (M x N); M, N, K powers of two.

    a and b share a dtype: float16/bfloat16/float32 accumulate in float32, float64 in float64, int8
    in int32. input_precision: "ieee" (default) or "tf32" (float32 inputs rounded to tf32, 10 mantissa
    bits, as tensor cores read them; the multiply-adds of float32 dots run on the CUDA cores, tf32 ones
    too: tensor-core tf32 is not implemented yet, tests/test_review_session22_compiler.py).
    """
    return _semantic.dot(a, b, acc, input_precision, out_dtype)


# -- atomics ------------------------------------------------------------------------------------------
def _atomic(kind: str):
    def function(pointer, val, mask=None, sem="acq_rel", scope="gpu", *, _semantic=None):
        return _semantic.atomic_rmw(kind, pointer, val, mask, sem, scope)

    name = f"atomic_{kind}"
    function.__name__ = function.__qualname__ = name
    function.__doc__ = (f"Atomically apply `{kind}` of `val` to the memory `pointer` points to, where "
                        "`mask`; returns the old values (pointer's shape). sem: relaxed, acquire, "
                        "release, acq_rel; scope: cta, gpu, sys.")
    return builtin(function)


atomic_add = _atomic("add")
atomic_max = _atomic("max")
atomic_min = _atomic("min")
atomic_and = _atomic("and")
atomic_or = _atomic("or")
atomic_xor = _atomic("xor")
atomic_xchg = _atomic("xchg")


@builtin
def atomic_cas(pointer, cmp, val, sem="acq_rel", scope="gpu", *, _semantic=None):
    """Atomically write `val` where memory equals `cmp`; returns the old values."""
    return _semantic.atomic_cas(pointer, cmp, val, sem, scope)


# -- shapes -------------------------------------------------------------------------------------------
@builtin
def reshape(input, shape, *, _semantic=None):
    """Row-major reshape of a block to `shape` (same number of elements)."""
    return _semantic.reshape(input, shape)


@builtin
def trans(input, *dims, _semantic=None):
    """Permute the dims of a block (`dims` a permutation); with none, reverse them."""
    return _semantic.trans(input, *dims)


@builtin
def broadcast_to(input, shape, *, _semantic=None):
    """`input` stretched to `shape` by NumPy broadcasting (scalars are splatted)."""
    return _semantic.broadcast_to(input, shape)


@builtin
def expand_dims(input, axis, *, _semantic=None):
    """`input` with a new size-1 dim at `axis` (negative counts from the end)."""
    return _semantic.expand_dims(input, axis)


@builtin
def multiple_of(input, values, *, _semantic=None):
    """Promise the compiler that `input`'s values are multiples of `values` (one int per dim)."""
    return _semantic.multiple_of(input, values)


@builtin
def max_contiguous(input, values, *, _semantic=None):
    """Promise the compiler that `input` holds runs of `values` consecutive integers (one per dim)."""
    return _semantic.max_contiguous(input, values)


# -- debugging ----------------------------------------------------------------------------------------
@builtin
def device_print(prefix, *args, hex=False, _semantic=None):
    """Print `prefix` and the values of `args` from every program instance (and thread)."""
    return _semantic.device_print(prefix, *args, hex=hex)


@builtin
def launch_bounds(min_blocks_per_sm, *, _semantic=None):
    """Ask ptxas to fit `min_blocks_per_sm` programs (CTAs) of this kernel on one SM at once: it caps
    the registers per thread at what that many CTAs of num_warps * 32 threads leave (65536 registers
    per SM on sm_80/sm_90), spilling if it must (PTX ISA, "Performance-Tuning Directives":
    `.minnctapersm` with `.maxntid`; CUDA's __launch_bounds__). A constexpr int from 1 to 32, for the
    whole kernel wherever it is called; calls with different values, and CTAs that cannot fit on one
    SM together (min_blocks_per_sm * num_warps * 32 > 2048 threads, which ptxas would ignore), raise
    CompilationError when compiling. The interpreter ignores it.
    """
    if isinstance(min_blocks_per_sm, constexpr):
        min_blocks_per_sm = min_blocks_per_sm.value
    return _semantic.launch_bounds(min_blocks_per_sm)


@builtin
def cluster_dims(size, *, _semantic=None):
    """Launch this kernel's programs in clusters of `size` consecutive program ids along grid axis 0
    (a thread block cluster, sm_90: PTX `.reqnctapercluster size, 1, 1`, CUDA's __cluster_dims__): the
    programs of a cluster run at the same time on one GPC, and the copy engine can deliver one load to
    all of them (`desc.load(offsets, multicast=True)`). The rank of a program in its cluster is
    `program_id(0) % size`. A constexpr int from 1 to 8, for the whole kernel wherever it is called.

    Launches whose grid's axis 0 is not a multiple of `size` raise LaunchError (everywhere, the
    interpreter and GPUs without clusters included, where the directive has no other effect); calls
    with different sizes raise CompilationError when compiling.
    """
    if isinstance(size, constexpr):
        size = size.value
    return _semantic.cluster_dims(size)


@builtin
def cluster_sum(*values, _semantic=None):
    """The sum of each of `values` over the programs of this program's cluster (`dsl.cluster_dims`), the
    same in every program of the cluster: the programs' values are added in rank order (rank =
    program_id(0) % size), so the result is deterministic. `values`: blocks or scalars of numbers,
    each summed in its own shape; 16-bit floats and small ints are summed in float32 / int32 as by
    `dsl.sum`. One value returns its sum, several a tuple of sums, exchanged together.

    On sm_90 each program writes its values into a slot in the shared memory of every program of the
    cluster (distributed shared memory: `mapa` + `st.shared::cluster`), then the cluster's threads
    meet at a cluster barrier (`barrier.cluster.arrive.release` / `wait.acquire`, PTX ISA "barrier.cluster";
    CUDA Programming Guide, "Distributed Shared Memory"), then each program adds the slots in its own
    shared memory. Slots alternate between two buffers, so a call costs one cluster barrier (the kernel
    starts with one more: no program writes into another before it runs). A kernel without clusters
    (size 1) gets the values themselves.

    Every program of a cluster must make the same cluster_sum calls, in the same order: on the GPU a
    program that makes fewer leaves the others waiting for ever (the interpreter, which runs a
    cluster's programs side by side, raises InterpreterError instead). Compiling a kernel with
    clusters of more than one program and cluster_sum for a GPU before sm_90 raises CompilationError.
    """
    results = _semantic.cluster_sum(values)
    return results[0] if len(results) == 1 else results


@builtin
def barrier(*, _semantic=None):
    """Wait until every thread of this program (CTA) reaches this point; the program's global and
    shared memory writes before it are visible to all its threads after it (PTX `bar.sync`, CUDA's
    __syncthreads). For a block one thread stored and another loads, e.g. a tile written to global
    memory and read back in another layout. Reach it from every thread or none: under a condition
    that is the same for the whole program (the DSL's scalar conditions are). The interpreter runs a
    program's elements together: nothing to wait for there."""
    return _semantic.barrier()


@builtin
def static_assert(cond, msg="", *, _semantic=None):
    """Fail the compilation with `msg` (CompilationError) where the compile-time `cond` is false (Triton's
    `tl.static_assert`; for runtime conditions use device_assert).

    Raises:
        CompilationError: `cond` is false, or a runtime value.
    """
    return _semantic.static_assert(cond, msg)


@builtin
def device_assert(cond, msg="", *, _semantic=None):
    """Fail the launch with `msg` where `cond` is false (checked by the interpreter; on the GPU a trap)."""
    return _semantic.device_assert(cond, msg)


# Methods of block values (`x.to(dsl.float32)`, `x.reshape(...)`, ...): name -> builtin taking x first.
@builtin
def _to(input, dtype, bitcast=False, *, _semantic=None):
    return _semantic.cast(input, dtype, bitcast)


VALUE_METHODS = {
    "to": _to, "reshape": reshape, "trans": trans, "broadcast_to": broadcast_to,
    "expand_dims": expand_dims, "sum": sum, "max": max, "min": min, "argmax": argmax,
    "argmin": argmin, "cumsum": cumsum,
}

__all__ = [
    "builtin", "constexpr", "static_range", "program_id", "num_programs", "arange", "zeros", "full",
    "load", "store", "where", "minimum", "maximum", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "abs",
    "sin", "cos", "sigmoid", "erf", "tanh", "floor", "ceil", "fma", "cdiv", "cast", "sum", "max", "min",
    "argmax", "argmin", "cumsum", "dot", "atomic_add", "atomic_max", "atomic_min", "atomic_and",
    "atomic_or", "atomic_xor", "atomic_xchg", "atomic_cas", "reshape", "trans", "broadcast_to",
    "expand_dims", "multiple_of", "max_contiguous", "device_print", "device_assert", "barrier", "clamp",
    "static_assert",
]
