"""Composite ops: type inference, NumPy references against PyTorch, decompositions into
primitives, and the text round trip."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ember import (
    BadAttributeError,
    Builder,
    DType,
    ShapeError,
    TensorType,
    interpret,
    parse_graph,
    print_graph,
)
from ember.dtypes import from_numpy
from ember.graph.ops import all_opdefs, get_opdef

RNG = np.random.default_rng(0)


def randn(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def positive(*shape):
    return (np.abs(RNG.standard_normal(shape)) + 0.5).astype(np.float32)


def one_op(name, inputs, attrs=None):
    """A graph of one `name` op over inputs of the given arrays' (or types') dtypes and shapes."""
    b = Builder(name)
    values = []
    for i, x in enumerate(inputs):
        t = x if isinstance(x, TensorType) else TensorType(from_numpy(x.dtype), x.shape)
        values.append(b.input(f"x{i}", t.dtype, t.shape))
    b.output(*b.op(name, values, attrs or {}).results)
    return b.build()


def expand_once(graph):
    """A copy of `graph` with each composite op replaced by its decomposition."""
    b = Builder(graph.name)
    b.graph.constants.update(graph.constants)
    env = {v: b.input(v.name, v.dtype, v.shape) for v in graph.inputs}
    for op in graph.ops:
        assert not op.regions
        operands = [env[v] for v in op.operands]
        opdef = get_opdef(op.name)
        if opdef.is_composite:
            results = list(opdef.decompose(b, operands, dict(op.attrs)))
            assert [r.type for r in results] == [r.type for r in op.results], op.name
        else:
            results = b.op(op.name, operands, dict(op.attrs)).results
        env.update(zip(op.results, results))
    b.output(*(env[v] for v in graph.outputs))
    return b.build()


def expand(graph):
    """`graph` with composites expanded, repeatedly, until only primitives remain."""
    for _ in range(10):
        if not any(get_opdef(op.name).is_composite for op in graph.walk()):
            return graph
        graph = expand_once(graph)
    raise AssertionError("decomposition did not reach primitives in 10 rounds")


def round_trips(graph):
    text = print_graph(graph)
    assert print_graph(parse_graph(text)) == text


def t(*tensors):
    return [torch.from_numpy(np.ascontiguousarray(x)) for x in tensors]


# -- one case per op and attribute variant: (op, attrs, inputs, torch function) -------------
X = randn(2, 3, 4, 5, scale=3)
X_WIDE = np.concatenate([randn(40, scale=3), [-30, -25, 0, 25, 30]]).astype(np.float32)
MASK = RNG.random((4, 6)) > 0.3
MASK[:, 0] = True  # no row fully masked
Q, K, V = randn(2, 3, 4, 8), randn(2, 3, 6, 8), randn(2, 3, 6, 5)


def _layer_norm_broadcast(x, s, bias):
    return F.layer_norm(x, (4, 5), eps=1e-5) * s + bias


CASES = {
    "relu": ("relu", {}, [X], F.relu),
    "leaky_relu": ("leaky_relu", {}, [X], F.leaky_relu),
    "leaky_relu_alpha": ("leaky_relu", {"alpha": 0.2}, [X], lambda x: F.leaky_relu(x, 0.2)),
    "elu": ("elu", {"alpha": 1.5}, [X], lambda x: F.elu(x, 1.5)),
    "selu": ("selu", {}, [X], F.selu),
    "celu": ("celu", {"alpha": 2.0}, [X], lambda x: F.celu(x, 2.0)),
    "softplus": ("softplus", {}, [X_WIDE], F.softplus),
    "log_sigmoid": ("log_sigmoid", {}, [X_WIDE], F.logsigmoid),
    "softsign": ("softsign", {}, [X], F.softsign),
    "mish": ("mish", {}, [X_WIDE], F.mish),
    "gelu": ("gelu", {}, [X], F.gelu),
    "gelu_tanh": ("gelu", {"approximate": "tanh"}, [X],
                  lambda x: F.gelu(x, approximate="tanh")),
    "silu": ("silu", {}, [X_WIDE], F.silu),
    "hard_sigmoid": ("hard_sigmoid", {}, [X], lambda x: torch.clamp(x * 0.2 + 0.5, 0, 1)),
    "hard_sigmoid_torch": ("hard_sigmoid", {"alpha": 1 / 6}, [X], F.hardsigmoid),
    "hard_swish": ("hard_swish", {}, [X], F.hardswish),
    "clip": ("clip", {"min": -0.5, "max": 0.7}, [X], lambda x: torch.clamp(x, -0.5, 0.7)),
    "clip_min": ("clip", {"min": 0.25}, [X], lambda x: torch.clamp(x, min=0.25)),
    "clip_crossed": ("clip", {"min": 1.0, "max": -1.0}, [X], lambda x: torch.clamp(x, 1.0, -1.0)),
    "clip_none": ("clip", {}, [X], lambda x: x),
    "prelu": ("prelu", {}, [X, randn(3, 1, 1)],
              lambda x, s: F.prelu(x, s.reshape(3))),
    "softmax": ("softmax", {}, [X], lambda x: F.softmax(x, -1)),
    "softmax_axis": ("softmax", {"axis": 1}, [X], lambda x: F.softmax(x, 1)),
    "log_softmax": ("log_softmax", {"axis": -2}, [X], lambda x: F.log_softmax(x, -2)),
    "reduce_mean": ("reduce_mean", {"axes": (0, 2), "keepdims": True}, [X],
                    lambda x: x.mean(dim=(0, 2), keepdim=True)),
    "reduce_mean_all": ("reduce_mean", {"axes": (0, 1, 2, 3)}, [X], lambda x: x.mean()),
    "reduce_var": ("reduce_var", {"axes": (-1,)}, [X],
                   lambda x: x.var(dim=-1, correction=0)),
    "reduce_var_unbiased": ("reduce_var", {"axes": (1, 3), "keepdims": True, "correction": 1},
                            [X], lambda x: x.var(dim=(1, 3), correction=1, keepdim=True)),
    "reduce_l1": ("reduce_l1", {"axes": (1,)}, [X], lambda x: x.abs().sum(dim=1)),
    "reduce_l2": ("reduce_l2", {"axes": (2, 3)}, [X],
                  lambda x: torch.linalg.vector_norm(x, 2, dim=(2, 3))),
    "reduce_sum_square": ("reduce_sum_square", {"axes": (0,), "keepdims": True}, [X],
                          lambda x: (x * x).sum(dim=0, keepdim=True)),
    "reduce_logsumexp": ("reduce_logsumexp", {"axes": (1, 2)}, [X],
                         lambda x: torch.logsumexp(x, dim=(1, 2))),
    "reduce_logsumexp_keep": ("reduce_logsumexp", {"axes": (-1,), "keepdims": True}, [X],
                              lambda x: torch.logsumexp(x, dim=-1, keepdim=True)),
    "layer_norm": ("layer_norm", {}, [X, randn(5), randn(5)],
                   lambda x, s, b: F.layer_norm(x, (5,), s, b)),
    "layer_norm_axis": ("layer_norm", {"axis": 1, "epsilon": 1e-3}, [X, randn(3, 4, 5)],
                        lambda x, s: F.layer_norm(x, (3, 4, 5), s, eps=1e-3)),
    "layer_norm_plain": ("layer_norm", {}, [X], lambda x: F.layer_norm(x, (5,))),
    "layer_norm_broadcast": ("layer_norm", {"axis": -2}, [X, randn(5), randn(1, 5)],
                             _layer_norm_broadcast),
    "rms_norm": ("rms_norm", {}, [X, randn(5)], lambda x, s: F.rms_norm(x, (5,), s, 1e-5)),
    "rms_norm_axis": ("rms_norm", {"axis": 2}, [X], lambda x: F.rms_norm(x, (4, 5), eps=1e-5)),
    "group_norm": ("group_norm", {"num_groups": 2}, [randn(2, 6, 3, 4), randn(6), randn(6)],
                   lambda x, s, b: F.group_norm(x, 2, s, b, 1e-5)),
    "group_norm_2d": ("group_norm", {"num_groups": 3, "epsilon": 1e-2},
                      [randn(4, 6), randn(6), randn(6)],
                      lambda x, s, b: F.group_norm(x, 3, s, b, 1e-2)),
    "instance_norm": ("instance_norm", {}, [randn(2, 3, 4, 5), randn(3), randn(3)],
                      lambda x, s, b: F.instance_norm(x, weight=s, bias=b, eps=1e-5)),
    "batch_norm": ("batch_norm", {"epsilon": 1e-3},
                   [randn(2, 3, 4, 5), randn(3), randn(3), randn(3), positive(3)],
                   lambda x, s, b, m, v: F.batch_norm(x, m, v, s, b, False, 0.0, 1e-3)),
    "batch_norm_2d": ("batch_norm", {}, [randn(4, 3), randn(3), randn(3), randn(3), positive(3)],
                      lambda x, s, b, m, v: F.batch_norm(x, m, v, s, b, False, 0.0, 1e-5)),
    "sdpa": ("sdpa", {}, [Q, K, V], F.scaled_dot_product_attention),
    "sdpa_causal": ("sdpa", {"is_causal": True, "scale": 0.5}, [Q, K, V],
                    lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                   scale=0.5)),
    "sdpa_bool_mask": ("sdpa", {}, [Q, K, V, MASK],
                       lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m)),
    "sdpa_float_mask": ("sdpa", {}, [Q, K, V, randn(1, 3, 4, 6)],
                        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m)),
    "sdpa_broadcast": ("sdpa", {}, [Q, randn(1, 3, 6, 8), randn(3, 6, 5), randn(6)],
                       lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m)),
    "sdpa_3d": ("sdpa", {}, [randn(2, 5, 8), randn(2, 5, 8), randn(2, 5, 8)],
                F.scaled_dot_product_attention),
    "tile": ("tile", {"repeats": (2, 1, 3)}, [randn(2, 3, 1)], lambda x: torch.tile(x, (2, 1, 3))),
    "tile_identity": ("tile", {"repeats": (1, 1)}, [randn(2, 3)], lambda x: x),
}


def test_every_composite_has_a_case():
    composites = {d.name for d in all_opdefs() if d.is_composite}
    assert composites == {case[0] for case in CASES.values()}
    for d in all_opdefs():
        if d.is_composite:
            assert d.family == "composite" and "composite" in d.traits


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_reference_matches_torch(case):
    name, attrs, inputs, torch_fn = case
    (got,) = interpret(one_op(name, inputs, attrs), inputs)
    expected = torch_fn(*t(*inputs)).numpy()
    assert got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_decomposition_matches_reference(case):
    name, attrs, inputs, _ = case
    graph = one_op(name, inputs, attrs)
    expanded = expand(graph)
    assert not any(get_opdef(op.name).is_composite for op in expanded.walk())
    assert [v.type for v in expanded.outputs] == [v.type for v in graph.outputs]
    (want,) = interpret(graph, inputs)
    (got,) = interpret(expanded, inputs)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    round_trips(expanded)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_text_round_trip(case):
    name, attrs, inputs, _ = case
    graph = one_op(name, inputs, attrs)
    round_trips(graph)
    text = print_graph(graph)
    for key in attrs:
        assert key in text or attrs[key] == get_opdef(name).attrs[key].default


# -- half precision ---------------------------------------------------------------------------
HALF_CASES = ["gelu", "leaky_relu_alpha", "mish", "softmax", "log_softmax", "reduce_var",
              "reduce_logsumexp", "layer_norm", "group_norm", "batch_norm", "sdpa_float_mask",
              "sdpa_causal", "hard_swish", "clip"]


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
@pytest.mark.parametrize("key", HALF_CASES)
def test_half_precision(key, dtype):
    name, attrs, inputs, torch_fn = CASES[key]
    half = [x.astype(DType.bf16.np if dtype == "bfloat16" else dtype) if x.dtype == np.float32
            else x for x in inputs]
    graph = one_op(name, half, attrs)
    expanded = expand(graph)
    (want,) = interpret(graph, half)
    (got,) = interpret(expanded, half)
    assert got.dtype == want.dtype == half[0].dtype
    # Both compute in f32 and round once, so they differ by at most an ulp.
    tol = 1e-2 if dtype == "bfloat16" else 1e-3
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                               rtol=tol, atol=tol)
    if dtype == np.float16:  # f32 math on the same rounded inputs, rounded to f16
        expected = torch_fn(*t(*(x.astype(np.float32) if x.dtype == np.float16 else x
                                 for x in half))).numpy().astype(np.float16)
        np.testing.assert_allclose(want.astype(np.float32), expected.astype(np.float32),
                                   rtol=2e-3, atol=2e-3)
    ops = [op.name for op in expanded.walk()]
    assert "cast" in ops or name == "clip"


def test_decomposition_of_half_keeps_half_inputs_and_outputs():
    graph = expand(one_op("softmax", [TensorType(DType.f16, (2, 8))]))
    assert graph.inputs[0].dtype is DType.f16 and graph.outputs[0].dtype is DType.f16
    assert graph.ops[0].name == "cast" and graph.ops[0].attrs["to"] is DType.f32
    assert graph.outputs[0].producer.name == "cast"


# -- integers, f64 and special values ----------------------------------------------------------
def test_relu_and_clip_on_integers():
    x = np.arange(-10, 10, dtype=np.int32)
    cases = [("relu", {}, np.maximum(x, 0)),
             ("clip", {"min": -3.5, "max": 5.5}, np.clip(x, -3, 5)),
             ("clip", {"min": -1e30}, x),
             ("clip", {"max": 1e30, "min": 100.0}, np.full_like(x, 100))]
    for name, attrs, expected in cases:
        graph = one_op(name, [x], attrs)
        assert graph.outputs[0].dtype is DType.i32
        for g in (graph, expand(graph)):
            (got,) = interpret(g, [x])
            assert got.dtype == np.int32
            np.testing.assert_array_equal(got, expected)
    x8 = np.array([-128, 0, 127], np.int8)
    graph = one_op("clip", [x8], {"min": 300.0})  # beyond i8: clips to the largest i8
    for g in (graph, expand(graph)):
        np.testing.assert_array_equal(interpret(g, [x8])[0], [127, 127, 127])


def test_f64_matches_torch():
    x = RNG.standard_normal((3, 7))
    for name, fn in (("gelu", F.gelu), ("softmax", lambda x: F.softmax(x, -1)),
                     ("mish", F.mish)):
        graph = one_op(name, [x])
        for g in (graph, expand(graph)):
            (got,) = interpret(g, [x])
            assert got.dtype == np.float64
            np.testing.assert_allclose(got, fn(torch.from_numpy(x)).numpy(), rtol=1e-12,
                                       atol=1e-12)


def test_stable_at_extremes():
    x = np.array([[-np.inf, -1e30, 0.0, 1e30, 80.0], [-np.inf] * 5], np.float32)
    for name in ("softmax", "log_softmax", "softplus", "log_sigmoid", "silu", "reduce_logsumexp"):
        attrs = {"axes": (1,)} if name.startswith("reduce") else {}
        graph = one_op(name, [x], attrs)
        (want,) = interpret(graph, [x])
        (got,) = interpret(expand(graph), [x])
        np.testing.assert_array_equal(got, want)
    # logsumexp: a row of -inf gives -inf, not NaN; softmax rows of finite values are exact.
    (lse,) = interpret(one_op("reduce_logsumexp", [x], {"axes": (1,)}), [x])
    assert lse[0] == np.float32(1e30) and lse[1] == -np.inf
    (sm,) = interpret(expand(one_op("softmax", [x[:1]])), [x[:1]])
    np.testing.assert_array_equal(sm, [[0, 0, 0, 1, 0]])
    (sp,) = interpret(expand(one_op("softplus", [x[:1]])), [x[:1]])
    np.testing.assert_array_equal(sp, np.array([[0, 0, np.log(2), 1e30, 80]], np.float32))


def test_nan_propagates():
    x = np.array([np.nan, 1.0], np.float32)
    for name in ("relu", "leaky_relu", "elu", "gelu", "clip", "hard_sigmoid", "softplus"):
        attrs = {"min": 0.0, "max": 0.5} if name == "clip" else {}
        (got,) = interpret(expand(one_op(name, [x], attrs)), [x])
        assert np.isnan(got[0]), name


def test_reduce_var_with_correction_beyond_count():
    x = randn(2, 3)
    graph = one_op("reduce_var", [x], {"axes": (1,), "correction": 3})
    for g in (graph, expand(graph)):
        (got,) = interpret(g, [x])
        assert np.all(np.isinf(got))


# -- type inference ----------------------------------------------------------------------------
F32, F16, I32, BOOL = DType.f32, DType.f16, DType.i32, DType.bool


def tt(dtype, *shape):
    return TensorType(dtype, shape)


INFER = [
    # (op, operand types, attrs, result type)
    ("relu", [tt(I32, 3)], {}, tt(I32, 3)),
    ("leaky_relu", [tt(F16, 2, 3)], {"alpha": 0.1}, tt(F16, 2, 3)),
    ("elu", [tt(F32)], {}, tt(F32)),
    ("selu", [tt(DType.bf16, 4)], {}, tt(DType.bf16, 4)),
    ("celu", [tt(F32, 1, 2)], {"alpha": -1.0}, tt(F32, 1, 2)),
    ("softplus", [tt(DType.f64, 0)], {}, tt(DType.f64, 0)),
    ("log_sigmoid", [tt(F32, 5)], {}, tt(F32, 5)),
    ("softsign", [tt(F32, 5)], {}, tt(F32, 5)),
    ("mish", [tt(F32, 5)], {}, tt(F32, 5)),
    ("gelu", [tt(F32, 5)], {"approximate": "tanh"}, tt(F32, 5)),
    ("silu", [tt(F32, 5)], {}, tt(F32, 5)),
    ("hard_sigmoid", [tt(F32, 5)], {"alpha": 0.5}, tt(F32, 5)),
    ("hard_swish", [tt(F32, 5)], {}, tt(F32, 5)),
    ("clip", [tt(DType.u8, 5)], {"max": 3.0}, tt(DType.u8, 5)),
    ("prelu", [tt(F32, 2, 3, 4), tt(F32, 3, 1)], {}, tt(F32, 2, 3, 4)),
    ("softmax", [tt(F32, 2, 3)], {"axis": 0}, tt(F32, 2, 3)),
    ("log_softmax", [tt(F32, 7)], {}, tt(F32, 7)),
    ("reduce_mean", [tt(F32, 2, 3, 4)], {"axes": (-1, 0)}, tt(F32, 3)),
    ("reduce_mean", [tt(F32, 2, 3, 4)], {"axes": (), "keepdims": True}, tt(F32, 2, 3, 4)),
    ("reduce_var", [tt(F32, 2, 3, 4)], {"axes": (1,), "keepdims": True}, tt(F32, 2, 1, 4)),
    ("reduce_l1", [tt(I32, 2, 3)], {"axes": (1,)}, tt(I32, 2)),
    ("reduce_l2", [tt(F32, 2, 3)], {"axes": (0, 1)}, tt(F32)),
    ("reduce_sum_square", [tt(F32, 2, 3)], {"axes": (0,)}, tt(F32, 3)),
    ("reduce_logsumexp", [tt(F32, 2, 3)], {"axes": (0,), "keepdims": True}, tt(F32, 1, 3)),
    ("layer_norm", [tt(F32, 2, 3, 4), tt(F32, 3, 4), tt(F32, 4)], {"axis": 1},
     tt(F32, 2, 3, 4)),
    ("rms_norm", [tt(F16, 2, 8), tt(F16, 8)], {}, tt(F16, 2, 8)),
    ("group_norm", [tt(F32, 2, 6, 5), tt(F32, 6), tt(F32, 6)], {"num_groups": 3},
     tt(F32, 2, 6, 5)),
    ("instance_norm", [tt(F32, 2, 6, 5), tt(F32, 6), tt(F32, 6)], {}, tt(F32, 2, 6, 5)),
    ("batch_norm", [tt(F32, 2, 6), *[tt(F32, 6)] * 4], {}, tt(F32, 2, 6)),
    ("sdpa", [tt(F32, 2, 1, 4, 8), tt(F32, 3, 6, 8), tt(F32, 1, 6, 5)], {}, tt(F32, 2, 3, 4, 5)),
    ("sdpa", [tt(F32, 4, 8), tt(F32, 6, 8), tt(F32, 6, 2), tt(BOOL, 4, 1)], {}, tt(F32, 4, 2)),
    ("tile", [tt(F32, 2, 3)], {"repeats": (3, 0)}, tt(F32, 6, 0)),
]


def infer(name, types, attrs):
    b = Builder()
    values = [b.input(f"x{i}", ty.dtype, ty.shape) for i, ty in enumerate(types)]
    return b.op(name, values, attrs).result.type


@pytest.mark.parametrize("name, types, attrs, expected", INFER,
                         ids=[f"{case[0]}-{i}" for i, case in enumerate(INFER)])
def test_infer(name, types, attrs, expected):
    assert infer(name, types, attrs) == expected


ERRORS = [
    # (op, operand types, attrs, message pattern)
    ("relu", [tt(BOOL, 3)], {}, "expected one of"),
    ("leaky_relu", [tt(I32, 3)], {}, "expected one of"),
    ("leaky_relu", [tt(F32, 3)], {"alpha": math.nan}, "alpha must be finite"),
    ("elu", [tt(F32, 3)], {"alpha": math.inf}, "alpha must be finite"),
    ("selu", [tt(F32, 3)], {"gamma": math.nan}, "gamma must be finite"),
    ("celu", [tt(F32, 3)], {"alpha": 0.0}, "alpha must not be 0"),
    ("softplus", [tt(I32, 3)], {}, "expected one of"),
    ("log_sigmoid", [tt(I32, 3)], {}, "expected one of"),
    ("softsign", [tt(DType.u8, 3)], {}, "expected one of"),
    ("mish", [tt(DType.i64, 3)], {}, "expected one of"),
    ("gelu", [tt(I32, 3)], {}, "expected one of"),
    ("silu", [tt(BOOL, 3)], {}, "expected one of"),
    ("hard_sigmoid", [tt(F32, 3)], {"beta": -math.inf}, "beta must be finite"),
    ("hard_swish", [tt(I32, 3)], {}, "expected one of"),
    ("clip", [tt(F32, 3)], {"min": math.nan}, "must not be NaN"),
    ("clip", [tt(BOOL, 3)], {}, "expected one of"),
    ("prelu", [tt(F32, 2, 3), tt(F32, 4)], {}, "does not broadcast"),
    ("prelu", [tt(F32, 3), tt(F32, 2, 3)], {}, "does not broadcast"),
    ("prelu", [tt(F32, 3), tt(F16, 3)], {}, "one dtype"),
    ("softmax", [tt(F32, 2, 3)], {"axis": 2}, "out of range"),
    ("softmax", [tt(I32, 2, 3)], {}, "expected one of"),
    ("log_softmax", [tt(F32)], {}, "out of range"),
    ("reduce_mean", [tt(F32, 2, 3)], {"axes": (1, -1)}, "repeat an axis"),
    ("reduce_mean", [tt(I32, 2, 3)], {"axes": (1,)}, "expected one of"),
    ("reduce_var", [tt(F32, 2, 3)], {"axes": (1,), "correction": -1}, "correction must be"),
    ("reduce_l1", [tt(BOOL, 2, 3)], {"axes": (1,)}, "expected one of"),
    ("reduce_l2", [tt(I32, 2, 3)], {"axes": (1,)}, "expected one of"),
    ("reduce_sum_square", [tt(F32)], {"axes": (0,)}, "out of range for rank 0"),
    ("reduce_logsumexp", [tt(F32, 2, 3)], {"axes": (2,)}, "out of range"),
    ("layer_norm", [tt(F32, 2, 5), tt(F32, 3)], {}, "does not broadcast to the normalized"),
    ("layer_norm", [tt(F32, 2, 5), tt(F32, 5), tt(F32, 2, 5)], {"axis": -1},
     "bias .* does not broadcast"),
    ("layer_norm", [tt(F32, 2, 5), tt(F16, 5)], {}, "one dtype"),
    ("layer_norm", [tt(F32, 2, 5)], {"epsilon": -1.0}, "epsilon must be"),
    ("rms_norm", [tt(F32, 2, 5)], {"axis": 2}, "out of range"),
    ("group_norm", [tt(F32, 2, 6, 5), tt(F32, 6), tt(F32, 6)], {"num_groups": 4},
     "does not divide"),
    ("group_norm", [tt(F32, 2, 6, 5), tt(F32, 3), tt(F32, 3)], {"num_groups": 3},
     r"must have shape \[6\]"),
    ("instance_norm", [tt(F32, 2, 6), tt(F32, 6), tt(F32, 6)], {}, "rank >= 3"),
    ("batch_norm", [tt(F32, 2, 6), tt(F32, 6), tt(F32, 6), tt(F32, 6), tt(F32, 1, 6)], {},
     "per-channel"),
    ("sdpa", [tt(F32, 4, 8), tt(F32, 6, 8), tt(F32, 6, 2), tt(BOOL, 4, 6)],
     {"is_causal": True}, "cannot be used together"),
    ("sdpa", [tt(F32, 4, 8), tt(F32, 6, 7), tt(F32, 6, 2)], {}, "differ in the last dim"),
    ("sdpa", [tt(F32, 4, 8), tt(F32, 6, 8), tt(F32, 5, 2)], {}, "differ in the sequence dim"),
    ("sdpa", [tt(F32, 4, 8), tt(F32, 6, 8), tt(F32, 6, 2), tt(I32, 4, 6)], {}, "must be bool"),
    ("sdpa", [tt(F32, 4, 8), tt(F32, 6, 8), tt(F32, 6, 2), tt(BOOL, 2, 4, 6)], {},
     "does not broadcast to the scores"),
    ("sdpa", [tt(F32, 2, 4, 8), tt(F32, 3, 6, 8), tt(F32, 6, 2)], {}, "do not broadcast"),
    ("sdpa", [tt(F32, 8), tt(F32, 6, 8), tt(F32, 6, 2)], {}, "rank >= 2"),
    ("tile", [tt(F32, 2, 3)], {"repeats": (2,)}, "one entry per dim"),
    ("tile", [tt(F32, 2, 3)], {"repeats": (2, -1)}, ">= 0"),
]


@pytest.mark.parametrize("name, types, attrs, pattern", ERRORS,
                         ids=[f"{case[0]}-{i}" for i, case in enumerate(ERRORS)])
def test_infer_errors(name, types, attrs, pattern):
    with pytest.raises(ShapeError, match=pattern) as info:
        infer(name, types, attrs)
    assert f"graph.{name}" in str(info.value)


def test_every_composite_has_infer_and_error_cases():
    composites = {d.name for d in all_opdefs() if d.is_composite}
    assert {case[0] for case in INFER} == composites
    assert {case[0] for case in ERRORS} == composites


def test_bad_attributes():
    with pytest.raises(BadAttributeError, match="expected one of none, tanh"):
        infer("gelu", [tt(F32, 3)], {"approximate": "fast"})
    with pytest.raises(BadAttributeError, match="needs attribute 'num_groups'"):
        infer("group_norm", [tt(F32, 2, 6), tt(F32, 6), tt(F32, 6)], {})
    with pytest.raises(BadAttributeError, match="needs attribute 'axes'"):
        infer("reduce_mean", [tt(F32, 2, 6)], {})


def test_sdpa_default_scale_prints_nothing():
    graph = one_op("sdpa", [Q, K, V])
    assert "scale" not in print_graph(graph)
    graph = one_op("sdpa", [Q, K, V], {"scale": 0.25, "is_causal": True})
    text = print_graph(graph)
    assert "scale = 0.25" in text and "is_causal = true" in text
    assert print_graph(parse_graph(text)) == text


def test_clip_bounds_print_and_parse():
    graph = one_op("clip", [TensorType(F32, (3,))], {"min": -math.inf, "max": 6.0})
    text = print_graph(graph)
    assert "max = 6.0" in text and "min" not in text
    graph = one_op("clip", [TensorType(F32, (3,))], {"min": 0.0})
    round_trips(graph)


def test_decompose_pass_expands_a_block():
    from ember.graph.passes import get_pass

    b = Builder("block")
    x = b.input("x", DType.f32, (2, 4, 8))
    scale, bias = b.input("scale", DType.f32, (8,)), b.input("bias", DType.f32, (8,))
    h = b.layer_norm(x, scale, bias)
    h = b.sdpa(h, h, h, is_causal=True)
    h = b.add(b.gelu(h, approximate="tanh"), x)
    h = b.clip(b.tile(h, repeats=(1, 1, 1)))  # both expand to their operand
    b.output(b.softmax(b.reduce_mean(h, axes=(1,), keepdims=True)), h)
    graph = b.build()
    inputs = [randn(2, 4, 8), randn(8), randn(8)]
    want = interpret(graph, inputs)
    expanded = get_pass("decompose").run(parse_graph(print_graph(graph)))
    assert not any(get_opdef(op.name).is_composite for op in expanded.walk())
    for got, expected in zip(interpret(expanded, inputs), want):
        np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-6)
    round_trips(expanded)
