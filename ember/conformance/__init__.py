"""Conformance suites: the ONNX backend test suite (and, later, PyTorch's OpInfo samples)."""
