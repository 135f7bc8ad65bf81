"""Random numbers in kernels: Triton's counter-based Philox generator (`dsl.rand`, `randn`, `randint`,
`randint4x`, `rand4x`, `randn4x`, `philox`, `philox_impl`, `uint_to_uniform_float`,
`pair_uniform_to_normal`) and `dsl.umulhi`, the multiply it is built on.

The generator is Philox4x32-10 (and Philox4x64-10 for 64-bit counters) of J. K. Salmon, M. A. Moraes,
R. O. Dror and D. E. Shaw, "Parallel random numbers: as easy as 1, 2, 3" (SC 2011): a keyed bijection of a
four-word counter, so a value depends only on (seed, offset) -- not on the program, the block size or the
launch -- and the interpreter and the compiled kernel give the same bits (the normals: within a few float32
ulps, their log / cos / sin being NumPy's and libdevice's). The conventions are Triton's
(`triton.language.random`, 3.x), so that a ported kernel draws the same numbers:

- key: the seed converted to uint64 (a signed seed sign-extends), then for 32-bit counters
  (k0, k1) = (its low 32 bits, its high 32 bits), for 64-bit counters (k0, k1) = (seed, 0);
- counter: `randint4x(seed, offset)` is `philox(seed, offset, 0, 0, 0)`: word 0 holds the offset (its bits
  as unsigned), words 1 to 3 are zero;
- one round (multipliers M0 = 0xD2511F53, M1 = 0xCD9E8D57; 64-bit: 0xD2E7470EE14C6C93, 0xCA5A826395121157):
  (c0, c1, c2, c3) <- (hi(M1 * c2) ^ c1 ^ k0, lo(M1 * c2), hi(M0 * c0) ^ c3 ^ k1, lo(M0 * c0)), then the key
  is bumped by the Weyl constants W0 = 0x9E3779B9, W1 = 0xBB67AE85 (64-bit: 0x9E3779B97F4A7C15,
  0xBB67AE8584CAA73B), wrapping; 10 rounds unless `n_rounds` says otherwise;
- uniform floats: the word read as a signed integer x, x < 0 replaced by -x - 1 (so 0 <= x < 2**31, 2**63),
  then float32(x) * float32(4.6566127342e-10) (64-bit words: 1.0842020432385337e-19), which stays below 1.0;
- normals: Box-Muller on a pair of uniforms, u1 clamped to at least 1e-7:
  sqrt(-2 log u1) * (cos(2 pi u2), sin(2 pi u2)).

The helpers are `@dsl.jit` functions over the language's own unsigned arithmetic; the few builtins here
check their arguments and normalize them (errors name the argument and what was expected).
"""

from __future__ import annotations

from ..errors import CompilationError
from ..ir import OpCode
from ..runtime.jit import jit
from . import promotion
from .core import builtin, constexpr, static_range
from .dtypes import PointerType, float32, int32, int64, shape_of, uint32, uint64
from .elementwise_builtins import cos, log, maximum, sin, sqrt, where
from .semantics import element_of

N_ROUNDS_DEFAULT = 10

# (M0, M1, W0, W1) by counter width: Salmon et al. (2011), Philox4x32 / Philox4x64 (the multipliers and the
# Weyl sequence's key increments, the golden ratio and sqrt(3) - 1 in fixed point)
_PHILOX_CONSTANTS = {
    32: (0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85),
    64: (0xD2E7470EE14C6C93, 0xCA5A826395121157, 0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B),
}
# Scales with float32(2**(N-1) - 1) * float32(scale) < 1.0 (Triton's uint_to_uniform_float): 2**-31 and 2**-63
# less one and two float32 ulps
_UNIFORM_SCALE = {32: 4.6566127342e-10, 64: 1.0842020432385337e-19}


def _integer_value(_semantic, value, what: str, like=None):
    """`value` (an IR value or an int literal) as an IR value of an integer dtype, or CompilationError."""
    if isinstance(value, constexpr):
        value = value.value
    if isinstance(value, bool) or not (isinstance(value, int) or hasattr(value, "type")):
        raise CompilationError(f"{what} must be an integer (a scalar or a block), got {_shown(value)}")
    value = _semantic.to_value(value, like)
    element = element_of(value)
    if isinstance(element, PointerType) or not element.is_integer or element.is_bool:
        raise CompilationError(f"{what} must be an integer (a scalar or a block), got {element}")
    return value


