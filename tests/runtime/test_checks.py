"""Values that compiled code cannot compute with fail the run with a DataError naming the op:
an index out of the range of its axis (gathers, scatters), an integer division by zero
(ember/graph/passes/checks.py). Every way of running a program: the general call, the
native call, the loop interpreter, a program of every size, an AOT library."""

from __future__ import annotations

import numpy as np
import pytest

from ember import Builder, Config, DataError, DType
from ember.driver.pipeline import compile_graph
from ember.graph.passes import get_pass
from ember.graph.symbolic import symbol
from ember.loops.interp import run_program
from ember.loops.lower import lower_graph
from ember.loops.text import parse_program, print_program
from ember.loops.verify import verify_program
from ember.target import Target

CPU = Config(executor="cpu", disk_cache=False)
TABLE = np.arange(40, dtype=np.float32).reshape(10, 4)


def embedding(index_dtype=DType.i64) -> Builder:
    b = Builder("lookup")
    ids = b.input("ids", index_dtype, (3,))
    b.output(b.gather(b.constant(TABLE), ids, axis=0))
    return b


def test_an_index_out_of_range_fails_the_run_on_every_call_path():
    run = compile_graph(embedding().build(), CPU)
    good = np.array([1, -1, 9])
    for _ in range(4):  # the general call, then the native one
        np.testing.assert_array_equal(run(good)[0], TABLE[[1, -1, 9]])
        for bad in ([1, 10, 2], [-11, 0, 0]):
            with pytest.raises(DataError, match="graph.check_index.*an index is out of the"
                                                " range of the axis it addresses"):
                run(np.array(bad))
    assert run.native("list") is not None  # (the native call ran above)
    out = [np.empty((3, 4), np.float32)]
    with pytest.raises(DataError):
        run(np.array([0, 99, 0]), out=out)
    np.testing.assert_array_equal(run(good, out=out)[0], TABLE[[1, -1, 9]])


@pytest.mark.parametrize("op", ["gather_elements", "gather_nd", "scatter_elements",
                                "scatter_nd"])
def test_every_indexing_op_checks_its_indices(op):
    b = Builder(op)
    data = b.input("data", DType.f32, (4, 5))
    if op == "gather_elements":
        ids = b.input("ids", DType.i32, (4, 5))
        b.output(b.gather_elements(data, ids, axis=1))
        good, bad = np.zeros((4, 5), np.int32), np.full((4, 5), 5, np.int32)
    elif op == "scatter_elements":
        ids = b.input("ids", DType.i32, (2, 5))
        b.output(b.scatter_elements(data, ids, b.constant(np.ones((2, 5), np.float32)),
                                    axis=0))
        good, bad = np.ones((2, 5), np.int32), np.full((2, 5), -5, np.int32)
    else:  # index pairs into (4, 5): the second must be below 5
        ids = b.input("ids", DType.i64, (3, 2))
        if op == "gather_nd":
            b.output(b.gather_nd(data, ids))
        else:
            b.output(b.scatter_nd(data, ids, b.constant(np.ones(3, np.float32))))
        good, bad = np.array([[0, 4], [3, 0], [-4, -5]]), np.array([[0, 4], [3, 5], [0, 0]])
    run = compile_graph(b.build(), CPU)
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    run(x, good)
    with pytest.raises(DataError, match="an index is out of the range"):
        run(x, bad)


@pytest.mark.parametrize("op", ["div", "mod", "fmod"])
def test_an_integer_division_by_zero_fails_the_run(op):
    b = Builder(op)
    x, y = b.input("x", DType.i32, (4,)), b.input("y", DType.i32, (4,))
    b.output(getattr(b, op)(x, y))
    run = compile_graph(b.build(), CPU)
    x = np.array([7, -7, -2 ** 31, 5], np.int32)
    run(x, np.array([2, -3, -1, 1], np.int32))  # INT_MIN / -1 wraps: no trap
    with pytest.raises(DataError, match="an integer division by zero"):
        run(x, np.array([2, 0, 1, 1], np.int32))


