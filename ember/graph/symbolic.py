"""Symbolic dimensions: sizes known by name until a call binds them.

A dimension of a `TensorType` is an `int` or a `Dim`, an integer expression of named sizes
(`?b`, `?b*128`, `?s+1`, `div(?s,2)`): a sum of products of atoms with integer
coefficients, in one normal form, so that equal expressions compare equal and hash alike.
Atoms are symbols, and the floor divisions, remainders, minima and maxima that do not
simplify. Arithmetic with ints and other dims is closed (an expression that folds to a
constant is an `int`), so shape inference written for ints works on dims unchanged.

A symbol stands for a size of at least 1, and at most its bound where its graph declares
one (`size_bounds`: `?s <= 512`; else 2**62). What depends on a value (a comparison, `range`, an int
attribute that must be a number) is decided from those bounds when it can be (`?b*128 >=
128` holds; `min(?s, 512)` is `?s` under `?s <= 512`) and raises `SymbolicShapeError`
when it cannot (`?b >= 2`): the op that
needs it names itself in the message, and the frontend specializes instead. A symbol is
never taken to be 1 where that decides a broadcast: `[?b]` with `[?c]` does not broadcast
(nor does NumPy's rule say it might); `[?b]` with `[1]` does.
"""

from __future__ import annotations

import math
import re
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Union

from ember.errors import ShapeError

_SYMBOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# An atom: a symbol's name, or (op, a, b) for an op in div, mod, min, max over dims
Atom = str | tuple
Monomial = tuple  # of atoms, sorted by _atom_key
DimLike = Union[int, "Dim"]  # noqa: UP007  (a forward reference: | needs the class)


class SymbolicShapeError(ShapeError):
    """A size known only at call time where a number is needed, or a comparison of sizes
    that their bounds do not decide. `symbols` names the sizes that were needed as numbers
    (empty where unknown): fixing just those may be enough to compile."""

    def __init__(self, message: str, symbols: Iterable[str] = ()):
        super().__init__(message)
        self.symbols = frozenset(symbols)


