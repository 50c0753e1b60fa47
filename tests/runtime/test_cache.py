"""The compile caches: keys, disk entries (round trip, corruption, atomic writes), memory
cache, and a second process that loads object code instead of compiling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from ember import Builder, Config, DType
from ember.driver.keys import cache_key
from ember.runtime import cache as cache_mod
from ember.runtime.cache import (
    CacheStats,
    DiskCache,
    MemoryCache,
    cache_dir,
    get_or_build,
)
from ember.runtime.executable import Artifact, Executable, Interface
from ember.runtime.memory_plan import plan_memory
from ember.target import Target
from tests.runtime import handmade

HOST = Target.host()

REPO = Path(__file__).resolve().parents[2]
C = np.arange(8, dtype=np.float32)


def graph(weight: np.ndarray = C):
    b = Builder("g")
    x = b.input("x", DType.f32, (8,))
    b.output(b.add(x, b.constant(weight, name="w")))
    return b.build()


def build_handmade() -> Artifact:
    """The stand-in for 'run every stage': the handmade program's object code."""
    program = handmade.program()
    plan = plan_memory(program)
    return Artifact([handmade.object_code(plan)], Interface.of(program, handmade.ENTRY), plan,
                    {"c": C.copy()})


def load_handmade(artifact: Artifact) -> Executable:
    engine, address = handmade.load_object(artifact.objects[0])
    return Executable(artifact.interface, artifact.plan, address, engine, artifact.constants)


SIGNATURE = [("f32", (8,))]


def test_key_covers_graph_constants_signature_config_target_and_version() -> None:
    config = Config(target="znver3")
    base = cache_key(graph(), SIGNATURE, config, "0.1.0")
    assert cache_key(graph(), SIGNATURE, config, "0.1.0") == base
    other_weight = C.copy()
    other_weight[3] = 3.5
    variants = [
        cache_key(graph(other_weight), SIGNATURE, config, "0.1.0"),
        cache_key(graph(), [("f32", (9,))], config, "0.1.0"),
        cache_key(graph(), SIGNATURE, Config(target="znver3", max_specializations=2),
                  "0.1.0"),
        cache_key(graph(), SIGNATURE, Config(target="znver4"), "0.1.0"),
        cache_key(graph(), SIGNATURE, Config(target=Target.named("znver3").with_(
            l2_bytes=1 << 20)), "0.1.0"),
        cache_key(graph(), SIGNATURE, config, "0.2.0"),
    ]
    assert len({base, *variants}) == 7


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("EMBER_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "ember"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/paths/are/ignored")
    assert cache_dir() == Path.home() / ".cache" / "ember"


def test_entry_round_trip(tmp_path) -> None:
    disk = DiskCache(tmp_path)
    artifact = build_handmade()
    artifact.constants.update({"h": np.ones((2, 3), ml_dtypes.bfloat16),
                               "b": np.array([True, False]), "s": np.array(7, np.int64),
                               "e": np.zeros((0, 4), np.float16)})
    artifact.extra = {"stages_ms": {"llvm": 12.5}}
    disk.store("ab" * 32, artifact)
    loaded = disk.load("ab" * 32)
    assert loaded is not None
    assert loaded.objects == artifact.objects
    assert loaded.interface == artifact.interface and loaded.plan == artifact.plan
    assert loaded.extra == artifact.extra
    assert list(loaded.constants) == list(artifact.constants)
    for name, data in artifact.constants.items():
        got = loaded.constants[name]
        assert got.dtype == data.dtype and got.shape == data.shape
        np.testing.assert_array_equal(got, data)
        assert got.ctypes.data % 64 == 0
    del loaded.constants["h"], loaded.constants["b"], loaded.constants["s"], loaded.constants["e"]
    y, _ = load_handmade(loaded)(np.ones(8, np.float32))
    np.testing.assert_array_equal(y, 1 + C)


def corrupt_code(path: Path) -> None:
    code = path / "code0.o"
    code.write_bytes(code.read_bytes()[:100])


def corrupt_json(path: Path) -> None:
    meta = path / "meta.json"
    meta.write_text(meta.read_text()[:-40] + "garbage")


