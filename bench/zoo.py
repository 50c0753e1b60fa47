"""The model zoo: architectures from `transformers`, built from configs, as a new user would
bring them to Ember.

    python bench/zoo.py [--models bert,swin,...] [--threads 1,2] [--repeat 5] [--no-record]
    python bench/zoo.py --check [--tiny]      # correctness only, both doors, no peers
    python bench/zoo.py --tune 2 [--executor ray]   # each model before and after tuning

Every entry is built from its config object with random weights (nothing is downloaded) at
batch 1 and its usual input size: 224x224 images, 128-token sequences, one second of 16 kHz
audio. Decoders are small members of their families (a few layers of the real layer), so
that a run of the zoo fits a 2-core machine. `--tiny` builds each architecture with a few
narrow layers and small inputs instead: the same code paths in the model, what
tests/frontends/torch/test_zoo.py compiles in CI.

The timed run writes one table per thread count to docs/benchmarks.md: Ember against
PyTorch eager, torch.compile (Inductor) and ONNX Runtime, with Ember's compile time cold
(empty cache) and warm (a new process's compile, found on disk). Each model runs in a
process of its own (see bench_models.bench_in_child for why).
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


@dataclass(frozen=True)
class Entry:
    """One architecture: the transformers model class, its config overrides at the usual
    size and at the tiny one, and the kind of input it takes."""

    family: str  # vision, text, decoder, audio
    model: str  # a transformers class name
    inputs: str  # image, text, audio, seq2seq-decoder
    full: dict = field(default_factory=dict)
    tiny: dict = field(default_factory=dict)
    size: int = 224  # image side, sequence length or audio samples at the usual size
    tiny_size: int = 32
    part: str = ""  # a submodule to take (BART's encoder or decoder)
    # (rtol, atol) for `matches`, looser than 1e-4 only with a measured reason beside it.
    tolerance: tuple[float, float] = (1e-4, 1e-4)


# A base-sized encoder (BERT-base's shape), for the families whose config defaults to a
# larger member (ALBERT's xxlarge, DeBERTa-v2's xlarge).
BASE_TEXT = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072)
# Narrow stand-ins for the usual sizes, shared by the entries of a family.
TINY_TEXT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=128, vocab_size=1000)
TINY_VIT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=128, image_size=32, patch_size=8)
SMALL_DECODER = dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                     num_key_value_heads=2, intermediate_size=1408, vocab_size=32000,
                     use_cache=False)
TINY_DECODER = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, intermediate_size=128, vocab_size=1000,
                    use_cache=False)
TINY_AUDIO = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=128, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2),
                  conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
                  num_conv_pos_embedding_groups=4)

ZOO: dict[str, Entry] = {
    # Vision: CNNs.
    "resnet18": Entry("vision", "ResNetModel", "image",
                      dict(hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2],
                           layer_type="basic"),
                      dict(hidden_sizes=[8, 16, 16, 32], depths=[1, 1, 1, 1],
                           layer_type="basic", embedding_size=8)),
    "resnet50": Entry("vision", "ResNetModel", "image", {},
                      dict(hidden_sizes=[16, 16, 32, 32], depths=[1, 1, 1, 1],
                           embedding_size=8)),
    "mobilenet_v2": Entry("vision", "MobileNetV2Model", "image", {},
                          dict(depth_multiplier=0.35, image_size=32)),
    "regnet": Entry("vision", "RegNetModel", "image", {},
                    dict(hidden_sizes=[16, 16, 32, 32], depths=[1, 1, 1, 1],
                         groups_width=8, embedding_size=8)),
    "convnext": Entry("vision", "ConvNextModel", "image",
                      dict(hidden_sizes=[96, 192, 384, 768], depths=[3, 3, 9, 3]),
                      dict(hidden_sizes=[16, 16, 32, 32], depths=[1, 1, 1, 1])),
    "poolformer": Entry("vision", "PoolFormerModel", "image", {},
                        dict(hidden_sizes=[16, 16, 32, 32], depths=[1, 1, 1, 1])),
    # Vision: transformers and hybrids.
    "vit": Entry("vision", "ViTModel", "image", {}, TINY_VIT),
    "deit": Entry("vision", "DeiTModel", "image", {}, TINY_VIT),
    "beit": Entry("vision", "BeitModel", "image", {},
                  dict(TINY_VIT, use_relative_position_bias=True)),
    "dinov2": Entry("vision", "Dinov2Model", "image", {}, dict(TINY_VIT, patch_size=4)),
    "swin": Entry("vision", "SwinModel", "image", {},
                  dict(embed_dim=16, depths=[1, 1], num_heads=[2, 4], image_size=32,
                       patch_size=2, window_size=4)),
    "levit": Entry("vision", "LevitModel", "image", {},
                   dict(hidden_sizes=[16, 32, 48], num_attention_heads=[2, 2, 2],
                        depths=[1, 1, 1], key_dim=[8, 8, 8], image_size=64), tiny_size=64),
    "mobilevit": Entry("vision", "MobileViTModel", "image", dict(image_size=256),
                       dict(hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24,
                                                                          32, 64],
                            image_size=64), size=256, tiny_size=64),
    "segformer": Entry("vision", "SegformerModel", "image", {},
                       dict(hidden_sizes=[8, 16, 24, 32], num_attention_heads=[1, 1, 2, 2],
                            depths=[1, 1, 1, 1])),
    "clip_vision": Entry("vision", "CLIPVisionModel", "image", {},
                         dict(TINY_VIT, image_size=32)),
    # Text encoders.
    "bert": Entry("text", "BertModel", "text", {}, TINY_TEXT, size=128, tiny_size=16),
    "roberta": Entry("text", "RobertaModel", "text", {}, TINY_TEXT, size=128, tiny_size=16),
    "albert": Entry("text", "AlbertModel", "text", BASE_TEXT, dict(TINY_TEXT, embedding_size=32),
                    size=128, tiny_size=16),
    "electra": Entry("text", "ElectraModel", "text", {}, dict(TINY_TEXT, embedding_size=32),
                     size=128, tiny_size=16),
    "deberta_v2": Entry("text", "DebertaV2Model", "text", BASE_TEXT, TINY_TEXT, size=128,
                        tiny_size=16),
    "xlm_roberta": Entry("text", "XLMRobertaModel", "text", {}, TINY_TEXT, size=128,
                         tiny_size=16),
    "mpnet": Entry("text", "MPNetModel", "text", {}, TINY_TEXT, size=128, tiny_size=16),
    "clip_text": Entry("text", "CLIPTextModel", "text", {},
                       dict(TINY_TEXT, max_position_embeddings=77), size=77, tiny_size=16),
    "bart_encoder": Entry("text", "BartModel", "text", dict(encoder_layers=6, decoder_layers=6,
                                                            d_model=768, encoder_ffn_dim=3072,
                                                            decoder_ffn_dim=3072,
                                                            encoder_attention_heads=12,
                                                            decoder_attention_heads=12),
                          dict(d_model=64, encoder_layers=2, decoder_layers=2,
                               encoder_ffn_dim=128, decoder_ffn_dim=128,
                               encoder_attention_heads=4, decoder_attention_heads=4,
                               vocab_size=1000),
                          size=128, tiny_size=16, part="encoder"),
    "bart_decoder": Entry("decoder", "BartModel", "seq2seq-decoder",
                          dict(encoder_layers=6, decoder_layers=6, d_model=768,
                               encoder_ffn_dim=3072, decoder_ffn_dim=3072,
                               encoder_attention_heads=12, decoder_attention_heads=12,
                               use_cache=False),
                          dict(d_model=64, encoder_layers=2, decoder_layers=2,
                               encoder_ffn_dim=128, decoder_ffn_dim=128,
                               encoder_attention_heads=4, decoder_attention_heads=4,
                               vocab_size=1000, use_cache=False),
                          size=128, tiny_size=16, part="decoder"),
    # Decoders, each small.
    "gpt2": Entry("decoder", "GPT2Model", "text", dict(use_cache=False),
                  dict(n_embd=64, n_layer=2, n_head=4, vocab_size=1000, use_cache=False),
                  size=128, tiny_size=16),
    "gpt_neo": Entry("decoder", "GPTNeoModel", "text",
                     dict(hidden_size=768, num_layers=12, num_heads=12,
                          attention_types=[[["global", "local"], 6]], use_cache=False),
                     dict(hidden_size=64, num_layers=2, num_heads=4, vocab_size=1000,
                          attention_types=[[["global", "local"], 1]], window_size=8,
                          use_cache=False),
                     size=128, tiny_size=16,
                     # GPT-Neo does not scale its attention scores: eager in float32 is
                     # itself 3.3e-4 from float64 at its usual size (Ember 5.3e-4; outputs
                     # up to 4.6).
                     tolerance=(1e-4, 1e-3)),
    "opt": Entry("decoder", "OPTModel", "text", dict(use_cache=False),
                 dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      ffn_dim=128, word_embed_proj_dim=64, vocab_size=1000, use_cache=False),
                 size=128, tiny_size=16),
    "bloom": Entry("decoder", "BloomModel", "text",
                   dict(hidden_size=768, n_layer=6, n_head=12, vocab_size=32000,
                        use_cache=False),
                   dict(hidden_size=64, n_layer=2, n_head=4, vocab_size=1000, use_cache=False),
                   size=128, tiny_size=16),
    "qwen2": Entry("decoder", "Qwen2Model", "text", SMALL_DECODER, TINY_DECODER, size=128,
                   tiny_size=16),
    "mistral": Entry("decoder", "MistralModel", "text", dict(SMALL_DECODER, sliding_window=64),
                     dict(TINY_DECODER, sliding_window=8), size=128, tiny_size=16),
    "gemma": Entry("decoder", "GemmaModel", "text", dict(SMALL_DECODER, head_dim=64),
                   dict(TINY_DECODER, head_dim=16), size=128, tiny_size=16),
    "phi3": Entry("decoder", "Phi3Model", "text", dict(SMALL_DECODER, pad_token_id=0),
                  dict(TINY_DECODER, pad_token_id=0), size=128, tiny_size=16),
    # Audio.
    "wav2vec2": Entry("audio", "Wav2Vec2Model", "audio", {}, TINY_AUDIO, size=16000,
                      tiny_size=400),
    "hubert": Entry("audio", "HubertModel", "audio", {}, TINY_AUDIO, size=16000,
                    tiny_size=400),
}


class Positional(torch.nn.Module):
    """A model called positionally with its inputs passed by name, returning its first
    output: one tensor, what every door (ONNX export included) can take and compare."""

    def __init__(self, model: torch.nn.Module, names: tuple[str, ...]):
        super().__init__()
        self.model = model
        self.names = names

    def forward(self, *inputs):
        out = self.model(**dict(zip(self.names, inputs)))
        return out if isinstance(out, torch.Tensor) else out[0]


def _trained_scale(model: torch.nn.Module) -> None:
    """Weights at the scale training leaves them, where a family's initializer is far off:
    linear and convolution weights normal with variance 1/fan-in, batch-norm statistics
    not the identity's. Some initializers (std 0.02 for every convolution) shrink a deep
    CNN's activations layer by layer to denormals (MobileViT's output was ~1e-40), which
    no trained model computes and which are many times slower on x86 for every peer."""
    for m in model.modules():
        if isinstance(m, (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d)):
            fan_in = m.weight[0].numel()
            torch.nn.init.normal_(m.weight, std=fan_in ** -0.5)
        elif isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)


def build(name: str, tiny: bool = False) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """(module in eval mode, example inputs) for a zoo entry; seeded, so the same each call."""
    import transformers

    entry = ZOO[name]
    torch.manual_seed(0)
    model_class = getattr(transformers, entry.model)
    config = model_class.config_class(**(entry.tiny if tiny else entry.full))
    model = model_class(config)
    _trained_scale(model)
    if entry.part:
        model = getattr(model, "get_" + entry.part)()
    size = entry.tiny_size if tiny else entry.size
    if entry.inputs == "image":
        names, inputs = ("pixel_values",), (torch.randn(1, config.num_channels, size, size),)
    elif entry.inputs == "text":
        names, inputs = ("input_ids",), (torch.randint(0, config.vocab_size, (1, size)),)
    elif entry.inputs == "audio":
        names, inputs = ("input_values",), (torch.randn(1, size),)
    else:  # seq2seq-decoder: the decoder's tokens and the encoder's states it attends to
        names = ("input_ids", "encoder_hidden_states")
        inputs = (torch.randint(0, config.vocab_size, (1, size)),
                  torch.randn(1, size, config.d_model))
    return Positional(model, names).eval(), inputs


def matches(name: str, got: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether `got` is `expected` within the entry's tolerance. The absolute part shrinks
    with outputs under 1: random weights shrink a narrow model's activations layer by layer
    (the tiny MobileNetV2's output is ~1e-30), and an absolute 1e-4 would pass anything."""
    rtol, atol = ZOO[name].tolerance
    scale = float(expected.abs().max())
    return got.shape == expected.shape and bool(
        torch.allclose(got, expected, rtol=rtol, atol=atol * min(1.0, scale)))


