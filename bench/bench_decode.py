"""Greedy decoding: the per-token latency of `model.generate` (batch 1, a prompt of 128
tokens, 64 new ones) for GPT-2 and a Llama-family model built from their configs (random
weights), against eager PyTorch, torch.compile (Inductor), and the floor: the weight bytes
a token reads over the copy bandwidth measured in the same run.

Ways, each in a process of its own (same seed, same weights), tokens checked against
eager's:
- eager: the model's default (a DynamicCache that grows a step at a time);
- eager-static: eager with `cache_implementation="static"` (the cache preallocated);
- ember: `ember.compile(model).generate(...)` with the static cache;
- ember-dynamo: `model.forward = torch.compile(model.forward, backend="ember")`, static;
- inductor: `torch.compile(model.forward)` (Inductor), static (with --inductor: its compile
  takes minutes on two cores).

Per-token latency is (t(1 + N) - t(1)) / N: generate with N new tokens less generate with
one, so the prompt's forward drops out. A VM's memory bandwidth drifts (by 2x within
minutes, here), so each way measures the copy bandwidth between its timed runs and is
compared with the floor at that bandwidth. ONNX Runtime has no generate loop of its own
(onnxruntime-genai is another package and exports its own models), so it is not a peer
here.

    python bench/bench_decode.py [--models gpt2,llama] [--threads 2] [--new 64] [--inductor]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # built from its config: never download

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPT = 128


def make_model(name: str):
    import torch
    import transformers

    torch.manual_seed(0)
    if name == "gpt2":  # GPT-2 small (124M)
        config = transformers.GPT2Config()
        model = transformers.GPT2LMHeadModel(config)
    elif name == "llama":  # Llama architecture, grouped-query attention (~110M)
        config = transformers.LlamaConfig(
            hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
            num_attention_heads=12, num_key_value_heads=4, vocab_size=32000,
            max_position_embeddings=2048)
        model = transformers.LlamaForCausalLM(config)
    else:
        raise SystemExit(f"unknown model {name!r}: gpt2 or llama")
    return model.eval()


def weight_bytes(model) -> int:
    """Bytes of the weights a decode step reads: every parameter once (tied ones once)."""
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes()
                for p in model.parameters()}
    return sum(storages.values())


def generator(way: str, model):
    """generate(ids, **options) for `way`, and the options it decodes with."""
    import torch

    import ember

    static = {"cache_implementation": "static"}
    if way == "eager":
        return model.generate, {}
    if way == "eager-static":
        return model.generate, static
    if way == "ember":
        compiled = ember.compile(model, config=ember.Config(disk_cache=False))
        return compiled.generate, static
    if way == "ember-dynamo":
        model.forward = torch.compile(model.forward, backend="ember")
        return model.generate, static
    if way == "inductor":
        model.forward = torch.compile(model.forward)
        return model.generate, static
    raise SystemExit(f"unknown way {way!r}")


def run_way(model_name: str, way: str, new: int, repeat: int) -> dict:
    """In this process: the tokens, the first call's seconds, and per-token latency."""
    import torch

    model = make_model(model_name)
    generate, options = generator(way, model)
    ids = torch.randint(0, model.config.vocab_size, (1, PROMPT),
                        generator=torch.Generator().manual_seed(1))

    def timed(count: int) -> tuple[float, torch.Tensor]:
        start = time.perf_counter()
        tokens = generate(ids, max_new_tokens=count, min_new_tokens=count, do_sample=False,
                          **options)
        return time.perf_counter() - start, tokens

    from ember.runtime.machine import copy_bandwidth, read_bandwidth
    from ember.target import Target

    target = Target.host()

    def bandwidths() -> tuple[float, float]:
        return copy_bandwidth(target), read_bandwidth(target)

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first, tokens = timed(1 + new)  # compiles the prompt's step and the decode step
        one, full, measured = [], [], [bandwidths()]
        for _ in range(repeat):  # the bandwidth drifts on a VM: measured between runs
            one.append(timed(1)[0])
            full.append(timed(1 + new)[0])
            measured.append(bandwidths())
    per_token = (statistics.median(full) - statistics.median(one)) / new
    return {"tokens": tokens[0, PROMPT:].tolist(), "first_s": first,
            "per_token_ms": per_token * 1e3, "prompt_ms": statistics.median(one) * 1e3,
            "copy_gbs": statistics.median(c for c, _ in measured),
            "read_gbs": statistics.median(r for _, r in measured)}


