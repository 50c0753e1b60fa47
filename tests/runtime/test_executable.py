"""The executable: input checks, passing by pointer, out= buffers, arena and constants."""

from __future__ import annotations

import numpy as np
import pytest

from ember.dtypes import DType
from ember.errors import EmberError, ShapeError
from ember.runtime.executable import Executable, Interface, as_array, data_address
from ember.target import Target
from tests.runtime import handmade

HOST = Target.host()

C = np.arange(8, dtype=np.float32)


@pytest.fixture(scope="module")
def exe() -> Executable:
    program, plan, engine, address = handmade.build()
    return Executable(program, plan, address, engine, {"c": C.copy()})


def test_runs_and_passes_inputs_arena_and_constants_by_pointer(exe: Executable) -> None:
    x = np.linspace(0, 1, 8, dtype=np.float32)
    y, info = exe(x)
    np.testing.assert_array_equal(y, x + C)
    assert info[0] == x.ctypes.data  # no copy of a contiguous input
    assert info[1] % 64 == 0 and info[1] == exe.arena.ctypes.data
    assert info[2] == exe.constants[0].ctypes.data
    _, again = exe(x)
    assert again[1] == info[1] and again[2] == info[2]  # arena and constants allocated once


def test_non_contiguous_and_byte_swapped_inputs_are_copied(exe: Executable) -> None:
    base = np.arange(16, dtype=np.float32)
    y, info = exe(base[::2])
    np.testing.assert_array_equal(y, base[::2] + C)
    assert info[0] != base.ctypes.data
    y, _ = exe(np.arange(8, dtype=">f4"))
    np.testing.assert_array_equal(y, np.arange(8) + C)


def test_mismatched_inputs_raise_shape_error_naming_the_input(exe: Executable) -> None:
    with pytest.raises(ShapeError, match="takes 1 inputs"):
        exe()
    with pytest.raises(ShapeError, match="takes 1 inputs"):
        exe(np.zeros(8, np.float32), np.zeros(8, np.float32))
    with pytest.raises(ShapeError, match=r"input 0 \(%x\): expected f32\[8\], got float64\[8\]"):
        exe(np.zeros(8))
    with pytest.raises(ShapeError, match=r"%x.*got float32\[2,4\]"):
        exe(np.zeros((2, 4), np.float32))
    with pytest.raises(ShapeError, match="%x"):
        exe([1.0] * 8)  # a list reads as f64


def test_out_buffers_are_written_and_checked(exe: Executable) -> None:
    x = np.ones(8, np.float32)
    y, info = np.empty(8, np.float32), np.empty(3, np.int64)
    results = exe(x, out=[y, info])
    assert results[0] is y and results[1] is info
    np.testing.assert_array_equal(y, x + C)
    with pytest.raises(ShapeError, match="2 outputs"):
        exe(x, out=y)
    with pytest.raises(ShapeError, match=r"out= buffer 0 \(%y\): expected f32\[8\]"):
        exe(x, out=[np.empty(9, np.float32), info])
    with pytest.raises(ShapeError, match="C-contiguous"):
        exe(x, out=[np.empty(16, np.float32)[::2], info])
    # An output that is also the input: the input is read from a copy.
    exe(x, out=[x, info])
    np.testing.assert_array_equal(x, 1 + C)


def test_arrays_pass_by_the_address_of_their_data(exe: Executable) -> None:
    """data_address reads a writeable array's buffer and falls back to ctypes for the
    others; the kernel sees each input's and out= buffer's own data, read-only or not."""
    for a in (np.arange(8, dtype=np.float32), np.zeros((3, 5)), np.empty(0, np.float32)):
        assert data_address(a) == a.ctypes.data
        a.flags.writeable = False
        assert data_address(a) == a.ctypes.data
    x = np.ones(8, np.float32)
    x.flags.writeable = False
    y, info = np.empty(8, np.float32), np.empty(3, np.int64)
    assert exe(x, out=[y, info])[0] is y and info[0] == x.ctypes.data
    np.testing.assert_array_equal(y, x + C)
    _, again = exe(x)
    assert again[0] == x.ctypes.data
    frozen = np.empty(8, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ShapeError, match="writeable"):
        exe(x, out=[frozen, info])


