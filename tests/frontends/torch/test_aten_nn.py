"""Linear algebra and neural-net converters (aten_nn.py) against eager PyTorch (the
helpers and the three ways in are those of test_aten_tensor.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.frontends.torch.test_aten_tensor import assert_same, check, check_aten, check_module

aten = torch.ops.aten


class Each(nn.Module):
    """Layer i applied to input i (or every layer to a single input)."""

    def __init__(self, *layers):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, *xs):
        xs = xs * len(self.layers) if len(xs) == 1 else xs
        return [layer(x) for layer, x in zip(self.layers, xs)]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_layers_through_export():
    """The layers of the brief, one torch.export capture for all."""
    convs = [(nn.Conv1d(4, 6, 3, stride=2, padding=1, dilation=2), (2, 4, 11)),
             (nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 0), groups=2), (1, 4, 7, 6)),
             (nn.Conv2d(3, 4, 3, padding="same", bias=False), (1, 3, 6, 6)),
             (nn.Conv3d(2, 4, 2, stride=(1, 2, 1), dilation=(2, 1, 1)), (1, 2, 5, 5, 4)),
             (nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
              (1, 4, 5, 4)),
             (nn.ConvTranspose1d(3, 2, 4, stride=3, dilation=2, bias=False), (2, 3, 5))]
    image = torch.randn(2, 4, 9, 10)
    bn = nn.BatchNorm2d(4)
    bn.running_mean.normal_()
    bn.running_var.uniform_(0.5, 2)
    layers = [(nn.Linear(8, 3), torch.randn(2, 5, 8)), (nn.Linear(8, 3, bias=False),
                                                        torch.randn(8)),
              *((conv, torch.randn(shape)) for conv, shape in convs),
              (nn.MaxPool2d(3, 2, 1, ceil_mode=True), image),
              (nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False), image),
              (nn.AdaptiveAvgPool2d((3, 5)), image), (nn.LayerNorm(10), image),
              (nn.GroupNorm(2, 4), image), (bn, image), (nn.Embedding(10, 4),
                                                        torch.tensor([[1, 0], [3, 9]])),
              (nn.Upsample(scale_factor=2), image), (nn.Upsample(size=(5, 7)), image),
              (nn.Upsample(scale_factor=2, mode="bilinear"), image),
              (nn.Upsample(size=(4, 13), mode="bilinear", align_corners=True), image)]
    check_module(Each(*(layer for layer, _ in layers)), *(x for _, x in layers))


def test_products():
    a, b, c = torch.randn(3, 4, 5), torch.randn(3, 5, 2), torch.randn(3, 4, 2)
    check(lambda a, b, c: (a @ b, a[0] @ b[0], torch.baddbmm(c, a, b, beta=0.5, alpha=2),
                           torch.addmm(c[0, 0], a[0], b[0], alpha=0.5), a[0] @ b[0, :, 0],
                           torch.einsum("bij,bjk->bik", a, b), a[None] @ b, F.linear(a, b[0].T)),
          a, b, c)
    check_aten(lambda a, b, c: (aten.addmv(c[0, :, 0], a[0], b[0, :, 0], beta=0),
                                aten.dot(a[0, 0], a[1, 0])[None], aten.mv(a[0], b[0, :, 0])),
               a, b, c)


def test_pools():
    x = torch.randn(2, 3, 9, 10)
    check(lambda x: (F.max_pool2d(x, 3, 2, 1, ceil_mode=True),
                     F.max_pool2d(x, (2, 3), dilation=(1, 2)),
                     F.avg_pool2d(x, 3, 2, 1), F.avg_pool2d(x, 2, divisor_override=3),
                     F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
                     F.max_pool1d(x[0], 3), F.avg_pool1d(x[0], 4, 3, 2), F.max_pool3d(x, 2, 1),
                     F.avg_pool3d(x, (1, 3, 2), ceil_mode=True), F.max_pool2d(x[0], 2)), x)
    check(lambda x: (F.adaptive_avg_pool2d(x, (3, 5)), F.adaptive_avg_pool2d(x, (4, 3)),
                     F.adaptive_avg_pool1d(x[0], 4), F.adaptive_max_pool2d(x, (3, 4)),
                     F.adaptive_max_pool2d(x, (4, 3)), F.adaptive_avg_pool3d(x, (3, 1, 2))), x)


def test_normalizations():
    x = torch.randn(2, 4, 5, 6)
    norms = Each(nn.LayerNorm(6), nn.LayerNorm((5, 6), elementwise_affine=False),
                 nn.LayerNorm(6, bias=False), nn.GroupNorm(2, 4),
                 nn.GroupNorm(4, 4, affine=False), nn.BatchNorm2d(4),
                 nn.InstanceNorm2d(4, affine=True), nn.BatchNorm2d(4, affine=False)).eval()
    for p in norms.parameters():
        nn.init.normal_(p)
    for bn in (norms.layers[5], norms.layers[7]):
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2)
    check(norms, x)
    w, b = torch.randn(6), torch.randn(6)
    check_aten(lambda x, w, b: (aten.native_layer_norm(x, [5, 6], None, None, 1e-5),
                                aten.native_layer_norm(x, [6], w, b, 1e-3),
                                aten.native_group_norm(x, w[:4], None, 2, 4, 30, 2, 1e-5),
                                aten._native_batch_norm_legit.no_stats(x, w[:4], b[:4], True,
                                                                       0.1, 1e-5)),
               x, w, b, tol=1e-4)


def test_weight_norm():
    """The fused weight norm (a parametrized conv's weight, as wav2vec2's position
    convolution has it), over the first and the last axis."""
    v, g0, g2 = torch.randn(6, 4, 3), torch.rand(6, 1, 1) + 0.5, torch.rand(1, 1, 3) + 0.5
    check_aten(lambda v, g0, g2: (*aten._weight_norm_interface(v, g0, 0),
                                  *aten._weight_norm_interface(v, g2, 2)), v, g0, g2)
    conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 6, 3), dim=2)
    check_module(conv, torch.randn(2, 4, 10))


def test_upsample():
    x = torch.randn(1, 2, 3, 4, 5)
    check_aten(lambda x: (aten.upsample_nearest1d.vec(x[0, 0], None, [2.0]),
                          aten.upsample_nearest2d.vec(x[0], None, [1.5, 3.0]),
                          aten.upsample_nearest3d.vec(x, [4, 6, 7], None),
                          aten._upsample_nearest_exact2d.vec(x[0], [5, 3], None),
                          aten.upsample_linear1d.vec(x[0, 0], [9], True, None),
                          aten.upsample_bilinear2d.vec(x[0], [6, 9], False, None),
                          aten.upsample_bilinear2d.default(x[0], [6, 9], False, 2.0),
                          aten.upsample_trilinear3d.vec(x, None, False, [2.0, 1.5, 0.5]),
                          aten.upsample_bicubic2d.vec(x[0], [7, 9], False, None),
                          aten.upsample_bicubic2d.vec(x[0], [5, 5], True, None)), x, tol=1e-4)


def test_attention_and_shuffle():
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)
    flash = aten._scaled_dot_product_flash_attention_for_cpu
    check_aten(lambda q, k, v, m: (flash(q, k, v)[0], flash(q, k, v, is_causal=True)[0],
                                   flash(q, k, v, attn_mask=m, scale=0.3)[0]),
               q, k, v, torch.randn(4, 6))
    x = torch.randn(2, 8, 3, 4)
    check_aten(lambda x: (aten.pixel_shuffle(x, 2), aten.pixel_unshuffle(x[:, :, :2], 2)), x)


def test_torch_compile_backend():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Conv2d(8, 4, 3, groups=4), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.LayerNorm(4), nn.Linear(4, 2)).eval()
    compiled = torch.compile(model, backend="ember", fullgraph=True, dynamic=False,
                             options={"strict": True})
    x = torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        assert_same(compiled(x), model(x))
