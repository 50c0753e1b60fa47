"""The CUDA runtime: a program compiled for an NVIDIA GPU as a Python callable.

    exe = CudaExecutable(artifact, target)  # touches no driver: compiling needs no GPU
    y, = exe(x)                  # NumPy arrays or CPU tensors: copied in, NumPy arrays out
    y, = exe(x_cuda)             # torch CUDA tensors: by pointer, on torch's current stream,
                                 # torch CUDA tensors out (no synchronization)

The artifact holds one module's PTX (`objects[0]`; a cubin is loaded as it is) and, in
`extra["gpu"]`, the launches of each kernel (`[function, grid_x, block_x]` in order, every
function taking the kernel's buffers as device pointers) and the program's host steps as
JSON: `["call", kernel, [buffer, ...]]`, `["if", cond, [then], [else]]` and `["loop",
trip_count, cond, counter, [body]]`, with the CPU entry's semantics.

The first call sets up the device (`DeviceProgram`): torch's primary context (so torch's
pointers are valid in it), the module and its functions, one allocation for the arena and
one per constant, uploaded once. `DeviceProgram` walks the steps; every driver call goes
through `call`, which names the call that failed. An `if` or a `loop` reads its buffers
back, a synchronization each; a program of calls alone whose buffer addresses repeat is
captured once as a CUDA graph and replayed (EMBER_CUDA_GRAPHS=0 turns that off).
"""

from __future__ import annotations

import ctypes
import importlib
import os
import re
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from ember.dtypes import DType
from ember.errors import DeviceError, EmberError, ShapeError
from ember.loops.ir import Buffer
from ember.runtime.executable import (
    Artifact,
    _check,
    _check_count,
    _describe,
    _given_outputs,
    as_array,
)
from ember.target import Target

_DRIVER: Any = None  # cuda.bindings.driver once cuInit has succeeded
_DRIVER_LOCK = threading.Lock()

# torch's names of Ember's dtypes (the runtime imports no frontend, and torch only when a
# call is given a tensor).
_TORCH_DTYPES = {DType.f16: "float16", DType.bf16: "bfloat16", DType.f32: "float32",
                 DType.f64: "float64", DType.i8: "int8", DType.i16: "int16",
                 DType.i32: "int32", DType.i64: "int64", DType.u8: "uint8",
                 DType.u16: "uint16", DType.u32: "uint32", DType.u64: "uint64",
                 DType.bool: "bool"}


def driver() -> Any:
    """`cuda.bindings.driver`, initialized (cuInit) at the first call that succeeds; a
    DeviceError where the package, the driver or a device is missing."""
    global _DRIVER
    with _DRIVER_LOCK:
        if _DRIVER is not None:
            return _DRIVER
        try:
            cu = importlib.import_module("cuda.bindings.driver")
        except ImportError as e:
            raise DeviceError("the GPU runtime needs cuda-bindings: pip install 'ember[gpu]'"
                              ) from e
        try:
            result = cu.cuInit(0)
        except Exception as e:  # no libcuda: cuda-bindings raises, it returns no code
            raise DeviceError(f"no CUDA driver or device: {type(e).__name__}: {e}") from e
        if int(result[0]) != 0:
            raise DeviceError(f"no CUDA driver or device: cuInit failed with"
                              f" {error_name(cu, result[0])}")
        _DRIVER = cu
        return cu


def error_name(cu: Any, err: Any) -> str:
    """The driver's name of an error code (CUDA_ERROR_INVALID_PTX), or its number."""
    try:
        status, name = cu.cuGetErrorName(err)
        if int(status) == 0:
            return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001 (the name is for the message only)
        pass
    return f"error {int(err)}"


def call(cu: Any, name: str, *args: Any) -> Any:
    """One driver call, checked: what it returns besides the status (None, one value or a
    tuple), or a DeviceError that names the call and the error."""
    result = getattr(cu, name)(*args)
    if int(result[0]) != 0:
        raise DeviceError(f"{name} failed: {error_name(cu, result[0])}")
    values = result[1:]
    return None if not values else values[0] if len(values) == 1 else values


def _free(cu: Any, owned: list[tuple[str, Any]]) -> None:
    """Release what a DeviceProgram owns, newest first, in its context (errors ignored: the
    context may be gone)."""
    current = [o for o in owned if o[0] == "cuCtxSetCurrent"]
    for name, handle in current + [o for o in reversed(owned) if o not in current]:
        try:
            getattr(cu, name)(handle)
        except Exception:  # noqa: BLE001
            pass
    owned.clear()


