"""The op registry: one `OpDef` per op, holding everything Ember knows about it.

An op's definition gives its arity, attribute schema, shape/dtype inference, NumPy
reference semantics, its traits and category (what passes may assume about it) and, for
composite ops, a decomposition into primitives. A primitive op's lowering lives in the loop
level's registry (ember/loops/lower/core.py), which may import the graph but not the reverse;
docs/graph-ir.md ("Adding an op") lists every step, and tests check that none is missed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember.dtypes import DType
from ember.errors import BadAttributeError, ShapeError, UnsupportedOpError
from ember.graph.ir import TensorType
from ember.graph.symbolic import Dim

REQUIRED = object()  # marks an attribute that has no default

# How fusion treats an op (ember/graph/fusion/policy.py describes each); "opaque" is never fused.
CATEGORIES = ("elementwise", "index map", "reduction", "contraction", "opaque")
# Declared traits and what they promise. Passes read them instead of keeping name lists.
TRAITS = {
    "pure": "no side effects: equal ops on equal operands give equal results",
    "elementwise": "the value at an index depends on the operands at that (broadcast) index",
    "commutative": "the two operands may be swapped",
    "composite": "has a decomposition into other ops",
    "isolated": "its regions see no values of the enclosing scopes",
    "raw_bits": "the interpreter passes f16/bf16 operands unwidened",
    "expensive": "tens of cycles per element: fusion does not recompute it at a broadcast",
    "transcendental": "expensive math that fused kernels compute once and store",
}

# Attribute kinds and the Python values that hold them.
ATTR_KINDS = ("int", "float", "bool", "str", "dtype", "ints", "floats", "dense", "symbol")


@dataclass(frozen=True)
class Attr:
    """One attribute of an op's schema: its kind, default and (for `str`) allowed values."""

    kind: str
    default: Any = REQUIRED
    choices: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        assert self.kind in ATTR_KINDS, self.kind


