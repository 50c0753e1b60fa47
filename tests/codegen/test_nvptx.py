"""The GPU backend without a GPU: its schedule computes what the graph does (the scheduled
program run on this CPU, where a `threads` loop is a serial one, against the reference
interpreter), and every kernel it emits is PTX that ptxas assembles for sm_80 and sm_90
with no spills."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from llvmlite import ir

import ember
from ember import Builder, Config, DType, interpret
from ember.codegen import CodegenError, nvptx
from ember.driver.pipeline import lower_to_program
from ember.frontends.torch.export import export
from ember.graph.symbolic import SymbolicShapeError, symbol
from ember.loops.analysis import launches
from ember.loops.ir import For
from ember.loops.primitives import Schedule
from ember.loops.schedules.gpu import gpu_steps
from ember.loops.text import parse_kernel, print_kernel
from ember.runtime.executable import compile_program
from ember.target import Target

ARCHS = ("sm_80", "sm_90")
needs_ptxas = pytest.mark.skipif(nvptx.ptxas_path() is None,
                                 reason="ptxas is not installed (pip install nvidia-cuda-nvcc)")


class Block(torch.nn.Module):
    """A transformer-ish block and a conv stage: matmuls, layer norm, softmax, GELU's erf,
    a conv, pooling, a full mean."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(48, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x, image):
        h = torch.nn.functional.gelu(self.norm(self.proj(x)))
        attention = torch.softmax(h @ h.transpose(-1, -2) / 8.0, dim=-1) @ h
        pooled = torch.nn.functional.max_pool2d(torch.relu(self.conv(image)), 2)
        return attention + pooled.mean(), pooled.sin()


def block_graph():
    torch.manual_seed(0)
    args = (torch.randn(2, 6, 48), torch.randn(2, 3, 8, 8))
    return export(Block().eval(), args), [a.numpy() for a in args]


def math_graph():
    """Functions the GPU gets from libdevice (sin, lgamma, pow; f64 exp and tanh) beside
    those Ember computes inline (f32 exp, tanh)."""
    b = Builder("math")
    x = b.input("x", DType.f32, (64,))
    w = b.input("w", DType.f64, (64,))
    y = b.add(b.add(b.sin(x), b.lgamma(b.abs(x))), b.pow(b.abs(x), x))
    b.output(b.add(y, b.tanh(b.exp(x))), b.tanh(b.exp(w)))
    return b.build(), [np.linspace(-3, 3, 64, dtype=np.float32), np.linspace(-2, 2, 64)]


def loop_graph():
    """A graph loop with a condition computed on the device, carried arrays and an `if`."""
    b = Builder("loop")
    x = b.input("x", DType.f32, (32,))
    n = b.input("n", DType.i64, ())

    def body(bb, i, u, v):
        big = bb.gt(bb.reduce_max(u, axes=(0,)), bb.constant(np.array(50.0, np.float32)))
        u2, v2 = bb.if_(big, lambda tb: [u, v],
                        lambda eb: [eb.add(eb.mul(u, v), x), eb.tanh(eb.add(v, u))])
        return [bb.op("not", [big]).result, u2, v2]

    u, v = b.loop(n, b.constant(np.array(True)), [x, b.neg(x)], body)
    b.output(u, v)
    return b.build(), [np.linspace(0, 2, 32, dtype=np.float32), np.array(6, np.int64)]


GRAPHS = {"block": block_graph, "math": math_graph, "loop": loop_graph}


def gpu_program(graph, arch: str = "sm_90"):
    return lower_to_program(graph, Config(target=arch, disk_cache=False))[0]


# -- the schedule -------------------------------------------------------------------------

