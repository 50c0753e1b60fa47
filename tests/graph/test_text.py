"""The text form: exact round trips, the broken-input corpus, and mutation fuzzing."""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember import Builder, DType, ParseError, interpret, parse_graph, print_graph

CORPUS = sorted((Path(__file__).parent / "parse_errors").glob("*.ir"))


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_broken_input_gives_positioned_parse_error(path: Path) -> None:
    text = path.read_text()
    expected = re.match(r"// ERROR: (\d+):(\d+): (.*)", text)
    assert expected, f"{path.name} must start with '// ERROR: line:col: message'"
    line, column, message = int(expected[1]), int(expected[2]), expected[3]
    with pytest.raises(ParseError) as info:
        parse_graph(text, path.name)
    error = info.value
    assert message in error.message
    assert (error.line, error.column) == (line, column), str(error)
    assert str(error).startswith(f"{path.name}:{line}:{column}: ")


def _roundtrip(graph) -> str:
    text = print_graph(graph)
    again = print_graph(parse_graph(text))
    assert again == text
    return text


@pytest.mark.parametrize("dtype", list(DType))
def test_constants_of_every_dtype_round_trip_bit_exactly(dtype: DType) -> None:
    rng = np.random.default_rng(0)
    if dtype.is_float:
        values = rng.standard_normal(40).astype(np.float64) * 1e3
        values[:6] = [np.inf, -np.inf, 0.0, -0.0, 1e-30, 65504.0]
    elif dtype is DType.bool:
        values = rng.integers(0, 2, 40).astype(bool)
    else:
        info = np.iinfo(dtype.np)
        values = rng.integers(info.min, info.max, 40, dtype=np.int64 if info.min < 0
                              else np.uint64, endpoint=True).astype(dtype.np)
        values[:2] = [info.min, info.max]
    array = np.asarray(values).astype(dtype.np)
    b = Builder("consts")
    big = b.constant(array, name="big")  # goes to the table (base64)
    small = b.constant(array[:8])  # prints inline as literals
    b.output(big, small)
    graph = b.build()
    text = _roundtrip(graph)
    assert "base64" in text
    parsed = parse_graph(text)
    for got, want in zip(interpret(parsed, []), (array, array[:8])):
        assert got.dtype == want.dtype
        assert got.tobytes() == want.tobytes()


def test_inline_mode_prints_table_constants_in_place() -> None:
    b = Builder("g")
    b.output(b.constant(np.arange(20, dtype=np.float32), name="w"))
    graph = b.build()
    inline = print_graph(graph, constants="inline")
    assert "constants {" not in inline and "dense<f32[20] [0.0, 1.0, 2.0," in inline
    assert np.array_equal(interpret(parse_graph(inline), [])[0], np.arange(20))
    elided = print_graph(graph, constants="elide")
    assert "@w = dense<f32[20] elided>" in elided
    with pytest.raises(ParseError, match="elided"):
        parse_graph(elided)


def test_half_precision_literals_are_shortest_and_exact() -> None:
    b = Builder("g")
    for ctor in (np.float16, ml_dtypes.bfloat16):
        b.output(b.constant(np.array([0.1, 3.140625, -2.5e-3], dtype=ctor)))
    text = _roundtrip(b.build())
    assert "dense<f16[3] [0.1, 3.14, -0.0025]>" in text


def test_names_locations_and_attributes_round_trip() -> None:
    b = Builder("g")
    x = b.input("input:0/weird name", DType.f32, (2, 3))
    y = b.cast(x, to=DType.f16, loc='onnx node "Cast_1" (opset 19)', name_hint="9lives")
    z = b.cast(y, to=DType.f32, name_hint="9lives")
    b.output(z)
    text = _roundtrip(b.build())
    assert "%input_0_weird_name: f32[2,3]" in text
    assert 'loc("onnx node \\"Cast_1\\" (opset 19)")' in text
    assert "%_9lives = " in text and "%_9lives_1 = " in text


def test_if_and_loop_round_trip_and_run() -> None:
    b = Builder("ctl")
    x = b.input("x", DType.f32, (3,))
    c = b.input("c", DType.bool, ())
    (r,) = b.if_(c, lambda t: [t.exp(x)], lambda e: [e.neg(x)])
    n = b.constant(np.int64(4))
    true = b.constant(True)
    total, scan = b.loop(n, true, [r], lambda lb, i, acc: [true, lb.add(acc, x), lb.mul(acc, 2.0)],
                         num_scan=1, scan_length=4)
    b.output(total, scan)
    graph = b.build()
    parsed = parse_graph(_roundtrip(graph))
    xv = np.array([1.0, -2.0, 0.5], np.float32)
    for cond in (True, False):
        want = interpret(graph, [xv, np.array(cond)])
        got = interpret(parsed, [xv, np.array(cond)])
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    start = np.exp(xv)
    np.testing.assert_allclose(want[0], np.negative(xv) + 4 * xv, rtol=1e-6)
    assert interpret(graph, [xv, np.array(True)])[1].shape == (4, 3)
    np.testing.assert_allclose(interpret(graph, [xv, np.array(True)])[1][1], 2 * (start + xv))


# -- mutation fuzzing: any damage to valid text is a ParseError, never anything else -----
SAMPLE = None


def _sample_text() -> str:
    global SAMPLE
    if SAMPLE is None:
        b = Builder("fuzz")
        x = b.input("x", DType.f32, (2, 3))
        c = b.input("c", DType.bool, ())
        w = b.constant(np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 12), name="w")
        y = b.add(b.exp(x), 1.5)
        (r,) = b.if_(c, lambda t: [t.mul(y, y)], lambda e: [e.sub(y, x)])
        b.output(b.cast(r, to=DType.f16, loc="source.py:12"), w)
        SAMPLE = print_graph(b.build())
    return SAMPLE


def _parse_or_parse_error(text: str) -> None:
    try:
        parse_graph(text)
    except ParseError as e:
        assert e.line >= 1 and e.column >= 1
        assert "internal error" not in e.message  # (the text itself may say "internal")


mutation_settings = settings(max_examples=300, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow])


@mutation_settings
@given(st.data())
def test_truncated_text_is_a_parse_error(data) -> None:
    text = _sample_text()
    cut = data.draw(st.integers(0, len(text) - 2))
    with pytest.raises(ParseError):
        parse_graph(text[:cut])


@mutation_settings
@given(st.data())
def test_mutated_text_parses_or_is_a_parse_error(data) -> None:
    text = _sample_text()
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(text) - 1))
        kind = data.draw(st.sampled_from(["delete", "insert", "replace", "duplicate"]))
        char = data.draw(st.sampled_from(list('%@{}[]()<>,:="0123456789-.eafgx \n')))
        if kind == "delete":
            text = text[:pos] + text[pos + 1:]
        elif kind == "insert":
            text = text[:pos] + char + text[pos:]
        elif kind == "replace":
            text = text[:pos] + char + text[pos + 1:]
        else:
            end = data.draw(st.integers(pos, min(len(text), pos + 40)))
            text = text[:end] + text[pos:end] + text[end:]
    _parse_or_parse_error(text)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
def test_arbitrary_text_is_a_parse_error(text: str) -> None:
    _parse_or_parse_error(text)


def test_deep_nesting_is_a_parse_error() -> None:
    depth = 3000
    body = "%0 = graph.if %c : f32[] {\n" * depth
    with pytest.raises(ParseError):
        parse_graph(f"graph @g(%c: bool[]) -> () {{\n{body}")
