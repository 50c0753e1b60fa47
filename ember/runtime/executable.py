"""A compiled program as a Python callable: one native call per inference.

    exe = Executable(program, plan, entry, engine, constants)
    y, = exe(x)                 # NumPy arrays or CPU torch tensors in, NumPy arrays out
    exe(x, out=[y])             # or write into the caller's buffers

The entry has the C signature `int32_t entry(void **inputs, void **outputs, void
**constants, char *arena)`: the pointer arrays follow the order of the program's buffers of
each kind; it returns 0, or which check failed (`Interface.failure`: a DataError).
Inputs are checked (count, dtype, shape) before the call, so a mismatch raises ShapeError
instead of running native code on the wrong memory. Contiguous inputs pass by pointer,
without a copy; others are copied first. The executable owns its arena (allocated once,
64-byte aligned) and its constants, so one call is one native call and no allocation
besides the outputs.

A program compiled for every size (`Program.sizes`) runs as a `SizedExecutable`, whose
entry also takes the sizes and the temps' arena offsets (`int64_t *sizes, int64_t
*offsets`): each call binds the sizes from its inputs' shapes, and each binding gets its
output shapes and its packing of the arena once.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember.dtypes import DType
from ember.errors import DataError, EmberError, ShapeError
from ember.graph.bind import bind_shapes
from ember.graph.symbolic import bind, parse_dim
from ember.loops.ir import Buffer, Program, failure_message
from ember.runtime.fastcall import native_call
from ember.runtime.memory_plan import ALIGNMENT, MemoryPlan, check_fits, plan_memory
from ember.runtime.pool import OUTPUTS
from ember.target import Target

# Plain calls of an executable before it makes its native call (a compile that runs once,
# as most tests do, makes none).
NATIVE_AFTER_CALLS = 2

# int32_t entry(void **inputs, void **outputs, void **constants, char *arena): the status
# (`failure`)
ENTRY_TYPE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_void_p, ctypes.c_void_p)


@dataclass(frozen=True)
class Interface:
    """What running a compiled program needs to know of it: its buffers of each kind in the
    order of the entry's pointer arrays, its kernels and the entry's symbol. It is all that
    the disk cache keeps of the Program."""

    name: str
    entry: str
    inputs: tuple[Buffer, ...]
    outputs: tuple[Buffer, ...]
    constants: tuple[Buffer, ...]
    temps: tuple[Buffer, ...]
    kernels: tuple[str, ...] = ()
    # A program compiled for every size: the entry's size arguments, in order (`Program.
    # sizes`), and the largest value each may take (the graph's `size_bounds`).
    sizes: tuple[str, ...] = ()
    bounds: tuple[tuple[str, int], ...] = ()
    # (output, input) positions: the output is computed in that input's memory (the
    # graph's `aliases`): a run is given the input's memory as the output's, or a copy.
    aliases: tuple[tuple[int, int], ...] = ()
    # The origin of each call that checks values (`Program.status_calls`), by the number
    # the entry's status gives it.
    checks: tuple[str, ...] = ()

    @classmethod
    def of(cls, program: Program, entry: str = "") -> Interface:
        buffers = [tuple(program.of_kind(k)) for k in ("input", "output", "constant", "temp")]
        names = [[b.name for b in kind] for kind in buffers[:2]]
        aliases = tuple(sorted((names[1].index(out), names[0].index(source))
                               for out, source in program.aliases.items()))
        checks = tuple(program.kernel(c.kernel).origin or c.kernel
                       for c in program.status_calls())
        return cls(program.name, entry, *buffers, tuple(k.name for k in program.kernels),
                   program.sizes, tuple(sorted(program.size_bounds.items())), aliases, checks)

    def failure(self, status: int) -> DataError:
        """The error of a run whose entry returned `status` (nonzero): the check of call
        number `status >> 8` failed with code `status & 255`."""
        return DataError(failure_message(self.name, self.checks, status))

    def to_json(self) -> dict[str, Any]:
        def bufs(bs: tuple[Buffer, ...]) -> list[list[Any]]:
            return [[b.name, b.dtype.value, [d if isinstance(d, int) else str(d)
                                             for d in b.shape]] for b in bs]

        return {"name": self.name, "entry": self.entry, "inputs": bufs(self.inputs),
                "outputs": bufs(self.outputs), "constants": bufs(self.constants),
                "temps": bufs(self.temps), "kernels": list(self.kernels),
                "sizes": list(self.sizes), "bounds": [list(b) for b in self.bounds],
                "aliases": [list(a) for a in self.aliases], "checks": list(self.checks)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Interface:
        def bufs(items: list[list[Any]]) -> tuple[Buffer, ...]:
            return tuple(Buffer(n, DType(t), tuple(parse_dim(x) if isinstance(x, str)
                                                   else int(x) for x in s))
                         for n, t, s in items)

        return cls(d["name"], d["entry"], bufs(d["inputs"]), bufs(d["outputs"]),
                   bufs(d["constants"]), bufs(d["temps"]), tuple(d["kernels"]),
                   tuple(d.get("sizes", ())), tuple((n, int(v)) for n, v in d.get("bounds", ())),
                   tuple((int(k), int(j)) for k, j in d.get("aliases", ())),
                   tuple(str(c) for c in d.get("checks", ())))


def _in_place(iface: Interface, arrays: list[np.ndarray], outputs: list[np.ndarray],
              given: bool) -> list[np.ndarray]:
    """The inputs to run on, with `outputs` ready for them: an output computed in an
    input's memory (`Interface.aliases`) that is not that memory gets a copy of it first;
    any other input that shares memory with an output buffer the caller `given` is read
    from a copy."""
    aliased = set()
    for k, j in iface.aliases:
        if not np.may_share_memory(outputs[k], arrays[j]):
            np.copyto(outputs[k], arrays[j])
        elif not (outputs[k].ctypes.data == arrays[j].ctypes.data and
                  outputs[k].shape == arrays[j].shape):
            raise ShapeError(f"output {k} of {iface.name} is computed in input {j}'s"
                             " memory: give that array itself, or one that shares none")
        aliased.add((k, j))
    if not given:
        return arrays
    return [a.copy() if any(np.may_share_memory(a, o) for k, o in enumerate(outputs)
                            if (k, j) not in aliased) else a for j, a in enumerate(arrays)]


def _describe(b: Buffer) -> str:
    return f"{b.dtype.value}[{','.join(map(str, b.shape))}]"


def _type_of(a: np.ndarray) -> str:
    return f"{a.dtype}[{','.join(map(str, a.shape))}]"


def as_array(x: Any, what: str) -> np.ndarray:
    """A NumPy view of an array or a CPU torch tensor (bf16 through an int16 view), without
    copying; anything else through np.asarray."""
    if isinstance(x, np.ndarray):
        return x
    if type(x).__module__.startswith("torch"):
        import torch

        if isinstance(x, torch.Tensor):
            if x.device.type != "cpu":
                raise ShapeError(f"{what}: a tensor on {x.device}; compiled CPU code needs"
                                 " CPU tensors")
            x = x.detach().resolve_conj().resolve_neg()
            if x.dtype == torch.bfloat16:
                return x.view(torch.int16).numpy().view(DType.bf16.np)
            return x.numpy()
    try:
        return np.asarray(x)
    except Exception as e:  # an object NumPy cannot read is a bad input, not a crash
        raise ShapeError(f"{what}: cannot read a {type(x).__name__} as an array ({e})") from e


def _check(a: np.ndarray, b: Buffer, what: str) -> np.ndarray:
    """`a` as `b` expects it: the same dtype and shape, native byte order, C-contiguous and
    aligned (copied when it is not)."""
    want = b.dtype.np
    if a.dtype != want and a.dtype.newbyteorder("=") == want:
        a = a.astype(want)  # a byte-swapped array of the right type: convert, don't reject
    if a.dtype != want or a.shape != b.shape:
        raise ShapeError(f"{what}: expected {_describe(b)}, got {_type_of(a)}")
    if not (a.flags.c_contiguous and a.flags.aligned):
        a = np.array(a, order="C", copy=True)
    return a


def data_address(a: np.ndarray) -> int:
    """The address of C-contiguous `a`'s data. `a.ctypes.data` builds a ctypes view at each
    call (about 0.8 us); a writeable array's buffer gives it in about 0.3 us."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError):  # read-only, or empty
        return a.ctypes.data


