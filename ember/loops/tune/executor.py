"""Where the tuner's measurements run. An executor has `slots` workers, one per machine,
each running one measurement at a time: two measurements on one machine would time each
other. A worker is a process of its own, so that a candidate that crashes or hangs costs
its measurement, never the caller; the worker is then replaced.

- `LocalExecutor`, the default: one worker process on this machine.
- `RayExecutor` (`Config(tune_executor="ray")`, the `ember[ray]` extra): one worker on each
  machine of a Ray cluster whose target is the compile's, holding all of that machine's
  CPUs while it lives, so that candidates are measured on as many machines at once and
  nothing else the cluster runs shares a machine with a measurement.

`run_all` measures a list of jobs through either, within a time budget.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import os
import socket
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from ember.errors import EmberError
from ember.target import Target, host_key

MEASURE_TIMEOUT = 120.0  # seconds before a measurement counts as hung

# A job: the function to run on a worker, and its arguments.
Job = tuple[Callable[..., Any], tuple[Any, ...]]


class Executor(ABC):
    """Workers in `slots`, each on a machine of its own."""

    slots: int = 1

    @abstractmethod
    def start(self, slot: int, fn: Callable[..., Any], args: tuple) -> concurrent.futures.Future:
        """Run fn(*args) on the worker in `slot` (idle until now)."""

    @abstractmethod
    def replace(self, slot: int) -> None:
        """Put a fresh worker in `slot`, after its worker crashed or hung."""

    @abstractmethod
    def crashed(self, error: BaseException) -> bool:
        """Whether a job's error says that its worker died (rather than the job raised)."""

    @abstractmethod
    def machine(self, slot: int) -> str:
        """The name of the machine `slot`'s worker runs on."""

    @abstractmethod
    def close(self) -> None:
        """Stop the workers."""


def run_all(executor: Executor, count: int, job: Callable[[int], Job], budget_seconds: float,
            on_result: Callable[[int, Any, str | None], None] | None = None,
            timeout: float = MEASURE_TIMEOUT) -> list[tuple[int, Any, str]]:
    """Run jobs 0 .. count-1 (`job(i)`, made when it starts), as many at once as the
    executor has slots, starting new ones until the budget is spent (the first always
    runs, and the budget starts when a job first ends: starting a worker is not
    measuring; those started finish). Returns (job index, result, machine) for each job
    that returned, in the order they finished; `on_result` hears of every job that ran,
    with its result or why it failed."""
    deadline = float("inf")  # until a job first ends
    idle = list(range(executor.slots))
    running: dict[concurrent.futures.Future, tuple[int, int, float]] = {}  # slot, job, start
    results: list[tuple[int, Any, str]] = []
    started = 0

    def finish(slot: int, index: int, result: Any, why: str | None) -> None:
        nonlocal deadline
        deadline = min(deadline, time.perf_counter() + budget_seconds)
        if why is None:
            results.append((index, result, executor.machine(slot)))
        if on_result is not None:
            on_result(index, result, why)
        idle.append(slot)

    while True:
        while idle and started < count and time.perf_counter() < deadline:
            slot = idle.pop(0)
            fn, args = job(started)
            running[executor.start(slot, fn, args)] = (slot, started, time.perf_counter())
            started += 1
        if not running:
            return results
        first_end = min(start for _, _, start in running.values()) + timeout
        done, _ = concurrent.futures.wait(running, max(0.0, first_end - time.perf_counter()),
                                          concurrent.futures.FIRST_COMPLETED)
        for future in done:
            slot, index, _ = running.pop(future)
            result, why = None, None
            try:
                result = future.result()
            except Exception as e:  # noqa: BLE001  (a candidate's failure is a result)
                why = f"{type(e).__name__}: {e}"
                if executor.crashed(e):
                    executor.replace(slot)
                    why = "the worker process crashed"
            finish(slot, index, result, why)
        now = time.perf_counter()
        for future, (slot, index, start) in list(running.items()):
            if now - start >= timeout:
                del running[future]
                executor.replace(slot)
                finish(slot, index, None, f"timed out after {timeout:.0f} s")


# -- this machine ------------------------------------------------------------------------------
class LocalExecutor(Executor):
    """One worker process on this machine, started afresh (spawn: nothing copied from the
    caller) at its first job."""

    slots = 1

    def __init__(self) -> None:
        self.pool: concurrent.futures.ProcessPoolExecutor | None = None

    def start(self, slot: int, fn: Callable[..., Any], args: tuple) -> concurrent.futures.Future:
        if self.pool is None:
            self.pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        with _main_script_hidden():  # the worker process starts at its first job
            return self.pool.submit(fn, *args)

    def replace(self, slot: int) -> None:
        self.close()  # the next job starts a new process

    def crashed(self, error: BaseException) -> bool:
        return isinstance(error, concurrent.futures.process.BrokenProcessPool)

    def machine(self, slot: int) -> str:
        return socket.gethostname()

    def close(self) -> None:
        if self.pool is None:
            return
        # A hung worker is killed (shutdown alone waits for nothing but kills nothing).
        for process in list(getattr(self.pool, "_processes", {}).values()):
            process.kill()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.pool = None


