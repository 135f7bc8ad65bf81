"""Induction-variable substitution: a value a `for` loop carries and advances by a loop-invariant
step every trip (`a_ptrs += BLOCK_K * stride_ak`, the usual K-loop idiom) is recomputed from the
induction variable instead.

    for %k in range(%lb, %ub, %step) iter(%p = %p0):        for %k in range(%lb, %ub, %step):
        ... load %p ...                               ->        %i = (%k - %lb) / %step          (exact)
        yield addptr %p, splat(%s)                              %p_k = addptr %p0, splat(%i * %s)
                                                                ... load %p_k ...

`%p_k` is the value `%p` had on trip `%i`, so the loop's reads of `%p` read it instead. Nothing in the
loop then depends on the carried value: a load's address and mask are functions of `%k` and of values
defined before the loop, which is what passes/pipelining.py needs to issue a later trip's copy early
(cp.async / TMA rings), and the address block is an index computation the layout pass can place in
any layout (a transposed view's pointers get its column-major memory layout instead of the carried
row-major one). A read of the loop's result after the loop reads `%p0` advanced by the trip count
instead (`ceil((ub - lb) / step)`, 0 for an empty range), so the carry is dead and DCE removes it
(keeping it beside `%p0` would hold both across the loop).

What qualifies, in a loop whose induction variable is a signed 32/64-bit integer: a carried pointer
(scalar or block) yielded as `addptr(%p, o)`, or a carried 32/64-bit integer yielded as `add(%p, o)`,
`add(o, %p)` or `sub(%p, o)`, where `o` is a scalar or a splat of one that is loop-invariant: defined
before the loop, or computed in the loop body by pure integer ops from such values only (those ops are
moved in front of the loop). Trip indices and counts are computed in the unsigned type of the induction
variable's width, where `|k - lb| < 2^bits` is exact (the signed difference wraps for a range spanning
more than half the type). Pointer offsets are multiplied in int64, so `%i * %s` cannot wrap where the
carried sum would not; integer carries use their own type, whose wrap-around the repeated additions
share. Floating-point carries are left alone (their sums are not exact). The `while` loop has no
induction variable and is not touched.

Source: induction-variable recognition and substitution, Aho, Lam, Sethi, Ullman, "Compilers:
Principles, Techniques, and Tools" (2nd ed.), section 9.8.
"""

from __future__ import annotations

from typing import Optional

from ..ir import Block, Function, Operation, OpCode, Value
from ..ir.rewrite import replace_all_uses
from ..language.dtypes import BlockType, DType, PointerType, int1, int64, shape_of, uint32, uint64, with_shape
from .dce import eliminate_dead_code
from ._rewriting import Inserter, constant_int, replace_uses

_UNSIGNED = {32: uint32, 64: uint64}

# Pure scalar integer ops a loop-invariant offset may be computed with inside the loop (no division:
# moved in front of a loop that may run zero times, it must not be able to fault or be undefined).
_MOVABLE = frozenset({OpCode.CONSTANT, OpCode.SPLAT, OpCode.CAST, OpCode.ADD, OpCode.SUB, OpCode.MUL, OpCode.NEG,
                      OpCode.SHL, OpCode.AND, OpCode.OR, OpCode.XOR, OpCode.MINIMUM, OpCode.MAXIMUM,
                      OpCode.MULTIPLE_OF, OpCode.MAX_CONTIGUOUS})


def substitute_induction_variables(function: Function) -> bool:
    """Rewrite every qualifying carried value of every `for` loop (module docstring); True when the IR
    changed."""
    changed = False
    read = {id(operand) for op in function.walk() for operand in op.operands}
    for op in list(function.walk()):
        if op.opcode == OpCode.FOR:
            changed |= _rewrite_loop(function, op, read)
    if changed:
        eliminate_dead_code(function)
    return changed


