"""The memory a compile allocates: its objects and its arrays are made once and most die
young, in a process whose heap (PyTorch, transformers, the user's model) is large and old.

- **Huge pages.** NumPy advises huge pages (MADV_HUGEPAGE) for every array of 4 MiB or
  more. Where the kernel's huge-page `defrag` setting is `madvise` (a common default), the
  first touch of such memory may stall in synchronous compaction instead of falling back
  to small pages (numpy/numpy#31590). A compile copies each weight once or twice (import,
  packing, folding) and touches each page of a copy once, so it would pay that stall for
  the whole model.
- **The cyclic garbage collector.** A compile creates millions of objects; the full
  collections they trigger walk every object of the process, the old heap included, which
  a compile neither frees nor changes. Reference counting frees nearly all that a compile
  drops; the few cycles wait for the first collection after it.

Inside `compiling()`, NumPy allocates without the advice and the cyclic collector is off.
docs/benchmarks.md (stop 47) has what each costs: a second of a cold compile and a
collection of half a second in a warm one, for a few percent more peak memory.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

try:
    from numpy._core.multiarray import _set_madvise_hugepage
except ImportError:  # NumPy 1.x
    try:
        from numpy.core.multiarray import _set_madvise_hugepage
    except ImportError:  # a NumPy without the switch: nothing to turn off
        _set_madvise_hugepage = None

_lock = threading.Lock()
_depth = 0  # compiles in progress, in any thread
_advice_before = False  # NumPy's setting when the first of them began
_paused = False  # whether that first one turned the collector off (it was on)


@contextlib.contextmanager
def compiling() -> Iterator[None]:
    """The scope of a compile's work (also a decorator). Scopes nest and overlap across
    threads: the last to end restores NumPy's setting and the collector."""
    global _depth, _advice_before, _paused
    with _lock:
        if _depth == 0:
            if _set_madvise_hugepage is not None:
                _advice_before = bool(_set_madvise_hugepage(False))
            _paused = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                if _set_madvise_hugepage is not None:
                    _set_madvise_hugepage(_advice_before)
                if _paused:
                    gc.enable()
