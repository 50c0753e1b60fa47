"""Compile caches: in memory, and on disk so that a new process skips every stage.

    exe = get_or_build(key, build, load, memory=MemoryCache(), disk=DiskCache())

The key is the driver's (ember/driver/keys.py): a hash of what decides the machine code.
A disk entry is a folder `<root>/<key[:2]>/<key>/` holding the object code (`code0.o`,
`code1.o`, ...: one file per module), the constants (`constants.bin`, 64-byte aligned,
mapped when loaded) and `meta.json`: the program's interface, memory plan, constants
index, and a check of every file and of itself (SHA-256; the constants, hundreds of
megabytes for a large model, by a CRC-32 per chunk, on all cores: a check against disk
errors that a warm start can afford).
Entries are written into a temp folder and renamed into place, so a reader never sees half
an entry; one that fails its checks is discarded and rebuilt. A fresh build's entry is
written by a thread of its own while the program already runs (`store_later`: hundreds of
megabytes of new pages cost a large model's compile half a second); this process's own
lookups wait for it, and the interpreter waits for it at exit.

The root is `EMBER_CACHE_DIR`, else `$XDG_CACHE_HOME/ember`, else `~/.cache/ember`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ember.dtypes import DType, from_numpy
from ember.runtime.executable import Artifact, Interface
from ember.runtime.memory_plan import MemoryPlan, align
from ember.target import usable_cores
from ember.util.files import cache_dir
from ember.util.keys import bytes_check

log = logging.getLogger("ember.cache")

FORMAT = 3
CONSTANTS, META = "constants.bin", "meta.json"


def code_file(index: int) -> str:
    """The name of an entry's `index`-th object file."""
    return f"code{index}.o"


def _sha(data: Any) -> str:
    return hashlib.sha256(data).hexdigest()


def _mapped(path: Path, size: int) -> np.ndarray:
    """The bytes of the file at `path` (`size` of them, else CorruptEntry), mapped rather
    than read: no copy (a copy of a large model's weights cost more than reading them), the
    pages the page cache's, shared with every process that maps them. A private mapping: a
    write would change this process's copy, never the file (no kernel writes a constant)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size != size:
            raise CorruptEntry(f"{path.name} has the wrong size")
        if size == 0:
            return np.zeros(0, np.uint8)
        mapping = mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE,
                            prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return np.frombuffer(mapping, np.uint8)


# -- what a cache entry holds ---------------------------------------------------------------

class CorruptEntry(Exception):
    """A disk entry that fails its checks (internal: the entry is discarded and rebuilt)."""


def _constants_layout(constants: dict[str, np.ndarray]) -> tuple[list[list[Any]], int]:
    index, offset = [], 0
    for name, data in constants.items():
        dtype = from_numpy(data.dtype)
        index.append([name, dtype.value, list(data.shape), offset, data.nbytes])
        offset = align(offset + data.nbytes)
    return index, offset


# This process's entries being written by `store_later`, by folder (threads of this
# process that built the same graph at once each write it; the first rename wins).
_WRITING: dict[Path, list[threading.Thread]] = {}
_WRITING_LOCK = threading.Lock()


def wait_for_writes(path: Path | None = None) -> None:
    """Return once this process's background writes (of the entry at `path`, or every
    one) are on disk or have failed."""
    with _WRITING_LOCK:
        threads = [t for ts in _WRITING.values() for t in ts] if path is None \
            else list(_WRITING.get(path, ()))
    for thread in threads:
        thread.join()


class DiskCache:
    """Compiled artifacts in folders under `root`, one per key."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else cache_dir()
        self.discarded = 0

    def path(self, key: str) -> Path:
        return self.root / key[:2] / key

    def load(self, key: str) -> Artifact | None:
        """The entry for `key`, or None when there is none or it was corrupt (then removed)."""
        path = self.path(key)
        wait_for_writes(path)
        if not path.is_dir():
            return None
        try:
            return self._read(key, path)
        except (CorruptEntry, OSError, ValueError, KeyError, TypeError) as e:
            log.warning("ember cache: discarding corrupt entry %s (%s)", path, e)
            self.discarded += 1
            self.discard(key)
            return None

    def _read(self, key: str, path: Path) -> Artifact:
        meta = json.loads((path / META).read_text())
        body = meta["body"]
        if _sha(_canonical(body)) != meta["checksum"]:
            raise CorruptEntry("metadata checksum mismatch")
        if body["format"] != FORMAT or body["key"] != key:
            raise CorruptEntry("entry of another format or key")
        objects = []
        for index in range(body["objects"]):
            name = code_file(index)
            objects.append((path / name).read_bytes())
            _verify(objects[-1], body["files"][name], name)
        size = body["files"][CONSTANTS][0]
        blob = _mapped(path / CONSTANTS, size)
        if [size, bytes_check(blob, usable_cores())] != body["files"][CONSTANTS]:
            raise CorruptEntry(f"{CONSTANTS} fails its check")
        constants = {}
        for name, dtype, shape, offset, nbytes in body["constants"]:
            np_type = DType(dtype).np
            view = blob[offset:offset + nbytes].view(np_type).reshape(shape)
            view.flags.writeable = False
            constants[name] = view
        return Artifact(objects, Interface.from_json(body["interface"]),
                        MemoryPlan.from_json(body["plan"]), constants, body["extra"])

    def store(self, key: str, artifact: Artifact) -> Path:
        """Write the entry for `key` atomically; an entry already there is kept."""
        final = self.path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=final.parent))
        try:
            self._write(key, artifact, tmp)
            try:
                os.replace(tmp, final)
            except OSError:  # another process stored the same key first: keep theirs
                if not final.is_dir():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final

    def store_later(self, key: str, artifact: Artifact) -> None:
        """`store` in a thread of its own (a non-daemon one: the interpreter finishes it
        before it exits); a failure to write is logged, as a cache's must be."""
        final = self.path(key)

        def write() -> None:
            try:
                self.store(key, artifact)
            except OSError as e:  # a read-only or full disk costs a rebuild later
                log.warning("ember cache: cannot store %s (%s)", key, e)
            finally:
                with _WRITING_LOCK:
                    _WRITING[final].remove(thread)
                    if not _WRITING[final]:
                        del _WRITING[final]

        thread = threading.Thread(target=write, name=f"ember-cache-{key[:8]}")
        with _WRITING_LOCK:  # (started before another thread can wait for it)
            _WRITING.setdefault(final, []).append(thread)
            thread.start()

    def _write(self, key: str, artifact: Artifact, folder: Path) -> None:
        index, size = _constants_layout(artifact.constants)
        with open(folder / CONSTANTS, "wb") as f:
            for (_, _, _, offset, _), data in zip(index, artifact.constants.values()):
                f.write(bytes(offset - f.tell()))  # the alignment's padding
                f.write(np.ascontiguousarray(data).reshape(-1).view(np.uint8).data)
            f.write(bytes(size - f.tell()))
        # On this thread alone: a background write leaves the other cores to the program,
        # and an interpreter that is exiting (it waits for the write) takes no new pools.
        files = {CONSTANTS: [size, bytes_check(_mapped(folder / CONSTANTS, size), 1)]}
        for i, data in enumerate(artifact.objects):
            _write_file(folder / code_file(i), data)
            files[code_file(i)] = [len(data), _sha(data)]
        body = {"format": FORMAT, "key": key, "interface": artifact.interface.to_json(),
                "plan": artifact.plan.to_json(), "constants": index, "extra": artifact.extra,
                "objects": len(artifact.objects), "files": files}
        meta = {"checksum": _sha(_canonical(body)), "body": body}
        _write_file(folder / META, json.dumps(meta, indent=1).encode())

    def discard(self, key: str) -> None:
        """Remove the entry for `key`: renamed aside first, so readers never see half of it."""
        path = self.path(key)
        wait_for_writes(path)
        trash = path.parent / f".trash-{key}-{os.getpid()}-{id(self)}"
        try:
            os.replace(path, trash)
        except OSError:
            return
        shutil.rmtree(trash, ignore_errors=True)


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _verify(data: Any, expected: list[Any], what: str) -> None:
    size, checksum = expected
    if len(data) != size or _sha(data) != checksum:
        raise CorruptEntry(f"{what} fails its checksum")


