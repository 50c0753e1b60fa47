"""Level 3: LLVM IR from the loop IR (`llvm`, `scalar`), and its compilation for the host
CPU (`cpu`: O3, the in-process JIT, object code)."""

from __future__ import annotations

from ember.errors import EmberError


class CodegenError(EmberError):
    """Loop IR that code generation cannot turn into LLVM IR (an op on a dtype it has no
    code for, mismatched operand types, a buffer without a planned place, ...)."""
