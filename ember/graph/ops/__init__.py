"""Op definitions, one module per family. Importing this package registers them all."""

from ember.graph.ops import (  # noqa: F401  (registration)
    checks,
    composite,
    control,
    elementwise,
    fused,
    indexing,
    linalg,
    pool,
    reduce,
    sampling,
    shape,
    special,
    winograd,
)
from ember.graph.ops.registry import Attr, OpDef, all_opdefs, define, get_opdef, has_op

__all__ = ["Attr", "OpDef", "all_opdefs", "define", "get_opdef", "has_op"]