def _aligned_empty(nbytes: int) -> tuple[np.ndarray, np.ndarray]:
    """A zeroed byte array of `nbytes` whose data is ALIGNMENT-aligned, and its owner."""
    check_fits(nbytes, "the scratch arena")
    owner = np.zeros(nbytes + ALIGNMENT, np.uint8)
    start = -owner.ctypes.data % ALIGNMENT
    return owner[start:start + nbytes], owner


def _check_count(iface: Interface, inputs: Sequence[Any]) -> None:
    if len(inputs) != len(iface.inputs):
        raise ShapeError(f"{iface.name} takes {len(iface.inputs)} inputs"
                         f" ({', '.join('%' + b.name for b in iface.inputs)}),"
                         f" got {len(inputs)}")


def _given_outputs(name: str, buffers: Sequence[Buffer], out: Any
                   ) -> tuple[list[Any], list[np.ndarray]]:
    """The caller's `out` buffers as the arrays the entry writes; they must match exactly
    (they cannot be copied into)."""
    if not isinstance(out, (list, tuple)):
        out = [out]
    if len(out) != len(buffers):
        raise ShapeError(f"{name} has {len(buffers)} outputs, got {len(out)} out= buffers")
    arrays = []
    for i, (x, b) in enumerate(zip(out, buffers)):
        what = f"out= buffer {i} (%{b.name})"
        a = as_array(x, what)
        if a.dtype != b.dtype.np or a.shape != b.shape:
            raise ShapeError(f"{what}: expected {_describe(b)}, got {_type_of(a)}")
        if not (a.flags.c_contiguous and a.flags.aligned and a.flags.writeable):
            raise ShapeError(f"{what}: must be a writeable, C-contiguous array")
        for j, other in enumerate(arrays):  # (each would overwrite the other's results)
            if a.nbytes and other.nbytes and np.may_share_memory(a, other):
                raise ShapeError(f"{what} shares memory with out= buffer {j}")
        arrays.append(a)
    return list(out), arrays