def test_torch_tensors_pass_by_pointer() -> None:
    torch = pytest.importorskip("torch")
    program, plan, engine, address = handmade.build()
    exe = Executable(program, plan, address, engine, {"c": torch.arange(8.0).numpy()})
    x = torch.linspace(0, 1, 8, requires_grad=True)
    y, info = exe(x)
    np.testing.assert_allclose(y, x.detach().numpy() + C)
    assert info[0] == x.data_ptr()
    out = torch.empty(8)
    exe(x, out=[out, np.empty(3, np.int64)])
    np.testing.assert_allclose(out.numpy(), y)
    b = torch.ones(4, dtype=torch.bfloat16)
    view = as_array(b, "b")
    assert view.dtype == DType.bf16.np and view.ctypes.data == b.data_ptr()
    with pytest.raises(ShapeError, match="expected f32"):
        exe(torch.ones(8, dtype=torch.float64))


def test_constants_are_checked_at_construction() -> None:
    program, plan, engine, address = handmade.build()
    with pytest.raises(EmberError, match="no data for constant buffers c"):
        Executable(program, plan, address, engine, {})
    with pytest.raises(EmberError, match="bad constant data"):
        Executable(program, plan, address, engine, {"c": np.zeros(3, np.float32)})
    iface = Interface.of(program, "handmade_entry")
    assert Interface.from_json(iface.to_json()) == iface
    exe = Executable(iface, plan, address, engine, [C])
    assert exe.program is None
    np.testing.assert_array_equal(exe(np.zeros(8, np.float32))[0], C)


def test_compiled_graph_matches_the_interpreter_with_reused_memory() -> None:
    from ember import Builder, interpret
    from ember.loops.lower.program import lower_graph
    from ember.runtime.executable import compile_program
    from ember.runtime.memory_plan import plan_memory

    b = Builder("chain")
    x = b.input("x", DType.f32, (4, 8))
    w = b.constant(np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8), name="w")
    y = b.tanh(b.exp(b.add(x, w)))
    b.output(b.sub(b.neg(y), x), b.abs(y))
    graph = b.build()
    program = lower_graph(graph, target=HOST)
    plan = plan_memory(program)
    assert plan.inplace and plan.arena_size < plan.total_bytes
    exe = compile_program(program, HOST, plan)
    xv = np.random.default_rng(0).standard_normal((4, 8), dtype=np.float32)
    for got, want in zip(exe(xv), interpret(graph, [xv])):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_compiled_control_flow_with_a_planned_arena_matches_the_interpreter() -> None:
    from ember import Builder, interpret
    from ember.loops.lower.program import lower_graph
    from ember.runtime.executable import compile_program
    from ember.runtime.memory_plan import plan_memory

    b = Builder("cf")
    x = b.input("x", DType.f32, (4,))
    n = b.input("n", DType.i64, ())
    c = b.input("c", DType.bool, ())

    def body(bb, i, acc, y):
        z = bb.add(bb.exp(bb.neg(acc)), y)
        return [c, bb.tanh(z), bb.add(y, z)]

    acc, y = b.loop(n, c, [b.exp(x), b.neg(x)], body)
    out = b.if_(c, lambda bb: [bb.abs(bb.sub(acc, y))], lambda bb: [bb.neg(acc)])
    b.output(out[0], b.mul(b.exp(y), acc))
    graph = b.build()
    program = lower_graph(graph, target=HOST)
    plan = plan_memory(program)
    assert plan.inplace
    exe = compile_program(program, HOST, plan)
    xv = np.linspace(-1, 1, 4, dtype=np.float32)
    for trips in (0, 1, 3):
        for flag in (True, False):
            args = [xv, np.array(trips, np.int64), np.array(flag)]
            for got, want in zip(exe(*args), interpret(graph, args)):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