@dataclass(eq=False)
class OpDef:
    """Everything about one op. See docs/graph-ir.md for how to add one.

    infer(types, attrs) -> TensorType | list[TensorType]; region ops get `regions=` too.
    reference(*arrays, **attrs) -> ndarray | tuple of ndarrays (None for region ops,
    which the interpreter runs itself).
    decompose(builder, operands, attrs) -> list[Value], for composite ops.
    traits: names from TRAITS; category: one of CATEGORIES.
    """

    name: str
    arity: tuple[int, int | None]  # (min, max) operands; max None = variadic
    infer: Callable[..., Any]
    reference: Callable[..., Any] | None
    attrs: dict[str, Attr] = field(default_factory=dict)
    num_regions: int = 0
    traits: frozenset[str] = frozenset()
    decompose: Callable[..., Any] | None = None
    summary: str = ""
    family: str = ""
    category: str = "opaque"

    def __post_init__(self) -> None:
        assert self.category in CATEGORIES, f"{self.name}: category {self.category!r}"
        unknown = self.traits - set(TRAITS)
        assert not unknown, f"{self.name}: unknown traits {sorted(unknown)}"
        assert "transcendental" not in self.traits or "expensive" in self.traits, \
            f"{self.name}: a transcendental op is expensive too"

    @property
    def is_composite(self) -> bool:
        return self.decompose is not None

    def check_arity(self, count: int) -> None:
        lo, hi = self.arity
        if count < lo or (hi is not None and count > hi):
            want = f"{lo}" if lo == hi else f"{lo} to {hi}" if hi is not None else f"at least {lo}"
            raise ShapeError(f"takes {want} operands, got {count}")

    def normalize_attrs(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Check `attrs` against the schema, fill in defaults and convert to canonical values."""
        unknown = set(attrs) - set(self.attrs)
        if unknown:
            raise BadAttributeError(
                f"no attribute(s) {', '.join(sorted(unknown))}"
                f" (it has: {', '.join(self.attrs) or 'none'})"
            )
        out: dict[str, Any] = {}
        for key, spec in self.attrs.items():
            if key in attrs:
                out[key] = convert_attr(key, spec, attrs[key])
            elif spec.default is REQUIRED:
                raise BadAttributeError(f"needs attribute '{key}'")
            else:
                out[key] = spec.default
        return out

    def infer_types(self, types: Sequence[TensorType], attrs: dict[str, Any],
                    regions: Sequence[Any] = ()) -> list[TensorType]:
        self.check_arity(len(types))
        result = (self.infer(list(types), attrs, regions=regions) if self.num_regions
                  else self.infer(list(types), attrs))
        return [result] if isinstance(result, TensorType) else list(result)


def convert_attr(key: str, spec: Attr, value: Any) -> Any:
    """The canonical Python value of one attribute, or a BadAttributeError naming it."""

    def bad(why: str) -> BadAttributeError:
        return BadAttributeError(f"attribute '{key}': {why}, got {value!r}")

    kind = spec.kind
    if value is None and spec.default is None:
        return None
    try:
        if kind == "int":
            if isinstance(value, Dim):  # a size known at call time
                return value
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise bad("expected an integer")
            return int(value)
        if kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                raise bad("expected a number")
            return float(value)
        if kind == "bool":
            if not isinstance(value, (bool, np.bool_)):
                raise bad("expected a bool")
            return bool(value)
        if kind == "str":
            if not isinstance(value, str):
                raise bad("expected a string")
            if spec.choices and value not in spec.choices:
                raise bad(f"expected one of {', '.join(spec.choices)}")
            return value
        if kind == "symbol":
            if not isinstance(value, str) or not value:
                raise bad("expected a constant name")
            return value
        if kind == "dtype":
            if isinstance(value, DType):
                return value
            if isinstance(value, str) and value in DType.__members__:
                return DType(value)
            raise bad("expected a dtype")
        if kind == "ints":
            items = tuple(value)
            if any(isinstance(v, bool) or not isinstance(v, (int, np.integer, Dim))
                   for v in items):
                raise bad("expected a list of integers")
            return tuple(v if isinstance(v, Dim) else int(v) for v in items)
        if kind == "floats":
            items = tuple(value)
            if any(isinstance(v, bool) or not isinstance(v, (int, float, np.number))
                   for v in items):
                raise bad("expected a list of numbers")
            return tuple(float(v) for v in items)
        if kind == "dense":
            if not isinstance(value, np.ndarray):
                raise bad("expected a NumPy array")
            from ember.dtypes import from_numpy

            from_numpy(value.dtype)  # raises for element types Ember does not have
            array = value if value.flags.c_contiguous else value.copy(order="C")
            array.flags.writeable = False
            return array
    except (TypeError, ValueError):
        raise bad(f"expected {kind}") from None
    raise AssertionError(kind)


_REGISTRY: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    assert opdef.name not in _REGISTRY, f"op {opdef.name} registered twice"
    _REGISTRY[opdef.name] = opdef
    return opdef


def define(name: str, *, arity: int | tuple[int, int | None], infer: Callable[..., Any],
           reference: Callable[..., Any] | None, attrs: dict[str, Attr] | None = None,
           num_regions: int = 0, traits: Sequence[str] = (),
           decompose: Callable[..., Any] | None = None, summary: str = "",
           family: str = "", category: str = "opaque") -> OpDef:
    """Define and register an op. `arity` is a count or a (min, max) pair."""
    if isinstance(arity, int):
        arity = (arity, arity)
    return register(OpDef(name, arity, infer, reference, dict(attrs or {}), num_regions,
                          frozenset(traits), decompose, summary, family, category))


def get_opdef(name: str) -> OpDef:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnsupportedOpError(f"unknown op 'graph.{name}'") from None


def has_op(name: str) -> bool:
    return name in _REGISTRY


def all_opdefs() -> list[OpDef]:
    return sorted(_REGISTRY.values(), key=lambda d: (d.family, d.name))
