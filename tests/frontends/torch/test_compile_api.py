"""The PyTorch entry points' behaviour: `ember.compile(module)` and
`torch.compile(module, backend="ember")`.

Recompilation per input signature and its bounded cache, output structures (dict, tuple),
an op Ember will never convert (torch.linalg.eigh: aten._linalg_eigh) in strict mode (an
UnsupportedOpError naming the ATen op and its source line) and in fallback mode (eager
result, one warning, counters), and inputs of the wrong dtype or rank (an EmberError, and
the compiled module still works afterwards).

The modules use only ops with converters since the frontend core (addmm, permute, relu,
add, mul), so these tests do not depend on the converters being written now.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import ember
import ember.torch
from ember.api import torch_dynamo as dynamo
from ember.config import Config
from ember.errors import EmberError, ShapeError, UnsupportedOpError


def close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


class Eigh(torch.nn.Module):
    """An op Ember does not convert, between two that it does."""

    def forward(self, x):
        sym = x + x.mT
        eigenvalues, _ = torch.linalg.eigh(sym)  # the unsupported op: aten._linalg_eigh
        return torch.relu(eigenvalues) * 2.0


def ember_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if str(w.message).startswith("ember:")]


# -- recompilation and its cache ------------------------------------------------------------


def test_recompiles_on_a_new_input_shape() -> None:
    model = torch.nn.Linear(8, 4)
    compiled = ember.compile(model, strict=True)
    for batch, compilations in ((2, 1), (2, 1), (5, 2), (2, 2), (5, 2)):
        x = torch.randn(batch, 8)
        close(compiled(x), model(x).detach())
        assert compiled.compilations == compilations, f"after batch {batch}"


def test_recompiles_on_a_new_input_dtype() -> None:
    compiled = ember.compile(torch.nn.ReLU(), strict=True)
    compiled(torch.randn(3))
    out = compiled(torch.tensor([-1.0, 2.0], dtype=torch.float64))
    assert compiled.compilations == 2
    assert out.dtype == torch.float64
    close(out, torch.tensor([0.0, 2.0], dtype=torch.float64))


def test_example_inputs_compile_ahead_of_the_first_call() -> None:
    x = torch.randn(3, 8)
    compiled = ember.compile(torch.nn.Linear(8, 2), x, strict=True)
    assert compiled.compilations == 1
    compiled(x)
    assert compiled.compilations == 1


def test_specialization_cache_is_bounded() -> None:
    model = torch.nn.Linear(8, 4)
    compiled = ember.compile(model, config=Config(max_specializations=2), strict=True)
    for batch in (1, 2, 3):
        compiled(torch.randn(batch, 8))
    assert compiled.compilations == 3
    assert len(compiled.cache) == 2  # batch 1 was evicted: the oldest
    compiled(torch.randn(3, 8))  # still cached (and now the most recent)
    assert compiled.compilations == 3
    x = torch.randn(1, 8)
    close(compiled(x), model(x).detach())  # compiled again
    assert compiled.compilations == 4
    assert len(compiled.cache) == 2
    compiled(torch.randn(3, 8))  # kept: it was used more recently than batch 2
    assert compiled.compilations == 4


def test_max_specializations_must_be_positive() -> None:
    with pytest.raises(EmberError, match="max_specializations"):
        Config(max_specializations=0)


# -- output structures ----------------------------------------------------------------------


class DictOut(torch.nn.Module):
    def forward(self, x, y):
        return {"sum": x + y, "relu": torch.relu(x), "scaled": y * 3.0}


class TupleOut(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x), (x * 2.0, x + 1.0)


def test_dict_output() -> None:
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    expected = DictOut()(x, y)
    for compiled in (ember.compile(DictOut(), strict=True),
                     torch.compile(DictOut(), backend="ember", options={"strict": True})):
        out = compiled(x, y)
        assert type(out) is dict and list(out) == ["sum", "relu", "scaled"]
        for key in expected:
            close(out[key], expected[key])


def test_tuple_output() -> None:
    x = torch.randn(4, 5)
    expected = TupleOut()(x)
    for compiled in (ember.compile(TupleOut(), strict=True),
                     torch.compile(TupleOut(), backend="ember", options={"strict": True})):
        out = compiled(x)
        assert type(out) is tuple and len(out) == 2
        assert type(out[1]) is tuple and len(out[1]) == 2
        close(out[0], expected[0])
        close(out[1][0], expected[1][0])
        close(out[1][1], expected[1][1])


def test_torch_compile_really_uses_ember() -> None:
    torch._dynamo.reset()
    before = ember.torch.counters["graphs"]
    compiled = torch.compile(TupleOut(), backend="ember", fullgraph=True,
                             options={"strict": True})
    compiled(torch.randn(3, 3))
    assert ember.torch.counters["graphs"] == before + 1


# -- an unsupported op: strict and fallback -------------------------------------------------


def _sym_input() -> torch.Tensor:
    return torch.randn(4, 4)


def test_strict_names_the_unsupported_op_and_its_source_line() -> None:
    with pytest.raises(UnsupportedOpError) as info:
        ember.compile(Eigh(), strict=True)(_sym_input())
    message = str(info.value)
    assert "aten._linalg_eigh" in message
    assert "test_compile_api.py:" in message and "torch.linalg.eigh(sym)" in message


def test_strict_torch_compile_names_the_unsupported_op() -> None:
    torch._dynamo.reset()
    compiled = torch.compile(Eigh(), backend="ember", options={"strict": True})
    with pytest.raises(Exception) as info:  # Dynamo wraps it in BackendCompilerFailed
        compiled(_sym_input())
    inner = info.value
    while inner is not None and not isinstance(inner, UnsupportedOpError):
        inner = getattr(inner, "inner_exception", None) or inner.__cause__
    assert isinstance(inner, UnsupportedOpError), f"got {info.value!r}"
    assert "aten._linalg_eigh" in str(inner)
    assert "test_compile_api.py:" in str(inner) and "torch.linalg.eigh(sym)" in str(inner)


def test_fallback_matches_eager_and_warns_once() -> None:
    x = _sym_input()
    expected = Eigh()(x)
    compiled = ember.compile(Eigh())
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        close(compiled(x), expected)
        close(compiled(x.clone()), expected)
    messages = ember_warnings(record)
    assert len(messages) == 1, messages
    assert "aten._linalg_eigh" in messages[0]


def test_torch_compile_fallback_matches_eager_warns_once_and_counts(monkeypatch) -> None:
    monkeypatch.setattr(dynamo, "_warned", set())  # the once-per-process memory, for this test
    torch._dynamo.reset()
    x = _sym_input()
    expected = Eigh()(x)
    before = dict(ember.torch.counters)
    compiled = torch.compile(Eigh(), backend="ember")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        close(compiled(x), expected)
        close(compiled(x.clone()), expected)
        torch._dynamo.reset()  # compiled afresh: the same ops do not warn again
        close(torch.compile(Eigh(), backend="ember")(x), expected)
    messages = ember_warnings(record)
    assert len(messages) == 1, messages
    assert "aten._linalg_eigh" in messages[0]
    counters = ember.torch.counters
    assert counters["graphs"] - before.get("graphs", 0) == 2
    assert counters["fallback_graphs"] - before.get("fallback_graphs", 0) == 2
    assert counters["fallback_ops"] - before.get("fallback_ops", 0) >= 2


# -- wrong inputs at call time --------------------------------------------------------------


def test_wrong_input_dtype_is_an_ember_error() -> None:
    model = torch.nn.Linear(8, 4)
    compiled = ember.compile(model)
    x = torch.randn(2, 8)
    compiled(x)
    # Eager raises "mat1 and mat2 must have the same dtype"; Ember must say so too (when
    # capturing, or when building the graph), not crash or compute something.
    with pytest.raises(EmberError, match="dtype|could not capture Linear"):
        compiled(torch.ones(2, 8, dtype=torch.int64))
    close(compiled(x), model(x).detach())  # still works


def test_wrong_input_rank_is_an_ember_error() -> None:
    model = torch.nn.Conv2d(3, 4, 3)
    compiled = ember.compile(model)
    with pytest.raises(EmberError, match="could not capture Conv2d"):
        compiled(torch.randn(5, 5))
    x = torch.randn(1, 3, 6, 6)
    close(compiled(x), model(x).detach())  # still works


def test_wrong_argument_count_is_an_ember_error() -> None:
    compiled = ember.compile(torch.nn.ReLU())
    with pytest.raises(EmberError):
        compiled(torch.randn(3), torch.randn(3))


def test_exported_graph_checks_input_dtype_and_rank() -> None:
    x = torch.randn(2, 8)
    graph = ember.torch.export(torch.nn.Linear(8, 4), (x,))
    run = ember.compile(graph)
    assert run(x.numpy())[0].shape == (2, 4)
    with pytest.raises(ShapeError, match="expected f32"):
        run(x.numpy().astype(np.float64))
    with pytest.raises(ShapeError, match="expected shape"):
        run(x.numpy().reshape(16))


def test_tensors_of_every_layout_give_the_eager_result() -> None:
    """Contiguous CPU tensors go to compiled code by address; views that are not (a
    transpose, a negated view, one that needs grad) take the checked path. All match."""
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU()).eval()
    x = torch.randn(4, 6)
    compiled = ember.compile(model, (x,), config=Config(executor="cpu"))
    with torch.no_grad():
        close(compiled(x), model(x))
        close(compiled(x), model(x))  # outputs are fresh tensors: the first is not reused
        wide = torch.randn(6, 4)
        close(compiled(wide.T), model(wide.T))
        close(compiled(torch._neg_view(x)), model(-x))
        close(compiled(x[:, :].requires_grad_(False)), model(x))
    first, second = compiled(x), compiled(x)
    assert first.data_ptr() != second.data_ptr()


def test_calls_that_alternate_between_shapes_run_their_own_code() -> None:
    """A call tries the code of the latest call first and falls back to the cache of
    specializations when the tensors do not fit it."""
    model = torch.nn.Linear(8, 4).eval()
    compiled = ember.compile(model, config=Config(executor="cpu"), strict=True)
    with torch.no_grad():
        for batch in (2, 5, 2, 5, 5, 2):
            x = torch.randn(batch, 8)
            close(compiled(x), model(x))
        x = torch.randn(8, 2).T  # the shape of the latest code, but not contiguous
        close(compiled(x), model(x))
    assert compiled.compilations == 2


def test_bf16_and_large_outputs_of_the_plain_call() -> None:
    """Small outputs are new tensors of the output's dtype (bf16 included); large ones
    come from the output pool, which takes their memory back once they are dropped."""
    from ember.runtime.pool import OUTPUTS

    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    model = model.to(torch.bfloat16)
    compiled = ember.compile(model, (x,), config=Config(executor="cpu"), strict=True)
    with torch.no_grad():
        out = compiled(x)
        assert out.dtype == torch.bfloat16 and out.shape == (4, 16)
        torch.testing.assert_close(out, model(x), rtol=2e-2, atol=2e-2)

    big = torch.randn(256, 256)  # 256 KiB: above the pool's smallest block
    compiled = ember.compile(torch.nn.ReLU(), (big,), config=Config(executor="cpu"),
                             strict=True)
    first = compiled(big)
    close(first, torch.relu(big))
    address = first.data_ptr()
    reused = OUTPUTS.reused
    del first
    second = compiled(big)
    close(second, torch.relu(big))
    assert OUTPUTS.reused == reused + 1 and second.data_ptr() == address


def test_capture_traces_once_and_decomposes_only_what_has_no_converter(monkeypatch) -> None:
    """torch.export traces to ATen once; the core decompositions (a second trace) run only
    for a graph that holds an op with no converter (PReLU's `_prelu_kernel`), and either
    way the result is eager's."""
    from ember.frontends.torch import export

    decomposed = []
    original = torch.export.ExportedProgram.run_decompositions
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions",
                        lambda self, *a, **k: decomposed.append(1) or original(self, *a, **k))
    x = torch.randn(2, 3, 8)
    for module, traces in [(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()), 0),
                           (torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.PReLU(3)), 1)]:
        decomposed.clear()
        program, _ = export.capture_program(module.eval(), (x,))
        assert len(decomposed) == traces
        ops = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
        assert "aten.linear.default" not in ops  # ATen, not the training IR
        with torch.no_grad():
            close(ember.compile(module, strict=True)(x), module(x))
