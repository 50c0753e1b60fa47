"""Differential testing of the whole pipeline on random graphs: each graph runs through the
reference interpreter (the oracle) and through compiled code at every optimization level
(fusion, Winograd and fused attention off; the default; the GPU's schedule, run on this
CPU), and every result must match the oracle's within the tolerance of the graph's op mix.
A failure shrinks (hypothesis) to a minimal graph, printed as IR text to keep as a
regression test.

CI runs EXAMPLES graphs. `make fuzz` runs EMBER_FUZZ_JOBS workers for EMBER_FUZZ_SECONDS
each (tests/fuzz/budget.py; EMBER_FUZZ_SEED makes a run repeatable) and prints how many
graphs each checked.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings

from ember import interpret
from ember.config import Config
from ember.driver.pipeline import compile_graph, lower_to_program
from ember.errors import EmberError
from ember.graph.ir import Graph
from ember.graph.text import print_graph
from ember.runtime.executable import compile_program
from ember.target import Target
from tests.fuzz.budget import FUZZ, run_for_a_while, timed, workers
from tests.graph.random_graphs import random_graphs

EXAMPLES = 25
LEVELS = {
    "O0": Config(executor="cpu", disk_cache=False, fusion=False, winograd=False,
                 fuse_attention=False),
    "O2": Config(executor="cpu", disk_cache=False),
}
GPU = Config(target="sm_90", disk_cache=False)


def tolerance(graph: Graph) -> float:
    """The relative (and absolute) tolerance of the graph's op mix: a value rounded to a
    16-bit float may land an ulp of it away when what feeds it was summed in another
    order (bf16: 2**-8, f16: 2**-11); otherwise f32 sums in another order, and inline
    exp/tanh/erf against NumPy's, stay within 1e-4."""
    casts = {op.attrs.get("to") for op in graph.walk() if op.name == "cast"}
    names = {str(t) for t in casts}
    if any("bf16" in n for n in names):
        return 1e-2
    if any("f16" in n for n in names):
        return 2e-3
    return 1e-4


COUNTS = {"checked": 0, "refused": 0}  # (graphs of this process; the oracle's refusals)


def check_pipeline(graph: Graph, inputs: list[np.ndarray]) -> None:
    try:
        with np.errstate(all="ignore"):
            want = interpret(graph, inputs)
    except EmberError:
        COUNTS["refused"] += 1
        return  # (a graph the oracle refuses: no claim to check)
    COUNTS["checked"] += 1
    tol = tolerance(graph)
    runs = {level: lambda c=config: compile_graph(graph, c)(*inputs)
            for level, config in LEVELS.items()}
    runs["gpu schedule"] = lambda: _gpu_schedule_on_cpu(graph, inputs)
    for level, run in runs.items():
        with np.errstate(all="ignore"):
            got = run()
        assert len(got) == len(want), level
        for i, (g, w) in enumerate(zip(got, want)):
            assert g.dtype == w.dtype and g.shape == w.shape, (level, i)
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, equal_nan=True,
                                       err_msg=f"{level}, output {i}\n{print_graph(graph)}")


def _gpu_schedule_on_cpu(graph: Graph, inputs: list[np.ndarray]) -> list[np.ndarray]:
    program, plan = lower_to_program(graph, GPU)
    return compile_program(program, Target.host(), plan)(*inputs)


@settings(max_examples=EXAMPLES, **FUZZ)
@given(random_graphs(wide=True))
def test_random_graphs_match_the_interpreter_at_every_level(case) -> None:
    check_pipeline(*case)


@timed
@workers
def test_fuzz_for_a_while(worker: int) -> None:
    before = dict(COUNTS)
    ran = run_for_a_while(random_graphs(wide=True), check_pipeline, worker)
    checked = COUNTS["checked"] - before["checked"]
    refused = COUNTS["refused"] - before["refused"]
    print(f"\nfuzz: {checked} random graphs checked at {len(LEVELS) + 1} levels (and"
          f" {refused} the interpreter refuses) {ran}: no mismatch")
