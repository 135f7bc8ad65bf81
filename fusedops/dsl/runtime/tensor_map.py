"""Tensor maps (TMA descriptors) for the bulk tensor copy engine, encoded on the host.

A tensor map is the 128-byte, 64-byte-aligned opaque object `cp.async.bulk.tensor` reads to copy a
box of a global tensor into shared memory: base address, sizes, byte strides, the box, the shared
memory swizzle, and what out-of-bounds elements read as (zeros: a ragged edge tile needs no mask).
It is built by the driver (`cuTensorMapEncodeTiled`) and reaches the kernel as a `__grid_constant__`
parameter (`.param .align 64 .b8 name[128]`, see codegen/tma.py) or in global memory.

`TensorMapSpec` says what to describe in the DSL's terms (dims outermost first, like torch: a
row-major (M, K) matrix is shape (M, K), strides (K, 1), box (BLOCK_M, BLOCK_K)); the driver wants
dims innermost first and strides in bytes without the innermost one. `encode_arguments` does that
translation and checks the driver's documented limits (cuTensorMapEncodeTiled in the CUDA driver API
reference, repeated in cuda-python's docstring), so a bad spec fails with a message that says which
limit, before the driver returns a bare CUDA_ERROR_INVALID_VALUE. `encode_tensor_map` calls the
driver.

Swizzle modes: 32/64/128 bytes are the shared layouts of `layouts.shared.nvmma_shared` (the
wgmma operand tiles of `layouts.mma_shared.wgmma_operand_shared` with the same swizzle), with the
box's inner extent at most the swizzle width; None is no swizzle.

CPU-only module: importing it needs neither a GPU nor cuda-python.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Callable, Optional, Sequence

from fusedops.dsl.errors import LaunchError
from fusedops.dsl.language import dtypes
from fusedops.dsl.runtime import kernel_launcher

TENSOR_MAP_BYTES = 128
TENSOR_MAP_ALIGN = 64
MAX_RANK = 5
MAX_BOX = 256
# A tensor map's limits (cuTensorMapEncodeTiled): byte strides below MAX_STRIDE_BYTES, sizes up to MAX_SIZE.
MAX_STRIDE_BYTES = 1 << 40
MAX_SIZE = 1 << 32
_DATA_TYPES = {dtypes.float16: "FLOAT16", dtypes.bfloat16: "BFLOAT16", dtypes.float32: "FLOAT32",
               dtypes.float64: "FLOAT64", dtypes.int32: "INT32", dtypes.int64: "INT64",
               dtypes.uint8: "UINT8", dtypes.uint16: "UINT16", dtypes.uint32: "UINT32", dtypes.uint64: "UINT64",
               # no signed 8/16-bit types: copies move bits, and out-of-bounds zeros are the same bits
               dtypes.int8: "UINT8", dtypes.int16: "UINT16"}
_SWIZZLES = {None: "NONE", 32: "32B", 64: "64B", 128: "128B"}
_L2_PROMOTIONS = {None: "NONE", 64: "L2_64B", 128: "L2_128B", 256: "L2_256B"}


@dataclasses.dataclass(frozen=True)
class TensorMapSpec:
    """What a tensor map describes, dims outermost first.

    element: the dsl dtype (float16, bfloat16, float32, ...).
    shape: the global tensor's size per dim (elements); strides: per dim, in elements, the last 1.
    box: the tile one copy brings (elements per dim, each <= 256).
    swizzle_bytes: 32, 64, 128 (the shared tile is `nvmma_shared(box, bits, swizzle_bytes)`) or None.
    l2_promotion_bytes: L2 fetch granularity (None, 64, 128, 256).
    Out-of-bounds elements read as zero (CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE).
    """

    element: object
    shape: tuple
    strides: tuple
    box: tuple
    swizzle_bytes: Optional[int] = 128
    l2_promotion_bytes: Optional[int] = 256

    @property
    def box_bytes(self) -> int:
        """Bytes one copy writes to shared memory (the `expect_tx` count of its mbarrier)."""
        count = 1
        for size in self.box:
            count *= size
        return count * self.element.itemsize


@dataclasses.dataclass(frozen=True)
class EncodeArguments:
    """The arguments of `cuTensorMapEncodeTiled`, as enum member names and plain ints (dims innermost
    first): what `encode_tensor_map` passes, and what the CPU tests check."""

    data_type: str              # CUtensorMapDataType member, e.g. "CU_TENSOR_MAP_DATA_TYPE_FLOAT16"
    rank: int
    global_address: int
    global_dims: tuple          # elements, innermost first
    global_strides: tuple       # bytes, rank - 1 entries (the innermost dim's stride is the element)
    box_dims: tuple
    element_strides: tuple
    interleave: str
    swizzle: str
    l2_promotion: str
    oob_fill: str


def _fail(spec: TensorMapSpec, why: str) -> LaunchError:
    return LaunchError(f"cannot build a TMA tensor map for {spec}: {why}")


def encode_arguments(spec: TensorMapSpec, global_address: int) -> EncodeArguments:
    """The `cuTensorMapEncodeTiled` arguments describing `spec` for a tensor at `global_address`.

    Raises:
        LaunchError: the spec breaks a limit of the driver: rank 1-5; address 16-byte aligned;
            innermost stride 1; other strides multiples of 16 bytes below 2**40; sizes 1 .. 2**32;
            box dims 1 .. 256, the inner one a multiple of 16 bytes and, swizzled, at most the
            swizzle width; a dtype or swizzle TMA has no mode for.
    """
    rank = len(spec.shape)
    if not 1 <= rank <= MAX_RANK or len(spec.strides) != rank or len(spec.box) != rank:
        raise _fail(spec, f"shape, strides and box must have one entry per dim, 1 to {MAX_RANK} dims")
    if spec.element not in _DATA_TYPES:
        raise _fail(spec, f"TMA has no data type for {spec.element}")
    if spec.swizzle_bytes not in _SWIZZLES or spec.l2_promotion_bytes not in _L2_PROMOTIONS:
        raise _fail(spec, f"swizzle must be one of {sorted(_SWIZZLES, key=str)} and L2 promotion one of "
                          f"{sorted(_L2_PROMOTIONS, key=str)}")
    size = spec.element.itemsize
    if global_address % 16:
        raise _fail(spec, f"the base address {global_address:#x} is not 16-byte aligned")
    if spec.strides[-1] != 1:
        raise _fail(spec, "the innermost dim must be contiguous (stride 1); transpose the spec instead")
    byte_strides = tuple(stride * size for stride in spec.strides[:-1])
    if any(stride <= 0 or stride % 16 or stride >= MAX_STRIDE_BYTES for stride in byte_strides):
        raise _fail(spec, f"strides of {byte_strides} bytes: each must be a positive multiple of 16 below 2**40")
    if any(not 1 <= dim <= MAX_SIZE for dim in spec.shape):
        raise _fail(spec, "every size must be between 1 and 2**32 (an empty tensor has no tensor map)")
    if any(not 1 <= box <= MAX_BOX for box in spec.box):
        raise _fail(spec, f"box dims must be between 1 and {MAX_BOX}")
    inner_bytes = spec.box[-1] * size
    if inner_bytes % 16:
        raise _fail(spec, f"the box's inner extent ({inner_bytes} bytes) must be a multiple of 16 bytes")
    if spec.swizzle_bytes is not None and inner_bytes > spec.swizzle_bytes:
        raise _fail(spec, f"the box's inner extent ({inner_bytes} bytes) exceeds the {spec.swizzle_bytes}-byte swizzle")
    return EncodeArguments(
        data_type=f"CU_TENSOR_MAP_DATA_TYPE_{_DATA_TYPES[spec.element]}", rank=rank, global_address=global_address,
        global_dims=tuple(reversed(spec.shape)), global_strides=tuple(reversed(byte_strides)),
        box_dims=tuple(reversed(spec.box)), element_strides=(1,) * rank,
        interleave="CU_TENSOR_MAP_INTERLEAVE_NONE", swizzle=f"CU_TENSOR_MAP_SWIZZLE_{_SWIZZLES[spec.swizzle_bytes]}",
        l2_promotion=f"CU_TENSOR_MAP_L2_PROMOTION_{_L2_PROMOTIONS[spec.l2_promotion_bytes]}",
        oob_fill="CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE")


def encode_tensor_map(spec: TensorMapSpec, global_address: int, driver=None):
    """The `CUtensorMap` (cuda-python object, 128 bytes; pass it as a kernel argument with ctype None,
    or copy its bytes) describing `spec` at `global_address`. `driver`: the `cuda.bindings.driver`
    module (default: the one `runtime.driver` loads; tests pass a fake).

    Raises:
        LaunchError: `encode_arguments`'s checks, no cuda-python, or the driver's refusal.
    """
    args = encode_arguments(spec, global_address)
    driver = _loaded(driver)
    return _call_driver(driver, spec, args, _driver_arguments(driver, args), global_address)


def _loaded(driver):
    if driver is None:
        from fusedops.dsl.runtime.driver import cuda_driver
        driver = cuda_driver()
    return driver


def _driver_arguments(driver, args: EncodeArguments) -> tuple:
    """(arguments before the address, arguments after it) of cuTensorMapEncodeTiled, as `driver`'s enums."""
    # cuda-python takes the sizes as its cuuint64_t / cuuint32_t wrappers, not ints (seen on the H200).
    u64, u32 = getattr(driver, "cuuint64_t", int), getattr(driver, "cuuint32_t", int)
    return ((getattr(driver.CUtensorMapDataType, args.data_type), u32(args.rank)),
            ([u64(d) for d in args.global_dims], [u64(s) for s in args.global_strides],
             [u32(b) for b in args.box_dims], [u32(e) for e in args.element_strides],
             getattr(driver.CUtensorMapInterleave, args.interleave), getattr(driver.CUtensorMapSwizzle, args.swizzle),
             getattr(driver.CUtensorMapL2promotion, args.l2_promotion),
             getattr(driver.CUtensorMapFloatOOBfill, args.oob_fill)))