def _rewrite_loop(function: Function, loop: Operation, read: set) -> bool:
    body = loop.regions[0]
    induction = body.args[0]
    if not (isinstance(induction.type, DType) and induction.type.is_signed and induction.type.bits in _UNSIGNED):
        return False
    yielded = body.terminator.operands
    steps, invariant = [], {}
    for index, arg in enumerate(body.args[1:]):
        step = _scalar_step(arg, yielded[index], loop, invariant)
        if step is not None:
            steps.append((index, arg, step))
    if not steps:
        return False
    before_loop = Inserter(loop.parent, loop)
    for position, (index, arg, (scalar, negate)) in enumerate(steps):
        _hoist(scalar, loop)
        if negate:
            steps[position] = (index, arg, (before_loop.value(OpCode.NEG, [scalar], scalar.type), False))
    at = Inserter(body, body.ops[0])
    trip = _trips(at, loop, induction, count=False)
    after, count = None, None
    for index, arg, (scalar, _) in steps:
        initial = loop.operands[3 + index]
        replace_uses(body, 0, arg, _value_on_trip(at, loop, initial, scalar, trip))
        if id(loop.results[index]) in read:      # read after the loop: p0 advanced by the trip count
            if after is None:
                block = loop.parent
                after = Inserter(block, block.ops[block.ops.index(loop) + 1])
                count = _trips(after, loop, loop.operands[1], count=True)
            replace_all_uses(function, loop.results[index], _value_on_trip(after, loop, initial, scalar, count))
    return True


def _scalar_step(arg: Value, yielded: Value, loop: Operation, invariant: dict) -> Optional[tuple]:
    """(s, negate): `yielded` is carried `arg` advanced by loop-invariant scalar `s` (by `-s` when
    negate); None when it is not."""
    op = yielded.defining_op
    if op is None or op.parent is not loop.regions[0]:
        return None
    element = arg.type.element if isinstance(arg.type, BlockType) else arg.type
    negate = False
    if op.opcode == OpCode.ADDPTR and isinstance(element, PointerType) and op.operands[0] is arg:
        offset = op.operands[1]
    elif isinstance(element, PointerType) or not element.is_integer or element.is_bool or element.bits not in (32, 64):
        return None
    elif op.opcode == OpCode.ADD and arg in op.operands:
        offset = op.operands[1] if op.operands[0] is arg else op.operands[0]
    elif op.opcode == OpCode.SUB and op.operands[0] is arg:
        offset, negate = op.operands[1], True
    else:
        return None
    scalar_type = offset.type.element if isinstance(offset.type, BlockType) else offset.type
    if offset is arg or not scalar_type.is_integer or scalar_type.is_bool:
        return None
    if not isinstance(element, PointerType) and scalar_type != element:
        return None
    source = offset.defining_op if isinstance(offset.type, BlockType) else None
    if source is not None and source.opcode == OpCode.SPLAT:
        offset = source.operands[0]
    elif source is not None and source.opcode == OpCode.CONSTANT:     # a splat folded to a constant
        offset = Inserter(loop.parent, loop).value(OpCode.CONSTANT, [], scalar_type, dict(source.attrs))
    elif source is not None or isinstance(offset.type, BlockType):
        return None
    return (offset, negate) if _invariant(offset, loop, invariant) else None


def _inside(value: Value, loop: Operation) -> bool:
    """Whether `value` is defined inside `loop` (in its body or a region nested there)."""
    owner = value.owner
    block = owner if isinstance(owner, Block) else owner.parent
    while block is not None:
        if block.parent is loop:
            return True
        block = block.parent.parent if block.parent is not None else None
    return False


def _invariant(value: Value, loop: Operation, known: dict) -> bool:
    """Defined before `loop`, or by movable ops directly in its body from such values only (`known`
    memoizes the answer per value)."""
    if id(value) in known:
        return known[id(value)]
    if not _inside(value, loop):
        answer = True
    else:
        op = value.defining_op
        answer = (op is not None and op.parent is loop.regions[0] and op.opcode in _MOVABLE and not op.regions
                  and not isinstance(value.type, BlockType)
                  and all(_invariant(operand, loop, known) and isinstance(operand.type, DType)
                          and operand.type.is_integer for operand in op.operands))
    known[id(value)] = answer
    return answer