def entry_function(entry: Any, entry_type: Any = ENTRY_TYPE) -> Any:
    """The entry as a ctypes function of `entry_type`, from an address or a ctypes
    function."""
    if isinstance(entry, int):
        address = entry
    else:
        address = ctypes.cast(entry, ctypes.c_void_p).value
    if not address:
        raise EmberError("the compiled entry has no address")
    return entry_type(address)


class Executable:
    """A compiled program, ready to run. `engine` is whatever keeps the code alive (an
    llvmlite execution engine); it is only held."""

    def __init__(self, program: Program | Interface, plan: MemoryPlan, entry: Any, engine: Any,
                 constants: dict[str, np.ndarray] | Sequence[np.ndarray] | None = None,
                 notes: dict[str, Any] | None = None, target: Target | None = None):
        # What the build recorded (timings, the kernel table), for explain and the demo.
        self.notes = notes or {}
        self.target = target  # what the code was compiled for (None: not known here)
        self.interface = program if isinstance(program, Interface) else Interface.of(program)
        self.program = program if isinstance(program, Program) else None
        self.plan = plan
        self.engine = engine
        self._entry = entry_function(entry)
        self._entry_address = ctypes.cast(self._entry, ctypes.c_void_p).value
        iface = self.interface
        if constants is None:
            constants = self.program.constants if self.program is not None else {}
        if isinstance(constants, dict):
            missing = [b.name for b in iface.constants if b.name not in constants]
            if missing:
                raise EmberError(f"no data for constant buffers {', '.join(missing)}")
            constants = [constants[b.name] for b in iface.constants]
        if len(constants) != len(iface.constants):
            raise EmberError(f"{len(constants)} constant arrays for"
                             f" {len(iface.constants)} constant buffers")
        try:
            self.constants = [_check(np.asarray(c), b, f"constant %{b.name}")
                              for c, b in zip(constants, iface.constants)]
        except ShapeError as e:
            raise EmberError(f"bad constant data: {e}") from e
        self._constant_ptrs = (ctypes.c_void_p * max(1, len(self.constants)))(
            *(c.ctypes.data for c in self.constants))
        self.arena, self._arena_owner = _aligned_empty(plan.arena_size)
        self._lock = threading.Lock()  # one arena: calls from several threads take turns
        # The entry's pointer arrays, filled under the lock at each call: building them
        # afresh cost microseconds of a 30-us model.
        self._in_ptrs = (ctypes.c_void_p * max(1, len(iface.inputs)))()
        self._out_ptrs = (ctypes.c_void_p * max(1, len(iface.outputs)))()
        self._entry_args = (ctypes.addressof(self._in_ptrs), ctypes.addressof(self._out_ptrs),
                            ctypes.addressof(self._constant_ptrs), self.arena.ctypes.data)
        self._expected = tuple((b.dtype.np, b.shape) for b in iface.inputs)
        self._output_specs = tuple((b.shape, b.dtype.np) for b in iface.outputs)
        self._natives: dict[str, Any] = {}
        self._plain_calls = 0  # calls before the native call is made (`native`)

    @property
    def input_types(self) -> list[Buffer]:
        return list(self.interface.inputs)

    @property
    def output_types(self) -> list[Buffer]:
        return list(self.interface.outputs)

    def __call__(self, *inputs: Any, out: Any = None) -> list[np.ndarray]:
        if out is None:
            fast = self._natives.get("list")
            if fast is not None:
                result = fast(*inputs)
                if result is not NotImplemented:
                    return result
            elif self._plain_calls < NATIVE_AFTER_CALLS:
                self._plain_calls += 1
            elif "list" not in self._natives:  # (asked once: None where there is none)
                self.native("list")
        iface = self.interface
        _check_count(iface, inputs)
        plain = all(type(x) is np.ndarray and x.dtype == dtype and x.shape == shape
                    and x.flags.c_contiguous and x.flags.aligned
                    for x, (dtype, shape) in zip(inputs, self._expected))
        if plain and out is None and not iface.aliases:
            return self.run_addresses([data_address(x) for x in inputs])  # the common call
        if plain and not iface.aliases and type(out) in (list, tuple) and \
                len(out) == len(self._output_specs) and \
                all(type(o) is np.ndarray and o.dtype == dtype and o.shape == shape and
                    o.flags.c_contiguous and o.flags.aligned and o.flags.writeable
                    and not any(np.may_share_memory(x, o) for x in inputs)
                    for o, (shape, dtype) in zip(out, self._output_specs)) and \
                not any(np.may_share_memory(a, b) for i, a in enumerate(out) for b in out[:i]):
            # The common call with out= buffers that share no memory with the inputs or
            # each other.
            self.run_into([data_address(x) for x in inputs], [data_address(o) for o in out])
            return list(out)
        arrays = [_check(as_array(x, f"input {i} (%{b.name})"), b, f"input {i} (%{b.name})")
                  for i, (x, b) in enumerate(zip(inputs, iface.inputs))]
        results, outputs = self._outputs(out)
        arrays = _in_place(iface, arrays, outputs, out is not None)
        self.run_into([data_address(a) for a in arrays], [data_address(a) for a in outputs])
        return results

    def native(self, result: str = "list") -> Any:
        """This program as a builtin function of its input arrays that returns its outputs
        (as a list, a tuple, or with result="single" its one output) in one native call,
        or `NotImplemented` for arrays it does not take as they are (ember.runtime.fastcall);
        None where there is none (code computed in its inputs' memory, another target)."""
        if result not in self._natives:
            call = None
            if self.target is not None and not self.interface.aliases and not (
                    result == "single" and len(self._output_specs) != 1):
                call = native_call(
                    self._entry_address, self._entry_args[2],
                    self._entry_args[3], self._expected,
                    [OUTPUTS.allocator(shape, dtype) for shape, dtype in self._output_specs],
                    self._lock, self.target, result, owner=self, fail=self._fail)
            self._natives[result] = call
        return self._natives[result]

    def _fail(self, status: int) -> None:
        raise self.interface.failure(status)

    def run_addresses(self, inputs: Sequence[int]) -> list[np.ndarray]:
        """Runs on inputs given by their data addresses, into fresh outputs. The caller has
        checked each input against `input_types`: dtype, shape, C order and alignment (and
        keeps it alive through the call); nothing here can check an address."""
        if self.interface.aliases:
            raise ShapeError(f"{self.interface.name} computes outputs in its inputs' memory:"
                             " run it on arrays, or give the outputs (run_into)")
        outputs = [OUTPUTS.array(shape, dtype) for shape, dtype in self._output_specs]
        self.run_into(inputs, [data_address(a) for a in outputs])
        return outputs

    def run_into(self, inputs: Sequence[int], outputs: Sequence[int]) -> None:
        """Runs on inputs and into outputs given by their data addresses, which the caller
        has checked against `input_types` and `output_types` (dtype, shape, C order and
        alignment) and keeps alive through the call. An output computed in an input's
        memory (`Interface.aliases`) is given that input's address, or holds a copy."""
        with self._lock:
            self._in_ptrs[:len(inputs)] = inputs
            self._out_ptrs[:len(outputs)] = outputs
            status = self._entry(*self._entry_args)
        if status:
            raise self.interface.failure(status)

    def buffer_addresses(self, inputs: Sequence[np.ndarray],
                         outputs: Sequence[np.ndarray]) -> dict[str, int]:
        """The data address of every buffer of a run on `inputs` and `outputs` (arrays
        that the caller checked and keeps alive), by buffer name: theirs, the constants'
        and the temporaries' places in the arena. For running kernels one by one
        (`ember explain`), under `arena_lock`."""
        iface = self.interface
        address = {b.name: a.ctypes.data for b, a in zip(iface.inputs, inputs)}
        address |= {b.name: a.ctypes.data for b, a in zip(iface.outputs, outputs)}
        address |= {b.name: a.ctypes.data for b, a in zip(iface.constants, self.constants)}
        arena = self.arena.ctypes.data
        address |= {b.name: arena + self.plan.offsets[b.name] for b in iface.temps}
        return address

    @property
    def arena_lock(self) -> threading.Lock:
        """Held by every run: whoever runs kernels on the arena itself holds it too."""
        return self._lock

    def _outputs(self, out: Any) -> tuple[list[Any], list[np.ndarray]]:
        """The objects to return and the arrays the entry writes: fresh arrays, or the
        caller's `out` buffers, which must match exactly (they cannot be copied into)."""
        iface = self.interface
        if out is None:
            arrays = [OUTPUTS.array(b.shape, b.dtype.np) for b in iface.outputs]
            return arrays, arrays
        return _given_outputs(iface.name, iface.outputs, out)

    def __repr__(self) -> str:
        iface = self.interface
        sig = ", ".join(_describe(b) for b in iface.inputs)
        res = ", ".join(_describe(b) for b in iface.outputs)
        return (f"Executable(@{iface.name}({sig}) -> ({res}), {len(iface.kernels)} kernels,"
                f" arena {self.plan.arena_size} B)")


