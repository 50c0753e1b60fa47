"""A CPython entry to compiled code: one native function that Python calls like a builtin.

A call through ctypes converts every argument and result in Python (about 1 us a call
here, and as much again for checking the arrays), so a small compiled function spent most
of its time outside its code. `fast_call_module` builds, once per process, one generic
METH_FASTCALL function

    PyObject *ember_fast_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs)

that reads what to check and run from a descriptor (`self` is a tuple whose item 0 is the
descriptor's address, the rest keeps what it points to alive): each argument must be a
plain `numpy.ndarray` of the expected dtype object, rank and shape, C-contiguous and
aligned. Then it allocates the outputs (by calling a Python allocator per output), takes
the program's arena lock without blocking, releases the GIL around the program's entry,
and returns the outputs as a list, a tuple, or the one output. Anything else (another
shape, a subclass, a strided view, a busy arena) returns `NotImplemented`, and the caller
takes its general path, which checks and explains.

The C API is called by name (MCJIT resolves it in this process); the object layouts it
reads are the offsets below, which the runtime checks against live objects before using
this (`ember.runtime.fastcall`).
"""

from __future__ import annotations

from llvmlite import ir

FUNCTION_NAME = "ember_fast_call"

# Where CPython and NumPy keep what the entry reads (64-bit builds): PyObject's type, and
# PyArrayObject's data, nd, dimensions, descr and flags.
OB_TYPE = 8
ARRAY_DATA = 16
ARRAY_NDIM = 24
ARRAY_DIMS = 32
ARRAY_DESCR = 56
ARRAY_FLAGS = 64
C_CONTIGUOUS_ALIGNED = 0x1 | 0x100  # NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED

# The descriptor: i64 fields in this order.
DESCRIPTOR_FIELDS = (
    "entry",  # int32 entry(void **inputs, void **outputs, void **constants, char *arena)
    "constants",  # void **
    "arena",  # char *
    "n_inputs",
    "n_outputs",
    "result",  # RESULT_LIST, RESULT_TUPLE or RESULT_SINGLE
    "inputs",  # per input: {PyArray_Descr *dtype, i64 rank, i64 *dims}
    "outputs",  # per output: {PyObject *allocate, PyObject *args}: allocate(*args)
    "acquire",  # the arena lock's acquire, called with `acquire_args` (blocking=False)
    "acquire_args",
    "release",  # the lock's release, called with `no_args`
    "no_args",
    "array_type",  # &PyArray_Type
    "true",  # Py_True
    "not_implemented",  # Py_NotImplemented
    "fail",  # called with a nonzero status (a failed check): raises the error it describes
)
FIELD = {name: k for k, name in enumerate(DESCRIPTOR_FIELDS)}
INPUT_FIELDS = 3
OUTPUT_FIELDS = 2
RESULT_LIST, RESULT_TUPLE, RESULT_SINGLE = 0, 1, 2

_I8P = ir.IntType(8).as_pointer()
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_OBJ = _I8P  # PyObject *


def fast_call_module(triple: str) -> ir.Module:
    """The module of `ember_fast_call` (see the module docstring)."""
    module = ir.Module("ember_fast_call")
    module.triple = triple
    api = {name: ir.Function(module, ir.FunctionType(ret, args), name) for name, ret, args in (
        ("PyTuple_GetItem", _OBJ, [_OBJ, _I64]),
        ("PyLong_AsVoidPtr", _I8P, [_OBJ]),
        ("PyObject_Call", _OBJ, [_OBJ, _OBJ, _OBJ]),
        ("Py_IncRef", ir.VoidType(), [_OBJ]),
        ("Py_DecRef", ir.VoidType(), [_OBJ]),
        ("PyEval_SaveThread", _I8P, []),
        ("PyEval_RestoreThread", ir.VoidType(), [_I8P]),
        ("PyList_New", _OBJ, [_I64]),
        ("PyList_SetItem", _I32, [_OBJ, _I64, _OBJ]),
        ("PyTuple_New", _OBJ, [_I64]),
        ("PyTuple_SetItem", _I32, [_OBJ, _I64, _OBJ]),
        ("PyLong_FromLong", _OBJ, [_I64]),
    )}
    api["PyObject_CallFunctionObjArgs"] = ir.Function(
        module, ir.FunctionType(_OBJ, [_OBJ], var_arg=True), "PyObject_CallFunctionObjArgs")
    fn = ir.Function(module, ir.FunctionType(_OBJ, [_OBJ, _OBJ.as_pointer(), _I64]),
                     FUNCTION_NAME)
    _FastCall(fn, api).emit()
    return module


