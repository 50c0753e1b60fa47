"""ember.compile of a model that torch.export cannot capture (a transformers decoder with
its default use_cache=True returns a DynamicCache): one warning, then Dynamo captures it
with the ember backend, and the outputs are the model's own."""

from __future__ import annotations

import pytest
import torch

import ember


def test_a_decoder_with_a_cache_compiles_through_dynamo() -> None:
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    model = GPT2Model(GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=1000)).eval()
    ids = torch.randint(0, 1000, (1, 8))
    with pytest.warns(UserWarning, match="through torch.compile"):
        compiled = ember.compile(model, (ids,))
    for length in (8, 11):
        ids = torch.randint(0, 1000, (1, length))
        got = compiled(ids)
        with torch.no_grad():
            want = model(ids)
        assert type(got) is type(want) and got.past_key_values is not None
        torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, atol=1e-4,
                                   rtol=1e-4)