def _write_file(path: Path, data: Any) -> None:
    with open(path, "wb") as f:
        f.write(data)


# -- the in-memory cache, and the lookup that uses both ---------------------------------------

class MemoryCache:
    """The most recently used compiled executables of this process, by key."""

    def __init__(self, max_entries: int = 64):
        self.max_entries = max_entries
        self.entries: OrderedDict[str, Any] = OrderedDict()

    def get(self, key: str) -> Any:
        if key in self.entries:
            self.entries.move_to_end(key)
            return self.entries[key]
        return None

    def put(self, key: str, value: Any) -> None:
        self.entries[key] = value
        self.entries.move_to_end(key)
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)


@dataclass
class CacheStats:
    memory_hits: int = 0
    disk_hits: int = 0
    builds: int = 0


def get_cached(key: str, load: Callable[[Artifact], Any], *, memory: MemoryCache | None = None,
               disk: DiskCache | None = None, stats: CacheStats | None = None) -> Any:
    """The executable for `key` from memory, else loaded from disk (no stage runs), else
    None."""
    stats = stats if stats is not None else CacheStats()
    if memory is not None and (found := memory.get(key)) is not None:
        stats.memory_hits += 1
        return found
    artifact = disk.load(key) if disk is not None else None
    if artifact is None:
        return None
    stats.disk_hits += 1
    return _loaded(key, artifact, load, memory)


def get_or_build(key: str, build: Callable[[], Artifact], load: Callable[[Artifact], Any], *,
                 memory: MemoryCache | None = None, disk: DiskCache | None = None,
                 stats: CacheStats | None = None) -> Any:
    """The executable for `key`: cached (`get_cached`), else built (every stage), loaded,
    and stored on disk while it runs (`DiskCache.store_later`)."""
    stats = stats if stats is not None else CacheStats()
    found = get_cached(key, load, memory=memory, disk=disk, stats=stats)
    if found is not None:
        return found
    artifact = build()
    stats.builds += 1
    if disk is not None:
        disk.store_later(key, artifact)
    return _loaded(key, artifact, load, memory)


def _loaded(key: str, artifact: Artifact, load: Callable[[Artifact], Any],
            memory: MemoryCache | None) -> Any:
    executable = load(artifact)
    if memory is not None:
        memory.put(key, executable)
    return executable
