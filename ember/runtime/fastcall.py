"""Compiled programs called from Python without ctypes: `native_call(...)` gives a builtin
function that checks its arrays, runs the program and returns fresh outputs in one native
call (ember.codegen.pycall's `ember_fast_call`), or returns `NotImplemented` for the
caller's general path.

    call = executable.native("list")   # (native_call with its entry, arena, ...); or None
    outputs = call(x, y)               # or NotImplemented

The generic entry is compiled once per process (a few ms), each program's descriptor in
microseconds. It reads CPython's and NumPy's object layouts at fixed offsets, so it is used
only where live objects show those offsets (CPython with a GIL, 64-bit, NumPy's
PyArrayObject as 1.x and 2.x lay it out).
"""

from __future__ import annotations

import ctypes
import functools
import sys
import sysconfig
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ember.codegen import pycall
from ember.target import Target

_RESULTS = {"list": pycall.RESULT_LIST, "tuple": pycall.RESULT_TUPLE,
            "single": pycall.RESULT_SINGLE}


class _MethodDef(ctypes.Structure):
    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p),
                ("ml_flags", ctypes.c_int), ("ml_doc", ctypes.c_char_p)]


_METH_FASTCALL = 0x80


def _new_function() -> Any:
    """CPython's PyCFunction_NewEx(method, self, module), through ctypes."""
    new = ctypes.pythonapi.PyCFunction_NewEx
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.py_object, ctypes.c_void_p]
    return new


def layout_matches() -> bool:
    """Whether this process lays out objects as `ember_fast_call` reads them."""
    if (sys.implementation.name != "cpython" or ctypes.sizeof(ctypes.c_void_p) != 8
            or sysconfig.get_config_var("Py_GIL_DISABLED")):
        return False
    a = np.zeros((3, 5), np.float32)[:, 1:]  # a view: not contiguous, aligned

    def read(offset: int, kind: Any = ctypes.c_int64) -> int:
        return kind.from_address(id(a) + offset).value

    dims = read(pycall.ARRAY_DIMS)
    return (read(pycall.OB_TYPE) == id(np.ndarray) and read(pycall.ARRAY_DATA) == a.ctypes.data
            and read(pycall.ARRAY_NDIM, ctypes.c_int32) == 2
            and ctypes.c_int64.from_address(dims + 8).value == 4
            and read(pycall.ARRAY_DESCR) == id(a.dtype)
            and read(pycall.ARRAY_FLAGS, ctypes.c_int32) & 1 == 0
            and read(pycall.ARRAY_FLAGS, ctypes.c_int32) & 0x100 != 0)


@functools.cache
def _method(target: Target) -> tuple[_MethodDef, Any] | None:
    """The PyMethodDef of this process's `ember_fast_call` and the code that holds it; None
    where the layout differs."""
    if not layout_matches():
        return None
    from ember.codegen.cpu import compile_module

    # Scalar code of no particular CPU: it runs wherever the process does.
    plain = target.with_(cpu="generic", features=(), disabled=())
    jit = compile_module(pycall.fast_call_module(target.triple), plain, 2)
    method = _MethodDef(b"ember_fast_call", jit.address(pycall.FUNCTION_NAME),
                        _METH_FASTCALL, None)
    return method, jit


def _unknown_failure(status: int) -> None:
    from ember.errors import DataError

    raise DataError(f"the program failed a check (status {status})")


def native_call(entry: int, constants: int, arena: int, inputs: Sequence[tuple[Any, tuple]],
                outputs: Sequence[tuple[Callable, tuple]], lock: Any, target: Target,
                result: str = "list", owner: Any = None,
                fail: Callable[[int], Any] | None = None) -> Callable | None:
    """A builtin function running the program whose entry is at `entry` (with its constant
    pointer array and arena at those addresses) on arrays of `inputs`' (dtype, shape),
    into outputs made by `outputs`' (allocate, args) calls, under `lock`, returning them
    as `result` ("list", "tuple", or "single": the one output); None where this process
    cannot have one. A run whose entry returns a nonzero status calls `fail(status)`,
    which raises. The function keeps `owner` (what owns the code, arena and constants)
    alive."""
    if not target.runs_here():
        return None
    fail = fail or _unknown_failure
    made = _method(target)
    if made is None:
        return None
    method, jit = made
    dims = [(ctypes.c_int64 * max(1, len(shape)))(*shape) for _, shape in inputs]
    dtypes = [np.dtype(dtype) for dtype, _ in inputs]
    input_table = (ctypes.c_int64 * max(1, pycall.INPUT_FIELDS * len(inputs)))(*[
        v for dtype, (_, shape), d in zip(dtypes, inputs, dims)
        for v in (id(dtype), len(shape), ctypes.addressof(d))])
    output_args = [(allocate, tuple(args)) for allocate, args in outputs]
    output_table = (ctypes.c_int64 * max(1, pycall.OUTPUT_FIELDS * len(outputs)))(*[
        id(v) for pair in output_args for v in pair])
    acquire, release = lock.acquire, lock.release  # bound once: the descriptor holds their ids
    acquire_args, no_args = (False,), ()
    fields = {
        "entry": entry, "constants": constants, "arena": arena, "n_inputs": len(inputs),
        "n_outputs": len(outputs), "result": _RESULTS[result],
        "inputs": ctypes.addressof(input_table), "outputs": ctypes.addressof(output_table),
        "acquire": id(acquire), "acquire_args": id(acquire_args),
        "release": id(release), "no_args": id(no_args), "array_type": id(np.ndarray),
        "true": id(True), "not_implemented": id(NotImplemented), "fail": id(fail)}
    descriptor = (ctypes.c_int64 * len(pycall.DESCRIPTOR_FIELDS))(
        *[fields[name] for name in pycall.DESCRIPTOR_FIELDS])
    # Everything the descriptor points to lives as long as the function (its `self`):
    # the bound methods too, whose ids it holds.
    holder = (ctypes.addressof(descriptor), descriptor, input_table, output_table, dims,
              dtypes, output_args, acquire, release, acquire_args, no_args, fail, jit,
              method, owner)
    return _new_function()(ctypes.addressof(method), holder, None)
