"""The keys that name a compiled graph in the caches: a content hash of everything that
decides its machine code (the input graph with its constants' bytes, the input signature,
the config with its target, Ember's code)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from ember.graph.ir import Graph
from ember.graph.text import print_graph
from ember.runtime.cache import FORMAT
from ember.target import usable_cores
from ember.util.keys import code_version, digest_each, jsonable, known_digest


def graph_fingerprint(graph: Graph) -> str:
    """A hash of a graph: its text with the constant table elided, then each constant's
    bytes (hashing bytes is much faster than printing them; large ones on all cores)."""
    h = hashlib.sha256(print_graph(graph, constants="elide").encode())
    # (A constant whose bytes this compile hashed already, a model's weight, is not hashed
    # again: `known_digest`.)
    digests = [known_digest(data) for data in graph.constants.values()]
    arrays = [np.ascontiguousarray(data) for data in graph.constants.values()]
    missing = [i for i, digest in enumerate(digests) if digest is None]
    for i, digest in zip(missing, digest_each([arrays[i].reshape(-1).view(np.uint8).data
                                               for i in missing], usable_cores())):
        digests[i] = digest
    for name, data, digest in zip(graph.constants, arrays, digests):
        h.update(f"\n@{name} {data.dtype.str} {data.dtype.name} {data.shape}\n".encode())
        h.update(digest)
    return h.hexdigest()


def cache_key(graph: Graph, signature: Any, config: Any, version: str | None = None) -> str:
    """The content hash that names a compiled graph in both caches; `config` carries its
    resolved target (`Config.resolved`)."""
    parts = {"format": FORMAT, "graph": graph_fingerprint(graph),
             "signature": jsonable(signature), "config": jsonable(config),
             "version": version or code_version()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
