"""What Ember's ONNX conformance counts: the *numeric core* of the onnx node test suite.

A node case is in the core unless it needs something Ember deliberately does not model.
Each exclusion is stated once here with its reason; everything else counts, fp16, bf16,
quantization and control flow included.
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx

# Domains whose ops are outside a numeric inference compiler.
EXCLUDED_DOMAINS = {
    "ai.onnx.preview.training": "training ops (gradients, optimizers) are not inference",
    "ai.onnx.ml": "classic-ML ops (trees, SVMs, label encoders) work on maps and strings",
}

# Ops whose results are random: there is nothing deterministic to compare.
RANDOM_OPS = {
    "Bernoulli": "random", "RandomNormal": "random", "RandomNormalLike": "random",
    "RandomUniform": "random", "RandomUniformLike": "random", "Multinomial": "random",
}

# Ops over optional values (absent-or-present), which Ember's IR has no type for.
OPTIONAL_OPS = {"Optional", "OptionalHasElement", "OptionalGetElement"}

# Ops over sequences of tensors (models may use them without declaring sequence types).
SEQUENCE_OPS = {"SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase",
                "SequenceInsert", "SequenceLength", "SequenceMap", "SplitToSequence",
                "ConcatFromSequence"}

# Element types Ember's tensors do not have.
EXCLUDED_ELEMENT_TYPES = {
    onnx.TensorProto.STRING: "strings are not numeric tensors",
    onnx.TensorProto.FLOAT8E4M3FN: "8-bit floats are not modelled",
    onnx.TensorProto.FLOAT8E4M3FNUZ: "8-bit floats are not modelled",
    onnx.TensorProto.FLOAT8E5M2: "8-bit floats are not modelled",
    onnx.TensorProto.FLOAT8E5M2FNUZ: "8-bit floats are not modelled",
    onnx.TensorProto.UINT4: "sub-byte integers are not modelled",
    onnx.TensorProto.INT4: "sub-byte integers are not modelled",
    onnx.TensorProto.COMPLEX64: "complex numbers are not modelled",
    onnx.TensorProto.COMPLEX128: "complex numbers are not modelled",
}
for _name in ("FLOAT4E2M1", "FLOAT8E8M0", "INT2", "UINT2"):
    if hasattr(onnx.TensorProto, _name):
        EXCLUDED_ELEMENT_TYPES[getattr(onnx.TensorProto, _name)] = "sub-byte or 8-bit float"

# Value kinds other than tensors.
EXCLUDED_VALUE_KINDS = {
    "sequence_type": "sequences are not tensors",
    "optional_type": "optionals are not tensors",
    "map_type": "maps are not tensors",
    "sparse_tensor_type": "sparse tensors are not modelled",
}


def _graphs(graph: onnx.GraphProto) -> Iterable[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.g.ByteSize():
                yield from _graphs(attr.g)
            for g in attr.graphs:
                yield from _graphs(g)


def _value_infos(graph: onnx.GraphProto):
    yield from graph.input
    yield from graph.output
    yield from graph.value_info


def _type_reason(type_proto: onnx.TypeProto) -> str | None:
    kind = type_proto.WhichOneof("value")
    if kind in EXCLUDED_VALUE_KINDS:
        return EXCLUDED_VALUE_KINDS[kind]
    if kind == "tensor_type":
        return EXCLUDED_ELEMENT_TYPES.get(type_proto.tensor_type.elem_type)
    return None


def exclusion_reason(model: onnx.ModelProto) -> str | None:
    """Why a model is outside the numeric core, or None when it is in it."""
    for graph in _graphs(model.graph):
        for node in graph.node:
            if node.domain in EXCLUDED_DOMAINS:
                return f"{node.domain}: {EXCLUDED_DOMAINS[node.domain]}"
            if node.op_type in RANDOM_OPS:
                return f"{node.op_type} is random"
            if node.op_type in SEQUENCE_OPS:
                return f"{node.op_type}: sequences are not tensors"
            if node.op_type in OPTIONAL_OPS:
                return f"{node.op_type}: optional values are not modelled"
            for attr in node.attribute:
                if attr.t.ByteSize() and attr.t.data_type in EXCLUDED_ELEMENT_TYPES:
                    return EXCLUDED_ELEMENT_TYPES[attr.t.data_type]
                if attr.name in ("to", "output_dtype", "dtype") and \
                        attr.i in EXCLUDED_ELEMENT_TYPES:
                    return f"{node.op_type} to {EXCLUDED_ELEMENT_TYPES[attr.i]}"
        for info in _value_infos(graph):
            reason = _type_reason(info.type)
            if reason:
                return reason
        for init in graph.initializer:
            if init.data_type in EXCLUDED_ELEMENT_TYPES:
                return EXCLUDED_ELEMENT_TYPES[init.data_type]
    return None
