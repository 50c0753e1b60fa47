"""Sizes that change: a model compiled per signature (`ember.compile(model)`: a capture,
an import and a native compile for each new shape) against one compiled once for every
size (`ember.compile(model, dynamic=...)`: one capture with symbolic sizes, kernels that
take the sizes as arguments), on bert-base over sequence lengths, ResNet-50 over batches
and an MLP over batches (all built from their configs, random weights). Per size: the
first call (what a new size costs) and the steady latency (median of rounds, eager
interleaved). Each way runs in a process of its own, with no disk cache, so that neither
finds the other's code.

    python bench/bench_dynamic.py [--models bert,resnet50,mlp] [--sequences 1,128,512]
                                  [--batches 1,32] [--threads 2] [--repeat 10]
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


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(mode: str, model, inputs_for, sizes: list[int], dynamic, repeat: int) -> dict:
    """Per size: the first call's seconds, then the median latency of Ember and eager."""
    import torch

    import ember

    config = ember.Config(disk_cache=False)
    compiled = ember.compile(model, config=config,
                             dynamic=dynamic if mode == "dynamic" else None)
    result: dict = {}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for size in sizes:
            x = inputs_for(size)
            first = timed(lambda x=x: compiled(*x))
            times: dict[str, list[float]] = {"ember": [], "eager": []}
            for _ in range(repeat):
                times["ember"].append(timed(lambda x=x: compiled(*x)))
                times["eager"].append(timed(lambda x=x: model(*x)))
            result[size] = {"first": first, **{k: statistics.median(v)
                                               for k, v in times.items()}}
    return {"sizes": result, "captures": compiled.compilations}


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


def run_mode(mode: str, args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    return {name: measure(mode, model, inputs_for, sizes, dynamic, args.repeat)
            for name, (model, inputs_for, sizes, dynamic) in models(args).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bert,resnet50,mlp")
    parser.add_argument("--sequences", default="1,128,512")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--mode", choices=("static", "dynamic"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:  # one way, in this process: JSON out
        print(json.dumps(run_mode(args.mode, args)))
        return
    from bench.bench_models import machine

    env = {**os.environ, "EMBER_NUM_THREADS": str(args.threads)}
    results = {}
    for mode in ("static", "dynamic"):
        done = subprocess.run([sys.executable, __file__, "--mode", mode, "--models",
                               args.models, "--sequences", args.sequences, "--batches",
                               args.batches, "--threads", str(args.threads), "--repeat",
                               str(args.repeat)],
                              env=env, stdout=subprocess.PIPE, text=True, check=True)
        results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"Machine: {machine()}; {args.threads} thread(s).\n")
    print("| model | size | first call: per signature | every size | latency: per signature"
          " | every size | every size / per signature | eager |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, static in results["static"].items():
        dynamic = results["dynamic"][name]
        for size, one in static["sizes"].items():
            other = dynamic["sizes"][size]
            print(f"| {name} | {size} | {one['first'] * 1e3:.0f} ms |"
                  f" {other['first'] * 1e3:.0f} ms | {one['ember'] * 1e3:.2f} ms |"
                  f" {other['ember'] * 1e3:.2f} ms | {other['ember'] / one['ember']:.2f} |"
                  f" {other['eager'] * 1e3:.2f} ms |")
        print(f"| {name} | captures | {static['captures']} | {dynamic['captures']} | | | | |")


if __name__ == "__main__":
    main()
