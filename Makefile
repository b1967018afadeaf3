# Turnwire developer commands. Everything installs from this repo's own files:
# Python packages into .venv/ (pinned by constraints.txt), buf and the Node.js
# gRPC packages into node_modules/ (pinned by package-lock.json).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BUF := node_modules/.bin/buf
# Debian 12 packages the Go client builds with (clients/go/README.md); protoc-gen-go and
# protoc-gen-go-grpc only regenerate and check its generated code.
GO_PACKAGES := golang-go golang-google-grpc-dev golang-github-golang-protobuf-1-5-dev \
	golang-google-genproto-dev protoc-gen-go protoc-gen-go-grpc

.PHONY: setup demo install-go test test-go test-python test-node lint protos check-protos breaking bench stress clean

setup: $(VENV)/.installed node_modules/.installed

$(VENV)/.installed: pyproject.toml clients/python/pyproject.toml middleware/pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "Python 3.11+ is required (set PYTHON=...)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e clients/python -e middleware -e '.[dev]'
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

## demo: start the sidecar on its embedded defaults, hold a conversation that calls tools, stop it.
demo: setup
	$(VENV)/bin/turnwire demo

## test: every test (Python unit + end-to-end, Node.js client end-to-end, the Go client when Go is installed).
test: setup
	bash tools/with-postgres.sh $(PY) -m pytest -q
	node --test tests/node/
	$(MAKE) --no-print-directory test-go

## install-go: install the Debian packages of the Go client (as root, or through sudo); quick when present.
install-go:
	@if dpkg -s $(GO_PACKAGES) >/dev/null 2>&1; then echo "Go client packages installed"; else \
	  sudo=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
	  $$sudo apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $(GO_PACKAGES); fi

## test-go: the Go client's tests (clients/go), in GOPATH mode on Debian's Go packages.
test-go: setup
	@if command -v go >/dev/null; then bash tools/go-test.sh; else \
	  echo "Go not installed: skipping Go client tests (apt-get install $(GO_PACKAGES))"; fi

## lint: ruff, mypy, buf lint, buf breaking, generated-code drift.
lint: setup check-protos breaking
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(BUF) lint

## protos: regenerate clients/python/src/turnwire_client/v1 from protos/, and clients/go/gen when the Go plugins are installed.
protos: setup
	bash tools/generate-python.sh
	@if command -v protoc-gen-go >/dev/null && command -v protoc-gen-go-grpc >/dev/null; then \
	  bash tools/generate-go.sh; else \
	  echo "protoc-gen-go or protoc-gen-go-grpc not installed: NOT regenerating clients/go/gen (apt-get install protoc-gen-go protoc-gen-go-grpc)"; fi

## check-protos: fail when the committed generated code differs from the protos.
check-protos: setup
	bash tools/check-generated.sh

## breaking: buf breaking (FILE rules) against the released contract, protos/released/ (and main, on a branch).
breaking: setup
	bash tools/check-breaking.sh

## stress: the stress, crash and fuzz suites at full size (make test runs them small).
stress: setup
	TURNWIRE_STRESS_SCALE=10 bash tools/with-postgres.sh $(PY) -m pytest -q tests/stress

## bench: benchmarks (tables, no pass/fail).
bench: setup
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) node_modules .mypy_cache .ruff_cache .pytest_cache