def tamper_json(path: Path) -> None:
    meta = json.loads((path / "meta.json").read_text())
    meta["body"]["plan"]["arena_size"] += 64  # still valid JSON: the checksum catches it
    (path / "meta.json").write_text(json.dumps(meta))


def corrupt_constants(path: Path) -> None:
    with open(path / "constants.bin", "r+b") as f:
        f.write(b"\xff\xff")


@pytest.mark.parametrize("damage", [corrupt_code, corrupt_json, tamper_json, corrupt_constants,
                                    lambda p: (p / "code0.o").unlink()])
def test_corrupt_entry_is_discarded_and_rebuilt(tmp_path, damage) -> None:
    disk, key = DiskCache(tmp_path), "cd" * 32
    stats = CacheStats()
    get_or_build(key, build_handmade, load_handmade, disk=disk, stats=stats)
    cache_mod.wait_for_writes()  # the entry is written while the program runs
    damage(disk.path(key))
    exe = get_or_build(key, build_handmade, load_handmade, disk=disk, stats=stats)
    assert stats.builds == 2 and disk.discarded == 1
    np.testing.assert_array_equal(exe(np.zeros(8, np.float32))[0], C)
    assert disk.load(key) is not None  # the rebuilt entry is whole again
    assert sorted(p.name for p in disk.path(key).parent.iterdir()) == [key]


def test_interrupted_write_leaves_no_partial_entry(tmp_path, monkeypatch) -> None:
    disk, key = DiskCache(tmp_path), "ef" * 32
    real_write = cache_mod._write_file

    def dying_write(path: Path, data) -> None:
        if path.name == "meta.json":
            real_write(path, b'{"checksum": "trunc')  # half written, then the process "dies"
            raise KeyboardInterrupt
        real_write(path, data)

    monkeypatch.setattr(cache_mod, "_write_file", dying_write)
    with pytest.raises(KeyboardInterrupt):
        disk.store(key, build_handmade())
    assert not disk.path(key).exists()
    assert list(disk.path(key).parent.iterdir()) == []  # the temp folder is gone too
    # A process killed outright leaves its temp folder; it is never taken for an entry.
    (disk.path(key).parent / ".tmp-killed").mkdir()
    assert disk.load(key) is None
    monkeypatch.setattr(cache_mod, "_write_file", real_write)
    disk.store(key, build_handmade())
    assert disk.load(key) is not None


def test_a_fresh_entry_is_written_while_the_program_runs(tmp_path, monkeypatch) -> None:
    disk, key = DiskCache(tmp_path), "23" * 32
    release, real_write = threading.Event(), cache_mod._write_file

    def slow_write(path: Path, data) -> None:
        assert release.wait(60)
        real_write(path, data)

    monkeypatch.setattr(cache_mod, "_write_file", slow_write)
    exe = get_or_build(key, build_handmade, load_handmade, disk=disk)
    np.testing.assert_array_equal(exe(np.zeros(8, np.float32))[0], C)  # before the entry
    assert not disk.path(key).exists()
    release.set()
    assert disk.load(key) is not None  # this process's lookup waits for the write
    cache_mod.wait_for_writes()


def test_store_keeps_an_entry_another_process_wrote(tmp_path) -> None:
    disk, key = DiskCache(tmp_path), "01" * 32
    first = build_handmade()
    disk.store(key, first)
    second = build_handmade()
    second.extra = {"writer": 2}
    disk.store(key, second)
    assert disk.load(key).extra == {}
    assert [p.name for p in disk.path(key).parent.iterdir()] == [key]


def test_memory_cache_hits_and_evicts(tmp_path) -> None:
    memory, stats, loads = MemoryCache(max_entries=2), CacheStats(), []

    def load(artifact):
        loads.append(artifact)
        return load_handmade(artifact)

    a = get_or_build("a", build_handmade, load, memory=memory, stats=stats)
    assert get_or_build("a", build_handmade, load, memory=memory, stats=stats) is a
    assert stats.builds == 1 and stats.memory_hits == 1 and len(loads) == 1
    get_or_build("b", build_handmade, load, memory=memory, stats=stats)
    get_or_build("c", build_handmade, load, memory=memory, stats=stats)
    assert memory.get("a") is None and memory.get("c") is not None


