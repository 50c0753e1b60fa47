"""Sizes that change from call to call. torch.compile(backend="ember") when Dynamo hands
over symbolic sizes (after a shape change, with dynamic=True, or mark_dynamic): the graph
is imported once with Ember's symbolic sizes (or, where Ember cannot keep them symbolic,
traced again per size), each call's sizes get compiled code, made once and reused, at most
Config.max_specializations kept; never an exception. `ember.compile(module, dynamic=...)`:
one capture serves every size it names."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never download

import pytest  # noqa: E402
import torch  # noqa: E402

import ember  # noqa: E402
import ember.torch  # noqa: E402
from ember.driver import pipeline  # noqa: E402
from ember.frontends.torch import export  # noqa: E402
from ember.graph.bind import graph_symbols  # noqa: E402

torch.manual_seed(0)


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 4)).eval()


class Shapes(torch.nn.Module):
    """Outputs that depend on the sizes: a reshape by x.shape[0] and a scale by it."""

    def forward(self, x, y):
        z = x.reshape(x.shape[0], -1) @ y
        return torch.softmax(z, dim=-1) * x.shape[0], z.sum(0)


def test_a_new_batch_size_is_a_specialization_not_an_error() -> None:
    torch._dynamo.reset()
    model = mlp()
    compiled = torch.compile(model, backend="ember")
    before = dict(ember.torch.counters)
    with torch.no_grad():
        for batch in (1, 3, 5, 3, 5):
            x = torch.randn(batch, 16)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    after = ember.torch.counters
    assert after["dynamic_graphs"] - before.get("dynamic_graphs", 0) == 1
    # 3 and 5 compiled once each, then reused (batch 1 was the static first graph)
    assert after["specializations"] - before.get("specializations", 0) == 2


def test_dynamic_true_with_size_dependent_outputs() -> None:
    torch._dynamo.reset()
    model = Shapes()
    compiled = torch.compile(model, backend="ember", dynamic=True)
    for batch in (2, 3, 6):
        x, y = torch.randn(batch, 4, 5), torch.randn(20, 7)
        for got, want in zip(compiled(x, y), model(x, y)):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_mark_dynamic() -> None:
    torch._dynamo.reset()
    model = torch.nn.Linear(16, 3)
    compiled = torch.compile(model, backend="ember")
    x = torch.randn(5, 16)
    torch._dynamo.mark_dynamic(x, 0)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
        y = torch.randn(9, 16)
        torch.testing.assert_close(compiled(y), model(y), atol=1e-5, rtol=1e-5)


def test_specializations_are_bounded() -> None:
    torch._dynamo.reset()
    model = mlp()
    compiled = torch.compile(model, backend="ember", dynamic=True,
                             options={"max_specializations": 2})
    before = ember.torch.counters["evictions"]
    with torch.no_grad():
        for batch in (2, 3, 4, 2):
            x = torch.randn(batch, 16)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    assert ember.torch.counters["evictions"] - before == 2  # 2 went at 4, 3 at the new 2


def test_a_symbolic_graph_is_imported_once_with_its_sizes() -> None:
    """Dynamo's symbolic graph becomes one Ember graph with symbolic sizes, compiled once
    for every size (no new trace, no new compile); the sizes it returns and scales by come
    from each call's binding."""
    torch._dynamo.reset()
    model = Shapes()
    compiled = torch.compile(model, backend="ember", dynamic=True, options={"executor": "cpu"})
    before = dict(ember.torch.counters)
    for batch in (2, 3, 6, 3):
        x, y = torch.randn(batch, 4, 5), torch.randn(20, 7)
        for got, want in zip(compiled(x, y), model(x, y)):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    counts = {k: v - before.get(k, 0) for k, v in ember.torch.counters.items()}
    assert counts["symbolic_graphs"] == counts["dynamic_graphs"] == counts["every_size"] == 1
    assert counts.get("specializations", 0) == 0


def small_cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 5)).eval()


def small_bert() -> torch.nn.Module:
    import transformers

    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=128)
    return transformers.BertModel(config).eval()


BATCHES = (1, 2, 3, 5, 8, 17, 64)
SEQUENCES = (7, 64, 128, 300)
SWEEPS = {  # what CI runs; the slow sweep runs every batch (and sequence, for BERT)
    "mlp": ((1, 2, 3, 17), BATCHES),
    "cnn": ((1, 2, 5), BATCHES),
    "bert": (((1, 7), (2, 7), (1, 64), (3, 64)),
             tuple((b, s) for b in (1, 2, 3, 5) for s in SEQUENCES)),
}


def _sweep_inputs(name: str, size) -> tuple:
    if name == "mlp":
        return (torch.randn(size, 16),)
    if name == "cnn":
        return (torch.randn(size, 3, 16, 16),)
    batch, sequence = size
    return (torch.randint(0, 1000, (batch, sequence)),)


