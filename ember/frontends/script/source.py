"""Reading a scripted function's source: its AST with positions in the user's file.

`inspect.getsource` gives the function's lines, possibly indented (a method, a nested
def); they are dedented to parse, and every node's line and column are shifted back so
that errors point where the user looks, not at a line of the function.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ember.errors import ScriptError


@dataclass
class FunctionSource:
    """A function's definition node (positions in file coordinates) and its file's lines."""

    fn: Callable[..., Any]
    tree: ast.FunctionDef
    file: str
    lines: list[str]  # the function's lines as they are in the file
    first_line: int  # the file line of lines[0]

    def source_line(self, line: int) -> str:
        index = line - self.first_line
        return self.lines[index].rstrip("\n") if 0 <= index < len(self.lines) else ""

    def error(self, cls: type[ScriptError], node: ast.AST, message: str,
              notes: tuple[tuple[ast.AST | None, str], ...] = (),
              length: int | None = None) -> ScriptError:
        """A `cls` positioned at `node` (its span, or `length` characters from its start),
        with a note for each (node, message) pair of `notes`."""
        line, column, end_column = self.span(node, length)
        rendered = []
        for note_node, note in notes:
            if note_node is None or not hasattr(note_node, "lineno"):
                continue
            nl, nc, ne = self.span(note_node)
            rendered.append((note, nl, nc, ne, self.source_line(nl).strip() and
                             self.source_line(nl), self.file))
        return cls(message, self.file, line, column, end_column, self.source_line(line),
                   tuple(rendered))

    def span(self, node: ast.AST, length: int | None = None) -> tuple[int, int, int]:
        """(line, 1-based column, exclusive 1-based end column) of `node` on its first line."""
        line = node.lineno
        column = node.col_offset + 1
        if length is not None:
            end = column + length
        elif getattr(node, "end_lineno", line) == line and node.end_col_offset is not None:
            end = node.end_col_offset + 1
        else:
            end = len(self.source_line(line)) + 1
        return line, column, max(end, column + 1)


def read_source(fn: Callable[..., Any]) -> FunctionSource:
    """The parsed definition of `fn`, or a ScriptError when Python kept no source for it."""
    name = getattr(fn, "__qualname__", repr(fn))
    try:
        lines, first_line = inspect.getsourcelines(fn)
        file = inspect.getsourcefile(fn) or inspect.getfile(fn)
    except (OSError, TypeError) as e:
        raise ScriptError(
            f"cannot read the source of {name} ({e}): @ember.script compiles a function's"
            " source, so define it in a file (not with exec, eval or at the interactive"
            " prompt)") from None
    text = "".join(lines)
    dedented = textwrap.dedent(text)
    indent = _indent_width(lines)
    try:
        module = ast.parse(dedented)
    except SyntaxError as e:
        raise ScriptError(f"cannot parse the source of {name}: {e}") from None
    tree = module.body[0] if module.body else None
    if not isinstance(tree, ast.FunctionDef):
        raise ScriptError(f"@ember.script needs a function defined with `def`; {name} is not"
                          " one (a lambda or an async def?)")
    ast.increment_lineno(tree, first_line - 1)
    for node in ast.walk(tree):
        if hasattr(node, "col_offset"):
            node.col_offset += indent
            if getattr(node, "end_col_offset", None) is not None:
                node.end_col_offset += indent
    first_line = max(first_line, 1)
    return FunctionSource(fn, tree, file, lines, first_line)


def _indent_width(lines: list[str]) -> int:
    """The width of the common leading whitespace that textwrap.dedent removes."""
    widths = [len(line) - len(line.lstrip()) for line in lines if line.strip()]
    return min(widths, default=0)
