"""Scripted workloads: `@ember.script` against `numba.njit` and `jax.jit`, side by side in
one run, on the same inputs.

    python bench/bench_script.py [--repeat 7] [--threads 1] [--only rnn_b32,...] [--no-record]

Each workload is a plain Python function on NumPy arrays (`WORKLOADS`): Ember scripts that
source as it is; numba compiles the same source where it can, else the loop form a numba
user would write (`numba_version`, for the NumPy calls numba lacks: `axis=` on argmin,
`keepdims=`); JAX gets a hand-written `lax` version (`jax_version`: `lax.scan`,
`while_loop`, `fori_loop`), since JAX cannot trace a Python `if` or `while` on an array.
All run in float32 and are checked against the plain function.

A row reports the median steady-state time of each (the best of `--repeat` rounds' medians
is not used: the machine is shared), the ratios, and the time to first result: a fresh
decoration (or `jax.jit`) and its first call, with Ember's disk cache off. The large
workloads' geometric means and the tiny functions' per-call overhead come after the table.
Peers: `pip install -e '.[peers]'` (numba, scipy for numba's `@`, jax); a missing peer's
columns read "-". Threads: every peer gets `--threads` (Ember's team, XLA's intra-op
threads; numba's njit is serial).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _set_threads(threads: int) -> None:
    """Before any peer loads its thread pool."""
    os.environ.setdefault("EMBER_NUM_THREADS", str(threads))
    flags = os.environ.get("XLA_FLAGS", "")
    if threads == 1 and "multi_thread_eigen" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen=false".strip()


import numpy as np  # noqa: E402

F32 = np.float32


# -- the workloads, as a user writes them ---------------------------------------------------
def rnn(x, W, U, b):
    h = np.zeros((x.shape[1], U.shape[0]), dtype=x.dtype)
    for t in range(x.shape[0]):
        h = np.tanh(x[t] @ W + h @ U + b)
    return h


def newton_cbrt(a, tol):
    x = a
    while True:
        step = (x * x * x - a) / (F32(3.0) * x * x)
        x = x - step
        if np.max(np.abs(step)) < tol:
            break
    return x


def bisection_cbrt(a, tol):
    lo = np.zeros_like(a)
    hi = a
    while np.max(hi - lo) > tol:
        mid = (lo + hi) * F32(0.5)
        below = mid * mid * mid < a
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    return (lo + hi) * F32(0.5)


def mandelbrot(cr, ci, max_iter):
    zr = np.zeros_like(cr)
    zi = np.zeros_like(ci)
    count = np.zeros(cr.shape, np.int32)
    for _ in range(max_iter):
        active = zr * zr + zi * zi <= F32(4.0)
        if not np.any(active):
            break
        zr, zi = (np.where(active, zr * zr - zi * zi + cr, zr),
                  np.where(active, F32(2.0) * zr * zi + ci, zi))
        count = count + active.astype(np.int32)
    return count


def stencil(u, steps):
    for _ in range(steps):
        u = np.concatenate((u[:1], (u[:-2] + u[1:-1] + u[2:]) * F32(1.0 / 3.0), u[-1:]))
    return u


def kmeans(points, centers, iters):
    k = centers.shape[0]
    for _ in range(iters):
        d = (np.sum(points * points, axis=1, keepdims=True)
             - F32(2.0) * (points @ centers.T) + np.sum(centers * centers, axis=1))
        labels = np.argmin(d, axis=1)
        onehot = (labels[:, None] == np.arange(k)[None, :]).astype(points.dtype)
        counts = np.sum(onehot, axis=0)
        centers = (onehot.T @ points) / np.maximum(counts, F32(1.0))[:, None]
    return centers


def cumsum_setitem(x):
    out = np.zeros_like(x)
    acc = x[0] - x[0]
    for i in range(x.shape[0]):
        acc = acc + x[i]
        out[i] = acc
    return out


def power_iteration(A, iters):
    v = np.ones(A.shape[0], A.dtype)
    for _ in range(iters):
        w = A @ v
        v = w / np.sqrt(np.sum(w * w))
    return v


# -- numba: the same source, or the loops numba needs ---------------------------------------
def kmeans_loops(points, centers, iters):
    n, dims = points.shape
    k = centers.shape[0]
    for _ in range(iters):
        sums = np.zeros((k, dims), points.dtype)
        counts = np.zeros(k, points.dtype)
        for p in range(n):
            best, label = np.inf, 0
            for c in range(k):
                dist = F32(0.0)
                for j in range(dims):
                    diff = points[p, j] - centers[c, j]
                    dist += diff * diff
                if dist < best:
                    best, label = dist, c
            counts[label] += 1
            for j in range(dims):
                sums[label, j] += points[p, j]
        centers = sums / np.maximum(counts, F32(1.0)).reshape(k, 1)
    return centers


def numba_version(name: str) -> Callable:
    return {"kmeans": kmeans_loops}.get(name, WORKLOAD_FUNCTIONS[name])


# -- JAX: lax control flow by hand ----------------------------------------------------------
def jax_version(name: str) -> Callable:
    import jax
    import jax.numpy as jnp
    from jax import lax

    def rnn_jax(x, W, U, b):
        def step(h, xt):
            return jnp.tanh(xt @ W + h @ U + b), None
        return lax.scan(step, jnp.zeros((x.shape[1], U.shape[0]), x.dtype), x)[0]

    def newton_jax(a, tol):
        def body(state):
            x, _ = state
            step = (x * x * x - a) / (3.0 * x * x)
            return x - step, jnp.max(jnp.abs(step))
        return lax.while_loop(lambda s: s[1] >= tol, body, (a, jnp.float32(jnp.inf)))[0]

    def bisection_jax(a, tol):
        def body(state):
            lo, hi = state
            mid = (lo + hi) * 0.5
            below = mid * mid * mid < a
            return jnp.where(below, mid, lo), jnp.where(below, hi, mid)
        lo, hi = lax.while_loop(lambda s: jnp.max(s[1] - s[0]) > tol, body,
                                (jnp.zeros_like(a), a))
        return (lo + hi) * 0.5

    def mandelbrot_jax(cr, ci, max_iter):
        def cond(state):
            i, zr, zi, count, alive = state
            return (i < max_iter) & alive

        def body(state):
            i, zr, zi, count, _ = state
            active = zr * zr + zi * zi <= 4.0
            zr, zi = (jnp.where(active, zr * zr - zi * zi + cr, zr),
                      jnp.where(active, 2.0 * zr * zi + ci, zi))
            # the next iteration's test: NumPy's loop stops when no point is active
            alive = jnp.any(zr * zr + zi * zi <= 4.0)
            return i + 1, zr, zi, count + active.astype(jnp.int32), alive
        zeros = jnp.zeros_like(cr)
        return lax.while_loop(cond, body, (0, zeros, zeros, jnp.zeros(cr.shape, jnp.int32),
                                           jnp.bool_(True)))[3]

    def stencil_jax(u, steps):
        def body(_, u):
            return jnp.concatenate((u[:1], (u[:-2] + u[1:-1] + u[2:]) * (1.0 / 3.0), u[-1:]))
        return lax.fori_loop(0, steps, body, u)

    def kmeans_jax(points, centers, iters):
        k = centers.shape[0]

        def body(_, centers):
            d = (jnp.sum(points * points, axis=1, keepdims=True)
                 - 2.0 * (points @ centers.T) + jnp.sum(centers * centers, axis=1))
            onehot = jax.nn.one_hot(jnp.argmin(d, axis=1), k, dtype=points.dtype)
            return (onehot.T @ points) / jnp.maximum(jnp.sum(onehot, axis=0), 1.0)[:, None]
        return lax.fori_loop(0, iters, body, centers)

    def cumsum_jax(x):
        def step(acc, xi):
            acc = acc + xi
            return acc, acc
        return lax.scan(step, jnp.zeros((), x.dtype), x)[1]

    def power_jax(A, iters):
        def body(_, v):
            w = A @ v
            return w / jnp.sqrt(jnp.sum(w * w))
        return lax.fori_loop(0, iters, body, jnp.ones(A.shape[0], A.dtype))

    fn = {"rnn": rnn_jax, "newton_cbrt": newton_jax, "bisection_cbrt": bisection_jax,
          "mandelbrot": mandelbrot_jax, "stencil": stencil_jax, "kmeans": kmeans_jax,
          "cumsum_setitem": cumsum_jax, "power_iteration": power_jax}[name]
    return fn


WORKLOAD_FUNCTIONS = {f.__name__: f for f in (rnn, newton_cbrt, bisection_cbrt, mandelbrot,
                                               stencil, kmeans, cumsum_setitem,
                                               power_iteration)}


@dataclass
class Workload:
    row: str  # the table's name for it
    function: str  # a key of WORKLOAD_FUNCTIONS
    make: Callable[[np.random.Generator], tuple]  # the arguments
    static: tuple[int, ...] = ()  # positions of Python ints (static for jax.jit)
    tiny: bool = False  # a per-call overhead row, not a large workload


def _rnn_inputs(batch: int) -> Callable:
    def make(rng):
        x = rng.standard_normal((256, batch, 128)).astype(F32)
        W, U = (rng.standard_normal((128, 128)).astype(F32) / 16 for _ in range(2))
        return x, W, U, rng.standard_normal(128).astype(F32) / 4
    return make


def _mandelbrot_inputs(rng):
    re, im = np.meshgrid(np.linspace(-2.0, 0.6, 1024), np.linspace(-1.2, 1.2, 1024))
    return re.astype(F32), im.astype(F32), 100


WORKLOADS = [
    Workload("rnn, batch 1", "rnn", _rnn_inputs(1)),
    Workload("rnn, batch 32", "rnn", _rnn_inputs(32)),
    Workload("newton cbrt, 1M", "newton_cbrt",
             lambda rng: (rng.uniform(1, 1000, 1 << 20).astype(F32), 1e-3)),
    Workload("bisection cbrt, 1M", "bisection_cbrt",
             lambda rng: (rng.uniform(1, 1000, 1 << 20).astype(F32), 1e-3)),
    Workload("mandelbrot, 1024x1024", "mandelbrot", _mandelbrot_inputs, static=(2,)),
    Workload("stencil 1M x 100", "stencil",
             lambda rng: (rng.standard_normal(1 << 20).astype(F32), 100), static=(1,)),
    Workload("k-means 100k x 8, k=16, 10 steps", "kmeans",
             lambda rng: (rng.standard_normal((100_000, 8)).astype(F32),
                          rng.standard_normal((16, 8)).astype(F32), 10), static=(2,)),
    Workload("cumsum setitem, 64", "cumsum_setitem",
             lambda rng: (rng.standard_normal(64).astype(F32),), tiny=True),
    Workload("power iteration 32x32, 20", "power_iteration",
             lambda rng: (rng.standard_normal((32, 32)).astype(F32), 20), static=(1,),
             tiny=True),
]


# -- timing --------------------------------------------------------------------------------
def first_and_steady(make_fn: Callable[[], Callable], args: tuple, repeat: int,
                     prepare: Callable[[Any], Any] = lambda r: r) -> tuple[float, float, Any]:
    """(seconds to the first result from a fresh function, median seconds a call after it,
    the result). A call repeats until a round takes 20 ms, so tiny calls are timed in bulk."""
    start = time.perf_counter()
    fn = make_fn()
    result = prepare(fn(*args))
    first = time.perf_counter() - start
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            prepare(fn(*args))
        took = time.perf_counter() - start
        if took > 0.02 or calls >= 1 << 16:
            break
        calls *= 4
    rounds = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            prepare(fn(*args))
        rounds.append((time.perf_counter() - start) / calls)
    return first, statistics.median(rounds), result


def run_workload(w: Workload, repeat: int, peers: dict[str, bool]) -> dict:
    import ember

    args = w.make(np.random.default_rng(0))
    source = WORKLOAD_FUNCTIONS[w.function]
    expected = source(*args)
    row: dict[str, Any] = {"row": w.row, "tiny": w.tiny}
    config = ember.Config(executor="cpu", disk_cache=False)

    def check(who: str, got) -> None:
        """Floats within 1e-3; integers (escape counts) equal but for 0.1% of them, since
        a contracted multiply-add can tip a point on the set's boundary."""
        got = np.asarray(got)
        if expected.dtype.kind == "f":
            same = got.shape == expected.shape and np.allclose(got, expected, rtol=1e-3,
                                                               atol=1e-3)
        else:
            same = got.shape == expected.shape and np.mean(got != expected) <= 1e-3
        if not same:
            raise AssertionError(f"{w.row}: {who} differs from the plain function")

    timings = {}
    first, steady, got = first_and_steady(lambda: ember.script(source, config=config), args,
                                          repeat)
    check("ember", got)
    timings["ember"] = (first, steady)
    timings["numpy"] = (None, first_and_steady(lambda: source, args, repeat)[1])
    if peers["numba"]:
        import numba

        first, steady, got = first_and_steady(lambda: numba.njit(numba_version(w.function)),
                                              args, repeat)
        check("numba", got)
        timings["numba"] = (first, steady)
    if peers["jax"]:
        import jax

        fn = jax_version(w.function)
        first, steady, got = first_and_steady(
            lambda: jax.jit(fn, static_argnums=w.static), args, repeat,
            prepare=lambda r: r.block_until_ready())
        check("jax", got)
        timings["jax"] = (first, steady)
    row["timings"] = timings
    print(f"  {w.row}: done", file=sys.stderr)
    return row


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-4:
        return f"{seconds * 1e3:.4f}"
    return f"{seconds * 1e3:.3f}" if seconds < 0.01 else f"{seconds * 1e3:.1f}"


