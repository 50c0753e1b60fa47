"""The CUDA runtime (ember/runtime/cuda.py) without a GPU: the driver is missing (a
DeviceError at the first call, none at construction), and a fake driver that keeps device
memory as bytearrays and runs each function as NumPy code checks the launches, the host
steps (if, loop), graph capture and the input checks. With a GPU, the same program runs
as hand-written PTX (`test_real_device`)."""

from __future__ import annotations

import ctypes
import inspect
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ember.dtypes import DType
from ember.errors import DeviceError, EmberError, ShapeError
from ember.loops.ir import Buffer
from ember.runtime import cuda
from ember.runtime.cuda import CudaExecutable
from ember.runtime.executable import Artifact, Interface
from ember.runtime.memory_plan import MemoryPlan

N = 1000
GRID, BLOCK = 4, 256
C = np.linspace(-1, 1, N, dtype=np.float32)
X = np.arange(N, dtype=np.float32)


def ptx(n: int = N) -> str:
    """Three functions over f32[n] (one thread per element): add(x, c, t): t = x + c;
    inc(t): t += 1; twice(t, y): y = t + t. Accepted by ptxas for sm_80 and sm_90."""
    def kernel(name: str, params: list[str], body: str) -> str:
        loads = "\n".join(f"  ld.param.u64 %rd{k}, [{p}];\n  cvta.to.global.u64 %rd{k}, %rd{k};"
                          f"\n  add.s64 %rd{k}, %rd{k}, %rd0;" for k, p in enumerate(params, 1))
        return (f".visible .entry {name}({', '.join(f'.param .u64 {p}' for p in params)})\n{{\n"
                "  .reg .pred %p;\n  .reg .b32 %r<4>;\n  .reg .b64 %rd<5>;\n  .reg .f32 %f<4>;\n"
                "  mov.u32 %r1, %ctaid.x;\n  mov.u32 %r2, %ntid.x;\n  mov.u32 %r3, %tid.x;\n"
                f"  mad.lo.s32 %r1, %r1, %r2, %r3;\n  setp.ge.s32 %p, %r1, {n};\n"
                f"  @%p bra DONE;\n  mul.wide.s32 %rd0, %r1, 4;\n{loads}\n{body}\n"
                "DONE:\n  ret;\n}\n")

    return "\n".join([
        ".version 7.8\n.target sm_80\n.address_size 64\n",
        kernel("add", ["x", "c", "t"], "  ld.global.f32 %f1, [%rd1];\n  ld.global.f32 %f2,"
               " [%rd2];\n  add.f32 %f3, %f1, %f2;\n  st.global.f32 [%rd3], %f3;"),
        kernel("inc", ["t"], "  ld.global.f32 %f1, [%rd1];\n  add.f32 %f2, %f1, 0f3F800000;\n"
               "  st.global.f32 [%rd1], %f2;"),
        kernel("twice", ["t", "y"], "  ld.global.f32 %f1, [%rd1];\n  add.f32 %f2, %f1, %f1;\n"
               "  st.global.f32 [%rd2], %f2;")])


def f32(name: str) -> Buffer:
    return Buffer(name, DType.f32, (N,))


LAUNCHES = {"k_add": [["add", GRID, BLOCK]], "k_inc": [["inc", GRID, BLOCK]],
            "k_twice": [["twice", GRID, BLOCK]]}
# The temps: t, then the loop's counter (an i32: written 4 bytes wide).
T_OFFSET, COUNTER_OFFSET = 64, 4096


def artifact(steps: list, launches: dict | None = None, aliases: tuple = ()) -> Artifact:
    """x, cond, trip in; y out; constant c; temps t and counter; `steps` run."""
    iface = Interface(
        "prog", "", (f32("x"), Buffer("cond", DType.bool, ()), Buffer("trip", DType.i64, ())),
        (f32("y"),), (f32("c"),), (f32("t"), Buffer("counter", DType.i32, ())),
        ("k_add", "k_inc", "k_twice"), aliases=aliases)
    plan = MemoryPlan({"t": T_OFFSET, "counter": COUNTER_OFFSET}, COUNTER_OFFSET + 64)
    gpu = {"arch": "sm_90", "launches": launches or LAUNCHES, "steps": steps}
    return Artifact([ptx().encode()], iface, plan, {"c": C.copy()}, {"gpu": gpu})


