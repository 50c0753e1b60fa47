# Every target creates .venv from nothing when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-full bench zoo lint lint-imports clean cross-tools gpu-tools fuzz fuzz-parsers fuzz-models

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m ember demo

test: $(STAMP) cross-tools gpu-tools
	$(BIN)/python -m pytest -q -n 2

# The GPU backend's tests assemble its PTX with ptxas and link libdevice (no GPU needed):
# the CUDA toolkit's where one is installed, else NVIDIA's wheels, installed when missing.
gpu-tools: $(STAMP)
	@$(BIN)/python -c "from ember.codegen import nvptx; exit(nvptx.ptxas_path() is None)" \
	  || $(BIN)/python -m pip install -q 'nvidia-cuda-nvcc==13.0.*' \
	  || echo "note: could not install ptxas; the tests that assemble PTX are skipped"
	@$(BIN)/python -c "from ember.codegen import nvptx; exit(nvptx.libdevice_path() is None)" \
	  || $(BIN)/python -m pip install -q 'nvidia-nvvm==13.0.*' \
	  || echo "note: could not install libdevice; the tests that need it are skipped"

# The AArch64 cross tests need a cross compiler and qemu-user, `ember explain --svg` needs
# graphviz: installed when missing (as root, through apt-get), else those tests are skipped
# with the reason.
DEBIAN_TOOLS := gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user graphviz
cross-tools:
	@if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null \
	    || ! command -v dot >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get install -y -q --no-install-recommends $(DEBIAN_TOOLS) >/dev/null \
	    || (apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $(DEBIAN_TOOLS) >/dev/null) \
	    || echo "note: could not install $(DEBIAN_TOOLS); tests that need them are skipped"; \
	  else echo "note: $(DEBIAN_TOOLS) missing; tests that need them are skipped"; fi; \
	fi

test-full: $(STAMP) cross-tools gpu-tools
	EMBER_SLOW_TESTS=1 $(BIN)/python -m pytest -q -n 2 -m ''

# Differential fuzzing of the pipeline on random graphs (tests/fuzz/test_random_pipeline.py):
# one worker per core for FUZZ_SECONDS each; a mismatch stops it with the shrunk graph.
FUZZ_SECONDS ?= 600
fuzz: $(STAMP)
	EMBER_FUZZ_SECONDS=$(FUZZ_SECONDS) EMBER_FUZZ_JOBS=2 $(BIN)/python -m pytest -q -n 2 -rP \
	  -p no:cacheprovider tests/fuzz -k "fuzz_for_a_while and not models"

# Random ONNX models through Ember and ONNX Runtime (tests/fuzz/test_onnx_models.py), then
# random PyTorch programs through torch.compile(backend="ember") and eager
# (tests/fuzz/test_torch_programs.py), FUZZ_SECONDS each; an ONNX disagreement's shrunk
# model goes to fuzz/mismatch/.
fuzz-models: $(STAMP)
	EMBER_FUZZ_SECONDS=$(FUZZ_SECONDS) EMBER_FUZZ_JOBS=2 EMBER_FUZZ_OUT=fuzz/mismatch \
	  $(BIN)/python -m pytest -q -n 2 -rP -p no:cacheprovider tests/fuzz -k fuzz_models_for

# The coverage-guided fuzzers (fuzz/harness.py), each for FUZZ_SECONDS; new inputs that
# reach new code go to fuzz/corpus/<target>/, a crash to fuzz/crash-*.
FUZZ_TARGETS := graph_text loop_text onnx_model
fuzz-parsers: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[fuzz]'
	for target in $(FUZZ_TARGETS); do \
	  $(BIN)/python fuzz/run.py $$target -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096 \
	    -artifact_prefix=fuzz/ || exit 1; done

# The peers of the scripted workloads (numba, jax): only `make bench` needs them.
PEERS := $(VENV)/.peers
$(PEERS): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[peers]'
	touch $(PEERS)

# The model zoo (bench/zoo.py): 35 architectures against eager, torch.compile and ONNX
# Runtime on 1 and 2 threads, tables to docs/benchmarks.md (about an hour on 2 cores).
zoo: $(STAMP) $(PEERS)
	$(BIN)/python bench/zoo.py --threads 1,2

bench: $(STAMP) $(PEERS)
	$(BIN)/python bench/bench_gemm.py --record
	$(BIN)/python bench/bench_ops.py --threads 1
	$(BIN)/python bench/bench_ops.py --threads 2
	$(BIN)/python bench/kernel_counts.py
	$(BIN)/python bench/bench_models.py --threads 1
	$(BIN)/python bench/bench_models.py --threads 2
	$(BIN)/python bench/bench_script.py --threads 1

lint: $(STAMP) lint-imports
	$(BIN)/ruff check ember tests bench fuzz

# The layering contracts of pyproject.toml ([tool.importlinter]; docs/architecture.md).
lint-imports: $(STAMP)
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) build *.egg-info
