"""The coverage-guided fuzzers' targets (atheris, libFuzzer's engine): each `check` takes
bytes and must end in a result or an `EmberError`. Anything else (another exception, an
`InternalError`, which is Ember's report of a failure of its own, a crash, a hang) is a
bug: the fuzzer stops and writes the input that caused it.

    python fuzz/run.py graph_text -max_total_time=1800   # or onnx_model, loop_text
    make fuzz-parsers FUZZ_SECONDS=1800                   # each target in turn

Each target's corpus is checked in (`fuzz/corpus/<target>/`); `tests/test_fuzz_corpora.py`
runs every file of it through `check` in CI, so an input that once broke Ember stays a
regression test.
"""

from __future__ import annotations

import warnings

from ember.errors import EmberError, InternalError


def graph_text(data: bytes) -> None:
    """The graph IR's text parser, then the verifier and a print/parse round trip of what
    parsed."""
    from ember.graph.text import parse_graph, print_graph
    from ember.graph.verify import verify_graph

    text = data.decode("utf-8", errors="replace")
    try:
        graph = parse_graph(text)
        verify_graph(graph)
    except EmberError:
        return
    printed = print_graph(graph)
    assert print_graph(parse_graph(printed)) == printed, "the printed text does not round-trip"


def loop_text(data: bytes) -> None:
    """The loop IR's text parser, then its verifier."""
    from ember.loops.text import parse_program
    from ember.loops.verify import verify_program

    try:
        verify_program(parse_program(data.decode("utf-8", errors="replace")))
    except EmberError:
        return


def onnx_model(data: bytes) -> None:
    """Serialized bytes as an ONNX model, through the importer (its dim_params symbolic)."""
    from ember.frontends.onnx.importer import Importer, load_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            Importer(load_model(data), symbolic=True).run()
        except InternalError:
            raise
        except EmberError:
            return


TARGETS = {"graph_text": graph_text, "loop_text": loop_text, "onnx_model": onnx_model}
