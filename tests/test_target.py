"""`ember.Target` (ember/target.py): the host described from its features, the presets'
facts consistent with each other, names resolved (aliases, unknown names refused at
construction), a key that changes with every fact, and no module but the target module
and the driver asking what the host is."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import llvmlite.binding as llvm
import pytest

import ember
from ember.driver.pipeline import resolve
from ember.dtypes import DType
from ember.target import ALIASES, PRESETS, Target, TargetError

HOST = Target.host()
CPU_PRESETS = [name for name, t in PRESETS.items() if t.kind == "cpu"]
EMBER = Path(ember.__file__).parent


# -- the host ------------------------------------------------------------------------------
def test_host_has_the_process_triple_and_is_named_host() -> None:
    """The host's triple is LLVM's process triple; its name is "host"."""
    assert HOST.name == "host"
    assert HOST.triple == llvm.get_process_triple()
    assert HOST.kind == "cpu" and HOST.runs_here()


def test_host_vector_width_follows_its_features() -> None:
    """On x86 the vectors are 512 bits iff the host has AVX-512F, else 256 with AVX."""
    if HOST.arch == "x86_64":
        want = 512 if "avx512f" in HOST.features else 256 if "avx" in HOST.features else 128
        assert HOST.vector_bits == want
        assert HOST.vector_registers == (32 if "avx512f" in HOST.features else 16)
    else:
        assert HOST.vector_bits == 128 and HOST.vector_registers == 32


def test_host_features_are_those_llvm_reports_on() -> None:
    """Features are the ones the processor reports on, and the rest are disabled."""
    reported = llvm.get_host_cpu_features()
    assert set(HOST.features) == {f for f, on in reported.items() if on}
    assert set(HOST.disabled) == {f for f, on in reported.items() if not on}
    assert list(HOST.features) == sorted(HOST.features)


@pytest.mark.parametrize("dtype, size", [(DType.f64, 8), (DType.f32, 4), (DType.f16, 2),
                                         (DType.bf16, 2), (DType.i8, 1)])
def test_host_lanes_follow_its_vector_width(dtype, size) -> None:
    """lanes(dtype) is the vector width over the dtype's bits."""
    assert HOST.lanes(dtype) == HOST.vector_bits // (8 * size)


def test_host_has_cores_and_caches() -> None:
    """At least one core, and positive cache sizes."""
    assert HOST.cores >= 1
    assert HOST.l1d_bytes > 0 and HOST.l2_bytes > 0
    assert HOST.l3_bytes > 0 or HOST.arch != "x86_64"  # some Arm parts have no L3
    assert HOST.l1d_bytes < HOST.l2_bytes
    assert HOST.fma_units >= 1 and HOST.fma_latency >= 1


def test_fma_probe_sees_pipelined_units_and_their_latency() -> None:
    """A dependent chain of FMAs waits out each one's latency; independent chains overlap:
    more than two FMAs are in flight on any pipelined vector unit, and a dependent FMA
    takes a few cycles of the clock that a chain of integer adds measures (three to six
    on every x86 and Arm core of this decade): whole numbers on the host."""
    from ember import target as target_module

    host = Target.host()
    chains = target_module.probe_chains(host.vector_registers)
    in_flight, cycles = target_module._fma_timing(host.triple, host.vector_bits, chains)
    assert in_flight > 2 and 2.5 < cycles < 7
    assert 1 <= host.fma_units <= 4 and 3 <= host.fma_latency <= 6


@pytest.mark.parametrize("name", ["znver3", "znver4", "sapphirerapids", "neoverse-n1"])
def test_fma_probe_keeps_its_chains_in_registers(name) -> None:
    """The probe's independent chains fit the vector registers with the constant: a
    spilled accumulator would time the stack (16 chains on AVX2's 16 registers measured
    one FMA unit on a Zen 3, which has two)."""
    import llvmlite.binding as llvm

    from ember import target as target_module

    target = Target.named(name)
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    chains = target_module.probe_chains(target.vector_registers)
    module = target_module.fma_probe_module(target.triple, target.vector_bits, chains)
    machine = llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.cpu, features=",".join(f"+{f}" for f in target.features), opt=2)
    asm = machine.emit_assembly(llvm.parse_assembly(str(module)))
    stack = "sp]" if target.arch == "aarch64" else "(%rsp)"
    assert stack not in asm
    assert chains >= target.fma_units * target.fma_latency  # it can see every unit
    # The clock's adds add a register: Golden Cove folds adds of constants at rename.
    clock = asm[asm.index("adds:"):]
    if target.arch == "x86_64":
        assert len(re.findall(r"\badd[qx]?\s+%", clock)) >= target_module._CLOCK_ADDS