def _shown(value) -> str:
    return repr(value) if isinstance(value, (int, float, str, type(None))) else type(value).__name__


def _rounds(n_rounds) -> int:
    if isinstance(n_rounds, constexpr):
        n_rounds = n_rounds.value
    if isinstance(n_rounds, bool) or not isinstance(n_rounds, int) or n_rounds < 0:
        raise CompilationError(f"n_rounds must be a constexpr int >= 0, got {_shown(n_rounds)}")
    return n_rounds


def _broadcast_counters(_semantic, counters: list, keys: list) -> list:
    """The counters broadcast to the shape of all six values (every output word has it, whatever n_rounds);
    the keys stay as they are (a scalar key is added once per thread, not per element)."""
    shape = ()
    for value in counters + keys:
        try:
            shape = _semantic._broadcast_shape(shape, shape_of(value.type))
        except CompilationError as e:
            raise CompilationError(f"the counters and the seed do not broadcast together: {e}") from None
    return [v if shape_of(v.type) == shape else _semantic.broadcast_to(v, shape) for v in counters] + keys


# -- the multiply Philox is made of ---------------------------------------------------------------------
@builtin
def umulhi(x, y, *, _semantic=None):
    """The high N bits of the 2N-bit product of x and y read as N-bit unsigned integers (Triton's
    `tl.umulhi`; PTX `mul.hi.u32` / `mul.hi.u64`).

    x, y: integer scalars or blocks (int literals adopt the other operand's type), promoted to one type of
    N = 8, 16, 32 or 64 bits and broadcast together. Returns that type and shape; a signed type's bits are
    the unsigned result's (umulhi(-1, 2) in int32 is 1). The low half is `x * y` (wrapping).

    Raises:
        CompilationError: an operand that is not an integer (floats, pointers, int1).
    """
    for name, value in (("x", x), ("y", y)):
        if isinstance(value, bool) or not (isinstance(value, int) or hasattr(value, "type")):
            raise CompilationError(f"umulhi: {name} must be an integer scalar or block, got {_shown(value)}")
    a, b = _semantic._pair(x, y)
    for name, value in (("x", a), ("y", b)):
        element = element_of(value)
        if isinstance(element, PointerType) or not element.is_integer or element.is_bool:
            raise CompilationError(f"umulhi: {name} must be an integer scalar or block, got {element}")
    try:
        dtype = promotion.promote(element_of(a), element_of(b))
    except promotion.PromotionError as e:
        raise CompilationError(f"umulhi: {e}") from None
    a, b = _semantic.broadcast_pair(_semantic.cast(a, dtype), _semantic.cast(b, dtype))
    return _semantic.builder.value(OpCode.UMULHI, [a, b], a.type)


# -- argument checks and normalization (builtins the helpers call) ------------------------------------
@builtin
def _philox_state(c0, c1, c2, c3, k0, k1, n_rounds, *, _semantic=None):
    """philox_impl's arguments checked: six values of one unsigned type (uint32 or uint64), broadcast to one
    shape, and that type's constants (M0, M1, W0, W1)."""
    _rounds(n_rounds)
    names = ("c0", "c1", "c2", "c3", "k0", "k1")
    first = next((i for i, v in enumerate((c0, c1, c2, c3, k0, k1)) if hasattr(v, "type")), None)
    like = element_of((c0, c1, c2, c3, k0, k1)[first]) if first is not None else uint32     # all literals: uint32
    values = [_integer_value(_semantic, v, n, like) for n, v in zip(names, (c0, c1, c2, c3, k0, k1))]
    if like not in (uint32, uint64):
        raise CompilationError(f"{names[first]} must be uint32 or uint64, got {like} (dsl.philox takes signed "
                               "counters and a seed)")
    for name, value in zip(names, values):
        if element_of(value) != like:
            raise CompilationError(f"{name} must have the type of the others ({like}), got {element_of(value)}")
    return (*_broadcast_counters(_semantic, values[:4], values[4:]), *_PHILOX_CONSTANTS[like.bits])


