"""The warm path of `ember.compile(module)`: a module's fingerprint, computed without
tracing it, names the compiled graph in the disk cache, so that a new process loads the
machine code without running torch.export (seconds for a ResNet-50) or any compile stage.

The fingerprint hashes what decides the traced graph:

- Ember's version and source, Python's and torch's versions, the config, the target and
  the input signature (shapes, dtypes, the call's structure);
- every submodule's path, class and training flag, and its attributes (a Conv2d's
  stride, a config object's fields, a user's `self._scale`) by `repr`, but the ones
  every `torch.nn.Module` keeps for itself;
- the code. The user's code (anything outside the Python installation's library
  folders: a file of the project, a script read from standard input, a class made by
  `exec`) by what runs, whatever its source: the bytecode of every method of each class
  in a submodule's MRO and of every function they reach, with the values of the globals,
  defaults and closure cells they read, followed through the user's functions and
  classes. Library code (torch, transformers) by the files of its classes and of what
  their methods name as globals (its version is in its files);
- every parameter and buffer: name, dtype, shape and bytes (the bytes' SHA-256 per tensor,
  the large ones on all cores).

A module it cannot vouch for has no fingerprint and is traced every time: one with hooks,
one whose attributes or reached values hold an object that prints as an address (an
object `<... at 0x..>` says nothing about its state), a C method bound to an object, or
a module that is not one of its submodules (its weights are not hashed).

    index entry: <cache>/modules/<fp[:2]>/<fp>.json = {"graph": cache key, "out_spec": ...}
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import sys
import sysconfig
import types
from pathlib import Path
from typing import Any

import numpy as np

from ember.runtime.cache import cache_dir
from ember.target import usable_cores
from ember.util.files import write_atomically
from ember.util.keys import code_version, digest_each, jsonable, remember_digest

_SIMPLE = (bool, int, float, str, type(None))


def module_fingerprint(module: Any, signature: tuple, config: Any) -> str | None:
    """The fingerprint of `module` called with inputs of `signature` (None when the module
    cannot be fingerprinted; see the module's docstring)."""
    import torch

    h = hashlib.sha256(json.dumps({
        "ember": code_version(), "torch": torch.__version__, "python": sys.version,
        "config": jsonable(config),  # (resolved by ember.compile: its target included)
        "signature": jsonable(signature)},
        sort_keys=True).encode())
    code = _Code()
    for path, sub in module.named_modules():
        if sub._forward_hooks or sub._forward_pre_hooks or \
                getattr(sub, "_backward_hooks", None):
            return None
        cls = type(sub)
        attributes = _attributes(sub, code)
        classes = code.of(cls)
        if attributes is None or classes is None:
            return None
        h.update(f"\n{path}:{cls.__module__}.{cls.__qualname__}:{sub.training}\n".encode())
        h.update(classes.encode())
        h.update(attributes.encode())
    tensors = [*module.named_parameters(), *module.named_buffers()]
    data = [_tensor_bytes(tensor) for _, tensor in tensors]
    for (name, tensor), digest in zip(tensors, digest_each(data, usable_cores())):
        h.update(f"\n@{name} {tensor.dtype} {tuple(tensor.shape)}\n".encode())
        h.update(digest)
        # (The import's copy of this tensor has these bytes, unless it changes first.)
        remember_digest(tensor, (tensor._version, digest))
    return h.hexdigest()


@functools.cache
def _module_internals() -> frozenset[str]:
    """The attributes every torch.nn.Module keeps in its __dict__ (its parameters, buffers,
    submodules and hook tables), which the fingerprint reads otherwise or not at all."""
    import torch

    return frozenset(vars(torch.nn.Module()))


def _attributes(sub: Any, code: _Code) -> str | None:
    """The module's own attributes as text, or None when one cannot be vouched for."""
    parts = []
    for key, value in sorted(vars(sub).items()):
        if key in _module_internals() or key == "training":
            continue
        text = code.value(value)
        if text is None:
            return None
        parts.append(f"{key}={text}")
    return ";".join(parts)


@functools.cache
def _library_roots() -> tuple[str, ...]:
    """The folders of the Python installation's own and installed packages."""
    paths = sysconfig.get_paths()
    roots = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib")
             if paths.get(k)}
    return tuple(sorted(roots))


_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by Python code, not C


def _is_library(obj: Any) -> bool:
    """Whether `obj` (a function, class or module) comes from an installed package or the
    standard library, not from the user's code: a C type, or Python code whose module is a
    file in those folders and which was defined there (a class that `exec` made with
    another namespace says `builtins` or some module's name: its methods' globals tell)."""
    if isinstance(obj, type) and not obj.__flags__ & _HEAP_TYPE:
        return True
    if isinstance(obj, types.ModuleType):
        return _in_library(getattr(obj, "__file__", None))
    if not _library_namespace(getattr(obj, "__module__", None)):
        return False
    functions = [obj] if isinstance(obj, types.FunctionType) else \
        [getattr(m, "__func__", m) for m in vars(obj).values()]
    return all(_library_namespace(f.__globals__.get("__name__"), f.__globals__)
               for f in functions if isinstance(f, types.FunctionType))


def _library_namespace(name: str | None, namespace: dict | None = None) -> bool:
    """Whether module `name` is a library file's (and `namespace`, when given, is its)."""
    module = sys.modules.get(name or "")
    return module is not None and _in_library(getattr(module, "__file__", None)) and \
        (namespace is None or vars(module) is namespace)


@functools.cache
def _in_library(path: str | None) -> bool:
    if not path:
        return False
    path = os.path.realpath(path)
    return any(path.startswith(root + os.sep) for root in _library_roots())


