"""Each unsupported construct and each type error: its class, line, column and span, and
the message format `file:LINE:COL: error: ...` with the source line and a `^^^` span."""

import inspect
import linecache

import numpy as np
import pytest

import ember
from ember.errors import ScriptError, ScriptNameError, ScriptSyntaxError, ScriptTypeError


def plain_helper(x):
    return x


def position(fn, snippet, nth=0):
    """(line, 1-based column) of the `nth` occurrence of `snippet` in fn's source (the
    `def` line itself only for `def`)."""
    lines, first = inspect.getsourcelines(fn)
    hits = [(first + k, line.index(snippet) + 1) for k, line in enumerate(lines)
            if snippet in line and (k > 0 or snippet == "def")]
    return hits[nth]


def check_error(error, fn, snippet, length=None, nth=0):
    line, column = position(fn, snippet, nth)
    assert (error.line, error.column) == (line, column), str(error)
    assert error.end_column == column + (length if length is not None else len(snippet))
    assert error.file == inspect.getsourcefile(fn)
    text = str(error)
    assert text.startswith(f"{error.file}:{line}:{column}: error: ")
    source_line, carets = text.split("\n")[1:3]
    assert source_line.strip() == linecache.getline(error.file, line).strip()
    assert carets.strip() == "^" * (error.end_column - column)
    assert "$" not in text  # no internal names


# -- refused at decoration: (function, error class, the span's text, span length) -----------

def uses_try(x):
    try:
        x = x + 1
    except ValueError:
        pass
    return x


def uses_with(x):
    with open("f"):
        pass
    return x


def uses_lambda(x):
    f = lambda v: v  # noqa: E731
    return f(x)


def uses_generator(x):
    return sum(v for v in x)


def uses_list_comprehension(x):
    return [v * 2 for v in x]


def uses_print(x):
    print(x)
    return x


def calls_plain_function(x):
    return plain_helper(x)


def uses_global(x):
    global plain_helper
    return x


def sets_argument(x):
    x[0] = 1.0
    return x


def loops_over_array(x):
    for row in x:
        x = row
    return x


def for_else(x):
    for i in range(3):
        x = x + i
    else:
        x = x * 2
    return x


def while_else(x):
    while np.sum(x) < 3:
        x = x + 1
    else:
        x = x * 2
    return x


def uses_yield(x):
    yield x


def nested_def(x):
    def inner(v):
        return v
    return x


def imports(x):
    import math  # noqa: F401
    return x


def asserts(x):
    assert x.shape[0] == 2
    return x


def raises(x):
    raise ValueError("no")


def returns_sometimes(x):
    if np.sum(x) > 0:
        return x


def uses_unknown_numpy(x):
    return np.linalg.svd(x)


REFUSED = [
    (uses_try, ScriptSyntaxError, "try", None),
    (uses_with, ScriptSyntaxError, "with", None),
    (uses_lambda, ScriptSyntaxError, "lambda", len("lambda")),
    (uses_generator, ScriptSyntaxError, "sum", None),  # sum is no supported builtin
    (uses_list_comprehension, ScriptSyntaxError, "[v * 2 for v in x]", None),
    (uses_print, ScriptSyntaxError, "print", None),
    (calls_plain_function, ScriptSyntaxError, "plain_helper", None),
    (uses_global, ScriptSyntaxError, "global", None),
    (sets_argument, ScriptSyntaxError, "x[0]", None),
    (loops_over_array, ScriptSyntaxError, "x:", 1),
    (for_else, ScriptSyntaxError, "for", None),
    (while_else, ScriptSyntaxError, "while", None),
    (uses_yield, ScriptSyntaxError, "yield x", None),
    (nested_def, ScriptSyntaxError, "def", None, ),
    (imports, ScriptSyntaxError, "import", None),
    (asserts, ScriptSyntaxError, "assert", None),
    (raises, ScriptSyntaxError, "raise", None),
    (returns_sometimes, ScriptSyntaxError, "def", None),
    (uses_unknown_numpy, ScriptSyntaxError, "np.linalg.svd", None),
]


@pytest.mark.parametrize("fn, cls, snippet, length", REFUSED,
                         ids=[case[0].__name__ for case in REFUSED])
def test_refused_at_decoration(fn, cls, snippet, length):
    with pytest.raises(cls) as info:
        ember.script(fn)
    nth = 1 if fn is nested_def else 0
    check_error(info.value, fn, snippet, length, nth)


def test_generator_expression_is_refused_itself():
    def total(x):
        return np.sum(v for v in x)

    with pytest.raises(ScriptSyntaxError, match="generator expressions"):
        ember.script(total)


def test_source_unavailable():
    namespace = {}
    exec("def f(x):\n    return x\n", namespace)
    with pytest.raises(ScriptError, match="cannot read the source"):
        ember.script(namespace["f"])


# -- raised at the first call: types and names -------------------------------------------------

def shape_changes(x, n):
    h = x
    for _i in range(n):
        h = np.concatenate((h, x))
    return h


def dtype_changes(x, n):
    acc = np.zeros(x.shape, np.int64)
    for _i in range(n):
        acc = acc + x
    return acc


def branches_disagree(x):
    if np.sum(x) > 0:
        y = x
    else:
        y = x[0]
    return y


def one_branch_only(x):
    if np.sum(x) > 0:
        y = x * 2
    return y


def undefined_name(x):
    return x + not_defined_anywhere  # noqa: F821


def setitem_through_alias(x):
    y = x
    y[0] = 2.0
    x = y
    return x


def bad_broadcast(x, y):
    return x + y


def ambiguous_truth(x):
    if x > 0:
        x = x * 2
    return x