def test_constant_operands_are_checked_at_compile_time():
    """A constant divisor or index table that is fine needs no check at run time; one that
    is not is checked when (and if) it runs."""
    b = Builder("constants")
    x = b.input("x", DType.i64, (3,))
    halves = b.div(x, b.constant(np.array([2, 2, 2])))
    picked = b.gather(b.constant(TABLE), b.constant(np.array([0, 9, -10])), axis=0)
    b.output(halves)
    b.output(picked)
    checked = get_pass("check_values").run(b.build())
    assert not [op for op in checked.body.ops if op.name.startswith("check_")]

    b = Builder("bad_constant")
    x = b.input("x", DType.f32, (10, 4))
    b.output(b.gather(x, b.constant(np.array([3, 10])), axis=0))
    run = compile_graph(b.build(), CPU)
    with pytest.raises(DataError, match="out of the range"):
        run(TABLE)


def test_a_check_in_a_loop_body_stops_the_run_at_its_iteration():
    """A graph loop whose body gathers at the iteration number: the check fails at the
    first iteration past the table, wherever that is."""
    b = Builder("walk")
    trips = b.input("trips", DType.i64, ())
    start = b.constant(np.zeros(4, np.float32))

    def body(r, i, total):
        return [r.constant(np.array(True)), r.add(total, r.gather(r.constant(TABLE), i, axis=0))]

    (total,) = b.loop(trips, b.constant(np.array(True)), [start], body)
    b.output(total)
    run = compile_graph(b.build(), CPU)
    np.testing.assert_array_equal(run(np.array(10))[0], TABLE.sum(0))
    with pytest.raises(DataError, match="out of the range"):
        run(np.array(11))


def test_a_program_of_every_size_checks_against_the_sizes_of_its_call():
    b = Builder("sized")
    data = b.input("data", DType.f32, (symbol("n"), 4))
    ids = b.input("ids", DType.i64, (2,))
    b.output(b.gather(data, ids, axis=0))
    run = compile_graph(b.build(), CPU)
    ids = np.array([0, 6])
    np.testing.assert_array_equal(run(np.ones((7, 4), np.float32), ids)[0], np.ones((2, 4)))
    with pytest.raises(DataError, match="out of the range"):
        run(np.ones((6, 4), np.float32), ids)


def test_the_loop_interpreter_and_the_text_form_know_the_status_word():
    graph = get_pass("check_values").run(embedding().build())
    program = verify_program(lower_graph(graph, Target.host()))
    assert [b.kind for b in program.buffers].count("status") == 1
    text = print_program(program)
    assert "status %status: i32[]" in text
    again = verify_program(parse_program(text))
    assert print_program(again) == text
    np.testing.assert_array_equal(run_program(again, [np.array([2, 3, 4])])[0], TABLE[2:5])
    with pytest.raises(DataError, match="check_index.*out of the range"):
        run_program(again, [np.array([2, 30, 4])])


def test_an_aot_library_returns_the_status_and_names_the_check(tmp_path):
    from ember.loops.schedule import schedule_program
    from ember.runtime.aot import Library, write_library
    from ember.runtime.memory_plan import plan_memory

    graph = get_pass("check_values").run(embedding().build())
    target = Target.host()
    program = schedule_program(verify_program(lower_graph(graph, target)), target)
    write_library(program, plan_memory(program), tmp_path, target, "lookup")
    header = (tmp_path / "lookup.h").read_text()
    assert "#define LOOKUP_INDEX_OUT_OF_RANGE 1" in header
    assert "const char *lookup_check_origin(int status);" in header
    library = Library(tmp_path)
    np.testing.assert_array_equal(library(np.array([0, 1, 2]))[0], TABLE[:3])
    with pytest.raises(DataError, match="lookup: graph.check_index.*out of the range"):
        library(np.array([0, 10, 2]))
