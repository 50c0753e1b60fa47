"""The ONNX frontend: importer, per-op converters (ops/), and the Backend API."""
