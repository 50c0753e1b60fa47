"""A model's schedules print, save and replay: every tunable kernel's parameters (a
matmul's tile and blocks, a conv's, an attention kernel's, a pool's) are written out by a
compile, and given back they give exactly that code; edited, they give the edited one."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import ember
from ember.codegen.cpu import llvm_ir_text
from ember.codegen.llvm import program_module
from ember.driver.pipeline import lower_to_program, resolve
from ember.loops.ir import For
from ember.loops.text import print_program

RNG = np.random.default_rng(7)


def model() -> ember.Graph:
    """A conv, a depthwise conv and a pool (knob kernels), a matmul and attention."""
    b = ember.Builder("scheduled")
    x = b.input("x", "f32", (1, 8, 16, 16))
    w = b.constant((RNG.standard_normal((16, 8, 3, 3)) / 8).astype(np.float32))
    y = b.relu(b.op("conv", [x, w], {"pads": (1, 1, 1, 1)}).result)
    dw = b.constant((RNG.standard_normal((16, 1, 3, 3)) / 3).astype(np.float32))
    y = b.op("conv", [y, dw], {"pads": (1, 1, 1, 1), "groups": 16}).result
    y = b.op("max_pool", [y], {"kernel": (2, 2), "strides": (2, 2)}).result  # [1,16,8,8]
    t = b.reshape(y, shape=(16, 64))
    q = b.matmul(t, b.constant((RNG.standard_normal((64, 64)) / 8).astype(np.float32)))
    kt = b.reshape(b.transpose(q, perm=(1, 0)), shape=(1, 64, 16))
    att = b.op("attention", [b.reshape(q, shape=(1, 16, 64)), kt, b.reshape(q, shape=(1, 16, 64))],
               {"empty_rows_zero": False}).result
    b.output(att)
    return b.build()


def llvm_ir(graph, config) -> tuple[str, dict]:
    chosen: dict = {}
    config = resolve(config)
    program, plan = lower_to_program(graph, config, schedules=chosen)
    return llvm_ir_text(program_module(program, plan.offsets), config.target,
                        optimized=False), chosen


CPU = ember.Config(executor="cpu", disk_cache=False)


def test_every_tunable_kernel_has_its_schedule_written_out() -> None:
    _, chosen = llvm_ir(model(), CPU)
    classes = {key.split("/", 1)[0] for key in chosen}
    assert {"gemm", "conv_gemm", "depthwise_conv", "pool", "attention"} <= classes, chosen
    gemm = next(r for k, r in chosen.items() if k.startswith("gemm/"))
    assert {"mr", "nr", "kc", "mc", "nc"} <= set(gemm["schedule"])


def test_schedules_given_back_give_byte_identical_llvm_ir(tmp_path) -> None:
    graph = model()
    first, chosen = llvm_ir(graph, CPU)
    path = tmp_path / "schedules.json"
    path.write_text(json.dumps(chosen))
    replayed, again = llvm_ir(graph, ember.Config(executor="cpu", disk_cache=False,
                                                  schedules=str(path)))
    assert replayed == first and again == chosen


def test_an_edited_schedule_gives_that_code(tmp_path) -> None:
    """A matmul tile of 4 rows and one vector instead of the default: the micro-kernel's
    shape changes, and the results stay right."""
    graph = model()
    first, chosen = llvm_ir(graph, CPU)
    key = next(k for k in chosen if k.startswith("gemm/"))
    lanes = resolve(CPU).target.lanes()
    chosen[key]["schedule"].update(mr=4, nr=lanes)
    chosen_attention = next(k for k in chosen if k.startswith("attention/"))
    chosen[chosen_attention]["schedule"]["row_group"] = 2
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(chosen))
    config = ember.Config(executor="cpu", disk_cache=False, schedules=str(path))
    # The two edited kernels' loop nests changed: their primitives, written for the old
    # nests, give way to the default schedule, with a warning each.
    with pytest.warns(UserWarning, match="written for another loop nest") as warned:
        edited, again = llvm_ir(graph, config)
    assert len(warned) == 2
    assert edited != first
    changed = {k for k in chosen if again[k] != chosen[k]}
    assert len(changed) == 2 and all(k.startswith("kernel/") for k in changed)
    with pytest.warns(UserWarning, match="written for another loop nest"):
        program, _ = lower_to_program(graph, resolve(config))
        compiled = ember.compile(graph, config=config)
    text = print_program(program)
    assert f"f32[4,{lanes}]" in text  # the edited register tile
    x = RNG.standard_normal((1, 8, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(compiled(x)[0], ember.interpret(graph, [x])[0], rtol=1e-4,
                               atol=1e-4)


def test_an_edited_conv_schedule_gives_that_code(tmp_path) -> None:
    """The conv's implicit GEMM is a scheduling step too: its record (the tile and blocks,
    fitted to the conv when the step is made) edited to a tile of 2 rows gives that tile."""
    graph = model()
    _, chosen = llvm_ir(graph, CPU)
    key = next(k for k in chosen if k.startswith("conv_gemm/"))
    assert set(chosen[key]["schedule"]) == {"mr", "nr", "mc", "nc", "parallel"}
    chosen[key]["schedule"]["mr"] = 2
    path = tmp_path / "conv.json"
    path.write_text(json.dumps(chosen))
    config = ember.Config(executor="cpu", disk_cache=False, schedules=str(path))
    with pytest.warns(UserWarning, match="written for another loop nest"):
        program, _ = lower_to_program(graph, resolve(config))
        compiled = ember.compile(graph, config=config)
    conv = next(k for k in program.kernels if k.name.endswith("_conv_max"))  # conv + relu
    nr = chosen[key]["schedule"]["nr"]
    assert any(b.shape == (2, nr) for b in conv.locals), conv.locals
    x = RNG.standard_normal((1, 8, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(compiled(x)[0], ember.interpret(graph, [x])[0], rtol=1e-4,
                               atol=1e-4)


def test_edited_primitives_give_that_code_and_are_checked(tmp_path) -> None:
    """A kernel's schedule as primitives: dropping the vectorization of an elementwise
    kernel gives serial code that computes the same; a primitive that cannot apply is an
    error naming the step."""
    b = ember.Builder("scaled")
    x = b.input("x", "f32", (64, 100))
    b.output(b.exp(b.mul(x, b.constant(np.float32(0.5)))))
    graph = b.build()
    first, chosen = llvm_ir(graph, CPU)
    key = next(k for k in chosen if k.startswith("kernel/"))
    steps = chosen[key]["steps"]
    assert ["vectorize_blocks"] == [s[0] for s in steps if s[0].startswith("vector")], steps
    chosen[key]["steps"] = [s for s in steps if s[0] != "vectorize_blocks"]
    path = tmp_path / "serial.json"
    path.write_text(json.dumps(chosen))
    config = ember.Config(executor="cpu", disk_cache=False, schedules=str(path))
    serial, again = llvm_ir(graph, config)
    assert serial != first and again == chosen
    program, _ = lower_to_program(graph, resolve(config))
    assert "vectorized" not in {s.kind for k in program.kernels for s in k.walk()
                                if isinstance(s, For)}
    data = RNG.standard_normal((64, 100)).astype(np.float32)
    np.testing.assert_allclose(ember.compile(graph, config=config)(data)[0],
                               np.exp(data * 0.5), rtol=1e-6)
    chosen[key]["steps"] = [["unroll", "nosuchloop"]]
    path.write_text(json.dumps(chosen))
    with pytest.raises(ember.EmberError, match=r"step 1 \(unroll nosuchloop\).*no loop"):
        llvm_ir(graph, config)


def test_a_bad_schedules_file_is_a_clear_error(tmp_path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("[1, 2]")
    with pytest.raises(ember.EmberError, match="maps kernel keys to records"):
        lower_to_program(model(), ember.Config(executor="cpu", schedules=str(path)))


def test_ember_lower_prints_and_takes_the_schedules(tmp_path) -> None:
    ir = tmp_path / "model.ir"
    ir.write_text(ember.print_graph(model()))
    out = tmp_path / "schedules.json"
    run = [sys.executable, "-m", "ember", "lower", str(ir)]
    shown = subprocess.run([*run, "--schedule"], capture_output=True, text=True, check=True)
    assert "// schedules" in shown.stdout and '"gemm/' in shown.stdout
    subprocess.run([*run, "--schedule", str(out)], capture_output=True, text=True, check=True)
    given = subprocess.run([*run, "--schedules", str(out)], capture_output=True, text=True,
                           check=True)
    assert given.stdout == shown.stdout.split("// schedules")[0]