def table(rows: list[dict]) -> str:
    lines = ["| workload | Ember ms | numba ms | jax.jit ms | NumPy ms | vs numba | vs jax"
             " | vs NumPy | first result s: Ember | numba | jax |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        t = r["timings"]
        ember = t["ember"][1]
        steady = {who: _ms(t[who][1]) if who in t else "-" for who in PEERS}
        ratio = {who: f"{t[who][1] / ember:.2f}x" if who in t else "-" for who in PEERS}
        first = {who: f"{t[who][0]:.2f}" if t.get(who, (None,))[0] is not None else "-"
                 for who in ("ember", *PEERS)}
        lines.append(f"| {r['row']} | {_ms(ember)} | {steady['numba']} | {steady['jax']} |"
                     f" {steady['numpy']} | {ratio['numba']} | {ratio['jax']} |"
                     f" {ratio['numpy']} | {first['ember']} | {first['numba']} |"
                     f" {first['jax']} |")
    return "\n".join(lines)


PEERS = ("numba", "jax", "numpy")


def summary(rows: list[dict]) -> str:
    def geomean(who: str, tiny: bool) -> str:
        ratios = [r["timings"][who][1] / r["timings"]["ember"][1] for r in rows
                  if r["tiny"] == tiny and who in r["timings"]]
        if not ratios:
            return "-"
        return f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x ({len(ratios)})"

    firsts = [r["timings"]["ember"][0] for r in rows]
    return (f"Speed-ups are the peer's time over Ember's (above 1x, Ember is faster)."
            f" Large workloads, geometric mean: vs numba {geomean('numba', False)}, vs"
            f" jax.jit {geomean('jax', False)}, vs NumPy {geomean('numpy', False)}. Tiny"
            f" functions (per-call overhead): vs numba {geomean('numba', True)}, vs jax.jit"
            f" {geomean('jax', True)}. Ember's time to first result: median"
            f" {statistics.median(firsts):.2f} s, max {max(firsts):.2f} s.")


def peers_present() -> dict[str, bool]:
    present = {}
    for name in ("numba", "jax"):
        try:
            __import__(name)
            present[name] = True
        except ImportError:
            present[name] = False
    return present


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", default="", help="rows whose name starts with these")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    _set_threads(args.threads)
    from bench.bench_models import machine, record

    only = [s.strip() for s in args.only.split(",") if s.strip()]
    peers = peers_present()
    rows = [run_workload(w, args.repeat, peers) for w in WORKLOADS
            if not only or any(w.row.startswith(o) for o in only)]
    text = (f"### {datetime.date.today()}: scripted workloads, f32, {args.threads} thread(s)"
            f" (median of {args.repeat})\n\n{machine()}\n\n{table(rows)}\n\n{summary(rows)}\n")
    print(text)
    if not args.no_record:
        record(text)


if __name__ == "__main__":
    main()
