"""The EmberError hierarchy: every error a user can cause is one of these."""

from __future__ import annotations


class EmberError(Exception):
    """Base class of every error Ember raises on bad input."""


class UnsupportedOpError(EmberError):
    """An op (or an op/dtype/attribute combination) that Ember cannot handle."""


class ShapeError(EmberError):
    """Operand shapes or dtypes that an op does not accept."""


class BadAttributeError(EmberError):
    """A missing, unknown or ill-typed op attribute."""


class VerificationError(EmberError):
    """IR that breaks a structural rule (use before definition, type mismatch, ...)."""


class InterpreterError(EmberError):
    """A run-time failure of the reference interpreter (bad input values, index out of range)."""


class PassError(EmberError):
    """A pass failed; the message names the pass and where a reproducer was written."""


class ParseError(EmberError):
    """Malformed IR text. Carries the 1-based line and column of the offending token."""

    def __init__(self, message: str, line: int, column: int, source_name: str = "<text>"):
        self.message = message
        self.line = line
        self.column = column
        self.source_name = source_name
        super().__init__(f"{source_name}:{line}:{column}: {message}")



class CompileError(EmberError):
    """A compile stage after the graph passes (lowering, LLVM) failed; the message names the
    stage and where a reproducer was written."""


class ScheduleError(EmberError):
    """A schedule primitive that is illegal on the kernel given, or a malformed schedule."""