def test_an_elementwise_nest_is_one_launch_of_a_thread_per_element() -> None:
    kernel = parse_kernel("""kernel @scale(%x: f32[64,128], %y: f32[64,128]) {
  for %i = 0 to 64 {
    for %j = 0 to 128 {
      %y[%i, %j] = mul(%x[%i, %j], 2.0:f32)
    }
  }
}
""")
    scheduled, steps = gpu_steps(kernel)
    assert [str(s) for s in steps] == ["fuse i j", "threads i_j"]
    (top,) = scheduled.body
    assert isinstance(top, For) and top.kind == "threads" and top.stop.value == 64 * 128
    module, plan = nvptx.program_module(_program_of(scheduled))
    assert [(x.blocks, x.threads) for x in plan["scale"]] == [(32, 256)]


ROWS = """kernel @rows(%x: f32[100,64], %y: f32[100], %total: f32[]) {
  local %acc: f32[]
  for %i = 0 to 100 {
    %acc[] = 0.0:f32
    for %k = 0 to 64 {
      %acc[] = add(%acc[], %x[%i, %k])
    }
    %y[%i] = %acc[]
  }
  %acc[] = 0.0:f32
  for %i2 = 0 to 100 {
    %acc[] = add(%acc[], %y[%i2])
  }
  %total[] = %acc[]
}
"""


def test_rows_run_a_thread_each_and_a_sum_over_them_one_thread() -> None:
    scheduled, _ = gpu_steps(parse_kernel(ROWS))
    groups = launches(scheduled)
    assert [len(g) for g in groups] == [1, 3]  # the row loop; the sum's three statements
    assert groups[0][0].kind == "threads" and groups[1][1].kind == "serial"
    _, plan = nvptx.program_module(_program_of(scheduled))
    assert [(x.blocks, x.threads) for x in plan["rows"]] == [(1, 100), (1, 1)]


def test_a_local_carried_past_a_launch_keeps_its_runs_in_one_thread() -> None:
    # %acc is set before the elementwise loop and read after it: two single-thread runs
    # cannot share it (a launch's locals die with it), so the loop between runs serially.
    kernel = parse_kernel("""kernel @carry(%x: f32[64], %y: f32[64], %z: f32[]) {
  local %acc: f32[]
  %acc[] = %x[0]
  for %i = 0 to 64 {
    %y[%i] = neg(%x[%i])
  }
  %z[] = %acc[]
}
""")
    scheduled, steps = gpu_steps(kernel)
    assert len(launches(scheduled)) == 1
    assert "threads" not in print_kernel(scheduled)
    assert Schedule(steps).apply(kernel) == scheduled  # (the steps make what they say)


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_the_gpu_schedule_computes_what_the_graph_does(name: str) -> None:
    graph, inputs = GRAPHS[name]()
    program = gpu_program(graph)
    assert any(isinstance(s, For) and s.kind == "threads"
               for k in program.kernels for s in k.body)
    got = compile_program(program, Target.host())(*inputs)
    for g, w in zip(got, interpret(graph, inputs)):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)


# -- PTX ------------------------------------------------------------------------------------

@needs_ptxas
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_ptxas_assembles_every_kernel_without_spills(name: str, arch: str) -> None:
    graph, _ = GRAPHS[name]()
    program = gpu_program(graph, arch)
    ptx, plan = nvptx.program_ptx(program, Target.named(arch))
    assert f".target {arch}" in ptx and ".extern" not in ptx
    assembled = nvptx.assemble(ptx, arch)
    functions = {x.function for launches_ in plan.values() for x in launches_}
    assert set(assembled.registers) == functions
    assert all(count == 0 for count in assembled.spills.values()), assembled.spills
    assert max(assembled.registers.values()) <= 128


def test_math_the_gpu_lacks_comes_from_libdevice() -> None:
    if nvptx.libdevice_path() is None:
        pytest.skip("libdevice is not installed (pip install nvidia-nvvm)")
    module, _ = nvptx.program_module(gpu_program(math_graph()[0]))
    called = {fn.name for fn in module.functions if fn.is_declaration}
    assert {"__nv_sinf", "__nv_lgamma", "__nv_powf", "__nv_exp", "__nv_tanh"} <= called
    assert "__nv_expf" not in called  # f32 exp is Ember's own polynomial
    ptx = nvptx.module_ptx(module, Target.named("sm_90"))
    assert ".extern" not in ptx and "__nv_" not in ptx.split(".entry")[0]


