"""Expressions: constants, names, operators, comparisons, boolean logic, conditional expressions,
subscripts, attributes and tuples.

An expression evaluates to an IR `Value` (runtime) or a Python object (compile time). Operations on
compile-time operands only are evaluated in Python, with Python's semantics (so `-7 // 2 == -4` for
constexprs); as soon as one operand is a runtime value the operation is built through `Semantics`,
with the kernel language's rules (C-style `//` and `%`, weakly typed literals, broadcasting).
"""

from __future__ import annotations

import ast
import operator
import types

from ..errors import CompilationError, UnsupportedError
from ..ir import Block, OpCode, Value
from ..ir.ops import SIDE_EFFECTS
from ..language import block_builtins, core
from ..language.block_pointers import BLOCK_POINTER_METHODS, BlockPointer
from ..language.composite import is_composite
from ..language.descriptors import DESCRIPTOR_METHODS, TensorDescriptor
from ..language.dtypes import BlockType, int1, shape_of
from ..language.promotion import printable
from ..language.shape_ops import described, holds_runtime
from ..language import libdevice, triton_math
from ..language.triton_names import missing_libdevice_hint, missing_math_hint, missing_name_hint
from .scope import check_global, class_attribute_reads, instance_attribute_reads, is_callable_instance, is_runtime

_BINARY = {
    ast.Add: ("add", operator.add), ast.Sub: ("sub", operator.sub), ast.Mult: ("mul", operator.mul),
    ast.Div: ("truediv", operator.truediv), ast.FloorDiv: ("floordiv", operator.floordiv),
    ast.Mod: ("mod", operator.mod), ast.BitAnd: ("and", operator.and_), ast.BitOr: ("or", operator.or_),
    ast.BitXor: ("xor", operator.xor), ast.LShift: ("lshift", operator.lshift),
    ast.RShift: ("rshift", operator.rshift), ast.Pow: ("pow", operator.pow),
    ast.MatMult: ("matmul", operator.matmul),
}
_COMPARE = {
    ast.Eq: ("eq", operator.eq), ast.NotEq: ("ne", operator.ne), ast.Lt: ("lt", operator.lt),
    ast.LtE: ("le", operator.le), ast.Gt: ("gt", operator.gt), ast.GtE: ("ge", operator.ge),
    ast.Is: (None, operator.is_), ast.IsNot: (None, operator.is_not),
    ast.In: (None, lambda a, b: a in b), ast.NotIn: (None, lambda a, b: a not in b),
}
# Ops that make `a if c else b` branch (only the chosen arm runs): memory reads and every side effect.
_OBSERVABLE = SIDE_EFFECTS | frozenset({OpCode.LOAD, OpCode.DESCRIPTOR_LOAD})
_UNARY = {ast.USub: ("neg", operator.neg), ast.UAdd: ("pos", operator.pos), ast.Invert: ("invert", operator.invert),
          ast.Not: ("not", operator.not_)}


class BoundMethod:
    """`x.to`, `x.reshape`, ...: a builtin with its first argument (the block value) bound."""

    __slots__ = ("function", "value")

    def __init__(self, function, value):
        self.function, self.value = function, value


def python_evaluate(symbol: str, function, *operands):
    """Evaluate a compile-time operation in Python, turning Python's errors into CompilationErrors."""
    try:
        return function(*operands)
    except Exception as e:   # ZeroDivisionError, TypeError, ...: the user's constexpr arithmetic failed
        shown = ", ".join(described(o) for o in operands)
        raise CompilationError(f"compile-time `{symbol}` of {shown} failed: {e}") from None