def _call_driver(driver, spec: TensorMapSpec, args: EncodeArguments, arguments: tuple, global_address: int,
                 made_current: Optional[Callable] = None):
    # made_current: a context manager factory that makes the kernel's context current, for a retry where the
    # calling thread has none (CUDA_ERROR_INVALID_CONTEXT: e.g. autograd's backward thread before its first
    # launch; kernel_launcher.made_current).
    before, after = arguments
    result = driver.cuTensorMapEncodeTiled(*before, global_address, *after)
    status, tensor_map = result[0], result[1]
    if made_current is not None and getattr(status, "name", None) == "CUDA_ERROR_INVALID_CONTEXT":
        with made_current():
            result = driver.cuTensorMapEncodeTiled(*before, global_address, *after)
        status, tensor_map = result[0], result[1]
    if int(status) != 0:
        raise _fail(spec, f"cuTensorMapEncodeTiled returned {getattr(status, 'name', status)} for {args}")
    return tensor_map


def matrix_spec(element, shape: Sequence[int], strides: Sequence[int], box: Sequence[int],
                swizzle_bytes: Optional[int] = 128) -> TensorMapSpec:
    """A 2-D `TensorMapSpec` for a matrix view (rows, cols) whose contiguous dim is the last (a
    column-major view is described transposed: shape (cols, rows), strides (row stride, 1))."""
    return TensorMapSpec(element, tuple(int(s) for s in shape), tuple(int(s) for s in strides),
                         tuple(int(b) for b in box), swizzle_bytes)


