"""The ONNX importer and Backend API: inputs, specialization, and every kind of bad model."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ember import EmberError, ShapeError, UnsupportedOpError, interpret
from ember.graph.symbolic import symbol
from ember.onnx import backend, import_model


def make_model(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def add_relu_model(shape=("N", 4)) -> onnx.ModelProto:
    return make_model(
        [helper.make_node("Add", ["x", "b"], ["s"], name="add0"),
         helper.make_node("Relu", ["s"], ["y"], name="relu0")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        [numpy_helper.from_array(np.array([1, -2, 3, -4], np.float32), "b")])


def test_import_runs_and_keeps_names_and_origins() -> None:
    graph = import_model(add_relu_model(), input_shapes={"x": (2, 4)})
    x = np.array([[0, 0, 0, 0], [1, 1, 1, 1]], np.float32)
    np.testing.assert_array_equal(interpret(graph, [x])[0], [[1, 0, 3, 0], [2, 0, 4, 0]])
    text = str(graph)
    assert "%x: f32[2,4]" in text and "%s = graph.add %x, %b" in text
    assert "loc(\"onnx Add 'add0'\")" in text


def test_symbolic_dims_are_sizes_unless_given() -> None:
    graph = import_model(add_relu_model())
    assert graph.inputs[0].shape == (symbol("N"), 4)
    for rows in (1, 5):
        x = np.ones((rows, 4), np.float32)
        np.testing.assert_array_equal(interpret(graph, [x])[0], np.tile([2, 0, 4, 0], (rows, 1)))
    assert import_model(add_relu_model(), input_shapes={"x": (2, 4)}).inputs[0].shape == (2, 4)
    with pytest.raises(ShapeError, match=r"dim 1 is 3, expected 4"):
        interpret(graph, [np.ones((2, 3), np.float32)])


def _dynamic_reshape_model() -> onnx.ModelProto:
    """x [batch, seq, 8] -> MatMul -> Reshape to (batch, -1, 2, 2) through Shape, Gather,
    Unsqueeze and Concat (a torch.onnx export's shape computation), Softmax."""
    rng = np.random.default_rng(0)
    ints = {"zero": np.array(0, np.int64), "axes0": np.array([0], np.int64),
            "tail": np.array([-1, 2, 2], np.int64)}
    return make_model(
        [helper.make_node("MatMul", ["x", "w"], ["mm"]),
         helper.make_node("Shape", ["mm"], ["shape"]),
         helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
         helper.make_node("Unsqueeze", ["batch", "axes0"], ["batch1"]),
         helper.make_node("Concat", ["batch1", "tail"], ["target"], axis=0),
         helper.make_node("Reshape", ["mm", "target"], ["r"]),
         helper.make_node("Softmax", ["r"], ["y"], axis=-1)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", None, 2, 2])],
        [numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w"),
         *(numpy_helper.from_array(v, k) for k, v in ints.items())])


@pytest.mark.parametrize("executor", ["interp", "cpu"])
def test_dynamic_axes_run_any_size_from_one_import(executor) -> None:
    """Batch and sequence as dim_params: one symbolic import (the shape computation on
    ?batch evaluated at import), any sizes after, matching ONNX Runtime."""
    ort = pytest.importorskip("onnxruntime")
    model = _dynamic_reshape_model()
    rep = backend.prepare(model, executor=executor)
    session = ort.InferenceSession(model.SerializeToString())
    rng = np.random.default_rng(1)
    for batch, seq in ((1, 3), (4, 7), (2, 1)):
        x = rng.standard_normal((batch, seq, 8)).astype(np.float32)
        np.testing.assert_allclose(rep.run([x])[0], session.run(None, {"x": x})[0],
                                   rtol=1e-5, atol=1e-6)
    graph, runner = rep.symbolic()
    assert "graph.size {value = ?batch}" in str(graph)
    assert rep.specializations == []  # nothing was imported per signature
    if executor == "cpu":  # and compiled once, for every size
        assert runner.generic is not None and runner.compilations == 1, runner.why_specialized


def test_model_from_path_and_bytes(tmp_path) -> None:
    model = add_relu_model((3, 4))
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    assert import_model(path).inputs[0].shape == (3, 4)
    assert import_model(str(path)).inputs[0].shape == (3, 4)
    assert import_model(model.SerializeToString()).inputs[0].shape == (3, 4)


def _bad_files(tmp_path):
    data = add_relu_model((3, 4)).SerializeToString()
    files = {"text.onnx": b"this is not a model\n", "empty.onnx": b"",
             "noise.onnx": np.random.default_rng(0).integers(0, 256, 4096, np.uint8).tobytes()}
    for cut in (1, 7, len(data) // 3, len(data) // 2, len(data) - 3):
        files[f"truncated_{cut}.onnx"] = data[:cut]
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    return sorted(tmp_path.iterdir())


def test_truncated_corrupt_and_non_onnx_files_give_clear_errors(tmp_path) -> None:
    for path in _bad_files(tmp_path):
        with pytest.raises(EmberError) as info:
            import_model(path)
        assert str(path.name) in str(info.value) or "not a valid ONNX model" in str(info.value)
    with pytest.raises(EmberError, match="no ONNX model at"):
        import_model(tmp_path / "missing.onnx")
    with pytest.raises(EmberError, match="expected an ONNX model or a path"):
        import_model(42)


def test_every_truncation_is_an_ember_error_or_a_model(tmp_path) -> None:
    data = add_relu_model((3, 4)).SerializeToString()
    for cut in range(0, len(data), 3):
        try:
            import_model(data[:cut])
        except EmberError:
            pass


def test_dangling_input_name() -> None:
    model = make_model([helper.make_node("Relu", ["nowhere"], ["y"], name="r")],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    with pytest.raises(EmberError, match="input 'nowhere' is not defined by any node"):
        import_model(model)
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="r")],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                       [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])])
    with pytest.raises(EmberError, match="graph output 'z' is not defined"):
        import_model(model)