ADD, INC, TWICE = (["call", "k_add", ["x", "c", "t"]], ["call", "k_inc", ["t"]],
                   ["call", "k_twice", ["t", "y"]])


class FakeDriver:
    """The calls of `cuda.bindings.driver` that the runtime makes. Device memory is one
    bytearray per allocation; a function runs as `functions[name](fake, *addresses)` at its
    launch (or at its graph's). Memory copies and synchronizations while a stream captures
    fail, as they do on a device."""

    CUstreamCaptureMode = SimpleNamespace(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL=1)

    def __init__(self, functions: dict | None = None):
        self.functions = {"add": lambda d, x, c, t: d.f32(t).__setitem__(..., d.f32(x) + d.f32(c)),
                          "inc": lambda d, *args: d.f32(args[-1]).__iadd__(1),
                          "twice": lambda d, t, y: d.f32(y).__setitem__(..., 2 * d.f32(t)),
                          **(functions or {})}
        self.memory: dict[int, bytearray] = {}
        self.calls: list[tuple[str, tuple]] = []
        self.launches: list[tuple] = []  # (function, grid, block, addresses, stream)
        self.capturing = None
        self.graph: list = []
        self.image = b""
        self.waits: list[tuple] = []  # (stream, the stream it waits for)

    def __getattribute__(self, name: str):
        value = object.__getattribute__(self, name)
        if name.startswith("cu") and callable(value):
            def recorded(*args):
                self.calls.append((name, args))
                return value(*args)
            return recorded
        return value

    def bytes_at(self, address: int, n: int) -> memoryview:
        for base, block in self.memory.items():
            if base <= address and address + n <= base + len(block):
                return memoryview(block)[address - base:address - base + n]
        raise AssertionError(f"no device memory at {address:#x} (+{n})")

    def array(self, address: int, dtype: type, count: int = 1) -> np.ndarray:
        return np.frombuffer(self.bytes_at(address, count * np.dtype(dtype).itemsize), dtype)

    def f32(self, address: int) -> np.ndarray:
        return self.array(address, np.float32, N)

    def cuDeviceGet(self, ordinal):
        return 0, ordinal

    def cuDevicePrimaryCtxRetain(self, device):
        return 0, "context"

    def cuCtxSetCurrent(self, context):
        assert context == "context"
        return (0,)

    def cuModuleLoadData(self, image):
        self.image = ctypes.string_at(image)  # up to the NUL
        return 0, "module"

    def cuModuleGetFunction(self, module, name):
        if name.decode() not in self.functions:
            return (500,)  # CUDA_ERROR_NOT_FOUND
        return 0, ("function", name.decode())

    def cuStreamCreate(self, flags):
        return 0, 0x5000 + flags

    def cuEventCreate(self, flags):
        return 0, "event"

    def cuEventRecord(self, event, stream):
        self.recorded = stream
        return (0,)

    def cuStreamWaitEvent(self, stream, event, flags):
        self.waits.append((stream, self.recorded))
        return (0,)

    def cuMemAlloc(self, n):
        base = 0x10000000 * (len(self.memory) + 1)
        self.memory[base] = bytearray(n)
        return 0, base

    def cuMemcpyHtoDAsync(self, dst, src, n, stream):
        assert self.capturing is None
        self.bytes_at(dst, n)[:] = ctypes.string_at(src, n)
        return (0,)

    def cuMemcpyDtoHAsync(self, dst, src, n, stream):
        assert self.capturing is None
        ctypes.memmove(dst, bytes(self.bytes_at(src, n)), n)
        return (0,)

    def cuMemcpyDtoDAsync(self, dst, src, n, stream):
        assert self.capturing is None
        self.bytes_at(dst, n)[:] = bytes(self.bytes_at(src, n))
        return (0,)

    def cuStreamSynchronize(self, stream):
        assert self.capturing is None
        return (0,)

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        assert (gy, gz, by, bz, shared, extra) == (1, 1, 1, 1, 0, 0)
        addresses, types = params
        assert types == (ctypes.c_void_p,) * len(addresses)
        launch = (f[1], gx, bx, addresses, stream)
        if self.capturing == stream:
            self.graph.append(launch)
        else:
            self.run(launch)
        return (0,)

    def run(self, launch):
        self.launches.append(launch)
        self.functions[launch[0]](self, *launch[3])

    def cuStreamBeginCapture(self, stream, mode):
        assert mode == 1 and self.capturing is None
        self.capturing, self.graph = stream, []
        return (0,)

    def cuStreamEndCapture(self, stream):
        assert self.capturing == stream
        self.capturing = None
        return 0, self.graph

    def cuGraphInstantiate(self, graph, flags):
        return 0, ("graph", list(graph))

    def cuGraphLaunch(self, graph, stream):
        for launch in graph[1]:
            self.run((*launch[:4], stream))
        return (0,)

    def cuGetErrorName(self, err):
        return 0, {500: b"CUDA_ERROR_NOT_FOUND", 218: b"CUDA_ERROR_INVALID_PTX"}[int(err)]

    def _release(self, handle):
        return (0,)

    cuGraphDestroy = cuGraphExecDestroy = cuMemFree = cuModuleUnload = cuEventDestroy = _release
    cuStreamDestroy = cuDevicePrimaryCtxRelease = _release


