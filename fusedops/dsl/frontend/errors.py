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
import linecache
import os
import textwrap
import threading
import tokenize
from typing import Optional

from ..errors import CompilationError
from ..ir import Location

# CPython 3.11 / 3.12 keep ast.parse's recursion depth in interpreter-wide state, so two threads parsing at once
# (a switch inside the AST construction) can fail with "SystemError: AST constructor recursion depth mismatch"
# (cpython gh-106905): kernels compiled from several threads parse their sources one at a time. A fork waits
# for a parse in progress (the lock is released in both processes).
_PARSE_LOCK = threading.Lock()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_PARSE_LOCK.acquire, after_in_parent=_PARSE_LOCK.release,
                        after_in_child=_PARSE_LOCK.release)


def parse(text: str) -> ast.Module:
    """ast.parse(text), one thread at a time (see _PARSE_LOCK). Raises SyntaxError as ast.parse does."""
    with _PARSE_LOCK:
        return ast.parse(text)


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


@dataclasses.dataclass(frozen=True)
class SourceText:
    """The text of the file that defines a function, as it was when the function was decorated (read then,
    parsed at its first compile): an edit of the file after the import neither changes the kernel nor
    shifts another function's lines into it. `lines` is empty where the file cannot be read (`error`)."""

    file: str
    lines: tuple
    error: str = ""


def read_source(fn) -> SourceText:
    """The SourceText of the plain Python function `fn` (linecache's lines of its file: cheap, one read
    per file); of the function it wraps where it has a `__wrapped__` (functools.wraps), as
    inspect.getsource reads."""
    fn = inspect.unwrap(fn)
    try:
        file = inspect.getsourcefile(fn) or inspect.getfile(fn)
    except (OSError, TypeError) as e:
        return SourceText("", (), str(e))
    linecache.checkcache(file)
    lines = linecache.getlines(file, fn.__globals__)
    return SourceText(file, tuple(lines), "" if lines else f"could not get the source of {file}")


def parse_function(fn, text: Optional[SourceText] = None) -> SourceInfo:
    """Parse the source of the plain Python function `fn` (the one it wraps, see read_source) from `text`
    (read_source(fn) by default).

    Raises:
        CompilationError: the source cannot be found (a function typed into a REPL or built with
            `exec`), it is not a `def` (a lambda), or the text at the function's line defines another
            function (its file changed before it was read).
    """
    name = getattr(fn, "__name__", fn)
    text = read_source(fn) if text is None else text
    fn = inspect.unwrap(fn)     # the function whose body, globals and closure the kernel is
    first = fn.__code__.co_firstlineno      # the first decorator's line, or the def's
    if not text.lines or not 0 < first <= len(text.lines):
        reason = text.error or f"line {first} is past the end of {text.file}"
        raise CompilationError(f"cannot read the source of `{name}` ({reason}); kernels must be defined with "
                               "`def` in a file")
    try:
        lines = inspect.getblock(list(text.lines[first - 1:]))
    except (IndexError, SyntaxError, tokenize.TokenError):     # from a line that no longer starts the function
        lines = []
    source = "".join(lines)
    dedented = textwrap.dedent(source)
    indent = _leading_spaces(source) - _leading_spaces(dedented)
    try:
        tree = parse(dedented)
    except SyntaxError:
        tree = None
    function = tree.body[0] if tree is not None and tree.body else None
    if not isinstance(function, ast.FunctionDef):
        if fn.__name__ == "<lambda>":
            raise CompilationError(f"`{name}` must be defined with `def` (not a lambda) to be compiled")
        raise CompilationError(f"`{name}` must be defined with `def` to be compiled (line {first} of {text.file} "
                               "does not start it: was the file changed after it was imported?)")
    if function.name != fn.__code__.co_name:
        raise CompilationError(f"the source of `{name}` at line {first} of {text.file} now defines "
                               f"`{function.name}`: the file changed after it was imported; re-import it")
    return SourceInfo(fn.__name__, text.file, first, indent, tuple(lines), function, fn.__globals__,
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
