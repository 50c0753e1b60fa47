"""Language-model decoding through both doors: greedy `generate` of transformers decoders
(built from configs, random weights) gives eager's tokens and logits, with the static
cache (preallocated, written in place at each step) and with the default dynamic one.
And the parameters the torch.compile door freezes into constants follow in-place
updates of the weights."""

from __future__ import annotations

import warnings

import pytest
import torch

import ember
from ember.api.torch_dynamo import counters

transformers = pytest.importorskip("transformers")


def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512,
                                     initializer_range=0.2)
    return transformers.GPT2LMHeadModel(config).eval()


def llama():
    """A Llama-family model with grouped-query attention (4 query heads, 2 key/value
    heads) and rotary embeddings."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=512, initializer_range=0.2)
    return transformers.LlamaForCausalLM(config).eval()


def greedy(generate, ids, **options):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' notes on the random config
        return generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                        output_logits=True, return_dict_in_generate=True, **options)


def assert_same_generation(got, want) -> None:
    assert got.sequences.tolist() == want.sequences.tolist()
    for step, (a, b) in enumerate(zip(got.logits, want.logits)):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4, msg=f"step {step}")


@pytest.mark.parametrize("make", [gpt2, llama])
@pytest.mark.parametrize("door", ["ember.compile", "torch.compile"])
def test_greedy_generate_with_a_static_cache_matches_eager(make, door) -> None:
    model = make()
    ids = torch.randint(0, 512, (1, 9), generator=torch.Generator().manual_seed(1))
    want = greedy(model.generate, ids, cache_implementation="static")
    assert len(set(want.sequences[0, 9:].tolist())) > 1  # the check sees varied tokens
    before = counters["graphs"]
    if door == "ember.compile":  # (compiled code: the cache is written in place)
        generate = ember.compile(model, config=ember.Config(executor="cpu")).generate
    else:
        model.forward = torch.compile(model.forward, backend="ember",
                                      options={"executor": "cpu"})
        generate = model.generate
    assert_same_generation(greedy(generate, ids, cache_implementation="static"), want)
    # The prompt's step and the decode step: the static cache keeps the decode step's
    # shapes, so the later steps reuse its code.
    assert counters["graphs"] - before == 2


def test_greedy_generate_with_the_default_cache_matches_eager() -> None:
    model = llama()
    ids = torch.randint(0, 512, (1, 7), generator=torch.Generator().manual_seed(2))
    want = greedy(model.generate, ids)
    compiled = ember.compile(model)
    assert_same_generation(greedy(compiled.generate, ids), want)


def test_a_compiled_module_reads_the_modules_attributes() -> None:
    model = gpt2()
    compiled = ember.compile(model)
    assert isinstance(compiled.config, ember.Config)  # its own attributes first
    assert compiled.generation_config is model.generation_config
    assert compiled.lm_head is model.lm_head


def test_frozen_parameters_follow_in_place_updates() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 8)).eval()
    compiled = torch.compile(model, backend="ember")
    x = torch.randn(3, 16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        before = counters["refreezes"]
        model[0].weight.mul_(2)  # an in-place write: the version counter moves
        torch.testing.assert_close(compiled(x), model(x))
        model[2].weight.data = torch.randn(8, 32)  # new storage under the same Parameter
        torch.testing.assert_close(compiled(x), model(x))
        assert counters["refreezes"] - before == 2
        torch.testing.assert_close(compiled(x), model(x))  # and no more after
        assert counters["refreezes"] - before == 2