def test_all_unsupported_ops_are_reported_at_once() -> None:
    model = make_model(
        [helper.make_node("FrobnicateA", ["x"], ["a"], name="fa"),
         helper.make_node("Relu", ["a"], ["b"], name="r"),
         helper.make_node("FrobnicateB", ["b"], ["c"], name="fb1"),
         helper.make_node("FrobnicateB", ["c"], ["y"], name="fb2"),
         helper.make_node("Custom", ["y"], ["z"], name="c", domain="com.example")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])])
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedOpError) as info:
        import_model(model)
    message = str(info.value)
    assert "3 op(s)" in message
    assert "FrobnicateA (domain ai.onnx, opset 17): nodes fa" in message
    assert "FrobnicateB (domain ai.onnx, opset 17): nodes fb1, fb2" in message
    assert "Custom (domain com.example, opset 1): nodes c" in message
    with pytest.raises(UnsupportedOpError):  # the backend refuses at prepare time
        backend.prepare(model)


def test_unsupported_element_type() -> None:
    model = make_model([helper.make_node("Identity", ["x"], ["y"])],
                       [helper.make_tensor_value_info("x", TensorProto.STRING, [2])],
                       [helper.make_tensor_value_info("y", TensorProto.STRING, [2])])
    with pytest.raises(UnsupportedOpError, match="element type STRING"):
        import_model(model)


def test_backend_api() -> None:
    model = add_relu_model((2, 4))
    assert backend.supports_device("CPU") and not backend.supports_device("CUDA")
    x = np.ones((2, 4), np.float32)
    (y,) = backend.run_model(model, [x])
    np.testing.assert_array_equal(y, np.maximum(x + [1, -2, 3, -4], 0))
    (y,) = backend.prepare(model).run({"x": x})
    assert y.shape == (2, 4)
    node = helper.make_node("Add", ["a", "b"], ["c"])
    (c,) = backend.run_node(node, [x, x])
    np.testing.assert_array_equal(c, 2 * x)
    with pytest.raises(ShapeError, match="takes 1 inputs, got 2"):
        backend.prepare(model).run([x, x])
    with pytest.raises(ShapeError, match="expected f32, got float64"):
        backend.prepare(model).run([x.astype(np.float64)])
    with pytest.raises(EmberError, match="unknown executor"):
        backend.prepare(model, executor="tpu")


