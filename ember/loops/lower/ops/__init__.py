"""Lowerings of graph ops, one module per family; importing this package registers them."""

from ember.loops.lower.ops import (  # noqa: F401  (registration)
    attention,
    elementwise,
    indexing,
    linalg,
    movement,
    pool,
    reduce,
    sampling,
    special,
    winograd,
)
