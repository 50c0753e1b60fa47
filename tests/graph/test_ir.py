"""The graph IR core: builder, verifier, interpreter entry checks, control flow."""

from __future__ import annotations

import numpy as np
import pytest

from ember import (
    BadAttributeError,
    Builder,
    DType,
    EmberError,
    InterpreterError,
    ShapeError,
    TensorType,
    UnsupportedOpError,
    VerificationError,
    interpret,
    verify_graph,
)
from ember.graph.ir import Region, Value


def small_graph():
    b = Builder("g")
    x = b.input("x", DType.f32, (2, 3))
    y = b.exp(x, loc="model.py:3")
    z = b.add(y, x)
    b.output(z)
    return b.build(), (x, y, z)


def test_tensor_type_basics() -> None:
    t = TensorType(DType.f16, (2, 3))
    assert str(t) == "f16[2,3]" and t.numel == 6 and t.nbytes == 12 and t.rank == 2
    assert str(TensorType(DType.bool, ())) == "bool[]"
    with pytest.raises(TypeError):
        TensorType("f32", (1,))


def test_builder_infers_types_and_names_errors_with_origin() -> None:
    graph, (x, y, z) = small_graph()
    assert z.type == TensorType(DType.f32, (2, 3))
    b = Builder("bad")
    a = b.input("a", DType.f32, (2, 3))
    i = b.input("i", DType.i32, (2, 3))
    with pytest.raises(ShapeError,
                       match=r"graph.add \(onnx node 'Add_7'\): operands must have one"):
        b.add(a, i, loc="onnx node 'Add_7'")
    with pytest.raises(ShapeError, match="has dtype i32, expected one of"):
        b.exp(i)
    with pytest.raises(BadAttributeError, match="needs attribute 'to'"):
        b.cast(a)
    with pytest.raises(BadAttributeError, match="attribute 'to': expected a dtype, got 3"):
        b.cast(a, to=3)
    with pytest.raises(BadAttributeError, match="no attribute"):
        b.exp(a, axis=1)
    with pytest.raises(ShapeError, match="takes 2 operands, got 1"):
        b.op("add", [a])
    with pytest.raises(UnsupportedOpError, match="unknown op 'graph.nonsense'"):
        b.op("nonsense", [a])
    with pytest.raises(AttributeError):
        b.nonsense  # noqa: B018


def test_python_scalars_become_constants_of_the_other_operand_type() -> None:
    b = Builder("g")
    x = b.input("x", DType.f16, (3,))
    y = b.mul(x, 2)
    assert y.type == TensorType(DType.f16, (3,))
    b.output(y)
    out = interpret(b.build(), [np.array([1, 2, 3], np.float16)])[0]
    assert out.dtype == np.float16 and list(out) == [2, 4, 6]


def test_verifier_accepts_built_graphs_and_rejects_broken_ones() -> None:
    graph, (x, y, z) = small_graph()
    assert verify_graph(graph) is graph

    graph.ops.reverse()  # add now uses exp's result before exp runs
    with pytest.raises(VerificationError, match=r"graph.add uses .* before its definition"):
        verify_graph(graph)

    graph, (x, y, z) = small_graph()
    graph.ops[0].results[0].type = TensorType(DType.f32, (3, 2))
    with pytest.raises(VerificationError, match=r"graph.exp \(model.py:3\): result types"):
        verify_graph(graph)

    graph, _ = small_graph()
    graph.ops[0].attrs["axis"] = 1
    with pytest.raises(VerificationError, match="no attribute"):
        verify_graph(graph)

    graph, _ = small_graph()
    graph.ops[0].name = "frobnicate"
    with pytest.raises(VerificationError, match="unknown op"):
        verify_graph(graph)

    graph, _ = small_graph()
    stray = Value(TensorType(DType.f32, (2, 3)), None, 0, "stray")
    graph.outputs[0] = stray
    with pytest.raises(VerificationError, match="terminator uses"):
        verify_graph(graph)


def test_verifier_checks_regions() -> None:
    b = Builder("g")
    x = b.input("x", DType.f32, (4,))
    c = b.input("c", DType.bool, ())
    inner = []

    def then(t):
        inner.append(t.exp(x))
        return [inner[0]]

    (r,) = b.if_(c, then, lambda e: [x])
    b.output(r)
    graph = b.build()
    graph.outputs[0] = inner[0]  # a value from inside the then region
    with pytest.raises(VerificationError, match="outside its region"):
        verify_graph(graph)

    graph.outputs[0] = r
    graph.ops[-1].regions[1].outputs = [c]  # else now yields bool[]
    with pytest.raises(VerificationError, match="then region yields"):
        verify_graph(graph)

    graph.ops[-1].regions[1].outputs = [x]
    graph.ops[-1].regions.append(Region())
    with pytest.raises(VerificationError, match="has 3 regions, expected 2"):
        verify_graph(graph)


def test_verifier_checks_constant_table() -> None:
    b = Builder("g")
    b.output(b.constant(np.zeros((4, 8), np.float32), name="w"))
    graph = b.build()
    graph.constants["w"] = np.zeros((4, 9), np.float32)
    with pytest.raises(VerificationError, match="result types"):
        verify_graph(graph)
    del graph.constants["w"]
    with pytest.raises(VerificationError, match="not in the graph's constant table"):
        verify_graph(graph)


def test_interpreter_checks_inputs() -> None:
    graph, _ = small_graph()
    good = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(interpret(graph, [good])[0], np.e + 1, rtol=1e-6)
    np.testing.assert_allclose(interpret(graph, {"x": good})[0], np.e + 1, rtol=1e-6)
    with pytest.raises(ShapeError, match="takes 1 inputs, got 2"):
        interpret(graph, [good, good])
    with pytest.raises(ShapeError, match=r"input 0 \(%x\): expected f32, got float64"):
        interpret(graph, [good.astype(np.float64)])
    with pytest.raises(ShapeError, match=r"expected shape \[2, 3\], got \[3, 2\]"):
        interpret(graph, [good.T.copy()])
    with pytest.raises(ShapeError, match="missing"):
        interpret(graph, {"y": good})


def test_loop_with_early_exit_and_scan_length_check() -> None:
    b = Builder("g")
    x = b.input("x", DType.f32, ())
    n = b.constant(np.int64(100))
    true = b.constant(True)

    def body(lb, i, acc):
        nxt = lb.add(acc, 1.0)
        return [lb.lt(nxt, 10.0), nxt]

    (final,) = b.loop(n, true, [x], body)
    b.output(final)
    graph = b.build()
    assert interpret(graph, [np.float32(3.5)])[0] == np.float32(10.5)

    b = Builder("scan")
    x = b.input("x", DType.f32, ())
    n = b.input("n", DType.i64, ())
    true = b.constant(True)
    b.output(*b.loop(n, true, [x], lambda lb, i, acc: [true, acc, lb.cast(i, to=DType.f32)],
                     num_scan=1, scan_length=3))
    graph = b.build()
    assert list(interpret(graph, [np.float32(0), np.int64(3)])[1]) == [0, 1, 2]
    with pytest.raises(InterpreterError, match="ran 5 iterations, but its scan outputs"):
        interpret(graph, [np.float32(0), np.int64(5)])


def test_errors_are_ember_errors() -> None:
    for cls in (ShapeError, VerificationError, InterpreterError, BadAttributeError,
                UnsupportedOpError):
        assert issubclass(cls, EmberError)
