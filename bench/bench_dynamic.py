"""Sizes that change: a model compiled per signature (`ember.compile(model)`: a capture,
an import and a native compile for each new shape) against one compiled once for every
size (`ember.compile(model, dynamic=...)`: one capture with symbolic sizes, kernels that
take the sizes as arguments), on bert-base over sequence lengths, ResNet-50 over batches
and an MLP over batches (all built from their configs, random weights). Per size: the
first call (what a new size costs) and the steady latency (median of rounds, eager
interleaved with both ways, in one process, no disk cache); then the code of every size
again after serving the size for as long as that code took to compile (a small graph's size
then has code of its own: SizeSpecialized's hot sizes).

    python bench/bench_dynamic.py [--models bert,resnet50,mlp] [--sequences 1,128,512]
                                  [--batches 1,32] [--threads 2] [--repeat 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # built from its config: never download

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(model, inputs_for, sizes: list[int], dynamic, repeat: int) -> dict:
    """Per size: each way's first call (the code compiled per signature, then the code of
    every size, captured at the first size), then rounds that run Ember per signature,
    Ember of every size and eager in turn (medians): the ratios come from one process, so
    that a neighbour's load moves them all alike."""
    import torch

    import ember

    config = ember.Config(disk_cache=False)
    ways = {"static": ember.compile(model, config=config),
            "dynamic": ember.compile(model, config=config, dynamic=dynamic)}
    result: dict = {}
    compile_s = 0.0
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for size in sizes:
            x = inputs_for(size)
            row = {f"first {way}": timed(lambda c=c, x=x: c(*x)) for way, c in ways.items()}
            times: dict[str, list[float]] = {"static": [], "dynamic": [], "eager": []}
            for _ in range(repeat):
                for way, c in ways.items():
                    times[way].append(timed(lambda c=c, x=x: c(*x)))
                times["eager"].append(timed(lambda x=x: model(*x)))
            # Served for as long as the code of every size took to compile, a size gets
            # code of its own where the graph is small enough (SizeSpecialized.run's hot
            # sizes): the latency after.
            compile_s = max(compile_s, row["first dynamic"])  # (the first size's)
            served = time.perf_counter() + compile_s
            while time.perf_counter() < served:
                ways["dynamic"](*x)
            warm = statistics.median(timed(lambda x=x: ways["dynamic"](*x))
                                     for _ in range(repeat))
            result[size] = {**row, **{k: statistics.median(v) for k, v in times.items()},
                            "served": warm}
    return {"sizes": result, "captures": {way: c.compilations for way, c in ways.items()}}


def models(args) -> dict:
    """name -> (model, inputs for a size, the sizes, what `dynamic=` names)."""
    import torch
    import transformers

    torch.manual_seed(0)
    sequences = [int(s) for s in args.sequences.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    chosen = args.models.split(",")
    made = {}
    if "bert" in chosen:
        bert = transformers.BertModel(transformers.BertConfig()).eval()
        made["bert-base"] = (bert, lambda s: (torch.randint(0, 30522, (1, s)),), sequences,
                             True)
    if "resnet50" in chosen:
        resnet = transformers.ResNetModel(transformers.ResNetConfig()).eval()
        made["resnet-50"] = (resnet, lambda b: (torch.randn(b, 3, 224, 224),), batches,
                             {"pixel_values": {0: "batch"}})
    if "mlp" in chosen:
        mlp = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                                  torch.nn.Linear(1024, 256)).eval()
        made["mlp"] = (mlp, lambda b: (torch.randn(b, 256),), [1, 5, 17, 64],
                       {"input": {0: "batch"}})
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bert,resnet50,mlp")
    parser.add_argument("--sequences", default="1,128,512")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    os.environ["EMBER_NUM_THREADS"] = str(args.threads)
    import torch

    from bench.bench_models import machine

    torch.set_num_threads(args.threads)
    results = {name: measure(model, inputs_for, sizes, dynamic, args.repeat)
               for name, (model, inputs_for, sizes, dynamic) in models(args).items()}
    print(f"Machine: {machine()}; {args.threads} thread(s).\n")
    print("| model | size | first call: per signature | every size | latency: per signature"
          " | every size | every size / per signature | every size, served as long as it took to"
          " compile | ratio | eager |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, result in results.items():
        for size, r in result["sizes"].items():
            print(f"| {name} | {size} | {r['first static'] * 1e3:.0f} ms |"
                  f" {r['first dynamic'] * 1e3:.0f} ms | {r['static'] * 1e3:.2f} ms |"
                  f" {r['dynamic'] * 1e3:.2f} ms | {r['dynamic'] / r['static']:.2f} |"
                  f" {r['served'] * 1e3:.2f} ms | {r['served'] / r['static']:.2f} |"
                  f" {r['eager'] * 1e3:.2f} ms |")
        captures = result["captures"]
        print(f"| {name} | captures | {captures['static']} | {captures['dynamic']} |"
              " | | | | | |")


if __name__ == "__main__":
    main()
