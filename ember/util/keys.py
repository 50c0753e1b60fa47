"""What cache keys are made of: values as JSON, and the version of Ember's own code."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from pathlib import Path
from typing import Any

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
