"""Files that readers never see half-written (the one atomic-write helper), and the folder
Ember keeps its caches in."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: str | os.PathLike, data: str | bytes) -> None:
    """Write `data` to `path` (its folders made as needed) through a temp file renamed into
    place, so that a reader sees the old file or the new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def cache_dir() -> Path:
    """The root of Ember's caches: EMBER_CACHE_DIR, else `$XDG_CACHE_HOME/ember`, else
    `~/.cache/ember`."""
    if os.environ.get("EMBER_CACHE_DIR"):
        return Path(os.environ["EMBER_CACHE_DIR"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "ember"
