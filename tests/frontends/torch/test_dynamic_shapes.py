"""torch.compile(backend="ember") when Dynamo hands over symbolic sizes (after a shape
change, with dynamic=True, or mark_dynamic): each call's sizes get a specialization,
compiled once and reused, at most MAX_SPECIALIZATIONS kept; never an exception."""

from __future__ import annotations

import torch

import ember.torch
from ember.api import torch_dynamo

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


def test_specializations_are_bounded(monkeypatch) -> None:
    torch._dynamo.reset()
    monkeypatch.setattr(torch_dynamo, "MAX_SPECIALIZATIONS", 2)
    model = mlp()
    compiled = torch.compile(model, backend="ember", dynamic=True)
    before = ember.torch.counters["evictions"]
    with torch.no_grad():
        for batch in (2, 3, 4, 2):
            x = torch.randn(batch, 16)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    assert ember.torch.counters["evictions"] - before == 2  # 2 went at 4, 3 at the new 2
