"""Source positions of kernel code and the locations attached to compilation errors.

A kernel's AST comes from `inspect.getsource` + `textwrap.dedent`; `SourceInfo` remembers what
that took away (the first line number in the real file and the indentation removed), so every
AST node maps back to `file:line:col` of the real file and the real source line, which
`CompilationError` prints with a caret under the column.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from typing import Optional

from ..errors import CompilationError
from ..ir import Location


@dataclasses.dataclass(frozen=True)
class SourceInfo:
    """One parsed Python function: its AST, where its text lives, and its global names.

    file: the source file; first_line: the file's line number of the first line `lines[0]`;
    indent: columns removed by dedenting; lines: the original (not dedented) source lines;
    tree: the `ast.FunctionDef`; globals / closure: the names the function body can read (the
    closure is a live view of the function's cells).
    """

    name: str
    file: str
    first_line: int
    indent: int
    lines: tuple
    tree: ast.FunctionDef
    globals: dict
    closure: object

    def location(self, node: Optional[ast.AST]) -> Location:
        """The real-file location of `node` (the function's `def` line when `node` is None)."""
        node = node if node is not None and hasattr(node, "lineno") else self.tree
        relative = node.lineno
        line_text = self.lines[relative - 1] if 0 < relative <= len(self.lines) else ""
        return Location(self.file, self.first_line + relative - 1, node.col_offset + self.indent,
                        self.name, line_text.rstrip("\n"))


def parse_function(fn) -> SourceInfo:
    """Parse the source of the plain Python function `fn`.

    Raises:
        CompilationError: the source cannot be found (a function typed into a REPL or built with
            `exec`), or it is not a `def` (a lambda).
    """
    try:
        lines, first_line = inspect.getsourcelines(fn)
        file = inspect.getsourcefile(fn) or inspect.getfile(fn)
    except (OSError, TypeError) as e:
        raise CompilationError(f"cannot read the source of `{getattr(fn, '__name__', fn)}` ({e}); kernels must "
                               "be defined with `def` in a file") from None
    text = "".join(lines)
    dedented = textwrap.dedent(text)
    indent = _leading_spaces(text) - _leading_spaces(dedented)
    tree = ast.parse(dedented)
    function = tree.body[0] if tree.body else None
    if not isinstance(function, ast.FunctionDef):
        raise CompilationError(f"`{fn.__name__}` must be defined with `def` (not a lambda) to be compiled")
    return SourceInfo(fn.__name__, file, first_line, indent, tuple(lines), function, fn.__globals__,
                      _ClosureView(fn))


class _ClosureView:
    """The variables a function captured from enclosing functions, read from its cells when looked up
    (so a kernel compiled later sees their current values)."""

    def __init__(self, fn):
        self._cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))

    def get(self, name: str, default=None):
        cell = self._cells.get(name)
        if cell is None:
            return default
        try:
            return cell.cell_contents
        except ValueError:   # an empty cell: the enclosing variable is not assigned yet
            return default

    def __contains__(self, name: str) -> bool:
        return self.get(name, _EMPTY) is not _EMPTY

    def __getitem__(self, name: str):
        value = self.get(name, _EMPTY)
        if value is _EMPTY:
            raise KeyError(name)
        return value


_EMPTY = object()


def _leading_spaces(text: str) -> int:
    for line in text.splitlines():
        if line.strip():
            return len(line) - len(line.lstrip())
    return 0


def with_location(error: CompilationError, loc: Location) -> CompilationError:
    """`error` itself when it already has a location, else a copy of it located at `loc`."""
    if error.loc is not None and getattr(error.loc, "line", 0) > 0:
        return error
    located = type(error)(error.message, loc)
    located.__cause__ = error.__cause__
    return located