def make(steps: list, monkeypatch, graphs: bool = False, **kw) -> tuple[CudaExecutable,
                                                                       FakeDriver]:
    monkeypatch.setenv("EMBER_CUDA_GRAPHS", "1" if graphs else "0")
    fake = FakeDriver()
    return CudaExecutable(artifact(steps, **kw), None, cu=fake), fake


def inputs(x=X, cond=True, trip=0) -> tuple:
    return x, np.array(cond), np.array(trip, np.int64)


def allocation(fake: FakeDriver, size: int) -> int:
    """The address of the one allocation of `size` bytes."""
    (base,) = [b for b, block in fake.memory.items() if len(block) == size]
    return base


# -- no driver --------------------------------------------------------------------------------

def test_no_driver_raises_device_error_at_the_first_call_only(monkeypatch) -> None:
    monkeypatch.setattr(cuda, "_DRIVER", None)
    try:
        cuda.driver()
        pytest.skip("this machine has a CUDA driver and device")
    except DeviceError:
        pass
    exe = CudaExecutable(artifact([ADD, TWICE]))  # constructing touches no driver
    assert "CudaExecutable(@prog(f32[1000], bool[], i64[]) -> (f32[1000])" in repr(exe)
    with pytest.raises(DeviceError, match="cuda-bindings|no CUDA driver or device"):
        exe(*inputs())


def test_driver_errors_say_what_is_missing(monkeypatch) -> None:
    monkeypatch.setattr(cuda, "_DRIVER", None)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", None)
    with pytest.raises(DeviceError, match=r"needs cuda-bindings: pip install 'ember\[gpu\]'"):
        cuda.driver()

    def no_library(flags):
        raise RuntimeError('"cuda" is an NVIDIA driver library')

    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", SimpleNamespace(cuInit=no_library))
    with pytest.raises(DeviceError, match="no CUDA driver or device: RuntimeError"):
        cuda.driver()
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", SimpleNamespace(
        cuInit=lambda flags: (100,), cuGetErrorName=lambda e: (0, b"CUDA_ERROR_NO_DEVICE")))
    with pytest.raises(DeviceError, match="cuInit failed with CUDA_ERROR_NO_DEVICE"):
        cuda.driver()
    assert cuda._DRIVER is None  # a failure is not kept: a later call tries again


def test_a_failed_driver_call_is_named(monkeypatch) -> None:
    exe, fake = make([ADD], monkeypatch, launches={"k_add": [["missing", 1, 32]]})
    with pytest.raises(DeviceError, match="cuModuleGetFunction failed: CUDA_ERROR_NOT_FOUND"):
        exe(*inputs())


# -- launches and addresses -------------------------------------------------------------------

