"""Tensor descriptors: `dsl.make_tensor_descriptor(base, shape, strides, block_shape)`, `desc.load(offsets)`,
`desc.store(offsets, value)` and `desc.atomic_add(offsets, value)`.

A tensor descriptor names a 2-D global tensor (a base pointer, its size and element strides per
dim) and the box one load reads from it:

    a_desc = dsl.make_tensor_descriptor(a_ptr, (M, K), (stride_am, stride_ak), (BLOCK_M, BLOCK_K))
    a = a_desc.load((pid_m * BLOCK_M, k0))      # (BLOCK_M, BLOCK_K) block; zeros outside [0, M) x [0, K)

Semantics (interpreter and every target): element (i, j) of the result is
`base[(offset0 + i) * stride0 + (offset1 + j) * stride1]` where 0 <= offset0 + i < shape0 and
0 <= offset1 + j < shape1, and 0 elsewhere: a ragged edge needs no mask. `desc.store(offsets, value)`
writes element (i, j) of `value` there, and only where it is inside the tensor; `desc.atomic_add(offsets,
value)` adds it there atomically (float32 / int32 / uint32 tensors).

Why an explicit construct (issue 7; Triton's `tl.make_tensor_descriptor` and CuTe's TMA atoms are the
same idea): on sm_90a with FUSEDOPS_TMA=1 a descriptor load that feeds a pipelined wgmma is copied by
the bulk tensor copy engine, whose tensor map the host encodes from the launch's arguments
(runtime/tensor_map.py). That is why `base`, `shape` and `strides` must be kernel arguments (or
literal ints): the host finds them among the launch's values. Everywhere else the load is an
ordinary masked load (passes/descriptors.py).

Limits: rank 2; offsets are int32; shape/strides int32 or int64 arguments or ints.
"""

from __future__ import annotations

from ..errors import CompilationError
from ..ir import Block, OpCode, Value
from .core import builtin
from .dtypes import BlockType, DType, PointerType, float32, int32, int64, uint32
from .promotion import printable
from .shape_ops import check_block_size, compile_time_bool, shown


class TensorDescriptor:
    """The compile-time value `make_tensor_descriptor` returns: IR values of the base, the shape and
    the strides, and the box (`block_shape`) its `load` reads. Not a runtime value: it cannot be
    stored, passed to another kernel or carried through a loop (it does not change there)."""

    __slots__ = ("base", "shape", "strides", "block_shape")

    def __init__(self, base: Value, shape: tuple, strides: tuple, block_shape: tuple):
        self.base, self.shape, self.strides, self.block_shape = base, shape, strides, block_shape

    @property
    def element(self) -> DType:
        return self.base.type.element

    def __repr__(self) -> str:
        return f"TensorDescriptor({self.element}, block_shape={self.block_shape})"


def _is_kernel_argument(value: Value) -> bool:
    owner = value.owner
    return isinstance(owner, Block) and owner.parent is None


def _argument_or_constant(semantic, value, what: str) -> Value:
    """`value` as an IR int scalar that is a kernel argument or a constant."""
    if isinstance(value, bool) or not isinstance(value, (int, Value)):
        raise CompilationError(f"make_tensor_descriptor: {what} must be an int kernel argument or an int, "
                               f"got {shown(value)}")
    if isinstance(value, int):
        if not -2**63 <= value < 2**63:     # (a constant would wrap it to 64 bits)
            raise CompilationError(f"make_tensor_descriptor: {what} {printable(value)} does not fit in int64")
        return semantic.constant(value, int32 if -2**31 <= value < 2**31 else int64)
    if isinstance(value.type, BlockType) or value.type not in (int32, int64):
        raise CompilationError(f"make_tensor_descriptor: {what} must be an int32/int64 scalar, got {value.type}")
    op = value.defining_op
    if not _is_kernel_argument(value) and (op is None or op.opcode != OpCode.CONSTANT):
        raise CompilationError(f"make_tensor_descriptor: {what} must be a kernel argument (or an int), not a value "
                               "computed in the kernel: the host builds the tensor map from the launch's arguments")
    return value


def _pair(value, what: str, where: str = "make_tensor_descriptor") -> tuple:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise CompilationError(f"{where}: {what} must be a tuple of 2 entries (2-D descriptors only), got {shown(value)}")
    return tuple(value)


@builtin
def make_tensor_descriptor(base, shape, strides, block_shape, *, _semantic=None):
    """A descriptor of the 2-D tensor at `base` (a pointer kernel argument) of `shape` (2 ints:
    kernel arguments or literals) and element `strides` (2 ints: kernel arguments or literals), whose
    `load(offsets)` reads `block_shape` (2 constexpr powers of two) boxes; see the module docstring.

    Raises CompilationError for a base, shape or stride that is not a kernel argument or literal,
    a rank other than 2, or a block shape that is not powers of two."""
    if not isinstance(base, Value) or not isinstance(base.type, PointerType) or not _is_kernel_argument(base):
        raise CompilationError("make_tensor_descriptor: the base must be a tensor (pointer) kernel argument, "
                               "not an offset pointer: the host builds the tensor map from the launch's arguments")
    shape = tuple(_argument_or_constant(_semantic, s, "each size") for s in _pair(shape, "shape"))
    strides = tuple(_argument_or_constant(_semantic, s, "each stride") for s in _pair(strides, "strides"))
    block_shape = _pair(block_shape, "block_shape")
    if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 or b & (b - 1) for b in block_shape):
        raise CompilationError(f"make_tensor_descriptor: block_shape must be constexpr powers of two, got {block_shape}")
    check_block_size(block_shape, "make_tensor_descriptor: block_shape")
    return TensorDescriptor(base, shape, strides, tuple(block_shape))