def test_fma_facts_are_measured_once_per_machine(tmp_path, monkeypatch) -> None:
    """The measured units and latency are kept in the cache folder and read back (every
    process, so every cache key, sees one figure); another machine's entry is measured
    anew; without a JIT the nearest preset's figures stand."""
    from ember import target as target_module

    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(target_module, "_fma_timing",
                        lambda triple, bits, chains: calls.append(bits) or (9.8, 4.9))
    features = {"avx2", "fma"}
    triple = "x86_64-unknown-linux-gnu"
    assert target_module._fma_facts(triple, "cpu", features, 256, 16, 1, 4) == (2, 5)
    assert target_module._fma_facts(triple, "cpu", features, 256, 16, 1, 4) == (2, 5)
    assert calls == [256]
    assert target_module._fma_facts(triple, "cpu", features, 512, 32, 1, 4) == (2, 5)
    assert calls == [256, 512]

    def no_jit(triple, bits, chains):
        raise RuntimeError("no JIT here")

    monkeypatch.setattr(target_module, "_fma_timing", no_jit)
    (tmp_path / "host-target.json").unlink()
    assert target_module._fma_facts(triple, "cpu", features, 256, 16, 3, 4) == (3, 4)


# -- presets -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CPU_PRESETS)
def test_cpu_preset_facts_are_consistent(name) -> None:
    """Each CPU preset: lanes from its width, 16 or 32 registers, its own features, caches."""
    t = Target.named(name)
    assert t.name == name and Target.get(name) is t
    assert t.lanes(DType.f32) * 32 == t.vector_bits
    assert t.lanes(DType.f64) * 64 == t.vector_bits
    assert t.vector_bits in (128, 256, 512)
    assert t.vector_registers in (16, 32)
    assert t.fma_units >= 1 and t.fma_latency >= 1 and t.cores >= 1
    assert 0 < t.l1d_bytes < t.l2_bytes
    assert list(t.features) == sorted(t.features) and t.features
    if t.arch == "x86_64":
        assert t.has("avx2") and t.has("fma")
        assert (t.vector_bits == 512) == t.has("avx512f")
        assert (t.vector_registers == 32) == t.has("avx512f")
        assert t.cc == "cc"
    else:
        assert t.arch == "aarch64" and t.has("neon") and t.vector_bits == 128
        assert t.cc == "aarch64-linux-gnu-gcc"


@pytest.mark.parametrize("name", CPU_PRESETS)
def test_cpu_preset_feature_string_is_llvm_syntax(name) -> None:
    """feature_string is '+f' for each feature, comma separated."""
    t = Target.named(name)
    assert t.feature_string.split(",") == [f"+{f}" for f in t.features]


@pytest.mark.parametrize("spec", ["host", None, "", "native"])
def test_get_host_names_give_the_host(spec) -> None:
    """"host", None, "" and "native" all name this machine."""
    assert Target.get(spec) == HOST


def test_get_passes_a_target_through() -> None:
    """A Target given to get is returned as it is."""
    synthetic = Target.named("znver3").with_(name="mine", cores=3)
    assert Target.get(synthetic) is synthetic


@pytest.mark.parametrize("alias", ["arm64", "aarch64"])
def test_aliases_give_the_aarch64_preset(alias) -> None:
    """arm64 and aarch64 are the aarch64-linux-gnu preset."""
    assert ALIASES[alias] == "aarch64-linux-gnu"
    assert Target.get(alias) is PRESETS["aarch64-linux-gnu"]


