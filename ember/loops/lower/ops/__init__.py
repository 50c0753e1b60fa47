"""Lowerings of graph ops, one module per family; importing this package registers them."""

from ember.loops.lower.ops import elementwise, movement  # noqa: F401  (registration)