def _offsets(semantic, descriptor, offsets, what: str) -> list:
    """The 2 offsets of a descriptor `what` (load / store) as int32 IR scalars."""
    if not isinstance(descriptor, TensorDescriptor):
        raise CompilationError(f"{what} expects a tensor descriptor, got {shown(descriptor)}")
    coordinates = []
    for offset in _pair(offsets, f"{what} offsets", f"descriptor {what}"):
        if isinstance(offset, Value):
            if isinstance(offset.type, BlockType) or offset.type != int32:
                raise CompilationError(f"descriptor {what} offsets must be int32 scalars, got {offset.type}")
        elif isinstance(offset, bool) or not isinstance(offset, int) or not -2**31 <= offset < 2**31:
            raise CompilationError(f"descriptor {what} offsets must be int32 scalars, got {shown(offset)}")
        else:
            offset = semantic.constant(offset, int32)
        coordinates.append(offset)
    return coordinates


@builtin
def descriptor_load(descriptor, offsets, multicast=False, *, _semantic=None):
    """`descriptor.load(offsets, multicast=False)`: the `block_shape` box whose first element is at
    `offsets` (2 int32 scalars or ints; may be negative or past the end), zeros outside the tensor.

    multicast (constexpr bool): every program of the kernel's cluster (`dsl.cluster_dims`) makes this
    same call, with the same offsets, as often as the others: where the copy engine fills a pipelined
    wgmma operand ring (sm_90a), each program then copies 1 / cluster size of the box from L2 and the
    engine writes it into the shared memory of every program of the cluster (TMA multicast, PTX ISA
    cp.async.bulk.tensor `.multicast::cluster`). The result is the same; a cluster whose programs load
    different boxes gets a mix of them, and one whose programs make different numbers of such calls
    hangs. Without a cluster, or where the load is not done by the copy engine, it is an ordinary load.
    """
    coordinates = _offsets(_semantic, descriptor, offsets, "load")
    multicast = compile_time_bool(multicast, "descriptor load: multicast")
    operands = [descriptor.base, *descriptor.shape, *descriptor.strides, *coordinates]
    result = BlockType(descriptor.block_shape, descriptor.element)
    attrs = dict(block_shape=descriptor.block_shape)
    if multicast:
        attrs["multicast"] = True
    return _semantic.builder.value(OpCode.DESCRIPTOR_LOAD, operands, result, **attrs)


def _box_write(semantic, descriptor, offsets, value, what: str, **attrs) -> None:
    """A DESCRIPTOR_STORE of `value` (a scalar or a block_shape block, converted to the element type)
    at `offsets`; `what` names the method in errors."""
    coordinates = _offsets(semantic, descriptor, offsets, what)
    if isinstance(value, Value) and isinstance(value.type.element if isinstance(value.type, BlockType) else value.type,
                                               PointerType):
        raise CompilationError(f"descriptor {what}: the value must be numbers (a scalar or a {descriptor.block_shape} "
                               f"block), got {value.type}")
    value = semantic.cast(value, descriptor.element)     # a literal as a store converts it
    if not isinstance(value.type, BlockType):
        value = semantic.broadcast_to(value, descriptor.block_shape)     # a scalar fills the box
    if tuple(value.type.shape) != descriptor.block_shape:
        raise CompilationError(f"descriptor {what}: the value must be a {descriptor.block_shape} block "
                               f"(the descriptor's block_shape), got {value.type}")
    value = semantic.cast(value, descriptor.element)
    operands = [descriptor.base, *descriptor.shape, *descriptor.strides, *coordinates, value]
    semantic.builder.create(OpCode.DESCRIPTOR_STORE, operands, [], dict(block_shape=descriptor.block_shape, **attrs))


@builtin
def descriptor_store(descriptor, offsets, value, *, _semantic=None):
    """`descriptor.store(offsets, value)`: write `value` (a `block_shape` block, converted to the
    tensor's element type) to the box whose first element is at `offsets` (2 int32 scalars or ints; may
    be negative or past the end); elements outside the tensor are not written. On sm_90a the copy
    engine may do it (passes/descriptors.py). A scalar value fills the box. Raises CompilationError for a
    block of another shape."""
    _box_write(_semantic, descriptor, offsets, value, "store")


# Element types `atomic_add` takes: those the copy engine's reduction and the atomics both add.
ATOMIC_ADD_ELEMENTS = (float32, int32, uint32)


@builtin
def descriptor_atomic_add(descriptor, offsets, value, *, _semantic=None):
    """`descriptor.atomic_add(offsets, value)`: add `value` (a `block_shape` block or a scalar, converted
    to the tensor's element type: float32, int32 or uint32) to the box whose first element is at
    `offsets`, element by element and atomically (relaxed, device scope: many programs may add to
    the same elements; float sums then depend on the order), only where the box lies inside the
    tensor. Returns nothing. On sm_90a the copy engine may do it as one bulk reduction of the box
    (PTX ISA cp.reduce.async.bulk.tensor `.add`: the tile goes through shared memory as for `store`,
    passes/descriptors.py); elsewhere, and for a box starting before the tensor or off 16 bytes, it
    is one `atom.add` per element. The program's later memory accesses see its additions, as after a
    store. Raises CompilationError for another element type or a block of another shape."""
    if isinstance(descriptor, TensorDescriptor) and descriptor.element not in ATOMIC_ADD_ELEMENTS:
        raise CompilationError(f"descriptor atomic_add: the tensor's element type must be one of "
                               f"{', '.join(map(str, ATOMIC_ADD_ELEMENTS))}, got {descriptor.element}")
    _box_write(_semantic, descriptor, offsets, value, "atomic_add", reduce="add")


DESCRIPTOR_METHODS = {"load": descriptor_load, "store": descriptor_store, "atomic_add": descriptor_atomic_add}
