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


class InternalError(EmberError):
    """A failure inside Ember on input it should have refused or handled (a bug), reported
    with where it happened; the original exception is its cause."""


class DataError(EmberError):
    """A value that compiled code found it cannot compute with while running (an index out
    of range, an integer division by zero), named with the op it came from."""


class ResourceError(EmberError):
    """Work that would need more memory than the machine has, refused before allocating."""


class DeviceError(EmberError):
    """No GPU, no driver, or a failed driver call: what a device run needs and lacks."""


class ScheduleError(EmberError):
    """A schedule primitive that is illegal on the kernel given, or a malformed schedule."""


class ScriptError(EmberError):
    """An error in a function compiled by `@ember.script`, positioned in the user's file.

    The message reads `file.py:LINE:COL: error: message`, then the source line with a
    `^^^^` span under COL..END_COL, then one `file.py:LINE:COL: note: ...` line (and its
    source) for each second location. `line` and `column` are 1-based; `end_column` is
    exclusive. A function whose source cannot be read gets a ScriptError without a position.
    """

    def __init__(self, message: str, file: str | None = None, line: int | None = None,
                 column: int | None = None, end_column: int | None = None,
                 source_line: str | None = None,
                 notes: tuple[tuple[str, int, int, int, str, str], ...] = ()):
        self.message = message
        self.file, self.line, self.column, self.end_column = file, line, column, end_column
        self.source_line = source_line
        self.notes = notes  # (message, line, column, end_column, source line, file)
        super().__init__(self.render())

    def render(self) -> str:
        if self.line is None:
            return self.message
        text = [_located(self.file, self.line, self.column, self.end_column, self.source_line,
                         "error", self.message)]
        for message, line, column, end_column, source, file in self.notes:
            text.append(_located(file, line, column, end_column, source, "note", message))
        return "\n".join(text)


def _located(file, line, column, end_column, source, kind, message) -> str:
    head = f"{file}:{line}:{column}: {kind}: {message}"
    if not source:
        return head
    width = max(1, (end_column or column + 1) - column)
    return f"{head}\n    {source}\n    {' ' * (column - 1)}{'^' * width}"


class ScriptSyntaxError(ScriptError):
    """A Python construct that `@ember.script` does not support (raised at decoration time
    where the syntax alone shows it)."""


class ScriptTypeError(ScriptError):
    """Types that do not fit: operands, a carried value whose shape or dtype changes, a
    value used as the wrong kind (an array where a Python int is needed)."""


class ScriptNameError(ScriptError):
    """A name that is not defined, may be undefined, or names something a scripted
    function cannot use."""


class ScriptInternalError(ScriptError):
    """A bug of the scripting frontend, positioned at the statement it was emitting."""
