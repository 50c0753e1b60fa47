"""This machine's limits, measured: the FMA peak and the copy bandwidth, the two roofs of
explain's roofline.

- **Peak**: a generated loop of independent vector FMAs (as many accumulators of the
  widest vector the host has as its registers hold: enough to hide the FMA latency),
  timed on one thread; the parallel
  peak is that times the thread count (EMBER_NUM_THREADS or the cores).
- **Bandwidth**: a compiled copy of 64 MiB into a preallocated buffer (read + write), on
  the thread team that compiled code uses.

The figures are cached per process and on disk (machine.json in the cache folder), keyed
by the CPU, its features and the thread count; `measure(force=True)` measures again.
"""

from __future__ import annotations

import ctypes
import functools
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ember.dtypes import DType
from ember.target import Target, fma_loop, probe_chains
from ember.util.files import write_atomically


@dataclass(frozen=True)
class MachineLimits:
    cpu: str
    threads: int
    peak_gflops_one_thread: float
    bandwidth_gbs: float  # read + write bytes per second, copying

    @property
    def peak_gflops(self) -> float:
        return self.peak_gflops_one_thread * self.threads


def _fma_peak(target: Target) -> float:
    """GFLOP/s of one thread running independent vector FMAs of `target`'s width."""
    from llvmlite import ir

    from ember.codegen.cpu import compile_module

    lanes, chains = target.lanes(DType.f32), probe_chains(target.vector_registers)
    module = ir.Module("peak")
    fma_loop(module, "ember_fma_peak", lanes, chains=chains, depth=1)
    jit = compile_module(module, target)
    run = jit.function("ember_fma_peak", ctypes.c_float, ctypes.c_int64)
    iterations = 2_000_000
    run(10_000)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        run(iterations)
        best = min(best, time.perf_counter() - start)
    return 2 * chains * lanes * iterations / best / 1e9


# A copy of `n` f32s in one parallel loop, written as loop IR: what lowering and the
# default schedule make of a graph that returns its input, without running either.
_COPY_PROGRAM = """
kernel @copy(%src: f32[{n}], %dst: f32[{n}]) {{
  for %i = 0 to {n} parallel {{
    %dst[%i] = %src[%i]
  }}
}}

program @copy {{
  input %x: f32[{n}]
  output %y: f32[{n}]
  call @copy(%x, %y)
}}
"""


# A sum of `rows` x `n` f32s, a row per task, in one parallel loop, written as loop IR: a
# stream of reads with nothing written back, what a matrix-vector product's weights are.
_READ_PROGRAM = """
kernel @read(%src: f32[{rows},{n}], %dst: f32[{rows},{lanes}]) {{
  local %acc: f32[4,{lanes}]
  for %t = 0 to {rows} parallel {{
    for %a = 0 to 4 unrolled {{
      for %j = 0 to {lanes} vectorized {{
        %acc[%a, %j] = 0.0:f32
      }}
    }}
    for %i = 0 to {blocks} {{
      for %a = 0 to 4 unrolled {{
        for %j = 0 to {lanes} vectorized {{
          %acc[%a, %j] = add(%acc[%a, %j],
                             %src[%t, add(mul(%i, {block}), add(mul(%a, {lanes}), %j))])
        }}
      }}
    }}
    for %j = 0 to {lanes} vectorized {{
      %dst[%t, %j] = add(add(%acc[0, %j], %acc[1, %j]), add(%acc[2, %j], %acc[3, %j]))
    }}
  }}
}}

program @read {{
  input %x: f32[{rows},{n}]
  output %y: f32[{rows},{lanes}]
  call @read(%x, %y)
}}
"""


def read_bandwidth(target: Target) -> float:
    """GB/s of a compiled, parallel sum of 256 MiB, measured now: the rate at which this
    machine streams data it only reads (a matrix-vector product's bound)."""
    lanes = target.lanes()
    rows, n = 64, 1 << 20
    text = _READ_PROGRAM.format(rows=rows, n=n, lanes=lanes, block=4 * lanes,
                                blocks=n // (4 * lanes))
    src, dst = np.ones((rows, n), np.float32), np.empty((rows, lanes), np.float32)
    return src.nbytes / _fastest_run(text, "machine.read", target, src, dst, 5) / 1e9


def copy_bandwidth(target: Target) -> float:
    """GB/s (read + write) of a compiled, parallel copy of 64 MiB, measured now (a VM's
    share of memory bandwidth drifts: benchmarks measure it next to what they time)."""
    n = 1 << 24
    src, dst = np.ones(n, np.float32), np.empty(n, np.float32)
    text = _COPY_PROGRAM.format(n=n)
    return 2 * src.nbytes / _fastest_run(text, "machine.copy", target, src, dst, 7) / 1e9


def _fastest_run(text: str, name: str, target: Target, src: np.ndarray, dst: np.ndarray,
                 rounds: int) -> float:
    """The seconds of the fastest of `rounds` runs (after a first) of the loop-IR program
    `text`, compiled for `target`, from `src` into `dst`."""
    from ember.loops.text import parse_program
    from ember.runtime.executable import compile_program

    run = compile_program(parse_program(text, name), target)
    run(src, out=[dst])
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        run(src, out=[dst])
        best = min(best, time.perf_counter() - start)
    return best


def _key(target: Target) -> dict:
    from ember.codegen.cpu import default_num_threads

    # The boot: another VM of the same CPU (a new session's) has bandwidth of its own, and
    # a cache keyed by the CPU alone gave explain one VM's roofs on the next (78.5 GB/s of
    # copy where this one measured 35-89).
    return {"cpu": target.cpu, "target": target.key(), "threads": default_num_threads(),
            "boot": _boot_id()}


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:  # (not Linux: the machine's limits are kept until the cache is cleared)
        return ""


@functools.cache
def _measured(key_text: str, target: Target) -> MachineLimits:
    from ember.runtime.cache import cache_dir

    key = json.loads(key_text)
    path = cache_dir() / "machine.json"
    try:
        saved = json.loads(path.read_text())
        if saved.get("key") == key:
            return MachineLimits(**saved["limits"])
    except (OSError, ValueError, TypeError, KeyError):
        pass
    limits = MachineLimits(key["cpu"], key["threads"], round(_fma_peak(target), 1),
                           round(copy_bandwidth(target), 1))
    write_atomically(path, json.dumps({"key": key, "limits": asdict(limits)}, indent=1))
    return limits


def measure(target: Target, force: bool = False) -> MachineLimits:
    """The limits of this machine, described by `target` (measured once, then read from
    the cache)."""
    key_text = json.dumps(_key(target), sort_keys=True)
    if force:
        _measured.cache_clear()
        from ember.runtime.cache import cache_dir

        (cache_dir() / "machine.json").unlink(missing_ok=True)
    return _measured(key_text, target)