def _hoist(value: Value, loop: Operation) -> None:
    """Move the body ops computing invariant `value` in front of `loop` (operands first)."""
    op = value.defining_op
    if op is None or op.parent is not loop.regions[0]:
        return
    for operand in op.operands:
        _hoist(operand, loop)
    loop.regions[0].ops.remove(op)
    block = loop.parent
    block.ops.insert(block.ops.index(loop), op)
    op.parent = block


def _cast(at: Inserter, value: Value, type_) -> Value:
    return value if value.type == type_ else at.value(OpCode.CAST, [value], type_)


def _trips(at: Inserter, loop: Operation, end: Value, count: bool) -> Value:
    """How many trips start before `end`: with `end` the induction variable (count False), the trips
    before this one, `(k - lb) / step`; with `end` the upper bound (count True), the loop's trip count
    (0 when the range is empty).
    Computed in the unsigned type of the induction variable's width, where a distance below 2^bits is
    exact (in the signed type it wraps when the range spans more than half of it)."""
    induction = loop.regions[0].args[0]
    signed = induction.type
    unsigned = _UNSIGNED[signed.bits]
    lower, end, step = (_cast(at, v, signed) for v in (loop.operands[0], end, loop.operands[2]))
    lower_u, end_u, step_u = (_cast(at, v, unsigned) for v in (lower, end, step))
    one = at.constant(1, unsigned)
    known = constant_int(loop.operands[2])
    if known is not None and known > 0:
        runs = at.value(OpCode.GT, [end, lower], int1)
        distance, magnitude = at.value(OpCode.SUB, [end_u, lower_u], unsigned), step_u
    elif known is not None and known < 0:
        runs = at.value(OpCode.LT, [end, lower], int1)
        distance = at.value(OpCode.SUB, [lower_u, end_u], unsigned)
        magnitude = at.constant(-known, unsigned)
    else:
        zero = at.constant(0, signed)
        upward = at.value(OpCode.GT, [step, zero], int1)
        downward = at.value(OpCode.LT, [step, zero], int1)
        runs = at.value(OpCode.OR, [at.value(OpCode.AND, [upward, at.value(OpCode.GT, [end, lower], int1)], int1),
                                    at.value(OpCode.AND, [downward, at.value(OpCode.LT, [end, lower], int1)], int1)],
                        int1)
        distance = at.value(OpCode.WHERE, [upward, at.value(OpCode.SUB, [end_u, lower_u], unsigned),
                                           at.value(OpCode.SUB, [lower_u, end_u], unsigned)], unsigned)
        magnitude = at.value(OpCode.WHERE, [upward, step_u, at.value(OpCode.NEG, [step_u], unsigned)], unsigned)
    if not count:       # in the body, where the loop runs: the step is not 0
        return at.value(OpCode.IDIV, [distance, magnitude], unsigned)
    safe = at.value(OpCode.WHERE, [runs, magnitude, one], unsigned)           # no division by a zero step
    trips = at.value(OpCode.ADD, [at.value(OpCode.IDIV, [at.value(OpCode.SUB, [distance, one], unsigned), safe],
                                           unsigned), one], unsigned)
    zero_u = at.constant(0, unsigned)
    return at.value(OpCode.WHERE, [runs, trips, zero_u], unsigned)


def _value_on_trip(at: Inserter, loop: Operation, initial: Value, scalar: Value, trip: Value) -> Value:
    """`initial` advanced `trip` times by `scalar`: addptr / add of `trip * scalar`."""
    element = initial.type.element if isinstance(initial.type, BlockType) else initial.type
    pointer = isinstance(element, PointerType)
    product_type = int64 if pointer else element
    before_loop = Inserter(loop.parent, loop)
    step = _cast(before_loop, scalar, product_type)
    product = at.value(OpCode.MUL, [_cast(at, trip, product_type), step], product_type)
    shape = shape_of(initial.type)
    if shape:
        product = at.value(OpCode.SPLAT, [product], with_shape(product_type, shape))
    return at.value(OpCode.ADDPTR if pointer else OpCode.ADD, [initial, product], initial.type)
