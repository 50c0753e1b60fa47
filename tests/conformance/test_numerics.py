"""Numerics per op family against each frontend's semantics: NaN and infinity propagation,
signed zeros, denormals, integer overflow, float-to-integer conversion, division by zero.

The torch door: each family is one module applying its ops to a grid of special values,
compiled to native code by `ember.compile` and compared with eager PyTorch element by
element: NaN where eager has NaN, the same infinities, the same sign on a zero, denormals
kept (no flush to zero). A result that differs from eager's f32 may instead match eager's
f64 result rounded to f32: Ember is sometimes the more accurate (sigmoid(-88.8) is a
denormal that eager's f32 kernel gives as 0; remainder(1, 1e-40) is NaN in eager's f32,
whose quotient overflows).

The ONNX door: against the ONNX reference implementation (`onnx.reference`, which the
specification's tests are written against), and ONNX Runtime where the two agree.

Left open on purpose (docs/reliability.md, "Numerics"):
- which zero max, min, relu, clamp, fmax and fmin give for -0 and +0 (`nsz` on
  `llvm.maximum`: ordering the zeros cost x86 three instructions a vector); also the zeros
  of a cumulative sum's first element and of sort's ties;
- the sign of a zero remainder: Python's and NumPy's (the divisor's), where eager gives the
  dividend's.
An integer division by zero fails the run with a DataError, as eager raises
(tests/runtime/test_checks.py tests the checks).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.config import Config

CPU = Config(executor="cpu", disk_cache=False)
DENORMAL = 1e-40  # f32 denormals: the smallest normal f32 is 1.2e-38
SPECIALS = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -2.5, math.inf, -math.inf, math.nan,
            DENORMAL, -DENORMAL, 1e-45, 1e-38, 3e38, -3e38, 88.8, -88.8, -104.0, 100.0]


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def grid() -> tuple[torch.Tensor, torch.Tensor]:
    """Every pair of special values: a[i, j] = SPECIALS[i], b[i, j] = SPECIALS[j]."""
    s = torch.tensor(SPECIALS)
    n = len(SPECIALS)
    return s[:, None].expand(n, n).contiguous(), s[None, :].expand(n, n).contiguous()


def mismatches(got: np.ndarray, want: np.ndarray, zero_signs: bool) -> np.ndarray:
    """Where `got` differs from `want` in kind (NaN, infinity, zero, denormal), in a zero's
    sign (with `zero_signs`), or in value by more than 2e-6 relative (a few f32 ulps; three
    denormal steps near zero)."""
    if got.dtype.kind != "f":
        return got != want
    got, want = got.astype(np.float64), want.astype(np.float64)
    bad = np.isnan(got) != np.isnan(want)
    both = ~np.isnan(got) & ~np.isnan(want)
    bad |= both & (np.isinf(got) | np.isinf(want)) & (got != want)
    finite = both & np.isfinite(got) & np.isfinite(want)
    bad |= finite & ((got == 0) != (want == 0))
    bad |= finite & (np.abs(got - want) > 2e-6 * np.abs(want) + 4.2e-45)
    if zero_signs:
        bad |= finite & (got == 0) & (want == 0) & (np.signbit(got) != np.signbit(want))
    return bad


def check_family(ops: dict, *inputs: torch.Tensor, open_zeros=()) -> None:
    """All of `ops` (name -> fn of `inputs`) compiled as one module, against eager (f32, or
    f64 rounded to f32 where Ember is the more accurate)."""
    names = list(ops)
    module = Fn(lambda *xs: tuple(ops[name](*xs) for name in names))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = ember.compile(module, inputs, config=CPU)(*inputs)
    want = module(*inputs)
    want64 = module(*(x.double() if x.is_floating_point() else x for x in inputs))
    failures = []
    for name, g, w, w64 in zip(names, got, want, want64):
        g, w = g.float() if g.dtype is torch.bfloat16 else g, \
            w.float() if w.dtype is torch.bfloat16 else w
        assert g.dtype == w.dtype and g.shape == w.shape, (name, g.dtype, w.dtype, g.shape)
        bad = mismatches(g.numpy(), w.numpy(), name not in open_zeros)
        if bad.any() and w.dtype is torch.float32:
            bad &= mismatches(g.numpy(), w64.float().numpy(), name not in open_zeros)
        if bad.any():
            at = tuple(np.argwhere(bad)[0])
            failures.append(f"{name} at {at}: {g.numpy()[at]!r}, eager {w.numpy()[at]!r}"
                            f" ({int(bad.sum())} elements)")
    assert not failures, "\n".join(failures)


# -- float ops, the torch door ---------------------------------------------------------------

UNARY = {
    "neg": torch.neg, "abs": torch.abs, "relu": torch.relu, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "exp": torch.exp, "expm1": torch.expm1, "exp2": torch.exp2,
    "log": torch.log, "log1p": torch.log1p, "log2": torch.log2, "log10": torch.log10,
    "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "tanh": torch.tanh,
    "asin": torch.asin, "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh,
    "cosh": torch.cosh, "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh,
    "sigmoid": torch.sigmoid, "logsigmoid": F.logsigmoid, "erf": torch.erf,
    "erfc": torch.erfc, "floor": torch.floor, "ceil": torch.ceil, "round": torch.round,
    "trunc": torch.trunc, "frac": torch.frac, "sign": torch.sign,
    "reciprocal": torch.reciprocal, "square": torch.square, "pow_half": lambda x: x ** 0.5,
    "pow_minus_one": lambda x: x ** -1, "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
    "softplus": F.softplus, "elu": F.elu, "selu": F.selu, "celu": F.celu,
    "leaky_relu": F.leaky_relu, "hardtanh": F.hardtanh, "relu6": F.relu6,
    "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid, "mish": F.mish,
    "softsign": F.softsign, "clamp": lambda x: x.clamp(-1, 1),
    "clamp_min": lambda x: x.clamp(min=0), "nan_to_num": torch.nan_to_num,
    "isnan": torch.isnan, "isinf": torch.isinf, "signbit": torch.signbit,
    "to_f16": lambda x: x.half(), "to_bf16": lambda x: x.bfloat16(),
    "to_f64": lambda x: x.double(), "times_zero": lambda x: x * 0,
    "plus_minus_zero": lambda x: x + (-0.0), "over_inf": lambda x: x / math.inf,
}
EXTREMES = ("relu", "hardtanh", "relu6", "clamp", "clamp_min", "maximum", "minimum", "fmax",
            "fmin", "amax", "amin", "max_pool")


def test_unary_float_ops_on_special_values():
    check_family(UNARY, torch.tensor(SPECIALS), open_zeros=EXTREMES)


BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "maximum": torch.maximum, "minimum": torch.minimum, "fmax": torch.fmax,
    "fmin": torch.fmin, "pow": torch.pow, "atan2": torch.atan2, "fmod": torch.fmod,
    "remainder": torch.remainder,
    "floor_divide": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "trunc_divide": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "copysign": torch.copysign, "hypot": torch.hypot, "eq": torch.eq, "lt": torch.lt,
    "ne": torch.ne, "where": lambda a, b: torch.where(a > b, a, b), "xlogy": torch.xlogy,
    "lerp": lambda a, b: torch.lerp(a, b, 0.3),
}


def test_binary_float_ops_on_every_pair_of_special_values():
    check_family(BINARY, *grid(), open_zeros=(*EXTREMES, "remainder"))


REDUCTIONS = {
    "sum": lambda x: x.sum(1), "sum_all": lambda x: x.sum(), "sum_down": lambda x: x.sum(0),
    "prod": lambda x: x.prod(1), "mean": lambda x: x.mean(1), "amax": lambda x: x.amax(1),
    "amin": lambda x: x.amin(0), "max_all": lambda x: x.max(), "argmax": lambda x: x.argmax(1),
    "argmin": lambda x: x.argmin(0), "max_dim": lambda x: x.max(1).values,
    "max_dim_index": lambda x: x.max(1).indices, "softmax": lambda x: x.softmax(1),
    "log_softmax": lambda x: x.log_softmax(1), "logsumexp": lambda x: x.logsumexp(1),
    "var": lambda x: x.var(1), "norm": lambda x: x.norm(dim=1),
    "cumsum": lambda x: x.cumsum(1), "any_nan": lambda x: x.isnan().any(1),
    "layer_norm": lambda x: F.layer_norm(x, x.shape[1:]), "matmul": lambda x: x @ x.T,
    "max_pool": lambda x: F.max_pool2d(x[None, None], 2),
    "avg_pool": lambda x: F.avg_pool2d(x[None, None], 2),
    "sort": lambda x: x.sort(1).values, "topk": lambda x: x.topk(3, 1).values,
}


def test_reductions_and_contractions_over_special_values():
    a, b = grid()
    check_family(REDUCTIONS, a * b, open_zeros=(*EXTREMES, "cumsum", "sort"))


# -- integers, the torch door: wrapping arithmetic, conversions ------------------------------

INT_DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]


def int_operands(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    info = torch.iinfo(dtype)
    low = -1 if info.min < 0 else 0
    x = torch.tensor([info.min, info.min + 1, low, 0, 1, 2, 7, info.max - 1, info.max],
                     dtype=dtype)
    y = torch.tensor([info.max, -1 if info.min < 0 else 3, 2, 3, info.max, 5, 5, 2, 3],
                     dtype=dtype)
    return x, y


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_integer_arithmetic_wraps_as_eagers(dtype):
    ops = {
        "add": torch.add, "sub": torch.sub, "mul": torch.mul, "neg": lambda x, y: -x,
        "abs": lambda x, y: x.abs(), "pow": lambda x, y: x ** (y % 70),
        "cube": lambda x, y: x ** 3, "shl": lambda x, y: x << 3, "shr": lambda x, y: x >> 1,
        "sum": lambda x, y: x.sum(dtype=dtype), "cumsum": lambda x, y: x.cumsum(0),
        "prod": lambda x, y: x.prod(), "plus_300": lambda x, y: x + 300,
        "times_minus_one": lambda x, y: x * -1, "clamp": lambda x, y: x.clamp(-3, 5),
        "floor_divide": lambda x, y: x // y, "remainder": torch.remainder,
        "trunc_divide": lambda x, y: torch.div(x, y, rounding_mode="trunc"),
        "fmod": torch.fmod, "true_divide": torch.div, "to_f32": lambda x, y: x.float(),
        "to_i8": lambda x, y: x.to(torch.int8), "to_u8": lambda x, y: x.to(torch.uint8),
        "bitwise_not": lambda x, y: ~x, "sign": lambda x, y: x.sign(),
    }
    check_family(ops, *int_operands(dtype))


def test_a_negative_integer_exponent_gives_the_integer_part():
    x = torch.tensor([1, -1, -1, 2, -2, 0, 5, 3], dtype=torch.int64)
    y = torch.tensor([-1, -3, -4, -1, -2, 5, -7, 39], dtype=torch.int64)
    got = ember.compile(Fn(torch.pow), (x, y), config=CPU)(x, y)
    assert got.tolist() == [1, -1, 1, 0, 0, 0, 0, 3 ** 39]  # 3 ** 39 > 2 ** 53: exact


def test_integer_division_by_zero_raises_as_eager():
    x = torch.tensor([7, -7, -(2 ** 31), 5], dtype=torch.int32)
    module = Fn(lambda x, y: (x // y, x % y, torch.div(x, y, rounding_mode="trunc"),
                              torch.fmod(x, y)))
    y = torch.tensor([2, 3, -1, -2], dtype=torch.int32)
    run = ember.compile(module, (x, y), config=CPU)
    # INT_MIN / -1 wraps (eager's kernel traps there: SIGFPE takes the process down)
    assert [g.tolist() for g in run(x, y)] == [[3, -3, -(2 ** 31), -3], [1, 2, 0, -1],
                                               [3, -2, -(2 ** 31), -2], [1, -1, 0, 1]]
    zero = torch.tensor([2, 0, 1, 1], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        module(x, zero)
    with pytest.raises(ember.DataError, match="an integer division by zero"):
        run(x, zero)


# Float -> integer as eager, NumPy and ONNX Runtime give it on x86-64 (C leaves it undefined):
# truncated into i32 (i64 for i64), outside it or NaN its minimum, then wrapped.
FLOATS = [0.0, -0.0, 2.7, -2.7, 1e10, -1e10, 3e9, 300.0, -129.0, 255.5, math.inf, -math.inf,
          math.nan]
CONVERTED = {
    torch.int8: [0, 0, 2, -2, 0, 0, 0, 44, 127, -1, 0, 0, 0],
    torch.uint8: [0, 0, 2, 254, 0, 0, 0, 44, 127, 255, 0, 0, 0],
    torch.int16: [0, 0, 2, -2, 0, 0, 0, 300, -129, 255, 0, 0, 0],
    torch.int32: [0, 0, 2, -2] + [-(2 ** 31)] * 3 + [300, -129, 255] + [-(2 ** 31)] * 3,
    torch.int64: [0, 0, 2, -2, 10 ** 10, -(10 ** 10), 3 * 10 ** 9, 300, -129, 255]
    + [-(2 ** 63)] * 3,
}


def test_floats_convert_to_integers_as_on_x86():
    x = torch.tensor(FLOATS)
    module = Fn(lambda x: tuple(x.to(dtype) for dtype in CONVERTED))
    got = ember.compile(module, (x,), config=CPU)(x)
    assert [g.tolist() for g in got] == list(CONVERTED.values())


def test_the_reference_converts_floats_as_the_compiled_code():
    from ember.dtypes import DType
    from ember.graph.ops.elementwise import float_to_int

    x = np.array(FLOATS, np.float32)
    for dtype, want in zip((DType.i8, DType.u8, DType.i16, DType.i32, DType.i64),
                           CONVERTED.values()):
        assert float_to_int(x, dtype).tolist() == want, dtype
    big = np.array([2.0 ** 63, 2.0 ** 64 - 2 ** 11, -1.0, math.nan])
    assert float_to_int(big, DType.u64).tolist() == [2 ** 63, 2 ** 64 - 2 ** 11,
                                                     2 ** 64 - 1, 2 ** 63]


@pytest.mark.parametrize("src", ["f32", "f64"])
def test_every_integer_type_converts_as_the_reference(src):
    from ember import Builder, DType, interpret
    from ember.driver.pipeline import compile_graph

    x = np.array([*FLOATS, 2.0 ** 31, -(2.0 ** 31), 2.0 ** 63, 1.8e19, 2.0 ** 64, -1.5,
                  65535.9, 4294967295.0], DType(src).np)
    b = Builder("conversions")
    xs = b.input("x", DType(src), x.shape)
    for dtype in (DType.i8, DType.u8, DType.i16, DType.u16, DType.i32, DType.u32, DType.i64,
                  DType.u64):
        b.output(b.cast(xs, to=dtype))
    graph = b.build()
    for got, want in zip(compile_graph(graph, CPU)(x), interpret(graph, [x])):
        assert got.dtype == want.dtype and got.tolist() == want.tolist(), got.dtype


# -- the ONNX door, against the ONNX reference implementation --------------------------------

def tensor_type(dtype) -> int:
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def onnx_node_model(op: str, inputs: list[np.ndarray], attrs: dict | None = None,
                    out_dtype=None, opset: int = 18):
    from onnx import helper

    names = [f"x{i}" for i in range(len(inputs))]
    graph = helper.make_graph(
        [helper.make_node(op, names, ["y"], **(attrs or {}))], op,
        [helper.make_tensor_value_info(n, tensor_type(a.dtype), a.shape)
         for n, a in zip(names, inputs)],
        [helper.make_tensor_value_info("y", tensor_type(out_dtype or inputs[0].dtype), None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check_onnx(op: str, inputs: list[np.ndarray], attrs: dict | None = None,
               out_dtype=None, zero_signs: bool = True, opset: int = 18) -> None:
    from onnx.reference import ReferenceEvaluator

    from ember.api.onnx_backend import EmberRep

    model = onnx_node_model(op, inputs, attrs, out_dtype, opset)
    feeds = {f"x{i}": a for i, a in enumerate(inputs)}
    with np.errstate(all="ignore"):
        (want,) = ReferenceEvaluator(model).run(None, feeds)
        (got,) = EmberRep(model, config=CPU).run(feeds)
    assert got.dtype == want.dtype and got.shape == want.shape, (op, got.dtype, want.dtype)
    bad = mismatches(got, np.asarray(want), zero_signs)
    assert not bad.any(), f"{op} at {tuple(np.argwhere(bad)[0])}: {got[bad][:4]}," \
                          f" the reference {np.asarray(want)[bad][:4]}"


ONNX_UNARY = ["Neg", "Abs", "Sqrt", "Exp", "Log", "Floor", "Ceil", "Round", "Sign",
              "Reciprocal", "Sin", "Cos", "Atan", "Sinh", "Softsign", "Relu"]


@pytest.mark.parametrize("op", ONNX_UNARY)
def test_onnx_unary_ops_on_special_values(op):
    check_onnx(op, [np.array(SPECIALS, np.float32)], zero_signs=op != "Relu")


@pytest.mark.parametrize("op", ["IsNaN", "IsInf"])
def test_onnx_predicates_on_special_values(op):
    check_onnx(op, [np.array(SPECIALS, np.float32)], out_dtype=np.bool_)


def test_onnx_nan_propagates_through_max_min_and_their_reductions():
    # ONNX's specification does not say; its reference implementation (and PyTorch)
    # propagate a NaN through Max, Min, ReduceMax and ReduceMin, and ArgMax picks it.
    # ONNX Runtime skips it in the reductions.
    a, b = (x.numpy() for x in grid())
    for op in ("Max", "Min"):
        check_onnx(op, [a, b], zero_signs=False)
    for op in ("ReduceMax", "ReduceMin"):
        check_onnx(op, [a * b], {"axes": [1]}, zero_signs=False, opset=17)
    for op in ("ArgMax", "ArgMin"):
        check_onnx(op, [a * b], {"axis": 1}, out_dtype=np.int64)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_onnx_integer_arithmetic_wraps(dtype):
    x, y = (t.numpy() for t in int_operands(getattr(torch, np.dtype(dtype).name)))
    for op in ("Add", "Sub", "Mul"):
        check_onnx(op, [x, y])
    check_onnx("Pow", [x, y % 70])  # exact and wrapping, as the reference's NumPy power


def test_onnx_cast_of_floats_to_integers():
    from ember.api.onnx_backend import EmberRep

    x = np.array(FLOATS, np.float32)
    for dtype, want in zip((np.int8, np.uint8, np.int16, np.int32, np.int64),
                           CONVERTED.values()):
        model = onnx_node_model("Cast", [x], {"to": tensor_type(dtype)}, out_dtype=dtype)
        (got,) = EmberRep(model, config=CPU).run({"x0": x})
        assert got.tolist() == want, dtype
