"""Per-op transfer functions of the pointer analysis: `RULES[opcode](op, operand_infos) -> infos`.

Each rule returns one `AxisInfo` per result of `op`, given those of its operands. A rule may only
claim what holds for every execution; ops without a rule get `elementwise_rule` if elementwise
(equal inputs give equal outputs, so constancy survives), else nothing. Index arithmetic is assumed
not to wrap around (as Triton's analysis assumes): offsets near 2**31 would need int64 anyway.
"""

from __future__ import annotations

import dataclasses

from ..ir.core import Operation
from ..ir.ops import ELEMENTWISE, OpCode
from ..language.dtypes import DType, PointerType, shape_of
from ._axis_info import (AxisInfo, cap, constant_info, default_info, divisibility_at, element_divisibility,
                         element_type, floor_pow2, info_shape, pow2_divisor, uniform_info, unit,
                         without_contiguity)
from ._constant_eval import evaluate_binary, evaluate_cast, wrap


def _dims(op: Operation) -> range:
    return range(len(info_shape(op.results[0])))


def _min_constancy(infos, d: int) -> int:
    return min(info.constancy[d] for info in infos)


def elementwise_rule(op: Operation, ins: list) -> list:
    """Equal operands give equal results: constancy is the smallest of the operands'."""
    shape = info_shape(op.results[0])
    constancy = tuple(_min_constancy(ins, d) for d in range(len(shape))) if ins else shape
    ones = (1,) * len(shape)
    return [AxisInfo(ones, ones, constancy)]


def _constant(op: Operation, ins: list) -> list:
    value = op.attrs.get("value")
    shape = info_shape(op.result)
    element = element_type(op.result)
    if isinstance(element, DType) and element.is_integer and not isinstance(value, float):
        return [constant_info(shape, int(value))]
    return [uniform_info(shape)]


def _arange(op: Operation, ins: list) -> list:
    start, end = op.attrs["start"], op.attrs["end"]
    if end - start == 1:
        return [constant_info((1,), start)]
    return [AxisInfo((end - start,), (pow2_divisor(start),), (1,), None, start >= 0)]


def _program_id(op: Operation, ins: list) -> list:
    return [AxisInfo((1,), (1,), (1,), None, True)]


def _splat(op: Operation, ins: list) -> list:
    (x,) = ins
    shape = info_shape(op.result)
    return [AxisInfo((1,) * len(shape), (x.divisibility[0],) * len(shape), shape, x.constant, x.nonnegative)]


def _broadcast(op: Operation, ins: list) -> list:
    (x,) = ins
    before, after = info_shape(op.operands[0]), info_shape(op.result)
    contiguity, constancy = list(x.contiguity), list(x.constancy)
    for d, (have, want) in enumerate(zip(before, after)):
        if have == 1 and want > 1:
            contiguity[d], constancy[d] = 1, want
    return [dataclasses.replace(x, contiguity=tuple(contiguity), constancy=tuple(constancy))]


def _expand_dims(op: Operation, ins: list) -> list:
    (x,) = ins
    if not shape_of(op.operands[0].type):
        return [dataclasses.replace(x, contiguity=(1,), constancy=(1,))]   # scalar -> block of (1,)
    axis = op.attrs["axis"]
    new_divisibility = element_divisibility(x, unit(op.operands[0]))

    def insert(t: tuple, item) -> tuple:
        return t[:axis] + (item,) + t[axis:]

    return [dataclasses.replace(x, contiguity=insert(x.contiguity, 1), constancy=insert(x.constancy, 1),
                                divisibility=insert(x.divisibility, new_divisibility))]


