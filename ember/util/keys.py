"""What cache keys are made of: values as JSON, and the version of Ember's own code."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from blake3 import blake3

# The package's folder, found without importing `ember` (which imports every level).
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def jsonable(x: Any) -> Any:
    """`x` as JSON values: dataclasses as dicts of their fields, tuples as lists, dict keys
    as strings, anything else by `str`."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: jsonable(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return str(x)


@functools.cache
def code_version() -> str:
    """A hash of Ember's source (`__version__` included): a changed compiler never reuses
    code that an older one cached."""
    digest = hashlib.sha256()
    for path in sorted(_PACKAGE_ROOT.rglob("*.py")):
        digest.update(str(path.relative_to(_PACKAGE_ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


# A smaller buffer is hashed in line: handing it to a thread costs more than hashing it.
_IN_LINE_BYTES = 1 << 20


def _on_threads(fn: Callable[[Any], Any], items: Sequence[Any], workers: int) -> list[Any]:
    if workers <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, items))


def _digest(data: Any, workers: int = 1) -> blake3:
    return blake3(memoryview(data).cast("B"), max_threads=workers)


def digest_each(buffers: Sequence[Any], workers: int) -> list[bytes]:
    """The BLAKE3 digest (32 bytes) of each buffer, the large ones on `workers` threads
    (blake3 lets go of the GIL while it hashes): a module's weights, for its cache key.
    BLAKE3 hashed 5.8 GB/s on one core of a Sapphire Rapids where SHA-256 did 0.8, and a
    warm start hashes every weight."""
    sizes = [memoryview(b).nbytes for b in buffers]
    large = [i for i, size in enumerate(sizes) if size >= _IN_LINE_BYTES]
    digests = [b"" if size >= _IN_LINE_BYTES else _digest(b).digest()
               for b, size in zip(buffers, sizes)]
    for i, digest in zip(large, _on_threads(lambda i: _digest(buffers[i]).digest(), large,
                                            workers)):
        digests[i] = digest
    return digests


def bytes_check(data: Any, workers: int) -> str:
    """A check of a large buffer's bytes against a disk error or a cut-short write (an
    entry's constants, checked at each warm load): its BLAKE3 digest, on `workers`
    threads. A check, not a key: what names a cache entry is a SHA-256 of its parts."""
    return "blake3:" + _digest(data, workers).hexdigest()


# Digests of objects whose bytes were hashed already in this compile (a model's weights, for
# its fingerprint; then their copies in its graph), by id: (object, digest).
_KNOWN_DIGESTS: ContextVar[dict[int, tuple[Any, Any]] | None] = \
    ContextVar("known_digests", default=None)


@contextmanager
def digests_known() -> Iterator[None]:
    """A scope (one compile: nothing writes the objects it names meanwhile) in which
    `remember_digest` records what `known_digest` gives back, so that bytes are hashed
    once."""
    token = _KNOWN_DIGESTS.set({})
    try:
        yield
    finally:
        _KNOWN_DIGESTS.reset(token)


def remember_digest(obj: Any, digest: Any) -> None:
    """Record `digest` for `obj` in the current `digests_known` scope (none: nothing)."""
    known = _KNOWN_DIGESTS.get()
    if known is not None:
        known[id(obj)] = (obj, digest)


def known_digest(obj: Any) -> Any:
    """The digest recorded for this very object in the current scope, or None."""
    known = _KNOWN_DIGESTS.get()
    entry = known.get(id(obj)) if known else None
    return entry[1] if entry is not None and entry[0] is obj else None