def check(name: str, tiny: bool) -> dict:
    """Compile one entry through both doors, compare each with eager; the error and the
    compile times."""
    import ember

    model, inputs = build(name, tiny)
    with torch.no_grad():
        expected = model(*inputs)
        start = time.perf_counter()
        compiled = ember.compile(model, inputs, config=ember.Config(executor="cpu"),
                                 strict=True)
        got = compiled(*inputs)
        compile_s = time.perf_counter() - start
        dynamo = torch.compile(model, backend="ember",
                               options={"executor": "cpu", "strict": True})
        got_dynamo = dynamo(*inputs)
    errors = {door: float((out - expected).abs().max()) for door, out in
              (("ember.compile", got), ("torch.compile", got_dynamo))}
    ok = all(matches(name, out, expected) for out in (got, got_dynamo))
    return {"model": name, "ok": ok, "errors": errors, "compile": compile_s,
            "scale": float(expected.abs().max())}


def bench(name: str, repeat: int, threads: int, peers: set[str]) -> dict:
    """One entry timed: Ember (cold and warm compile, run), eager, and the `peers` among
    Inductor ("inductor") and ONNX Runtime ("ort")."""
    import bench_models

    import ember
    from ember.driver import pipeline
    from ember.runtime.cache import wait_for_writes

    model, inputs = build(name)
    with torch.no_grad():
        expected = model(*inputs)
        eager = bench_models.median_ms(lambda: model(*inputs), repeat)
        start = time.perf_counter()
        compiled = ember.compile(model, inputs, config=ember.Config(executor="cpu"))
        compile_s = time.perf_counter() - start
        wait_for_writes()  # (written while the model runs; a new process finds it whole)
        pipeline.clear_memory_cache()
        start = time.perf_counter()
        compiled = ember.compile(model, inputs, config=ember.Config(executor="cpu"))
        warm_s = time.perf_counter() - start
        got = compiled(*inputs)
        error = float((got - expected).abs().max())
        ok = matches(name, got, expected)
        ember_ms = bench_models.median_ms(lambda: compiled(*inputs), repeat)
        inductor_ms = None
        try:
            if "inductor" not in peers:
                raise LookupError("not asked for")
            inductor = torch.compile(model)
            inductor(*inputs)
            inductor_ms = bench_models.median_ms(lambda: inductor(*inputs), repeat)
        except LookupError:
            pass
        except Exception as e:  # noqa: BLE001  (a peer failing is reported, not fatal)
            print(f"  torch.compile: {type(e).__name__}: {e}", file=sys.stderr)
    ort = None
    try:
        if "ort" in peers:
            ort = bench_models.onnxruntime_ms(name, model, inputs, repeat, threads)
    except Exception as e:  # noqa: BLE001  (a peer failing to export is reported, not fatal)
        print(f"  onnxruntime: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
    return {"model": name, "eager": eager, "ember": ember_ms, "inductor": inductor_ms,
            "ort": ort, "compile": compile_s, "warm": warm_s, "error": error,
            "matches": ok}


def tune(name: str, repeat: int, budget: float, executor: str) -> dict:
    """One entry timed with the default schedules, then tuned (into the tuning database
    EMBER_TUNING_DB names, shared by the run's models) and timed again."""
    import bench_models

    import ember
    from ember.loops.tune import TuningDatabase

    model, inputs = build(name)
    database = os.environ["EMBER_TUNING_DB"]
    known = set(TuningDatabase(database).entries)
    with torch.no_grad():
        expected = model(*inputs)
        default = ember.compile(model, inputs, config=ember.Config(executor="cpu"))
        default_ms = bench_models.median_ms(lambda: default(*inputs), repeat)
        start = time.perf_counter()
        tuned = ember.compile(model, inputs, config=ember.Config(
            executor="cpu", tune=True, tune_budget=budget, tune_executor=executor,
            disk_cache=False))
        tune_s = time.perf_counter() - start
        got = tuned(*inputs)
        tuned_ms = bench_models.median_ms(lambda: tuned(*inputs), repeat)
    found = set(TuningDatabase(database).entries) - known
    return {"model": name, "default": default_ms, "tuned": tuned_ms, "tune_s": tune_s,
            "kernels": len(found), "matches": matches(name, got, expected)}


def tune_table(rows: list[dict], names: list[str], threads: int, repeat: int, budget: float,
               executor: str) -> list[str]:
    import bench_models

    lines = [f"### {datetime.date.today()}: the model zoo tuned, batch 1, f32, {threads}"
             f" threads, {budget:g} s per kernel, {executor} executor (median of {repeat})",
             "", f"Machine: {bench_models.machine()}.", "",
             "| model | default ms | tuned ms | speed-up | kernels searched | tuning s |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += model_lines(rows, names, lambda r: [
        f"{r['default']:.2f}", f"{r['tuned']:.2f}",
        f"{r['default'] / r['tuned']:.2f}x{'' if r['matches'] else ' (over tolerance)'}",
        str(r["kernels"]), f"{r['tune_s']:.0f}"])
    if rows:
        ratios = [r["default"] / r["tuned"] for r in rows]
        geomean = statistics.geometric_mean(ratios)
        lines += ["", f"Geometric mean speed-up {geomean:.3f}x (range {min(ratios):.2f}-"
                  f"{max(ratios):.2f}x); {sum(r['kernels'] for r in rows)} kernels searched"
                  f" in {sum(r['tune_s'] for r in rows) / 60:.0f} minutes. Kernels a model"
                  " shares with one tuned before it are not searched again."]
    return lines


