"""docs/onnx.md, generated from the converter registry: `python -m ember.frontends.onnx.doc`.

A test checks that the checked-in page is current.
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx

from ember.frontends.onnx.context import supported_op_types

DOC = Path(__file__).resolve().parents[3] / "docs" / "onnx.md"

HEAD = """# ONNX support

`ember.onnx.import_model(model_or_path, input_shapes=None)` imports a model into the graph
IR; `ember.onnx.backend` implements the ONNX Backend API (`prepare`, `run_model`,
`run_node`, `supports_device`). Conformance figures: `docs/conformance.md`.

- Every opset the installed `onnx` package knows is accepted ({max_opset} here); a
  converter handles an op from the opset in the "from opset" column on, reading the
  attributes and inputs that each later version added.
- Symbolic dims (dim_params, unnamed dims) are specialized to the shapes given in
  `input_shapes`; the others stay symbolic sizes (`?batch`, docs/graph-ir.md): `Shape`
  gives `graph.size` ops and the shape computations on them (Gather, Concat, arithmetic)
  are evaluated on the sizes, so one import runs any size. Through the backend a model is
  imported once that way, and per input signature where the import needs a size as a
  number.
- Inputs that decide a result's shape (a Reshape target, Slice bounds, TopK's k, ...)
  must be constants, or, through the backend, are specialized on their run-time values.
- An op without a converter raises `UnsupportedOpError`; the importer lists every such
  op of a model (type, domain, opset, node names) in one error.

## Supported ops

{count} op types. Generated from the converter registry by
`python -m ember.frontends.onnx.doc`.

| op | domain | from opset | latest ONNX version of the op |
|---|---|---|---|
"""


def onnx_doc() -> str:
    ops = supported_op_types()
    rows = []
    for (domain, op_type), versions in ops.items():
        try:
            latest = onnx.defs.get_schema(op_type, domain=domain).since_version
        except onnx.defs.SchemaError:
            latest = "-"
        rows.append(f"| {op_type} | {domain or 'ai.onnx'} | {', '.join(map(str, versions))}"
                    f" | {latest} |")
    return HEAD.format(max_opset=onnx.defs.onnx_opset_version(), count=len(ops)) + \
        "\n".join(rows) + "\n"


if __name__ == "__main__":
    DOC.write_text(onnx_doc())
    sys.stdout.write(f"wrote {DOC}\n")
