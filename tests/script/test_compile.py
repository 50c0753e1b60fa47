"""How scripted functions compile: loops stay loop ops run natively, specializations are
counted and bounded, annotations compile at decoration, options reach the compile."""

import warnings

import numpy as np
import pytest

import ember
from ember.errors import ScriptTypeError
from ember.runtime.executable import Executable
from tests.script import programs as P

CPU = ember.Config(executor="cpu")


def count_native_calls(executable):
    """Wrap the executable's native entry: a list that grows by one per native call."""
    calls = []
    entry = executable._entry
    executable.native = lambda result="list": None  # every call through `_entry`

    def counted(*args):
        calls.append(1)
        return entry(*args)

    executable._entry = counted
    return calls


def test_kernels_per_call_do_not_depend_on_the_trip_count():
    f = ember.script(P.dynamic_count, config=CPU, dynamic=("n",))
    x = np.linspace(0, 1, 8)
    f(x, 2)
    (spec,) = f.specializations()
    assert [op.name for op in spec.graph.ops if op.name == "loop"] == ["loop"]
    kernels = spec.executable.interface.kernels
    calls = count_native_calls(spec.executable)
    for n in (0, 1, 7, 300):
        np.testing.assert_allclose(f(x, n), P.dynamic_count(x, n), rtol=1e-12)
    assert f.compiles == 1 and len(calls) == 4  # one native call each, whatever n
    assert f.specializations()[0].executable.interface.kernels == kernels


def test_while_on_data_is_one_native_call():
    f = ember.script(P.newton_cube_root, config=CPU)
    a = np.linspace(1, 20, 16)
    f(a, 1e-2)
    calls = count_native_calls(f.specializations()[0].executable)
    for tol in (1.0, 1e-3, 1e-9):
        np.testing.assert_allclose(f(a, tol), P.newton_cube_root(a, tol), rtol=1e-12)
    assert f.compiles == 1 and len(calls) == 3  # floats are runtime values: one compile


def test_constant_trip_count_with_array_state_is_a_loop_op():
    f = ember.script(P.dynamic_count)
    x = np.ones(4)
    for n in (3, 200):
        f(x, n)
    graphs = [s.graph for s in f.specializations()]
    assert [sum(1 for _ in g.walk()) for g in graphs][0] == \
        [sum(1 for _ in g.walk()) for g in graphs][1]  # the op count does not grow with n
    assert all(any(op.name == "loop" for op in g.ops) for g in graphs)


def test_stats_count_compiles_and_hits():
    f = ember.script(P.softmax_rows)
    x32, x64 = np.ones((2, 3), np.float32), np.ones((2, 3))
    f(x32), f(x32), f(x64), f(x64.T.copy())
    assert f.stats == {"compiles": 3, "calls": 4, "hits": 1, "evictions": 0}
    assert f.compiles == 3


def test_recompiles_are_bounded_with_a_warning_naming_the_argument():
    f = ember.script(P.python_loop_unrolled, max_specializations=2)
    x = np.ones(2)
    f(x, 1), f(x, 2)
    with pytest.warns(UserWarning, match="the argument that vary: n"):
        f(x, 3)
    assert f.stats["evictions"] == 1 and len(f.specializations()) == 2


def test_dynamic_int_needs_a_known_argument():
    with pytest.raises(ScriptTypeError, match="no argument m"):
        ember.script(P.dynamic_count, dynamic=("m",))


def scaled(x: ember.Tensor[ember.f32, (2, 3)], w: ember.Tensor[np.float32, (3,)]):
    return x * w + 1.0


def test_annotations_compile_at_decoration():
    f = ember.script(scaled)
    assert f.compiles == 1
    x, w = np.ones((2, 3), np.float32), np.arange(3, dtype=np.float32)
    got = f(x, w)
    assert f.compiles == 1 and got.dtype == np.float32
    np.testing.assert_allclose(got, scaled(x, w))