def test_a_module_the_driver_rejects_names_its_ptx_version(monkeypatch) -> None:
    exe, fake = make([ADD], monkeypatch)
    fake.cuModuleLoadData = lambda image: (218,)
    with pytest.raises(DeviceError, match=r"cuModuleLoadData failed: CUDA_ERROR_INVALID_PTX"
                                          r" \(.version 7.8, .target sm_80\)"):
        exe(*inputs())


def test_launches_in_order_with_every_buffers_device_address(monkeypatch) -> None:
    launches = {**LAUNCHES, "k_add": [["add", 4, 256], ["inc", 8, 128]]}
    exe, fake = make([ADD, TWICE], monkeypatch, launches=launches)
    assert fake.calls == []  # nothing before the first call
    y, = exe(*inputs())
    np.testing.assert_array_equal(y, 2 * (X + C + 1))
    arena = allocation(fake, COUNTER_OFFSET + 64)
    x_address, c_address, _ = fake.launches[0][3]
    y_address = fake.launches[2][3][1]
    t = arena + T_OFFSET
    assert [launch[:4] for launch in fake.launches] == [
        ("add", 4, 256, (x_address, c_address, t)), ("inc", 8, 128, (x_address, c_address, t)),
        ("twice", GRID, BLOCK, (t, y_address))]
    assert len({x_address, c_address, y_address, arena}) == 4
    np.testing.assert_array_equal(fake.f32(c_address), C)  # the constant, uploaded
    np.testing.assert_array_equal(fake.f32(x_address), X)  # the input, uploaded
    assert len({launch[4] for launch in fake.launches}) == 1  # one stream


def test_constants_and_buffers_are_allocated_once(monkeypatch) -> None:
    exe, fake = make([ADD, TWICE], monkeypatch)
    exe(*inputs())
    allocations = len(fake.memory)
    uploads = [args[1] for name, args in fake.calls if name == "cuMemcpyHtoDAsync"]
    y, = exe(*inputs(x=X + 5))
    np.testing.assert_array_equal(y, 2 * (X + 5 + C))
    assert len(fake.memory) == allocations
    later = [args[1] for name, args in fake.calls if name == "cuMemcpyHtoDAsync"][len(uploads):]
    assert len(later) == 3  # the three inputs; not the constant again
    assert [name for name, _ in fake.calls].count("cuModuleLoadData") == 1


def test_close_frees_what_the_device_holds_in_its_context(monkeypatch) -> None:
    exe, fake = make([ADD, TWICE], monkeypatch, graphs=True)
    for _ in range(2):
        exe(*inputs())
    del fake.calls[:]
    exe.close()
    names = [name for name, _ in fake.calls]
    assert names[0] == "cuCtxSetCurrent" and names[-1] == "cuDevicePrimaryCtxRelease"
    assert names.count("cuMemFree") == len(fake.memory)
    assert {"cuModuleUnload", "cuGraphExecDestroy", "cuStreamDestroy"} <= set(names)
    assert exe.device is None  # a later call sets the device up again


def test_the_ptx_is_loaded_nul_terminated(monkeypatch) -> None:
    exe, fake = make([ADD], monkeypatch)
    exe(*inputs())
    assert fake.image == ptx().encode()


def test_an_output_computed_in_an_inputs_memory_starts_as_its_copy(monkeypatch) -> None:
    exe, fake = make([["call", "k_inc", ["y"]]], monkeypatch, aliases=((0, 0),))
    y, = exe(*inputs())
    np.testing.assert_array_equal(y, X + 1)


# -- host steps ---------------------------------------------------------------------------------

def test_if_runs_the_branch_its_condition_holds(monkeypatch) -> None:
    exe, fake = make([ADD, ["if", "cond", [INC], [INC, INC]], TWICE], monkeypatch)
    y, = exe(*inputs(cond=True))
    np.testing.assert_array_equal(y, 2 * (X + C + 1))
    assert [launch[0] for launch in fake.launches] == ["add", "inc", "twice"]
    fake.launches.clear()
    y, = exe(*inputs(cond=False))
    np.testing.assert_array_equal(y, 2 * (X + C + 2))
    assert [launch[0] for launch in fake.launches] == ["add", "inc", "inc", "twice"]


