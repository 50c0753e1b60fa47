"""Scripted functions against the same functions run by Python, on inputs that take
different branches and trip counts, in float32 and float64."""

import numpy as np
import pytest

import ember
from tests.script import programs as P

SCRIPTED = {}
EXECUTOR = ["interp"]


@pytest.fixture(autouse=True, params=["interp", "cpu"])
def executor(request):
    """Every case runs on the reference interpreter and as compiled code."""
    EXECUTOR[0] = request.param
    return request.param


def scripted(fn):
    """One scripted wrapper per function and executor, shared by the parametrized cases
    (compiles are the cost of these tests)."""
    key = (fn, EXECUTOR[0])
    if key not in SCRIPTED:
        SCRIPTED[key] = ember.script(fn, config=ember.Config(executor=EXECUTOR[0]))
    return SCRIPTED[key]


def check(fn, *args, expected=None):
    want = fn(*args) if expected is None else expected
    got = scripted(fn)(*args)
    # float32 inputs round at every step; float64 ones agree to a few ulps of the result.
    single = any(isinstance(a, np.ndarray) and a.dtype == np.float32 for a in args)
    compare(got, want, 2e-5 if single else 1e-9)
    return got


def compare(got, want, tol):
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            compare(g, w, tol)
        return
    if isinstance(want, np.ndarray):
        assert np.asarray(got).dtype == want.dtype, (np.asarray(got).dtype, want.dtype)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)


DTYPES = [np.float32, np.float64]
rng = np.random.default_rng(7)