# -- tensor maps as kernel parameters --------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TensorMapParam:
    """A tensor-map kernel parameter of a compiled kernel (appended after its other parameters, in
    order) and how the host builds it from the launch's runtime values.

    element: the dsl dtype's name ("float16", ...).
    base: the index of the pointer argument among the runtime values.
    shape, strides: per dim of the DSL descriptor (outermost first), ("arg", index) for a runtime
        value or ("const", int) for a specialized constant; strides in elements.
    contiguous_dim: the dim whose stride is 1 (the map is described with it innermost).
    box: (rows, inner) elements one copy brings, outermost first: the tile's other dim, and one
        swizzle atom of the contiguous dim (a tile wider than the swizzle takes several copies).
    swizzle_bytes: the shared tile's swizzle (32, 64 or 128).
    """

    element: str
    base: int
    shape: tuple
    strides: tuple
    contiguous_dim: int
    box: tuple
    swizzle_bytes: int

    def to_json(self) -> list:
        return [self.element, self.base, [list(s) for s in self.shape], [list(s) for s in self.strides],
                self.contiguous_dim, list(self.box), self.swizzle_bytes]

    @classmethod
    def from_json(cls, item) -> "TensorMapParam":
        """The param `to_json` wrote. Raises ValueError for anything else (a cache entry edited or corrupted)."""
        if not cls._json_well_formed(item):
            raise ValueError(f"not a tensor map param: {item!r:.200}")
        element, base, shape, strides, contiguous, box, swizzle = item
        return cls(element, base, tuple(tuple(s) for s in shape), tuple(tuple(s) for s in strides), contiguous,
                   tuple(box), swizzle)

    @staticmethod
    def _json_well_formed(item) -> bool:
        def index(value):
            return type(value) is int and value >= 0

        def sources(value):
            return isinstance(value, list) and len(value) == 2 and all(
                isinstance(s, list) and len(s) == 2 and s[0] in ("arg", "const") and type(s[1]) is int
                and (s[0] == "const" or s[1] >= 0) for s in value)
        if not isinstance(item, list) or len(item) != 7:
            return False
        element, base, shape, strides, contiguous, box, swizzle = item
        return (element in {dtype.name for dtype in dtypes.ALL_DTYPES} and index(base) and sources(shape) and sources(strides)
                and index(contiguous) and contiguous < 2
                and isinstance(box, list) and len(box) == len(shape) and all(index(b) and b > 0 for b in box)
                and swizzle in (32, 64, 128))

    def spec(self, values: Sequence) -> TensorMapSpec:
        """The `TensorMapSpec` for a launch with runtime `values`: the contiguous dim innermost."""
        def resolve(source):
            kind, value = source
            return int(values[value]) if kind == "arg" else int(value)
        contiguous = self.contiguous_dim
        shape = [resolve(s) for s in self.shape]
        strides = [resolve(s) for s in self.strides]
        return TensorMapSpec(getattr(dtypes, self.element), (shape[1 - contiguous], shape[contiguous]),
                             (strides[1 - contiguous], strides[contiguous]), self.box, self.swizzle_bytes)

    def key_indices(self) -> tuple:
        """The runtime values the map depends on: the base address, then the arguments among the sizes
        and strides (what a cache of encoded maps is keyed by, with the parameter itself)."""
        return (self.base,) + tuple(v for kind, v in self.shape + self.strides if kind == "arg")