def test_backend_specializes_on_shape_deciding_inputs() -> None:
    model = make_model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="r")],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                        helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    rep = backend.prepare(model)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    assert rep.run([x, np.array([3, 4])])[0].shape == (3, 4)
    assert rep.run([x, np.array([4, 3])])[0].shape == (4, 3)
    assert rep.run([x, np.array([3, 4])])[0].shape == (3, 4)
    assert len(rep.specializations) == 2
    assert all(set(s.values) == {"shape"} for s in rep.specializations)
    with pytest.raises(UnsupportedOpError, match="must be a constant: it decides a shape"):
        import_model(model)  # without values there is no static shape


def test_ember_compile_accepts_onnx_models_and_graphs(tmp_path) -> None:
    import ember

    model = add_relu_model((2, 4))
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    x = np.ones((2, 4), np.float32)
    (y,) = ember.compile(str(path)).run([x])
    np.testing.assert_array_equal(y, [[2, 0, 4, 0]] * 2)
    graph = import_model(model)
    np.testing.assert_array_equal(ember.compile(graph)(x)[0], y)
    with pytest.raises(EmberError, match="cannot compile a dict"):
        ember.compile({})


def test_a_string_field_that_is_not_utf8_is_refused_with_its_path() -> None:
    """Found by the importer's fuzzer (fuzz/corpus/onnx_model/crash-invalid-utf8-graph-name):
    protobuf hands back a string field holding bytes that are not UTF-8 as `bytes`, and
    the importer failed on it with a TypeError."""
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
                                   [onnx.helper.make_tensor_value_info("x", 1, [2])],
                                   [onnx.helper.make_tensor_value_info("y", 1, [2])])
    data = onnx.helper.make_model(graph).SerializeToString().replace(b"\x12\x01g",
                                                                     b"\x12\x01\xfc")
    with pytest.raises(EmberError, match=r"model\.graph\.name is not UTF-8"):
        import_model(data)


def test_an_attribute_of_another_kind_than_the_schema_declares_is_refused() -> None:
    """Found by the importer's fuzzer (fuzz/corpus/onnx_model/crash-attribute-of-another-
    kind): a Flatten whose `axis` held a list failed with a TypeError in its converter."""
    node = onnx.helper.make_node("Flatten", ["x"], ["y"])
    node.attribute.append(onnx.helper.make_attribute("axis", [1, 2]))
    graph = onnx.helper.make_graph([node], "g",
                                   [onnx.helper.make_tensor_value_info("x", 1, [2, 3])],
                                   [onnx.helper.make_tensor_value_info("y", 1, [2, 3])])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
    with pytest.raises(EmberError, match="attribute 'axis' is INTS; the operator declares"
                                         " it INT"):
        import_model(model)


def test_an_attribute_the_operator_does_not_declare_is_refused() -> None:
    """Found by tests/conformance/test_numerics.py: a ReduceMax at opset 18 (where `axes`
    became an input) with an `axes` attribute reduced every axis, the attribute ignored."""
    node = onnx.helper.make_node("ReduceMax", ["x"], ["y"], axes=[1])
    graph = onnx.helper.make_graph([node], "g",
                                   [onnx.helper.make_tensor_value_info("x", 1, [2, 3])],
                                   [onnx.helper.make_tensor_value_info("y", 1, None)])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    with pytest.raises(EmberError, match="attribute 'axes' is not one that ReduceMax declares"
                                         " at opset 18"):
        import_model(model)
    model.opset_import[0].version = 17  # where ReduceMax declares it
    assert import_model(model).outputs[0].type.shape == (2, 1)


def test_a_recurrent_node_without_its_weights_is_refused() -> None:
    """Found by the importer's fuzzer (fuzz/corpus/onnx_model/crash-rnn-without-weights):
    an RNN whose W input was missing failed with an AttributeError in its converter."""
    node = onnx.helper.make_node("RNN", ["x", "", "r"], ["y"], hidden_size=2)
    graph = onnx.helper.make_graph(
        [node], "g", [onnx.helper.make_tensor_value_info("x", 1, [3, 1, 2]),
                      onnx.helper.make_tensor_value_info("r", 1, [1, 2, 2])],
        [onnx.helper.make_tensor_value_info("y", 1, None)])
    with pytest.raises(EmberError, match="input 1 is required"):
        import_model(onnx.helper.make_model(graph))