def _reshape(op: Operation, ins: list) -> list:
    (x,) = ins
    before, after = info_shape(op.operands[0]), info_shape(op.result)
    step = unit(op.operands[0])
    kept_before = [d for d, n in enumerate(before) if n > 1]
    kept_after = [d for d, n in enumerate(after) if n > 1]
    if [before[d] for d in kept_before] == [after[d] for d in kept_after]:
        # Only size-1 dims come or go: the other dims keep their facts.
        everywhere = element_divisibility(x, step)
        contiguity, divisibility, constancy = [1] * len(after), [everywhere] * len(after), [1] * len(after)
        for old, new in zip(kept_before, kept_after):
            contiguity[new], divisibility[new], constancy[new] = (x.contiguity[old], x.divisibility[old],
                                                                  x.constancy[old])
        return [dataclasses.replace(x, contiguity=tuple(contiguity), divisibility=tuple(divisibility),
                                    constancy=tuple(constancy))]
    uniform = tuple(x.constancy) == tuple(before)
    ones = (1,) * len(after)
    return [AxisInfo(ones, (element_divisibility(x, step),) * len(after), after if uniform else ones,
                     x.constant if uniform else None, x.nonnegative)]


def _trans(op: Operation, ins: list) -> list:
    (x,) = ins
    perm = op.attrs["perm"]
    return [dataclasses.replace(x, contiguity=tuple(x.contiguity[p] for p in perm),
                                divisibility=tuple(x.divisibility[p] for p in perm),
                                constancy=tuple(x.constancy[p] for p in perm))]


def _identity(op: Operation, ins: list) -> list:
    return [ins[0]]


def _multiple_of(op: Operation, ins: list) -> list:
    (x,) = ins
    values = op.attrs["values"]
    divisibility = tuple(cap(max(v, pow2_divisor(h))) for v, h in zip(x.divisibility, values))
    return [dataclasses.replace(x, divisibility=divisibility)]


def _max_contiguous(op: Operation, ins: list) -> list:
    (x,) = ins
    shape = info_shape(op.result)
    # Runs of h (any h) contain aligned runs of the largest power of two dividing h.
    contiguity = tuple(max(c, min(pow2_divisor(h), n)) for c, h, n in zip(x.contiguity, op.attrs["values"], shape))
    return [dataclasses.replace(x, contiguity=contiguity)]


def _cast(op: Operation, ins: list) -> list:
    (x,) = ins
    source, target = element_type(op.operands[0]), element_type(op.result)
    if isinstance(source, PointerType) or isinstance(target, PointerType):
        # Between a pointer and a 64-bit integer the address (and its divisibility) is kept; runs of
        # consecutive elements are runs of consecutive integers only for 1-byte pointees.
        pointee = source if isinstance(source, PointerType) else target
        if pointee.element.itemsize == 1:
            return [AxisInfo(x.contiguity, x.divisibility, x.constancy)]
        facts = without_contiguity(x, unit(op.operands[0]))
        return [AxisInfo(facts.contiguity, facts.divisibility, x.constancy)]
    if not (source.is_integer and target.is_integer) or source.is_bool or target.is_bool:
        constant = None
        if x.constant is not None:
            constant = evaluate_cast(source, target, x.constant)
        if isinstance(constant, bool) or (isinstance(constant, int) and not target.is_floating):
            return [constant_info(info_shape(op.result), int(constant))]
        return [AxisInfo((1,) * x.rank, (1,) * x.rank, x.constancy, None, x.nonnegative)]
    widening = target.bits >= source.bits
    order_kept = widening and (x.nonnegative or (target.bits > source.bits and
                                                 (target.is_signed or source.kind == "uint")))
    kept = x if order_kept else without_contiguity(x, 1)
    divisibility = tuple(min(v, 1 << target.bits) for v in kept.divisibility)
    constant = None if x.constant is None else wrap(x.constant, target)
    return [AxisInfo(kept.contiguity, divisibility, x.constancy, constant, x.nonnegative and widening)]


