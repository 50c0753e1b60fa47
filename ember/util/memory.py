"""Memory that a compile allocates: small pages for the copies it makes once.

NumPy advises huge pages (MADV_HUGEPAGE) for every array of 4 MiB or more. Where the
kernel's huge-page `defrag` setting is `madvise` (a common default), the first touch of
such memory may stall in synchronous compaction instead of falling back to small pages
(numpy/numpy#31590). A compile copies each weight once or twice (import, packing,
folding) and touches every page of the copy once, so it pays that stall for the whole
model: on the machine of docs/benchmarks.md (stop 47), fresh arrays filled at 0.5 GB/s
with the advice and 2.2 GB/s without, a second of BERT's cold compile. Inside
`compile_allocations`, NumPy allocates without the advice.
"""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def compile_allocations() -> Iterator[None]:
    """NumPy's large allocations go without the huge-page advice until the outermost scope
    (of any thread) ends, which restores the setting it found. Also a decorator."""
    global _depth, _advice_before
    if _set_madvise_hugepage is None:
        yield
        return
    with _lock:
        if _depth == 0:
            _advice_before = bool(_set_madvise_hugepage(False))
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _set_madvise_hugepage(_advice_before)