class Dim:
    """An integer expression of named sizes (see the module docstring); immutable."""

    __slots__ = ("terms", "_hash")

    def __init__(self, terms: Mapping[Monomial, int]):
        self.terms: tuple[tuple[Monomial, int], ...] = tuple(sorted(
            ((m, c) for m, c in terms.items() if c), key=lambda mc: _monomial_key(mc[0])))
        self._hash = hash(self.terms)

    # -- construction ---------------------------------------------------------------------
    @staticmethod
    def _of(terms: Mapping[Monomial, int]) -> DimLike:
        """The expression of `terms`, or its int when it is constant."""
        nonzero = {m: c for m, c in terms.items() if c}
        if not nonzero:
            return 0
        if set(nonzero) == {()}:
            return nonzero[()]
        return Dim(nonzero)

    @staticmethod
    def _atom(atom: Atom) -> Dim:
        return Dim({(atom,): 1})

    # -- arithmetic -------------------------------------------------------------------------
    def __add__(self, other: Any) -> DimLike:
        if not _is_dimlike(other):
            return NotImplemented
        terms = dict(self.terms)
        for m, c in _terms(other).items():
            terms[m] = terms.get(m, 0) + c
        return Dim._of(terms)

    __radd__ = __add__

    def __neg__(self) -> DimLike:
        return Dim._of({m: -c for m, c in self.terms})

    def __sub__(self, other: Any) -> DimLike:
        if not _is_dimlike(other):
            return NotImplemented
        return self + (-other)

    def __rsub__(self, other: Any) -> DimLike:
        if not _is_dimlike(other):
            return NotImplemented
        return (-self) + other

    def __mul__(self, other: Any) -> DimLike:
        if not _is_dimlike(other):
            return NotImplemented
        terms: dict[Monomial, int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in _terms(other).items():
                m = tuple(sorted(m1 + m2, key=_atom_key))
                terms[m] = terms.get(m, 0) + c1 * c2
        return Dim._of(terms)

    __rmul__ = __mul__

    def __floordiv__(self, other: Any) -> DimLike:
        return floor_div(self, other) if _is_dimlike(other) else NotImplemented

    def __rfloordiv__(self, other: Any) -> DimLike:
        return floor_div(other, self) if _is_dimlike(other) else NotImplemented

    def __mod__(self, other: Any) -> DimLike:
        return modulo(self, other) if _is_dimlike(other) else NotImplemented

    def __rmod__(self, other: Any) -> DimLike:
        return modulo(other, self) if _is_dimlike(other) else NotImplemented

    # -- comparison -------------------------------------------------------------------------
    def __eq__(self, other: Any) -> bool:
        if isinstance(other, Dim):
            return self.terms == other.terms
        return False  # a Dim is never an int: constants fold to ints

    def __ne__(self, other: Any) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return self._hash

    def __ge__(self, other: Any) -> bool:
        if not _is_dimlike(other):
            return NotImplemented
        return _decide_at_least(self - other, 0, f"{self} >= {_text(other)}")

    def __gt__(self, other: Any) -> bool:
        if not _is_dimlike(other):
            return NotImplemented
        return _decide_at_least(self - other, 1, f"{self} > {_text(other)}")

    def __le__(self, other: Any) -> bool:
        if not _is_dimlike(other):
            return NotImplemented
        return _decide_at_least(other - self, 0, f"{self} <= {_text(other)}")

    def __lt__(self, other: Any) -> bool:
        if not _is_dimlike(other):
            return NotImplemented
        return _decide_at_least(other - self, 1, f"{self} < {_text(other)}")

    def __bool__(self) -> bool:
        return _decide_at_least(self, 1, f"{self} != 0")

    def __index__(self) -> int:
        raise SymbolicShapeError(f"the size {self} is known only at call time, and a number"
                                 " is needed here", self.symbols)

    __int__ = __index__

    # -- inspection -------------------------------------------------------------------------
    @property
    def symbols(self) -> frozenset[str]:
        """The names of the symbols the expression reads."""
        names: set[str] = set()
        for m, _ in self.terms:
            for atom in m:
                names |= _atom_symbols(atom)
        return frozenset(names)

    def evaluate(self, env: Mapping[str, DimLike]) -> DimLike:
        """The expression's value with each symbol's value from `env` (numbers, or other
        dims: a renaming)."""
        total = 0
        for m, c in self.terms:
            product = c
            for atom in m:
                product *= _evaluate_atom(atom, env)
            total += product
        return total

    def as_symbol(self) -> str | None:
        """The name when the expression is one bare symbol."""
        if len(self.terms) == 1:
            (m, c), = self.terms
            if c == 1 and len(m) == 1 and isinstance(m[0], str):
                return m[0]
        return None

    def __str__(self) -> str:
        parts = []
        for m, c in self.terms:
            if not m:
                text = str(abs(c))
            else:
                factors = [_atom_text(a) for a in m]
                text = "*".join(([str(abs(c))] if abs(c) != 1 else []) + factors)
            parts.append(("-" if c < 0 else "+") + text)
        joined = "".join(parts)
        return joined[1:] if joined.startswith("+") else joined

    def __repr__(self) -> str:
        return f"Dim({self})"

    def __reduce__(self):  # pickled (cache keys, processes) as its terms
        return (Dim, (dict(self.terms),))


def symbol(name: str) -> Dim:
    """The size named `name` (letters, digits and `_`)."""
    if not _SYMBOL_NAME.match(name):
        raise ShapeError(f"'{name}' is not a symbol name (letters, digits and _)")
    return Dim._atom(name)


def is_symbolic(dim: Any) -> bool:
    return isinstance(dim, Dim)


def is_static_shape(shape: Iterable[DimLike]) -> bool:
    return not any(isinstance(d, Dim) for d in shape)


def floor_div(a: DimLike, b: DimLike) -> DimLike:
    """a // b for sizes: exact where the terms divide, else an atom."""
    if not isinstance(a, Dim) and not isinstance(b, Dim):
        return a // b
    if isinstance(b, int):
        if b <= 0:
            raise SymbolicShapeError(f"a size divided by {b}")
        if b == 1:
            return a
        terms = _terms(a)
        constant = terms.pop((), 0)
        if all(c % b == 0 for c in terms.values()):  # (b*q + c) // b = q + c // b
            return Dim._of({m: c // b for m, c in terms.items()}) + constant // b
    elif a == b:
        return 1
    elif (quotient := _divide_exactly(a, b)) is not None:
        return quotient
    return Dim._atom(("div", a, b))


def modulo(a: DimLike, b: DimLike) -> DimLike:
    """a % b for sizes: exact where the terms divide, else an atom."""
    if not isinstance(a, Dim) and not isinstance(b, Dim):
        return a % b
    if isinstance(b, int):
        if b <= 0:
            raise SymbolicShapeError(f"a size modulo {b}")
        terms = _terms(a)
        constant = terms.pop((), 0)
        if all(c % b == 0 for c in terms.values()):
            return constant % b
    elif a == b or _divide_exactly(a, b) is not None:
        return 0
    return Dim._atom(("mod", a, b))


def _divide_exactly(a: DimLike, b: Dim) -> DimLike | None:
    """a / b when b is one term (c * atoms) that divides every term of a, else None."""
    if len(b.terms) != 1:
        return None
    (divisor, c), = b.terms
    quotient: dict[Monomial, int] = {}
    for m, coefficient in _terms(a).items():
        rest = list(m)
        for atom in divisor:
            if atom not in rest:
                return None
            rest.remove(atom)
        if coefficient % c:
            return None
        quotient[tuple(rest)] = coefficient // c
    return Dim._of(quotient)


def dim_min(a: DimLike, b: DimLike) -> DimLike:
    """The smaller of two sizes: decided where their bounds tell, else an atom."""
    try:
        return a if a <= b else b
    except SymbolicShapeError:
        return Dim._atom(("min",) + tuple(sorted((a, b), key=_text)))


def dim_max(a: DimLike, b: DimLike) -> DimLike:
    """The larger of two sizes: decided where their bounds tell, else an atom."""
    try:
        return a if a >= b else b
    except SymbolicShapeError:
        return Dim._atom(("max",) + tuple(sorted((a, b), key=_text)))


# The value cost models take a symbolic size to have (never what code relies on): sizes
# left symbolic are batches and sequences, which are taken to be many.
SIZE_HINT = 64


def size_hint(dim: DimLike) -> int:
    """A number standing for `dim` in a heuristic (fusion's costs): its value with every
    symbol at SIZE_HINT. Never for a decision that code relies on."""
    if not isinstance(dim, Dim):
        return int(dim)
    return int(dim.evaluate(dict.fromkeys(dim.symbols, SIZE_HINT)))


def evaluate(dim: DimLike, env: Mapping[str, DimLike]) -> DimLike:
    return dim.evaluate(env) if isinstance(dim, Dim) else int(dim)


def bind(value: Any, env: Mapping[str, DimLike]) -> Any:
    """`value` with every Dim in it (through tuples and lists) evaluated in `env`."""
    if isinstance(value, Dim):
        return value.evaluate(env)
    if isinstance(value, tuple):
        return tuple(bind(v, env) for v in value)
    if isinstance(value, list):
        return [bind(v, env) for v in value]
    return value


def symbols_in(value: Any) -> frozenset[str]:
    """The symbols that a dim, or a tuple or list of them, reads."""
    if isinstance(value, Dim):
        return value.symbols
    if isinstance(value, (tuple, list)):
        return frozenset().union(*(symbols_in(v) for v in value))
    return frozenset()


# -- text ----------------------------------------------------------------------------------
def parse_dim(text: str) -> DimLike:
    """The dim written `text` (as printed: `?b*128+1`, `div(?s,2)`, `7`)."""
    from ember.lexer import TokenStream

    ts = TokenStream(text, "<dim>")
    dim = read_dim(ts)
    if ts.peek.kind != "eof":
        raise ts.error(f"unexpected {ts.peek.text!r} after the dim")
    return dim


def read_dim(ts) -> DimLike:
    """A dim expression from a TokenStream: sums and differences of products of numbers,
    `?symbols`, `div/mod/min/max(a, b)` and parenthesized dims."""
    value = _read_product(ts)
    while True:
        token = ts.peek
        if token.kind == "punct" and token.text in ("+", "-"):
            ts.next()
            rhs = _read_product(ts)
            value = value + rhs if token.text == "+" else value - rhs
        elif token.kind == "number" and token.text.startswith("-"):  # `?b-2*?s` lexes `-2`
            ts.next()
            value = value + _read_product(ts, _parse_int(ts, token))
        else:
            return value


def _read_product(ts, first: DimLike | None = None) -> DimLike:
    value = _read_atom(ts) if first is None else first
    while ts.accept("*"):
        value = value * _read_atom(ts)
    return value


def _read_atom(ts) -> DimLike:
    token = ts.next()
    if token.kind == "number":
        return _parse_int(ts, token)
    if token.kind == "dim":
        return symbol(token.text[1:])
    if token.kind == "punct" and token.text == "-":  # `-?b`
        return -_read_atom(ts)
    if token.kind == "punct" and token.text == "(":
        value = read_dim(ts)
        ts.expect(")")
        return value
    if token.kind == "ident" and token.text in _FUNCTIONS:
        ts.expect("(")
        a = read_dim(ts)
        ts.expect(",")
        b = read_dim(ts)
        ts.expect(")")
        return _FUNCTIONS[token.text](a, b)
    raise ts.error(f"expected a dimension (a number, ?name or div/mod/min/max), found"
                   f" {token.text or 'the end'!r}", token)


def _parse_int(ts, token) -> int:
    try:
        return int(token.text)
    except ValueError:
        raise ts.error(f"expected an integer dimension, found {token.text!r}", token) from None


_FUNCTIONS = {"div": floor_div, "mod": modulo, "min": dim_min, "max": dim_max}


# -- internals -----------------------------------------------------------------------------
def _is_dimlike(x: Any) -> bool:
    return isinstance(x, Dim) or (isinstance(x, int) and not isinstance(x, bool))


def _terms(x: DimLike) -> dict[Monomial, int]:
    return dict(x.terms) if isinstance(x, Dim) else ({(): int(x)} if x else {})


def _text(x: DimLike) -> str:
    return str(x)


def _atom_text(atom: Atom) -> str:
    if isinstance(atom, str):
        return "?" + atom
    op, a, b = atom
    return f"{op}({_text(a)},{_text(b)})"


def _atom_key(atom: Atom) -> tuple:
    return (0, atom) if isinstance(atom, str) else (1, _atom_text(atom))


def _monomial_key(m: Monomial) -> tuple:
    return (len(m) == 0, -len(m), [_atom_key(a) for a in m])


def _atom_symbols(atom: Atom) -> set[str]:
    if isinstance(atom, str):
        return {atom}
    return set(symbols_in(atom[1]) | symbols_in(atom[2]))


def _evaluate_atom(atom: Atom, env: Mapping[str, int]) -> int:
    if isinstance(atom, str):
        if atom not in env:
            raise SymbolicShapeError(f"no value for the size ?{atom}", {atom})
        return env[atom]
    op, a, b = atom
    return _FUNCTIONS[op](evaluate(a, env), evaluate(b, env))


def _interval(x: DimLike) -> tuple[float, float]:
    """The least and the greatest value of `x`: each symbol between 1 and its bound (the
    active `size_bounds`; none: unbounded), div, mod, min and max of sizes from theirs."""
    if not isinstance(x, Dim):
        return x, x
    low = high = 0.0
    for m, c in x.terms:
        m_low, m_high = 1.0, 1.0
        for atom in m:  # every atom is a size, at least 0: the product's ends multiply
            a_low, a_high = _atom_interval(atom)
            m_low *= a_low
            m_high = 0.0 if 0 in (m_high, a_high) else m_high * a_high
        ends = (c * m_low, c * m_high)
        low, high = low + min(ends), high + max(ends)
    return low, high


def _atom_interval(atom: Atom) -> tuple[float, float]:
    if isinstance(atom, str):
        return 1, _BOUNDS.get().get(atom, LARGEST_SIZE)
    op, a, b = atom
    (a_low, a_high), (b_low, b_high) = _interval(a), _interval(b)
    if op == "div":
        return (max(0, math.floor(a_low / b_high)) if b_high < math.inf else 0,
                math.floor(a_high / b_low) if a_high < math.inf else math.inf)
    if op == "mod":
        return 0, max(0, min(a_high, b_high - 1))
    if op == "min":
        return min(a_low, b_low), min(a_high, b_high)
    return max(a_low, b_low), max(a_high, b_high)


def _decide_at_least(x: DimLike, least: int, claim: str) -> bool:
    """Whether x >= least, from the symbols' bounds; SymbolicShapeError when they do not
    tell."""
    low, high = _interval(x)
    if low >= least:
        return True
    if high < least:
        return False
    raise SymbolicShapeError(f"whether {claim} depends on the sizes at call time",
                             symbols_in(x))


def definitely(compare: Callable[..., bool], *sizes: DimLike) -> bool:
    """Whether compare(*sizes) (`operator.lt`, ...) holds for every value the sizes' bounds
    allow: False when they do not decide it."""
    try:
        return bool(compare(*sizes))
    except SymbolicShapeError:
        return False


# The bound of a size its graph does not bound: sizes index memory in i64, and
# `x[i:sys.maxsize]` (PyTorch's "to the end") must read as the end.
LARGEST_SIZE = 1 << 62

# The upper bounds of the sizes whose types are being inferred: a graph's `size_bounds`,
# set by the builder and the verifier around each op's inference (as a ShapeEnv is).
_BOUNDS: ContextVar[Mapping[str, int]] = ContextVar(
    "ember_size_bounds", default=types.MappingProxyType({}))


@contextmanager
def size_bounds(bounds: Mapping[str, int]) -> Iterator[None]:
    """Within: each size named in `bounds` is at most its value."""
    if not bounds:
        yield
        return
    token = _BOUNDS.set({**_BOUNDS.get(), **bounds})
    try:
        yield
    finally:
        _BOUNDS.reset(token)
