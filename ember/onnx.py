"""`ember.onnx`: import ONNX models, and the ONNX Backend API.

    from ember.onnx import import_model, backend
    graph = import_model("model.onnx", input_shapes={"input": (1, 3, 224, 224)})
    outputs = backend.prepare("model.onnx").run([x])
"""

from ember.api import onnx_backend as _backend_module
from ember.frontends.onnx.context import supported_op_types
from ember.frontends.onnx.importer import import_model, load_model

backend = _backend_module
__all__ = ["backend", "import_model", "load_model", "supported_op_types"]
