"""Simple statements: assignments (plain, augmented, annotated, tuple unpacking), expression
statements, `assert`, `pass`, and the rejected `break` / `continue`."""

from __future__ import annotations

import ast

from ..errors import CompilationError, UnsupportedError
from ..ir import Value
from ..language import core
from ..language.dtypes import DType, PointerType
from ..language.promotion import printable
from .scope import is_runtime


class StatementsMixin:
    # -- assignments -------------------------------------------------------------------------------
    def visit_Assign(self, node: ast.Assign):
        value = self.visit(node.value)
        for target in node.targets:
            self.assign_target(target, value)

    def visit_AugAssign(self, node: ast.AugAssign):
        if not isinstance(node.target, ast.Name):
            raise UnsupportedError("kernel values are immutable: only names can be updated in place "
                                   "(write memory with dsl.store)")
        current = self.scope.lookup(node.target.id)
        value = self.binary_operation(node.op, current, self.visit(node.value))
        self.scope.assign(node.target.id, value, self.source.location(node))

    def visit_AnnAssign(self, node: ast.AnnAssign):
        if node.value is None:
            raise UnsupportedError("a bare annotation (`x: T` without a value) is not supported in kernels")
        annotation = self.visit(node.annotation)
        value = self.visit(node.value)
        if annotation is core.constexpr:
            if is_runtime(value):
                raise CompilationError(f"`{ast.unparse(node.target)}` is annotated dsl.constexpr but is "
                                       "assigned a runtime value")
        elif isinstance(annotation, (DType, PointerType)):
            value = self.semantic.cast(value, annotation)
        else:
            raise CompilationError(f"unsupported annotation {ast.unparse(node.annotation)}; use dsl.constexpr "
                                   "or a dsl dtype")
        self.assign_target(node.target, value)

    def assign_target(self, target: ast.AST, value) -> None:
        """Bind `value` to an assignment target: a name, or a tuple/list of targets (unpacking)."""
        with self.located(target) as loc:
            if isinstance(target, ast.Name):
                self.scope.assign(target.id, value, loc)
            elif isinstance(target, (ast.Tuple, ast.List)):
                if isinstance(value, core.constexpr):
                    value = value.value
                if isinstance(value, Value) or not isinstance(value, (tuple, list)):
                    raise CompilationError(f"cannot unpack {_describe(value)} into {len(target.elts)} names")
                if any(isinstance(t, ast.Starred) for t in target.elts):
                    raise UnsupportedError("starred assignment (`a, *b = ...`) is not supported in kernels")
                if len(value) != len(target.elts):
                    raise CompilationError(f"cannot unpack {len(value)} values into {len(target.elts)} names")
                for element, item in zip(target.elts, value):
                    self.assign_target(element, item)
            elif isinstance(target, (ast.Subscript, ast.Attribute)):
                raise UnsupportedError("kernel values are immutable: assigning to `x[...]` or `x.attr` is not "
                                       "supported; write memory with dsl.store, or build a new value")
            else:
                raise UnsupportedError(f"cannot assign to {ast.unparse(target)} in a kernel")

    # -- other statements --------------------------------------------------------------------------
    def visit_Expr(self, node: ast.Expr):
        self.visit(node.value)

    def visit_Pass(self, node: ast.Pass):
        return None

    def visit_Assert(self, node: ast.Assert):
        condition = self.visit(node.test)
        message = self.visit(node.msg) if node.msg is not None else ""
        if not isinstance(message, str):
            raise CompilationError("an assert message in a kernel must be a constant string")
        if not is_runtime(condition):
            if not condition:
                raise CompilationError(f"compile-time assertion failed: {message or ast.unparse(node.test)}")
            return
        self.semantic.device_assert(condition, message or f"assertion failed: {ast.unparse(node.test)}")

    def visit_Break(self, node: ast.Break):
        raise UnsupportedError("`break` is not supported in kernels; use a `while` loop whose condition says "
                               "when to stop")

    def visit_Continue(self, node: ast.Continue):
        raise UnsupportedError("`continue` is not supported in kernels; put the rest of the loop body under "
                               "an `if`")


def _describe(value) -> str:
    if isinstance(value, Value):
        return f"a value of type {value.type}"
    return f"{type(value).__name__} {printable(value)}"
