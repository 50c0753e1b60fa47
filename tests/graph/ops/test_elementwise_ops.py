"""Elementwise ops, `where`, `cast` and `constant`: type inference and semantics vs PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember import BadAttributeError, Builder, DType, ShapeError, interpret, parse_graph, print_graph
from ember.graph.ops.elementwise import BINARY_OPS, UNARY_OPS

RNG = np.random.default_rng(7)


def run(build, *inputs: np.ndarray):
    """Build a graph with inputs of the given arrays' types; check the text round trip; run."""
    b = Builder("t")
    values = [b.input(f"x{i}", DType(_dtype_name(a)), a.shape) for i, a in enumerate(inputs)]
    out = build(b, *values)
    b.output(*(out if isinstance(out, tuple) else (out,)))
    graph = b.build()
    text = print_graph(graph)
    assert print_graph(parse_graph(text)) == text
    results = interpret(graph, list(inputs))
    return results if isinstance(out, tuple) else results[0]


def _dtype_name(a: np.ndarray) -> str:
    from ember.dtypes import from_numpy

    return from_numpy(a.dtype).value


# Inputs inside each function's domain, and the torch function to compare with.
UNARY_CASES = {
    "neg": (torch.neg, (-3, 3)), "abs": (torch.abs, (-3, 3)), "sign": (torch.sign, (-3, 3)),
    "exp": (torch.exp, (-5, 5)), "expm1": (torch.expm1, (-2, 2)), "log": (torch.log, (0.1, 5)),
    "log1p": (torch.log1p, (-0.5, 5)), "sqrt": (torch.sqrt, (0, 9)),
    "rsqrt": (torch.rsqrt, (0.1, 9)), "reciprocal": (torch.reciprocal, (0.5, 3)),
    "sin": (torch.sin, (-4, 4)), "cos": (torch.cos, (-4, 4)), "tan": (torch.tan, (-1.2, 1.2)),
    "asin": (torch.asin, (-1, 1)), "acos": (torch.acos, (-1, 1)), "atan": (torch.atan, (-5, 5)),
    "sinh": (torch.sinh, (-3, 3)), "cosh": (torch.cosh, (-3, 3)), "tanh": (torch.tanh, (-4, 4)),
    "asinh": (torch.asinh, (-5, 5)), "acosh": (torch.acosh, (1, 5)),
    "atanh": (torch.atanh, (-0.9, 0.9)), "erf": (torch.erf, (-3, 3)),
    "sigmoid": (torch.sigmoid, (-30, 30)), "floor": (torch.floor, (-5, 5)),
    "ceil": (torch.ceil, (-5, 5)), "round": (torch.round, (-5, 5)),
    "trunc": (torch.trunc, (-5, 5)), "isnan": (torch.isnan, None), "isinf": (torch.isinf, None),
    "not": (torch.logical_not, "bool"), "bitwise_not": (torch.bitwise_not, "int"),
}


def test_every_unary_op_has_a_case() -> None:
    assert set(UNARY_CASES) == set(UNARY_OPS)


def _unary_input(name: str) -> np.ndarray:
    domain = UNARY_CASES[name][1]
    if domain == "bool":
        return RNG.integers(0, 2, (3, 5)).astype(bool)
    if domain == "int":
        return RNG.integers(-100, 100, (3, 5)).astype(np.int32)
    if domain is None:
        return np.array([0.0, np.nan, np.inf, -np.inf, 1.5, -2.0], np.float32)
    lo, hi = domain
    x = RNG.uniform(lo, hi, (3, 5)).astype(np.float32)
    if name == "round":
        x[0, :3] = [0.5, 1.5, -2.5]  # half to even
    return x


