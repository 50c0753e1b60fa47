"""The warm path of ember.compile(module) (ember/frontends/torch/fingerprint.py): a module
compiled before, in this process or another, loads its machine code by its fingerprint
without being traced; anything that changes the traced graph changes the fingerprint."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import ember
from ember.api import torch_module
from ember.frontends.torch import export as export_module
from ember.frontends.torch.fingerprint import _entry_path, module_fingerprint

CPU = ember.Config(executor="cpu")


class Net(torch.nn.Module):
    def __init__(self, scale: float = 2.0):
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)
        self.scale = scale

    def forward(self, x):
        return torch.relu(self.linear(x)) * self.scale


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def traces(monkeypatch):
    """How many times modules were traced (torch.export) from now on."""
    count = [0]
    original = export_module.capture_program

    def counting(*args, **kwargs):
        count[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(export_module, "capture_program", counting)
    return count


def compiled_output(model, x):
    with torch.no_grad():
        return ember.compile(model, (x,), config=CPU)(x)


def test_second_compile_loads_without_tracing(traces) -> None:
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(3, 8)
    first = compiled_output(model, x)
    assert traces[0] == 1
    second = compiled_output(model, x)  # a new CompiledModule: the fingerprint finds it
    assert traces[0] == 1
    torch.testing.assert_close(second, first)
    torch.testing.assert_close(second, model(x).detach(), rtol=1e-5, atol=1e-6)


def test_what_changes_the_graph_changes_the_fingerprint(traces) -> None:
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(3, 8)
    compiled_output(model, x)
    with torch.no_grad():
        model.linear.weight[0, 0] += 1.0  # new weights
    torch.testing.assert_close(compiled_output(model, x), model(x).detach(), rtol=1e-5,
                               atol=1e-6)
    assert traces[0] == 2
    model.scale = 3.0  # a plain attribute forward reads
    torch.testing.assert_close(compiled_output(model, x), model(x).detach(), rtol=1e-5,
                               atol=1e-6)
    assert traces[0] == 3
    compiled_output(model, torch.randn(5, 8))  # another signature
    assert traces[0] == 4


def test_modules_it_cannot_vouch_for_have_no_fingerprint() -> None:
    model = Net().eval()
    signature = ("spec", ("torch.float32", (3, 8)))
    assert module_fingerprint(model, signature, CPU) is not None
    model.opaque = object()  # prints as an address: its state is unknown
    assert module_fingerprint(model, signature, CPU) is None
    del model.opaque
    model.linear.register_forward_hook(lambda *args: None)
    assert module_fingerprint(model, signature, CPU) is None


def test_corrupt_index_entry_is_traced_again(traces) -> None:
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(3, 8)
    compiled_output(model, x)
    entries = list(_entry_path("00").parent.parent.rglob("*.json"))
    assert len(entries) == 1
    entries[0].write_text(entries[0].read_text().replace('"graph": "', '"graph": "0'))
    torch.testing.assert_close(compiled_output(model, x), model(x).detach(), rtol=1e-5,
                               atol=1e-6)
    assert traces[0] == 2


def test_no_disk_cache_no_fingerprint(traces) -> None:
    model, x = Net().eval(), torch.randn(3, 8)
    config = ember.Config(executor="cpu", disk_cache=False)
    for _ in range(2):
        with torch.no_grad():
            ember.compile(model, (x,), config=config)(x)
    assert traces[0] == 2
    assert torch_module.CompiledModule(model, config, False)._fingerprint((x,), {}) is None


def test_a_new_process_starts_warm(cache) -> None:
    """The same module in a fresh process: loaded by its fingerprint, never traced."""
    script = textwrap.dedent(f"""
        import sys, torch, ember
        sys.path.insert(0, {str(__import__('pathlib').Path(__file__).parent)!r})
        from ember.frontends.torch import export
        from test_warm_cache import Net
        torch.manual_seed(0)
        model, x = Net().eval(), torch.randn(3, 8)
        traced = []
        original = export.capture_program
        export.capture_program = lambda *a, **k: traced.append(1) or original(*a, **k)
        with torch.no_grad():
            y = ember.compile(model, (x,), config=ember.Config(executor="cpu"))(x)
        torch.testing.assert_close(y, model(x).detach(), rtol=1e-5, atol=1e-6)
        print(len(traced))
    """)
    env = {"EMBER_CACHE_DIR": str(cache), "PATH": "/usr/bin:/bin"}
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           env=env, timeout=300) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    assert [run.stdout.split()[-1] for run in runs] == ["1", "0"]


STDIN_MODULE = """
import torch, ember
class Net(torch.nn.Module):
    def forward(self, x):
        return x * {k}
