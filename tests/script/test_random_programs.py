"""Random programs from a small grammar of the scripting subset (assignments, arithmetic,
`if` on array conditions, for-range and while loops with break and continue), scripted and
run by Python on the same inputs."""

import importlib.util
import itertools
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ember

NAMES = ("a", "b", "c")
FOLDER = Path(tempfile.mkdtemp(prefix="ember-script-programs-"))
_ids = itertools.count()


@st.composite
def expressions(draw, names, depth=0):
    if depth >= 2 or draw(st.booleans()):
        return draw(st.sampled_from(names + ("0.5", "2")))
    kind = draw(st.sampled_from(("binary", "call", "scale")))
    left = draw(expressions(names, depth + 1))
    if kind == "binary":
        op = draw(st.sampled_from(("+", "-", "*")))
        return f"({left} {op} {draw(expressions(names, depth + 1))})"
    if kind == "call":
        fn = draw(st.sampled_from(("np.tanh", "np.abs", "np.sin")))
        return f"{fn}({left})"
    return f"({left} * {draw(st.sampled_from(('0.25', '3', '-1')))})"


@st.composite
def blocks(draw, names, depth, loop_vars, indent, least=1):
    pad = "    " * indent
    lines = []
    for _ in range(draw(st.integers(least, 3))):
        kind = draw(st.sampled_from(("assign", "assign", "augment", "if", "for", "while", "exit")
                                    if depth < 2 else ("assign", "augment", "exit")))
        target = draw(st.sampled_from(NAMES))
        usable = names + loop_vars
        # (An array in every value: a name bound to a scalar would change its shape.)
        value = f"np.tanh({draw(expressions(usable))} + {draw(st.sampled_from(NAMES))})"
        if kind == "assign":
            lines.append(f"{pad}{target} = {value}")
        elif kind == "augment":
            op = draw(st.sampled_from(("+=", "-=", "*=")))
            lines.append(f"{pad}{target} {op} {value}")
        elif kind == "if":
            name, bound = draw(st.sampled_from(NAMES)), draw(st.sampled_from(("0", "0.5", "-1")))
            cond = f"np.sum({name}) > {bound}"
            lines.append(f"{pad}if {cond}:")
            lines += draw(blocks(names, depth + 1, loop_vars, indent + 1))
            if draw(st.booleans()):
                lines.append(f"{pad}else:")
                lines += draw(blocks(names, depth + 1, loop_vars, indent + 1))
        elif kind == "for":
            var = f"i{depth}"
            bounds = draw(st.sampled_from(("3", "0", "1, 4", "4, 0, -2", "n")))
            lines.append(f"{pad}for {var} in range({bounds}):")
            lines += draw(blocks(names, depth + 1, loop_vars + (var,), indent + 1))
        elif kind == "while":
            # The counter first, so that a `continue` cannot loop forever.
            var, name = f"k{depth}", draw(st.sampled_from(NAMES))
            lines.append(f"{pad}{var} = 0")
            lines.append(f"{pad}while {var} < 3 and np.sum({name}) > -2:")
            lines.append(f"{pad}    {var} += 1")
            lines += draw(blocks(names, depth + 1, loop_vars + (var,), indent + 1))
        elif loop_vars:
            name, bound = draw(st.sampled_from(NAMES)), draw(st.sampled_from(("0.3", "0.9")))
            cond = f"np.max({name}) > {bound}"
            lines.append(f"{pad}if {cond}:")
            lines.append(f"{pad}    {draw(st.sampled_from(('break', 'continue')))}")
        else:
            lines.append(f"{pad}{target} = {target} * 0.5")
    return lines


@st.composite
def programs(draw):
    body = draw(blocks(NAMES, 0, (), 1, least=2))
    name = f"program_{next(_ids)}"
    # (Fresh arrays first: `a += ...` on an argument would change the caller's array.)
    source = "\n".join(["import numpy as np", "", "", f"def {name}(a, b, c, n):",
                        "    a, b, c = a * 1.0, b * 1.0, c * 1.0", *body,
                        "    return a, b + c", ""])
    return name, source


def load(name, source):
    path = FOLDER / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def run_both(program, seed, executor="interp"):
    name, source = program
    fn = load(name, source)
    rng = np.random.default_rng(seed)
    scripted = ember.script(fn, config=ember.Config(executor=executor))
    for n in (0, 2):
        args = tuple(rng.standard_normal(4) for _ in NAMES)
        want = fn(*(a.copy() for a in args), n)
        got = scripted(*args, n)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12, err_msg=source)


SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(max_examples=25, **SETTINGS)
@given(programs(), st.integers(0, 2**16))
def test_random_programs(program, seed):
    run_both(program, seed)


@pytest.mark.slow
@settings(max_examples=400, **SETTINGS)
@given(programs(), st.integers(0, 2**16))
def test_random_programs_long(program, seed):
    run_both(program, seed)


@pytest.mark.slow
@settings(max_examples=60, **SETTINGS)
@given(programs(), st.integers(0, 2**16))
def test_random_programs_compiled(program, seed):
    run_both(program, seed, "cpu")
