"""Semantics of memory access, reductions, scans, `dot`, atomics and debugging (a mixin of `Semantics`)."""

from __future__ import annotations

from ..errors import CompilationError
from ..ir import OpCode, Value
from .dtypes import (BlockType, DType, PointerType, float32, float64, int1, int8, int32, shape_of,
                     uint8, uint32, with_shape)
from .shape_ops import check_block_size, compile_time_flag, shown

# PTX cache operators (PTX ISA, "Cache Operators"), by access.
_LOAD_CACHE_MODIFIERS = ("", ".ca", ".cg", ".cs", ".lu", ".cv")
_STORE_CACHE_MODIFIERS = ("", ".wb", ".cg", ".cs", ".wt")
_EVICTION_POLICIES = ("", "evict_first", "evict_last", "evict_normal")
_ATOMIC_KINDS = ("add", "max", "min", "and", "or", "xor", "xchg")
_SEMANTICS = ("relaxed", "acquire", "release", "acq_rel")
_SCOPES = ("gpu", "cta", "sys")
_INPUT_PRECISIONS = ("ieee", "tf32")


def _element(x: Value):
    return x.type.element if isinstance(x.type, BlockType) else x.type


class BlockOps:
    # -- memory ------------------------------------------------------------------------------------
    def _pointer(self, ptr, what: str) -> Value:
        if not isinstance(ptr, Value) or not isinstance(_element(ptr), PointerType):
            raise CompilationError(f"{what} expects a pointer (a tensor argument plus offsets), got "
                                   f"{getattr(ptr, 'type', type(ptr).__name__)}")
        return ptr

    def _common_shape(self, *values):
        shape = ()
        for value in values:
            if value is not None:
                shape = self._broadcast_shape(shape, shape_of(value.type))
        return shape

    def load(self, ptr, mask=None, other=None, cache_modifier: str = "", eviction_policy: str = "") -> Value:
        """Read the elements `ptr` points to where `mask` is true; `other` (default 0) elsewhere."""
        ptr = self._pointer(ptr, "load")
        self._check_cache("load", _LOAD_CACHE_MODIFIERS, cache_modifier, eviction_policy)
        element = _element(ptr).element
        if mask is not None:
            mask = self.to_condition(mask, allow_block=True)
        if other is not None and mask is None:
            other = None   # nothing is masked off, so `other` is never used
        if other is not None:
            other = self.cast(other, element)
        shape = self._common_shape(ptr, mask, other)
        operands = [self.broadcast_to(ptr, shape)]
        if mask is not None:
            operands.append(self.broadcast_to(mask, shape))
        if other is not None:
            operands.append(self.broadcast_to(other, shape))
        return self.builder.value(OpCode.LOAD, operands, with_shape(element, shape), masked=mask is not None,
                                  has_other=other is not None, cache=cache_modifier, eviction=eviction_policy)

    def store(self, ptr, value, mask=None, cache_modifier: str = "", eviction_policy: str = "") -> None:
        """Write `value` (converted to the pointee type) where `mask` is true."""
        ptr = self._pointer(ptr, "store")
        self._check_cache("store", _STORE_CACHE_MODIFIERS, cache_modifier, eviction_policy)
        element = _element(ptr).element
        value = self.cast(value, element)
        if mask is not None:
            mask = self.to_condition(mask, allow_block=True)
        shape = self._common_shape(ptr, value, mask)
        if shape != shape_of(ptr.type):
            # the value (or mask) broadcasts to the pointer's shape, never the pointer to theirs: that would
            # write each address several times, one write winning (a race on the GPU)
            raise CompilationError(f"store: the value (shape {shape_of(value.type)}) and mask must broadcast to "
                                   f"the pointer's shape {shape_of(ptr.type)}; a store of shape {shape} would "
                                   "write some addresses more than once")
        operands = [self.broadcast_to(ptr, shape), self.broadcast_to(value, shape)]
        if mask is not None:
            operands.append(self.broadcast_to(mask, shape))
        self.builder.create(OpCode.STORE, operands, [], dict(masked=mask is not None, cache=cache_modifier,
                                                             eviction=eviction_policy))

    def _check_cache(self, what: str, modifiers: tuple, cache_modifier, eviction_policy):
        if cache_modifier not in modifiers:
            raise CompilationError(f"{what}: cache_modifier must be one of {modifiers}, got {shown(cache_modifier)}")
        if eviction_policy not in _EVICTION_POLICIES:
            raise CompilationError(f"{what}: eviction_policy must be one of {_EVICTION_POLICIES}, "
                                   f"got {shown(eviction_policy)}")

    # -- reductions and scans ----------------------------------------------------------------------
    def _axis(self, x: Value, axis, what: str) -> int:
        rank = len(shape_of(x.type))
        if rank == 0:
            raise CompilationError(f"{what} needs a block, got a scalar")
        if not isinstance(axis, int):
            raise CompilationError(f"{what} axis must be a constexpr int, got {shown(axis)}")
        if not -rank <= axis < rank:
            raise CompilationError(f"{what} axis {shown(axis)} is out of range for a block of shape {shape_of(x.type)}")
        return axis % rank

    def _accumulation_type(self, element: DType) -> DType:
        """Sums accumulate narrow types wider: int1/8/16 in int32 (uint32), float16/bfloat16 in float32."""
        if element.is_floating:
            return float32 if element.bits == 16 else element
        if element.bits < 32:
            return uint32 if element.kind == "uint" else int32
        return element

    def _flatten_for_reduce(self, x: Value, axis):
        if axis is None:
            numel = x.type.numel if isinstance(x.type, BlockType) else 1
            return self.reshape(x, (numel,)), 0
        return x, self._axis(x, axis, "reduction")

    def _result_dtype(self, dtype, what: str):
        """A reduction's or scan's `dtype=` argument (Triton's): None, or a number dtype the input is converted to
        first and the result converted back to."""
        if dtype is not None and not (isinstance(dtype, DType) and not dtype.is_bool):
            raise CompilationError(f"{what}: dtype must be a dsl number dtype such as dsl.float32 (or None), "
                                   f"got {shown(dtype)}")
        return dtype

    def reduce(self, x, axis, kind: str, keep_dims: bool = False, dtype=None) -> Value:
        """sum / max / min / xor (integers: triton_compat.xor_sum) along `axis` (all axes when None); sum
        accumulates as `_accumulation_type`. `dtype`
        (sum only, Triton's): x is converted to it first and the sum (accumulated as its type's) back to it."""
        dtype = self._result_dtype(dtype, kind)
        if dtype is not None:
            return self.cast(self.reduce(self.cast(x, dtype), axis, kind, keep_dims), dtype)
        x = self.to_value(x)
        if isinstance(_element(x), PointerType):
            raise CompilationError(f"cannot {kind}-reduce pointers")
        if not isinstance(x.type, BlockType):
            raise CompilationError(f"{kind} needs a block, got a scalar of type {x.type}")
        original_rank = len(shape_of(x.type))
        x, axis_index = self._flatten_for_reduce(x, axis)
        boolean = kind != "sum" and _element(x) == int1      # max / min of int1: any / all, reduced in int32
        if kind == "sum":
            x = self.cast(x, self._accumulation_type(_element(x)))
        elif boolean:
            x = self.cast(x, int32)
        shape = shape_of(x.type)
        out_shape = shape[:axis_index] + shape[axis_index + 1:]
        result = self.builder.value(OpCode.REDUCE, [x], with_shape(_element(x), out_shape), kind=kind, axis=axis_index)
        if boolean:
            result = self.cast(result, int1)
        return self._keep_dims(result, axis, axis_index, original_rank, keep_dims)

    def _keep_dims(self, result, axis, axis_index, rank, keep_dims):
        if isinstance(keep_dims, Value):
            raise CompilationError(f"keep_dims must be a constexpr bool, got {shown(keep_dims)}")
        if not keep_dims:
            return result
        if axis is None:
            return self.reshape(result, (1,) * rank) if rank else result
        return self.expand_dims(result, axis_index)

    def argreduce(self, x, axis, kind: str, keep_dims: bool = False) -> Value:
        """argmax / argmin along `axis` (int32 indices; ties give the first index)."""
        x = self.to_value(x)
        if isinstance(_element(x), PointerType):
            raise CompilationError(f"cannot take the {kind} of pointers")
        if not isinstance(x.type, BlockType):
            raise CompilationError(f"{kind} needs a block, got a scalar")
        original_rank = len(shape_of(x.type))
        x, axis_index = self._flatten_for_reduce(x, axis)
        if _element(x) == int1:
            x = self.cast(x, int32)
        shape = shape_of(x.type)
        out_shape = shape[:axis_index] + shape[axis_index + 1:]
        result = self.builder.value(OpCode.ARGREDUCE, [x], with_shape(int32, out_shape), kind=kind, axis=axis_index)
        return self._keep_dims(result, axis, axis_index, original_rank, keep_dims)

    def cumsum(self, x, axis: int = 0, reverse: bool = False, dtype=None) -> Value:
        """Inclusive prefix sum along `axis`, accumulated as a sum is; `dtype` as for `reduce`."""
        dtype = self._result_dtype(dtype, "cumsum")
        if dtype is not None:
            return self.cast(self.cumsum(self.cast(x, dtype), axis, reverse), dtype)
        x = self.to_value(x)
        if isinstance(_element(x), PointerType):
            raise CompilationError("cannot cumsum pointers")
        axis = self._axis(x, axis, "cumsum")
        x = self.cast(x, self._accumulation_type(_element(x)))
        reverse = compile_time_flag(reverse, "cumsum reverse")
        return self.builder.value(OpCode.SCAN, [x], x.type, kind="sum", axis=axis, reverse=reverse)

    # -- dot ---------------------------------------------------------------------------------------
    def dot(self, a, b, acc=None, input_precision=None, out_dtype=None) -> Value:
        """Matrix product of blocks a (M x K) and b (K x N), added to acc (M x N).

        Inputs float16/bfloat16/float32/float64 accumulate in float32 (float64 for float64); int8 in
        int32. input_precision: "ieee" (exact fp32 FMA, the default) or "tf32" (float32 inputs only).
        """
        a, b = self.to_value(a), self.to_value(b)
        sa, sb = shape_of(a.type), shape_of(b.type)
        if len(sa) != 2 or len(sb) != 2:
            raise CompilationError(f"dot needs 2-D blocks, got shapes {sa} and {sb}")
        if sa[1] != sb[0]:
            raise CompilationError(f"dot shapes {sa} and {sb} do not match: a is M x K, b must be K x N")
        ea, eb = _element(a), _element(b)
        if ea != eb:
            raise CompilationError(f"dot operands must have one dtype, got {ea} and {eb}; cast one with .to()")
        if ea in (int8, uint8):
            default_out = int32
        elif ea.is_floating:
            default_out = float64 if ea == float64 else float32
        else:
            raise CompilationError(f"dot supports float16, bfloat16, float32, float64 and int8, got {ea}")
        precision = input_precision or "ieee"
        if precision not in _INPUT_PRECISIONS:
            raise CompilationError(f"input_precision must be one of {_INPUT_PRECISIONS}, got {shown(precision)}")
        if precision == "tf32" and ea != float32:
            precision = "ieee"
        shape = (sa[0], sb[1])
        check_block_size(shape, "dot result")
        if out_dtype is not None and out_dtype != default_out:
            raise CompilationError(f"dot out_dtype must be {default_out} for {ea} inputs (the accumulation "
                                   f"dtype), got {shown(out_dtype)}")
        if acc is None:
            acc = self.constant(0, default_out, shape)
        else:
            acc = self.to_value(acc)
            if shape_of(acc.type) != shape:
                raise CompilationError(f"dot accumulator must have shape {shape}, got {shape_of(acc.type)}")
            if _element(acc) != default_out:
                raise CompilationError(f"dot accumulator must be {default_out} for {ea} inputs, got {_element(acc)}")
        return self.builder.value(OpCode.DOT, [a, b, acc], acc.type, input_precision=precision)

    # -- atomics -----------------------------------------------------------------------------------
    def _check_atomic(self, sem, scope):
        """(sem, scope), checked; None is Triton's default of each (`sem=None, scope=None`: acq_rel, gpu)."""
        sem = "acq_rel" if sem is None else sem
        scope = "gpu" if scope is None else scope
        if sem not in _SEMANTICS:
            raise CompilationError(f"sem must be one of {_SEMANTICS}, got {shown(sem)}")
        if scope not in _SCOPES:
            raise CompilationError(f"scope must be one of {_SCOPES}, got {shown(scope)}")
        return sem, scope

    def atomic_rmw(self, kind: str, ptr, value, mask=None, sem: str = "acq_rel", scope: str = "gpu") -> Value:
        """Atomically combine `value` into memory; returns the old values."""
        ptr = self._pointer(ptr, f"atomic_{kind}")
        sem, scope = self._check_atomic(sem, scope)
        if kind not in _ATOMIC_KINDS:
            raise CompilationError(f"unknown atomic kind {kind!r}")
        element = _element(ptr).element
        if kind in ("and", "or", "xor") and not element.is_integer:
            raise CompilationError(f"atomic_{kind} needs an integer pointer, got {element}")
        if element == int1 or element.bits < 16 or (element.bits == 16 and kind != "add" and kind != "xchg"):
            raise CompilationError(f"atomic_{kind} does not support {element}")
        value = self.cast(value, element)
        if mask is not None:
            mask = self.to_condition(mask, allow_block=True)
        shape = self._common_shape(ptr, value, mask)
        operands = [self.broadcast_to(ptr, shape), self.broadcast_to(value, shape)]
        if mask is not None:
            operands.append(self.broadcast_to(mask, shape))
        return self.builder.value(OpCode.ATOMIC_RMW, operands, with_shape(element, shape), kind=kind,
                                  masked=mask is not None, sem=sem, scope=scope)

    def atomic_cas(self, ptr, cmp, value, sem: str = "acq_rel", scope: str = "gpu") -> Value:
        """Atomically store `value` where memory equals `cmp`; returns the old values."""
        ptr = self._pointer(ptr, "atomic_cas")
        sem, scope = self._check_atomic(sem, scope)
        element = _element(ptr).element
        if element.bits not in (16, 32, 64) or element == int1:
            raise CompilationError(f"atomic_cas does not support {element}")
        cmp = self.cast(cmp, element)
        value = self.cast(value, element)
        shape = self._common_shape(ptr, cmp, value)
        operands = [self.broadcast_to(v, shape) for v in (ptr, cmp, value)]
        return self.builder.value(OpCode.ATOMIC_CAS, operands, with_shape(element, shape), sem=sem, scope=scope)

    # -- debugging ---------------------------------------------------------------------------------
    def device_print(self, prefix: str, *values, hex: bool = False) -> None:
        if not isinstance(prefix, str):
            raise CompilationError("device_print's first argument must be a string prefix")
        operands = [self.to_value(v) for v in values]
        hex = compile_time_flag(hex, "device_print: hex")
        self.builder.create(OpCode.PRINT, operands, [], dict(prefix=prefix, hex=hex))

    def static_assert(self, cond, msg="") -> None:
        if isinstance(cond, Value):
            raise CompilationError(f"static_assert needs a compile-time condition, got {shown(cond)}; use "
                                   "dsl.device_assert for runtime conditions")
        if not cond:
            raise CompilationError(f"static_assert failed: {msg}" if msg else "static_assert failed")

    def barrier(self) -> None:
        self.builder.create(OpCode.BARRIER, [], [], {})

    def launch_bounds(self, min_blocks_per_sm) -> None:
        if type(min_blocks_per_sm) is not int or not 1 <= min_blocks_per_sm <= 32:
            raise CompilationError(f"launch_bounds: min_blocks_per_sm must be a constexpr int from 1 to 32, got "
                                   f"{shown(min_blocks_per_sm)}")
        self.builder.create(OpCode.LAUNCH_BOUNDS, [], [], dict(min_blocks_per_sm=min_blocks_per_sm))

    def cluster_dims(self, size) -> None:
        from ..ir.ops import MAX_CLUSTER_SIZE
        if type(size) is not int or not 1 <= size <= MAX_CLUSTER_SIZE:
            raise CompilationError(f"cluster_dims: size must be a constexpr int from 1 to {MAX_CLUSTER_SIZE}, got "
                                   f"{shown(size)}")
        self.builder.create(OpCode.CLUSTER_DIMS, [], [], dict(size=size))

    def cluster_sum(self, values) -> tuple:
        """The CLUSTER_SUM of `values` (each cast to its sum's accumulation type), as a tuple of results."""
        if not values:
            raise CompilationError("cluster_sum needs at least one value")
        operands = []
        for index, value in enumerate(values):
            value = self.to_value(value)
            element = _element(value)
            if isinstance(element, PointerType) or element == int1:
                raise CompilationError(f"cluster_sum: value {index} must be a number or a block of numbers, got "
                                       f"{value.type}")
            operands.append(self.cast(value, self._accumulation_type(element)))
        op = self.builder.create(OpCode.CLUSTER_SUM, operands, [v.type for v in operands], {})
        return tuple(op.results)

    def device_assert(self, condition, message: str = "") -> None:
        if not isinstance(message, str):
            raise CompilationError("device_assert's message must be a string")
        condition = self.to_condition(condition, allow_block=True)
        self.builder.create(OpCode.ASSERT, [condition], [], dict(message=message))