def test_loop_runs_its_body_trip_count_times_with_the_counter_written(monkeypatch) -> None:
    seen = []
    exe, fake = make([ADD, ["loop", "trip", "cond", "counter", [INC, ["call", "k_see",
                                                                      ["counter"]]]], TWICE],
                     monkeypatch, launches={**LAUNCHES, "k_see": [["see", 1, 1]]})
    fake.functions["see"] = lambda d, counter: seen.append(int(d.array(counter, np.int32)[0]))
    y, = exe(*inputs(trip=3))
    np.testing.assert_array_equal(y, 2 * (X + C + 3))
    assert seen == [0, 1, 2]
    counter = allocation(fake, COUNTER_OFFSET + 64) + COUNTER_OFFSET
    assert fake.array(counter, np.int32)[0] == 3
    writes = [args for name, args in fake.calls if name == "cuMemcpyHtoDAsync"
              and args[0] == counter]
    assert [n for _, _, n, _ in writes] == [4] * 4  # 0, 1, 2, 3: each as wide as an i32
    seen.clear()
    y, = exe(*inputs(trip=0))
    np.testing.assert_array_equal(y, 2 * (X + C))
    assert seen == []


def test_loop_stops_when_its_condition_fails(monkeypatch) -> None:
    def stop_after_two(d, counter, cond):
        if d.array(counter, np.int32)[0] == 1:
            d.array(cond, np.bool_)[0] = False

    exe, fake = make([ADD, ["loop", "trip", "cond", "counter",
                            [INC, ["call", "k_stop", ["counter", "cond"]]]], TWICE],
                     monkeypatch, launches={**LAUNCHES, "k_stop": [["stop", 1, 1]]})
    fake.functions["stop"] = stop_after_two
    y, = exe(*inputs(trip=10))
    np.testing.assert_array_equal(y, 2 * (X + C + 2))
    y, = exe(*inputs(trip=10, cond=False))
    np.testing.assert_array_equal(y, 2 * (X + C))


def test_work_on_another_stream_waits_for_the_latest_calls(monkeypatch) -> None:
    exe, fake = make([ADD, TWICE], monkeypatch)
    exe(*inputs())
    own = fake.launches[-1][4]
    exe.device.follow(own)  # the same stream: in order already
    assert fake.waits == []
    exe.device.follow(7)  # (torch's stream, say)
    assert fake.waits == [(7, own)]
    exe(*inputs())
    assert fake.waits == [(7, own), (own, 7)]


# -- graphs ---------------------------------------------------------------------------------

def test_calls_whose_addresses_repeat_are_captured_once_and_replayed(monkeypatch) -> None:
    exe, fake = make([ADD, INC, TWICE], monkeypatch, graphs=True)
    for k in range(4):
        y, = exe(*inputs(x=X * k))
        np.testing.assert_array_equal(y, 2 * (X * k + C + 1))
    assert exe.graph_captures == 1
    names = [name for name, _ in fake.calls]
    assert names.count("cuStreamBeginCapture") == 1 and names.count("cuGraphLaunch") == 3
    assert names.count("cuLaunchKernel") == 6  # the first call's three, and the capture's


def test_a_capture_that_fails_turns_graphs_off(monkeypatch) -> None:
    exe, fake = make([ADD, TWICE], monkeypatch, graphs=True)
    fake.cuGraphInstantiate = lambda graph, flags: (1,)  # CUDA_ERROR_INVALID_VALUE
    fake.cuGetErrorName = lambda err: (0, b"CUDA_ERROR_INVALID_VALUE")
    for k in range(3):
        y, = exe(*inputs(x=X + k))
        np.testing.assert_array_equal(y, 2 * (X + k + C))
    assert not exe.graphs and "cuGraphInstantiate failed" in exe.graph_error
    assert len(fake.launches) == 6 and fake.capturing is None


def test_graphs_are_off_for_host_decisions_and_by_the_environment(monkeypatch) -> None:
    exe, fake = make([ADD, ["if", "cond", [INC], []], TWICE], monkeypatch, graphs=True)
    assert not exe.graphs
    exe, fake = make([ADD, TWICE], monkeypatch, graphs=False)
    assert not exe.graphs
    for _ in range(3):
        exe(*inputs())
    assert exe.graph_captures == 0 and len(fake.launches) == 6