@pytest.mark.parametrize("name", sorted(UNARY_CASES))
def test_unary_semantics_against_torch(name: str) -> None:
    x = _unary_input(name)
    got = run(lambda b, v: getattr(b, name)(v), x)
    want = UNARY_CASES[name][0](torch.from_numpy(x)).numpy()
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["exp", "tanh", "sigmoid", "erf", "sqrt"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_unary_half_precision_rounds_once(name: str, dtype) -> None:
    x32 = RNG.uniform(0.1, 3, (4, 4)).astype(np.float32)
    xt = torch.from_numpy(x32).to(dtype)
    x = xt.float().numpy().astype(DType.f16.np if dtype == torch.float16 else DType.bf16.np)
    got = run(lambda b, v: getattr(b, name)(v), x)
    # Computed in f32 and rounded once: exactly torch's f32 result rounded to the type.
    want = UNARY_CASES[name][0](xt.float()).to(dtype).float().numpy()
    np.testing.assert_array_equal(got.astype(np.float32), want)


def test_unary_type_inference_and_errors() -> None:
    b = Builder("t")
    f = b.input("f", DType.f32, (2, 3))
    i = b.input("i", DType.i32, (2, 3))
    assert b.exp(f).type == f.type
    assert b.isnan(f).dtype is DType.bool
    assert b.abs(i).type == i.type
    with pytest.raises(ShapeError, match=r"graph.exp: operand has dtype i32, expected one of"):
        b.exp(i)
    with pytest.raises(ShapeError, match="graph.not: operand has dtype f32"):
        getattr(b, "not")(f)
    with pytest.raises(ShapeError, match="graph.bitwise_not: operand has dtype f32"):
        b.bitwise_not(f)
    with pytest.raises(ShapeError, match="takes 1 operands, got 2"):
        b.neg(f, f)


def _torch_div(a, b):
    if a.dtype.is_floating_point:
        return torch.div(a, b)
    return torch.div(a, b, rounding_mode="trunc")


BINARY_CASES = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": _torch_div,
    "pow": torch.pow, "max": torch.maximum, "min": torch.minimum, "mod": torch.remainder,
    "fmod": torch.fmod, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le,
    "gt": torch.gt, "ge": torch.ge, "and": torch.logical_and, "or": torch.logical_or,
    "xor": torch.logical_xor, "bitwise_and": torch.bitwise_and,
    "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor,
    "shl": torch.bitwise_left_shift, "shr": torch.bitwise_right_shift,
}
BOOL_ONLY = {"and", "or", "xor"}
INT_ONLY = {"bitwise_and", "bitwise_or", "bitwise_xor", "shl", "shr"}


def test_every_binary_op_has_a_case() -> None:
    assert set(BINARY_CASES) == set(BINARY_OPS)


def _binary_inputs(name: str, dtype: str):
    shape_a, shape_b = (2, 3, 4), (3, 1)  # broadcasting on both sides
    if name in BOOL_ONLY:
        return (RNG.integers(0, 2, shape_a).astype(bool), RNG.integers(0, 2, shape_b).astype(bool))
    if dtype == "i32":
        a = RNG.integers(-50, 50, shape_a).astype(np.int32)
        b = RNG.integers(1, 9, shape_b).astype(np.int32) * RNG.choice([-1, 1], shape_b)
        if name in ("shl", "shr"):
            b = np.abs(b).astype(np.int32)
        if name == "pow":
            a, b = np.clip(a, -6, 6).astype(np.int32), np.abs(b).astype(np.int32) % 4
        return a, b.astype(np.int32)
    a = RNG.uniform(-3, 3, shape_a).astype(np.float32)
    b = RNG.uniform(0.5, 2, shape_b).astype(np.float32) * RNG.choice([-1, 1], shape_b)
    if name == "pow":
        a = np.abs(a)
    b[0, 0] = a[0, 0, 0] if name in ("eq", "ne", "le", "ge") else b[0, 0]
    return a, b.astype(np.float32)


BINARY_PARAMS = [(n, d) for n in sorted(BINARY_CASES) for d in ("f32", "i32")
                 if not (n in INT_ONLY and d == "f32") and not (n in BOOL_ONLY and d == "i32")]


@pytest.mark.parametrize(("name", "dtype"), BINARY_PARAMS)
def test_binary_semantics_against_torch(name: str, dtype: str) -> None:
    a, b = _binary_inputs(name, dtype)
    got = run(lambda bld, x, y: getattr(bld, name)(x, y), a, b)
    want = BINARY_CASES[name](torch.from_numpy(a), torch.from_numpy(b)).numpy()
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_integer_division_truncates_and_mod_follows_the_divisor() -> None:
    a = np.array([7, -7, 7, -7], np.int64)
    b = np.array([2, 2, -2, -2], np.int64)
    assert list(run(lambda bld, x, y: bld.div(x, y), a, b)) == [3, -3, -3, 3]
    assert list(run(lambda bld, x, y: bld.mod(x, y), a, b)) == [1, 1, -1, -1]
    assert list(run(lambda bld, x, y: bld.fmod(x, y), a, b)) == [1, -1, 1, -1]
    u = np.array([200, 7], np.uint8)
    assert list(run(lambda bld, x, y: bld.add(x, y), u, u)) == [144, 14]  # wraps


def test_max_min_propagate_nan() -> None:
    a = np.array([np.nan, 1.0, 2.0], np.float32)
    b = np.array([0.0, np.nan, 1.0], np.float32)
    np.testing.assert_array_equal(run(lambda bld, x, y: bld.max(x, y), a, b), [np.nan, np.nan, 2])