def in_child(model_name: str, way: str, args) -> dict | None:
    env = dict(os.environ, EMBER_NUM_THREADS=str(args.threads),
               OMP_NUM_THREADS=str(args.threads))
    command = [sys.executable, __file__, "--child", f"{model_name}:{way}", "--new",
               str(args.new), "--repeat", str(args.repeat), "--threads", str(args.threads)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"{model_name} {way}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


DOORS = ("ember", "ember-dynamo")


def table_row(model_name: str, weights: int, results: dict) -> str:
    """One model's row of the table: each way's per-token ms and its floors."""
    def floor_ms(r: dict, key: str = "copy_gbs") -> float:
        return weights / (r[key] * 1e9) * 1e3

    def spread(values: list[float]) -> str:
        return f"{min(values):.1f}-{max(values):.1f}"

    eager = results["eager"]

    def by(way: str, base) -> str:
        r = results[way]
        return f"{r['per_token_ms'] / base(r):.2f}" if r and eager else "n/a"

    done = [r for r in results.values() if r]
    cells = [f"{r['per_token_ms']:.1f} ({r['per_token_ms'] / floor_ms(r):.2f}x)" if r
             else "failed" for r in results.values()]
    ratios = [" / ".join(by(w, base) for w in DOORS) for base in (
        lambda _: eager["per_token_ms"], floor_ms, lambda r: floor_ms(r, "read_gbs"))]
    match = all(r is not None and r["tokens"] == eager["tokens"] for r in results.values())
    first = results["ember"]["first_s"] if results["ember"] else float("nan")
    return (f"| {model_name} | {weights / 2**20:.0f} | {spread([r['copy_gbs'] for r in done])}"
            f" | {spread([r['read_gbs'] for r in done])} |"
            f" {spread([floor_ms(r) for r in done])} | " + " | ".join(cells)
            + f" | {' | '.join(ratios)} | {'yes' if match else 'NO'} | {first:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="gpt2,llama")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--inductor", action="store_true")
    parser.add_argument("--child")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.child:
        model_name, way = args.child.split(":")
        print(json.dumps(run_way(model_name, way, args.new, args.repeat)))
        return

    from bench.bench_models import machine, publish

    os.environ["EMBER_NUM_THREADS"] = str(args.threads)
    ways = ["eager", "eager-static", "ember", "ember-dynamo"]
    ways += ["inductor"] if args.inductor else []
    lines = [f"## Greedy decoding, {args.threads} thread(s): per-token ms (`python"
             f" bench/bench_decode.py --threads {args.threads}`)", "",
             f"Machine: {machine()}. Prompt {PROMPT}, {args.new} new tokens, batch 1."
             " Each way runs in a process of its own and measures, between its timed runs,"
             " the copy bandwidth (read + write bytes of a parallel copy) and the read"
             " bandwidth (a parallel sum: data only read, as a matrix-vector product's"
             " weights are). Its floor is the weight bytes over the copy bandwidth; a cell"
             " is ms (x that floor); `x read floor` divides by the weight bytes over the"
             " read bandwidth instead.", "",
             "| model | weights MiB | copy GB/s | read GB/s | floor ms | " + " | ".join(ways)
             + " | ember / eager | ember x floor | ember x read floor | tokens match |"
             " ember first call s |",
             "|---" * (len(ways) + 10) + "|"]
    for model_name in args.models.split(","):
        weights = weight_bytes(make_model(model_name))
        results = {way: in_child(model_name, way, args) for way in ways}
        lines.append(table_row(model_name, weights, results))
        print(lines[-1], flush=True)
    publish(lines, not args.no_record)


if __name__ == "__main__":
    main()