def test_unknown_target_names_the_known_ones() -> None:
    """An unknown name raises TargetError listing host and every preset."""
    with pytest.raises(TargetError) as info:
        Target.get("pdp11")
    message = str(info.value)
    assert "unknown target 'pdp11'" in message
    for known in ("host", *PRESETS):
        assert known in message
    with pytest.raises(TargetError, match="known: host"):
        Target.named("host")  # named() is for presets only; get() knows "host"


def test_config_with_unknown_target_fails_at_construction() -> None:
    """Config(target="nonsense") raises before any compile."""
    with pytest.raises(TargetError, match="unknown target 'nonsense'"):
        ember.Config(target="nonsense")


def test_config_resolves_names_to_targets() -> None:
    """resolve(Config) turns names, aliases and None into Targets."""
    assert resolve(ember.Config(target="arm64")).target is PRESETS["aarch64-linux-gnu"]
    assert resolve(ember.Config()).target == HOST
    synthetic = HOST.with_(name="synthetic", vector_bits=256)
    config = ember.Config(target=synthetic)
    assert resolve(config) is config


# -- keys ----------------------------------------------------------------------------------
def _changed(value):
    """A different value of the same type as `value`."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 2 + 1
    if isinstance(value, tuple):
        return (*value, "extra")
    return value + "-other"


KEY_FIELDS = [f.name for f in dataclasses.fields(Target) if f.compare]


@pytest.mark.parametrize("field", KEY_FIELDS)
def test_key_differs_when_any_fact_differs(field) -> None:
    """Changing one fact (with_) changes the key."""
    base = Target.named("znver3")
    other = base.with_(**{field: _changed(getattr(base, field))})
    assert other != base
    assert other.key() != base.key()


def test_key_is_stable_and_names_the_target() -> None:
    """Equal targets have equal keys: the same value from call to call and copy to copy."""
    base = Target.named("znver4")
    assert base.key() == base.key() == base.with_().key()
    assert base.key().startswith("znver4-")
    assert base.with_(cc="clang").key() == base.key()  # the linker does not change code
    assert len({Target.named(n).key() for n in PRESETS}) == len(PRESETS)


# -- no host discovery outside the target module and the driver ----------------------------
HOST_QUERIES = {"get_host_cpu_name", "get_host_cpu_features", "get_process_triple", "_host"}
ALLOWED = ("target.py", "driver/")


def host_queries(source: str) -> list[tuple[int, str]]:
    """(line, call) for each call in `source` that asks what the host is."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else \
            func.id if isinstance(func, ast.Name) else None
        if name == "host" and isinstance(func, ast.Attribute) and \
                isinstance(func.value, ast.Name) and func.value.id == "Target":
            found.append((node.lineno, "Target.host()"))
        elif name in HOST_QUERIES:
            found.append((node.lineno, f"{name}()"))
    return found


def test_host_query_scan_sees_calls_and_not_comments() -> None:
    """The scan finds real calls, aliased or not, and ignores comments, strings, is_host."""
    source = '''
"""Target.host() in a docstring"""
# get_process_triple() in a comment
import llvmlite.binding as llvm
from ember.target import Target, _host, is_host
x = Target.host()
y = llvm.get_host_cpu_features()
z = _host()
w = is_host("host")
s = "get_host_cpu_name()"
'''
    assert host_queries(source) == [(6, "Target.host()"), (7, "get_host_cpu_features()"),
                                    (8, "_host()")]


def test_only_the_target_module_and_the_driver_ask_what_the_host_is() -> None:
    """No module under ember/ but target.py and driver/ calls a host query."""
    assert host_queries((EMBER / "target.py").read_text())  # the scan sees the real ones
    violations = []
    for path in sorted(EMBER.rglob("*.py")):
        relative = path.relative_to(EMBER).as_posix()
        if relative == ALLOWED[0] or relative.startswith(ALLOWED[1]):
            continue
        for line, call in host_queries(path.read_text()):
            violations.append(f"ember/{relative}:{line}: {call}")
    assert not violations, "host discovery outside ember/target.py and ember/driver/:\n" + \
        "\n".join(violations)
