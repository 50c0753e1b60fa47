"""The scripting frontend: a Python function's AST to graph IR (see docs/script.md).

    source.py    reading the source, positions in the user's file
    checks.py    the whitelist of constructs, checked at decoration
    function.py  a decorated function: read, checked, transformed, with liveness
    exits.py     break / continue / return as flags (every loop stays one loop op)
    liveness.py  what an `if` yields and what a loop carries
    types.py     values, weak scalars, annotations and specialization keys
    arrays.py    NumPy semantics on IR values (promotion, indexing, setitem)
    library.py   the NumPy functions, methods and builtins a script may call
    joins.py     joining a name's values where control flow meets
    emit.py, loops.py, expressions.py  the abstract interpreter that emits the graph

The decorator, its specialization cache and the calls are in ember/api/script.py.
"""

from ember.frontends.script.emit import emit_function
from ember.frontends.script.function import ScriptedFunction, is_scripted
from ember.frontends.script.types import RuntimeInput, Tensor, TensorSpec, arg_key

__all__ = ["RuntimeInput", "ScriptedFunction", "Tensor", "TensorSpec", "arg_key", "emit_function",
           "is_scripted"]
