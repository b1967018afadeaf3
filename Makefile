# Turnwire developer commands. Everything installs from this repo's own files:
# Python packages into .venv/ (pinned by constraints.txt), buf, the Node.js
# gRPC packages and the TypeScript client's dependencies into node_modules/
# (pinned by package-lock.json).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BUF := node_modules/.bin/buf
# Debian 12 packages the Go client builds with (clients/go/README.md); protoc-gen-go and
# protoc-gen-go-grpc only regenerate and check its generated code.
GO_PACKAGES := golang-go golang-google-grpc-dev golang-github-golang-protobuf-1-5-dev \
	golang-google-genproto-dev protoc-gen-go protoc-gen-go-grpc

# Bytecode caches on: a test run starts hundreds of Python processes, and without .pyc files each
# compiles the repo's modules again and pytest rewrites every test module's asserts again.
unexport PYTHONDONTWRITEBYTECODE

# The tests that need nothing beyond the pytest process (markers: pyproject.toml, tests/conftest.py).
IN_PROCESS := not (e2e or postgres or packaging or stress)
# pytest-xdist workers for `make test`. The end-to-end tests mostly wait for processes they
# started, so more workers than cores; loadgroup keeps the tests that share a module's sidecar
# on one worker (tests/conftest.py). Each worker picks its own ports and PostgreSQL databases.
TEST_WORKERS ?= 4
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist loadgroup

.PHONY: setup dist demo install-go install-chromium build-inspector build-web-example build-ai-sdk-example check test test-python test-node test-go conformance kit-conformance build-node lint docs protos check-protos breaking bench stress clean sync-client

setup: $(VENV)/.installed node_modules/.installed

$(VENV)/.installed: pyproject.toml clients/python/pyproject.toml middleware/pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "Python 3.11+ is required (set PYTHON=...)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e clients/python -e middleware -e '.[dev,bedrock,vertex,gemini]'
	touch $@

node_modules/.installed: package.json package-lock.json clients/node/package.json clients/web-example/package.json \
		clients/ai-sdk-example/package.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

## dist: the release artifacts of VERSION into dist/ (docs/install.md): an sdist and a wheel of each Python
## distribution (turnwire, turnwire-sdk, turnwire-client; checked by twine), the npm package of the TypeScript client
## (npm pack), and the Go module in the module proxy's layout (dist/goproxy). Versions checked against VERSION first.
# DIST: where (tests/test_release_artifacts.py builds elsewhere); emptied first.
DIST ?= dist
dist: setup build-node
	$(PY) -m pytest -q -p no:randomly tests/test_release_version.py
	rm -rf "$(DIST)" && mkdir -p "$(DIST)"
	for project in clients/python middleware .; do \
	  $(PY) -m build --no-isolation --outdir "$(DIST)" $$project >/dev/null || exit 1; done
	$(VENV)/bin/twine check --strict "$(DIST)"/*.whl "$(DIST)"/*.tar.gz
	@# --ignore-scripts: build-node compiled dist/ (prepack would rewrite it under the Node.js tests beside).
	npm pack ./clients/node --pack-destination "$(DIST)" --ignore-scripts --loglevel=error
	$(PY) tools/go_module_release.py "$(DIST)/goproxy"
	@ls -1 "$(DIST)" "$(DIST)"/goproxy/*/*/@v

## demo: start the sidecar on its embedded defaults, hold a conversation that calls tools, stop it.
demo: setup build-inspector
	$(VENV)/bin/turnwire demo $(DEMO_ARGS)

## check: the inner loop, after every edit: lint, then the in-process tests (no process, package or database), in parallel.
check: lint
	$(PY) -m pytest -q -n auto -m "$(IN_PROCESS)"

## test: every test (Python unit + end-to-end, Node.js end-to-end, the TypeScript client's, the Go client when Go is installed, the conformance suite).
# The four suites run side by side (each mostly waits for the processes it started); each one's
# output is printed whole when it ends (--output-sync), and any failure fails the target.
test: setup build-node
	@echo "make test: pytest, Node.js, Go and the conformance suite side by side; each prints its output when it ends (pytest's last, after several minutes)"
	$(MAKE) --no-print-directory -j4 --output-sync=target test-python test-node test-go conformance

## test-python: every pytest test, on TEST_WORKERS workers (PostgreSQL brought up when none listens).
test-python: setup build-node
	bash tools/with-postgres.sh $(PY) -m pytest -q $(PYTEST_PARALLEL)

## test-node: the Node.js end-to-end tests and the TypeScript client's.
test-node: setup build-node
	node --test --test-concurrency=4 tests/node/ clients/node/tests/

## install-go: install the Debian packages of the Go client (as root, or through sudo); quick when present.
install-go:
	@if dpkg -s $(GO_PACKAGES) >/dev/null 2>&1; then echo "Go client packages installed"; else \
	  sudo=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
	  $$sudo apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $(GO_PACKAGES); fi

## install-chromium: Debian's Chromium for the browser tests (tests/e2e/test_web_example_e2e.py,
## tests/e2e/test_ai_sdk_page_e2e.py, driven by playwright-core; no browser download); quick when present.
install-chromium:
	@if dpkg -s chromium >/dev/null 2>&1; then echo "Chromium installed"; else \
	  sudo=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
	  $$sudo apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends chromium; fi