def in_child(args: list[str]) -> dict | None:
    """Run this script on one model in a process of its own; its JSON line, or None when
    it failed (the failure's tail is printed)."""
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                          check=False)
    if done.returncode:
        sys.stderr.write(done.stderr[-1200:])
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def model_lines(rows: list[dict], names: list[str], cells) -> list[str]:
    """A table line per model of `names`: its `cells(row)`, or "failed" where it has no
    row (its child process failed)."""
    by_name = {r["model"]: r for r in rows}
    width = len(cells(rows[0])) if rows else 1
    return [f"| {name} | " + " | ".join(cells(by_name[name]) if name in by_name else
                                        ["failed"] + [""] * (width - 1)) + " |"
            for name in names]


def table(rows: list[dict], names: list[str], threads: int, repeat: int) -> list[str]:
    import bench_models

    lines = [f"### {datetime.date.today()}: the model zoo, batch 1, f32, {threads} threads"
             f" (median of {repeat})", "", f"Machine: {bench_models.machine()}.", "",
             "| model | eager ms | torch.compile ms | ONNX Runtime ms | Ember ms | vs eager |"
             " vs torch.compile | vs ORT | compile s cold | warm | max error |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def num(v):
        return f"{v:.2f}" if v is not None else "n/a"

    def speedup(peer, r):
        return f"{r[peer] / r['ember']:.2f}x" if r.get(peer) else "n/a"

    lines += model_lines(rows, names, lambda r: [
        f"{r['eager']:.2f}", num(r["inductor"]), num(r["ort"]), f"{r['ember']:.2f}",
        speedup("eager", r), speedup("inductor", r), speedup("ort", r), f"{r['compile']:.1f}",
        f"{r['warm']:.2f}", f"{r['error']:.1e}{'' if r['matches'] else ' (over tolerance)'}"])
    compiles = [r["compile"] for r in rows]
    lines += ["", "Speed-ups are the peer's time over Ember's (above 1x, Ember is faster)."
              " Geometric means: " + ", ".join(
                  f"{label} {bench_models.geomean(peer, rows)}" for peer, label in
                  (("eager", "vs eager"), ("inductor", "vs torch.compile"),
                   ("ort", "vs ONNX Runtime"))) + "."]
    if compiles:
        lines.append(f"Cold compile: median {statistics.median(compiles):.1f} s, slowest"
                     f" {max(compiles):.1f} s; warm: slowest"
                     f" {max(r['warm'] for r in rows):.2f} s.")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--peers", default="inductor,ort",
                        help="the peers besides eager: inductor, ort (or none)")
    parser.add_argument("--check", action="store_true", help="correctness only")
    parser.add_argument("--tiny", action="store_true", help="the tiny versions (--check)")
    parser.add_argument("--tune", type=float, metavar="BUDGET",
                        help="time each model before and after tuning, BUDGET seconds per"
                             " kernel")
    parser.add_argument("--executor", default="local", help="the tuner's: local, ray, ray:ADDR")
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--one", metavar="MODEL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = args.models.split(",")
    if args.one:  # a child: one model, into a cache folder of its own
        cache = tempfile.mkdtemp(prefix="ember-zoo-")
        os.environ["EMBER_CACHE_DIR"] = cache
        atexit.register(shutil.rmtree, cache, ignore_errors=True)
        threads = int(args.threads)
        peers = set(args.peers.split(","))
        torch.set_num_threads(threads)
        os.environ["EMBER_NUM_THREADS"] = str(threads)
        if args.check:
            result = check(args.one, args.tiny)
        elif args.tune is not None:
            result = tune(args.one, args.repeat, args.tune, args.executor)
        else:
            result = bench(args.one, args.repeat, threads, peers)
        print(json.dumps(result))
        return
    if args.check:
        failed = []
        for name in names:
            row = in_child(["--one", name, "--check", "--threads", "2"]
                           + (["--tiny"] if args.tiny else []))
            print(f"{name}: {row}", flush=True)
            if row is None or not row["ok"]:
                failed.append(name)
        print(f"{len(names) - len(failed)} of {len(names)} match eager"
              + (f"; failed: {', '.join(failed)}" if failed else ""))
        raise SystemExit(1 if failed else 0)
    import bench_models

    if args.tune is not None:  # one database for the run: models share kernels
        os.environ.setdefault("EMBER_TUNING_DB", tempfile.mktemp(prefix="zoo-tuning-",
                                                                  suffix=".json"))
        print(f"tuning database: {os.environ['EMBER_TUNING_DB']}", file=sys.stderr)
    for threads in map(int, args.threads.split(",")):
        if args.tune is not None:
            rows = [row for name in names if (row := in_child(
                ["--one", name, "--threads", str(threads), "--repeat", str(args.repeat),
                 "--tune", str(args.tune), "--executor", args.executor])) is not None]
            bench_models.publish(tune_table(rows, names, threads, args.repeat, args.tune,
                                            args.executor), not args.no_record)
            continue
        rows = []
        for name in names:
            print(f"benchmarking {name} on {threads} threads ...", file=sys.stderr, flush=True)
            row = in_child(["--one", name, "--threads", str(threads), "--repeat",
                            str(args.repeat), "--peers", args.peers])
            if row is not None:
                rows.append(row)
        bench_models.publish(table(rows, names, threads, args.repeat), not args.no_record)


if __name__ == "__main__":
    main()
