"""`for` and `while` loops: unrolling (static_range, compile-time tuples) and IR FOR / WHILE ops
with loop-carried values (the rules are in control_flow.py's docstring)."""

from __future__ import annotations

import ast
import builtins

from ..errors import CompilationError, UnsupportedError
from ..ir import Block, OpCode
from ..language import core, promotion, triton_compat
from ..language.composite import is_composite
from ..language.dtypes import BlockType, DType, int64, shape_of
from ..language.shape_ops import described
from .carried_types import is_literal_promotion, literals_reaching
from .control_flow import _MISSING, _assigned_names, _element, _is_number, _promoted_with_literal, _same_constant
from .scope import is_runtime

# The most iterations a dsl.static_range loop unrolls: each is compiled as its own copy of the body.
MAX_UNROLL = 4096


class LoopsMixin:
    # -- for ---------------------------------------------------------------------------------------
    def visit_For(self, node: ast.For):
        if node.orelse:
            raise UnsupportedError("`for ... else` is not supported in kernels")
        kind, bounds = self._iteration(node.iter)
        self.loops.append(node)
        try:
            if kind == "unroll":
                for item in bounds:
                    self.assign_target(node.target, item)
                    self.compile_statements(node.body)
            else:
                if not isinstance(node.target, ast.Name):
                    raise UnsupportedError("the variable of a `for` loop over range() must be a single name")
                with self.located(node.iter):
                    header = self._range_bounds(*bounds)
                self._compile_loop(node, header)
        finally:
            self.loops.pop()

    def _iteration(self, iterator: ast.expr):
        """("unroll", items) or ("loop", (start, stop, step)) for a `for` loop's iterable."""
        if isinstance(iterator, ast.Call):
            function = self.visit(iterator.func)
            if function is triton_compat.range:         # Triton's tl.range: a range() with compiler hints
                with self.located(iterator):
                    args = [self.visit(a) for a in iterator.args]
                    if any(k.arg is None for k in iterator.keywords):
                        raise CompilationError("dsl.range() takes no **keyword arguments")
                    kwargs = {k.arg: self.visit(k.value) for k in iterator.keywords}
                    return "loop", triton_compat.range_bounds(args, kwargs)
            if function is builtins.range or function is core.static_range:
                with self.located(iterator):
                    if iterator.keywords or not 1 <= len(iterator.args) <= 3:
                        raise CompilationError("range() takes 1 to 3 positional arguments")
                    args = [self.visit(a) for a in iterator.args]
                    start, stop, step = (0, args[0], 1) if len(args) == 1 else (args + [1])[:3]
                    if function is builtins.range:
                        return "loop", (start, stop, step)
                    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, stop, step)):
                        raise CompilationError("dsl.static_range bounds must be constexpr ints; use range() for a "
                                               "loop with runtime bounds")
                    if step == 0:
                        raise CompilationError("dsl.static_range step must not be zero")
                    count = max(0, -((start - stop) // step))     # len(range(...)), for bounds past ssize_t too
                    if count > MAX_UNROLL:
                        bounds = ", ".join(promotion.printable(v) for v in (start, stop, step))
                        raise CompilationError(f"dsl.static_range({bounds}) unrolls {promotion.printable(count)} "
                                               f"iterations, over {MAX_UNROLL}; use range() for a loop")
                    return "unroll", range(start, stop, step)
        value = self.visit(iterator)
        if not is_runtime(value) and isinstance(value, (tuple, list)):
            return "unroll", value
        with self.located(iterator):
            raise UnsupportedError("a kernel `for` loop iterates over range(...), dsl.static_range(...) or a "
                                   "compile-time tuple")

    def _range_bounds(self, start, stop, step) -> list:
        """The three bounds as IR scalars of one integer type (the promotion of the runtime ones, widened
        for literals that do not fit)."""
        bounds = (start, stop, step)
        for value in bounds:
            if is_runtime(value):
                if isinstance(value.type, BlockType) or not isinstance(value.type, DType) \
                        or not value.type.is_integer:
                    raise CompilationError(f"range() bounds must be integer scalars, got {value.type}")
            elif not isinstance(value, int):
                raise CompilationError(f"range() bounds must be integers, got {described(value)}")
        if not is_runtime(step) and step == 0:
            raise CompilationError("range() step must not be zero")
        try:
            dtype = self._bounds_type(bounds)
        except promotion.PromotionError as e:   # a literal past 64 bits, or types without a common one
            raise CompilationError(f"range() bounds: {e}") from None
        if dtype.is_bool:
            dtype = promotion.promote(dtype, promotion.literal_dtype(0))
        if dtype.kind == "uint" and any(_may_be_negative(v) for v in bounds):
            # C's promotion would make a negative step or bound a huge unsigned one; Python's range counts
            # with the sign, so widen to a signed type that holds both (none holds uint64's range).
            if dtype.bits == 64:
                raise CompilationError("range() mixes uint64 bounds with signed or negative ones: cast them to one "
                                       "type first")
            dtype = int64
        return [self.semantic.cast(self.semantic.to_value(v, dtype), dtype) for v in bounds]

    @staticmethod
    def _bounds_type(bounds):
        """The promotion of the runtime bounds' types, widened for the literals that do not fit it."""
        dtype = None
        for value in bounds:
            if is_runtime(value):
                dtype = value.type if dtype is None else promotion.promote(dtype, value.type)
        for value in bounds:
            if not is_runtime(value) and (dtype is None or not promotion.literal_fits(value, dtype)):
                literal = promotion.literal_dtype(value)
                dtype = literal if dtype is None else promotion.promote(dtype, literal)
        return dtype

    # -- while -------------------------------------------------------------------------------------
    def visit_While(self, node: ast.While):
        if node.orelse:
            raise UnsupportedError("`while ... else` is not supported in kernels")
        self.loops.append(node)
        try:
            self._compile_loop(node, None)
        finally:
            self.loops.pop()

    # -- loop-carried values -----------------------------------------------------------------------
    def _compile_loop(self, node, header) -> None:
        """Build the FOR (`header` = [lb, ub, step]) or WHILE (`header` None) op of `node`."""
        target = node.target.id if isinstance(node, ast.For) else None
        outermost = self.loops[0]
        start = (outermost.lineno, outermost.col_offset)
        names = [n for n in _assigned_names(node.body) if n != target and self.scope.defines(n)
                 and self.read_at_or_after(n, start)]
        inits = {n: self.scope.names[n] for n in names}
        # A tuple of kernel values and numbers is carried item by item, as slots named `name[i]`.
        tuples = _TupleSlots(names, inits)
        # Compile-time values other than numbers cannot be carried: they must not change in the loop.
        fixed = {n for n in names if not is_runtime(inits[n]) and not _is_number(inits[n])}
        retype, cast_back, dropped = {}, set(), set()
        # numbers taken as unchanged (`_keeps_number`), and those the next attempt showed to change after all
        kept_numbers, changing = set(), set()
        outer = self.builder.block
        for _ in range(3 * len(names) + 2):
            mark = len(outer.ops)
            carried = [n for n in names if n not in fixed and n not in dropped]
            init_values = [self._loop_init(inits[n], retype.get(n)) for n in carried]
            types = [v.type for v in init_values]
            attempt = self._loop_attempt(node, header, target, carried, types, tuples, [inits[n] for n in carried])
            if attempt is None:      # a while whose condition is a compile-time False
                del outer.ops[mark:]
                return
            regions, body_args, scope = attempt
            ends = [tuples.end(scope, n) for n in carried]
            retry = False
            for name, arg, end, init in zip(carried, body_args, ends, init_values):
                if end is _MISSING:
                    dropped.add(name)    # hidden by the body (e.g. an inner loop's variable): not carried
                    retry = True
                elif end is arg:
                    fixed.add(name)      # unchanged by the body: not carried
                    retry = True
                elif name not in changing and _is_number(inits[name]) and _keeps_number(end, {arg}, inits[name]):
                    # only assigned the number it starts as (`v = 0`, then `v = 0` in the body, in an inner `if`
                    # or loop): not carried, so that it stays that number after the loop, as before it
                    fixed.add(name)
                    kept_numbers.add(name)
                    retry = True
                elif not self._carried_type_ok(node, name, arg, end, inits[name], retype, cast_back, scope):
                    retry = True
            for name in (n for n in names if n not in carried and n not in dropped):
                end = tuples.end(scope, name)
                if end is not inits[name] and not (not is_runtime(end) and _same_constant(end, inits[name])) \
                        and end is not _MISSING:
                    if name in kept_numbers:        # the number does change (a number of another type): carry it
                        kept_numbers.discard(name)
                        fixed.discard(name)
                        changing.add(name)
                        retry = True
                        continue
                    if isinstance(inits[name], (tuple, list)):
                        raise CompilationError(f"`{name}` is a {type(inits[name]).__name__} before the loop and is "
                                               "reassigned in the loop body; only tuples of kernel values and "
                                               "numbers can be loop-carried: carry its items as separate variables "
                                               f"(e.g. `a, b = {name}`)")
                    raise CompilationError(f"`{name}` is the compile-time value {described(inits[name])} before the "
                                           "loop but is reassigned in the loop body; only numbers and kernel values "
                                           "can be loop-carried")
            if retry:
                del outer.ops[mark:]
                continue
            self._finish_loop(node, header, regions, carried, init_values, ends, cast_back, scope, tuples)
            return
        raise CompilationError("the types of the loop-carried variables do not settle")

    def _adopts(self, init, type_) -> bool:
        """Whether a carried variable whose initial value is `init` takes the type `type_` the body gives it:
        `init` is a literal that fits it, or a value that an enclosing loop's such literal flows into (a
        loop nested in that loop's body then converts `init`, as the literal would have adopted the type)."""
        element = _element(type_)
        if not isinstance(element, DType):
            return False
        if _is_number(init):
            return promotion.literal_fits(init, element)
        try:
            if promotion.broadcast_shapes(shape_of(init.type), shape_of(type_)) != shape_of(type_):
                return False
        except promotion.PromotionError:
            return False
        return any(promotion.literal_fits(literal, element)
                   for literal in literals_reaching(self.context.carry_inits, init))

    def _loop_init(self, init, type_):
        if is_runtime(init):
            if type_ is None or init.type == type_:
                return init
            return self.semantic.broadcast_to(self.semantic.cast(init, _element(type_)), shape_of(type_))
        if type_ is None:
            return self.semantic.to_value(init)
        return self.semantic.constant(init, _element(type_), shape_of(type_))

    def _carried_type_ok(self, node, name, arg, end, init, retype, cast_back, scope) -> bool:
        """True when `end` (the body's value of carried `name`) can be yielded for block argument `arg`;
        False after recording a fix that needs another attempt; raises when the type changed."""
        if is_runtime(end):
            if end.type == arg.type:
                return True
            if self._adopts(init, end.type) and retype.get(name) != end.type:
                retype[name] = end.type           # a literal initial value adopts the body's type
                return False
            if is_literal_promotion(end, arg.type):
                cast_back.add(name)
                return True
            raise CompilationError(
                f"loop-carried variable `{name}` has type {arg.type} before the loop (line "
                f"{self.source.location(node).line}) but is assigned a {end.type} in the loop body; its type must not "
                "change in a loop: give it the final type before the loop (e.g. dsl.zeros(shape, dtype)) or convert "
                "with .to(dtype)", scope.locations.get(name))
        if _is_number(end) and isinstance(_element(arg.type), DType) and promotion.literal_fits(end, _element(arg.type)):
            return True
        # a literal initial value and a literal the body assigns promote together, as two literals do
        # (`scale = 1`, then `scale = 0.5` in the body: float32)
        wider = _promoted_with_literal(arg.type, end) if _is_number(end) else None
        if wider is not None and self._adopts(init, wider) and retype.get(name) != wider:
            retype[name] = wider
            return False
        raise CompilationError(f"loop-carried variable `{name}` has type {arg.type} before the loop but becomes "
                               f"{described(end)} in the loop body", scope.locations.get(name))

    def _loop_attempt(self, node, header, target, carried, types, tuples, inits):
        """Compile the loop's regions with the carried names typed `types` (`tuples`: the carried tuples'
        slots; `inits`: their initial values before any conversion); None when a `while` condition is a
        compile-time False."""
        regions = []
        if header is None:
            before = Block(types, carried)
            scope = self.scope.copy()
            for name, arg in zip(carried, before.args):
                scope.assign(name, arg)
            tuples.bind(scope, dict(zip(carried, before.args)))
            saved = self.scope
            self.scope = scope
            try:
                with self.builder.insert_into(before), self.located(node.test):
                    condition = self.visit(node.test)
                    if not is_runtime(condition):
                        if not condition:
                            return None
                        raise UnsupportedError("this `while` condition is always true and `break` is not "
                                               "supported, so the loop could never end")
                    condition = self.semantic.to_condition(condition)
                    self.builder.create(OpCode.CONDITION, [condition] + list(before.args), [])
            finally:
                self.scope = saved
            regions.append(before)
            body = Block(types, carried)
            body_args = body.args
        else:
            body = Block([header[0].type] + types, [target] + carried)
            body_args = body.args[1:]
        scope = self.scope.copy()
        if target is not None:
            scope.assign(target, body.args[0])
        for name, arg in zip(carried, body_args):
            scope.assign(name, arg)
        tuples.bind(scope, dict(zip(carried, body_args)))
        self.context.carry_inits.update(zip(body_args, inits))     # for loops nested in the body (_adopts)
        try:
            self.compile_region(body, scope, node.body)
        finally:
            for arg in body_args:
                del self.context.carry_inits[arg]
        regions.append(body)
        return regions, body_args, scope

    def _finish_loop(self, node, header, regions, carried, init_values, ends, cast_back, scope, tuples) -> None:
        body = regions[-1]
        with self.builder.insert_into(body):
            operands = []
            for name, init, end in zip(carried, init_values, ends):
                if name in cast_back:
                    end = self.semantic.cast(end, _element(init.type))
                operands.append(self.materialize(end, init.type))
            self.builder.create(OpCode.YIELD, operands, [])
        opcode = OpCode.FOR if header is not None else OpCode.WHILE
        operands = (list(header) if header is not None else []) + list(init_values)
        op = self.builder.create(opcode, operands, [v.type for v in init_values], regions=regions)
        for name, result in zip(carried, op.results):
            self.scope.assign(name, result)
        tuples.bind(self.scope, dict(zip(carried, op.results)))
        tuples.forget(self.scope)
        tuples.forget(scope)
        line = self.source.location(node).line
        if isinstance(node, ast.For):
            self.scope.hide(node.target.id, f"`{node.target.id}` is the variable of the loop at line {line} and is "
                                            "not defined after the loop")
        for name in scope.names:
            if not self.scope.defines(name) and name not in self.scope.hidden:
                self.scope.hide(name, f"`{name}` is first assigned inside the loop at line {line}, so it is not "
                                      "defined after the loop; assign it before the loop to carry its value out")
        for name, reason in scope.hidden.items():
            if name not in carried and name not in self.scope.hidden:
                self.scope.hide(name, reason)


class _TupleSlots:
    """The loop-carried tuples of a loop: a name whose value before the loop is a tuple of kernel values and
    numbers is replaced in `names` by one slot per item, `name[i]` (not an identifier: no clash), whose
    initial value is the item (in `inits`). `bind` sets the tuple names of a scope from the carried slots'
    values (a slot that is not carried keeps its initial value; an enclosing loop's slots of the same name
    are not this loop's), `end` reads a slot's value from the tuple at the end of the body (its location
    the tuple's), `forget` removes the slots from a scope once the loop is built. A composite value (a block
    pointer: language/composite.py) is carried the same way, its slots named `name.item` (`p.offsets[1]`)."""

    def __init__(self, names: list, inits: dict):
        self.slots = {}         # tuple name -> its slot names
        self.parent = {}        # slot name -> (tuple name, item index)
        self.composites = {}    # composite name -> its value before the loop (rebuilt with the slots' values)
        for name in [n for n in names if is_composite(inits[n]) or (isinstance(inits[n], tuple) and inits[n]
                     and all(is_runtime(item) or _is_number(item) for item in inits[n]))]:
            value = inits[name]
            if is_composite(value):
                self.composites[name] = value
                slots, items = [f"{name}.{item}" for item in value.item_names()], value.items()
            else:
                slots, items = [f"{name}[{index}]" for index in range(len(value))], value
            self.slots[name] = slots
            at = names.index(name)
            names[at:at + 1] = slots
            del inits[name]
            for index, (slot, item) in enumerate(zip(slots, items)):
                inits[slot] = item
                self.parent[slot] = (name, index)
        self.inits = inits

    def bind(self, scope, values: dict) -> None:
        for name, slots in self.slots.items():
            items = tuple(values.get(slot, self.inits[slot]) for slot in slots)
            scope.assign(name, self.composites[name].with_items(items) if name in self.composites else items)

    def end(self, scope, name):
        if name not in self.parent:
            return scope.names.get(name, _MISSING)
        parent, index = self.parent[name]
        value = scope.names.get(parent, _MISSING)
        if value is _MISSING:
            return _MISSING
        count = len(self.slots[parent])
        if parent in self.composites:
            if not self.composites[parent].same_layout(value):
                raise CompilationError(f"`{parent}` is {described(self.composites[parent])} before the loop but "
                                       f"{described(value)} at the end of the loop body; a loop-carried block "
                                       "pointer must keep its block_shape and order",
                                       scope.locations.get(parent))
            value = value.items()
        elif not isinstance(value, tuple) or len(value) != count:
            raise CompilationError(f"`{parent}` is a tuple of {count} items before the loop but "
                                   f"{described(value)} at the end of the loop body; a loop-carried tuple must keep "
                                   "its length", scope.locations.get(parent))
        if parent in scope.locations:       # errors about the item point at the tuple's last assignment
            scope.locations[name] = scope.locations[parent]
        return value[index]

    def forget(self, scope) -> None:
        for slot in self.parent:
            scope.names.pop(slot, None)
            scope.locations.pop(slot, None)


def _keeps_number(value, kept: set, number) -> bool:
    """Whether `value`, a loop body's value of a variable that starts as the literal `number`, is always that
    number: `number` itself, a value of `kept` (the variable's block arguments: what the loop starts it as), its
    constant, or the result of an inner `if` or loop whose every path gives one of those (`if c: v = 0`, a nested
    loop that assigns `v = 0`), so that the variable is not changed by the loop."""
    if _is_number(value):
        return _same_constant(value, number)
    if not is_runtime(value):       # another compile-time value (None, a tuple): not the number
        return False
    if value in kept:
        return True
    op = value.defining_op
    if op is None:
        return False
    if op.opcode == OpCode.CONSTANT:
        return not isinstance(value.type, BlockType) and _same_constant(op.attrs["value"], number)
    index = op.results.index(value)
    if op.opcode == OpCode.IF:
        return all(region.terminator is not None and _keeps_number(region.terminator.operands[index], kept, number)
                   for region in op.regions)
    if op.opcode in (OpCode.FOR, OpCode.WHILE):
        first = 3 if op.opcode == OpCode.FOR else 0        # a FOR's operands and body arguments start with its range
        if not _keeps_number(op.operands[first + index], kept, number):
            return False
        inner = kept | {region.args[index + (1 if op.opcode == OpCode.FOR else 0)] for region in op.regions}
        return _keeps_number(op.regions[-1].terminator.operands[index], inner, number)
    return False


def _may_be_negative(value) -> bool:
    """A negative literal, or a runtime value of a signed type (range()'s bounds)."""
    return value.type.is_signed if is_runtime(value) else value < 0
