"""The frontend's AST passes in text: the exit transform and liveness, and the graph it
emits (printable, parsable, verified)."""

import ast
import textwrap

import numpy as np

import ember
from ember.frontends.script.exits import transform_exits
from ember.frontends.script.liveness import annotate_liveness
from ember.frontends.script.source import FunctionSource
from ember.graph import parse_graph, print_graph, verify_graph
from tests.script import programs as P


def transformed(code: str) -> FunctionSource:
    tree = ast.parse(textwrap.dedent(code)).body[0]
    source = FunctionSource(None, tree, "<test>", code.splitlines(True), 1)
    transform_exits(source)
    annotate_liveness(source.tree)
    return source


def unparsed(code: str) -> str:
    return ast.unparse(transformed(code).tree)


def test_return_in_a_branch_guards_the_rest():
    assert unparsed("""
        def f(x):
            if c(x):
                return x
            y = x + 1
            return y
    """) == textwrap.dedent("""\
        def f(x):
            $returned = False
            $retval = $undefined
            if c(x):
                $retval = x
                $returned = True
            if not $returned:
                y = x + 1
                $retval = y
                $returned = True
            return $retval""")


def test_return_on_both_branches_needs_no_guard():
    assert unparsed("""
        def f(x):
            if c(x):
                return x
            else:
                return -x
            x = x * 2
    """).endswith("""\
    if c(x):
        $retval = x
        $returned = True
    else:
        $retval = -x
        $returned = True
    return $retval""")


def test_break_and_continue_are_flags_and_the_loop_stops_on_break():
    source = transformed("""
        def f(x, n):
            for i in range(n):
                if c(x):
                    continue
                if d(x):
                    break
                x = x + i
            return x
    """)
    assert ast.unparse(source.tree) == textwrap.dedent("""\
        def f(x, n):
            $broke0 = False
            for i in range(n):
                $continued0 = False
                if c(x):
                    $continued0 = True
                if not $continued0:
                    if d(x):
                        $broke0 = True
                    if not $broke0:
                        x = x + i
            return x""")
    loop = source.tree.body[1]
    assert loop.ember_stop == ["$broke0"]
    assert loop.ember_carried == ["$broke0", "x"]  # $continued0 is reset every iteration


def test_liveness_decides_if_results_and_carried_values():
    source = transformed("""
        def f(x, n):
            t = x
            s = x
            for i in range(n):
                t = x * i
                s = s + t
                u = s * 2
            if c(s):
                a = s
                b = s
            else:
                a = x
                b = x
            return a
    """)
    loop, branch = source.tree.body[2], source.tree.body[3]
    assert loop.ember_carried == ["s"]  # t and u are rebound before use; i is dead after
    assert branch.ember_live_out == {"a"}  # so the if yields a only


def test_loop_variable_is_carried_when_read_after_the_loop():
    loop = transformed("""
        def f(x, n):
            for i in range(n):
                x = x + 1
            return x, i
    """).tree.body[0]
    assert loop.ember_carried == ["i", "x"]


def test_emitted_graphs_print_parse_and_verify():
    cases = [(P.rnn_sequence, (np.ones((3, 2, 2)), np.ones((2, 2)), np.eye(2), np.zeros(2))),
             (P.search_with_all_exits, (np.linspace(-1, 1, 5), 0.5)),
             (P.nested_if_in_for, (np.ones(3), 2))]
    for fn, args in cases:
        scripted = ember.script(fn)
        scripted(*args)
        graph = scripted.specializations()[0].graph
        verify_graph(graph)
        text = print_graph(graph)
        assert print_graph(parse_graph(text)) == text
