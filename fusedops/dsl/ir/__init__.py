"""The block IR: op codes, values and operations, builder, printer, verifier."""

from .builder import Builder
from .core import UNKNOWN_LOCATION, Block, Function, Location, Operation, Value
from .ops import OpCode
from .printer import print_function
from .verifier import VerificationError, verify

__all__ = ["Builder", "Block", "Function", "Location", "Operation", "Value", "OpCode", "print_function",
           "verify", "VerificationError", "UNKNOWN_LOCATION"]