def test_device_function_names() -> None:
    assert nvptx.device_function("expf") == "__nv_expf"
    assert nvptx.device_function("lgamma") == "__nv_lgamma"
    assert nvptx.device_function("llvm.exp.f32") == "__nv_expf"
    assert nvptx.device_function("llvm.pow.f64") == "__nv_pow"
    assert nvptx.device_function("llvm.fabs.f32") == "llvm.fabs.f32"


def test_an_intrinsic_nvptx_cannot_compile_is_refused_before_llvm_sees_it() -> None:
    module = ir.Module("m")
    ir.Function(module, ir.FunctionType(ir.FloatType(), [ir.FloatType()]), "llvm.sinh.f32")
    with pytest.raises(CodegenError, match="llvm.sinh.f32.*NVPTX cannot compile"):
        nvptx._check_intrinsics(module)


def test_ptx_calling_an_undefined_function_is_refused() -> None:
    module = ir.Module("m")
    f32 = ir.FloatType()
    missing = ir.Function(module, ir.FunctionType(f32, [f32]), "not_a_gpu_function")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.PointerType()]), "k")
    fn.calling_convention = "ptx_kernel"
    b = ir.IRBuilder(fn.append_basic_block())
    b.store(b.call(missing, [b.load(fn.args[0], typ=f32)]), fn.args[0])
    b.ret_void()
    with pytest.raises(CodegenError, match="not_a_gpu_function"):
        nvptx.module_ptx(module, Target.named("sm_90"))


def test_a_graph_of_sizes_known_at_call_time_is_compiled_per_shape() -> None:
    b = Builder("sized")
    x = b.input("x", DType.f32, (symbol("b"), 8))
    b.output(b.neg(x))
    program = lower_to_program(b.build(), Config(target="sm_90"), every_size=True)[0]
    with pytest.raises(SymbolicShapeError, match="one shape"):
        nvptx.program_module(program)


def test_compiling_for_the_gpu_needs_no_gpu_and_running_says_none_is_there() -> None:
    from ember.errors import DeviceError
    from ember.runtime import cuda

    graph, inputs = math_graph()
    run = ember.compile(graph, config=Config(target="sm_90", executor="cpu",
                                             disk_cache=False))
    try:
        cuda.driver()
    except DeviceError:
        pass
    else:
        pytest.skip("this machine has a CUDA driver and device")
    with pytest.raises(DeviceError, match="CUDA|cuda"):
        run(*inputs)


def _program_of(kernel):
    """A program of one call of `kernel`, its first parameter the input."""
    from ember.loops.ir import Call, Program, ProgramBuffer

    buffers = [ProgramBuffer(p, "input" if i == 0 else "output")
               for i, p in enumerate(kernel.params)]
    return Program(kernel.name, buffers, [kernel],
                   [Call(kernel.name, [p.name for p in kernel.params])])


@needs_ptxas
def test_a_small_transformer_exports_ptx_that_ptxas_accepts(tmp_path) -> None:
    import json
    import subprocess

    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                        use_cache=False)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 64, (1, 8))
    out = ember.export(model, (ids,), tmp_path, target="sm_90", name="gpt")
    manifest = json.loads((out / "gpt.json").read_text())
    ptx = (out / manifest["files"]["ptx"]).read_text()
    done = subprocess.run([nvptx.ptxas_path(), "-arch=sm_90", "-o", str(tmp_path / "x.cubin"),
                           str(out / "gpt.ptx")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    functions = {f for launches_ in manifest["launches"].values() for f, _, _ in launches_}
    assert functions == set(re.findall(r"\.entry (\w+)\(", ptx))
    assert (out / "gpt.cubin").stat().st_size > 0
    called = {step[1] for step in manifest["steps"]}
    assert called <= set(manifest["launches"])
    assert manifest["weights"]["bytes"] == (out / "weights.bin").stat().st_size
