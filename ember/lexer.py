"""The tokenizer shared by the text forms of every IR level.

Tokens: `%name` values, `@name` symbols, `?name` sizes (symbolic dims), identifiers
(which may contain dots: `graph.add`), numbers (`-3`, `1.5e-05`, `inf`, `-inf`, `nan`),
double-quoted strings with JSON escapes, and punctuation. `//` starts a comment to the
end of the line.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ember.errors import ParseError

_TOKEN = re.compile(
    r"""
    (?P<space>[ \t\r\n]+|//[^\n]*)
  | (?P<value>%[A-Za-z0-9_.$]+)
  | (?P<symbol>@[A-Za-z0-9_.$]+)
  | (?P<dim>\?[A-Za-z_][A-Za-z0-9_]*)
  | (?P<number>-?(?:\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+|inf\b|nan\b))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.$]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<punct>->|[=:,()\[\]{}<>^+*-])
    """,
    re.VERBOSE,
)


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # value, symbol, dim, number, ident, string, punct, eof
    text: str
    line: int
    column: int


def tokenize(text: str, source_name: str = "<text>") -> list[Token]:
    tokens = []
    pos, line, line_start = 0, 1, 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            what = ("unterminated string literal" if text[pos] == '"'
                    else f"unexpected character {text[pos]!r}")
            raise ParseError(what, line, pos - line_start + 1, source_name)
        kind = match.lastgroup
        if kind != "space":
            tokens.append(Token(kind, match.group(), line, pos - line_start + 1))
        newlines = match.group().count("\n")
        if newlines:
            line += newlines
            line_start = match.start() + match.group().rindex("\n") + 1
        pos = match.end()
    tokens.append(Token("eof", "", line, pos - line_start + 1))
    return tokens


class TokenStream:
    """A cursor over tokens with the `expect`/`accept` helpers of a recursive-descent parser."""

    def __init__(self, text: str, source_name: str = "<text>"):
        self.source_name = source_name
        self.tokens = tokenize(text, source_name)
        self.pos = 0

    @property
    def peek(self) -> Token:
        return self.tokens[self.pos]

    def peek_at(self, offset: int) -> Token:
        return self.tokens[min(self.pos + offset, len(self.tokens) - 1)]

    def next(self) -> Token:
        token = self.tokens[self.pos]
        if token.kind != "eof":
            self.pos += 1
        return token

    def error(self, message: str, token: Token | None = None) -> ParseError:
        token = token or self.peek
        return ParseError(message, token.line, token.column, self.source_name)

    def at(self, text: str) -> bool:
        token = self.peek
        return token.text == text and token.kind in ("punct", "ident")

    def accept(self, text: str) -> bool:
        if self.at(text):
            self.pos += 1
            return True
        return False

    def expect(self, text: str) -> Token:
        if not self.at(text):
            raise self.error(f"expected '{text}', found {describe(self.peek)}")
        return self.next()

    def expect_kind(self, kind: str, what: str) -> Token:
        if self.peek.kind != kind:
            raise self.error(f"expected {what}, found {describe(self.peek)}")
        return self.next()

    def expect_int(self, what: str = "an integer") -> int:
        token = self.peek
        if token.kind != "number" or not re.fullmatch(r"-?\d+", token.text):
            raise self.error(f"expected {what}, found {describe(token)}")
        self.next()
        return int(token.text)

    def expect_number(self) -> int | float:
        token = self.expect_kind("number", "a number")
        return parse_number(token.text)

    def expect_string(self) -> str:
        token = self.expect_kind("string", "a string")
        try:
            return json.loads(token.text)
        except ValueError:
            raise self.error("malformed string literal", token) from None


def parse_number(text: str) -> int | float:
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return float(text)


def describe(token: Token) -> str:
    return "end of input" if token.kind == "eof" else f"'{token.text}'"


def quote(text: str) -> str:
    return json.dumps(text)
