"""`LinearLayout`: a layout as a linear map over GF(2) from input-index bits to coordinate bits.

A layout says which thread holds which element of a power-of-two block, in which register. Following
"Linear Layouts" (Zhou et al., 2025, arXiv 2505.23819), every layout we use is a linear map over
GF(2): the input is a tuple of indices, one per *input dim* (`"register"`, `"lane"`, `"warp"` for a
distributed layout; `"offset"` for a shared-memory layout), and the output is the element's
coordinates, one per *output dim* (`"dim0"`, `"dim1"`, ... for a block). The map is given by one
basis vector per input bit (a tuple of output coordinates); the image of an input is the XOR of the
bases of its set bits. All sizes are powers of two, so XOR never leaves the block.

Example: thread (lane 5, warp 0) of `blocked((4, 64), ...)` holds in register 3 the element
`layout.apply(register=3, lane=5, warp=0)`.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Optional, Sequence, Union

from .gf2 import Span

REGISTER = "register"
LANE = "lane"
WARP = "warp"
OFFSET = "offset"
WARP_SIZE = 32
LANE_BITS = 5



def dim_names(rank: int) -> tuple:
    """The output dim names of a rank-`rank` block: ("dim0", "dim1", ...)."""
    return tuple(f"dim{i}" for i in range(rank))


def log2_exact(value: int, what: str = "size") -> int:
    """log2 of a power of two; ValueError naming `what` otherwise."""
    if not isinstance(value, int) or value <= 0 or value & (value - 1):
        raise ValueError(f"{what} must be a power of two, got {value!r}")
    return value.bit_length() - 1


class LinearLayout:
    """An immutable, hashable linear map from input-dim bits to output coordinates over GF(2).

    bases:    {input dim name: [basis for bit 0, basis for bit 1, ...]}; each basis is a tuple with
              one int per output dim. An input dim with k bases has size 2**k (k may be 0).
    out_dims: {output dim name: size} in coordinate order, or a shape tuple (names dim0, dim1, ...).

    Equality compares the output dims (ordered) and the non-empty input dims' bases; an absent input
    dim and an empty one (size 1) are the same. Raises ValueError for sizes that are not powers of
    two, bases of the wrong length or coordinates outside the output dims.
    """

    __slots__ = ("_bases", "_out", "_key")

    def __init__(self, bases: Union[Mapping[str, Sequence[Sequence[int]]], Iterable],
                 out_dims: Union[Mapping[str, int], Sequence[int]]):
        if isinstance(out_dims, Mapping):
            out = tuple((str(name), int(size)) for name, size in out_dims.items())
        else:
            sizes = tuple(int(s) for s in out_dims)
            out = tuple(zip(dim_names(len(sizes)), sizes))
        for name, size in out:
            log2_exact(size, f"output dim {name!r} size")
        if len({name for name, _ in out}) != len(out):
            raise ValueError(f"duplicate output dim names in {out}")
        items = bases.items() if isinstance(bases, Mapping) else bases
        normalized = []
        for name, vectors in items:
            vecs = tuple(tuple(int(c) for c in v) for v in vectors)
            for v in vecs:
                if len(v) != len(out):
                    raise ValueError(f"basis {v} of input dim {name!r} needs {len(out)} coordinates")
                for c, (out_name, size) in zip(v, out):
                    if not 0 <= c < size:
                        raise ValueError(f"basis {v} of input dim {name!r}: coordinate {c} is outside "
                                         f"output dim {out_name!r} of size {size}")
            normalized.append((str(name), vecs))
        if len({name for name, _ in normalized}) != len(normalized):
            raise ValueError(f"duplicate input dim names in {[n for n, _ in normalized]}")
        object.__setattr__(self, "_bases", tuple(normalized))
        object.__setattr__(self, "_out", out)
        object.__setattr__(self, "_key", (out, frozenset((n, b) for n, b in normalized if b)))

    def __setattr__(self, name, value):
        raise AttributeError("LinearLayout is immutable")

    # -- constructors -------------------------------------------------------------------------------
    @classmethod
    def identity(cls, size: int, in_dim: str, out_dim: str) -> "LinearLayout":
        """in_dim index i -> out_dim coordinate i, for i < size."""
        bits = log2_exact(size)
        return cls({in_dim: [(1 << k,) for k in range(bits)]}, {out_dim: size})

    @classmethod
    def zeros(cls, size: int, in_dim: str, out_dim: str, out_size: int = 1) -> "LinearLayout":
        """Every in_dim index (size of them) -> coordinate 0: a broadcast over in_dim."""
        bits = log2_exact(size)
        return cls({in_dim: [(0,)] * bits}, {out_dim: out_size})

    # -- structure ----------------------------------------------------------------------------------
    @property
    def in_dims(self) -> tuple:
        return tuple(name for name, _ in self._bases)

    @property
    def out_dims(self) -> tuple:
        return tuple(name for name, _ in self._out)

    @property
    def shape(self) -> tuple:
        """Output dim sizes in order: the block shape for a distributed or shared layout."""
        return tuple(size for _, size in self._out)

    @property
    def rank(self) -> int:
        return len(self._out)

    def bases_of(self, in_dim: str) -> tuple:
        """The basis tuples of `in_dim`, bit 0 first; () when the layout has no such input dim."""
        for name, vecs in self._bases:
            if name == in_dim:
                return vecs
        return ()

    def in_dim_bits(self, in_dim: str) -> int:
        return len(self.bases_of(in_dim))

    def in_dim_size(self, in_dim: str) -> int:
        """2**bits of `in_dim`; 1 for an input dim the layout does not have."""
        return 1 << self.in_dim_bits(in_dim)

    def out_dim_size(self, out_dim: str) -> int:
        for name, size in self._out:
            if name == out_dim:
                return size
        raise KeyError(f"no output dim {out_dim!r} in {self.out_dims}")

    @property
    def num_registers(self) -> int:
        return self.in_dim_size(REGISTER)

    @property
    def num_lanes(self) -> int:
        return self.in_dim_size(LANE)

    @property
    def num_warps(self) -> int:
        return self.in_dim_size(WARP)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def total_in_bits(self) -> int:
        return sum(len(v) for _, v in self._bases)

    @property
    def total_out_bits(self) -> int:
        return sum(size.bit_length() - 1 for _, size in self._out)

    # -- evaluation -----------------------------------------------------------------------------------
    def apply(self, **inputs: int) -> tuple:
        """The output coordinates of the given input indices (missing input dims are 0).

        Raises ValueError for an unknown input dim or an index outside its dim.
        """
        coords = [0] * len(self._out)
        known = dict(self._bases)
        for name, index in inputs.items():
            if name not in known:
                if index == 0:
                    continue
                raise ValueError(f"layout has no input dim {name!r} (has {self.in_dims})")
            vecs = known[name]
            if not 0 <= index < (1 << len(vecs)):
                raise ValueError(f"{name} index {index} is outside 0..{(1 << len(vecs)) - 1}")
            bit = 0
            while index:
                if index & 1:
                    coords = [a ^ b for a, b in zip(coords, vecs[bit])]
                index >>= 1
                bit += 1
        return tuple(coords)

    # flattened form: output dim 0 in the lowest bits (internal convention for the linear algebra)
    def _out_shifts(self) -> list:
        shifts, shift = [], 0
        for _, size in self._out:
            shifts.append(shift)
            shift += size.bit_length() - 1
        return shifts

    def flatten_coords(self, coords: Sequence[int]) -> int:
        """Coordinates as one bit vector: output dim 0 in the lowest bits."""
        return sum(c << s for c, s in zip(coords, self._out_shifts()))

    def flat_bases(self, in_dim: str) -> tuple:
        """The bases of `in_dim` as flattened bit vectors (see flatten_coords)."""
        return tuple(self.flatten_coords(v) for v in self.bases_of(in_dim))

    def _flat_columns(self) -> list:
        return [self.flatten_coords(v) for _, vecs in self._bases for v in vecs]

    # -- properties of the map ------------------------------------------------------------------------
    def _map_rank(self) -> int:
        return Span(self._flat_columns()).rank

    def is_surjective(self) -> bool:
        """Every element of the output space is the image of some input (every element is owned)."""
        return self._map_rank() == self.total_out_bits

    def is_injective(self) -> bool:
        """No two inputs map to the same element (no duplicated data)."""
        return self._map_rank() == self.total_in_bits

    def is_bijective(self) -> bool:
        return self.is_injective() and self.is_surjective()

    def is_injective_up_to_broadcast(self) -> bool:
        """The nonzero bases are linearly independent: the only duplication is broadcast (input bits
        whose basis is zero, e.g. the extra threads of a block smaller than the CTA)."""
        nonzero = [c for c in self._flat_columns() if c]
        return Span(nonzero).rank == len(nonzero)

    def broadcast_mask(self, in_dim: str) -> int:
        """Bit mask of the `in_dim` bits whose basis is zero: indices differing only in these bits
        hold the same elements (codegen lets only index & mask == 0 store)."""
        mask = 0
        for bit, v in enumerate(self.bases_of(in_dim)):
            if not any(v):
                mask |= 1 << bit
        return mask

    # -- algebra --------------------------------------------------------------------------------------
    def __mul__(self, other: "LinearLayout") -> "LinearLayout":
        """The product: input and output dims are united; on a shared input dim self's bits are the
        low bits, on a shared output dim other's coordinates are scaled by self's size (so
        identity(4, r, d) * identity(32, l, d) puts lanes at steps of 4 along d)."""
        if not isinstance(other, LinearLayout):
            return NotImplemented
        out = dict(self._out)
        scale = {}
        for name, size in other._out:
            scale[name] = out.get(name, 1)
            out[name] = out.get(name, 1) * size
        names = list(out)

        def widen(layout, vec, scaled):
            own = dict(zip(layout.out_dims, vec))
            return tuple(own.get(n, 0) * (scale.get(n, 1) if scaled else 1) for n in names)

        bases: dict = {}
        for name, vecs in self._bases:
            bases[name] = [widen(self, v, False) for v in vecs]
        for name, vecs in other._bases:
            bases.setdefault(name, []).extend(widen(other, v, True) for v in vecs)
        return LinearLayout(bases, out)

    def compose(self, outer: "LinearLayout") -> "LinearLayout":
        """x -> outer(self(x)): self's output dims feed outer's input dims of the same names.

        Raises ValueError when an output dim of self is not an input dim of outer or is larger.
        """
        for name, size in self._out:
            if size > outer.in_dim_size(name):
                raise ValueError(f"cannot compose: output dim {name!r} (size {size}) does not fit "
                                 f"the input dims of {outer!r}")
        bases = {name: [outer.apply(**dict(zip(self.out_dims, v))) for v in vecs]
                 for name, vecs in self._bases}
        return LinearLayout(bases, dict(outer._out))

    def _inverse(self, require_injective: bool) -> "LinearLayout":
        if not self.is_surjective():
            raise ValueError(f"layout is not surjective, it has no inverse: {self!r}")
        if require_injective and not self.is_injective():
            raise ValueError(f"layout is not injective, use pseudo_invert(): {self!r}")
        span = Span()
        owners = []        # global input bit -> (input dim, bit)
        for name, vecs in self._bases:
            for bit, v in enumerate(vecs):
                span.add(self.flatten_coords(v), 1 << len(owners))
                owners.append((name, bit))
        in_names = [name for name, _ in self._bases]
        bases = {}
        for shift, (name, size) in zip(self._out_shifts(), self._out):
            vecs = []
            for k in range(size.bit_length() - 1):
                combination = span.solve(1 << (shift + k))
                image = dict.fromkeys(in_names, 0)
                g = 0
                while combination:
                    if combination & 1:
                        dim, bit = owners[g]
                        image[dim] |= 1 << bit
                    combination >>= 1
                    g += 1
                vecs.append(tuple(image[n] for n in in_names))
            bases[name] = vecs
        return LinearLayout(bases, {name: 1 << len(vecs) for name, vecs in self._bases})

    def invert(self) -> "LinearLayout":
        """The inverse of a bijective layout (output dims become input dims). ValueError otherwise."""
        return self._inverse(require_injective=True)

    def pseudo_invert(self) -> "LinearLayout":
        """A right inverse of a surjective layout: self.apply(**inv(coords)) == coords.

        Among the inputs holding an element it picks the one built from the earliest independent
        input bits (input dims in order, low bits first), so registers are preferred over lanes over
        warps in a distributed layout. ValueError if the layout is not surjective.
        """
        return self._inverse(require_injective=False)

    def with_bases(self, **bases: Sequence[Sequence[int]]) -> "LinearLayout":
        """A copy with the bases of the named input dims replaced (or added)."""
        merged = dict(self._bases)
        merged.update(bases)
        return LinearLayout(merged, dict(self._out))

    # -- comparison and printing ----------------------------------------------------------------------
    def __eq__(self, other) -> bool:
        return isinstance(other, LinearLayout) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        def fmt(v):
            return "(" + ", ".join(str(c) for c in v) + ")"
        parts = [f"{name}=[{', '.join(fmt(v) for v in vecs)}]" for name, vecs in self._bases]
        outs = ", ".join(f"{name}={size}" for name, size in self._out)
        return f"LinearLayout({', '.join(parts)}; out: {outs})"


def distributed(shape: Sequence[int], register: Sequence, lane: Sequence, warp: Sequence) -> LinearLayout:
    """A distributed layout of a block of `shape` from its register, lane and warp bases."""
    return LinearLayout({REGISTER: register, LANE: lane, WARP: warp}, tuple(shape))


def distributed_table(layout: LinearLayout) -> dict:
    """{(register, lane, warp): coords} for every input of a distributed layout (tests, debugging)."""
    return {(r, l, w): layout.apply(register=r, lane=l, warp=w)
            for w in range(layout.num_warps) for l in range(layout.num_lanes)
            for r in range(layout.num_registers)}


def unit(rank: int, dim: int, step: int) -> tuple:
    """The basis with `step` in `dim` and 0 elsewhere."""
    v = [0] * rank
    v[dim] = step
    return tuple(v)


def zero(rank: int) -> tuple:
    return (0,) * rank


def maybe_unit(shape: Sequence[int], dim: int, step: int) -> Optional[tuple]:
    """unit(dim, step) if step is inside shape[dim], else None (the bit is past the block)."""
    return unit(len(shape), dim, step) if step < shape[dim] else None