class _Code:
    """Text for the code a module runs and the values it reads, walked once per
    fingerprint (cycles: a function reached again is named, not walked again)."""

    def __init__(self):
        self.seen: set[int] = set()

    def of(self, cls: type) -> str | None:
        """The code of `cls` and its bases: files for library classes, what runs for the
        user's."""
        parts = []
        for klass in cls.__mro__:
            if klass is object:
                continue
            text = _library_class_code(klass) if _is_library(klass) else self.user_class(klass)
            if text is None:
                return None
            parts.append(text)
        return ",".join(parts)

    def user_class(self, klass: type) -> str | None:
        if id(klass) in self.seen:
            return f"class {klass.__qualname__}"
        self.seen.add(id(klass))
        parts = [f"class {klass.__module__}.{klass.__qualname__}"]
        for name, member in sorted(vars(klass).items()):
            if name in ("__dict__", "__weakref__", "__module__", "__doc__", "__qualname__"):
                continue
            if isinstance(member, property):
                member = (member.fget, member.fset)
            elif isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            text = self.value(member)
            if text is None:
                return None
            parts.append(f"{name}={text}")
        return ";".join(parts)

    def function(self, fn: types.FunctionType) -> str | None:
        if _is_library(fn):
            return f"{fn.__module__}.{fn.__qualname__}:{_file_digest(fn)}"
        if id(fn) in self.seen:
            return f"def {fn.__qualname__}"
        self.seen.add(id(fn))
        parts = [f"def {fn.__module__}.{fn.__qualname__}", self.code(fn.__code__),
                 self.value(fn.__defaults__), self.value(fn.__kwdefaults__)]
        for cell in fn.__closure__ or ():
            try:
                parts.append(self.value(cell.cell_contents))
            except ValueError:  # an empty cell
                parts.append("<empty>")
        for name in sorted(_global_names(fn.__code__)):
            if name in fn.__globals__:
                text = self.value(fn.__globals__[name])
                parts.append(None if text is None else f"{name}={text}")
        return None if None in parts else "\n".join(parts)

    def code(self, code: types.CodeType) -> str:
        """What runs: the bytecode, the constants (nested code too) and the names."""
        # (`value`, not repr: a frozenset constant's order changes with the hash seed)
        consts = [self.code(c) if isinstance(c, types.CodeType) else self.value(c) or repr(c)
                  for c in code.co_consts]
        return (f"{code.co_code.hex()}|{consts}|{code.co_names}|{code.co_freevars}|"
                f"{code.co_cellvars}|{code.co_argcount}|{code.co_kwonlyargcount}|"
                f"{code.co_flags}")

    def held_module(self, module: Any) -> str | None:
        """Text for a module held in a plain attribute rather than as a submodule (Qwen2's
        attention keeps its rotary function as one, in a dict): its classes and attributes,
        when it holds no tensors (which the fingerprint would not hash) and no hooks."""
        if next(module.parameters(), None) is not None or \
                next(module.buffers(), None) is not None:
            return None
        parts = []
        for path, sub in module.named_modules():
            if sub._forward_hooks or sub._forward_pre_hooks:
                return None
            classes, attributes = self.of(type(sub)), _attributes(sub, self)
            if classes is None or attributes is None:
                return None
            parts.append(f"{path}:{classes}:{attributes}:{sub.training}")
        return "module(" + ";".join(parts) + ")"

    def value(self, value: Any) -> str | None:
        """Text for a value the code reads: itself for plain values, the code of functions
        and classes, a module's name and file; None for what cannot be vouched for."""
        if isinstance(value, _SIMPLE):
            return repr(value)
        if isinstance(value, (tuple, list, frozenset, set)):
            items = [self.value(v) for v in value]
            if isinstance(value, (set, frozenset)):
                items = sorted(items, key=str)
            return None if None in items else f"{type(value).__name__}({', '.join(items)})"
        if isinstance(value, dict):
            items = [(self.value(k), self.value(v)) for k, v in value.items()]
            if any(None in pair for pair in items):
                return None
            return "dict(" + ", ".join(f"{k}: {v}" for k, v in sorted(items)) + ")"
        if isinstance(value, types.FunctionType):
            return self.function(value)
        if isinstance(value, types.MethodType):
            inner = self.value(value.__func__)
            owner = self.value(value.__self__) if not isinstance(value.__self__, type) \
                else value.__self__.__qualname__
            return None if inner is None or owner is None else f"method {inner} of {owner}"
        if isinstance(value, type):
            return _library_class_code(value) if _is_library(value) else \
                self.user_class(value)
        if isinstance(value, types.ModuleType):
            return f"module {value.__name__}:{_file_digest(value)}"
        if isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType)):
            owner = getattr(value, "__self__", None)
            if owner is None or isinstance(owner, types.ModuleType):
                return f"builtin {getattr(owner, '__name__', '')}.{value.__name__}"
            return None  # a C method bound to an object whose state is unknown
        import torch

        if isinstance(value, torch.nn.Module):
            return self.held_module(value)
        text = repr(value)
        if " at 0x" in text:
            return None
        return f"{type(value).__qualname__}:{text}"


def _global_names(code: types.CodeType) -> set[str]:
    """The names `code` and the code nested in it (comprehensions, inner functions) may
    read as globals."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


@functools.cache
def _library_class_code(klass: type) -> str:
    """Digests of the file holding library class `klass` and of what its methods name as
    globals (one level: a library's version is in its files)."""
    digests = {_file_digest(klass)}
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


def _tensor_bytes(tensor: Any) -> memoryview:
    import torch

    data = tensor.detach()
    if data.device.type != "cpu":
        data = data.cpu()
    data = data.contiguous()
    if data.dtype == torch.bfloat16:
        data = data.view(torch.int16)
    return memoryview(np.ascontiguousarray(data.numpy()).reshape(-1).view(np.uint8))


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
