"""Shape and indexing converters (aten_tensor.py) against eager PyTorch.

Three ways in: `check_module` compiles with `ember.compile(strict=True)` (torch.export,
then its core ATen decompositions); `check` traces with torch.compile's decomposition
table (what the `ember` backend receives, without Dynamo's cost); `check_aten` traces
the ATen calls as written, for ops that both decompositions rewrite away.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

import ember
from ember.api.torch_runner import GraphRunner
from ember.errors import UnsupportedOpError
from ember.frontends.torch.fx_importer import import_fx

aten = torch.ops.aten


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def assert_same(got, want, tol=1e-5):
    got, want = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g.dtype, g.shape) == (w.dtype, w.shape)
        if w.dtype.is_floating_point:
            torch.testing.assert_close(g, w, rtol=tol, atol=tol)
        else:
            assert torch.equal(g, w)


def check_module(fn, *inputs, tol=1e-5):
    """`fn` (a module or a function) compiled by ember.compile matches eager."""
    module = (fn if isinstance(fn, torch.nn.Module) else Fn(fn)).eval()
    with torch.no_grad():
        want = module(*inputs)
    assert_same(ember.compile(module, strict=True)(*inputs), want, tol)


@functools.cache
def _core_aten():
    return core_aten_decompositions()


def check(fn, *inputs, tol=1e-5, decompose=True):
    """`fn` traced to core ATen ops (or as called), imported and run, matches eager."""
    table = _core_aten() if decompose else None
    with torch.no_grad():
        gm = make_fx(fn, decomposition_table=table, tracing_mode="fake",
                     _allow_non_fake_inputs=True)(*inputs)  # weights become constants
        gm.graph.eliminate_dead_code()  # as export and AOT Autograd leave their graphs
        want = fn(*inputs)
    assert_same(GraphRunner(import_fx(gm))(*inputs), want, tol)


check_aten = functools.partial(check, decompose=False)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


X = torch.randn(2, 6, 8)


def test_views():
    check_module(lambda x: (x.view(3, -1), x.reshape(-1), x[..., None], x[:, None, :, None],
                            x[:, :1].squeeze(1), x[:, :1].squeeze(), x.permute(2, 0, 1),
                            x.transpose(0, -1), x[0].t(), x[:, :1].expand(-1, 5, -1),
                            x[0, 0].expand(3, 2, 8), x.flatten(1)), X)


def test_slices():
    check(lambda x: (x[:, 1:5:2], x[..., -3:100], x[:, -1], x[1:0], x[:, ::3, 5:],
                     x.narrow(2, 1, 3), x[-1, 2], x[:, -100:2]), X)


def test_cat_stack_split():
    def fn(x):
        return (torch.cat([x, x[:, :0], x[:, :2]], 1), torch.cat([x, x[0, 0, :0]], 0),
                torch.stack([x, x], 1), torch.stack([x[0], x[1]], -1),
                *torch.split(x, 3, 2), *torch.split(x, [1, 5], 1), *torch.chunk(x, 4, 1),
                *torch.unbind(x, 2)[:2])

    check(fn, X)
    check_aten(lambda x: (aten.unbind(x, 1), aten.split(x, 5, -1)), X)


def test_advanced_indexing():
    a = torch.tensor([[1], [0]])
    b = torch.tensor([1, -2, 3])

    def fn(x, a, b):
        return (x[a], x[:, b], x[a, b], x[:, a, None], x[a, :, b], x[..., b], x[:, b, a],
                x[1, b], torch.index_select(x, 2, b % 8), torch.index_select(x, 0, a[0, 0]))

    check_module(fn, X, a, b)
    check(fn, X, a, b)


def test_gather():
    index = torch.randint(0, 6, (2, 3, 8))
    check(lambda x, i: (torch.gather(x, 1, i), torch.gather(x, 2, i[:, :, :4])), X, index)


def test_scatter():
    index = torch.tensor([[[0, 1, 2, 0, 4, 5, 1, 2]], [[5, 5, 5, 0, 0, 1, 1, 1]]])
    src = torch.randn(2, 3, 8)

    def fn(x, i, s):
        return (x.scatter(1, i, s), x.scatter(1, i, 2.5), x.scatter_add(1, i, s),
                x.scatter_reduce(1, i, s, "amax"),
                x.scatter_reduce(1, i, s, "amin", include_self=False),
                x.scatter_reduce(1, i, s, "sum", include_self=False),
                x.scatter_reduce(1, i, s, "prod"),
                x.scatter_reduce(1, i, s, "mean"),
                x.scatter_reduce(1, i, s, "mean", include_self=False))

    check(fn, X, index, src)


def test_index_put():
    rows = torch.tensor([1, 0, 1])
    cols = torch.tensor([[2], [7]])
    mask = torch.tensor([True, False, True, False, False, True])

    def fn(x, r, c, m, v):
        return (aten.index_put(x, [r], v[0, :1], accumulate=True),
                aten.index_put(x, [None, r, c], v[:2, :1, :1]),
                aten.index_put(x, [r, None, c], v[0, 0, 0], accumulate=True),
                aten.index_put(x, [None, m], v[0, 0, 0]),
                aten.index_put(x, [None, m], v[:, :1], accumulate=True))

    values = torch.randn(2, 6, 8)
    check_aten(fn, X, rows, cols, mask, values)
    check_module(lambda x, r, v: x.index_put((r,), v[0, :1], accumulate=True), X, rows, values)


def test_mask_put_of_per_element_values_is_unsupported():
    gm = make_fx(lambda x, m, v: aten.index_put(x, (m,), v), tracing_mode="fake")(
        torch.randn(4, 3), torch.tensor([True, False, True, False]), torch.randn(2, 3))
    with pytest.raises(UnsupportedOpError, match="data-dependent"):
        import_fx(gm)


def test_pads():
    check(lambda x: (F.pad(x, (1, 2, 3, 0), value=1.5), F.pad(x, (-1, 2)),
                     F.pad(x, (0, 0, 0, 0, 1, 1))), X)
    x4 = torch.randn(1, 2, 5, 6)
    check_aten(lambda x: (aten.reflection_pad2d(x, [1, 2, 3, 0]),
                          aten.replication_pad2d(x, [2, 0, 1, 4]),
                          aten.reflection_pad1d(x[0], [2, 3]),
                          aten.replication_pad3d(x, [1, 1, 0, 2, 1, 0])), x4)


def test_flip_roll_repeat_tril():
    check(lambda x: (torch.flip(x, (0, 2)), x.repeat(2, 1, 1, 3), x.repeat(1, 2, 1)), X)
    check_aten(lambda x: (aten.roll(x, [1, -2], [1, 2]), aten.roll(x, [3]),
                          aten.roll(x, [13], [2]), aten.tril(x), aten.tril(x, 2),
                          aten.triu(x, -1), aten.flip(x, [-1])), X)


def test_topk_sort():
    ties = torch.tensor([[3.0, 1.0, 3.0, 2.0, 1.0, 3.0], [0.0, -1.0, 5.0, 5.0, 0.0, 2.0]])
    check(lambda x: (torch.topk(x, 3, dim=1), torch.topk(x, 2, dim=0, largest=False),
                     torch.sort(x, dim=1, descending=True), torch.sort(x, stable=True),
                     torch.argsort(x, dim=-1, stable=True)), X)
    check_aten(lambda x: (aten.sort.stable(x, stable=True, descending=True),
                          aten.sort.stable(x, stable=True)), ties)


def test_slice_writes_diagonal_unfold():
    x, src = torch.randn(4, 6), torch.randn(4, 2)
    check_aten(lambda x, s: (aten.slice_scatter(x, s, 1, 1, 5, 2),
                             aten.slice_scatter(x, s, 1, -2),
                             aten.select_scatter(x, s[:, 0], 1, -1),
                             aten.diagonal(x), aten.diagonal(x, -1),
                             aten.diagonal(x.view(2, 2, 6), 1, 2, 0),
                             aten.unfold(x, 1, 3, 2)), x, src)


def test_arange():
    check(lambda x: (x + torch.arange(8), torch.arange(1, 7, 2) + 0.5,
                     x[0, 0] * torch.arange(0.5, 4.5, 0.5), x.view(torch.int32) + 1), X)


def test_torch_compile_backend():
    def fn(x, i):
        return torch.cat([x[:, 1:5:2], x[i].flip(0)], 1).permute(0, 2, 1)[..., None], \
            torch.topk(x, 2)[0]

    compiled = torch.compile(fn, backend="ember", fullgraph=True, dynamic=False,
                             options={"strict": True})
    index = torch.tensor([1, 0])
    assert_same(compiled(X, index), fn(X, index))