def test_binary_type_inference_and_errors() -> None:
    b = Builder("t")
    x = b.input("x", DType.f32, (2, 1, 4))
    y = b.input("y", DType.f32, (3, 1))
    i = b.input("i", DType.i32, (4,))
    t = b.input("t", DType.bool, (4,))
    assert b.add(x, y).shape == (2, 3, 4)
    assert b.lt(x, y).type.dtype is DType.bool
    with pytest.raises(ShapeError, match="operands must have one dtype"):
        b.add(x, i)
    with pytest.raises(ShapeError, match=r"shapes \[2, 1, 4\] and \[3, 2\] do not broadcast"):
        b.mul(x, b.input("z", DType.f32, (3, 2)))
    with pytest.raises(ShapeError, match="has dtype bool"):
        b.add(t, t)
    with pytest.raises(ShapeError, match="has dtype i32"):
        getattr(b, "and")(i, i)
    with pytest.raises(ShapeError, match="has dtype f32"):
        b.shl(x, x)


def test_where_semantics_and_errors() -> None:
    c = RNG.integers(0, 2, (3, 1)).astype(bool)
    a = RNG.standard_normal((1, 4)).astype(np.float32)
    e = RNG.standard_normal((3, 4)).astype(np.float32)
    got = run(lambda b, *v: b.where(*v), c, a, e)
    want = torch.where(torch.from_numpy(c), torch.from_numpy(a), torch.from_numpy(e)).numpy()
    np.testing.assert_array_equal(got, want)
    b = Builder("t")
    f = b.input("f", DType.f32, (3,))
    with pytest.raises(ShapeError, match="condition has dtype f32"):
        b.where(f, f, f)
    with pytest.raises(ShapeError, match="the two branches must have one dtype"):
        b.where(b.lt(f, f), f, b.input("i", DType.i32, (3,)))


@pytest.mark.parametrize(("src", "dst"), [
    ("f32", "i32"), ("f32", "u8"), ("f32", "bool"), ("bool", "f32"), ("f32", "f16"),
    ("f32", "bf16"), ("i64", "f32"), ("f16", "f32"), ("bf16", "f32"), ("f64", "f32"),
    ("i32", "i8"), ("i32", "bool"),
])
def test_cast_semantics_against_torch(src: str, dst: str) -> None:
    torch_types = {"f32": torch.float32, "i32": torch.int32, "u8": torch.uint8,
                   "bool": torch.bool, "f16": torch.float16, "bf16": torch.bfloat16,
                   "i64": torch.int64, "f64": torch.float64, "i8": torch.int8}
    base = torch.tensor([0.0, 1.7, -2.6, 3.0, 0.3, 1e-3, 250.0, -0.0])
    if src in ("u8",) or dst == "u8":
        base = base.abs()
    xt = base.to(torch_types[src])
    x = xt.float().numpy().astype(DType(src).np)
    got = run(lambda b, v: b.cast(v, to=DType(dst)), x)
    want = xt.to(torch_types[dst])
    assert got.dtype == DType(dst).np
    np.testing.assert_array_equal(got.astype(np.float64), want.double().numpy())


def test_cast_type_inference_and_errors() -> None:
    b = Builder("t")
    x = b.input("x", DType.f32, (2,))
    assert b.cast(x, to=DType.i8).type.dtype is DType.i8
    assert b.cast(x, to="bf16").type.dtype is DType.bf16
    with pytest.raises(BadAttributeError, match="needs attribute 'to'"):
        b.cast(x)
    with pytest.raises(BadAttributeError, match="attribute 'to': expected a dtype"):
        b.cast(x, to="f128")


def test_constant_inline_and_table() -> None:
    b = Builder("t")
    small = b.constant(np.array([1, 2, 3], np.int16))
    large = b.constant(np.arange(100, dtype=np.float64), name="ramp")
    assert small.producer.attrs["value"] is not None and large.producer.attrs["name"] == "ramp"
    b.output(small, large)
    got = interpret(parse_graph(print_graph(b.build())), [])
    assert got[0].dtype == np.int16 and list(got[0]) == [1, 2, 3]
    np.testing.assert_array_equal(got[1], np.arange(100))
    with pytest.raises(ShapeError, match="exactly one of 'value'"):
        b.op("constant", [], {})
    with pytest.raises(BadAttributeError, match="attribute 'value': expected a NumPy array"):
        b.op("constant", [], {"value": [1, 2]})
    with pytest.raises(Exception, match="unsupported element type"):
        b.constant(np.array(["a"]))
