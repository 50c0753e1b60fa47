"""sgemm benchmark: Ember's blocked matmul (ember/loops/schedules/gemm.py) against
torch.matmul, on 1 and 2 threads, as GFLOP/s and as a fraction of the FMA peak measured in
the same run.

    python bench/bench_gemm.py [--sizes 256,512,1024,2048] [--threads 1,2] [--repeat 9]
    python bench/bench_gemm.py --sizes 512x512x24,512x512x40   (M x K x N shapes)

Each thread count runs in its own process (EMBER_NUM_THREADS and torch.set_num_threads set
before anything runs): square matmuls of each size, Ember compiled once (a graph with one
matmul, called with `out=` preallocated) and torch.matmul with `out=`, timed interleaved,
`--repeat` rounds of one call each; a row reports the median (and the best) of the rounds.

The FMA peak is an Ember kernel: independent accumulators of one vector of f32 lanes each
(`vectorized`, `unrolled` loops and `fma`: vector FMAs with no memory operand, as many
chains as the registers hold beside the constant, which hides the FMA latency),
repeated; one such loop per thread of a `parallel` loop gives the team's peak. The
machine is shared: medians over rounds, and the ratios in one run, are what to compare.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ember.target import Target

HOST = Target.host()

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PEAK_KERNEL = """kernel @fma_peak(%c: f32[2,{lanes}], %out: f32[{threads},{chains},{lanes}]) {{
  local %acc: f32[{chains},{lanes}]
  for %t = 0 to {threads} parallel {{
    for %i = 0 to {chains} unrolled {{ for %j = 0 to {lanes} vectorized {{
      %acc[%i, %j] = %c[0, %j]
    }} }}
    for %r = 0 to {rounds} {{
      for %i2 = 0 to {chains} unrolled {{ for %j2 = 0 to {lanes} vectorized {{
        %acc[%i2, %j2] = fma(%acc[%i2, %j2], %c[0, %j2], %c[1, %j2])
      }} }}
    }}
    for %i3 = 0 to {chains} unrolled {{ for %j3 = 0 to {lanes} vectorized {{
      %out[%t, %i3, %j3] = %acc[%i3, %j3]
    }} }}
  }}
}}"""


def fma_peak(threads: int, rounds: int = 2_000_000, repeat: int = 7) -> float:
    """GFLOP/s of `threads` threads each running independent chains of one-vector FMAs
    (best of `repeat`)."""
    import numpy as np

    from ember.codegen import cpu
    from ember.codegen.llvm import kernel_module
    from ember.dtypes import DType
    from ember.loops.text import parse_kernel
    from ember.loops.verify import verify_kernel
    from ember.target import probe_chains

    lanes, chains = HOST.lanes(DType.f32), probe_chains(HOST.vector_registers)
    kernel = verify_kernel(parse_kernel(PEAK_KERNEL.format(
        threads=threads, rounds=rounds, lanes=lanes, chains=chains)))
    jit = cpu.compile_module(kernel_module([kernel], name="peak"), target=HOST)
    jit.set_num_threads("peak", threads)
    run = jit.kernel("fma_peak", 2)
    c = np.stack([np.full(lanes, 0.999, np.float32), np.full(lanes, 0.001, np.float32)])
    out = np.zeros((threads, chains, lanes), np.float32)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run(c.ctypes.data, out.ctypes.data)
        best = min(best, time.perf_counter() - start)
    return 2 * chains * lanes * rounds * threads / best / 1e9


def shape_of(size: str) -> tuple[int, int, int]:
    """(M, K, N) of a --sizes entry: `n` (square) or `MxKxN`."""
    dims = tuple(int(d) for d in size.split("x"))
    return dims * 3 if len(dims) == 1 else dims


def measure(sizes: list[str], threads: int, repeat: int) -> dict:
    """One process, one thread count: the peak, then each size (Ember and torch)."""
    import numpy as np
    import torch

    import ember

    torch.set_num_threads(threads)
    result = {"threads": threads, "peak": fma_peak(threads), "rows": []}
    for size in sizes:
        m, k, n = shape_of(size)
        rng = np.random.default_rng(n)
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        g = ember.Builder(f"sgemm{m}x{k}x{n}")
        g.output(g.matmul(g.input("a", "f32", (m, k)), g.input("b", "f32", (k, n))))
        compiled = ember.compile(g.build(), config=ember.Config(executor="cpu",
                                                                disk_cache=False))
        out = [np.empty((m, n), np.float32)]
        ta, tb, tout = torch.from_numpy(a), torch.from_numpy(b), torch.empty(m, n)
        compiled.run(a, b, out=out)
        torch.matmul(ta, tb, out=tout)
        np.testing.assert_allclose(out[0], tout.numpy(), rtol=1e-3, atol=1e-3 * np.sqrt(k))
        times: dict[str, list[float]] = {"ember": [], "torch": []}
        for _ in range(repeat):  # interleaved, so that both see the same machine
            start = time.perf_counter()
            compiled.run(a, b, out=out)
            times["ember"].append(time.perf_counter() - start)
            start = time.perf_counter()
            torch.matmul(ta, tb, out=tout)
            times["torch"].append(time.perf_counter() - start)
        flop = 2 * m * k * n
        result["rows"].append({"n": size, **{
            f"{who}_{stat}": flop / fn(ts) / 1e9 for who, ts in times.items()
            for stat, fn in (("median", statistics.median), ("best", min))}})
        print(f"  {threads} thread(s), {size}: done", file=sys.stderr)
    return result


def table(results: list[dict], repeat: int) -> str:
    from bench.bench_models import machine

    lines = [f"### {datetime.date.today()}: sgemm, Ember vs torch.matmul (median of {repeat}"
             " rounds; best in brackets)", "", f"Machine: {machine()}.", "",
             f"FMA peak (an Ember kernel of independent {HOST.vector_bits}-bit FMAs, this run): "
             + ", ".join(f"{r['peak']:.1f} GFLOP/s on {r['threads']} thread(s)"
                         for r in results) + ".", "",
             "| n (or M x K x N) | threads | Ember GFLOP/s | of peak | torch GFLOP/s | of peak |"
             " Ember / torch |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        for row in r["rows"]:
            e, t = row["ember_median"], row["torch_median"]
            lines.append(f"| {row['n']} | {r['threads']} | {e:.1f} ({row['ember_best']:.1f})"
                         f" | {e / r['peak']:.0%} | {t:.1f} ({row['torch_best']:.1f}) |"
                         f" {t / r['peak']:.0%} | {e / t:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="256,512,1024,2048")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--record", action="store_true",
                        help="append the table to docs/benchmarks.md")
    args = parser.parse_args()
    sizes = args.sizes.split(",")
    if args.child:
        print(json.dumps(measure(sizes, args.child, args.repeat)))
        return
    results = []
    for threads in (int(t) for t in args.threads.split(",")):
        env = {**os.environ, "EMBER_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
        done = subprocess.run([sys.executable, __file__, "--sizes", args.sizes, "--repeat",
                               str(args.repeat), "--child", str(threads)], env=env,
                              stdout=subprocess.PIPE, text=True, check=True)
        results.append(json.loads(done.stdout))
    text = table(results, args.repeat)
    print(text)
    if args.record:
        with (ROOT / "docs" / "benchmarks.md").open("a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