def _bitcast(op: Operation, ins: list) -> list:
    (x,) = ins
    source, target = element_type(op.operands[0]), element_type(op.result)
    if isinstance(source, PointerType) and isinstance(target, PointerType):
        if source.element.itemsize == target.element.itemsize:
            return [AxisInfo(x.contiguity, x.divisibility, x.constancy)]
        facts = without_contiguity(x, unit(op.operands[0]))
        return [AxisInfo(facts.contiguity, facts.divisibility, x.constancy)]
    if source.is_integer and target.is_integer:   # the same bits: the low zero bits stay
        facts = without_contiguity(x, 1)
        return [AxisInfo(facts.contiguity, facts.divisibility, x.constancy)]
    return [AxisInfo((1,) * x.rank, (1,) * x.rank, x.constancy)]


def _add_like(op: Operation, ins: list, subtract: bool) -> list:
    """a + b, a - b, and addptr(a, b) (b counts elements, a's divisibility is in bytes)."""
    a, b = ins
    pointer = op.opcode == OpCode.ADDPTR
    step_a = unit(op.operands[0])
    scale = step_a if pointer else 1
    contiguity, divisibility, constancy = [], [], []
    for d in _dims(op):
        c = min(a.contiguity[d], b.constancy[d])
        if not subtract:
            c = max(c, min(a.constancy[d], b.contiguity[d]))
        contiguity.append(c)
        divisibility.append(cap(min(divisibility_at(a, d, c, step_a), divisibility_at(b, d, c, 1) * scale)))
        constancy.append(min(a.constancy[d], b.constancy[d]))
    nonnegative = not subtract and a.nonnegative and b.nonnegative
    return [AxisInfo(tuple(contiguity), tuple(divisibility), tuple(constancy), None, nonnegative)]


def _mul(op: Operation, ins: list) -> list:
    a, b = ins
    if b.constant == 1 or a.constant == 1:
        return [a if b.constant == 1 else b]
    divisibility = (cap(element_divisibility(a, 1) * element_divisibility(b, 1)),) * len(_dims(op))
    constancy = tuple(min(a.constancy[d], b.constancy[d]) for d in _dims(op))
    return [AxisInfo((1,) * len(constancy), divisibility, constancy, None, a.nonnegative and b.nonnegative)]


def _log2_of_constant(info: AxisInfo):
    """log2 of `info`'s constant when it is a positive power of two below 2**62, else None."""
    n = info.constant
    return n.bit_length() - 1 if n is not None and 0 < n < 1 << 62 and n & (n - 1) == 0 else None


def _shift_amount(info: AxisInfo):
    n = info.constant
    return n if n is not None and 0 <= n < 62 else None


def _bucket_run(x: AxisInfo, d: int, bucket: int) -> int:
    """Aligned runs of consecutive values of `x` along d that never cross a multiple of `bucket`:
    runs of min(contiguity, bucket, divisibility) start at a multiple of that length."""
    return min(x.contiguity[d], bucket, x.divisibility[d])


def _elementwise_facts(op: Operation, a: AxisInfo, b: AxisInfo, divisibility: list, nonnegative: bool):
    constancy = tuple(min(a.constancy[d], b.constancy[d]) for d in _dims(op))
    return [AxisInfo((1,) * len(constancy), tuple(divisibility), constancy, None, nonnegative)]


def _shift_left(op: Operation, ins: list) -> list:
    a, b = ins
    shift = _shift_amount(b)
    if shift == 0:
        return [a]
    if shift is None:   # a << s is still a multiple of whatever divides a
        return _elementwise_facts(op, a, b, [element_divisibility(a, 1) for d in _dims(op)], False)
    divisibility = [cap(element_divisibility(a, 1) << shift) for d in _dims(op)]
    return [AxisInfo((1,) * len(divisibility), tuple(divisibility), a.constancy, None, a.nonnegative)]