def _run_sweep(name: str, sizes, dynamic) -> dict:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = {"mlp": mlp, "cnn": small_cnn, "bert": small_bert}[name]()
    compiled = torch.compile(model, backend="ember", dynamic=dynamic,
                             options={"executor": "cpu"})  # (compiled code: the acceptance)
    before = dict(ember.torch.counters)
    made = pipeline.stats.builds + pipeline.stats.disk_hits
    with torch.no_grad():
        for size in sizes:
            inputs = _sweep_inputs(name, size)
            got, want = compiled(*inputs), model(*inputs)
            if name == "bert":
                got, want = got.last_hidden_state, want.last_hidden_state
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    counts = {k: v - before.get(k, 0) for k, v in ember.torch.counters.items()}
    # native code made (built, or loaded from disk; not reused from memory)
    counts["compiles"] = pipeline.stats.builds + pipeline.stats.disk_hits - made
    return counts


def _dynamo_graphs(name: str, sizes) -> int:
    """How many graphs Dynamo itself makes of the sweep with dynamic=True (PyTorch's own
    guards: its fake convolution picks a memory format by batch, `2 <= ?b <= 15`)."""
    torch._dynamo.reset()
    graphs = []
    model = {"mlp": mlp, "cnn": small_cnn, "bert": small_bert}[name]()
    counted = torch.compile(model, dynamic=True,
                            backend=lambda gm, _: graphs.append(gm) or gm.forward)
    with torch.no_grad():
        for size in sizes:
            counted(*_sweep_inputs(name, size))
    return len(graphs)


def _check_counts(counts: dict, dynamic, name: str = "", sizes=()) -> None:
    if dynamic:  # Dynamo's: a size of 1 may get a graph of its own; Ember adds none
        assert counts["graphs"] <= 2 or counts["graphs"] == _dynamo_graphs(name, sizes)
        # ... and compiles at most two, for the whole sweep: graphs that differ in a bound
        # only (Dynamo's `2 <= ?b <= 15` for a CNN's batch) share their code
        assert counts["compiles"] <= 2
    assert counts.get("evictions", 0) == 0 or counts["specializations"] > 8
    if dynamic:  # code of every size: no compile per size
        assert counts["every_size"] == counts["symbolic_graphs"] >= 1
        # (a size of 1's graph of its own may be traced at its one size)
        assert counts.get("specializations", 0) <= counts["graphs"] - counts["every_size"]
    if dynamic and name == "cnn":  # height and width fixed (the pools need them), once
        assert counts["partial_specializations"] == counts["every_size"]


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("name", sorted(SWEEPS))
def test_size_sweeps_match_eager_with_few_compiles(name, dynamic) -> None:
    """Every call of the sweep matches eager, none raises, and with dynamic=True Dynamo
    hands over at most two graphs for it (issue 22's acceptance, CI's subset)."""
    _check_counts(_run_sweep(name, SWEEPS[name][0], dynamic), dynamic, name, SWEEPS[name][0])


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("name", sorted(SWEEPS))
def test_full_size_sweeps(name, dynamic) -> None:
    _check_counts(_run_sweep(name, SWEEPS[name][1], dynamic), dynamic, name, SWEEPS[name][1])


def test_sizes_an_op_needs_as_numbers_are_fixed_and_the_rest_stay_symbolic() -> None:
    """Dynamo makes a CNN's height and width symbolic too; its max-pool needs them as
    numbers (a window over ?h is valid only for ?h >= 2), so they are fixed per value and
    the batch stays symbolic: one compile per image size, whatever the batch."""
    torch._dynamo.reset()
    model = small_cnn()
    compiled = torch.compile(model, backend="ember", dynamic=True,
                             options={"executor": "cpu"})
    before = dict(ember.torch.counters)
    with torch.no_grad():
        # (not square at first: Dynamo gives equal sizes one symbol)
        for shape in ((2, 3, 16, 20), (5, 3, 16, 20), (3, 3, 20, 20), (4, 3, 24, 12),
                      (7, 3, 16, 20)):
            x = torch.randn(*shape)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)
    counts = {k: v - before.get(k, 0) for k, v in ember.torch.counters.items()}
    assert counts["graphs"] == 1 and counts["partial_specializations"] == 3
    assert counts["every_size"] == 3 and counts.get("specializations", 0) == 0


# -- ember.compile(module, dynamic=...) ----------------------------------------------------
def test_one_capture_serves_every_batch(monkeypatch) -> None:
    captures = []
    capture = export.capture_program
    monkeypatch.setattr(export, "capture_program",
                        lambda *a, **k: captures.append(1) or capture(*a, **k))
    model = mlp()
    compiled = ember.compile(model, (torch.randn(4, 16),), dynamic={"input": {0: "batch"}})
    with torch.no_grad():
        for batch in (4, 1, 2, 9, 64, 2):
            x = torch.randn(batch, 16)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    assert len(captures) == 1 and compiled.compilations == 1