## test-go: the Go client's tests (clients/go), in GOPATH mode on Debian's Go packages.
test-go: setup
	@if command -v go >/dev/null; then bash tools/go-test.sh; else \
	  echo "Go not installed: skipping Go client tests (apt-get install $(GO_PACKAGES))"; fi

## conformance: the conformance suite (clients/conformance) through the Python, TypeScript and Go clients (Go when installed), then kit-conformance.
conformance: setup build-node
	$(PY) clients/conformance/python/run.py
	node clients/conformance/node/run.mjs
	TURNWIRE_CONFORMANCE_PROTOCOL=connect node clients/conformance/node/run.mjs
	@if command -v go >/dev/null; then bash clients/conformance/go/run.sh; else \
	  echo "Go not installed: NOT running the Go conformance runner (apt-get install $(GO_PACKAGES))"; fi
	$(MAKE) --no-print-directory kit-conformance

## kit-conformance: the hook and tool kits' suite (clients/conformance/kits) against each kit's fixture (Go's when installed).
kit-conformance: setup build-node
	$(PY) clients/conformance/kits/run.py --kit python
	$(PY) clients/conformance/kits/run.py --kit node
	@if command -v go >/dev/null; then $(PY) clients/conformance/kits/run.py --kit go; else \
	  echo "Go not installed: NOT running the kit suite for the Go kit (apt-get install $(GO_PACKAGES))"; fi

## build-node: compile the TypeScript client, clients/node/src -> dist/ (when a source changed),
## and the inspector page (build-inspector).
build-node: clients/node/dist/index.js build-inspector

## build-inspector: the inspector page (clients/inspector: type-checked by tsc, bundled by esbuild,
## no framework) into the sidecar's package, server/turnwire_server/http/inspector_page/.
INSPECTOR_PAGE := server/turnwire_server/http/inspector_page
build-inspector: $(INSPECTOR_PAGE)/inspector.js

$(INSPECTOR_PAGE)/inspector.js: node_modules/.installed $(wildcard clients/inspector/src/*) clients/inspector/tsconfig.json
	node_modules/.bin/tsc -p clients/inspector
	node_modules/.bin/esbuild clients/inspector/src/main.ts --bundle --format=esm --target=es2022 \
	  --log-level=warning --outfile=$(INSPECTOR_PAGE)/inspector.js
	cp clients/inspector/src/index.html clients/inspector/src/inspector.css $(INSPECTOR_PAGE)/

## build-web-example: bundle the browser example (clients/web-example, esbuild) into its dist/.
build-web-example: clients/web-example/dist/app.js

clients/web-example/dist/app.js: clients/node/dist/index.js clients/web-example/src/main.ts clients/web-example/src/index.html
	npm run --silent build -w clients/web-example

## build-ai-sdk-example: bundle the AI SDK example page (clients/ai-sdk-example: useChat, React, esbuild) into its dist/.
build-ai-sdk-example: clients/ai-sdk-example/dist/app.js

clients/ai-sdk-example/dist/app.js: node_modules/.installed clients/ai-sdk-example/src/main.tsx clients/ai-sdk-example/src/index.html
	npm run --silent build -w clients/ai-sdk-example

clients/node/dist/index.js: node_modules/.installed clients/node/tsconfig.json $(shell find clients/node/src -name '*.ts')
	node_modules/.bin/tsc -p clients/node/tsconfig.json
	touch $@

## lint: ruff, mypy, buf lint, buf breaking, generated-code drift, prettier on the TypeScript client, the docs site.
lint: setup check-protos breaking docs
	PYTHON=$(PY) bash tools/check-sync-client.sh
	cd clients/node && ../../node_modules/.bin/prettier --check --log-level warn .
	cd clients/inspector && ../../node_modules/.bin/prettier --check --log-level warn . && ../../node_modules/.bin/tsc -p .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(BUF) lint

## sync-client: regenerate the sync Python client (turnwire_client/_sync_client.py) from the async one.
sync-client: setup
	$(PY) tools/generate_sync_client.py

## docs: build the documentation site (mkdocs.yml, docs/) into site/; --strict fails on a broken link or anchor.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

## protos: regenerate every client's code from protos/ with one `buf generate` (buf.gen.yaml): clients/python/src/turnwire_client/v1, clients/node/src/gen, and clients/go/gen/turnwire/v1 when the Go plugins are installed.
protos: setup
	bash tools/generate.sh

## check-protos: fail when the committed generated code differs from the protos.
check-protos: setup
	bash tools/check-generated.sh

## breaking: buf breaking (FILE rules) against the released contract, protos/released/ (and main, on a branch).
breaking: setup
	bash tools/check-breaking.sh

## stress: the stress, crash and fuzz suites at full size (make test runs them small).
stress: setup
	TURNWIRE_STRESS_SCALE=10 bash tools/with-postgres.sh $(PY) -m pytest -q --timeout=7200 tests/stress

## bench: benchmarks (tables, no pass/fail).
bench: setup
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) node_modules clients/node/dist dist site .mypy_cache .ruff_cache .pytest_cache
