"""Sizes that change: a model compiled for one shape (a capture per signature) against one
compiled with `dynamic=True` (one capture, code compiled per size from it), on BERT
(bert-base from its config, random weights) over sequence lengths, and an MLP over batch
sizes. Per model: the first call at each new size (what a new size costs), then the
steady latency at the first size (median of rounds, eager interleaved). Each way runs in
a process of its own, with no disk cache, so that neither finds the other's code.

    python bench/bench_dynamic.py [--sequences 128,129,200] [--threads 2] [--repeat 20]
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


def measure(mode: str, model, inputs_for, sizes: list[int], repeat: int) -> dict:
    """First-call seconds per size, then the median latency at sizes[0] (and eager's)."""
    import torch

    import ember

    config = ember.Config(disk_cache=False)
    compiled = ember.compile(model, config=config, dynamic=True if mode == "dynamic" else None)
    result = {"first": {}}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for size in sizes:
            x = inputs_for(size)
            result["first"][size] = timed(lambda x=x: compiled(*x))
        x = inputs_for(sizes[0])
        times: dict[str, list[float]] = {"ember": [], "eager": []}
        for _ in range(repeat):
            times["ember"].append(timed(lambda: compiled(*x)))
            times["eager"].append(timed(lambda: model(*x)))
    result.update({k: statistics.median(v) for k, v in times.items()})
    result["captures"] = compiled.compilations
    return result


def run_mode(mode: str, args) -> dict:
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    bert = transformers.BertModel(transformers.BertConfig()).eval()
    mlp = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                              torch.nn.Linear(1024, 256)).eval()
    sequences = [int(s) for s in args.sequences.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    return {"bert-base": measure(mode, bert, lambda s: (torch.randint(0, 30522, (1, s)),),
                                 sequences, args.repeat),
            "mlp": measure(mode, mlp, lambda b: (torch.randn(b, 256),), batches,
                           args.repeat)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", default="128,129,200")
    parser.add_argument("--batches", default="4,5,17")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--mode", choices=("static", "dynamic"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:  # one way, in this process: JSON out
        print(json.dumps(run_mode(args.mode, args)))
        return
    from bench.bench_models import machine

    env = {**os.environ, "EMBER_NUM_THREADS": str(args.threads)}
    results = {}
    for mode in ("static", "dynamic"):
        done = subprocess.run([sys.executable, __file__, "--mode", mode, "--sequences",
                               args.sequences, "--batches", args.batches, "--threads",
                               str(args.threads), "--repeat", str(args.repeat)],
                              env=env, stdout=subprocess.PIPE, text=True, check=True)
        results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"Machine: {machine()}; {args.threads} thread(s).\n")
    print("| model | what | per signature | dynamic=True | per signature / dynamic |")
    print("|---|---|---:|---:|---:|")
    for name, static in results["static"].items():
        dynamic = results["dynamic"][name]
        for size, seconds in static["first"].items():
            other = dynamic["first"][size]
            print(f"| {name} | first call at {size} | {seconds * 1e3:.0f} ms |"
                  f" {other * 1e3:.0f} ms | {seconds / other:.2f} |")
        first = next(iter(static["first"]))
        print(f"| {name} | latency at {first} (eager {static['eager'] * 1e3:.2f} /"
              f" {dynamic['eager'] * 1e3:.2f} ms) | {static['ember'] * 1e3:.2f} ms |"
              f" {dynamic['ember'] * 1e3:.2f} ms | {static['ember'] / dynamic['ember']:.2f} |")
        print(f"| {name} | captures | {static['captures']} | {dynamic['captures']} | |")


if __name__ == "__main__":
    main()