@builtin
def _philox_key_and_counters(seed, c0, c1, c2, c3, n_rounds, *, _semantic=None):
    """philox's arguments checked and converted: the four counters as the unsigned type of c0's width (32 or
    64 bits; int literals adopt c0's type), and the key words from the seed (the module docstring)."""
    _rounds(n_rounds)
    seed = _integer_value(_semantic, seed, "seed")
    first = _integer_value(_semantic, c0, "offset (counter c0)")
    width = element_of(first).bits
    if width not in (32, 64):
        raise CompilationError(f"offset (counter c0) must be a 32- or 64-bit integer, got "
                               f"{element_of(first)} (convert it with .to(dsl.int32) or .to(dsl.int64))")
    unsigned = uint32 if width == 32 else uint64
    counters = [first]
    for name, value in (("c1", c1), ("c2", c2), ("c3", c3)):
        value = _integer_value(_semantic, value, name, element_of(first))
        if element_of(value).bits != width:
            raise CompilationError(f"{name} must have c0's width ({width} bits), got {element_of(value)}")
        counters.append(value)
    counters = [_semantic.cast(v, unsigned, True) for v in counters]
    seed = _semantic.cast(seed, uint64)
    if width == 32:
        k0 = _semantic.cast(seed, uint32)
        k1 = _semantic.cast(_semantic.binary("rshift", seed, 32), uint32)
    else:
        k0, k1 = seed, _semantic.constant(0, uint64)
    return tuple(_broadcast_counters(_semantic, counters, [k0, k1]))


@builtin
def _uniform_float_input(x, *, _semantic=None):
    """uint_to_uniform_float's argument as the signed integer of its width, and the scale of that width."""
    x = _integer_value(_semantic, x, "x")
    bits = element_of(x).bits
    if bits not in (32, 64):
        raise CompilationError(f"x must be a 32- or 64-bit integer (randint's result), "
                               f"got {element_of(x)}")
    return _semantic.cast(x, int32 if bits == 32 else int64, True), _UNIFORM_SCALE[bits]


# -- the generator --------------------------------------------------------------------------------------
@jit
def philox_impl(c0, c1, c2, c3, k0, k1, n_rounds: constexpr = N_ROUNDS_DEFAULT):
    """`n_rounds` Philox rounds of the counter (c0, c1, c2, c3) under the key (k0, k1) (the module docstring
    states a round). All six are uint32 (Philox4x32) or all uint64 (Philox4x64), scalars or blocks
    (broadcast together); int literals adopt their type. Returns the four words, of that type and shape.

    Raises:
        CompilationError: values of other or mixed types, n_rounds not a constexpr int >= 0.
    """
    c0, c1, c2, c3, k0, k1, M0, M1, W0, W1 = _philox_state(c0, c1, c2, c3, k0, k1, n_rounds)
    for _ in static_range(n_rounds):
        previous0, previous2 = c0, c2
        c0 = umulhi(M1, previous2) ^ c1 ^ k0
        c2 = umulhi(M0, previous0) ^ c3 ^ k1
        c1 = M1 * previous2
        c3 = M0 * previous0
        k0 = k0 + W0
        k1 = k1 + W1
    return c0, c1, c2, c3


@jit
def philox(seed, c0, c1, c2, c3, n_rounds: constexpr = N_ROUNDS_DEFAULT):
    """Philox of the counter (c0, c1, c2, c3) under the key made from `seed` (Triton's `tl.philox`).

    seed: an integer scalar (or block), any width; converted to uint64 (signed seeds sign-extend), the key is
    its low and high 32-bit halves for 32-bit counters, (seed, 0) for 64-bit ones. c0 .. c3: integer scalars
    or blocks of one width, 32 bits (Philox4x32) or 64 bits (Philox4x64), their bits read as unsigned; int
    literals adopt c0's type. n_rounds: a constexpr int >= 0 (default 10). Returns four blocks (scalars) of
    uint32 or uint64, the counters' broadcast shape.

    Raises:
        CompilationError: a non-integer seed or counter, counters of other widths, a bad n_rounds.
    """
    c0, c1, c2, c3, k0, k1 = _philox_key_and_counters(seed, c0, c1, c2, c3, n_rounds)
    return philox_impl(c0, c1, c2, c3, k0, k1, n_rounds)


@jit
def randint4x(seed, offset, n_rounds: constexpr = N_ROUNDS_DEFAULT):
    """Four independent random words for each offset: `philox(seed, offset, 0, 0, 0, n_rounds)` (Triton's
    `tl.randint4x`). offset: an int32 / uint32 (or int64 / uint64) scalar or block; the words are uint32
    (uint64) of its shape, uniform over the type and a function of (seed, offset) only.

    Raises:
        CompilationError: as `dsl.philox` (offsets of 8 or 16 bits, floats, a non-integer seed).
    """
    return philox(seed, offset, 0, 0, 0, n_rounds)