class DeviceProgram:
    """An artifact's program on one device: its module and functions, arena and constants
    (its fixed buffers), and the walk of its host steps, given the device addresses of the
    inputs and outputs. `cu` is `cuda.bindings.driver`, or anything with its calls."""

    def __init__(self, cu: Any, artifact: Artifact, constants: dict[str, np.ndarray],
                 ordinal: int = 0):
        self.cu = cu
        self.ordinal = ordinal
        self.owned: list[tuple[str, Any]] = []  # (the call that releases it, handle)
        self._finalizer = weakref.finalize(self, _free, cu, self.owned)
        self._finalizer.atexit = False  # (at exit the driver tears the context down)
        iface, gpu = artifact.interface, artifact.extra["gpu"]
        device = call(cu, "cuDeviceGet", ordinal)
        self.context = call(cu, "cuDevicePrimaryCtxRetain", device)
        self.owned += [("cuDevicePrimaryCtxRelease", device), ("cuCtxSetCurrent", self.context)]
        self.activate()
        image = bytes(artifact.objects[0])
        if not image.startswith(b"\x7fELF"):  # PTX text: the driver reads it to a NUL
            image = image.rstrip(b"\0") + b"\0"
        self._image = np.frombuffer(image, np.uint8)
        try:
            self.module = call(cu, "cuModuleLoadData", self._image.ctypes.data)
        except DeviceError as e:  # (UNSUPPORTED_PTX_VERSION: a driver older than the PTX)
            header = re.findall(rb"^\s*\.(?:version|target)\s+\S+", image[:4096], re.M)
            raise DeviceError(f"{e} ({', '.join(h.strip().decode() for h in header)})"
                              ) from e
        self.owned.append(("cuModuleUnload", self.module))
        names = sorted({f for launches in gpu["launches"].values() for f, _, _ in launches})
        self.functions = {f: call(cu, "cuModuleGetFunction", self.module, f.encode())
                          for f in names}
        self.launches = {k: [(f, self.functions[f], int(grid), int(block))
                             for f, grid, block in launches]
                         for k, launches in gpu["launches"].items()}
        self.dtypes = {b.name: b.dtype for kind in (iface.inputs, iface.outputs,
                                                    iface.constants, iface.temps) for b in kind}
        self.stream = call(cu, "cuStreamCreate", 1)  # CU_STREAM_NON_BLOCKING
        self.owned.append(("cuStreamDestroy", self.stream))
        self.arena = self.alloc(artifact.plan.arena_size)
        self.fixed = {b.name: self.arena + artifact.plan.offsets[b.name] for b in iface.temps}
        for name, data in constants.items():
            self.fixed[name] = self.alloc(data.nbytes)
            self.upload(self.fixed[name], data, self.stream)
        self.synchronize(self.stream)
        self.inputs: list[int] = []  # device buffers for host inputs and outputs (`host_buffers`)
        self.outputs: list[int] = []
        self.last_stream: Any = None  # where the latest call's work went (`follow`)
        self._event: Any = None

    def activate(self) -> None:
        call(self.cu, "cuCtxSetCurrent", self.context)

    def alloc(self, nbytes: int) -> int:
        ptr = call(self.cu, "cuMemAlloc", max(int(nbytes), 1))
        self.owned.append(("cuMemFree", ptr))
        return int(ptr)

    def host_buffers(self, iface: Any) -> None:
        """Device buffers for the inputs and outputs of calls on host arrays (made once)."""
        if not self.inputs and not self.outputs:
            self.inputs = [self.alloc(b.nbytes) for b in iface.inputs]
            self.outputs = [self.alloc(b.nbytes) for b in iface.outputs]

    def upload(self, address: int, array: np.ndarray, stream: Any) -> None:
        if array.nbytes:
            call(self.cu, "cuMemcpyHtoDAsync", address, array.ctypes.data, array.nbytes,
                 stream)

    def download(self, array: np.ndarray, address: int, stream: Any) -> None:
        if array.nbytes:
            call(self.cu, "cuMemcpyDtoHAsync", array.ctypes.data, address, array.nbytes,
                 stream)

    def copy(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        if nbytes and dst != src:
            call(self.cu, "cuMemcpyDtoDAsync", dst, src, nbytes, stream)

    def synchronize(self, stream: Any) -> None:
        call(self.cu, "cuStreamSynchronize", stream)

    def follow(self, stream: Any) -> None:
        """Order the work that goes on `stream` next after the latest call's, when that went
        on another stream: calls share the arena and the device buffers."""
        if self.last_stream is not None and int(self.last_stream) != int(stream):
            if self._event is None:
                self._event = call(self.cu, "cuEventCreate", 2)  # CU_EVENT_DISABLE_TIMING
                self.owned.append(("cuEventDestroy", self._event))
            call(self.cu, "cuEventRecord", self._event, self.last_stream)
            call(self.cu, "cuStreamWaitEvent", stream, self._event, 0)
        self.last_stream = stream

    # -- the host steps ------------------------------------------------------------------

    def run(self, steps: Sequence[Any], address: dict[str, int], stream: Any) -> None:
        """Run `steps` with the buffers at `address` (every buffer they name), on
        `stream`."""
        for step in steps:
            kind = step[0]
            if kind == "call":
                self.launch(step[1], [address[name] for name in step[2]], stream)
            elif kind == "if":
                _, cond, then, orelse = step
                (flag,) = self.read([cond], address, stream)
                self.run(then if flag else orelse, address, stream)
            elif kind == "loop":
                _, trip, cond, counter, body = step
                count = 0
                self.write(counter, count, address, stream)
                while True:
                    limit, flag = self.read([trip, cond], address, stream)
                    if not (count < limit and flag):
                        break
                    self.run(body, address, stream)
                    count += 1
                    self.write(counter, count, address, stream)
            else:
                raise EmberError(f"unknown GPU host step {kind!r}")

    def launch(self, kernel: str, args: Sequence[int], stream: Any) -> None:
        """Launch `kernel`'s functions in order, each given every buffer's address."""
        params = (tuple(args), (ctypes.c_void_p,) * len(args)) if args else 0
        for _, function, grid, block in self.launches[kernel]:
            call(self.cu, "cuLaunchKernel", function, grid, 1, 1, block, 1, 1, 0, stream,
                 params, 0)

    def read(self, names: Sequence[str], address: dict[str, int], stream: Any
             ) -> list[Any]:
        """The values of scalar buffers, after the work queued on `stream`."""
        values = [np.zeros((), self.dtypes[name].np) for name in names]
        for name, value in zip(names, values):
            self.download(value, address[name], stream)
        self.synchronize(stream)
        return [v.item() for v in values]

    def write(self, name: str, value: int, address: dict[str, int], stream: Any) -> None:
        # (a pageable source is staged before the call returns: it may go at once)
        self.upload(address[name], np.array(value, self.dtypes[name].np), stream)

    def capture(self, steps: Sequence[Any], address: dict[str, int]) -> Any:
        """`steps` (launches only) captured as an instantiated CUDA graph: launched on any
        stream, it runs them with these addresses."""
        cu, stream = self.cu, self.stream
        self.synchronize(stream)  # (once per capture: the stream idle, as it begins)
        # Thread-local: other threads' driver calls (torch's) go on while this one captures.
        call(cu, "cuStreamBeginCapture", stream,
             cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        try:
            self.run(steps, address, stream)
        except BaseException:
            cu.cuStreamEndCapture(stream)  # (the capture ends; its graph is dropped)
            raise
        graph = call(cu, "cuStreamEndCapture", stream)
        try:
            executable = call(cu, "cuGraphInstantiate", graph, 0)
        finally:
            call(cu, "cuGraphDestroy", graph)
        self.owned.append(("cuGraphExecDestroy", executable))
        return executable

    def release(self, executable: Any) -> None:
        """Destroy a graph that `capture` made."""
        for i, (name, handle) in enumerate(self.owned):
            if name == "cuGraphExecDestroy" and handle is executable:
                del self.owned[i]
                call(self.cu, "cuGraphExecDestroy", executable)
                return

    def close(self) -> None:
        self._finalizer()


def _graphs_enabled() -> bool:
    return os.environ.get("EMBER_CUDA_GRAPHS", "1") not in ("0", "false", "no")


def _is_cuda_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and bool(getattr(x, "is_cuda", False))


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


class CudaExecutable:
    """A program compiled for an NVIDIA GPU, ready to run: the `Executable` of the GPU.
    Constructing it touches no driver; the first call sets up the device (a DeviceError
    says what is missing). `cu` replaces `cuda.bindings.driver` (tests)."""

    def __init__(self, artifact: Artifact, target: Target | None = None, *, cu: Any = None):
        if "gpu" not in artifact.extra or not artifact.objects:
            raise EmberError("not a GPU artifact: no PTX module or no extra['gpu'] table")
        self.artifact = artifact
        self.target = target
        self.interface = artifact.interface
        self.plan = artifact.plan
        self.notes = artifact.extra  # (what explain and the demo read)
        self.program = None
        iface = self.interface
        missing = [b.name for b in iface.constants if b.name not in artifact.constants]
        if missing:
            raise EmberError(f"no data for constant buffers {', '.join(missing)}")
        try:  # (checked here: a bad artifact fails where it is loaded, not at a call)
            self.constants = {b.name: _check(np.asarray(artifact.constants[b.name]), b,
                                             f"constant %{b.name}") for b in iface.constants}
        except ShapeError as e:
            raise EmberError(f"bad constant data: {e}") from e
        self.steps = artifact.extra["gpu"]["steps"]
        # Graphs replay launches only: an if or a loop decides on the host.
        self.graphs = _graphs_enabled() and all(s[0] == "call" for s in self.steps)
        self.graph_captures = 0  # (for tests and explain)
        self.graph_error = ""  # why graphs were turned off, if a capture failed
        self._cu = cu
        self.device: DeviceProgram | None = None
        self._lock = threading.Lock()  # one arena: calls from several threads take turns
        self._last_key: tuple[int, ...] | None = None
        self._graph: tuple[tuple[int, ...], Any] | None = None

    @property
    def input_types(self) -> list[Buffer]:
        return list(self.interface.inputs)

    @property
    def output_types(self) -> list[Buffer]:
        return list(self.interface.outputs)

    def __call__(self, *inputs: Any, out: Any = None) -> list[Any]:
        _check_count(self.interface, inputs)
        given = [] if out is None else list(out) if isinstance(out, (list, tuple)) else [out]
        tensors = [x for x in (*inputs, *given) if _is_cuda_tensor(x)]
        with self._lock:
            if tensors:
                return self._run_on_device(inputs, out, tensors)
            return self._run_on_host(inputs, out)

    def _ready(self, ordinal: int) -> DeviceProgram:
        """The program on device `ordinal`, set up at the first call, its context current."""
        if self.device is None:
            self.device = DeviceProgram(self._cu or driver(), self.artifact, self.constants,
                                        ordinal)
        elif self.device.ordinal != ordinal:
            raise DeviceError(f"{self.interface.name} runs on cuda:{self.device.ordinal},"
                              f" given tensors on cuda:{ordinal}")
        else:
            self.device.activate()
        return self.device

    def _run_on_host(self, inputs: Sequence[Any], out: Any) -> list[np.ndarray]:
        """NumPy arrays (or CPU tensors) in and out, through device buffers of their own."""
        iface = self.interface
        arrays = [_check(as_array(x, f"input {i} (%{b.name})"), b, f"input {i} (%{b.name})")
                  for i, (x, b) in enumerate(zip(inputs, iface.inputs))]
        if out is None:
            results = outputs = [np.empty(b.shape, b.dtype.np) for b in iface.outputs]
        else:
            results, outputs = _given_outputs(iface.name, iface.outputs, out)
        dev = self._ready(0 if self.device is None else self.device.ordinal)
        dev.host_buffers(iface)
        stream = dev.stream
        dev.follow(stream)
        for a, address in zip(arrays, dev.inputs):
            dev.upload(address, a, stream)
        self._execute(dev, dev.inputs, dev.outputs, stream)
        for o, address in zip(outputs, dev.outputs):
            dev.download(o, address, stream)
        dev.synchronize(stream)
        return results

    def _run_on_device(self, inputs: Sequence[Any], out: Any, tensors: list[Any]
                       ) -> list[Any]:
        """torch CUDA tensors by pointer (host inputs copied to the device), on torch's
        current stream; torch CUDA tensors out."""
        import torch

        iface = self.interface
        device = tensors[0].device
        if any(t.device != device for t in tensors):
            raise DeviceError(f"{iface.name} was given tensors on several devices:"
                              f" {sorted({str(t.device) for t in tensors})}")
        dev = self._ready(device.index if device.index is not None else 0)
        stream = torch.cuda.current_stream(device).cuda_stream
        dev.follow(stream)
        keep = []  # what must live until the launches are queued
        ins = []
        for i, (x, b) in enumerate(zip(inputs, iface.inputs)):
            what = f"input {i} (%{b.name})"
            if _is_cuda_tensor(x):
                x = self._tensor(x, b, what).contiguous()
                keep.append(x)
                ins.append(x.data_ptr())
            else:
                a = _check(as_array(x, what), b, what)
                dev.host_buffers(iface)
                dev.upload(dev.inputs[i], a, stream)
                ins.append(dev.inputs[i])
        if out is None:
            results = [torch.empty(b.shape, dtype=getattr(torch, _TORCH_DTYPES[b.dtype]),
                                   device=device) for b in iface.outputs]
        else:
            results = list(out) if isinstance(out, (list, tuple)) else [out]
            if len(results) != len(iface.outputs):
                raise ShapeError(f"{iface.name} has {len(iface.outputs)} outputs, got"
                                 f" {len(results)} out= buffers")
            for i, (o, b) in enumerate(zip(results, iface.outputs)):
                what = f"out= buffer {i} (%{b.name})"
                if not _is_cuda_tensor(o) or o.device != device or not o.is_contiguous():
                    raise ShapeError(f"{what}: must be a contiguous CUDA tensor on {device},"
                                     " as the inputs are")
                self._tensor(o, b, what)
        outs = [t.data_ptr() for t in results]
        # An input that shares memory with an output it is not computed in is read from a
        # copy (as Executable does).
        aliased = set(iface.aliases)
        spans = [(a, b.nbytes) for a, b in zip(outs, iface.outputs)]
        for j, (address, b) in enumerate(zip(ins, iface.inputs)):
            if any(_overlaps((address, b.nbytes), span) and (k, j) not in aliased
                   for k, span in enumerate(spans)):
                copy = torch.empty(b.shape, dtype=getattr(torch, _TORCH_DTYPES[b.dtype]),
                                   device=device)
                dev.copy(copy.data_ptr(), address, b.nbytes, stream)
                keep.append(copy)
                ins[j] = copy.data_ptr()
        self._execute(dev, ins, outs, stream)
        return results

    @staticmethod
    def _tensor(t: Any, b: Buffer, what: str) -> Any:
        import torch

        if t.dtype != getattr(torch, _TORCH_DTYPES[b.dtype]) or tuple(t.shape) != b.shape:
            raise ShapeError(f"{what}: expected {_describe(b)}, got {t.dtype}"
                             f"[{','.join(map(str, t.shape))}]")
        return t.detach().resolve_conj().resolve_neg()

    def _execute(self, dev: DeviceProgram, ins: Sequence[int], outs: Sequence[int],
                 stream: Any) -> None:
        """The program's steps on these device addresses: outputs computed in an input's
        memory start as a copy of it, then the steps run (or their graph replays)."""
        iface = self.interface
        for k, j in iface.aliases:
            dev.copy(outs[k], ins[j], iface.outputs[k].nbytes, stream)
        address = dev.fixed | {b.name: a for b, a in zip(iface.inputs, ins)}
        address |= {b.name: a for b, a in zip(iface.outputs, outs)}
        if self.graphs:
            key = (*ins, *outs)
            if self._graph is not None and self._graph[0] == key:
                call(dev.cu, "cuGraphLaunch", self._graph[1], stream)
                return
            if key == self._last_key:  # addresses that repeat: capture them once
                if self._graph is not None:
                    dev.release(self._graph[1])
                    self._graph = None
                try:
                    self._graph = (key, dev.capture(self.steps, address))
                except DeviceError as e:  # (then the launches run as they are, from now on)
                    self.graphs, self.graph_error = False, str(e)
                else:
                    self.graph_captures += 1
                    call(dev.cu, "cuGraphLaunch", self._graph[1], stream)
                    return
            self._last_key = key
        dev.run(self.steps, address, stream)

    def close(self) -> None:
        """Free the device memory, module and graphs now (else when collected)."""
        with self._lock:
            if self.device is not None:
                self.device.close()
                self.device = None
                self._graph = self._last_key = None

    def __repr__(self) -> str:
        iface = self.interface
        sig = ", ".join(_describe(b) for b in iface.inputs)
        res = ", ".join(_describe(b) for b in iface.outputs)
        gpu = self.artifact.extra["gpu"]
        functions = sum(len(v) for v in gpu["launches"].values())
        return (f"CudaExecutable(@{iface.name}({sig}) -> ({res}), {functions} functions,"
                f" {gpu.get('arch', '?')}, arena {self.plan.arena_size} B)")