# -- checks ---------------------------------------------------------------------------------

def test_inputs_are_checked_before_the_device_is_touched(monkeypatch) -> None:
    exe, fake = make([ADD, TWICE], monkeypatch)
    with pytest.raises(ShapeError, match=r"input 0 \(%x\): expected f32\[1000\], got"
                                         r" float32\[999\]"):
        exe(X[:-1], np.array(True), np.array(0, np.int64))
    with pytest.raises(ShapeError, match="expected i64"):
        exe(X, np.array(True), np.array(0, np.int32))
    with pytest.raises(ShapeError, match="takes 3 inputs"):
        exe(X)
    with pytest.raises(ShapeError, match="out= buffer 0"):
        exe(*inputs(), out=[np.empty(N, np.float64)])
    assert fake.calls == []
    out = np.empty(N, np.float32)
    y, = exe(*inputs(), out=[out])
    assert y is out
    np.testing.assert_array_equal(out, 2 * (X + C))


def test_a_bad_artifact_fails_where_it_is_loaded() -> None:
    bad = artifact([ADD])
    bad.constants["c"] = np.zeros(3, np.float32)
    with pytest.raises(EmberError, match="bad constant data"):
        CudaExecutable(bad)
    with pytest.raises(EmberError, match="not a GPU artifact"):
        CudaExecutable(Artifact([b""], bad.interface, bad.plan, {"c": C}))


def test_public_face_matches_the_cpu_executable(monkeypatch) -> None:
    exe, _ = make([ADD, TWICE], monkeypatch)
    assert [b.name for b in exe.input_types] == ["x", "cond", "trip"]
    assert [b.name for b in exe.output_types] == ["y"]
    assert repr(exe) == ("CudaExecutable(@prog(f32[1000], bool[], i64[]) -> (f32[1000]),"
                         " 3 functions, sm_90, arena 4160 B)")


# -- against the real bindings --------------------------------------------------------------

def test_calls_fit_the_signatures_of_cuda_bindings(monkeypatch) -> None:
    real = pytest.importorskip("cuda.bindings.driver")
    names = set(re.findall(r'"(cu[A-Z]\w+)"', Path(cuda.__file__).read_text()))
    names |= {"cuInit", "cuGetErrorName"}
    assert not [n for n in names if not hasattr(real, n)]
    assert hasattr(real.CUstreamCaptureMode, "CU_STREAM_CAPTURE_MODE_THREAD_LOCAL")
    exe, fake = make([ADD, ["loop", "trip", "cond", "counter", [INC]], TWICE], monkeypatch,
                     aliases=((0, 0),))
    exe(*inputs(trip=2))
    exe.device.follow(7)
    exe.close()
    graphs, fake_graphs = make([ADD, TWICE], monkeypatch, graphs=True)
    for _ in range(3):
        graphs(*inputs())
    graphs.close()
    calls = fake.calls + fake_graphs.calls
    for name, args in calls:
        inspect.signature(getattr(real, name)).bind(*args)
    made = {name for name, _ in calls}
    assert names - made <= {"cuInit", "cuGetErrorName"}  # every call was made, and fits


def test_real_device() -> None:
    """With a GPU: the program as PTX, on host arrays (steps, loop, graphs) and on torch
    CUDA tensors."""
    try:
        cuda.driver()
    except DeviceError as e:
        pytest.skip(str(e))
    loop = [ADD, ["loop", "trip", "cond", "counter", [INC]], ["if", "cond", [INC], []], TWICE]
    exe = CudaExecutable(artifact(loop))
    y, = exe(*inputs(trip=3))
    np.testing.assert_allclose(y, 2 * (X + C + 4))
    calls = CudaExecutable(artifact([ADD, INC, TWICE]))
    for k in range(3):
        y, = calls(*inputs(x=X + k))
        np.testing.assert_allclose(y, 2 * (X + k + C + 1))
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        return
    x = torch.tensor(X, device="cuda")
    for k in range(3):
        y, = calls(x + k, np.array(True), np.array(0, np.int64))
        assert y.is_cuda
        np.testing.assert_allclose(y.cpu().numpy(), 2 * (X + k + C + 1))
    assert calls.graph_captures >= 1