@jit
def randint(seed, offset, n_rounds: constexpr = N_ROUNDS_DEFAULT):
    """The first word of `randint4x(seed, offset, n_rounds)`: a uint32 (uint64 for 64-bit offsets) block of
    offset's shape, uniform over the type (Triton's `tl.randint`).

    Raises:
        CompilationError: as `dsl.philox`.
    """
    first, _, _, _ = randint4x(seed, offset, n_rounds)
    return first


@jit
def uint_to_uniform_float(x):
    """Random bits to float32 uniform in [0, 1) (Triton's `tl.uint_to_uniform_float`): x (int32 / uint32 or
    int64 / uint64, scalar or block) read as signed, negative values replaced by -x - 1, then converted to
    float32 (rounded to nearest) and multiplied by the float32 of 4.6566127342e-10 (64 bits:
    1.0842020432385337e-19). Returns float32 of x's shape; the largest result is 1 - 2**-24 (64 bits:
    1 - 2**-23), and 0 is possible.

    Raises:
        CompilationError: x not a 32- or 64-bit integer.
    """
    x, scale = _uniform_float_input(x)
    x = where(x < 0, -x - 1, x)
    return x.to(float32) * scale


@jit
def rand(seed, offset, n_rounds: constexpr = N_ROUNDS_DEFAULT):
    """float32 uniform in [0, 1) for each offset: `uint_to_uniform_float(randint(seed, offset, n_rounds))`
    (Triton's `tl.rand`). seed: an integer scalar; offset: an int32 / int64 scalar or block (its shape is
    the result's). Never 1.0 nor negative; the same (seed, offset) gives the same value in every launch.

    Raises:
        CompilationError: as `dsl.philox`.
    """
    return uint_to_uniform_float(randint(seed, offset, n_rounds))


@jit
def rand4x(seed, offset, n_rounds: constexpr = N_ROUNDS_DEFAULT):
    """Four independent float32 blocks uniform in [0, 1), from the four words of `randint4x` (Triton's
    `tl.rand4x`).

    Raises:
        CompilationError: as `dsl.philox`.
    """
    i1, i2, i3, i4 = randint4x(seed, offset, n_rounds)
    return uint_to_uniform_float(i1), uint_to_uniform_float(i2), uint_to_uniform_float(i3), uint_to_uniform_float(i4)


@jit
def pair_uniform_to_normal(u1, u2):
    """Two independent standard normals from two uniforms in [0, 1) by the Box-Muller transform (G. E. P.
    Box and M. E. Muller, 1958), in float32 (Triton's `tl.pair_uniform_to_normal`): u1 is clamped to at
    least 1e-7 (|n| <= 5.68), r = sqrt(-2 log u1), returns (r cos(2 pi u2), r sin(2 pi u2)).
    """
    u1 = maximum(1.0e-7, u1)
    th = 6.283185307179586 * u2
    r = sqrt(-2.0 * log(u1))
    return r * cos(th), r * sin(th)


@jit
def randn(seed, offset, n_rounds: constexpr = N_ROUNDS_DEFAULT):
    """float32 standard normal for each offset (Triton's `tl.randn`): Box-Muller of the uniforms of the first
    two words of `randint4x(seed, offset, n_rounds)`, its cosine half. Finite, |value| <= 5.68.

    Raises:
        CompilationError: as `dsl.philox`.
    """
    i1, i2, _, _ = randint4x(seed, offset, n_rounds)
    n1, _ = pair_uniform_to_normal(uint_to_uniform_float(i1), uint_to_uniform_float(i2))
    return n1


@jit
def randn4x(seed, offset, n_rounds: constexpr = N_ROUNDS_DEFAULT):
    """Four float32 standard normal blocks: Box-Muller of the uniforms of words (1, 2) and (3, 4) of
    `randint4x` (Triton's `tl.randn4x`).

    Raises:
        CompilationError: as `dsl.philox`.
    """
    u1, u2, u3, u4 = rand4x(seed, offset, n_rounds)
    n1, n2 = pair_uniform_to_normal(u1, u2)
    n3, n4 = pair_uniform_to_normal(u3, u4)
    return n1, n2, n3, n4


__all__ = [
    "umulhi", "philox_impl", "philox", "randint4x", "randint", "uint_to_uniform_float", "rand", "rand4x",
    "pair_uniform_to_normal", "randn", "randn4x",
]