def tensor_map_bytes(tensor_map) -> bytes:
    """The 128 bytes of an encoded tensor map (a cuda-python `CUtensorMap`, or bytes)."""
    if isinstance(tensor_map, (bytes, bytearray)):
        return bytes(tensor_map)
    import ctypes
    return ctypes.string_at(int(tensor_map.getPtr()), TENSOR_MAP_BYTES)


EMPTY_TENSOR_MAP = bytes(TENSOR_MAP_BYTES)
MAX_CACHED_MAPS = 256


class TensorMapEncoder:
    """Builds the tensor-map arguments of launches of one compiled kernel from their runtime values.

    A map embeds the tensor's address, so it is encoded per distinct (address, sizes, strides) of a
    parameter and kept (at most MAX_CACHED_MAPS per kernel; a full cache starts over): a launch with
    new addresses encodes (about what `encode_tensor_map` costs: tests/test_tma.py measures it with
    a fake driver), a repeated one costs a dict lookup per map. A size of 0 (an empty tensor: the
    driver has no map for it) gives a map of zeros, which a kernel never uses: its copies are
    predicated on the loop running.

    Raises LaunchError (from `encode_tensor_map`) for values the driver cannot describe; the compiler
    only uses TMA where the specialization proves alignment and strides, so that means a bug.
    """

    def __init__(self, params: Sequence[TensorMapParam], driver=None, made_current: Optional[Callable] = None):
        self.params = tuple(params)
        self._driver = driver
        self._made_current = made_current
        self._keys = tuple((i, p.key_indices()) for i, p in enumerate(self.params))
        self._cache: dict = {}
        self._checked: dict = {}        # (param, sizes, strides) -> (spec, checked arguments at address 0)
        indices = sorted({i for _, key in self._keys for i in key})
        self._launch_key = operator.itemgetter(*indices, indices[0]) if indices else (lambda values: ())
        self._launches: dict = {}       # the launch key -> the tuple of maps (one lookup per launch)
        self.encode = self._build_encode()

    def _build_encode(self):
        launches, launch_key, slow = self._launches, self._launch_key, self._encode_all

        def encode(values: Sequence) -> tuple:
            """The 128-byte arguments, one per parameter, for runtime `values`."""
            key = launch_key(values)
            maps = launches.get(key)
            if maps is None:
                if len(launches) >= MAX_CACHED_MAPS:
                    launches.clear()      # (dropping the oldest one by one makes `next(iter())` slow)
                maps = launches[key] = slow(values)
            return maps

        return encode

    def _encode_all(self, values: Sequence) -> tuple:
        cache = self._cache
        out = []
        for index, indices in self._keys:
            key = (index, *[values[i] for i in indices])
            encoded = cache.get(key)
            if encoded is None:
                encoded = self._encode(self.params[index], key, values)
                if len(cache) >= MAX_CACHED_MAPS:
                    cache.clear()
                cache[key] = encoded
            out.append(encoded)
        return tuple(out)

    def _encode(self, param: TensorMapParam, key: tuple, values: Sequence) -> bytes:
        # The checked arguments depend on the sizes and strides only (`key` less the address): a new
        # address (the common miss: the same shapes, new tensors) costs an alignment check and the
        # driver call.
        shape_key = (key[0], *key[2:])
        checked = self._checked.get(shape_key)
        if checked is None:
            spec = param.spec(values)
            if 0 in spec.shape:
                return EMPTY_TENSOR_MAP
            args = encode_arguments(spec, 0)
            self._driver = _loaded(self._driver)
            checked = self._checked[shape_key] = (spec, args, _driver_arguments(self._driver, args))
            if len(self._checked) > MAX_CACHED_MAPS:
                self._checked.clear()
        spec, args, arguments = checked
        address = int(values[param.base])
        if address % 16:
            encode_arguments(spec, address)       # raises, naming the limit
        return tensor_map_bytes(_call_driver(self._driver, spec, args, arguments, address, self._made_current))


class TensorMapLauncher:
    """A kernel launcher (kernel_launcher.KernelLauncher's `launch`/`stream_of`) for a kernel with tensor-map
    parameters: `launch(grid, stream, values)` appends the maps for `values` and launches. Every
    launch path (the full one, cached plans, prepared launches) goes through it, so a map always
    matches the addresses of the launch it is passed to."""

    def __init__(self, launcher, params: Sequence[TensorMapParam], driver=None):
        self.launcher = launcher
        context = getattr(getattr(launcher, "kernel", None), "context", None)
        self.encoder = TensorMapEncoder(params, driver, None if context is None else functools.partial(
            kernel_launcher.made_current, context))
        self.stream_of = launcher.stream_of
        inner, encode = launcher.launch, self.encoder.encode

        def launch(grid, stream, values) -> None:
            inner(grid, stream, (*values, *encode(values)))

        self.launch = launch

    def __getattr__(self, name):
        return getattr(self.launcher, name)