x = torch.ones(3)
print(ember.compile(Net(), (x,), config=ember.Config(executor="cpu"))(x).tolist())
"""

EXEC_MODULE = """
import sys, torch, ember
source = "class Net(torch.nn.Module):\\n    def forward(self, x):\\n        return x * SCALE\\n"
namespace = {{"torch": torch, "SCALE": {k}.0}}
exec(source, namespace)
x = torch.ones(3)
print(ember.compile(namespace["Net"](), (x,), config=ember.Config(executor="cpu"))(x).tolist())
"""


@pytest.mark.parametrize("template, how", [(STDIN_MODULE, "stdin"), (EXEC_MODULE, "exec")])
def test_modules_without_a_source_file_get_their_own_code(cache, template, how) -> None:
    """Two processes whose modules differ only in their code (read from standard input) or
    in a global's value (a class made by exec): each gets its own results, though the
    class names, files (none) and signatures are the same; a third, like the first, finds
    the first one's code."""
    env = {"EMBER_CACHE_DIR": str(cache), "PATH": "/usr/bin:/bin"}
    results = []
    for k in (2, 5, 2):
        code = template.format(k=k)
        args = [sys.executable, "-"] if how == "stdin" else [sys.executable, "-c", code]
        run = subprocess.run(args, input=code if how == "stdin" else None,
                             capture_output=True, text=True, env=env, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        results.append(run.stdout.split("\n")[-2])
    assert results == ["[2.0, 2.0, 2.0]", "[5.0, 5.0, 5.0]", "[2.0, 2.0, 2.0]"]
    assert len(list(cache.glob("modules/*/*.json"))) == 2


def _helper_module(body: str) -> type:
    """A Net whose forward calls a helper that calls another, defined by exec."""
    namespace = {"torch": torch}
    exec("def inner(x):\n    return " + body + "\n"
         "def outer(x):\n    return inner(x) + 1\n"
         "class Net(torch.nn.Module):\n"
         "    def __init__(self):\n        super().__init__()\n        self._gain = 2.0\n"
         "    def forward(self, x):\n        return outer(x) * self._gain\n", namespace)
    return namespace["Net"]


def test_what_the_code_reaches_is_in_the_fingerprint() -> None:
    """Code two calls away, a private attribute forward reads, and a closure's value all
    change the fingerprint; the same code and values give the same one."""
    signature = ("spec", ("torch.float32", (3, 8)))
    first, same = _helper_module("x * 3")(), _helper_module("x * 3")()
    assert module_fingerprint(first, signature, CPU) == module_fingerprint(same, signature, CPU)
    assert module_fingerprint(_helper_module("x * 4")(), signature, CPU) != \
        module_fingerprint(first, signature, CPU)
    changed = _helper_module("x * 3")()
    changed._gain = 3.0
    assert module_fingerprint(changed, signature, CPU) != module_fingerprint(first, signature,
                                                                              CPU)

    def scaled(k):
        class Scaled(torch.nn.Module):
            def forward(self, x):
                return x * k
        return Scaled()

    assert module_fingerprint(scaled(2), signature, CPU) != \
        module_fingerprint(scaled(3), signature, CPU)
    assert module_fingerprint(scaled(2), signature, CPU) == \
        module_fingerprint(scaled(2), signature, CPU)


def test_a_module_reached_outside_the_submodules_has_no_fingerprint() -> None:
    """A forward that calls a module held in a global: its weights are not the module's
    parameters, so nothing vouches for them and the module is traced every time."""
    namespace = {"torch": torch, "ENCODER": torch.nn.Linear(8, 8)}
    exec("class Net(torch.nn.Module):\n    def forward(self, x):\n"
         "        return ENCODER(x)\n", namespace)
    assert module_fingerprint(namespace["Net"](), ("spec",), CPU) is None


def test_a_module_held_in_an_attribute_is_vouched_for_by_its_code_when_it_has_no_tensors(
        ) -> None:
    """Qwen2's attention keeps its rotary function as a parameterless module in a dict:
    its code and attributes are in the fingerprint (a change to them changes it); one that
    holds weights, which the fingerprint would not hash, leaves the module without one."""
    signature = ("spec", ("torch.float32", (3, 8)))
    model = Net().eval()
    model.functions = {"act": torch.nn.LeakyReLU(0.1)}
    first = module_fingerprint(model, signature, CPU)
    assert first is not None
    model.functions = {"act": torch.nn.LeakyReLU(0.2)}
    assert module_fingerprint(model, signature, CPU) not in (None, first)
    model.functions = {"act": torch.nn.Linear(8, 8)}
    assert module_fingerprint(model, signature, CPU) is None


def test_weights_hashed_for_the_fingerprint_are_not_hashed_again(monkeypatch) -> None:
    """The graph key of a traced module reuses the digests its fingerprint computed for
    the weights (`digests_known`), and is the key computed from the bytes themselves."""
    from ember.driver import keys
    from ember.driver.pipeline import resolve, signature
    from ember.explain import _latest_executable

    torch.manual_seed(3)
    model, x = Net().eval(), torch.randn(3, 8)
    hashed = []
    original = keys.digest_each
    monkeypatch.setattr(keys, "digest_each",
                        lambda buffers, workers: hashed.extend(buffers) or
                        original(buffers, workers))
    with torch.no_grad():
        compiled = ember.compile(model, (x,), config=CPU)
        compiled(x)
    assert hashed == []  # the weight and the bias: known from the fingerprint
    with torch.no_grad():
        graph = export_module.import_program(export_module.capture_program(model, (x,))[0])
    expected = keys.cache_key(graph, signature(graph), resolve(CPU))
    assert len(hashed) == 2  # outside a compile, hashed from their bytes
    assert _latest_executable(compiled).cache_key == expected


def test_a_tensor_changed_after_its_digest_is_hashed_again() -> None:
    from ember.frontends.torch.context import to_numpy
    from ember.util.keys import digests_known, known_digest, remember_digest

    weight = torch.randn(4, 4)
    with digests_known():
        remember_digest(weight, (weight._version, b"digest"))
        assert known_digest(to_numpy(weight)) == b"digest"
        weight.add_(1.0)  # a new version: its old digest is not taken
        assert known_digest(to_numpy(weight)) is None
    assert known_digest(weight) is None  # (only inside the scope)