# void entry(void **inputs, void **outputs, void **constants, char *arena, int64_t *sizes,
#            int64_t *offsets)
SIZED_ENTRY_TYPE = ctypes.CFUNCTYPE(ctypes.c_int32, *[ctypes.c_void_p] * 6)


@dataclass(frozen=True)
class _Binding:
    """What the calls of one binding of the sizes share: the buffers' shapes, the entry's
    size and offset tables, and the arena the plan packs them into."""

    inputs: tuple[Buffer, ...]
    outputs: tuple[Buffer, ...]
    sizes: Any  # ctypes int64 array, in Interface.sizes order
    offsets: Any  # ctypes int64 array, one per temp in Interface.temps order
    arena_size: int


class SizedExecutable(Executable):
    """A program compiled once for every size (`Interface.sizes`): a call binds the sizes
    from its inputs' shapes (a ShapeError names the input and dim that do not fit), and
    each binding gets its output shapes and its packing of the arena once (the `limit`
    most recent are kept; `bindings` counts those made). The arena grows to the largest
    binding seen, so a repeated shape allocates nothing but its outputs."""

    def __init__(self, program: Program | Interface, plan: MemoryPlan, entry: Any,
                 engine: Any, constants: dict[str, np.ndarray] | Sequence[np.ndarray] | None
                 = None, notes: dict[str, Any] | None = None, limit: int = 64,
                 target: Target | None = None):
        super().__init__(program, plan, entry, engine, constants, notes, target)
        self._entry = entry_function(entry, SIZED_ENTRY_TYPE)
        self.limit = limit
        self.bindings = 0
        self._bound: OrderedDict[tuple, _Binding] = OrderedDict()
        iface = self.interface
        self._bounds = dict(iface.bounds)
        self._names = [b.name for b in iface.inputs]
        self._declared = [b.shape for b in iface.inputs]
        self.env: dict[tuple, dict[str, int]] = {}  # the sizes of each input shapes bound
        self.latest: tuple | None = None  # the input shapes of the latest call

    def native(self, result: str = "list") -> None:
        """None: each call binds its sizes first (in Python)."""
        return None

    def binding(self, shapes: Sequence[Sequence[int]]) -> _Binding:
        """The binding for inputs of these shapes, made at the first call that has them."""
        key = tuple(tuple(s) for s in shapes)
        found = self._bound.get(key)
        if found is not None:
            self._bound.move_to_end(key)
            self.latest = key  # (what explain reports at)
            return found
        iface = self.interface
        env = bind_shapes(f"compiled @{iface.name}", self._names, self._declared, key,
                          self._bounds)
        plan = self.plan.bind(env)
        outputs = [Buffer(b.name, b.dtype, bind(b.shape, env)) for b in iface.outputs]
        check_fits(plan.arena_size + sum(int(b.nbytes) for b in outputs),
                   f"@{iface.name} at sizes {env}")
        found = _Binding(
            tuple(Buffer(b.name, b.dtype, bind(b.shape, env)) for b in iface.inputs),
            tuple(Buffer(b.name, b.dtype, bind(b.shape, env)) for b in iface.outputs),
            (ctypes.c_int64 * max(1, len(iface.sizes)))(*(env[n] for n in iface.sizes)),
            (ctypes.c_int64 * max(1, len(iface.temps)))(
                *(plan.offsets[b.name] for b in iface.temps)),
            plan.arena_size)
        self.bindings += 1
        self.env[key] = env
        self._bound[key] = found
        self.latest = key
        if len(self._bound) > self.limit:
            self.env.pop(self._bound.popitem(last=False)[0], None)
        return found

    def buffer_addresses(self, inputs: Sequence[np.ndarray],
                         outputs: Sequence[np.ndarray]) -> dict[str, int]:
        """`Executable.buffer_addresses` for the binding of these inputs' shapes."""
        bound = self.binding([a.shape for a in inputs])
        iface = self.interface
        if bound.arena_size > self.arena.nbytes:
            self.arena, self._arena_owner = _aligned_empty(bound.arena_size)
        address = {b.name: a.ctypes.data for b, a in zip(iface.inputs, inputs)}
        address |= {b.name: a.ctypes.data for b, a in zip(iface.outputs, outputs)}
        address |= {b.name: a.ctypes.data for b, a in zip(iface.constants, self.constants)}
        arena = self.arena.ctypes.data
        address |= {b.name: arena + offset for b, offset in zip(iface.temps, bound.offsets)}
        return address

    def __call__(self, *inputs: Any, out: Any = None) -> list[np.ndarray]:
        iface = self.interface
        _check_count(iface, inputs)
        arrays = [as_array(x, f"input {i} (%{b.name})") for i, (x, b) in
                  enumerate(zip(inputs, iface.inputs))]
        bound = self.binding([a.shape for a in arrays])
        arrays = [_check(a, b, f"input {i} (%{b.name})")
                  for i, (a, b) in enumerate(zip(arrays, bound.inputs))]
        results, outputs = self._outputs_of(bound.outputs, out)
        arrays = _in_place(iface, arrays, outputs, out is not None)
        self.run_bound(bound, [data_address(a) for a in arrays],
                       [data_address(a) for a in outputs])
        return results

    def run_bound(self, bound: _Binding, inputs: Sequence[int], outputs: Sequence[int]
                  ) -> None:
        """Runs on inputs and outputs given by their data addresses, of the binding's shapes
        (checked by the caller, who keeps them alive through the call)."""
        with self._lock:
            if bound.arena_size > self.arena.nbytes:
                self.arena, self._arena_owner = _aligned_empty(bound.arena_size)
            self._in_ptrs[:len(inputs)] = inputs
            self._out_ptrs[:len(outputs)] = outputs
            status = self._entry(
                ctypes.addressof(self._in_ptrs), ctypes.addressof(self._out_ptrs),
                ctypes.addressof(self._constant_ptrs), self.arena.ctypes.data,
                ctypes.addressof(bound.sizes), ctypes.addressof(bound.offsets))
        if status:
            raise self.interface.failure(status)

    def run_addresses(self, inputs: Sequence[int]) -> list[np.ndarray]:
        raise ShapeError(f"{self.interface.name} is compiled for every size: run it on"
                         " arrays (their shapes bind the sizes), not on addresses")

    run_into = run_addresses

    def _outputs_of(self, buffers: tuple[Buffer, ...], out: Any
                    ) -> tuple[list[Any], list[np.ndarray]]:
        if out is None:
            arrays = [OUTPUTS.array(b.shape, b.dtype.np) for b in buffers]
            return arrays, arrays
        return _given_outputs(self.interface.name, buffers, out)

    def __repr__(self) -> str:
        return super().__repr__().replace(f"arena {self.plan.arena_size} B",
                                          "arena per binding of "
                                          + ", ".join("?" + n for n in self.interface.sizes))