class ExpressionsMixin:
    def visit_Constant(self, node: ast.Constant):
        if isinstance(node.value, (bytes, complex)) or node.value is Ellipsis:
            raise UnsupportedError(f"{type(node.value).__name__} constants are not supported in kernels")
        return node.value

    def visit_JoinedStr(self, node: ast.JoinedStr) -> str:
        """An f-string of compile-time values (constexprs, numbers, dtypes, strings), formatted at compile time as
        Python formats them: Triton's `tl.static_print(f"BLOCK={BLOCK}")`, `tl.static_assert(c, f"...")`.

        Raises:
            UnsupportedError: a kernel value in it (its value exists only when the kernel runs).
            CompilationError: a format spec the value refuses.
        """
        pieces = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                pieces.append(str(part.value))
                continue
            value = self.visit(part.value)
            if isinstance(value, core.constexpr):
                value = value.value
            if is_runtime(value) or holds_runtime(value):
                raise UnsupportedError(f"f-strings can format only compile-time values, got {described(value)} (its "
                                       "value exists only when the kernel runs): pass it to dsl.device_print "
                                       "(dsl.static_print shows its type)")
            spec = self.visit(part.format_spec) if part.format_spec is not None else ""
            converted = {ord("s"): str, ord("r"): repr, ord("a"): ascii}.get(part.conversion, lambda v: v)(value)
            try:
                pieces.append(format(converted, spec))
            except (TypeError, ValueError) as e:
                raise CompilationError(f"f-string format {spec!r} of {printable(value)} failed: {e}") from None
        return "".join(pieces)

    def visit_Name(self, node: ast.Name):
        return self.scope.lookup(node.id)

    def visit_Tuple(self, node):
        items = []
        for element in node.elts:
            if isinstance(element, ast.Starred):
                value = self.visit(element.value)
                if isinstance(value, Value) or not isinstance(value, (tuple, list)):
                    raise CompilationError("only compile-time tuples can be unpacked with `*`")
                items.extend(value)
            else:
                items.append(self.visit(element))
        return tuple(items)

    visit_List = visit_Tuple

    # -- operators ---------------------------------------------------------------------------------
    def visit_BinOp(self, node: ast.BinOp):
        return self.binary_operation(node.op, self.visit(node.left), self.visit(node.right))

    def binary_operation(self, op: ast.operator, left, right):
        name, function = _BINARY[type(op)]
        if not is_runtime(left) and not is_runtime(right):
            return python_evaluate(name, function, left, right)
        if name == "pow":
            return libdevice.power_operator(self.semantic, left, right)
        if name == "matmul":
            return self.semantic.dot(left, right)
        return self.semantic.binary(name, self._operand(left), self._operand(right))

    def _operand(self, value):
        if isinstance(value, core.constexpr):
            value = value.value
        if not isinstance(value, Value) and not isinstance(value, (bool, int, float)):
            shown = described(value) if holds_runtime(value) or is_composite(value) \
                else f"{type(value).__name__} {printable(value)}"
            raise CompilationError(f"{shown} cannot be combined with a kernel value")
        return value

    def visit_UnaryOp(self, node: ast.UnaryOp):
        operand = self.visit(node.operand)
        name, function = _UNARY[type(node.op)]
        if not is_runtime(operand):
            return python_evaluate(name, function, operand)
        return self.semantic.unary(name, operand)

    def visit_Compare(self, node: ast.Compare):
        return self._compare_chain(self.visit(node.left), list(zip(node.ops, node.comparators)))

    def _compare_chain(self, left, links):
        """`left op1 c1 op2 c2 ...` as Python: each comparator evaluated once, the chain stopping at the first
        false link (a compile-time false; a runtime scalar one through `_runtime_bool_op`'s short circuit when
        the rest of the chain loads or stores)."""
        (op, comparator), rest = links[0], links[1:]
        right = self.visit(comparator)
        current = self._compare(op, left, right)
        if not rest:
            return current
        if not is_runtime(current):
            return self._compare_chain(right, rest) if current else current
        return self._runtime_bool_op(True, current, lambda: self._compare_chain(right, rest))

    def _compare(self, op: ast.cmpop, left, right):
        name, function = _COMPARE[type(op)]
        if not isinstance(op, (ast.Is, ast.IsNot)) and (is_composite(left) or is_composite(right)):
            # Python would compare the objects by identity (a compile-time answer about runtime positions)
            shown = described(left if is_composite(left) else right)
            raise CompilationError(f"{shown} cannot be compared (`{_SYMBOLS.get(type(op), 'in')}`); compare the "
                                   "offsets you advance it by instead")
        if not isinstance(op, (ast.Is, ast.IsNot)) and (_holds_runtime(left) or _holds_runtime(right)):
            # Python would compare the IR values inside by identity (a compile-time answer to a runtime question)
            if isinstance(op, (ast.In, ast.NotIn)):
                raise CompilationError("`in` / `not in` need compile-time operands")
            raise CompilationError(f"`{_SYMBOLS[type(op)]}` of tuples holding runtime values is not supported; "
                                   "compare the items one by one")
        if not is_runtime(left) and not is_runtime(right):
            return python_evaluate(type(op).__name__, function, left, right)
        if name is None:
            if isinstance(op, (ast.Is, ast.IsNot)):
                return function(left, right)    # a runtime value is never None nor a constexpr
            raise CompilationError("`in` / `not in` need compile-time operands")
        return self.semantic.binary(name, self._operand(left), self._operand(right))

    def visit_BoolOp(self, node: ast.BoolOp):
        is_and = isinstance(node.op, ast.And)
        result = self.visit(node.values[0])
        for operand in node.values[1:]:
            if not is_runtime(result):
                if bool(result) != is_and:      # `False and x`, `True or x`: x is not evaluated
                    return result
                result = self.visit(operand)
            else:
                result = self._runtime_bool_op(is_and, result, operand)
        return result

    def _runtime_bool_op(self, is_and: bool, left: Value, node):
        """`left and <node>` / `left or <node>` for a runtime `left` (node: an AST expression, or a function
        that builds the right side). Blocks, and a right side that reads or
        writes no memory, are evaluated elementwise on both sides (int1); a scalar `left` whose right side loads
        or stores short-circuits as in Python (an `if`: `i < n and dsl.load(p + i) > 0` loads only where
        i < n), as the ternary does."""
        arm = Block()
        with self.builder.insert_into(arm):     # node: an AST expression, or a function building the value
            right = self._operand(node() if callable(node) else self.visit(node))
        scalar = not isinstance(left.type, BlockType) and not isinstance(getattr(right, "type", None), BlockType)
        if not scalar or not any(op.opcode in _OBSERVABLE or op.regions for op in arm.walk()):
            for op in arm.ops:
                self.builder.block.append(op)
            return self.semantic.logical("and" if is_and else "or", left, right)
        condition = self.semantic.to_condition(left)
        with self.builder.insert_into(arm):
            self.builder.create(OpCode.YIELD, [self.semantic.to_condition(right)], [])
        skipped = Block()           # `False and ...` is False, `True or ...` is True
        with self.builder.insert_into(skipped):
            self.builder.create(OpCode.YIELD, [self.semantic.constant(not is_and, int1)], [])
        regions = [arm, skipped] if is_and else [skipped, arm]
        return self.builder.create(OpCode.IF, [condition], [int1], regions=regions).result

    def visit_IfExp(self, node: ast.IfExp):
        condition = self.visit(node.test)
        if not is_runtime(condition):
            return self.visit(node.body if condition else node.orelse)
        if isinstance(condition.type, BlockType):
            raise CompilationError("the condition of `a if c else b` is a block; use dsl.where(c, a, b) for an "
                                   "elementwise choice")
        condition = self.semantic.to_condition(condition)
        blocks, values = (Block(), Block()), []
        for block, arm in zip(blocks, (node.body, node.orelse)):
            with self.builder.insert_into(block):
                values.append(self._operand(self.visit(arm)))
        if not any(nested.opcode in _OBSERVABLE or nested.regions for block in blocks for nested in block.walk()):
            for block in blocks:            # pure arms: both run, one is selected (no branch)
                for op in block.ops:
                    self.builder.block.append(op)
            return self.semantic.where(condition, *values)
        # an arm reads or writes memory (or has control flow): only the chosen one runs, as in Python
        with self.builder.insert_into(Block()):     # the result's type, as `where` would give it
            result_type = self.semantic.where(condition, *values).type
        element = result_type.element if isinstance(result_type, BlockType) else result_type
        for block, value in zip(blocks, values):
            with self.builder.insert_into(block):
                value = self.semantic.cast(self.semantic.to_value(value, element), element)
                value = self.semantic.broadcast_to(value, shape_of(result_type))
                self.builder.create(OpCode.YIELD, [value], [])
        return self.builder.create(OpCode.IF, [condition], [result_type], regions=list(blocks)).result

    # -- subscripts and attributes -----------------------------------------------------------------
    def visit_Subscript(self, node: ast.Subscript):
        value = self.visit(node.value)
        index = self.visit(node.slice)
        if is_runtime(value):
            return self.semantic.subscript(value, index)
        if is_runtime(index) or (isinstance(index, tuple) and any(is_runtime(i) for i in index)):
            raise CompilationError("a compile-time tuple cannot be indexed with a runtime value; use "
                                   "dsl.static_range for the loop so that the index is a constexpr")
        return python_evaluate("[]", operator.getitem, value, index)

    def visit_Slice(self, node: ast.Slice):
        parts = [self.visit(part) if part is not None else None for part in (node.lower, node.upper, node.step)]
        if any(is_runtime(part) for part in parts):
            raise CompilationError("slice bounds must be compile-time values")
        return slice(*parts)

    def visit_Attribute(self, node: ast.Attribute):
        return self.attribute(self.visit(node.value), node)

    def attribute(self, value, node: ast.Attribute):
        """`value.<node.attr>`, `value` being what `node.value` evaluated to."""
        name = node.attr
        if is_runtime(value):
            return self.value_attribute(value, name)
        if isinstance(value, TensorDescriptor):
            if name not in DESCRIPTOR_METHODS:
                raise CompilationError(f"tensor descriptors have no attribute `{name}`; they have .load(offsets), "
                                       ".store(offsets, value) and .atomic_add(offsets, value)")
            return BoundMethod(DESCRIPTOR_METHODS[name], value)
        if isinstance(value, BlockPointer):
            if name not in BLOCK_POINTER_METHODS:
                raise CompilationError(f"block pointers have no attribute `{name}`; they have .advance(offsets) "
                                       "(read and write them with dsl.load / dsl.store)")
            return BoundMethod(BLOCK_POINTER_METHODS[name], value)
        if not hasattr(value, name):
            if value is triton_math:
                owner, hint = "module `fusedops.dsl.math`", missing_math_hint(name)
            elif value is libdevice:
                owner, hint = "module `fusedops.dsl.extra.cuda.libdevice`", missing_libdevice_hint(name)
            else:
                owner = f"module `{value.__name__}`" if isinstance(value, types.ModuleType) else type(value).__name__
                hint = missing_name_hint(name) if getattr(value, "__name__", None) == "fusedops.dsl" else ""
            raise CompilationError(f"{owner} has no attribute `{name}`{hint}")
        if name.startswith("__"):
            raise UnsupportedError(f"cannot read `{name}` in a kernel")
        result = getattr(value, name)
        if isinstance(value, types.ModuleType):
            # (a name a module's __getattr__ supplies, PEP 562, is not in its namespace: not recorded)
            namespace = vars(value)
            reads = [(namespace, name, namespace[name])] if name in namespace else []
        elif isinstance(value, type):
            reads = class_attribute_reads(value, name)
        elif is_callable_instance(value):
            reads = instance_attribute_reads(value, name)
        else:
            return result
        checked = check_global(f"{ast.unparse(node)}", result)
        if self.scope.on_global is not None and not isinstance(result, types.FunctionType):
            # `module.NAME`, `Class.NAME` and `instance.NAME` (of a callable global) are read like globals: a later
            # rebinding of the attribute (or of a module global to another module) recompiles the kernel
            for table, key, obj in reads:
                self.scope.on_global(table, key, obj)
        return checked

    def value_attribute(self, value: Value, name: str):
        if name == "shape":
            return shape_of(value.type)
        if name == "dtype":
            return value.type.scalar
        if name == "T":                 # Triton's x.T: the transpose of a 2-D block
            return self.semantic.trans(value)
        if name in block_builtins.VALUE_METHODS:
            return BoundMethod(block_builtins.VALUE_METHODS[name], value)
        methods = ", ".join(f".{m}()" for m in block_builtins.VALUE_METHODS)
        raise CompilationError(f"kernel values have no attribute `{name}`; they have .shape, .dtype, .T and {methods}")


def _holds_runtime(value) -> bool:
    """Whether `value` is a compile-time tuple or list with a runtime value among its items (at any depth)."""
    return isinstance(value, (tuple, list)) and any(is_runtime(item) or _holds_runtime(item) for item in value)


_SYMBOLS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