def _quotient(op: Operation, ins: list) -> list:
    """a // b and a >> b: for b a power of two 2**s (a shift by s), aligned runs of consecutive a
    inside one multiple of 2**s give one quotient. `//` truncates toward zero, so its buckets line
    up only for non-negative a; `>>` rounds toward minus infinity and needs no sign."""
    a, b = ins
    shift = _shift_amount(b) if op.opcode == OpCode.SHR else _log2_of_constant(b)
    # x // 0 is -1, so a non-negative quotient needs a divisor known to be positive.
    positive_divisor = b.constant is not None and b.constant > 0
    nonnegative = a.nonnegative and (positive_divisor or op.opcode == OpCode.SHR)
    if shift is None:
        return _elementwise_facts(op, a, b, [1] * len(_dims(op)), nonnegative)
    if shift == 0:
        return [a]
    bucket_ok = op.opcode == OpCode.SHR or a.nonnegative
    constancy, divisibility = [], []
    for d in _dims(op):
        run = _bucket_run(a, d, 1 << shift) if bucket_ok else 1
        constancy.append(max(a.constancy[d], run))
        # An exact multiple of 2**t divided by 2**s (t >= s) is a multiple of 2**(t - s).
        divisibility.append(max(1, element_divisibility(a, 1) >> shift))
    return [AxisInfo((1,) * len(constancy), tuple(divisibility), tuple(constancy), None, nonnegative)]


def _remainder(op: Operation, ins: list) -> list:
    """a % b and a & b: for b = 2**s (a mask 2**s - 1), aligned runs of consecutive a inside one
    multiple of 2**s stay consecutive. A multiple of 2**t keeps being one (or becomes 0)."""
    a, b = ins
    if op.opcode == OpCode.AND:
        mask = b.constant
        shift = (mask + 1).bit_length() - 1 if mask is not None and 0 <= mask < 1 << 62 \
            and mask & (mask + 1) == 0 else None
        bucket_ok = True
        nonnegative = a.nonnegative or b.nonnegative
    else:
        shift = _log2_of_constant(b)
        bucket_ok = a.nonnegative
        nonnegative = a.nonnegative   # the remainder has the dividend's sign (and x % 0 is x)
    if shift is None:
        if op.opcode == OpCode.AND:   # x & y keeps the low zero bits of either
            divisibility = [max(element_divisibility(a, 1), element_divisibility(b, 1)) for d in _dims(op)]
        else:                         # x - q * y
            divisibility = [min(element_divisibility(a, 1), element_divisibility(b, 1)) for d in _dims(op)]
        return _elementwise_facts(op, a, b, divisibility, nonnegative)
    contiguity, divisibility = [], []
    for d in _dims(op):
        run = _bucket_run(a, d, 1 << shift) if bucket_ok else 1
        contiguity.append(run)
        divisibility.append(divisibility_at(a, d, run, 1))
    return [AxisInfo(tuple(contiguity), tuple(divisibility), a.constancy, None, nonnegative)]


def _bitwise(op: Operation, ins: list) -> list:
    """a | b and a ^ b keep the low zero bits both have."""
    a, b = ins
    divisibility = [min(element_divisibility(a, 1), element_divisibility(b, 1)) for d in _dims(op)]
    return _elementwise_facts(op, a, b, divisibility, a.nonnegative and b.nonnegative)


def _minmax(op: Operation, ins: list) -> list:
    a, b = ins
    divisibility = tuple(min(element_divisibility(a, 1), element_divisibility(b, 1)) for d in _dims(op))
    constancy = tuple(min(a.constancy[d], b.constancy[d]) for d in _dims(op))
    either = a.nonnegative or b.nonnegative
    nonnegative = either if op.opcode == OpCode.MAXIMUM else a.nonnegative and b.nonnegative
    return [AxisInfo((1,) * len(constancy), divisibility, constancy, None, nonnegative)]


def _compare(op: Operation, ins: list) -> list:
    """Comparisons; `offs < n` is constant over aligned runs of `offs` that never straddle n."""
    a, b = ins
    code = op.opcode
    constancy = []
    for d in _dims(op):
        k = min(a.constancy[d], b.constancy[d])
        # x < n and x >= n flip between n - 1 and n: aligned runs of L consecutive x, with L
        # dividing both the run's first value and n, never contain that flip.
        if code in (OpCode.LT, OpCode.GE):
            runs, bound = a, b
        elif code in (OpCode.GT, OpCode.LE):
            runs, bound = b, a
        else:
            constancy.append(k)
            continue
        run = min(runs.contiguity[d], runs.divisibility[d], bound.constancy[d], element_divisibility(bound, 1))
        constancy.append(max(k, floor_pow2(run)))
    ones = (1,) * len(constancy)
    return [AxisInfo(ones, ones, tuple(constancy), None, True)]