class _FastCall:
    """Emits the body of `ember_fast_call` into `fn`."""

    def __init__(self, fn: ir.Function, api: dict[str, ir.Function]):
        self.fn, self.api = fn, api
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))

    # -- small helpers ---------------------------------------------------------------------
    def block(self, name: str) -> ir.Block:
        return self.fn.append_basic_block(name)

    def word(self, base: ir.Value, index: ir.Value | int, ty: ir.Type = _I64) -> ir.Value:
        """The `ty` at byte offset 8 * index of `base` (an i8*)."""
        b = self.b
        index = ir.Constant(_I64, index) if isinstance(index, int) else index
        at = b.gep(base, [b.mul(index, ir.Constant(_I64, 8))])
        return b.load(b.bitcast(at, ty.as_pointer()))

    def at_offset(self, obj: ir.Value, offset: int, ty: ir.Type) -> ir.Value:
        b = self.b
        return b.load(b.bitcast(b.gep(obj, [ir.Constant(_I64, offset)]), ty.as_pointer()))

    def field(self, name: str, ty: ir.Type = _I64) -> ir.Value:
        value = self.word(self.desc, FIELD[name])
        return value if ty == _I64 else self.b.inttoptr(value, ty)

    def counted_loop(self, name: str, count: ir.Value, body) -> None:
        """for (i = 0; i < count; i++) body(i); `body` may branch away (it must leave the
        builder in a block that falls through to the next iteration)."""
        b = self.b
        counter = self.alloca(_I64)
        b.store(ir.Constant(_I64, 0), counter)
        head, inside, done = self.block(f"{name}.head"), self.block(f"{name}.body"), \
            self.block(f"{name}.done")
        b.branch(head)
        b.position_at_end(head)
        i = b.load(counter)
        b.cbranch(b.icmp_signed("<", i, count), inside, done)
        b.position_at_end(inside)
        body(i)
        b.store(b.add(i, ir.Constant(_I64, 1)), counter)
        b.branch(head)
        b.position_at_end(done)

    def alloca(self, ty: ir.Type, count: ir.Value | None = None) -> ir.Value:
        """An alloca in the entry block (a dynamic count where given)."""
        b = self.b
        with b.goto_block(self.fn.entry_basic_block):
            if count is None:
                return b.alloca(ty)
        return b.alloca(ty, size=count)

    def unless(self, condition: ir.Value, target: ir.Block, name: str) -> None:
        """Go to `target` unless `condition` holds; continue in a fresh block."""
        ok = self.block(name)
        self.b.cbranch(condition, ok, target)
        self.b.position_at_end(ok)

    def call(self, name: str, *args: ir.Value) -> ir.Value:
        return self.b.call(self.api[name], list(args))

    def drop_outputs(self, count: ir.Value) -> None:
        """Py_DecRef the first `count` outputs made."""
        self.counted_loop("drop", count, lambda k: self.call(
            "Py_DecRef", self.b.load(self.b.gep(self.objects, [k]))))

    # -- the function ----------------------------------------------------------------------
    def emit(self) -> None:
        b = self.b
        self_obj, args, nargs = self.fn.args
        self.desc = self.call("PyLong_AsVoidPtr",
                              self.call("PyTuple_GetItem", self_obj, ir.Constant(_I64, 0)))
        decline = self.block("decline")  # NotImplemented: the caller's general path
        fail = self.block("fail")  # NULL: a Python error is set
        n_in, n_out = self.field("n_inputs"), self.field("n_outputs")
        self.unless(b.icmp_signed("==", nargs, n_in), decline, "count_ok")

        pointers_in = self.alloca(_I8P, n_in)
        self.pointers_out = self.alloca(_I8P, n_out)
        self.objects = self.alloca(_OBJ, n_out)
        self.counted_loop("check", n_in, lambda i: self.check_input(args, i, pointers_in,
                                                                     decline))
        made = self.alloca(_I64)
        b.store(ir.Constant(_I64, 0), made)
        self.counted_loop("allocate", n_out, lambda k: self.allocate_output(k, made, fail))

        # The arena is the program's: take its lock without waiting (while another thread
        # runs the program, this call goes the general way, which waits). The outputs are
        # made first: a Python allocator must not run while the lock is held.
        failed_with_outputs = self.block("failed_with_outputs")
        taken = self.call("PyObject_Call", self.field("acquire", _OBJ),
                          self.field("acquire_args", _OBJ), ir.Constant(_OBJ, None))
        self.unless(b.icmp_unsigned("!=", taken, ir.Constant(_OBJ, None)),
                    failed_with_outputs, "acquired")
        self.call("Py_DecRef", taken)
        busy = self.block("busy")
        self.unless(b.icmp_unsigned("==", taken, self.field("true", _OBJ)), busy, "run")
        entry_type = ir.FunctionType(_I32, [_I8P] * 4)
        state = self.call("PyEval_SaveThread")
        status = b.call(self.field("entry", entry_type.as_pointer()), [
            b.bitcast(pointers_in, _I8P), b.bitcast(self.pointers_out, _I8P),
            self.field("constants", _I8P), self.field("arena", _I8P)])
        self.call("PyEval_RestoreThread", state)
        released = self.call("PyObject_Call", self.field("release", _OBJ),
                             self.field("no_args", _OBJ), ir.Constant(_OBJ, None))
        self.unless(b.icmp_unsigned("!=", released, ir.Constant(_OBJ, None)),
                    failed_with_outputs, "released")
        self.call("Py_DecRef", released)
        check_failed = self.block("check_failed")
        self.unless(b.icmp_signed("==", status, ir.Constant(_I32, 0)), check_failed, "passed")
        self.return_outputs(n_out)

        # A failed check: `fail(status)` raises its error; the outputs are dropped.
        b.position_at_end(check_failed)
        code = self.call("PyLong_FromLong", b.sext(status, _I64))
        self.unless(b.icmp_unsigned("!=", code, ir.Constant(_OBJ, None)),
                    failed_with_outputs, "code_made")
        raised = self.call("PyObject_CallFunctionObjArgs", self.field("fail", _OBJ), code,
                           ir.Constant(_OBJ, None))
        self.call("Py_DecRef", code)
        self.unless(b.icmp_unsigned("==", raised, ir.Constant(_OBJ, None)), failed_with_outputs,
                    "fail.returned")
        self.call("Py_DecRef", raised)  # (it raises: never here)
        b.branch(failed_with_outputs)

        b.position_at_end(busy)
        self.drop_outputs(n_out)
        b.branch(decline)

        b.position_at_end(failed_with_outputs)
        self.drop_outputs(n_out)
        b.branch(fail)

        b.position_at_end(fail)
        b.ret(ir.Constant(_OBJ, None))

        b.position_at_end(decline)
        declined = self.field("not_implemented", _OBJ)
        self.call("Py_IncRef", declined)
        b.ret(declined)

    def check_input(self, args: ir.Value, i: ir.Value, pointers: ir.Value,
                    decline: ir.Block) -> None:
        b = self.b
        array = b.load(b.gep(args, [i]))
        spec = b.gep(self.field("inputs", _I8P), [b.mul(i, ir.Constant(_I64, 8 * INPUT_FIELDS))])
        self.unless(b.icmp_unsigned("==", self.at_offset(array, OB_TYPE, _I64),
                                    self.field("array_type")), decline, "is_array")
        self.unless(b.icmp_unsigned("==", self.at_offset(array, ARRAY_DESCR, _I64),
                                    self.word(spec, 0)), decline, "dtype_ok")
        rank = self.word(spec, 1)
        self.unless(b.icmp_signed("==", b.sext(self.at_offset(array, ARRAY_NDIM, _I32), _I64),
                                  rank), decline, "rank_ok")
        flags = self.at_offset(array, ARRAY_FLAGS, _I32)
        wanted = ir.Constant(_I32, C_CONTIGUOUS_ALIGNED)
        self.unless(b.icmp_unsigned("==", b.and_(flags, wanted), wanted), decline, "layout_ok")
        dims = b.inttoptr(self.at_offset(array, ARRAY_DIMS, _I64), _I8P)
        expected = b.inttoptr(self.word(spec, 2), _I8P)
        self.counted_loop("dims", rank, lambda d: self.unless(
            b.icmp_signed("==", self.word(dims, d), self.word(expected, d)), decline, "dim_ok"))
        b.store(b.inttoptr(self.at_offset(array, ARRAY_DATA, _I64), _I8P),
                b.gep(pointers, [i]))

    def allocate_output(self, k: ir.Value, made: ir.Value, fail: ir.Block) -> None:
        b = self.b
        spec = b.gep(self.field("outputs", _I8P), [b.mul(k, ir.Constant(_I64, 8 * OUTPUT_FIELDS))])
        array = self.call("PyObject_Call", b.inttoptr(self.word(spec, 0), _OBJ),
                          b.inttoptr(self.word(spec, 1), _OBJ), ir.Constant(_OBJ, None))
        failed = self.block("allocate.failed")
        self.unless(b.icmp_unsigned("!=", array, ir.Constant(_OBJ, None)), failed,
                    "allocated")
        b.store(array, b.gep(self.objects, [k]))
        b.store(b.inttoptr(self.at_offset(array, ARRAY_DATA, _I64), _I8P),
                b.gep(self.pointers_out, [k]))
        b.store(b.add(k, ir.Constant(_I64, 1)), made)
        after = b.block
        b.position_at_end(failed)
        self.drop_outputs(b.load(made))
        b.branch(fail)
        b.position_at_end(after)

    def return_outputs(self, n_out: ir.Value) -> None:
        b = self.b
        kind = self.field("result")
        single, many = self.block("single"), self.block("many")
        b.cbranch(b.icmp_signed("==", kind, ir.Constant(_I64, RESULT_SINGLE)), single, many)
        b.position_at_end(single)
        b.ret(b.load(self.objects))

        b.position_at_end(many)
        as_tuple = b.icmp_signed("==", kind, ir.Constant(_I64, RESULT_TUPLE))
        tuple_block, list_block = self.block("tuple"), self.block("list")
        b.cbranch(as_tuple, tuple_block, list_block)
        for block, new, set_item in ((tuple_block, "PyTuple_New", "PyTuple_SetItem"),
                                     (list_block, "PyList_New", "PyList_SetItem")):
            b.position_at_end(block)
            result = self.call(new, n_out)
            made = self.block(f"{new}.made")
            failed = self.block(f"{new}.failed")
            b.cbranch(b.icmp_unsigned("!=", result, ir.Constant(_OBJ, None)), made, failed)
            b.position_at_end(failed)
            self.drop_outputs(n_out)
            b.ret(ir.Constant(_OBJ, None))
            b.position_at_end(made)
            self.counted_loop(f"{new}.fill", n_out, lambda k, result=result, set_item=set_item:
                              self.call(set_item, result, k, b.load(b.gep(self.objects, [k]))))
            b.ret(result)
