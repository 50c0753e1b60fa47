"""The warm path of `ember.compile(module)`: a module's fingerprint, computed without
tracing it, names the compiled graph in the disk cache, so that a new process loads the
machine code without running torch.export (seconds for a ResNet-50) or any compile stage.

The fingerprint hashes what decides the traced graph:

- Ember's version and source, torch's version, the config, the target and the input
  signature (shapes, dtypes, the call's structure);
- every submodule's path, class and training flag, and its public attributes (a Conv2d's
  stride, a config object's fields) by `repr`;
- the code: the file of every class in each submodule's MRO, and the files of the
  functions, classes and modules that their methods name as globals (a helper in another
  file, `torch.nn.functional`);
- every parameter and buffer: name, dtype, shape and bytes.

A module it cannot vouch for has no fingerprint and is traced every time: one with hooks,
or with an attribute whose `repr` is an address (an object that prints as `<... at 0x..>`
says nothing about its state). Code reached more than one global away from a method is not
hashed: a changed helper called only through another helper is not noticed until Ember,
torch or the module's own files change (or the cache is cleared).

    index entry: <cache>/modules/<fp[:2]>/<fp>.json = {"graph": cache key, "out_spec": ...}
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import types
from pathlib import Path
from typing import Any

import numpy as np

from ember.runtime.cache import cache_dir
from ember.util.files import write_atomically
from ember.util.keys import code_version, jsonable

_SIMPLE = (bool, int, float, str, type(None))


def module_fingerprint(module: Any, signature: tuple, config: Any) -> str | None:
    """The fingerprint of `module` called with inputs of `signature` (None when the module
    cannot be fingerprinted; see the module's docstring)."""
    import torch

    h = hashlib.sha256(json.dumps({
        "ember": code_version(), "torch": torch.__version__,
        "config": jsonable(config),  # (resolved by ember.compile: its target included)
        "signature": jsonable(signature)},
        sort_keys=True).encode())
    for path, sub in module.named_modules():
        if sub._forward_hooks or sub._forward_pre_hooks or \
                getattr(sub, "_backward_hooks", None):
            return None
        cls = type(sub)
        attributes = _attributes(sub)
        if attributes is None:
            return None
        h.update(f"\n{path}:{cls.__module__}.{cls.__qualname__}:{sub.training}\n".encode())
        h.update(_class_code(cls).encode())
        h.update(attributes.encode())
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        _tensor_bytes(h, name, tensor)
    return h.hexdigest()


def _attributes(sub: Any) -> str | None:
    """The module's public attributes as text, or None when one prints as an address."""
    parts = []
    for key, value in sorted(vars(sub).items()):
        if key.startswith("_") or key == "training":
            continue
        text = repr(value) if isinstance(value, _SIMPLE) else _object_repr(value)
        if text is None:
            return None
        parts.append(f"{key}={text}")
    return ";".join(parts)


def _object_repr(value: Any) -> str | None:
    if isinstance(value, (tuple, list)):
        items = [repr(v) if isinstance(v, _SIMPLE) else _object_repr(v) for v in value]
        return None if None in items else f"{type(value).__name__}({', '.join(items)})"
    if callable(value) and hasattr(value, "__code__"):  # a function: its code's file
        return f"{value.__module__}.{value.__qualname__}:{_file_digest(value)}"
    text = repr(value)
    return None if " at 0x" in text else f"{type(value).__qualname__}:{text}"


@functools.cache
def _class_code(cls: type) -> str:
    """Digests of the files holding the classes of `cls`'s MRO and of what their methods
    name as globals (one level)."""
    digests = set()
    for klass in cls.__mro__:
        if klass is object:
            continue
        digests.add(_file_digest(klass))
        for member in vars(klass).values():
            fn = getattr(member, "__func__", member)
            code = getattr(fn, "__code__", None)
            if code is None:
                continue
            globals_ = getattr(fn, "__globals__", {})
            for name in code.co_names:
                target = globals_.get(name)
                if isinstance(target, (types.FunctionType, type, types.ModuleType)):
                    digests.add(_file_digest(target))
    return ",".join(sorted(digests))


def _file_digest(obj: Any) -> str:
    try:
        path = inspect.getsourcefile(obj) if not isinstance(obj, types.ModuleType) \
            else getattr(obj, "__file__", None)
    except TypeError:  # a builtin: nothing on disk to change
        path = None
    if not path:
        return f"builtin:{getattr(obj, '__name__', type(obj).__name__)}"
    try:
        stat = os.stat(path)
    except OSError:
        return f"missing:{path}"
    return _digest(path, stat.st_mtime_ns, stat.st_size)


@functools.cache
def _digest(path: str, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def _tensor_bytes(h: Any, name: str, tensor: Any) -> None:
    import torch

    data = tensor.detach()
    if data.device.type != "cpu":
        data = data.cpu()
    data = data.contiguous()
    h.update(f"\n@{name} {data.dtype} {tuple(data.shape)}\n".encode())
    if data.dtype == torch.bfloat16:
        data = data.view(torch.int16)
    h.update(memoryview(np.ascontiguousarray(data.numpy()).reshape(-1).view(np.uint8)))


# -- the index: fingerprint -> compiled graph --------------------------------------------------

def _entry_path(fingerprint: str) -> Path:
    return cache_dir() / "modules" / fingerprint[:2] / f"{fingerprint}.json"


def load_entry(fingerprint: str) -> tuple[str, Any] | None:
    """(the graph's cache key, the module's output spec) recorded for `fingerprint`, or
    None (no entry, or one that fails its checksum)."""
    from torch.utils._pytree import treespec_loads

    try:
        meta = json.loads(_entry_path(fingerprint).read_text())
        body = meta["body"]
        if hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest() != \
                meta["checksum"] or body["fingerprint"] != fingerprint:
            return None
        return body["graph"], treespec_loads(body["out_spec"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store_entry(fingerprint: str, graph_key: str, out_spec: Any) -> None:
    """Record that `fingerprint` compiles to the graph cached under `graph_key` (written
    atomically; a failure to write only costs a trace next time)."""
    from torch.utils._pytree import treespec_dumps

    body = {"fingerprint": fingerprint, "graph": graph_key, "out_spec": treespec_dumps(out_spec)}
    meta = {"checksum": hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest(),
            "body": body}
    try:
        write_atomically(_entry_path(fingerprint), json.dumps(meta))
    except OSError:
        pass
