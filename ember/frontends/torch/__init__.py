"""The PyTorch frontend: torch.export capture, the `ember` torch.compile backend, and the
converters from core ATen ops to the graph IR (aten_*.py)."""