def test_loop_carried_shape_change():
    with pytest.raises(ScriptTypeError) as info:
        ember.script(shape_changes)(np.ones(2), 3)
    e = info.value
    check_error(e, shape_changes, "h = np.concatenate((h, x))")
    assert "`h` changes type in the loop: float64[2] before it and float64[4]" in e.message
    assert [n[1] for n in e.notes] == [position(shape_changes, "h = x")[0],
                                       position(shape_changes, "for")[0]]


def test_loop_carried_dtype_change():
    with pytest.raises(ScriptTypeError, match="`acc` changes type in the loop: int64"
                                              r"\[3\] before it and float64\[3\]"):
        ember.script(dtype_changes)(np.ones(3), 2)


def test_branches_disagree():
    with pytest.raises(ScriptTypeError) as info:
        ember.script(branches_disagree)(np.ones(3))
    check_error(info.value, branches_disagree, "if np.sum(x) > 0:", len("if np.sum(x) > 0:"))
    assert "float64[3] after the then branch but float64[] after the else" in info.value.message
    assert len(info.value.notes) == 2


def test_bound_in_one_branch_only():
    with pytest.raises(ScriptNameError) as info:
        ember.script(one_branch_only)(np.ones(3))
    check_error(info.value, one_branch_only, "y", nth=1)
    assert info.value.notes[0][1] == position(one_branch_only, "y = x * 2")[0]


def test_undefined_name():
    with pytest.raises(ScriptNameError) as info:
        ember.script(undefined_name)(np.ones(3))
    check_error(info.value, undefined_name, "not_defined_anywhere")


def test_setitem_through_alias_of_argument():
    with pytest.raises(ScriptTypeError, match="caller's array `x`") as info:
        ember.script(setitem_through_alias)(np.ones(3))
    check_error(info.value, setitem_through_alias, "y[0]")


def test_operand_shapes():
    with pytest.raises(ScriptTypeError, match="do not broadcast") as info:
        ember.script(bad_broadcast)(np.ones(3), np.ones(4))
    check_error(info.value, bad_broadcast, "x + y")


def test_truth_of_an_array():
    with pytest.raises(ScriptTypeError, match="np.any") as info:
        ember.script(ambiguous_truth)(np.ones(3))
    check_error(info.value, ambiguous_truth, "x > 0")


def augments_argument(x):
    x += 1.0
    return x


def test_augmented_assignment_on_an_argument():
    with pytest.raises(ScriptTypeError, match=r"`x \+= \.\.\.` updates `x` in place in"
                                              " NumPy, which would change the caller's") as info:
        ember.script(augments_argument)(np.ones(3))
    check_error(info.value, augments_argument, "x", nth=0)


@ember.script
def callee_with_bad_shapes(x):
    return x + np.ones(5)


def calls_callee(x):
    return callee_with_bad_shapes(x) * 2


def test_error_in_a_callee_notes_the_call():
    with pytest.raises(ScriptTypeError) as info:
        ember.script(calls_callee)(np.ones(3))
    check_error(info.value, callee_with_bad_shapes.fn, "x + np.ones(5)")
    (note,) = info.value.notes
    assert note[0] == "in this call of callee_with_bad_shapes"
    assert note[1:3] == position(calls_callee, "callee_with_bad_shapes(x)")


def test_positions_of_an_indented_function_are_the_files():
    class Holder:
        @staticmethod
        def method(x):
            return x @ x.T @ np.ones(7)

    with pytest.raises(ScriptTypeError) as info:
        ember.script(Holder.method)(np.ones((2, 3)))
    check_error(info.value, Holder.method, "x @ x.T @ np.ones(7)")


def writes_through_local_alias(x):
    a = np.zeros(3)
    b = a
    b[0] = x[0]
    return a + b


def augments_local_alias(x):
    a = x * 2
    b = a
    b *= 3.0
    return a


def test_in_place_updates_through_a_live_alias():
    with pytest.raises(ScriptTypeError, match="`a` is the same array") as info:
        ember.script(writes_through_local_alias)(np.ones(3))
    check_error(info.value, writes_through_local_alias, "b[0]")
    assert info.value.notes[0][1] == position(writes_through_local_alias, "a = np.zeros")[0]
    with pytest.raises(ScriptTypeError, match=r"write `b = b \* \.\.\.`"):
        ember.script(augments_local_alias)(np.ones(3))


def rebinds_dead_alias(x):
    a = x * 2
    b = a
    b *= 3.0
    return b


def test_in_place_update_of_an_alias_that_is_dead_is_fine():
    np.testing.assert_allclose(ember.script(rebinds_dead_alias)(np.ones(3)), np.full(3, 6.0))


def calls_a_local_value(x):
    f = x.shape
    return f(1)


def unknown_method(x):
    return x.cumsum_everything()


def test_calls_known_only_at_the_first_call():
    with pytest.raises(ScriptNameError, match="cannot call `tuple`") as info:
        ember.script(calls_a_local_value)(np.ones(3))
    check_error(info.value, calls_a_local_value, "f", nth=1)
    with pytest.raises(ScriptNameError, match="no method `cumsum_everything`") as info:
        ember.script(unknown_method)(np.ones(3))
    check_error(info.value, unknown_method, "x.cumsum_everything")


def slice_of_runtime_length(x):
    out = x * 0
    for i in range(x.shape[0]):
        out[0] = np.sum(x[i:])
    return out


def test_runtime_slice_needs_a_static_length():
    with pytest.raises(ScriptTypeError, match=r"write `x\[i:i \+ n\]`") as info:
        ember.script(slice_of_runtime_length)(np.ones(3))
    check_error(info.value, slice_of_runtime_length, "i:")