@pytest.mark.parametrize("batch", ["batch", torch.export.Dim("batch", max=64)])
def test_sizes_take_the_names_dynamic_gives(batch) -> None:
    model = mlp()
    compiled = ember.compile(model, (torch.randn(4, 16),), dynamic={"input": {0: batch}},
                             config=ember.Config(executor="cpu"))
    with torch.no_grad():
        x = torch.randn(3, 16)
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    graph = next(iter(compiled.cache.values())).graph_runner.graph
    assert graph_symbols(graph) == {"batch"}  # (not PyTorch's ?s31)
    if not isinstance(batch, str):
        assert graph.size_bounds == {"batch": 64}


def test_dynamic_true_keeps_what_the_model_lets_vary() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.LayerNorm(8),
                                torch.nn.GELU()).eval()
    compiled = ember.compile(model, dynamic=True)
    with torch.no_grad():
        for shape in ((2, 9, 16), (1, 5, 16), (3, 16, 16)):
            x = torch.randn(*shape)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    assert compiled.compilations == 1


def test_dynamic_true_fixes_what_a_pool_needs_and_keeps_the_batch() -> None:
    """torch.export makes the height and width symbolic too; the pool needs them as
    numbers, so they are fixed at the capture's and the batch stays symbolic: one capture
    per image size (the first call of batch 1 included)."""
    model = small_cnn()
    compiled = ember.compile(model, dynamic=True, config=ember.Config(executor="cpu"))
    with torch.no_grad():
        for shape in ((1, 3, 16, 20), (2, 3, 16, 20), (5, 3, 16, 20), (3, 3, 20, 20),
                      (4, 3, 20, 20)):
            x = torch.randn(*shape)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)
    assert compiled.compilations == 2


def test_a_bounded_sequence_is_symbolic() -> None:
    """BERT slices its 512 position ids by the sequence length: PyTorch's bound on it
    (`?s <= 512`) comes with the capture, so one capture serves every length, and a
    longer one is refused as the model refuses it."""
    model = small_bert()
    compiled = ember.compile(model, dynamic=True)
    with torch.no_grad():
        for batch, sequence in ((2, 9), (1, 5), (3, 16), (1, 64)):
            ids = torch.randint(0, 1000, (batch, sequence))
            torch.testing.assert_close(compiled(ids).last_hidden_state,
                                       model(ids).last_hidden_state, atol=1e-4, rtol=1e-4)
        assert compiled.compilations == 1
        with pytest.raises(ember.EmberError):
            compiled(torch.randint(0, 1000, (1, 513)))


class TopK(torch.nn.Module):
    def forward(self, x):
        return x.topk(x.shape[0], dim=1).values  # torch.export keeps no size of x dynamic


def test_sizes_that_cannot_stay_symbolic_are_specialized_with_a_warning() -> None:
    model = TopK()
    compiled = ember.compile(model, dynamic={"x": {0: "batch"}})
    with pytest.warns(UserWarning, match="compiled per input shape"):
        for batch in (3, 4, 3):
            x = torch.randn(batch, 8)
            torch.testing.assert_close(compiled(x), model(x))
    assert compiled.compilations == 2


def test_a_size_the_capture_kept_static_is_checked() -> None:
    """A dim not named dynamic must match the capture: a new capture for a new value
    (the module takes it), an EmberError naming the failure when the module cannot."""
    model = mlp()
    compiled = ember.compile(model, (torch.randn(4, 16),), dynamic={"input": {0: "batch"}})
    with pytest.raises(ember.EmberError, match="could not capture"):
        compiled(torch.randn(4, 15))


def test_dynamic_is_for_modules() -> None:
    g = ember.Builder("g")
    g.output(g.neg(g.input("x", "f32", (2,))))
    with pytest.raises(ember.EmberError, match="dynamic= applies to a torch.nn.Module"):
        ember.compile(g.build(), dynamic=True)


class Keyword(torch.nn.Module):
    def forward(self, x, *, y):
        return x * 2 + y


def test_dynamic_true_with_keyword_inputs_is_one_capture() -> None:
    """torch.export reads dynamic_shapes for keywords by the forward's parameter names."""
    model = Keyword()
    compiled = ember.compile(model, dynamic=True)
    for rows in (3, 5):
        x, y = torch.randn(rows, 4), torch.randn(rows, 4)
        torch.testing.assert_close(compiled(x, y=y), model(x, y=y))
    assert compiled.compilations == 1


def test_a_first_call_of_size_one_captures_for_every_size() -> None:
    """torch.export takes a dynamic dim of size 1 to be 1 always: the capture sees two
    copies of the example instead, so that a batch of one first still serves every batch
    from one capture and one compile."""
    model = mlp()
    compiled = ember.compile(model, (torch.randn(1, 16),), dynamic={"input": {0: "batch"}},
                             config=ember.Config(executor="cpu", disk_cache=False))
    with torch.no_grad():
        for batch in (1, 7, 1, 3):
            x = torch.randn(batch, 16)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    assert compiled.compilations == 1
    runner = next(iter(compiled.cache.values())).graph_runner
    assert runner.sizes.generic is not None and runner.sizes.compilations == 1
