"""The frontend: Python AST of a `@dsl.jit` function -> block IR, specialized on a signature."""

from .errors import SourceInfo, SourceText, parse_function, read_source
from .generator import GeneratedKernel, generate

__all__ = ["generate", "GeneratedKernel", "parse_function", "read_source", "SourceInfo", "SourceText"]