CHILD = """
import json, sys
import numpy as np
from ember import Config
from ember.driver.keys import cache_key
from ember.driver.pipeline import resolve
from ember.runtime.cache import CacheStats, DiskCache, get_or_build
from tests.runtime import test_cache as t

key = cache_key(t.graph(), t.SIGNATURE, resolve(Config()))
stats = CacheStats()
exe = get_or_build(key, t.build_handmade, t.load_handmade, disk=DiskCache(), stats=stats)
y = exe(np.ones(8, np.float32))[0]
print(json.dumps({"key": key, "builds": stats.builds, "disk_hits": stats.disk_hits,
                  "y": y.tolist()}))
"""


def run_child(code: str, cache: Path) -> dict:
    env = {**os.environ, "EMBER_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_second_process_loads_from_disk(tmp_path) -> None:
    cold, warm = run_child(CHILD, tmp_path), run_child(CHILD, tmp_path)
    assert cold["builds"] == 1 and cold["disk_hits"] == 0
    assert warm["builds"] == 0 and warm["disk_hits"] == 1
    assert cold["key"] == warm["key"] and cold["y"] == warm["y"] == (1 + C).tolist()


REAL_CHILD = """
import json, sys
import numpy as np
from ember import Config, interpret
from ember.driver.keys import cache_key
from ember.driver.pipeline import resolve
from ember.runtime.cache import CacheStats, DiskCache, get_or_build
from ember.runtime.executable import build_artifact, load_artifact
from tests.runtime import test_cache as t

g = t.graph()
def build():
    from ember.loops.lower.program import lower_graph
    return build_artifact(lower_graph(g, t.HOST), t.HOST)

stats = CacheStats()
exe = get_or_build(cache_key(g, t.SIGNATURE, resolve(Config())), build,
                   lambda artifact: load_artifact(artifact, t.HOST),
                   disk=DiskCache(), stats=stats)
x = np.linspace(-1, 1, 8, dtype=np.float32)
print(json.dumps({"builds": stats.builds, "disk_hits": stats.disk_hits,
                  "lowered": "ember.loops.lower" in sys.modules,
                  "equal": bool((exe(x)[0] == interpret(g, [x])[0]).all())}))
"""


def test_second_process_skips_lowering_and_llvm(tmp_path) -> None:
    pytest.importorskip("ember.codegen.cpu")
    cold, warm = run_child(REAL_CHILD, tmp_path), run_child(REAL_CHILD, tmp_path)
    assert cold == {"builds": 1, "disk_hits": 0, "lowered": True, "equal": True}
    assert warm == {"builds": 0, "disk_hits": 1, "lowered": False, "equal": True}


def test_large_buffers_are_hashed_and_checked_on_threads_as_in_line() -> None:
    """digest_each (a module's weights for its fingerprint) and bytes_check (an entry's
    constants) give on threads what they give in line, BLAKE3's digests of the bytes of
    any dtype, and a flipped byte anywhere or a cut-short buffer changes the check."""
    from blake3 import blake3

    from ember.util.keys import bytes_check, digest_each

    rng = np.random.default_rng(0)
    buffers = [rng.bytes(n) for n in (0, 10, 3 << 20, 5 << 20)]
    expected = [blake3(b).digest() for b in buffers]
    assert digest_each(buffers, 1) == digest_each(buffers, 4) == expected
    floats = rng.standard_normal(1 << 19).astype(np.float32)
    assert digest_each([floats], 2) == [blake3(floats.tobytes()).digest()]
    blob = np.frombuffer(rng.bytes((40 << 20) + 3), np.uint8).copy()
    check = bytes_check(blob, 4)
    assert check == bytes_check(blob, 1) and check.startswith("blake3:")
    for position in (0, (20 << 20) + 1, blob.size - 1):
        blob[position] ^= 1
        assert bytes_check(blob, 4) != check
        blob[position] ^= 1
    assert bytes_check(blob[:-1], 4) != check