# -- glue to codegen: what a compile produces, and how it comes back to life ------------------

@dataclass
class Artifact:
    """A compiled program as the disk cache stores it: object code (one object file per
    module the program was compiled as) plus what running it needs, and nothing of the IR."""

    objects: list[bytes]
    interface: Interface
    plan: MemoryPlan
    constants: dict[str, np.ndarray]
    extra: dict[str, Any] = field(default_factory=dict)  # JSON-able notes (timings, ...)


def build_artifact(program: Program, target: Target, plan: MemoryPlan | None = None
                   ) -> Artifact:
    """Plan memory (unless given a plan) and compile `program` to `target`'s object code,
    for this process."""
    from ember.codegen.cpu import compile_objects
    from ember.codegen.llvm import entry_name, program_modules

    plan = plan or plan_memory(program)
    objects = compile_objects(program_modules(program, plan.offsets, shards(program)), target)
    return Artifact(objects, Interface.of(program, entry_name(program.name)), plan,
                    dict(program.constants))


def shards(program: Program) -> int:
    """How many modules to compile `program` as: two per core, so that the cores stay busy
    while Python builds the next module, for programs large enough to be worth it."""
    from ember.codegen.cpu import usable_cores

    workers = usable_cores()
    return 1 if workers == 1 or len(program.kernels) < 8 else 2 * workers


def load_artifact(artifact: Artifact, target: Target) -> Executable:
    """Load an artifact's object code (for `target`) into a fresh engine: no LLVM compile
    runs."""
    from ember.codegen.cpu import load_objects

    jit = load_objects(artifact.objects, target)
    kind = SizedExecutable if artifact.interface.sizes else Executable
    return kind(artifact.interface, artifact.plan, jit.address(artifact.interface.entry), jit,
                artifact.constants, artifact.extra, target=target)


def compile_program(program: Program, target: Target, plan: MemoryPlan | None = None
                    ) -> Executable:
    """`program` as a callable (the cold path of the cache, without the cache)."""
    return load_artifact(build_artifact(program, target, plan), target)


def scratch_arrays(params: list) -> list[np.ndarray]:
    """Buffers for a kernel's parameters: small random values (indices stay in range: the
    generated code clamps data-dependent indices anyway)."""
    rng = np.random.default_rng(0)
    arrays = []
    for dtype, shape in params:
        t = DType(dtype)
        if t.is_float:
            arrays.append(rng.uniform(0.5, 1.5, shape).astype(t.np))
        else:
            arrays.append(np.zeros(shape, t.np))
    return arrays