def _where(op: Operation, ins: list) -> list:
    condition, a, b = ins
    step = unit(op.operands[1])
    contiguity, divisibility, constancy = [], [], []
    for d in _dims(op):
        c = min(a.contiguity[d], b.contiguity[d], condition.constancy[d])
        contiguity.append(c)
        divisibility.append(min(divisibility_at(a, d, c, step), divisibility_at(b, d, c, step)))
        constancy.append(min(condition.constancy[d], a.constancy[d], b.constancy[d]))
    return [AxisInfo(tuple(contiguity), tuple(divisibility), tuple(constancy), None,
                     a.nonnegative and b.nonnegative)]


def _load(op: Operation, ins: list) -> list:
    # Equal addresses (under equal masks and `other`) read equal values within one load.
    return elementwise_rule(op, ins)


def _integer_binary(op: Operation, ins: list) -> list:
    """Binary integer ops: exact when both operands are known constants, else the op's rule."""
    a, b = ins
    element = element_type(op.operands[0])
    if a.constant is not None and b.constant is not None and isinstance(element, DType):
        value = evaluate_binary(op.opcode, element, a.constant, b.constant)
        if value is not None:
            return [constant_info(info_shape(op.result), int(value))]
    return _BINARY_RULES[op.opcode](op, ins)


_BINARY_RULES = {
    OpCode.ADD: lambda op, ins: _add_like(op, ins, subtract=False),
    OpCode.SUB: lambda op, ins: _add_like(op, ins, subtract=True),
    OpCode.MUL: _mul,
    OpCode.IDIV: _quotient, OpCode.SHR: _quotient, OpCode.MOD: _remainder, OpCode.AND: _remainder,
    OpCode.SHL: _shift_left, OpCode.OR: _bitwise, OpCode.XOR: _bitwise,
    OpCode.MINIMUM: _minmax, OpCode.MAXIMUM: _minmax,
    OpCode.EQ: _compare, OpCode.NE: _compare, OpCode.LT: _compare, OpCode.LE: _compare,
    OpCode.GT: _compare, OpCode.GE: _compare,
}

RULES = {
    OpCode.CONSTANT: _constant,
    OpCode.ARANGE: _arange,
    OpCode.PROGRAM_ID: _program_id,
    OpCode.NUM_PROGRAMS: _program_id,
    OpCode.SPLAT: _splat,
    OpCode.BROADCAST: _broadcast,
    OpCode.EXPAND_DIMS: _expand_dims,
    OpCode.RESHAPE: _reshape,
    OpCode.TRANS: _trans,
    OpCode.CONVERT_LAYOUT: _identity,
    OpCode.MULTIPLE_OF: _multiple_of,
    OpCode.MAX_CONTIGUOUS: _max_contiguous,
    OpCode.CAST: _cast,
    OpCode.BITCAST: _bitcast,
    OpCode.ADDPTR: lambda op, ins: _add_like(op, ins, subtract=False),
    OpCode.WHERE: _where,
    OpCode.LOAD: _load,
}


def infer(op: Operation, ins: list) -> list:
    """The AxisInfo of each result of `op` (a non-control-flow op) from its operands' infos."""
    code = op.opcode
    if code in _BINARY_RULES:
        element = element_type(op.operands[0])
        if isinstance(element, DType) and element.is_integer:
            return _integer_binary(op, ins)
        return elementwise_rule(op, ins)
    rule = RULES.get(code)
    if rule is not None:
        return rule(op, ins)
    if code in ELEMENTWISE:
        return elementwise_rule(op, ins)
    return [default_info(info_shape(result)) for result in op.results]