def rand(*shape, dtype=np.float64, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("steps", [1, 4, 9])
def test_rnn_sequence(dtype, steps):
    check(P.rnn_sequence, rand(steps, 2, 3, dtype=dtype), rand(3, 4, dtype=dtype),
          rand(4, 4, dtype=dtype, scale=0.5), rand(4, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_newton_while_on_reduction(dtype):
    for low, high in ((1.0, 2.0), (0.5, 30.0)):
        a = rng.uniform(low, high, 16).astype(dtype)
        check(P.newton_cube_root, a, 1e-3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bisection(dtype):
    target = rng.uniform(1, 4, 8).astype(dtype)
    check(P.bisection, np.zeros(8, dtype), np.full(8, 4.0, dtype), target, 1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("limit", [0.5, 7.0, 40.0])
def test_while_true_break(dtype, limit):
    check(P.while_true_break, np.abs(rand(3, dtype=dtype)) + 0.1, limit)


@pytest.mark.parametrize("dtype", DTYPES)
def test_continue(dtype):
    for _ in range(3):
        check(P.sum_odd_rows, rand(6, 3, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [0.3, 3.0])
def test_nested_if_in_for(dtype, scale):
    check(P.nested_if_in_for, rand(5, dtype=dtype, scale=scale), 6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_range_steps(dtype):
    check(P.range_steps, rand(4, dtype=dtype))
    check(P.negative_step_index, rand(5, 2, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 5])
def test_loop_carried_tuple(dtype, n):
    check(P.carried_tuple, rand(3, dtype=dtype), n)


@pytest.mark.parametrize("dtype", DTYPES)
def test_calls_another_scripted_function(dtype):
    h, w = rand(2, 3, dtype=dtype), rand(3, 3, dtype=dtype)
    want_h, want_c = h, np.zeros_like(h)
    for _ in range(3):
        want_h, want_c = P._cell(want_h, want_c, w)
    check(P.lstm_like, h, w, 3, expected=want_h + want_c)
    graph = scripted(P.lstm_like).specializations()[-1].graph
    assert [op.name for op in graph.ops].count("loop") == 1  # the callee is inlined


@pytest.mark.parametrize("dtype", DTYPES)
def test_early_returns_in_branches(dtype):
    for x in (np.array([1.0, 2.0]), np.array([-3.0, 1.5]), np.array([-3.0, 0.5])):
        check(P.early_return_branches, x.astype(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [0.1, 1.0, 8.0])
def test_early_return_in_loop(dtype, scale):
    check(P.early_return_in_loop, np.abs(rand(3, dtype=dtype, scale=scale)), 6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_setitem_in_loop(dtype):
    check(P.cumsum_setitem, rand(7, 2, dtype=dtype))
    check(P.slice_setitem, rand(3, 2, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", [0, 1, 2])
def test_constant_branch_on_int(dtype, mode):
    check(P.const_branch_on_int, rand(3, 4, dtype=dtype), mode)
    graph = scripted(P.const_branch_on_int).specializations()[-1].graph
    assert not any(op.name == "if" for op in graph.walk())  # folded at compile time


@pytest.mark.parametrize("dtype", DTYPES)
def test_numpy_functions(dtype):
    check(P.softmax_rows, rand(3, 5, dtype=dtype))
    check(P.numpy_mix, rand(2, 3, dtype=dtype), rand(2, 3, dtype=dtype))


def test_mandelbrot_break_on_any():
    re, im = np.meshgrid(np.linspace(-2, 1, 6), np.linspace(-1, 1, 4))
    check(P.mandelbrot_escape, re, im, 20)
    check(P.mandelbrot_escape, re.astype(np.float32) + 3, im.astype(np.float32), 20)


def test_python_loop_unrolls_to_constants():
    x = rand(3)
    got = check(P.python_loop_unrolled, x, 5)
    assert got[1] == 30 and isinstance(got[1], int)
    graph = scripted(P.python_loop_unrolled).specializations()[-1].graph
    assert not any(op.name == "loop" for op in graph.walk())


def test_weak_python_floats_keep_float32():
    x = rand(4, dtype=np.float32)
    got = check(P.dynamic_count, x, 3)
    assert got.dtype == np.float32


def test_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    x = torch.randn(5, dtype=torch.float64)
    got = scripted(P.early_return_branches)(x)
    assert isinstance(got, torch.Tensor)
    np.testing.assert_allclose(got.numpy(), P.early_return_branches(x.numpy()))


@pytest.mark.parametrize("dtype", DTYPES)
def test_more_control_flow(dtype):
    for n in (2, 4):
        check(P.return_in_nested_loops, np.ones(3, dtype), n)
    for scale in (1.0, 7.0):
        check(P.loop_variable_after_break, np.full(2, scale, dtype))
    check(P.while_continue, rand(2, dtype=dtype))
    check(P.while_data_tuple, rand(3, dtype=dtype))
    check(P.elementwise_setitem_2d, rand(2, 3, dtype=dtype))
    for sign in (1, -1):
        check(P.conditional_expression, sign * np.ones(2, dtype))
        check(P.keyword_call, sign * np.ones(2, dtype))


def test_integer_arrays_keep_their_dtype():
    check(P.integer_arithmetic, np.arange(-4, 5, dtype=np.int32))


def test_long_constant_loop_becomes_a_loop_op():
    got = check(P.python_loop_unrolled, rand(2), 100)  # past the unroll budget
    assert int(got[1]) == sum(i * i for i in range(100))


@pytest.mark.parametrize("dtype", DTYPES)
def test_exits_and_runtime_bounds(dtype):
    for _ in range(3):
        x = rand(6, dtype=dtype)
        check(P.calls_early_returning, x)
        check(P.search_with_all_exits, x, 1.0)
        check(P.range_from_data, x)
        check(P.negative_runtime_index_setitem, x)


OFFSET = np.array([1.0, -2.0, 3.0])


def test_names_from_closures_and_globals():
    scale = 3.0
    power = 2

    def closure_and_global(x):
        return (x * scale) ** power + OFFSET

    x = rand(3)
    got = ember.script(closure_and_global)(x)
    np.testing.assert_allclose(got, closure_and_global(x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_tuple_dtype_and_default_arguments(dtype):
    pair = (rand(3, dtype=dtype), rand(3, dtype=dtype))
    check(P.tuple_and_dtype_arguments, pair, np.float64)
    check(P.tuple_and_dtype_arguments, pair, np.dtype("int32"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_names_bound_on_every_path_that_goes_on(dtype):
    for sign in (1, -1):
        check(P.bound_unless_returned, sign * np.ones(3, dtype))
    check(P.bound_unless_continued, rand(5, 2, dtype=dtype))
    check(P.bound_in_a_later_iteration, rand(2, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_numpy_scalars_are_strong_python_numbers_weak(dtype):
    check(P.numpy_scalars_are_strong, rand(3, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_slices_with_runtime_starts(dtype):
    for k in (1, 3):
        check(P.sliding_windows, rand(7, dtype=dtype), k)