@contextlib.contextmanager
def _main_script_hidden():
    """A spawned worker runs the caller's main script again (as `__mp_main__`) unless it
    cannot find it; a script without an `if __name__ == "__main__"` guard would then run
    its compile again in every worker. The workers need Ember only: while one starts, the
    script's path is hidden."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or getattr(main, "__spec__", None) is not None:
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


# -- a Ray cluster -----------------------------------------------------------------------------
class RayWorker:
    """A Ray actor: runs measurements one at a time on its machine, on `threads` threads
    (the team size the winners are keyed by)."""

    def __init__(self, threads: int) -> None:
        os.environ["EMBER_NUM_THREADS"] = str(threads)

    def target_key(self) -> str:
        return host_key()

    def run(self, fn: Callable[..., Any], args: tuple) -> Any:
        return fn(*args)


class RayExecutor(Executor):
    """A worker on every live machine of the Ray cluster at `address` (None: the one
    RAY_ADDRESS names, else a new local instance; see `ray.init`) whose host target is
    `target`; a machine of another target is left alone. Ember must be installed on every
    machine."""

    def __init__(self, target: Target, threads: int, address: str | None = None,
                 start_timeout: float = 120.0) -> None:
        try:
            import ray
        except ImportError:
            raise EmberError("tune_executor='ray' needs Ray: pip install 'ember[ray]'") from None
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.ray = ray
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        self.actor_class = ray.remote(RayWorker)
        self.threads = threads
        self.nodes: list[tuple[str, str, float]] = []  # node id, address, CPUs
        self.workers: list[Any] = []
        candidates = [(node["NodeID"], node["NodeManagerAddress"],
                       node["Resources"].get("CPU", 0.0))
                      for node in ray.nodes() if node["Alive"]]
        self.strategy = NodeAffinitySchedulingStrategy
        workers = [self._new_worker(node) for node in candidates]
        try:
            keys = ray.get([w.target_key.remote() for w in workers], timeout=start_timeout)
        except ray.exceptions.GetTimeoutError:
            for w in workers:
                ray.kill(w)
            raise EmberError(f"the Ray cluster did not start a tuning worker on each of its"
                             f" {len(workers)} machines within {start_timeout:.0f} s (each"
                             " takes all of its machine's CPUs: is another job holding"
                             " some?)") from None
        for node, worker, key in zip(candidates, workers, keys):
            if key == target.key():
                self.nodes.append(node)
                self.workers.append(worker)
            else:
                ray.kill(worker)
        if not self.workers:
            raise EmberError(f"no machine of the Ray cluster is a {target.key()} (the"
                             f" compile's target); its machines are {', '.join(set(keys))}")
        self.slots = len(self.workers)

    def _new_worker(self, node: tuple[str, str, float]) -> Any:
        node_id, _, cpus = node
        return self.actor_class.options(
            scheduling_strategy=self.strategy(node_id, soft=False), num_cpus=cpus,
            max_restarts=-1, max_task_retries=0).remote(self.threads)

    def start(self, slot: int, fn: Callable[..., Any], args: tuple) -> concurrent.futures.Future:
        return self.workers[slot].run.remote(fn, args).future()

    def replace(self, slot: int) -> None:
        self.ray.kill(self.workers[slot], no_restart=True)
        self.workers[slot] = self._new_worker(self.nodes[slot])

    def crashed(self, error: BaseException) -> bool:
        exceptions = self.ray.exceptions
        return isinstance(error, exceptions.RayActorError | exceptions.WorkerCrashedError |
                          exceptions.ActorUnavailableError)

    def machine(self, slot: int) -> str:
        return self.nodes[slot][1]

    def close(self) -> None:
        for worker in self.workers:
            self.ray.kill(worker, no_restart=True)
        self.workers = []


def make_executor(spec: str, target: Target, threads: int) -> Executor:
    """The executor `spec` names: "local", "ray" (the cluster RAY_ADDRESS names, else a new
    local instance) or "ray:ADDRESS"."""
    name, _, address = spec.partition(":")
    if name == "local" and not address:
        return LocalExecutor()
    if name == "ray":
        return RayExecutor(target, threads, address or None)
    raise EmberError(f"unknown tuning executor '{spec}' (available: local, ray, ray:ADDRESS)")