def test_config_reaches_the_compile():
    f = ember.script(config=ember.Config(executor="interp"))(P.softmax_rows)
    f(np.ones((2, 2)))
    assert not isinstance(f.specializations()[0].executable, Executable)
    g = ember.script(P.softmax_rows, config=CPU)
    g(np.ones((2, 2)))
    assert isinstance(g.specializations()[0].executable, Executable)


def test_unsupported_argument_types():
    f = ember.script(P.softmax_rows)
    with pytest.raises(ScriptTypeError, match="argument `x` is a list"):
        f([1.0, 2.0])


def test_no_warning_within_the_bound():
    f = ember.script(P.python_loop_unrolled)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in range(4):
            f(np.ones(2), n)


@ember.script(config=CPU, max_specializations=4)
def decorated_with_options(x: ember.Tensor[ember.f64, (3,)], n: int = 2):
    for _ in range(n):
        x = x * 2.0
    return x


def test_decorator_with_options_and_annotations():
    assert decorated_with_options.compiles == 0  # `n` has no Tensor annotation: no AOT
    np.testing.assert_allclose(decorated_with_options(np.ones(3)), np.full(3, 4.0))
    assert isinstance(decorated_with_options.specializations()[0].executable, Executable)
    assert decorated_with_options.max_specializations == 4


def test_calls_on_arrays_reuse_their_signatures_compile() -> None:
    """Array-only calls find their compile by dtypes and shapes (the fast path), and an
    evicted signature compiles again rather than running another's code."""
    f = ember.script(_double_plus, max_specializations=2)
    with pytest.warns(UserWarning, match="dropping the oldest"):
        for shape in [(3,), (4,), (3,), (5,), (3,), (4,)]:  # (4,) is dropped at (5,)
            x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
            np.testing.assert_array_equal(f(x), x * 2 + 1)
    assert f.stats["calls"] == 6 and f.stats["hits"] == 2
    assert f.stats["compiles"] == 4 and f.stats["evictions"] == 2
    x = np.ones(3, np.float64)  # the shape of a compiled one, another dtype
    with pytest.warns(UserWarning, match="dropping the oldest"):
        assert f(x).dtype == np.float64 and f.stats["compiles"] == 5


def _double_plus(x):
    return x * 2 + 1


def test_setitem_in_a_loop_writes_the_carried_array_in_place() -> None:
    """`out[i] = v` in a loop is a scatter of one element into the carried buffer itself:
    no step of the loop copies or rewrites the whole array (a step is O(1), not O(n))."""
    from ember.driver.pipeline import lower_to_program
    from ember.loops.ir import ProgramLoop

    def fill(x):
        out = np.zeros((x.shape[0], 3), x.dtype)
        for i in range(x.shape[0]):
            out[i] = x[i] * 2  # a row: the leading axis indexed, the rest whole
            out[i, 0] += 1
        return out

    f = ember.script(fill, config=ember.Config(executor="cpu", disk_cache=False))
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    want = x * 2
    want[:, 0] += 1
    np.testing.assert_array_equal(f(x), want)
    (spec,) = f.specializations()
    assert sum(op.name == "scatter_nd" for op in spec.graph.walk()) == 2
    program, _ = lower_to_program(spec.graph, ember.Config(executor="cpu"))
    (loop,) = [s for s in program.steps if isinstance(s, ProgramLoop)]
    kernels = {k.name: k for k in program.kernels}
    origins = {s.kernel: kernels[s.kernel].origin.split()[0] for s in loop.body}
    scatters = [s for s in loop.body if origins[s.kernel] == "graph.scatter_nd"]
    assert len(scatters) == 2 and all(s.args[0] == s.args[-1] for s in scatters)
    carried = scatters[0].args[0]  # computed in the carried buffer, read by one gather_nd
    assert sorted(origins[s.kernel] for s in loop.body if carried in s.args) == \
        ["graph.gather_nd"] + ["graph.scatter_nd"] * 2
