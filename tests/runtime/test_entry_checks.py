"""The entry checks of compiled callables, as properties: whatever a caller passes (another
dtype, rank or shape, a strided or reversed view, zero-size dims, out= buffers that are
read-only, strided, overlap the inputs or each other, objects that are not arrays), a call
ends in the graph's values or a ShapeError, never a crash or garbage; the same holds for
the native call path that a program takes after its first calls."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember import Builder, Config, DType, ShapeError, interpret
from ember.driver import pipeline
from ember.graph.symbolic import symbol

CPU = Config(executor="cpu", disk_cache=False)
SHAPE = (3, 5)


def _graph():
    b = Builder("entry")
    x = b.input("x", DType.f32, SHAPE)
    y = b.input("y", DType.f32, SHAPE[1:])
    b.output(b.tanh(b.add(x, y)), b.reduce_sum(x, axes=(1,)))
    return b.build()


def _sized_graph():
    b = Builder("entry_sized")
    x = b.input("x", DType.f32, (symbol("n"), 5))
    b.output(b.mul(x, 2.0))
    return b.build()


GRAPH, SIZED = _graph(), _sized_graph()
RUN, RUN_SIZED = pipeline.compile_graph(GRAPH, CPU), pipeline.compile_graph(SIZED, CPU)


@st.composite
def arrays(draw, shape):
    """An array meant to be of `shape` (f32), or something a caller might pass instead."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    kind = draw(st.sampled_from(["exact", "dtype", "shape", "rank", "strided", "reversed",
                                 "empty", "fortran", "list", "scalar", "object", "swapped"]))
    base = rng.standard_normal(shape).astype(np.float32)
    if kind == "dtype":
        return base.astype(draw(st.sampled_from([np.float64, np.int32, np.float16, bool])))
    if kind == "shape":
        return rng.standard_normal(tuple(d + draw(st.integers(1, 2)) for d in shape)
                                   ).astype(np.float32)
    if kind == "rank":
        return base.reshape(-1) if len(shape) > 1 else base.reshape(1, -1)
    if kind == "strided":
        wide = rng.standard_normal((*shape[:-1], shape[-1] * 2)).astype(np.float32)
        return wide[..., ::2]
    if kind == "reversed":
        return base[::-1]
    if kind == "empty":
        return np.zeros((0, *shape[1:]), np.float32)
    if kind == "fortran":
        return np.asfortranarray(base)
    if kind == "list":
        return base.tolist()
    if kind == "scalar":
        return 1.5
    if kind == "object":
        return object()
    if kind == "swapped":
        return base.astype(base.dtype.newbyteorder(">"))
    return base


def _expected(graph, inputs):
    """The graph's values for these inputs if they are what it takes, else None."""
    arrays_ = []
    for value, x in zip(graph.inputs, inputs):
        try:
            a = np.asarray(x)
        except Exception:  # noqa: BLE001
            return None
        if a.dtype.kind == "O" or a.dtype.newbyteorder("=") != np.float32 or \
                len(a.shape) != len(value.shape) or any(
                    isinstance(d, int) and d != s for d, s in zip(value.shape, a.shape)):
            return None
        arrays_.append(np.ascontiguousarray(a, np.float32))
    if any(a.shape[0] == 0 for a in arrays_ if a.ndim) and graph is SIZED:
        return None  # (a size of 0 is outside ?n's range of at least 1)
    return interpret(graph, arrays_)


def _call(run, inputs, out=None):
    try:
        return run(*inputs, out=out) if out is not None else run(*inputs)
    except ShapeError:
        return None


PROPERTY = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(arrays(SHAPE), arrays(SHAPE[1:]))
def test_a_call_gives_the_values_or_a_shape_error(x, y) -> None:
    want = _expected(GRAPH, [x, y])
    for _ in range(3):  # (the later calls take the native path)
        got = _call(RUN, [x, y])
        if want is None:
            assert got is None
            continue
        assert got is not None
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@PROPERTY
@given(arrays((4, 5)))
def test_a_call_of_sizes_known_at_call_time_gives_the_values_or_a_shape_error(x) -> None:
    want = _expected(SIZED, [x])
    got = _call(RUN_SIZED, [x])
    if want is None:
        assert got is None
    else:
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6)


@PROPERTY
@given(st.sampled_from(["exact", "readonly", "strided", "dtype", "shape", "overlap_input",
                        "same_twice", "count"]), st.integers(0, 2**16))
def test_out_buffers_are_written_or_refused(kind, seed) -> None:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    y = rng.standard_normal(SHAPE[1:]).astype(np.float32)
    want = interpret(GRAPH, [x.copy(), y.copy()])
    out = [np.empty(SHAPE, np.float32), np.empty(SHAPE[:1], np.float32)]
    if kind == "readonly":
        out[0].flags.writeable = False
    elif kind == "strided":
        out[0] = np.empty((SHAPE[0], SHAPE[1] * 2), np.float32)[:, ::2]
    elif kind == "dtype":
        out[1] = np.empty(SHAPE[:1], np.float64)
    elif kind == "shape":
        out[1] = np.empty(SHAPE, np.float32)
    elif kind == "overlap_input":
        out[0] = x  # the result written over an input that is still read
    elif kind == "same_twice":  # two outputs in one memory: each would overwrite the other
        out[1] = out[0].reshape(-1)[:SHAPE[0]]
    elif kind == "count":
        out = out[:1]
    got = _call(RUN, [x, y], out=out)
    if kind in ("readonly", "strided", "dtype", "shape", "count", "same_twice"):
        assert got is None
        return
    assert got is not None
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
